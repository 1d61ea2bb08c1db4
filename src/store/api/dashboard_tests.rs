//! Grafana dashboards as the API's clients: ours (`examples/grafana`) and CEEMS's own
//! (`tests/fixtures/ceems-api/grafana`). Every Infinity query, its variables filled as Grafana
//! fills them, is answered, and every column it shows is in the answer.

use super::tests::{api_with, data, line, sample, NOW};
use super::*;
use crate::store::db::AggregateDelta;

/// The sample's jobs, one of them with a GPU, each with ten minutes of aggregates.
async fn aggregated_api() -> (Api, tempfile::TempDir) {
    let mut lines = sample();
    let gpu_job = line(4, "alice", "physics", NOW - 1800, Some(NOW - 900));
    lines.push(gpu_job.replace("cpu=2,", "cpu=2,gres/gpu=1,"));
    let (api, tmp) = api_with(&lines, &["root"]).await;
    let ids = api
        .fetch(Sql::new("SELECT id, alloc_gpus FROM units"))
        .await
        .unwrap();
    let deltas: Vec<AggregateDelta> = ids
        .iter()
        .map(|r| AggregateDelta {
            row: r.get(0).unwrap(),
            counted_until: None,
            to: NOW,
            ended: true,
            seconds: 600,
            // 2 CPUs busy at 75 %, half of 1 GiB, the GPU at 50 %.
            cpu_seconds: 900.0,
            cpu_energy_joules: 36_000.0,
            host_energy_joules: 72_000.0,
            gpu_energy_joules: match r.get::<i64>(1).unwrap() {
                0 => 0.0,
                _ => 180_000.0,
            },
            emissions_grams: 1.5,
            io_read_bytes: 4096.0,
            io_write_bytes: 8192.0,
            mean_memory_bytes: Some(536_870_912.0),
            mean_gpu_utilization: Some(0.5),
            memory_peak_bytes: None,
            gpu_memory_peak_bytes: None,
            memory_fail_count: None,
            gpu_utilization_max: None,
            series: Vec::new(),
            measured: 31,
        })
        .collect();
    api.store.apply_aggregates(&deltas, NOW).await.unwrap();
    api.store.rebuild_usage("lab", NOW).await.unwrap();
    (api, tmp)
}

/// Every Infinity query of a dashboard: its URL, parameters, root and column selectors.
fn infinity_queries(value: &Value, out: &mut Vec<Value>) {
    match value {
        Value::Object(map) => {
            if map.contains_key("url") && map.contains_key("url_options") {
                out.push(value.clone());
            }
            map.values().for_each(|v| infinity_queries(v, out));
        }
        Value::Array(list) => list.iter().for_each(|v| infinity_queries(v, out)),
        _ => {}
    }
}

/// The value at a column's dotted selector (`avg_cpu_usage.global`).
fn at<'a>(row: &'a Value, selector: &str) -> Option<&'a Value> {
    selector.split('.').try_fold(row, |v, key| v.get(key))
}

/// The query `q` as Grafana sends it, for `user` on `endpoint` ("" or "/admin").
fn request(q: &Value, endpoint: &str, user: &str) -> (String, String) {
    let url = q["url"]
        .as_str()
        .unwrap()
        .replace("${VAR_ENDPOINT}", endpoint);
    let path = url[url.find("/api/").unwrap()..].to_owned();
    let params: Vec<String> = q["url_options"]["params"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let v = match p["value"].as_str().unwrap() {
                "${__from:date:seconds}" => (NOW - 7 * 86400).to_string(),
                "${__to:date:seconds}" => NOW.to_string(),
                "${account}" => "physics".to_owned(),
                "${user}" => user.to_owned(),
                "${VAR_CLUSTER_ID}" => "lab".to_owned(),
                v => v.to_owned(),
            };
            format!("{}={v}", p["key"].as_str().unwrap())
        })
        .collect();
    (path, params.join("&"))
}

/// Every query of ours answers, with every column it reads.
#[tokio::test]
async fn the_example_grafana_dashboard_reads_fields_the_api_has() {
    let (api, _tmp) = aggregated_api().await;
    let dashboard: Value = serde_json::from_str(include_str!(
        "../../../examples/grafana/dashboards/ceems-my-jobs.json"
    ))
    .unwrap();
    let datasource =
        include_str!("../../../examples/grafana/provisioning/datasources/ceems-api.yml");
    assert!(datasource.contains("httpHeaderName1: X-Grafana-User"));
    assert!(datasource.contains("httpHeaderValue1: ${__user.login}"));
    let mut queries = Vec::new();
    infinity_queries(&dashboard, &mut queries);
    assert_eq!(queries.len(), 6);
    for q in &queries {
        let (path, query) = request(q, "", "alice");
        let a = api.handle(&path, Some(&query), Some("alice"), NOW).await;
        let rows = data(&a);
        assert!(!rows.is_empty(), "{path}?{query}: no rows");
        for col in q["columns"].as_array().unwrap() {
            let sel = col["selector"].as_str().unwrap();
            assert!(
                rows.iter().any(|r| at(r, sel).is_some()),
                "no {sel} in {path}?{query}: {}",
                a.text()
            );
        }
    }
}

