//! `slurm`: per-job metrics of Slurm jobs from their cgroups (v1 and v2).
//!
//! Discovery, per scrape:
//! - v1: `<cgroupfs>/<active subsystem>/slurm*/uid_*/job_<id>`; `slurm_<node>` roots come from
//!   slurmd built for several daemons per host and fill the `cgrouphostname` label.
//! - v2: `<cgroupfs>/system.slice/*slurmstepd.scope/job_<id>`; `<node>_slurmstepd.scope` fills
//!   `cgrouphostname`. Slurm 26.05 may name job directories by an opaque identifier instead
//!   of `job_<id>`: for those the numeric id is `SLURM_JOB_ID` in a job process's environ,
//!   cached per directory until the job ends.
//!
//! Jobs whose cgroup subtree holds no process are dropped, as CEEMS does.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Deserialize;

use super::cgroup::{
    self, names, CgroupReader, CgroupVersion, FileFault, HostMemory, ReadOptions, UnitError,
};
use super::procfs;
use super::{Capability, CollectError, Collector, CollectorSpec, Context};
use crate::config::Opt;
use crate::metrics::{Labels, MetricSet};

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "slurm",
    default_enabled: false,
    // Reading other users' /proc/<pid>/environ (opaque job directories).
    capabilities: &[Capability::CAP_SYS_PTRACE, Capability::CAP_DAC_READ_SEARCH],
    options,
    build,
};

const MANAGER: &str = "slurm";

fn options() -> Vec<Opt> {
    vec![
        Opt::flag(
            "collector.slurm.swap-memory-metrics",
            "Export swap usage of jobs (ceems_compute_unit_memsw_*)",
        )
        .alias("collector.slurm.swap.memory.metrics"),
        Opt::flag(
            "collector.slurm.psi-metrics",
            "Export pressure stall information of jobs (cgroups v2 only)",
        )
        .alias("collector.slurm.psi.metrics"),
    ]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Settings {
    #[serde(default)]
    #[allow(dead_code)]
    enabled: bool,
    swap_memory_metrics: bool,
    psi_metrics: bool,
}

/// A job's cgroup, as found by discovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobCgroup {
    /// The Slurm job id.
    pub uuid: String,
    /// The node name of a multi-slurmd host, else empty.
    pub cgroup_host: String,
    /// Path relative to the hierarchy (v2) or to each controller (v1).
    pub rel: PathBuf,
}

pub struct SlurmCollector {
    version: CgroupVersion,
    /// Where discovery starts: the active v1 controller, or the v2 root.
    base: PathBuf,
    procfs: PathBuf,
    hostname: String,
    read_opts: ReadOptions,
    reader: Mutex<CgroupReader>,
    /// Opaque job directory → job id, kept while the directory exists.
    opaque_ids: Mutex<HashMap<PathBuf, String>>,
}

fn host_memory(procfs: &Path) -> HostMemory {
    let mut host = HostMemory::default();
    if let Ok(text) = std::fs::read_to_string(procfs.join("meminfo")) {
        let _ = procfs::meminfo(&text, |name, v| match name.as_str() {
            "MemTotal_bytes" => host.mem_total_bytes = v,
            "SwapTotal_bytes" => host.swap_total_bytes = v,
            _ => {}
        });
    }
    host
}

