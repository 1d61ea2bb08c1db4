//! Real kernel accounting: as root on writable cgroup v1 hierarchies, build a Slurm-shaped job
//! cgroup, run a CPU burner that also holds memory inside it, scrape the exporter, and compare
//! with what the kernel itself reports. Also the netdev collector on the real loopback device.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::cgroup::{cpuacct_dir, make_dirs, v1_skip_reason as skip_reason, JobCgroups, CGROUPFS};
use common::{label_of, name_of, parse_series, start_exporter, KillOnDrop};

const MEMORY_MIB: u64 = 256;

fn read_u64(path: &Path) -> u64 {
    fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .parse()
        .expect("number")
}

fn stat_field(path: &Path, key: &str) -> u64 {
    fs::read_to_string(path)
        .expect("stat file")
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {}", path.display()))
}

fn within(got: f64, want: f64, rel: f64) -> bool {
    (got - want).abs() <= rel * want.abs()
}

#[test]
fn scrape_agrees_with_kernel_accounting() {
    if let Some(reason) = skip_reason() {
        println!("SKIPPED scrape_agrees_with_kernel_accounting: {reason}");
        return;
    }
    let cpuacct = cpuacct_dir().expect("checked above");
    let memory = Path::new(CGROUPFS).join("memory");
    let cpuset = Path::new(CGROUPFS).join("cpuset");
    let job_id = 900_000 + std::process::id() % 100_000;
    let job_rel = PathBuf::from(format!("slurm/uid_0/job_{job_id}"));
    let task_rel = job_rel.join("step_batch/task_0");

    let mut job = JobCgroups::new();
    make_dirs(&cpuacct.join(&task_rel), &mut job.dirs, false);
    make_dirs(&memory.join(&task_rel), &mut job.dirs, false);
    let cpuset_ok = cpuset.join("cpuset.cpus").exists();
    if cpuset_ok {
        make_dirs(
            &cpuset.join(job_rel.join("step_batch")),
            &mut job.dirs,
            true,
        );
    }

    // The shell joins the cgroups before exec, so every tick and page of the burner counts.
    let mut join = format!(
        "echo $$ > '{}/cgroup.procs' && echo $$ > '{}/cgroup.procs'",
        cpuacct.join(&task_rel).display(),
        memory.join(&task_rel).display()
    );
    if cpuset_ok {
        join.push_str(&format!(
            " && echo $$ > '{}/cgroup.procs'",
            cpuset.join(job_rel.join("step_batch")).display()
        ));
    }
    let burner = format!(
        "b = b'\\x01' * ({MEMORY_MIB} << 20)\nimport time\nt = time.time()\nwhile time.time() - t < 2.5: pass\ntime.sleep(60)\n"
    );
    // The job works in its scratch directory.
    let scratch = tempfile::tempdir().expect("scratch dir");
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!("{join} && exec python3 -c \"$BURNER\""))
        .env("BURNER", burner)
        .current_dir(scratch.path())
        .stdin(Stdio::null())
        .spawn()
        .expect("start burner");
    job.children.push(KillOnDrop(child));

    // Wait for the burner to finish burning (it then sleeps, so the numbers hold still).
    let user_ticks = cpuacct.join(&job_rel).join("cpuacct.stat");
    let start = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let a = stat_field(&user_ticks, "user");
        std::thread::sleep(Duration::from_millis(300));
        let b = stat_field(&user_ticks, "user");
        if a > 150 && a == b {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "burner did not burn 1.5 s of CPU in 20 s (user ticks {b})"
        );
    }

    let exporter = start_exporter(
        Path::new("/"),
        &[
            "--collector.slurm",
            "--collector.slurm.per-core-metrics",
            "--collector.slurm.memory-detail-metrics",
            &format!(
                "--collector.slurm.scratch-path={}",
                scratch.path().display()
            ),
            "--collector.slurm.scratch-path=/nonexistent-scratch",
            "--web.disable-exporter-metrics",
        ],
    );
    let series = parse_series(&exporter.get("/metrics"));
    let uuid = job_id.to_string();
    let value = |name: &str| -> f64 {
        *series
            .iter()
            .find(|(k, _)| name_of(k) == name && label_of(k, "uuid") == Some(uuid.as_str()))
            .unwrap_or_else(|| panic!("no {name} for job {uuid} in the scrape"))
            .1
    };

    // Two kernel sources: the exporter reads cpuacct.stat (ticks); cpuacct.usage is in ns.
    let kernel_cpu = read_u64(&cpuacct.join(&job_rel).join("cpuacct.usage")) as f64 / 1e9;
    let scraped_cpu = value("ceems_compute_unit_cpu_user_seconds_total")
        + value("ceems_compute_unit_cpu_system_seconds_total");
    assert!(scraped_cpu > 1.5, "burner CPU time missing: {scraped_cpu}");
    assert!(
        within(scraped_cpu, kernel_cpu, 0.05),
        "cpu seconds: exporter {scraped_cpu}, kernel cpuacct.usage {kernel_cpu}"
    );

    let kernel_used = read_u64(&memory.join(&job_rel).join("memory.usage_in_bytes")) as f64;
    let scraped_used = value("ceems_compute_unit_memory_used_bytes");
    assert!(
        within(scraped_used, kernel_used, 0.05),
        "memory used: exporter {scraped_used}, kernel {kernel_used}"
    );
    let kernel_rss = stat_field(&memory.join(&job_rel).join("memory.stat"), "total_rss") as f64;
    let scraped_rss = value("ceems_compute_unit_memory_rss_bytes");
    assert!(
        scraped_rss >= (MEMORY_MIB << 20) as f64 * 0.95,
        "rss {scraped_rss} below the {MEMORY_MIB} MiB the burner holds"
    );
    assert!(
        within(scraped_rss, kernel_rss, 0.05),
        "rss: exporter {scraped_rss}, kernel {kernel_rss}"
    );
    // Per-core times add up to the job's total (both in ns in the kernel).
    let per_core: f64 = series
        .iter()
        .filter(|(k, _)| {
            name_of(k) == "ceems_compute_unit_cpu_per_core_seconds_total"
                && label_of(k, "uuid") == Some(uuid.as_str())
        })
        .map(|(_, v)| *v)
        .sum();
    let usage_now = read_u64(&cpuacct.join(&job_rel).join("cpuacct.usage")) as f64 / 1e9;
    assert!(
        within(per_core, usage_now, 0.01),
        "per-core sum {per_core} vs cpuacct.usage {usage_now}"
    );
    let peak = value("ceems_compute_unit_memory_max_used_bytes");
    assert!(
        peak >= scraped_used * 0.95,
        "peak {peak} below use {scraped_used}"
    );
    println!(
        "job {uuid}: per-core sum {per_core:.4} s / cpuacct.usage {usage_now:.4} s; peak memory {peak}"
    );
    println!(
        "job {uuid}: cpu exporter {scraped_cpu:.3} s / kernel {kernel_cpu:.3} s; \
         memory used exporter {scraped_used} / kernel {kernel_used}; rss exporter {scraped_rss} / kernel {kernel_rss}"
    );
    if cpuset_ok {
        let cpus = fs::read_to_string(cpuset.join(&job_rel).join("cpuset.cpus")).expect("cpus");
        let want = ceems::host::cgroup::parse::cpuset_count(&cpus).expect("cpuset");
        assert_eq!(value("ceems_compute_unit_cpus"), want as f64);
    }
    // Read as the exporter runs: privileges dropped, the process root's.
    let uses = |path: &str| {
        series
            .iter()
            .find(|(k, _)| {
                name_of(k) == "ceems_compute_unit_uses_scratch"
                    && label_of(k, "uuid") == Some(uuid.as_str())
                    && label_of(k, "path") == Some(path)
            })
            .map(|(_, v)| *v)
    };
    assert_eq!(uses(&scratch.path().display().to_string()), Some(1.0));
    assert_eq!(uses("/nonexistent-scratch"), Some(0.0));
    assert!(
        series.contains_key("ceems_scrape_collector_success{collector=\"slurm\"}"),
        "no slurm success gauge"
    );
    assert_eq!(
        series["ceems_scrape_collector_success{collector=\"slurm\"}"],
        1.0
    );
}

