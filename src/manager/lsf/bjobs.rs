//! What LSF says of the jobs on this node: the names of their cgroup directories, and
//! `bjobs -u all -m <host> -json -o "jobid jobindex alloc_slot nalloc_slot gpu_alloc"`, from
//! which a job's CPUs and GPUs on this host are read.

use std::collections::BTreeSet;

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BjobsError {
    #[error("bjobs -json: not a JSON document: {0}")]
    Json(String),
    #[error("bjobs -json: record {index}: {message}")]
    Record { index: usize, message: String },
}

/// The job id of an LSF job cgroup directory, `job.<id>[<index>].<internal id>.<timestamp>…`
/// (`job.42.34071.1775289779`, `job.42[2].34071.1775289779`): `42` or `42[2]`.
pub fn job_of_cgroup(name: &str) -> Option<String> {
    let rest = name.strip_prefix("job.")?;
    let (id, rest) = rest.split_once('.')?;
    let (number, index) = match id.split_once('[') {
        Some((n, i)) => (n, Some(i.strip_suffix(']')?)),
        None => (id, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(number) || !index.is_none_or(digits) {
        return None;
    }
    // The internal id and the timestamp follow; anything may come after them.
    let mut tail = rest.splitn(3, '.');
    let (internal, stamp) = (tail.next()?, tail.next()?);
    (digits(internal) && digits(stamp)).then(|| id.to_owned())
}

/// The GPUs a job holds on this host, as `GPU_ALLOC` gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobGpus {
    None,
    /// Whole GPUs by their minor numbers.
    Minors(BTreeSet<u32>),
    /// MIG instances (`2:1/0` entries): which ones is only in the job's processes'
    /// `CUDA_VISIBLE_DEVICES`.
    Mig,
}

/// One job of `bjobs` with what it holds on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BjobsJob {
    /// `JOBID`, or `JOBID[JOBINDEX]` for an array element.
    pub uuid: String,
    /// Slots on this host.
    pub cpus: u32,
    pub gpus: JobGpus,
}

#[derive(Debug, Deserialize)]
struct Document {
    #[serde(rename = "RECORDS", default)]
    records: Vec<Record>,
}

#[derive(Debug, Deserialize)]
struct Record {
    #[serde(rename = "JOBID")]
    job_id: Value,
    #[serde(rename = "JOBINDEX", default)]
    job_index: Value,
    #[serde(rename = "ALLOC_SLOT", default)]
    alloc_slot: Value,
    #[serde(rename = "GPU_ALLOC", default)]
    gpu_alloc: Value,
}

/// A field that LSF prints as a string or a number.
fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.trim().to_owned()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Whether `entry` (a host of `ALLOC_SLOT` or `GPU_ALLOC`) names `host`: the same name, or
/// one is the other's short name (`node1` and `node1.example.org`). Not a substring match:
/// `node1` is not `node10`.
fn same_host(entry: &str, host: &str) -> bool {
    let short = |s: &str| s.split('.').next().unwrap_or(s).to_owned();
    entry == host
        || (entry.starts_with(host) && entry[host.len()..].starts_with('.'))
        || (host.starts_with(entry) && host[entry.len()..].starts_with('.'))
        || (!host.is_empty() && short(entry) == host)
}

/// The GPUs of `gpu_alloc` (`host:m1,m2;host2:…`, one entry per process) on `host`.
fn gpus_on(gpu_alloc: &str, host: &str) -> Result<JobGpus, String> {
    for entry in gpu_alloc
        .split(';')
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let Some((entry_host, devices)) = entry.split_once(':') else {
            return Err(format!("GPU_ALLOC entry `{entry}` has no host"));
        };
        if !same_host(entry_host, host) {
            continue;
        }
        if devices.contains('/') {
            return Ok(JobGpus::Mig);
        }
        let minors = devices
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(|d| {
                d.parse::<u32>()
                    .map_err(|_| format!("GPU_ALLOC: `{d}` is not a GPU number"))
            })
            .collect::<Result<BTreeSet<u32>, String>>()?;
        return Ok(if minors.is_empty() {
            JobGpus::None
        } else {
            JobGpus::Minors(minors)
        });
    }
    Ok(JobGpus::None)
}

