//! Efficiency findings of a job, in plain words: each rule has a stable id, a severity, a
//! one-line message and advice. They are computed from what the store holds of the job (its
//! request, its state, its aggregates) whenever those change, and stored with it.

use serde::{Deserialize, Serialize};

use crate::store::db::measured;

/// Thresholds of the rules (`[stats-server.findings]`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct Thresholds {
    /// CPU efficiency (%) below which a job gets `cpu_efficiency`.
    pub cpu_efficiency_below: f64,
    /// Peak memory (% of the request) below which a job gets `memory_underused`.
    pub memory_use_below: f64,
    /// Requests smaller than this (bytes) are not judged for memory.
    pub memory_min_request_bytes: f64,
    /// Mean GPU use (%) below which a job gets `gpu_low_use`.
    pub gpu_utilization_below: f64,
    /// Elapsed time (% of the time limit) below which a job gets `time_limit_overestimated`.
    pub time_limit_use_below: f64,
    /// Time limits shorter than this (seconds) are not judged.
    pub time_limit_min_seconds: f64,
    /// Emissions of a car per km, for the comparison of the `energy` finding.
    pub car_grams_per_km: f64,
    /// Cores per GPU above which a GPU job that keeps fewer busy gets `cores_per_gpu`.
    pub cores_per_gpu_above: f64,
    /// Memory per GPU (bytes) above which a GPU job that peaks under it gets
    /// `memory_per_gpu`.
    pub memory_per_gpu_above_bytes: f64,
    /// A node of a multi-node job is idle when its CPU time is under this share of the
    /// busiest node's.
    pub idle_node_share_below: f64,
    /// A CPU job on several nodes with at most this many cores per node gets `thin_spread`.
    pub thin_spread_cores_per_node: f64,
    /// Memory of the site's smallest MIG slice (bytes; 0: the site has none): a one-GPU job
    /// that peaked under it and kept its GPU under `mig-utilization-below` gets `mig_fit`.
    pub mig_memory_bytes: f64,
    pub mig_utilization_below: f64,
    /// How a user asks for that slice (`--gres=gpu:1g.10gb:1`), said in the advice.
    pub mig_request: String,
}

