//! `slurm_cluster`: the cluster as Slurm's controller sees it (nodes, CPUs and memory by state,
//! partitions, jobs by state, user, account and pending reason), from `sinfo` and `squeue`
//! with format strings. Meant for one node. However many scrapers ask, the commands run at most
//! once per `--collector.slurm_cluster.poll-limit`; a hung command is killed and the last good
//! data is served with success 0.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::{CollectError, Collector, CollectorSpec, Context};
use crate::config::{Kind, Opt};
use crate::host::command;
use crate::host::ParseError;
use crate::metrics::{Labels, MetricSet};

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "slurm_cluster",
    default_enabled: false,
    capabilities: &[],
    options,
    build,
    self_test: None,
    sub_collectors: &[],
};

/// One record per node and partition.
pub const SINFO_ARGS: &[&str] = &[
    "-h",
    "-N",
    "-O",
    "NodeList:|,Partition:|,StateLong:|,CPUsState:|,Memory:|,AllocMem:|,FreeMem:",
];
/// One record per job.
pub const SQUEUE_ARGS: &[&str] = &["-h", "-o", "%P|%T|%u|%a|%r|%C"];

fn options() -> Vec<Opt> {
    vec![
        Opt::new(
            "collector.slurm_cluster.sinfo-path",
            Kind::Str,
            "sinfo command",
        )
        .default("sinfo"),
        Opt::new(
            "collector.slurm_cluster.squeue-path",
            Kind::Str,
            "squeue command",
        )
        .default("squeue"),
        Opt::new(
            "collector.slurm_cluster.poll-limit",
            Kind::Duration,
            "Run sinfo and squeue at most once in this time, however many scrapes ask",
        )
        .default("10s"),
        Opt::new(
            "collector.slurm_cluster.cmd-timeout",
            Kind::Duration,
            "Kill sinfo or squeue after this long and serve the last good data",
        )
        .default("10s"),
    ]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Settings {
    sinfo_path: PathBuf,
    squeue_path: PathBuf,
    #[serde(deserialize_with = "crate::config::de_duration")]
    poll_limit: Duration,
    #[serde(deserialize_with = "crate::config::de_duration")]
    cmd_timeout: Duration,
}

/// One `sinfo -N` record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLine {
    pub node: String,
    pub partition: String,
    pub state: String,
    pub cpus_allocated: u64,
    pub cpus_idle: u64,
    pub cpus_other: u64,
    pub cpus_total: u64,
    pub memory_mib: u64,
    pub alloc_memory_mib: u64,
    /// None when Slurm reports `N/A`.
    pub free_memory_mib: Option<u64>,
}

/// One `squeue` record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobLine {
    pub partition: String,
    pub state: String,
    pub user: String,
    pub account: String,
    pub reason: String,
    pub cpus: u64,
}

fn num(line: usize, what: &str, v: &str) -> Result<u64, ParseError> {
    v.trim()
        .parse()
        .map_err(|_| ParseError::new(line, format!("{what} `{v}` is not an unsigned integer")))
}

/// The non-empty records of a `|`-separated output, numbered from 1, fields trimmed.
fn records(text: &str) -> impl Iterator<Item = (usize, Vec<&str>)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i + 1, l.split('|').map(str::trim).collect()))
}

/// Parses `sinfo -h -N -O NodeList:|,Partition:|,StateLong:|,CPUsState:|,Memory:|,AllocMem:|,FreeMem:`.
pub fn parse_nodes(text: &str) -> Result<Vec<NodeLine>, ParseError> {
    let mut out = Vec::new();
    for (n, f) in records(text) {
        let [node, partition, state, cpus, mem, alloc, free] = f[..] else {
            return Err(ParseError::new(
                n,
                format!("expected 7 fields, got {}", f.len()),
            ));
        };
        let c: Vec<&str> = cpus.split('/').collect();
        let [a, idle, o, t] = c[..] else {
            return Err(ParseError::new(n, format!("CPUs `{cpus}` is not A/I/O/T")));
        };
        out.push(NodeLine {
            node: node.to_owned(),
            // The default partition is marked with a `*`.
            partition: partition.trim_end_matches('*').to_owned(),
            // Flags such as `idle*` (not responding) or `mixed-` are the state's decorations.
            state: state
                .trim_end_matches(['*', '~', '#', '!', '%', '$', '@', '^', '-', '+'])
                .to_owned(),
            cpus_allocated: num(n, "allocated CPUs", a)?,
            cpus_idle: num(n, "idle CPUs", idle)?,
            cpus_other: num(n, "other CPUs", o)?,
            cpus_total: num(n, "total CPUs", t)?,
            memory_mib: num(n, "memory", mem)?,
            alloc_memory_mib: num(n, "allocated memory", alloc)?,
            free_memory_mib: match free {
                "N/A" | "" => None,
                v => Some(num(n, "free memory", v)?),
            },
        });
    }
    Ok(out)
}

