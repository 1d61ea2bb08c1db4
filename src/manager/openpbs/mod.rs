//! OpenPBS jobs as compute units (`--collector.openpbs`). PBS's `pbs_cgroups` hook puts a
//! job's processes in `pbs_jobs.service/jobid/<job id>` (the full id with its server and array
//! index: `1009249[0].pbs-server`) of each v1 controller, or of the v2 hierarchy (CEEMS
//! refuses v2; the hook supports it, and so do we). CPUs come from the job's cpuset; no PBS
//! command runs. A job's GPUs are the `CUDA_VISIBLE_DEVICES` (GPU or MIG UUIDs) the hook sets
//! in its processes, read from the processes whose `PBS_JOBID` is the job's.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Deserialize;

use crate::collect::gpu::{self, GpuDevice};
use crate::collect::units::discovery::populated_units;
use crate::collect::units::{cgroup_version, SubCollector, UnitCollector};
use crate::collect::{Capability, CollectError, Collector, CollectorSpec, Context};
use crate::config::Opt;
use crate::host::cgroup::{
    subdirs, CgroupVersion, FileFault, Populated, ReadOptions, V1Controllers,
};
use crate::manager::environ::read_units_environ;
use crate::manager::{ResourceManager, UnitCgroup, UnitGpus};

pub mod accounting;
pub mod records;
pub mod setup;

pub const MANAGER: &str = "openpbs";

/// How a job asks OpenPBS for resources, in findings' advice.
pub const REQUEST_WORDS: super::RequestWords = super::RequestWords {
    cores: "qsub -l select=…:ncpus=…",
    memory: "qsub -l select=…:mem=…",
    gpus: "qsub -l select=…:ngpus=…",
    time: "qsub -l walltime=…",
};

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "openpbs",
    default_enabled: false,
    // Reading jobs' environments (other users' processes) for their GPUs.
    capabilities: &[Capability::CAP_SYS_PTRACE, Capability::CAP_DAC_READ_SEARCH],
    options,
    build,
    self_test: Some(|paths, caps| {
        crate::security::check::test_foreign_environ(&paths.procfs, caps)
    }),
    sub_collectors: &[SubCollector::Perf, SubCollector::Ebpf],
};

/// The hook's parent of job cgroups, under each controller (v1) or the root (v2).
pub const JOBS_DIR: &str = "pbs_jobs.service/jobid";

fn options() -> Vec<Opt> {
    vec![
        Opt::flag(
            "collector.openpbs.swap-memory-metrics",
            "Export swap usage of jobs (ceems_compute_unit_memsw_*)",
        ),
        Opt::flag(
            "collector.openpbs.psi-metrics",
            "Export pressure stall information of jobs (cgroups v2 only)",
        ),
    ]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Settings {
    swap_memory_metrics: bool,
    psi_metrics: bool,
}

/// The `openpbs` collector: PBS jobs read and emitted as units.
pub type OpenPbsCollector = UnitCollector<OpenPbsManager>;

fn build(ctx: &Context) -> Result<Box<dyn Collector>, CollectError> {
    let s: Settings = ctx.settings()?;
    let version = cgroup_version(ctx)?;
    let mut manager = OpenPbsManager::new(
        &ctx.paths.cgroupfs,
        &ctx.paths.procfs,
        version,
        &ctx.common.cgroups.active_subsystem,
    );
    manager.devices = gpu::discover_for_units(&ctx.common.gpu, &ctx.paths.sysfs, "jobs");
    tracing::info!(version = ?version, jobs = %manager.root.join(JOBS_DIR).display(), "openpbs collector discovers jobs");
    let collector = UnitCollector::new(
        manager,
        &ctx.paths.cgroupfs,
        &ctx.paths.procfs,
        version,
        &ctx.hostname,
        ReadOptions {
            swap: s.swap_memory_metrics,
            psi: s.psi_metrics,
        },
        SPEC.capabilities,
    )
    .with_context(ctx, version)?;
    Ok(Box::new(collector))
}

/// Whether a directory name is a PBS job id: `<sequence>[<index>].<server>`.
pub fn is_job_id(name: &str) -> bool {
    let Some((head, server)) = name.split_once('.') else {
        return false;
    };
    let sequence = match head.split_once('[') {
        Some((n, index)) => match index.strip_suffix(']') {
            Some(i) if !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return false,
        },
        None => head,
    };
    !sequence.is_empty()
        && sequence.bytes().all(|b| b.is_ascii_digit())
        && !server.is_empty()
        && crate::manager::is_unit_id(name)
}

/// OpenPBS as a resource manager: its jobs, with their GPUs from their environments.
pub struct OpenPbsManager {
    version: CgroupVersion,
    /// The v1 controller or v2 root that holds the hook's jobs.
    root: PathBuf,
    procfs: PathBuf,
    populated: Mutex<Populated>,
    devices: Vec<GpuDevice>,
    /// Each job's devices (positions in `devices`), read once per job.
    held: Mutex<HashMap<String, Vec<usize>>>,
}

impl OpenPbsManager {
    pub fn new(
        cgroupfs: &Path,
        procfs: &Path,
        version: CgroupVersion,
        active_subsystem: &str,
    ) -> OpenPbsManager {
        let root = match version {
            CgroupVersion::V1 => {
                V1Controllers::resolve(cgroupfs).subsystem_dir(cgroupfs, active_subsystem)
            }
            CgroupVersion::V2 => cgroupfs.to_owned(),
        };
        OpenPbsManager {
            version,
            root,
            procfs: procfs.to_owned(),
            populated: Mutex::new(Populated::default()),
            devices: Vec::new(),
            held: Mutex::new(HashMap::new()),
        }
    }

    /// Reads the GPUs of jobs not read before.
    fn read_gpus(&self, units: &[UnitCgroup]) -> HashMap<String, Vec<usize>> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let present: BTreeSet<&str> = units.iter().map(|u| u.uuid.as_str()).collect();
        held.retain(|k, _| present.contains(k.as_str()));
        let missing: Vec<&UnitCgroup> = units
            .iter()
            .filter(|u| !held.contains_key(&u.uuid))
            .collect();
        let reads = read_units_environ(
            &missing,
            &self.procfs,
            SPEC.capabilities,
            "PBS_JOBID",
            &["CUDA_VISIBLE_DEVICES"],
        );
        for (uuid, visible) in reads {
            // A job whose processes say nothing yet is asked again at the next scrape.
            if let Some(visible) = visible {
                held.insert(uuid, device_positions(&visible, &self.devices));
            }
        }
        held.clone()
    }
}

