//! The perf sub-collector on this machine's real kernel, as root: a job in real cgroups runs a
//! burner that counts the page faults it causes itself, and the exporter (privileges dropped as
//! in production) must count at least as many; a job without the opt-in variable gets no perf
//! series; 200 jobs coming and going leave no descriptor behind; a cgroup on the unified
//! hierarchy is counted in cgroup mode; and perf and eBPF failing leave the job's other series
//! and the collector's success as they were.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::cgroup::{fd_count, make_dirs, spawn_in, v1_job, v1_skip_reason, JobCgroups, CGROUPFS};
use common::{label_of, name_of, parse_series, start_exporter, start_listening, Running};

const PERF_FD: &str = "anon_inode:[perf_event]";

/// Pages the burner touches after the go file appears.
const PAGES: usize = 20_000;

/// Sleeps in small steps until `go` exists (context switches), touches fresh pages, writes
/// the page faults it caused (its own rusage) to `done`, then keeps sleeping.
const BURNER: &str = r#"
import mmap, os, resource, sys, time
go, done, pages = sys.argv[1], sys.argv[2], int(sys.argv[3])
while not os.path.exists(go):
    time.sleep(0.005)
def faults():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt + r.ru_majflt
before = faults()
m = mmap.mmap(-1, pages * 4096)
for i in range(0, pages * 4096, 4096):
    m[i] = 1
for _ in range(100):
    time.sleep(0.001)
caused = faults() - before
with open(done + ".tmp", "w") as f:
    f.write(str(caused))
os.rename(done + ".tmp", done)
time.sleep(600)
"#;

/// The job's shell waits for `go`, then starts the burner as its child: created after the
/// first scrape opened the shell's counters, the burner is counted through their inheritance.
fn burner_script(dir: &Path) -> String {
    fs::write(dir.join("burner.py"), BURNER).expect("write burner");
    format!(
        "while [ ! -e {0}/go ]; do sleep 0.005; done; python3 {0}/burner.py {0}/go {0}/done {PAGES}",
        dir.display()
    )
}

fn perf_value(exporter: &Running, job: &str, metric: &str) -> Option<f64> {
    let series = parse_series(&exporter.get("/metrics"));
    series
        .iter()
        .find(|(k, _)| name_of(k) == metric && label_of(k, "uuid") == Some(job))
        .map(|(_, v)| *v)
}

fn scrape(exporter: &Running) -> std::collections::BTreeMap<String, f64> {
    parse_series(&exporter.get("/metrics"))
}

fn value_of(series: &std::collections::BTreeMap<String, f64>, job: &str, metric: &str) -> f64 {
    series
        .iter()
        .find(|(k, _)| name_of(k) == metric && label_of(k, "uuid") == Some(job))
        .map(|(_, v)| *v)
        .unwrap_or(0.0)
}

fn has_perf(series: &std::collections::BTreeMap<String, f64>, job: &str) -> bool {
    series
        .keys()
        .any(|k| name_of(k).starts_with("ceems_perf_") && label_of(k, "uuid") == Some(job))
}

