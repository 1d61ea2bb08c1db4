//! The kernel's performance counters (`perf_event_open`): the events CEEMS's perf sub-collector
//! knows, opened on a cgroup (one counter per CPU) or on a task and the tasks it creates later.
//! Counters come from the perf-event2 crate; this module says which ones and how they are read.

use std::fs::File;
use std::io;

use perf_event::events::{Cache, CacheId, CacheOp, CacheResult, Hardware, Software};
use perf_event::{Builder, Counter, ReadFormat};

use super::ParseError;

/// Which CEEMS flag turns an event on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventGroup {
    Hardware,
    Software,
    Cache,
}

/// What the kernel is asked to count.
#[derive(Debug, Clone, Copy)]
pub enum EventKind {
    Hardware(Hardware),
    Software(Software),
    Cache(CacheId, CacheOp, CacheResult),
}

/// One event: its group, CEEMS's profiler name (for `--collector.perf.*-profilers`) and the
/// metric it is exported as (`ceems_perf_<metric>_total`).
#[derive(Debug, Clone, Copy)]
pub struct PerfEvent {
    pub group: EventGroup,
    pub profiler: &'static str,
    pub metric: &'static str,
    pub help: &'static str,
    pub kind: EventKind,
}

const fn hw(
    profiler: &'static str,
    metric: &'static str,
    help: &'static str,
    e: Hardware,
) -> PerfEvent {
    PerfEvent {
        group: EventGroup::Hardware,
        profiler,
        metric,
        help,
        kind: EventKind::Hardware(e),
    }
}

const fn sw(
    profiler: &'static str,
    metric: &'static str,
    help: &'static str,
    e: Software,
) -> PerfEvent {
    PerfEvent {
        group: EventGroup::Software,
        profiler,
        metric,
        help,
        kind: EventKind::Software(e),
    }
}

const fn cache(
    profiler: &'static str,
    metric: &'static str,
    help: &'static str,
    id: CacheId,
    op: CacheOp,
    result: CacheResult,
) -> PerfEvent {
    PerfEvent {
        group: EventGroup::Cache,
        profiler,
        metric,
        help,
        kind: EventKind::Cache(id, op, result),
    }
}

