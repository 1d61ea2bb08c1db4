//! What LSF's accounting says of a cluster's jobs, for the stats-server: finished jobs from
//! `bacct -u all -l -gpu -UF` (the long format, one record per job between dashed lines), and
//! running or pending ones from `bjobs -json`. Both commands are run with `TZ=UTC` (see
//! `accounting.rs`), so the local times they print are UTC and no daylight-saving hour is
//! ambiguous.

use std::collections::BTreeSet;

use serde::Deserialize;
use serde_json::Value;

use crate::host::ParseError;
use crate::manager::civil::civil_from_days;
pub use crate::manager::civil::parse_asctime as parse_time;
use crate::manager::{Allocation, Reported, UnitRecord};

/// The fields asked of `bjobs -json -o …` for the stats-server.
pub const BJOBS_FIELDS: &str = "jobid jobindex user user_group queue job_name proj_name stat alloc_slot nalloc_slot submit_time start_time run_time effective_resreq gpu_num mem memlimit mem_efficiency exec_cwd runtimelimit";

/// `YYYY/MM/DD/HH:MM` of epoch seconds, in UTC.
pub fn minute(epoch: i64) -> String {
    let (year, month, day) = civil_from_days(epoch.div_euclid(86_400));
    let secs = epoch.rem_euclid(86_400);
    format!(
        "{year:04}/{month:02}/{day:02}/{:02}:{:02}",
        secs / 3600,
        secs % 3600 / 60
    )
}

/// `9 Mbytes`, `11M`, `1.5G`, `512` (bytes) → bytes.
fn memory_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: f64 = number.parse().ok().filter(|n: &f64| n.is_finite())?;
    let scale = match unit.trim().chars().next().map(|c| c.to_ascii_uppercase()) {
        None | Some('B') => 1.0,
        Some('K') => 1024.0,
        Some('M') => 1024.0 * 1024.0,
        Some('G') => 1024.0 * 1024.0 * 1024.0,
        Some('T') => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        Some(_) => return None,
    };
    Some((number * scale) as u64)
}

/// `5.20%` → 5.2.
fn percent(text: &str) -> Option<f64> {
    text.trim()
        .strip_suffix('%')?
        .trim()
        .parse()
        .ok()
        .filter(|p: &f64| p.is_finite())
}

/// What a job was given: LSF prints memory used and its share of what was reserved, so the
/// reservation is `used / efficiency`; unknown (0) without an efficiency.
fn reserved_bytes(used: Option<u64>, efficiency: Option<f64>) -> u64 {
    match (used, efficiency) {
        (Some(used), Some(e)) if e > 0.0 => (used as f64 * 100.0 / e) as u64,
        _ => 0,
    }
}

/// An LSF job id, `42` or `42[3]`.
fn is_job_id(id: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match id.split_once('[') {
        Some((n, rest)) => digits(n) && rest.strip_suffix(']').is_some_and(digits),
        None => digits(id),
    }
}

/// LSF's job states as the stats-server's (Slurm's) words, so that findings and reports read
/// them alike; `detail` is the end-of-job line, which says why an `EXIT` job ended.
fn state(status: &str, detail: &str) -> &'static str {
    match status {
        "DONE" => "COMPLETED",
        "EXIT" if detail.contains("TERM_RUNLIMIT") => "TIMEOUT",
        "EXIT" if detail.contains("TERM_MEMLIMIT") => "OUT_OF_MEMORY",
        "EXIT"
            if [
                "TERM_OWNER",
                "TERM_ADMIN",
                "TERM_FORCE_OWNER",
                "TERM_FORCE_ADMIN",
            ]
            .iter()
            .any(|t| detail.contains(t)) =>
        {
            "CANCELLED"
        }
        "EXIT" => "FAILED",
        "RUN" => "RUNNING",
        "PEND" => "PENDING",
        "USUSP" | "SSUSP" | "PSUSP" => "SUSPENDED",
        _ => "UNKNOWN",
    }
}

