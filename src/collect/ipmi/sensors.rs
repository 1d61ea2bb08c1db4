//! The BMC's sensors (CEEMS v0.16's `ceems_ipmi_sensor_reading_current`): which to read
//! (by unit, or by sensor number), where from (a tool's sensor listing, or natively), and
//! the parsers of the listings of `ipmitool` and FreeIPMI's `ipmi-sensors`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::native::NativeError;
use super::parse::Format;
use super::sdr::{SensorRecord, Session};
use super::Source;
use crate::collect::CollectError;
use crate::host::{command, ParseError};
use crate::metrics::{Labels, MetricSet};

/// One sensor's reading; `value` is `None` when the BMC has none (absent, not scanning).
#[derive(Debug, Clone, PartialEq)]
pub struct SensorReading {
    pub name: String,
    /// The sensor number, where the listing gives it.
    pub number: Option<u8>,
    /// CEEMS's symbol for the unit (`C`, `V`, `RPM`, `W`...).
    pub unit: String,
    pub value: Option<f64>,
}

/// CEEMS's symbols of the IPMI base units (§43.17), by code.
const UNIT_SYMBOLS: [&str; 93] = [
    "Unspecified/Unused",
    "C",
    "F",
    "K",
    "V",
    "A",
    "W",
    "J",
    "C",
    "VA",
    "nt",
    "lm",
    "lx",
    "cd",
    "kPa",
    "psi",
    "nt",
    "CFM",
    "RPM",
    "Hz",
    "μs",
    "ms",
    "s",
    "min",
    "hr",
    "d",
    "w",
    "mil",
    "in",
    "ft",
    "in³",
    "ft³",
    "mm",
    "cm",
    "m",
    "cm³",
    "m³",
    "l",
    "fl oz",
    "rad",
    "sr",
    "rev",
    "Hz",
    "g",
    "oz",
    "lb",
    "ft-lb",
    "oz-in",
    "G",
    "Gb",
    "H",
    "mH",
    "F",
    "μF",
    "Ω",
    "Ω⁻¹",
    "mol",
    "Bq",
    "ppm",
    "Unknown",
    "dB",
    "dBA",
    "dBC",
    "Gy",
    "Sv",
    "ColorK",
    "b",
    "Kb",
    "Mb",
    "Gb",
    "B",
    "KB",
    "MB",
    "GB",
    "word",
    "dword",
    "qword",
    "memory line",
    "hit",
    "miss",
    "retry",
    "reset",
    "overflow",
    "underrun",
    "collision",
    "pkt",
    "msg",
    "char",
    "err",
    "correctable err",
    "uncorrectable err",
    "fatal",
    "g",
];

/// The `sensorunits` label of a unit code.
pub fn unit_symbol(code: u8) -> &'static str {
    UNIT_SYMBOLS
        .get(usize::from(code))
        .copied()
        .unwrap_or("Unknown")
}

/// The `sensorunits` label of a unit as a tool prints it (`degrees C`, `Volts`, FreeIPMI's
/// `C`, `V`): the same symbol as the native path gives; a unit not known is kept as printed.
pub fn tool_unit(printed: &str) -> String {
    let symbol = match printed.trim().to_ascii_lowercase().as_str() {
        "" | "unspecified" => "Unspecified/Unused",
        "degrees c" | "c" => "C",
        "degrees f" | "f" => "F",
        "degrees k" | "k" => "K",
        "volts" | "v" => "V",
        "amps" | "a" => "A",
        "watts" | "w" => "W",
        "joules" | "j" => "J",
        "va" => "VA",
        "kpa" => "kPa",
        "psi" => "psi",
        "cfm" => "CFM",
        "rpm" => "RPM",
        "hz" => "Hz",
        _ => return printed.trim().to_owned(),
    };
    symbol.to_owned()
}

/// What the tools print for a sensor without a reading.
fn no_reading(value: &str) -> bool {
    matches!(
        value.to_ascii_lowercase().as_str(),
        "na" | "n/a" | "no reading" | "disabled" | "not readable" | "event-only"
    )
}

/// A listing's sensors, and its lines that could not be read.
#[derive(Debug, Default)]
pub struct Listing {
    pub readings: Vec<SensorReading>,
    pub errors: Vec<ParseError>,
}

