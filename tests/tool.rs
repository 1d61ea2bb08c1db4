//! `ceems tool` through the `ceems_tool` link. CEEMS's `tool-web-config` scenario as its e2e
//! script runs it: a web config with basic auth and a self-signed certificate, an exporter
//! started with it on the pack's trees, its metrics read over HTTPS with the password the
//! tool printed, compared with CEEMS's expected output; then the checks.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

/// `ceems_tool ARGS` from `dir`: exit status and standard error.
fn ceems_tool(dir: &Path, args: &[&str]) -> (i32, String) {
    let link = dir.join("ceems_tool");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ceems"), &link).unwrap();
    }
    let out = Command::new(&link)
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
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

/// Stand-ins of the GPU exporters the pack's `mock_exporters` runs: NVIDIA's DCGM exporter, AMD's
/// SMI exporter and AMD's device metrics exporter, each with its series names and labels.
fn gpu_exporter(kind: &'static str) -> common::http::TestServer {
    use common::http::{Request, Response};
    let mut body = String::new();
    match kind {
        "dcgm" => {
            for (i, uuid) in [
                "GPU-956348bc-d43d-23ed-53d4-857749fa2b67",
                "GPU-feba7e40-d724-01ff-b00f-3a439a28a6c7",
            ]
            .iter()
            .enumerate()
            {
                for name in [
                    "DCGM_FI_DEV_POWER_USAGE",
                    "DCGM_FI_DEV_POWER_USAGE_INSTANT",
                    "DCGM_FI_DEV_GPU_UTIL",
                ] {
                    body.push_str(&format!(
                        "{name}{{Hostname=\"host\",UUID=\"{uuid}\",GPU_I_ID=\"\",device=\"nvidia{i}\",gpu=\"{i}\",pci_bus_id=\"00000000:1{i}:00.0\",modelName=\"NVIDIA A100 80GiB\"}} 150\n"
                    ));
                }
            }
        }
        "amd-smi" => {
            for i in 0..2 {
                for (name, label) in [
                    ("amd_gpu_power", "gpu_power"),
                    ("amd_gpu_use_percent", "gpu_use_percent"),
                    ("amd_gpu_memory_use_percent", "gpu_memory_use_percent"),
                ] {
                    body.push_str(&format!(
                        "{name}{{{label}=\"{i}\",productname=\"Advanced Micro Devices Inc\"}} 50\n"
                    ));
                }
            }
        }
        _ => {
            for i in 0..2 {
                for name in ["gpu_power_usage", "gpu_gfx_activity", "gpu_used_vram"] {
                    body.push_str(&format!(
                        "{name}{{gpu_id=\"{i}\",gpu_partition_id=\"0\",serial_number=\"2017000080{i}c\"}} 50\n"
                    ));
                }
            }
        }
    }
    common::http::TestServer::start(
        false,
        std::sync::Arc::new(move |_: &Request| Response::raw(200, body.clone())),
    )
}

/// CEEMS's `tool-relabel-configs` scenario: a real Prometheus with the pack's config scraping
/// the three GPU exporters' stand-ins, and `ceems_tool tsdb create-relabel-configs` printing
/// CEEMS's expected output byte for byte.
#[test]
fn ceems_tool_relabel_configs_scenario() {
    common::lab::prometheus_tools().expect("prometheus");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (_prometheus, url, _exporters) = pack_prometheus(
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

/// Prometheus with the pack's config, its GPU exporters' stand-ins and `extra` targets, once
/// `ready` (a PromQL count) answers `count` series; killed when dropped.
fn pack_prometheus(
    dir: &Path,
    extra: &[(&str, &common::http::TestServer)],
    ready: &str,
    count: usize,
) -> (common::KillOnDrop, String, Vec<common::http::TestServer>) {
    let exporters = vec![
        ("localhost:9400", gpu_exporter("dcgm")),
        ("localhost:9500", gpu_exporter("amd-smi")),
        ("localhost:9600", gpu_exporter("amd-device-metrics")),
    ];
    let mut config = std::fs::read_to_string(
        common::fixtures().join("ceems-api/cmd/ceems_tool/testdata/prometheus.yml"),
    )
    .unwrap();
    for (pack, ours) in exporters
        .iter()
        .map(|(p, s)| (*p, s))
        .chain(extra.iter().copied())
    {
        config = config.replace(pack, ours.url().trim_start_matches("http://"));
    }
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let port = common::free_port();
    let child = common::KillOnDrop(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let url = format!("http://127.0.0.1:{port}");
    let start = std::time::Instant::now();
    loop {
        let answer = ureq::get(&format!("{url}/api/v1/query"))
            .query("query", ready)
            .call()
            .ok()
            .and_then(|r| r.into_string().ok())
            .unwrap_or_default();
        if answer.matches("\"metric\"").count() == count {
            break;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "{answer}"
        );
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    (child, url, exporters.into_iter().map(|(_, s)| s).collect())
}

/// `tsdb create-ceems-tsdb-updater-queries` against a real Prometheus holding the recorded
/// series CEEMS's `tool-recording-rules` scenario's Prometheus had (CPU use and memory, no
/// power or emissions): the queries section of that scenario's expected output, byte for byte.
#[test]
fn ceems_tool_updater_queries_for_what_prometheus_records() {
    common::lab::prometheus_tools().expect("prometheus");
    let tmp = tempfile::tempdir().unwrap();
    let recorded = common::http::TestServer::start(
        false,
        std::sync::Arc::new(|_: &common::http::Request| {
            common::http::Response::raw(
                200,
                "uuid:ceems_cpu_usage:ratio_irate{uuid=\"1479763\"} 0.5\nuuid:ceems_cpu_memory_usage:ratio{uuid=\"1479763\"} 0.25\n",
            )
        }),
    );
    let (_prometheus, url, _exporters) = pack_prometheus(
        tmp.path(),
        &[("localhost:9010", &recorded)],
        "{__name__=~\"uuid:.*\"}",
        2,
    );
    let (status, out) = ceems_tool(
        tmp.path(),
        &[
            "tsdb",
            "create-ceems-tsdb-updater-queries",
            &format!("--url={url}"),
        ],
    );
    assert_eq!(status, 0, "{out}");
    let pack = std::fs::read_to_string(
        common::fixtures()
            .join("ceems-api/cmd/ceems_tool/testdata/output/e2e-test-recording-rules-output.txt"),
    )
    .unwrap();
    let want = &pack[pack.find("Queries for TSDB updater:").unwrap()..];
    assert_eq!(out, want);
}