/// Every event, with CEEMS's names.
pub const EVENTS: &[PerfEvent] = &[
    hw(
        "CpuCycles",
        "cpucycles",
        "Number of CPU cycles (frequency scaled)",
        Hardware::CPU_CYCLES,
    ),
    hw(
        "CpuInstr",
        "instructions",
        "Number of CPU instructions",
        Hardware::INSTRUCTIONS,
    ),
    hw(
        "BranchInstr",
        "branch_instructions",
        "Number of CPU branch instructions",
        Hardware::BRANCH_INSTRUCTIONS,
    ),
    hw(
        "BranchMisses",
        "branch_misses",
        "Number of CPU branch misses",
        Hardware::BRANCH_MISSES,
    ),
    hw(
        "CacheRef",
        "cache_refs",
        "Number of cache references (non frequency scaled)",
        Hardware::CACHE_REFERENCES,
    ),
    hw(
        "CacheMisses",
        "cache_misses",
        "Number of cache misses",
        Hardware::CACHE_MISSES,
    ),
    hw(
        "RefCpuCycles",
        "ref_cpucycles",
        "Number of CPU cycles",
        Hardware::REF_CPU_CYCLES,
    ),
    sw(
        "PageFault",
        "page_faults",
        "Number of page faults",
        Software::PAGE_FAULTS,
    ),
    sw(
        "ContextSwitch",
        "context_switches",
        "Number of context switches",
        Software::CONTEXT_SWITCHES,
    ),
    sw(
        "CpuMigration",
        "cpu_migrations",
        "Number of CPU process migrations",
        Software::CPU_MIGRATIONS,
    ),
    sw(
        "MinorFault",
        "minor_faults",
        "Number of minor page faults",
        Software::PAGE_FAULTS_MIN,
    ),
    sw(
        "MajorFault",
        "major_faults",
        "Number of major page faults",
        Software::PAGE_FAULTS_MAJ,
    ),
    cache(
        "L1DataReadHit",
        "cache_l1d_read_hits",
        "Number L1 data cache read hits",
        CacheId::L1D,
        CacheOp::READ,
        CacheResult::ACCESS,
    ),
    cache(
        "L1DataReadMiss",
        "cache_l1d_read_misses",
        "Number L1 data cache read misses",
        CacheId::L1D,
        CacheOp::READ,
        CacheResult::MISS,
    ),
    cache(
        "L1DataWriteHit",
        "cache_l1d_write_hits",
        "Number L1 data cache write hits",
        CacheId::L1D,
        CacheOp::WRITE,
        CacheResult::ACCESS,
    ),
    cache(
        "L1InstrReadMiss",
        "cache_l1_instr_read_misses",
        "Number instruction L1 instruction read misses",
        CacheId::L1I,
        CacheOp::READ,
        CacheResult::MISS,
    ),
    cache(
        "InstrTLBReadHit",
        "cache_tlb_instr_read_hits",
        "Number instruction TLB read hits",
        CacheId::ITLB,
        CacheOp::READ,
        CacheResult::ACCESS,
    ),
    cache(
        "InstrTLBReadMiss",
        "cache_tlb_instr_read_misses",
        "Number instruction TLB read misses",
        CacheId::ITLB,
        CacheOp::READ,
        CacheResult::MISS,
    ),
    cache(
        "LLReadHit",
        "cache_ll_read_hits",
        "Number last level read hits",
        CacheId::LL,
        CacheOp::READ,
        CacheResult::ACCESS,
    ),
    cache(
        "LLReadMiss",
        "cache_ll_read_misses",
        "Number last level read misses",
        CacheId::LL,
        CacheOp::READ,
        CacheResult::MISS,
    ),
    cache(
        "LLWriteHit",
        "cache_ll_write_hits",
        "Number last level write hits",
        CacheId::LL,
        CacheOp::WRITE,
        CacheResult::ACCESS,
    ),
    cache(
        "LLWriteMiss",
        "cache_ll_write_misses",
        "Number last level write misses",
        CacheId::LL,
        CacheOp::WRITE,
        CacheResult::MISS,
    ),
    cache(
        "BPUReadHit",
        "cache_bpu_read_hits",
        "Number BPU read hits",
        CacheId::BPU,
        CacheOp::READ,
        CacheResult::ACCESS,
    ),
    cache(
        "BPUReadMiss",
        "cache_bpu_read_misses",
        "Number BPU read misses",
        CacheId::BPU,
        CacheOp::READ,
        CacheResult::MISS,
    ),
];

/// Where a counter counts.
#[derive(Debug)]
pub enum Target<'a> {
    /// The tasks of a cgroup (and its descendants) while they run on `cpu`.
    Cgroup { dir: &'a File, cpu: usize },
    /// One task (a thread id) and every task it creates from now on, on any CPU.
    Task(i32),
}

/// Opens `event` on `target`, counting at once; kernel-mode work done for the tasks counts
/// too (a context switch happens in the kernel).
pub fn open(event: &PerfEvent, target: &Target<'_>) -> io::Result<Counter> {
    builder(event, target).build()
}

fn builder<'a>(event: &PerfEvent, target: &Target<'a>) -> Builder<'a> {
    let mut builder = match event.kind {
        EventKind::Hardware(e) => Builder::new(e),
        EventKind::Software(e) => Builder::new(e),
        EventKind::Cache(id, op, result) => Builder::new(Cache {
            which: id,
            operation: op,
            result,
        }),
    };
    builder.exclude_kernel(false).exclude_hv(true).enabled(true);
    match target {
        Target::Cgroup { dir, cpu } => {
            builder.observe_cgroup(dir).one_cpu(*cpu);
        }
        Target::Task(tid) => {
            builder.observe_pid(*tid).any_cpu().inherit(true);
        }
    }
    builder
}

