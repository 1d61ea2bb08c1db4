//! The collector registry: every collector is one module that exports a [`CollectorSpec`];
//! [`COLLECTORS`] lists them. The registry turns the specs into flags, builds the enabled
//! collectors, and runs a scrape in which each collector gets its own thread and deadline.

pub mod alloy_targets;
pub mod cpu;
pub mod cray_pm_counters;
pub mod emissions;
pub mod gpu;
pub mod hwmon;
pub mod infiniband;
pub mod ipmi;
pub mod meminfo;
pub mod netdev;
pub mod rapl;
pub mod redfish;
pub mod slurm_cluster;
pub mod trace;
pub mod units;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::config::{Kind, Layered, Opt};
use crate::metrics::{Labels, MetricSet};

pub use caps::Capability;

/// One collector: how it reads its metrics. Its name, flags and capabilities are in its
/// [`CollectorSpec`].
pub trait Collector: Send + Sync + 'static {
    /// Reads the metrics. Runs on a dedicated blocking thread, so it may block on I/O.
    fn collect(&self, out: &mut MetricSet) -> Result<(), CollectError>;
}

/// What a collector failed at. Expected absences (no such hardware) log at debug level.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot parse {path}: {source}")]
    Parse {
        path: PathBuf,
        source: crate::host::ParseError,
    },
    #[error("{0}")]
    Absent(String),
    #[error("{0}")]
    Other(String),
    /// The source failed; the collector still wrote its last good values, which are served
    /// while the collector reports success 0.
    #[error("{0} (serving the last good values)")]
    Stale(String),
}

impl CollectError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> CollectError {
        CollectError::Io {
            path: path.into(),
            source,
        }
    }

    /// Lists a directory whose absence means "this node has no such hardware".
    pub fn read_dir_or_absent(
        dir: &std::path::Path,
        absent: &str,
    ) -> Result<std::fs::ReadDir, CollectError> {
        std::fs::read_dir(dir).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                CollectError::Absent(absent.to_owned())
            } else {
                CollectError::io(dir, e)
            }
        })
    }

    fn is_absence(&self) -> bool {
        matches!(self, CollectError::Absent(_))
    }
}

/// Filesystem roots, injected so that fixture trees can stand in for the host's.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Paths {
    pub sysfs: PathBuf,
    pub procfs: PathBuf,
    pub cgroupfs: PathBuf,
}

/// Settings every collector may read, from `[exporter.collector]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CommonSettings {
    pub disable_defaults: bool,
    pub empty_hostname_label: bool,
    #[serde(deserialize_with = "crate::config::de_duration")]
    pub timeout: Duration,
    pub cgroups: CgroupSettings,
    #[serde(default)]
    pub gpu: gpu::GpuSettings,
    #[serde(default)]
    pub rdma: units::rdma::RdmaSettings,
    #[serde(default)]
    pub perf: units::perf::PerfSettings,
    #[serde(default)]
    pub ebpf: units::ebpf::EbpfSettings,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CgroupSettings {
    #[serde(default)]
    pub force_version: Option<String>,
    pub active_subsystem: String,
}

/// What a collector is built from.
pub struct Context {
    pub paths: Paths,
    pub common: CommonSettings,
    /// Value of the `hostname` label (empty with `--collector.empty-hostname-label`).
    pub hostname: String,
    /// This collector's own table, `[exporter.collector.<name>]`.
    pub settings: Layered,
}

impl Context {
    /// This collector's own settings (its table without `enabled`).
    pub fn settings<T: serde::de::DeserializeOwned>(&self) -> Result<T, CollectError> {
        self.settings
            .get("")
            .map_err(|e| CollectError::Other(e.to_string()))
    }

    pub fn hostname_labels(&self) -> Labels {
        Labels::new(&[("hostname", &self.hostname)])
    }
}

/// The static description of a collector, known before it is built (for flags, `--help` and
/// `check-privileges`).
pub struct CollectorSpec {
    pub name: &'static str,
    pub default_enabled: bool,
    pub capabilities: &'static [Capability],
    /// The collector's own options besides `--collector.<name>`.
    pub options: fn() -> Vec<Opt>,
    pub build: fn(&Context) -> Result<Box<dyn Collector>, CollectError>,
    /// The real operation behind `capabilities`, for `check-privileges`.
    pub self_test: Option<fn(&Paths, &[Capability]) -> crate::security::check::OperationTest>,
}

