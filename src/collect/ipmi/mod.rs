//! `ipmi` (CEEMS v0.10's `ipmi_dcmi`): node power from the BMC's DCMI power reading, through
//! FreeIPMI's `ipmi-dcmi`, `ipmitool`, `ipmiutil`, Cray's `capmc`, or natively through
//! `/dev/ipmi0`; and, when asked, the BMC's sensors (CEEMS v0.16).

pub mod native;
pub mod parse;
pub mod sdr;
pub mod sensors;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::{CollectError, Collector, CollectorSpec, Context, MetricNames};
use crate::config::{Kind, Opt};
use crate::host::command;
use crate::metrics::{Labels, MetricSet};
use parse::{Format, PowerReading};
use sensors::{Selection, SensorSource};

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "ipmi",
    default_enabled: false,
    // /dev/ipmi0 is root's, mode 0600, for the tools and native mode alike.
    capabilities: &[caps::Capability::CAP_DAC_OVERRIDE],
    options,
    build,
    self_test: Some(|_, caps| crate::security::check::test_ipmi_device(DEVICES, caps)),
    sub_collectors: &[],
};

/// The tools in the order they are looked for, with the arguments that ask for a reading.
const TOOLS: &[(&str, &[&str])] = &[
    ("ipmi-dcmi", &["--get-system-power-statistics"]),
    ("ipmitool", &["dcmi", "power", "reading"]),
    ("ipmiutil", &["dcmi", "power"]),
    ("capmc", &["get_system_power", "-w", "600"]),
];

/// Where the OpenIPMI driver's device node may be, by distribution and udev rules.
pub const DEVICES: &[&str] = &["/dev/ipmi0", "/dev/ipmi/0", "/dev/ipmidev/0"];

fn options() -> Vec<Opt> {
    vec![
        Opt::new(
            "collector.ipmi.dcmi.cmd",
            Kind::Str,
            "IPMI command to run, e.g. `ipmi-dcmi --get-system-power-statistics`; a bare tool path gets that tool's usual arguments. Found on PATH when unset",
        )
        .key("collector.ipmi.cmd")
        .renamed_from("collector.ipmi_dcmi.cmd"),
        Opt::flag(
            "collector.ipmi.force-native-mode",
            "Read DCMI power from the OpenIPMI device (/dev/ipmi0) directly, with no external tool",
        )
        .renamed_from("collector.ipmi_dcmi.force-native-mode"),
        Opt::new(
            "collector.ipmi.cmd-timeout",
            Kind::Duration,
            "Longest time an IPMI command or native request may take before it is killed",
        )
        .default("5s")
        .renamed_from("collector.ipmi_dcmi.cmd-timeout"),
        Opt::new(
            "collector.ipmi.max-age",
            Kind::Duration,
            "When a reading fails, serve the last good one (with success 0) if it is at most this old",
        )
        .default("5m")
        .renamed_from("collector.ipmi_dcmi.max-age"),
        Opt::new(
            "collector.ipmi.device",
            Kind::Str,
            "OpenIPMI device for native mode (default: the first of /dev/ipmi0, /dev/ipmi/0, /dev/ipmidev/0)",
        )
        .hidden()
        .renamed_from("collector.ipmi_dcmi.device"),
        Opt::flag(
            "collector.ipmi.power-energy-sensor-readings",
            "Also export the BMC's power and energy sensors (those in watts or joules) as ceems_ipmi_sensor_reading_current",
        ),
        Opt::new(
            "collector.ipmi.sensor-id",
            Kind::List,
            "Also export the BMC sensor of this number (repeatable; 48 or 0x30), as `ipmitool sdr elist` lists them",
        ),
        Opt::new(
            "collector.ipmi.sensor.cmd",
            Kind::Str,
            "Command listing the BMC's sensors (default: `ipmitool ... sdr elist full` or `ipmi-sensors -v` beside the DCMI tool, with its arguments; the OpenIPMI device in native mode)",
        )
        .key("collector.ipmi.sensor-cmd"),
        Opt::new(
            "collector.ipmi.dev-num",
            Kind::Int,
            "Number of the OpenIPMI device for native mode: 0 is /dev/ipmi0",
        ),
        Opt::flag(
            "collector.ipmi.test-mode",
            "Skip the start-up probe (CEEMS's e2e test flag)",
        )
        .hidden()
        .renamed_from("collector.ipmi_dcmi.test-mode"),
    ]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Settings {
    #[serde(default)]
    cmd: Option<String>,
    force_native_mode: bool,
    #[serde(deserialize_with = "crate::config::de_duration")]
    cmd_timeout: Duration,
    #[serde(deserialize_with = "crate::config::de_duration")]
    max_age: Duration,
    #[serde(default)]
    device: Option<PathBuf>,
    test_mode: bool,
    power_energy_sensor_readings: bool,
    #[serde(default)]
    sensor_id: Vec<String>,
    #[serde(default)]
    sensor_cmd: Option<String>,
    #[serde(default)]
    dev_num: Option<u32>,
}

/// Where readings come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    Command {
        program: PathBuf,
        args: Vec<String>,
        format: Format,
    },
    /// The first of `devices` that exists at each reading: the modules may be loaded after
    /// the exporter starts.
    Native { devices: Vec<PathBuf> },
}

