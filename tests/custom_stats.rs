//! CEEMS 0.15's custom stats on a real Prometheus (Debian's): two jobs' series (a counter and a
//! level that moves) scraped from a stand-in exporter while the jobs run, then the
//! stats-server with CEEMS's YAML (a Slurm cluster whose sacct lists the two ended jobs, an
//! updater with the four custom stats maps). Each job's four maps in the API equal what PromQL
//! gives for that job alone.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::http::{Response, TestServer};
use common::lab::{prometheus_tools, wait_until, Prometheus};

/// The jobs: id, how many seconds they run, bytes a second, their level's base.
const JOBS: [(&str, f64, f64, f64); 2] = [("101", 6.0, 1000.0, 40.0), ("102", 4.0, 250.0, 70.0)];

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn each_jobs_custom_stats_equal_what_promql_gives_for_it_alone() {
    if !common::runnable(
        "each_jobs_custom_stats_equal_what_promql_gives_for_it_alone",
        prometheus_tools(),
    ) {
        return;
    }
    // The jobs start once Prometheus scrapes; a job's series are served while it runs, as an
    // exporter serves its cgroup's.
    let clock: Arc<std::sync::Mutex<Option<f64>>> = Arc::default();
    let started = Arc::clone(&clock);
    let exporter = TestServer::start(
        false,
        Arc::new(move |_req: &common::http::Request| {
            let Some(began) = *started.lock().unwrap() else {
                return Response::raw(200, "");
            };
            let t = now() - began;
            let mut text = String::from(
                "# TYPE ceems_test_io_bytes_total counter\n# TYPE ceems_test_level gauge\n",
            );
            for (id, runs, rate, base) in JOBS {
                if t <= runs {
                    text.push_str(&format!(
                        "ceems_test_io_bytes_total{{uuid=\"{id}\"}} {}\nceems_test_level{{uuid=\"{id}\"}} {}\n",
                        rate * t,
                        base + (t.floor() % 3.0) * 10.0
                    ));
                }
            }
            Response::raw(200, text)
        }),
    );
    let prom = Prometheus::start(&[exporter.port], &[]);
    wait_until("Prometheus scraping", Duration::from_secs(30), || {
        !prom.query("up == 1").is_empty()
    });
    let began = now();
    *clock.lock().unwrap() = Some(began);
    let level = |id: &str| format!("ceems_test_level{{uuid=\"{id}\"}}");
    wait_until("both jobs' series", Duration::from_secs(30), || {
        JOBS.iter().all(|(id, ..)| {
            !prom
                .query(&format!("count_over_time({}[1m]) > 2", level(id)))
                .is_empty()
        })
    });
    // Both jobs have ended, and their series are stale.
    std::thread::sleep(Duration::from_secs_f64((began + 8.0 - now()).max(0.0)));

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).unwrap();
    let start = began.floor() as i64;
    let lines: Vec<String> = JOBS
        .iter()
        .map(|(id, runs, ..)| {
            let end = start + *runs as i64;
            format!("{id}|debug|normal|physics|alice|2001|alice|2001|{start}|{start}|{end}|00:00:0{}|{}|0:0|COMPLETED|billing=1,cpu=1,mem=1G,node=1|n1|/tmp|60|job{id}", *runs as i64, *runs as i64)
        })
        .collect();
    for (name, body) in [
        (
            "sacct",
            format!("#!/bin/sh\ncat <<'EOF'\n{}\nEOF\n", lines.join("\n")),
        ),
        ("sacctmgr", "#!/bin/sh\nexit 0\n".to_owned()),
    ] {
        let path = bin.join(name);
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let bytes = "ceems_test_io_bytes_total{uuid=~\"{{.UUIDs}}\"}";
    let moving = "ceems_test_level{uuid=~\"{{.UUIDs}}\"}";
    let config = dir.join("config.yml");
    std::fs::write(
        &config,
        format!(
            "ceems_api_server:\n  data:\n    path: {data}\n  admin:\n    users: [root]\nclusters:\n  - id: lab\n    manager: slurm\n    updaters: [tsdb]\n    cli:\n      path: {bin}\nupdaters:\n  - id: tsdb\n    updater: tsdb\n    web:\n      url: {url}\n    extra_config:\n      cutoff_duration: 0s\n      queries:\n        total_custom_stats:\n          bytes: max_over_time({bytes}[{{{{.Range}}}}]) - min_over_time({bytes}[{{{{.Range}}}}])\n        avg_custom_stats:\n          level: avg_over_time({moving}[{{{{.Range}}}}])\n        min_custom_stats:\n          level: min_over_time({moving}[{{{{.Range}}}}])\n        max_custom_stats:\n          level: max_over_time({moving}[{{{{.Range}}}}])\n",
            data = dir.join("data").display(),
            bin = bin.display(),
            url = prom.url(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_ceems"));
    command
        .args([
            "stats-server",
            &format!("--config.file={}", config.display()),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let server = common::start_listening(command, "stats-server");
    let path = "/api/v1/units/admin?from=0&field=uuid&field=total_custom_stats&field=avg_custom_stats&field=min_custom_stats&field=max_custom_stats";
    let mut units = Vec::new();
    let asked = Instant::now();
    while units.len() < JOBS.len() {
        assert!(
            asked.elapsed() < Duration::from_secs(30),
            "no custom stats: {units:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
        units = common::api_get(&server, path, "root")["data"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|u| u.get("max_custom_stats").is_some())
            .collect();
    }
    let alone = |promql: String| -> f64 {
        let result = prom.query(&promql);
        assert_eq!(result.len(), 1, "{promql}: {result:?}");
        result[0]["value"][1].as_str().unwrap().parse().unwrap()
    };
    for (id, _, rate, base) in JOBS {
        let unit = units.iter().find(|u| u["uuid"] == id).unwrap();
        let stat = |name: &str, key: &str| unit[name][key].as_f64().unwrap_or(f64::NAN);
        let bytes = format!("ceems_test_io_bytes_total{{uuid=\"{id}\"}}[5m]");
        let levels = format!("{}[5m]", level(id));
        let want = [
            (
                "total_custom_stats",
                "bytes",
                alone(format!("max_over_time({bytes}) - min_over_time({bytes})")),
            ),
            (
                "avg_custom_stats",
                "level",
                alone(format!("avg_over_time({levels})")),
            ),
            (
                "min_custom_stats",
                "level",
                alone(format!("min_over_time({levels})")),
            ),
            (
                "max_custom_stats",
                "level",
                alone(format!("max_over_time({levels})")),
            ),
        ];
        for (name, key, value) in want {
            let got = stat(name, key);
            assert!(
                (got - value).abs() <= 1e-6 * value.abs().max(1.0),
                "job {id} {name}.{key}: the API says {got}, PromQL {value}: {unit}"
            );
        }
        // The job's own values, not the other's: its level never left [base, base + 20].
        assert!(stat("min_custom_stats", "level") >= base, "{unit}");
        assert!(stat("max_custom_stats", "level") <= base + 20.0, "{unit}");
        assert!(stat("total_custom_stats", "bytes") <= rate * 7.0, "{unit}");
    }
}