fn build(ctx: &Context) -> Result<Box<dyn Collector>, CollectError> {
    let s: Settings = ctx
        .settings
        .get("")
        .map_err(|e| CollectError::Other(e.to_string()))?;
    let root = &ctx.paths.cgroupfs;
    let version = match ctx.common.cgroups.force_version.as_deref() {
        Some(v) => CgroupVersion::from_flag(v)
            .ok_or_else(|| CollectError::Other(format!("unknown cgroup version `{v}`")))?,
        None => cgroup::detect_version(root),
    };
    let reader = CgroupReader::new(root, version, host_memory(&ctx.paths.procfs));
    let base = match version {
        CgroupVersion::V1 => reader
            .v1_controllers()
            .subsystem_dir(root, &ctx.common.cgroups.active_subsystem),
        CgroupVersion::V2 => root.join("system.slice"),
    };
    tracing::info!(
        version = ?version,
        base = %base.display(),
        "slurm collector discovers jobs"
    );
    Ok(Box::new(SlurmCollector {
        version,
        base,
        procfs: ctx.paths.procfs.clone(),
        hostname: ctx.hostname.clone(),
        read_opts: ReadOptions {
            swap: s.swap_memory_metrics,
            psi: s.psi_metrics,
        },
        reader: Mutex::new(reader),
        opaque_ids: Mutex::new(HashMap::new()),
    }))
}

fn job_id_of(name: &OsStr) -> Option<&str> {
    let id = name.to_str()?.strip_prefix("job_")?;
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())).then_some(id)
}

fn subdirs(dir: &Path) -> Vec<(std::ffi::OsString, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<_> = entries
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .map(|e| (e.file_name(), e.path()))
        .collect();
    out.sort();
    out
}

/// A job directory found by walking, before its processes are checked.
struct Candidate {
    id: Option<String>,
    cgroup_host: String,
    abs: PathBuf,
}

