//! CEEMS's API e2e scenarios (`fixtures/ceems-api/pkg/api/testdata/output`) against
//! `ceems stats-server`, the request as CEEMS's `scripts/e2e-test.sh` sends it and the answer
//! compared as it compares: JSON with keys and lists sorted and numbers by value, the CORS
//! header dump byte for byte but for its `Date` line.
//!
//! First the scenarios whose answer does not depend on the pack's clusters' data, then the
//! Slurm, Kubernetes and OpenStack ones, with the pack's `config.yml` (its `sacct` and
//! `sacctmgr`, and stand-ins of its mock Prometheus, Kubernetes API server, Nova and Keystone
//! over HTTP), and CEEMS's own Slurm, Kubernetes and OpenStack dashboards as clients.

mod common;

use std::io::{Read as _, Write as _};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::ceems_pack::{fnv1a32, mock_prometheus, pack_config_of, Mocks};
use common::Running;
use serde_json::Value;

/// A scenario's expected answer: today's CEEMS's (v0.16; those v0.10.2 wrote that v0.16 did
/// not change are the same files).
fn expected(name: &str) -> String {
    let path = common::fixtures()
        .join("ceems-v0.16/pkg/api/testdata/output")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A server with CEEMS's e2e admins and a cluster whose sacct lists nothing.
fn start(dir: &Path) -> Running {
    let sacct: PathBuf = dir.join("sacct");
    std::fs::write(&sacct, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&sacct, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_ceems"));
    command
        .args([
            "stats-server",
            &format!("--storage.data.path={}", dir.join("data").display()),
            &format!("--slurm.sacct.path={}", sacct.display()),
            "--slurm.sacctmgr.path=",
            "--slurm.cluster-id=slurm-0",
            "--web.admin-users=grafana",
            "--web.admin-users=__test_admin",
            "--storage.update-interval=1h",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    common::start_listening(command, "stats-server")
}

/// What CEEMS's `compare_json` compares: objects by key, lists in sorted order, numbers by
/// value.
fn canonical(v: Value) -> Value {
    match v {
        Value::Array(list) => {
            let mut list: Vec<Value> = list.into_iter().map(canonical).collect();
            list.sort_by_key(|v| v.to_string());
            Value::Array(list)
        }
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, canonical(v))).collect())
        }
        Value::Number(n) => n.as_f64().map_or(Value::Number(n), Value::from),
        other => other,
    }
}

fn same_json(scenario: &str, got: &str, want: &str) {
    let parse = |what: &str, text: &str| -> Value {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{scenario}: {what} {e}: {text}"))
    };
    assert_eq!(
        canonical(parse("answer", got)),
        canonical(parse("fixture", want)),
        "{scenario}: {got}"
    );
}

fn get(server: &Running, path: &str, user: Option<&str>) -> (u16, String) {
    let mut req = ureq::get(&server.url(path));
    if let Some(u) = user {
        req = req.set("X-Grafana-User", u);
    }
    match req.call() {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
        Err(e) => panic!("{path}: {e}"),
    }
}

/// The response head to a raw request, as `curl -I` prints it.
fn raw_head(server: &Running, request: &str) -> String {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 4096];
    while !out.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8(out).unwrap()
}

