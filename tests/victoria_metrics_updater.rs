//! The stats-server's updater against Debian's VictoriaMetrics holding 300 jobs' series,
//! written through its import API (CPU counters, memory, and the recorded power and emissions,
//! every 30 s over each job's life), with a series limit a batch of jobs exceeds. Each job's
//! aggregates equal what PromQL gives for that job alone; the refused batches are asked in
//! halves; and when the store goes down in the middle of a run, the jobs already counted keep
//! their values, the others are counted at the next run, and none is counted twice.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::http::{Request, Response, TestServer};
use common::lab::{victoria_metrics_tools, wait_until, VictoriaMetrics};

const JOBS: u64 = 300;
/// The series limit: a query over more than 50 jobs' CPU counters is refused.
const MAX_SERIES: &str = "-search.maxUniqueTimeseries=100";

struct Job {
    id: u64,
    start: u64,
    end: u64,
    cores: f64,
    watts: f64,
    memory: f64,
}

/// Jobs of the last three hours, of lengths from 2 to 52 minutes, all ended five minutes ago
/// at least (the store shows the newest 30 s only later).
fn jobs(now: u64) -> Vec<Job> {
    (0..JOBS)
        .map(|i| {
            let start = now - 10_800 + i * 25;
            Job {
                id: 5000 + i,
                start,
                end: start + 120 + (i * 97) % 3000,
                cores: 0.5 + (i % 4) as f64 * 0.5,
                watts: 40.0 + (i % 7) as f64 * 15.0,
                memory: 1e9 + i as f64 * 1e6,
            }
        })
        .collect()
}

/// The jobs' series in Prometheus's text format with timestamps, as an exporter and the
/// recording rules would have them, for the import API.
fn series(jobs: &[Job]) -> String {
    let mut text = String::new();
    for j in jobs {
        let labels = format!(
            "job=\"ceems\",instance=\"node{}:9010\",uuid=\"{}\"",
            j.id % 10,
            j.id
        );
        let mut t = j.start;
        while t <= j.end {
            let ms = t * 1000;
            let s = (t - j.start) as f64;
            for (name, value) in [
                ("ceems_compute_unit_cpu_user_seconds_total", j.cores * s),
                ("ceems_compute_unit_cpu_system_seconds_total", 0.1 * s),
                ("ceems_compute_unit_memory_used_bytes", j.memory),
                ("uuid:ceems_host_power_watts:pue", j.watts),
                (
                    "uuid:ceems_host_emissions_g_s:pue",
                    j.watts / 3.6e6 * 44.179085,
                ),
            ] {
                text.push_str(&format!("{name}{{{labels}}} {value} {ms}\n"));
            }
            t += 30;
        }
    }
    text
}

/// A `sacct` that prints the jobs, as `sacct --parsable2` lists them.
fn sacct(dir: &Path, jobs: &[Job]) -> std::path::PathBuf {
    let lines: String = jobs
        .iter()
        .map(|j| {
            let d = j.end - j.start;
            format!(
                "{}|cpu|normal|physics|alice|2001|alice|2001|{}|{}|{}|{:02}:{:02}:{:02}|{d}|0:0|COMPLETED|billing=2,cpu=2,mem=2G,node=1|node{}|/home/alice|120|job{}\n",
                j.id, j.start, j.start, j.end, d / 3600, d / 60 % 60, d % 60, j.id % 10, j.id
            )
        })
        .collect();
    let listing = dir.join("sacct.txt");
    std::fs::write(&listing, lines).unwrap();
    common::stub(dir, "sacct", &listing)
}

/// The value of `promql` for one job, from the store itself.
fn one_job(vm: &VictoriaMetrics, promql: &str, at: u64) -> f64 {
    let body = ureq::post(&format!("{}/api/v1/query", vm.url()))
        .send_form(&[("query", promql), ("time", &at.to_string())])
        .unwrap()
        .into_string()
        .unwrap();
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    answer["data"]["result"][0]["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{promql}: {answer}"))
}

