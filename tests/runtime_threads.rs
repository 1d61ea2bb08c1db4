//! `--runtime.gomaxprocs` (CEEMS's flag, and its GOMAXPROCS variable): the stats-server takes
//! it as CEEMS's units pass it, and by default runs a worker thread per core the process may
//! use, a cgroup CPU quota counted (here a real cgroup v1 `cpu` group capped at one core).

mod common;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The `workers=N` of the stats-server's start line, started with `args` (in `cgroup`'s
/// `cgroup.procs` first, when given).
fn workers(args: &[&str], env: &[(&str, &str)], cgroup: Option<&Path>) -> Result<usize, String> {
    let tmp = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ceems"));
    cmd.args([
        "stats-server",
        &format!("--storage.data.path={}", tmp.path().display()),
        "--slurm.sacct.path=true",
        "--security.drop-privileges=false",
        &format!("--web.listen-address=127.0.0.1:{}", common::free_port()),
    ])
    .args(args)
    .envs(env.iter().copied())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    if let Some(group) = cgroup {
        let procs = group.join("cgroup.procs");
        // Before exec: the process starts inside the group, as under systemd's CPUQuota=.
        unsafe {
            cmd.pre_exec(move || std::fs::write(&procs, std::process::id().to_string()));
        }
    }
    let mut child = common::KillOnDrop(cmd.spawn().unwrap());
    let mut stderr = child.0.stderr.take().unwrap();
    let mut log = String::new();
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    while start.elapsed() < Duration::from_secs(20) {
        let n = stderr.read(&mut buf).unwrap_or(0);
        if n == 0 {
            return Err(log);
        }
        log.push_str(&String::from_utf8_lossy(&buf[..n]));
        if let Some(line) = log.lines().find(|l| l.contains("stats-server started")) {
            let n = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("workers="))
                .and_then(|n| n.parse().ok());
            return n.ok_or_else(|| line.to_owned());
        }
    }
    Err(log)
}

#[test]
fn ceems_s_gomaxprocs_flag_and_variable_set_the_worker_threads() {
    assert_eq!(workers(&["--runtime.gomaxprocs=1"], &[], None), Ok(1));
    assert_eq!(workers(&[], &[("GOMAXPROCS", "3")], None), Ok(3));
    let refused = workers(&["--runtime.gomaxprocs=-2"], &[], None).unwrap_err();
    assert!(refused.contains("runtime.gomaxprocs"), "{refused}");
}

#[test]
fn by_default_a_worker_thread_per_core_of_the_cgroup_s_cpu_quota() {
    let cores = std::thread::available_parallelism().unwrap().get();
    assert_eq!(workers(&[], &[], None), Ok(cores));
    let cpu = Path::new("/sys/fs/cgroup/cpu");
    if !cpu.join("cpu.cfs_quota_us").exists() || !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped the quota half: no cgroup v1 cpu controller, or not root");
        return;
    }
    let group = cpu.join(format!("ceems-test-gomaxprocs-{}", std::process::id()));
    std::fs::create_dir(&group).unwrap();
    std::fs::write(group.join("cpu.cfs_period_us"), "100000").unwrap();
    std::fs::write(group.join("cpu.cfs_quota_us"), "100000").unwrap();
    let capped = workers(&[], &[], Some(&group));
    // The group can be removed once its process is gone.
    for _ in 0..50 {
        if std::fs::remove_dir(&group).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(capped, Ok(1), "a quota of one core");
}