/// The counters of one target (a task, or a cgroup on one CPU). Software events are one group,
/// read with one `read` for all; the kernel never takes them off a CPU, so grouping them costs
/// nothing. Hardware and cache events stay alone: the CPU has few registers for them, and
/// alone each can be multiplexed where a group would need a register for every member at once.
#[derive(Default)]
pub struct TargetCounters {
    software: Option<SoftwareGroup>,
    alone: Vec<(usize, Counter)>,
}

struct SoftwareGroup {
    /// Counts the first event and reads the whole group.
    leader: Counter,
    /// Counter id → the caller's event index, the leader's included.
    events: Vec<(u64, usize)>,
    /// Kept open: closing a member would take it out of the group.
    _members: Vec<Counter>,
}

impl TargetCounters {
    /// Opens `events` (the caller's index, the event) on `target`; those that fail come back
    /// with why, beside the counters that opened.
    pub fn open(
        events: &[(usize, &PerfEvent)],
        target: &Target<'_>,
    ) -> (TargetCounters, Vec<(usize, io::Error)>) {
        let mut counters = TargetCounters::default();
        let mut errors = Vec::new();
        for (index, event) in events {
            let software = matches!(event.kind, EventKind::Software(_));
            let opened = match (&mut counters.software, software) {
                (None, true) => builder(event, target)
                    .read_format(
                        ReadFormat::GROUP
                            | ReadFormat::ID
                            | ReadFormat::TOTAL_TIME_ENABLED
                            | ReadFormat::TOTAL_TIME_RUNNING,
                    )
                    .build_group()
                    .map(|group| {
                        let leader = group.into_counter();
                        counters.software = Some(SoftwareGroup {
                            events: vec![(leader.id(), *index)],
                            leader,
                            _members: Vec::new(),
                        });
                    }),
                (Some(group), true) => builder(event, target)
                    .build_with_group(&mut group.leader)
                    .map(|member| {
                        group.events.push((member.id(), *index));
                        group._members.push(member);
                    }),
                (_, false) => {
                    open(event, target).map(|counter| counters.alone.push((*index, counter)))
                }
            };
            if let Err(e) = opened {
                errors.push((*index, e));
            }
        }
        (counters, errors)
    }

    /// Adds each event's count, scaled for multiplexing, to `totals[index]`.
    pub fn add_to(&mut self, totals: &mut [u64]) {
        if let Some(group) = &mut self.software {
            if let Ok(data) = group.leader.read_group() {
                let ns = |d: Option<std::time::Duration>| {
                    d.map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
                };
                let (enabled, running) = (ns(data.time_enabled()), ns(data.time_running()));
                for entry in data.iter() {
                    let index = group.events.iter().find(|(id, _)| *id == entry.id());
                    if let Some(total) = index.and_then(|(_, i)| totals.get_mut(*i)) {
                        *total = total.saturating_add(scale(entry.value(), enabled, running));
                    }
                }
            }
        }
        for (index, counter) in &mut self.alone {
            if let (Ok(v), Some(total)) = (read_scaled(counter), totals.get_mut(*index)) {
                *total = total.saturating_add(v);
            }
        }
    }

    /// Open descriptors.
    pub fn descriptors(&self) -> usize {
        self.software.as_ref().map_or(0, |g| g.events.len()) + self.alone.len()
    }
}

/// Whether an open failed because this CPU or kernel lacks the event (a VM without a PMU, an
/// architecture without that cache event), not because of the target or a permission.
pub fn is_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc_errno::ENOENT) | Some(libc_errno::EOPNOTSUPP) | Some(libc_errno::ENODEV)
    )
}