/// The jobs of a `bjobs -json` document with what each holds on `host`.
pub fn parse(json: &str, host: &str) -> Result<Vec<BjobsJob>, BjobsError> {
    let doc: Document = serde_json::from_str(json).map_err(|e| BjobsError::Json(e.to_string()))?;
    doc.records
        .iter()
        .enumerate()
        .map(|(index, r)| {
            let bad = |message: String| BjobsError::Record { index, message };
            let id = text(&r.job_id)
                .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| bad(format!("JOBID {} is not a job number", r.job_id)))?;
            let uuid = match text(&r.job_index).as_deref() {
                None | Some("") | Some("0") => id,
                Some(i) if i.bytes().all(|b| b.is_ascii_digit()) => format!("{id}[{i}]"),
                Some(i) => return Err(bad(format!("JOBINDEX `{i}` is not a number"))),
            };
            let slots = text(&r.alloc_slot).unwrap_or_default();
            let cpus = slots
                .split(':')
                .filter(|h| same_host(h.trim(), host))
                .count();
            let gpus = gpus_on(&text(&r.gpu_alloc).unwrap_or_default(), host).map_err(bad)?;
            Ok(BjobsJob {
                uuid,
                cpus: u32::try_from(cpus).unwrap_or(u32::MAX),
                gpus,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CEEMS's `testdata/bjobs` document, as its e2e scenarios print it.
    const CEEMS_BJOBS: &str = include_str!("../../../tests/fixtures/lsf/bjobs-ceems.json");

    #[test]
    fn ceems_fixture_gives_its_expected_cpus_and_gpus() {
        let jobs = parse(CEEMS_BJOBS, "testhost-1").unwrap();
        let minors = |v: &[u32]| JobGpus::Minors(v.iter().copied().collect());
        assert_eq!(
            jobs,
            [
                BjobsJob {
                    uuid: "1009248".into(),
                    cpus: 6,
                    gpus: JobGpus::Mig
                },
                BjobsJob {
                    uuid: "1009249".into(),
                    cpus: 4,
                    gpus: minors(&[0, 1])
                },
                BjobsJob {
                    uuid: "1009250".into(),
                    cpus: 4,
                    gpus: minors(&[1, 4])
                },
            ]
        );
        // The other host of job 1009249 sees its own half.
        let other = parse(CEEMS_BJOBS, "testhost-2.example.com").unwrap();
        assert_eq!((other[1].cpus, other[0].cpus), (4, 0));
    }

    #[test]
    fn array_elements_numbers_and_host_names() {
        let doc = r#"{"RECORDS":[{"JOBID":42,"JOBINDEX":2,"ALLOC_SLOT":"node1:node10:node1.example.org","GPU_ALLOC":""}]}"#;
        let jobs = parse(doc, "node1").unwrap();
        assert_eq!((jobs[0].uuid.as_str(), jobs[0].cpus), ("42[2]", 2));
        assert_eq!(jobs[0].gpus, JobGpus::None);
        assert!(parse(r#"{"RECORDS":[]}"#, "n").unwrap().is_empty());
    }

    #[test]
    fn malformed_documents_say_what_is_wrong() {
        assert!(matches!(
            parse("bjobs: not found", "n"),
            Err(BjobsError::Json(_))
        ));
        for bad in [
            r#"{"RECORDS":[{"JOBID":"x1"}]}"#,
            r#"{"RECORDS":[{"JOBID":"1","JOBINDEX":"a"}]}"#,
            r#"{"RECORDS":[{"JOBID":"1","GPU_ALLOC":"n:zero"}]}"#,
            r#"{"RECORDS":[{"JOBID":"1","GPU_ALLOC":"nohost"}]}"#,
        ] {
            let e = parse(bad, "n").unwrap_err();
            assert!(
                matches!(e, BjobsError::Record { index: 0, .. }),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn job_cgroup_names() {
        assert_eq!(
            job_of_cgroup("job.1009248.35399.1775318419").as_deref(),
            Some("1009248")
        );
        assert_eq!(
            job_of_cgroup("job.42[2].34071.1775289779").as_deref(),
            Some("42[2]")
        );
        assert_eq!(
            job_of_cgroup("job.9.30675.1775295256.extra").as_deref(),
            Some("9")
        );
        for name in [
            "job.42",
            "job.42.1",
            "job.x.1.2",
            "job.42[].1.2",
            "job.42[a].1.2",
            "job-mps-service",
            "leaf",
            "job.1.2.x",
        ] {
            assert_eq!(job_of_cgroup(name), None, "{name}");
        }
    }

    proptest::proptest! {
        /// Whatever bjobs prints, an answer or an error, never a panic.
        #[test]
        fn any_output_is_parsed_without_panicking(text in ".{0,300}", host in "[a-z0-9.-]{0,20}") {
            let _ = parse(&text, &host);
            let _ = job_of_cgroup(&text);
            let doc = format!(r#"{{"RECORDS":[{{"JOBID":"1","ALLOC_SLOT":"{t}","GPU_ALLOC":"{t}"}}]}}"#, t = text.replace(['"', '\\'], ""));
            let _ = parse(&doc, &host);
        }
    }
}