#[test]
fn ceems_scenarios_that_need_no_cluster_data_answer_as_ceems_does() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    // (scenario, user header, request, fixture)
    let json_scenarios = [
        (
            "api-admin-denied-query",
            "usr1",
            "/api/v1/units/admin",
            "e2e-test-api-server-admin--denied-query.txt",
        ),
        (
            "api-current-usage-admin-denied-query",
            "usr1",
            "/api/v1/usage/global/admin?cluster_id=slurm-1&user=usr2",
            "e2e-test-api-server-current-usage-admin-denied-query.txt",
        ),
        (
            "api-units-invalid-query",
            "usr2",
            "/api/v1/units?cluster_id=slurm-0&from=1676934000&to=1677538800&field=uuiid",
            "e2e-test-api-server-units-invalid-query.txt",
        ),
        (
            "api-verify-fail-query",
            "usr2",
            "/api/v1/units/verify?cluster_id=slurm-1&uuid=1479763&uuid=11508",
            "e2e-test-api-verify-fail-query.txt",
        ),
        (
            "api-project-empty-query",
            "usr1",
            "/api/v1/projects?project=acc3",
            "e2e-test-api-server-project-empty-query.txt",
        ),
    ];
    for (scenario, user, path, fixture) in json_scenarios {
        let (_, body) = get(&server, path, Some(user));
        same_json(scenario, &body, &expected(fixture));
    }
    // The demo routes: only the status is compared (the bodies are made up).
    for (scenario, path, fixture) in [
        (
            "api-demo-units-query",
            "/api/v1/demo/units",
            "e2e-test-api-demo-units-query.txt",
        ),
        (
            "api-demo-usage-query",
            "/api/v1/demo/usage",
            "e2e-test-api-demo-usage-query.txt",
        ),
    ] {
        let (status, body) = get(&server, path, None);
        assert_eq!(status.to_string(), expected(fixture), "{scenario}: {body}");
        let rows: Value = serde_json::from_str(&body).unwrap();
        assert!(
            rows["data"].as_array().is_some_and(|r| !r.is_empty()),
            "{scenario}: {body}"
        );
    }
    // The preflight: the head byte for byte, its Date line deleted as the script does.
    let head = raw_head(
        &server,
        "OPTIONS /api/v1/units HTTP/1.1\r\nHost: 127.0.0.1\r\nAccess-Control-Request-Method: GET\r\n\
         Access-Control-Request-Headers: x-grafana-user\r\nOrigin: https://reqbin.com\r\n\r\n",
    );
    let without_date: String = head
        .split_inclusive("\r\n")
        .filter(|line| !line.starts_with("Date"))
        .collect();
    assert_eq!(
        without_date,
        expected("e2e-test-api-preflight-query.txt"),
        "api-cors-preflight"
    );
    // CEEMS's service account is an admin.
    let (status, body) = get(&server, "/api/v1/clusters/admin", Some("ceems-int-svc"));
    assert_eq!(status, 200, "{body}");
    same_json(
        "clusters as ceems-int-svc",
        &body,
        r#"{"status":"success","data":[{"id":"slurm-0","manager":"slurm"}]}"#,
    );
}

/// An answer without what docs/compat.md lists as ours that CEEMS leaves out: its daily usage
/// (`experimental`) gives the total, least and greatest custom stats but not their mean.
fn without_our_additions(scenario: &str, body: &str) -> String {
    let mut v: Value = serde_json::from_str(body).unwrap_or_default();
    if scenario.contains("experimental") {
        for row in v["data"].as_array_mut().into_iter().flatten() {
            if let Some(row) = row.as_object_mut() {
                row.remove("avg_custom_stats");
            }
        }
    }
    v.to_string()
}

/// The expected answer with what docs/compat.md lists as ours: sacct's `mem=320.5G` is
/// 320.5 GiB (CEEMS drops the fraction: 320 GiB), and the memory time with it; the times of
/// a pod that ended before the server's first pull are its life's (CEEMS counts only the
/// time it saw it run: none), so kusr2's usage weighs its pod's means.
fn with_our_deviations(fixture: &str, expected: &str) -> String {
    let daily = fixture.contains("experimental");
    let mut v: Value = serde_json::from_str(expected).unwrap();
    // pod22: 3 CPUs, 3 GiB and 3 GPU slices from 11:26:58 to 12:10:58.
    let wall = 2640.0;
    let pod22 = serde_json::json!({"alloc_cpumemtime": 3072.0 * wall, "alloc_cputime": 3.0 * wall,
                                   "alloc_gpumemtime": wall, "alloc_gputime": 3.0 * wall,
                                   "walltime": wall});
    // test-user-4's two VMs on os-1: one vCPU and 256 MiB each, launched at 13:18:08 and
    // deleted at 14:21:57; their means are the mock's values, weighed alike.
    let vm = 3829.0;
    let vms = serde_json::json!({"alloc_cpumemtime": 256.0 * 2.0 * vm, "alloc_cputime": 2.0 * vm,
                                 "alloc_gpumemtime": 0.0, "alloc_gputime": 0.0, "walltime": 2.0 * vm});
    let mean = |ids: &[&str]| {
        let values = ids.iter().map(|id| {
            let h = fnv1a32(id);
            f64::from(h) / 10f64.powi(h.to_string().len() as i32 - 2)
        });
        (values.sum::<f64>() / ids.len() as f64 * 1e8).round() / 1e8
    };
    let user4_mean = mean(&[
        "6330d17c-6fe8-419c-a044-58e590480e18",
        "38c14d24-2e8a-4cb6-ad5b-851612e800ab",
    ]);
    for unit in v["data"].as_array_mut().into_iter().flatten() {
        // CEEMS's daily usage writes the series no updater of the cluster asks as zeros;
        // ours leaves them out, as its other answers do.
        if let (true, Some(row)) = (daily, unit.as_object_mut()) {
            row.retain(|_, series| {
                !series.as_object().is_some_and(|subs| {
                    !subs.is_empty() && subs.values().all(|x| x.as_f64() == Some(0.0))
                }) || series.get("global").is_some()
                    || series.get("walltime").is_some()
            });
        }
        if unit["cluster_id"] == "os-1" && unit["username"] == "test-user-4" {
            unit["total_time_seconds"] = vms.clone();
            for mean in ["avg_cpu_usage", "avg_cpu_mem_usage"] {
                unit[mean]["global"] = Value::from(user4_mean);
            }
        }
        let k8s = unit["cluster_id"]
            .as_str()
            .is_some_and(|c| c.starts_with("k8s-"));
        if k8s && unit["username"] == "kusr2" {
            unit["total_time_seconds"] = pod22.clone();
            for mean in [
                "avg_cpu_usage",
                "avg_cpu_mem_usage",
                "avg_gpu_usage",
                "avg_gpu_mem_usage",
            ] {
                unit[mean]["global"] = Value::from(21.25488198);
            }
        }
        // usr2's usage on slurm-1 is that one job.
        let usr2_usage = unit["username"] == "usr2" && unit["cluster_id"] == "slurm-1";
        if usr2_usage && unit.get("uuid").is_none() {
            unit["total_time_seconds"]["alloc_cpumemtime"] = Value::from(320.5 * 1024.0 * 497.0);
        }
        if unit["uuid"] == "1481508" {
            unit["allocation"]["mem"] = Value::from(320.5 * 1024.0 * 1024.0 * 1024.0);
            unit["total_time_seconds"]["alloc_cpumemtime"] = Value::from(320.5 * 1024.0 * 497.0);
        }
    }
    v.to_string()
}

