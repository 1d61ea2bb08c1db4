//! Per-job process detail (`--collector.slurm.process-metrics`): processes and threads by
//! state, open file descriptors, and CPU time per executable, from each job's cgroup
//! processes and their `/proc/<pid>` files. Processes that exit mid-read are skipped.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use super::cgroup::{self, FileFault};
use super::procfs::{self, PidStat};

/// Executables beyond this many per job are summed as `exe="other"` unless configured.
pub const DEFAULT_EXE_LIMIT: usize = 10;

/// One job's processes, summed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobProcesses {
    pub processes_by_state: BTreeMap<&'static str, u64>,
    pub threads_by_state: BTreeMap<&'static str, u64>,
    pub open_fds: u64,
    /// Clock ticks of user + system time of the live processes, per executable path.
    pub ticks_by_exe: HashMap<String, u64>,
    /// For each scratch path asked about, whether a process works or has a file open under it.
    pub uses_scratch: Vec<bool>,
}

/// A process link (`cwd`, `fd/<n>`) as the kernel shows it, without its ` (deleted)` mark.
fn link_target(path: &Path) -> Option<PathBuf> {
    let target = std::fs::read_link(path).ok()?;
    let text = target.to_string_lossy();
    Some(match text.strip_suffix(" (deleted)") {
        Some(t) => PathBuf::from(t),
        None => target,
    })
}

/// Marks in `uses` the scratch paths that `target` lies under (whole components: `/scratch`
/// is not under `/scratchy`).
fn mark_scratch(target: &Path, scratch: &[PathBuf], uses: &mut [bool]) {
    for (used, root) in uses.iter_mut().zip(scratch) {
        *used |= target.starts_with(root);
    }
}

/// Every pid of a cgroup subtree.
pub fn subtree_pids(dir: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut faults: Vec<FileFault> = Vec::new();
    cgroup::find_pid(dir, &mut faults, &mut |pid| {
        pids.push(pid);
        false
    });
    pids
}

/// `/proc/<pid>/stat` (or a task's), parsed; None when it is gone or malformed.
pub fn read_stat(path: &Path) -> Option<PidStat> {
    let text = std::fs::read_to_string(path).ok()?;
    procfs::pid_stat(&text).ok()
}

/// Reads the processes of one job, and whether they use each of `scratch`. Needs to see other
/// users' `/proc/<pid>/fd`, `cwd` and `exe`: call under the capabilities the slurm collector
/// declares.
pub fn read_job(procfs_root: &Path, pids: &[u32], scratch: &[PathBuf]) -> JobProcesses {
    let mut j = JobProcesses {
        uses_scratch: vec![false; scratch.len()],
        ..JobProcesses::default()
    };
    let mut path = PathBuf::new();
    for pid in pids {
        path.clear();
        path.push(procfs_root);
        path.push(pid.to_string());
        // Gone already: the job's process ended between the listing and now.
        let Some(stat) = read_stat(&path.join("stat")) else {
            continue;
        };
        *j.processes_by_state
            .entry(procfs::state_name(stat.state))
            .or_default() += 1;
        let mut counted_threads = 0;
        if let Ok(tasks) = std::fs::read_dir(path.join("task")) {
            for t in tasks.flatten() {
                if let Some(ts) = read_stat(&t.path().join("stat")) {
                    *j.threads_by_state
                        .entry(procfs::state_name(ts.state))
                        .or_default() += 1;
                    counted_threads += 1;
                }
            }
        }
        if counted_threads == 0 {
            // No task directory to read: count the threads under the process's own state.
            *j.threads_by_state
                .entry(procfs::state_name(stat.state))
                .or_default() += stat.num_threads.max(1);
        }
        if let Ok(fds) = std::fs::read_dir(path.join("fd")) {
            if scratch.is_empty() {
                j.open_fds += fds.count() as u64;
            } else {
                for fd in fds.flatten() {
                    j.open_fds += 1;
                    if let Some(target) = link_target(&fd.path()) {
                        mark_scratch(&target, scratch, &mut j.uses_scratch);
                    }
                }
            }
        }
        if !scratch.is_empty() {
            if let Some(cwd) = link_target(&path.join("cwd")) {
                mark_scratch(&cwd, scratch, &mut j.uses_scratch);
            }
        }
        let exe = std::fs::read_link(path.join("exe"))
            .map(|p| {
                p.to_string_lossy()
                    .trim_end_matches(" (deleted)")
                    .to_owned()
            })
            .unwrap_or_else(|_| "unknown".to_owned());
        *j.ticks_by_exe.entry(exe).or_default() += stat.utime + stat.stime;
    }
    j
}

/// Keeps the `limit` executables with the most CPU time and folds the rest into `other`.
pub fn cap_executables(ticks: &HashMap<String, u64>, limit: usize) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = ticks.iter().map(|(k, t)| (k.clone(), *t)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    if v.len() > limit {
        let other: u64 = v[limit..].iter().map(|(_, t)| t).sum();
        v.truncate(limit);
        v.push(("other".to_owned(), other));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_use_by_working_directory_or_open_file() {
        let scratch = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let sibling = PathBuf::from(format!("{}y", scratch.path().display()));
        let roots = [scratch.path().to_owned(), other.path().to_owned(), sibling];
        let run = |cwd: &Path, open: Option<&Path>| {
            let script = match open {
                Some(f) => format!("exec 3>'{}'; sleep 30", f.display()),
                None => "sleep 30".to_owned(),
            };
            let mut child = std::process::Command::new("sh")
                .args(["-c", &script])
                .current_dir(cwd)
                .spawn()
                .unwrap();
            // Until the shell has opened its file.
            std::thread::sleep(std::time::Duration::from_millis(200));
            let j = read_job(Path::new("/proc"), &[child.id()], &roots);
            let _ = child.kill();
            let _ = child.wait();
            j.uses_scratch
        };
        assert_eq!(run(scratch.path(), None), [true, false, false]);
        let out = other.path().join("out");
        assert_eq!(run(Path::new("/"), Some(&out)), [false, true, false]);
        std::fs::remove_file(&out).unwrap();
        assert_eq!(run(Path::new("/"), None), [false, false, false]);
    }

    #[test]
    fn executables_beyond_the_cap_are_folded() {
        let ticks: HashMap<String, u64> = [("/a", 50), ("/b", 30), ("/c", 20), ("/d", 5)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        assert_eq!(
            cap_executables(&ticks, 2),
            vec![
                ("/a".to_owned(), 50),
                ("/b".to_owned(), 30),
                ("other".to_owned(), 25)
            ]
        );
        assert_eq!(cap_executables(&ticks, 10).len(), 4);
    }

    #[test]
    fn this_process_is_read_and_a_vanished_one_skipped() {
        let me = std::process::id();
        let j = read_job(Path::new("/proc"), &[me, u32::MAX - 1], &[]);
        assert_eq!(j.processes_by_state.values().sum::<u64>(), 1);
        assert!(j.threads_by_state.values().sum::<u64>() >= 1);
        assert!(j.open_fds >= 3, "{}", j.open_fds);
        let exe = std::env::current_exe().unwrap();
        assert!(
            j.ticks_by_exe
                .contains_key(&exe.to_string_lossy().into_owned()),
            "{:?}",
            j.ticks_by_exe
        );
    }
}
