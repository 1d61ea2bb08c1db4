//! The perf sub-collector (`--collector.perf.*`): hardware, software and hardware-cache
//! counters per unit, inside the unit collectors as in CEEMS.
//!
//! A unit whose cgroup the kernel's perf_event controller sees (cgroups v2, or a v1 `perf_event`
//! hierarchy holding it) is counted on its cgroup: one counter per event and per CPU the unit
//! may run on. Otherwise each process of the unit is counted with inheritance: its threads at
//! first sight, and every task they create afterwards through the same counters, so a process
//! forked after its parent was counted is not counted twice. Counts of processes that ended
//! are kept until the unit ends, so the `_total` series never go back.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Deserialize;

use crate::collect::Capability;
use crate::host::cgroup::CgroupVersion;
use crate::host::perf::{self, EventGroup, PerfEvent, Target, TargetCounters, EVENTS};
use crate::host::procfs;
use crate::metrics::{Labels, MetricSet};

/// `[exporter.collector.perf]`: CEEMS's `--collector.perf.*` flags.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PerfSettings {
    #[serde(default)]
    pub hardware_events: bool,
    #[serde(default)]
    pub hardware_profilers: Vec<String>,
    #[serde(default)]
    pub software_events: bool,
    #[serde(default)]
    pub software_profilers: Vec<String>,
    #[serde(default)]
    pub hardware_cache_events: bool,
    #[serde(default)]
    pub cache_profilers: Vec<String>,
    #[serde(default)]
    pub env_vars: Vec<String>,
}

impl PerfSettings {
    pub fn enabled(&self) -> bool {
        self.hardware_events || self.software_events || self.hardware_cache_events
    }

    /// The events the flags turn on: every event of an enabled group, or only the named
    /// profilers of it. An unknown profiler name is an error that lists the known ones.
    pub fn events(&self) -> Result<Vec<&'static PerfEvent>, String> {
        let mut events = Vec::new();
        for (group, on, names, flag) in [
            (
                EventGroup::Hardware,
                self.hardware_events,
                &self.hardware_profilers,
                "hardware-profilers",
            ),
            (
                EventGroup::Software,
                self.software_events,
                &self.software_profilers,
                "software-profilers",
            ),
            (
                EventGroup::Cache,
                self.hardware_cache_events,
                &self.cache_profilers,
                "cache-profilers",
            ),
        ] {
            let in_group = || EVENTS.iter().filter(move |e| e.group == group);
            for name in names {
                if !in_group().any(|e| e.profiler == name) {
                    let known: Vec<&str> = in_group().map(|e| e.profiler).collect();
                    return Err(format!(
                        "--collector.perf.{flag}: unknown profiler `{name}` (known: {})",
                        known.join(", ")
                    ));
                }
            }
            if on {
                events.extend(
                    in_group()
                        .filter(|e| names.is_empty() || names.iter().any(|n| n == e.profiler)),
                );
            }
        }
        Ok(events)
    }
}

/// Opening counters on other users' tasks, and reading their environment (a 0400 file of
/// theirs) for `--collector.perf.env-var`; `CAP_SYS_ADMIN` stands for `CAP_PERFMON` on kernels
/// before 5.8.
pub fn capabilities() -> &'static [Capability] {
    const WITH_PERFMON: &[Capability] = &[
        Capability::CAP_DAC_READ_SEARCH,
        Capability::CAP_PERFMON,
        Capability::CAP_SYS_PTRACE,
    ];
    const WITHOUT: &[Capability] = &[
        Capability::CAP_DAC_READ_SEARCH,
        Capability::CAP_SYS_ADMIN,
        Capability::CAP_SYS_PTRACE,
    ];
    if kernel_knows(Capability::CAP_PERFMON) {
        WITH_PERFMON
    } else {
        WITHOUT
    }
}

/// Whether the running kernel has `cap` (`/proc/sys/kernel/cap_last_cap`).
pub fn kernel_knows(cap: Capability) -> bool {
    caps::runtime::procfs_all_supported(None)
        .map(|all| all.contains(&cap))
        .unwrap_or(true)
}

