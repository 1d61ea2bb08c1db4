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

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::gpu::jobs::{self, GresShares, JobGpus, OrderMap};
use super::gpu::{self, GpuDevice};
use super::job_props::{self, JobProps};
use super::{Capability, CollectError, Collector, CollectorSpec, Context};
use crate::config::{Kind, Opt};
use crate::host::cgroup::detail::{self, DetailOptions};
use crate::host::cgroup::{
    self, names, CgroupReader, CgroupVersion, FileFault, HostMemory, ReadOptions, SubtreeShape,
    UnitError,
};
use crate::host::processes;
use crate::host::procfs;
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
    /// The job's directory in the hierarchy discovery walks.
    pub dir: PathBuf,
}

pub struct SlurmCollector {
    version: CgroupVersion,
    /// Where discovery starts: the active v1 controller, or the v2 root.
    base: PathBuf,
    procfs: PathBuf,
    hostname: String,
    read_opts: ReadOptions,
    reader: Mutex<CgroupReader>,
    cache: Mutex<DiscoveryCache>,
    /// `Some` with `--collector.slurm.info-metrics`: where job properties files are, if any.
    info: Option<JobInfoSource>,
    /// Job id → its properties, until the job ends.
    props: Mutex<HashMap<String, JobProps>>,
    detail: DetailOptions,
    /// `Some(exe limit)` with `--collector.slurm.process-metrics`.
    processes: Option<usize>,
    /// The node's GPUs and how jobs map onto them; None on nodes without GPUs.
    gpus: Option<GpuMapping>,
}

/// The node's GPUs and what maps Slurm's GPU indices onto them.
pub struct GpuMapping {
    pub devices: Vec<GpuDevice>,
    pub order: OrderMap,
    pub gres: GresShares,
    pub job_map_dir: Option<PathBuf>,
    /// What is known of each present job's GPUs, until the job ends.
    cache: Mutex<HashMap<String, GpuLookup>>,
}

/// What is known of one job's GPUs. A job's GPUs do not change while it runs: once found they
/// are final. "No GPU" is remembered with the processes it was read from and the shape of the
/// job's cgroup subtree: the job is looked at again only when a directory (a step) comes or
/// goes, and then only its new processes' environments are read.
#[derive(Debug, Default)]
struct GpuLookup {
    /// `(Slurm index, share)`; empty while no GPU is known.
    held: Vec<(u32, f64)>,
    /// The job's processes at the last lookup; their environments were read.
    pids: HashSet<u32>,
    /// The subtree when those were read; None before the first lookup.
    shape: Option<SubtreeShape>,
}

impl GpuMapping {
    pub fn new(
        devices: Vec<GpuDevice>,
        order: OrderMap,
        gres: GresShares,
        job_map_dir: Option<PathBuf>,
    ) -> GpuMapping {
        GpuMapping {
            devices,
            order,
            gres,
            job_map_dir,
            cache: Mutex::new(HashMap::new()),
        }
    }
}

/// Where job metadata comes from.
#[derive(Debug, Clone, Default)]
pub struct JobInfoSource {
    pub props_dir: Option<PathBuf>,
}

/// How long a job found with processes is trusted to still have some without walking its
/// subtree again (where no `cgroup.events` says so in one read).
const POPULATED_TTL: Duration = Duration::from_secs(30);

/// What discovery remembers between scrapes, for job directories that still exist.
#[derive(Default)]
struct DiscoveryCache {
    /// Opaque job directory → job id.
    opaque_ids: HashMap<PathBuf, String>,
    /// Job directory → when a process was last seen in it.
    populated: HashMap<PathBuf, Instant>,
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
    let s: Settings = ctx.settings()?;
    let root = &ctx.paths.cgroupfs;
    let version = match ctx.common.cgroups.force_version.as_deref() {
        Some(v) => CgroupVersion::from_flag(v)
            .ok_or_else(|| CollectError::Other(format!("unknown cgroup version `{v}`")))?,
        None => cgroup::detect_version(root),
    };
    let collector = SlurmCollector::new(
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
        base = %collector.base.display(),
        "slurm collector discovers jobs"
    );
    Ok(Box::new(collector))
}

