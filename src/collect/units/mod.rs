//! Compute units (batch jobs, VMs, pods) of any resource manager. The manager finds the node's
//! units and says what it knows of them (owner, GPUs); [`UnitCollector`] reads their cgroups
//! and processes and emits the `ceems_compute_unit_*` series, with the manager's name in the
//! `manager` label. A new manager is one folder under `src/manager/` that implements
//! [`ResourceManager`] and a `CollectorSpec` that builds a `UnitCollector` over it.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub mod discovery;
pub mod ebpf;
mod emit;
pub mod perf;
pub mod rdma;

use super::{Capability, CollectError, Collector, MetricNames};
use crate::host::cgroup::detail::{self, DetailOptions, UnitDetail};
use crate::host::cgroup::{
    self, CgroupReader, CgroupVersion, FileFault, HostMemory, ReadOptions, ReaderThread, UnitError,
    UnitStats,
};
use crate::host::{processes, procfs};
use crate::metrics::{Labels, MetricSet};
pub use discovery::{ResourceManager, UnitCgroup, UnitGpus, UnitInfo, UnitSet};
pub use emit::{emit_detail, emit_processes, emit_rdma_current, emit_scratch, emit_unit, names};

/// A part that runs inside a unit collector, per unit, when its settings turn it on; a
/// collector's spec names those it hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubCollector {
    /// RDMA resources and queue pair counters of the units' processes (`--collector.rdma.stats`).
    Rdma,
    /// Perf events per unit (`--collector.perf.*`).
    Perf,
    /// eBPF IO and network counters per unit (`--collector.ebpf.*`).
    Ebpf,
}

/// The mapping of the last scrape of the units collector, for the nvidia collector's per-unit
/// series.
static PUBLISHED: Mutex<Vec<UnitGpus>> = Mutex::new(Vec::new());

pub fn publish(units: Vec<UnitGpus>) {
    *PUBLISHED.lock().unwrap_or_else(|p| p.into_inner()) = units;
}

