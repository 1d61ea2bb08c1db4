//! The collector registry, above `collect` and `manager`: [`COLLECTORS`] lists every
//! collector's spec, and the registry turns them into flags, builds the enabled ones, and runs
//! a scrape in which each collector gets its own thread and deadline.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::collect::alloy_targets::{AlloySettings, AlloyTargets};
use crate::collect::units::{cgroup_version_of, ResourceManager, SubCollector};
use crate::collect::{
    self, cpu, cray_pm_counters, emissions, gpu, hwmon, infiniband, ipmi, meminfo, netdev, rapl,
    redfish, slurm_cluster, units, Capability, CollectError, Collector, CollectorSpec,
    CommonSettings, Context, MetricNames, Paths,
};
use crate::config::{Layered, Opt};
use crate::manager;
use crate::metrics::{Labels, MetricSet};

/// Every collector this binary has.
pub static COLLECTORS: &[CollectorSpec] = &[
    cpu::SPEC,
    meminfo::SPEC,
    netdev::SPEC,
    infiniband::SPEC,
    crate::manager::slurm::SPEC,
    crate::manager::libvirt::SPEC,
    crate::manager::lsf::SPEC,
    crate::manager::k8s::SPEC,
    crate::manager::openpbs::SPEC,
    rapl::SPEC,
    hwmon::SPEC,
    cray_pm_counters::SPEC,
    ipmi::SPEC,
    redfish::SPEC,
    emissions::SPEC,
    slurm_cluster::SPEC,
    gpu::nvidia::SPEC,
];

/// The flags of every collector: the shared ones, then `--collector.<name>` and each one's own
/// options.
pub fn options() -> Vec<Opt> {
    let mut opts = collect::common_options();
    // The collectors CEEMS renamed keep their old flags.
    let renamed = |opt: Opt, name: &str| match v010_name(name) {
        Some(old) if old != name => opt.renamed_from(&format!("collector.{old}")),
        _ => opt,
    };
    for spec in COLLECTORS {
        let default = match (spec.default_enabled, V010_DEFAULTS.contains(&spec.name)) {
            (true, _) => "enabled",
            (false, false) => "disabled",
            (false, true) => "disabled; enabled with --compat.metric-names=v0.10",
        };
        // No default value: whether it is on by default depends on --compat.metric-names.
        let mut enable = Opt::flag(
            &format!("collector.{}", spec.name),
            &format!("Enable the {} collector (default: {default})", spec.name),
        )
        .key(&format!("collector.{}.enabled", spec.name));
        enable.default = None;
        opts.push(renamed(enable, spec.name));
        opts.extend((spec.options)());
    }
    opts
}

/// Collectors today's CEEMS leaves off that v0.10 turned on by default.
const V010_DEFAULTS: &[&str] = &["rapl"];

/// Collectors that had another name in CEEMS v0.10, with that name.
const V010_NAMES: &[(&str, &str)] = &[("ipmi", "ipmi_dcmi")];

/// A collector's name in CEEMS v0.10.
fn v010_name(name: &str) -> Option<&'static str> {
    V010_NAMES
        .iter()
        .find(|(now, _)| *now == name)
        .map(|(_, old)| *old)
}

/// The name a collector reports itself by (`ceems_scrape_collector_success{collector=…}`).
pub fn collector_label(spec: &CollectorSpec, names: MetricNames) -> &'static str {
    match names {
        MetricNames::Current => spec.name,
        MetricNames::V010 => v010_name(spec.name).unwrap_or(spec.name),
    }
}

/// Whether a collector runs unless a flag says otherwise.
fn default_on(spec: &CollectorSpec, names: MetricNames) -> bool {
    spec.default_enabled || (names == MetricNames::V010 && V010_DEFAULTS.contains(&spec.name))
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
    /// The collect running now, if any. A scrape that comes while it runs waits for its
    /// outcome instead of starting another (a hung collector would pile up threads) or going
    /// without (the two Prometheus servers of an HA pair, scraping within the same second,
    /// would see the collector's series vanish from one of them).
    running: RunningSlot,
    /// What the collector last failed with, so that an operator reads a failure once when it
    /// starts or changes, and once when it ends, not at every scrape.
    last_failure: Mutex<Option<String>>,
}