/// The node's GPUs, when it has some. A malformed order map stops start-up; a GPU tool that
/// fails leaves the collector without GPU series, said in the log.
fn gpu_mapping(ctx: &Context, s: &Settings) -> Result<Option<GpuMapping>, CollectError> {
    let order = OrderMap::parse(s.gpu_order_map.as_deref().unwrap_or(""))
        .map_err(|e| CollectError::Other(format!("--collector.slurm.gpu-order-map: {e}")))?;
    let devices = match gpu::discover(&ctx.common.gpu, &ctx.paths.sysfs) {
        Ok(d) => d,
        Err(e) => {
            tracing::error!(error = %e, "cannot list the node's GPUs; jobs get no GPU series");
            return Ok(None);
        }
    };
    if devices.is_empty() {
        return Ok(None);
    }
    let gres = match std::fs::read_to_string(&s.gres_config_file) {
        Ok(text) => jobs::parse_gres_conf(&text, &ctx.hostname).unwrap_or_else(|e| {
            tracing::warn!(path = %s.gres_config_file.display(), error = %e, "gres.conf not understood; GPUs count as whole");
            GresShares::default()
        }),
        Err(_) => GresShares::default(),
    };
    tracing::info!(
        gpus = devices.len(),
        ordered = !order.is_empty(),
        shards = gres.shards,
        "jobs are mapped to the node's GPUs"
    );
    Ok(Some(GpuMapping::new(
        devices,
        order,
        gres,
        s.gpu_job_map_path
            .clone()
            .filter(|p| !p.as_os_str().is_empty()),
    )))
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
    /// A collector over the hierarchy at `cgroupfs`; `active_subsystem` is the v1 controller
    /// in which jobs are discovered.
    pub fn new(
        cgroupfs: &Path,
        procfs: &Path,
        version: CgroupVersion,
        active_subsystem: &str,
        hostname: &str,
        read_opts: ReadOptions,
    ) -> SlurmCollector {
        let reader = CgroupReader::new(cgroupfs, version, host_memory(procfs));
        let base = match version {
            CgroupVersion::V1 => reader
                .v1_controllers()
                .subsystem_dir(cgroupfs, active_subsystem),
            CgroupVersion::V2 => cgroupfs.join("system.slice"),
        };
        SlurmCollector {
            version,
            base,
            procfs: procfs.to_owned(),
            hostname: hostname.to_owned(),
            read_opts,
            reader: Mutex::new(reader),
            cache: Mutex::new(DiscoveryCache::default()),
            info: None,
            props: Mutex::new(HashMap::new()),
            detail: DetailOptions::default(),
            processes: None,
            gpus: None,
        }
    }

    /// Also export which GPUs each job holds.
    pub fn with_gpus(mut self, gpus: GpuMapping) -> SlurmCollector {
        self.gpus = Some(gpus);
        self
    }

    /// Also export per-job process detail, with at most `exe_limit` executables each.
    pub fn with_processes(mut self, exe_limit: usize) -> SlurmCollector {
        self.processes = Some(exe_limit);
        self
    }

    /// Also read and export these detail groups.
    pub fn with_detail(mut self, detail: DetailOptions) -> SlurmCollector {
        self.detail = detail;
        self
    }

    /// Also export `ceems_compute_unit_info` from these sources.
    pub fn with_info(mut self, source: JobInfoSource) -> SlurmCollector {
        self.info = Some(source);
        self
    }

    /// A job's user, account, partition and name: the prolog's file, else a job process's
    /// environment, else the user of the `uid_<uid>` directory. Only complete answers are
    /// remembered, so a job found before its prolog wrote is asked again.
    fn job_props(&self, job: &JobCgroup, source: &JobInfoSource) -> JobProps {
        if let Some(p) = self
            .props
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&job.uuid)
        {
            return p.clone();
        }
        let from_file = source.props_dir.as_ref().and_then(|dir| {
            let path = dir.join(&job.uuid);
            let text = std::fs::read_to_string(&path).ok()?;
            job_props::parse_props_file(&text)
                .map_err(|e| tracing::debug!(path = %path.display(), error = %e, "bad job properties file"))
                .ok()
        });
        let found = from_file.or_else(|| self.props_from_environ(&job.dir));
        let props = match found {
            Some(p) => p,
            None => JobProps {
                user: job_props::uid_from_path(&job.rel)
                    .and_then(|uid| {
                        nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                            .ok()
                            .flatten()
                    })
                    .map(|u| u.name)
                    .unwrap_or_default(),
                ..JobProps::default()
            },
        };
        if props.is_known() {
            self.props
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(job.uuid.clone(), props.clone());
        }
        props
    }

    /// Updates what is known of each job's GPUs: the prolog's files, else the environment of
    /// its processes whose `SLURM_JOB_ID` is the job's (one with `SLURM_JOB_GPUS` before one
    /// with only `SLURM_STEP_GPUS`). Only jobs with no GPU known and a process not seen before
    /// are looked up, and only those processes' environments are read, in one privileged call.
    fn lookup_gpus(&self, mapping: &GpuMapping, found: &[JobCgroup]) {
        let mut cache = mapping.cache.lock().unwrap_or_else(|p| p.into_inner());
        let present: HashSet<&str> = found.iter().map(|j| j.uuid.as_str()).collect();
        cache.retain(|k, _| present.contains(k.as_str()));
        // (job, its processes now, those not read before, its subtree now)
        let mut pending: Vec<(&JobCgroup, Vec<u32>, Vec<u32>, SubtreeShape)> = Vec::new();
        let mut faults = Vec::new();
        for job in found {
            let known = cache.entry(job.uuid.clone()).or_default();
            if !known.held.is_empty() || known.shape.as_ref().is_some_and(|s| s.unchanged()) {
                continue;
            }
            let (pids, shape) = cgroup::subtree(&job.dir, &mut faults);
            let new: Vec<u32> = pids
                .iter()
                .copied()
                .filter(|p| !known.pids.contains(p))
                .collect();
            if !new.is_empty() {
                pending.push((job, pids, new, shape));
                continue;
            }
            // Gone processes need not be remembered.
            known.pids.retain(|p| pids.contains(p));
            // A new step's directory can be made before its processes join it: keep looking
            // until they have.
            let grew = known.shape.as_ref().is_none_or(|old| shape.grew_from(old));
            if !grew {
                known.shape = Some(shape);
            }
        }
        if pending.is_empty() {
            return;
        }
        let from_prolog = mapping
            .job_map_dir
            .as_deref()
            .map(jobs::read_job_map)
            .unwrap_or_default();
        let mut to_read = Vec::new();
        for (job, pids, new, shape) in pending {
            let known = cache.entry(job.uuid.clone()).or_default();
            known.pids = pids.into_iter().collect();
            known.shape = Some(shape);
            match from_prolog.get(&job.uuid) {
                Some(gpus) => known.held = gpus.iter().map(|g| (*g, 1.0)).collect(),
                None => to_read.push((job.uuid.clone(), new)),
            }
        }
        if to_read.is_empty() {
            return;
        }
        let procfs = self.procfs.clone();
        // Other users' environ files need CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH.
        let reads = crate::security::privileged(SPEC.capabilities, move || {
            to_read
                .into_iter()
                .map(|(uuid, pids)| {
                    let found = job_gpu_environ(&procfs, &uuid, &pids);
                    (uuid, found)
                })
                .collect::<Vec<_>>()
        });
        for (uuid, env) in reads {
            if let (Some(known), Some(env)) = (cache.get_mut(&uuid), env) {
                let share = jobs::share(&env, mapping.gres, mapping.devices.len());
                known.held = env.gpus.iter().map(|g| (*g, share)).collect();
            }
        }
    }

    fn emit_gpus(&self, mapping: &GpuMapping, found: &[JobCgroup], out: &mut MetricSet) {
        self.lookup_gpus(mapping, found);
        let cache = mapping.cache.lock().unwrap_or_else(|p| p.into_inner());
        let mut published = Vec::new();
        for job in found {
            let held = cache
                .get(&job.uuid)
                .map(|k| k.held.as_slice())
                .unwrap_or(&[]);
            let mut devices = Vec::new();
            for &(index, share) in held {
                let Some(device) = mapping.order.device(&mapping.devices, index) else {
                    tracing::warn!(job = %job.uuid, index, "the job holds a GPU index this node does not have; check --collector.slurm.gpu-order-map");
                    continue;
                };
                let index_text = index.to_string();
                let gpuiid = device
                    .gpu_instance_id
                    .map(|g| g.to_string())
                    .unwrap_or_default();
                let hindex = format!("{}/gpu-{index}", self.hostname);
                let labels = Labels::new(&[
                    ("cgrouphostname", job.cgroup_host.as_str()),
                    ("gpuiid", &gpuiid),
                    ("gpuuuid", &device.uuid),
                    ("hindex", &hindex),
                    ("hostname", &self.hostname),
                    ("index", &index_text),
                    ("manager", MANAGER),
                    ("uuid", &job.uuid),
                ]);
                out.gauge(
                    "ceems_compute_unit_gpu_index_flag",
                    "A value > 0 indicates the job using current GPU",
                    labels.clone(),
                    device.fraction * share,
                );
                if let Some(sm) = device.sm_count {
                    out.gauge(
                        "ceems_compute_unit_gpu_sm_count",
                        "Streaming multiprocessors of the GPU or MIG instance the job holds",
                        labels,
                        f64::from(sm),
                    );
                }
                devices.push((index, device.clone(), share));
            }
            if !devices.is_empty() {
                published.push(JobGpus {
                    uuid: job.uuid.clone(),
                    cgroup_host: job.cgroup_host.clone(),
                    devices,
                });
            }
        }
        jobs::publish(published);
    }

    /// Job metadata from the environment of the first job process that has it.
    fn props_from_environ(&self, dir: &Path) -> Option<JobProps> {
        self.first_in_environ(dir, &mut Vec::new(), job_props::from_environ)
    }

    /// What `pick` finds in the environment of the first process of `dir`'s subtree that has it.
    fn first_in_environ<T: Send + 'static>(
        &self,
        dir: &Path,
        faults: &mut Vec<FileFault>,
        pick: fn(&[u8]) -> Option<T>,
    ) -> Option<T> {
        let mut pids = Vec::new();
        cgroup::find_pid(dir, faults, &mut |pid| {
            pids.push(pid);
            false
        });
        let procfs = self.procfs.clone();
        // Other users' environ files need CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH.
        crate::security::privileged(SPEC.capabilities, move || {
            pids.into_iter().find_map(|pid| {
                let environ = std::fs::read(procfs.join(pid.to_string()).join("environ")).ok()?;
                pick(&environ)
            })
        })
    }

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
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let candidates = self.candidates()?;
        let present: HashSet<&Path> = candidates.iter().map(|c| c.abs.as_path()).collect();
        cache
            .opaque_ids
            .retain(|k, _| present.contains(k.as_path()));
        cache.populated.retain(|k, _| present.contains(k.as_path()));
        drop(present);
        let mut jobs = Vec::new();
        for c in candidates {
            let uuid = match c.id {
                Some(id) => {
                    if !self.has_processes(&c.abs, &mut cache, faults) {
                        continue;
                    }
                    id
                }
                None => match cache.opaque_ids.get(&c.abs) {
                    Some(id) => id.clone(),
                    None => match self.opaque_job_id(&c.abs, faults) {
                        Some(id) => {
                            cache.opaque_ids.insert(c.abs.clone(), id.clone());
                            id
                        }
                        None => continue,
                    },
                },
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
                dir: c.abs,
            });
        }
        Ok(jobs)
    }

    /// Whether a job's subtree holds a process: v2's `cgroup.events` says so in one read;
    /// otherwise walk the subtree's `cgroup.procs`, trusting a positive answer for a while.
    fn has_processes(
        &self,
        dir: &Path,
        cache: &mut DiscoveryCache,
        faults: &mut Vec<FileFault>,
    ) -> bool {
        if self.version == CgroupVersion::V2 {
            if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.events")) {
                let mut populated = None;
                match cgroup::parse::flat_keyed(&text, |k, v| {
                    if k == "populated" {
                        populated = Some(v != 0);
                    }
                }) {
                    Ok(()) if populated.is_some() => return populated == Some(true),
                    Ok(()) => {}
                    Err(e) => faults.push(FileFault {
                        path: dir.join("cgroup.events"),
                        message: e.to_string(),
                    }),
                }
            }
        }
        let now = Instant::now();
        if let Some(seen) = cache.populated.get(dir) {
            if now.duration_since(*seen) < POPULATED_TTL {
                return true;
            }
        }
        let found = cgroup::first_pid(dir, faults).is_some();
        if found {
            cache.populated.insert(dir.to_owned(), now);
        } else {
            cache.populated.remove(dir);
        }
        found
    }

    /// The job id of an opaque directory: `SLURM_JOB_ID` of the first process that has one
    /// (slurmstepd itself sits in the job's subtree and has none).
    fn opaque_job_id(&self, dir: &Path, faults: &mut Vec<FileFault>) -> Option<String> {
        let found =
            self.first_in_environ(dir, faults, |environ| match procfs::slurm_job_id(environ) {
                Ok(id) => id.map(|id| id.to_string()),
                Err(e) => {
                    tracing::debug!(error = %e, "bad SLURM_JOB_ID");
                    None
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

/// The GPUs that the environments of `pids` give job `uuid`: the first `SLURM_JOB_GPUS`, else
/// the first `SLURM_STEP_GPUS`. A process can sit in a job's cgroup and belong to another job
/// (seen in CEEMS's fixtures): only the job's own processes count.
fn job_gpu_environ(procfs: &Path, uuid: &str, pids: &[u32]) -> Option<jobs::JobGpuEnv> {
    let mut step = None;
    for pid in pids {
        let Ok(environ) = std::fs::read(procfs.join(pid.to_string()).join("environ")) else {
            continue;
        };
        let own = procfs::slurm_job_id(&environ)
            .ok()
            .flatten()
            .is_some_and(|id| id.to_string() == uuid);
        if !own {
            continue;
        }
        match jobs::from_environ(&environ) {
            Some(e) if e.from_job => return Some(e),
            Some(e) => {
                step.get_or_insert(e);
            }
            None => {}
        }
    }
    step
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
        self.collect_jobs(&jobs, out);
        Ok(())
    }
}

impl SlurmCollector {
    /// Reads and emits the discovered jobs; a job whose cgroup vanished meanwhile is skipped.
    pub fn collect_jobs(&self, jobs: &[JobCgroup], out: &mut MetricSet) {
        let mut faults = Vec::new();
        let mut reader = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        let mut count = 0usize;
        let devices = if self.detail.io {
            std::fs::read_to_string(self.procfs.join("diskstats"))
                .map(|t| detail::diskstats_names(&t))
                .unwrap_or_default()
        } else {
            HashMap::new()
        };
        let ticks = cgroup::clock_ticks();
        // Other users' /proc/<pid>/fd and exe: one privileged call for all jobs.
        let processes: HashMap<String, processes::JobProcesses> = match self.processes {
            Some(_) => {
                let pids: Vec<(String, Vec<u32>)> = jobs
                    .iter()
                    .map(|j| (j.uuid.clone(), processes::subtree_pids(&j.dir)))
                    .collect();
                let procfs = self.procfs.clone();
                crate::security::privileged(SPEC.capabilities, move || {
                    pids.into_iter()
                        .map(|(uuid, pids)| (uuid, processes::read_job(&procfs, &pids)))
                        .collect()
                })
            }
            None => HashMap::new(),
        };
        for job in jobs {
            let stats = match reader.read_unit(&job.rel, self.read_opts, &mut faults) {
                Ok(s) => s,
                Err(UnitError::Vanished(_)) => {
                    tracing::debug!(job = %job.uuid, "job cgroup vanished during the scrape");
                    faults.clear();
                    continue;
                }
            };
            count += 1;
            let base = [
                ("cgrouphostname", job.cgroup_host.as_str()),
                ("hostname", self.hostname.as_str()),
                ("manager", MANAGER),
                ("uuid", job.uuid.as_str()),
            ];
            let labels = Labels::new(&base);
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
            if self.detail.any() {
                let d = reader.read_detail(&job.rel, self.detail, &mut faults);
                for f in faults.drain(..) {
                    tracing::debug!(job = %job.uuid, path = %f.path.display(), error = %f.message, "cannot read job detail file");
                }
                detail::emit_detail(out, &base, &d, &devices);
            }
            if let (Some(limit), Some(p)) = (self.processes, processes.get(job.uuid.as_str())) {
                processes::emit(out, &base, p, limit, ticks);
            }
            if let Some(source) = &self.info {
                let p = self.job_props(job, source);
                out.gauge(
                    "ceems_compute_unit_info",
                    "Slurm job metadata: user, account, partition and job name",
                    Labels::new(&[
                        ("account", &p.account),
                        ("cgrouphostname", &job.cgroup_host),
                        ("hostname", &self.hostname),
                        ("jobname", &p.job_name),
                        ("manager", MANAGER),
                        ("partition", &p.partition),
                        ("user", &p.user),
                        ("uuid", &job.uuid),
                    ]),
                    1.0,
                );
            }
        }
        if let Some(mapping) = &self.gpus {
            self.emit_gpus(mapping, jobs, out);
        }
        if self.info.is_some() {
            let present: HashSet<&str> = jobs.iter().map(|j| j.uuid.as_str()).collect();
            self.props
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|k, _| present.contains(k.as_str()));
        }
        out.gauge(
            names::UNITS,
            names::UNITS_HELP,
            Labels::new(&[("hostname", &self.hostname), ("manager", MANAGER)]),
            count as f64,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        c.collect_jobs(&jobs, &mut out);
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
            fs::write(mem_dir.join("memory.stat"), "anon twelve\n\0\u{fffd}").unwrap();
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
        assert!(c.cache.lock().unwrap().opaque_ids.is_empty());
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
        let uid = job_props::uid_from_path(&tree.job_dir(2)).expect("v1 path has uid_");
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
        assert!(!c.props.lock().unwrap().contains_key("1000000"));
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
            let device = |minor: u32| GpuDevice {
                index: minor as usize,
                minor,
                uuid: format!("GPU-{minor}"),
                gpu_instance_id: None,
                sm_count: None,
                fraction: 1.0,
                model: String::new(),
            };
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
            let mapping = c.gpus.as_ref().unwrap();
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
