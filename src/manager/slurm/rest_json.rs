//! slurmrestd's accounting answers (`openapi/dbv0.0.38`, Slurm 22.05): jobs and associations,
//! turned into the records `sacct` gives. Each job is parsed on its own, so one malformed job
//! is skipped with its error and the others are kept; `line` in an error is the job's position
//! in the answer (from 1).

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::host::ParseError;
use crate::manager::{Allocation, Associations, UnitRecord};

use super::sacct::expand_nodelist;

/// slurmrestd's error number for a query that matched nothing: an empty answer, not a fault.
const NOTHING_FOUND: i64 = 9003;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RestAnswerError {
    #[error("slurmrestd answered something that is not its JSON: {0}")]
    Shape(String),
    #[error("slurmrestd: {0}")]
    Refused(String),
}

#[derive(Debug, Deserialize)]
struct ApiError {
    #[serde(default)]
    error_number: Option<i64>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    source: Option<String>,
}

impl ApiError {
    fn text(&self) -> String {
        [&self.description, &self.error, &self.source]
            .into_iter()
            .flatten()
            .filter(|s| !s.is_empty())
            .cloned()
            .collect::<Vec<_>>()
            .join(": ")
    }
}

#[derive(Debug, Deserialize)]
struct Envelope<'a, T> {
    #[serde(default)]
    errors: Vec<ApiError>,
    #[serde(borrow, default = "Vec::new")]
    jobs: Vec<&'a RawValue>,
    #[serde(default = "Vec::new")]
    associations: Vec<T>,
}

/// The errors of an answer, but "nothing found".
fn refused(errors: &[ApiError]) -> Option<RestAnswerError> {
    let real: Vec<String> = errors
        .iter()
        .filter(|e| e.error_number != Some(NOTHING_FOUND))
        .map(ApiError::text)
        .collect();
    (!real.is_empty()).then(|| RestAnswerError::Refused(real.join("; ")))
}

#[derive(Debug, Deserialize)]
struct Job {
    job_id: u64,
    #[serde(default)]
    partition: Option<String>,
    #[serde(default)]
    qos: Option<String>,
    #[serde(default)]
    account: Option<String>,
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    working_directory: Option<String>,
    #[serde(default)]
    nodes: Option<String>,
    time: Times,
    #[serde(default)]
    exit_code: Option<ExitCode>,
    state: State,
    #[serde(default)]
    tres: Option<Tres>,
}

#[derive(Debug, Deserialize)]
struct Times {
    #[serde(default)]
    submission: Option<i64>,
    #[serde(default)]
    start: Option<i64>,
    #[serde(default)]
    end: Option<i64>,
    #[serde(default)]
    elapsed: Option<u64>,
    /// Minutes; null when unlimited or the partition's.
    #[serde(default)]
    limit: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct ExitCode {
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    return_code: Option<i64>,
    #[serde(default)]
    signal: Option<Signal>,
}

#[derive(Debug, Deserialize)]
struct Signal {
    #[serde(default)]
    signal_id: Option<i64>,
}

#[derive(Debug, Deserialize)]
struct State {
    current: String,
}

#[derive(Debug, Deserialize)]
struct Tres {
    #[serde(default)]
    allocated: Vec<TresItem>,
}

#[derive(Debug, Deserialize)]
struct TresItem {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    count: Option<i64>,
}

#[derive(Debug, Deserialize)]
struct Association {
    account: Option<String>,
    #[serde(default)]
    user: Option<String>,
}

/// Resolves user and group names to ids: the REST answers carry names only. Names the host
/// cannot resolve get no id, as a job of an unknown user would from sacct's database.
pub trait NameIds {
    fn uid(&mut self, user: &str) -> Option<u32>;
    fn gid(&mut self, group: &str) -> Option<u32>;
}

/// This host's users and groups (NSS), each name looked up once per answer.
#[derive(Default)]
pub struct HostNames {
    users: HashMap<String, Option<u32>>,
    groups: HashMap<String, Option<u32>>,
}

impl NameIds for HostNames {
    fn uid(&mut self, user: &str) -> Option<u32> {
        *self.users.entry(user.to_owned()).or_insert_with(|| {
            nix::unistd::User::from_name(user)
                .ok()
                .flatten()
                .map(|u| u.uid.as_raw())
        })
    }