impl Default for Thresholds {
    fn default() -> Thresholds {
        Thresholds {
            cpu_efficiency_below: 25.0,
            memory_use_below: 20.0,
            memory_min_request_bytes: 1024.0 * 1024.0 * 1024.0,
            gpu_utilization_below: 10.0,
            time_limit_use_below: 20.0,
            time_limit_min_seconds: 3600.0,
            // The EU fleet average of new cars in 2023 (EEA): about 108 g/km.
            car_grams_per_km: 108.0,
            cores_per_gpu_above: 16.0,
            memory_per_gpu_above_bytes: 128.0 * 1024.0 * 1024.0 * 1024.0,
            idle_node_share_below: 0.05,
            thin_spread_cores_per_node: 2.0,
            // An H100's or H200's 1g slice; 0 where the site has no MIG.
            mig_memory_bytes: 10.0 * 1024.0 * 1024.0 * 1024.0,
            mig_utilization_below: 15.0,
            mig_request: String::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

impl Severity {
    /// Its name as stored and served (`info`, `warning`, `critical`).
    pub fn name(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Finding {
    pub id: String,
    pub severity: Severity,
    pub message: String,
    pub advice: String,
}

/// What the rules look at, as the store holds it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobFacts {
    /// The manager of the job's cluster, whose words the advice uses (empty: Slurm's).
    pub manager: String,
    /// Who and where, for the site's rules ([`crate::store::rules`]).
    pub name: String,
    pub user: String,
    pub project: String,
    pub partition: String,
    pub qos: String,
    /// The job's nodes, comma-separated (`n1,n2`).
    pub nodes: String,
    /// CPU seconds of each node of a multi-node job over its life (empty: not known).
    pub node_cpu_seconds: Vec<(String, f64)>,
    pub state: String,
    pub exit_code: String,
    pub ended: bool,
    pub elapsed_seconds: i64,
    pub time_limit_seconds: Option<i64>,
    pub alloc_cpus: i64,
    pub alloc_mem_bytes: i64,
    pub alloc_gpus: i64,
    /// Seconds of the job's life that Prometheus data covers.
    pub aggregated_seconds: i64,
    pub cpu_seconds: f64,
    pub memory_peak_bytes: Option<f64>,
    pub memory_fail_count: Option<f64>,
    pub mean_gpu_utilization: Option<f64>,
    pub gpu_utilization_max: Option<f64>,
    /// The highest GPU memory it used on one GPU.
    pub gpu_memory_peak_bytes: Option<f64>,
    pub host_energy_joules: f64,
    pub gpu_energy_joules: f64,
    pub emissions_grams: f64,
    /// Which figures Prometheus gave ([`crate::store::db::measured`]).
    pub measured: i64,
}

impl JobFacts {
    /// Mean cores busy over the time Prometheus saw, once it gave the job's CPU time (a job a
    /// few seconds old has one sample, no rate yet): None for a job without series.
    pub fn cores_used(&self) -> Option<f64> {
        (self.aggregated_seconds > 0 && measured::has(self.measured, measured::CPU))
            .then(|| self.cpu_seconds / self.aggregated_seconds as f64)
    }

    /// How many nodes it ran on.
    pub fn node_count(&self) -> usize {
        self.nodes.split(',').filter(|n| !n.is_empty()).count()
    }
}

/// `3.0 GiB`: a size in words.
pub(crate) fn bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b.max(0.0);
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} {}", UNITS[i])
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// `1 h 5 min`: a time in words.
pub(crate) fn duration(s: i64) -> String {
    let s = s.max(0);
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, sec) => format!("{sec} s"),
        (0, m, sec) => format!("{m} min {sec} s"),
        (h, m, _) => format!("{h} h {m} min"),
    }
}

fn finding(id: &str, severity: Severity, message: String, advice: String) -> Finding {
    Finding {
        id: id.to_owned(),
        severity,
        message,
        advice,
    }
}

/// Mean cores busy that make a job on several cores look serial.
const SERIAL_LOW: f64 = 0.75;
const SERIAL_HIGH: f64 = 1.25;

/// The findings of one job, most severe first.
pub fn evaluate(job: &JobFacts, t: &Thresholds) -> Vec<Finding> {
    let mut out = Vec::new();
    let ask = crate::manager::request_words(&job.manager);
    // CPU: a job without series is not judged.
    let cores_used = job.cores_used();
    if let Some(used) = cores_used.filter(|_| job.alloc_cpus > 0) {
        let efficiency = 100.0 * used / job.alloc_cpus as f64;
        // One core busy of several: a serial program, whatever the efficiency threshold.
        let serial = job.alloc_cpus >= 2 && (SERIAL_LOW..=SERIAL_HIGH).contains(&used);
        if serial {
            out.push(finding(
                "serial_code",
                Severity::Warning,
                format!(
                    "It kept {used:.1} of its {} CPU cores busy ({efficiency:.0}% CPU efficiency, near 1/{}): the program looks serial.",
                    job.alloc_cpus, job.alloc_cpus
                ),
                format!(
                    "Ask for one core ({}), or make the program use the others (threads, MPI ranks, a parallel library) if it can.",
                    ask.cores
                ),
            ));
        } else if efficiency < t.cpu_efficiency_below {
            out.push(finding(
                "cpu_efficiency",
                Severity::Warning,
                format!(
                    "It used {used:.1} of its {} CPU cores on average ({efficiency:.0}% CPU efficiency).",
                    job.alloc_cpus
                ),
                format!(
                    "Ask for fewer cores ({}), or check that the program really runs in parallel.",
                    ask.cores
                ),
            ));
        }
    }
    // Memory.
    let oom = job.state == "OUT_OF_MEMORY" || job.memory_fail_count.is_some_and(|n| n > 0.0);
    if oom {
        out.push(finding(
            "memory_exhausted",
            Severity::Critical,
            match job.memory_fail_count {
                Some(n) if n > 0.0 => format!(
                    "It hit its memory limit of {} ({n:.0} failed allocations).",
                    bytes(job.alloc_mem_bytes as f64)
                ),
                _ => format!(
                    "It was killed for using more than its {} of memory.",
                    bytes(job.alloc_mem_bytes as f64)
                ),
            },
            format!(
                "Ask for more memory ({}), or make the program use less.",
                ask.memory
            ),
        ));
    } else if let Some(peak) = job.memory_peak_bytes {
        let request = job.alloc_mem_bytes as f64;
        if job.ended && request >= t.memory_min_request_bytes && request > 0.0 {
            let pct = 100.0 * peak / request;
            if pct < t.memory_use_below {
                out.push(finding(
                    "memory_underused",
                    Severity::Info,
                    format!(
                        "Its memory peaked at {} of the {} it asked for ({pct:.0}%).",
                        bytes(peak),
                        bytes(request)
                    ),
                    match crate::manager::memory_request(&job.manager, peak * 1.25) {
                        Some(paste) => format!(
                            "Ask for less memory next time ({}): `{paste}` covers its peak and a quarter more; other jobs can then start on the node.",
                            ask.memory
                        ),
                        None => format!(
                            "Ask for less memory next time ({}): other jobs can then start on the node.",
                            ask.memory
                        ),
                    },
                ));
            }
        }
    }
    // GPUs.
    if job.alloc_gpus > 0 {
        match (job.gpu_utilization_max, job.mean_gpu_utilization) {
            (Some(max), _) if max <= 0.0 => out.push(finding(
                "gpu_unused",
                Severity::Critical,
                format!("It held {} GPU(s) and never used them.", job.alloc_gpus),
                format!(
                    "Do not ask for GPUs ({}) unless the program uses them; check that it finds CUDA.",
                    ask.gpus
                ),
            )),
            (Some(_), Some(mean)) if 100.0 * mean < t.gpu_utilization_below => out.push(finding(
                "gpu_low_use",
                Severity::Warning,
                format!(
                    "Its {} GPU(s) were busy {:.0}% of the time on average.",
                    job.alloc_gpus,
                    100.0 * mean
                ),
                format!(
                    "Ask for fewer GPUs ({}), or feed them more work (larger batches, more data loader workers).",
                    ask.gpus
                ),
            )),
            _ => {}
        }
    }
    // Cores and memory per GPU, beyond what the job used of them.
    if job.alloc_gpus > 0 {
        let gpus = job.alloc_gpus as f64;
        let per_gpu = job.alloc_cpus as f64 / gpus;
        if per_gpu > t.cores_per_gpu_above
            && cores_used.is_some_and(|u| u <= t.cores_per_gpu_above * gpus)
        {
            out.push(finding(
                "cores_per_gpu",
                Severity::Info,
                format!(
                    "It asked for {} cores for {} GPU(s), {per_gpu:.0} per GPU, and kept {:.1} busy.",
                    job.alloc_cpus,
                    job.alloc_gpus,
                    cores_used.unwrap_or_default()
                ),
                format!(
                    "Ask for at most {:.0} cores per GPU ({}): the other cores can serve jobs that need no GPU.",
                    t.cores_per_gpu_above, ask.cores
                ),
            ));
        }
        let mem_per_gpu = job.alloc_mem_bytes as f64 / gpus;
        if mem_per_gpu > t.memory_per_gpu_above_bytes
            && job
                .memory_peak_bytes
                .is_some_and(|p| p <= t.memory_per_gpu_above_bytes * gpus)
        {
            out.push(finding(
                "memory_per_gpu",
                Severity::Info,
                format!(
                    "It asked for {} of memory for {} GPU(s), {} per GPU, and peaked at {}.",
                    bytes(job.alloc_mem_bytes as f64),
                    job.alloc_gpus,
                    bytes(mem_per_gpu),
                    bytes(job.memory_peak_bytes.unwrap_or_default())
                ),
                format!(
                    "Ask for at most {} per GPU ({}): the rest of the node's memory can serve other jobs.",
                    bytes(t.memory_per_gpu_above_bytes),
                    ask.memory
                ),
            ));
        }
    }
    nodes(job, t, &ask, &mut out);
    // A small GPU job: a MIG slice would do.
    if let (1, true, Some(max), Some(mean), Some(peak)) = (
        job.alloc_gpus,
        job.ended,
        job.gpu_utilization_max,
        job.mean_gpu_utilization,
        job.gpu_memory_peak_bytes,
    ) {
        if max > 0.0 && 100.0 * mean < t.mig_utilization_below && peak <= t.mig_memory_bytes {
            out.push(finding(
                "mig_fit",
                Severity::Info,
                format!(
                    "It kept its GPU {:.0}% busy on average and used at most {} of its memory: a MIG slice of {} would have done.",
                    100.0 * mean,
                    bytes(peak),
                    bytes(t.mig_memory_bytes)
                ),
                match t.mig_request.as_str() {
                    "" => format!("Ask for a MIG slice instead of a whole GPU ({}; your admins name the slices): the rest of the GPU serves others.", ask.gpus),
                    request => format!("Ask for a MIG slice instead of a whole GPU (`{request}`): the rest of the GPU serves others."),
                },
            ));
        }
    }
    // Time limit.
    if let (true, Some(limit)) = (job.ended, job.time_limit_seconds) {
        if limit as f64 >= t.time_limit_min_seconds && job.state == "COMPLETED" {
            let pct = 100.0 * job.elapsed_seconds as f64 / limit as f64;
            if pct < t.time_limit_use_below {
                out.push(finding(
                    "time_limit_overestimated",
                    Severity::Info,
                    format!(
                        "It ran {} of the {} it asked for ({pct:.0}%).",
                        duration(job.elapsed_seconds),
                        duration(limit)
                    ),
                    match crate::manager::time_request(
                        &job.manager,
                        job.elapsed_seconds + job.elapsed_seconds / 2,
                    ) {
                        Some(paste) => format!(
                            "Ask for a shorter time ({}): `{paste}` covers its run time and a half; shorter jobs start sooner.",
                            ask.time
                        ),
                        None => format!(
                            "Ask for a shorter time ({}): shorter jobs start sooner.",
                            ask.time
                        ),
                    },
                ));
            }
        }
    }
    // Failures.
    if job.ended {
        let advice = match job.state.as_str() {
            "TIMEOUT" => Some(format!(
                "It reached its time limit: ask for more time ({}), or save checkpoints to restart from.",
                ask.time
            )),
            "FAILED" => Some("Read the job's error output; the exit code is the program's.".to_owned()),
            "NODE_FAIL" => Some(
                "A node failed under it: resubmit; tell the admins if it happens again.".to_owned(),
            ),
            "OUT_OF_MEMORY" => Some("See the memory finding.".to_owned()),
            _ => None,
        };
        if let Some(advice) = advice {
            out.push(finding(
                "job_failed",
                Severity::Warning,
                format!(
                    "It ended in state {} with exit code {}.",
                    job.state,
                    if job.exit_code.is_empty() {
                        "unknown"
                    } else {
                        &job.exit_code
                    }
                ),
                advice,
            ));
        }
    }
    // Energy, in words, only where a power source measured it.
    let joules = job.host_energy_joules + job.gpu_energy_joules;
    let energy_seen = measured::has(job.measured, measured::HOST_ENERGY | measured::GPU_ENERGY);
    if joules > 0.0 && energy_seen {
        let kwh = joules / 3.6e6;
        let km = job.emissions_grams / t.car_grams_per_km;
        out.push(finding(
            "energy",
            Severity::Info,
            match measured::has(job.measured, measured::EMISSIONS) {
                true => format!(
                    "It used {kwh:.3} kWh and emitted {:.0} g CO2e: about {km:.1} km by car (at {:.0} g CO2e/km).",
                    job.emissions_grams, t.car_grams_per_km
                ),
                false => format!("It used {kwh:.3} kWh."),
            },
            "Efficient jobs use less energy for the same science.".to_owned(),
        ));
    }
    out.sort_by_key(|f| std::cmp::Reverse(f.severity));
    out
}

/// Busiest node's CPU seconds under which a multi-node job is not judged for idle nodes: a
/// job that did little did it on no node in particular.
const IDLE_NODES_MIN_BUSY_SECONDS: f64 = 60.0;

/// Multi-node jobs: nodes that did nothing, and cores or GPUs spread thin over nodes.
fn nodes(
    job: &JobFacts,
    t: &Thresholds,
    ask: &crate::manager::RequestWords,
    out: &mut Vec<Finding>,
) {
    let count = job.node_count();
    if count < 2 {
        return;
    }
    let busiest = job
        .node_cpu_seconds
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((top, top_seconds)) = busiest.filter(|b| b.1 >= IDLE_NODES_MIN_BUSY_SECONDS) {
        let idle: Vec<&(String, f64)> = job
            .node_cpu_seconds
            .iter()
            .filter(|(_, s)| *s < t.idle_node_share_below * top_seconds)
            .collect();
        if !idle.is_empty() {
            let listed: Vec<String> = idle
                .iter()
                .take(10)
                .map(|(n, s)| format!("{n} ({s:.1} CPU core-seconds)"))
                .collect();
            out.push(finding(
                "idle_nodes",
                Severity::Warning,
                format!(
                    "{} of its {count} nodes did almost nothing: {}{}, against {top_seconds:.0} on {top}.",
                    idle.len(),
                    listed.join(", "),
                    if idle.len() > 10 { ", …" } else { "" }
                ),
                "Check that the program starts on every node it asks for (srun, or mpirun with the job's host list), or ask for fewer nodes.".to_owned(),
            ));
        }
    }
    let per_node = job.alloc_cpus as f64 / count as f64;
    let (what, amount, per) = match job.alloc_gpus {
        0 if per_node <= t.thin_spread_cores_per_node => ("cores", job.alloc_cpus, per_node),
        g if g >= 2 && g as f64 / count as f64 <= 1.0 => ("GPUs", g, g as f64 / count as f64),
        _ => return,
    };
    out.push(finding(
        "thin_spread",
        Severity::Info,
        format!("It spread {amount} {what} over {count} nodes ({per:.1} per node)."),
        format!(
            "Ask for them on fewer nodes ({}, with the nodes' count): work within a node talks faster, and whole nodes stay free for jobs that need them.",
            if what == "GPUs" { ask.gpus } else { ask.cores }
        ),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(job: &JobFacts) -> Vec<String> {
        evaluate(job, &Thresholds::default())
            .into_iter()
            .map(|f| f.id)
            .collect()
    }

    fn ended(state: &str) -> JobFacts {
        JobFacts {
            state: state.into(),
            exit_code: "0:0".into(),
            ended: true,
            elapsed_seconds: 3600,
            time_limit_seconds: Some(7200),
            alloc_cpus: 4,
            alloc_mem_bytes: 4 << 30,
            aggregated_seconds: 3600,
            cpu_seconds: 4.0 * 3600.0,
            memory_peak_bytes: Some(3.0 * (1u64 << 30) as f64),
            measured: 31,
            ..Default::default()
        }
    }

    #[test]
    fn a_job_is_not_judged_on_cpu_or_energy_prometheus_never_gave() {
        // Six seconds into a busy job: one sample, no CPU time yet.
        let young = JobFacts {
            ended: false,
            state: "RUNNING".into(),
            aggregated_seconds: 6,
            cpu_seconds: 0.0,
            measured: 0,
            ..ended("RUNNING")
        };
        assert!(!ids(&young).contains(&"cpu_efficiency".to_owned()));
        let judged = JobFacts {
            measured: measured::CPU,
            ..young.clone()
        };
        assert!(ids(&judged).contains(&"cpu_efficiency".to_owned()));
        // No power source: no energy line, even with a stray non-zero sum.
        let unpowered = JobFacts {
            host_energy_joules: 1.0,
            measured: measured::CPU,
            ..ended("COMPLETED")
        };
        assert!(!ids(&unpowered).contains(&"energy".to_owned()));
        // Power without an emission factor: the energy alone.
        let no_factor = JobFacts {
            host_energy_joules: 3.6e6,
            measured: measured::CPU | measured::HOST_ENERGY,
            ..ended("COMPLETED")
        };
        let said = evaluate(&no_factor, &Thresholds::default());
        let energy = said.iter().find(|f| f.id == "energy").unwrap();
        assert_eq!(energy.message, "It used 1.000 kWh.");
    }

    #[test]
    fn a_severity_s_name_is_the_one_stored_and_served() {
        for s in [Severity::Info, Severity::Warning, Severity::Critical] {
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!("\"{}\"", s.name())
            );
        }
    }

    #[test]
    fn zero_elapsed_time_and_no_figures_give_no_nan_and_no_cpu_verdict() {
        let empty = JobFacts {
            state: "COMPLETED".into(),
            ended: true,
            alloc_cpus: 8,
            time_limit_seconds: Some(7200),
            ..Default::default()
        };
        let f = evaluate(&empty, &Thresholds::default());
        // Nothing ran, so only the unused time limit is said, and said in numbers.
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].id, "time_limit_overestimated");
        assert!(
            f[0].message
                .contains("0 s of the 2 h 0 min it asked for (0%)"),
            "{}",
            f[0].message
        );
        assert!(f
            .iter()
            .all(|f| !f.message.contains("NaN") && !f.message.contains("inf")));
        assert!(evaluate(&JobFacts::default(), &Thresholds::default()).is_empty());
    }

