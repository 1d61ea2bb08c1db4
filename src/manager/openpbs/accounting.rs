//! The stats-server's side of OpenPBS: the server's accounting log, read incrementally, and
//! `qstat -f -F json` for a single job or, where the log is not on this host, for the jobs
//! the server still holds.
//!
//! The log is one file a day (`server_priv/accounting/YYYYMMDD`, named by the server's local
//! date). Each file's read position is remembered, so a pull reads only what was appended; a
//! file that shrank or was replaced is read again from its start. Jobs are kept by id with
//! the time of their last record, and a pull answers every job of its window, not only the
//! lines read since the last pull: an ingestion that failed is answered again in full, and a
//! job read twice is still one row. A partial last line is left for the next pull.
//!
//! PBS has no list of who belongs to which project (`qsub -P` takes any name): no project
//! membership is pulled, as for LSF.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use super::records::{self, LogRecord, RecordKind};
use crate::host::command::{self, CommandError};
use crate::host::ParseError;
use crate::manager::civil::civil_from_days;
use crate::manager::{
    unix_now, Accounting, AccountingError, Associations, UnitRecord, UnitRecords,
};

/// Largest `qstat` answer read.
const MAX_OUTPUT: u64 = 1 << 30;
/// Most bytes of log read in one pull (the rest is read by the next).
const MAX_READ: u64 = 256 << 20;
/// A line longer than this is not a record (a corrupt file): it is skipped.
const MAX_LINE: usize = 1 << 20;

/// Where a log file was read to.
#[derive(Debug, Clone, Copy)]
struct FilePosition {
    ino: u64,
    offset: u64,
}

/// A job as the log last described it.
#[derive(Debug, Clone)]
struct KnownJob {
    unit: UnitRecord,
    /// Epoch seconds of its last record.
    last: i64,
}

impl KnownJob {
    fn ended(&self) -> bool {
        self.unit.end.is_some()
    }
}

/// What the log has told so far.
#[derive(Debug, Default)]
pub struct Journal {
    files: HashMap<PathBuf, FilePosition>,
    jobs: HashMap<String, KnownJob>,
    /// The server's offset from UTC (its log lines are local time), learnt from records
    /// that carry both.
    utc_offset: Option<i64>,
}

/// A day's file name (`20261126`) as days since 1970-01-01.
fn file_day(name: &str) -> Option<i64> {
    if name.len() != 8 || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let year: i64 = name[..4].parse().ok()?;
    let month: i64 = name[4..6].parse().ok().filter(|m| (1..=12).contains(m))?;
    let day: i64 = name[6..].parse().ok().filter(|d| (1..=31).contains(d))?;
    Some(crate::manager::civil::days_from_civil(year, month, day))
}

/// The file name of a day.
pub fn day_file(days: i64) -> String {
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}{m:02}{d:02}")
}

impl Journal {
    /// Reads what was appended to the files of the days from `since` on, and answers the
    /// jobs that changed from `since` on or have not ended.
    pub fn pull(
        &mut self,
        dir: &Path,
        since: i64,
        now: i64,
    ) -> Result<Vec<Result<UnitRecord, ParseError>>, AccountingError> {
        // A day's file is named by the server's local date: a day on each side covers any
        // offset from UTC.
        let first_day = since.div_euclid(86_400) - 1;
        let entries = std::fs::read_dir(dir).map_err(|e| {
            AccountingError::Other(format!(
                "cannot list PBS's accounting directory {}: {e}",
                dir.display()
            ))
        })?;
        let mut days: Vec<(i64, PathBuf)> = entries
            .flatten()
            .filter_map(|e| {
                let day = file_day(e.file_name().to_str()?)?;
                (day >= first_day).then(|| (day, e.path()))
            })
            .collect();
        days.sort();
        self.files
            .retain(|path, _| days.iter().any(|(_, p)| p == path));
        let mut errors = Vec::new();
        let mut budget = MAX_READ;
        for (_, path) in &days {
            if budget == 0 {
                break;
            }
            match self.read_file(path, now, &mut budget) {
                Ok(mut e) => errors.append(&mut e),
                Err(e) => errors.push(ParseError::new(
                    0,
                    format!("cannot read {}: {e}", path.display()),
                )),
            }
        }
        self.jobs.retain(|_, j| !j.ended() || j.last >= since);
        let mut out: Vec<Result<UnitRecord, ParseError>> = errors.into_iter().map(Err).collect();
        let mut jobs: Vec<&KnownJob> = self.jobs.values().collect();
        jobs.sort_by(|a, b| (a.last, &a.unit.uuid).cmp(&(b.last, &b.unit.uuid)));
        for job in jobs {
            let mut unit = job.unit.clone();
            if unit.state == "RUNNING" {
                if let Some(start) = unit.start {
                    unit.elapsed_seconds = u64::try_from(now - start).unwrap_or(0);
                }
            }
            out.push(Ok(unit));
        }
        Ok(out)
    }

