//! Discovery of a node's Slurm job cgroups, at each scrape:
//! - v1: `<cgroupfs>/<active subsystem>/slurm*/uid_*/job_<id>`; `slurm_<node>` roots come from
//!   slurmd built for several daemons per host and fill the `cgrouphostname` label.
//! - v2: `<cgroupfs>/system.slice/*slurmstepd.scope/job_<id>`; `<node>_slurmstepd.scope` fills
//!   `cgrouphostname`. Slurm 26.05 may name job directories by an opaque identifier instead
//!   of `job_<id>`: for those the numeric id is `SLURM_JOB_ID` in a job process's environ,
//!   cached per directory until the job ends.
//!
//! Jobs whose cgroup subtree holds no process are dropped, as CEEMS does.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::SlurmManager;
use crate::collect::CollectError;
use crate::host::cgroup::{subdirs, CgroupVersion, FileFault, Populated, Subdir};
use crate::host::procfs;
use crate::manager::UnitCgroup;

/// What discovery remembers between scrapes, for job directories that still exist.
#[derive(Default)]
pub(super) struct DiscoveryCache {
    /// Opaque job directory → job id.
    pub(super) opaque_ids: HashMap<PathBuf, String>,
    /// Which job directories hold processes.
    pub(super) populated: Populated,
}

fn job_id_of(name: &OsStr) -> Option<String> {
    let id = name.to_str()?.strip_prefix("job_")?;
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())).then(|| id.to_owned())
}

/// A job directory found by walking, before its processes are checked.
struct Candidate {
    id: Option<String>,
    cgroup_host: String,
    abs: PathBuf,
    ino: u64,
}

impl SlurmManager {
    fn candidates(&self) -> Result<Vec<Candidate>, CollectError> {
        let roots = std::fs::read_dir(&self.base).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                CollectError::Absent(format!("no cgroup hierarchy at {}", self.base.display()))
            } else {
                CollectError::io(&self.base, e)
            }
        })?;
        let mut roots: Vec<(String, PathBuf)> = roots
            .flatten()
            .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
            .filter_map(|e| Some((e.file_name().to_str()?.to_owned(), e.path())))
            .collect();
        roots.sort();
        let mut out = Vec::new();
        for (name, path) in roots {
            match self.version {
                CgroupVersion::V1 => {
                    let host = match name.as_str() {
                        "slurm" => "",
                        n => match n.strip_prefix("slurm_") {
                            Some(h) => h,
                            None => continue,
                        },
                    };
                    // slurm/uid_<uid>/job_<id>, and job_<id> directly under the root.
                    for child in subdirs(&path) {
                        if let Some(id) = job_id_of(child.name()) {
                            out.push(candidate(Some(id), host, child));
                        } else if child.name().to_str().is_some_and(|c| c.starts_with("uid_")) {
                            for job in subdirs(&child.path) {
                                if let Some(id) = job_id_of(job.name()) {
                                    out.push(candidate(Some(id), host, job));
                                }
                            }
                        }
                    }
                }
                CgroupVersion::V2 => {
                    let host = match name.as_str() {
                        "slurmstepd.scope" => "",
                        n => match n.strip_suffix("_slurmstepd.scope") {
                            Some(h) => h,
                            None => continue,
                        },
                    };
                    for child in subdirs(&path) {
                        if let Some(id) = job_id_of(child.name()) {
                            out.push(candidate(Some(id), host, child));
                        } else if child.name() != "system" {
                            out.push(candidate(None, host, child));
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Finds the jobs with at least one process, resolving opaque directories to job ids.
    pub fn find_jobs(&self, faults: &mut Vec<FileFault>) -> Result<Vec<UnitCgroup>, CollectError> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let candidates = self.candidates()?;
        // By the paths' bytes: hashing a `Path` hashes each component apart.
        let present: HashSet<&[u8], foldhash::fast::RandomState> = candidates
            .iter()
            .map(|c| c.abs.as_os_str().as_bytes())
            .collect();
        cache
            .opaque_ids
            .retain(|k, _| present.contains(k.as_os_str().as_bytes()));
        cache
            .populated
            .retain(|k| present.contains(k.as_os_str().as_bytes()));
        drop(present);
        let mut jobs = Vec::new();
        for c in candidates {
            let uuid = match c.id {
                Some(id) => {
                    if !cache
                        .populated
                        .check(self.version, &c.abs, Some(c.ino), faults)
                    {
                        continue;
                    }
                    id
                }
                None => match cache.opaque_ids.get(&c.abs) {
                    Some(id) => id.clone(),
                    None => match self.opaque_job_id(&c.abs, faults) {
                        Some(id) => {
                            cache.opaque_ids.insert(c.abs.clone(), id.clone());
                            id
                        }
                        None => continue,
                    },
                },
            };
            let rel = below(&c.abs, &self.base).unwrap_or(&c.abs).to_path_buf();
            let rel = match self.version {
                CgroupVersion::V1 => rel,
                CgroupVersion::V2 => Path::new("system.slice").join(rel),
            };
            jobs.push(UnitCgroup {
                uuid,
                cgroup_host: c.cgroup_host,
                rel,
                dir: c.abs,
                dir_ino: Some(c.ino),
            });
        }
        Ok(jobs)
    }

    /// The job id of an opaque directory: `SLURM_JOB_ID` of the first process that has one
    /// (slurmstepd itself sits in the job's subtree and has none).
    fn opaque_job_id(&self, dir: &Path, faults: &mut Vec<FileFault>) -> Option<String> {
        let found =
            self.first_in_environ(dir, faults, |environ| match procfs::slurm_job_id(environ) {
                Ok(id) => id.map(|id| id.to_string()),
                Err(e) => {
                    tracing::debug!(error = %e, "bad SLURM_JOB_ID");
                    None
                }
            });
        if found.is_none() {
            tracing::debug!(
                cgroup = %dir.display(),
                "no process with SLURM_JOB_ID in job cgroup; skipping it"
            );
        }
        found
    }
}

/// `path` relative to `base`, which a walk joined it to. Compared as bytes: `strip_prefix`
/// walks both paths' components, which for a thousand jobs was a twentieth of a scrape's
/// user time.
fn below<'a>(path: &'a Path, base: &Path) -> Option<&'a Path> {
    let base = base.as_os_str().as_bytes();
    let rest = path.as_os_str().as_bytes().strip_prefix(base)?;
    let rest = match rest.strip_prefix(b"/") {
        Some(rest) => rest,
        // Not at a component's end: `/a/bc` is not below `/a/b`.
        None if !base.ends_with(b"/") && !rest.is_empty() => return None,
        None => rest,
    };
    Some(Path::new(OsStr::from_bytes(rest)))
}

fn candidate(id: Option<String>, host: &str, dir: Subdir) -> Candidate {
    Candidate {
        id,
        cgroup_host: host.to_owned(),
        abs: dir.path,
        ino: dir.ino,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_read_below_the_directory_it_was_found_in() {
        let job = Path::new("/cgroup/cpuacct/slurm/uid_1/job_2");
        for base in ["/cgroup/cpuacct", "/cgroup/cpuacct/"] {
            assert_eq!(
                below(job, Path::new(base)),
                Some(Path::new("slurm/uid_1/job_2"))
            );
        }
        // A sibling that shares the base's name as a prefix is not below it.
        assert_eq!(below(job, Path::new("/cgroup/cpu")), None);
        assert_eq!(below(job, Path::new("/other")), None);
    }
}