    #[test]
    fn a_busy_well_sized_job_has_no_finding() {
        assert!(ids(&ended("COMPLETED")).is_empty());
    }

    #[test]
    fn cpu_efficiency_needs_data_and_counts_only_covered_time() {
        let mut j = ended("COMPLETED");
        j.cpu_seconds = 0.6 * 3600.0; // 0.6 of 4 cores: 15%
        let f = evaluate(&j, &Thresholds::default());
        assert_eq!(f[0].id, "cpu_efficiency");
        assert!(
            f[0].message.contains("0.6 of its 4 CPU cores"),
            "{}",
            f[0].message
        );
        assert!(f[0].message.contains("15%"), "{}", f[0].message);
        // Zero elapsed / no series: not judged.
        j.aggregated_seconds = 0;
        assert!(!ids(&j).contains(&"cpu_efficiency".to_owned()));
        // A running job is judged on what it did so far.
        let mut running = ended("RUNNING");
        running.ended = false;
        running.cpu_seconds = 0.1 * 3600.0;
        assert_eq!(ids(&running), ["cpu_efficiency"]);
        // Threshold from the configuration.
        let mut j = ended("COMPLETED");
        j.cpu_seconds = 1.4 * 3600.0; // 35%
        assert!(ids(&j).is_empty());
        let strict = Thresholds {
            cpu_efficiency_below: 50.0,
            ..Default::default()
        };
        assert_eq!(evaluate(&j, &strict)[0].id, "cpu_efficiency");
    }

