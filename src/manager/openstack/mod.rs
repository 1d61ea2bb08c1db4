//! OpenStack clouds, the stats-server's side: Nova's servers as units (the same UUIDs the
//! exporter's `libvirt` collector labels its series with, so their usage joins), Keystone's
//! users and the projects each has a role in. The exporter's side is `libvirt`.
//!
//! - `api`: the two APIs, a Keystone token, pages;
//! - `server`: Nova's and Keystone's answers, and a server as a unit;
//! - here: a cloud's entry of the config, and the pulls.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;

pub mod api;
pub mod server;

use api::CloudApi;
use server::{GpuAliases, Names, Server};

use super::registry::{AccountingSpec, ClusterEntry, SetupError};
use super::{unix_now, Accounting, AccountingError, Associations, UnitRecord, UnitRecords};
use crate::web::client::ClientTls;

pub const MANAGER: &str = "openstack";

/// How a VM is given resources, in findings' advice.
pub const REQUEST_WORDS: super::RequestWords = super::RequestWords {
    cores: "the flavor's vCPUs",
    memory: "the flavor's RAM",
    gpus: "the flavor's GPUs (resources:VGPU, pci_passthrough:alias)",
    time: "the VM's lifetime",
};

pub const ACCOUNTING: AccountingSpec = AccountingSpec {
    manager: MANAGER,
    example: r#"{ id = "cloud", manager = "openstack", openstack-compute-url = "https://nova:8774/v2.1", openstack-identity-url = "https://keystone:5000", openstack-auth = { identity = { methods = ["application_credential"], application_credential = { id = "…", secret = "…" } } } }"#,
    build,
};

/// A cloud's entry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct CloudSettings {
    /// Nova's endpoint, with its version (`https://nova:8774/v2.1`).
    openstack_compute_url: String,
    /// Keystone's endpoint, without `/v3`.
    openstack_identity_url: String,
    /// Keystone's `auth` object (`identity.methods`, `password` or `application_credential`),
    /// posted as it is written.
    openstack_auth: toml::Table,
    /// Headers sent to both APIs (CEEMS's `web.http_headers`); Nova's microversion is
    /// `latest` unless one is set here.
    #[serde(default)]
    openstack_http_headers: std::collections::BTreeMap<String, String>,
    /// PEM roots of the APIs' certificates (default: the public ones).
    #[serde(default)]
    openstack_ca_file: Option<PathBuf>,
    #[serde(default)]
    openstack_cert_file: Option<PathBuf>,
    #[serde(default)]
    openstack_key_file: Option<PathBuf>,
    #[serde(default)]
    openstack_insecure_skip_verify: bool,
    /// The `pci_passthrough:alias` names that are GPUs (default: every alias).
    #[serde(default)]
    openstack_gpu_aliases: Option<Vec<String>>,
    /// The longest one request may take.
    #[serde(
        default = "default_timeout",
        deserialize_with = "crate::config::de_duration"
    )]
    openstack_timeout: Duration,
}

fn default_timeout() -> Duration {
    Duration::from_secs(60)
}

/// Nova's microversion headers; `latest` embeds each server's flavor (2.47 and later).
const MICROVERSION_HEADERS: [&str; 2] = ["X-OpenStack-Nova-API-Version", "OpenStack-API-Version"];