impl Source {
    /// A command line from the flag: words split on whitespace; a lone known tool gets its
    /// usual arguments.
    pub fn from_command_line(line: &str) -> Option<Source> {
        let mut words = line.split_whitespace().map(str::to_owned);
        let program = PathBuf::from(words.next()?);
        let mut args: Vec<String> = words.collect();
        let base = program
            .file_name()
            .map(|b| b.to_string_lossy().into_owned())
            .unwrap_or_default();
        if args.is_empty() {
            if let Some((_, defaults)) = TOOLS.iter().find(|(t, _)| *t == base) {
                args = defaults.iter().map(|s| (*s).to_owned()).collect();
            }
        }
        let format = if base == "capmc" {
            Format::CapmcJson
        } else {
            Format::Text
        };
        Some(Source::Command {
            program,
            args,
            format,
        })
    }

    /// The first tool found on `PATH`, else in the sbin directories, else the OpenIPMI device.
    /// `PATH` wins over sbin so that an operator's (or a test's) choice beats what the
    /// distribution installed.
    pub fn detect(path_var: Option<&std::ffi::OsStr>, devices: &[&Path]) -> Option<Source> {
        let sbin: Vec<PathBuf> = command::SBIN_DIRS.iter().map(PathBuf::from).collect();
        for dirs in [command::path_dirs(path_var), sbin] {
            for (tool, _) in TOOLS {
                if let Some(program) = command::find_in(tool, &dirs) {
                    return Source::from_command_line(&program.to_string_lossy());
                }
            }
        }
        devices.iter().find(|d| d.exists()).map(|d| Source::Native {
            devices: vec![d.to_path_buf()],
        })
    }
}

pub struct IpmiCollector {
    source: Source,
    timeout: Duration,
    max_age: Duration,
    labels: Labels,
    last_good: Mutex<Option<(Instant, PowerReading)>>,
    msgid: AtomicI64,
    /// Which generation's family names to export.
    pub names: MetricNames,
    hostname: String,
    /// The BMC's sensors, when asked for.
    pub sensors: Option<sensors::SensorPart>,
}

/// The families of the current, minimum, maximum and average readings, today's and v0.10's
/// (`--compat.metric-names=v0.10`), each with its help.
const POWER_NAMES: [(&str, &str, &str, &str); 4] = [
    (
        "ceems_ipmi_dcmi_power_current_watts",
        "Current power consumption reported by DCMI in watts",
        "ceems_ipmi_dcmi_current_watts",
        "Current Power consumption in watts",
    ),
    (
        "ceems_ipmi_dcmi_power_min_watts",
        "Minimum power consumption reported by DCMI in watts",
        "ceems_ipmi_dcmi_min_watts",
        "Minimum Power consumption in watts",
    ),
    (
        "ceems_ipmi_dcmi_power_max_watts",
        "Maximum power consumption reported by DCMI in watts",
        "ceems_ipmi_dcmi_max_watts",
        "Maximum Power consumption in watts",
    ),
    (
        "ceems_ipmi_dcmi_power_avg_watts",
        "Average power consumption reported by DCMI in watts",
        "ceems_ipmi_dcmi_avg_watts",
        "Average Power consumption in watts",
    ),
];

