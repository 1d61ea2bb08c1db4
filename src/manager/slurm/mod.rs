//! Slurm. The exporter's `slurm` collector: per-job metrics of Slurm jobs from their cgroups
//! (v1 and v2); the stats-server's jobs, users and projects from `sacct` and `sacctmgr`.
//!
//! - `discover`: finds the node's job cgroups at each scrape;
//! - `props`: who a job belongs to (`ceems_compute_unit_info`);
//! - `gpus` and `gpu_env`: which of the node's GPUs each job holds;
//! - `accounting`, `sacct`, `runner`: the stats-server's side; `rest` and `rest_json` the same
//!   through slurmrestd;
//! - here: the collector's flags and the [`ResourceManager`] over the parts above.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Deserialize;

use crate::collect::units::rdma::RdmaStats;
use crate::collect::units::{SubCollector, UnitCollector};
use crate::collect::{Capability, CollectError, Collector, CollectorSpec, Context};
use crate::config::{Kind, Opt};
use crate::host::cgroup::detail::DetailOptions;
use crate::host::cgroup::{CgroupVersion, FileFault, ReadOptions, V1Controllers};
use crate::manager::{ResourceManager, UnitCgroup, UnitGpus, UnitInfo, UnitSet};

pub mod accounting;
pub mod conf;
mod discover;
pub mod gpu_env;
mod gpus;
pub mod props;
pub mod rest;
pub mod rest_json;
pub mod runner;
pub mod sacct;
pub mod setup;

use discover::DiscoveryCache;
use gpus::gpu_mapping;
pub use gpus::GpuMapping;
use props::JobProps;

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "slurm",
    default_enabled: false,
    // Reading other users' /proc/<pid>/environ (opaque job directories).
    capabilities: &[Capability::CAP_SYS_PTRACE, Capability::CAP_DAC_READ_SEARCH],
    options,
    build,
    self_test: Some(|paths, caps| {
        crate::security::check::test_foreign_environ(&paths.procfs, caps)
    }),
    sub_collectors: &[SubCollector::Rdma, SubCollector::Perf, SubCollector::Ebpf],
};

pub const MANAGER: &str = "slurm";

/// How a job asks Slurm for resources, in findings' advice.
pub const REQUEST_WORDS: super::RequestWords = super::RequestWords {
    cores: "-c / --ntasks",
    memory: "--mem or --mem-per-cpu",
    gpus: "--gres=gpu",
    time: "--time",
};

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
        Opt::flag(
            "collector.slurm.process-metrics",
            "Export jobs' processes and threads by state, open files and CPU time per executable",
        ),
        Opt::new(
            "collector.slurm.process-exe-limit",
            Kind::Int,
            "Executables per job with their own exe label; the rest are summed as exe=\"other\"",
        )
        .default("10"),
        Opt::new(
            "collector.slurm.scratch-path",
            Kind::List,
            "Filesystem whose use is exported per job as ceems_compute_unit_uses_scratch{path} (repeatable): 1 while a job process has its working directory or an open file under it; reads each job process's open files at every scrape",
        )
        .key("collector.slurm.scratch-paths"),
        Opt::flag(
            "collector.slurm.memory-detail-metrics",
            "Export jobs' huge pages, mapped, active/inactive file, unevictable and shared memory, and peak use",
        ),
        Opt::flag(
            "collector.slurm.per-core-metrics",
            "Export jobs' CPU time per core (cgroups v1; v2 keeps no per-core figure per cgroup)",
        ),
        Opt::flag(
            "collector.slurm.io-metrics",
            "Export jobs' block IO bytes and requests per device",
        ),
        Opt::flag(
            "collector.slurm.info-metrics",
            "Export ceems_compute_unit_info with each job's user, account, partition and name",
        ),
        Opt::new(
            "collector.slurm.gpu-order-map",
            Kind::Str,
            "Slurm GPU index to device, <slurm index>:<minor>[.<gpu instance id>],… where Slurm and the driver order GPUs differently (mixed MIG and full GPUs)",
        ),
        Opt::new(
            "collector.slurm.gpu-job-map-path",
            Kind::Str,
            "Directory of GPU→job files written by a prolog (examples/slurm/prolog.sh); read before the jobs' environment",
        ),
        Opt::new(
            "collector.slurm.gres-config-file",
            Kind::Str,
            "Slurm's gres.conf, for the shard and MPS counts that make a job's GPU share",
        )
        .default("/etc/slurm/gres.conf"),
        Opt::new(
            "collector.slurm.job-props-path",
            Kind::Str,
            "Directory of job properties files written by a prolog (examples/slurm/prolog.sh); read before the jobs' environment",
        ),
    ]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Settings {
    swap_memory_metrics: bool,
    psi_metrics: bool,
    info_metrics: bool,
    #[serde(default)]
    job_props_path: Option<PathBuf>,
    #[serde(default)]
    gpu_order_map: Option<String>,
    #[serde(default)]
    gpu_job_map_path: Option<PathBuf>,
    gres_config_file: PathBuf,
    memory_detail_metrics: bool,
    per_core_metrics: bool,
    io_metrics: bool,
    process_metrics: bool,
    process_exe_limit: i64,
    #[serde(default)]
    scratch_paths: Vec<PathBuf>,
}