fn build(entry: &ClusterEntry<'_>) -> Result<Arc<dyn Accounting>, SetupError> {
    let c: CloudSettings = entry.parse(MANAGER)?;
    let read = |what: &str, path: &Option<PathBuf>| -> Result<Option<Vec<u8>>, SetupError> {
        path.as_ref()
            .map(|p| {
                std::fs::read(p).map_err(|e| entry.error(format!("{what} {}: {e}", p.display())))
            })
            .transpose()
    };
    let tls = ClientTls {
        roots_pem: read("openstack-ca-file", &c.openstack_ca_file)?.unwrap_or_default(),
        identity_pem: read("openstack-cert-file", &c.openstack_cert_file)?
            .zip(read("openstack-key-file", &c.openstack_key_file)?),
        insecure_skip_verify: c.openstack_insecure_skip_verify,
    };
    for (key, url) in [
        ("openstack-compute-url", &c.openstack_compute_url),
        ("openstack-identity-url", &c.openstack_identity_url),
    ] {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(entry.error(format!("{key} `{url}`: an http:// or https:// URL")));
        }
    }
    let mut headers: Vec<(String, String)> = c.openstack_http_headers.into_iter().collect();
    if !headers.iter().any(|(k, _)| {
        MICROVERSION_HEADERS
            .iter()
            .any(|m| m.eq_ignore_ascii_case(k))
    }) {
        headers.push((MICROVERSION_HEADERS[0].to_owned(), "latest".to_owned()));
    }
    let auth = serde_json::to_value(&c.openstack_auth)
        .map_err(|e| entry.error(format!("openstack-auth: {e}")))?;
    let api = CloudApi::new(
        &c.openstack_compute_url,
        &c.openstack_identity_url,
        &tls,
        c.openstack_timeout,
        headers,
        &auth,
    )
    .map_err(|e| entry.error(e))?;
    tracing::info!(cluster = %entry.id, compute = %c.openstack_compute_url, identity = %c.openstack_identity_url, "VMs from OpenStack's Nova, users and projects from Keystone");
    Ok(Arc::new(OpenStackAccounting {
        api,
        gpu_aliases: match c.openstack_gpu_aliases {
            Some(names) => GpuAliases::Named(names),
            None => GpuAliases::All,
        },
        state: Mutex::new(PullState::default()),
    }))
}

/// How long Keystone's users and projects are kept before they are asked again (sooner when
/// a server names an id not among them).
const NAMES_TTL: Duration = Duration::from_secs(3600);
/// Keystone is asked for unknown ids at most this often.
const NAMES_RETRY: Duration = Duration::from_secs(60);
/// Users whose projects are asked at once.
const PROJECT_REQUESTS: usize = 8;

/// One cloud's accounting.
pub struct OpenStackAccounting {
    api: CloudApi,
    gpu_aliases: GpuAliases,
    state: Mutex<PullState>,
}

/// What Keystone said of the cloud's users and projects.
#[derive(Default)]
struct Directory {
    names: Names,
    projects: BTreeSet<String>,
    /// (user, project) names.
    members: Vec<(String, String)>,
}

impl Directory {
    /// As the store keeps it: names, and their Keystone ids beside.
    fn associations(&self) -> Associations {
        let by_name = |ids: &HashMap<String, String>| {
            ids.iter()
                .map(|(id, name)| (name.clone(), id.clone()))
                .collect()
        };
        Associations {
            projects: self.projects.iter().cloned().collect(),
            members: self.members.clone(),
            user_uids: by_name(&self.names.users),
            project_uids: by_name(&self.names.projects),
        }
    }
}

#[derive(Default)]
struct PullState {
    directory: Directory,
    names_at: Option<Instant>,
    /// The servers listed running at the last pull, and when: one gone from both lists since
    /// (deleted and purged, or missed) is closed then.
    open: HashMap<String, (UnitRecord, i64)>,
}

