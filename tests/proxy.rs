//! `ceems redfish-proxy` end to end: real exporters → the proxy → two stand-in BMCs, and the
//! requests it must refuse.

mod common;

use std::time::{Duration, Instant};

use common::bmc::StandinBmc;
use common::{start_exporter, start_subcommand, Running};

fn bmc(watts: f64) -> StandinBmc {
    StandinBmc::with_sessions(watts, false)
}

fn proxy(bmcs: &[(&str, &StandinBmc)], extra: &[&str]) -> Running {
    let targets: Vec<String> = bmcs
        .iter()
        .map(|(ip, b)| format!("--redfish.target={ip}={}", b.url()))
        .collect();
    let mut args: Vec<&str> = targets.iter().map(String::as_str).collect();
    // The tests' client stands for a front proxy: its X-Real-IP names the node.
    args.push("--web.trusted-proxy=127.0.0.1");
    args.extend_from_slice(extra);
    start_subcommand("redfish-proxy", std::path::Path::new("."), &args, &[])
}

fn exporter_via(proxy: &Running, bmc: &StandinBmc, dir: &std::path::Path) -> Running {
    let config = dir.join(format!("redfish-{}.yml", bmc.port));
    std::fs::write(
        &config,
        format!(
            "redfish_web_config:\n  protocol: http\n  hostname: 127.0.0.1\n  port: {}\n  username: admin\n  password: secret\n  use_session_token: true\n  external_url: {}\n",
            bmc.port,
            proxy.url("")
        ),
    )
    .unwrap();
    let flag = format!("--collector.redfish.config.file={}", config.display());
    start_exporter(
        dir,
        &[
            "--collector.disable-defaults",
            "--collector.redfish",
            &flag,
            "--collector.empty-hostname-label",
        ],
    )
}

