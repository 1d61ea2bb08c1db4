//! `netdev` (off by default): each network device's counters from `/proc/net/dev`, as CEEMS's
//! collector of the same name, with its device include/exclude patterns.

use std::path::PathBuf;

use regex::Regex;
use serde::Deserialize;

use super::{CollectError, Collector, CollectorSpec, Context};
use crate::config::{Kind, Opt};
use crate::host::ParseError;
use crate::metrics::{Labels, MetricSet};

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "netdev",
    default_enabled: false,
    capabilities: &[],
    options,
    build,
    self_test: None,
    sub_collectors: &[],
};

fn options() -> Vec<Opt> {
    vec![
        Opt::new(
            "collector.netdev.device-include",
            Kind::Str,
            "Regexp of net devices to include (mutually exclusive to device-exclude)",
        ),
        Opt::new(
            "collector.netdev.device-exclude",
            Kind::Str,
            "Regexp of net devices to exclude (mutually exclusive to device-include)",
        ),
    ]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Settings {
    device_include: Option<String>,
    device_exclude: Option<String>,
}

/// The 16 counters of a `/proc/net/dev` line, in the file's order: name, help.
const COUNTERS: [(&str, &str); 16] = [
    (
        "ceems_netdev_receive_bytes_total",
        "Total received bytes by the network device",
    ),
    (
        "ceems_netdev_receive_packets_total",
        "Total received packets by the network device",
    ),
    (
        "ceems_netdev_receive_errors_total",
        "Total received errors by the network device",
    ),
    (
        "ceems_netdev_receive_dropped_total",
        "Total received dropped packets by the network device",
    ),
    (
        "ceems_netdev_receive_fifo_total",
        "Total received FIFO errors by the network device",
    ),
    (
        "ceems_netdev_receive_frame_total",
        "Total received frames by the network device",
    ),
    (
        "ceems_netdev_receive_compressed_total",
        "Total received compressed packets by the network device",
    ),
    (
        "ceems_netdev_receive_multicast_total",
        "Total received multicast packets by the network device",
    ),
    (
        "ceems_netdev_transmit_bytes_total",
        "Total transmitted bytes by the network device",
    ),
    (
        "ceems_netdev_transmit_packets_total",
        "Total transmitted packets by the network device",
    ),
    (
        "ceems_netdev_transmit_errors_total",
        // CEEMS's text, which says bytes for errors.
        "Total transmitted bytes by the network device",
    ),
    (
        "ceems_netdev_transmit_dropped_total",
        "Total transmitted dropped packets by the network device",
    ),
    (
        "ceems_netdev_transmit_fifo_total",
        "Total frame transmission errors FIFO by the network device",
    ),
    (
        "ceems_netdev_transmit_colls_total",
        "Total transmitted collisions by the network device",
    ),
    (
        "ceems_netdev_transmit_carrier_total",
        "Total frame transmission errors errors due to loss of carrier by the network device",
    ),
    (
        "ceems_netdev_transmit_compressed_total",
        "Total transmitted compressed packets by the network device",
    ),
];

/// One device's line of `/proc/net/dev`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetDevice<'a> {
    pub name: &'a str,
    pub counters: [u64; 16],
}

/// Parses `/proc/net/dev`: two header lines, then `name: 16 counters` per device.
pub fn parse_net_dev(text: &str) -> Result<Vec<NetDevice<'_>>, ParseError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().skip(2) {
        if line.trim().is_empty() {
            continue;
        }
        let (name, values) = line.split_once(':').ok_or_else(|| {
            ParseError::new(i + 1, format!("expected `device: counters`, got `{line}`"))
        })?;
        let mut counters = [0u64; 16];
        let mut fields = values.split_ascii_whitespace();
        for slot in counters.iter_mut() {
            let field = fields.next().ok_or_else(|| {
                ParseError::new(
                    i + 1,
                    format!("fewer than 16 counters for `{}`", name.trim()),
                )
            })?;
            *slot = field.parse().map_err(|_| {
                ParseError::new(i + 1, format!("`{field}` is not an unsigned integer"))
            })?;
        }
        out.push(NetDevice {
            name: name.trim(),
            counters,
        });
    }
    Ok(out)
}

/// Which devices are reported: CEEMS's include and exclude patterns, one of them at most.
#[derive(Debug)]
enum DeviceFilter {
    All,
    Include(Regex),
    Exclude(Regex),
}