/// The devices `CUDA_VISIBLE_DEVICES` names: whole GPUs by UUID, MIG instances by theirs
/// (case does not matter); ordinals and unknown ids are skipped.
pub fn device_positions(visible: &str, devices: &[GpuDevice]) -> Vec<usize> {
    let mut at: Vec<usize> = visible
        .split(',')
        .map(|id| id.trim().to_ascii_lowercase())
        .filter(|id| !id.is_empty())
        .filter_map(|id| {
            devices.iter().position(|d| match &d.instance_uuid {
                Some(mig) => mig.to_ascii_lowercase() == id,
                None => d.gpu_instance_id.is_none() && d.uuid.to_ascii_lowercase() == id,
            })
        })
        .collect();
    at.sort_unstable();
    at.dedup();
    at
}

impl ResourceManager for OpenPbsManager {
    fn name(&self) -> &'static str {
        MANAGER
    }

    fn discover(&self, faults: &mut Vec<FileFault>) -> Result<Vec<UnitCgroup>, CollectError> {
        if !self.root.is_dir() {
            return Err(CollectError::Absent(format!(
                "no cgroup hierarchy at {}",
                self.root.display()
            )));
        }
        let found: Vec<(String, PathBuf, u64)> = subdirs(&self.root.join(JOBS_DIR))
            .into_iter()
            .filter_map(|d| {
                let name = d.name().to_str().filter(|n| is_job_id(n))?.to_owned();
                Some((name, d.path, d.ino))
            })
            .collect();
        let mut populated = self.populated.lock().unwrap_or_else(|p| p.into_inner());
        Ok(populated_units(
            &mut populated,
            self.version,
            &self.root,
            &found,
            faults,
        ))
    }

    fn gpus(&self, units: &[UnitCgroup]) -> Vec<UnitGpus> {
        if self.devices.is_empty() {
            return Vec::new();
        }
        let held = self.read_gpus(units);
        let mut holders: HashMap<usize, usize> = HashMap::new();
        for at in held.values().flatten() {
            *holders.entry(*at).or_default() += 1;
        }
        units
            .iter()
            .filter_map(|u| {
                let devices: Vec<(u32, GpuDevice, f64)> = held
                    .get(&u.uuid)?
                    .iter()
                    .map(|at| {
                        let d = &self.devices[*at];
                        let share = 1.0 / holders.get(at).copied().unwrap_or(1).max(1) as f64;
                        (d.index as u32, d.clone(), share)
                    })
                    .collect();
                (!devices.is_empty()).then(|| UnitGpus {
                    manager: MANAGER,
                    uuid: u.uuid.clone(),
                    rel: u.rel.clone(),
                    cgroup_host: String::new(),
                    devices,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_as_the_hook_names_their_directories() {
        for ok in [
            "1009248.testhost-1",
            "1009249[0].testhost-1",
            "7.pbs.example.org",
        ] {
            assert!(is_job_id(ok), "{ok}");
        }
        for bad in [
            "",
            "1009248",
            "x1.server",
            "1[].s",
            "1[a].s",
            "12.",
            ".s",
            "tasks",
            "1.s/x",
        ] {
            assert!(!is_job_id(bad), "{bad}");
        }
    }

    #[test]
    fn jobs_are_found_in_the_hooks_v2_layout_too() {
        let tmp = tempfile::tempdir().unwrap();
        let jobs = tmp.path().join(JOBS_DIR);
        for (name, populated) in [
            ("12.pbs", 1),
            ("13[4].pbs", 1),
            ("14.pbs", 0),
            ("not-a-job", 1),
        ] {
            let dir = jobs.join(name);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(
                dir.join("cgroup.events"),
                format!("populated {populated}\nfrozen 0\n"),
            )
            .unwrap();
            std::fs::write(dir.join("cgroup.procs"), "1\n").unwrap();
        }
        let m = OpenPbsManager::new(tmp.path(), tmp.path(), CgroupVersion::V2, "cpu");
        let mut faults = Vec::new();
        let mut found: Vec<String> = m
            .discover(&mut faults)
            .unwrap()
            .into_iter()
            .map(|u| u.uuid)
            .collect();
        found.sort();
        assert_eq!(found, ["12.pbs", "13[4].pbs"], "{faults:?}");
    }

    #[test]
    fn visible_devices_name_whole_gpus_and_mig_instances() {
        let mut devices: Vec<GpuDevice> = (0..3)
            .map(|i| GpuDevice::for_test(i, i as u32, None, 1.0))
            .collect();
        devices[2].gpu_instance_id = Some(1);
        devices[2].instance_uuid = Some("MIG-abc".into());
        assert_eq!(
            device_positions("gpu-1, MIG-ABC,GPU-1,0,GPU-9", &devices),
            [1, 2]
        );
        assert!(device_positions("", &devices).is_empty());
    }
}
