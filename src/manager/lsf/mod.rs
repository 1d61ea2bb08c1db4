//! IBM Spectrum LSF jobs as compute units (`--collector.lsf`). LSF puts a job's processes in
//! `lsf/<cluster>/job.<id>[<index>].<internal id>.<timestamp>` of each v1 controller, and on
//! v2 in that directory's `leaf`. A job's CPUs and GPUs on this host come from `bjobs -json`
//! (`bjobs.rs`), asked again when the node's set of jobs changes: a job without CPU affinity
//! has every CPU in its cpuset, so the cgroup cannot say.
//!
//! The stats-server's side is `accounting.rs` (bacct and bjobs, parsed in `bacct.rs`).
//!
//! A job's MIG instances are named only in its processes' `CUDA_VISIBLE_DEVICES` (`mig.rs`).

pub mod accounting;
pub mod bacct;
pub mod bjobs;
pub mod mig;
pub mod setup;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::collect::gpu::{self, GpuDevice};
use crate::collect::units::discovery::populated_units;
use crate::collect::units::{cgroup_version, SubCollector, UnitCollector};
use crate::collect::{Capability, CollectError, Collector, CollectorSpec, Context};
use crate::config::{Kind, Opt};
use crate::host::cgroup::{
    subdirs, CgroupVersion, FileFault, Populated, ReadOptions, V1Controllers,
};
use crate::manager::environ::read_units_environ;
use crate::manager::{ResourceManager, UnitCgroup, UnitGpus};

use bjobs::{BjobsJob, JobGpus};

pub const MANAGER: &str = "lsf";

/// How a job asks LSF for resources, in findings' advice.
pub const REQUEST_WORDS: super::RequestWords = super::RequestWords {
    cores: "bsub -n",
    memory: "bsub -M, or -R \"rusage[mem=…]\"",
    gpus: "bsub -gpu \"num=…\"",
    time: "bsub -W",
};

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "lsf",
    default_enabled: false,
    // Reading MIG jobs' environments (other users' processes).
    capabilities: &[Capability::CAP_SYS_PTRACE, Capability::CAP_DAC_READ_SEARCH],
    options,
    build,
    self_test: Some(|paths, caps| {
        crate::security::check::test_foreign_environ(&paths.procfs, caps)
    }),
    sub_collectors: &[SubCollector::Perf, SubCollector::Ebpf],
};

/// `bjobs` is asked again at least this often, even when the node's jobs stay the same.
const BJOBS_MAX_AGE: Duration = Duration::from_secs(15 * 60);
/// Longest `bjobs` may take.
const BJOBS_TIMEOUT: Duration = Duration::from_secs(5);
/// After a failed `bjobs`, the same jobs are asked for again only this much later: a broken
/// or hung `bjobs` must not cost every scrape its timeout.
const BJOBS_RETRY_AFTER: Duration = Duration::from_secs(60);