/// In front of the store: forwards queries, counting those answered, and answers 503 (the
/// store down) after `up_for` of them until `back` is set.
fn flaky_proxy(
    vm_url: String,
    up_for: usize,
    back: Arc<AtomicBool>,
) -> (TestServer, Arc<AtomicUsize>) {
    let answered = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&answered);
    let proxy = TestServer::start(
        false,
        Arc::new(move |req: &Request| {
            if count.load(Ordering::SeqCst) >= up_for && !back.load(Ordering::SeqCst) {
                return Response::raw(503, "store down");
            }
            let url = format!("{vm_url}{}", req.target);
            let forwarded = ureq::request(&req.method, &url)
                .set(
                    "Content-Type",
                    req.header("content-type").unwrap_or("text/plain"),
                )
                .send_bytes(&req.body);
            let (status, body) = match forwarded {
                Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
                Err(ureq::Error::Status(s, r)) => (s, r.into_string().unwrap_or_default()),
                Err(e) => (502, e.to_string()),
            };
            if status == 200 {
                count.fetch_add(1, Ordering::SeqCst);
            }
            Response::raw(status, body).with_header("Content-Type", "application/json")
        }),
    );
    (proxy, answered)
}

/// Each job's uuid, status and the fields compared, as the admin reads them.
fn units(server: &common::Running) -> Vec<serde_json::Value> {
    let answer = common::api_get(
        server,
        "/api/v1/units/admin?from=0&field=uuid&field=aggregates_status&field=total_cpu_seconds&field=total_host_energy_usage_kwh&field=total_emissions_gms&field=avg_cpu_mem_usage_bytes",
        "root",
    );
    answer["data"].as_array().cloned().unwrap_or_default()
}

fn done(units: &[serde_json::Value]) -> usize {
    units
        .iter()
        .filter(|u| u["aggregates_status"] == "done")
        .count()
}

/// Equal, but for the API's rounding to eight decimals.
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-8 + 1e-9 * a.abs().max(b.abs())
}