/// Every collector this binary has.
pub static COLLECTORS: &[CollectorSpec] = &[
    cpu::SPEC,
    meminfo::SPEC,
    netdev::SPEC,
    infiniband::SPEC,
    crate::manager::slurm::SPEC,
    crate::manager::libvirt::SPEC,
    rapl::SPEC,
    hwmon::SPEC,
    cray_pm_counters::SPEC,
    ipmi::SPEC,
    redfish::SPEC,
    emissions::SPEC,
    slurm_cluster::SPEC,
    gpu::nvidia::SPEC,
];

/// The flags of every collector: `--collector.<name>` and each one's own options.
pub fn options() -> Vec<Opt> {
    let mut opts = vec![
        Opt::flag(
            "collector.disable-defaults",
            "Disable every collector that is on by default; enable the wanted ones one by one",
        ),
        Opt::flag(
            "collector.empty-hostname-label",
            "Leave the hostname label empty (for tests and for setups that add it by relabelling)",
        ),
        Opt::new(
            "collector.timeout",
            Kind::Duration,
            "Longest time one collector may take in a scrape; shorter if Prometheus's scrape timeout is",
        )
        .default("10s"),
        Opt::new(
            "collector.cgroups.force-version",
            Kind::Str,
            "Use this cgroup version instead of detecting it from the mount",
        )
        .possible(&["v1", "v2"]),
        Opt::new(
            "collector.cgroups.active-subsystem",
            Kind::Str,
            "cgroups v1 subsystem in which units are discovered",
        )
        .default("cpuacct"),
        Opt::new(
            "collector.gpu.type",
            Kind::Str,
            "GPU vendor of the node; detected from PCI vendor ids when not given",
        )
        .possible(&["nvidia", "amd", "nogpu"]),
        Opt::new(
            "collector.gpu.nvidia-smi-path",
            Kind::Str,
            "nvidia-smi, asked for the GPUs when libnvidia-ml.so.1 cannot be loaded (default: found on PATH)",
        ),
        Opt::new(
            "collector.gpu.rocm-smi-path",
            Kind::Str,
            "rocm-smi, asked for AMD GPUs (default: found on PATH)",
        ),
        Opt::new(
            "collector.gpu.amd-smi-path",
            Kind::Str,
            "amd-smi, asked for AMD GPUs when there is no rocm-smi (default: found on PATH)",
        ),
        Opt::flag(
            "collector.rdma.stats",
            "Export the RDMA resources of units' processes and ports' traffic with the unit collectors (ceems_rdma_*); turns on per-process queue pair counters of Mellanox links",
        ),
        Opt::new(
            "collector.rdma.cmd",
            Kind::Str,
            "The rdma tool of iproute2 (default: found on PATH)",
        ),
        Opt::flag(
            "collector.perf.hardware-events",
            "Count hardware events per unit with the slurm and libvirt collectors (ceems_perf_cpucycles_total, instructions, branches, cache references and misses)",
        ),
        Opt::new(
            "collector.perf.hardware-profilers",
            Kind::List,
            "Only these hardware events (repeatable): CpuCycles, CpuInstr, BranchInstr, BranchMisses, CacheRef, CacheMisses, RefCpuCycles",
        ),
        Opt::flag(
            "collector.perf.software-events",
            "Count software events per unit (ceems_perf_page_faults_total, context switches, CPU migrations, minor and major faults)",
        ),
        Opt::new(
            "collector.perf.software-profilers",
            Kind::List,
            "Only these software events (repeatable): PageFault, ContextSwitch, CpuMigration, MinorFault, MajorFault",
        ),
        Opt::flag(
            "collector.perf.hardware-cache-events",
            "Count hardware cache events per unit (ceems_perf_cache_*_total: L1 data and instruction, last level, TLB, branch predictor)",
        ),
        Opt::new(
            "collector.perf.cache-profilers",
            Kind::List,
            "Only these cache events (repeatable): L1DataReadHit, L1DataReadMiss, L1DataWriteHit, L1InstrReadMiss, InstrTLBReadHit, InstrTLBReadMiss, LLReadHit, LLReadMiss, LLWriteHit, LLWriteMiss, BPUReadHit, BPUReadMiss",
        ),
        Opt::new(
            "collector.perf.env-var",
            Kind::List,
            "Count a unit's perf events only while one of its processes has this variable in its environment, whatever its value (repeatable; any of them)",
        )
        .key("collector.perf.env-vars"),
        Opt::flag(
            "collector.ebpf.io-metrics",
            "Count file system reads, writes, opens, creates and unlinks per unit with eBPF (ceems_ebpf_*; Linux 5.12 or later with BTF)",
        ),
        Opt::flag(
            "collector.ebpf.network-metrics",
            "Count TCP and UDP traffic and TCP retransmissions per unit with eBPF (ceems_ebpf_ingress_*, egress_*, retrans_*; Linux 6.3 or later)",
        ),
        Opt::new(
            "collector.ebpf.fs-mount-point",
            Kind::List,
            "Export IO only on mount points containing this string (repeatable; default: every mount point). Fewer mount points, fewer series",
        )
        .key("collector.ebpf.fs-mount-points"),
    ];
    for spec in COLLECTORS {
        opts.push(
            Opt::flag(
                &format!("collector.{}", spec.name),
                &format!(
                    "Enable the {} collector (default: {})",
                    spec.name,
                    if spec.default_enabled {
                        "enabled"
                    } else {
                        "disabled"
                    }
                ),
            )
            .key(&format!("collector.{}.enabled", spec.name))
            .default(if spec.default_enabled {
                "true"
            } else {
                "false"
            }),
        );
        opts.extend((spec.options)());
    }
    opts
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("collector {name} could not start")]
    Build {
        name: &'static str,
        source: CollectError,
    },
}