    #[test]
    fn one_core_busy_of_several_is_serial_code_and_not_also_low_efficiency() {
        let mut j = ended("COMPLETED");
        j.cpu_seconds = 3600.0; // 1.0 of 4 cores: 25%, near 1/4
        let f = evaluate(&j, &Thresholds::default());
        assert_eq!(
            f.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(),
            ["serial_code"]
        );
        assert!(
            f[0].message
                .contains("kept 1.0 of its 4 CPU cores busy (25% CPU efficiency, near 1/4)"),
            "{}",
            f[0].message
        );
        assert!(f[0].advice.contains("-c / --ntasks"), "{}", f[0].advice);
        // Two cores busy of four, or one core asked for and busy: not serial.
        for (cpus, used) in [(4, 2.0), (1, 1.0)] {
            let j = JobFacts {
                alloc_cpus: cpus,
                cpu_seconds: used * 3600.0,
                ..ended("COMPLETED")
            };
            assert!(
                !ids(&j).contains(&"serial_code".to_owned()),
                "{cpus} {used}"
            );
        }
        // No CPU series: no verdict.
        let unseen = JobFacts {
            cpu_seconds: 3600.0,
            measured: 0,
            ..ended("COMPLETED")
        };
        assert!(!ids(&unseen).contains(&"serial_code".to_owned()));
    }

