//! `ceems stats-server` end to end on the real Slurm lab (`scripts/slurm-lab.sh`), with the
//! exporter on the lab's cgroups and Debian's Prometheus scraping it: three jobs of two users
//! burn CPU; the server, started as root, drops to nobody, runs the real sacct and sacctmgr as
//! the slurm user, computes each job's CPU use from the real series, and the API gives each
//! user their own jobs only.

mod common;

use std::path::Path;
use std::time::Duration;

use common::lab::{
    lab, prometheus_scraping, prometheus_tools, start_stats_server, submit, wait_jobs_gone,
    wait_until, write_burner, CancelOnDrop, BURNER,
};
use common::{runnable, start_exporter};

fn job<'a>(units: &'a serde_json::Value, id: &str) -> Option<&'a serde_json::Value> {
    units["data"].as_array()?.iter().find(|u| u["uuid"] == id)
}

#[test]
fn real_jobs_get_cpu_usage_from_prometheus_and_each_user_sees_only_their_own() {
    if !runnable("stats_server_lab", lab().and_then(|_| prometheus_tools())) {
        return;
    }
    let exporter = start_exporter(Path::new("/"), &["--collector.slurm"]);
    let prom = prometheus_scraping(exporter.port);

    write_burner();
    let burn = format!("-c 1 --mem=200M --wrap 'python3 {BURNER} 12'");
    let a1 = submit("alice", &format!("-J e2e-a1 {burn}"));
    let a2 = submit("alice", &format!("-J e2e-a2 {burn}"));
    let b1 = submit("bob", &format!("-J e2e-b1 {burn}"));
    let _cancel = CancelOnDrop(vec![a1.clone(), a2.clone(), b1.clone()]);
    let ids = [a1.clone(), a2.clone(), b1.clone()];
    wait_jobs_gone(&ids, Duration::from_secs(180));
    // Prometheus saw each job's CPU time (the series are stale once a job ends).
    for id in &ids {
        let q = format!(
            "max_over_time(ceems_compute_unit_cpu_user_seconds_total{{uuid=\"{id}\"}}[5m])"
        );
        assert!(
            !prom.query(&q).is_empty(),
            "Prometheus has no series for job {id}"
        );
    }

    let (server, _data) = start_stats_server(&prom.url());

    let window = "/api/v1/units?from=0&field=uuid&field=username&field=state&field=total_cpu_seconds&field=avg_cpu_usage&field=aggregates_status&field=total_cpu_energy_usage_kwh&field=total_host_energy_usage_kwh&field=total_emissions_gms";
    let mut units = serde_json::Value::Null;
    wait_until(
        "aggregates of alice's jobs",
        Duration::from_secs(60),
        || {
            units = common::api_get(&server, window, "alice");
            [&a1, &a2]
                .iter()
                .all(|id| job(&units, id).is_some_and(|u| u["aggregates_status"] == "done"))
        },
    );
    for id in [&a1, &a2] {
        let u = job(&units, id).unwrap();
        let cpu = u["total_cpu_seconds"].as_f64().unwrap_or(0.0);
        let usage = u["avg_cpu_usage"]["global"].as_f64().unwrap_or(0.0);
        // 12 s of one busy core; Prometheus's increase() misses at most a scrape at each end.
        assert!(cpu > 5.0 && cpu < 20.0, "job {id}: {cpu} CPU seconds: {u}");
        assert!(usage > 30.0, "job {id}: {usage}% CPU: {u}");
        assert_eq!(u["state"], "COMPLETED", "{u}");
        // The exporter has no power collector: no energy, not 0 kWh.
        assert!(u.get("total_cpu_energy_usage_kwh").is_none(), "{u}");
        assert!(u["total_host_energy_usage_kwh"].is_null(), "{u}");
        assert!(u["total_emissions_gms"].is_null(), "{u}");
    }
    let report = ureq::get(&server.url(&format!("/report/lab/{a1}.txt")))
        .set("X-Grafana-User", "alice")
        .call()
        .expect("alice's report")
        .into_string()
        .unwrap();
    assert!(
        report.contains("no power data: enable a power collector"),
        "{report}"
    );
    assert!(!report.contains("0.000 kWh"), "{report}");
    println!("alice's jobs: {}", units["data"]);
    for u in units["data"].as_array().unwrap() {
        assert_eq!(u["username"], "alice", "alice sees {u}");
    }
    assert!(job(&units, &b1).is_none(), "alice sees bob's job");

    let mut bobs = serde_json::Value::Null;
    wait_until("aggregates of bob's job", Duration::from_secs(30), || {
        bobs = common::api_get(&server, window, "bob");
        job(&bobs, &b1).is_some_and(|u| u["aggregates_status"] == "done")
    });
    assert!(
        job(&bobs, &b1).unwrap()["total_cpu_seconds"]
            .as_f64()
            .unwrap()
            > 5.0
    );
    assert!(job(&bobs, &a1).is_none() && job(&bobs, &a2).is_none());
    // bob asking for alice's job by id gets nothing.
    let other = common::api_get(&server, &format!("/api/v1/units?from=0&uuid={a1}"), "bob");
    assert_eq!(other["data"], serde_json::json!([]));

    // Users and projects come from the real sacctmgr, run as the slurm user.
    let users = common::api_get(&server, "/api/v1/users", "alice");
    assert_eq!(
        users["data"],
        serde_json::json!([{"cluster_id": "lab", "resource_manager": "slurm", "name": "alice",
                            "projects": ["physics"]}])
    );
    let admin = common::api_get(
        &server,
        &format!("/api/v1/units/admin?from=0&uuid={b1}"),
        "root",
    );
    assert_eq!(job(&admin, &b1).unwrap()["username"], "bob");
    let usage = common::api_get(
        &server,
        "/api/v1/usage/global?field=total_cpu_seconds",
        "alice",
    );
    assert!(
        usage["data"][0]["total_cpu_seconds"].as_f64().unwrap() > 10.0,
        "{usage}"
    );
    let metrics = server.get("/metrics");
    assert!(
        metrics.contains("ceems_stats_aggregate_failures_total{cluster_id=\"lab\"} 0"),
        "{metrics}"
    );
}
