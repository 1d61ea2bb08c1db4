//! What PBS says of its jobs, as the stats-server's rows: the server's accounting log
//! (`server_priv/accounting/YYYYMMDD`, one record a line:
//! `11/26/2026 00:00:26;E;1[1].pbslab;user=alice group=alice … Exit_status=0`, values with
//! spaces quoted) and `qstat -f -F json` (run with `TZ=UTC`: its times are `asctime(3)` text).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::host::ParseError;
use crate::manager::civil::{days_from_civil, parse_asctime};
use crate::manager::{Allocation, UnitRecord};

/// The kinds of accounting records that say something of a job's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// `Q`: queued.
    Queued,
    /// `S`: started.
    Started,
    /// `E`: ended, with its exit status and usage.
    Ended,
    /// `D`: deleted (`qdel`); a running job's `E` follows.
    Deleted,
    /// `R`: rerun (requeued).
    Rerun,
    /// `A`: aborted by the server.
    Aborted,
}

/// One accounting record of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    /// The line's local time read as if it were UTC: add the server's offset for epoch seconds.
    pub logged: i64,
    pub kind: RecordKind,
    pub id: String,
    pub attrs: BTreeMap<String, String>,
}

impl LogRecord {
    /// An epoch-seconds attribute (`start`, `end`, `qtime`); PBS writes 0 for "not yet".
    pub fn epoch(&self, key: &str) -> Option<i64> {
        self.attrs.get(key)?.parse::<i64>().ok().filter(|t| *t > 0)
    }

    /// The server's offset from UTC, as this record shows it: the line's local time against
    /// the epoch time it records (a `Q`'s qtime, an `S`'s start, an `E`'s end), rounded to
    /// a quarter hour.
    pub fn utc_offset(&self) -> Option<i64> {
        let key = match self.kind {
            RecordKind::Queued => "qtime",
            RecordKind::Started => "start",
            RecordKind::Ended => "end",
            _ => return None,
        };
        let diff = self.logged - self.epoch(key)?;
        (diff.abs() <= 14 * 3600).then(|| (diff as f64 / 900.0).round() as i64 * 900)
    }
}

/// `MM/DD/YYYY HH:MM:SS` read as UTC.
fn log_time(text: &str) -> Option<i64> {
    let (date, clock) = text.split_once(' ')?;
    let mut d = date.splitn(3, '/');
    let month: i64 = d.next()?.parse().ok().filter(|m| (1..=12).contains(m))?;
    let day: i64 = d.next()?.parse().ok().filter(|d| (1..=31).contains(d))?;
    let year: i64 = d
        .next()?
        .parse()
        .ok()
        .filter(|y| (1970..=9999).contains(y))?;
    let mut c = clock.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (h, m, s) = (c.next()??, c.next()??, c.next()??);
    if h > 23 || m > 59 || s > 60 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + h * 3600 + m * 60 + s)
}

/// `key=value` pairs separated by spaces; a value that starts with `"` or `'` runs to the
/// same quote followed by a space or the end.
fn attributes(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let eq = rest
            .find('=')
            .ok_or_else(|| format!("`{}` is not key=value", truncate(rest)))?;
        let key = &rest[..eq];
        if key.is_empty() || key.contains(' ') {
            return Err(format!("`{}` is not key=value", truncate(rest)));
        }
        let after = &rest[eq + 1..];
        let (value, next) = match after.chars().next() {
            Some(q @ ('"' | '\'')) => {
                let body = &after[1..];
                let mut end = None;
                for (i, _) in body.match_indices(q) {
                    let tail = &body[i + 1..];
                    if tail.is_empty() || tail.starts_with(' ') {
                        end = Some(i);
                        break;
                    }
                }
                let end = end.ok_or_else(|| format!("{key}: unterminated quote"))?;
                (&body[..end], &body[end + 1..])
            }
            _ => match after.find(' ') {
                Some(sp) => (&after[..sp], &after[sp..]),
                None => (after, ""),
            },
        };
        out.insert(key.to_owned(), value.to_owned());
        rest = next.trim_start();
    }
    Ok(out)
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((at, _)) => &s[..at],
        None => s,
    }
}