fn options() -> Vec<Opt> {
    vec![
        Opt::flag(
            "collector.lsf.swap-memory-metrics",
            "Export swap usage of jobs (ceems_compute_unit_memsw_*)",
        ),
        Opt::flag(
            "collector.lsf.psi-metrics",
            "Export pressure stall information of jobs (cgroups v2 only)",
        ),
        Opt::new(
            "collector.lsf.bjobs-path",
            Kind::Str,
            "LSF's bjobs command (empty: found on PATH)",
        )
        .default(""),
    ]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Settings {
    swap_memory_metrics: bool,
    psi_metrics: bool,
    bjobs_path: String,
}

/// The last `bjobs` answer, and the jobs it was asked for.
#[derive(Default)]
struct BjobsCache {
    asked_for: BTreeSet<String>,
    at: Option<Instant>,
    failed_at: Option<Instant>,
    jobs: HashMap<String, BjobsJob>,
}

/// LSF as a resource manager: its jobs, with their CPUs and GPUs from `bjobs`.
pub struct LsfManager {
    version: CgroupVersion,
    /// The v1 controller or v2 root that holds `lsf/`.
    root: PathBuf,
    bjobs: PathBuf,
    /// This host as LSF names it in `ALLOC_SLOT` and `GPU_ALLOC`.
    host: String,
    cache: Mutex<BjobsCache>,
    populated: Mutex<Populated>,
    devices: Vec<GpuDevice>,
    procfs: PathBuf,
    /// Jobs' MIG instances, as positions in `devices`.
    mig: Mutex<HashMap<String, Vec<usize>>>,
}

/// The `lsf` collector: LSF jobs read and emitted as units.
pub type LsfCollector = UnitCollector<LsfManager>;

fn build(ctx: &Context) -> Result<Box<dyn Collector>, CollectError> {
    let s: Settings = ctx.settings()?;
    let version = cgroup_version(ctx)?;
    let bjobs = match s.bjobs_path.trim() {
        "" => crate::host::command::find_program("bjobs", std::env::var_os("PATH").as_deref())
            .ok_or_else(|| {
                CollectError::Other(
                    "no bjobs on PATH: put LSF's commands on the exporter's PATH (source LSF's profile.lsf in its unit) or set --collector.lsf.bjobs-path".into(),
                )
            })?,
        path => PathBuf::from(path),
    };
    let host = if ctx.hostname.is_empty() {
        nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default()
    } else {
        ctx.hostname.clone()
    };
    let mut manager = LsfManager::new(
        &ctx.paths.cgroupfs,
        &ctx.paths.procfs,
        version,
        &ctx.common.cgroups.active_subsystem,
        &bjobs,
        &host,
    );
    manager.devices = gpu::discover_for_units(&ctx.common.gpu, &ctx.paths.sysfs, "jobs");
    tracing::info!(version = ?version, root = %manager.root.display(), bjobs = %bjobs.display(), host = %host, "lsf collector discovers jobs");
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

impl LsfManager {
    pub fn new(
        cgroupfs: &Path,
        procfs: &Path,
        version: CgroupVersion,
        active_subsystem: &str,
        bjobs: &Path,
        host: &str,
    ) -> LsfManager {
        let root = match version {
            CgroupVersion::V1 => {
                V1Controllers::resolve(cgroupfs).subsystem_dir(cgroupfs, active_subsystem)
            }
            CgroupVersion::V2 => cgroupfs.to_owned(),
        };
        LsfManager {
            version,
            root,
            bjobs: bjobs.to_owned(),
            host: host.to_owned(),
            cache: Mutex::new(BjobsCache::default()),
            populated: Mutex::new(Populated::default()),
            devices: Vec::new(),
            procfs: procfs.to_owned(),
            mig: Mutex::new(HashMap::new()),
        }
    }

    /// Asks `bjobs` for `units` again when the set of jobs changed or the last answer is old;
    /// a failing `bjobs` keeps the last answer and says why.
    fn jobs(&self, units: &[UnitCgroup]) {
        if self.bjobs.as_os_str().is_empty() {
            return;
        }
        let ids: BTreeSet<String> = units.iter().map(|u| u.uuid.clone()).collect();
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let changed = cache.asked_for != ids;
        let stale = cache.at.is_none_or(|at| at.elapsed() >= BJOBS_MAX_AGE);
        let backing_off = cache
            .failed_at
            .is_some_and(|at| at.elapsed() < BJOBS_RETRY_AFTER);
        if !ids.is_empty() && (changed || (stale && !backing_off)) {
            let args: Vec<String> = [
                "-u",
                "all",
                "-m",
                &self.host,
                "-json",
                "-o",
                "jobid jobindex alloc_slot nalloc_slot gpu_alloc",
            ]
            .map(String::from)
            .to_vec();
            match crate::host::command::run(&self.bjobs, &args, BJOBS_TIMEOUT)
                .map_err(|e| e.to_string())
                .and_then(|out| bjobs::parse(&out, &self.host).map_err(|e| e.to_string()))
            {
                Ok(jobs) => {
                    cache.jobs = jobs.into_iter().map(|j| (j.uuid.clone(), j)).collect();
                    cache.asked_for = ids;
                    cache.at = Some(Instant::now());
                    cache.failed_at = None;
                }
                Err(e) => {
                    cache.asked_for = ids;
                    cache.failed_at = Some(Instant::now());
                    tracing::warn!(error = %e, "bjobs failed; jobs' CPUs come from their cpusets and their GPUs are not mapped")
                }
            }
        }
    }
}

/// The units' shares of the node's GPUs: whole GPUs by bjobs' minor numbers, MIG instances as
/// `mig` found them (positions in `devices`); a device held by n jobs is 1/n of each.
pub fn share_gpus(
    units: &[UnitCgroup],
    jobs: &HashMap<String, BjobsJob>,
    mig: &HashMap<String, Vec<usize>>,
    devices: &[GpuDevice],
) -> Vec<UnitGpus> {
    let held_by = |u: &UnitCgroup| -> BTreeSet<usize> {
        match jobs.get(&u.uuid).map(|j| &j.gpus) {
            Some(JobGpus::Minors(minors)) => minors
                .iter()
                .filter_map(|m| {
                    devices
                        .iter()
                        .position(|d| d.minor == *m && d.gpu_instance_id.is_none())
                })
                .collect(),
            Some(JobGpus::Mig) => mig.get(&u.uuid).into_iter().flatten().copied().collect(),
            _ => BTreeSet::new(),
        }
    };
    let held: Vec<(&UnitCgroup, BTreeSet<usize>)> = units.iter().map(|u| (u, held_by(u))).collect();
    let mut holders: HashMap<usize, usize> = HashMap::new();
    for at in held.iter().flat_map(|(_, h)| h) {
        *holders.entry(*at).or_default() += 1;
    }
    held.into_iter()
        .filter(|(_, h)| !h.is_empty())
        .map(|(u, h)| UnitGpus {
            manager: MANAGER,
            uuid: u.uuid.clone(),
            rel: u.rel.clone(),
            cgroup_host: String::new(),
            devices: h
                .into_iter()
                .map(|at| {
                    let share = 1.0 / holders.get(&at).copied().unwrap_or(1).max(1) as f64;
                    (devices[at].index as u32, devices[at].clone(), share)
                })
                .collect(),
        })
        .collect()
}

impl LsfManager {
    /// The MIG instances of `units` (bjobs' `GPU_ALLOC` gave sizes only), read from their
    /// processes' environments once per job and kept while it runs.
    fn mig_instances(&self, units: &[&UnitCgroup]) -> HashMap<String, Vec<usize>> {
        let mut known = self.mig.lock().unwrap_or_else(|p| p.into_inner());
        let present: HashSet<&str> = units.iter().map(|u| u.uuid.as_str()).collect();
        known.retain(|k, _| present.contains(k.as_str()));
        let missing: Vec<&UnitCgroup> = units
            .iter()
            .copied()
            .filter(|u| !known.contains_key(&u.uuid))
            .collect();
        let reads = read_units_environ(
            &missing,
            &self.procfs,
            SPEC.capabilities,
            mig::JOB_ID_VAR,
            mig::VISIBLE_VARS,
        );
        for (uuid, found) in reads {
            match found {
                Some(value) => {
                    known.insert(uuid, mig::instance_positions(&value, &self.devices));
                }
                None => {
                    tracing::debug!(job = %uuid, "no process of the MIG job says its instances (CUDA_VISIBLE_DEVICES with LSB_BATCH_JID) yet, or its environment cannot be read")
                }
            }
        }
        known.clone()
    }
}

impl ResourceManager for LsfManager {
    fn name(&self) -> &'static str {
        MANAGER
    }

    fn discover(&self, faults: &mut Vec<FileFault>) -> Result<Vec<UnitCgroup>, CollectError> {
        let lsf = self.root.join("lsf");
        if !self.root.is_dir() {
            return Err(CollectError::Absent(format!(
                "no cgroup hierarchy at {}",
                self.root.display()
            )));
        }
        let mut found = Vec::new();
        for cluster in subdirs(&lsf) {
            for job in subdirs(&cluster.path) {
                let Some(uuid) = job.name().to_str().and_then(bjobs::job_of_cgroup) else {
                    continue;
                };
                // v2: the processes are in `leaf`, which CEEMS reads as the job.
                let (dir, ino) = match self.version {
                    CgroupVersion::V2 => {
                        let leaf = job.path.join("leaf");
                        match std::fs::metadata(&leaf) {
                            Ok(m) if m.is_dir() => (leaf, std::os::unix::fs::MetadataExt::ino(&m)),
                            _ => (job.path, job.ino),
                        }
                    }
                    CgroupVersion::V1 => (job.path, job.ino),
                };
                found.push((uuid, dir, ino));
            }
        }
        let mut populated = self.populated.lock().unwrap_or_else(|p| p.into_inner());
        let units = populated_units(&mut populated, self.version, &self.root, &found, faults);
        drop(populated);
        // Before the units are read: their CPUs come from this answer.
        self.jobs(&units);
        Ok(units)
    }

    fn cpus(&self, unit: &UnitCgroup) -> Option<f64> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .jobs
            .get(&unit.uuid)
            .map(|j| f64::from(j.cpus))
            .filter(|n| *n > 0.0)
    }

    fn gpus(&self, units: &[UnitCgroup]) -> Vec<UnitGpus> {
        if self.devices.is_empty() {
            return Vec::new();
        }
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let mig_jobs: Vec<&UnitCgroup> = units
            .iter()
            .filter(|u| matches!(cache.jobs.get(&u.uuid).map(|j| &j.gpus), Some(JobGpus::Mig)))
            .collect();
        let mig = self.mig_instances(&mig_jobs);
        share_gpus(units, &cache.jobs, &mig, &self.devices)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(uuid: &str) -> UnitCgroup {
        UnitCgroup {
            uuid: uuid.into(),
            cgroup_host: String::new(),
            rel: PathBuf::new(),
            dir: PathBuf::new(),
            dir_ino: None,
        }
    }

    #[test]
    fn bjobs_is_asked_again_when_the_jobs_change_not_at_every_scrape() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let calls = tmp.path().join("calls");
        let bjobs = tmp.path().join("bjobs");
        // Fails, as a broken LSF client does, and counts its calls.
        std::fs::write(
            &bjobs,
            format!("#!/bin/sh\necho x >> '{}'\nexit 1\n", calls.display()),
        )
        .unwrap();
        std::fs::set_permissions(&bjobs, std::fs::Permissions::from_mode(0o755)).unwrap();
        let m = LsfManager::new(
            tmp.path(),
            tmp.path(),
            CgroupVersion::V2,
            "cpuacct",
            &bjobs,
            "n1",
        );
        let count = || {
            std::fs::read_to_string(&calls)
                .unwrap_or_default()
                .lines()
                .count()
        };
        m.jobs(&[unit("1")]);
        m.jobs(&[unit("1")]);
        assert_eq!(
            count(),
            1,
            "the same jobs after a failure wait for the retry delay"
        );
        m.jobs(&[unit("1"), unit("2")]);
        assert_eq!(count(), 2, "a new job is asked for at once");
        m.jobs(&[]);
        assert_eq!(count(), 2, "no job, no bjobs");
    }

    #[test]
    fn a_gpu_held_by_two_jobs_is_half_of_each() {
        let devices: Vec<GpuDevice> = (0..5)
            .map(|m| GpuDevice::for_test(m as usize, m, None, 1.0))
            .collect();
        let job = |uuid: &str, gpus: JobGpus| {
            let j = BjobsJob {
                uuid: uuid.into(),
                cpus: 4,
                gpus,
            };
            (uuid.to_owned(), j)
        };
        let minors = |m: &[u32]| JobGpus::Minors(m.iter().copied().collect());
        // CEEMS's fixture: 1009249 holds GPUs 0 and 1, 1009250 GPUs 1 and 4.
        let jobs: HashMap<String, BjobsJob> = [
            job("1009248", JobGpus::Mig),
            job("1009249", minors(&[0, 1])),
            job("1009250", minors(&[1, 4])),
        ]
        .into();
        let units = [unit("1009248"), unit("1009249"), unit("1009250")];
        let held = share_gpus(&units, &jobs, &HashMap::new(), &devices);
        let shares: Vec<(String, Vec<(u32, f64)>)> = held
            .iter()
            .map(|u| {
                let d = u.devices.iter().map(|(i, _, s)| (*i, *s)).collect();
                (u.uuid.clone(), d)
            })
            .collect();
        assert_eq!(
            shares,
            [
                ("1009249".to_owned(), vec![(0, 1.0), (1, 0.5)]),
                ("1009250".to_owned(), vec![(1, 0.5), (4, 1.0)]),
            ]
        );
    }
}