/// What the GPU lookup relies on to skip CPU-only jobs cheaply: on real cgroupfs, a process
/// joining a job leaves the subtree's shape as it was, and a step coming, going or being
/// re-created under the same name changes it.
#[test]
fn subtree_shape_follows_steps_not_processes() {
    use ceems::host::cgroup::subtree;
    if let Some(reason) = skip_reason() {
        println!("SKIPPED subtree_shape_follows_steps_not_processes: {reason}");
        return;
    }
    let cpuacct = cpuacct_dir().expect("checked above");
    let job_dir = cpuacct.join(format!(
        "slurm/uid_0/job_{}",
        800_000 + std::process::id() % 100_000
    ));
    let task = job_dir.join("step_batch/task_0");
    let mut job = JobCgroups::new();
    make_dirs(&task, &mut job.dirs, false);
    let (pids, empty) = subtree(&job_dir, &mut Vec::new());
    assert!(pids.is_empty());

    let child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > '{}/cgroup.procs' && exec sleep 60",
            task.display()
        ))
        .stdin(Stdio::null())
        .spawn()
        .expect("start sleeper");
    let pid = child.id();
    job.children.push(KillOnDrop(child));
    let start = Instant::now();
    while !fs::read_to_string(task.join("cgroup.procs"))
        .unwrap_or_default()
        .contains(&pid.to_string())
    {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "sleeper never joined"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(empty.unchanged(), "a process joining changed the shape");
    let (pids, running) = subtree(&job_dir, &mut Vec::new());
    assert_eq!(pids, [pid]);
    assert_eq!(running, empty);

    let step = job_dir.join("step_0");
    fs::create_dir(&step).expect("mkdir step_0");
    assert!(!running.unchanged(), "a new step did not change the shape");
    let (_, with_step) = subtree(&job_dir, &mut Vec::new());
    assert!(with_step.grew_from(&running));
    assert!(!running.grew_from(&with_step));

    // One step ends and another starts between two scrapes: the link count is the same.
    fs::remove_dir(&step).expect("rmdir step_0");
    let next = job_dir.join("step_1");
    fs::create_dir(&next).expect("mkdir step_1");
    assert!(
        !with_step.unchanged(),
        "a replaced step did not change the shape"
    );
    let (_, replaced) = subtree(&job_dir, &mut Vec::new());
    // Made again under the same name.
    fs::remove_dir(&next).expect("rmdir step_1");
    fs::create_dir(&next).expect("mkdir step_1 again");
    assert!(
        !replaced.unchanged(),
        "a re-created step did not change the shape"
    );
    fs::remove_dir(&next).expect("rmdir step_1");
}

