//! The eBPF sub-collector on this machine's real kernel, as root, with the object
//! `scripts/build-bpf.sh` built: a job writes 64 MiB with dd, reads them back and sends 10 MiB
//! over TCP to a listener on 127.0.0.1; the exporter (privileges dropped as in production) must
//! count at least that for the job, and nothing for another job that only sleeps.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::cgroup::{v1_job, v1_skip_reason};
use common::{label_of, name_of, parse_series, start_exporter};

const MIB: f64 = 1024.0 * 1024.0;

/// Sums a family's series of one job (over mount points, protocols and families).
fn total(series: &BTreeMap<String, f64>, job: &str, metric: &str) -> f64 {
    series
        .iter()
        .filter(|(k, _)| name_of(k) == metric && label_of(k, "uuid") == Some(job))
        .map(|(_, v)| *v)
        .sum()
}

/// tracefs, where the programs' tracepoints are; systemd mounts it on a booted host.
fn ensure_tracefs() -> Result<(), String> {
    if Path::new("/sys/kernel/tracing/events").is_dir() {
        return Ok(());
    }
    let out = Command::new("mount")
        .args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"])
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "cannot mount tracefs: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[test]
fn ebpf_counts_a_jobs_io_and_traffic() {
    if let Some(reason) = v1_skip_reason() {
        println!("SKIPPED ebpf_counts_a_jobs_io_and_traffic: {reason}");
        return;
    }
    if let Err(reason) = ensure_tracefs() {
        println!("SKIPPED ebpf_counts_a_jobs_io_and_traffic: {reason}");
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").expect("listener");
    let port = listener.local_addr().expect("port").port();
    let received = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().expect("accept");
        let mut buf = Vec::new();
        conn.read_to_end(&mut buf).expect("receive");
        buf.len()
    });

    let work = tempfile::tempdir().expect("work dir");
    let w = work.path().display().to_string();
    let script = format!(
        "while [ ! -e {w}/go ]; do sleep 0.05; done; \
         dd if=/dev/zero of={w}/data bs=1M count=64 2>/dev/null && \
         dd if={w}/data of=/dev/null bs=1M 2>/dev/null && \
         python3 -c 'import socket; s = socket.create_connection((\"127.0.0.1\", {port})); s.sendall(b\"x\" * (10 << 20)); s.close()' && \
         touch {w}/done; exec sleep 600"
    );
    let base = 700_000 + u64::from(std::process::id()) % 10_000 * 10;
    let (busy, idle) = (base + 1, base + 2);
    let _busy = v1_job(busy, &script, &[]);
    let _idle = v1_job(idle, "exec sleep 600", &[]);
    std::thread::sleep(Duration::from_millis(300));

    let exporter = start_exporter(
        Path::new("/"),
        &[
            "--collector.slurm",
            "--collector.ebpf.io-metrics",
            "--collector.ebpf.network-metrics",
            "--web.disable-exporter-metrics",
        ],
    );
    let (a, b) = (busy.to_string(), idle.to_string());
    let before = parse_series(&exporter.get("/metrics"));
    assert_eq!(
        before["ceems_scrape_collector_success{collector=\"slurm\"}"],
        1.0
    );
    fs::write(work.path().join("go"), "").expect("go");
    let start = Instant::now();
    while !work.path().join("done").exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the job did not finish its IO"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(received.join().expect("listener"), 10 << 20);
    let after = parse_series(&exporter.get("/metrics"));
    let delta = |job: &str, metric: &str| total(&after, job, metric) - total(&before, job, metric);
    let written = delta(&a, "ceems_ebpf_write_bytes_total");
    let read = delta(&a, "ceems_ebpf_read_bytes_total");
    let sent = delta(&a, "ceems_ebpf_egress_bytes_total");
    let packets = delta(&a, "ceems_ebpf_egress_packets_total");
    println!(
        "job {a}: wrote {:.1} MiB, read {:.1} MiB, sent {:.1} MiB in {packets} segments",
        written / MIB,
        read / MIB,
        sent / MIB
    );
    assert!(written >= 64.0 * MIB, "write bytes {written}");
    assert!(read >= 64.0 * MIB, "read bytes {read}");
    assert!(sent >= 10.0 * MIB, "egress bytes {sent}");
    assert!(packets > 0.0, "no egress segments");
    assert!(delta(&a, "ceems_ebpf_open_requests_total") >= 2.0);
    assert!(
        delta(&a, "ceems_ebpf_create_requests_total") >= 1.0,
        "dd created its file"
    );
    for metric in [
        "ceems_ebpf_write_bytes_total",
        "ceems_ebpf_read_bytes_total",
        "ceems_ebpf_egress_bytes_total",
    ] {
        assert_eq!(
            delta(&b, metric),
            0.0,
            "{metric} moved for the idle job {b}"
        );
    }
    assert_eq!(
        after["ceems_scrape_collector_success{collector=\"slurm\"}"],
        1.0
    );
}
