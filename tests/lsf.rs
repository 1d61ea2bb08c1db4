//! LSF jobs on the real kernel (as root, this machine's writable cgroup v1 hierarchies): a job
//! cgroup shaped as LSF makes it, `lsf/<cluster>/job.<id>.<internal id>.<timestamp>`, a burning
//! process inside, a `bjobs` stand-in printing LSF 10.1's `-json` shape; the scrape's CPU
//! seconds and memory match the kernel's, its CPUs are bjobs' slots on this host, and the job
//! leaves the scrape when its cgroup goes.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::cgroup::{cpuacct_dir, make_dirs, spawn_in, v1_skip_reason, JobCgroups, CGROUPFS};
use common::{label_of, name_of, parse_series, start_exporter, unit_value};

#[test]
fn an_lsf_job_is_read_as_the_kernel_accounts_it() {
    if let Some(reason) = v1_skip_reason() {
        println!("SKIPPED: {reason}");
        return;
    }
    let cpuacct = cpuacct_dir().expect("checked");
    let memory = Path::new(CGROUPFS).join("memory");
    let id = 700_000 + std::process::id() % 100_000;
    // An array element, as LSF names them.
    let uuid = format!("{id}[3]");
    let rel = PathBuf::from(format!("lsf/ceemslab/job.{id}[3].35399.1775318419"));
    let mut job = JobCgroups::new();
    make_dirs(&cpuacct.join(&rel), &mut job.dirs, false);
    make_dirs(&memory.join(&rel), &mut job.dirs, false);
    // Burns 2 s of CPU time, however busy the machine, then holds still.
    let burner = "b = b'\\x01' * (64 << 20)\nimport time\nwhile time.process_time() < 2.0: pass\ntime.sleep(60)\n";
    job.children.push(spawn_in(
        &[cpuacct.join(&rel), memory.join(&rel)],
        &format!("exec python3 -c \"{burner}\""),
        &[],
    ));
    let stat = cpuacct.join(&rel).join("cpuacct.stat");
    let start = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let accounted = std::fs::read_to_string(&stat).unwrap_or_default();
        // User and system: reading its own CPU time is a system call.
        let ticks: u64 = accounted
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum();
        if ticks > 150 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the burner did not burn: {}: {accounted:?}",
            stat.display()
        );
    }
    std::thread::sleep(Duration::from_millis(800));

    // bjobs: three slots of the job on this host, one on another.
    let dir = tempfile::tempdir().unwrap();
    let bjobs = dir.path().join("bjobs");
    std::fs::write(
        &bjobs,
        format!(
            "#!/bin/sh\ncat <<'EOF'\n{{\"COMMAND\":\"bjobs\",\"JOBS\":1,\"RECORDS\":[{{\"JOBID\":\"{id}\",\"JOBINDEX\":\"3\",\"ALLOC_SLOT\":\"lsfhost.example.org:lsfhost.example.org:lsfhost.example.org:otherhost\",\"NALLOC_SLOT\":\"4\",\"GPU_ALLOC\":\"\"}}]}}\nEOF\n"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bjobs, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bjobs_flag = format!("--collector.lsf.bjobs-path={}", bjobs.display());
    let exporter = start_exporter(
        Path::new("/"),
        &[
            "--collector.lsf",
            &bjobs_flag,
            "--collector.cgroups.force-version=v1",
            "--collector.force-hostname=lsfhost",
            "--web.disable-exporter-metrics",
        ],
    );
    let series = parse_series(&exporter.get("/metrics"));
    let kernel_cpu: f64 = std::fs::read_to_string(cpuacct.join(&rel).join("cpuacct.usage"))
        .unwrap()
        .trim()
        .parse::<f64>()
        .unwrap()
        / 1e9;
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
    let kernel_used: f64 = std::fs::read_to_string(memory.join(&rel).join("memory.usage_in_bytes"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let scraped_used = unit_value(&series, "ceems_compute_unit_memory_used_bytes", &uuid).unwrap();
    assert!(
        (scraped_used - kernel_used).abs() <= 0.05 * kernel_used,
        "memory: exporter {scraped_used}, kernel {kernel_used}"
    );
    assert_eq!(
        unit_value(&series, "ceems_compute_unit_cpus", &uuid),
        Some(3.0)
    );
    assert!(series.contains_key("ceems_scrape_collector_success{collector=\"lsf\"}"));
    let manager = series
        .keys()
        .find(|k| {
            name_of(k) == "ceems_compute_unit_cpus" && label_of(k, "uuid") == Some(uuid.as_str())
        })
        .and_then(|k| label_of(k, "manager"));
    assert_eq!(manager, Some("lsf"));

    // The job ends: its cgroup goes, and so does it from the scrape.
    drop(job);
    let series = parse_series(&exporter.get("/metrics"));
    assert_eq!(unit_value(&series, "ceems_compute_unit_cpus", &uuid), None);
}
