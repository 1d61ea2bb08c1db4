//! Real Slurm-shaped job cgroups on this machine's writable cgroup v1 hierarchies (and the
//! unified v2 one of a hybrid mount), for the tests that compare with the kernel.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::KillOnDrop;

pub const CGROUPFS: &str = "/sys/fs/cgroup";

/// A job's directories, removed (deepest first) when dropped, after its processes are killed.
pub struct JobCgroups {
    pub dirs: Vec<PathBuf>,
    pub children: Vec<KillOnDrop>,
}

impl JobCgroups {
    pub fn new() -> JobCgroups {
        JobCgroups {
            dirs: Vec::new(),
            children: Vec::new(),
        }
    }
}

impl Drop for JobCgroups {
    fn drop(&mut self) {
        // The processes leave first: a cgroup with one cannot be removed.
        self.children.clear();
        // The kernel needs a moment to release a killed task from its cgroups.
        for dir in self.dirs.iter().rev() {
            for _ in 0..50 {
                if fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

pub fn cpuacct_dir() -> Option<PathBuf> {
    ["cpu,cpuacct", "cpuacct"]
        .iter()
        .map(|c| Path::new(CGROUPFS).join(c))
        .find(|p| p.join("cpuacct.stat").exists())
}

/// Why the v1 job tests cannot run here, if they cannot.
pub fn v1_skip_reason() -> Option<String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Some("not running as root".into());
    }
    if cpuacct_dir().is_none() || !Path::new(CGROUPFS).join("memory/memory.stat").exists() {
        return Some(format!(
            "no cgroup v1 cpuacct and memory hierarchies under {CGROUPFS}"
        ));
    }
    if Command::new("python3").arg("-V").output().is_err() {
        return Some("python3 (the burner) is not installed".into());
    }
    None
}

/// Creates `dir` and its missing parents, recording what it created; cpuset directories get
/// their parent's CPUs and memory nodes, without which no task may join them.
pub fn make_dirs(dir: &Path, created: &mut Vec<PathBuf>, cpuset: bool) {
    let mut missing = Vec::new();
    let mut cur = dir.to_path_buf();
    while !cur.exists() {
        missing.push(cur.clone());
        cur = cur
            .parent()
            .expect("cgroup path has a parent")
            .to_path_buf();
    }
    for d in missing.into_iter().rev() {
        fs::create_dir(&d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
        if cpuset {
            let parent = d.parent().expect("parent");
            for f in ["cpuset.cpus", "cpuset.mems"] {
                let v = fs::read_to_string(parent.join(f)).expect("parent cpuset");
                fs::write(d.join(f), v.trim()).expect("write cpuset");
            }
        }
        created.push(d);
    }
}

/// Starts `sh -c script` inside `dirs` (each a cgroup directory): the shell joins them before
/// it runs the script, so everything the script does is accounted there.
pub fn spawn_in(dirs: &[PathBuf], script: &str, env: &[(&str, &str)]) -> KillOnDrop {
    let join: Vec<String> = dirs
        .iter()
        .map(|d| format!("echo $$ > '{}/cgroup.procs'", d.display()))
        .collect();
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!("{} && {script}", join.join(" && ")))
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .spawn()
        .expect("start job process");
    KillOnDrop(child)
}

/// A Slurm job `job_<id>` in the v1 cpuacct and memory hierarchies running `script`.
pub fn v1_job(id: u64, script: &str, env: &[(&str, &str)]) -> JobCgroups {
    let cpuacct = cpuacct_dir().expect("cpuacct hierarchy");
    let memory = Path::new(CGROUPFS).join("memory");
    let task_rel = PathBuf::from(format!("slurm/uid_0/job_{id}/step_batch/task_0"));
    let mut job = JobCgroups::new();
    make_dirs(&cpuacct.join(&task_rel), &mut job.dirs, false);
    make_dirs(&memory.join(&task_rel), &mut job.dirs, false);
    job.children.push(spawn_in(
        &[cpuacct.join(&task_rel), memory.join(&task_rel)],
        script,
        env,
    ));
    job
}

/// Open descriptors of a process whose target is `kind` (`anon_inode:[perf_event]`, say).
pub fn fd_count(pid: u32, kind: &str) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter(|e| fs::read_link(e.path()).is_ok_and(|t| t.as_os_str() == kind))
                .count()
        })
        .unwrap_or(0)
}