/// The series of CEEMS's columns our aggregates do not have: GPU memory use and GPU
/// emissions (docs/compat.md).
const NOT_AGGREGATED: &[&str] = &["avg_gpu_mem_usage", "total_gpu_emissions_gms"];

/// CEEMS's Slurm and Kubernetes dashboards, as a user and through `/admin` as an admin:
/// every query answers 200 with rows, and every column is in them, but for the series we do
/// not aggregate and the emissions of providers other than the one configured.
#[tokio::test]
async fn ceems_dashboards_fill_their_columns() {
    let (api, _tmp) = aggregated_api().await;
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/ceems-api/grafana/dashboards"
    );
    let mut filled = 0;
    let mut columns = 0;
    for file in ["slurm/slurm-job-summary.json", "k8s/k8s-pod-summary.json"] {
        let text = std::fs::read_to_string(format!("{dir}/{file}")).unwrap();
        let dashboard: Value = serde_json::from_str(&text).unwrap();
        let mut queries = Vec::new();
        infinity_queries(&dashboard, &mut queries);
        assert!(queries.len() >= 10, "{file}: {}", queries.len());
        for (endpoint, user) in [("", "alice"), ("/admin", "root")] {
            for q in &queries {
                let (path, query) = request(q, endpoint, "alice");
                let a = api.handle(&path, Some(&query), Some(user), NOW).await;
                let rows = data(&a);
                assert!(!rows.is_empty(), "{file} {path}?{query} as {user}: no rows");
                if q["root_selector"] == "data.projects[*]" {
                    // The account variable: the user's projects.
                    assert_eq!(rows[0]["projects"], json!(["physics"]), "{file}");
                    continue;
                }
                for col in q["columns"].as_array().unwrap() {
                    let sel = col["selector"].as_str().unwrap();
                    let series = sel.split('.').next().unwrap();
                    let provider = sel.split('.').nth(1).unwrap_or("");
                    columns += 1;
                    let found = rows.iter().any(|r| at(r, sel).is_some());
                    if found {
                        filled += 1;
                    } else if NOT_AGGREGATED.contains(&series)
                        || (provider.ends_with("_total") && provider != "owid_total")
                    {
                        assert!(
                            rows.iter()
                                .all(|r| r.get(series).is_none()
                                    || series == "total_cpu_emissions_gms"),
                            "{sel} is aggregated now: take it out of NOT_AGGREGATED"
                        );
                    } else {
                        panic!("{file} {path}?{query} as {user}: no {sel} in {}", a.text());
                    }
                }
            }
        }
    }
    // What a site sees filled of these dashboards' columns.
    eprintln!("{filled} of {columns} columns filled");
    assert!(filled * 10 >= columns * 7, "{filled} of {columns}");
}

/// A job's aggregates in CEEMS's series objects, and a user's summed in usage.
#[tokio::test]
async fn aggregates_are_answered_as_ceems_series() {
    let (api, _tmp) = aggregated_api().await;
    let a = api
        .handle("/api/v1/units", Some("uuid=4"), Some("alice"), NOW)
        .await;
    let job = &data(&a)[0];
    assert_eq!(job["avg_cpu_usage"], json!({"global": 75.0}));
    assert_eq!(job["avg_cpu_mem_usage"], json!({"global": 50.0}));
    // The job's share of its nodes' power (CEEMS's meaning), not its CPU packages'.
    assert_eq!(job["total_cpu_energy_usage_kwh"], json!({"total": 0.02}));
    assert_eq!(job["total_cpu_emissions_gms"], json!({"owid_total": 1.5}));
    assert_eq!(job["avg_gpu_usage"], json!({"global": 50.0}));
    assert_eq!(job["total_gpu_energy_usage_kwh"], json!({"total": 0.05}));
    assert_eq!(job["total_io_read_stats"], json!({"bytes": 4096.0}));
    assert_eq!(job["allocation"]["gpus"], 1);
    // One GPU for the job's 900 s from start to end.
    assert_eq!(job["total_time_seconds"]["alloc_gputime"], 900);
    // Job 1 holds no GPU: no GPU series.
    let a = api
        .handle("/api/v1/units", Some("uuid=1"), Some("alice"), NOW)
        .await;
    assert!(data(&a)[0].get("avg_gpu_usage").is_none());
    // Alice's three jobs of physics: means weighted by time, totals summed.
    let a = api
        .handle("/api/v1/usage/global", None, Some("alice"), NOW)
        .await;
    let usage = &data(&a)[0];
    assert_eq!(usage["num_units"], 3);
    assert_eq!(usage["avg_cpu_usage"], json!({"global": 75.0}));
    assert_eq!(usage["total_cpu_energy_usage_kwh"], json!({"total": 0.06}));
    assert_eq!(usage["avg_gpu_usage"], json!({"global": 50.0}));
    assert_eq!(usage["total_gpu_energy_usage_kwh"], json!({"total": 0.05}));
}
