//! Resource managers: what Slurm (or another manager) knows of its units, for both wings.
//!
//! - [`ResourceManager`]: the exporter's side. It finds the node's units in the cgroup tree,
//!   says who owns them and which GPUs they hold; `collect::units` reads and emits them.
//! - [`Accounting`]: the stats-server's side. It lists the cluster's units of a time window
//!   and its users and projects; `store::ingest` writes them.
//!
//! A manager is one folder here, over the host layer. Its exporter side plugs into the
//! exporter's registry (a `CollectorSpec` listed in `registry::COLLECTORS`, built on
//! `collect::units::UnitCollector` and the exporter's GPU discovery); its accounting side is
//! built by the stats-server from its settings. Neither wing's code is needed by the other.

use crate::host::command::CommandError;
use crate::host::ParseError;

pub mod civil;
pub mod environ;
pub mod k8s;
pub mod libvirt;
pub mod lsf;
pub mod openpbs;
pub mod openstack;
pub mod registry;
pub mod slurm;

/// The exporter's side of a manager, defined beside the unit collector that uses it.
pub use crate::collect::units::discovery::{
    ResourceManager, UnitCgroup, UnitGpus, UnitInfo, UnitSet,
};

/// How a user asks this manager for resources, for findings' advice: each names the option
/// or field that sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestWords {
    pub cores: &'static str,
    pub memory: &'static str,
    pub gpus: &'static str,
    pub time: &'static str,
}

/// The request words of the manager named `manager` (Slurm's for a name none has).
pub fn request_words(manager: &str) -> RequestWords {
    match manager {
        lsf::MANAGER => lsf::REQUEST_WORDS,
        k8s::MANAGER => k8s::REQUEST_WORDS,
        openpbs::MANAGER => openpbs::REQUEST_WORDS,
        libvirt::MANAGER => libvirt::REQUEST_WORDS,
        openstack::MANAGER => openstack::REQUEST_WORDS,
        _ => slurm::REQUEST_WORDS,
    }
}

/// What to ask for instead, in the manager's syntax, to paste: memory `bytes` (a peak with its
/// margin) rounded up to a whole GiB (256 MiB under one), or None where the manager has no
/// such option (a VM's flavour).
pub fn memory_request(manager: &str, bytes: f64) -> Option<String> {
    const GIB: f64 = (1u64 << 30) as f64;
    let (amount, unit) = match bytes {
        b if b >= GIB => ((b / GIB).ceil() as u64, "G"),
        b => (((b / (GIB / 4.0)).ceil().max(1.0) * 256.0) as u64, "M"),
    };
    match manager {
        lsf::MANAGER => Some(format!("bsub -M {amount}{unit}B")),
        openpbs::MANAGER => Some(format!("-l select=…:mem={amount}{}b", unit.to_lowercase())),
        k8s::MANAGER => Some(format!("resources.requests.memory: {amount}{unit}i")),
        libvirt::MANAGER | openstack::MANAGER => None,
        _ => Some(format!("--mem={amount}{unit}")),
    }
}

/// A time limit to ask for instead, in the manager's syntax: `seconds` rounded up to a
/// quarter of an hour, or under an hour to the minute (a quarter of an hour can be more than a
/// short job asked for).
pub fn time_request(manager: &str, seconds: i64) -> Option<String> {
    let step = if seconds < 3600 { 60 } else { 900 };
    let s = (seconds.max(1) + step - 1) / step * step;
    let (d, h, m) = (s / 86400, s / 3600 % 24, s / 60 % 60);
    match manager {
        lsf::MANAGER => Some(format!("bsub -W {}:{m:02}", s / 3600)),
        openpbs::MANAGER => Some(format!("-l walltime={:02}:{m:02}:00", s / 3600)),
        k8s::MANAGER => Some(format!("activeDeadlineSeconds: {s}")),
        libvirt::MANAGER | openstack::MANAGER => None,
        _ if d > 0 => Some(format!("--time={d}-{h:02}:{m:02}:00")),
        _ => Some(format!("--time={h:02}:{m:02}:00")),
    }
}

/// Seconds since the epoch, as accounting records count them (0 before 1970).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Whether `id` can be a unit's id under any manager: a Slurm job (`42`), an LSF array element
/// (`42[3]`), a pod UID, a VM UUID. Nothing else reaches a manager's command or the database.
pub fn is_unit_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'[' | b']'))
        && !id.starts_with('-')
}