fn status(req: ureq::Request) -> (u16, String) {
    match req.call() {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn exporters_reach_their_own_bmc_through_the_proxy() {
    let (b1, b2) = (bmc(300.0), bmc(700.0));
    let p = proxy(&[("10.0.0.1", &b1), ("10.0.0.2", &b2)], &[]);
    let dir = tempfile::tempdir().unwrap();
    for (b, want) in [(&b1, "300"), (&b2, "700")] {
        let e = exporter_via(&p, b, dir.path());
        let text = e.get("/metrics");
        assert!(
            text.contains(&format!(
                "ceems_redfish_power_current_watts{{chassis=\"1U\",hostname=\"\"}} {want}\n"
            )),
            "{text}"
        );
        assert!(text.contains("ceems_scrape_collector_success{collector=\"redfish\"} 1\n"));
    }
    for b in [&b1, &b2] {
        assert_eq!(b.logins(), 1, "one session per exporter");
        for seen in b.seen() {
            assert!(
                !seen.headers.contains_key("x-redfish-url"),
                "routing header reached the BMC: {seen:?}"
            );
        }
    }
}

#[test]
fn x_real_ip_picks_the_bmc_and_client_authorization_is_stripped() {
    let (b1, b2) = (bmc(300.0), bmc(700.0));
    let p = proxy(&[("10.0.0.1", &b1), ("10.0.0.2", &b2)], &[]);
    // Basic auth would be accepted by the BMC, but must not pass the proxy.
    let (code, _) = status(
        ureq::get(&p.url("/redfish/v1/Chassis/1U/Power"))
            .set("X-Real-IP", "10.0.0.2")
            .set("Authorization", "Basic YWRtaW46c2VjcmV0"),
    );
    assert_eq!(code, 401);
    assert!(b2
        .seen()
        .iter()
        .all(|s| !s.headers.contains_key("authorization")));

    let login = ureq::post(&p.url("/redfish/v1/SessionService/Sessions"))
        .set("X-Real-IP", "10.0.0.2")
        .set("Content-Type", "application/json")
        .send_string(r#"{"UserName":"admin","Password":"secret"}"#)
        .unwrap();
    assert_eq!(login.status(), 201);
    let token = login.header("X-Auth-Token").unwrap().to_owned();
    // The BMC's Location comes back as a path, to be used through the proxy.
    assert!(login
        .header("Location")
        .unwrap()
        .starts_with("/redfish/v1/"));
    let (code, body) = status(
        ureq::get(&p.url("/redfish/v1/Chassis/1U/Power"))
            .set("X-Real-IP", "10.0.0.2")
            .set("X-Auth-Token", &token),
    );
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"PowerConsumedWatts\":700.0"), "{body}");
    assert_eq!(b1.seen().len(), 0, "the other BMC was contacted");
}

#[test]
fn refused_paths_unknown_targets_and_slow_bmcs() {
    let b1 = bmc(300.0);
    let p = proxy(&[("10.0.0.1", &b1)], &["--redfish.timeout=1s"]);
    for path in [
        "/redfish/v1/AccountService/Accounts",
        "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
        "/redfish/v1/Chassis/1U/%2e%2e/%2e%2e/AccountService",
        "/redfish/v1/Chassis?$expand=*",
    ] {
        let (code, body) = status(ureq::get(&p.url(path)).set("X-Real-IP", "10.0.0.1"));
        assert_eq!(code, 403, "{path}: {body}");
        assert!(body.contains("not"), "{path}: {body}");
    }
    let (code, body) = status(
        ureq::request("PATCH", &p.url("/redfish/v1/Chassis/1U")).set("X-Real-IP", "10.0.0.1"),
    );
    assert_eq!(code, 405, "{body}");
    assert_eq!(b1.seen().len(), 0, "a refused request reached the BMC");

    let (code, body) =
        status(ureq::get(&p.url("/redfish/v1/Chassis")).set("X-Real-IP", "10.9.9.9"));
    assert_eq!(code, 403);
    assert!(
        body.contains("no BMC is configured for client 10.9.9.9"),
        "{body}"
    );
    let (code, body) =
        status(ureq::get(&p.url("/redfish/v1/Chassis")).set("X-Redfish-Url", "https://192.0.2.1"));
    assert_eq!(code, 403);
    assert!(body.contains("not a configured target"), "{body}");
    // A configured BMC may be named by the header when the address maps to none.
    let (code, _) = status(ureq::get(&p.url("/redfish/v1/")).set("X-Redfish-Url", &b1.url()));
    assert_eq!(code, 200);

    b1.set_delay(Duration::from_secs(3));
    let start = Instant::now();
    let (code, body) = status(ureq::get(&p.url("/redfish/v1/")).set("X-Real-IP", "10.0.0.1"));
    assert_eq!(code, 504, "{body}");
    assert!(
        start.elapsed() < Duration::from_millis(2500),
        "{:?}",
        start.elapsed()
    );
}

/// Without targets or BMC networks CEEMS relays to any URL an exporter names; this proxy
/// relays only to BMCs on its own host, and says so at start.
#[test]
fn a_proxy_without_targets_reaches_only_bmcs_on_its_host() {
    let local = bmc(250.0);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("redfish-proxy.log");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_ceems"));
    command
        .arg("redfish-proxy")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let p = common::start_listening(command, "redfish-proxy");
    let (code, body) = status(ureq::get(&p.url("/redfish/v1/")).set("X-Redfish-Url", &local.url()));
    assert_eq!(code, 200, "{body}");
    // An address outside this host is refused before any connection is tried.
    let (code, body) =
        status(ureq::get(&p.url("/redfish/v1/")).set("X-Redfish-Url", "https://192.0.2.7"));
    assert_eq!(code, 403, "relayed off the host: {body}");
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        log.contains("no BMC is configured") && log.contains("--redfish.bmc-network"),
        "{log}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ceems"))
        .args(["redfish-proxy", "--redfish.target=node1=https://bmc"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("node1"), "{err}");
}

#[test]
fn tls_bmcs_need_skip_verify_and_slow_clients_are_cut_off() {
    let tls_bmc = StandinBmc::with_sessions(420.0, true);
    let strict = proxy(&[("10.0.0.1", &tls_bmc)], &[]);
    let (code, body) = status(ureq::get(&strict.url("/redfish/v1/")).set("X-Real-IP", "10.0.0.1"));
    assert_eq!(code, 502, "a self-signed BMC was trusted: {body}");
    assert!(body.to_lowercase().contains("certificate"), "{body}");
    let lax = proxy(
        &[("10.0.0.1", &tls_bmc)],
        &[
            "--redfish.insecure-skip-verify",
            "--web.header-read-timeout=1s",
        ],
    );
    let (code, body) = status(ureq::get(&lax.url("/redfish/v1/")).set("X-Real-IP", "10.0.0.1"));
    assert_eq!(code, 200, "{body}");

    // A client that never finishes its headers loses the connection.
    use std::io::{Read, Write};
    let mut slow = std::net::TcpStream::connect(("127.0.0.1", lax.port)).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    slow.write_all(b"GET /redfish/v1/ HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 256];
    let n = slow.read(&mut buf).unwrap_or(0);
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "connection kept open {:?}",
        start.elapsed()
    );
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(n == 0 || answer.contains("408"), "{answer}");
}