fn build(ctx: &Context) -> Result<Box<dyn Collector>, CollectError> {
    let s: Settings = ctx.settings()?;
    let numbered = s.dev_num.map(|n| PathBuf::from(format!("/dev/ipmi{n}")));
    let devices: Vec<&Path> = match s.device.as_ref().or(numbered.as_ref()) {
        Some(d) => vec![d.as_path()],
        None => DEVICES.iter().map(Path::new).collect(),
    };
    let source = if s.force_native_mode {
        Source::Native {
            devices: devices.iter().map(|d| d.to_path_buf()).collect(),
        }
    } else if let Some(line) = s.cmd.as_deref().filter(|l| !l.trim().is_empty()) {
        Source::from_command_line(line)
            .ok_or_else(|| CollectError::Other("empty --collector.ipmi.dcmi.cmd".into()))?
    } else {
        Source::detect(std::env::var_os("PATH").as_deref(), &devices).ok_or_else(|| {
            CollectError::Other(
                "no IPMI tool (ipmi-dcmi, ipmitool, ipmiutil, capmc) on PATH or in /sbin, /usr/sbin, /usr/local/sbin, and no OpenIPMI device; install one, set --collector.ipmi.dcmi.cmd, or disable the collector".into(),
            )
        })?
    };
    tracing::info!(collector = "ipmi", source = ?source, "reading DCMI power");
    let selection = Selection {
        power_energy: s.power_energy_sensor_readings,
        numbers: s
            .sensor_id
            .iter()
            .flat_map(|l| l.split(','))
            .filter(|n| !n.trim().is_empty())
            .map(sensors::parse_sensor_number)
            .collect::<Result<_, _>>()
            .map_err(CollectError::Other)?,
    };
    let sensor_source = match s.sensor_cmd.as_deref().filter(|l| !l.trim().is_empty()) {
        _ if selection.is_empty() => None,
        Some(line) => {
            let mut words = line.split_whitespace().map(str::to_owned);
            let program = PathBuf::from(words.next().unwrap_or_default());
            Some(SensorSource::Command { program, args: words.collect() })
        }
        None => Some(SensorSource::beside(&source).ok_or_else(|| {
            CollectError::Other(format!(
                "BMC sensors were asked for, but {source:?} lists none; set --collector.ipmi.sensor.cmd (e.g. `ipmitool sdr elist full`) or use --collector.ipmi.force-native-mode"
            ))
        })?),
    };
    let mut collector = IpmiCollector::new(source, s.cmd_timeout, s.max_age, &ctx.hostname);
    collector.names = ctx.names;
    if let Some(source) = sensor_source {
        tracing::info!(collector = "ipmi", source = ?source, selection = ?selection, "reading BMC sensors");
        collector.sensors = Some(sensors::SensorPart::new(source, selection));
    }
    if !s.test_mode {
        // A probe so that a broken set-up shows in the start-up log, not only as success 0.
        if let Err(e) = collector.read() {
            tracing::warn!(collector = "ipmi", error = %e, "first DCMI power reading failed");
        }
    }
    Ok(Box::new(collector))
}