/// Whether `unit` may be named to a manager's command (`scancel`, `bkill`, `qdel`): an id and
/// an owner that no command can read as an option.
pub fn check_nameable(unit: &UnitRecord) -> Result<(), AccountingError> {
    let user_ok = !unit.user.is_empty()
        && !unit.user.starts_with('-')
        && unit
            .user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@'));
    match is_unit_id(&unit.uuid) && user_ok {
        true => Ok(()),
        false => Err(AccountingError::Other(format!(
            "unit `{}` of user `{}` cannot be named to a command",
            unit.uuid.escape_debug(),
            unit.user.escape_debug()
        ))),
    }
}

/// What an accounting source says of one unit: a row of the stats-server's `units` table.
/// Fields a manager does not know stay empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitRecord {
    /// The manager's id of the unit (a Slurm job id).
    pub uuid: String,
    /// The queue the unit ran in (Slurm's partition).
    pub partition: String,
    /// Its service class (Slurm's QoS).
    pub qos: String,
    /// The project it is charged to (Slurm's account).
    pub account: String,
    pub group: String,
    pub gid: Option<u32>,
    pub user: String,
    pub uid: Option<u32>,
    pub submit: Option<i64>,
    pub start: Option<i64>,
    pub end: Option<i64>,
    pub elapsed_seconds: u64,
    pub exit_code: String,
    /// The state without its detail (`CANCELLED by 0` → `CANCELLED`).
    pub state: String,
    pub allocation: Allocation,
    pub nodes: Vec<String>,
    pub workdir: String,
    /// The requested time limit (None: unlimited or the queue's).
    pub time_limit_seconds: Option<u64>,
    pub name: String,
    /// What the manager said in its own words, for CEEMS's answers.
    pub reported: Reported,
}

/// A unit's facts as its manager wrote them, where CEEMS answers them so: Slurm's state with
/// its detail (`CANCELLED by 1002`), its `Elapsed` (`00:08:17`), its compact node list
/// (`compute-[0-2]`). Empty where a manager has no such words.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Reported {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub state: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub elapsed: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub nodelist: String,
    /// How many nodes it was given (Slurm's `AllocTRES` `node=`), which a node list written
    /// as a range does not say without expanding it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nodes: u64,
    /// What the manager says the unit holds, in its own names (a pod's `vcpus`, `mem` and
    /// GPU resources), answered in place of the common allocation.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub allocation: serde_json::Map<String, serde_json::Value>,
    /// The manager's own tags (a pod's `qos`, `annotations`, `labels`), answered in place of
    /// the batch schedulers' ones.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub tags: serde_json::Map<String, serde_json::Value>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A duration as sacct writes `Elapsed` and CEEMS answers it: `HH:MM:SS`, `D-HH:MM:SS` past
/// a day.
pub fn elapsed_text(seconds: i64) -> String {
    let s = seconds.max(0);
    let (days, h, m, s) = (s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
    match days {
        0 => format!("{h:02}:{m:02}:{s:02}"),
        d => format!("{d}-{h:02}:{m:02}:{s:02}"),
    }
}

impl Reported {
    /// As stored: a JSON object, `{}` when empty.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }
}

/// What a unit holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allocation {
    pub cpus: u64,
    pub mem_bytes: u64,
    pub gpus: u64,
    /// Slurm's billing units; 0 where the manager has none.
    pub billing: u64,
    pub nodes: u64,
}