mod libc_errno {
    pub const ENOENT: i32 = nix::errno::Errno::ENOENT as i32;
    pub const EOPNOTSUPP: i32 = nix::errno::Errno::EOPNOTSUPP as i32;
    pub const ENODEV: i32 = nix::errno::Errno::ENODEV as i32;
}

/// A counter's value, scaled up for the time the kernel had it off the PMU when more events
/// were asked for than the CPU has counters (multiplexing), as `perf stat` does.
pub fn read_scaled(counter: &mut Counter) -> io::Result<u64> {
    let c = counter.read_count_and_time()?;
    Ok(scale(c.count, c.time_enabled, c.time_running))
}

/// `count × enabled / running`; 0 when the counter never ran.
pub fn scale(count: u64, enabled: u64, running: u64) -> u64 {
    if running == 0 {
        return 0;
    }
    if running >= enabled {
        return count;
    }
    let scaled = u128::from(count) * u128::from(enabled) / u128::from(running);
    u64::try_from(scaled).unwrap_or(u64::MAX)
}

/// A kernel CPU list (`0-3,8,10-11`), as in `cpuset.cpus` and `/sys/devices/system/cpu/online`.
pub fn cpu_list(text: &str) -> Result<Vec<usize>, ParseError> {
    let text = text.trim();
    let mut cpus = Vec::new();
    if text.is_empty() {
        return Ok(cpus);
    }
    for part in text.split(',') {
        let number = |s: &str| -> Result<usize, ParseError> {
            s.trim()
                .parse()
                .map_err(|_| ParseError::new(1, format!("`{s}` is not a CPU number")))
        };
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (number(a)?, number(b)?),
            None => {
                let n = number(part)?;
                (n, n)
            }
        };
        // More CPUs than any machine has is a malformed file, not a reason to allocate.
        if last < first || last - first >= 65_536 || last >= 1 << 20 {
            return Err(ParseError::new(1, format!("`{part}` is not a CPU range")));
        }
        cpus.extend(first..=last);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// `kernel.perf_event_paranoid` and what it allows an exporter holding `CAP_PERFMON`.
pub fn paranoid(procfs: &std::path::Path) -> Option<i32> {
    std::fs::read_to_string(procfs.join("sys/kernel/perf_event_paranoid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(
            cpu_list("0-3,8,10-11\n").unwrap(),
            vec![0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(cpu_list("5").unwrap(), vec![5]);
        assert_eq!(cpu_list("\n").unwrap(), Vec::<usize>::new());
        assert!(cpu_list("3-1").is_err());
        assert!(cpu_list("a").is_err());
        assert!(cpu_list("0-99999999").is_err());
    }

    #[test]
    fn scaling_follows_the_time_on_the_pmu() {
        assert_eq!(scale(100, 10, 10), 100);
        assert_eq!(scale(100, 10, 5), 200);
        assert_eq!(scale(100, 10, 0), 0);
        assert_eq!(scale(u64::MAX, u64::MAX, 1), u64::MAX);
    }

    #[test]
    fn ceems_names_are_unique() {
        let mut metrics: Vec<&str> = EVENTS.iter().map(|e| e.metric).collect();
        metrics.sort_unstable();
        metrics.dedup();
        assert_eq!(metrics.len(), EVENTS.len());
        assert_eq!(
            EVENTS
                .iter()
                .filter(|e| e.group == EventGroup::Hardware)
                .count(),
            7
        );
        assert_eq!(
            EVENTS
                .iter()
                .filter(|e| e.group == EventGroup::Software)
                .count(),
            5
        );
        assert_eq!(
            EVENTS
                .iter()
                .filter(|e| e.group == EventGroup::Cache)
                .count(),
            12
        );
    }

    proptest::proptest! {
        #[test]
        fn cpu_list_never_panics(s in "[0-9,\\- a]{0,40}") {
            if let Ok(cpus) = cpu_list(&s) {
                proptest::prop_assert!(cpus.windows(2).all(|w| w[0] < w[1]));
            }
        }
    }
}