/// A unit as the perf sub-collector needs it.
pub struct PerfUnit<'a> {
    pub uuid: &'a str,
    /// The unit's directory in the hierarchy discovery walks.
    pub dir: &'a Path,
    /// Relative to each v1 controller's root.
    pub rel: &'a Path,
    pub pids: &'a [u32],
}

/// A process counted through its own counters; its descendants created afterwards count there.
struct Root {
    /// Clock ticks after boot when its counters opened.
    opened_at: u64,
    counters: Vec<TargetCounters>,
}

/// What is counted of one unit.
#[derive(Default)]
struct UnitCounters {
    /// Counts of counters already closed, per event.
    closed: Vec<u64>,
    /// Cgroup mode: per event and CPU; opened once.
    cgroup: Option<Vec<TargetCounters>>,
    /// Task mode: the processes counted through their own counters.
    roots: HashMap<u32, Root>,
    /// Processes counted through a root's inherited counters: pid → root pid.
    covered: HashMap<u32, u32>,
    /// The totals last exported, which the next never go below.
    last: Vec<u64>,
}

impl UnitCounters {
    fn new(events: usize) -> UnitCounters {
        UnitCounters {
            closed: vec![0; events],
            last: vec![0; events],
            ..UnitCounters::default()
        }
    }

    fn close(&mut self, counters: Vec<TargetCounters>) {
        for mut c in counters {
            c.add_to(&mut self.closed);
        }
    }

    fn close_all(&mut self) {
        if let Some(c) = self.cgroup.take() {
            self.close(c);
        }
        let roots: Vec<Root> = self.roots.drain().map(|(_, r)| r).collect();
        for r in roots {
            self.close(r.counters);
        }
        self.covered.clear();
    }

    fn fds(&self) -> usize {
        let all = self.cgroup.iter().flatten();
        all.chain(self.roots.values().flat_map(|r| &r.counters))
            .map(TargetCounters::descriptors)
            .sum()
    }
}

/// What one privileged call opens.
enum OpenRequest {
    Cgroup {
        uuid: String,
        dir: PathBuf,
        cpus: Vec<usize>,
    },
    Process {
        uuid: String,
        pid: u32,
    },
}

struct Opened {
    uuid: String,
    /// Some((pid, opened_at)) for a process.
    process: Option<(u32, u64)>,
    counters: Vec<TargetCounters>,
    errors: Vec<(usize, io::Error)>,
}

#[derive(Default)]
struct State {
    units: HashMap<String, UnitCounters>,
    /// Events the CPU or kernel does not have: said once, then left out.
    unsupported: HashSet<usize>,
    /// Other failures already said, by kind, so a node that refuses says it once.
    said: HashSet<String>,
    /// `--collector.perf.env-var`: pid → whether its environment sets one, while it lives.
    environ: HashMap<u32, bool>,
}

/// The perf sub-collector of one unit collector.
pub struct PerfStats {
    events: Vec<&'static PerfEvent>,
    /// `ceems_perf_<metric>_total` of each event, made once rather than per unit and scrape.
    names: Vec<String>,
    env_vars: Vec<String>,
    procfs: PathBuf,
    sysfs: PathBuf,
    cgroupfs: PathBuf,
    version: CgroupVersion,
    /// v1: whether a `perf_event` hierarchy is mounted, looked up once, not per unit and scrape.
    v1_perf_event: bool,
    capabilities: &'static [Capability],
    state: Mutex<State>,
}

impl PerfStats {
    /// None when no perf flag is on, or (said in the log) when the kernel refuses every
    /// counter (`perf_event_paranoid` above 2, as some distributions set): the unit collector
    /// goes on without it. An error for an unknown profiler name.
    pub fn from_settings(
        settings: &PerfSettings,
        procfs: &Path,
        sysfs: &Path,
        cgroupfs: &Path,
        version: CgroupVersion,
    ) -> Result<Option<PerfStats>, String> {
        if !settings.enabled() {
            return Ok(None);
        }
        let events = settings.events()?;
        if let Err(why) = paranoid_allows(procfs) {
            tracing::error!(%why, "perf sub-collector off; the rest of the collector goes on");
            return Ok(None);
        }
        tracing::info!(
            events = events.len(),
            env_vars = ?settings.env_vars,
            "perf sub-collector on"
        );
        Ok(Some(PerfStats {
            names: events
                .iter()
                .map(|e| format!("ceems_perf_{}_total", e.metric))
                .collect(),
            events,
            env_vars: settings.env_vars.clone(),
            procfs: procfs.to_owned(),
            sysfs: sysfs.to_owned(),
            cgroupfs: cgroupfs.to_owned(),
            version,
            v1_perf_event: cgroupfs.join("perf_event").is_dir(),
            capabilities: capabilities(),
            state: Mutex::new(State::default()),
        }))
    }

