//! `ceems tool` through the `ceems_tool` link. CEEMS's `tool-web-config` scenario as its e2e
//! script runs it: a web config with basic auth and a self-signed certificate, an exporter
//! started with it on the pack's trees, its metrics read over HTTPS with the password the
//! tool printed, compared with CEEMS's expected output; then the checks.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

/// `ceems_tool ARGS` from `dir`: exit status and standard error.
fn ceems_tool(dir: &Path, args: &[&str]) -> (i32, String) {
    common::tool_pack::ceems_tool(dir, args, "")
}

/// The script's `skip_re`: lines that change from run to run.
fn kept(line: &str) -> bool {
    let skip = regex::Regex::new(
        r"^(go_|ceems_exporter_build_info|ceems_scrape_collector_duration_seconds|process_|ceems_textfile_mtime_seconds|ceems_time_(zone|seconds)|ceems_network_(receive|transmit)_(bytes|packets)_total)",
    )
    .unwrap();
    !skip.is_match(line)
}

#[test]
fn ceems_tool_web_config_scenario_and_checks() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // The pack's trees where the script has them (paths show in RAPL's labels).
    let testdata = dir.join("pkg/collector/testdata");
    std::fs::create_dir_all(&testdata).unwrap();
    for tree in ["sys", "proc"] {
        std::os::unix::fs::symlink(
            common::fixtures().join("compat").join(tree),
            testdata.join(tree),
        )
        .unwrap();
    }
    let (status, log) = ceems_tool(
        dir,
        &[
            "config",
            "create-web-config",
            "--tls",
            "--tls.host",
            "example.com",
            "--tls.host",
            "127.0.0.1",
            "--output-dir",
            "config",
        ],
    );
    assert_eq!(status, 0, "{log}");
    // As the script reads it.
    let secret = regex::Regex::new("plain text password for basic auth is (.*)\nstore (.*)")
        .unwrap()
        .captures(&log)
        .unwrap_or_else(|| panic!("no password in {log}"))[1]
        .to_owned();
    let web_config = dir.join("config/web-config.yml");

    let port = common::free_port();
    let exporter = dir.join("ceems_exporter");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ceems"), &exporter).unwrap();
    let _running = common::KillOnDrop(
        Command::new(&exporter)
            .current_dir(dir)
            .args([
                "--path.sysfs=pkg/collector/testdata/sys",
                "--path.cgroupfs=pkg/collector/testdata/sys/fs/cgroup",
                "--path.procfs=pkg/collector/testdata/proc",
                &format!("--web.listen-address=127.0.0.1:{port}"),
                &format!("--web.config.file={}", web_config.display()),
                "--web.disable-exporter-metrics",
                "--collector.empty-hostname-label",
                "--log.level=debug",
                // The pack is CEEMS v0.10's: its names (tests/compat.rs runs it alike).
                "--compat.metric-names=v0.10",
                // The tool writes its files for its own user only; run as that user.
                "--security.drop-privileges=false",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let tls = ceems::web::client::ClientTls {
        roots_pem: std::fs::read(dir.join("config/cert.pem")).unwrap(),
        identity_pem: None,
        insecure_skip_verify: false,
    };
    let agent = ceems::web::client::agent_with_tls(
        ceems::web::client::Timeouts::all(std::time::Duration::from_secs(5)),
        &tls,
    )
    .unwrap();
    let url = format!("https://127.0.0.1:{port}/metrics");
    let auth = |password: &str| {
        use base64::Engine as _;
        let token = base64::engine::general_purpose::STANDARD.encode(format!("ceems:{password}"));
        format!("Basic {token}")
    };
    let start = std::time::Instant::now();
    let body = loop {
        match agent.get(&url).set("Authorization", &auth(&secret)).call() {
            Ok(r) => break r.into_string().unwrap(),
            Err(e) => {
                assert!(start.elapsed().as_secs() < 10, "no answer: {e}");
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
    };
    let got: Vec<&str> = body.lines().filter(|l| kept(l)).collect();
    let want = std::fs::read_to_string(
        common::fixtures()
            .join("ceems-api/cmd/ceems_tool/testdata/output/e2e-test-web-config-output.txt"),
    )
    .unwrap()
    // docs/compat.md: there is no Go version to report.
    .replace("goversion from which", "rustversion from which");
    assert_eq!(got, want.lines().collect::<Vec<_>>());
    // Without the password, or with another, nothing.
    for wrong in ["", "guess"] {
        match agent.get(&url).set("Authorization", &auth(wrong)).call() {
            Err(ureq::Error::Status(401, _)) => {}
            other => panic!("{wrong:?}: {other:?}"),
        }
    }

    // The checks: the file written is a valid web config, a broken one is named.
    let broken = dir.join("broken.yml");
    std::fs::write(&broken, "tls_server_config:\n  cert_file: cert.pem\n").unwrap();
    let (status, log) = ceems_tool(
        dir,
        &["check", "web-config", "config/web-config.yml", "broken.yml"],
    );
    assert_eq!(status, 1, "{log}");
    assert!(log.contains("config/web-config.yml SUCCESS"), "{log}");
    assert!(
        log.contains("broken.yml FAILED") && log.contains("key_file"),
        "{log}"
    );
    let (status, log) = ceems_tool(dir, &["check", "web-config", "config/web-config.yml"]);
    assert_eq!(status, 0, "{log}");

    // A running lb or stats-server answers its /health; nothing listening fails the check.
    let stats = common::start_subcommand(
        "stats-server",
        dir,
        &[
            &format!("--storage.data.path={}", dir.join("data").display()),
            "--slurm.sacct.path=/bin/true",
            "--slurm.sacctmgr.path=",
            "--security.drop-privileges=false",
        ],
        &[],
    );
    let (status, log) = ceems_tool(
        dir,
        &["check", "api-healthy", &format!("--url={}", stats.url(""))],
    );
    assert_eq!(status, 0, "{log}");
    assert!(log.contains("SUCCESS"), "{log}");
    let closed = format!("--url=http://127.0.0.1:{}", common::free_port());
    let (status, log) = ceems_tool(dir, &["check", "lb-healthy", &closed]);
    assert_eq!(status, 1, "{log}");
    assert!(log.contains("check failed"), "{log}");
}

/// CEEMS's `tool-relabel-configs` scenario: a real Prometheus with the pack's config scraping
/// the three GPU exporters' stand-ins, and `ceems_tool tsdb create-relabel-configs` printing
/// CEEMS's expected output byte for byte.
#[test]
fn ceems_tool_relabel_configs_scenario() {
    common::lab::prometheus_tools().expect("prometheus");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (_prometheus, url, _exporters) = common::tool_pack::pack_prometheus(
        dir,
        &[],
        "count by (job) ({__name__=~\"DCGM_FI_DEV_POWER_USAGE_INSTANT|amd_gpu_power|gpu_power_usage\"})",
        4,
    );
    let (status, out) = ceems_tool(
        dir,
        &["tsdb", "create-relabel-configs", &format!("--url={url}")],
    );
    assert_eq!(status, 0, "{out}");
    let want = std::fs::read_to_string(
        common::fixtures()
            .join("ceems-api/cmd/ceems_tool/testdata/output/e2e-test-relabel-config-output.txt"),
    )
    .unwrap();
    assert_eq!(out, want);
}
