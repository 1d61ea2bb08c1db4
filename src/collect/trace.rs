//! Job tracing (`--web.trace-path`): job wrappers (`examples/trace/ceems-trace.py`) POST
//! per-process samples; they become `ceems_trace_*` series until they are older than the TTL.
//! Bodies are bounded, strictly typed, and the number of traced jobs is capped.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::metrics::{Labels, MetricSet};

/// Largest accepted body.
pub const MAX_BODY: usize = 1 << 20;

/// One process of a job, as a wrapper saw it.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProcessSample {
    pub pid: u32,
    pub cpu_percent: f64,
    pub rss_bytes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub threads: u64,
}

/// What a wrapper POSTs.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TraceReport {
    pub job_id: String,
    pub samples: Vec<ProcessSample>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TraceError {
    #[error("body is larger than {MAX_BODY} bytes")]
    TooLarge,
    #[error("invalid trace report: {0}")]
    Invalid(String),
    #[error("already tracing {0} jobs; try again when one has expired")]
    TooManyJobs(usize),
}

/// Parses and checks a POSTed body.
pub fn parse_report(body: &[u8]) -> Result<TraceReport, TraceError> {
    if body.len() > MAX_BODY {
        return Err(TraceError::TooLarge);
    }
    let r: TraceReport =
        serde_json::from_slice(body).map_err(|e| TraceError::Invalid(e.to_string()))?;
    if r.job_id.is_empty()
        || r.job_id.len() > 64
        || !r
            .job_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(TraceError::Invalid(format!(
            "job_id `{}` is not a job id",
            r.job_id
        )));
    }
    for s in &r.samples {
        if !s.cpu_percent.is_finite() || s.cpu_percent < 0.0 {
            return Err(TraceError::Invalid(format!(
                "pid {}: cpu_percent must be a number of 0 or more",
                s.pid
            )));
        }
    }
    Ok(r)
}

/// The latest report of each traced job.
#[derive(Debug, Clone, Serialize)]
pub struct TraceEntry {
    pub job_id: String,
    pub age_seconds: f64,
    pub samples: Vec<ProcessSample>,
}

pub struct TraceStore {
    ttl: Duration,
    max_jobs: usize,
    hostname: String,
    jobs: Mutex<HashMap<String, (Instant, Vec<ProcessSample>)>>,
}

impl TraceStore {
    pub fn new(ttl: Duration, max_jobs: usize, hostname: &str) -> TraceStore {
        TraceStore {
            ttl,
            max_jobs,
            hostname: hostname.to_owned(),
            jobs: Mutex::new(HashMap::new()),
        }
    }

    fn expire(&self, jobs: &mut HashMap<String, (Instant, Vec<ProcessSample>)>) {
        jobs.retain(|_, (at, _)| at.elapsed() < self.ttl);
    }

    /// Stores a report: a job already traced is updated; a new one beyond the cap is refused.
    pub fn record(&self, report: TraceReport) -> Result<(), TraceError> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        self.expire(&mut jobs);
        if !jobs.contains_key(&report.job_id) && jobs.len() >= self.max_jobs {
            return Err(TraceError::TooManyJobs(self.max_jobs));
        }
        jobs.insert(report.job_id, (Instant::now(), report.samples));
        Ok(())
    }

    /// The current entries, by job id.
    pub fn entries(&self) -> Vec<TraceEntry> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        self.expire(&mut jobs);
        let mut out: Vec<TraceEntry> = jobs
            .iter()
            .map(|(id, (at, samples))| TraceEntry {
                job_id: id.clone(),
                age_seconds: at.elapsed().as_secs_f64(),
                samples: samples.clone(),
            })
            .collect();
        out.sort_by(|a, b| a.job_id.cmp(&b.job_id));
        out
    }

    /// The `ceems_trace_*` series of the entries still alive.
    pub fn emit(&self, out: &mut MetricSet) {
        for e in self.entries() {
            for s in &e.samples {
                let pid = s.pid.to_string();
                let labels = Labels::new(&[
                    ("hostname", &self.hostname),
                    ("pid", &pid),
                    ("uuid", &e.job_id),
                ]);
                out.gauge(
                    "ceems_trace_cpu_percent",
                    "CPU use of a traced job process in percent of one core",
                    labels.clone(),
                    s.cpu_percent,
                );
                out.gauge(
                    "ceems_trace_rss_bytes",
                    "Resident memory of a traced job process in bytes",
                    labels.clone(),
                    s.rss_bytes as f64,
                );
                out.gauge(
                    "ceems_trace_threads",
                    "Threads of a traced job process",
                    labels.clone(),
                    s.threads as f64,
                );
                out.counter(
                    "ceems_trace_read_bytes_total",
                    "Bytes a traced job process has read",
                    labels.clone(),
                    s.read_bytes as f64,
                );
                out.counter(
                    "ceems_trace_write_bytes_total",
                    "Bytes a traced job process has written",
                    labels,
                    s.write_bytes as f64,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"job_id":"42","samples":[{"pid":7,"cpu_percent":99.5,"rss_bytes":1048576,"read_bytes":0,"write_bytes":4096,"threads":2}]}"#;

    #[test]
    fn reports_are_strict() {
        assert_eq!(parse_report(GOOD.as_bytes()).unwrap().samples[0].pid, 7);
        let unknown = GOOD.replace("\"threads\"", "\"thread_count\"");
        assert!(matches!(
            parse_report(unknown.as_bytes()),
            Err(TraceError::Invalid(_))
        ));
        let text = GOOD.replace("99.5", "\"high\"");
        assert!(matches!(
            parse_report(text.as_bytes()),
            Err(TraceError::Invalid(_))
        ));
        let negative = GOOD.replace("\"rss_bytes\":1048576", "\"rss_bytes\":-1");
        assert!(parse_report(negative.as_bytes()).is_err());
        let bad_id = GOOD.replace("\"42\"", "\"4 2\"");
        assert!(parse_report(bad_id.as_bytes()).is_err());
        assert_eq!(
            parse_report(&vec![b' '; MAX_BODY + 1]),
            Err(TraceError::TooLarge)
        );
    }

    #[test]
    fn cap_and_expiry() {
        let store = TraceStore::new(Duration::from_millis(200), 2, "n");
        let report = |id: &str| TraceReport {
            job_id: id.into(),
            samples: Vec::new(),
        };
        store.record(report("1")).unwrap();
        store.record(report("2")).unwrap();
        // An update of a traced job is fine; a third job is not.
        store.record(report("1")).unwrap();
        assert_eq!(store.record(report("3")), Err(TraceError::TooManyJobs(2)));
        std::thread::sleep(Duration::from_millis(250));
        assert!(store.entries().is_empty());
        store.record(report("3")).unwrap();
    }

    proptest::proptest! {
        #[test]
        fn never_panics(data in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = parse_report(&data);
        }
    }
}
