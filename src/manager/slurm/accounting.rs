//! The stats-server's side of Slurm: a cluster's jobs from `sacct`, its users and projects
//! from `sacctmgr`, both run as `runner` decides.

use super::runner::SlurmCommand;
use super::sacct::{self, FIELDS};
use crate::host::command::StdoutLines;
use crate::host::ParseError;
use crate::manager::{
    Accounting, AccountingError, Associations, RecordError, UnitRecord, UnitRecords,
};

/// Longest line of sacct's read (a job's line is a few hundred bytes; its name, work
/// directory and node list are the long fields).
pub const MAX_SACCT_LINE: usize = 1 << 20;
/// Largest sacctmgr answer read.
pub const MAX_SACCTMGR_OUTPUT: u64 = 64 << 20;

/// One Slurm cluster's accounting commands.
#[derive(Debug, Clone)]
pub struct SlurmAccounting {
    pub sacct: SlurmCommand,
    pub sacctmgr: Option<SlurmCommand>,
    /// `scancel`, for the stats-server's policies: beside sacct unless the entry names it.
    pub scancel: SlurmCommand,
    /// `--clusters=<name>` for both commands, for a slurmdbd that serves several clusters.
    pub slurm_name: Option<String>,
    /// Where sacct's times without an offset are read (`--storage.data.time-zone`).
    pub time_zone: jiff::tz::TimeZone,
}

impl SlurmAccounting {
    /// The sacct arguments for jobs since `seconds_ago` until now, every user, allocations only.
    pub fn sacct_args(&self, seconds_ago: i64) -> Vec<String> {
        self.with_format(vec![
            "-D".into(),
            // Relative times: sacct reads absolute ones in the server's local time zone.
            "--starttime".into(),
            format!("now-{}", seconds_ago.max(0)),
            "--endtime".into(),
            "now".into(),
        ])
    }

    /// The sacct arguments for one job: with `--jobs` and no start time, sacct looks back to
    /// the epoch.
    pub fn sacct_job_args(&self, id: &str) -> Vec<String> {
        self.with_format(vec!["--jobs".into(), id.to_owned()])
    }

    fn with_format(&self, mut args: Vec<String>) -> Vec<String> {
        args.extend(
            ["-X", "--noheader", "--allusers", "--parsable2", "--format"].map(str::to_owned),
        );
        args.push(FIELDS.join(","));
        if let Some(name) = &self.slurm_name {
            args.push(format!("--clusters={name}"));
        }
        args
    }

    /// scancel's arguments for job `id` of `user`: scancel leaves the job alone when another
    /// user owns it (a job id Slurm gave again).
    pub fn scancel_args(&self, id: &str, user: &str) -> Vec<String> {
        let mut args = vec![format!("--user={user}")];
        if let Some(name) = &self.slurm_name {
            args.push(format!("--clusters={name}"));
        }
        args.extend(["--".to_owned(), id.to_owned()]);
        args
    }

    pub fn sacctmgr_args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            "list",
            "associations",
            "--noheader",
            "--parsable2",
            "format=account,user",
        ]
        .map(str::to_owned)
        .to_vec();
        if let Some(name) = &self.slurm_name {
            args.push(format!("cluster={name}"));
        }
        args
    }
}

impl SlurmAccounting {
    fn records(&self, args: &[String]) -> Result<UnitRecords, AccountingError> {
        // Lines are parsed as the caller pulls them, as sacct prints them: a window of a
        // million jobs (180 MB of output) is never held.
        let lines = self
            .sacct
            .stream(args, &[("SLURM_TIME_FORMAT", "%s")], MAX_SACCT_LINE)?;
        Ok(Box::new(SacctRecords {
            lines,
            buf: Vec::new(),
            line: 0,
            zone: self.time_zone.clone(),
            broken: false,
        }))
    }
}