/// Slurm as a resource manager: its jobs, their owners and their GPUs.
pub struct SlurmManager {
    version: CgroupVersion,
    /// Where discovery starts: the active v1 controller, or the v2 root.
    base: PathBuf,
    procfs: PathBuf,
    cache: Mutex<DiscoveryCache>,
    /// `Some` with `--collector.slurm.info-metrics`: where job properties files are, if any.
    info: Option<JobInfoSource>,
    /// Job id → its properties, until the job ends.
    props: Mutex<HashMap<String, JobProps>>,
    /// The node's GPUs and how jobs map onto them; None on nodes without GPUs.
    gpus: Option<GpuMapping>,
}

/// The `slurm` collector: Slurm's jobs read and emitted as units.
pub type SlurmCollector = UnitCollector<SlurmManager>;

/// Where job metadata comes from.
#[derive(Debug, Clone, Default)]
pub struct JobInfoSource {
    pub props_dir: Option<PathBuf>,
}

fn build(ctx: &Context) -> Result<Box<dyn Collector>, CollectError> {
    let s: Settings = ctx.settings()?;
    let root = &ctx.paths.cgroupfs;
    let version = crate::collect::units::cgroup_version(ctx)?;
    let collector = SlurmCollector::slurm(
        root,
        &ctx.paths.procfs,
        version,
        &ctx.common.cgroups.active_subsystem,
        &ctx.hostname,
        ReadOptions {
            swap: s.swap_memory_metrics,
            psi: s.psi_metrics,
        },
    );
    let collector = collector.with_rdma(RdmaStats::from_settings(
        &ctx.common.rdma,
        &ctx.paths.sysfs,
        ctx.common.timeout,
    ));
    let collector = collector.with_context(ctx, version)?;
    let collector = collector.with_detail(DetailOptions {
        memory: s.memory_detail_metrics,
        per_core: s.per_core_metrics,
        io: s.io_metrics,
    });
    let collector = if s.process_metrics {
        collector.with_processes(usize::try_from(s.process_exe_limit).unwrap_or(0))
    } else {
        collector
    };
    if let Some(p) = s.scratch_paths.iter().find(|p| !p.is_absolute()) {
        return Err(CollectError::Other(format!(
            "--collector.slurm.scratch-path `{}` must be an absolute path",
            p.display()
        )));
    }
    let collector = collector.with_scratch(s.scratch_paths.clone());
    let collector = match gpu_mapping(ctx, &s)? {
        Some(m) => collector.with_gpus(m),
        None => collector,
    };
    let collector = if s.info_metrics {
        collector.with_info(JobInfoSource {
            props_dir: s.job_props_path,
        })
    } else {
        collector
    };
    tracing::info!(
        version = ?version,
        base = %collector.manager.base.display(),
        "slurm collector discovers jobs"
    );
    Ok(Box::new(collector))
}