struct Entry {
    name: &'static str,
    collector: Arc<dyn Collector>,
    /// Set while a collect runs, so a hung collector is not started again on top of itself.
    busy: Arc<AtomicBool>,
}

pub struct Registry {
    entries: Vec<Entry>,
    /// `--collector.timeout`: the longest a collector may take in one scrape.
    timeout: Duration,
}

/// The collectors left on by `--collector.*` flags and `--collector.disable-defaults`, each with
/// its own settings table, and the settings they share.
pub struct Selection {
    pub common: CommonSettings,
    pub enabled: Vec<(&'static CollectorSpec, Layered)>,
}

pub fn select(settings: &Layered) -> Result<Selection, crate::config::ConfigError> {
    let mut collectors = settings.clone().take("collector");
    let mut tables = Vec::with_capacity(COLLECTORS.len());
    for spec in COLLECTORS {
        let table = match collectors.remove(spec.name) {
            Some(toml::Value::Table(t)) => t,
            _ => toml::Table::new(),
        };
        tables.push(table);
    }
    // What is left are the shared keys; unknown ones fail here, naming the key.
    let common: CommonSettings = settings.scoped("collector", collectors).get("")?;
    let mut enabled = Vec::new();
    for (spec, table) in COLLECTORS.iter().zip(tables) {
        let path = format!("collector.{}", spec.name);
        let mut layer = settings.scoped(&path, table);
        let on = match layer.table.get("enabled") {
            Some(toml::Value::Boolean(b)) => *b,
            Some(_) => {
                return Err(crate::config::ConfigError::Invalid {
                    origin: layer.origin_of("enabled"),
                    key: format!("{path}.enabled"),
                    message: "expected true or false".to_owned(),
                })
            }
            None => spec.default_enabled,
        };
        // disable-defaults turns off default collectors unless they were named explicitly.
        let on = if common.disable_defaults && spec.default_enabled {
            on && layer.explicit("enabled")
        } else {
            on
        };
        if on {
            // The collector's own settings are the rest of its table.
            layer.table.remove("enabled");
            enabled.push((spec, layer));
        }
    }
    Ok(Selection { common, enabled })
}

/// The sub-collectors that run inside the enabled unit collectors, each with what it needs:
/// RDMA inside slurm (as in CEEMS), perf inside slurm and libvirt.
pub fn sub_collectors(selection: &Selection) -> Vec<(&'static str, &'static [Capability])> {
    let enabled = |name: &str| selection.enabled.iter().any(|(spec, _)| spec.name == name);
    let units = enabled("slurm") || enabled("libvirt");
    let mut parts = Vec::new();
    if selection.common.rdma.stats && enabled("slurm") {
        parts.push((
            "rdma stats (per-process queue pair counters)",
            units::rdma::CAPABILITIES,
        ));
    }
    if selection.common.perf.enabled() && units {
        parts.push((
            "perf counters (units' tasks and cgroups)",
            units::perf::capabilities(),
        ));
    }
    if selection.common.ebpf.enabled() && units {
        parts.push((
            "ebpf programs (load, attach, read maps)",
            units::ebpf::capabilities(),
        ));
    }
    parts
}

/// The union of the capabilities the enabled collectors and their sub-collectors declare.
pub fn needed_capabilities(
    settings: &Layered,
) -> Result<Vec<Capability>, crate::config::ConfigError> {
    let selection = select(settings)?;
    let subs = sub_collectors(&selection);
    Ok(crate::security::sorted(
        selection
            .enabled
            .iter()
            .flat_map(|(spec, _)| spec.capabilities.iter().copied())
            .chain(subs.iter().flat_map(|(_, caps)| caps.iter().copied())),
    ))
}

impl Registry {
    /// Builds the enabled collectors. A collector that cannot start is an error that names it.
    pub fn build(settings: &Layered, hostname: &str) -> Result<Registry, RegistryError> {
        let paths: Paths = settings.get("path")?;
        let Selection { common, enabled } = select(settings)?;
        let mut entries = Vec::new();
        for (spec, layer) in enabled {
            let ctx = Context {
                paths: paths.clone(),
                common: common.clone(),
                hostname: if common.empty_hostname_label {
                    String::new()
                } else {
                    hostname.to_owned()
                },
                settings: layer,
            };
            let collector = (spec.build)(&ctx).map_err(|source| RegistryError::Build {
                name: spec.name,
                source,
            })?;
            tracing::info!(collector = spec.name, "collector enabled");
            entries.push(Entry {
                name: spec.name,
                collector: Arc::from(collector),
                busy: Arc::new(AtomicBool::new(false)),
            });
        }
        Ok(Registry {
            entries,
            timeout: common.timeout,
        })
    }