/// Reads the sensor listing of `ipmitool sensor`, `ipmitool sdr [e]list`, `ipmi-sensors`
/// or `ipmi-sensors -v`, told apart by their shape. Discrete sensors (states, not numbers)
/// are left out; a line of none of these shapes is an error naming it, and the others are
/// still read.
pub fn parse_listing(output: &str) -> Listing {
    if output.lines().any(|l| l.starts_with("Record ID:")) {
        return freeipmi_verbose(output);
    }
    let mut listing = Listing::default();
    for (i, line) in output.lines().enumerate() {
        if !line.contains('|') {
            // Tools' chatter ("Caching SDR repository ...") and blank lines.
            continue;
        }
        let fields: Vec<&str> = line.split('|').map(str::trim).collect();
        match read_line(&fields) {
            Ok(Some(r)) => listing.readings.push(r),
            Ok(None) => {}
            Err(message) => listing.errors.push(ParseError::new(i + 1, message)),
        }
    }
    listing
}

fn number_of(value: &str, line_kind: &str) -> Result<Option<f64>, String> {
    if no_reading(value) {
        return Ok(None);
    }
    value
        .parse::<f64>()
        .map(Some)
        .map_err(|_| format!("{line_kind}: reading `{value}` is not a number"))
}

/// One `|`-separated line of ipmitool or ipmi-sensors.
fn read_line(fields: &[&str]) -> Result<Option<SensorReading>, String> {
    let reading = |name: &str, number, unit: &str, value| SensorReading {
        name: name.to_owned(),
        number,
        unit: tool_unit(unit),
        value,
    };
    match fields {
        // ipmitool sensor: name, value, unit, status, six thresholds.
        [name, value, unit, _status, _, _, _, _, _, _] => {
            if unit.eq_ignore_ascii_case("discrete") {
                return Ok(None);
            }
            let value = number_of(value, "ipmitool sensor")?;
            Ok(Some(reading(name, None, unit, value)))
        }
        // ipmi-sensors: its header, then record id, name, type, reading, units, event.
        ["ID", "Name", ..] => Ok(None),
        [id, name, _type, value, unit, _event] if id.parse::<u16>().is_ok() => {
            if unit.eq_ignore_ascii_case("N/A") && no_reading(value) {
                return Ok(None);
            }
            let value = number_of(value, "ipmi-sensors")?;
            Ok(Some(reading(name, None, unit, value)))
        }
        // ipmitool sdr elist: name, number in hex with an `h`, status, entity, reading.
        [name, number, _status, _entity, value] if number.ends_with('h') => {
            let hex = number.trim_end_matches('h');
            let number = u8::from_str_radix(hex, 16)
                .map_err(|_| format!("ipmitool sdr elist: sensor number `{number}`"))?;
            Ok(sdr_reading(value).map(|(v, unit)| reading(name, Some(number), unit, v)))
        }
        // ipmitool sdr list: name, reading, status.
        [name, value, _status] => {
            Ok(sdr_reading(value).map(|(v, unit)| reading(name, None, unit, v)))
        }
        _ => Err(format!(
            "{} fields, not a sensor line of ipmitool or ipmi-sensors",
            fields.len()
        )),
    }
}

/// `45 degrees C` → (45, `degrees C`); `No Reading` → no value; a discrete state → `None`.
fn sdr_reading(value: &str) -> Option<(Option<f64>, &str)> {
    if no_reading(value) {
        return Some((None, ""));
    }
    let (number, unit) = value.split_once(' ').unwrap_or((value, ""));
    let number = number.parse::<f64>().ok()?;
    // `0x00` and state words are discrete sensors; a number with no unit is one too.
    (!unit.is_empty()).then_some((Some(number), unit.trim()))
}

