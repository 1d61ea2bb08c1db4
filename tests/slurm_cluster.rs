//! The slurm_cluster collector against stand-in `sinfo` and `squeue` that print what the lab's
//! Slurm 22.05 prints: one run per poll limit however many scrapes ask, and a hung command
//! killed with the last good data served.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{parse_series, start_exporter};

fn stand_in(dir: &Path, name: &str, output: &str, counter: &Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    let delay = dir.join(format!("{name}.delay"));
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\necho run >> '{}'\n[ -f '{}' ] && sleep \"$(cat '{}')\"\ncat <<'EOF'\n{output}EOF\n",
            counter.display(),
            delay.display(),
            delay.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

fn runs(counter: &Path) -> usize {
    std::fs::read_to_string(counter)
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

#[test]
fn concurrent_scrapes_share_one_poll_and_a_hung_command_serves_the_last_data() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // The exporter drops to nobody when started as root: it must run and count the stand-ins.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let counter = dir.join("sinfo.runs");
    let sinfo = stand_in(
        dir,
        "sinfo",
        "localhost|debug*|mixed|1/1/0/2|23081|100|20312\n",
        &counter,
    );
    let squeue = stand_in(
        dir,
        "squeue",
        "debug|RUNNING|alice|physics|None|1\ndebug|PENDING|bob|chemistry|Resources|2\n",
        &dir.join("squeue.runs"),
    );
    let (s1, s2) = (
        format!("--collector.slurm_cluster.sinfo-path={sinfo}"),
        format!("--collector.slurm_cluster.squeue-path={squeue}"),
    );
    let exporter = start_exporter(
        dir,
        &[
            "--collector.disable-defaults",
            "--collector.slurm_cluster",
            &s1,
            &s2,
            "--collector.slurm_cluster.poll-limit=30s",
            "--collector.slurm_cluster.cmd-timeout=1s",
            "--web.max-requests=0",
        ],
    );
    let url = exporter.url("/metrics");
    let bodies: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..10)
            .map(|_| s.spawn(|| ureq::get(&url).call().unwrap().into_string().unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(runs(&counter), 1, "sinfo ran more than once for 10 scrapes");
    let served = bodies
        .iter()
        .filter(|b| {
            b.contains("ceems_slurm_partition_jobs{partition=\"debug\",state=\"running\"} 1")
        })
        .count();
    assert!(served >= 1, "{}", bodies[0]);
    // Later scrapes within the poll limit reuse the data.
    let body = exporter.get("/metrics");
    assert!(
        body.contains("ceems_slurm_pending_jobs{reason=\"Resources\"} 1"),
        "{body}"
    );
    assert_eq!(runs(&counter), 1);
    drop(exporter);

    // A hung sinfo: killed after the timeout; the last good data is served, success 0.
    let exporter = start_exporter(
        dir,
        &[
            "--collector.disable-defaults",
            "--collector.slurm_cluster",
            &s1,
            &s2,
            "--collector.slurm_cluster.poll-limit=0s",
            "--collector.slurm_cluster.cmd-timeout=1s",
        ],
    );
    let first = parse_series(&exporter.get("/metrics"));
    assert_eq!(
        first["ceems_scrape_collector_success{collector=\"slurm_cluster\"}"],
        1.0
    );
    std::fs::write(dir.join("sinfo.delay"), "30").unwrap();
    let start = Instant::now();
    let body = exporter.get("/metrics");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let s = parse_series(&body);
    assert_eq!(
        s["ceems_scrape_collector_success{collector=\"slurm_cluster\"}"],
        0.0
    );
    assert_eq!(s["ceems_slurm_cpus{state=\"total\"}"], 2.0, "{body}");
}
