//! Collectors: the contract every collector meets ([`Collector`], described by a
//! [`CollectorSpec`]), the settings and roots they are built from, and one module per
//! collector. The list of them all and the scrape that runs them are in `src/registry.rs`,
//! above this layer and `src/manager/`.

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
use std::time::Duration;

use serde::Deserialize;

use crate::config::{Kind, Layered, Opt};
use crate::metrics::Labels;
use crate::metrics::MetricSet;

pub use caps::Capability;
pub use units::SubCollector;

/// One collector: how it reads its metrics. Its name, flags and capabilities are in its
/// [`CollectorSpec`].
pub trait Collector: Send + Sync + 'static {
    /// Reads the metrics. Runs on a dedicated blocking thread, so it may block on I/O.
    fn collect(&self, out: &mut MetricSet) -> Result<(), CollectError>;
}

/// What a collector failed at. The registry logs a failure at warning level when it starts or
/// changes, and when it ends.
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
    /// Part of the source failed; what was read is served while the collector reports
    /// success 0.
    #[error("{0} (serving what was read)")]
    Partial(String),
}

impl CollectError {
    /// Whether the collector's output is served despite the failure.
    pub fn keeps_output(&self) -> bool {
        matches!(self, CollectError::Stale(_) | CollectError::Partial(_))
    }

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
    /// `--collector.force-hostname`: the `hostname` label instead of this node's name.
    #[serde(default)]
    pub force_hostname: Option<String>,
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

/// Which CEEMS generation's metric names to export (`--compat.metric-names`): the families
/// CEEMS v0.11 renamed, and the labels it added, differ between the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum MetricNames {
    /// CEEMS v0.11 and later: `ceems_ipmi_dcmi_power_*`, `ceems_redfish_power_*`, hwmon's
    /// `index`, the `ipmi` collector.
    #[default]
    #[serde(rename = "v0.11")]
    Current,
    /// CEEMS v0.10, for sites whose dashboards and rules still ask for its names.
    #[serde(rename = "v0.10")]
    V010,
}

impl MetricNames {
    /// The flag's values, newest first.
    pub const VALUES: &'static [&'static str] = &["v0.11", "v0.10"];

    /// `current` in today's CEEMS, `v010` in v0.10.
    pub fn pick<T>(self, current: T, v010: T) -> T {
        match self {
            MetricNames::Current => current,
            MetricNames::V010 => v010,
        }
    }
}

/// What a collector is built from.
pub struct Context {
    pub paths: Paths,
    pub common: CommonSettings,
    /// The generation of metric names to export.
    pub names: MetricNames,
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
    /// The sub-collectors that run inside this one's units (perf, eBPF, RDMA), if any.
    pub sub_collectors: &'static [SubCollector],
}

/// The options every collector shares, `[exporter.collector]` and its common tables.
pub fn common_options() -> Vec<Opt> {
    vec![
        Opt::new(
            "compat.metric-names",
            Kind::Str,
            "Metric names of this CEEMS generation: v0.11 (v0.11 and later: ceems_ipmi_dcmi_power_*, ceems_redfish_power_*, hwmon's index label, the ipmi collector) or v0.10 (for v0.10 dashboards and rules: the old names, collector=\"ipmi_dcmi\", rapl on by default)",
        )
        .possible(MetricNames::VALUES)
        .default(MetricNames::VALUES[0]),
        Opt::new(
            "collector.force-hostname",
            Kind::Str,
            "Value of every hostname label instead of this node's name",
        ),
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
    ]
}
