//! Walking a unit's subtree: its processes, and the shape that tells when it changed.

use std::io;
use std::path::{Path, PathBuf};

use super::kept::{self, DescriptorBudget};
use super::{parse, FileFault};

/// Visits the pids of a unit's subtree, depth first, until `visit` returns true (found).
/// Slurm puts processes in leaf cgroups (`step_*/user/task_*`), so a job's own file is empty.
pub fn find_pid(
    dir: &Path,
    faults: &mut Vec<FileFault>,
    visit: &mut impl FnMut(u32) -> bool,
) -> Option<u32> {
    walk(dir, 0, faults, &mut |_, _| {}, visit)
}

/// As [`find_pid`], and `on_dir` sees each directory, with its depth below `dir`, before its
/// processes are read.
fn walk(
    dir: &Path,
    depth: usize,
    faults: &mut Vec<FileFault>,
    on_dir: &mut impl FnMut(&Path, usize),
    visit: &mut impl FnMut(u32) -> bool,
) -> Option<u32> {
    on_dir(dir, depth);
    let procs = dir.join("cgroup.procs");
    match std::fs::read_to_string(&procs) {
        Ok(text) => {
            for pid in parse::procs(&text) {
                match pid {
                    Ok(pid) if visit(pid) => return Some(pid),
                    Ok(_) => {}
                    Err(e) => faults.push(FileFault {
                        path: procs.clone(),
                        message: e.to_string(),
                    }),
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => faults.push(FileFault {
            path: procs.clone(),
            message: e.to_string(),
        }),
    }
    let entries = std::fs::read_dir(dir).ok()?;
    for entry in entries.flatten() {
        // cgroupfs holds no symlinks; fixture trees might, and following them could escape.
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            if let Some(pid) = walk(&entry.path(), depth + 1, faults, on_dir, visit) {
                return Some(pid);
            }
        }
    }
    None
}

/// A unit's directory and its children as a walk found them, each with its inode and link
/// count. Adding a child directory raises its parent's link count; a removed or re-created one
/// no longer stats the same. A process joining changes none of it (nor the mtime, which the
/// kernel does not update when a cgroup is made). Slurm starts a job's processes with a new
/// environment only in a new step, which is a new directory right below the job's; the
/// deeper ones (tasks) come with their step and are not stamped, to keep the check cheap.
///
/// The unit's directory is held open while its budget allows: the checks then stat through
/// it (`fstat`, and `fstatat` of one name), not by walking the whole path again, which on
/// cgroupfs costs several times more.
#[derive(Debug)]
pub struct SubtreeShape {
    dir: PathBuf,
    held: Option<kept::Held>,
    top: Option<(u64, u64)>,
    children: Vec<(std::ffi::OsString, u64, u64)>,
}

impl PartialEq for SubtreeShape {
    fn eq(&self, other: &SubtreeShape) -> bool {
        (&self.dir, self.top, &self.children) == (&other.dir, other.top, &other.children)
    }
}

fn dir_stamp(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(dir)
        .ok()
        .map(|m| (m.ino(), m.nlink()))
}

impl SubtreeShape {
    /// Whether every directory still stats as it did: one stat a directory, no read.
    pub fn unchanged(&self) -> bool {
        let top = match &self.held {
            Some(held) => held.stamp(),
            None => dir_stamp(&self.dir),
        };
        top.is_some()
            && top == self.top
            && self.children.iter().all(|(name, ino, nlink)| {
                let now = match &self.held {
                    Some(held) => held.child_stamp(name),
                    None => dir_stamp(&self.dir.join(name)),
                };
                now == Some((*ino, *nlink))
            })
    }

    /// Whether this shape holds a directory that `old` did not.
    pub fn grew_from(&self, old: &SubtreeShape) -> bool {
        self.top.map(|t| t.0) != old.top.map(|t| t.0)
            || self
                .children
                .iter()
                .any(|(name, ino, _)| !old.children.iter().any(|(n, i, _)| n == name && i == ino))
    }
}

/// Every pid of a unit's subtree, and the shape of its top two levels.
pub fn subtree(dir: &Path, faults: &mut Vec<FileFault>) -> (Vec<u32>, SubtreeShape) {
    let mut pids = Vec::new();
    let mut shape = SubtreeShape {
        dir: dir.to_owned(),
        held: kept::Held::open_dir(dir, &DescriptorBudget::process()),
        top: None,
        children: Vec::new(),
    };
    walk(
        dir,
        0,
        faults,
        // Stamped before its listing is read, so that a change after the stamp shows next time.
        &mut |d, depth| match depth {
            0 => shape.top = dir_stamp(d),
            1 => {
                if let (Some(name), Some((ino, nlink))) = (d.file_name(), dir_stamp(d)) {
                    shape.children.push((name.to_owned(), ino, nlink));
                }
            }
            _ => {}
        },
        &mut |pid| {
            pids.push(pid);
            false
        },
    );
    (pids, shape)
}

/// The shape of a unit's subtree alone, without reading its processes: for readers that walk
/// the subtree again only when it changed.
pub fn shape(dir: &Path) -> SubtreeShape {
    let top = dir_stamp(dir);
    let mut children = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            if let Some((ino, nlink)) = dir_stamp(&entry.path()) {
                children.push((entry.file_name(), ino, nlink));
            }
        }
    }
    SubtreeShape {
        dir: dir.to_owned(),
        held: kept::Held::open_dir(dir, &DescriptorBudget::process()),
        top,
        children,
    }
}

/// The first process of a unit's subtree, if it has any.
pub fn first_pid(dir: &Path, faults: &mut Vec<FileFault>) -> Option<u32> {
    find_pid(dir, faults, &mut |_| true)
}

#[cfg(test)]
mod tests {
    use super::first_pid;
    use std::fs;
    use std::path::Path;

    fn write(dir: &Path, file: &str, text: &str) {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join(file), text).unwrap();
    }

    #[test]
    fn first_pid_searches_the_subtree() {
        let tmp = tempfile::tempdir().unwrap();
        let job = tmp.path().join("job_1");
        write(&job, "cgroup.procs", "");
        write(&job.join("step_0/user/task_0"), "cgroup.procs", "123\n");
        assert_eq!(first_pid(&job, &mut Vec::new()), Some(123));
        let empty = tmp.path().join("job_2");
        write(&empty.join("step_0"), "cgroup.procs", "\n");
        assert_eq!(first_pid(&empty, &mut Vec::new()), None);
    }
}