impl Entry {
    /// Logs a failure at warning level when it is new or differs from the last one.
    fn failed(&self, error: &str) {
        let mut last = self.last_failure.lock().unwrap_or_else(|p| p.into_inner());
        if last.as_deref() == Some(error) {
            tracing::debug!(collector = self.name, error, "collector still failing");
            return;
        }
        tracing::warn!(collector = self.name, error, "collector failed");
        *last = Some(error.to_owned());
    }

    /// Logs the end of a failure.
    fn succeeded(&self) {
        let mut last = self.last_failure.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(error) = last.take() {
            tracing::info!(collector = self.name, previous_error = %error, "collector recovered");
        }
    }
}

/// What a collect produced, for the scrapes that waited on it.
#[derive(Clone)]
enum Outcome {
    Served(Arc<MetricSet>),
    Stale(Arc<MetricSet>),
    Failed,
}

type OutcomeReceiver = tokio::sync::watch::Receiver<Option<Outcome>>;
type RunningSlot = Arc<Mutex<Option<OutcomeReceiver>>>;

/// A scrape's part in one collector's collect.
enum Part {
    /// It started the collect.
    Started(tokio::task::JoinHandle<(Result<(), CollectError>, MetricSet)>),
    /// It waits for the one an earlier scrape started.
    Joined(OutcomeReceiver),
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
    pub names: MetricNames,
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
    let names: MetricNames = settings.get("compat.metric-names")?;
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
            None => default_on(spec, names),
        };
        // disable-defaults turns off default collectors unless they were named explicitly.
        let on = if common.disable_defaults && default_on(spec, names) {
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
    Ok(Selection {
        common,
        names,
        enabled,
    })
}

/// The sub-collectors that run inside the enabled unit collectors, each with what it needs:
/// those that some enabled collector's spec names and whose settings turn them on.
pub fn sub_collectors(selection: &Selection) -> Vec<(&'static str, &'static [Capability])> {
    let named = |part: SubCollector| {
        selection
            .enabled
            .iter()
            .any(|(spec, _)| spec.sub_collectors.contains(&part))
    };
    let common = &selection.common;
    let mut parts = Vec::new();
    if common.rdma.stats && named(SubCollector::Rdma) {
        parts.push((
            "rdma stats (per-process queue pair counters)",
            units::rdma::CAPABILITIES,
        ));
    }
    if common.perf.enabled() && named(SubCollector::Perf) {
        parts.push((
            "perf counters (units' tasks and cgroups)",
            units::perf::capabilities(),
        ));
    }
    if common.ebpf.enabled() && named(SubCollector::Ebpf) {
        parts.push((
            "ebpf programs (load, attach, read maps)",
            units::ebpf::capabilities(),
        ));
    }
    parts
}

/// The union of the capabilities the enabled collectors, their sub-collectors and the Alloy
/// discoverer declare.
pub fn needed_capabilities(
    settings: &Layered,
) -> Result<Vec<Capability>, crate::config::ConfigError> {
    let selection = select(settings)?;
    let subs = sub_collectors(&selection);
    let alloy = AlloySettings::read(settings)?;
    let discoverer: &[Capability] = if alloy.enabled() {
        alloy_manager_capabilities(alloy_manager(&alloy, &selection))
    } else {
        &[]
    };
    Ok(crate::security::sorted(
        selection
            .enabled
            .iter()
            .flat_map(|(spec, _)| spec.capabilities.iter().copied())
            .chain(subs.iter().flat_map(|(_, caps)| caps.iter().copied()))
            .chain(discoverer.iter().copied()),
    ))
}