#[test]
fn the_updater_on_victoria_metrics_counts_every_job_once_through_limits_and_an_outage() {
    if !common::runnable(
        "the_updater_on_victoria_metrics_counts_every_job_once_through_limits_and_an_outage",
        victoria_metrics_tools(),
    ) {
        return;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let jobs = jobs(now);
    let vm = VictoriaMetrics::start_with(&[MAX_SERIES]);
    ureq::post(&format!("{}/api/v1/import/prometheus", vm.url()))
        .send_string(&series(&jobs))
        .unwrap();
    ureq::get(&format!("{}/internal/force_flush", vm.url()))
        .call()
        .unwrap();
    let first = &jobs[0];
    wait_until(
        "the import to be searchable",
        Duration::from_secs(30),
        || {
            let q = format!(
                "count(ceems_compute_unit_memory_used_bytes{{uuid=\"{}\"}})",
                first.id
            );
            ureq::post(&format!("{}/api/v1/query", vm.url()))
                .send_form(&[("query", &q), ("time", &first.end.to_string())])
                .ok()
                .and_then(|r| r.into_string().ok())
                .is_some_and(|b| b.contains("\"value\""))
        },
    );

    // The store goes down after 40 answers: some batches are counted, then none.
    let back = Arc::new(AtomicBool::new(false));
    let (proxy, answered) = flaky_proxy(vm.url(), 40, Arc::clone(&back));
    let dir = tempfile::tempdir().unwrap();
    let sacct = sacct(dir.path(), &jobs);
    let server = common::start_subcommand(
        "stats-server",
        dir.path(),
        &[
            &format!("--storage.data.path={}", dir.path().join("db").display()),
            &format!("--slurm.sacct.path={}", sacct.display()),
            "--slurm.sacctmgr.path=",
            "--slurm.run-as-user=",
            "--slurm.cluster-id=vm",
            &format!("--prometheus.url={}", proxy.url()),
            "--prometheus.scrape-interval=30s",
            "--storage.update-interval=2s",
            "--storage.first-window=1d",
            "--web.admin-users=root",
            "--security.drop-privileges=false",
        ],
        &[],
    );
    wait_until(
        "the store to go down mid-run",
        Duration::from_secs(60),
        || answered.load(Ordering::SeqCst) >= 40 && done(&units(&server)) > 0,
    );
    // A run or two against the store down: nothing more is counted.
    std::thread::sleep(Duration::from_secs(5));
    let during = units(&server);
    let counted = done(&during);
    assert!(
        counted > 0 && counted < JOBS as usize,
        "{counted} of {JOBS} jobs counted before the outage"
    );

    back.store(true, Ordering::SeqCst);
    let mut after = Vec::new();
    wait_until("every job counted", Duration::from_secs(60), || {
        after = units(&server);
        done(&after) == JOBS as usize
    });

    // Each job's aggregates are what PromQL gives for it alone, counted once; the jobs
    // counted before the outage have kept theirs.
    let kept: std::collections::HashMap<String, serde_json::Value> = during
        .iter()
        .filter(|u| u["aggregates_status"] == "done")
        .map(|u| (u["uuid"].as_str().unwrap().to_owned(), u.clone()))
        .collect();
    for j in &jobs {
        let unit = after
            .iter()
            .find(|u| u["uuid"].as_str() == Some(j.id.to_string().as_str()))
            .unwrap_or_else(|| panic!("job {} missing", j.id));
        let duration = (j.end - j.start) as f64;
        let selector = |name: &str| format!("{name}{{uuid=\"{}\"}}", j.id);
        let cpu = one_job(
            &vm,
            &format!(
                "sum(increase({}[4h]) + increase({}[4h]))",
                selector("ceems_compute_unit_cpu_user_seconds_total"),
                selector("ceems_compute_unit_cpu_system_seconds_total")
            ),
            now,
        );
        let watts = one_job(
            &vm,
            &format!(
                "avg_over_time({}[4h])",
                selector("uuid:ceems_host_power_watts:pue")
            ),
            now,
        );
        let memory = one_job(
            &vm,
            &format!(
                "avg_over_time({}[4h])",
                selector("ceems_compute_unit_memory_used_bytes")
            ),
            now,
        );
        let got = |field: &str| unit[field].as_f64().unwrap_or(f64::NAN);
        assert!(
            close(got("total_cpu_seconds"), cpu),
            "job {}: {unit} against {cpu}",
            j.id
        );
        assert!(
            close(got("total_host_energy_usage_kwh"), watts * duration / 3.6e6),
            "job {}: {unit} against {watts} W",
            j.id
        );
        assert!(
            close(got("avg_cpu_mem_usage_bytes"), memory),
            "job {}: {unit}",
            j.id
        );
        // And what the job really did: its cores from its first sample to its last.
        let sampled = ((j.end - j.start) / 30 * 30) as f64;
        assert!(
            (cpu - (j.cores + 0.1) * sampled).abs() < 1e-6 * cpu,
            "job {}: {cpu} CPU seconds",
            j.id
        );
        if let Some(before) = kept.get(&j.id.to_string()) {
            assert_eq!(before, unit, "job {} changed after it was done", j.id);
        }
    }
    // The operator sees the refusals and the outage in the server's metrics.
    let metrics = server.get("/metrics");
    let value = |name: &str| {
        common::parse_series(&metrics)
            .get(&format!("{name}{{cluster_id=\"vm\"}}"))
            .copied()
            .unwrap_or(0.0)
    };
    assert!(
        value("ceems_stats_aggregate_split_batches_total") >= 2.0,
        "{metrics}"
    );
    assert!(
        value("ceems_stats_aggregate_failures_total") >= 1.0,
        "{metrics}"
    );
    assert!(
        value("ceems_stats_aggregate_queries_total") >= 40.0,
        "{metrics}"
    );
}
