//! Whether a unit's cgroup subtree holds a process. Managers drop units that hold none, as
//! CEEMS does.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{first_pid, parse, CgroupVersion, FileFault};

/// How long a unit found with processes is trusted to still have some without walking its
/// subtree again (where no `cgroup.events` says so in one read).
const POPULATED_TTL: Duration = Duration::from_secs(30);

/// The answers of the last scrapes, for directories that still exist.
#[derive(Debug, Default)]
pub struct Populated {
    seen: HashMap<PathBuf, Instant>,
}

impl Populated {
    /// v2's `cgroup.events` says so in one read; otherwise walk the subtree's `cgroup.procs`,
    /// trusting a positive answer for a while.
    pub fn check(
        &mut self,
        version: CgroupVersion,
        dir: &Path,
        faults: &mut Vec<FileFault>,
    ) -> bool {
        if version == CgroupVersion::V2 {
            if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.events")) {
                let mut populated = None;
                match parse::flat_keyed(&text, |k, v| {
                    if k == "populated" {
                        populated = Some(v != 0);
                    }
                }) {
                    Ok(()) if populated.is_some() => return populated == Some(true),
                    Ok(()) => {}
                    Err(e) => faults.push(FileFault {
                        path: dir.join("cgroup.events"),
                        message: e.to_string(),
                    }),
                }
            }
        }
        let now = Instant::now();
        if let Some(seen) = self.seen.get(dir) {
            if now.duration_since(*seen) < POPULATED_TTL {
                return true;
            }
        }
        let found = first_pid(dir, faults).is_some();
        if found {
            self.seen.insert(dir.to_owned(), now);
        } else {
            self.seen.remove(dir);
        }
        found
    }

    /// Forgets the directories `keep` says are gone.
    pub fn retain(&mut self, keep: impl Fn(&Path) -> bool) {
        self.seen.retain(|k, _| keep(k));
    }
}

/// The subdirectories of `dir` by name, sorted; none when it cannot be read.
pub fn subdirs(dir: &Path) -> Vec<(OsString, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<_> = entries
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .map(|e| (e.file_name(), e.path()))
        .collect();
    out.sort();
    out
}
