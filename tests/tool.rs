//! `ceems tool` through the `ceems_tool` link. CEEMS v0.16's `tool-web-config` scenario as its
//! e2e script runs it: a web config with basic auth and a self-signed certificate, an exporter
//! started with it on the pack's trees and waited for with the script's `waitport` (plain
//! HTTP to its TLS port), its metrics read with `curl -k` and the password the tool printed,
//! compared with CEEMS's expected output; then the checks.

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
                "--collector.force-hostname=testhost-1",
                "--log.level=debug",
                // The tool writes its files for its own user only; run as that user.
                "--security.drop-privileges=false",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    common::waitport(port);
    let out = Command::new("curl")
        .args(["-k", "-s"])
        .arg(format!("https://ceems:{secret}@127.0.0.1:{port}/metrics"))
        .output()
        .unwrap();
    let body = String::from_utf8(out.stdout).unwrap();
    let got: Vec<&str> = body.lines().filter(|l| kept(l)).collect();
    let want = std::fs::read_to_string(
        common::fixtures()
            .join("ceems-v0.16/cmd/ceems_tool/testdata/output/e2e-test-web-config-output.txt"),
    )
    .unwrap()
    // docs/compat.md: there is no Go version to report.
    .replace("goversion from which", "rustversion from which");
    assert_eq!(got, want.lines().collect::<Vec<_>>());
    // The certificate the tool made verifies for its host; without the password, or with
    // another, nothing is answered.
    let status_of = |password: &str, verify: bool| -> String {
        let mut curl = Command::new("curl");
        curl.args(["-s", "-o", "/dev/null", "-w", "%{http_code}"]);
        match verify {
            true => curl
                .arg("--cacert")
                .arg(dir.join("config/cert.pem"))
                .arg("--resolve")
                .arg(format!("example.com:{port}:127.0.0.1"))
                .arg(format!(
                    "https://ceems:{password}@example.com:{port}/metrics"
                )),
            false => curl
                .arg("-k")
                .arg(format!("https://ceems:{password}@127.0.0.1:{port}/metrics")),
        };
        String::from_utf8(curl.output().unwrap().stdout).unwrap()
    };
    assert_eq!(status_of(&secret, true), "200");
    for wrong in ["", "guess"] {
        assert_eq!(status_of(wrong, false), "401", "{wrong:?}");
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
    // One whose sacct fails says it is degraded, and why; its API still answers.
    let failing = common::start_subcommand(
        "stats-server",
        dir,
        &[
            &format!("--storage.data.path={}", dir.join("data-failing").display()),
            "--slurm.sacct.path=/bin/false",
            "--slurm.sacctmgr.path=",
            "--security.drop-privileges=false",
        ],
        &[],
    );
    let url = format!("--url={}", failing.url(""));
    let began = std::time::Instant::now();
    let (status, log) = loop {
        let (status, log) = ceems_tool(dir, &["check", "api-healthy", &url]);
        if status != 0 || began.elapsed() > std::time::Duration::from_secs(20) {
            break (status, log);
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(status, 1, "{log}");
    assert!(
        log.contains("status=503") && log.contains("ingestion failing since"),
        "{log}"
    );
    assert!(log.contains("/bin/false"), "the reason is not said: {log}");
    assert!(failing.get("/api/v1/health").contains("ok"));
    let closed = format!("--url=http://127.0.0.1:{}", common::free_port());
    let (status, log) = ceems_tool(dir, &["check", "lb-healthy", &closed]);
    assert_eq!(status, 1, "{log}");
    assert!(log.contains("check failed"), "{log}");
}

/// CEEMS's `tool-relabel-configs` scenario: a real Prometheus with the pack's config scraping
/// the three GPU exporters' stand-ins, and `ceems_tool tsdb create-relabel-configs` printing
/// CEEMS's expected output byte for byte: v0.16's (AMD's device metrics exporter found by its
/// `amd_gpu_` series, the note on rules), and v0.10.2's with `--compat.metric-names=v0.10`.
#[test]
fn ceems_tool_relabel_configs_scenario() {
    use common::tool_pack::Pack;
    common::lab::prometheus_tools().expect("prometheus");
    for (pack, flags, expected) in [
        (
            Pack::V016,
            &[][..],
            "ceems-v0.16/cmd/ceems_tool/testdata/output/e2e-test-relabel-config-output.txt",
        ),
        (
            Pack::V010,
            &["--compat.metric-names=v0.10"][..],
            "ceems-api/cmd/ceems_tool/testdata/output/e2e-test-relabel-config-output.txt",
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (_prometheus, url, _exporters) = common::tool_pack::pack_prometheus(
            pack,
            dir,
            &[],
            "count by (job) ({__name__=~\"DCGM_FI_DEV_POWER_USAGE_INSTANT|amd_gpu_power|amd_gpu_package_power|gpu_power_usage\"})",
            4,
        );
        let url = format!("--url={url}");
        let args = [&["tsdb", "create-relabel-configs", &url][..], flags].concat();
        let (status, out) = ceems_tool(dir, &args);
        assert_eq!(status, 0, "{out}");
        let want = std::fs::read_to_string(common::fixtures().join(expected)).unwrap();
        assert_eq!(out, want, "{expected}");
    }
}