impl SlurmManager {
    /// Slurm's jobs in the hierarchy at `cgroupfs`; `active_subsystem` is the v1 controller
    /// in which jobs are discovered.
    pub fn new(
        cgroupfs: &Path,
        procfs: &Path,
        version: CgroupVersion,
        active_subsystem: &str,
    ) -> SlurmManager {
        let base = match version {
            CgroupVersion::V1 => {
                V1Controllers::resolve(cgroupfs).subsystem_dir(cgroupfs, active_subsystem)
            }
            CgroupVersion::V2 => cgroupfs.join("system.slice"),
        };
        SlurmManager {
            version,
            base,
            procfs: procfs.to_owned(),
            cache: Mutex::new(DiscoveryCache::default()),
            info: None,
            props: Mutex::new(HashMap::new()),
            gpus: None,
        }
    }
}

impl ResourceManager for SlurmManager {
    fn name(&self) -> &'static str {
        MANAGER
    }

    fn discover(&self, faults: &mut Vec<FileFault>) -> Result<Vec<UnitCgroup>, CollectError> {
        self.find_jobs(faults)
    }

    fn info(&self, job: &UnitCgroup) -> Option<UnitInfo> {
        let p = self.job_props(job, self.info.as_ref()?);
        Some(UnitInfo {
            help: "Slurm job metadata: user, account, partition and job name",
            labels: vec![
                ("account", p.account),
                ("jobname", p.job_name),
                ("partition", p.partition),
                ("user", p.user),
            ],
        })
    }

    fn gpus(&self, jobs: &[UnitCgroup]) -> Vec<UnitGpus> {
        match &self.gpus {
            Some(mapping) => self.unit_gpus(mapping, jobs),
            None => Vec::new(),
        }
    }

    fn retain(&self, present: &UnitSet<'_>) {
        self.props
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k, _| present.contains(k.as_str()));
    }
}

impl SlurmCollector {
    /// A collector of Slurm's jobs in the hierarchy at `cgroupfs`.
    pub fn slurm(
        cgroupfs: &Path,
        procfs: &Path,
        version: CgroupVersion,
        active_subsystem: &str,
        hostname: &str,
        read_opts: ReadOptions,
    ) -> SlurmCollector {
        UnitCollector::new(
            SlurmManager::new(cgroupfs, procfs, version, active_subsystem),
            cgroupfs,
            procfs,
            version,
            hostname,
            read_opts,
            SPEC.capabilities,
        )
    }

    /// Also export which GPUs each job holds.
    pub fn with_gpus(mut self, gpus: GpuMapping) -> SlurmCollector {
        self.manager.gpus = Some(gpus);
        self
    }

    /// Also export `ceems_compute_unit_info` from these sources.
    pub fn with_info(mut self, source: JobInfoSource) -> SlurmCollector {
        self.manager.info = Some(source);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::gpu_env::{GresShares, OrderMap};
    use super::*;
    use crate::collect::gpu::GpuDevice;
    use crate::metrics::MetricSet;
    use crate::testing::{generate, JobTree, TreeSpec};
    use std::fs;

    fn collector(tree: &JobTree) -> SlurmCollector {
        tree.slurm_collector()
    }

    fn scrape(c: &SlurmCollector) -> String {
        let mut out = MetricSet::new();
        c.collect(&mut out).expect("collect");
        let mut text = String::new();
        out.encode_text(&mut text);
        text
    }

    fn units(text: &str) -> f64 {
        text.lines()
            .find_map(|l| {
                l.strip_prefix("ceems_compute_units{hostname=\"node\",manager=\"slurm\"} ")
            })
            .and_then(|v| v.parse().ok())
            .expect("units series")
    }

    #[test]
    fn finds_every_job_in_v1_and_v2() {
        for version in [CgroupVersion::V1, CgroupVersion::V2] {
            let tmp = tempfile::tempdir().unwrap();
            let tree = generate(tmp.path(), TreeSpec::new(version, 5)).unwrap();
            let text = scrape(&collector(&tree));
            assert_eq!(units(&text), 5.0, "{version:?}");
            for id in 1_000_000..1_000_005 {
                assert!(
                    text.contains(&format!("uuid=\"{id}\"")),
                    "{version:?}: job {id}"
                );
            }
            assert!(!text.contains("ceems_compute_collect_error"), "{text}");
        }
    }

    #[test]
    fn vanished_job_is_skipped() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = generate(tmp.path(), TreeSpec::new(CgroupVersion::V2, 3)).unwrap();
        let c = collector(&tree);
        let jobs = c.discover(&mut Vec::new()).unwrap();
        assert_eq!(jobs.len(), 3);
        // The job ends between discovery and reading.
        fs::remove_dir_all(tree.job_dir(1)).unwrap();
        let mut out = MetricSet::new();
        c.collect_units(jobs, &mut out).unwrap();
        let mut text = String::new();
        out.encode_text(&mut text);
        assert_eq!(units(&text), 2.0);
        assert!(!text.contains("uuid=\"1000001\""), "{text}");
        assert!(!text.contains("ceems_compute_collect_error"));
    }