/// What the Alloy discoverer needs to read the environments of `manager`'s units' processes:
/// that manager's collector's capabilities.
fn alloy_manager_capabilities(manager: &str) -> &'static [Capability] {
    match manager {
        manager::slurm::MANAGER => manager::slurm::SPEC.capabilities,
        manager::lsf::MANAGER => manager::lsf::SPEC.capabilities,
        // Pods' processes run as any user: their environments (--discoverer.alloy-targets.env-var).
        manager::k8s::MANAGER => &[Capability::CAP_SYS_PTRACE, Capability::CAP_DAC_READ_SEARCH],
        manager::openpbs::MANAGER => manager::openpbs::SPEC.capabilities,
        _ => &[],
    }
}

/// The manager whose units the Alloy discoverer lists: the one named, else the one whose
/// collector is on when Slurm's is not (as CEEMS picks the enabled one), else Slurm.
fn alloy_manager(alloy: &AlloySettings, selection: &Selection) -> &'static str {
    let on = |name: &str| selection.enabled.iter().any(|(spec, _)| spec.name == name);
    let others = [
        manager::lsf::MANAGER,
        manager::k8s::MANAGER,
        manager::openpbs::MANAGER,
    ];
    match alloy.resource_manager.as_str() {
        "" if !on(manager::slurm::MANAGER) => others
            .into_iter()
            .find(|m| on(m))
            .unwrap_or(manager::slurm::MANAGER),
        named => others
            .into_iter()
            .find(|m| *m == named)
            .unwrap_or(manager::slurm::MANAGER),
    }
}

/// The `hostname` label: `--collector.force-hostname`, else empty with
/// `--collector.empty-hostname-label`, else the node's name.
pub fn hostname_label(common: &CommonSettings, node: &str) -> String {
    match (&common.force_hostname, common.empty_hostname_label) {
        (Some(forced), _) => forced.clone(),
        (None, true) => String::new(),
        (None, false) => node.to_owned(),
    }
}

/// The Alloy targets discoverer the settings ask for, built on the named manager's discovery.
pub fn alloy_targets(settings: &Layered) -> Result<Option<AlloyTargets>, CollectError> {
    let err = |e: crate::config::ConfigError| CollectError::Other(e.to_string());
    let s = AlloySettings::read(settings).map_err(err)?;
    if !s.enabled() {
        return Ok(None);
    }
    let paths: Paths = settings.get("path").map_err(err)?;
    let selection = select(settings).map_err(err)?;
    let manager = alloy_manager(&s, &selection);
    let common = selection.common;
    let version = cgroup_version_of(common.cgroups.force_version.as_deref(), &paths.cgroupfs)?;
    let units: Box<dyn ResourceManager> = match manager {
        manager::lsf::MANAGER => Box::new(manager::lsf::LsfManager::new(
            &paths.cgroupfs,
            &paths.procfs,
            version,
            &common.cgroups.active_subsystem,
            // Discovery needs only the cgroups: bjobs is not asked.
            std::path::Path::new(""),
            "",
        )),
        manager::openpbs::MANAGER => Box::new(manager::openpbs::OpenPbsManager::new(
            &paths.cgroupfs,
            &paths.procfs,
            version,
            &common.cgroups.active_subsystem,
        )),
        manager::k8s::MANAGER => Box::new(manager::k8s::K8sManager::new(
            &paths.cgroupfs,
            version,
            &common.cgroups.active_subsystem,
        )),
        _ => Box::new(manager::slurm::SlurmManager::new(
            &paths.cgroupfs,
            &paths.procfs,
            version,
            &common.cgroups.active_subsystem,
        )),
    };
    let capabilities = alloy_manager_capabilities(manager);
    Ok(Some(AlloyTargets::new(
        units,
        capabilities,
        paths.procfs,
        s.env_var,
    )))
}

