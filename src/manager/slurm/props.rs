//! Who a Slurm job belongs to, for `ceems_compute_unit_info`: from the file a prolog wrote
//! (`examples/slurm/prolog.sh`, CEEMS's format), else from a job process's environment, else
//! the user of the cgroup's `uid_<uid>` directory.

use crate::host::procfs;
use crate::host::ParseError;

/// A job's owner and placement. Fields a source does not know are empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobProps {
    pub user: String,
    pub account: String,
    pub partition: String,
    pub job_name: String,
}

impl JobProps {
    pub fn is_known(&self) -> bool {
        !self.user.is_empty()
    }
}

/// A prolog's job properties file: `user account nodelist workdir` on one line.
pub fn parse_props_file(text: &str) -> Result<JobProps, ParseError> {
    let mut words = text.split_whitespace();
    let user = words
        .next()
        .ok_or_else(|| ParseError::new(1, "empty job properties file"))?;
    let account = words.next().unwrap_or_default();
    let valid = |s: &str| s.chars().all(|c| !c.is_control());
    if !valid(user) || !valid(account) {
        return Err(ParseError::new(1, "control characters in user or account"));
    }
    Ok(JobProps {
        user: user.to_owned(),
        account: account.to_owned(),
        ..JobProps::default()
    })
}

/// `SLURM_JOB_USER`, `SLURM_JOB_ACCOUNT`, `SLURM_JOB_PARTITION` and `SLURM_JOB_NAME` of a
/// job process's environ; None without a user.
pub fn from_environ(environ: &[u8]) -> Option<JobProps> {
    let var = |name: &str| {
        procfs::environ_var(environ, name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default()
    };
    let props = JobProps {
        user: var("SLURM_JOB_USER"),
        account: var("SLURM_JOB_ACCOUNT"),
        partition: var("SLURM_JOB_PARTITION"),
        job_name: var("SLURM_JOB_NAME"),
    };
    props.is_known().then_some(props)
}

/// The uid in a v1 job path, `…/uid_<uid>/job_<id>`.
pub fn uid_from_path(path: &std::path::Path) -> Option<u32> {
    path.components()
        .find_map(|c| c.as_os_str().to_str()?.strip_prefix("uid_")?.parse().ok())
}

use std::path::Path;

use super::{JobInfoSource, SlurmManager, SPEC};
use crate::host::cgroup::{self, FileFault};
use crate::manager::UnitCgroup;

impl SlurmManager {
    /// A job's user, account, partition and name: the prolog's file, else a job process's
    /// environment, else the user of the `uid_<uid>` directory. Only complete answers are
    /// remembered, so a job found before its prolog wrote is asked again.
    pub(super) fn job_props(&self, job: &UnitCgroup, source: &JobInfoSource) -> JobProps {
        if let Some(p) = self
            .props
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&job.uuid)
        {
            return p.clone();
        }
        let from_file = source.props_dir.as_ref().and_then(|dir| {
            let path = dir.join(&job.uuid);
            let text = std::fs::read_to_string(&path).ok()?;
            parse_props_file(&text)
                .map_err(|e| tracing::debug!(path = %path.display(), error = %e, "bad job properties file"))
                .ok()
        });
        let found = from_file.or_else(|| self.props_from_environ(&job.dir));
        let props = match found {
            Some(p) => p,
            None => JobProps {
                user: uid_from_path(&job.rel)
                    .and_then(|uid| {
                        nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                            .ok()
                            .flatten()
                    })
                    .map(|u| u.name)
                    .unwrap_or_default(),
                ..JobProps::default()
            },
        };
        if props.is_known() {
            self.props
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(job.uuid.clone(), props.clone());
        }
        props
    }

    /// Job metadata from the environment of the first job process that has it.
    fn props_from_environ(&self, dir: &Path) -> Option<JobProps> {
        self.first_in_environ(dir, &mut Vec::new(), from_environ)
    }

    /// What `pick` finds in the environment of the first process of `dir`'s subtree that has it.
    pub(super) fn first_in_environ<T: Send + 'static>(
        &self,
        dir: &Path,
        faults: &mut Vec<FileFault>,
        pick: fn(&[u8]) -> Option<T>,
    ) -> Option<T> {
        let mut pids = Vec::new();
        cgroup::find_pid(dir, faults, &mut |pid| {
            pids.push(pid);
            false
        });
        let procfs = self.procfs.clone();
        // Other users' environ files need CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH.
        crate::security::privileged(SPEC.capabilities, move || {
            pids.into_iter().find_map(|pid| {
                let environ = std::fs::read(procfs.join(pid.to_string()).join("environ")).ok()?;
                pick(&environ)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceems_props_files() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/compat/fixtures/slurmjobprops");
        let text = std::fs::read_to_string(dir.join("1009248")).unwrap();
        let p = parse_props_file(&text).unwrap();
        assert_eq!(
            (p.user.as_str(), p.account.as_str()),
            ("testusr", "testacc")
        );
        assert!(parse_props_file("  \n").is_err());
        assert!(parse_props_file("bad\u{7}user acc").is_err());
        assert_eq!(parse_props_file("alice").unwrap().account, "");
    }

    #[test]
    fn environ_and_path() {
        let env = b"HOME=/home/a\0SLURM_JOB_USER=alice\0SLURM_JOB_ACCOUNT=physics\0SLURM_JOB_PARTITION=debug\0SLURM_JOB_NAME=wrap\0";
        assert_eq!(
            from_environ(env),
            Some(JobProps {
                user: "alice".into(),
                account: "physics".into(),
                partition: "debug".into(),
                job_name: "wrap".into(),
            })
        );
        assert_eq!(from_environ(b"SLURM_JOB_ID=3\0"), None);
        assert_eq!(
            uid_from_path(std::path::Path::new("slurm_n1/uid_2001/job_7")),
            Some(2001)
        );
        assert_eq!(
            uid_from_path(std::path::Path::new("system.slice/job_7")),
            None
        );
    }
}