impl DeviceFilter {
    fn new(include: Option<&str>, exclude: Option<&str>) -> Result<DeviceFilter, CollectError> {
        let compile = |flag: &str, p: &str| {
            Regex::new(p).map_err(|e| {
                CollectError::Other(format!("--collector.netdev.{flag}: bad pattern: {e}"))
            })
        };
        match (
            include.filter(|p| !p.is_empty()),
            exclude.filter(|p| !p.is_empty()),
        ) {
            (Some(_), Some(_)) => Err(CollectError::Other(
                "--collector.netdev.device-include and --collector.netdev.device-exclude are \
                 mutually exclusive"
                    .into(),
            )),
            (Some(p), None) => Ok(DeviceFilter::Include(compile("device-include", p)?)),
            (None, Some(p)) => Ok(DeviceFilter::Exclude(compile("device-exclude", p)?)),
            (None, None) => Ok(DeviceFilter::All),
        }
    }

    /// Go's `MatchString`: the pattern matches anywhere in the name unless anchored.
    fn keeps(&self, name: &str) -> bool {
        match self {
            DeviceFilter::All => true,
            DeviceFilter::Include(p) => p.is_match(name),
            DeviceFilter::Exclude(p) => !p.is_match(name),
        }
    }
}

pub struct NetdevCollector {
    path: PathBuf,
    hostname: String,
    filter: DeviceFilter,
}

fn build(ctx: &Context) -> Result<Box<dyn Collector>, CollectError> {
    let s: Settings = ctx.settings()?;
    Ok(Box::new(NetdevCollector {
        path: ctx.paths.procfs.join("net/dev"),
        hostname: ctx.hostname.clone(),
        filter: DeviceFilter::new(s.device_include.as_deref(), s.device_exclude.as_deref())?,
    }))
}

impl Collector for NetdevCollector {
    fn collect(&self, out: &mut MetricSet) -> Result<(), CollectError> {
        let text =
            std::fs::read_to_string(&self.path).map_err(|e| CollectError::io(&self.path, e))?;
        let devices = parse_net_dev(&text).map_err(|source| CollectError::Parse {
            path: self.path.clone(),
            source,
        })?;
        for dev in devices.iter().filter(|d| self.filter.keeps(d.name)) {
            let labels = Labels::new(&[("device", dev.name), ("hostname", &self.hostname)]);
            for ((name, help), value) in COUNTERS.iter().zip(dev.counters) {
                out.counter(name, help, labels.clone(), value as f64);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = include_str!("../../tests/fixtures/compat/proc/net/dev");

    #[test]
    fn parses_the_kernel_format() {
        let devices = parse_net_dev(FIXTURE).unwrap();
        let names: Vec<&str> = devices.iter().map(|d| d.name).collect();
        assert_eq!(names, ["vethf345468", "lo", "docker0", "eth0"]);
        let eth0 = &devices[3];
        assert_eq!(eth0.counters[0], 874_354_587);
        assert_eq!(eth0.counters[1], 1_036_395);
        assert_eq!(eth0.counters[8], 563_352_563);
    }

    #[test]
    fn malformed_lines_are_errors() {
        let head = "Inter-|\n face |\n";
        assert_eq!(
            parse_net_dev(&format!("{head}eth0 1 2\n"))
                .unwrap_err()
                .line,
            3
        );
        assert!(parse_net_dev(&format!("{head}eth0: 1 2 3\n")).is_err());
        assert!(parse_net_dev(&format!("{head}eth0: {}x\n", "1 ".repeat(15))).is_err());
        assert!(parse_net_dev(head).unwrap().is_empty());
    }

    #[test]
    fn include_and_exclude_follow_ceems() {
        let f = DeviceFilter::new(Some("eth0"), None).unwrap();
        assert!(f.keeps("eth0") && !f.keeps("lo"));
        // Unanchored, as Go's regexp.MatchString.
        assert!(f.keeps("veth0eth0"));
        let f = DeviceFilter::new(None, Some("^(lo|docker.*)$")).unwrap();
        assert!(!f.keeps("lo") && !f.keeps("docker0") && f.keeps("eth0"));
        assert!(DeviceFilter::new(Some("a"), Some("b")).is_err());
        assert!(DeviceFilter::new(Some("("), None).is_err());
        assert!(DeviceFilter::new(Some(""), None).unwrap().keeps("x"));
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in "\\PC*") {
            let _ = parse_net_dev(&s);
        }
    }
}
