//! `ceems lb` towards stores behind TLS and credentials. CEEMS's `lb-auth` scenario as its
//! script runs it: a real Prometheus (Debian's) behind the pack's `web-config.yml` (its TLS
//! key and basic auth), `ceems_lb` with the pack's `config-with-auth.yml` and its own
//! `web-config-ceems.yml`, one query through both. Then HTTPS stand-ins: a store whose
//! certificate is trusted through a CA file, one whose certificate is not (refused unless
//! `insecure-skip-verify`), one that does not answer in time; each cluster's failure stays
//! its own. Last, the stats-server's API behind TLS and basic auth, asked for ownership.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::http::{Request, Response, TestServer};

fn pack(name: &str) -> std::path::PathBuf {
    common::fixtures()
        .join("ceems-v0.16/pkg/lb/testdata")
        .join(name)
}

/// Copies the pack's files into `dir`, readable by the user the lb drops to.
fn copy_into(dir: &Path, names: &[&str]) {
    for name in names {
        let to = dir.join(name);
        std::fs::copy(pack(name), &to).unwrap();
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
}

fn wait_for_port(port: u16) {
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "nothing on :{port}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn ceems_lb_auth_scenario_through_a_prometheus_behind_tls_and_basic_auth() {
    if !common::runnable(
        "ceems_lb_auth_scenario_through_a_prometheus_behind_tls_and_basic_auth",
        common::lab::prometheus_tools(),
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    copy_into(
        dir,
        &[
            "localhost.crt",
            "localhost.key",
            "web-config.yml",
            "web-config-ceems.yml",
        ],
    );
    let port = common::free_port();
    let _prometheus = common::KillOnDrop(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                pack("prometheus.yml").display()
            ))
            .arg(format!(
                "--web.config.file={}",
                dir.join("web-config.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg("--storage.tsdb.retention.time=10y")
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus"),
    );
    wait_for_port(port);
    let config = dir.join("config-with-auth.yml");
    std::fs::write(
        &config,
        std::fs::read_to_string(pack("config-with-auth.yml"))
            .unwrap()
            .replace(
                "https://localhost:9090",
                &format!("https://localhost:{port}"),
            ),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let link = dir.join("ceems_lb");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ceems"), &link).unwrap();
    let mut command = Command::new(&link);
    // As the script: from the pack's root, where its database is.
    command
        .current_dir(common::fixtures().join("ceems-v0.16"))
        .args([
            &format!("--config.file={}", config.display()),
            &format!(
                "--web.config.file={}",
                dir.join("web-config-ceems.yml").display()
            ),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let lb = common::start_listening(command, "ceems_lb");
    let query = "/api/v1/query?query=avg_cpu_usage%7Buuid%3D%221479763%22%7D&time=1645450627";
    let ask = |credentials: &str| {
        let mut last = String::new();
        // Prometheus may still be opening its TSDB.
        for _ in 0..50 {
            let answer = ureq::get(&format!("http://{credentials}127.0.0.1:{}{query}", lb.port))
                .set("X-Grafana-User", "usr1")
                .set("X-Ceems-Cluster-Id", "slurm-0")
                .call();
            match answer {
                Ok(r) => return (200, r.into_string().unwrap()),
                Err(ureq::Error::Status(code, r)) if code != 502 && code != 503 => {
                    return (code, r.into_string().unwrap_or_default())
                }
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("no answer: {last}");
    };
    let (status, body) = ask("ceems:password@");
    assert_eq!(status, 200, "{body}");
    let want = std::fs::read_to_string(pack("output/e2e-test-lb-auth-server.txt")).unwrap();
    assert_eq!(body.trim_end(), want.trim_end());
    // The script's own request: curl with the query's braces and quotes as they are.
    let scripted = Command::new("curl")
        .args(["-k", "-s", "-H", "X-Grafana-User: usr1", "-H", "X-Ceems-Cluster-Id: slurm-0"])
        .arg(format!(
            "http://ceems:password@127.0.0.1:{}/api/v1/query?query=avg_cpu_usage\\{{uuid=\"1479763\"\\}}&time=1645450627",
            lb.port
        ))
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&scripted.stdout), want, "lb-auth");
    // Without the lb's own credentials, nothing reaches the store.
    assert_eq!(ask("").0, 401);
}

/// A Prometheus-shaped stand-in over HTTPS that says which credentials and header it got.
fn store(tls: bool, name: &'static str) -> TestServer {
    TestServer::start(
        tls,
        Arc::new(move |req: &Request| {
            let seen = serde_json::json!({
                "store": name,
                "authorization": req.header("authorization"),
                "header": req.header("x-site"),
            });
            Response::json(200, serde_json::json!({"status": "success", "data": seen}))
        }),
    )
}

#[test]
fn each_cluster_reaches_its_stores_with_their_tls_and_credentials_and_fails_alone() {
    let trusted = store(true, "trusted");
    let untrusted = store(true, "untrusted");
    let skipped = store(true, "skipped");
    let slow = store(false, "slow");
    slow.set_delay(Duration::from_secs(3));
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, &trusted.cert_pem).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, "t0ken\n").unwrap();
    for f in [&ca, &token] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let config = dir.join("ceems.toml");
    std::fs::write(
        &config,
        format!(
            "[lb.lb]\ntimeout = \"1s\"\n\n\
             [[lb.lb.stores]]\ncluster = \"trusted\"\nurl = \"{}\"\nca-file = \"{}\"\nbearer-token-file = \"{}\"\nheaders = {{ X-Site = \"a\" }}\n\n\
             [[lb.lb.stores]]\ncluster = \"untrusted\"\nurl = \"{}\"\n\n\
             [[lb.lb.stores]]\ncluster = \"skipped\"\nurl = \"{}\"\ninsecure-skip-verify = true\nbasic-auth-user = \"prometheus\"\nbasic-auth-password = \"password\"\n\n\
             [[lb.lb.stores]]\ncluster = \"slow\"\nurl = \"{}\"\n",
            trusted.url(),
            ca.display(),
            token.display(),
            untrusted.url(),
            skipped.url(),
            slow.url()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let lb = common::start_subcommand(
        "lb",
        dir,
        &[
            &format!("--config.file={}", config.display()),
            &format!(
                "--storage.data.path={}",
                common::fixtures()
                    .join("ceems-api/pkg/api/testdata")
                    .display()
            ),
            "--web.admin-users=admin",
            "--lb.health-check-interval=1h",
        ],
        &[],
    );
    let ask = |cluster: &str| {
        let started = Instant::now();
        let answer = ureq::get(&format!(
            "http://127.0.0.1:{}/api/v1/query?query=up",
            lb.port
        ))
        .set("X-Grafana-User", "admin")
        .set("X-Ceems-Cluster-Id", cluster)
        .call();
        let (status, body) = match answer {
            Ok(r) => (200, r.into_string().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
            Err(e) => panic!("{cluster}: {e}"),
        };
        (status, body, started.elapsed())
    };
    let (status, body, _) = ask("trusted");
    assert_eq!(status, 200, "{body}");
    let seen: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(seen["data"]["authorization"], "Bearer t0ken", "{body}");
    assert_eq!(seen["data"]["header"], "a", "{body}");
    let (status, body, _) = ask("untrusted");
    assert_eq!(status, 502, "an unknown certificate is refused: {body}");
    let (status, body, _) = ask("skipped");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("Basic cHJvbWV0aGV1czpwYXNzd29yZA=="),
        "{body}"
    );
    let (status, _, took) = ask("slow");
    assert_eq!(status, 502);
    assert!(took < Duration::from_millis(2900), "{took:?}");
    // The others keep answering.
    assert_eq!(ask("trusted").0, 200);
    assert_eq!(ask("skipped").0, 200);
}

/// The stats-server's API behind TLS and basic auth (a stand-in shaped like its answers):
/// `--lb.ceems-api-url` with `[lb.lb.ceems-api-client]` reaches it; a user's own unit passes,
/// another's is refused, and without the client settings nothing passes.
#[test]
fn ownership_is_asked_of_an_api_server_behind_tls_and_basic_auth() {
    let api = TestServer::start(
        true,
        Arc::new(|req: &Request| {
            if req.header("authorization") != Some("Basic Y2VlbXM6cGFzc3dvcmQ=") {
                return Response::json(401, serde_json::json!({"status": "error"}));
            }
            let user = req.header("x-grafana-user").unwrap_or("");
            match req.path() {
                "/api/v1/users/admin" => Response::json(
                    200,
                    serde_json::json!({"status": "success", "data": [{"name": "grafana"}]}),
                ),
                "/api/v1/units/verify" if user == "usr1" && req.target.contains("uuid=1479763") => {
                    Response::json(200, serde_json::json!({"status": "success"}))
                }
                _ => Response::json(403, serde_json::json!({"status": "error"})),
            }
        }),
    );
    let prometheus = store(false, "prometheus");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let ca = dir.join("api-ca.pem");
    std::fs::write(&ca, &api.cert_pem).unwrap();
    std::fs::set_permissions(&ca, std::fs::Permissions::from_mode(0o644)).unwrap();
    let start = |client: &str| {
        let config = dir.join(format!("lb-{}.toml", client.len()));
        std::fs::write(
            &config,
            format!(
                "[lb.lb]\nbackends = [\"slurm-0={}\"]\nceems-api-url = \"{}\"\n{client}",
                prometheus.url(),
                api.url()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
        common::start_subcommand(
            "lb",
            dir,
            &[&format!("--config.file={}", config.display())],
            &[],
        )
    };
    let ask = |lb: &common::Running, user: &str, uuid: &str| {
        let url = format!(
            "http://127.0.0.1:{}/api/v1/query?query=up%7Buuid%3D%22{uuid}%22%7D",
            lb.port
        );
        match ureq::get(&url).set("X-Grafana-User", user).call() {
            Ok(r) => r.status(),
            Err(ureq::Error::Status(code, _)) => code,
            Err(e) => panic!("{e}"),
        }
    };
    let lb = start(&format!(
        "\n[lb.lb.ceems-api-client]\nca-file = \"{}\"\nbasic-auth-user = \"ceems\"\nbasic-auth-password = \"password\"\n",
        ca.display()
    ));
    assert_eq!(ask(&lb, "usr1", "1479763"), 200);
    assert_eq!(ask(&lb, "usr1", "1481510"), 403);
    assert_eq!(
        ask(&lb, "grafana", "1481510"),
        200,
        "an admin of the API server"
    );
    drop(lb);
    // Without them the API's certificate is not trusted: no answer, no query relayed.
    let lb = start("");
    assert_ne!(ask(&lb, "usr1", "1479763"), 200);
}