    /// A job the log has described, for a single job's question when qstat cannot answer.
    pub fn job(&self, id: &str) -> Option<UnitRecord> {
        self.jobs.get(id).map(|j| j.unit.clone())
    }

    fn read_file(
        &mut self,
        path: &Path,
        now: i64,
        budget: &mut u64,
    ) -> std::io::Result<Vec<ParseError>> {
        let mut file = File::open(path)?;
        let meta = file.metadata()?;
        let mut pos = match self.files.get(path) {
            // Replaced (a new inode) or truncated: read it again from its start.
            Some(p) if p.ino == meta.ino() && p.offset <= meta.len() => *p,
            _ => FilePosition {
                ino: meta.ino(),
                offset: 0,
            },
        };
        if pos.offset == meta.len() {
            self.files.insert(path.to_owned(), pos);
            return Ok(Vec::new());
        }
        file.seek(SeekFrom::Start(pos.offset))?;
        let want = (meta.len() - pos.offset).min(*budget);
        let mut buf = Vec::with_capacity(usize::try_from(want).unwrap_or(0));
        file.take(want).read_to_end(&mut buf)?;
        // Only whole lines: the server may be writing the last one.
        let whole = match buf.iter().rposition(|b| *b == b'\n') {
            Some(at) => at + 1,
            None if buf.len() >= MAX_LINE => buf.len(),
            None => 0,
        };
        *budget -= whole as u64;
        // Line numbers are known only for a file read from its start.
        let first_line = (pos.offset == 0).then_some(1);
        let mut errors = Vec::new();
        for (i, line) in buf[..whole].split(|b| *b == b'\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            let number = first_line.map_or(0, |n| n + i);
            if line.len() > MAX_LINE {
                errors.push(ParseError::new(number, "a line too long to be a record"));
                continue;
            }
            let text = String::from_utf8_lossy(line);
            match records::parse_line(&text) {
                Ok(Some(rec)) => self.apply(&rec, now),
                Ok(None) => {}
                Err(e) => errors.push(ParseError::new(number, format!("{}: {e}", path.display()))),
            }
        }
        pos.offset += whole as u64;
        self.files.insert(path.to_owned(), pos);
        Ok(errors)
    }

    fn apply(&mut self, rec: &LogRecord, now: i64) {
        if let Some(offset) = rec.utc_offset() {
            self.utc_offset = Some(offset);
        }
        // Without a record that shows it yet, the server's clock is taken as UTC.
        let offset = self.utc_offset.unwrap_or(0);
        let at = rec.logged - offset;
        let unit = match rec.kind {
            RecordKind::Deleted | RecordKind::Aborted if !rec.attrs.contains_key("user") => {
                // Deleted or aborted before it ran: only the job's earlier records name it.
                let Some(known) = self.jobs.get(&rec.id) else {
                    return;
                };
                let mut unit = if rec.kind == RecordKind::Deleted {
                    match records::deleted(&known.unit, rec, -offset) {
                        Some(u) => u,
                        None => return,
                    }
                } else {
                    let mut u = known.unit.clone();
                    u.state = "FAILED".into();
                    u.end = Some(at);
                    u
                };
                unit.elapsed_seconds = 0;
                unit
            }
            RecordKind::Deleted => return,
            _ => records::unit_record(rec, now, -offset),
        };
        match self.jobs.get(&rec.id) {
            // A file read again, or an older file read after a newer one, tells nothing new.
            Some(known) if known.last > at => {}
            _ => {
                self.jobs
                    .insert(rec.id.clone(), KnownJob { unit, last: at });
            }
        }
    }
}