/// The `Key <value>` pairs of a bacct line: `Job <3>, User <usr3>, Command <a > b>`. A value
/// ends at a `>` followed by a separator or the line's end, so `>` inside one is kept.
fn pairs(line: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(open) = rest.find('<') {
        let key = rest[..open]
            .rsplit([',', ';', '.'])
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned();
        let after = &rest[open + 1..];
        let mut end = None;
        for (i, _) in after.match_indices('>') {
            let next = after[i + 1..].chars().next();
            if matches!(next, None | Some(',' | ';' | '.' | ' ')) {
                end = Some(i);
                break;
            }
        }
        let Some(end) = end else { break };
        out.push((key, after[..end].to_owned()));
        rest = &after[end + 1..];
    }
    out
}

/// Hosts of `Allocated N Slot(s) on Host(s) <h1> <h1> <4*h2>`, one entry per slot.
fn slot_hosts(text: &str) -> Vec<String> {
    let mut hosts = Vec::new();
    for (_, value) in pairs(text) {
        let (count, host) = match value.split_once('*') {
            Some((n, h)) => (n.parse::<usize>().unwrap_or(1), h),
            None => (1, value.as_str()),
        };
        hosts.extend(std::iter::repeat_n(host.to_owned(), count.min(1 << 16)));
    }
    hosts
}

/// The event of a `Sun Apr 12 17:23:38 2026: Submitted from host …` line.
fn event(line: &str) -> Option<(i64, &str)> {
    // The clock's colons are not followed by a space: the first `: ` ends the date.
    let (date, what) = line.split_once(": ")?;
    Some((parse_time(date)?, what))
}

/// What CEEMS 0.14+ answers of an LSF job, in its words: LSF's status (`DONE`, `EXIT`,
/// `RUN`), an allocation of nodes, CPUs (slots), memory and GPUs (no billing), and its tags:
/// the queue, the effective resource request, how it completed (`done`, `exit`; bacct only),
/// its hosts joined by `|` and its working directory.
fn ceems_words(rec: &UnitRecord, status: &str, res_req: &str, completed: Option<&str>) -> Reported {
    let mut allocation = serde_json::Map::new();
    for (k, v) in [
        ("nodes", rec.allocation.nodes),
        ("cpus", rec.allocation.cpus),
        ("mem", rec.allocation.mem_bytes),
        ("gpus", rec.allocation.gpus),
    ] {
        allocation.insert(k.into(), v.into());
    }
    let mut tags = serde_json::Map::new();
    tags.insert("queue".into(), rec.partition.clone().into());
    tags.insert("res_req".into(), res_req.into());
    if let Some(exit) = completed {
        tags.insert("exit_status".into(), exit.into());
    }
    tags.insert("nodelist".into(), rec.nodes.join("|").into());
    tags.insert("workdir".into(), rec.workdir.clone().into());
    Reported {
        state: status.to_owned(),
        allocation,
        tags,
        ..Reported::default()
    }
}

