//! `cray_pm_counters`: node, CPU, memory and accelerator power and energy of HPE Cray nodes,
//! from `<sysfs>/cray/pm_counters`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{CollectError, Collector, CollectorSpec, Context};
use crate::metrics::{Labels, MetricSet};

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "cray_pm_counters",
    default_enabled: false,
    capabilities: &[],
    options: Vec::new,
    build,
    self_test: None,
    sub_collectors: &[],
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Quantity {
    Energy,
    Power,
    PowerCap,
    Temp,
}

impl Quantity {
    fn metric(self) -> (&'static str, &'static str) {
        match self {
            Quantity::Energy => (
                "ceems_cray_pm_counters_energy_joules",
                "Current energy value in joules",
            ),
            Quantity::Power => (
                "ceems_cray_pm_counters_power_watts",
                "Current power value in watts",
            ),
            Quantity::PowerCap => (
                "ceems_cray_pm_counters_power_limit_watts",
                "Current power limit value in watts",
            ),
            Quantity::Temp => (
                "ceems_cray_pm_counters_temp_celsius",
                "Current temperature value in celsius",
            ),
        }
    }
}

/// Maps a pm_counters file name to its domain and quantity: `power` → (`node`, Power),
/// `accel0_power_cap` → (`accel0`, PowerCap), `cpu0_temp` → (`cpu0`, Temp). Other files
/// (`freshness`, `version`, …) give None.
pub fn classify(file: &str) -> Option<(String, Quantity)> {
    let (domain, quantity) = match file.split_once('_') {
        None => ("", file),
        Some((d, q)) if matches!(q, "energy" | "power" | "power_cap" | "temp") => (d, q),
        Some(("power", "cap")) => ("", "power_cap"),
        Some(_) => return None,
    };
    let quantity = match quantity {
        "energy" => Quantity::Energy,
        "power" => Quantity::Power,
        "power_cap" => Quantity::PowerCap,
        "temp" => Quantity::Temp,
        _ => return None,
    };
    let domain = if domain.is_empty() {
        "node".to_owned()
    } else {
        let kind = domain.trim_end_matches(|c: char| c.is_ascii_digit());
        if !matches!(kind, "cpu" | "memory" | "accel") {
            return None;
        }
        domain.to_owned()
    };
    Some((domain, quantity))
}

/// The value of a counter file: `873 W 1734094386309238 us` → 873.
pub fn counter_value(text: &str) -> Result<u64, String> {
    let first = text.split_whitespace().next().ok_or("empty counter file")?;
    first
        .parse()
        .map_err(|_| format!("`{first}` is not an unsigned integer"))
}

pub struct CrayPmCollector {
    dir: PathBuf,
    hostname: String,
}

fn build(ctx: &Context) -> Result<Box<dyn Collector>, CollectError> {
    Ok(Box::new(CrayPmCollector::new(
        &ctx.paths.sysfs,
        &ctx.hostname,
    )))
}

impl CrayPmCollector {
    pub fn new(sysfs: &Path, hostname: &str) -> CrayPmCollector {
        CrayPmCollector {
            dir: sysfs.join("cray").join("pm_counters"),
            hostname: hostname.to_owned(),
        }
    }
}

impl Collector for CrayPmCollector {
    fn collect(&self, out: &mut MetricSet) -> Result<(), CollectError> {
        let entries =
            CollectError::read_dir_or_absent(&self.dir, "this node has no Cray pm_counters")?;
        let mut values = BTreeMap::new();
        for entry in entries.flatten() {
            let Some((domain, q)) = classify(&entry.file_name().to_string_lossy()) else {
                continue;
            };
            let path = entry.path();
            let text = std::fs::read_to_string(&path).map_err(|e| CollectError::io(&path, e))?;
            match counter_value(&text) {
                // CEEMS leaves zero readings out (an unset cap reads 0).
                Ok(v) if v > 0 => {
                    values.insert((q, domain), v);
                }
                Ok(_) => {}
                Err(message) => {
                    tracing::debug!(path = %path.display(), %message, "skipping pm counter")
                }
            }
        }
        for ((q, domain), v) in values {
            let (name, help) = q.metric();
            out.gauge(
                name,
                help,
                Labels::new(&[("domain", &domain), ("hostname", &self.hostname)]),
                v as f64,
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names() {
        assert_eq!(classify("power"), Some(("node".into(), Quantity::Power)));
        assert_eq!(
            classify("power_cap"),
            Some(("node".into(), Quantity::PowerCap))
        );
        assert_eq!(classify("energy"), Some(("node".into(), Quantity::Energy)));
        assert_eq!(
            classify("accel3_power_cap"),
            Some(("accel3".into(), Quantity::PowerCap))
        );
        assert_eq!(classify("cpu0_temp"), Some(("cpu0".into(), Quantity::Temp)));
        assert_eq!(
            classify("memory_energy"),
            Some(("memory".into(), Quantity::Energy))
        );
        assert_eq!(classify("freshness"), None);
        assert_eq!(classify("raw_scan_hz"), None);
        assert_eq!(classify("disk_power"), None);
    }

    #[test]
    fn values() {
        assert_eq!(counter_value("873 W 1734094386309238 us\n"), Ok(873));
        assert_eq!(counter_value("0 W"), Ok(0));
        assert!(counter_value("").is_err());
        assert!(counter_value("-3 W").is_err());
    }
}