impl OpenStackAccounting {
    /// Keystone's users, their projects, and the projects' members.
    fn fetch_directory(&self) -> Result<Directory, AccountingError> {
        let users = self.api.users().map_err(other)?;
        let results: Vec<_> = users
            .chunks(PROJECT_REQUESTS)
            .flat_map(|chunk| {
                std::thread::scope(|s| {
                    let handles: Vec<_> = chunk
                        .iter()
                        .map(|u| s.spawn(|| self.api.user_projects(&u.id)))
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().unwrap_or_else(|_| Ok(Vec::new())))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut names = Names::default();
        let mut projects = BTreeSet::new();
        let mut members = BTreeSet::new();
        for (user, listed) in users.iter().zip(results) {
            names.users.insert(user.id.clone(), user.name.clone());
            for p in listed.map_err(other)? {
                names.projects.insert(p.id.clone(), p.name.clone());
                projects.insert(p.name.clone());
                members.insert((user.name.clone(), p.name));
            }
        }
        Ok(Directory {
            names,
            projects,
            members: members.into_iter().collect(),
        })
    }

    /// Refreshes the names when they are older than their TTL, or (`missing`) when a server
    /// named an id they lack; a failed refresh keeps the old names if there are some.
    fn refresh_names(&self, state: &mut PullState, missing: bool) -> Result<(), AccountingError> {
        let age = state.names_at.map(|t| t.elapsed());
        let due = match age {
            None => true,
            Some(age) => age > NAMES_TTL || (missing && age > NAMES_RETRY),
        };
        if !due {
            return Ok(());
        }
        match self.fetch_directory() {
            Ok(directory) => {
                tracing::info!(
                    users = directory.names.users.len(),
                    projects = directory.projects.len(),
                    "OpenStack users and projects from Keystone"
                );
                state.directory = directory;
                state.names_at = Some(Instant::now());
                Ok(())
            }
            Err(e) if state.names_at.is_some() => {
                tracing::warn!(error = %e, "Keystone's users and projects not refreshed; the last ones are kept");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The servers `filter` selects (`uuid=…`: one), listed and deleted (those of `window`
    /// too), one record each.
    fn servers(
        &self,
        filter: &[(&str, String)],
        window: &[(&str, String)],
    ) -> Result<Vec<Server>, AccountingError> {
        let running = self.api.servers(filter).map_err(other)?;
        let mut query = vec![("deleted", "true".to_owned())];
        query.extend(filter.iter().cloned());
        query.extend(window.iter().cloned());
        let deleted = self.api.servers(&query).map_err(other)?;
        // A server deleted while the lists were read is in both: its deleted record wins.
        let gone: BTreeSet<String> = deleted.iter().map(|s| s.id.clone()).collect();
        Ok(running
            .into_iter()
            .filter(|s| !gone.contains(&s.id))
            .chain(deleted)
            .collect())
    }
}

fn other(e: impl std::fmt::Display) -> AccountingError {
    AccountingError::Other(e.to_string())
}

/// Nova's time in a query.
fn nova_time(epoch: i64) -> String {
    jiff::Timestamp::from_second(epoch)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

impl Accounting for OpenStackAccounting {
    fn manager(&self) -> &'static str {
        MANAGER
    }

    fn units_since(&self, seconds_ago: i64) -> Result<UnitRecords, AccountingError> {
        let now = unix_now();
        let window = [
            (
                "changes-since",
                nova_time(now.saturating_sub(seconds_ago.max(0))),
            ),
            ("changes-before", nova_time(now)),
        ];
        let servers = self.servers(&[], &window)?;
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let missing = servers.iter().any(|s| state.directory.names.misses(s));
        self.refresh_names(&mut state, missing)?;
        let mut records: Vec<UnitRecord> = servers
            .iter()
            .map(|s| server::to_record(s, &state.directory.names, &self.gpu_aliases, now))
            .collect();
        let listed: BTreeSet<String> = records.iter().map(|r| r.uuid.clone()).collect();
        // Listed running before, in neither list now: ended when last seen.
        let vanished: Vec<String> = state
            .open
            .keys()
            .filter(|id| !listed.contains(*id))
            .cloned()
            .collect();
        for id in vanished {
            if let Some((mut r, seen)) = state.open.remove(&id) {
                tracing::info!(uuid = %id, "server no longer listed by Nova: ended when last seen");
                r.end = Some(seen);
                r.elapsed_seconds = r
                    .start
                    .map_or(0, |s| u64::try_from(seen.saturating_sub(s)).unwrap_or(0));
                r.state = "COMPLETED".into();
                r.reported.state = "DELETED".into();
                r.reported.elapsed = super::elapsed_text(r.elapsed_seconds as i64);
                records.push(r);
            }
        }
        // What runs now, and only that: an ended server must not be closed again later, when
        // the deleted list's window has moved past it.
        state.open = records
            .iter()
            .filter(|r| r.end.is_none())
            .map(|r| (r.uuid.clone(), (r.clone(), now)))
            .collect();
        Ok(Box::new(records.into_iter().map(Ok)))
    }

    fn unit(&self, id: &str) -> Result<UnitRecords, AccountingError> {
        let now = unix_now();
        let by_id = [("uuid", id.to_owned())];
        let servers: Vec<Server> = self
            .servers(&by_id, &[])?
            .into_iter()
            .filter(|s| s.id == id)
            .collect();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let missing = servers.iter().any(|s| state.directory.names.misses(s));
        self.refresh_names(&mut state, missing)?;
        let records: Vec<UnitRecord> = servers
            .iter()
            .map(|s| server::to_record(s, &state.directory.names, &self.gpu_aliases, now))
            .collect();
        Ok(Box::new(records.into_iter().map(Ok)))
    }

    fn associations(
        &self,
    ) -> Option<Result<(Associations, Vec<crate::host::ParseError>), AccountingError>> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = self.refresh_names(&mut state, false) {
            return Some(Err(e));
        }
        Some(Ok((state.directory.associations(), Vec::new())))
    }
}
