//! A Prometheus-compatible long-term store in the real Slurm lab: Debian's Prometheus scrapes
//! the exporter, evaluates the project's recording rules and remote-writes everything to
//! Debian's VictoriaMetrics. A stats-server querying VictoriaMetrics computes the same per-job
//! aggregates as one querying Prometheus itself, within 1 %: CPU time and usage, memory, and
//! the CPU power, host power and emissions of the recording rules (host power from an IPMI
//! tool stand-in, CPU power from a powercap tree whose counter a thread advances at 50 W,
//! emissions from OWID's static factor for France).

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::lab::{
    lab, prometheus_scraping_with, prometheus_tools, start_stats_server_with, submit,
    victoria_metrics_tools, wait_jobs_gone, wait_until, write_burner, CancelOnDrop,
    VictoriaMetrics, BURNER,
};
use common::{fixtures, runnable, start_exporter, stub};

/// A sysfs root whose one RAPL package zone draws `watts`, until dropped.
struct AdvancingRapl {
    root: tempfile::TempDir,
    stop: Arc<AtomicBool>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl AdvancingRapl {
    fn start(watts: f64) -> AdvancingRapl {
        let root = tempfile::tempdir().unwrap();
        let zone = root.path().join("class/powercap/intel-rapl:0");
        std::fs::create_dir_all(&zone).unwrap();
        std::fs::write(zone.join("name"), "package-0\n").unwrap();
        std::fs::write(zone.join("max_energy_range_uj"), "262143328850\n").unwrap();
        std::fs::write(zone.join("energy_uj"), "0\n").unwrap();
        for dir in root.path().ancestors().take(1).chain(zone.ancestors()) {
            if dir.starts_with(root.path()) {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let writer = std::thread::spawn(move || {
            let start = Instant::now();
            while !flag.load(Ordering::Relaxed) {
                let uj = (start.elapsed().as_secs_f64() * watts * 1e6) as u64;
                // Renamed into place, so the exporter never reads half a number.
                let tmp = zone.join(".energy_uj");
                std::fs::write(&tmp, format!("{uj}\n")).unwrap();
                std::fs::rename(&tmp, zone.join("energy_uj")).unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        AdvancingRapl {
            root,
            stop,
            writer: Some(writer),
        }
    }

    fn sysfs(&self) -> &Path {
        self.root.path()
    }
}

impl Drop for AdvancingRapl {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

const FIELDS: [&str; 7] = [
    "total_cpu_seconds",
    "avg_cpu_usage",
    "avg_cpu_mem_usage_bytes",
    "memory_peak_bytes",
    "total_cpu_energy_usage_kwh",
    "total_host_energy_usage_kwh",
    "total_emissions_gms",
];

fn units(server: &common::Running) -> serde_json::Value {
    let mut path = String::from("/api/v1/units/admin?from=0&field=uuid&field=aggregates_status");
    for f in FIELDS {
        path.push_str(&format!("&field={f}"));
    }
    let body = ureq::get(&server.url(&path))
        .set("X-Grafana-User", "root")
        .call()
        .map(|r| r.into_string().unwrap_or_default())
        .unwrap_or_default();
    serde_json::from_str(&body).unwrap_or_default()
}

/// A plain number, or the one value of a CEEMS series object (`{"global": 12.5}`).
fn number(v: &serde_json::Value) -> Option<f64> {
    v.as_f64()
        .or_else(|| v.as_object()?.values().next()?.as_f64())
}

fn job<'a>(units: &'a serde_json::Value, id: &str) -> Option<&'a serde_json::Value> {
    units["data"].as_array()?.iter().find(|u| u["uuid"] == id)
}

fn done(units: &serde_json::Value, ids: &[String]) -> bool {
    ids.iter()
        .all(|id| job(units, id).is_some_and(|u| u["aggregates_status"] == "done"))
}

#[test]
fn aggregates_through_victoria_metrics_equal_those_through_prometheus() {
    let tools = lab()
        .and_then(|_| prometheus_tools())
        .and_then(|_| victoria_metrics_tools());
    if !runnable("victoria_metrics_lab", tools) {
        return;
    }
    let vm = VictoriaMetrics::start();
    let rapl = AdvancingRapl::start(50.0);
    let stubs = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(stubs.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let ipmi: PathBuf = stub(
        stubs.path(),
        "ipmi-dcmi",
        &fixtures()
            .join("compat/fixtures/ipmi/freeipmi/ipmi-dcmi_--get-system-power-statistics.txt"),
    );
    let exporter = start_exporter(
        Path::new("/"),
        &[
            "--collector.slurm",
            &format!("--path.sysfs={}", rapl.sysfs().display()),
            "--path.cgroupfs=/sys/fs/cgroup",
            "--collector.rapl",
            "--collector.ipmi",
            &format!("--collector.ipmi.dcmi.cmd={}", ipmi.display()),
            "--collector.emissions",
            "--collector.emissions.provider=owid",
            "--collector.emissions.country-code=FR",
        ],
    );
    // Four scrapes a second: increase() extrapolates to the job's start on Prometheus and
    // counts from its first sample on VictoriaMetrics, half a scrape's worth apart; at 4 Hz
    // that is about 0.6 % of a 20 s job (0.8 % of a 15 s one: too close to 1 % to test).
    let prom = prometheus_scraping_with(exporter.port, "250ms", &vm.remote_write());

    write_burner();
    let short = submit(
        "alice",
        &format!("-J vm-short -c 1 --mem=200M --wrap 'python3 {BURNER} 20'"),
    );
    let long = submit(
        "bob",
        &format!("-J vm-long -c 1 --mem=300M --wrap 'python3 {BURNER} 25'"),
    );
    let ids = [short.clone(), long.clone()];
    let _cancel = CancelOnDrop(ids.to_vec());
    wait_jobs_gone(&ids, Duration::from_secs(180));

    // VictoriaMetrics answers for its last 30 s (-search.latencyOffset) only once they are
    // older, and remote write sends every 5 s: its server counts up to 35 s ago. Both servers
    // start once that is past the jobs' end and take the same delay, so each sees each job
    // in one window and only the stores differ.
    std::thread::sleep(Duration::from_secs(40));
    let delay = ["--prometheus.query-delay=35s"];
    let (direct, _d1) = start_stats_server_with(&prom.url(), "2s", &delay);
    let (through_vm, _d2) = start_stats_server_with(&vm.url(), "2s", &delay);
    let (mut a, mut b) = (serde_json::Value::Null, serde_json::Value::Null);
    wait_until("both servers' aggregates", Duration::from_secs(150), || {
        a = units(&direct);
        b = units(&through_vm);
        done(&a, &ids) && done(&b, &ids)
    });
    let mut differences = Vec::new();
    for id in &ids {
        let (pa, pb) = (job(&a, id).unwrap(), job(&b, id).unwrap());
        for f in FIELDS {
            let (x, y) = (number(&pa[f]), number(&pb[f]));
            println!("job {id} {f}: prometheus {x:?}, victoria-metrics {y:?}");
            let (Some(x), Some(y)) = (x, y) else {
                differences.push(format!("job {id} {f}: {x:?} against {y:?}"));
                continue;
            };
            if x <= 0.0 {
                differences.push(format!("job {id} {f}: no value through Prometheus ({x})"));
            } else if (x - y).abs() > 0.01 * x {
                differences.push(format!(
                    "job {id} {f}: {x} through Prometheus, {y} through VictoriaMetrics ({:+.2} %)",
                    100.0 * (y - x) / x
                ));
            }
        }
    }
    assert!(differences.is_empty(), "{differences:#?}");
}