/// One line of the accounting log: the job record it holds, None for the records that are
/// not of a job's life (licenses, reservations, array parents), or why it cannot be read.
pub fn parse_line(line: &str) -> Result<Option<LogRecord>, String> {
    let line = line.trim_end_matches(['\n', '\r']);
    if line.trim().is_empty() {
        return Ok(None);
    }
    let mut parts = line.splitn(4, ';');
    let (Some(time), Some(kind), Some(id)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(format!(
            "`{}` is not time;type;id;attributes",
            truncate(line)
        ));
    };
    let logged = log_time(time).ok_or_else(|| format!("`{}` is not a log time", truncate(time)))?;
    let kind = match kind {
        "Q" => RecordKind::Queued,
        "S" => RecordKind::Started,
        "E" => RecordKind::Ended,
        "D" => RecordKind::Deleted,
        "R" => RecordKind::Rerun,
        "A" => RecordKind::Aborted,
        _ => return Ok(None),
    };
    // Array parents (`12[]`) and reservations (`R12`) are not units.
    if !super::is_job_id(id) {
        return Ok(None);
    }
    let attrs = attributes(parts.next().unwrap_or(""))?;
    Ok(Some(LogRecord {
        logged,
        kind,
        id: id.to_owned(),
        attrs,
    }))
}

/// PBS sizes: `100mb`, `102400kb`, `0b`, `1gb`, `2w` (words of 8 bytes), powers of 1024.
pub fn size_bytes(text: &str) -> Option<u64> {
    let t = text.trim().to_ascii_lowercase();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let number: u64 = number.parse().ok()?;
    let (scale, word) = match unit.strip_suffix('w') {
        Some(prefix) => (prefix, 8),
        None => (unit.strip_suffix('b').unwrap_or(unit), 1),
    };
    let power = match scale {
        "" => 0,
        "k" => 1,
        "m" => 2,
        "g" => 3,
        "t" => 4,
        "p" => 5,
        _ => return None,
    };
    number.checked_mul(word)?.checked_mul(1u64 << (10 * power))
}

/// `HH:MM:SS`, `MM:SS` or seconds (PBS durations) → seconds.
pub fn duration_seconds(text: &str) -> Option<u64> {
    let mut total: u64 = 0;
    let parts: Vec<&str> = text.trim().split(':').collect();
    if parts.len() > 3 || parts.iter().any(|p| p.is_empty()) {
        return None;
    }
    for p in parts {
        let n: u64 = p.split('.').next()?.parse().ok()?;
        total = total.checked_mul(60)?.checked_add(n)?;
    }
    Some(total)
}

/// An ended job's state in the server's (Slurm's) words, from PBS's `Exit_status`: negative
/// values are PBS's own (`JOB_EXEC_KILL_*`), above 256 a signal (`qdel` sends SIGTERM).
pub fn end_state(exit_status: i64) -> &'static str {
    match exit_status {
        0 => "COMPLETED",
        -29 => "TIMEOUT",
        -27 | -26 => "OUT_OF_MEMORY",
        s if s > 256 && matches!(s - 256, 9 | 15) => "CANCELLED",
        _ => "FAILED",
    }
}

/// Slurm's `code:signal` spelling of an exit status.
pub fn exit_code(exit_status: i64) -> String {
    if exit_status > 256 {
        format!("0:{}", exit_status - 256)
    } else {
        format!("{exit_status}:0")
    }
}

/// The hosts of `exec_host` (`n1/0*2+n2/1`), each once, in order.
pub fn exec_hosts(text: &str) -> Vec<String> {
    let mut hosts: Vec<String> = Vec::new();
    for part in text.split('+') {
        let host = part.split('/').next().unwrap_or("").trim();
        if !host.is_empty() && !hosts.iter().any(|h| h == host) {
            hosts.push(host.to_owned());
        }
    }
    hosts
}