    #[test]
    fn a_gpu_job_asking_for_more_cores_or_memory_per_gpu_than_it_used_is_told_the_site_s_bound() {
        let gib = (1u64 << 30) as f64;
        let job = JobFacts {
            alloc_cpus: 64,
            alloc_gpus: 2,
            alloc_mem_bytes: 512 << 30,
            cpu_seconds: 20.0 * 3600.0, // 20 cores busy of 64, under 16 per GPU
            memory_peak_bytes: Some(100.0 * gib),
            mean_gpu_utilization: Some(0.9),
            gpu_utilization_max: Some(1.0),
            ..ended("COMPLETED")
        };
        let f = evaluate(&job, &Thresholds::default());
        let cores = f.iter().find(|f| f.id == "cores_per_gpu").unwrap();
        assert_eq!(
            cores.message,
            "It asked for 64 cores for 2 GPU(s), 32 per GPU, and kept 20.0 busy."
        );
        assert!(cores.advice.starts_with("Ask for at most 16 cores per GPU"));
        let memory = f.iter().find(|f| f.id == "memory_per_gpu").unwrap();
        assert_eq!(
            memory.message,
            "It asked for 512.0 GiB of memory for 2 GPU(s), 256.0 GiB per GPU, and peaked at 100.0 GiB."
        );
        // The cores were busy, the memory used: nothing to say.
        let busy = JobFacts {
            cpu_seconds: 60.0 * 3600.0,
            memory_peak_bytes: Some(400.0 * gib),
            ..job.clone()
        };
        let said = ids(&busy);
        assert!(!said.contains(&"cores_per_gpu".to_owned()), "{said:?}");
        assert!(!said.contains(&"memory_per_gpu".to_owned()), "{said:?}");
        // Within the bounds: nothing either.
        let small = JobFacts {
            alloc_cpus: 16,
            alloc_mem_bytes: 64 << 30,
            cpu_seconds: 8.0 * 3600.0,
            memory_peak_bytes: Some(40.0 * gib),
            ..job
        };
        let said = ids(&small);
        assert!(
            !said.contains(&"cores_per_gpu".to_owned())
                && !said.contains(&"memory_per_gpu".to_owned()),
            "{said:?}"
        );
    }