/// Parses `squeue -h -o %P|%T|%u|%a|%r|%C`.
pub fn parse_jobs(text: &str) -> Result<Vec<JobLine>, ParseError> {
    let mut out = Vec::new();
    for (n, f) in records(text) {
        let [partition, state, user, account, reason, cpus] = f[..] else {
            return Err(ParseError::new(
                n,
                format!("expected 6 fields, got {}", f.len()),
            ));
        };
        out.push(JobLine {
            partition: partition.to_owned(),
            state: state.to_ascii_lowercase(),
            user: user.to_owned(),
            account: account.to_owned(),
            reason: reason.to_owned(),
            cpus: num(n, "CPUs", cpus)?,
        });
    }
    Ok(out)
}

/// What one poll found.
#[derive(Debug, Clone, Default)]
struct Snapshot {
    nodes: Vec<NodeLine>,
    jobs: Vec<JobLine>,
}

const MIB: f64 = 1024.0 * 1024.0;

fn emit(out: &mut MetricSet, s: &Snapshot) {
    // A node in several partitions has one record per partition: count it once.
    let mut seen = BTreeSet::new();
    let mut nodes_by_state: BTreeMap<&str, u64> = BTreeMap::new();
    let mut cpus = [0u64; 4];
    let (mut mem_total, mut mem_alloc, mut mem_free) = (0u64, 0u64, 0u64);
    for n in &s.nodes {
        if !seen.insert(n.node.as_str()) {
            continue;
        }
        *nodes_by_state.entry(n.state.as_str()).or_default() += 1;
        cpus[0] += n.cpus_allocated;
        cpus[1] += n.cpus_idle;
        cpus[2] += n.cpus_other;
        cpus[3] += n.cpus_total;
        mem_total += n.memory_mib;
        mem_alloc += n.alloc_memory_mib;
        mem_free += n.free_memory_mib.unwrap_or(0);
    }
    for (state, count) in nodes_by_state {
        out.gauge(
            "ceems_slurm_nodes",
            "Nodes by state",
            Labels::new(&[("state", state)]),
            count as f64,
        );
    }
    for (state, v) in ["allocated", "idle", "other", "total"].iter().zip(cpus) {
        out.gauge(
            "ceems_slurm_cpus",
            "CPUs of the cluster by state",
            Labels::new(&[("state", state)]),
            v as f64,
        );
    }
    for (state, v) in [
        ("total", mem_total),
        ("allocated", mem_alloc),
        ("free", mem_free),
    ] {
        out.gauge(
            "ceems_slurm_memory_bytes",
            "Memory of the cluster's nodes by state",
            Labels::new(&[("state", state)]),
            v as f64 * MIB,
        );
    }
    let mut partitions: BTreeMap<&str, [u64; 5]> = BTreeMap::new();
    for n in &s.nodes {
        let p = partitions.entry(n.partition.as_str()).or_default();
        p[0] += n.cpus_allocated;
        p[1] += n.cpus_idle;
        p[2] += n.cpus_total;
        p[3] += n.alloc_memory_mib;
        p[4] += n.memory_mib;
    }
    for (partition, [alloc, idle, total, mem_alloc, mem_total]) in partitions {
        for (state, v) in [("allocated", alloc), ("idle", idle), ("total", total)] {
            out.gauge(
                "ceems_slurm_partition_cpus",
                "CPUs of a partition by state",
                Labels::new(&[("partition", partition), ("state", state)]),
                v as f64,
            );
        }
        for (state, v) in [
            ("allocated", mem_alloc),
            ("idle", mem_total.saturating_sub(mem_alloc)),
            ("total", mem_total),
        ] {
            out.gauge(
                "ceems_slurm_partition_memory_bytes",
                "Memory of a partition's nodes by state",
                Labels::new(&[("partition", partition), ("state", state)]),
                v as f64 * MIB,
            );
        }
    }
    let mut by_partition: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let mut by_user: BTreeMap<(&str, &str), (u64, u64)> = BTreeMap::new();
    let mut by_account: BTreeMap<(&str, &str), (u64, u64)> = BTreeMap::new();
    let mut pending: BTreeMap<&str, u64> = BTreeMap::new();
    for j in &s.jobs {
        *by_partition.entry((&j.partition, &j.state)).or_default() += 1;
        let u = by_user.entry((&j.user, &j.state)).or_default();
        u.0 += 1;
        u.1 += j.cpus;
        let a = by_account.entry((&j.account, &j.state)).or_default();
        a.0 += 1;
        a.1 += j.cpus;
        if j.state == "pending" {
            *pending.entry(&j.reason).or_default() += 1;
        }
    }
    for ((partition, state), n) in by_partition {
        out.gauge(
            "ceems_slurm_partition_jobs",
            "Jobs by partition and state",
            Labels::new(&[("partition", partition), ("state", state)]),
            n as f64,
        );
    }
    for (name, label, map) in [
        ("ceems_slurm_user", "user", &by_user),
        ("ceems_slurm_account", "account", &by_account),
    ] {
        for ((who, state), (jobs, cpus)) in map {
            let l = Labels::new(&[(label, who), ("state", state)]);
            out.gauge(
                &format!("{name}_jobs"),
                &format!("Jobs by {label} and state"),
                l.clone(),
                *jobs as f64,
            );
            out.gauge(
                &format!("{name}_cpus"),
                &format!("CPUs of jobs by {label} and state"),
                l,
                *cpus as f64,
            );
        }
    }
    for (reason, n) in pending {
        out.gauge(
            "ceems_slurm_pending_jobs",
            "Pending jobs by reason",
            Labels::new(&[("reason", reason)]),
            n as f64,
        );
    }
}