/// The kept-open reader against the kernel: values change under kept descriptors, an empty
/// file that gains content is seen, a job made again under the same name is read fresh, and a
/// removed job holds no descriptor.
#[test]
fn kept_descriptors_follow_the_kernel() {
    use ceems::host::cgroup::{CgroupReader, CgroupVersion, HostMemory, ReadOptions};
    if let Some(reason) = skip_reason() {
        println!("SKIPPED kept_descriptors_follow_the_kernel: {reason}");
        return;
    }
    let cpuset_root = Path::new(CGROUPFS).join("cpuset");
    let has_cpuset = cpuset_root.join("cpuset.cpus").exists();
    // Parents of its own, so that the other tests' jobs never see them half made.
    let rel = PathBuf::from(format!(
        "slurm_kept/uid_0/job_{}",
        900_000 + std::process::id() % 100_000
    ));
    let dirs_of = |rel: &Path| {
        let mut dirs = vec![
            cpuacct_dir().expect("checked").join(rel),
            Path::new(CGROUPFS).join("memory").join(rel),
        ];
        if has_cpuset {
            dirs.push(cpuset_root.join(rel));
        }
        dirs
    };
    let make = |job: &mut JobCgroups| {
        for d in dirs_of(&rel) {
            let cpuset = d.starts_with(&cpuset_root);
            make_dirs(&d, &mut job.dirs, cpuset);
            if cpuset {
                // No CPUs until it is given some, whatever the parents have (a write of
                // nothing never reaches the kernel: a newline clears).
                fs::write(d.join("cpuset.cpus"), "\n").expect("clear cpuset");
            }
        }
    };
    let mut reader = CgroupReader::new(
        Path::new(CGROUPFS),
        CgroupVersion::V1,
        HostMemory::default(),
    );
    let scrape = |reader: &mut CgroupReader| {
        let read = reader.read_unit(&rel, ReadOptions::default(), &mut Vec::new());
        reader.end_scrape();
        read
    };
    let memory = Path::new(CGROUPFS).join("memory").join(&rel);
    let mut job = JobCgroups::new();
    make(&mut job);
    fs::write(memory.join("memory.limit_in_bytes"), "67108864").expect("limit");
    let first = scrape(&mut reader).expect("job readable");
    assert_eq!(first.memory_total_bytes, 67_108_864.0);
    assert_eq!(first.cpus, 0.0);
    assert!(reader.kept_descriptors() >= 5, "files were not kept open");

    fs::write(memory.join("memory.limit_in_bytes"), "33554432").expect("limit");
    if has_cpuset {
        let d = cpuset_root.join(&rel);
        let parent = fs::read_to_string(d.parent().expect("parent").join("cpuset.cpus"));
        fs::write(d.join("cpuset.cpus"), parent.expect("parent cpuset").trim()).expect("give CPUs");
    }
    let second = scrape(&mut reader).expect("job readable");
    assert_eq!(second.memory_total_bytes, 33_554_432.0);
    if has_cpuset {
        assert!(
            second.cpus >= 1.0,
            "the CPUs given to the job were not seen"
        );
    }

    // The kernel fails reads through a removed cgroup's descriptors, and a job made again
    // under the same name is read through new ones.
    let stale = fs::File::open(memory.join("memory.limit_in_bytes")).expect("open");
    drop(job);
    let mut buf = [0u8; 64];
    assert!(
        std::os::unix::fs::FileExt::read_at(&stale, &mut buf, 0).is_err(),
        "a removed cgroup's file still reads"
    );
    let mut job = JobCgroups::new();
    make(&mut job);
    fs::write(memory.join("memory.limit_in_bytes"), "16777216").expect("limit");
    let again = scrape(&mut reader).expect("job readable");
    assert_eq!(again.memory_total_bytes, 16_777_216.0);
    drop(job);
    assert!(scrape(&mut reader).is_err(), "a removed job was read");
    assert_eq!(reader.kept_descriptors(), 0);
}