    #[test]
    fn malformed_file_flags_only_its_job() {
        for version in [CgroupVersion::V1, CgroupVersion::V2] {
            let tmp = tempfile::tempdir().unwrap();
            let tree = generate(tmp.path(), TreeSpec::new(version, 2)).unwrap();
            let mem_dir = match version {
                CgroupVersion::V2 => tree.job_dir(0),
                CgroupVersion::V1 => tree.job_dirs(0)[1].clone(),
            };
            // Only the keys a scrape wants are parsed: v2's `anon`, v1's `total_rss`.
            fs::write(
                mem_dir.join("memory.stat"),
                "anon twelve\ntotal_rss twelve\n\0\u{fffd}",
            )
            .unwrap();
            let text = scrape(&collector(&tree));
            assert!(
                text.contains("ceems_compute_collect_error{cgrouphostname=\"\",hostname=\"node\",manager=\"slurm\",uuid=\"1000000\"} 1"),
                "{version:?}: {text}"
            );
            assert!(!text.contains("ceems_compute_collect_error{cgrouphostname=\"\",hostname=\"node\",manager=\"slurm\",uuid=\"1000001\"}"));
            // The job's readable files are still reported.
            assert!(text.contains("ceems_compute_unit_cpu_system_seconds_total{cgrouphostname=\"\",hostname=\"node\",manager=\"slurm\",uuid=\"1000000\"}"));
            assert_eq!(units(&text), 2.0);
        }
    }

