//! `rapl`: CPU package and DRAM energy from the powercap zones under
//! `<sysfs>/class/powercap` (Intel's `intel-rapl:*` and AMD's zones alike).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Deserialize;

use super::{CollectError, Collector, CollectorSpec, Context};
use crate::config::Opt;
use crate::host::cgroup::parse;
use crate::metrics::{Labels, MetricSet};

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "rapl",
    default_enabled: false,
    // energy_uj is root-only since Linux 5.10 (CVE-2020-8694).
    capabilities: &[caps::Capability::CAP_DAC_READ_SEARCH],
    options,
    build,
    self_test: Some(|paths, caps| crate::security::check::test_rapl(&paths.sysfs, caps)),
    sub_collectors: &[],
};

fn options() -> Vec<Opt> {
    vec![Opt::flag(
        "collector.rapl.enable-zone-label",
        "Export one family per metric with the zone in a rapl_zone label, instead of one family per zone",
    )]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Settings {
    enable_zone_label: bool,
}

/// One powercap zone, as read in one scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct Zone {
    /// `package`, `dram`, `core`, `uncore`, `psys`: the `name` file without its `-N` suffix.
    pub name: String,
    pub index: u32,
    pub path: PathBuf,
    pub energy_uj: u64,
    pub max_energy_range_uj: Option<u64>,
    /// Limit of the constraint with the longest time window, in microwatts.
    pub power_limit_uw: Option<u64>,
}

/// Splits `package-0` into (`package`, Some(0)); names without a numeric suffix get None.
fn split_index(name: &str) -> (&str, Option<u32>) {
    if let Some((base, idx)) = name.rsplit_once('-') {
        if let Ok(i) = idx.parse::<u32>() {
            return (base, Some(i));
        }
    }
    (name, None)
}

fn read_trimmed(path: &Path) -> Result<String, CollectError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|e| CollectError::io(path, e))
}

fn read_u64(path: &Path) -> Result<u64, CollectError> {
    let text = std::fs::read_to_string(path).map_err(|e| CollectError::io(path, e))?;
    parse::single_u64(&text).map_err(|source| CollectError::Parse {
        path: path.to_owned(),
        source,
    })
}

/// The power limit of the constraint with the longest time window, if the zone has any.
fn longest_window_limit(dir: &Path) -> Option<u64> {
    let mut best: Option<(u64, u64)> = None;
    for n in 0.. {
        let window = dir.join(format!("constraint_{n}_time_window_us"));
        let Ok(window) = read_u64(&window) else {
            break;
        };
        let Ok(limit) = read_u64(&dir.join(format!("constraint_{n}_power_limit_uw"))) else {
            continue;
        };
        if best.is_none_or(|(w, _)| window > w) {
            best = Some((window, limit));
        }
    }
    best.map(|(_, limit)| limit)
}

/// Reads every zone under `powercap`. A zone whose energy cannot be read is reported in the
/// second list and left out of the first, so one broken zone does not hide the others.
pub fn read_zones(powercap: &Path) -> Result<(Vec<Zone>, Vec<CollectError>), CollectError> {
    let entries =
        CollectError::read_dir_or_absent(powercap, "this platform has no powercap zones")?;
    let mut dirs: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    dirs.sort();
    let mut zones = Vec::new();
    let mut faults = Vec::new();
    let mut name_uses: HashMap<String, u32> = HashMap::new();
    for dir in dirs {
        // The control type directory (`intel-rapl`) has no name file: not a zone.
        let Ok(raw_name) = read_trimmed(&dir.join("name")) else {
            continue;
        };
        let (base, index) = split_index(&raw_name);
        let uses = name_uses.entry(base.to_owned()).or_default();
        let index = index.unwrap_or(*uses);
        *uses += 1;
        let energy_uj = match read_u64(&dir.join("energy_uj")) {
            Ok(v) => v,
            Err(e) => {
                faults.push(e);
                continue;
            }
        };
        zones.push(Zone {
            name: sanitize(base),
            index,
            max_energy_range_uj: read_u64(&dir.join("max_energy_range_uj")).ok(),
            power_limit_uw: longest_window_limit(&dir),
            path: dir,
            energy_uj,
        });
    }
    Ok((zones, faults))
}