fn wait_for(path: &Path, what: &str) -> String {
    let start = Instant::now();
    loop {
        if let Ok(text) = fs::read_to_string(path) {
            return text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn job_id(offset: u64) -> u64 {
    800_000 + (u64::from(std::process::id()) % 10_000) * 10 + offset
}

#[test]
fn perf_counts_what_the_job_itself_caused() {
    if let Some(reason) = v1_skip_reason() {
        println!("SKIPPED perf_counts_what_the_job_itself_caused: {reason}");
        return;
    }
    let work = tempfile::tempdir().expect("work dir");
    let quiet = tempfile::tempdir().expect("work dir");
    let (profiled, unprofiled) = (job_id(1), job_id(2));
    let _a = v1_job(
        profiled,
        &burner_script(work.path()),
        &[("CEEMS_ENABLE_PERF", "0")],
    );
    let _b = v1_job(unprofiled, &burner_script(quiet.path()), &[]);
    std::thread::sleep(Duration::from_millis(300));

    // Hardware events are asked for too: this VM has no PMU, so they are said once and left
    // out while the rest is served.
    let exporter = start_exporter(
        Path::new("/"),
        &[
            "--collector.slurm",
            "--collector.perf.hardware-events",
            "--collector.perf.software-events",
            "--collector.perf.env-var=CEEMS_ENABLE_PERF",
            "--collector.perf.env-var=ENABLE_PERF",
            "--web.disable-exporter-metrics",
        ],
    );
    let (a, b) = (profiled.to_string(), unprofiled.to_string());
    // The first scrape opens the counters; the burner sleeps in small steps meanwhile.
    let first = scrape(&exporter);
    assert_eq!(
        first["ceems_scrape_collector_success{collector=\"slurm\"}"],
        1.0
    );
    assert!(
        first.keys().any(
            |k| name_of(k) == "ceems_compute_unit_cpu_user_seconds_total"
                && label_of(k, "uuid") == Some(a.as_str())
        ),
        "the profiled job is not in the scrape"
    );
    std::thread::sleep(Duration::from_millis(500));
    let before = scrape(&exporter);
    let faults_before = value_of(&before, &a, "ceems_perf_page_faults_total");
    let switches_before = value_of(&before, &a, "ceems_perf_context_switches_total");
    assert!(
        switches_before > 0.0,
        "no context switches counted for a job that sleeps in 5 ms steps"
    );

    fs::write(work.path().join("go"), "").expect("go");
    let caused: f64 = wait_for(&work.path().join("done"), "the burner's fault count")
        .trim()
        .parse()
        .expect("fault count");
    assert!(
        caused >= PAGES as f64 * 0.5,
        "burner caused only {caused} faults"
    );
    let after = scrape(&exporter);
    let faults_after = value_of(&after, &a, "ceems_perf_page_faults_total");
    let switches_after = value_of(&after, &a, "ceems_perf_context_switches_total");
    println!(
        "job {a}: page faults {faults_before} -> {faults_after} (burner caused {caused}); context switches {switches_before} -> {switches_after}"
    );
    assert!(
        faults_after - faults_before >= caused,
        "exporter counted {} page faults, the burner caused {caused}",
        faults_after - faults_before
    );
    assert!(
        switches_after > switches_before,
        "context switches did not grow"
    );
    // The other job never set the variable.
    assert!(
        !has_perf(&after, &b),
        "job {b} has perf series without the variable"
    );
    assert!(
        after.keys().any(
            |k| name_of(k) == "ceems_compute_unit_cpu_user_seconds_total"
                && label_of(k, "uuid") == Some(b.as_str())
        ),
        "job {b} is not in the scrape at all"
    );
    // No PMU here: hardware series are absent, not zero, and the scrape still succeeds.
    assert_eq!(
        after["ceems_scrape_collector_success{collector=\"slurm\"}"],
        1.0
    );
    assert!(perf_value(&exporter, &a, "ceems_perf_page_faults_total").is_some());
}

#[test]
fn perf_descriptors_follow_the_jobs() {
    if let Some(reason) = v1_skip_reason() {
        println!("SKIPPED perf_descriptors_follow_the_jobs: {reason}");
        return;
    }
    let exporter = start_exporter(
        Path::new("/"),
        &[
            "--collector.slurm",
            "--collector.perf.software-events",
            "--web.disable-exporter-metrics",
        ],
    );
    let pid = exporter.child.id();
    scrape(&exporter);
    let baseline = fd_count(pid, PERF_FD);
    const JOBS: u64 = 200;
    let mut jobs: Vec<JobCgroups> = (0..JOBS)
        .map(|i| v1_job(job_id(100) * 1000 + i, "exec sleep 600", &[]))
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let series = scrape(&exporter);
    let counted = series
        .keys()
        .filter(|k| name_of(k) == "ceems_perf_context_switches_total")
        .count();
    let during = fd_count(pid, PERF_FD);
    println!("exporter perf descriptors: {baseline} before, {during} with {JOBS} jobs ({counted} jobs with context switches)");
    // Five software events on one task per job.
    assert!(
        during >= JOBS as usize * 5,
        "{during} descriptors with {JOBS} jobs, {baseline} without"
    );
    jobs.clear();
    scrape(&exporter);
    let after = fd_count(pid, PERF_FD);
    // Other jobs of this machine may be counted too; none of ours may stay.
    assert!(
        after <= baseline,
        "perf descriptors leaked: {after} after the jobs ended, {baseline} before"
    );
}

#[test]
fn perf_counts_a_cgroup_in_cgroup_mode() {
    if !nix::unistd::Uid::effective().is_root() {
        println!("SKIPPED perf_counts_a_cgroup_in_cgroup_mode: not running as root");
        return;
    }
    let unified = Path::new(CGROUPFS).join("unified");
    let root: PathBuf = if Path::new(CGROUPFS).join("cgroup.controllers").exists() {
        PathBuf::from(CGROUPFS)
    } else if unified.join("cgroup.procs").exists() {
        unified
    } else {
        println!("SKIPPED perf_counts_a_cgroup_in_cgroup_mode: no cgroup v2 hierarchy mounted");
        return;
    };
    let work = tempfile::tempdir().expect("work dir");
    let rel = PathBuf::from(format!("ceems-perf-test-{}/job_1", std::process::id()));
    let dir = root.join(&rel);
    let mut job = JobCgroups::new();
    make_dirs(&dir, &mut job.dirs, false);
    job.children.push(spawn_in(
        std::slice::from_ref(&dir),
        &burner_script(work.path()),
        &[],
    ));
    std::thread::sleep(Duration::from_millis(300));

    let settings = ceems::collect::units::perf::PerfSettings {
        software_events: true,
        ..Default::default()
    };
    let perf = ceems::collect::units::perf::PerfStats::from_settings(
        &settings,
        Path::new("/proc"),
        Path::new("/sys"),
        &root,
        ceems::host::cgroup::CgroupVersion::V2,
    )
    .expect("perf settings")
    .expect("perf on");
    let pids: Vec<u32> = fs::read_to_string(dir.join("cgroup.procs"))
        .expect("procs")
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect();
    let unit = ceems::collect::units::perf::PerfUnit {
        uuid: "1",
        dir: &dir,
        rel: &rel,
        pids: &pids,
    };
    let read = |out: ceems::metrics::MetricSet| -> f64 {
        let mut text = String::new();
        out.encode_text(&mut text);
        let series = parse_series(&text);
        value_of(&series, "1", "ceems_perf_page_faults_total")
    };
    let mut out = ceems::metrics::MetricSet::new();
    perf.collect(std::slice::from_ref(&unit), "slurm", "node", &mut out);
    let cpus = ceems::host::perf::cpu_list(
        &fs::read_to_string("/sys/devices/system/cpu/online").expect("online CPUs"),
    )
    .expect("cpu list")
    .len();
    assert_eq!(
        perf.open_descriptors(),
        5 * cpus,
        "cgroup mode opens one counter per event and CPU"
    );
    let before = read(out);
    fs::write(work.path().join("go"), "").expect("go");
    let caused: f64 = wait_for(&work.path().join("done"), "the burner's fault count")
        .trim()
        .parse()
        .expect("fault count");
    let mut out = ceems::metrics::MetricSet::new();
    perf.collect(std::slice::from_ref(&unit), "slurm", "node", &mut out);
    let after = read(out);
    println!("cgroup mode: page faults {before} -> {after}, burner caused {caused}");
    assert!(
        after - before >= caused,
        "counted {} faults, burner caused {caused}",
        after - before
    );
    // The unit ends: its descriptors close.
    perf.collect(&[], "slurm", "node", &mut ceems::metrics::MetricSet::new());
    assert_eq!(perf.open_descriptors(), 0);
}

#[test]
fn perf_and_ebpf_failures_leave_the_slurm_series_whole() {
    let missing = ["unshare", "setpriv"].into_iter().find(|tool| {
        !std::process::Command::new(tool)
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if let Some(reason) = v1_skip_reason().or(missing.map(|t| format!("`{t}` is not installed"))) {
        println!("SKIPPED perf_and_ebpf_failures_leave_the_slurm_series_whole: {reason}");
        return;
    }
    let id = job_id(7);
    let _job = v1_job(id, "exec sleep 600", &[]);
    let job = id.to_string();
    let log = tempfile::NamedTempFile::new().expect("log file");

    // In a mount namespace of its own without tracefs (the eBPF programs cannot attach), and
    // without CAP_PERFMON or CAP_SYS_ADMIN in its bounding set (the kernel refuses every perf
    // counter on another user's process, at the scrape that opens them).
    let mut command = std::process::Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(
            "umount -l /sys/kernel/tracing 2>/dev/null; umount -l /sys/kernel/debug 2>/dev/null; \
             exec setpriv --bounding-set -perfmon,-sys_admin -- \"$@\"",
        )
        .args(["sh", env!("CARGO_BIN_EXE_ceems"), "exporter"])
        .args([
            "--collector.slurm",
            "--collector.perf.software-events",
            "--collector.ebpf.io-metrics",
            "--collector.ebpf.network-metrics",
            "--web.disable-exporter-metrics",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(log.reopen().expect("log file"));
    let exporter = start_listening(command, "exporter without perf and eBPF");

    for _ in 0..3 {
        let series = scrape(&exporter);
        assert_eq!(
            series["ceems_scrape_collector_success{collector=\"slurm\"}"], 1.0,
            "the slurm collector failed with its sub-collectors"
        );
        assert!(
            value_of(&series, &job, "ceems_compute_unit_memory_used_bytes") > 0.0,
            "job {job}'s own series are missing"
        );
        assert!(
            !series.keys().any(|k| (name_of(k).starts_with("ceems_perf_")
                || name_of(k).starts_with("ceems_ebpf_"))
                && label_of(k, "uuid") == Some(job.as_str())),
            "series from sub-collectors that cannot count"
        );
    }
    let log = fs::read_to_string(log.path()).expect("log");
    let lines = |what: &str| log.lines().filter(|l| l.contains(what)).count();
    assert_eq!(
        lines("eBPF sub-collector off"),
        1,
        "the eBPF failure is said once:\n{log}"
    );
    assert!(log.contains("tracefs is not mounted"), "{log}");
    assert_eq!(
        lines("cannot open perf counters"),
        1,
        "the perf refusal is said once over three scrapes:\n{log}"
    );
}