struct State {
    last_poll: Option<Instant>,
    last_good: Option<Snapshot>,
    last_error: Option<String>,
}

pub struct SlurmClusterCollector {
    sinfo: PathBuf,
    squeue: PathBuf,
    poll_limit: Duration,
    timeout: Duration,
    state: Mutex<State>,
}

fn build(ctx: &Context) -> Result<Box<dyn Collector>, CollectError> {
    let s: Settings = ctx.settings()?;
    Ok(Box::new(SlurmClusterCollector::new(
        s.sinfo_path,
        s.squeue_path,
        s.poll_limit,
        s.cmd_timeout,
    )))
}

impl SlurmClusterCollector {
    pub fn new(sinfo: PathBuf, squeue: PathBuf, poll_limit: Duration, timeout: Duration) -> Self {
        SlurmClusterCollector {
            sinfo,
            squeue,
            poll_limit,
            timeout,
            state: Mutex::new(State {
                last_poll: None,
                last_good: None,
                last_error: None,
            }),
        }
    }

    fn poll(&self) -> Result<Snapshot, String> {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let nodes = command::run(&self.sinfo, &args(SINFO_ARGS), self.timeout)
            .map_err(|e| e.to_string())?;
        let jobs = command::run(&self.squeue, &args(SQUEUE_ARGS), self.timeout)
            .map_err(|e| e.to_string())?;
        Ok(Snapshot {
            nodes: parse_nodes(&nodes).map_err(|e| format!("sinfo output: {e}"))?,
            jobs: parse_jobs(&jobs).map_err(|e| format!("squeue output: {e}"))?,
        })
    }
}

impl Collector for SlurmClusterCollector {
    fn collect(&self, out: &mut MetricSet) -> Result<(), CollectError> {
        // Held across the poll, so concurrent scrapes wait for one run instead of starting more.
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let due = state
            .last_poll
            .is_none_or(|t| t.elapsed() >= self.poll_limit);
        if due {
            state.last_poll = Some(Instant::now());
            match self.poll() {
                Ok(s) => {
                    state.last_good = Some(s);
                    state.last_error = None;
                }
                Err(e) => state.last_error = Some(e),
            }
        }
        if let Some(s) = &state.last_good {
            emit(out, s);
        }
        match (&state.last_error, &state.last_good) {
            (None, _) => Ok(()),
            (Some(e), Some(_)) => Err(CollectError::Stale(e.clone())),
            (Some(e), None) => Err(CollectError::Other(e.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_outputs() {
        let nodes = parse_nodes(
            "localhost|debug*|mixed|1/1/0/2|23081|100|20312\nn2|gpu|idle*|0/4/0/4|1000|0|N/A\n",
        )
        .unwrap();
        assert_eq!(nodes[0].partition, "debug");
        assert_eq!(nodes[0].cpus_allocated, 1);
        assert_eq!(nodes[1].state, "idle");
        assert_eq!(nodes[1].free_memory_mib, None);
        let jobs = parse_jobs(
            "debug|PENDING|bob|chemistry|Resources|2\ndebug|RUNNING|alice|physics|None|1\n",
        )
        .unwrap();
        assert_eq!(jobs[0].state, "pending");
        assert_eq!(jobs[1].cpus, 1);
        for bad in ["a|b", "n|p|s|1/2/3|1|2|3", "n|p|s|1/1/0/x|1|2|3"] {
            assert!(parse_nodes(bad).is_err(), "{bad}");
        }
        assert!(parse_jobs("p|R|u|a|r|x").is_err());
        assert!(parse_jobs("p|R|u").is_err());

        let mut out = MetricSet::new();
        emit(&mut out, &Snapshot { nodes, jobs });
        let mut text = String::new();
        out.encode_text(&mut text);
        for line in [
            "ceems_slurm_nodes{state=\"mixed\"} 1",
            "ceems_slurm_cpus{state=\"total\"} 6",
            "ceems_slurm_partition_cpus{partition=\"gpu\",state=\"idle\"} 4",
            "ceems_slurm_partition_jobs{partition=\"debug\",state=\"running\"} 1",
            "ceems_slurm_user_jobs{state=\"pending\",user=\"bob\"} 1",
            "ceems_slurm_account_cpus{account=\"chemistry\",state=\"pending\"} 2",
            "ceems_slurm_pending_jobs{reason=\"Resources\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panic(s in "\\PC*") {
            let _ = parse_nodes(&s);
            let _ = parse_jobs(&s);
        }
    }
}