/// A cluster's projects and their members.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Associations {
    pub projects: Vec<String>,
    /// (user, project)
    pub members: Vec<(String, String)>,
    /// Ids of users besides their names, where the manager has them (Keystone's), by name.
    pub user_uids: std::collections::BTreeMap<String, String>,
    /// The same for projects.
    pub project_uids: std::collections::BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    #[test]
    fn requests_to_paste_are_in_each_manager_s_syntax() {
        let gib = (1u64 << 30) as f64;
        assert_eq!(
            super::memory_request("slurm", 17.2 * gib).as_deref(),
            Some("--mem=18G")
        );
        assert_eq!(
            super::memory_request("slurm", 0.3 * gib).as_deref(),
            Some("--mem=512M")
        );
        assert_eq!(
            super::memory_request("lsf", 17.2 * gib).as_deref(),
            Some("bsub -M 18GB")
        );
        assert_eq!(
            super::memory_request("openpbs", 2.0 * gib).as_deref(),
            Some("-l select=…:mem=2gb")
        );
        assert_eq!(
            super::memory_request("k8s", 2.5 * gib).as_deref(),
            Some("resources.requests.memory: 3Gi")
        );
        assert_eq!(super::memory_request("openstack", gib), None);
        assert_eq!(
            super::time_request("slurm", 5000).as_deref(),
            Some("--time=01:30:00")
        );
        assert_eq!(
            super::time_request("slurm", 100_000).as_deref(),
            Some("--time=1-04:00:00")
        );
        assert_eq!(
            super::time_request("lsf", 5000).as_deref(),
            Some("bsub -W 1:30")
        );
        assert_eq!(
            super::time_request("openpbs", 100_000).as_deref(),
            Some("-l walltime=28:00:00")
        );
        assert_eq!(
            super::time_request("k8s", 60).as_deref(),
            Some("activeDeadlineSeconds: 60")
        );
        // Under an hour, to the minute: a 10-minute job that ran 37 s is told a minute.
        assert_eq!(
            super::time_request("slurm", 37).as_deref(),
            Some("--time=00:01:00")
        );
        assert_eq!(
            super::time_request("lsf", 3000).as_deref(),
            Some("bsub -W 0:50")
        );
    }

    #[test]
    fn unit_ids_of_every_manager_and_nothing_else() {
        for id in [
            "42",
            "42[3]",
            "483168fc-b347-4aa2-a9fa-9e3d220ba4c5",
            "instance-0000_1.a",
        ] {
            assert!(super::is_unit_id(id), "{id}");
        }
        for id in ["", "--help", "1;rm", "a b", "../x", "é", &"9".repeat(129)] {
            assert!(!super::is_unit_id(id), "{id}");
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AccountingError {
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error("{0}")]
    Other(String),
    /// The manager has no way, or no configured way, to do what was asked.
    #[error("{0}")]
    Unsupported(String),
}

/// Why an accounting answer's next unit did not come.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// This record could not be read; the ones after it still come.
    #[error(transparent)]
    Malformed(#[from] ParseError),
    /// The answer broke off (its command failed or was killed): no unit comes after this, and
    /// the answer was not whole.
    #[error(transparent)]
    Broken(#[from] AccountingError),
}

/// A unit of an accounting answer, or why it did not come.
pub type UnitRecords = Box<dyn Iterator<Item = Result<UnitRecord, RecordError>> + Send>;

/// An answer read whole: its units and the records that could not be read.
pub fn whole_answer(records: Vec<Result<UnitRecord, ParseError>>) -> UnitRecords {
    Box::new(records.into_iter().map(|r| r.map_err(RecordError::from)))
}

/// A cluster's accounting, as the stats-server pulls it. Both calls block: the server runs
/// them off its async workers.
pub trait Accounting: Send + Sync + 'static {
    /// The manager's name, as the schema records it.
    fn manager(&self) -> &'static str;
    /// The units that were pending, running or ended in the last `seconds_ago` seconds.
    fn units_since(&self, seconds_ago: i64) -> Result<UnitRecords, AccountingError>;
    /// The unit `id` whenever it ran: for a report asked for before the next pull has seen it.
    fn unit(&self, id: &str) -> Result<UnitRecords, AccountingError>;
    /// The cluster's projects and members, with the records that could not be read; None
    /// when this cluster's are not pulled.
    fn associations(&self) -> Option<Result<(Associations, Vec<ParseError>), AccountingError>>;
    /// Ends the running `unit`, as the manager described it a moment ago, in the manager's own
    /// way (Slurm's `scancel`, LSF's `bkill`, PBS's `qdel`, a pod's deletion), restricted to
    /// the unit's owner where the manager can be told so. Returns what the manager said.
    fn cancel(&self, unit: &UnitRecord) -> Result<String, AccountingError> {
        let _ = unit;
        Err(AccountingError::Unsupported(format!(
            "ceems cannot end {} units",
            self.manager()
        )))
    }
}