    fn gid(&mut self, group: &str) -> Option<u32> {
        *self.groups.entry(group.to_owned()).or_insert_with(|| {
            nix::unistd::Group::from_name(group)
                .ok()
                .flatten()
                .map(|g| g.gid.as_raw())
        })
    }
}

/// A time of the answer: 0 means not yet.
fn when(t: Option<i64>) -> Option<i64> {
    t.filter(|&t| t > 0)
}

fn allocation(tres: Option<&Tres>) -> Result<Allocation, String> {
    let mut a = Allocation::default();
    let Some(tres) = tres else {
        return Ok(a);
    };
    let mut typed_gpus = 0;
    for item in &tres.allocated {
        let Some(count) = item.count else {
            continue;
        };
        let count = u64::try_from(count)
            .map_err(|_| format!("TRES {} has a negative count {count}", item.kind))?;
        match (item.kind.as_str(), item.name.as_deref()) {
            ("cpu", _) => a.cpus = count,
            // Megabytes, as sacct's `mem=…M`.
            ("mem", _) => a.mem_bytes = count.saturating_mul(1 << 20),
            ("node", _) => a.nodes = count,
            ("billing", _) => a.billing = count,
            ("gres", Some("gpu")) => a.gpus = count,
            ("gres", Some(n)) if n.starts_with("gpu:") => typed_gpus = typed_gpus.max(count),
            _ => {}
        }
    }
    // Typed GPUs are also counted in gres/gpu; used only when it is absent, as from sacct.
    if a.gpus == 0 {
        a.gpus = typed_gpus;
    }
    Ok(a)
}

fn record(job: Job, names: &mut dyn NameIds) -> Result<UnitRecord, String> {
    let text = |v: Option<String>| v.unwrap_or_default();
    let user = text(job.user);
    let group = text(job.group);
    let state = job
        .state
        .current
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned();
    let exit_code = match job.exit_code {
        // Slurm 22.05's slurmrestd says SUCCESS 0 for a script that exited non-zero (sacct
        // says 3:0): unknown is better than wrong.
        Some(e) if state == "FAILED" && e.status.as_deref() == Some("SUCCESS") => String::new(),
        Some(e) => format!(
            "{}:{}",
            e.return_code.unwrap_or(0),
            e.signal.and_then(|s| s.signal_id).unwrap_or(0)
        ),
        None => String::new(),
    };
    Ok(UnitRecord {
        uuid: job.job_id.to_string(),
        partition: text(job.partition),
        qos: text(job.qos),
        account: text(job.account),
        uid: (!user.is_empty()).then(|| names.uid(&user)).flatten(),
        gid: (!group.is_empty()).then(|| names.gid(&group)).flatten(),
        user,
        group,
        submit: when(job.time.submission),
        start: when(job.time.start),
        end: when(job.time.end),
        elapsed_seconds: job.time.elapsed.unwrap_or(0),
        exit_code,
        state,
        allocation: allocation(job.tres.as_ref())?,
        nodes: expand_nodelist(job.nodes.as_deref().unwrap_or_default())?,
        workdir: text(job.working_directory),
        time_limit_seconds: job.time.limit.map(|m| m.saturating_mul(60)),
        name: text(job.name),
        // slurmrestd's answers are not sacct's words, but for a job never given nodes: both
        // say `None assigned`, which CEEMS answers as the job's node list.
        reported: crate::manager::Reported {
            nodelist: match job.nodes.as_deref() {
                Some(none @ "None assigned") => none.to_owned(),
                _ => String::new(),
            },
            ..Default::default()
        },
    })
}

/// The jobs of a `/slurmdb/<version>/jobs` or `/job/<id>` answer, each parsed or with why not.
pub fn parse_jobs(
    body: &str,
    names: &mut dyn NameIds,
) -> Result<Vec<Result<UnitRecord, ParseError>>, RestAnswerError> {
    let envelope: Envelope<'_, serde::de::IgnoredAny> =
        serde_json::from_str(body).map_err(|e| RestAnswerError::Shape(e.to_string()))?;
    if let Some(e) = refused(&envelope.errors) {
        return Err(e);
    }
    Ok(envelope
        .jobs
        .iter()
        .enumerate()
        .map(|(i, raw)| {
            serde_json::from_str::<Job>(raw.get())
                .map_err(|e| e.to_string())
                .and_then(|job| record(job, names))
                .map_err(|m| ParseError::new(i + 1, m))
        })
        .collect())
}

/// Projects and members of an `/slurmdb/<version>/associations` answer, root's left out as
/// `sacctmgr`'s are.
pub fn parse_associations(body: &str) -> Result<(Associations, Vec<ParseError>), RestAnswerError> {
    let envelope: Envelope<'_, serde_json::Value> =
        serde_json::from_str(body).map_err(|e| RestAnswerError::Shape(e.to_string()))?;
    if let Some(e) = refused(&envelope.errors) {
        return Err(e);
    }
    let mut a = Associations::default();
    let mut errors = Vec::new();
    for (i, value) in envelope.associations.into_iter().enumerate() {
        let assoc = match serde_json::from_value::<Association>(value) {
            Ok(Association {
                account: Some(account),
                user,
            }) if !account.is_empty() => (account, user.unwrap_or_default()),
            Ok(_) => {
                errors.push(ParseError::new(i + 1, "association without an account"));
                continue;
            }
            Err(e) => {
                errors.push(ParseError::new(i + 1, e.to_string()));
                continue;
            }
        };
        let (account, user) = assoc;
        if account == super::sacct::ROOT || user == super::sacct::ROOT {
            continue;
        }
        if !a.projects.contains(&account) {
            a.projects.push(account.clone());
        }
        if !user.is_empty() && !a.members.contains(&(user.clone(), account.clone())) {
            a.members.push((user, account));
        }
    }
    Ok((a, errors))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;

    impl NameIds for Fixed {
        fn uid(&mut self, user: &str) -> Option<u32> {
            (user == "bob").then_some(2002)
        }
        fn gid(&mut self, group: &str) -> Option<u32> {
            (group == "bob").then_some(2002)
        }
    }

    /// A job of the lab's slurmrestd 22.05.8 (dbv0.0.38), cut to the fields read, with a GPU
    /// and a signal added.
    const LAB_JOB: &str = r#"{"account":"chemistry","job_id":196,"name":"vm-long","nodes":"localhost",
        "partition":"debug","qos":"normal","group":"bob","user":"bob","working_directory":"/tmp",
        "time":{"elapsed":25,"eligible":1795481552,"end":1795481578,"start":1795481553,
                "submission":1795481552,"limit":null},
        "exit_code":{"status":"SIGNALED","return_code":0,"signal":{"signal_id":15,"name":"TERM"}},
        "state":{"current":"CANCELLED","reason":"None"},
        "steps":[{"step":{"id":"196.batch"}}],
        "tres":{"allocated":[{"type":"cpu","name":null,"id":1,"count":1},
                             {"type":"mem","name":null,"id":2,"count":300},
                             {"type":"energy","name":null,"id":3,"count":null},
                             {"type":"node","name":null,"id":4,"count":1},
                             {"type":"billing","name":null,"id":5,"count":1},
                             {"type":"gres","name":"gpu","id":1001,"count":2},
                             {"type":"gres","name":"gpu:a100","id":1002,"count":2}]}}"#;