/// One record of bacct's long format; `first_line` is where it starts in the output.
fn parse_record(lines: &[&str], first_line: usize) -> Result<Option<UnitRecord>, ParseError> {
    let Some(head_at) = lines
        .iter()
        .position(|l| l.trim_start().starts_with("Job <"))
    else {
        // The header ("Accounting information about jobs that are: …") or the summary.
        return Ok(None);
    };
    let line_no = first_line + head_at;
    let bad = |m: String| ParseError::new(line_no, m);
    let head = pairs(lines[head_at]);
    let get = |key: &str| {
        head.iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.trim().to_owned())
    };
    let uuid = get("Job").unwrap_or_default();
    if !is_job_id(&uuid) {
        return Err(bad(format!("job id `{uuid}` is not an LSF job id")));
    }
    let status = get("Status").unwrap_or_default();
    let mut rec = UnitRecord {
        uuid,
        partition: get("Queue").unwrap_or_default(),
        account: get("Project").unwrap_or_default(),
        user: get("User").unwrap_or_default(),
        name: get("Job Name")
            .or_else(|| get("Command"))
            .unwrap_or_default(),
        ..UnitRecord::default()
    };
    if rec.user.is_empty() {
        return Err(bad(format!("job {} has no user", rec.uuid)));
    }
    let mut completed = String::new();
    let mut res_req = String::new();
    let mut hosts: Vec<String> = Vec::new();
    let mut gpus: BTreeSet<(String, String)> = BTreeSet::new();
    let mut mem_used = None;
    let mut mem_efficiency = None;
    let mut gpu_host = String::new();
    let mut section = "";
    let mut iter = lines.iter().skip(head_at + 1).peekable();
    while let Some(line) = iter.next() {
        let trimmed = line.trim();
        if let Some((at, what)) = event(trimmed) {
            section = "";
            // An array element's events name it first: `[1] dispatched 2 Task(s) …`.
            let what = match what.strip_prefix('[').and_then(|w| w.split_once("] ")) {
                Some((index, rest)) if index.bytes().all(|b| b.is_ascii_digit()) => rest,
                _ => what,
            };
            if what.starts_with("Submitted from host") {
                rec.submit = Some(at);
                if let Some((_, cwd)) = pairs(what).into_iter().find(|(k, _)| k == "CWD") {
                    rec.workdir = cwd;
                }
            } else if ["Dispatched", "dispatched", "Started", "started"]
                .iter()
                .any(|w| what.starts_with(w))
            {
                rec.start.get_or_insert(at);
                // The allocated slots when printed, else the hosts tasks were started on.
                let allocated = what.find("Allocated").map(|i| &what[i..]);
                let list = allocated.unwrap_or(what);
                let (list, requested) = list.split_once("Effective RES_REQ ").unwrap_or((list, ""));
                res_req = requested.trim().to_owned();
                hosts = slot_hosts(list);
            } else if what.starts_with("Completed") {
                rec.end = Some(at);
                completed = what.to_owned();
            }
            continue;
        }
        if trimmed.starts_with("GPU_ALLOCATION:") {
            section = "gpu";
            continue;
        }
        if trimmed.starts_with("Accounting information about this job") {
            section = "acct";
            continue;
        }
        let words: Vec<&str> = trimmed.split_whitespace().collect();
        match section {
            "gpu" if words.first() == Some(&"HOST") || words.is_empty() => {}
            "gpu" => {
                // A row names its host, or continues the row above's (one column fewer).
                let gpu = if words.len() >= 11 {
                    gpu_host = words[0].to_owned();
                    words[2]
                } else if words.len() == 10 && !gpu_host.is_empty() {
                    words[1]
                } else {
                    return Err(bad(format!(
                        "GPU_ALLOCATION row `{trimmed}` has {} columns",
                        words.len()
                    )));
                };
                gpus.insert((gpu_host.clone(), gpu.to_owned()));
            }
            _ if words.contains(&"CPU_T") && words.contains(&"MEM") => {
                let col = words.iter().position(|w| *w == "MEM").unwrap_or(0);
                let values: Vec<&str> = iter
                    .next()
                    .map(|l| l.split_whitespace().collect())
                    .unwrap_or_default();
                if values.len() == words.len() {
                    mem_used = memory_bytes(values[col]);
                }
            }
            _ if words.last() == Some(&"MEM_EFFICIENCY") => {
                let value = iter.next().and_then(|l| l.split_whitespace().last());
                mem_efficiency = value.and_then(percent);
            }
            _ if words == ["RUNLIMIT"] => {
                let limit = iter
                    .next()
                    .map(|l| l.split_whitespace().collect::<Vec<_>>());
                rec.time_limit_seconds = limit
                    .as_deref()
                    .and_then(|w| w.first())
                    .and_then(|m| m.parse::<f64>().ok())
                    .filter(|m| m.is_finite() && *m >= 0.0)
                    .map(|m| (m * 60.0) as u64);
            }
            _ => {}
        }
    }
    if rec.start.is_none() {
        // Never dispatched (killed while pending): nothing ran to account for.
        return Ok(None);
    }
    let distinct: BTreeSet<&String> = hosts.iter().collect();
    rec.allocation = Allocation {
        cpus: hosts.len() as u64,
        mem_bytes: reserved_bytes(mem_used, mem_efficiency),
        gpus: gpus.len() as u64,
        billing: 0,
        nodes: distinct.len() as u64,
    };
    rec.nodes = distinct.into_iter().cloned().collect();
    rec.state = state(&status, &completed).to_owned();
    rec.exit_code = match completed.split("exit code <").nth(1) {
        Some(rest) => format!("{}:0", rest.split('>').next().unwrap_or("0").trim()),
        None if status == "DONE" => "0:0".to_owned(),
        None => String::new(),
    };
    if let (Some(start), Some(end)) = (rec.start, rec.end) {
        rec.elapsed_seconds = u64::try_from(end - start).unwrap_or(0);
    }
    // `Completed <exit>; TERM_OWNER: …` → exit.
    let how = completed
        .split_once('<')
        .and_then(|(_, rest)| rest.split_once('>'))
        .map_or("", |(how, _)| how);
    rec.reported = ceems_words(&rec, &status, &res_req, Some(how));
    Ok(Some(rec))
}