/// `ipmi-sensors -v`: blocks of `Key: value` lines, one per record.
fn freeipmi_verbose(output: &str) -> Listing {
    let mut listing = Listing::default();
    let mut block: Vec<(usize, &str, &str)> = Vec::new();
    let flush = |block: &mut Vec<(usize, &str, &str)>, listing: &mut Listing| {
        let get = |key: &str| block.iter().find(|(_, k, _)| *k == key);
        // A sensor the BMC cannot read ends its block before its thresholds and reading; a
        // discrete one has an event and no reading.
        let unread = (0, "Sensor Reading", "N/A");
        let reading = match get("Sensor Event") {
            None => get("Sensor Reading").or(Some(&unread)),
            Some(_) => get("Sensor Reading"),
        };
        if let (Some((_, _, name)), Some((line, _, reading))) = (get("ID String"), reading) {
            let number = get("Sensor Number").and_then(|(_, _, n)| n.parse::<u8>().ok());
            let (value, unit) = reading.split_once(' ').unwrap_or((reading, ""));
            match number_of(value, "ipmi-sensors -v") {
                Ok(value) => listing.readings.push(SensorReading {
                    name: (*name).to_owned(),
                    number,
                    unit: tool_unit(unit),
                    value,
                }),
                Err(e) => listing.errors.push(ParseError::new(*line, e)),
            }
        }
        block.clear();
    };
    for (i, line) in output.lines().enumerate() {
        match line.split_once(": ") {
            Some((key, value)) => block.push((i + 1, key.trim(), value.trim())),
            None if line.trim().is_empty() => flush(&mut block, &mut listing),
            None => {}
        }
    }
    flush(&mut block, &mut listing);
    listing
}

/// Which sensors are exported (CEEMS's two flags).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selection {
    /// `--collector.ipmi.power-energy-sensor-readings`: every sensor in watts or joules.
    pub power_energy: bool,
    /// `--collector.ipmi.sensor-id`: these sensor numbers.
    pub numbers: Vec<u8>,
}

impl Selection {
    pub fn is_empty(&self) -> bool {
        !self.power_energy && self.numbers.is_empty()
    }

    pub fn wants(&self, unit: &str, number: Option<u8>) -> bool {
        (self.power_energy && (unit == "W" || unit == "J"))
            || number.is_some_and(|n| self.numbers.contains(&n))
    }

    /// The wanted readings, each name and unit once. An error where numbers are asked for
    /// and the listing gives none.
    pub fn pick(&self, readings: Vec<SensorReading>) -> Result<Vec<SensorReading>, String> {
        if !self.numbers.is_empty() && readings.iter().any(|r| r.number.is_none()) {
            return Err("this sensor listing gives no sensor numbers, so --collector.ipmi.sensor-id selects nothing; list with `ipmitool sdr elist full` or `ipmi-sensors -v`".into());
        }
        let mut seen = std::collections::HashSet::new();
        Ok(readings
            .into_iter()
            .filter(|r| self.wants(&r.unit, r.number))
            .filter(|r| seen.insert((r.name.clone(), r.unit.clone())))
            .collect())
    }
}

/// `12`, `0x30`: a sensor number as the flag takes it (kingpin's base-0 parse).
pub fn parse_sensor_number(s: &str) -> Result<u8, String> {
    let s = s.trim();
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u8::from_str_radix(hex, 16),
        None => s.parse::<u8>(),
    };
    parsed.map_err(|_| format!("--collector.ipmi.sensor-id: `{s}` is not a sensor number (0-255)"))
}

/// Where sensor readings come from.
#[derive(Debug, Clone, PartialEq)]
pub enum SensorSource {
    Command {
        program: PathBuf,
        args: Vec<String>,
    },
    /// The same OpenIPMI device as the DCMI reading.
    Native,
}

impl SensorSource {
    /// The listing command of the tool that reads DCMI power, with the same connection
    /// arguments (`-I lanplus -H ...`): `ipmitool ... sdr elist full`, or `ipmi-sensors`
    /// beside `ipmi-dcmi`. `None` for tools with no such listing (ipmiutil, capmc).
    pub fn beside(dcmi: &Source) -> Option<SensorSource> {
        let Source::Command {
            program,
            args,
            format: Format::Text,
        } = dcmi
        else {
            return matches!(dcmi, Source::Native { .. }).then_some(SensorSource::Native);
        };
        let base = program.file_name()?.to_str()?;
        match base {
            "ipmitool" => {
                let connection = args.iter().take_while(|a| *a != "dcmi").cloned();
                Some(SensorSource::Command {
                    program: program.clone(),
                    args: connection
                        .chain(["sdr", "elist", "full"].map(str::to_owned))
                        .collect(),
                })
            }
            "ipmi-dcmi" => {
                let program = program.with_file_name("ipmi-sensors");
                let connection = args
                    .iter()
                    .filter(|a| *a != "--get-system-power-statistics")
                    .cloned();
                Some(SensorSource::Command {
                    program,
                    args: connection
                        .chain(["-v", "--quiet-cache"].map(str::to_owned))
                        .collect(),
                })
            }
            _ => None,
        }
    }
}