/// What a `Q`, `S`, `E`, `R` or `A` record says of its job; `now` is for a running job's
/// elapsed time, `to_utc` what turns the line's local time into UTC. A `D` record names no
/// job's attributes: see [`deleted`].
pub fn unit_record(rec: &LogRecord, now: i64, to_utc: i64) -> UnitRecord {
    let a = |k: &str| rec.attrs.get(k).cloned().unwrap_or_default();
    let start = rec.epoch("start");
    let end = rec.epoch("end");
    let mut unit = UnitRecord {
        uuid: rec.id.clone(),
        partition: a("queue"),
        account: a("project"),
        group: a("group"),
        user: a("user"),
        submit: rec.epoch("ctime").or_else(|| rec.epoch("qtime")),
        start,
        name: a("jobname"),
        time_limit_seconds: rec
            .attrs
            .get("Resource_List.walltime")
            .and_then(|w| duration_seconds(w)),
        allocation: Allocation {
            cpus: number(rec.attrs.get("Resource_List.ncpus")),
            mem_bytes: rec
                .attrs
                .get("Resource_List.mem")
                .and_then(|m| size_bytes(m))
                .unwrap_or(0),
            gpus: number(rec.attrs.get("Resource_List.ngpus")),
            billing: 0,
            nodes: number(rec.attrs.get("Resource_List.nodect")),
        },
        nodes: rec
            .attrs
            .get("exec_host")
            .map(|h| exec_hosts(h))
            .unwrap_or_default(),
        ..UnitRecord::default()
    };
    match rec.kind {
        RecordKind::Queued | RecordKind::Deleted => unit.state = "PENDING".into(),
        RecordKind::Started => {
            unit.state = "RUNNING".into();
            unit.elapsed_seconds = start.map_or(0, |s| u64::try_from(now - s).unwrap_or(0));
        }
        RecordKind::Rerun => {
            unit.state = "REQUEUED".into();
            unit.start = None;
        }
        RecordKind::Aborted => {
            unit.state = "FAILED".into();
            unit.end = Some(end.unwrap_or(rec.logged + to_utc));
        }
        RecordKind::Ended => {
            let status: i64 = rec
                .attrs
                .get("Exit_status")
                .and_then(|s| s.parse().ok())
                .unwrap_or(-1);
            unit.state = end_state(status).into();
            unit.exit_code = exit_code(status);
            unit.end = Some(end.unwrap_or(rec.logged + to_utc));
            unit.elapsed_seconds = rec
                .attrs
                .get("resources_used.walltime")
                .and_then(|w| duration_seconds(w))
                .or_else(|| Some(u64::try_from(unit.end? - start?).unwrap_or(0)))
                .unwrap_or(0);
        }
    }
    unit
}

/// A job deleted before it ran (`D` of a job that has no start): cancelled at the record's
/// time. A started job's deletion is its `E` record's to tell.
pub fn deleted(known: &UnitRecord, rec: &LogRecord, to_utc: i64) -> Option<UnitRecord> {
    if known.start.is_some() {
        return None;
    }
    let mut unit = known.clone();
    unit.state = "CANCELLED".into();
    unit.end = Some(rec.logged + to_utc);
    Some(unit)
}

fn number(v: Option<&String>) -> u64 {
    v.and_then(|n| n.trim().parse::<u64>().ok()).unwrap_or(0)
}

/// `qstat -f -F json`'s document (the fields read).
#[derive(Debug, Deserialize)]
struct QstatDocument {
    #[serde(rename = "Jobs", default)]
    jobs: BTreeMap<String, Value>,
}