    #[test]
    fn jobs_without_processes_are_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = generate(tmp.path(), TreeSpec::new(CgroupVersion::V2, 3)).unwrap();
        // Without cgroup.events (as in CEEMS's fixtures) the subtree's procs files decide.
        fs::remove_file(tree.job_dir(2).join("cgroup.events")).unwrap();
        for entry in walk(&tree.job_dir(2)) {
            if entry.ends_with("cgroup.procs") {
                fs::write(entry, "").unwrap();
            }
        }
        let text = scrape(&collector(&tree));
        assert_eq!(units(&text), 2.0);
        assert!(!text.contains("uuid=\"1000002\""));
    }

    #[test]
    fn cgroup_events_decides_on_v2() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = generate(tmp.path(), TreeSpec::new(CgroupVersion::V2, 2)).unwrap();
        // The kernel says the subtree is empty although a stale procs file lists a pid.
        fs::write(
            tree.job_dir(1).join("cgroup.events"),
            "populated 0\nfrozen 0\n",
        )
        .unwrap();
        let c = collector(&tree);
        assert_eq!(units(&scrape(&c)), 1.0);
        fs::write(
            tree.job_dir(1).join("cgroup.events"),
            "populated 1\nfrozen 0\n",
        )
        .unwrap();
        assert_eq!(units(&scrape(&c)), 2.0);
    }

    #[test]
    fn opaque_job_directories_get_their_id_from_the_environment() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = generate(tmp.path(), TreeSpec::new(CgroupVersion::V2, 2)).unwrap();
        let opaque = tree.job_dir(1).with_file_name("8f3a2c71-0b9e");
        fs::rename(tree.job_dir(1), &opaque).unwrap();
        let c = collector(&tree);
        let text = scrape(&c);
        assert_eq!(units(&text), 2.0);
        assert!(text.contains("ceems_compute_unit_cpu_user_seconds_total{cgrouphostname=\"\",hostname=\"node\",manager=\"slurm\",uuid=\"1000001\"}"), "{text}");

        // The id is cached: it survives the environ files going away...
        for p in fs::read_dir(tree.procfs()).unwrap().flatten() {
            let _ = fs::remove_file(p.path().join("environ"));
        }
        assert!(scrape(&c).contains("uuid=\"1000001\""));
        // ...and is forgotten once the directory is gone.
        fs::remove_dir_all(&opaque).unwrap();
        assert_eq!(units(&scrape(&c)), 1.0);
        assert!(c.manager.cache.lock().unwrap().opaque_ids.is_empty());
    }

    #[test]
    fn job_info_from_props_file_then_environ_then_uid() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = generate(tmp.path(), TreeSpec::new(CgroupVersion::V1, 3)).unwrap();
        let props = tmp.path().join("props");
        fs::create_dir_all(&props).unwrap();
        // Job 0: the prolog's file. Job 1: environ (the generator writes SLURM_JOB_ACCOUNT;
        // add a user). Job 2: nothing but its uid_<uid> directory.
        fs::write(props.join("1000000"), "alice physics node[1-2] /home/alice").unwrap();
        for p in fs::read_dir(tree.procfs()).unwrap().flatten() {
            let env = p.path().join("environ");
            if let Ok(text) = fs::read(&env) {
                if text.windows(18).any(|w| w == b"SLURM_JOB_ID=10000") {
                    let job = String::from_utf8_lossy(&text).into_owned();
                    if job.contains("SLURM_JOB_ID=1000001\0") {
                        fs::write(&env, format!("{job}SLURM_JOB_USER=bob\0SLURM_JOB_PARTITION=gpu\0SLURM_JOB_NAME=train\0")).unwrap();
                    } else if job.contains("SLURM_JOB_ID=1000002\0") {
                        fs::write(&env, "HOME=/\0").unwrap();
                    }
                }
            }
        }
        let c = collector(&tree).with_info(JobInfoSource {
            props_dir: Some(props.clone()),
        });
        let text = scrape(&c);
        let info = |uuid: &str| {
            text.lines()
                .find(|l| {
                    l.starts_with("ceems_compute_unit_info{")
                        && l.contains(&format!("uuid=\"{uuid}\""))
                })
                .unwrap_or_else(|| panic!("no info for {uuid} in\n{text}"))
                .to_owned()
        };
        assert!(
            info("1000000").contains("account=\"physics\"")
                && info("1000000").contains("user=\"alice\""),
            "{}",
            info("1000000")
        );
        let bob = info("1000001");
        assert!(
            bob.contains("user=\"bob\"")
                && bob.contains("partition=\"gpu\"")
                && bob.contains("jobname=\"train\""),
            "{bob}"
        );
        // Job 2: the user of its uid_<uid> directory, or empty where passwd has no such uid.
        let uid = props::uid_from_path(&tree.job_dir(2)).expect("v1 path has uid_");
        let want = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten()
            .map(|u| u.name)
            .unwrap_or_default();
        assert!(
            info("1000002").contains(&format!("user=\"{want}\"")),
            "{}",
            info("1000002")
        );
        // Remembered while the job lives: the file going away changes nothing...
        fs::remove_file(props.join("1000000")).unwrap();
        assert!(scrape(&c).contains("user=\"alice\""));
        // ...and forgotten when it ends.
        fs::remove_dir_all(tree.job_dir(0)).unwrap();
        scrape(&c);
        assert!(!c.manager.props.lock().unwrap().contains_key("1000000"));
    }

    #[test]
    fn multi_slurmd_roots_fill_cgrouphostname() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = generate(tmp.path(), TreeSpec::new(CgroupVersion::V2, 1)).unwrap();
        let scope = tree.cgroupfs().join("system.slice/slurmstepd.scope");
        fs::rename(&scope, scope.with_file_name("node7_slurmstepd.scope")).unwrap();
        let text = scrape(&collector(&tree));
        assert!(text.contains("cgrouphostname=\"node7\""), "{text}");

        let tmp = tempfile::tempdir().unwrap();
        let tree = generate(tmp.path(), TreeSpec::new(CgroupVersion::V1, 1)).unwrap();
        for ctrl in ["cpuacct", "memory", "cpuset"] {
            let d = tree.cgroupfs().join(ctrl);
            fs::rename(d.join("slurm"), d.join("slurm_node3")).unwrap();
        }
        let text = scrape(&collector(&tree));
        assert!(text.contains("cgrouphostname=\"node3\""), "{text}");
        assert_eq!(units(&text), 1.0);
    }

    fn gpu_flags(text: &str) -> Vec<&str> {
        text.lines()
            .filter(|l| l.starts_with("ceems_compute_unit_gpu_index_flag{"))
            .collect()
    }

    #[test]
    fn cpu_only_jobs_are_read_once_and_again_only_for_a_new_step() {
        for version in [CgroupVersion::V1, CgroupVersion::V2] {
            let tmp = tempfile::tempdir().unwrap();
            let tree = generate(tmp.path(), TreeSpec::new(version, 2)).unwrap();
            let device = |minor: u32| GpuDevice::for_test(minor as usize, minor, None, 1.0);
            let c = collector(&tree).with_gpus(GpuMapping::new(
                vec![device(0), device(1)],
                OrderMap::default(),
                GresShares::default(),
                None,
            ));
            assert!(gpu_flags(&scrape(&c)).is_empty(), "{version:?}");

            // A running process's environment does not change, so a job's known processes are
            // not read again: this edit is not seen.
            for p in fs::read_dir(tree.procfs()).unwrap().flatten() {
                let env = p.path().join("environ");
                if let Ok(text) = fs::read(&env) {
                    let mut text = text;
                    text.extend_from_slice(b"SLURM_JOB_GPUS=0\0");
                    fs::write(&env, text).unwrap();
                }
            }
            assert!(gpu_flags(&scrape(&c)).is_empty(), "{version:?}");

            // A new step of job 1000000, made before its process joins: looked at until it has.
            let task = match version {
                CgroupVersion::V1 => tree.job_dir(0).join("step_7/task_0"),
                CgroupVersion::V2 => tree.job_dir(0).join("step_7/user/task_0"),
            };
            fs::create_dir_all(&task).unwrap();
            fs::write(task.join("cgroup.procs"), "").unwrap();
            assert!(gpu_flags(&scrape(&c)).is_empty(), "{version:?}");
            let pid = tree.procfs().join("77777");
            fs::create_dir_all(&pid).unwrap();
            fs::write(
                pid.join("environ"),
                "SLURM_JOB_ID=1000000\0SLURM_STEP_GPUS=1\0",
            )
            .unwrap();
            fs::write(task.join("cgroup.procs"), "77777\n").unwrap();
            let text = scrape(&c);
            let flags = gpu_flags(&text);
            assert_eq!(flags.len(), 1, "{version:?}: {flags:?}");
            assert!(
                flags[0].contains("index=\"1\"") && flags[0].contains("uuid=\"1000000\""),
                "{version:?}: only the new step's GPU, not the edit above: {flags:?}"
            );

            // An ended job is forgotten.
            for dir in tree.job_dirs(0) {
                fs::remove_dir_all(dir).unwrap();
            }
            scrape(&c);
            let mapping = c.manager.gpus.as_ref().unwrap();
            let cache = mapping.cache.lock().unwrap();
            assert!(!cache.contains_key("1000000"), "{version:?}");
            assert!(cache.contains_key("1000001"), "{version:?}");
        }
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
        out
    }
}
