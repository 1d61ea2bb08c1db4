//! Which of the node's GPUs each Slurm job holds: the prolog's GPU→job files, else the
//! environment of the job's own processes, looked up once per job and again only when a step
//! comes or goes.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::gpu_env::{self as jobs, GresShares, OrderMap};
use super::{Settings, SlurmManager, MANAGER, SPEC};
use crate::collect::gpu::{self, GpuDevice};
use crate::collect::{CollectError, Context};
use crate::host::cgroup::{self, SubtreeShape};
use crate::host::procfs;
use crate::manager::{UnitCgroup, UnitGpus};

/// The node's GPUs and what maps Slurm's GPU indices onto them.
pub struct GpuMapping {
    pub devices: Vec<GpuDevice>,
    pub order: OrderMap,
    pub gres: GresShares,
    pub job_map_dir: Option<PathBuf>,
    /// What is known of each present job's GPUs, until the job ends.
    pub(super) cache: Mutex<HashMap<String, GpuLookup>>,
}

/// What is known of one job's GPUs. A job's GPUs do not change while it runs: once found they
/// are final. "No GPU" is remembered with the processes it was read from and the shape of the
/// job's cgroup subtree: the job is looked at again only when a directory (a step) comes or
/// goes, and then only its new processes' environments are read.
#[derive(Debug, Default)]
pub(super) struct GpuLookup {
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

/// The node's GPUs, when it has some. A malformed order map stops start-up; a GPU tool that
/// fails leaves the collector without GPU series, said in the log.
pub(super) fn gpu_mapping(ctx: &Context, s: &Settings) -> Result<Option<GpuMapping>, CollectError> {
    let order = OrderMap::parse(s.gpu_order_map.as_deref().unwrap_or(""))
        .map_err(|e| CollectError::Other(format!("--collector.slurm.gpu-order-map: {e}")))?;
    let devices = gpu::discover_for_units(&ctx.common.gpu, &ctx.paths.sysfs, "jobs");
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

impl SlurmManager {
    /// Updates what is known of each job's GPUs: the prolog's files, else the environment of
    /// its processes whose `SLURM_JOB_ID` is the job's (one with `SLURM_JOB_GPUS` before one
    /// with only `SLURM_STEP_GPUS`). Only jobs with no GPU known and a process not seen before
    /// are looked up, and only those processes' environments are read, in one privileged call.
    fn lookup_gpus(&self, mapping: &GpuMapping, found: &[UnitCgroup]) {
        let mut cache = mapping.cache.lock().unwrap_or_else(|p| p.into_inner());
        let present: HashSet<&str> = found.iter().map(|j| j.uuid.as_str()).collect();
        cache.retain(|k, _| present.contains(k.as_str()));
        // (job, its processes now, those not read before, its subtree now)
        let mut pending: Vec<(&UnitCgroup, Vec<u32>, Vec<u32>, SubtreeShape)> = Vec::new();
        let mut faults = Vec::new();
        for job in found {
            if !cache.contains_key(&job.uuid) {
                cache.insert(job.uuid.clone(), GpuLookup::default());
            }
            let Some(known) = cache.get_mut(&job.uuid) else {
                continue;
            };
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

    /// The GPUs each job holds, as devices of this node.
    pub(super) fn unit_gpus(&self, mapping: &GpuMapping, found: &[UnitCgroup]) -> Vec<UnitGpus> {
        self.lookup_gpus(mapping, found);
        let cache = mapping.cache.lock().unwrap_or_else(|p| p.into_inner());
        let mut held = Vec::new();
        for job in found {
            let known = cache
                .get(&job.uuid)
                .map(|k| k.held.as_slice())
                .unwrap_or(&[]);
            let mut devices = Vec::new();
            for &(index, share) in known {
                let Some(device) = mapping.order.device(&mapping.devices, index) else {
                    tracing::warn!(job = %job.uuid, index, "the job holds a GPU index this node does not have; check --collector.slurm.gpu-order-map");
                    continue;
                };
                devices.push((index, device.clone(), share));
            }
            if !devices.is_empty() {
                held.push(UnitGpus {
                    manager: MANAGER,
                    uuid: job.uuid.clone(),
                    rel: job.rel.clone(),
                    cgroup_host: job.cgroup_host.clone(),
                    devices,
                });
            }
        }
        held
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
