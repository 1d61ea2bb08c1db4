//! Whether a unit's cgroup subtree holds a process. Managers drop units that hold none, as
//! CEEMS does.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::kept::{DescriptorBudget, KeptFiles};
use super::{first_pid, parse, CgroupVersion, FileFault};

/// How long a unit found with processes is trusted to still have some without walking its
/// subtree again (where no `cgroup.events` says so in one read).
const POPULATED_TTL: Duration = Duration::from_secs(30);

/// The answers of the last scrapes, for directories that still exist.
#[derive(Debug)]
pub struct Populated {
    /// By the path's bytes: hashing a `Path` walks its components.
    seen: HashMap<Box<[u8]>, Instant, foldhash::fast::RandomState>,
    /// v2 `cgroup.events`, kept open.
    events: KeptFiles,
    buf: Vec<u8>,
}

impl Default for Populated {
    fn default() -> Populated {
        Populated {
            seen: HashMap::default(),
            events: KeptFiles::new(DescriptorBudget::process()),
            buf: Vec::new(),
        }
    }
}

impl Populated {
    /// v2's `cgroup.events` says so in one read; otherwise walk the subtree's `cgroup.procs`,
    /// trusting a positive answer for a while. `ino` is `dir`'s inode as discovery listed it.
    pub fn check(
        &mut self,
        version: CgroupVersion,
        dir: &Path,
        ino: Option<u64>,
        faults: &mut Vec<FileFault>,
    ) -> bool {
        if version == CgroupVersion::V2 {
            self.events.enter(dir, dir, ino);
            let read = self
                .events
                .read_with("cgroup.events", &mut self.buf, |path| {
                    path.push(dir);
                    path.push("cgroup.events");
                });
            if let Some(text) = read
                .ok()
                .flatten()
                .and_then(|n| std::str::from_utf8(&self.buf[..n]).ok())
            {
                let mut populated = None;
                match parse::flat_keyed(text, |k, v| {
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
        let key = dir.as_os_str().as_bytes();
        if let Some(seen) = self.seen.get(key) {
            if now.duration_since(*seen) < POPULATED_TTL {
                return true;
            }
        }
        let found = first_pid(dir, faults).is_some();
        if found {
            self.seen.insert(key.into(), now);
        } else {
            self.seen.remove(key);
        }
        found
    }

    /// Forgets the directories `keep` says are gone.
    pub fn retain(&mut self, keep: impl Fn(&Path) -> bool) {
        self.seen
            .retain(|k, _| keep(Path::new(OsStr::from_bytes(k))));
        self.events.retain(keep);
    }
}

/// A directory as its parent's listing shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subdir {
    pub path: PathBuf,
    /// The inode number the listing gives with the name, at no cost.
    pub ino: u64,
    /// Where the name starts in `path`.
    name_at: usize,
}

impl Subdir {
    /// The directory's own name, the last component of its path.
    pub fn name(&self) -> &OsStr {
        OsStr::from_bytes(&self.path.as_os_str().as_bytes()[self.name_at..])
    }
}

/// The subdirectories of `dir` by name, sorted; none when it cannot be read.
pub fn subdirs(dir: &Path) -> Vec<Subdir> {
    use std::os::unix::fs::DirEntryExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    // The path is the one copy made of each name: a thousand jobs' listings are read each
    // scrape, and a name apart was a thousand allocations more.
    let mut out: Vec<_> = entries
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .map(|e| {
            let path = e.path();
            // Names hold no `/`: the last one ends the parent.
            let name_at = path
                .as_os_str()
                .as_bytes()
                .iter()
                .rposition(|b| *b == b'/')
                .map_or(0, |p| p + 1);
            Subdir {
                path,
                ino: e.ino(),
                name_at,
            }
        })
        .collect();
    // Siblings: their names order them, compared as bytes.
    out.sort_by(|a, b| a.name().as_bytes().cmp(b.name().as_bytes()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only directories, in their names' byte order, each named as its path ends, whether or
    /// not the parent was given with a trailing `/`; a missing parent lists nothing.
    #[test]
    fn subdirs_are_the_directories_by_name() {
        let tmp = tempfile::tempdir().unwrap();
        for d in ["job_20", "job_3", "uid_1", "Z"] {
            std::fs::create_dir(tmp.path().join(d)).unwrap();
        }
        std::fs::write(tmp.path().join("job_1"), "a file").unwrap();
        let slashed = PathBuf::from(format!("{}/", tmp.path().display()));
        for parent in [tmp.path(), slashed.as_path()] {
            let listed = subdirs(parent);
            let names: Vec<&OsStr> = listed.iter().map(Subdir::name).collect();
            assert_eq!(names, ["Z", "job_20", "job_3", "uid_1"]);
            for d in &listed {
                assert_eq!(d.path, tmp.path().join(d.name()));
                assert!(d.path.is_dir());
            }
        }
        assert!(subdirs(&tmp.path().join("gone")).is_empty());
    }
}