/// The sensor half of the collector: where readings come from, which are exported, the
/// native path's records (read from the repository once), and the last good readings.
pub struct SensorPart {
    pub source: SensorSource,
    pub selection: Selection,
    records: Mutex<Option<Vec<SensorRecord>>>,
    last_good: Mutex<Option<(Instant, Vec<SensorReading>)>>,
}

/// What one read of the sensors gave: the wanted readings and the lines not understood.
type Read = (Vec<SensorReading>, Vec<ParseError>);

impl SensorPart {
    pub fn new(source: SensorSource, selection: Selection) -> SensorPart {
        SensorPart {
            source,
            selection,
            records: Mutex::new(None),
            last_good: Mutex::new(None),
        }
    }

    fn read(
        &self,
        devices: &[PathBuf],
        timeout: Duration,
        msgid: &AtomicI64,
    ) -> Result<Read, String> {
        match &self.source {
            SensorSource::Command { program, args } => {
                let out =
                    crate::security::with_capabilities_for_child(super::SPEC.capabilities, || {
                        command::run(program, args, timeout)
                    });
                let listing = match out {
                    Ok(out) => parse_listing(&out),
                    Err(e) => {
                        // ipmi-sensors lists every sensor and exits 1 when one could not be
                        // read: what it listed is used.
                        let listed = match &e {
                            command::CommandError::Failed { stdout, .. } => parse_listing(stdout),
                            _ => Listing::default(),
                        };
                        if listed.readings.is_empty() {
                            return Err(e.to_string());
                        }
                        listed
                    }
                };
                let errors = listing
                    .errors
                    .into_iter()
                    .map(|e| {
                        ParseError::new(e.line, format!("{}: {}", program.display(), e.message))
                    })
                    .collect();
                Ok((self.selection.pick(listing.readings)?, errors))
            }
            SensorSource::Native => {
                let (mut dev, device) = super::open_device(devices)?;
                let first = msgid.fetch_add(1, Ordering::Relaxed);
                let mut session = Session {
                    driver: &mut dev,
                    msgid: first as std::os::raw::c_long,
                    timeout,
                };
                let readings = self
                    .native_readings(&mut session)
                    .map_err(|e| format!("{}: {e}", device.display()))?;
                Ok((readings, Vec::new()))
            }
        }
    }

    /// The wanted sensors' readings through `session`; the repository is read on first use.
    pub fn native_readings(
        &self,
        session: &mut Session,
    ) -> Result<Vec<SensorReading>, NativeError> {
        let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        if records.is_none() {
            let wanted: Vec<SensorRecord> = session
                .sensor_records()?
                .into_iter()
                .filter(|r| {
                    r.readable() && self.selection.wants(unit_symbol(r.unit), Some(r.number))
                })
                .collect();
            let names: Vec<&str> = wanted.iter().map(|r| r.name.as_str()).collect();
            tracing::info!(collector = "ipmi", sensors = ?names, "BMC sensors to read");
            *records = Some(wanted);
        }
        let readings = session.readings(records.as_deref().unwrap_or_default())?;
        self.selection
            .pick(readings)
            .map_err(NativeError::Malformed)
    }

    /// Exports the readings (the last good ones, with an error, when a read fails and they
    /// are at most `max_age` old).
    pub fn collect(
        &self,
        out: &mut MetricSet,
        hostname: &str,
        devices: &[PathBuf],
        timeout: Duration,
        max_age: Duration,
        msgid: &AtomicI64,
    ) -> Result<(), CollectError> {
        let emit = |out: &mut MetricSet, readings: &[SensorReading]| {
            for r in readings {
                if let Some(v) = r.value {
                    let labels = Labels::new(&[
                        ("hostname", hostname),
                        ("sensorname", &r.name),
                        ("sensorunits", &r.unit),
                    ]);
                    out.gauge(SENSOR_FAMILY, SENSOR_HELP, labels, v);
                }
            }
        };
        let result = self.read(devices, timeout, msgid);
        let mut last = self.last_good.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok((readings, errors)) => {
                emit(out, &readings);
                *last = Some((Instant::now(), readings));
                match errors.first() {
                    None => Ok(()),
                    Some(e) => Err(CollectError::Partial(format!(
                        "sensor listing, line {}: {} ({} line(s) not read, the others exported)",
                        e.line,
                        e.message,
                        errors.len()
                    ))),
                }
            }
            Err(e) => match &*last {
                Some((at, readings)) if at.elapsed() <= max_age => {
                    emit(out, readings);
                    Err(CollectError::Stale(format!("sensors: {e}")))
                }
                _ => Err(CollectError::Other(format!("sensors: {e}"))),
            },
        }
    }
}

