//! The exporter reading the real IPMI tools' output: FreeIPMI's `ipmi-dcmi` and `ipmitool`
//! talk IPMI-over-LAN to a simulated BMC on 127.0.0.1 (`tests/tools/ipmi-dcmi-bmc.py`, on
//! pyghmi), so our parsers see what the tools really print, not captured text.
//! `ipmiutil` is left out: its LAN mode is fixed to UDP port 623 (see shared/notes/bmc.md).
//! The BMC's sensors: `ipmitool` and `ipmi-sensors` against Debian's `ipmi_sim` (OpenIPMI),
//! whose sensor repository the emulator file written here defines; the native path's
//! requests reach the same simulator through `ipmitool raw`.

mod common;

use std::collections::BTreeMap;
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

/// A BMC with a sensor repository: Debian's `ipmi_sim` (OpenIPMI), its sensors defined by
/// the emulator file written here, reached over IPMI-over-LAN on 127.0.0.1. Its console
/// port changes readings while it runs.
struct SensorBmc {
    _process: KillOnDrop,
    _dir: tempfile::TempDir,
    port: u16,
    console: u16,
}

/// (number, sensor type, unit code, M, result exponent, name, raw reading or none).
/// Thresholds (raw): critical above 90 and below 5. Absent Temp has a record and no sensor.
type SimSensor = (u8, u8, u8, i16, i8, &'static str, Option<u8>);
const SENSORS: &[SimSensor] = &[
    (0x30, 0x01, 1, 1, 0, "CPU Temp", Some(45)),
    (0x31, 0x04, 18, 50, 0, "FAN1", Some(96)),
    (0x32, 0x02, 4, 2, -2, "12V", Some(61)),
    (0x33, 0x08, 6, 4, 0, "PSU1 Power", Some(80)),
    (0x34, 0x01, 1, 1, 0, "Absent Temp", None),
];

/// A full sensor record (IPMI v2.0 table 43-1) of a threshold sensor owned by the BMC.
fn full_sdr(id: u16, (number, kind, unit, m, r_exp, name, _): SimSensor) -> Vec<u8> {
    let m = m as u16 & 0x3ff;
    let mut body = vec![0x20, 0x00, number, 0x03, 0x01, 0x7f, 0x68, kind, 0x01];
    body.extend([0x95, 0x7a, 0x95, 0x7a, 0x3f, 0x3f]);
    body.extend([0x00, unit, 0x00, 0x00]);
    body.extend([
        (m & 0xff) as u8,
        ((m >> 8) as u8) << 6,
        0,
        0,
        0,
        ((r_exp as u8) & 0xf) << 4,
    ]);
    body.extend([0, 0, 0, 0, 0xff, 0]);
    // Thresholds, upper non-recoverable first; then hysteresis, reserved, OEM.
    body.extend([95, 90, 85, 0, 5, 10, 0, 0, 0, 0, 0]);
    body.push(0xc0 | name.len() as u8);
    body.extend(name.as_bytes());
    let mut record = vec![
        (id & 0xff) as u8,
        (id >> 8) as u8,
        0x51,
        0x01,
        body.len() as u8,
    ];
    record.extend(body);
    record
}

fn free_port(udp: bool) -> u16 {
    if udp {
        UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .map(|a| a.port())
    } else {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .map(|a| a.port())
    }
    .expect("free port")
}

impl SensorBmc {
    fn start() -> SensorBmc {
        let dir = tempfile::tempdir().unwrap();
        let (port, console) = (free_port(true), free_port(false));
        let lan = format!(
            "name \"ceemstest\"\nset_working_mc 0x20\n  startlan 1\n    addr 127.0.0.1 {port}\n    priv_limit admin\n    allowed_auths_admin none md2 md5 straight\n    guid a123456789abcdefa123456789abcdef\n  endlan\n  console 127.0.0.1 {console}\n  user 2 true \"admin\" \"password\" admin 10 none md2 md5 straight\n"
        );
        let mut emu = String::from(
            "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\n",
        );
        for (i, sensor) in SENSORS.iter().enumerate() {
            let bytes: Vec<String> = full_sdr(i as u16 + 1, *sensor)
                .iter()
                .map(|b| format!("{b:#04x}"))
                .collect();
            emu.push_str(&format!("main_sdr_add 0x20 {}\n", bytes.join(" ")));
            if let (number, kind, .., Some(raw)) = *sensor {
                emu.push_str(&format!(
                    "sensor_add 0x20 0 {number:#04x} {kind:#04x} 0x01\n"
                ));
                emu.push_str(&format!("sensor_set_value 0x20 0 {number:#04x} {raw} 0\n"));
            }
        }
        emu.push_str("mc_enable 0x20\n");
        std::fs::write(dir.path().join("lan.conf"), lan).unwrap();
        std::fs::write(dir.path().join("sim.emu"), emu).unwrap();
        std::fs::create_dir(dir.path().join("state")).unwrap();
        let child = Command::new(tool("ipmi_sim"))
            .current_dir(dir.path())
            .args(["-c", "lan.conf", "-f", "sim.emu", "-s", "state", "-n"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ipmi_sim");
        let bmc = SensorBmc {
            _process: KillOnDrop(child),
            _dir: dir,
            port,
            console,
        };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if bmc.ipmitool(&["sdr", "elist", "full"]).is_ok() {
                return bmc;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("ipmi_sim did not answer on UDP port {port}");
    }

    /// ipmitool's connection arguments for this BMC (ipmi_sim wants cipher suite 3).
    fn ipmitool_line(&self) -> String {
        format!(
            "{} -I lanplus -C 3 -H 127.0.0.1 -p {} -U admin -P password -N 1 -R 2",
            tool("ipmitool"),
            self.port
        )
    }

    fn ipmitool(&self, args: &[&str]) -> Result<String, String> {
        let line = self.ipmitool_line();
        let mut words = line.split(' ');
        let out = Command::new(words.next().unwrap())
            .args(words)
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// `ipmitool sensor`'s reading and status of each sensor, read here without our parser.
    fn ipmitool_sensor(&self) -> BTreeMap<String, (String, String)> {
        self.ipmitool(&["sensor"])
            .expect("ipmitool sensor")
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split('|').map(str::trim).collect();
                (f.len() == 10).then(|| (f[0].to_owned(), (f[1].to_owned(), f[3].to_owned())))
            })
            .collect()
    }

    /// Changes a sensor's raw reading through the simulator's console.
    fn set(&self, number: u8, raw: u8) {
        use std::io::Write;
        let mut console =
            std::net::TcpStream::connect(("127.0.0.1", self.console)).expect("console");
        writeln!(console, "sensor_set_value 0x20 0 {number:#04x} {raw} 0").unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn sensor_tools_present() -> bool {
    have("ipmitool", "-V") && have("ipmi-sensors", "--version") && have("ipmi_sim", "--version")
}

/// The exported sensor readings: (name, unit) → value.
fn sensor_series(metrics: &str) -> BTreeMap<(String, String), f64> {
    parse_series(metrics)
        .into_iter()
        .filter_map(|(series, v)| {
            let labels = series.strip_prefix("ceems_ipmi_sensor_reading_current{")?;
            let label = |key: &str| {
                let start = labels.find(&format!("{key}=\""))? + key.len() + 2;
                Some(labels[start..].split('"').next()?.to_owned())
            };
            Some(((label("sensorname")?, label("sensorunits")?), v))
        })
        .collect()
}

#[test]
fn bmc_sensors_through_the_real_tools() {
    let tools = ensure_tools(
        sensor_tools_present,
        &["openipmi", "ipmitool", "freeipmi-tools"],
        &[],
    );
    if !runnable("bmc_sensors_through_the_real_tools", tools) {
        return;
    }
    let bmc = SensorBmc::start();
    // DCMI power is not under test here (ipmi_sim has none): a stand-in prints a reading.
    let dir = tempfile::tempdir().unwrap();
    let dcmi = dir.path().join("ipmi-dcmi");
    std::fs::write(&dcmi, "#!/bin/sh\necho 'Current Power : 300 Watts'\n").unwrap();
    std::fs::set_permissions(&dcmi, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let dcmi_flag = format!("--collector.ipmi.dcmi.cmd={}", dcmi.display());
    let freeipmi = format!(
        "{} -h 127.0.0.1:{} -u admin -p password --driver-type=LAN_2_0 -W opensesspriv -v --quiet-cache",
        tool("ipmi-sensors"),
        bmc.port
    );
    let want = |temp: f64| {
        BTreeMap::from([
            (("CPU Temp".to_owned(), "C".to_owned()), temp),
            (("FAN1".to_owned(), "RPM".to_owned()), 4800.0),
            (("12V".to_owned(), "V".to_owned()), 1.22),
            (("PSU1 Power".to_owned(), "W".to_owned()), 320.0),
        ])
    };
    let numbered = [
        "--collector.ipmi.power-energy-sensor-readings",
        "--collector.ipmi.sensor-id=0x30",
        "--collector.ipmi.sensor-id=49,50,52",
    ];
    for (listing, flags, expected) in [
        (
            format!("{} sdr elist full", bmc.ipmitool_line()),
            &numbered[..],
            want(45.0),
        ),
        (freeipmi.clone(), &numbered[..], want(45.0)),
        (
            format!("{} sensor", bmc.ipmitool_line()),
            &numbered[..1],
            BTreeMap::from([(("PSU1 Power".to_owned(), "W".to_owned()), 320.0)]),
        ),
    ] {
        let sensor_flag = format!("--collector.ipmi.sensor.cmd={listing}");
        let mut args = vec![
            "--collector.disable-defaults",
            "--collector.ipmi",
            &dcmi_flag,
            &sensor_flag,
        ];
        args.extend(flags);
        args.push("--collector.empty-hostname-label");
        let exporter = start_exporter(Path::new("."), &args);
        let metrics = exporter.get("/metrics");
        assert_eq!(sensor_series(&metrics), expected, "{listing}");
        // Every value is what the real `ipmitool sensor` prints; the absent sensor has none.
        let ipmitool = bmc.ipmitool_sensor();
        for ((name, _), value) in sensor_series(&metrics) {
            let printed: f64 = ipmitool[&name].0.parse().unwrap();
            assert!(
                (printed - value).abs() < 1e-9,
                "{name}: {printed} vs {value}"
            );
        }
        assert_eq!(ipmitool["Absent Temp"].0, "na");
        assert_eq!(
            parse_series(&metrics).get("ceems_scrape_collector_success{collector=\"ipmi\"}"),
            Some(&1.0),
            "{listing}: {metrics}"
        );
    }

    // The CPU goes critical: the simulated BMC says so, and the next scrape reads it.
    let sensor_flag = format!("--collector.ipmi.sensor.cmd={freeipmi}");
    let exporter = start_exporter(
        Path::new("."),
        &[
            "--collector.disable-defaults",
            "--collector.ipmi",
            &dcmi_flag,
            &sensor_flag,
            "--collector.ipmi.sensor-id=48",
            "--collector.empty-hostname-label",
        ],
    );
    bmc.set(0x30, 92);
    assert_eq!(bmc.ipmitool_sensor()["CPU Temp"].1, "cr");
    let metrics = exporter.get("/metrics");
    assert_eq!(
        sensor_series(&metrics).get(&("CPU Temp".to_owned(), "C".to_owned())),
        Some(&92.0),
        "{metrics}"
    );
    bmc.set(0x30, 45);

    // With no listing command, the sensors come from beside the DCMI tool, with its
    // connection. ipmi_sim has no DCMI: the sensors are still served, the failure is loud.
    let dcmi_flag = format!(
        "--collector.ipmi.dcmi.cmd={} dcmi power reading",
        bmc.ipmitool_line()
    );
    let exporter = start_exporter(
        Path::new("."),
        &[
            "--collector.disable-defaults",
            "--collector.ipmi",
            &dcmi_flag,
            "--collector.ipmi.power-energy-sensor-readings",
            "--collector.empty-hostname-label",
        ],
    );
    let metrics = exporter.get("/metrics");
    assert_eq!(
        sensor_series(&metrics),
        BTreeMap::from([(("PSU1 Power".to_owned(), "W".to_owned()), 320.0)]),
        "{metrics}"
    );
    assert_eq!(
        parse_series(&metrics).get("ceems_scrape_collector_success{collector=\"ipmi\"}"),
        Some(&0.0)
    );
    assert!(
        !metrics.contains("ceems_ipmi_dcmi_power_current_watts"),
        "{metrics}"
    );
}

/// The native path (the requests `/dev/ipmi0` would carry), sent to the simulated BMC
/// through `ipmitool raw`, reads what ipmitool itself reads.
#[test]
fn native_sensor_requests_read_what_ipmitool_reads() {
    use ceems::collect::ipmi::native::FnDriver;
    use ceems::collect::ipmi::sdr::Session;
    use ceems::collect::ipmi::sensors::{Selection, SensorPart, SensorSource};

    let tools = ensure_tools(
        sensor_tools_present,
        &["openipmi", "ipmitool", "freeipmi-tools"],
        &[],
    );
    if !runnable("native_sensor_requests_read_what_ipmitool_reads", tools) {
        return;
    }
    let bmc = SensorBmc::start();
    let mut requests = 0;
    let mut driver = FnDriver::new(|netfn, cmd, data| {
        requests += 1;
        let mut args = vec![format!("{netfn:#04x}"), format!("{cmd:#04x}")];
        args.extend(data.iter().map(|b| format!("{b:#04x}")));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut raw = vec!["raw"];
        raw.extend(args);
        match bmc.ipmitool(&raw) {
            Ok(out) => {
                let mut answer = vec![0u8];
                answer.extend(
                    out.split_whitespace()
                        .map(|h| u8::from_str_radix(h, 16).expect("hex")),
                );
                answer
            }
            // "Unable to send RAW command (... rsp=0xcb): ..." → the completion code.
            Err(err) => {
                let code = err
                    .split("rsp=0x")
                    .nth(1)
                    .and_then(|r| u8::from_str_radix(&r[..2], 16).ok());
                vec![code.unwrap_or(0xff)]
            }
        }
    });
    let part = SensorPart::new(
        SensorSource::Native,
        Selection {
            power_energy: false,
            numbers: vec![0x30, 0x31, 0x32, 0x33, 0x34],
        },
    );
    let mut session = Session {
        driver: &mut driver,
        msgid: 0,
        timeout: Duration::from_secs(5),
    };
    let readings = part.native_readings(&mut session).expect("native readings");
    let ipmitool = bmc.ipmitool_sensor();
    let got: Vec<(String, String, Option<String>)> = readings
        .iter()
        .map(|r| {
            (
                r.name.clone(),
                r.unit.clone(),
                r.value.map(|v| format!("{v:.3}")),
            )
        })
        .collect();
    let want: Vec<(String, String, Option<String>)> = [
        ("CPU Temp", "C"),
        ("FAN1", "RPM"),
        ("12V", "V"),
        ("PSU1 Power", "W"),
        ("Absent Temp", "C"),
    ]
    .iter()
    .map(|(name, unit)| {
        let printed = &ipmitool[*name].0;
        (
            name.to_string(),
            unit.to_string(),
            (printed != "na").then(|| printed.clone()),
        )
    })
    .collect();
    assert_eq!(got, want);
    assert!(
        requests > 10,
        "the repository was read record by record ({requests} requests)"
    );
}
