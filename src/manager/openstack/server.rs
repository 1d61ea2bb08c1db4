//! Nova's servers and Keystone's users and projects as their APIs write them, and a server as
//! a unit: its flavor's resources, its times, and what CEEMS answers of it (`allocation`,
//! `tags`, Nova's status).

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::manager::{elapsed_text, Allocation, Reported, UnitRecord};

/// A page of `GET /servers/detail`.
#[derive(Debug, Deserialize)]
pub struct ServerPage {
    pub servers: Vec<Server>,
    #[serde(default)]
    pub servers_links: Vec<Link>,
}

/// A page of `GET /v3/users`.
#[derive(Debug, Deserialize)]
pub struct UserPage {
    pub users: Vec<Named>,
    #[serde(default)]
    pub links: PageLinks,
}

/// A page of `GET /v3/users/{id}/projects`.
#[derive(Debug, Deserialize)]
pub struct ProjectPage {
    pub projects: Vec<Named>,
    #[serde(default)]
    pub links: PageLinks,
}

#[derive(Debug, Deserialize)]
pub struct Link {
    #[serde(default)]
    pub rel: String,
    #[serde(default)]
    pub href: String,
}

/// Keystone's `links` of a list: `next` is null on the last page.
#[derive(Debug, Default, Deserialize)]
pub struct PageLinks {
    #[serde(default)]
    pub next: Option<String>,
}

/// A Keystone user or project.
#[derive(Debug, Clone, Deserialize)]
pub struct Named {
    pub id: String,
    #[serde(default)]
    pub name: String,
}

impl ServerPage {
    /// The next page's link, when Nova gave one.
    pub fn next(&self) -> Option<&str> {
        self.servers_links
            .iter()
            .find(|l| l.rel == "next")
            .map(|l| l.href.as_str())
    }
}

/// A Nova server, with the flavor embedded (compute API microversion 2.47 and later).
#[derive(Debug, Clone, Deserialize)]
pub struct Server {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub tenant_id: String,
    #[serde(default)]
    pub user_id: String,
    #[serde(default)]
    pub created: Option<String>,
    #[serde(default)]
    pub updated: Option<String>,
    #[serde(default, rename = "OS-SRV-USG:launched_at")]
    pub launched_at: Option<String>,
    #[serde(default, rename = "OS-SRV-USG:terminated_at")]
    pub terminated_at: Option<String>,
    #[serde(default)]
    pub flavor: Flavor,
    #[serde(default)]
    pub metadata: Map<String, Value>,
    #[serde(default)]
    pub tags: Option<Vec<String>>,
    #[serde(default, rename = "OS-EXT-SRV-ATTR:reservation_id")]
    pub reservation_id: Option<String>,
    #[serde(default, rename = "OS-EXT-STS:power_state")]
    pub power_state: Option<i64>,
    #[serde(default, rename = "OS-EXT-AZ:availability_zone")]
    pub availability_zone: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Flavor {
    #[serde(default)]
    pub vcpus: u64,
    /// MiB.
    #[serde(default)]
    pub ram: u64,
    /// GiB.
    #[serde(default)]
    pub disk: u64,
    /// MiB; Nova writes `""` for none.
    #[serde(default)]
    pub swap: Value,
    #[serde(default)]
    pub original_name: String,
    #[serde(default)]
    pub extra_specs: Map<String, Value>,
}

/// Statuses of a server that has ended.
const DELETED: &[&str] = &["DELETED", "SOFT_DELETED"];
/// Statuses of a server that holds its resources but does not run: its time stops at its last
/// change.
const INACTIVE: &[&str] = &[
    "SHUTOFF",
    "SUSPENDED",
    "SHELVED",
    "SHELVED_OFFLOADED",
    "ERROR",
];

/// Which of a flavor's PCI aliases are GPUs.
#[derive(Debug, Clone, Default)]
pub enum GpuAliases {
    /// Every alias (a site passes GPUs through, nothing else).
    #[default]
    All,
    Named(Vec<String>),
}

/// Ids to names: Keystone's users and projects.
#[derive(Debug, Clone, Default)]
pub struct Names {
    pub users: HashMap<String, String>,
    pub projects: HashMap<String, String>,
}

impl Names {
    /// Whether a server names a user or project not known here.
    pub fn misses(&self, s: &Server) -> bool {
        !self.users.contains_key(&s.user_id) || !self.projects.contains_key(&s.tenant_id)
    }
}

/// Nova's time: RFC 3339, or without a zone (`launched_at`), which is UTC.
fn epoch(text: Option<&str>) -> Option<i64> {
    let t = text?.trim();
    if t.is_empty() {
        return None;
    }
    let has_zone = t
        .rsplit_once('T')
        .is_some_and(|(_, clock)| clock.contains(['Z', 'z', '+', '-']));
    match has_zone {
        true => crate::manager::civil::parse_rfc3339(t),
        false => crate::manager::civil::parse_rfc3339(&format!("{t}Z")),
    }
}

/// The power state's name, as CEEMS writes it.
fn power_state(code: Option<i64>) -> &'static str {
    match code.unwrap_or(0) {
        0 => "NOSTATE",
        1 => "RUNNING",
        3 => "PAUSED",
        4 => "SHUTDOWN",
        6 => "CRASHED",
        7 => "SUSPENDED",
        2 | 5 => "_UNUSED",
        _ => "N/A",
    }
}