impl SlurmCollector {
    fn candidates(&self) -> Result<Vec<Candidate>, CollectError> {
        let roots = std::fs::read_dir(&self.base).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                CollectError::Absent(format!("no cgroup hierarchy at {}", self.base.display()))
            } else {
                CollectError::io(&self.base, e)
            }
        })?;
        let mut roots: Vec<(String, PathBuf)> = roots
            .flatten()
            .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
            .filter_map(|e| Some((e.file_name().to_str()?.to_owned(), e.path())))
            .collect();
        roots.sort();
        let mut out = Vec::new();
        for (name, path) in roots {
            match self.version {
                CgroupVersion::V1 => {
                    let host = match name.as_str() {
                        "slurm" => "",
                        n => match n.strip_prefix("slurm_") {
                            Some(h) => h,
                            None => continue,
                        },
                    };
                    // slurm/uid_<uid>/job_<id>, and job_<id> directly under the root.
                    for (child, child_path) in subdirs(&path) {
                        if let Some(id) = job_id_of(&child) {
                            out.push(candidate(Some(id), host, child_path));
                        } else if child.to_str().is_some_and(|c| c.starts_with("uid_")) {
                            for (job, job_path) in subdirs(&child_path) {
                                if let Some(id) = job_id_of(&job) {
                                    out.push(candidate(Some(id), host, job_path));
                                }
                            }
                        }
                    }
                }
                CgroupVersion::V2 => {
                    let host = match name.as_str() {
                        "slurmstepd.scope" => "",
                        n => match n.strip_suffix("_slurmstepd.scope") {
                            Some(h) => h,
                            None => continue,
                        },
                    };
                    for (child, child_path) in subdirs(&path) {
                        if let Some(id) = job_id_of(&child) {
                            out.push(candidate(Some(id), host, child_path));
                        } else if child != "system" {
                            out.push(candidate(None, host, child_path));
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Finds the jobs with at least one process, resolving opaque directories to job ids.
    pub fn discover(&self, faults: &mut Vec<FileFault>) -> Result<Vec<JobCgroup>, CollectError> {
        let mut ids = self.opaque_ids.lock().unwrap_or_else(|p| p.into_inner());
        let mut seen_opaque = Vec::new();
        let mut jobs = Vec::new();
        for c in self.candidates()? {
            let uuid = match c.id {
                Some(id) => {
                    if cgroup::first_pid(&c.abs, faults).is_none() {
                        continue;
                    }
                    id
                }
                None => {
                    seen_opaque.push(c.abs.clone());
                    match ids.get(&c.abs) {
                        Some(id) => id.clone(),
                        None => match self.opaque_job_id(&c.abs, faults) {
                            Some(id) => {
                                ids.insert(c.abs.clone(), id.clone());
                                id
                            }
                            None => continue,
                        },
                    }
                }
            };
            let rel = c
                .abs
                .strip_prefix(&self.base)
                .map(Path::to_path_buf)
                .unwrap_or_else(|_| c.abs.clone());
            let rel = match self.version {
                CgroupVersion::V1 => rel,
                CgroupVersion::V2 => Path::new("system.slice").join(rel),
            };
            jobs.push(JobCgroup {
                uuid,
                cgroup_host: c.cgroup_host,
                rel,
            });
        }
        ids.retain(|k, _| seen_opaque.contains(k));
        Ok(jobs)
    }

    /// The job id of an opaque directory: `SLURM_JOB_ID` of the first process that has one
    /// (slurmstepd itself sits in the job's subtree and has none).
    fn opaque_job_id(&self, dir: &Path, faults: &mut Vec<FileFault>) -> Option<String> {
        let mut found = None;
        let mut path = PathBuf::new();
        cgroup::find_pid(dir, faults, &mut |pid| {
            path.clear();
            path.push(&self.procfs);
            path.push(pid.to_string());
            path.push("environ");
            let Ok(environ) = std::fs::read(&path) else {
                return false;
            };
            match procfs::slurm_job_id(&environ) {
                Ok(Some(id)) => {
                    found = Some(id.to_string());
                    true
                }
                Ok(None) => false,
                Err(e) => {
                    tracing::debug!(path = %path.display(), error = %e, "bad SLURM_JOB_ID");
                    false
                }
            }
        });
        if found.is_none() {
            tracing::debug!(
                cgroup = %dir.display(),
                "no process with SLURM_JOB_ID in job cgroup; skipping it"
            );
        }
        found
    }
}

fn candidate(id: Option<&str>, host: &str, abs: PathBuf) -> Candidate {
    Candidate {
        id: id.map(str::to_owned),
        cgroup_host: host.to_owned(),
        abs,
    }
}

impl Collector for SlurmCollector {
    fn name(&self) -> &'static str {
        "slurm"
    }

    fn capabilities(&self) -> &'static [Capability] {
        SPEC.capabilities
    }

    fn collect(&self, out: &mut MetricSet) -> Result<(), CollectError> {
        let mut faults = Vec::new();
        let jobs = self.discover(&mut faults)?;
        for f in faults.drain(..) {
            tracing::warn!(path = %f.path.display(), error = %f.message, "cannot read job processes");
        }
        let mut reader = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        let mut count = 0usize;
        for job in &jobs {
            let stats = match reader.read_unit(&job.rel, self.read_opts, &mut faults) {
                Ok(s) => s,
                Err(UnitError::Vanished(_)) => {
                    tracing::debug!(job = %job.uuid, "job cgroup vanished during the scrape");
                    faults.clear();
                    continue;
                }
            };
            count += 1;
            let labels = Labels::new(&[
                ("cgrouphostname", &job.cgroup_host),
                ("hostname", &self.hostname),
                ("manager", MANAGER),
                ("uuid", &job.uuid),
            ]);
            if !faults.is_empty() {
                for f in faults.drain(..) {
                    tracing::warn!(job = %job.uuid, path = %f.path.display(), error = %f.message, "cannot read job cgroup file");
                }
                out.gauge(
                    names::COLLECT_ERROR,
                    names::COLLECT_ERROR_HELP,
                    labels.clone(),
                    1.0,
                );
            }
            cgroup::emit_unit(out, &labels, &stats, self.read_opts);
        }
        out.gauge(
            names::UNITS,
            names::UNITS_HELP,
            Labels::new(&[("hostname", &self.hostname), ("manager", MANAGER)]),
            count as f64,
        );
        Ok(())
    }
}
