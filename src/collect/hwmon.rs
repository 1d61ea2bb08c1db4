//! `hwmon`: power and energy sensors of `<sysfs>/class/hwmon` (AMD's socket power, ACPI power
//! meters), as CEEMS exports them.

use std::path::{Path, PathBuf};

use super::{CollectError, Collector, CollectorSpec, Context, MetricNames};
use crate::metrics::{Labels, MetricSet};

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "hwmon",
    default_enabled: false,
    capabilities: &[],
    options: Vec::new,
    build,
    self_test: None,
    sub_collectors: &[],
};

/// (file type, file property) → (metric name, help); the only sensors CEEMS exports.
const SENSORS: &[(&str, &str, &str, &str)] = &[
    (
        "power",
        "input",
        "ceems_hwmon_power_current_watts",
        "Current Power consumption in watts",
    ),
    (
        "power",
        "input_lowest",
        "ceems_hwmon_power_min_watts",
        "Minimum Power consumption in watts",
    ),
    (
        "power",
        "input_highest",
        "ceems_hwmon_power_max_watts",
        "Maximum Power consumption in watts",
    ),
    (
        "power",
        "average",
        "ceems_hwmon_power_avg_watts",
        "Average Power consumption in watts",
    ),
    (
        "energy",
        "input",
        "ceems_hwmon_energy_current_joules",
        "Current Energy consumption in joules",
    ),
];

/// Splits a sensor file name such as `power1_input_highest` into (`power`, 1, `input_highest`).
pub fn split_sensor_file(name: &str) -> Option<(&str, u32, &str)> {
    let digits_at = name.find(|c: char| c.is_ascii_digit())?;
    let (kind, rest) = name.split_at(digits_at);
    let digits_end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let num = rest[..digits_end].parse().ok()?;
    let property = rest[digits_end..].strip_prefix('_')?;
    if kind.is_empty() || property.is_empty() {
        return None;
    }
    Some((kind, num, property))
}

/// Lower-case, with runs of characters outside `[a-z0-9:_]` turned into `_`, trimmed of `_`.
fn clean_name(raw: &str) -> String {
    let lower = raw.to_lowercase();
    let replaced: String = lower
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == ':' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    replaced.trim_matches('_').to_owned()
}

/// A stable name for a monitor: its device's bus and name, else its `name` file, else hwmonN.
fn chip(dir: &Path) -> Option<String> {
    if let Ok(device) = std::fs::canonicalize(dir.join("device")) {
        let name = device.file_name().map(|n| clean_name(&n.to_string_lossy()));
        let bus = device
            .parent()
            .and_then(|p| p.file_name())
            .map(|n| clean_name(&n.to_string_lossy()));
        match (bus, name) {
            (Some(b), Some(n)) if !b.is_empty() && !n.is_empty() => {
                return Some(format!("{b}_{n}"))
            }
            (_, Some(n)) if !n.is_empty() => return Some(n),
            _ => {}
        }
    }
    if let Some(name) = chip_name(dir) {
        return Some(name);
    }
    let real = std::fs::canonicalize(dir).ok()?;
    let last = clean_name(&real.file_name()?.to_string_lossy());
    (!last.is_empty()).then_some(last)
}

fn chip_name(dir: &Path) -> Option<String> {
    let raw = std::fs::read_to_string(dir.join("name")).ok()?;
    let name = clean_name(&raw);
    (!name.is_empty()).then_some(name)
}

struct Sensor {
    file: PathBuf,
    metric: usize,
    label: String,
}

/// Sensors CEEMS exports in one directory (the monitor's own or its `device`).
fn sensors_in(dir: &Path, found: &mut Vec<Sensor>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some((kind, num, property)) = split_sensor_file(&file_name.to_string_lossy())
            .map(|(k, n, p)| (k.to_owned(), n, p.to_owned()))
        else {
            continue;
        };
        if let Some(metric) = SENSORS
            .iter()
            .position(|(k, p, _, _)| *k == kind && *p == property)
        {
            found.push(Sensor {
                file: entry.path(),
                metric,
                label: format!("{kind}{num}"),
            });
        }
    }
}

/// A sensor value in micro-units, or None for unreadable, unparsable or zero readings (CEEMS
/// leaves those out).
fn read_micro(path: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: f64 = text.trim().parse().ok()?;
    (v > 0.0 && v.is_finite()).then_some(v)
}

pub struct HwmonCollector {
    class_dir: PathBuf,
    hostname: String,
    /// Which generation's labels to export.
    pub names: MetricNames,
}

fn build(ctx: &Context) -> Result<Box<dyn Collector>, CollectError> {
    let mut collector = HwmonCollector::new(&ctx.paths.sysfs, &ctx.hostname);
    collector.names = ctx.names;
    Ok(Box::new(collector))
}