/// CEEMS's family of sensor readings, with its help.
pub const SENSOR_FAMILY: &str = "ceems_ipmi_sensor_reading_current";
const SENSOR_HELP: &str = "Current reading of IPMI sensor";

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn fixture(name: &str) -> String {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ipmi");
        std::fs::read_to_string(root.join(name)).unwrap()
    }

    fn values(listing: &Listing) -> Vec<(&str, Option<u8>, &str, Option<f64>)> {
        listing
            .readings
            .iter()
            .map(|r| (r.name.as_str(), r.number, r.unit.as_str(), r.value))
            .collect()
    }

    #[test]
    fn the_four_listings_give_the_same_sensors() {
        let with_numbers = [
            ("CPU Temp", Some(0x30), "C", Some(45.0)),
            ("FAN1", Some(0x31), "RPM", Some(4800.0)),
            ("12V", Some(0x32), "V", Some(1.22)),
            ("PSU1 Power", Some(0x33), "W", Some(320.0)),
        ];
        for file in ["ipmitool-sdr-elist-full.txt", "ipmi-sensors-v.txt"] {
            let listing = parse_listing(&fixture(file));
            assert!(listing.errors.is_empty(), "{file}: {:?}", listing.errors);
            let got = values(&listing);
            assert_eq!(got[..4], with_numbers, "{file}");
            assert_eq!(got[4].0, "Absent Temp", "{file}");
            assert_eq!(got[4].3, None, "{file}");
        }
        for file in ["ipmitool-sensor.txt", "ipmi-sensors.txt"] {
            let listing = parse_listing(&fixture(file));
            assert!(listing.errors.is_empty(), "{file}: {:?}", listing.errors);
            let got: Vec<_> = values(&listing)
                .into_iter()
                .map(|(n, _, u, v)| (n, u, v))
                .collect();
            let want: Vec<_> = with_numbers
                .iter()
                .map(|(n, _, u, v)| (*n, *u, *v))
                .collect();
            assert_eq!(got[..4], want, "{file}");
            assert_eq!(got[4].2, None, "{file}");
        }
    }

    #[test]
    fn a_malformed_line_is_named_and_the_others_are_read() {
        let text = "CPU Temp | 45.000 | degrees C | ok | 0 | 5 | 10 | 85 | 90 | 95\n\
                    FAN1 | 48x0 | RPM | ok | 0 | 5 | 10 | 85 | 90 | 95\n\
                    half | a line\n\
                    PSU1 Power | 320.000 | Watts | ok | na | na | na | na | na | na\n";
        let listing = parse_listing(text);
        let lines: Vec<usize> = listing.errors.iter().map(|e| e.line).collect();
        assert_eq!(lines, [2, 3]);
        assert!(
            listing.errors[0].message.contains("`48x0`"),
            "{:?}",
            listing.errors
        );
        let names: Vec<&str> = listing.readings.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["CPU Temp", "PSU1 Power"]);
    }

    #[test]
    fn discrete_sensors_are_not_readings() {
        let text = "PS1 Status | 0x0 | discrete | 0x0100| na | na | na | na | na | na\n\
                    Intrusion  | 73h | ok  |  23.1 | Device Absent\n\
                    Fan Redund | 0x00 | ok\n";
        let listing = parse_listing(text);
        assert!(
            listing.readings.is_empty() && listing.errors.is_empty(),
            "{listing:?}"
        );
    }

    #[test]
    fn selection_by_unit_and_by_number() {
        let readings = parse_listing(&fixture("ipmitool-sdr-elist-full.txt")).readings;
        let power = Selection {
            power_energy: true,
            numbers: vec![],
        };
        let names = |s: &Selection| -> Vec<String> {
            s.pick(readings.clone())
                .unwrap()
                .into_iter()
                .map(|r| r.name)
                .collect()
        };
        assert_eq!(names(&power), ["PSU1 Power"]);
        let both = Selection {
            power_energy: true,
            numbers: vec![0x30, 0x34],
        };
        assert_eq!(names(&both), ["CPU Temp", "PSU1 Power", "Absent Temp"]);
        let unnumbered = parse_listing(&fixture("ipmitool-sensor.txt")).readings;
        let err = both.pick(unnumbered).unwrap_err();
        assert!(err.contains("sdr elist full"), "{err}");
        assert_eq!(parse_sensor_number("0x30"), Ok(48));
        assert_eq!(parse_sensor_number("49"), Ok(49));
        assert!(parse_sensor_number("256").is_err());
    }

    #[test]
    fn units_of_the_tools_are_ceems_symbols() {
        for (printed, symbol) in [
            ("degrees C", "C"),
            ("C", "C"),
            ("Volts", "V"),
            ("Watts", "W"),
            ("RPM", "RPM"),
            ("", "Unspecified/Unused"),
            ("furlongs", "furlongs"),
        ] {
            assert_eq!(tool_unit(printed), symbol);
        }
        assert_eq!(unit_symbol(18), "RPM");
        assert_eq!(unit_symbol(7), "J");
        assert_eq!(unit_symbol(200), "Unknown");
    }

    #[test]
    fn the_listing_beside_the_dcmi_tool() {
        let ipmitool = Source::from_command_line(
            "/usr/bin/ipmitool -I lanplus -H bmc -U u -P p dcmi power reading",
        )
        .unwrap();
        assert_eq!(
            SensorSource::beside(&ipmitool),
            Some(SensorSource::Command {
                program: "/usr/bin/ipmitool".into(),
                args: "-I lanplus -H bmc -U u -P p sdr elist full"
                    .split(' ')
                    .map(str::to_owned)
                    .collect(),
            })
        );
        let freeipmi = Source::from_command_line("/usr/sbin/ipmi-dcmi -h bmc").unwrap();
        assert!(matches!(
            SensorSource::beside(&freeipmi),
            Some(SensorSource::Command { program, args })
                if program == Path::new("/usr/sbin/ipmi-sensors") && args == ["-h", "bmc", "-v", "--quiet-cache"]
        ));
        let capmc = Source::from_command_line("capmc").unwrap();
        assert_eq!(SensorSource::beside(&capmc), None);
        let native = Source::Native { devices: vec![] };
        assert_eq!(SensorSource::beside(&native), Some(SensorSource::Native));
    }

    /// A stand-in listing tool whose output the test changes between scrapes.
    fn tool(dir: &Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("ipmitool");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn a_scrape_serves_the_lines_read_and_fails_loudly() {
        let tmp = tempfile::tempdir().unwrap();
        let program = tool(
            tmp.path(),
            "echo 'PSU1 Power | 33h | ok | 3.1 | 320 Watts'\necho 'PSU2 Power | 34h | ok | 3.1'",
        );
        let part = SensorPart::new(
            SensorSource::Command {
                program: program.clone(),
                args: vec![],
            },
            Selection {
                power_energy: true,
                numbers: vec![],
            },
        );
        let scrape = |part: &SensorPart| {
            let mut out = MetricSet::new();
            let r = part.collect(
                &mut out,
                "n1",
                &[],
                Duration::from_secs(2),
                Duration::from_millis(300),
                &AtomicI64::new(0),
            );
            let mut text = String::new();
            out.encode_text(&mut text);
            (r, text)
        };
        let (r, text) = scrape(&part);
        let err = r.unwrap_err();
        assert!(
            err.keeps_output() && err.to_string().contains("line 2"),
            "{err}"
        );
        assert!(text.contains(
            "ceems_ipmi_sensor_reading_current{hostname=\"n1\",sensorname=\"PSU1 Power\",sensorunits=\"W\"} 320\n"
        ), "{text}");

        tool(tmp.path(), "exit 1");
        let (r, text) = scrape(&part);
        assert!(matches!(r, Err(CollectError::Stale(_))), "{r:?}");
        assert!(text.contains("} 320\n"), "{text}");
        std::thread::sleep(Duration::from_millis(400));
        let (r, text) = scrape(&part);
        assert!(matches!(r, Err(CollectError::Other(_))), "{r:?}");
        assert!(text.is_empty(), "{text}");
    }

    proptest::proptest! {
        #[test]
        fn listings_never_panic(s in "\\PC*") {
            let _ = parse_listing(&s);
        }

        #[test]
        fn pipe_lines_never_panic(fields in proptest::collection::vec("[ -{}~]{0,12}", 0..12)) {
            let _ = parse_listing(&fields.join("|"));
        }
    }
}