/// The jobs of `bacct -l` output, each or the error that makes its record unreadable; records
/// of jobs that never started are left out.
pub fn parse_bacct(text: &str) -> Vec<Result<UnitRecord, ParseError>> {
    let mut out = Vec::new();
    let mut record: Vec<&str> = Vec::new();
    let mut first = 1;
    let is_rule = |l: &str| {
        let t = l.trim();
        t.len() >= 3 && t.bytes().all(|b| b == b'-')
    };
    for (i, line) in text.lines().enumerate() {
        if is_rule(line) {
            if let Some(r) = parse_record(&record, first).transpose() {
                out.push(r);
            }
            record.clear();
            first = i + 2;
        } else {
            record.push(line);
        }
    }
    if let Some(r) = parse_record(&record, first).transpose() {
        out.push(r);
    }
    out
}

#[derive(Debug, Deserialize)]
struct Document {
    #[serde(rename = "RECORDS", default)]
    records: Vec<serde_json::Map<String, Value>>,
}

/// The jobs of `bjobs -u all -a -json -o "<BJOBS_FIELDS>"`, finished ones too (see
/// [`unfinished`]). A record that cannot be read is an error in its place (line = its index + 1).
pub fn parse_bjobs(json: &str) -> Result<Vec<Result<UnitRecord, ParseError>>, ParseError> {
    let doc: Document = serde_json::from_str(json)
        .map_err(|e| ParseError::new(0, format!("bjobs -json: not a JSON document: {e}")))?;
    let mut out = Vec::new();
    for (i, r) in doc.records.iter().enumerate() {
        let field = |k: &str| match r.get(k) {
            Some(Value::String(s)) => s.trim().to_owned(),
            Some(Value::Number(n)) => n.to_string(),
            _ => String::new(),
        };
        let stat = field("STAT");
        out.push(bjobs_record(i + 1, &field, &stat));
    }
    Ok(out)
}

/// Whether bjobs' record is of a job still running or waiting: a finished job's record is
/// bacct's, which says how it ended.
pub fn unfinished(record: &UnitRecord) -> bool {
    matches!(record.state.as_str(), "RUNNING" | "PENDING" | "SUSPENDED")
}

