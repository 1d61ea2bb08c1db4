//! OpenPBS jobs on the real kernel (as root, this machine's writable cgroup v1 hierarchies): a
//! job array's sub-job cgroup as PBS's `pbs_cgroups` hook makes it,
//! `pbs_jobs.service/jobid/<sequence>[<index>].<server>` in cpuacct, memory and cpuset, a
//! burning process inside; the scrape's CPU seconds and memory are the kernel's, its uuid is
//! the full job id, its CPUs its cpuset's, and the job leaves when its cgroup goes.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::cgroup::{cpuacct_dir, make_dirs, spawn_in, v1_skip_reason, JobCgroups, CGROUPFS};
use common::{label_of, name_of, parse_series, read_number, start_exporter, unit_value};

#[test]
fn an_openpbs_sub_job_is_read_as_the_kernel_accounts_it() {
    if let Some(reason) = v1_skip_reason() {
        println!("SKIPPED: {reason}");
        return;
    }
    let cpuacct = cpuacct_dir().expect("checked");
    let memory = Path::new(CGROUPFS).join("memory");
    let cpuset = Path::new(CGROUPFS).join("cpuset");
    let uuid = format!("{}[2].ceemslab", 800_000 + std::process::id() % 100_000);
    let rel = format!("pbs_jobs.service/jobid/{uuid}");
    let mut job = JobCgroups::new();
    make_dirs(&cpuacct.join(&rel), &mut job.dirs, false);
    make_dirs(&memory.join(&rel), &mut job.dirs, false);
    make_dirs(&cpuset.join(&rel), &mut job.dirs, true);
    // Burns 2 s of CPU time, however busy the machine, then holds still.
    let burner = "b = b'\\x01' * (48 << 20)\nimport time\nwhile time.process_time() < 2.0: pass\ntime.sleep(60)\n";
    job.children.push(spawn_in(
        &[cpuacct.join(&rel), memory.join(&rel), cpuset.join(&rel)],
        &format!("exec python3 -c \"{burner}\""),
        &[("PBS_JOBID", uuid.as_str())],
    ));
    let usage = cpuacct.join(&rel).join("cpuacct.usage");
    let start = Instant::now();
    while read_number(&usage) < 1.5e9 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the burner did not burn"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    std::thread::sleep(Duration::from_millis(800));

    let exporter = start_exporter(
        Path::new("/"),
        &[
            "--collector.openpbs",
            "--collector.cgroups.force-version=v1",
            "--web.disable-exporter-metrics",
        ],
    );
    let series = parse_series(&exporter.get("/metrics"));
    let kernel_cpu = read_number(&usage) / 1e9;
    let scraped_cpu = unit_value(&series, "ceems_compute_unit_cpu_user_seconds_total", &uuid)
        .unwrap_or_else(|| panic!("no job {uuid} in the scrape: {series:?}"))
        + unit_value(
            &series,
            "ceems_compute_unit_cpu_system_seconds_total",
            &uuid,
        )
        .unwrap();
    assert!(scraped_cpu > 1.5, "{scraped_cpu}");
    assert!(
        (scraped_cpu - kernel_cpu).abs() <= 0.05 * kernel_cpu,
        "cpu: exporter {scraped_cpu}, kernel {kernel_cpu}"
    );
    let kernel_used = read_number(&memory.join(&rel).join("memory.usage_in_bytes"));
    let scraped_used = unit_value(&series, "ceems_compute_unit_memory_used_bytes", &uuid).unwrap();
    assert!(
        (scraped_used - kernel_used).abs() <= 0.05 * kernel_used,
        "memory: exporter {scraped_used}, kernel {kernel_used}"
    );
    // The job's cpuset is its parent's here: every CPU of the node.
    let cpus = std::fs::read_to_string(cpuset.join(&rel).join("cpuset.cpus")).unwrap();
    let count: f64 = cpus
        .trim()
        .split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<f64>().unwrap() - a.parse::<f64>().unwrap() + 1.0,
            None => 1.0,
        })
        .sum();
    assert_eq!(
        unit_value(&series, "ceems_compute_unit_cpus", &uuid),
        Some(count)
    );
    let manager = series
        .keys()
        .find(|k| {
            name_of(k) == "ceems_compute_unit_cpus" && label_of(k, "uuid") == Some(uuid.as_str())
        })
        .and_then(|k| label_of(k, "manager"));
    assert_eq!(manager, Some("openpbs"));

    // The job ends: its cgroup goes, and so does it from the scrape.
    drop(job);
    let series = parse_series(&exporter.get("/metrics"));
    assert_eq!(unit_value(&series, "ceems_compute_unit_cpus", &uuid), None);
}