impl Accounting for SlurmAccounting {
    fn manager(&self) -> &'static str {
        super::MANAGER
    }

    fn units_since(&self, seconds_ago: i64) -> Result<UnitRecords, AccountingError> {
        self.records(&self.sacct_args(seconds_ago))
    }

    fn unit(&self, id: &str) -> Result<UnitRecords, AccountingError> {
        self.records(&self.sacct_job_args(id))
    }

    fn associations(&self) -> Option<Result<(Associations, Vec<ParseError>), AccountingError>> {
        let cmd = self.sacctmgr.as_ref()?;
        Some(
            cmd.run(&self.sacctmgr_args(), &[], MAX_SACCTMGR_OUTPUT)
                .map(|out| sacct::parse_associations(&out))
                .map_err(AccountingError::from),
        )
    }

    fn cancel(&self, unit: &UnitRecord) -> Result<String, AccountingError> {
        crate::manager::check_nameable(unit)?;
        let out = self
            .scancel
            .run(&self.scancel_args(&unit.uuid, &unit.user), &[], 1 << 20)?;
        Ok(match out.trim() {
            "" => format!("scancel --user={} {}", unit.user, unit.uuid),
            said => said.to_owned(),
        })
    }
}

/// The records of sacct's output, each parsed as it is read; blank lines are skipped.
struct SacctRecords {
    lines: StdoutLines,
    buf: Vec<u8>,
    line: usize,
    zone: jiff::tz::TimeZone,
    /// sacct failed: nothing comes after the error.
    broken: bool,
}

impl Iterator for SacctRecords {
    type Item = Result<UnitRecord, RecordError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.broken {
            match self.lines.next_line(&mut self.buf) {
                Ok(false) => return None,
                Ok(true) => {}
                Err(e) => {
                    self.broken = true;
                    return Some(Err(RecordError::Broken(e.into())));
                }
            }
            self.line += 1;
            let text = String::from_utf8_lossy(&self.buf);
            let line = text.trim_end_matches('\r');
            if !line.trim().is_empty() {
                return Some(
                    sacct::parse_line_in(self.line, line, &self.zone).map_err(RecordError::from),
                );
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::slurm::runner::RunMode;
    use std::time::Duration;

    fn stand_in(dir: &std::path::Path, name: &str, body: &str) -> SlurmCommand {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        SlurmCommand {
            path,
            mode: RunMode::Native,
            timeout: Duration::from_secs(10),
            env: Vec::new(),
        }
    }

    #[test]
    fn records_come_with_their_line_numbers_and_bad_lines_are_errors_not_the_end() {
        let tmp = tempfile::tempdir().unwrap();
        let good = "1|debug|normal|physics|alice|2001|alice|2001|1795358897|1795358897|1795358926|00:00:29|29|0:0|COMPLETED|cpu=1,mem=300M,node=1|localhost|/tmp|60|wrap";
        let acct = SlurmAccounting {
            sacct: stand_in(
                tmp.path(),
                "sacct",
                &format!(
                    "[ \"$SLURM_TIME_FORMAT\" = %s ] || exit 7\nprintf '%s\\n\\nbroken\\n%s\\n' '{good}' '{}'",
                    good.replacen("1|", "2|", 1)
                ),
            ),
            sacctmgr: None,
            scancel: stand_in(
                tmp.path(),
                "scancel",
                "echo \"$@\" > \"$(dirname \"$0\")/scancel.args\"",
            ),
            slurm_name: Some("lab".into()),
            time_zone: jiff::tz::TimeZone::UTC,
        };
        assert!(acct.sacct_args(60).contains(&"--clusters=lab".to_owned()));
        let one = acct.sacct_job_args("42");
        assert!(one.windows(2).any(|w| w == ["--jobs", "42"]), "{one:?}");
        assert!(!one.iter().any(|a| a == "--starttime"), "{one:?}");
        let got: Vec<_> = acct.units_since(60).unwrap().collect();
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0].as_ref().unwrap().uuid, "1");
        assert!(
            matches!(&got[1], Err(RecordError::Malformed(e)) if e.line == 3),
            "{got:?}"
        );
        assert_eq!(got[2].as_ref().unwrap().uuid, "2");
        assert!(acct.associations().is_none());

        // A policy's cancel names the owner, so a job id Slurm gave again is left alone.
        let job = got[0].as_ref().unwrap();
        acct.cancel(job).unwrap();
        let args = std::fs::read_to_string(tmp.path().join("scancel.args")).unwrap();
        assert_eq!(args.trim(), "--user=alice --clusters=lab -- 1");
        let odd = UnitRecord {
            uuid: "--signal=KILL".into(),
            ..job.clone()
        };
        assert!(acct.cancel(&odd).is_err());
    }