/// A number written as a JSON number or string; 0 when neither.
fn number(v: &Value) -> f64 {
    match v {
        Value::Number(n) => n.as_f64().unwrap_or(0.0),
        Value::String(s) => s.trim().parse().unwrap_or(0.0),
        _ => 0.0,
    }
}

impl Flavor {
    /// vGPUs of `resources:VGPU`.
    fn vgpus(&self) -> u64 {
        self.extra_specs
            .get("resources:VGPU")
            .map(number)
            .filter(|n| n.is_finite() && *n > 0.0)
            .map_or(0, |n| n as u64)
    }

    /// GPUs passed through: the counts of `pci_passthrough:alias` (`a1:2,a2:1`) that are GPUs.
    fn passthrough_gpus(&self, gpus: &GpuAliases) -> u64 {
        let Some(Value::String(aliases)) = self.extra_specs.get("pci_passthrough:alias") else {
            return 0;
        };
        aliases
            .split(',')
            .filter_map(|a| a.split_once(':'))
            .filter(|(name, _)| match gpus {
                GpuAliases::All => true,
                GpuAliases::Named(names) => names.iter().any(|n| n == name.trim()),
            })
            .filter_map(|(_, count)| count.trim().parse::<u64>().ok())
            .sum()
    }
}

/// A server as a unit at `now`: its time from its launch to its end (deleted), its last change
/// (stopped, suspended, shelved) or now.
pub fn to_record(s: &Server, names: &Names, gpus: &GpuAliases, now: i64) -> UnitRecord {
    let created = epoch(s.created.as_deref());
    let launched = epoch(s.launched_at.as_deref());
    let deleted = DELETED.contains(&s.status.as_str());
    let end = match deleted {
        true => epoch(s.terminated_at.as_deref())
            .or(epoch(s.updated.as_deref()))
            .or(Some(now)),
        false => None,
    };
    let until = match (end, INACTIVE.contains(&s.status.as_str())) {
        (Some(end), _) => end,
        (None, true) => epoch(s.updated.as_deref()).unwrap_or(now),
        (None, false) => now,
    };
    let elapsed = launched.map_or(0, |l| u64::try_from(until.saturating_sub(l)).unwrap_or(0));
    // Ours, for queries and findings: a VM holds its flavor from launch to deletion, whatever
    // Nova's status (which CEEMS answers, and the reported state keeps).
    let state = match (end, launched) {
        (Some(_), _) => "COMPLETED",
        (None, Some(_)) => "RUNNING",
        (None, None) => "PENDING",
    };
    let f = &s.flavor;
    let vgpus = f.vgpus();
    let mut allocation = Map::new();
    allocation.insert("vcpus".into(), Value::from(f.vcpus));
    allocation.insert("mem".into(), Value::from(f.ram));
    allocation.insert("disk".into(), Value::from(f.disk));
    allocation.insert("swap".into(), Value::from(number(&f.swap) as u64));
    allocation.insert("name".into(), Value::from(f.original_name.as_str()));
    allocation.insert("extra_specs".into(), Value::Object(f.extra_specs.clone()));
    if vgpus > 0 {
        allocation.insert("vgpus".into(), Value::from(vgpus));
    }
    let mut tags = Map::new();
    tags.insert("metadata".into(), Value::Object(s.metadata.clone()));
    tags.insert(
        "tags".into(),
        Value::from(s.tags.clone().unwrap_or_default()),
    );
    tags.insert(
        "reservation_id".into(),
        Value::from(s.reservation_id.clone().unwrap_or_default()),
    );
    tags.insert(
        "power_state".into(),
        Value::from(power_state(s.power_state)),
    );
    tags.insert(
        "az".into(),
        Value::from(s.availability_zone.clone().unwrap_or_default()),
    );
    // An id Keystone did not name stays an id: the unit is kept, and says whose it is.
    let name_of = |map: &HashMap<String, String>, id: &str| {
        map.get(id).cloned().unwrap_or_else(|| id.to_owned())
    };
    UnitRecord {
        uuid: s.id.clone(),
        account: name_of(&names.projects, &s.tenant_id),
        user: name_of(&names.users, &s.user_id),
        submit: created,
        start: launched,
        end,
        elapsed_seconds: elapsed,
        state: state.to_owned(),
        allocation: Allocation {
            cpus: f.vcpus,
            mem_bytes: f.ram.saturating_mul(1 << 20),
            gpus: vgpus + f.passthrough_gpus(gpus),
            billing: 0,
            nodes: 1,
        },
        name: s.name.clone(),
        reported: Reported {
            state: s.status.clone(),
            elapsed: elapsed_text(elapsed as i64),
            allocation,
            tags,
            ..Reported::default()
        },
        ..UnitRecord::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(json: &str) -> Server {
        serde_json::from_str(json).unwrap()
    }

    const BASE: &str = r#"{"id": "1cef0381", "name": "vm", "status": "ACTIVE", "tenant_id": "p1", "user_id": "u1",
        "created": "2024-10-15T14:28:38Z", "updated": "2024-10-15T14:28:50Z",
        "OS-SRV-USG:launched_at": "2024-10-15T14:28:50.000000", "OS-SRV-USG:terminated_at": null,
        "OS-EXT-STS:power_state": 1, "OS-EXT-AZ:availability_zone": "nova", "tags": [],
        "OS-EXT-SRV-ATTR:reservation_id": "r-1", "metadata": {},
        "flavor": {"vcpus": 8, "ram": 8192, "disk": 1, "swap": "", "original_name": "m10.vgpu",
                   "extra_specs": {"resources:VGPU": "1", "pci_passthrough:alias": "a100:2,nic:1"}}}"#;

    fn names() -> Names {
        Names {
            users: HashMap::from([("u1".to_owned(), "alice".to_owned())]),
            projects: HashMap::from([("p1".to_owned(), "physics".to_owned())]),
        }
    }

    #[test]
    fn an_active_server_runs_from_its_launch_until_now_with_its_flavor() {
        let launched = 1_729_002_530;
        let r = to_record(
            &server(BASE),
            &names(),
            &GpuAliases::default(),
            launched + 3661,
        );
        assert_eq!((r.user.as_str(), r.account.as_str()), ("alice", "physics"));
        assert_eq!(
            (r.start, r.end, r.elapsed_seconds),
            (Some(launched), None, 3661)
        );
        assert_eq!(r.reported.elapsed, "01:01:01");
        assert_eq!(r.allocation.cpus, 8);
        assert_eq!(r.allocation.mem_bytes, 8 << 30);
        // One vGPU and both aliases' devices.
        assert_eq!(r.allocation.gpus, 4);
        let a = serde_json::to_value(&r.reported.allocation).unwrap();
        assert_eq!(a["mem"], 8192);
        assert_eq!(a["vgpus"], 1);
        assert_eq!(a["swap"], 0);
        assert_eq!(r.reported.tags["power_state"], "RUNNING");
        let only_a100 = GpuAliases::Named(vec!["a100".into()]);
        assert_eq!(
            to_record(&server(BASE), &names(), &only_a100, launched)
                .allocation
                .gpus,
            3
        );
    }

    #[test]
    fn a_deleted_server_ends_when_it_was_terminated_and_a_suspended_one_stops_counting() {
        let deleted = BASE.replace("\"ACTIVE\"", "\"DELETED\"").replace(
            ":terminated_at\": null",
            ":terminated_at\": \"2024-10-15T15:28:50.000000\"",
        );
        let r = to_record(&server(&deleted), &names(), &GpuAliases::All, 2_000_000_000);
        assert_eq!((r.end, r.elapsed_seconds), (Some(1_729_006_130), 3600));
        let suspended = BASE.replace("\"ACTIVE\"", "\"SUSPENDED\"").replace(
            "\"updated\": \"2024-10-15T14:28:50Z\"",
            "\"updated\": \"2024-10-15T14:38:50Z\"",
        );
        let r = to_record(
            &server(&suspended),
            &names(),
            &GpuAliases::All,
            2_000_000_000,
        );
        assert_eq!(
            (r.end, r.elapsed_seconds, r.state.as_str()),
            (None, 600, "RUNNING")
        );
        assert_eq!(r.reported.state, "SUSPENDED");
    }

    #[test]
    fn ids_keystone_did_not_name_stay_ids_and_odd_values_do_not_fail() {
        let odd = BASE
            .replace("\"u1\"", "\"u9\"")
            .replace("\"resources:VGPU\": \"1\"", "\"resources:VGPU\": \"x\"")
            .replace(
                "\"OS-SRV-USG:launched_at\": \"2024-10-15T14:28:50.000000\"",
                "\"OS-SRV-USG:launched_at\": null",
            );
        let r = to_record(&server(&odd), &names(), &GpuAliases::All, 2_000_000_000);
        assert_eq!(r.user, "u9");
        assert_eq!(
            (r.start, r.elapsed_seconds, r.state.as_str()),
            (None, 0, "PENDING")
        );
        assert_eq!(r.allocation.gpus, 3);
        assert!(serde_json::from_str::<ServerPage>(r#"{"servers": [{"name": "no id"}]}"#).is_err());
    }

    proptest::proptest! {
        /// Whatever a cloud writes in a server's times, status, flavor and extra specs, it is
        /// a unit or a parse error, never a panic.
        #[test]
        fn any_server_is_a_unit_or_an_error(
            times in proptest::collection::vec(proptest::prop_oneof![
                ".{0,40}",
                "[0-9]{4}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-6][0-9](\\.[0-9]{1,6})?Z?",
            ], 4),
            status in "[A-Z_]{0,12}",
            swap in ".{0,12}",
            vgpu in ".{0,12}",
            alias in ".{0,24}",
            numbers in proptest::collection::vec(proptest::num::u64::ANY, 3),
            power in proptest::num::i64::ANY,
            now in proptest::num::i64::ANY,
        ) {
            let text = serde_json::json!({"servers": [{
                "id": "x", "status": status, "created": times[0], "updated": times[1],
                "OS-SRV-USG:launched_at": times[2], "OS-SRV-USG:terminated_at": times[3],
                "OS-EXT-STS:power_state": power,
                "flavor": {"vcpus": numbers[0], "ram": numbers[1], "disk": numbers[2], "swap": swap,
                           "extra_specs": {"resources:VGPU": vgpu, "pci_passthrough:alias": alias}}}]})
            .to_string();
            if let Ok(page) = serde_json::from_str::<ServerPage>(&text) {
                for s in &page.servers {
                    let _ = to_record(s, &Names::default(), &GpuAliases::All, now);
                }
            }
        }
    }
}