    #[test]
    fn a_lab_job_reads_as_sacct_gives_it() {
        let body = format!(r#"{{"meta":{{}},"errors":[],"jobs":[{LAB_JOB}]}}"#);
        let jobs = parse_jobs(&body, &mut Fixed).unwrap();
        let job = jobs[0].as_ref().unwrap();
        assert_eq!(
            job,
            &UnitRecord {
                uuid: "196".into(),
                partition: "debug".into(),
                qos: "normal".into(),
                account: "chemistry".into(),
                group: "bob".into(),
                gid: Some(2002),
                user: "bob".into(),
                uid: Some(2002),
                submit: Some(1795481552),
                start: Some(1795481553),
                end: Some(1795481578),
                elapsed_seconds: 25,
                exit_code: "0:15".into(),
                state: "CANCELLED".into(),
                allocation: Allocation {
                    cpus: 1,
                    mem_bytes: 300 << 20,
                    gpus: 2,
                    billing: 1,
                    nodes: 1,
                },
                nodes: vec!["localhost".into()],
                workdir: "/tmp".into(),
                time_limit_seconds: None,
                name: "vm-long".into(),
                reported: Default::default(),
            }
        );
    }

    #[test]
    fn a_failed_job_that_slurmrestd_says_succeeded_has_no_exit_code() {
        let job = |state: &str| {
            format!(
                r#"{{"jobs":[{{"job_id":198,"time":{{}},"state":{{"current":"{state}"}},
                "exit_code":{{"status":"SUCCESS","return_code":0}}}}]}}"#
            )
        };
        let exit = |state: &str| {
            parse_jobs(&job(state), &mut Fixed).unwrap()[0]
                .as_ref()
                .unwrap()
                .exit_code
                .clone()
        };
        assert_eq!(exit("FAILED"), "");
        assert_eq!(exit("COMPLETED"), "0:0");
    }

    #[test]
    fn a_pending_job_has_no_start_end_or_nodes() {
        let body = r#"{"jobs":[{"job_id":7,"nodes":"None assigned","user":"nobody-here",
            "time":{"submission":1795481552,"start":0,"end":0,"elapsed":0,"limit":60},
            "state":{"current":"PENDING"}}]}"#;
        let jobs = parse_jobs(body, &mut Fixed).unwrap();
        let job = jobs[0].as_ref().unwrap();
        assert_eq!((job.start, job.end, job.nodes.len()), (None, None, 0));
        assert_eq!((job.uid, job.time_limit_seconds), (None, Some(3600)));
    }

    #[test]
    fn nothing_found_is_empty_and_other_errors_refuse() {
        let empty = r#"{"errors":[{"description":"Nothing found","error_number":9003,"error":"Nothing found with query","source":"slurmdb_jobs_get"}],"jobs":[]}"#;
        assert!(parse_jobs(empty, &mut Fixed).unwrap().is_empty());
        let bad = r#"{"errors":[{"description":"Unable to parse time format","error_number":9000,"error":"Query empty or not RFC7320 compliant","source":"start_time"}]}"#;
        assert_eq!(
            parse_jobs(bad, &mut Fixed).unwrap_err(),
            RestAnswerError::Refused(
                "Unable to parse time format: Query empty or not RFC7320 compliant: start_time"
                    .into()
            )
        );
        assert!(matches!(
            parse_jobs("Authentication failure", &mut Fixed),
            Err(RestAnswerError::Shape(_))
        ));
    }

    #[test]
    fn a_malformed_job_is_skipped_with_its_position() {
        let body = format!(
            r#"{{"jobs":[{{"job_id":"x"}},{LAB_JOB},{{"job_id":8,"time":{{}},"state":{{"current":"RUNNING"}},"nodes":"n[3-1]"}}]}}"#
        );
        let jobs = parse_jobs(&body, &mut Fixed).unwrap();
        assert_eq!(jobs[0].as_ref().unwrap_err().line, 1);
        assert!(jobs[1].is_ok());
        let e = jobs[2].as_ref().unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("n[3-1]"), "{}", e.message);
    }

    proptest::proptest! {
        /// Cut or altered answers give errors, never a panic.
        #[test]
        fn damaged_answers_never_panic(cut in 0usize..1400, at in 0usize..1400, byte in 0u8..128) {
            let body = format!(r#"{{"errors":[],"jobs":[{LAB_JOB}]}}"#);
            let mut bytes = body.into_bytes();
            if let Some(b) = bytes.get_mut(at) {
                *b = byte;
            }
            bytes.truncate(cut);
            let text = String::from_utf8_lossy(&bytes);
            let _ = parse_jobs(&text, &mut Fixed);
            let _ = parse_associations(&text);
        }
    }

    #[test]
    fn associations_from_the_lab() {
        // The lab's /slurmdb/v0.0.38/associations, cut to the fields read.
        let body = r#"{"errors":[],"associations":[
            {"account":"root","user":null,"cluster":"lab"},
            {"account":"chemistry","cluster":"lab"},
            {"account":"chemistry","user":"bob","cluster":"lab"},
            {"account":"physics","user":"alice","cluster":"lab"},
            {"account":"root","user":"root","cluster":"lab"},
            {"user":"stray"}]}"#;
        let (a, errors) = parse_associations(body).unwrap();
        // Root's account and root's membership left out, as from sacctmgr.
        assert_eq!(a.projects, ["chemistry", "physics"]);
        assert_eq!(
            a.members,
            [
                ("bob".to_owned(), "chemistry".to_owned()),
                ("alice".to_owned(), "physics".to_owned())
            ]
        );
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].line, 6);
    }
}