fn bjobs_record(
    index: usize,
    field: &dyn Fn(&str) -> String,
    stat: &str,
) -> Result<UnitRecord, ParseError> {
    let bad = |m: String| ParseError::new(index, m);
    let id = field("JOBID");
    let uuid = match field("JOBINDEX").as_str() {
        "" | "0" => id.clone(),
        i => format!("{id}[{i}]"),
    };
    if !is_job_id(&uuid) {
        return Err(bad(format!("JOBID `{id}` / JOBINDEX is not an LSF job id")));
    }
    let user = field("USER");
    if user.is_empty() {
        return Err(bad(format!("job {uuid} has no USER")));
    }
    let time = |k: &str| -> Result<Option<i64>, ParseError> {
        match field(k).as_str() {
            "" | "-" => Ok(None),
            t => parse_time(t)
                .map(Some)
                .ok_or_else(|| bad(format!("{k} `{t}` is not a time"))),
        }
    };
    let hosts: Vec<String> = field("ALLOC_SLOT")
        .split(':')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect();
    let distinct: BTreeSet<&String> = hosts.iter().collect();
    let count = |k: &str| -> Result<u64, ParseError> {
        match field(k).as_str() {
            "" | "-" => Ok(0),
            v => v
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite() && *n >= 0.0)
                .map(|n| n as u64)
                .ok_or_else(|| bad(format!("{k} `{v}` is not a number"))),
        }
    };
    let cpus = match count("NALLOC_SLOT")? {
        0 => hosts.len() as u64,
        n => n,
    };
    let limit = memory_bytes(&field("MEMLIMIT")).unwrap_or(0);
    let mem_bytes = match limit {
        0 => reserved_bytes(
            memory_bytes(&field("MEM")),
            percent(&field("MEM_EFFICIENCY")),
        ),
        l => l,
    };
    let elapsed = field("RUN_TIME")
        .split_whitespace()
        .next()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0);
    let mut rec = UnitRecord {
        partition: field("QUEUE"),
        account: field("PROJ_NAME"),
        group: field("USER_GROUP"),
        user,
        submit: time("SUBMIT_TIME")?,
        start: time("START_TIME")?,
        elapsed_seconds: elapsed,
        state: state(stat, "").to_owned(),
        allocation: Allocation {
            cpus,
            mem_bytes,
            gpus: count("GPU_NUM")?,
            billing: 0,
            nodes: distinct.len() as u64,
        },
        nodes: distinct.into_iter().cloned().collect(),
        workdir: field("EXEC_CWD"),
        // `60.0/host` minutes; absent or `-` when unlimited.
        time_limit_seconds: field("RUNTIMELIMIT")
            .split('/')
            .next()
            .and_then(|m| m.trim().parse::<f64>().ok())
            .filter(|m| m.is_finite() && *m > 0.0)
            .map(|m| (m * 60.0) as u64),
        name: field("JOB_NAME"),
        uuid,
        ..UnitRecord::default()
    };
    rec.reported = ceems_words(&rec, stat, &field("EFFECTIVE_RESREQ"), None);
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three jobs as LSF 10.1's `bacct -u all -l -gpu -UF` prints them, between its header and
    /// its summary: a GPU job on two hosts, a timed-out array element, one killed while pending.
    const BACCT: &str = include_str!("../../../tests/fixtures/lsf/bacct-l.txt");

    /// CEEMS v0.16's `bacct` stand-in (`pkg/api/testdata/bacct`): its array elements say
    /// `[1] dispatched …`; two jobs killed before dispatch are left out.
    #[test]
    fn array_elements_dispatched_in_lower_case_are_jobs_of_their_own() {
        let text = std::process::Command::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/ceems-v0.16/pkg/api/testdata/bacct"
        ))
        .output()
        .unwrap()
        .stdout;
        let jobs: Vec<UnitRecord> = parse_bacct(&String::from_utf8_lossy(&text))
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap();
        let ids: Vec<&str> = jobs.iter().map(|j| j.uuid.as_str()).collect();
        assert_eq!(ids, ["3", "4", "6[1]", "6[2]", "6[3]"]);
        let element = &jobs[2];
        assert_eq!(
            (element.user.as_str(), element.account.as_str()),
            ("usr4", "prj2")
        );
        assert!(element.start.is_some_and(|s| s > 0), "{element:?}");
        // CEEMS 0.14's words for job 3: bacct's status, the allocation without billing, the
        // tags it answers.
        let words = &jobs[0].reported;
        assert_eq!(words.state, "DONE");
        assert_eq!(
            serde_json::Value::Object(words.allocation.clone()),
            serde_json::json!({"nodes": 2, "cpus": 4, "mem": jobs[0].allocation.mem_bytes, "gpus": 4})
        );
        assert_eq!(
            serde_json::Value::Object(words.tags.clone()),
            serde_json::json!({
                "queue": "interactive",
                "res_req": "<select[(type == any ) && (ngpus>0)] order[r15s:pg] rusage[ngpus_physical=2.00/host] span[ptile=2] >;",
                "exit_status": "done",
                "nodelist": "nodes-1.example.com|nodes-2.example.com",
                "workdir": "/home/usr3"
            })
        );
        assert_eq!(jobs[2].reported.tags["exit_status"], "exit");
    }

    #[test]
    fn a_bacct_answer_gives_each_started_job_with_its_allocation() {
        let jobs: Vec<UnitRecord> = parse_bacct(BACCT)
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(jobs.len(), 2, "the never-started job is left out: {jobs:?}");
        let gpu = &jobs[0];
        let t = |s: &str| parse_time(s).unwrap();
        assert_eq!(
            (gpu.uuid.as_str(), gpu.user.as_str(), gpu.account.as_str()),
            ("7001", "alice", "physics")
        );
        assert_eq!(
            (gpu.partition.as_str(), gpu.name.as_str()),
            ("gpu", "train")
        );
        assert_eq!(gpu.submit, Some(t("Nov 24 09:00:00 2026")));
        assert_eq!(
            (gpu.start, gpu.end),
            (
                Some(t("Nov 24 09:00:05 2026")),
                Some(t("Nov 24 10:00:05 2026"))
            )
        );
        assert_eq!(gpu.elapsed_seconds, 3600);
        assert_eq!(
            (gpu.state.as_str(), gpu.exit_code.as_str()),
            ("COMPLETED", "0:0")
        );
        assert_eq!(gpu.workdir, "$HOME/run");
        // 2 GiB used is 25 % of what was reserved.
        assert_eq!(
            gpu.allocation,
            Allocation {
                cpus: 4,
                mem_bytes: 8 << 30,
                gpus: 2,
                billing: 0,
                nodes: 2
            }
        );
        assert_eq!(gpu.nodes, ["cn01", "cn02"]);

        let array = &jobs[1];
        assert_eq!(
            (array.uuid.as_str(), array.state.as_str()),
            ("7002[3]", "TIMEOUT")
        );
        assert_eq!(array.time_limit_seconds, Some(1800));
        assert_eq!(
            (
                array.allocation.cpus,
                array.allocation.nodes,
                array.allocation.mem_bytes
            ),
            (2, 1, 0)
        );
        assert_eq!(array.name, "./sim");
    }

    #[test]
    fn a_broken_record_is_an_error_in_its_place_and_the_rest_is_read() {
        let text = BACCT.replace("Job <7002[3]>", "Job <7002[x]>");
        let got = parse_bacct(&text);
        assert_eq!(got.len(), 2);
        assert!(got[0].is_ok());
        let e = got[1].as_ref().unwrap_err();
        assert!(e.message.contains("7002[x]"), "{e}");
        assert!(e.line > 20, "the error names the record's line: {e}");
        assert!(parse_bacct("").is_empty());
        assert!(parse_bacct("No matching job found\n").is_empty());
        let cut = &BACCT[..BACCT.find("GPU_ALLOCATION").unwrap()];
        assert!(parse_bacct(cut).iter().all(|r| r.is_ok()));
    }

    #[test]
    fn times_and_minutes_are_utc_both_ways() {
        assert_eq!(parse_time("Thu Jan  1 00:00:00 1970"), Some(0));
        assert_eq!(parse_time("Feb 29 12:00:00 2024"), Some(1_709_208_000));
        assert_eq!(
            parse_time("Apr 12 22:27:01 2026 L"),
            parse_time("Apr 12 22:27:01 2026")
        );
        for bad in [
            "",
            "Apr 12 2026",
            "Foo 12 10:00:00 2026",
            "Apr 32 10:00:00 2026",
            "Apr 1 25:00:00 2026",
            "Apr 1 1:2:3:4 2026",
        ] {
            assert_eq!(parse_time(bad), None, "{bad}");
        }
        assert_eq!(minute(1_709_208_000), "2024/02/29/12:00");
        assert_eq!(minute(0), "1970/01/01/00:00");
        let t = 1_795_000_000;
        assert_eq!(minute(t), minute(t - t % 60));
    }

    #[test]
    fn bjobs_gives_running_pending_and_just_finished_jobs() {
        let doc = r#"{"COMMAND":"bjobs","JOBS":3,"RECORDS":[
          {"JOBID":"8001","JOBINDEX":"0","USER":"alice","USER_GROUP":"phys","QUEUE":"gpu","JOB_NAME":"train","PROJ_NAME":"physics","STAT":"RUN","ALLOC_SLOT":"cn01:cn01:cn02","NALLOC_SLOT":"3","SUBMIT_TIME":"Nov 25 10:00:00 2026","START_TIME":"Nov 25 10:00:30 2026","RUN_TIME":"90 second(s)","GPU_NUM":"2","MEM":"1 Gbytes","MEMLIMIT":"","MEM_EFFICIENCY":"50.00%","EXEC_CWD":"/home/alice","RUNTIMELIMIT":"60.0/cn01"},
          {"JOBID":"8002","JOBINDEX":"4","USER":"bob","STAT":"PEND","SUBMIT_TIME":"Nov 25 10:01:00 2026","START_TIME":"","MEMLIMIT":"4 Gbytes"},
          {"JOBID":"8000","USER":"bob","STAT":"DONE"}
        ]}"#;
        let got: Vec<UnitRecord> = parse_bjobs(doc)
            .unwrap()
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(got.len(), 3);
        assert!(unfinished(&got[0]) && unfinished(&got[1]));
        assert!(!unfinished(&got[2]), "{:?}", got[2]);
        let run = &got[0];
        assert_eq!(
            (run.uuid.as_str(), run.state.as_str(), run.group.as_str()),
            ("8001", "RUNNING", "phys")
        );
        assert_eq!(
            run.allocation,
            Allocation {
                cpus: 3,
                mem_bytes: 2 << 30,
                gpus: 2,
                billing: 0,
                nodes: 2
            }
        );
        assert_eq!(
            (run.elapsed_seconds, run.time_limit_seconds),
            (90, Some(3600))
        );
        assert_eq!(run.end, None);
        let pend = &got[1];
        assert_eq!(
            (pend.uuid.as_str(), pend.state.as_str(), pend.start),
            ("8002[4]", "PENDING", None)
        );
        assert_eq!(pend.allocation.mem_bytes, 4 << 30);
        assert!(parse_bjobs("Job <1> is not found").is_err());
        let bad = parse_bjobs(
            r#"{"RECORDS":[{"JOBID":"1","USER":"a","STAT":"RUN","START_TIME":"yesterday"}]}"#,
        )
        .unwrap();
        assert!(bad[0].as_ref().unwrap_err().message.contains("START_TIME"));
    }

    proptest::proptest! {
        /// Whatever bacct or bjobs print, records or errors, never a panic.
        #[test]
        fn any_output_is_parsed_without_panicking(text in "(.{0,40}\n){0,12}") {
            let _ = parse_bacct(&text);
            let _ = parse_bjobs(&text);
            let _ = parse_time(&text);
            let job = format!("Job <1>, User <u>\n{text}\n{}", BACCT.lines().skip(12).take(20).collect::<Vec<_>>().join("\n"));
            let _ = parse_bacct(&job);
        }
    }
}