    #[test]
    fn a_node_of_a_multi_node_job_that_did_nothing_is_named_with_its_figures() {
        let two = |n2: f64| JobFacts {
            nodes: "n1,n2".into(),
            alloc_cpus: 8,
            cpu_seconds: 4.0 * 3600.0,
            node_cpu_seconds: vec![("n1".into(), 4.0 * 3600.0), ("n2".into(), n2)],
            ..ended("COMPLETED")
        };
        let f = evaluate(&two(3.0), &Thresholds::default());
        let idle = f.iter().find(|f| f.id == "idle_nodes").unwrap();
        assert_eq!(idle.severity, Severity::Warning);
        assert_eq!(
            idle.message,
            "1 of its 2 nodes did almost nothing: n2 (3.0 CPU core-seconds), against 14400 on n1."
        );
        // Both nodes busy; no per-node figures; a job that did little anywhere: not said.
        assert!(!ids(&two(3600.0)).contains(&"idle_nodes".to_owned()));
        let unknown = JobFacts {
            node_cpu_seconds: vec![],
            ..two(0.0)
        };
        assert!(!ids(&unknown).contains(&"idle_nodes".to_owned()));
        let little = JobFacts {
            node_cpu_seconds: vec![("n1".into(), 30.0), ("n2".into(), 0.0)],
            ..two(0.0)
        };
        assert!(!ids(&little).contains(&"idle_nodes".to_owned()));
    }

