//! Reads the accounting of one compute unit's cgroup, v1 or v2, under an injected root.
//!
//! Resource managers find their units and hand this module a path relative to the hierarchy;
//! it reads each file once into a [`UnitStats`]. Here: the version, the v1 controllers and the
//! types; `reader` reads a unit's files, `subtree` walks its processes, `detail` the optional
//! groups (per core, memory detail, IO), `kept` the descriptors kept between scrapes.

pub mod detail;
pub mod kept;
pub mod parse;
mod populated;
mod reader;
mod reader_thread;
mod subtree;

pub use populated::{subdirs, Populated, Subdir};
pub use reader::{clock_ticks, CgroupReader};
pub use reader_thread::{ReaderThread, ReaderThreadError};
pub use subtree::{find_pid, first_pid, shape, subtree, SubtreeShape};

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

impl CgroupVersion {
    /// Parses the `--collector.cgroups.force-version` value.
    pub fn from_flag(s: &str) -> Option<CgroupVersion> {
        match s {
            "v1" => Some(CgroupVersion::V1),
            "v2" => Some(CgroupVersion::V2),
            _ => None,
        }
    }
}

/// Detects the cgroup version of the hierarchy mounted at `root`: the cgroup2 filesystem
/// magic, or a `cgroup.controllers` file at the top for trees that are not mounts (fixtures).
pub fn detect_version(root: &Path) -> CgroupVersion {
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    if let Ok(st) = nix::sys::statfs::statfs(root) {
        #[allow(clippy::unnecessary_cast)]
        if st.filesystem_type().0 as i64 == CGROUP2_SUPER_MAGIC {
            return CgroupVersion::V2;
        }
    }
    if root.join("cgroup.controllers").is_file() {
        CgroupVersion::V2
    } else {
        CgroupVersion::V1
    }
}

/// Errors of reading one unit.
#[derive(Debug, thiserror::Error)]
pub enum UnitError {
    /// The unit's directory is gone: the job ended between discovery and reading.
    #[error("cgroup {0} vanished")]
    Vanished(PathBuf),
}

/// What went wrong with one file of a unit; the unit is still reported, flagged with an error.
#[derive(Debug)]
pub struct FileFault {
    pub path: PathBuf,
    pub message: String,
}

/// The accounting of one unit, in base units.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UnitStats {
    pub cpu_user_seconds: f64,
    pub cpu_system_seconds: f64,
    /// CPUs of the unit: its cpuset's, or what its manager says (a Kubernetes pod's may be a
    /// fraction).
    pub cpus: f64,
    pub cpu_psi_seconds: f64,
    pub memory_rss_bytes: f64,
    pub memory_cache_bytes: f64,
    pub memory_used_bytes: f64,
    pub memory_total_bytes: f64,
    pub memory_fail_count: f64,
    pub memsw_used_bytes: f64,
    pub memsw_total_bytes: f64,
    pub memsw_fail_count: f64,
    pub memory_psi_seconds: f64,
    /// The rdma controller's `rdma.current`, per device; empty without the controller.
    pub rdma: Vec<parse::HcaUsage>,
}

/// Which optional groups of files to read.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadOptions {
    pub swap: bool,
    pub psi: bool,
}

/// Host memory, used when a unit has no limit of its own.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostMemory {
    pub mem_total_bytes: f64,
    pub swap_total_bytes: f64,
}

/// The controllers of a v1 hierarchy, resolved once: Debian mounts `cpuacct` alone, most
/// distributions mount `cpu,cpuacct`.
#[derive(Debug, Clone)]
pub struct V1Controllers {
    pub cpuacct: PathBuf,
    pub memory: PathBuf,
    pub cpuset: PathBuf,
    pub rdma: PathBuf,
    /// The v2 hierarchy of a hybrid host (`unified`), which counts every cgroup's CPU time.
    pub unified: PathBuf,
}

impl V1Controllers {
    pub fn resolve(root: &Path) -> V1Controllers {
        let first_dir = |names: &[&str]| {
            names
                .iter()
                .map(|n| root.join(n))
                .find(|p| p.is_dir())
                .unwrap_or_else(|| root.join(names[0]))
        };
        V1Controllers {
            cpuacct: first_dir(&["cpu,cpuacct", "cpuacct,cpu", "cpuacct"]),
            memory: root.join("memory"),
            cpuset: root.join("cpuset"),
            rdma: root.join("rdma"),
            unified: root.join("unified"),
        }
    }

    /// The directory of a v1 subsystem name as given by `--collector.cgroups.active-subsystem`.
    pub fn subsystem_dir(&self, root: &Path, name: &str) -> PathBuf {
        match name {
            "cpuacct" | "cpu" => self.cpuacct.clone(),
            "memory" => self.memory.clone(),
            "cpuset" => self.cpuset.clone(),
            "rdma" => self.rdma.clone(),
            other => root.join(other),
        }
    }
}