    /// The sub-collector of a unit collector being built, from the shared settings.
    pub fn for_collector(
        ctx: &crate::collect::Context,
        version: CgroupVersion,
    ) -> Result<Option<PerfStats>, crate::collect::CollectError> {
        PerfStats::from_settings(
            &ctx.common.perf,
            &ctx.paths.procfs,
            &ctx.paths.sysfs,
            &ctx.paths.cgroupfs,
            version,
        )
        .map_err(crate::collect::CollectError::Other)
    }

    /// Open perf descriptors, for tests and logs.
    pub fn open_descriptors(&self) -> usize {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.units.values().map(UnitCounters::fds).sum()
    }

    /// The directory the perf_event controller sees the unit in, if any.
    fn cgroup_dir(&self, unit: &PerfUnit<'_>) -> Option<PathBuf> {
        match self.version {
            CgroupVersion::V2 => Some(unit.dir.to_owned()),
            CgroupVersion::V1 if !self.v1_perf_event => None,
            CgroupVersion::V1 => {
                let dir = self.cgroupfs.join("perf_event").join(unit.rel);
                dir.is_dir().then_some(dir)
            }
        }
    }

    /// The CPUs the unit may run on: its cpuset, else every online CPU.
    fn cpus(&self, unit: &PerfUnit<'_>) -> Vec<usize> {
        let cpuset = match self.version {
            CgroupVersion::V2 => unit.dir.join("cpuset.cpus.effective"),
            CgroupVersion::V1 => self
                .cgroupfs
                .join("cpuset")
                .join(unit.rel)
                .join("cpuset.effective_cpus"),
        };
        let read = |p: &Path| {
            std::fs::read_to_string(p)
                .ok()
                .and_then(|t| perf::cpu_list(&t).ok())
        };
        read(&cpuset)
            .filter(|c| !c.is_empty())
            .or_else(|| read(&self.sysfs.join("devices/system/cpu/online")))
            .unwrap_or_default()
    }

    fn stat(&self, pid: u32) -> Option<procfs::PidStat> {
        crate::host::processes::read_stat(&self.procfs.join(pid.to_string()).join("stat"))
    }

    /// Counts each unit's events and exports them; units not in `units` are forgotten and their
    /// descriptors closed.
    pub fn collect(
        &self,
        units: &[PerfUnit<'_>],
        manager: &str,
        hostname: &str,
        out: &mut MetricSet,
    ) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let present: HashSet<&str> = units.iter().map(|u| u.uuid).collect();
        state
            .units
            .retain(|uuid, _| present.contains(uuid.as_str()));

        let enabled = self.enabled_units(&mut state, units);

        let mut requests = Vec::new();
        for unit in units {
            let events = self.events.len();
            let counters = state
                .units
                .entry(unit.uuid.to_owned())
                .or_insert_with(|| UnitCounters::new(events));
            if !enabled.contains(unit.uuid) {
                counters.close_all();
                continue;
            }
            if counters.cgroup.is_some() {
                continue;
            }
            if let Some(dir) = self.cgroup_dir(unit) {
                counters.cgroup = Some(Vec::new());
                requests.push(OpenRequest::Cgroup {
                    uuid: unit.uuid.to_owned(),
                    dir,
                    cpus: self.cpus(unit),
                });
                continue;
            }
            plan_processes(counters, unit, &mut |pid| self.stat(pid), &mut requests);
        }
        if !requests.is_empty() {
            self.open(&mut state, requests);
        }

        for unit in units {
            let Some(counters) = state.units.get_mut(unit.uuid) else {
                continue;
            };
            let mut totals = counters.closed.clone();
            let live = counters.cgroup.iter_mut().flatten().chain(
                counters
                    .roots
                    .values_mut()
                    .flat_map(|r| r.counters.iter_mut()),
            );
            for c in live {
                c.add_to(&mut totals);
            }
            let labels = Labels::new(&[
                ("hostname", hostname),
                ("manager", manager),
                ("uuid", unit.uuid),
            ]);
            for (event, total) in totals.iter().enumerate() {
                let total = (*total).max(counters.last[event]);
                counters.last[event] = total;
                if total > 0 {
                    out.counter(
                        &self.names[event],
                        self.events[event].help,
                        labels.clone(),
                        total as f64,
                    );
                }
            }
        }
    }