impl HwmonCollector {
    pub fn new(sysfs: &Path, hostname: &str) -> HwmonCollector {
        HwmonCollector {
            class_dir: sysfs.join("class").join("hwmon"),
            hostname: hostname.to_owned(),
            names: MetricNames::default(),
        }
    }
}

impl Collector for HwmonCollector {
    fn collect(&self, out: &mut MetricSet) -> Result<(), CollectError> {
        let entries =
            CollectError::read_dir_or_absent(&self.class_dir, "this platform has no hwmon class")?;
        let mut any = false;
        for entry in entries.flatten() {
            let dir = entry.path();
            if !dir.is_dir() {
                continue;
            }
            let mut sensors = Vec::new();
            sensors_in(&dir, &mut sensors);
            sensors_in(&dir.join("device"), &mut sensors);
            if sensors.is_empty() {
                continue;
            }
            let Some(chip) = chip(&dir) else {
                continue;
            };
            let chip_name = chip_name(&dir).unwrap_or_default();
            let index = dir
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("hwmon"))
                .unwrap_or_default()
                .to_owned();
            for s in sensors {
                let Some(v) = read_micro(&s.file) else {
                    continue;
                };
                let (_, _, name, help) = SENSORS[s.metric];
                any = true;
                let mut labels = vec![
                    ("chip", chip.as_str()),
                    ("chip_name", chip_name.as_str()),
                    ("hostname", self.hostname.as_str()),
                ];
                // CEEMS v0.11 added the hwmon number (`hwmon4`: 4).
                if self.names == MetricNames::Current {
                    labels.push(("index", index.as_str()));
                }
                labels.push(("sensor", s.label.as_str()));
                out.gauge(name, help, Labels::new(&labels), v / 1e6);
            }
        }
        if !any {
            return Err(CollectError::Absent(
                "no hwmon power or energy sensor on this platform".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sensor_file_names() {
        assert_eq!(
            split_sensor_file("power1_input"),
            Some(("power", 1, "input"))
        );
        assert_eq!(
            split_sensor_file("power12_input_highest"),
            Some(("power", 12, "input_highest"))
        );
        assert_eq!(split_sensor_file("name"), None);
        assert_eq!(split_sensor_file("power1"), None);
        assert_eq!(split_sensor_file("1_input"), None);
        assert_eq!(split_sensor_file("power99999999999_input"), None);
    }

    #[test]
    fn device_link_names_the_chip_and_zero_readings_are_left_out() {
        let tmp = tempfile::tempdir().unwrap();
        let dev = tmp.path().join("devices/platform/acpi-power.0");
        let mon = dev.join("hwmon/hwmon0");
        std::fs::create_dir_all(&mon).unwrap();
        std::fs::write(mon.join("name"), "Power Meter\n").unwrap();
        std::fs::write(mon.join("power1_input"), "250500000\n").unwrap();
        std::fs::write(mon.join("power1_average"), "0\n").unwrap();
        std::fs::write(mon.join("temp1_input"), "40000\n").unwrap();
        std::os::unix::fs::symlink("../../../acpi-power.0", mon.join("device")).unwrap();
        let class = tmp.path().join("class/hwmon");
        std::fs::create_dir_all(&class).unwrap();
        std::os::unix::fs::symlink(&mon, class.join("hwmon0")).unwrap();

        let scrape = |names: MetricNames| {
            let mut c = HwmonCollector::new(tmp.path(), "n1");
            c.names = names;
            let mut set = MetricSet::new();
            c.collect(&mut set).unwrap();
            let mut text = String::new();
            set.encode_text(&mut text);
            text
        };
        let text = scrape(MetricNames::Current);
        assert!(text.contains(
            "ceems_hwmon_power_current_watts{chip=\"platform_acpi_power_0\",chip_name=\"power_meter\",hostname=\"n1\",index=\"0\",sensor=\"power1\"} 250.5\n"
        ), "{text}");
        assert!(!text.contains("avg_watts{"), "{text}");
        assert!(!text.contains("temp"), "{text}");
        // v0.10 dashboards join on the four labels CEEMS had then.
        let text = scrape(MetricNames::V010);
        assert!(text.contains(
            "ceems_hwmon_power_current_watts{chip=\"platform_acpi_power_0\",chip_name=\"power_meter\",hostname=\"n1\",sensor=\"power1\"} 250.5\n"
        ), "{text}");
    }

    #[test]
    fn no_sensors_is_an_absence() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("class/hwmon/hwmon0")).unwrap();
        let c = HwmonCollector::new(tmp.path(), "");
        assert!(matches!(
            c.collect(&mut MetricSet::new()),
            Err(CollectError::Absent(_))
        ));
    }
}