    #[test]
    fn cores_or_gpus_spread_one_or_two_per_node_are_said_once_per_job() {
        let spread = |cpus: i64, gpus: i64, nodes: &str| JobFacts {
            nodes: nodes.into(),
            alloc_cpus: cpus,
            alloc_gpus: gpus,
            cpu_seconds: cpus as f64 * 3600.0,
            mean_gpu_utilization: Some(0.9),
            gpu_utilization_max: Some(1.0),
            ..ended("COMPLETED")
        };
        let f = evaluate(&spread(4, 0, "n1,n2,n3,n4"), &Thresholds::default());
        let thin = f.iter().find(|f| f.id == "thin_spread").unwrap();
        assert_eq!(
            thin.message,
            "It spread 4 cores over 4 nodes (1.0 per node)."
        );
        assert!(thin.advice.contains("-c / --ntasks"), "{}", thin.advice);
        let gpus = evaluate(&spread(64, 4, "n1,n2,n3,n4"), &Thresholds::default());
        let thin = gpus.iter().find(|f| f.id == "thin_spread").unwrap();
        assert_eq!(
            thin.message,
            "It spread 4 GPUs over 4 nodes (1.0 per node)."
        );
        for packed in [
            spread(64, 0, "n1,n2"),
            spread(4, 0, "n1"),
            spread(64, 8, "n1,n2"),
        ] {
            assert!(
                !ids(&packed).contains(&"thin_spread".to_owned()),
                "{packed:?}"
            );
        }
    }

    #[test]
    fn a_small_one_gpu_job_is_told_a_mig_slice_would_do() {
        let gib = (1u64 << 30) as f64;
        let small = JobFacts {
            alloc_gpus: 1,
            mean_gpu_utilization: Some(0.08),
            gpu_utilization_max: Some(0.4),
            gpu_memory_peak_bytes: Some(6.0 * gib),
            ..ended("COMPLETED")
        };
        let f = evaluate(&small, &Thresholds::default());
        let mig = f.iter().find(|f| f.id == "mig_fit").unwrap();
        assert_eq!(
            mig.message,
            "It kept its GPU 8% busy on average and used at most 6.0 GiB of its memory: a MIG slice of 10.0 GiB would have done."
        );
        assert!(mig.advice.contains("--gres=gpu"), "{}", mig.advice);
        let named = Thresholds {
            mig_request: "--gres=gpu:1g.10gb:1".into(),
            ..Default::default()
        };
        let f = evaluate(&small, &named);
        assert!(f
            .iter()
            .any(|f| f.id == "mig_fit" && f.advice.contains("`--gres=gpu:1g.10gb:1`")));
        // Too much memory, a busy GPU, two GPUs, an unused GPU, no memory figure, no MIG: no.
        for other in [
            JobFacts {
                gpu_memory_peak_bytes: Some(30.0 * gib),
                ..small.clone()
            },
            JobFacts {
                mean_gpu_utilization: Some(0.6),
                ..small.clone()
            },
            JobFacts {
                alloc_gpus: 2,
                ..small.clone()
            },
            JobFacts {
                gpu_utilization_max: Some(0.0),
                mean_gpu_utilization: Some(0.0),
                ..small.clone()
            },
            JobFacts {
                gpu_memory_peak_bytes: None,
                ..small.clone()
            },
        ] {
            assert!(!ids(&other).contains(&"mig_fit".to_owned()), "{other:?}");
        }
        let no_mig = Thresholds {
            mig_memory_bytes: 0.0,
            ..Default::default()
        };
        assert!(!evaluate(&small, &no_mig).iter().any(|f| f.id == "mig_fit"));
    }

    #[test]
    fn memory_underuse_oom_and_missing_figures() {
        let mut j = ended("COMPLETED");
        j.memory_peak_bytes = Some(100.0 * 1024.0 * 1024.0);
        let f = evaluate(&j, &Thresholds::default());
        assert_eq!(f[0].id, "memory_underused");
        assert!(
            f[0].message.contains("100.0 MiB of the 4.0 GiB"),
            "{}",
            f[0].message
        );
        // The request to paste: its peak and a quarter, rounded up, in Slurm's syntax.
        assert!(f[0].advice.contains("`--mem=256M`"), "{}", f[0].advice);
        // Small requests are not judged, nor requests with no memory figure.
        j.alloc_mem_bytes = 512 << 20;
        assert!(ids(&j).is_empty());
        j.alloc_mem_bytes = 0;
        assert!(ids(&j).is_empty());
        // No series: no peak, nothing to say.
        let mut j = ended("COMPLETED");
        j.memory_peak_bytes = None;
        assert!(ids(&j).is_empty());
        // Out of memory, by state or by the cgroup's fail count.
        let oom = ended("OUT_OF_MEMORY");
        assert_eq!(ids(&oom), ["memory_exhausted", "job_failed"]);
        let mut fails = ended("COMPLETED");
        fails.memory_fail_count = Some(3.0);
        let f = evaluate(&fails, &Thresholds::default());
        assert_eq!(f[0].severity, Severity::Critical);
        assert!(f[0].message.contains("3 failed allocations"));
    }

    #[test]
    fn gpus_never_used_or_little_used() {
        let mut j = ended("COMPLETED");
        j.alloc_gpus = 2;
        j.gpu_utilization_max = Some(0.0);
        j.mean_gpu_utilization = Some(0.0);
        assert_eq!(ids(&j), ["gpu_unused"]);
        j.gpu_utilization_max = Some(0.5);
        j.mean_gpu_utilization = Some(0.05);
        let f = evaluate(&j, &Thresholds::default());
        assert_eq!(f[0].id, "gpu_low_use");
        assert!(f[0].message.contains("busy 5%"));
        // No GPU series (no exporter support): not judged.
        j.gpu_utilization_max = None;
        j.mean_gpu_utilization = None;
        assert!(ids(&j).is_empty());
    }

