//! The Redfish collector and the proxy against a real Redfish emulator: OpenStack's
//! `sushy-static` (PyPI `sushy-tools`) serving CEEMS's chassis documents as a DMTF mockup
//! directory. It has no authentication and answers a session login with 204 and no token, so
//! the collector must fall back to plain requests. Sessions, 401 renewal and TLS are tested
//! against the stand-in in `tests/redfish.rs`.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ceems::collect::redfish::{RedfishCollector, WebConfig};
use ceems::collect::Collector;
use ceems::metrics::MetricSet;
use common::{
    ensure_tools, fixtures, free_port, runnable, start_exporter, start_subcommand, KillOnDrop,
};

/// `sushy-static`, run through the interpreter pip installed it for, so that a PATH without
/// pip's script directory does not matter.
const SUSHY_STATIC: &str =
    "import sys; from sushy_tools.static.main import main; sys.argv[0] = 'sushy-static'; sys.exit(main())";

fn sushy_present() -> bool {
    Command::new("python3")
        .args(["-c", "import sushy_tools.static.main"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The emulator, stopped when dropped, and its port.
struct Emulator {
    _process: KillOnDrop,
    port: u16,
}

/// CEEMS's Redfish bodies laid out as a mockup directory (`<path>/index.json`).
fn mockup(dir: &Path) {
    let src = fixtures().join("compat/fixtures/redfish");
    for (file, at) in [
        ("service_root.json", ""),
        ("chassis_collection.json", "Chassis"),
        ("chassis_1.json", "Chassis/Chassis-1"),
        ("chassis_2.json", "Chassis/Chassis-2"),
        ("chassis_1_power.json", "Chassis/Chassis-1/Power"),
        ("chassis_2_power.json", "Chassis/Chassis-2/Power"),
    ] {
        let d = dir.join(at);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(src.join(file), d.join("index.json")).unwrap();
    }
}

fn emulator(dir: &Path) -> Emulator {
    mockup(dir);
    let port = free_port();
    let child = Command::new("python3")
        .args(["-c", SUSHY_STATIC])
        .args(["-i", "127.0.0.1", "-p", &port.to_string(), "-m"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start sushy-static");
    let e = Emulator {
        _process: KillOnDrop(child),
        port,
    };
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(15) {
        if ureq::get(&format!("http://127.0.0.1:{port}/redfish/v1/"))
            .call()
            .is_ok()
        {
            return e;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("sushy-static did not answer on port {port}");
}

fn require(test: &str) -> bool {
    runnable(test, ensure_tools(sushy_present, &[], &["sushy-tools"]))
}

fn config(dir: &Path, port: u16, proxy: Option<&str>) -> std::path::PathBuf {
    let path = dir.join(format!("redfish-{}.yml", proxy.is_some()));
    let mut text = format!(
        "redfish_web_config:\n  protocol: http\n  hostname: 127.0.0.1\n  port: {port}\n  username: admin\n  password: secret\n  use_session_token: true\n"
    );
    if let Some(p) = proxy {
        text.push_str(&format!("  external_url: {p}\n"));
    }
    std::fs::write(&path, text).unwrap();
    path
}

const CHASSIS_1: &str =
    "ceems_redfish_power_current_watts{chassis=\"Chassis_1\",hostname=\"\"} 397\n";
const CHASSIS_2: &str = "ceems_redfish_power_avg_watts{chassis=\"Chassis_2\",hostname=\"\"} 1734\n";

#[test]
fn collector_reads_chassis_power_from_sushy_static() {
    if !require("collector_reads_chassis_power_from_sushy_static") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let emu = emulator(&tmp.path().join("mockup"));
    let cfg = WebConfig::load(&config(tmp.path(), emu.port, None)).unwrap();
    let c = RedfishCollector::new(&cfg, "node", "").unwrap();
    let mut set = MetricSet::new();
    c.collect(&mut set).unwrap();
    let mut text = String::new();
    set.encode_text(&mut text);
    assert!(text.contains(CHASSIS_1), "{text}");
    assert!(text.contains(CHASSIS_2), "{text}");
}

#[test]
fn exporter_reaches_sushy_static_through_the_proxy() {
    if !require("exporter_reaches_sushy_static_through_the_proxy") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let emu = emulator(&tmp.path().join("mockup"));
    let target = format!("--redfish.target=10.0.0.5=http://127.0.0.1:{}", emu.port);
    let proxy = start_subcommand("redfish-proxy", tmp.path(), &[&target], &[]);
    let flag = format!(
        "--collector.redfish.config.file={}",
        config(tmp.path(), emu.port, Some(&proxy.url(""))).display()
    );
    let exporter = start_exporter(
        tmp.path(),
        &[
            "--collector.disable-defaults",
            "--collector.redfish",
            &flag,
            "--collector.empty-hostname-label",
        ],
    );
    let text = exporter.get("/metrics");
    assert!(text.contains(CHASSIS_1), "{text}");
    assert!(text.contains(CHASSIS_2), "{text}");
    assert!(text.contains("ceems_scrape_collector_success{collector=\"redfish\"} 1\n"));
}
