//! The exporter on a real Slurm cluster (`scripts/slurm-lab.sh`: Debian's Slurm 22.05 with
//! proctrack/cgroup on cgroup v1): a job of another user that starts three processes, opens
//! ten files, writes 50 MB and burns CPU is found, labelled with its user, account, partition
//! and name read from its processes' environment by the unprivileged exporter, shows its
//! processes, open files and CPU per executable, and disappears when it ends.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::lab::{as_user, lab, wait_until};
use common::{parse_series, start_exporter};

#[test]
fn a_real_slurm_job_of_another_user_is_found_labelled_and_dropped_when_it_ends() {
    if !common::runnable("slurm_lab", lab()) {
        return;
    }
    // python3 holds 10 files open, writes 50 MB, starts two sleeps and burns CPU.
    let workload = r#"import os, subprocess, time
files = [open('/tmp/ceems-lab-%d-%d' % (os.getpid(), i), 'w') for i in range(10)]
with open('/tmp/ceems-lab-%d-data' % os.getpid(), 'wb') as f:
    for _ in range(50):
        f.write(bytes(1 << 20))
    f.flush()
    os.fsync(f.fileno())
kids = [subprocess.Popen(['sleep', '120']) for _ in range(2)]
t = time.time()
while time.time() - t < 120:
    pass
"#;
    std::fs::write("/tmp/ceems-lab-workload.py", workload).unwrap();
    let job = as_user(
        "bob",
        "cd /tmp && sbatch --parsable -c 1 --mem=300M -J burner --wrap 'python3 /tmp/ceems-lab-workload.py'",
    );
    let job = job.split(';').next().unwrap_or_default().to_owned();
    assert!(job.chars().all(|c| c.is_ascii_digit()), "job id {job}");
    let cancel = Cancel(job.clone());

    // Started as root: it drops to nobody and raises CAP_SYS_PTRACE only to read bob's environ.
    let exporter = start_exporter(
        Path::new("/"),
        &[
            "--collector.slurm",
            "--collector.slurm.info-metrics",
            "--collector.slurm.process-metrics",
            "--collector.slurm.io-metrics",
            "--collector.slurm_cluster",
            "--collector.slurm_cluster.poll-limit=1s",
        ],
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

    let job_value = |body: &str, name: &str, label: Option<(&str, &str)>| -> f64 {
        parse_series(body)
            .into_iter()
            .filter(|(k, _)| {
                k.starts_with(&format!("{name}{{"))
                    && k.contains(&uuid)
                    && label.is_none_or(|(l, v)| k.contains(&format!("{l}=\"{v}\"")))
            })
            .map(|(_, v)| v)
            .sum()
    };
    wait_until(
        "three processes and ten open files",
        Duration::from_secs(30),
        || {
            body = exporter.get("/metrics");
            job_value(&body, "ceems_compute_unit_processes", None) >= 3.0
                && job_value(&body, "ceems_compute_unit_open_fds", None) >= 10.0
        },
    );
    assert!(
        job_value(&body, "ceems_compute_unit_threads", None) >= 3.0,
        "{body}"
    );
    let python_cpu = |body: &str| -> f64 {
        parse_series(body)
            .into_iter()
            .filter(|(k, _)| {
                k.starts_with("ceems_compute_unit_process_cpu_seconds{")
                    && k.contains(&uuid)
                    && k.contains("python3")
            })
            .map(|(_, v)| v)
            .sum()
    };
    let first = python_cpu(&body);
    std::thread::sleep(Duration::from_millis(1500));
    let second = python_cpu(&exporter.get("/metrics"));
    assert!(
        second > first,
        "python3 CPU did not grow: {first} then {second}\n{body}"
    );
    // Slurm's cgroup v1 plugin does not put jobs in the blkio hierarchy, so their writes are
    // not accounted per job on this machine; the series appear only where the kernel counts.
    let written = job_value(&body, "ceems_compute_unit_blkio_write_bytes_total", None);
    if written > 0.0 {
        assert!(written >= 50e6, "write bytes {written}");
    } else {
        println!("block IO of job {job} not accounted by this kernel/cgroup set-up");
    }

    // The controller's view: the node is busy and bob's job is running in debug.
    body = exporter.get("/metrics");
    let s = parse_series(&body);
    let busy: f64 = ["mixed", "allocated"]
        .iter()
        .filter_map(|st| s.get(&format!("ceems_slurm_nodes{{state=\"{st}\"}}")))
        .sum();
    assert_eq!(busy, 1.0, "{body}");
    assert!(
        s.get("ceems_slurm_partition_jobs{partition=\"debug\",state=\"running\"}")
            .is_some_and(|v| *v >= 1.0),
        "{body}"
    );
    assert!(
        s.get("ceems_slurm_user_jobs{state=\"running\",user=\"bob\"}")
            .is_some_and(|v| *v >= 1.0),
        "{body}"
    );

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
        // The workload's files, the 50 MB one included.
        if let Ok(entries) = std::fs::read_dir("/tmp") {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with("ceems-lab-") {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
}