/// One PBS complex's accounting.
#[derive(Debug)]
pub struct PbsAccounting {
    /// The server's `server_priv/accounting`; None where the stats-server does not run on the
    /// PBS server's host (then `qstat -x` answers the window).
    pub accounting_dir: Option<PathBuf>,
    /// Where `qstat` is; None: the log only.
    pub bin_dir: Option<PathBuf>,
    /// Variables PBS's commands need beside `TZ` (`PBS_CONF_FILE=…`).
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
    journal: Mutex<Journal>,
}

impl PbsAccounting {
    pub fn new(
        accounting_dir: Option<PathBuf>,
        bin_dir: Option<PathBuf>,
        env: Vec<(String, String)>,
        timeout: Duration,
    ) -> PbsAccounting {
        PbsAccounting {
            accounting_dir,
            bin_dir,
            env,
            timeout,
            journal: Mutex::new(Journal::default()),
        }
    }

    /// PBS's accounting directory and its commands' directory as `pbs.conf` (`PBS_HOME`,
    /// `PBS_EXEC`) names them.
    pub fn from_pbs_conf(conf: &Path) -> (Option<PathBuf>, Option<PathBuf>) {
        let Ok(text) = std::fs::read_to_string(conf) else {
            return (None, None);
        };
        let value = |key: &str| {
            // The last setting wins, as PBS reads the file.
            text.lines()
                .rev()
                .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
                .map(|v| PathBuf::from(v.trim()))
        };
        (
            value("PBS_HOME").map(|h| h.join("server_priv/accounting")),
            value("PBS_EXEC").map(|e| e.join("bin")),
        )
    }

    /// What PBS's commands run with: `TZ=UTC` and the configured variables.
    fn command_env(&self) -> Vec<(&str, &str)> {
        let mut env: Vec<(&str, &str)> = vec![("TZ", "UTC")];
        env.extend(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        env
    }

    fn qstat(
        &self,
        args: &[&str],
        now: i64,
    ) -> Result<Vec<Result<UnitRecord, ParseError>>, AccountingError> {
        let Some(dir) = &self.bin_dir else {
            return Ok(Vec::new());
        };
        let env = self.command_env();
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let out = match command::run_env(&dir.join("qstat"), &args, &env, self.timeout, MAX_OUTPUT)
        {
            Ok(out) => out,
            // qstat's answer for an id it does not hold.
            Err(CommandError::Failed { stderr, .. })
                if stderr.contains("Unknown Job Id") || stderr.contains("Job has finished") =>
            {
                return Ok(Vec::new())
            }
            Err(e) => return Err(e.into()),
        };
        if out.trim().is_empty() {
            return Ok(Vec::new());
        }
        records::parse_qstat(&out, now).map_err(|e| AccountingError::Other(e.to_string()))
    }
}

impl Accounting for PbsAccounting {
    fn manager(&self) -> &'static str {
        super::MANAGER
    }

