//! The stats-server's side of LSF: a cluster's finished jobs from `bacct`, its running and
//! pending ones from `bjobs`, both run from the cluster's LSF binary directory with
//! `TZ=UTC` (LSF prints local times without an offset).
//!
//! LSF has no list of who belongs to which project: `bsub -P` takes any name. So by default no
//! project membership is pulled (`associations` is None) and a user reads only their own jobs;
//! a membership built from the jobs themselves would let anyone into a project by naming it.
//! A site whose projects LSF enforces (`lsb.projects`) opts in to CEEMS's way: the users and
//! projects of the jobs each pull fetched (`lsf-projects-from-jobs`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use super::bacct;
use crate::host::command::{self, CommandError};
use crate::host::ParseError;
use crate::manager::{
    unix_now, Accounting, AccountingError, Associations, UnitRecord, UnitRecords,
};

/// Largest `bacct` or `bjobs` answer read.
const MAX_OUTPUT: u64 = 1 << 30;

/// One LSF cluster's commands.
#[derive(Debug)]
pub struct LsfAccounting {
    /// Where `bacct` and `bjobs` are.
    pub bin_dir: PathBuf,
    /// Variables LSF's commands need beside `TZ` (`LSF_ENVDIR=…`).
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
    /// Job groups from the last two `bjobs` answers: bacct does not print a job's group.
    groups: Mutex<[HashMap<String, String>; 2]>,
    /// Whether projects' members are the users of the jobs each pull fetched.
    projects_from_jobs: bool,
    /// Those of the last pull, until the server takes them.
    memberships: Mutex<Option<Associations>>,
}

impl LsfAccounting {
    pub fn new(bin_dir: &Path, env: Vec<(String, String)>, timeout: Duration) -> LsfAccounting {
        LsfAccounting {
            bin_dir: bin_dir.to_owned(),
            env,
            timeout,
            groups: Mutex::new(Default::default()),
            projects_from_jobs: false,
            memberships: Mutex::new(None),
        }
    }

    /// Projects' members taken from the jobs of each pull, as CEEMS 0.14+ takes them.
    pub fn with_projects_from_jobs(mut self, on: bool) -> LsfAccounting {
        self.projects_from_jobs = on;
        self
    }

    /// Remembers the users and projects of `records` for the next `associations`.
    fn remember_memberships(&self, records: &[Result<UnitRecord, ParseError>]) {
        if !self.projects_from_jobs {
            return;
        }
        let pairs: std::collections::BTreeSet<(String, String)> = records
            .iter()
            .flatten()
            .filter(|r| !r.user.is_empty() && !r.account.is_empty())
            .map(|r| (r.user.clone(), r.account.clone()))
            .collect();
        let mut projects: Vec<String> = pairs.iter().map(|(_, p)| p.clone()).collect();
        projects.sort();
        projects.dedup();
        let found = Associations {
            projects,
            members: pairs.into_iter().collect(),
            ..Default::default()
        };
        *self.memberships.lock().unwrap_or_else(|p| p.into_inner()) = Some(found);
    }

    /// The directory of `bacct` on `PATH`, when no directory is configured.
    pub fn find_bin_dir() -> Option<PathBuf> {
        command::find_program("bacct", std::env::var_os("PATH").as_deref())
            .and_then(|p| p.parent().map(Path::to_owned))
    }

