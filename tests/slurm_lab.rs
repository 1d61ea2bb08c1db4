//! The exporter on a real Slurm cluster (`scripts/slurm-lab.sh`: Debian's Slurm 22.05 with
//! proctrack/cgroup on cgroup v1): a job of another user is found, labelled with its user,
//! account, partition and name read from its processes' environment by the unprivileged
//! exporter, accounts CPU time, and disappears when it ends.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{parse_series, start_exporter};

fn lab() -> Result<(), String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err("needs root".into());
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/slurm-lab.sh");
    let out = Command::new("bash")
        .arg(script)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "slurm-lab.sh failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

fn as_user(user: &str, cmd: &str) -> String {
    let out = Command::new("su")
        .args([user, "-c", cmd])
        .current_dir("/tmp")
        .output()
        .expect("su");
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_real_slurm_job_of_another_user_is_found_labelled_and_dropped_when_it_ends() {
    if !common::runnable("slurm_lab", lab()) {
        return;
    }
    let job = as_user(
        "bob",
        "cd /tmp && sbatch --parsable -c 1 --mem=200M -J burner --wrap 'timeout 120 sh -c \"while :; do :; done\"'",
    );
    let job = job.split(';').next().unwrap_or_default().to_owned();
    assert!(job.chars().all(|c| c.is_ascii_digit()), "job id {job}");
    let cancel = Cancel(job.clone());

    // Started as root: it drops to nobody and raises CAP_SYS_PTRACE only to read bob's environ.
    let exporter = start_exporter(
        Path::new("/"),
        &["--collector.slurm", "--collector.slurm.info-metrics"],
    );
    let uuid = format!("uuid=\"{job}\"");
    let mut body = String::new();
    wait_until("the job's CPU time", Duration::from_secs(30), || {
        body = exporter.get("/metrics");
        parse_series(&body).iter().any(|(k, v)| {
            k.starts_with("ceems_compute_unit_cpu_user_seconds_total")
                && k.contains(&uuid)
                && *v > 0.5
        })
    });
    let info = body
        .lines()
        .find(|l| l.starts_with("ceems_compute_unit_info{") && l.contains(&uuid))
        .unwrap_or_else(|| panic!("no info for job {job}:\n{body}"));
    for label in [
        "user=\"bob\"",
        "account=\"chemistry\"",
        "partition=\"debug\"",
        "jobname=\"burner\"",
    ] {
        assert!(info.contains(label), "{label} missing in {info}");
    }

    drop(cancel);
    wait_until("the job to leave /metrics", Duration::from_secs(30), || {
        !exporter.get("/metrics").contains(&uuid)
    });
}

/// Cancels the job when dropped, so a failing test leaves no burner behind.
struct Cancel(String);

impl Drop for Cancel {
    fn drop(&mut self) {
        let _ = Command::new("scancel").arg(&self.0).status();
    }
}