    fn units_since(&self, seconds_ago: i64) -> Result<UnitRecords, AccountingError> {
        let now = unix_now();
        let since = now - seconds_ago.max(0);
        let records = match &self.accounting_dir {
            Some(dir) => {
                let mut journal = self.journal.lock().unwrap_or_else(|p| p.into_inner());
                journal.pull(dir, since, now)?
            }
            // Without the log: every job the server holds, its history included, those
            // that ended before the window left out.
            None => self
                .qstat(&["-x", "-t", "-f", "-F", "json"], now)?
                .into_iter()
                .filter(|r| {
                    r.as_ref()
                        .map_or(true, |u| u.end.is_none_or(|e| e >= since))
                })
                .collect(),
        };
        Ok(crate::manager::whole_answer(records))
    }

    fn unit(&self, id: &str) -> Result<UnitRecords, AccountingError> {
        let now = unix_now();
        let mut records = self.qstat(&["-x", "-t", "-f", "-F", "json", id], now)?;
        records.retain(|r| r.as_ref().map_or(true, |u| u.uuid == id));
        if records.is_empty() {
            let journal = self.journal.lock().unwrap_or_else(|p| p.into_inner());
            records.extend(journal.job(id).map(Ok));
        }
        Ok(crate::manager::whole_answer(records))
    }

    fn associations(&self) -> Option<Result<(Associations, Vec<ParseError>), AccountingError>> {
        None
    }