#[test]
fn untrusted_peers_cannot_claim_another_nodes_address() {
    let b2 = bmc(700.0);
    let target = format!("--redfish.target=10.0.0.2={}", b2.url());
    // A site that names its front proxy: this client (127.0.0.1) is not one of them.
    let p = start_subcommand(
        "redfish-proxy",
        std::path::Path::new("."),
        &[&target, "--web.trusted-proxy=192.0.2.1"],
        &[],
    );
    for (header, value) in [("X-Real-IP", "10.0.0.2"), ("X-Forwarded-For", "10.0.0.2")] {
        let (code, body) =
            status(ureq::get(&p.url("/redfish/v1/Chassis/1U/Power")).set(header, value));
        assert_eq!(code, 403, "{header}: {body}");
        assert!(
            body.contains("no BMC is configured for client 127.0.0.1"),
            "{body}"
        );
    }
    assert_eq!(b2.seen().len(), 0, "a spoofed address reached the BMC");
    // Behind a trusted front proxy, the last hop it appends names the node.
    let trusting = proxy(&[("10.0.0.2", &b2)], &[]);
    let (code, body) = status(
        ureq::get(&trusting.url("/redfish/v1/"))
            .set("X-Forwarded-For", "203.0.113.9, 10.0.0.2, 127.0.0.1"),
    );
    assert_eq!(code, 200, "{body}");
}

#[test]
fn bmc_networks_bound_the_bmcs_exporters_may_name() {
    let b = bmc(450.0);
    let inside = start_subcommand(
        "redfish-proxy",
        std::path::Path::new("."),
        &["--redfish.bmc-network=127.0.0.0/8"],
        &[],
    );
    let dir = tempfile::tempdir().unwrap();
    let e = exporter_via(&inside, &b, dir.path());
    let text = e.get("/metrics");
    assert!(
        text.contains("ceems_redfish_power_current_watts{chassis=\"1U\",hostname=\"\"} 450\n"),
        "{text}"
    );
    // A name is resolved, and only its addresses inside the networks are used.
    let by_name = format!("http://localhost:{}", b.port);
    let (code, body) =
        status(ureq::get(&inside.url("/redfish/v1/")).set("X-Redfish-Url", &by_name));
    assert_eq!(code, 200, "{body}");

    let seen = b.seen().len();
    let elsewhere = start_subcommand(
        "redfish-proxy",
        std::path::Path::new("."),
        &["--redfish.bmc-network=10.1.0.0/16"],
        &[],
    );
    for named in [b.url(), by_name] {
        let (code, body) =
            status(ureq::get(&elsewhere.url("/redfish/v1/")).set("X-Redfish-Url", &named));
        assert_eq!(code, 403, "{named}: {body}");
        assert!(body.contains("outside the BMC networks"), "{body}");
    }
    assert_eq!(
        b.seen().len(),
        seen,
        "a BMC outside the networks was contacted"
    );
}

#[test]
fn ceems_yaml_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let b = bmc(300.0);
    let run = |yaml: &str| {
        let path = dir.path().join("config.yml");
        std::fs::write(&path, yaml).unwrap();
        std::process::Command::new(env!("CARGO_BIN_EXE_ceems"))
            .args([
                "redfish-proxy",
                &format!("--config.file={}", path.display()),
                "--web.listen-address=127.0.0.1:0",
                "--security.drop-privileges=false",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    // CEEMS's documented file lists no targets: only BMCs on this host may be named, and the
    // start says what to add.
    let documented = "---\nredfish_config:\n  web:\n    insecure_skip_verify: false\n";
    let mut started = run(documented);
    let stderr = started.stderr.take().unwrap();
    let (lines, said) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let warning = loop {
        match said.recv_timeout(Duration::from_secs(10)) {
            Ok(line) if line.contains("no BMC is configured") => break line,
            Ok(_) => {}
            Err(e) => panic!("no warning about the missing targets: {e}"),
        }
    };
    assert!(warning.contains("bmc_networks"), "{warning}");
    let _ = started.kill();
    let _ = started.wait();
    let typo = run("redfish_config:\n  web:\n    insecure_skip_verfy: true\n")
        .wait_with_output()
        .unwrap();
    assert!(String::from_utf8_lossy(&typo.stderr).contains("insecure_skip_verfy"));
    // Its commented-out targets form works.
    let with_targets = format!(
        "{documented}  targets:\n    - host_ip_addrs:\n        - 10.0.0.7\n        - 10.0.0.8\n      url: {}\n",
        b.url()
    );
    let path = dir.path().join("targets.yml");
    std::fs::write(&path, with_targets).unwrap();
    let p = start_subcommand(
        "redfish-proxy",
        std::path::Path::new("."),
        &[
            &format!("--config.file={}", path.display()),
            "--web.trusted-proxy=127.0.0.1",
        ],
        &[],
    );
    let (code, body) = status(ureq::get(&p.url("/redfish/v1/")).set("X-Real-IP", "10.0.0.8"));
    assert_eq!(code, 200, "{body}");
}
