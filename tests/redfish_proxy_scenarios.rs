//! CEEMS v0.16's five `redfish-proxy-*` e2e scenarios (`fixtures/ceems-v0.16`), run as its
//! `scripts/e2e-test.sh` runs them: the `redfish_proxy` link with the pack's config and web
//! config, the script's `sleep 5` and `waitport`, its curl requests (`X-Real-IP` from
//! 127.0.0.1, `X-Redfish-Url`, basic auth over TLS), and the output compared with `diff`.
//! CEEMS's mock BMCs listen on `localhost:5000`-`5009`; the stand-ins answer as they do
//! (`BMC for host 192.168.1.<i> is running on port <500i>`) on free ports, which replace
//! those in the config and the requests.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;

use common::http::{Response, TestServer};

fn pack() -> PathBuf {
    common::fixtures().join("ceems-v0.16")
}

/// CEEMS's ten mock targets (`mock_servers redfish-targets-plain` or `-tls`).
fn mock_targets(tls: bool) -> Vec<TestServer> {
    (0..10)
        .map(|i| {
            TestServer::start(
                tls,
                Arc::new(move |req: &common::http::Request| match req.path() {
                    "/redfish/v1/" => Response::raw(
                        200,
                        format!(
                            "BMC for host 192.168.1.{i} is running on port {}\n",
                            5000 + i
                        ),
                    ),
                    _ => Response::raw(404, "404 page not found\n"),
                }),
            )
        })
        .collect()
}

/// `localhost:500<i>` of the pack's files and requests, made the stand-ins' ports.
fn with_ports(text: &str, targets: &[TestServer]) -> String {
    targets
        .iter()
        .enumerate()
        .fold(text.to_owned(), |t, (i, s)| {
            t.replace(
                &format!("localhost:{}", 5000 + i),
                &format!("localhost:{}", s.port),
            )
        })
}

struct Proxy {
    _child: common::KillOnDrop,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// `./bin/redfish_proxy --web.listen-address=127.0.0.1:PORT [--config.file=…]
/// [--web.config.file=…] --log.level=debug`, from the pack's root, then `sleep 5` and
/// `waitport`.
fn redfish_proxy(config: Option<&str>, web_config: bool, targets: &[TestServer]) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("redfish_proxy");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ceems"), &link).unwrap();
    let port = common::free_port();
    let log = dir.path().join("redfish_proxy.log");
    let mut command = Command::new(&link);
    command
        .current_dir(pack())
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    if let Some(name) = config {
        let text =
            std::fs::read_to_string(pack().join("cmd/redfish_proxy/testdata").join(name)).unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, with_ports(&text, targets)).unwrap();
        command.arg(format!("--config.file={}", path.display()));
    }
    if web_config {
        command.arg("--web.config.file=cmd/redfish_proxy/testdata/web-config.yml");
    }
    command.arg("--log.level=debug");
    let mut child = common::KillOnDrop(command.spawn().unwrap());
    std::thread::sleep(std::time::Duration::from_secs(5));
    if let Ok(Some(status)) = child.try_wait() {
        panic!(
            "redfish_proxy exited: {status}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    common::waitport(port);
    Proxy {
        _child: child,
        port,
        log,
        _dir: dir,
    }
}

/// The script's ten `X-Real-IP` requests, one per node, then one naming a BMC.
fn each_node_then_named(base: &str, named: &str) -> String {
    let mut out = String::new();
    for i in 0..10 {
        out += &common::get(&["-H", &format!("X-Real-IP: 192.168.1.{i}"), base]);
    }
    out + &common::get(&["-H", &format!("X-Redfish-Url: {named}"), base])
}

/// The script's `diff -u fixture output`.
fn check(scenario: &str, fixture: &str, out: &str, proxy: &Proxy) {
    let want = std::fs::read_to_string(
        pack()
            .join("cmd/redfish_proxy/testdata/output")
            .join(fixture),
    )
    .unwrap();
    assert_eq!(
        out,
        want,
        "{scenario}\n--- log\n{}",
        std::fs::read_to_string(&proxy.log).unwrap_or_default()
    );
}

fn plain_url(port: u16) -> String {
    format!("127.0.0.1:{port}/redfish/v1/")
}

fn tls_url(port: u16, credentials: &str) -> String {
    format!("https://{credentials}127.0.0.1:{port}/redfish/v1/")
}

#[test]
fn redfish_proxy_frontend_plain_backend_plain() {
    let targets = mock_targets(false);
    let p = redfish_proxy(Some("config-plain.yml"), false, &targets);
    let named = with_ports("http://localhost:5000", &targets);
    let out = each_node_then_named(&plain_url(p.port), &named);
    check(
        "redfish-proxy-frontend-plain-backend-plain",
        "e2e-test-redfish-proxy-plain-plain-output.txt",
        &out,
        &p,
    );
}

#[test]
fn redfish_proxy_frontend_tls_backend_plain() {
    let targets = mock_targets(false);
    let p = redfish_proxy(Some("config-plain.yml"), true, &targets);
    let named = with_ports("http://localhost:5000", &targets);
    let mut out = each_node_then_named(&tls_url(p.port, "admin:admin@"), &named);
    // Without the credentials: Unauthorized.
    out += &common::get(&[
        "-H",
        &format!("X-Redfish-Url: {named}"),
        &tls_url(p.port, ""),
    ]);
    check(
        "redfish-proxy-frontend-tls-backend-plain",
        "e2e-test-redfish-proxy-tls-plain-output.txt",
        &out,
        &p,
    );
}

#[test]
fn redfish_proxy_frontend_plain_backend_tls() {
    let targets = mock_targets(true);
    let p = redfish_proxy(Some("config-tls.yml"), false, &targets);
    let named = with_ports("https://localhost:5005", &targets);
    let out = each_node_then_named(&plain_url(p.port), &named);
    check(
        "redfish-proxy-frontend-plain-backend-tls",
        "e2e-test-redfish-proxy-plain-tls-output.txt",
        &out,
        &p,
    );
}

#[test]
fn redfish_proxy_frontend_tls_backend_tls() {
    let targets = mock_targets(true);
    let p = redfish_proxy(Some("config-tls.yml"), true, &targets);
    let named = with_ports("https://localhost:5005", &targets);
    let out = each_node_then_named(&tls_url(p.port, "admin:admin@"), &named);
    check(
        "redfish-proxy-frontend-tls-backend-tls",
        "e2e-test-redfish-proxy-tls-tls-output.txt",
        &out,
        &p,
    );
}

#[test]
fn redfish_proxy_targetless_frontend_plain_backend_plain() {
    let targets = mock_targets(false);
    let p = redfish_proxy(None, false, &targets);
    let named = with_ports("http://localhost:5000", &targets);
    let out = common::get(&[
        "-H",
        &format!("X-Redfish-Url: {named}"),
        &format!("http://{}", plain_url(p.port)),
    ]);
    check(
        "redfish-proxy-targetless-frontend-plain-backend-plain",
        "e2e-test-redfish-proxy-targetless-plain-plain-output.txt",
        &out,
        &p,
    );
}