    /// `qdel ID`, run where `qstat` is; qdel has no owner filter, so the caller checks the
    /// owner against qstat's answer just before.
    fn cancel(&self, unit: &UnitRecord) -> Result<String, AccountingError> {
        let Some(dir) = &self.bin_dir else {
            return Err(AccountingError::Unsupported(
                "no directory of PBS's commands (bin-dir): qdel cannot run".into(),
            ));
        };
        crate::manager::check_nameable(unit)?;
        let env = self.command_env();
        let out = command::run_env(
            &dir.join("qdel"),
            std::slice::from_ref(&unit.uuid),
            &env,
            self.timeout,
            1 << 20,
        )?;
        Ok(match out.trim() {
            "" => format!("qdel {}", unit.uuid),
            said => said.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const Q: &str = "11/26/2026 00:00:35;Q;3.pbslab;user=alice group=alice project=p jobname=j queue=workq ctime=1795651235 qtime=1795651235 etime=1795651235 Resource_List.ncpus=1\n";
    const S: &str = "11/26/2026 00:00:35;S;3.pbslab;user=alice group=alice project=p jobname=j queue=workq ctime=1795651235 qtime=1795651235 start=1795651235 exec_host=pbslab/0 Resource_List.ncpus=1\n";
    const E: &str = "11/26/2026 00:00:41;E;3.pbslab;user=alice group=alice project=p jobname=j queue=workq ctime=1795651235 qtime=1795651235 start=1795651235 exec_host=pbslab/0 Resource_List.ncpus=1 end=1795651241 Exit_status=0 resources_used.walltime=00:00:06\n";
    const NOW: i64 = 1795651300;

    fn ids(records: &[Result<UnitRecord, ParseError>]) -> Vec<(String, String)> {
        records
            .iter()
            .map(|r| {
                let u = r.as_ref().unwrap();
                (u.uuid.clone(), u.state.clone())
            })
            .collect()
    }

    #[test]
    fn a_line_being_written_is_read_once_it_is_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("20261126");
        let mut f = File::create(&path).unwrap();
        f.write_all(Q.as_bytes()).unwrap();
        f.write_all(S.as_bytes()).unwrap();
        f.write_all(&E.as_bytes()[..40]).unwrap();
        let mut journal = Journal::default();
        let first = journal.pull(dir.path(), NOW - 600, NOW).unwrap();
        assert_eq!(ids(&first), [("3.pbslab".into(), "RUNNING".into())]);
        assert_eq!(first[0].as_ref().unwrap().elapsed_seconds, 65);
        f.write_all(&E.as_bytes()[40..]).unwrap();
        let second = journal.pull(dir.path(), NOW - 600, NOW).unwrap();
        assert_eq!(ids(&second), [("3.pbslab".into(), "COMPLETED".into())]);
        // Nothing new: the window's jobs again, not twice.
        let third = journal.pull(dir.path(), NOW - 600, NOW).unwrap();
        assert_eq!(ids(&third), ids(&second));
        // A window after the job's end no longer holds it.
        assert!(journal.pull(dir.path(), NOW, NOW).unwrap().is_empty());
    }

    #[test]
    fn a_truncated_or_replaced_file_loses_and_doubles_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("20261126");
        std::fs::write(&path, format!("{Q}{S}")).unwrap();
        let mut journal = Journal::default();
        journal.pull(dir.path(), NOW - 600, NOW).unwrap();
        // Replaced by a copy that holds the whole day (a new inode) ...
        let tmp = dir.path().join("new");
        let other = Q.replace("3.pbslab", "4.pbslab");
        std::fs::write(&tmp, format!("{Q}{S}{E}{other}")).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        let after = journal.pull(dir.path(), NOW - 600, NOW).unwrap();
        assert_eq!(
            ids(&after),
            [
                ("4.pbslab".into(), "PENDING".into()),
                ("3.pbslab".into(), "COMPLETED".into())
            ]
        );
        // ... then truncated to its first line: read again, and an older record does not
        // undo the end already seen.
        std::fs::write(&path, Q).unwrap();
        let again = journal.pull(dir.path(), NOW - 600, NOW).unwrap();
        assert_eq!(ids(&again), ids(&after));
    }

    #[test]
    fn the_next_day_s_file_is_read_and_old_days_are_not() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("20261126"), format!("{Q}{S}")).unwrap();
        let old = Q
            .replace("3.pbslab", "1.pbslab")
            .replace("11/26/2026", "11/20/2026");
        std::fs::write(dir.path().join("20261120"), old).unwrap();
        std::fs::write(dir.path().join("20261126.gz"), "not a day's log").unwrap();
        let mut journal = Journal::default();
        assert_eq!(journal.pull(dir.path(), NOW - 600, NOW).unwrap().len(), 1);
        std::fs::write(
            dir.path().join("20261127"),
            E.replace("11/26/2026", "11/27/2026"),
        )
        .unwrap();
        let next = journal.pull(dir.path(), NOW - 600, NOW).unwrap();
        assert_eq!(ids(&next), [("3.pbslab".into(), "COMPLETED".into())]);
    }

    #[test]
    fn a_queued_job_deleted_is_cancelled_at_the_server_s_local_time() {
        let dir = tempfile::tempdir().unwrap();
        // A server two hours ahead of UTC: its lines' times are local.
        let q = "11/26/2026 02:00:35;Q;2.pbslab;user=alice group=alice project=p jobname=held queue=workq ctime=1795651235 qtime=1795651235 etime=0 Resource_List.ncpus=1\n";
        let d = "11/26/2026 02:01:35;D;2.pbslab;requestor=alice@pbslab\n";
        std::fs::write(dir.path().join("20261126"), format!("{q}{d}garbage line\n")).unwrap();
        let mut journal = Journal::default();
        let out = journal.pull(dir.path(), NOW - 600, NOW).unwrap();
        assert_eq!(out.len(), 2);
        let err = out[0].as_ref().unwrap_err();
        assert_eq!(err.line, 3, "{err}");
        let unit = out[1].as_ref().unwrap();
        assert_eq!(unit.state, "CANCELLED");
        assert_eq!(unit.end, Some(1795651235 + 60));
    }

    #[test]
    fn pbs_conf_names_the_log_and_the_commands() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("pbs.conf");
        std::fs::write(&conf, "PBS_EXEC=/opt/pbs\nPBS_HOME=/var/spool/pbs\n").unwrap();
        assert_eq!(
            PbsAccounting::from_pbs_conf(&conf),
            (
                Some(PathBuf::from("/var/spool/pbs/server_priv/accounting")),
                Some(PathBuf::from("/opt/pbs/bin"))
            )
        );
        assert_eq!(
            PbsAccounting::from_pbs_conf(&dir.path().join("none")),
            (None, None)
        );
    }
}