/// The jobs of a `qstat -f -F json [-x] [-t]` answer, each or why it cannot be read; array
/// parents are left out (their sub-jobs are the units). `now` is for running jobs' elapsed
/// time.
pub fn parse_qstat(
    json: &str,
    now: i64,
) -> Result<Vec<Result<UnitRecord, ParseError>>, ParseError> {
    let doc: QstatDocument = serde_json::from_str(json)
        .map_err(|e| ParseError::new(0, format!("qstat -F json: not a JSON document: {e}")))?;
    Ok(doc
        .jobs
        .iter()
        .enumerate()
        .filter(|(_, (id, _))| super::is_job_id(id))
        .map(|(i, (id, job))| qstat_job(id, job, now).map_err(|m| ParseError::new(i + 1, m)))
        .collect())
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn qstat_job(id: &str, job: &Value, now: i64) -> Result<UnitRecord, String> {
    let obj = job
        .as_object()
        .ok_or_else(|| format!("job {id}: not an object"))?;
    let field = |k: &str| obj.get(k).and_then(text);
    let list = |k: &str| {
        obj.get("Resource_List")
            .and_then(|r| r.get(k))
            .and_then(text)
    };
    let time = |k: &str| -> Result<Option<i64>, String> {
        match field(k) {
            None => Ok(None),
            Some(t) => parse_asctime(&t)
                .map(Some)
                .ok_or_else(|| format!("job {id}: {k} `{}` is not a time", truncate(&t))),
        }
    };
    let owner = field("Job_Owner").unwrap_or_default();
    let user = field("euser").unwrap_or_else(|| owner.split('@').next().unwrap_or("").to_owned());
    if user.is_empty() {
        return Err(format!("job {id}: no owner"));
    }
    let state = field("job_state").ok_or_else(|| format!("job {id}: no job_state"))?;
    let start = time("stime")?;
    let mut unit = UnitRecord {
        uuid: id.to_owned(),
        partition: field("queue").unwrap_or_default(),
        account: field("project").unwrap_or_default(),
        group: field("egroup").unwrap_or_default(),
        user,
        submit: time("ctime")?,
        start,
        name: field("Job_Name").unwrap_or_default(),
        workdir: obj
            .get("Variable_List")
            .and_then(|v| v.get("PBS_O_WORKDIR"))
            .and_then(text)
            .unwrap_or_default(),
        time_limit_seconds: list("walltime").and_then(|w| duration_seconds(&w)),
        allocation: Allocation {
            cpus: list("ncpus").and_then(|n| n.parse().ok()).unwrap_or(0),
            mem_bytes: list("mem").and_then(|m| size_bytes(&m)).unwrap_or(0),
            gpus: list("ngpus").and_then(|n| n.parse().ok()).unwrap_or(0),
            billing: 0,
            nodes: list("nodect").and_then(|n| n.parse().ok()).unwrap_or(0),
        },
        nodes: field("exec_host")
            .map(|h| exec_hosts(&h))
            .unwrap_or_default(),
        ..UnitRecord::default()
    };
    let used_walltime = obj
        .get("resources_used")
        .and_then(|r| r.get("walltime"))
        .and_then(text)
        .and_then(|w| duration_seconds(&w));
    let status: Option<i64> = field("Exit_status").and_then(|s| s.parse().ok());
    unit.state = match state.as_str() {
        "Q" | "H" | "W" | "T" => "PENDING",
        "R" | "E" | "B" | "X" => "RUNNING",
        "S" | "U" => "SUSPENDED",
        "M" => "PENDING",
        "F" => match status {
            Some(s) => end_state(s),
            // Deleted before it ran.
            None if start.is_none() => "CANCELLED",
            None => "FAILED",
        },
        other => {
            return Err(format!(
                "job {id}: job_state `{}` is not PBS's",
                truncate(other)
            ))
        }
    }
    .to_owned();
    if state == "F" {
        unit.end = time("obittime")?.or(time("mtime")?);
        unit.exit_code = status.map(exit_code).unwrap_or_default();
        unit.elapsed_seconds = used_walltime
            .or_else(|| Some(u64::try_from(unit.end? - start?).unwrap_or(0)))
            .unwrap_or(0);
    } else if let Some(s) = start.filter(|_| unit.state != "PENDING") {
        unit.elapsed_seconds = u64::try_from(now - s).unwrap_or(0);
    }
    Ok(unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as the lab's OpenPBS (23.06) wrote them.
    const LOG: &str = "\
11/26/2026 00:00:00;L;license;floating license hour:0 day:0 month:0 max:0
11/26/2026 00:00:20;Q;1[].pbslab;user=alice group=alice project=_pbs_project_default jobname=arr queue=workq ctime=1795651220 qtime=1795651220 etime=1795651220 array_indices=1-2 Resource_List.mem=100mb Resource_List.ncpus=1 Resource_List.nodect=1 Resource_List.place=free Resource_List.select=1:ncpus=1:mem=100mb Resource_List.walltime=00:02:00 
11/26/2026 00:00:20;S;1[1].pbslab;user=alice group=alice project=_pbs_project_default jobname=arr queue=workq ctime=1795651220 qtime=1795651220 etime=1795651220 start=1795651220 exec_host=pbslab/0 exec_vnode=(pbslab:ncpus=1:mem=102400kb) Resource_List.mem=100mb Resource_List.ncpus=1 Resource_List.nodect=1 Resource_List.place=free Resource_List.select=1:ncpus=1:mem=100mb Resource_List.walltime=00:02:00 resource_assigned.mem=102400kb resource_assigned.ncpus=1 
11/26/2026 00:00:26;E;1[1].pbslab;user=alice group=alice project=_pbs_project_default jobname=arr queue=workq ctime=1795651220 qtime=1795651220 etime=1795651220 start=1795651220 exec_host=pbslab/0 exec_vnode=(pbslab:ncpus=1:mem=102400kb) Resource_List.mem=100mb Resource_List.ncpus=1 Resource_List.nodect=1 Resource_List.place=free Resource_List.select=1:ncpus=1:mem=100mb Resource_List.walltime=00:02:00 session=12744 end=1795651226 Exit_status=0 resources_used.cpupercent=0 resources_used.cput=00:00:00 resources_used.diag_messages='{}' resources_used.mem=256kb resources_used.ncpus=1 resources_used.vmem=0kb resources_used.walltime=00:00:05 run_count=1
11/26/2026 00:00:35;Q;2.pbslab;user=alice group=alice project=_pbs_project_default jobname=held queue=workq ctime=1795651235 qtime=1795651235 etime=0 Resource_List.ncpus=1 Resource_List.nodect=1 Resource_List.place=pack Resource_List.select=1:ncpus=1 
11/26/2026 00:00:35;D;2.pbslab;requestor=alice@pbslab
11/26/2026 00:00:41;E;3.pbslab;user=alice group=alice project=\"big project\" jobname=killme queue=workq ctime=1795651235 qtime=1795651235 etime=1795651235 start=1795651235 exec_host=pbslab/0*2+n2/1 Resource_List.ncpus=2 Resource_List.walltime=00:01:00 session=13007 end=1795651241 Exit_status=271 resources_used.walltime=00:00:03 run_count=1
";

    fn records() -> Vec<LogRecord> {
        LOG.lines().filter_map(|l| parse_line(l).unwrap()).collect()
    }

    #[test]
    fn job_records_of_the_log_and_nothing_else() {
        let recs = records();
        let seen: Vec<(RecordKind, &str)> = recs.iter().map(|r| (r.kind, r.id.as_str())).collect();
        // The license line and the array's parent are not jobs.
        assert_eq!(
            seen,
            [
                (RecordKind::Started, "1[1].pbslab"),
                (RecordKind::Ended, "1[1].pbslab"),
                (RecordKind::Queued, "2.pbslab"),
                (RecordKind::Deleted, "2.pbslab"),
                (RecordKind::Ended, "3.pbslab"),
            ]
        );
        assert_eq!(recs[1].attrs["resources_used.diag_messages"], "{}");
        assert_eq!(recs[4].attrs["project"], "big project");
        assert_eq!(recs[0].utc_offset(), Some(0));
    }

    #[test]
    fn ended_jobs_become_rows_with_pbs_s_figures() {
        let recs = records();
        let done = unit_record(&recs[1], 0, 0);
        assert_eq!(done.uuid, "1[1].pbslab");
        assert_eq!(
            (done.user.as_str(), done.group.as_str()),
            ("alice", "alice")
        );
        assert_eq!(done.partition, "workq");
        assert_eq!(done.account, "_pbs_project_default");
        assert_eq!(done.state, "COMPLETED");
        assert_eq!(done.exit_code, "0:0");
        assert_eq!((done.start, done.end), (Some(1795651220), Some(1795651226)));
        assert_eq!(done.elapsed_seconds, 5);
        assert_eq!(done.time_limit_seconds, Some(120));
        assert_eq!(done.allocation.mem_bytes, 100 << 20);
        assert_eq!((done.allocation.cpus, done.allocation.nodes), (1, 1));
        assert_eq!(done.nodes, ["pbslab"]);
        assert_eq!(done.name, "arr");

        let killed = unit_record(&recs[4], 0, 0);
        assert_eq!(killed.state, "CANCELLED");
        assert_eq!(killed.exit_code, "0:15");
        assert_eq!(killed.nodes, ["pbslab", "n2"]);

        let running = unit_record(&recs[0], 1795651230, 0);
        assert_eq!(
            (running.state.as_str(), running.elapsed_seconds),
            ("RUNNING", 10)
        );

        let queued = unit_record(&recs[2], 0, 0);
        let gone = deleted(&queued, &recs[3], 3600).unwrap();
        assert_eq!(gone.state, "CANCELLED");
        assert_eq!(gone.end, Some(recs[3].logged + 3600));
        assert!(
            deleted(&running, &recs[3], 0).is_none(),
            "a started job's E says how it ended"
        );
    }

    #[test]
    fn exit_statuses_in_the_server_s_words() {
        assert_eq!(end_state(0), "COMPLETED");
        assert_eq!(end_state(1), "FAILED");
        assert_eq!(end_state(-29), "TIMEOUT");
        assert_eq!(end_state(-27), "OUT_OF_MEMORY");
        assert_eq!(end_state(265), "CANCELLED");
        assert_eq!(end_state(267), "FAILED");
        assert_eq!(exit_code(-29), "-29:0");
    }

    #[test]
    fn sizes_and_durations_as_pbs_writes_them() {
        assert_eq!(size_bytes("102400kb"), Some(100 << 20));
        assert_eq!(size_bytes("1GB"), Some(1 << 30));
        assert_eq!(size_bytes("0b"), Some(0));
        assert_eq!(size_bytes("512"), Some(512));
        assert_eq!(size_bytes("2kw"), Some(16384));
        for bad in ["", "kb", "1xb", "1.5gb", "99999999999pb"] {
            assert_eq!(size_bytes(bad), None, "{bad}");
        }
        assert_eq!(duration_seconds("01:02:03"), Some(3723));
        assert_eq!(duration_seconds("300"), Some(300));
        assert_eq!(duration_seconds("2:30"), Some(150));
        for bad in ["", "1:2:3:4", "a", "1::2"] {
            assert_eq!(duration_seconds(bad), None, "{bad}");
        }
    }

    #[test]
    fn malformed_lines_say_why() {
        for (bad, why) in [
            ("garbage", "is not time;type;id"),
            ("13/01/2026 00:00:00;E;1.s;user=a", "not a log time"),
            ("11/26/2026 00:00:00;E;1.s;user=a noequals", "not key=value"),
            (
                "11/26/2026 00:00:00;E;1.s;project=\"open end",
                "unterminated quote",
            ),
        ] {
            let err = parse_line(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
        assert_eq!(parse_line("11/26/2026 00:00:00;B;R12.s;x=y").unwrap(), None);
        assert_eq!(parse_line("11/26/2026 00:00:00;E;R12.s;x=y").unwrap(), None);
    }

    /// As the lab's `qstat -x -f -F json -t` printed it (trimmed).
    const QSTAT: &str = r#"{
        "timestamp": 1795651220, "pbs_version": "23.06.06", "pbs_server": "pbslab",
        "Jobs": {
            "0.pbslab": {
                "Job_Name": "STDIN", "Job_Owner": "alice@pbslab",
                "resources_used": {"cput": "00:00:00", "mem": "0b", "ncpus": 1, "walltime": "00:00:10"},
                "job_state": "F", "queue": "workq", "ctime": "Wed Nov 25 23:57:58 2026",
                "exec_host": "pbslab/0", "mtime": "Wed Nov 25 23:59:56 2026",
                "Resource_List": {"ncpus": 1, "nodect": 1, "select": "1:ncpus=1", "walltime": "00:05:00"},
                "stime": "Wed Nov 25 23:57:58 2026", "obittime": "Wed Nov 25 23:59:56 2026",
                "Variable_List": {"PBS_O_WORKDIR": "/tmp"},
                "euser": "alice", "egroup": "alice", "Exit_status": 0, "project": "_pbs_project_default"
            },
            "1[].pbslab": {"Job_Name": "arr", "Job_Owner": "alice@pbslab", "job_state": "B", "array": "True"},
            "1[2].pbslab": {
                "Job_Name": "arr", "Job_Owner": "alice@pbslab", "job_state": "R", "queue": "workq",
                "ctime": "Thu Nov 26 00:00:20 2026", "stime": "Thu Nov 26 00:00:20 2026",
                "Resource_List": {"mem": "100mb", "ncpus": 1, "ngpus": 2}
            },
            "4.pbslab": {"Job_Owner": "alice@pbslab", "job_state": "Z"}
        }
    }"#;

    #[test]
    fn qstat_json_jobs_with_their_state_and_figures() {
        let jobs = parse_qstat(QSTAT, 1795651230).unwrap();
        assert_eq!(jobs.len(), 3, "the array's parent is not a unit");
        let done = jobs[0].as_ref().unwrap();
        assert_eq!(done.uuid, "0.pbslab");
        assert_eq!(
            (done.state.as_str(), done.exit_code.as_str()),
            ("COMPLETED", "0:0")
        );
        assert_eq!(done.start, Some(1795651078));
        assert_eq!(done.end, Some(1795651196));
        assert_eq!(done.elapsed_seconds, 10);
        assert_eq!(done.time_limit_seconds, Some(300));
        assert_eq!(done.workdir, "/tmp");
        let running = jobs[1].as_ref().unwrap();
        assert_eq!(
            (running.state.as_str(), running.elapsed_seconds),
            ("RUNNING", 10)
        );
        assert_eq!(running.user, "alice", "from Job_Owner when euser is absent");
        assert_eq!(
            (running.allocation.gpus, running.allocation.mem_bytes),
            (2, 100 << 20)
        );
        let err = jobs[2].as_ref().unwrap_err();
        assert!(err.message.contains("job_state `Z`"), "{err}");
        assert!(parse_qstat("{", 0).is_err());
        assert!(parse_qstat(r#"{"pbs_server":"s"}"#, 0).unwrap().is_empty());
    }
}