/// Opens the first of `devices` that exists (the modules may be loaded after the exporter
/// starts), with the capability it needs.
fn open_device(devices: &[PathBuf]) -> Result<(native::OpenIpmiDevice, &PathBuf), String> {
    let Some(device) = devices.iter().find(|d| d.exists()) else {
        return Err(format!(
            "native mode: no OpenIPMI device at {}; load the ipmi_devintf and ipmi_si modules",
            devices
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    };
    let path = device.clone();
    let dev = crate::security::privileged(SPEC.capabilities, move || {
        native::OpenIpmiDevice::open(&path)
    })
    .map_err(|e| format!("cannot open {}: {e}", device.display()))?;
    Ok((dev, device))
}

impl IpmiCollector {
    pub fn new(source: Source, timeout: Duration, max_age: Duration, hostname: &str) -> Self {
        IpmiCollector {
            source,
            timeout,
            max_age,
            labels: Labels::new(&[("hostname", hostname)]),
            last_good: Mutex::new(None),
            msgid: AtomicI64::new(1),
            names: MetricNames::default(),
            hostname: hostname.to_owned(),
            sensors: None,
        }
    }

    fn read(&self) -> Result<PowerReading, String> {
        match &self.source {
            Source::Command {
                program,
                args,
                format,
            } => {
                // The tool gets the capability (ambient), not this process's threads.
                let out = crate::security::with_capabilities_for_child(SPEC.capabilities, || {
                    command::run(program, args, self.timeout)
                })
                .map_err(|e| e.to_string())?;
                parse::parse(*format, &out)
                    .map_err(|e| format!("cannot parse output of {}: {e}", program.display()))
            }
            Source::Native { devices } => {
                let (mut dev, device) = open_device(devices)?;
                let id = self.msgid.fetch_add(1, Ordering::Relaxed);
                native::read_power(&mut dev, id as std::os::raw::c_long, self.timeout)
                    .map_err(|e| format!("{}: {e}", device.display()))
            }
        }
    }

    fn emit(&self, out: &mut MetricSet, r: &PowerReading) {
        let values = [r.current, r.min, r.max, r.avg];
        for ((now, now_help, old, old_help), v) in POWER_NAMES.into_iter().zip(values) {
            if let Some(v) = v {
                let (name, help) = self.names.pick((now, now_help), (old, old_help));
                out.gauge(name, help, self.labels.clone(), v);
            }
        }
    }
}

impl Collector for IpmiCollector {
    fn collect(&self, out: &mut MetricSet) -> Result<(), CollectError> {
        let power = self.collect_power(out);
        let Some(sensors) = &self.sensors else {
            return power;
        };
        let devices = match &self.source {
            Source::Native { devices } => devices.as_slice(),
            Source::Command { .. } => &[],
        };
        let sensors = sensors.collect(
            out,
            &self.hostname,
            devices,
            self.timeout,
            self.max_age,
            &self.msgid,
        );
        // Either half failing leaves the other's series served, with success 0.
        match (power, sensors) {
            (Ok(()), Ok(())) => Ok(()),
            (Err(e), Ok(())) | (Ok(()), Err(e)) if out.len_samples() == 0 => Err(e),
            (Err(a), Err(b)) if out.len_samples() == 0 => {
                Err(CollectError::Other(format!("{a}; {b}")))
            }
            (power, sensors) => {
                let failed: Vec<String> = [power, sensors]
                    .into_iter()
                    .filter_map(|r| r.err().map(|e| e.to_string()))
                    .collect();
                Err(CollectError::Partial(failed.join("; ")))
            }
        }
    }
}

impl IpmiCollector {
    fn collect_power(&self, out: &mut MetricSet) -> Result<(), CollectError> {
        let result = self.read();
        let mut last = self.last_good.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(r) => {
                *last = Some((Instant::now(), r));
                self.emit(out, &r);
                Ok(())
            }
            Err(e) => match *last {
                Some((at, r)) if at.elapsed() <= self.max_age => {
                    self.emit(out, &r);
                    Err(CollectError::Stale(e))
                }
                _ => Err(CollectError::Other(e)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines() {
        assert_eq!(
            Source::from_command_line("/usr/sbin/ipmitool"),
            Some(Source::Command {
                program: "/usr/sbin/ipmitool".into(),
                args: vec!["dcmi".into(), "power".into(), "reading".into()],
                format: Format::Text,
            })
        );
        assert_eq!(
            Source::from_command_line("sudo /usr/sbin/ipmi-dcmi --get-system-power-statistics"),
            Some(Source::Command {
                program: "sudo".into(),
                args: vec![
                    "/usr/sbin/ipmi-dcmi".into(),
                    "--get-system-power-statistics".into()
                ],
                format: Format::Text,
            })
        );
        assert!(matches!(
            Source::from_command_line("/opt/cray/bin/capmc"),
            Some(Source::Command {
                format: Format::CapmcJson,
                ..
            })
        ));
        assert_eq!(Source::from_command_line("  "), None);
    }

    /// A stand-in tool whose output the test changes between scrapes.
    fn tool(dir: &Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("ipmi-dcmi");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    fn scrape(c: &IpmiCollector) -> (Result<(), CollectError>, String) {
        let mut set = MetricSet::new();
        let r = c.collect(&mut set);
        let mut s = String::new();
        set.encode_text(&mut s);
        (r, s)
    }

    #[test]
    fn a_failing_or_hung_bmc_serves_the_last_good_reading_until_it_is_too_old() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tool(tmp.path(), "echo 'Current Power : 300 Watts'");
        let source = Source::from_command_line(&p.to_string_lossy()).unwrap();
        let c = IpmiCollector::new(
            source,
            Duration::from_millis(300),
            Duration::from_millis(800),
            "",
        );
        let (r, text) = scrape(&c);
        assert!(r.is_ok());
        assert!(text.contains("ceems_ipmi_dcmi_power_current_watts{hostname=\"\"} 300\n"));

        tool(tmp.path(), "sleep 10");
        let start = Instant::now();
        let (r, text) = scrape(&c);
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "hung tool stalled"
        );
        assert!(matches!(r, Err(CollectError::Stale(_))), "{r:?}");
        assert!(text.contains("} 300\n"), "{text}");

        tool(tmp.path(), "echo garbage; exit 0");
        std::thread::sleep(Duration::from_millis(600));
        let (r, text) = scrape(&c);
        assert!(matches!(r, Err(CollectError::Other(_))), "{r:?}");
        assert!(text.is_empty(), "too old a reading was served: {text}");
    }

    #[test]
    fn detection_order_and_native_fallback() {
        let tmp = tempfile::tempdir().unwrap();
        let dev = tmp.path().join("ipmi0");
        std::fs::write(&dev, "").unwrap();
        let empty = tempfile::tempdir().unwrap();
        // No tool on this PATH; the sbin directories of this machine may hold one.
        let found = Source::detect(Some(empty.path().as_os_str()), &[dev.as_path()]);
        assert!(found.is_some());
        tool(tmp.path(), "true");
        assert!(matches!(
            Source::detect(Some(tmp.path().as_os_str()), &[dev.as_path()]),
            Some(Source::Command { program, .. }) if program == tmp.path().join("ipmi-dcmi")
        ));
    }
}