/// Metric-name-safe form of a zone name.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Energy counters that wrap at `max_energy_range_uj` turned into ones that never go back.
#[derive(Debug, Default)]
pub struct WrapTracker {
    /// Per zone path: last raw reading and the microjoules lost to earlier wraps.
    zones: HashMap<PathBuf, (u64, u64)>,
}

impl WrapTracker {
    /// The monotonic microjoules of a zone for this raw reading.
    pub fn update(&mut self, path: &Path, raw: u64, max_range: Option<u64>) -> u64 {
        let entry = self.zones.entry(path.to_owned()).or_insert((raw, 0));
        let (last, offset) = *entry;
        let offset = if raw < last {
            // The counter restarted at 0 after max_energy_range_uj. Without the range (no such
            // file) the best guess is that it restarted exactly from the last value.
            offset.saturating_add(max_range.unwrap_or(last))
        } else {
            offset
        };
        *entry = (raw, offset);
        raw.saturating_add(offset)
    }
}

pub struct RaplCollector {
    powercap: PathBuf,
    hostname: String,
    zone_label: bool,
    wraps: Mutex<WrapTracker>,
}

fn build(ctx: &Context) -> Result<Box<dyn Collector>, CollectError> {
    let s: Settings = ctx.settings()?;
    Ok(Box::new(RaplCollector::new(
        &ctx.paths.sysfs,
        &ctx.hostname,
        s.enable_zone_label,
    )))
}

impl RaplCollector {
    pub fn new(sysfs: &Path, hostname: &str, zone_label: bool) -> RaplCollector {
        RaplCollector {
            powercap: sysfs.join("class").join("powercap"),
            hostname: hostname.to_owned(),
            zone_label,
            wraps: Mutex::new(WrapTracker::default()),
        }
    }
}