    /// A registry of ready-made collectors, for tests and benchmarks.
    pub fn from_collectors(collectors: Vec<(&'static str, Box<dyn Collector>)>) -> Registry {
        Registry {
            entries: collectors
                .into_iter()
                .map(|(name, c)| Entry {
                    name,
                    collector: Arc::from(c),
                    busy: Arc::new(AtomicBool::new(false)),
                })
                .collect(),
            timeout: Duration::from_secs(10),
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.entries.iter().map(|e| e.name).collect()
    }

    /// Runs every collector concurrently, each on its own blocking thread, and waits for each
    /// until `timeout`. A late, failed or panicking collector reports success 0 and the rest of
    /// the scrape is served.
    pub async fn scrape(&self, timeout: Duration) -> MetricSet {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut running = Vec::with_capacity(self.entries.len());
        for e in &self.entries {
            if e.busy.swap(true, Ordering::AcqRel) {
                tracing::warn!(
                    collector = e.name,
                    "previous collect has not finished; skipping this one"
                );
                running.push((e.name, Instant::now(), None));
                continue;
            }
            let collector = Arc::clone(&e.collector);
            let guard = BusyGuard(Arc::clone(&e.busy));
            let handle = tokio::task::spawn_blocking(move || {
                let _guard = guard;
                let mut out = MetricSet::new();
                let result = collector.collect(&mut out);
                (result, out)
            });
            running.push((e.name, Instant::now(), Some(handle)));
        }

        let mut all = MetricSet::new();
        let mut status = MetricSet::new();
        for (name, started, handle) in running {
            let ok = match handle {
                None => false,
                Some(h) => match tokio::time::timeout_at(deadline, h).await {
                    Ok(Ok((Ok(()), out))) => {
                        all.merge(out);
                        true
                    }
                    Ok(Ok((Err(err @ CollectError::Stale(_)), out))) => {
                        tracing::warn!(collector = name, error = %err, "collector failed");
                        all.merge(out);
                        false
                    }
                    Ok(Ok((Err(err), out))) => {
                        // Partial output of a failed collector is dropped, as in CEEMS.
                        drop(out);
                        if err.is_absence() {
                            tracing::debug!(collector = name, error = %err, "collector failed");
                        } else {
                            tracing::warn!(collector = name, error = %err, "collector failed");
                        }
                        false
                    }
                    Ok(Err(join)) => {
                        tracing::error!(collector = name, error = %join, "collector panicked");
                        false
                    }
                    Err(_) => {
                        tracing::warn!(
                            collector = name,
                            timeout_seconds = timeout.as_secs_f64(),
                            "collector timed out"
                        );
                        false
                    }
                },
            };
            let labels = Labels::new(&[("collector", name)]);
            status.gauge(
                "ceems_scrape_collector_duration_seconds",
                "ceems_exporter: Duration of a collector scrape.",
                labels.clone(),
                started.elapsed().as_secs_f64(),
            );
            status.gauge(
                "ceems_scrape_collector_success",
                "ceems_exporter: Whether a collector succeeded.",
                labels,
                if ok { 1.0 } else { 0.0 },
            );
        }
        all.merge(status);
        all
    }
}

struct BusyGuard(Arc<AtomicBool>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(&'static str, Result<f64, ()>);
    impl Collector for Fixed {
        fn collect(&self, out: &mut MetricSet) -> Result<(), CollectError> {
            match self.1 {
                Ok(v) => {
                    out.gauge("test_value", "Test.", Labels::new(&[("c", self.0)]), v);
                    Ok(())
                }
                Err(()) => Err(CollectError::Other("broken".into())),
            }
        }
    }

    struct StaleValues;
    impl Collector for StaleValues {
        fn collect(&self, out: &mut MetricSet) -> Result<(), CollectError> {
            out.gauge("last_good", "Test.", Labels::empty(), 3.0);
            Err(CollectError::Stale("source down".into()))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stale_values_are_served_with_success_zero() {
        let reg = Registry::from_collectors(vec![("stale", Box::new(StaleValues))]);
        let out = text(reg.scrape(Duration::from_secs(1)).await);
        assert!(out.contains("last_good 3\n"), "{out}");
        assert!(out.contains("ceems_scrape_collector_success{collector=\"stale\"} 0\n"));
    }

    struct Hang;
    impl Collector for Hang {
        fn collect(&self, _: &mut MetricSet) -> Result<(), CollectError> {
            std::thread::sleep(Duration::from_secs(3));
            Ok(())
        }
    }

    struct Panics;
    impl Collector for Panics {
        fn collect(&self, _: &mut MetricSet) -> Result<(), CollectError> {
            panic!("collector bug")
        }
    }

    fn text(set: MetricSet) -> String {
        let mut s = String::new();
        set.encode_text(&mut s);
        s
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failing_hanging_and_panicking_collectors_do_not_stall_the_scrape() {
        let reg = Registry::from_collectors(vec![
            ("good", Box::new(Fixed("good", Ok(7.0)))),
            ("bad", Box::new(Fixed("bad", Err(())))),
            ("hang", Box::new(Hang)),
            ("panics", Box::new(Panics)),
        ]);
        let start = Instant::now();
        let out = text(reg.scrape(Duration::from_millis(300)).await);
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "scrape waited for the hung collector"
        );
        assert!(out.contains("test_value{c=\"good\"} 7\n"), "{out}");
        assert!(out.contains("ceems_scrape_collector_success{collector=\"good\"} 1\n"));
        assert!(out.contains("ceems_scrape_collector_success{collector=\"bad\"} 0\n"));
        assert!(out.contains("ceems_scrape_collector_success{collector=\"hang\"} 0\n"));
        assert!(out.contains("ceems_scrape_collector_success{collector=\"panics\"} 0\n"));

        // The hung collector is still running: the next scrape does not pile another on top.
        let out = text(reg.scrape(Duration::from_millis(100)).await);
        assert!(out.contains("ceems_scrape_collector_success{collector=\"hang\"} 0\n"));
        assert!(out.contains("ceems_scrape_collector_success{collector=\"panics\"} 0\n"));
        assert!(out.contains("ceems_scrape_collector_success{collector=\"good\"} 1\n"));
    }
}