    #[test]
    fn time_limit_and_failures() {
        let mut j = ended("COMPLETED");
        j.time_limit_seconds = Some(24 * 3600);
        let f = evaluate(&j, &Thresholds::default());
        assert_eq!(f[0].id, "time_limit_overestimated");
        assert!(
            f[0].message.contains("1 h 0 min of the 24 h 0 min"),
            "{}",
            f[0].message
        );
        // An hour's run: an hour and a half to ask for.
        assert!(f[0].advice.contains("`--time=01:30:00`"), "{}", f[0].advice);
        j.manager = "openpbs".into();
        let pbs = evaluate(&j, &Thresholds::default());
        assert!(
            pbs[0].advice.contains("`-l walltime=01:30:00`"),
            "{}",
            pbs[0].advice
        );
        // Short or absent limits, and running jobs, are not judged.
        j.time_limit_seconds = Some(1800);
        assert!(ids(&j).is_empty());
        j.time_limit_seconds = None;
        assert!(ids(&j).is_empty());
        let mut running = ended("RUNNING");
        running.ended = false;
        running.time_limit_seconds = Some(24 * 3600);
        assert!(ids(&running).is_empty());

        let mut failed = ended("FAILED");
        failed.exit_code = "1:0".into();
        let f = evaluate(&failed, &Thresholds::default());
        assert_eq!(f[0].id, "job_failed");
        assert!(f[0].message.contains("FAILED with exit code 1:0"));
        let timeout = ended("TIMEOUT");
        assert!(evaluate(&timeout, &Thresholds::default())[0]
            .advice
            .contains("time limit"));
        assert!(ids(&ended("CANCELLED")).is_empty());
    }

    #[test]
    fn advice_is_in_the_words_of_the_job_s_manager() {
        let mut j = ended("TIMEOUT");
        j.cpu_seconds = 0.1 * 3600.0;
        j.memory_fail_count = Some(1.0);
        j.alloc_gpus = 1;
        j.gpu_utilization_max = Some(0.0);
        let advice = |manager: &str| {
            let job = JobFacts {
                manager: manager.into(),
                ..j.clone()
            };
            evaluate(&job, &Thresholds::default())
                .into_iter()
                .map(|f| (f.id, f.advice))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let slurm = advice("slurm");
        assert!(
            slurm["cpu_efficiency"].contains("(-c / --ntasks)"),
            "{slurm:?}"
        );
        assert!(slurm["job_failed"].contains("--time"), "{slurm:?}");
        assert_eq!(advice(""), slurm, "Slurm's words are the default");
        let pod = advice("k8s");
        assert!(
            pod["cpu_efficiency"].contains("resources.requests.cpu"),
            "{pod:?}"
        );
        assert!(pod["memory_exhausted"].contains("limits.memory"), "{pod:?}");
        assert!(pod["gpu_unused"].contains("nvidia.com/gpu"), "{pod:?}");
        let lsf = advice("lsf");
        assert!(lsf["cpu_efficiency"].contains("bsub -n"), "{lsf:?}");
        assert!(lsf["job_failed"].contains("bsub -W"), "{lsf:?}");
        let pbs = advice("openpbs");
        assert!(pbs["cpu_efficiency"].contains(":ncpus="), "{pbs:?}");
        assert!(pbs["gpu_unused"].contains(":ngpus="), "{pbs:?}");
        assert!(pbs["job_failed"].contains("walltime"), "{pbs:?}");
        let vm = advice("libvirt");
        assert!(vm["cpu_efficiency"].contains("flavor"), "{vm:?}");
        for (manager, said) in [
            ("k8s", &pod),
            ("lsf", &lsf),
            ("openpbs", &pbs),
            ("libvirt", &vm),
        ] {
            assert!(
                said.values().all(|a| !a.contains("--ntasks")
                    && !a.contains("--gres")
                    && !a.contains("--mem")),
                "{manager}: Slurm's words in {said:?}"
            );
        }
    }

    #[test]
    fn energy_is_stated_with_the_car_factor() {
        let mut j = ended("COMPLETED");
        j.host_energy_joules = 3.6e6 * 2.5;
        j.emissions_grams = 216.0;
        let f = evaluate(&j, &Thresholds::default());
        assert_eq!(f[0].id, "energy");
        assert_eq!(
            f[0].message,
            "It used 2.500 kWh and emitted 216 g CO2e: about 2.0 km by car (at 108 g CO2e/km)."
        );
    }
}