impl Collector for RaplCollector {
    fn collect(&self, out: &mut MetricSet) -> Result<(), CollectError> {
        // energy_uj is root's since Linux 5.10.
        let powercap = self.powercap.clone();
        let (zones, faults) =
            crate::security::privileged(SPEC.capabilities, move || read_zones(&powercap))?;
        for fault in &faults {
            tracing::warn!(collector = "rapl", error = %fault, "skipping RAPL zone");
        }
        if zones.is_empty() {
            return Err(match faults.into_iter().next() {
                Some(first) => first,
                None => CollectError::Absent("no RAPL zone found".into()),
            });
        }
        let mut wraps = self.wraps.lock().unwrap_or_else(|p| p.into_inner());
        for z in &zones {
            let energy = wraps.update(&z.path, z.energy_uj, z.max_energy_range_uj);
            let index = z.index.to_string();
            let path = z.path.to_string_lossy();
            let joules = energy as f64 / 1e6;
            let limit = z.power_limit_uw.map(|uw| uw as f64 / 1e6);
            if self.zone_label {
                let labels = Labels::new(&[
                    ("hostname", &self.hostname),
                    ("index", &index),
                    ("path", &path),
                    ("rapl_zone", &z.name),
                ]);
                out.counter(
                    "ceems_rapl_joules_total",
                    "Current RAPL value in joules",
                    labels.clone(),
                    joules,
                );
                if let Some(w) = limit {
                    out.counter(
                        "ceems_rapl_power_limit_watts_total",
                        "Current RAPL power limit in watts",
                        labels,
                        w,
                    );
                }
            } else {
                let labels = Labels::new(&[
                    ("hostname", &self.hostname),
                    ("index", &index),
                    ("path", &path),
                ]);
                out.counter(
                    &format!("ceems_rapl_{}_joules_total", z.name),
                    &format!("Current RAPL {} value in joules", z.name),
                    labels.clone(),
                    joules,
                );
                if let Some(w) = limit {
                    out.counter(
                        &format!("ceems_rapl_{}_power_limit_watts_total", z.name),
                        &format!("Current RAPL {} power limit in watts", z.name),
                        labels,
                        w,
                    );
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(root: &Path, dir: &str, name: &str, energy: &str, max: u64) -> PathBuf {
        let d = root.join(dir);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("name"), format!("{name}\n")).unwrap();
        std::fs::write(d.join("energy_uj"), energy).unwrap();
        std::fs::write(d.join("max_energy_range_uj"), max.to_string()).unwrap();
        d
    }

    fn scrape(c: &RaplCollector) -> Result<String, CollectError> {
        let mut set = MetricSet::new();
        c.collect(&mut set)?;
        let mut s = String::new();
        set.encode_text(&mut s);
        Ok(s)
    }

    fn value(text: &str, prefix: &str) -> f64 {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
    }

    #[test]
    fn counter_keeps_growing_across_a_wrap() {
        let tmp = tempfile::tempdir().unwrap();
        let pc = tmp.path().join("class/powercap");
        let d = zone(&pc, "intel-rapl:0", "package-0", "900000000", 1_000_000_000);
        let c = RaplCollector::new(tmp.path(), "", false);
        let first = value(&scrape(&c).unwrap(), "ceems_rapl_package_joules_total");
        assert_eq!(first, 900.0);
        // The counter passes its maximum and restarts: 900 J → (1000 J wrap) → 50 J.
        std::fs::write(d.join("energy_uj"), "50000000").unwrap();
        let second = value(&scrape(&c).unwrap(), "ceems_rapl_package_joules_total");
        assert_eq!(second, 1050.0);
        std::fs::write(d.join("energy_uj"), "60000000").unwrap();
        let third = value(&scrape(&c).unwrap(), "ceems_rapl_package_joules_total");
        assert_eq!(third, 1060.0);
    }

    #[test]
    fn a_broken_zone_is_skipped_and_the_others_are_served() {
        let tmp = tempfile::tempdir().unwrap();
        let pc = tmp.path().join("class/powercap");
        zone(&pc, "intel-rapl:0", "package-0", "1000000", 10);
        zone(&pc, "intel-rapl:1", "package-1", "not a number", 10);
        let gone = zone(&pc, "intel-rapl:0:0", "dram", "5", 10);
        std::fs::remove_file(gone.join("energy_uj")).unwrap();
        let c = RaplCollector::new(tmp.path(), "", false);
        let text = scrape(&c).unwrap();
        assert!(text.contains("index=\"0\""), "{text}");
        assert!(!text.contains("index=\"1\""), "{text}");
        assert!(!text.contains("dram"), "{text}");
    }

    #[test]
    fn no_powercap_is_an_absence_and_all_zones_broken_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let c = RaplCollector::new(tmp.path(), "", false);
        assert!(matches!(scrape(&c), Err(CollectError::Absent(_))));
        let pc = tmp.path().join("class/powercap");
        let d = zone(&pc, "intel-rapl:0", "package-0", "1", 10);
        std::fs::remove_file(d.join("energy_uj")).unwrap();
        std::fs::create_dir(d.join("energy_uj")).unwrap();
        assert!(matches!(scrape(&c), Err(CollectError::Io { .. })));
    }

    #[test]
    fn zone_label_mode_and_longest_window_limit() {
        let tmp = tempfile::tempdir().unwrap();
        let pc = tmp.path().join("class/powercap");
        let d = zone(&pc, "intel-rapl:0", "package-0", "2000000", 10);
        for (n, window, limit) in [(0, "1000", "150000000"), (1, "2000000", "120000000")] {
            std::fs::write(d.join(format!("constraint_{n}_time_window_us")), window).unwrap();
            std::fs::write(d.join(format!("constraint_{n}_power_limit_uw")), limit).unwrap();
        }
        let c = RaplCollector::new(tmp.path(), "h", true);
        let text = scrape(&c).unwrap();
        assert_eq!(value(&text, "ceems_rapl_joules_total{"), 2.0);
        assert!(text.contains("rapl_zone=\"package\""), "{text}");
        assert_eq!(value(&text, "ceems_rapl_power_limit_watts_total{"), 120.0);
    }
}