#[test]
fn ceems_scenarios_of_every_cluster_answer_as_ceems_does() {
    assert_eq!(fnv1a32("1479763") as f64 / 1e8, 21.22149394);
    let dir = tempfile::tempdir().unwrap();
    let mocks = Mocks::start();
    let config = pack_config_of("ceems-v0.16", dir.path(), &mocks);
    let link = dir.path().join("ceems_api_server");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ceems"), &link).unwrap();
    let port = common::free_port();
    let mut command = Command::new(&link);
    command
        .current_dir(common::fixtures().join("ceems-v0.16"))
        .args([
            "--storage.data.skip.delete.old.units",
            "--test.disable.checks",
            &format!("--web.listen-address=127.0.0.1:{port}"),
            &format!("--config.file={}", config.display()),
            // The script starts one server a scenario; these share one (and the dashboards
            // and the lb ask it too), so the pack's requests_limit (30 a minute) does not
            // count this host's requests.
            "--web.trusted-ip-prefix=127.0.0.0/8",
            "--log.level=debug",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("server.log")).unwrap());
    let mut child = common::KillOnDrop(command.spawn().unwrap());
    // As the script: two seconds, then its waitport; then it asks, with no wait of ours for
    // the first update.
    std::thread::sleep(std::time::Duration::from_secs(2));
    common::waitport(port);
    if let Ok(Some(status)) = child.try_wait() {
        panic!(
            "ceems_api_server exited: {status}\n{}",
            std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default()
        );
    }
    let server = Running { child, port };
    let scenarios = [
        ("api-uuid-query", "usr2", "/api/v1/units?uuid=1481508&project=acc2&cluster_id=slurm-0", "e2e-test-api-server-uuid-query.txt"),
        ("api-admin-query", "grafana", "/api/v1/units/admin?user=usr3&cluster_id=slurm-0&project=acc3&from=1676934000&to=1677538800", "e2e-test-api-server-admin-query.txt"),
        ("api-admin-query-all", "grafana", "/api/v1/units/admin?cluster_id=slurm-1&from=1676934000&to=1677538800", "e2e-test-api-server-admin-query-all.txt"),
        ("api-project-query", "usr1", "/api/v1/projects?project=acc1", "e2e-test-api-server-project-query.txt"),
        ("api-user-query", "usr1", "/api/v1/users", "e2e-test-api-server-user-query.txt"),
        ("api-user-admin-query", "grafana", "/api/v1/users/admin?user=usr1", "e2e-test-api-server-user-admin-query.txt"),
        ("api-verify-pass-query", "usr1", "/api/v1/units/verify?cluster_id=slurm-0&uuid=1479763&uuid=1479765", "e2e-test-api-verify-pass-query.txt"),
        ("api-global-usage-query", "usr1", "/api/v1/usage/global?cluster_id=slurm-0&field=username&field=project&field=num_units", "e2e-test-api-server-global-usage-query.txt"),
        ("api-global-usage-admin-query", "grafana", "/api/v1/usage/global/admin?cluster_id=slurm-0&field=username&field=project&field=num_units", "e2e-test-api-server-global-usage-admin-query.txt"),
        ("api-project-query-k8s", "rb1", "/api/v1/projects?project=ns2", "e2e-test-api-server-project-query-k8s.txt"),
        ("api-user-query-k8s", "rb1", "/api/v1/users", "e2e-test-api-server-user-query-k8s.txt"),
        ("api-units-query-k8s", "kusr2", "/api/v1/units?cluster_id=k8s-1&project=ns2&to=1751883060", "e2e-test-api-server-query-k8s.txt"),
        ("api-current-usage-query-k8s", "kusr2", "/api/v1/usage/current?cluster_id=k8s-0&from={usage_from}&to={usage_to}&__terminated", "e2e-test-api-server-current-usage-query-k8s.txt"),
        ("api-global-usage-query-k8s", "kusr1", "/api/v1/usage/global?cluster_id=k8s-0&field=username&field=project&field=num_units", "e2e-test-api-server-global-usage-query-k8s.txt"),
        ("api-user-admin-all-query", "grafana", "/api/v1/users/admin", "e2e-test-api-server-user-admin-all-query.txt"),
        ("api-cluster-admin-query", "ceems-int-svc", "/api/v1/clusters/admin", "e2e-test-api-server-cluster-admin-query.txt"),
        ("api-global-stats-admin-query", "grafana", "/api/v1/stats/global/admin", "e2e-test-api-server-global-stats-admin-query.txt"),
        ("api-current-usage-admin-experimental-query", "grafana", "/api/v1/usage/current/admin?cluster_id=slurm-1&user=usr15&user=usr4&cluster_id=os-1&user=test-user-4&from={usage_from}&to={usage_to}&experimental", "e2e-test-api-server-current-usage-admin-experimental-query.txt"),
        ("api-current-usage-query", "usr1", "/api/v1/usage/current?cluster_id=slurm-1&from={usage_from}&to={usage_to}&__terminated", "e2e-test-api-server-current-usage-query.txt"),
        ("api-project-admin-query", "grafana", "/api/v1/projects/admin?project=test-project-3", "e2e-test-api-server-project-admin-query.txt"),
        ("api-running-query", "test-user-1", "/api/v1/units?running&cluster_id=os-1&field=uuid&field=state&field=started_at&field=allocation&field=tags&timezone=Europe%2FAthens", "e2e-test-api-server-running-query.txt"),
        ("api-admin-query-all-selected-fields", "grafana", "/api/v1/units/admin?cluster_id=os-0&running&from=1729000800&to=1729002300&field=uuid&field=started_at&field=ended_at&field=foo", "e2e-test-api-server-admin-query-all-selected-fields.txt"),
        ("api-current-usage-experimental-query", "test-user-4", "/api/v1/usage/current?cluster_id=os-1&from={usage_from}&to={usage_to}&experimental", "e2e-test-api-server-current-usage-experimental-query.txt"),
        ("api-current-stats-admin-query", "grafana", "/api/v1/stats/current/admin?cluster_id=os-1&from=1728994800&to=1729005000", "e2e-test-api-server-current-stats-admin-query.txt"),
        ("api-current-usage-admin-query", "grafana", "/api/v1/usage/current/admin?cluster_id=slurm-1&user=usr15&user=usr3&from={usage_from}&to={usage_to}&__terminated", "e2e-test-api-server-current-usage-admin-query.txt"),
    ];
    // The script's window: from a day ago to half an hour ahead.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut failed = Vec::new();
    // CEEMS's expected list of every user was written before its Kubernetes clusters (and is
    // not in its Makefile's list): its Slurm rows are compared.
    let stale = |scenario: &str, body: &str| -> String {
        let mut v: Value = serde_json::from_str(body).unwrap_or_default();
        if let (true, Some(rows)) = (
            scenario == "api-user-admin-all-query",
            v["data"].as_array_mut(),
        ) {
            rows.retain(|r| r["resource_manager"] == "slurm");
        }
        v.to_string()
    };
    for (scenario, user, path, fixture) in scenarios {
        let path = path
            .replace("{usage_from}", &(now - 86400).to_string())
            .replace("{usage_to}", &(now + 1800).to_string());
        let (_, body) = get(&server, &path, Some(user));
        let body = stale(scenario, &body);
        let body = without_our_additions(scenario, &body);
        let want = with_our_deviations(fixture, &expected(fixture));
        let parse = |t: &str| serde_json::from_str::<Value>(t).map(canonical).ok();
        if parse(&body) != parse(&want) {
            failed.push(format!("{scenario}:\n  got  {body}\n  want {want}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    let slurm = Dashboard {
        file: "slurm/slurm-job-summary.json",
        user: "usr3",
        account: "acc3",
        cluster: "slurm-0",
        range: (1676934000, 1677538800),
        min_columns: 2 * 30,
    };
    let k8s = Dashboard {
        file: "k8s/k8s-pod-summary.json",
        user: "kusr2",
        account: "ns2",
        cluster: "k8s-1",
        range: (1751839200, 1751925600),
        min_columns: 2 * 30,
    };
    // test-user-3's VMs of test-project-3 on 2024-10-15: one paused, two deleted.
    let openstack = Dashboard {
        file: "openstack/os-vm-summary.json",
        user: "test-user-3",
        account: "test-project-3",
        cluster: "os-1",
        range: (1728950400, 1729036800),
        min_columns: 20,
    };
    for d in [slurm, k8s, openstack] {
        dashboard_fills_its_columns(&server, &d);
    }
    lb_asks_the_api_server(&server, &mocks.prometheus);
}

/// CEEMS's `web.requests_limit` (`--web.max-requests`): a client's requests past that many
/// a minute get 429 with the seconds to wait; `--web.trusted-ip-prefix` is not counted.
#[test]
fn requests_past_the_rate_get_429_but_trusted_prefixes_pass() {
    for (prefix, refused) in [("192.0.2.0/24", true), ("127.0.0.0/8", false)] {
        let dir = tempfile::tempdir().unwrap();
        let yaml = dir.path().join("config.yml");
        std::fs::write(
            &yaml,
            format!(
                "ceems_api_server:\n  data:\n    path: {}\n  web:\n    requests_limit: 3\nclusters: []\n",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::set_permissions(&yaml, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_ceems"));
        command
            .args([
                "stats-server",
                &format!("--config.file={}", yaml.display()),
                &format!("--web.trusted-ip-prefix={prefix}"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let server = common::start_listening(command, "stats-server");
        let statuses: Vec<u16> = (0..6)
            .map(|_| get(&server, "/api/v1/clusters/admin", Some("ceems-int-svc")).0)
            .collect();
        match refused {
            true => assert!(
                statuses.contains(&429) && statuses.iter().filter(|s| **s == 200).count() <= 3,
                "{statuses:?}"
            ),
            false => assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}"),
        }
        if refused {
            let mut stream = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
            let head = {
                stream
                    .write_all(b"GET /api/v1/clusters/admin HTTP/1.1\r\nHost: x\r\n\r\n")
                    .unwrap();
                let mut buf = [0u8; 1024];
                let n = stream.read(&mut buf).unwrap();
                String::from_utf8_lossy(&buf[..n]).into_owned()
            };
            assert!(head.starts_with("HTTP/1.1 429"), "{head}");
            assert!(head.contains("Retry-After: "), "{head}");
        }
    }
}

/// Every Infinity query of a dashboard (its `url` and `url_options`).
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

/// Grafana's variables of a dashboard: its file, the user, their project, the cluster and
/// the time range of its jobs.
struct Dashboard {
    file: &'static str,
    user: &'static str,
    account: &'static str,
    cluster: &'static str,
    range: (u64, u64),
    /// Columns resolved over both passes, at least.
    min_columns: usize,
}

/// CEEMS's Slurm dashboard (usr3 of acc3 in February 2023), Kubernetes one (kusr2 of ns2 in
/// July 2025) and OpenStack one (test-user-3 of test-project-3, October 2024) on the pack's
/// data: as the user and, through `/admin`, as grafana, over the jobs' time range (current
/// usage: the last day), every query answers with rows and every column is in them but the
/// emissions of a provider the pack's config does not ask (OWID). A panel that names an admin
/// route is asked as grafana only.
fn dashboard_fills_its_columns(server: &Running, d: &Dashboard) {
    let text = std::fs::read_to_string(
        common::fixtures()
            .join("ceems-api/grafana/dashboards")
            .join(d.file),
    )
    .unwrap();
    let mut queries = Vec::new();
    infinity_queries(&serde_json::from_str(&text).unwrap(), &mut queries);
    assert!(queries.len() >= 10, "{}", queries.len());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut columns = 0;
    for (endpoint, header) in [("", d.user), ("/admin", "grafana")] {
        for q in &queries {
            let url = q["url"]
                .as_str()
                .unwrap()
                .replace("${VAR_ENDPOINT}", endpoint);
            // A panel that names an admin route is an admin's whatever the viewer.
            if endpoint.is_empty() && url.ends_with("/admin") {
                continue;
            }
            let params: Vec<String> = q["url_options"]["params"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    // Current usage is of the jobs written in the window: the server wrote
                    // the pack's jobs at its start, so it is asked for the last day, as the
                    // dashboard's default range asks.
                    let (from, to) = match url.contains("/usage/current") {
                        true => (now - 86400, now),
                        false => d.range,
                    };
                    let v = match p["value"].as_str().unwrap() {
                        "${__from:date:seconds}" => &from.to_string(),
                        "${__to:date:seconds}" => &to.to_string(),
                        "${account}" => d.account,
                        "${user}" => d.user,
                        "${VAR_CLUSTER_ID}" => d.cluster,
                        v => v,
                    };
                    format!("{}={v}", p["key"].as_str().unwrap())
                })
                .collect();
            let path = format!("{url}?{}", params.join("&"));
            let (status, body) = get(server, &path, Some(header));
            assert_eq!(status, 200, "{path} as {header}: {body}");
            let answer: Value = serde_json::from_str(&body).unwrap();
            let rows = answer["data"].as_array().cloned().unwrap_or_default();
            assert!(!rows.is_empty(), "{path} as {header}: no rows");
            for col in q["columns"].as_array().unwrap() {
                let sel = col["selector"].as_str().unwrap();
                if sel.is_empty() || sel.ends_with(".owid_total") {
                    continue;
                }
                let found = rows
                    .iter()
                    .any(|r| sel.split('.').try_fold(r, |v, k| v.get(k)).is_some());
                assert!(found, "{path} as {header}: no {sel} in {body}");
                columns += 1;
            }
        }
    }
    assert!(columns >= d.min_columns, "{}: {columns}", d.file);
}

/// The pack's mock Pyroscope (`scripts/mock_servers`, mode `pyro`): a merged flame graph
/// whose one name is the request's label selector, and a configuration.
fn mock_pyroscope() -> common::http::TestServer {
    use common::http::{Request, Response};
    use prost::Message as _;
    let config =
        std::fs::read(common::fixtures().join("ceems-api/pkg/lb/testdata/pyroscope/config.yml"))
            .unwrap();
    common::http::TestServer::start(
        false,
        std::sync::Arc::new(move |req: &Request| match req.path() {
            "/querier.v1.QuerierService/SelectMergeStacktraces" => {
                match pyro::SelectMergeStacktracesRequest::decode(req.body.as_slice()) {
                    Ok(asked) => {
                        let answer = pyro::SelectMergeStacktracesResponse {
                            flamegraph: Some(pyro::FlameGraph {
                                names: vec![asked.label_selector],
                            }),
                        };
                        Response::raw(200, answer.encode_to_vec())
                    }
                    Err(_) => Response::raw(500, "KO"),
                }
            }
            "/api/v1/status/config" => Response::raw(200, config.clone()),
            _ => Response::raw(404, "404 page not found\n"),
        }),
    )
}

/// The fields of Pyroscope's querier messages that CEEMS's mock and requestor use.
mod pyro {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SelectMergeStacktracesRequest {
        #[prost(string, tag = "2")]
        pub label_selector: String,
        #[prost(int64, tag = "3")]
        pub start: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SelectMergeStacktracesResponse {
        #[prost(message, optional, tag = "1")]
        pub flamegraph: Option<FlameGraph>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FlameGraph {
        #[prost(string, repeated, tag = "1")]
        pub names: Vec<String>,
    }
}

/// CEEMS's `pyro_requestor`: a raw protobuf `SelectMergeStacktraces` of `{service_name="…"}`
/// without a Content-Type; prints what it prints.
fn pyro_requestor(port: u16, user: &str, cluster: &str, uuid: &str, start: i64) -> String {
    use prost::Message as _;
    let body = pyro::SelectMergeStacktracesRequest {
        label_selector: format!("{{service_name=\"{uuid}\"}}"),
        start,
    }
    .encode_to_vec();
    let url = format!("http://localhost:{port}/querier.v1.QuerierService/SelectMergeStacktraces");
    let answer = ureq::post(&url)
        .set("X-Grafana-User", user)
        .set("X-Ceems-Cluster-Id", cluster)
        .send_bytes(&body);
    let (status, response) = match answer {
        Ok(r) => (r.status(), r),
        Err(ureq::Error::Status(code, r)) => (code, r),
        Err(e) => panic!("pyro_requestor: {e}"),
    };
    let mut bytes = Vec::new();
    response.into_reader().read_to_end(&mut bytes).unwrap();
    match status {
        200 => {
            let answer = pyro::SelectMergeStacktracesResponse::decode(bytes.as_slice()).unwrap();
            let names = answer.flamegraph.map(|f| f.names).unwrap_or_default();
            format!("\nreceived profiles for  {}\n", names.join(","))
        }
        _ => format!("{}\n", String::from_utf8_lossy(&bytes)),
    }
}

/// The script's `get -H "X-Grafana-User: …" -H "X-Ceems-Cluster-Id: …" URL`.
fn curl_as(user: &str, cluster: &str, url: &str) -> String {
    common::get(&[
        "-H",
        &format!("X-Grafana-User: {user}"),
        "-H",
        &format!("X-Ceems-Cluster-Id: {cluster}"),
        url,
    ])
}

/// A `*-query-*` scenario's two requests: the query of `uuid`'s CPU usage at `time` on the
/// Prometheus address, as the script writes it, then `pyro_requestor`'s call from that time
/// on the Pyroscope one.
fn query_then_profiles(ports: &[u16], user: &str, cluster: &str, uuid: &str, time: &str) -> String {
    let url = format!(
        "127.0.0.1:{}/api/v1/query?query=avg_cpu_usage\\{{uuid=\"{uuid}\"\\}}&time={time}",
        ports[0]
    );
    let start_ms = time.parse::<f64>().unwrap() as i64 * 1000;
    curl_as(user, cluster, &url) + &pyro_requestor(ports[1], user, cluster, uuid, start_ms)
}

/// `ceems_lb` as the script starts it, from the v0.16 pack's root (where its configs'
/// database path, `./pkg/api/testdata`, holds CEEMS's `ceems.db`), with the pack's config
/// whose stores' and API server's `localhost` ports are the stand-ins'; on `addresses` listen
/// addresses, each waited for with the script's `waitport`.
struct CeemsLb {
    _child: common::KillOnDrop,
    ports: Vec<u16>,
    _dir: tempfile::TempDir,
}

fn ceems_lb(config: &str, urls: &[(&str, String)], addresses: usize) -> CeemsLb {
    let dir = tempfile::tempdir().unwrap();
    let mut text = std::fs::read_to_string(v016().join("pkg/lb/testdata").join(config)).unwrap();
    for (from, to) in urls {
        text = text.replace(from, to);
    }
    let path = dir.path().join(config);
    std::fs::write(&path, text).unwrap();
    let link = dir.path().join("ceems_lb");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ceems"), &link).unwrap();
    let ports: Vec<u16> = (0..addresses).map(|_| common::free_port()).collect();
    let mut command = Command::new(&link);
    command
        .current_dir(v016())
        .arg(format!("--config.file={}", path.display()))
        .args(
            ports
                .iter()
                .map(|p| format!("--web.listen-address=127.0.0.1:{p}")),
        )
        .args(["--log.level=debug", "--security.drop-privileges=false"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("lb.log")).unwrap());
    let mut child = common::KillOnDrop(command.spawn().unwrap());
    for port in &ports {
        common::waitport(*port);
    }
    if let Ok(Some(status)) = child.try_wait() {
        panic!(
            "ceems_lb --config.file={config} exited: {status}\n{}",
            std::fs::read_to_string(dir.path().join("lb.log")).unwrap_or_default()
        );
    }
    CeemsLb {
        _child: child,
        ports,
        _dir: dir,
    }
}

/// CEEMS v0.16's material (`fixtures/ceems-v0.16`, from `shared/ceems-v0.16`).
fn v016() -> PathBuf {
    common::fixtures().join("ceems-v0.16")
}

fn expected_lb(name: &str) -> String {
    let path = v016().join("pkg/lb/testdata/output").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The script compares these outputs byte for byte. Ours are compared so line by line, but
/// for a line that is a JSON answer of a store, compared as `compare_json` compares: CEEMS
/// re-encodes a filtered answer (Go's key order, `"values":null`, docs/compat.md) where ours
/// keeps the store's order and leaves the absent out.
fn same_output(scenario: &str, got: &str, want: &str) {
    let (got_lines, want_lines): (Vec<&str>, Vec<&str>) =
        (got.split('\n').collect(), want.split('\n').collect());
    assert_eq!(
        got_lines.len(),
        want_lines.len(),
        "{scenario}:\n got  {got:?}\n want {want:?}"
    );
    let answer = |line: &str| -> Option<Value> {
        let mut v: Value = serde_json::from_str(line).ok()?;
        (v["status"] == "success").then_some(())?;
        for sample in v["data"]["result"].as_array_mut().into_iter().flatten() {
            if let Some(s) = sample.as_object_mut() {
                s.retain(|_, x| !x.is_null());
            }
        }
        Some(canonical(v))
    };
    for (g, w) in got_lines.iter().zip(&want_lines) {
        match (answer(g), answer(w)) {
            (Some(g), Some(w)) => assert_eq!(g, w, "{scenario}"),
            _ => assert_eq!(g, w, "{scenario}:\n got  {got:?}\n want {want:?}"),
        }
    }
}

/// CEEMS's two lb scenarios that ask the API server who owns what (`config-api.yml`: no
/// database, `ceems_api_server.web.url`), this server as the API, the pack's mock Prometheus
/// and Pyroscope as the stores.
fn lb_asks_the_api_server(server: &Running, prometheus: &common::http::TestServer) {
    let pyroscope = mock_pyroscope();
    let lb = ceems_lb(
        "config-api.yml",
        &[
            ("http://localhost:9090", prometheus.url()),
            ("http://localhost:4040", pyroscope.url()),
            ("http://localhost:9020", server.url("")),
        ],
        2,
    );
    for (scenario, cluster, uuid, time) in [
        (
            "lb-forbid-user-query-api",
            "slurm-1",
            "1481510",
            "1676990946",
        ),
        (
            "lb-allow-user-query-api",
            "slurm-0",
            "1479763",
            "1645450627",
        ),
    ] {
        let out = query_then_profiles(&lb.ports, "usr1", cluster, uuid, time);
        same_output(
            scenario,
            &out,
            &expected_lb(&format!("e2e-test-{scenario}.txt")),
        );
    }
    let pyro = lb.ports[1];
    // The API's admins pass unchecked; usr3 reads their own job.
    for user in ["grafana", "usr3"] {
        let out = pyro_requestor(pyro, user, "slurm-1", "1481510", 1676990946000);
        assert!(out.contains("received profiles for"), "{user}: {out}");
    }
}

/// CEEMS v0.16's other lb scenarios but `lb-auth` (in `lb_stores.rs`): `ceems_lb` on
/// CEEMS's own database with each of the pack's configs, one address or two (Prometheus's,
/// then Pyroscope's), the script's requests through curl, its expected outputs. The stand-ins
/// answer what CEEMS's mocks answer and no more: no readiness path.
#[test]
fn ceems_lb_scenarios_through_the_ceems_lb_link() {
    let (prometheus, pyroscope) = (mock_prometheus(), mock_pyroscope());
    let urls = [
        ("http://localhost:9090", prometheus.url()),
        ("http://localhost:4040", pyroscope.url()),
    ];
    let config = |port: u16| format!("127.0.0.1:{port}/api/v1/status/config");

    let lb = ceems_lb("config-db.yml", &urls, 2);
    let (tsdb, pyro) = (lb.ports[0], lb.ports[1]);
    let out =
        curl_as("usr1", "slurm-0", &config(tsdb)) + &curl_as("usr1", "slurm-0", &config(pyro));
    same_output("lb-basic", &out, &expected_lb("e2e-test-lb-server.txt"));
    for (scenario, cluster, uuid, time) in [
        (
            "lb-forbid-user-query-db",
            "slurm-1",
            "1481510",
            "1713032179.506",
        ),
        ("lb-allow-user-query-db", "slurm-0", "1479763", "1645450627"),
    ] {
        let out = query_then_profiles(&lb.ports, "usr1", cluster, uuid, time);
        same_output(
            scenario,
            &out,
            &expected_lb(&format!("e2e-test-{scenario}.txt")),
        );
    }
    let out = common::get(&[
        "-H",
        "X-Grafana-User: grafana",
        "-H",
        "X-Ceems-Cluster-Id: slurm-1",
        "-H",
        "Content-Type: application/x-www-form-urlencoded",
        "-X",
        "POST",
        "-d",
        "query=avg_cpu_usage{uuid=\"1479765\"}",
        &format!("127.0.0.1:{tsdb}/api/v1/query"),
    ]) + &pyro_requestor(pyro, "grafana", "slurm-1", "1479765", 1645450627000);
    same_output(
        "lb-allow-admin-query",
        &out,
        &expected_lb("e2e-test-lb-allow-admin-query.txt"),
    );
    drop(lb);

    let lb = ceems_lb("config-tsdb-only.yml", &urls, 1);
    let out = curl_as("grafana", "slurm-0", &config(lb.ports[0]));
    assert_eq!(
        out,
        expected_lb("e2e-test-lb-server-tsdb-only.txt"),
        "lb-basic-tsdb-only"
    );
    drop(lb);

    let lb = ceems_lb("config-pyro-only.yml", &urls, 1);
    let out = curl_as("usr1", "slurm-0", &config(lb.ports[0]));
    same_output(
        "lb-basic-pyro-only",
        &out,
        &expected_lb("e2e-test-lb-server-pyro-only.txt"),
    );
    drop(lb);

    let lb = ceems_lb("config-tsdb-pyro.yml", &urls, 2);
    let (tsdb, pyro) = (lb.ports[0], lb.ports[1]);
    let out = curl_as("usr1", "slurm-0", &config(tsdb))
        + &curl_as("usr1", "slurm-0", &config(pyro))
        + &curl_as("usr1", "slurm-1", &config(pyro));
    same_output(
        "lb-basic-tsdb-pyro",
        &out,
        &expected_lb("e2e-test-lb-server-tsdb-pyro-mix.txt"),
    );
}
