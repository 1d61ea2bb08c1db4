//! CEEMS's API e2e scenarios (`fixtures/ceems-api/pkg/api/testdata/output`) against
//! `ceems stats-server`, the request as CEEMS's `scripts/e2e-test.sh` sends it and the answer
//! compared as it compares: JSON with keys and lists sorted and numbers by value, the CORS
//! header dump byte for byte but for its `Date` line.
//!
//! These are the scenarios whose answer does not depend on the pack's clusters' data (which
//! needs its `config.yml` and its `sacct` stand-in read as CEEMS reads them).

mod common;

use std::io::{Read as _, Write as _};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::Running;
use serde_json::Value;

fn expected(name: &str) -> String {
    let path = common::fixtures()
        .join("ceems-api/pkg/api/testdata/output")
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
        (
            "api-global-usage-query-k8s",
            "kusr1",
            "/api/v1/usage/global?cluster_id=slurm-0&field=username&field=project&field=num_units",
            "e2e-test-api-server-global-usage-query-k8s.txt",
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
