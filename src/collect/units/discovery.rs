//! What the unit collector asks of a resource manager: the node's units with their cgroups,
//! what it knows of each (info, GPUs). A manager (a folder of `src/manager/`) implements
//! [`ResourceManager`]; this layer never names one.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::collect::CollectError;
use crate::host::cgroup::{CgroupVersion, FileFault, Populated};
use crate::host::gpu::GpuDevice;

/// A unit's cgroup, as its manager's discovery found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitCgroup {
    /// The manager's id of the unit (a Slurm job id).
    pub uuid: String,
    /// The node name of a host that runs several of the manager's daemons, else empty.
    pub cgroup_host: String,
    /// Path relative to the hierarchy (v2) or to each controller (v1).
    pub rel: PathBuf,
    /// The unit's directory in the hierarchy discovery walks.
    pub dir: PathBuf,
    /// `dir`'s inode as discovery listed it: tells a directory made again under the same
    /// name from the one whose files are kept open.
    pub dir_ino: Option<u64>,
}

/// `ceems_compute_unit_info` of one unit: its help text and the labels beside the unit's own.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitInfo {
    pub help: &'static str,
    pub labels: Vec<(&'static str, String)>,
}

/// The GPUs a unit holds, with its share of each.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitGpus {
    pub manager: &'static str,
    pub uuid: String,
    /// The unit's cgroup relative to the hierarchy (v2) or to each controller (v1), as
    /// `/proc/<pid>/cgroup` names it: which processes are the unit's.
    pub rel: PathBuf,
    pub cgroup_host: String,
    /// `(the manager's index, device, share)`: the unit's share of the device (shards, MPS,
    /// a GPU held by several jobs); the device's own fraction of its GPU is `device.fraction`.
    pub devices: Vec<(u32, GpuDevice, f64)>,
}

/// What a resource manager knows of the node's units.
pub trait ResourceManager: Send + Sync + 'static {
    /// The `manager` label of the units' series.
    fn name(&self) -> &'static str;
    /// The node's units that hold at least one process. A unit-level fault (a file that
    /// cannot be read) goes to `faults`; only a hierarchy that cannot be read is an error.
    fn discover(&self, faults: &mut Vec<FileFault>) -> Result<Vec<UnitCgroup>, CollectError>;
    /// The unit's `ceems_compute_unit_info`, when the manager exports one.
    fn info(&self, _unit: &UnitCgroup) -> Option<UnitInfo> {
        None
    }
    /// The CPUs the manager gave the unit, when its cpuset cannot say (an LSF job without
    /// CPU affinity has every CPU in it; a Kubernetes pod gets a share); None: the cpuset's.
    fn cpus(&self, _unit: &UnitCgroup) -> Option<f64> {
        None
    }
    /// The GPUs each of `units` holds; empty on a node without GPUs.
    fn gpus(&self, _units: &[UnitCgroup]) -> Vec<UnitGpus> {
        Vec::new()
    }
    /// Forgets what it keeps of units that are gone.
    fn retain(&self, _present: &UnitSet<'_>) {}
}

/// The uuids of the units a scrape found. Hashed with foldhash: SipHash showed in profiles
/// at a thousand jobs a scrape, and uuids come from the node's own cgroup names.
pub type UnitSet<'a> = HashSet<&'a str, foldhash::fast::RandomState>;

/// The units of `found` (uuid, directory, inode) whose directories hold a process, with
/// their paths relative to `root`; `populated` forgets the directories no longer found.
pub fn populated_units(
    populated: &mut Populated,
    version: CgroupVersion,
    root: &Path,
    found: &[(String, PathBuf, u64)],
    faults: &mut Vec<FileFault>,
) -> Vec<UnitCgroup> {
    let present: HashSet<&Path> = found.iter().map(|(_, d, _)| d.as_path()).collect();
    populated.retain(|k| present.contains(k));
    found
        .iter()
        .filter(|(_, dir, ino)| populated.check(version, dir, Some(*ino), faults))
        .map(|(uuid, dir, ino)| UnitCgroup {
            uuid: uuid.clone(),
            cgroup_host: String::new(),
            rel: dir.strip_prefix(root).unwrap_or(dir).to_path_buf(),
            dir: dir.clone(),
            dir_ino: Some(*ino),
        })
        .collect()
}
