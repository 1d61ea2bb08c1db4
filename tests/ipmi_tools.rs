//! The exporter reading the real IPMI tools' output: FreeIPMI's `ipmi-dcmi` and `ipmitool`
//! talk IPMI-over-LAN to a simulated BMC on 127.0.0.1 (`tests/tools/ipmi-dcmi-bmc.py`, on
//! pyghmi), so our parsers see what the tools really print, not captured text.
//! `ipmiutil` is left out: its LAN mode is fixed to UDP port 623 (see shared/notes/bmc.md).

mod common;

use std::net::UdpSocket;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{ensure_tools, parse_series, runnable, start_exporter, KillOnDrop};

/// A tool's full path: PATH, then the sbin directories (a CI PATH may lack /usr/sbin).
fn tool(name: &str) -> String {
    ceems::host::command::find_program(name, std::env::var_os("PATH").as_deref())
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| name.to_owned())
}

fn have(cmd: &str, arg: &str) -> bool {
    Command::new(tool(cmd))
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

fn tools_present() -> bool {
    have("ipmitool", "-V")
        && have("ipmi-dcmi", "--version")
        && Command::new("python3")
            .args(["-c", "import pyghmi"])
            .status()
            .is_ok_and(|s| s.success())
}

/// The simulated BMC, stopped when dropped, and its UDP port.
struct Bmc {
    _process: KillOnDrop,
    port: u16,
}

fn simulated_bmc() -> Bmc {
    let port = UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .expect("free UDP port");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/ipmi-dcmi-bmc.py");
    let child = Command::new("python3")
        .arg(script)
        .arg(port.to_string())
        .stdout(Stdio::null())
        .spawn()
        .expect("start simulated BMC");
    let bmc = Bmc {
        _process: KillOnDrop(child),
        port,
    };
    // Ready when ipmitool gets an answer.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        let ok = Command::new(tool("ipmitool"))
            .args(["-I", "lanplus", "-H", "127.0.0.1", "-p", &port.to_string()])
            .args(["-U", "admin", "-P", "password", "-N", "1", "-R", "1"])
            .args(["dcmi", "power", "reading"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return bmc;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("simulated BMC did not answer on UDP port {port}");
}

#[test]
fn real_ipmitool_and_ipmi_dcmi_output_is_read() {
    let tools = ensure_tools(tools_present, &["ipmitool", "freeipmi-tools"], &["pyghmi"]);
    if !runnable("real_ipmitool_and_ipmi_dcmi_output_is_read", tools) {
        return;
    }
    let bmc = simulated_bmc();
    let port = bmc.port;
    for cmd in [
        format!(
            "{} -I lanplus -H 127.0.0.1 -p {port} -U admin -P password dcmi power reading",
            tool("ipmitool")
        ),
        format!(
            "{} -h 127.0.0.1:{port} -u admin -p password --driver-type=LAN_2_0 --get-system-power-statistics",
            tool("ipmi-dcmi")
        ),
    ] {
        let flag = format!("--collector.ipmi.dcmi.cmd={cmd}");
        let exporter = start_exporter(
            Path::new("."),
            &[
                "--collector.disable-defaults",
                "--collector.ipmi",
                &flag,
                "--collector.empty-hostname-label",
            ],
        );
        let series = parse_series(&exporter.get("/metrics"));
        for (name, want) in [
            ("ceems_ipmi_dcmi_power_current_watts", 344.0),
            ("ceems_ipmi_dcmi_power_min_watts", 271.0),
            ("ceems_ipmi_dcmi_power_max_watts", 405.0),
            ("ceems_ipmi_dcmi_power_avg_watts", 319.0),
        ] {
            assert_eq!(
                series.get(&format!("{name}{{hostname=\"\"}}")),
                Some(&want),
                "{cmd}: {name}"
            );
        }
        assert_eq!(
            series.get("ceems_scrape_collector_success{collector=\"ipmi\"}"),
            Some(&1.0),
            "{cmd}"
        );
    }
}