/// The netdev collector on this machine's loopback device: what the test sends over
/// 127.0.0.1 shows in `lo`'s counters (both ways, as loopback receives what it sends).
#[test]
fn netdev_counts_loopback_traffic() {
    use std::io::{Read, Write};
    let exporter = start_exporter(
        Path::new("/"),
        &[
            "--collector.disable-defaults",
            "--collector.netdev",
            "--collector.netdev.device-include=^lo$",
            "--web.disable-exporter-metrics",
        ],
    );
    let counter = |text: &str, name: &str| -> f64 {
        let mut found = parse_series(text)
            .into_iter()
            .filter(|(series, _)| name_of(series) == name);
        let (series, value) = found.next().unwrap_or_else(|| panic!("no {name}:\n{text}"));
        assert_eq!(label_of(&series, "device"), Some("lo"));
        assert!(found.next().is_none(), "devices other than lo:\n{text}");
        value
    };
    let before = exporter.get("/metrics");
    assert!(before.contains("ceems_scrape_collector_success{collector=\"netdev\"} 1"));

    const SENT: usize = 4 << 20;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    let reader = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().expect("accept");
        let mut sink = Vec::new();
        conn.read_to_end(&mut sink).expect("read");
        sink.len()
    });
    let mut conn = std::net::TcpStream::connect(addr).expect("connect");
    conn.write_all(&vec![7u8; SENT]).expect("send");
    drop(conn);
    assert_eq!(reader.join().expect("reader"), SENT);

    let after = exporter.get("/metrics");
    for name in [
        "ceems_netdev_receive_bytes_total",
        "ceems_netdev_transmit_bytes_total",
    ] {
        let grew = counter(&after, name) - counter(&before, name);
        assert!(
            grew >= SENT as f64,
            "{name} grew by {grew}, less than the {SENT} bytes sent"
        );
    }
}