    /// The units to count now: all, or with `--collector.perf.env-var` those with a process
    /// whose environment sets one of the variables.
    fn enabled_units<'u>(&self, state: &mut State, units: &'u [PerfUnit<'u>]) -> HashSet<&'u str> {
        if self.env_vars.is_empty() {
            return units.iter().map(|u| u.uuid).collect();
        }
        let present: HashSet<u32> = units.iter().flat_map(|u| u.pids.iter().copied()).collect();
        state.environ.retain(|pid, _| present.contains(pid));
        let unknown: Vec<u32> = present
            .into_iter()
            .filter(|pid| !state.environ.contains_key(pid))
            .collect();
        if !unknown.is_empty() {
            let procfs = self.procfs.clone();
            let vars = self.env_vars.clone();
            let read: Vec<(u32, bool)> =
                crate::security::privileged(self.capabilities, move || {
                    unknown
                        .into_iter()
                        .map(|pid| {
                            let environ =
                                std::fs::read(procfs.join(pid.to_string()).join("environ"))
                                    .unwrap_or_default();
                            let set = vars
                                .iter()
                                .any(|v| procfs::environ_var(&environ, v).is_some());
                            (pid, set)
                        })
                        .collect()
                });
            state.environ.extend(read);
        }
        units
            .iter()
            .filter(|u| u.pids.iter().any(|p| state.environ.get(p) == Some(&true)))
            .map(|u| u.uuid)
            .collect()
    }

    /// Opens what `requests` ask for in one privileged call and files the counters.
    fn open(&self, state: &mut State, requests: Vec<OpenRequest>) {
        let events: Vec<(usize, &'static PerfEvent)> = self
            .events
            .iter()
            .copied()
            .enumerate()
            .filter(|(i, _)| !state.unsupported.contains(i))
            .collect();
        let procfs = self.procfs.clone();
        let opened: Vec<Opened> = crate::security::privileged(self.capabilities, move || {
            requests
                .into_iter()
                .map(|r| open_request(r, &events, &procfs))
                .collect()
        });
        for o in opened {
            for (event, e) in &o.errors {
                if perf::is_unsupported(e) {
                    if state.unsupported.insert(*event) {
                        tracing::warn!(
                            event = self.events[*event].profiler,
                            error = %e,
                            "this CPU or kernel does not count this perf event; it is left out"
                        );
                    }
                } else if e.raw_os_error() != Some(nix::errno::Errno::ESRCH as i32) {
                    let kind = e.kind().to_string();
                    if state.said.insert(kind) {
                        tracing::warn!(unit = %o.uuid, error = %e, "cannot open perf counters (said once per kind of failure)");
                    }
                }
            }
            let Some(counters) = state.units.get_mut(&o.uuid) else {
                continue;
            };
            match o.process {
                None => counters.cgroup = Some(o.counters),
                Some((pid, opened_at)) if !o.counters.is_empty() => {
                    counters.roots.insert(
                        pid,
                        Root {
                            opened_at,
                            counters: o.counters,
                        },
                    );
                }
                Some(_) => {}
            }
        }
    }
}

/// Whether `perf_event_paranoid` lets a capable exporter open counters, and what to change
/// when it does not.
fn paranoid_allows(procfs: &Path) -> Result<(), String> {
    match perf::paranoid(procfs) {
        Some(level) if level > 2 => Err(format!(
            "kernel.perf_event_paranoid is {level}: the kernel refuses perf counters to every process but root's; set it to 2 or lower"
        )),
        _ => Ok(()),
    }
}

/// Task mode: closes the counters of processes gone (once nothing they cover lives) and asks
/// for counters on the unit's processes that nothing counts yet. Only those are `stat`ed: a
/// process is alive while its pid is in the unit.
fn plan_processes(
    counters: &mut UnitCounters,
    unit: &PerfUnit<'_>,
    stat: &mut impl FnMut(u32) -> Option<procfs::PidStat>,
    requests: &mut Vec<OpenRequest>,
) {
    let alive: HashSet<u32> = unit.pids.iter().copied().collect();
    counters.covered.retain(|pid, _| alive.contains(pid));
    let dead: Vec<u32> = counters
        .roots
        .keys()
        .filter(|pid| !alive.contains(pid))
        .filter(|pid| !counters.covered.values().any(|root| root == *pid))
        .copied()
        .collect();
    for pid in dead {
        if let Some(r) = counters.roots.remove(&pid) {
            counters.close(r.counters);
        }
    }
    // Parents before children, so a child's cover is decided after its parent's.
    let mut new: Vec<(u32, procfs::PidStat)> = unit
        .pids
        .iter()
        .filter(|p| !counters.roots.contains_key(p) && !counters.covered.contains_key(p))
        .filter_map(|p| Some((*p, stat(*p)?)))
        .collect();
    new.sort_by_key(|(p, s)| (s.start_ticks, *p));
    for (pid, stat) in new {
        // A process created after its parent's counters were opened counts through them.
        let parent = stat.ppid;
        let cover = if let Some(r) = counters.roots.get(&parent) {
            (stat.start_ticks > r.opened_at).then_some(parent)
        } else {
            counters.covered.get(&parent).copied()
        };
        match cover {
            Some(root) => {
                counters.covered.insert(pid, root);
            }
            None => requests.push(OpenRequest::Process {
                uuid: unit.uuid.to_owned(),
                pid,
            }),
        }
    }
}

/// Clock ticks since boot, as `/proc/<pid>/stat` counts a process's start.
fn boot_ticks() -> u64 {
    let Ok(now) = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME) else {
        return 0;
    };
    let hz = crate::host::cgroup::clock_ticks();
    let ns = now.tv_sec() as f64 * 1e9 + now.tv_nsec() as f64;
    (ns * hz / 1e9) as u64
}

fn open_request(
    request: OpenRequest,
    events: &[(usize, &'static PerfEvent)],
    procfs: &Path,
) -> Opened {
    let mut counters = Vec::new();
    let mut errors = Vec::new();
    match request {
        OpenRequest::Cgroup { uuid, dir, cpus } => {
            match File::open(&dir) {
                Ok(file) => {
                    let mut events = events.to_vec();
                    for &cpu in &cpus {
                        let (opened, failed) =
                            TargetCounters::open(&events, &Target::Cgroup { dir: &file, cpu });
                        // An event that fails on one CPU is not asked for on the others.
                        events.retain(|(i, _)| !failed.iter().any(|(f, _)| f == i));
                        errors.extend(failed);
                        if opened.descriptors() > 0 {
                            counters.push(opened);
                        }
                    }
                }
                Err(err) => errors.push((0, err)),
            }
            Opened {
                uuid,
                process: None,
                counters,
                errors,
            }
        }
        OpenRequest::Process { uuid, pid } => {
            let opened_at = boot_ticks();
            let tids: Vec<i32> = std::fs::read_dir(procfs.join(pid.to_string()).join("task"))
                .map(|d| {
                    d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                        .collect()
                })
                .unwrap_or_default();
            let mut events = events.to_vec();
            for &tid in &tids {
                let (opened, failed) = TargetCounters::open(&events, &Target::Task(tid));
                // What this CPU lacks is not asked for on the other threads.
                events.retain(|(i, _)| {
                    !failed
                        .iter()
                        .any(|(f, e)| f == i && perf::is_unsupported(e))
                });
                errors.extend(failed);
                if opened.descriptors() > 0 {
                    counters.push(opened);
                }
            }
            Opened {
                uuid,
                process: Some((pid, opened_at)),
                counters,
                errors,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_choose_events_by_group_and_profiler() {
        let s = PerfSettings {
            software_events: true,
            software_profilers: vec!["PageFault".into(), "ContextSwitch".into()],
            hardware_cache_events: true,
            ..PerfSettings::default()
        };
        let metrics: Vec<&str> = s.events().unwrap().iter().map(|e| e.metric).collect();
        assert_eq!(metrics[..2], ["page_faults", "context_switches"]);
        assert_eq!(metrics.len(), 2 + 12);
        let bad = PerfSettings {
            hardware_events: true,
            hardware_profilers: vec!["Cycles".into()],
            ..PerfSettings::default()
        };
        let err = bad.events().unwrap_err();
        assert!(
            err.contains("unknown profiler `Cycles`") && err.contains("CpuCycles"),
            "{err}"
        );
        assert!(!PerfSettings::default().enabled());
    }

    #[test]
    fn paranoid_above_two_turns_perf_off_with_the_fix() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("sys/kernel")).unwrap();
        let paranoid = root.path().join("sys/kernel/perf_event_paranoid");
        let s = PerfSettings {
            software_events: true,
            ..PerfSettings::default()
        };
        let build = || {
            PerfStats::from_settings(&s, root.path(), root.path(), root.path(), CgroupVersion::V1)
        };
        std::fs::write(&paranoid, "2\n").unwrap();
        assert!(matches!(build(), Ok(Some(_))));
        std::fs::write(&paranoid, "3\n").unwrap();
        assert!(
            matches!(build(), Ok(None)),
            "perf stays off, the collector goes on"
        );
        let why = paranoid_allows(root.path()).unwrap_err();
        assert!(
            why.contains("perf_event_paranoid is 3") && why.contains("2 or lower"),
            "{why}"
        );
    }

    fn stat(ppid: u32, start_ticks: u64) -> procfs::PidStat {
        procfs::PidStat {
            state: 'S',
            utime: 0,
            stime: 0,
            num_threads: 1,
            ppid,
            start_ticks,
        }
    }

    #[test]
    fn children_forked_after_their_parent_was_counted_are_not_counted_again() {
        let mut counters = UnitCounters::new(1);
        counters.roots.insert(
            10,
            Root {
                opened_at: 200,
                counters: Vec::new(),
            },
        );
        // 11: forked after 10's counters opened; 12: its child; 13: forked before the open;
        // 14: started by something outside the unit.
        let stats: HashMap<u32, procfs::PidStat> = [
            (10, stat(1, 100)),
            (11, stat(10, 250)),
            (12, stat(11, 260)),
            (13, stat(10, 150)),
            (14, stat(1, 300)),
        ]
        .into_iter()
        .collect();
        let pids = [10, 11, 12, 13, 14];
        let unit = PerfUnit {
            uuid: "1",
            dir: Path::new("/"),
            rel: Path::new(""),
            pids: &pids,
        };
        let mut requests = Vec::new();
        plan_processes(
            &mut counters,
            &unit,
            &mut |p| stats.get(&p).copied(),
            &mut requests,
        );
        let opened: Vec<u32> = requests
            .iter()
            .map(|r| match r {
                OpenRequest::Process { pid, .. } => *pid,
                OpenRequest::Cgroup { .. } => 0,
            })
            .collect();
        assert_eq!(opened, vec![13, 14]);
        assert_eq!(counters.covered.get(&12), Some(&10));
        // The root is gone but its child lives: its counters stay open.
        let stats: HashMap<u32, procfs::PidStat> = [(11, stat(1, 250))].into_iter().collect();
        let unit = PerfUnit {
            pids: &[11],
            ..unit
        };
        plan_processes(
            &mut counters,
            &unit,
            &mut |p| stats.get(&p).copied(),
            &mut Vec::new(),
        );
        assert!(counters.roots.contains_key(&10));
        // And once that child is gone too, they close.
        let unit = PerfUnit { pids: &[], ..unit };
        plan_processes(&mut counters, &unit, &mut |_| None, &mut Vec::new());
        assert!(counters.roots.is_empty());
    }
}
