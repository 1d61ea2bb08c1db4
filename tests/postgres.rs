//! The stats-server on PostgreSQL (Debian's, `scripts/postgres-lab.sh`). In the real Slurm lab,
//! with Debian's Prometheus scraping the exporter, a server on PostgreSQL and one on SQLite
//! give the same answer to every API route, the same findings and the same report.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use common::lab::{
    lab, postgres_schema, postgres_tools, prometheus_scraping, prometheus_tools,
    start_stats_server_with, submit, wait_jobs_gone, wait_until, write_burner, CancelOnDrop,
    BURNER,
};
use common::{runnable, start_exporter, Running};

/// Fields that say when a server did something, not what the jobs did.
const SERVER_TIMES: [&str; 3] = [
    "last_updated_at_ts",
    "aggregates_updated_at_ts",
    "next_window_start_ts",
];

fn get(server: &Running, path: &str, user: &str) -> (u16, String) {
    match ureq::get(&server.url(path))
        .set("X-Grafana-User", user)
        .call()
    {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("GET {path}: {e}"),
    }
}

fn json(server: &Running, path: &str, user: &str) -> Value {
    let (status, body) = get(server, path, user);
    assert_eq!(status, 200, "GET {path} as {user}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

/// Where two answers differ: numbers within a relative 1e-12 (SQLite writes 15 significant
/// digits, PostgreSQL the shortest exact form) and server times aside.
fn differences(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            if (x - y).abs() > 1e-12 * x.abs().max(y.abs()) {
                out.push(format!("{path}: {x} on SQLite, {y} on PostgreSQL"));
            }
        }
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                if SERVER_TIMES.contains(&k.as_str()) {
                    continue;
                }
                let p = format!("{path}.{k}");
                match (x.get(k), y.get(k)) {
                    (Some(u), Some(v)) => differences(&p, u, v, out),
                    (u, v) => out.push(format!("{p}: {u:?} on SQLite, {v:?} on PostgreSQL")),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                differences(&format!("{path}[{i}]"), u, v, out);
            }
        }
        _ if a == b => {}
        _ => out.push(format!("{path}: {a} on SQLite, {b} on PostgreSQL")),
    }
}

/// Every unit of a server's answer has its aggregates settled.
fn settled(units: &Value) -> bool {
    units["data"].as_array().is_some_and(|list| {
        !list.is_empty()
            && list
                .iter()
                .all(|u| !matches!(u["aggregates_status"].as_str(), Some("pending" | "partial")))
    })
}

#[test]
fn every_answer_the_findings_and_the_report_are_the_same_on_postgresql_and_sqlite() {
    let tools = lab()
        .and_then(|_| prometheus_tools())
        .and_then(|_| postgres_tools());
    let url = match tools {
        Ok(url) => url,
        Err(e) => {
            runnable("postgres", Err(e));
            return;
        }
    };
    let exporter = start_exporter(
        Path::new("/"),
        &["--collector.slurm", "--path.cgroupfs=/sys/fs/cgroup"],
    );
    let prom = prometheus_scraping(exporter.port);

    // A busy job, an idle one and a failed one: each gives other findings.
    write_burner();
    let busy = submit(
        "alice",
        &format!("-J pg-busy -c 1 --mem=200M --wrap 'python3 {BURNER} 12'"),
    );
    let idle = submit("bob", "-J pg-idle -c 2 --mem=300M --wrap 'sleep 12'");
    let failed = submit("alice", "-J pg-failed -c 1 --wrap 'sleep 8; exit 3'");
    let ids = [busy.clone(), idle.clone(), failed.clone()];
    let _cancel = CancelOnDrop(ids.to_vec());
    wait_jobs_gone(&ids, Duration::from_secs(180));
    // The last scrapes of the jobs are in before either server counts them.
    std::thread::sleep(Duration::from_secs(5));

    let database = format!(
        "--storage.database-url={}",
        postgres_schema(&url, "answers")
    );
    let (sqlite, _d1) = start_stats_server_with(&prom.url(), "2s", &[]);
    let (postgres, _d2) = start_stats_server_with(&prom.url(), "2s", &[&database]);
    let all = "/api/v1/units/admin?from=0";
    wait_until("both servers' aggregates", Duration::from_secs(120), || {
        settled(&json(&sqlite, all, "root")) && settled(&json(&postgres, all, "root"))
    });
    let units = json(&sqlite, all, "root");
    let listed: Vec<&str> = units["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|u| u["uuid"].as_str())
        .collect();
    for id in &ids {
        assert!(listed.contains(&id.as_str()), "job {id} not in {listed:?}");
    }

    let mut paths: Vec<(String, &str)> = [
        ("/api/v1/units/admin?from=0", "root"),
        (
            "/api/v1/units/admin?from=0&field=uuid&field=findings&running=true",
            "root",
        ),
        ("/api/v1/units?from=0", "alice"),
        ("/api/v1/units?from=0&project=chemistry", "bob"),
        ("/api/v1/usage/current/admin?from=0", "root"),
        ("/api/v1/usage/current?from=0&groupby=project", "alice"),
        ("/api/v1/usage/global/admin", "root"),
        ("/api/v1/usage/global", "bob"),
        ("/api/v1/projects/admin", "root"),
        ("/api/v1/projects", "alice"),
        ("/api/v1/users/admin", "root"),
        ("/api/v1/users", "bob"),
        ("/api/v1/clusters/admin", "root"),
        ("/api/v1/findings/admin?from=0", "root"),
    ]
    .iter()
    .map(|(p, u)| (p.to_string(), *u))
    .collect();
    for (id, owner) in [(&busy, "alice"), (&idle, "bob"), (&failed, "alice")] {
        paths.push((format!("/api/v1/units/lab/{id}/findings"), owner));
        paths.push((format!("/report/lab/{id}.json"), owner));
    }
    let mut found = Vec::new();
    for (path, user) in &paths {
        let (a, b) = (json(&sqlite, path, user), json(&postgres, path, user));
        differences(path, &a, &b, &mut found);
    }
    // The page and the text report, as a user reads them.
    for (id, owner) in [(&busy, "alice"), (&failed, "alice")] {
        for suffix in ["", ".txt"] {
            let path = format!("/report/lab/{id}{suffix}");
            let (a, b) = (get(&sqlite, &path, owner), get(&postgres, &path, owner));
            assert_eq!(a.0, 200, "{path}: {}", a.1);
            if a != b {
                found.push(format!(
                    "{path}: the two pages differ:\n{}\n---\n{}",
                    a.1, b.1
                ));
            }
        }
    }
    assert!(found.is_empty(), "{found:#?}");

    // The findings are there to compare: the failed job's, at least.
    let findings = json(
        &postgres,
        &format!("/api/v1/units/lab/{failed}/findings"),
        "alice",
    );
    assert!(findings.to_string().contains("job_failed"), "{findings}");
}