    fn run(&self, program: &str, args: &[String]) -> Result<String, CommandError> {
        let mut env: Vec<(&str, &str)> = vec![("TZ", "UTC")];
        env.extend(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        match command::run_env(
            &self.bin_dir.join(program),
            args,
            &env,
            self.timeout,
            MAX_OUTPUT,
        ) {
            // An empty answer is an error to both commands.
            Err(CommandError::Failed { stderr, .. })
                if stderr.contains("No matching job found")
                    || stderr.contains("No unfinished job found")
                    || stderr.contains("is not found") =>
            {
                Ok(String::new())
            }
            other => other,
        }
    }

    /// `bacct`'s arguments for jobs that ended between `from` and `to` (epoch seconds).
    pub fn bacct_args(from: i64, to: i64) -> Vec<String> {
        let mut args: Vec<String> = ["-u", "all", "-l", "-gpu", "-UF", "-C"]
            .map(String::from)
            .to_vec();
        // Minutes: the start rounded down, the end up, so no second of the window is lost.
        args.push(format!(
            "{},{}",
            bacct::minute(from),
            bacct::minute(to + 59)
        ));
        args
    }

    fn bjobs_args(id: Option<&str>) -> Vec<String> {
        let mut args: Vec<String> = ["-u", "all", "-a", "-json", "-o", bacct::BJOBS_FIELDS]
            .map(String::from)
            .to_vec();
        args.extend(id.map(str::to_owned));
        args
    }

    /// Running and pending jobs; every listed job's group is remembered for bacct's records.
    fn unfinished(
        &self,
        id: Option<&str>,
    ) -> Result<Vec<Result<UnitRecord, ParseError>>, AccountingError> {
        let out = self.run("bjobs", &Self::bjobs_args(id))?;
        if out.trim().is_empty() {
            return Ok(Vec::new());
        }
        let mut records =
            bacct::parse_bjobs(&out).map_err(|e| AccountingError::Other(e.to_string()))?;
        // With -a, bjobs also lists jobs that ended within LSF's CLEAN_PERIOD: their groups
        // are kept for bacct's records, which lack them.
        if id.is_none() {
            let now: HashMap<String, String> = records
                .iter()
                .flatten()
                .map(|r| (r.uuid.clone(), r.group.clone()))
                .collect();
            let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
            groups[1] = std::mem::replace(&mut groups[0], now);
        }
        records.retain(|r| r.as_ref().map_or(true, bacct::unfinished));
        Ok(records)
    }

    fn finished(
        &self,
        args: &[String],
    ) -> Result<Vec<Result<UnitRecord, ParseError>>, AccountingError> {
        let mut records = bacct::parse_bacct(&self.run("bacct", args)?);
        let groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        for r in records.iter_mut().flatten() {
            if let Some(g) = groups.iter().find_map(|m| m.get(&r.uuid)) {
                r.group = g.clone();
            }
        }
        Ok(records)
    }
}

impl Accounting for LsfAccounting {
    fn manager(&self) -> &'static str {
        super::MANAGER
    }

    fn units_since(&self, seconds_ago: i64) -> Result<UnitRecords, AccountingError> {
        let to = unix_now();
        // bjobs first: a job that ended meanwhile is then bacct's, which comes last and wins.
        let mut records = self.unfinished(None)?;
        records.extend(self.finished(&Self::bacct_args(to - seconds_ago.max(0), to))?);
        self.remember_memberships(&records);
        Ok(crate::manager::whole_answer(records))
    }

    fn unit(&self, id: &str) -> Result<UnitRecords, AccountingError> {
        let mut records = self.unfinished(Some(id))?;
        let mut args: Vec<String> = ["-u", "all", "-l", "-gpu", "-UF"]
            .map(String::from)
            .to_vec();
        args.push(id.to_owned());
        records.extend(self.finished(&args)?);
        Ok(crate::manager::whole_answer(records))
    }

    /// With `lsf-projects-from-jobs`, the users and projects of the last pull's jobs (None
    /// until a pull fetched some, so a restart does not empty the stored ones); else None.
    fn associations(&self) -> Option<Result<(Associations, Vec<ParseError>), AccountingError>> {
        let taken = self
            .memberships
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        taken.map(|a| Ok((a, Vec::new())))
    }

    /// `bkill -u USER ID`: LSF leaves the job alone when another user owns it.
    fn cancel(&self, unit: &UnitRecord) -> Result<String, AccountingError> {
        crate::manager::check_nameable(unit)?;
        let args = ["-u".to_owned(), unit.user.clone(), unit.uuid.clone()];
        let out = self.run("bkill", &args)?;
        Ok(out.trim().to_owned())
    }
}