pub fn published() -> Vec<UnitGpus> {
    PUBLISHED.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The node's memory and swap, for limits that say "none".
pub fn host_memory(procfs: &Path) -> HostMemory {
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

/// The cgroup version units are read in: `--collector.cgroups.force-version`, else what the
/// hierarchy at `--path.cgroupfs` is.
pub fn cgroup_version(ctx: &super::Context) -> Result<CgroupVersion, CollectError> {
    cgroup_version_of(
        ctx.common.cgroups.force_version.as_deref(),
        &ctx.paths.cgroupfs,
    )
}

/// [`cgroup_version`] from the flag's value and the hierarchy's root.
pub fn cgroup_version_of(
    forced: Option<&str>,
    cgroupfs: &Path,
) -> Result<CgroupVersion, CollectError> {
    match forced {
        Some(v) => CgroupVersion::from_flag(v)
            .ok_or_else(|| CollectError::Other(format!("unknown cgroup version `{v}`"))),
        None => Ok(cgroup::detect_version(cgroupfs)),
    }
}

/// Reads and emits the units a manager finds.
pub struct UnitCollector<M> {
    pub manager: M,
    procfs: PathBuf,
    hostname: String,
    read_opts: ReadOptions,
    /// Where the units' cgroups are read, and how.
    cgroups: (PathBuf, CgroupVersion, HostMemory),
    /// The reader of the units' cgroups, on its own thread from the first scrape on.
    reader: Mutex<Option<ReaderThread>>,
    detail: DetailOptions,
    /// `Some(exe limit)` with process metrics.
    processes: Option<usize>,
    /// What reading other users' `/proc/<pid>` files needs.
    capabilities: &'static [Capability],
    /// `--collector.rdma.stats`.
    rdma: Option<rdma::RdmaStats>,
    /// `--collector.perf.*`.
    perf: Option<perf::PerfStats>,
    /// `--collector.ebpf.*`.
    ebpf: Option<ebpf::EbpfStats>,
    /// `--collector.slurm.scratch-path`: filesystems whose use by a unit is exported.
    scratch: Vec<PathBuf>,
    /// The units' processes as last listed, for the perf sub-collector alone.
    listed: Mutex<PidLists>,
    /// Each unit's label block as the last scrape built it.
    labels: Mutex<UnitLabels>,
    /// `--compat.metric-names`: v0.10 had no `ceems_compute_unit_gpu_sm_count`.
    names: MetricNames,
}

/// A unit's processes as one walk of its subtree found them.
struct ListedPids {
    shape: cgroup::SubtreeShape,
    pids: Vec<u32>,
    at: Instant,
}

/// Units' process lists, walked again only when a unit's subtree changed shape or its list
/// grew old: walking every cgroup of every job each scrape costs far more than reading the
/// perf counters themselves.
#[derive(Default)]
struct PidLists(HashMap<String, ListedPids>);

impl PidLists {
    /// Each unit's pids; units not in `units` are forgotten.
    fn list(&mut self, units: &[UnitCgroup], max_age: Duration) -> Vec<(String, Vec<u32>)> {
        let present: HashSet<&str> = units.iter().map(|u| u.uuid.as_str()).collect();
        self.0.retain(|uuid, _| present.contains(uuid.as_str()));
        let mut faults = Vec::new();
        units
            .iter()
            .map(|u| {
                let fresh = self
                    .0
                    .get(&u.uuid)
                    .is_some_and(|l| l.at.elapsed() < max_age && l.shape.unchanged());
                if !fresh {
                    let at = Instant::now();
                    let (pids, shape) = cgroup::subtree(&u.dir, &mut faults);
                    faults.clear();
                    self.0
                        .insert(u.uuid.clone(), ListedPids { shape, pids, at });
                }
                let pids = self.0.get(&u.uuid).map(|l| l.pids.clone());
                (u.uuid.clone(), pids.unwrap_or_default())
            })
            .collect()
    }
}

/// The units' label blocks of the last scrape, in its order of units: discovery gives them
/// in the same order scrape after scrape, so the block in a unit's place is nearly always its
/// own, found without hashing (building a thousand blocks showed in profiles).
#[derive(Default)]
struct UnitLabels(Vec<(UnitKey, Labels)>);

/// A unit's uuid and cgroup host, inline when they are short (job ids are): the check of
/// each unit against the last scrape's then reads one cache line in order instead of two
/// strings somewhere on the heap.
#[derive(Debug, PartialEq, Eq)]
enum UnitKey {
    Inline { lens: [u8; 2], bytes: [u8; 46] },
    Heap(Box<str>, Box<str>),
}

impl UnitKey {
    fn new(uuid: &str, host: &str) -> UnitKey {
        let mut bytes = [0; 46];
        match (u8::try_from(uuid.len()), u8::try_from(host.len())) {
            (Ok(u), Ok(h)) if uuid.len() + host.len() <= bytes.len() => {
                bytes[..uuid.len()].copy_from_slice(uuid.as_bytes());
                bytes[uuid.len()..uuid.len() + host.len()].copy_from_slice(host.as_bytes());
                UnitKey::Inline {
                    lens: [u, h],
                    bytes,
                }
            }
            _ => UnitKey::Heap(uuid.into(), host.into()),
        }
    }

    fn is(&self, uuid: &str, host: &str) -> bool {
        match self {
            UnitKey::Inline { lens, bytes } => {
                let (u, h) = (usize::from(lens[0]), usize::from(lens[1]));
                u == uuid.len()
                    && h == host.len()
                    && bytes[..u] == *uuid.as_bytes()
                    && bytes[u..u + h] == *host.as_bytes()
            }
            UnitKey::Heap(u, h) => **u == *uuid && **h == *host,
        }
    }
}

impl UnitLabels {
    /// The block of `unit`, in place `i` of this scrape, made of `base` (its uuid and cgroup
    /// host with the collector's constants): the last scrape's when that was the same unit.
    fn get(&mut self, i: usize, unit: &UnitCgroup, base: &[(&str, &str)]) -> Labels {
        if let Some((key, labels)) = self.0.get(i) {
            if key.is(&unit.uuid, &unit.cgroup_host) {
                return labels.clone();
            }
        }
        let labels = Labels::new(base);
        let entry = (UnitKey::new(&unit.uuid, &unit.cgroup_host), labels.clone());
        match self.0.get_mut(i) {
            Some(slot) => *slot = entry,
            None => self.0.push(entry),
        }
        labels
    }
}

/// How long the perf sub-collector trusts a unit's process list while its subtree keeps its
/// shape. A new step is a new directory and is seen at once; a process moved into an existing
/// directory (pam_slurm_adopt's ssh sessions) is seen within this time. Counters inherit into
/// every process the counted ones create, so those need no listing.
const PIDS_RELISTED_AFTER: Duration = Duration::from_secs(60);

impl<M: ResourceManager> UnitCollector<M> {
    /// A collector of `manager`'s units in the hierarchy at `cgroupfs`; reading other users'
    /// processes takes `capabilities`.
    pub fn new(
        manager: M,
        cgroupfs: &Path,
        procfs: &Path,
        version: CgroupVersion,
        hostname: &str,
        read_opts: ReadOptions,
        capabilities: &'static [Capability],
    ) -> UnitCollector<M> {
        UnitCollector {
            manager,
            procfs: procfs.to_owned(),
            hostname: hostname.to_owned(),
            read_opts,
            cgroups: (cgroupfs.to_owned(), version, host_memory(procfs)),
            reader: Mutex::new(None),
            detail: DetailOptions::default(),
            processes: None,
            capabilities,
            rdma: None,
            perf: None,
            ebpf: None,
            scratch: Vec::new(),
            listed: Mutex::new(PidLists::default()),
            labels: Mutex::new(UnitLabels::default()),
            names: MetricNames::default(),
        }
    }

    /// Exports the families of this CEEMS generation.
    fn with_names(mut self, names: MetricNames) -> UnitCollector<M> {
        self.names = names;
        self
    }

    /// What every manager's collector takes from its context: the perf and eBPF
    /// sub-collectors its flags ask for, and the generation of names.
    pub fn with_context(
        self,
        ctx: &super::Context,
        version: CgroupVersion,
    ) -> Result<UnitCollector<M>, CollectError> {
        Ok(self
            .with_perf(perf::PerfStats::for_collector(ctx, version)?)
            .with_ebpf(ebpf::EbpfStats::for_collector(ctx, version))
            .with_names(ctx.names))
    }

    /// Also export whether each unit's processes use each of `paths`.
    pub fn with_scratch(mut self, paths: Vec<PathBuf>) -> UnitCollector<M> {
        self.scratch = paths;
        self
    }

    /// Also export the RDMA resources of the units' processes and the ports' traffic.
    pub fn with_rdma(mut self, rdma: Option<rdma::RdmaStats>) -> UnitCollector<M> {
        self.rdma = rdma;
        self
    }

    /// Also count the units' IO and traffic with eBPF.
    fn with_ebpf(mut self, ebpf: Option<ebpf::EbpfStats>) -> UnitCollector<M> {
        self.ebpf = ebpf;
        self
    }

    /// Also count the units' perf events.
    fn with_perf(mut self, perf: Option<perf::PerfStats>) -> UnitCollector<M> {
        self.perf = perf;
        self
    }

    /// Also export per-unit process detail, with at most `exe_limit` executables each.
    pub fn with_processes(mut self, exe_limit: usize) -> UnitCollector<M> {
        self.processes = Some(exe_limit);
        self
    }

    /// Also read and export these detail groups.
    pub fn with_detail(mut self, detail: DetailOptions) -> UnitCollector<M> {
        self.detail = detail;
        self
    }

    /// Finds the units through the manager.
    pub fn discover(&self, faults: &mut Vec<FileFault>) -> Result<Vec<UnitCgroup>, CollectError> {
        self.manager.discover(faults)
    }

    /// Reads every unit's cgroup files on the reader's thread (started at the first call).
    fn read_units(
        &self,
        units: Vec<UnitCgroup>,
    ) -> Result<(Vec<UnitCgroup>, Vec<UnitRead>), CollectError> {
        let mut thread = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        let thread = match &mut *thread {
            Some(t) => t,
            None => {
                let (root, version, host) = self.cgroups.clone();
                let spawned = ReaderThread::spawn(move || CgroupReader::new(&root, version, host))
                    .map_err(|e| CollectError::Other(e.to_string()))?;
                thread.insert(spawned)
            }
        };
        let (opts, detail) = (self.read_opts, self.detail);
        thread
            .run(move |reader| {
                let reads = units
                    .iter()
                    .map(|unit| UnitRead::of(reader, unit, opts, detail))
                    .collect();
                reader.end_scrape();
                (units, reads)
            })
            .map_err(|e| CollectError::Other(e.to_string()))
    }

    /// Reads and emits the discovered units; a unit whose cgroup vanished meanwhile is skipped.
    pub fn collect_units(
        &self,
        units: Vec<UnitCgroup>,
        out: &mut MetricSet,
    ) -> Result<(), CollectError> {
        let manager = self.manager.name();
        let mut count = 0usize;
        let devices = if self.detail.io {
            std::fs::read_to_string(self.procfs.join("diskstats"))
                .map(|t| detail::diskstats_names(&t))
                .unwrap_or_default()
        } else {
            HashMap::new()
        };
        let ticks = cgroup::clock_ticks();
        // The processes' own files: for process metrics and scratch use alike.
        let read_processes = self.processes.is_some() || !self.scratch.is_empty();
        // Sub-collectors that read the pid list after the privileged pass.
        let pids_after = self.rdma.is_some() || self.perf.is_some();
        let mut pids: Vec<(String, Vec<u32>)> = if read_processes || self.rdma.is_some() {
            units
                .iter()
                .map(|u| (u.uuid.clone(), processes::subtree_pids(&u.dir)))
                .collect()
        } else if self.perf.is_some() {
            let mut listed = self.listed.lock().unwrap_or_else(|p| p.into_inner());
            listed.list(&units, PIDS_RELISTED_AFTER)
        } else {
            Vec::new()
        };
        // Other users' /proc/<pid>/fd and exe: one privileged call for all units.
        let processes: HashMap<String, processes::JobProcesses> = if read_processes {
            // The privileged thread takes its own copy only when a sub-collector needs the list after.
            let pids = if pids_after {
                pids.clone()
            } else {
                std::mem::take(&mut pids)
            };
            let procfs = self.procfs.clone();
            let scratch = self.scratch.clone();
            crate::security::privileged(self.capabilities, move || {
                pids.into_iter()
                    .map(|(uuid, pids)| (uuid, processes::read_job(&procfs, &pids, &scratch)))
                    .collect()
            })
        } else {
            HashMap::new()
        };
        let (units, reads) = self.read_units(units)?;
        out.expect_samples(units.len());
        let mut unit_labels = self.labels.lock().unwrap_or_else(|p| p.into_inner());
        unit_labels.0.truncate(units.len());
        for (place, (unit, read)) in units.iter().zip(reads).enumerate() {
            let UnitRead {
                stats,
                mut faults,
                detail,
            } = read;
            let mut stats = match stats {
                Ok(s) => s,
                Err(UnitError::Vanished(_)) => {
                    tracing::debug!(manager, unit = %unit.uuid, "unit cgroup vanished during the scrape");
                    continue;
                }
            };
            count += 1;
            if let Some(cpus) = self.manager.cpus(unit) {
                stats.cpus = cpus;
            }
            let base = [
                ("cgrouphostname", unit.cgroup_host.as_str()),
                ("hostname", self.hostname.as_str()),
                ("manager", manager),
                ("uuid", unit.uuid.as_str()),
            ];
            let labels = unit_labels.get(place, unit, &base);
            if !faults.is_empty() {
                for f in faults.drain(..) {
                    tracing::warn!(manager, unit = %unit.uuid, path = %f.path.display(), error = %f.message, "cannot read unit cgroup file");
                }
                out.gauge(
                    names::COLLECT_ERROR,
                    names::COLLECT_ERROR_HELP,
                    labels.clone(),
                    1.0,
                );
            }
            emit_unit(out, &labels, &stats, self.read_opts);
            emit_rdma_current(out, &base, &stats.rdma);
            if let Some((d, faults)) = detail {
                for f in faults {
                    tracing::debug!(manager, unit = %unit.uuid, path = %f.path.display(), error = %f.message, "cannot read unit detail file");
                }
                emit_detail(out, &base, &d, &devices);
            }
            if let Some(p) = processes.get(unit.uuid.as_str()) {
                if let Some(limit) = self.processes {
                    emit_processes(out, &base, p, limit, ticks);
                }
                emit_scratch(out, &base, &self.scratch, &p.uses_scratch);
            }
            if let Some(info) = self.manager.info(unit) {
                let mut labels: Vec<(&str, &str)> = base.to_vec();
                labels.extend(info.labels.iter().map(|(k, v)| (*k, v.as_str())));
                out.gauge(
                    "ceems_compute_unit_info",
                    info.help,
                    Labels::new(&labels),
                    1.0,
                );
            }
        }
        out.expect_samples(0);
        if let Some(rdma) = &self.rdma {
            rdma.collect(&pids, manager, &self.hostname, out);
        }
        if let Some(perf) = &self.perf {
            let perf_units: Vec<perf::PerfUnit<'_>> = units
                .iter()
                .zip(&pids)
                .map(|(u, (_, pids))| perf::PerfUnit {
                    uuid: &u.uuid,
                    dir: &u.dir,
                    rel: &u.rel,
                    pids,
                })
                .collect();
            perf.collect(&perf_units, manager, &self.hostname, out);
        }
        if let Some(ebpf) = &self.ebpf {
            let ebpf_units: Vec<ebpf::EbpfUnit<'_>> = units
                .iter()
                .map(|u| ebpf::EbpfUnit {
                    uuid: &u.uuid,
                    dir: &u.dir,
                    rel: &u.rel,
                })
                .collect();
            ebpf.collect(&ebpf_units, manager, &self.hostname, out);
        }
        let held = self.manager.gpus(&units);
        emit_gpus(out, &self.hostname, &held, self.names);
        publish(held);
        let present: UnitSet<'_> = units.iter().map(|u| u.uuid.as_str()).collect();
        self.manager.retain(&present);
        out.gauge(
            names::UNITS,
            names::UNITS_HELP,
            Labels::new(&[("hostname", &self.hostname), ("manager", manager)]),
            count as f64,
        );
        Ok(())
    }
}

/// What the reader's thread read of one unit: its accounting, what failed, and its detail
/// groups when asked for (not for a unit that vanished).
struct UnitRead {
    stats: Result<UnitStats, UnitError>,
    faults: Vec<FileFault>,
    detail: Option<(UnitDetail, Vec<FileFault>)>,
}

impl UnitRead {
    fn of(
        reader: &mut CgroupReader,
        unit: &UnitCgroup,
        opts: ReadOptions,
        detail: DetailOptions,
    ) -> UnitRead {
        reader.enter_unit(&unit.rel, &unit.dir, unit.dir_ino);
        let mut faults = Vec::new();
        let stats = reader.read_unit(&unit.rel, opts, &mut faults);
        let detail = (stats.is_ok() && detail.any()).then(|| {
            let mut faults = Vec::new();
            (reader.read_detail(&unit.rel, detail, &mut faults), faults)
        });
        UnitRead {
            stats,
            faults,
            detail,
        }
    }
}

/// `ceems_compute_unit_gpu_index_flag` and `_sm_count` of each GPU a unit holds.
fn emit_gpus(out: &mut MetricSet, hostname: &str, held: &[UnitGpus], names: MetricNames) {
    for unit in held {
        for (index, device, share) in &unit.devices {
            let index_text = index.to_string();
            let gpuiid = device
                .gpu_instance_id
                .map(|g| g.to_string())
                .unwrap_or_default();
            let hindex = format!("{hostname}/gpu-{index}");
            let labels = Labels::new(&[
                ("cgrouphostname", unit.cgroup_host.as_str()),
                ("gpuiid", &gpuiid),
                ("gpuuuid", &device.uuid),
                ("hindex", &hindex),
                ("hostname", hostname),
                ("index", &index_text),
                ("manager", unit.manager),
                ("uuid", &unit.uuid),
            ]);
            // v0.10 weighs a MIG instance by its share of the GPU; today's CEEMS gives the
            // unit's share of the instance and says its size in `_sm_count`.
            let flag = match names {
                MetricNames::V010 => device.fraction * share,
                MetricNames::Current => *share,
            };
            out.gauge(
                "ceems_compute_unit_gpu_index_flag",
                "A value > 0 indicates the compute unit using current GPU",
                labels.clone(),
                flag,
            );
            if let Some(sm) = device.sm_count.filter(|_| names == MetricNames::Current) {
                out.gauge(
                    "ceems_compute_unit_gpu_sm_count",
                    "Number of SMs/CUs in the GPU instance",
                    labels,
                    f64::from(sm),
                );
            }
        }
    }
}

impl<M: ResourceManager> Collector for UnitCollector<M> {
    fn collect(&self, out: &mut MetricSet) -> Result<(), CollectError> {
        let mut faults = Vec::new();
        let units = self.discover(&mut faults)?;
        for f in faults.drain(..) {
            tracing::warn!(manager = self.manager.name(), path = %f.path.display(), error = %f.message, "cannot read unit processes");
        }
        self.collect_units(units, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn unit(root: &Path, id: &str) -> UnitCgroup {
        let rel = PathBuf::from(format!("slurm/job_{id}"));
        UnitCgroup {
            uuid: id.to_owned(),
            cgroup_host: String::new(),
            dir: root.join(&rel),
            rel,
            dir_ino: None,
        }
    }

    fn procs(dir: &Path, pids: &str) {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join("cgroup.procs"), pids).unwrap();
    }

    #[test]
    fn process_lists_are_walked_again_on_a_new_step_or_when_old() {
        let tmp = tempfile::tempdir().unwrap();
        let job = unit(tmp.path(), "7");
        procs(&job.dir.join("step_batch"), "10\n");
        let mut lists = PidLists::default();
        let hour = Duration::from_secs(3600);
        assert_eq!(lists.list(std::slice::from_ref(&job), hour)[0].1, [10]);

        // A process moved into a directory that was there: the list is trusted until it is old.
        procs(&job.dir.join("step_batch"), "10\n11\n");
        assert_eq!(lists.list(std::slice::from_ref(&job), hour)[0].1, [10]);
        assert_eq!(
            lists.list(std::slice::from_ref(&job), Duration::ZERO)[0].1,
            [10, 11]
        );

        // A new step is a new directory: seen at once.
        procs(&job.dir.join("step_0"), "20\n");
        let mut pids = lists.list(std::slice::from_ref(&job), hour).remove(0).1;
        pids.sort_unstable();
        assert_eq!(pids, [10, 11, 20]);

        // A unit that ended is forgotten.
        lists.list(&[], hour);
        assert!(lists.0.is_empty());
    }

    /// A unit in the place it had gets the very block it had; another unit in that place, or
    /// the same uuid under another cgroup host, gets its own.
    #[test]
    fn label_blocks_are_reused_only_for_the_unit_they_were_made_for() {
        let root = Path::new("/sys/fs/cgroup");
        let mut cache = UnitLabels::default();
        let block = |cache: &mut UnitLabels, i: usize, u: &UnitCgroup| {
            let base = [
                ("cgrouphostname", u.cgroup_host.as_str()),
                ("uuid", u.uuid.as_str()),
            ];
            cache.get(i, u, &base)
        };
        let (a, b) = (unit(root, "1"), unit(root, "2"));
        let first = block(&mut cache, 0, &a);
        let again = block(&mut cache, 0, &a);
        assert!(std::ptr::eq(first.as_str(), again.as_str()), "not reused");
        assert_eq!(
            block(&mut cache, 0, &b).as_str(),
            r#"{cgrouphostname="",uuid="2"}"#
        );
        let mut elsewhere = b.clone();
        elsewhere.cgroup_host = "node9".to_owned();
        assert_eq!(
            block(&mut cache, 0, &elsewhere).as_str(),
            r#"{cgrouphostname="node9",uuid="2"}"#
        );
        assert_eq!(
            block(&mut cache, 1, &a).as_str(),
            r#"{cgrouphostname="",uuid="1"}"#
        );
        // The same bytes split otherwise between uuid and host are another unit.
        let mut split = unit(root, "2n");
        split.cgroup_host = "ode9".to_owned();
        assert_eq!(
            block(&mut cache, 0, &split).as_str(),
            r#"{cgrouphostname="ode9",uuid="2n"}"#
        );
        // Ids too long to keep inline are compared whole as well.
        let long = unit(root, &"7".repeat(60));
        let first = block(&mut cache, 2, &long);
        let again = block(&mut cache, 2, &long);
        assert!(std::ptr::eq(first.as_str(), again.as_str()), "not reused");
        let other = unit(root, &format!("{}8", "7".repeat(59)));
        assert!(block(&mut cache, 2, &other).as_str().contains(r#"78"}"#));
    }
}
