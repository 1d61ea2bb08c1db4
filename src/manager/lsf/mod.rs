//! IBM Spectrum LSF jobs as compute units (`--collector.lsf`). LSF puts a job's processes in
//! `lsf/<cluster>/job.<id>[<index>].<internal id>.<timestamp>` of each v1 controller, and on
//! v2 in that directory's `leaf`. A job's CPUs and GPUs on this host come from `bjobs -json`
//! (`bjobs.rs`), asked again when the node's set of jobs changes: a job without CPU affinity
//! has every CPU in its cpuset, so the cgroup cannot say.
//!
//! The stats-server's side is `accounting.rs` (bacct and bjobs, parsed in `bacct.rs`).
//!
//! Not yet: MIG instances of a job (LSF names them only in its processes'
//! `CUDA_VISIBLE_DEVICES`) and the Alloy discoverer.

pub mod accounting;
pub mod bacct;
pub mod bjobs;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::collect::gpu::{self, GpuDevice};
use crate::collect::units::{cgroup_version, SubCollector, UnitCollector};
use crate::collect::{CollectError, Collector, CollectorSpec, Context};
use crate::config::{Kind, Opt};
use crate::host::cgroup::{
    subdirs, CgroupVersion, FileFault, Populated, ReadOptions, V1Controllers,
};
use crate::manager::{ResourceManager, UnitCgroup, UnitGpus};

use bjobs::{BjobsJob, JobGpus};

pub const MANAGER: &str = "lsf";

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "lsf",
    default_enabled: false,
    capabilities: &[],
    options,
    build,
    self_test: None,
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
        version,
        &ctx.common.cgroups.active_subsystem,
        &bjobs,
        &host,
    );
    match gpu::discover(&ctx.common.gpu, &ctx.paths.sysfs) {
        Ok(devices) => manager.devices = devices,
        Err(e) => {
            tracing::error!(error = %e, "cannot list the node's GPUs; jobs get no GPU series")
        }
    }
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
        }
    }

    /// Asks `bjobs` for `units` again when the set of jobs changed or the last answer is old;
    /// a failing `bjobs` keeps the last answer and says why.
    fn jobs(&self, units: &[UnitCgroup]) {
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

/// The units' shares of the node's full GPUs: a GPU held by n jobs is 1/n of each.
pub fn share_gpus(
    units: &[UnitCgroup],
    jobs: &HashMap<String, BjobsJob>,
    devices: &[GpuDevice],
) -> Vec<UnitGpus> {
    let minors_of = |u: &UnitCgroup| match jobs.get(&u.uuid).map(|j| &j.gpus) {
        Some(JobGpus::Minors(m)) => m.clone(),
        _ => BTreeSet::new(),
    };
    let mut holders: HashMap<u32, usize> = HashMap::new();
    for u in units {
        for m in minors_of(u) {
            *holders.entry(m).or_default() += 1;
        }
    }
    units
        .iter()
        .filter_map(|u| {
            let held: Vec<(u32, GpuDevice, f64)> = minors_of(u)
                .into_iter()
                .filter_map(|m| {
                    let device = devices
                        .iter()
                        .find(|d| d.minor == m && d.gpu_instance_id.is_none())?;
                    let share = 1.0 / holders.get(&m).copied().unwrap_or(1).max(1) as f64;
                    Some((device.index as u32, device.clone(), share))
                })
                .collect();
            (!held.is_empty()).then(|| UnitGpus {
                manager: MANAGER,
                uuid: u.uuid.clone(),
                cgroup_host: String::new(),
                devices: held,
            })
        })
        .collect()
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
                let Some(uuid) = job.name.to_str().and_then(bjobs::job_of_cgroup) else {
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
        let present: HashSet<&Path> = found.iter().map(|(_, d, _)| d.as_path()).collect();
        populated.retain(|k| present.contains(k));
        let mut units = Vec::new();
        for (uuid, dir, ino) in &found {
            if !populated.check(self.version, dir, Some(*ino), faults) {
                continue;
            }
            units.push(UnitCgroup {
                uuid: uuid.clone(),
                cgroup_host: String::new(),
                rel: dir.strip_prefix(&self.root).unwrap_or(dir).to_path_buf(),
                dir: dir.clone(),
                dir_ino: Some(*ino),
            });
        }
        drop(populated);
        // Before the units are read: their CPUs come from this answer.
        self.jobs(&units);
        Ok(units)
    }

    fn cpus(&self, unit: &UnitCgroup) -> Option<u64> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .jobs
            .get(&unit.uuid)
            .map(|j| u64::from(j.cpus))
            .filter(|n| *n > 0)
    }

    fn gpus(&self, units: &[UnitCgroup]) -> Vec<UnitGpus> {
        if self.devices.is_empty() {
            return Vec::new();
        }
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        share_gpus(units, &cache.jobs, &self.devices)
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
        let m = LsfManager::new(tmp.path(), CgroupVersion::V2, "cpuacct", &bjobs, "n1");
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
        let held = share_gpus(&units, &jobs, &devices);
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