    fn sacct_printing(dir: &std::path::Path, body: &str, timeout: Duration) -> SlurmAccounting {
        let mut sacct = stand_in(dir, "sacct", body);
        sacct.timeout = timeout;
        SlurmAccounting {
            scancel: sacct.clone(),
            sacct,
            sacctmgr: None,
            slurm_name: None,
            time_zone: jiff::tz::TimeZone::UTC,
        }
    }

    const GOOD: &str = "1|debug|normal|physics|alice|2001|alice|2001|1795358897|1795358897|1795358926|00:00:29|29|0:0|COMPLETED|cpu=1,mem=300M,node=1|localhost|/tmp|60|wrap";

    #[test]
    fn a_large_window_is_read_as_sacct_prints_it() {
        let tmp = tempfile::tempdir().unwrap();
        // 200,000 jobs (36 MB): each comes, in order, while sacct still prints.
        let acct = sacct_printing(
            tmp.path(),
            &format!("seq 1 200000 | awk '{{ print $0 \"{}\" }}'", &GOOD[1..]),
            Duration::from_secs(60),
        );
        let mut n = 0u32;
        for (i, unit) in acct.units_since(60).unwrap().enumerate() {
            let unit = unit.unwrap_or_else(|e| panic!("record {i}: {e}"));
            assert_eq!(unit.uuid, (i + 1).to_string());
            n += 1;
        }
        assert_eq!(n, 200_000);
    }

    #[test]
    fn sacct_failing_or_hanging_midway_breaks_the_answer_off_with_why() {
        let tmp = tempfile::tempdir().unwrap();
        let acct = sacct_printing(
            tmp.path(),
            &format!("echo '{GOOD}'; echo 'sacct: error: slurmdbd went away' >&2; exit 1"),
            Duration::from_secs(10),
        );
        let got: Vec<_> = acct.units_since(60).unwrap().collect();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].as_ref().unwrap().uuid, "1");
        let Err(RecordError::Broken(e)) = &got[1] else {
            panic!("{got:?}")
        };
        assert!(e.to_string().contains("slurmdbd went away"), "{e}");

        let acct = sacct_printing(
            tmp.path(),
            &format!("echo '{GOOD}'; sleep 30; echo '{GOOD}'"),
            Duration::from_millis(500),
        );
        let start = std::time::Instant::now();
        let got: Vec<_> = acct.units_since(60).unwrap().collect();
        assert!(start.elapsed() < Duration::from_secs(10));
        assert_eq!(got.len(), 2, "{got:?}");
        let Err(RecordError::Broken(e)) = &got[1] else {
            panic!("{got:?}")
        };
        assert!(e.to_string().contains("did not finish within"), "{e}");

        // A line without end: refused, never held whole.
        let acct = sacct_printing(
            tmp.path(),
            "head -c 3000000 /dev/zero | tr '\\0' x",
            Duration::from_secs(10),
        );
        let got: Vec<_> = acct.units_since(60).unwrap().collect();
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            matches!(&got[0], Err(RecordError::Broken(e)) if e.to_string().contains("longer than")),
            "{got:?}"
        );
    }
}