impl Registry {
    /// Builds the enabled collectors. A collector that cannot start is an error that names it.
    pub fn build(settings: &Layered, hostname: &str) -> Result<Registry, RegistryError> {
        let paths: Paths = settings.get("path")?;
        let Selection {
            common,
            names,
            enabled,
        } = select(settings)?;
        let mut entries = Vec::new();
        for (spec, layer) in enabled {
            let ctx = Context {
                paths: paths.clone(),
                common: common.clone(),
                names,
                hostname: hostname_label(&common, hostname),
                settings: layer,
            };
            let name = collector_label(spec, names);
            let collector = (spec.build)(&ctx).map_err(|source| RegistryError::Build {
                name: spec.name,
                source,
            })?;
            tracing::info!(collector = name, "collector enabled");
            entries.push(Entry {
                name,
                collector: Arc::from(collector),
                running: RunningSlot::default(),
                last_failure: Mutex::new(None),
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
                    running: RunningSlot::default(),
                    last_failure: Mutex::new(None),
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
    /// the scrape is served. A collector still running for another scrape is not started
    /// again: this scrape shares its outcome.
    pub async fn scrape(&self, timeout: Duration) -> MetricSet {
        let deadline = tokio::time::Instant::now() + timeout;
        let running: Vec<_> = self
            .entries
            .iter()
            .map(|e| (e.name, Instant::now(), start_or_join(e)))
            .collect();

        let mut all = MetricSet::new();
        let mut status = MetricSet::new();
        for ((name, started, part), entry) in running.into_iter().zip(&self.entries) {
            let ok = match part {
                Part::Started(h) => match tokio::time::timeout_at(deadline, h).await {
                    Ok(Ok((Ok(()), out))) => {
                        entry.succeeded();
                        all.merge(out);
                        true
                    }
                    Ok(Ok((Err(err), out))) => {
                        entry.failed(&err.to_string());
                        // Partial output of a failed collector is dropped, as in CEEMS,
                        // unless the collector says it is served (stale or partial).
                        if err.keeps_output() {
                            all.merge(out);
                        }
                        false
                    }
                    Ok(Err(join)) => {
                        tracing::error!(collector = name, error = %join, "collector panicked");
                        false
                    }
                    Err(_) => {
                        entry.failed(&format!(
                            "timed out after {}s (--collector.timeout)",
                            timeout.as_secs_f64()
                        ));
                        false
                    }
                },
                Part::Joined(mut rx) => {
                    let waited = tokio::time::timeout_at(deadline, rx.wait_for(Option::is_some));
                    match waited.await {
                        // The collect that started it logged why it failed or panicked.
                        Ok(Ok(outcome)) => match outcome.clone() {
                            Some(Outcome::Served(set)) => {
                                all.merge(MetricSet::clone(&set));
                                true
                            }
                            Some(Outcome::Stale(set)) => {
                                all.merge(MetricSet::clone(&set));
                                false
                            }
                            Some(Outcome::Failed) | None => false,
                        },
                        Ok(Err(_closed)) => false,
                        Err(_) => {
                            tracing::warn!(
                                collector = name,
                                timeout_seconds = timeout.as_secs_f64(),
                                "collector still busy with an earlier scrape; timed out waiting \
                                 for it"
                            );
                            false
                        }
                    }
                }
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

/// Starts `entry`'s collect on a blocking thread, or joins the one already running.
fn start_or_join(entry: &Entry) -> Part {
    let mut slot = entry.running.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(rx) = &*slot {
        return Part::Joined(rx.clone());
    }
    let (tx, rx) = tokio::sync::watch::channel(None);
    *slot = Some(rx);
    drop(slot);
    let collector = Arc::clone(&entry.collector);
    let mut running = RunningGuard(Some(Arc::clone(&entry.running)));
    Part::Started(tokio::task::spawn_blocking(move || {
        let mut out = MetricSet::new();
        let result = collector.collect(&mut out);
        running.finish();
        // The slot's receiver is gone: those left are scrapes waiting. Copied only for them.
        if tx.receiver_count() > 0 {
            let shared = match &result {
                Ok(()) => Outcome::Served(Arc::new(out.clone())),
                Err(e) if e.keeps_output() => Outcome::Stale(Arc::new(out.clone())),
                Err(_) => Outcome::Failed,
            };
            let _ = tx.send(Some(shared));
        }
        (result, out)
    }))
}

/// Empties a collector's running slot when its collect ends, panics included (the waiting
/// scrapes then see the channel closed).
struct RunningGuard(Option<RunningSlot>);

impl RunningGuard {
    /// Empties the slot, after which no scrape can join.
    fn finish(&mut self) {
        if let Some(slot) = self.0.take() {
            slot.lock().unwrap_or_else(|p| p.into_inner()).take();
        }
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.finish();
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

    fn exporter_settings(args: &[&str]) -> Layered {
        let argv = std::iter::once("exporter").chain(args.iter().copied());
        let matches = crate::cmd::exporter::command()
            .try_get_matches_from(argv)
            .unwrap();
        crate::config::load("exporter", &crate::cmd::exporter::opts(), &matches).unwrap()
    }

    /// The first word of each sub-collector the settings turn on.
    fn parts(args: &[&str]) -> Vec<&'static str> {
        sub_collectors(&select(&exporter_settings(args)).unwrap())
            .into_iter()
            .map(|(what, _)| what.split(' ').next().unwrap())
            .collect()
    }

    #[test]
    fn sub_collectors_run_only_inside_the_collectors_whose_spec_names_them() {
        let on = ["--collector.rdma.stats", "--collector.perf.software-events"];
        assert!(parts(&on).is_empty(), "no unit collector is enabled");
        let libvirt = [&on[..], &["--collector.libvirt"]].concat();
        assert_eq!(parts(&libvirt), ["perf"], "libvirt hosts perf, not RDMA");
        let slurm = [&on[..], &["--collector.slurm"]].concat();
        assert_eq!(parts(&slurm), ["rdma", "perf"]);
        assert!(parts(&["--collector.slurm"]).is_empty(), "none turned on");
    }

    #[test]
    fn the_alloy_discoverer_needs_what_its_manager_needs() {
        let plain = needed_capabilities(&exporter_settings(&[])).unwrap();
        assert!(!plain.contains(&Capability::CAP_SYS_PTRACE), "{plain:?}");
        for args in [
            &["--discoverer.alloy-targets"][..],
            &["--discoverer.alloy-targets.resource-manager=slurm"][..],
            &["--discoverer.alloy-targets", "--collector.lsf"][..],
            &["--discoverer.alloy-targets.resource-manager=lsf"][..],
            &["--discoverer.alloy-targets", "--collector.k8s"][..],
            &["--discoverer.alloy-targets.resource-manager=openpbs"][..],
        ] {
            let needed = needed_capabilities(&exporter_settings(args)).unwrap();
            for cap in manager::slurm::SPEC.capabilities {
                assert!(needed.contains(cap), "{args:?}: {needed:?}");
            }
        }
    }

    /// Fails with the errors a test sets, or succeeds when none is set.
    struct Scripted(Arc<Mutex<Option<String>>>);
    impl Collector for Scripted {
        fn collect(&self, out: &mut MetricSet) -> Result<(), CollectError> {
            match self.0.lock().unwrap().clone() {
                Some(e) if e.starts_with("no ") => Err(CollectError::Absent(e)),
                Some(e) => Err(CollectError::Other(e)),
                None => {
                    out.gauge("fine", "Test.", Labels::empty(), 1.0);
                    Ok(())
                }
            }
        }
    }

    /// What a log writer was given.
    #[derive(Clone, Default)]
    struct Logged(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Logged {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_failure_is_logged_when_it_starts_changes_and_ends() {
        let logged = Logged::default();
        let writer = logged.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let error = Arc::new(Mutex::new(None));
        let reg = Registry::from_collectors(vec![("rapl", Box::new(Scripted(Arc::clone(&error))))]);
        let scrape = || reg.scrape(Duration::from_secs(5));
        // An absence (no powercap on this host) is said too: the operator turned it on.
        *error.lock().unwrap() = Some("no powercap tree at /sys/class/powercap".into());
        for _ in 0..3 {
            scrape().await;
        }
        *error.lock().unwrap() = Some("cannot read energy_uj: permission denied".into());
        scrape().await;
        scrape().await;
        *error.lock().unwrap() = None;
        scrape().await;
        scrape().await;
        let text = String::from_utf8(logged.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[0].contains("WARN") && lines[0].contains("no powercap tree"),
            "{text}"
        );
        assert!(
            lines[1].contains("WARN") && lines[1].contains("permission denied"),
            "{text}"
        );
        assert!(
            lines[2].contains("INFO") && lines[2].contains("collector recovered"),
            "{text}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stale_values_are_served_with_success_zero() {
        let reg = Registry::from_collectors(vec![("stale", Box::new(StaleValues))]);
        let out = text(reg.scrape(Duration::from_secs(1)).await);
        assert!(out.contains("last_good 3\n"), "{out}");
        assert!(out.contains("ceems_scrape_collector_success{collector=\"stale\"} 0\n"));
    }

    static HANG_CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    struct Hang;
    impl Collector for Hang {
        fn collect(&self, _: &mut MetricSet) -> Result<(), CollectError> {
            HANG_CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
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
        assert_eq!(
            HANG_CALLS.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "a second hung collect was started on top of the first"
        );
    }

    /// Sleeps, counts its calls, then gives its value or panics.
    struct Slow {
        calls: Arc<std::sync::atomic::AtomicUsize>,
        panics: bool,
    }
    impl Collector for Slow {
        fn collect(&self, out: &mut MetricSet) -> Result<(), CollectError> {
            let n = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            std::thread::sleep(Duration::from_millis(300));
            assert!(!self.panics, "collector bug");
            out.counter("slow_calls_total", "Test.", Labels::empty(), n as f64);
            Ok(())
        }
    }

    /// A registry of one [`Slow`], and its count of calls.
    fn slow(panics: bool) -> (Registry, Arc<std::sync::atomic::AtomicUsize>) {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let slow = Slow {
            calls: Arc::clone(&calls),
            panics,
        };
        (
            Registry::from_collectors(vec![("slow", Box::new(slow))]),
            calls,
        )
    }

    /// The texts of two scrapes started together.
    async fn two_at_once(reg: &Registry) -> [String; 2] {
        let (a, b) = tokio::join!(
            reg.scrape(Duration::from_secs(5)),
            reg.scrape(Duration::from_secs(5))
        );
        [text(a), text(b)]
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn scrapes_that_overlap_share_one_collect_and_both_get_its_series() {
        let (reg, slow) = slow(false);
        for out in two_at_once(&reg).await {
            assert!(out.contains("slow_calls_total 1\n"), "{out}");
            assert!(
                out.contains("ceems_scrape_collector_success{collector=\"slow\"} 1\n"),
                "{out}"
            );
        }
        assert_eq!(slow.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Once it has ended, the next scrape collects afresh.
        let out = text(reg.scrape(Duration::from_secs(5)).await);
        assert!(out.contains("slow_calls_total 2\n"), "{out}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_collect_that_panics_fails_every_scrape_waiting_on_it_and_not_the_next() {
        let (reg, slow) = slow(true);
        for out in two_at_once(&reg).await {
            assert!(
                out.contains("ceems_scrape_collector_success{collector=\"slow\"} 0\n"),
                "{out}"
            );
        }
        assert_eq!(slow.load(std::sync::atomic::Ordering::SeqCst), 1);
        let _ = reg.scrape(Duration::from_secs(5)).await;
        assert_eq!(
            slow.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "the panic emptied the slot"
        );
    }
}
