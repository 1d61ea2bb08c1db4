//! `infiniband` (off by default): each InfiniBand device's identity and, per port, its state,
//! rate and counters from `<sysfs>/class/infiniband`, as CEEMS (node_exporter's collector)
//! reports them.

use std::path::{Path, PathBuf};

use super::{CollectError, Collector, CollectorSpec, Context};
use crate::host::ParseError;
use crate::metrics::{Labels, MetricSet};

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "infiniband",
    default_enabled: false,
    capabilities: &[],
    options: Vec::new,
    build,
    self_test: None,
    sub_collectors: &[],
};

fn build(ctx: &Context) -> Result<Box<dyn Collector>, CollectError> {
    Ok(Box::new(InfinibandCollector {
        class: ctx.paths.sysfs.join("class/infiniband"),
    }))
}

/// A port counter: its file, the series it becomes, its help, and whether the kernel counts it
/// per lane (data counters are divided by the 4 lanes of a port; multiplied back, as
/// node_exporter does).
struct PortCounter {
    file: &'static str,
    metric: &'static str,
    help: &'static str,
    per_lane: bool,
}

const fn counter(
    file: &'static str,
    metric: &'static str,
    help: &'static str,
    per_lane: bool,
) -> PortCounter {
    PortCounter {
        file,
        metric,
        help,
        per_lane,
    }
}

/// `ports/<n>/counters`.
const COUNTERS: &[PortCounter] = &[
    counter("excessive_buffer_overrun_errors", "ceems_infiniband_excessive_buffer_overrun_errors_total", "Number of times that OverrunErrors consecutive flow control update periods occurred, each having at least one overrun error.", false),
    counter("link_downed", "ceems_infiniband_link_downed_total", "Number of times the link failed to recover from an error state and went down", false),
    counter("link_error_recovery", "ceems_infiniband_link_error_recovery_total", "Number of times the link successfully recovered from an error state", false),
    counter("local_link_integrity_errors", "ceems_infiniband_local_link_integrity_errors_total", "Number of times that the count of local physical errors exceeded the threshold specified by LocalPhyErrors.", false),
    counter("multicast_rcv_packets", "ceems_infiniband_multicast_packets_received_total", "Number of multicast packets received (including errors)", false),
    counter("multicast_xmit_packets", "ceems_infiniband_multicast_packets_transmitted_total", "Number of multicast packets transmitted (including errors)", false),
    counter("port_rcv_constraint_errors", "ceems_infiniband_port_constraint_errors_received_total", "Number of packets received on the switch physical port that are discarded", false),
    counter("port_rcv_data", "ceems_infiniband_port_data_received_bytes_total", "Number of data octets received on all links", true),
    counter("port_rcv_discards", "ceems_infiniband_port_discards_received_total", "Number of inbound packets discarded by the port because the port is down or congested", false),
    counter("port_rcv_errors", "ceems_infiniband_port_errors_received_total", "Number of packets containing an error that were received on this port", false),
    counter("port_rcv_packets", "ceems_infiniband_port_packets_received_total", "Number of packets received on all VLs by this port (including errors)", false),
    counter("port_rcv_remote_physical_errors", "ceems_infiniband_port_receive_remote_physical_errors_total", "Number of packets marked with the EBP (End of Bad Packet) delimiter received on the port.", false),
    counter("port_rcv_switch_relay_errors", "ceems_infiniband_port_receive_switch_relay_errors_total", "Number of packets that could not be forwarded by the switch.", false),
    counter("port_xmit_constraint_errors", "ceems_infiniband_port_constraint_errors_transmitted_total", "Number of packets not transmitted from the switch physical port", false),
    counter("port_xmit_data", "ceems_infiniband_port_data_transmitted_bytes_total", "Number of data octets transmitted on all links", true),
    counter("port_xmit_discards", "ceems_infiniband_port_discards_transmitted_total", "Number of outbound packets discarded by the port because the port is down or congested", false),
    counter("port_xmit_packets", "ceems_infiniband_port_packets_transmitted_total", "Number of packets transmitted on all VLs from this port (including errors)", false),
    counter("port_xmit_wait", "ceems_infiniband_port_transmit_wait_total", "Number of ticks during which the port had data to transmit but no data was sent during the entire tick", false),
    counter("symbol_error", "ceems_infiniband_symbol_error_total", "Number of minor link errors detected on one or more physical lanes.", false),
    counter("unicast_rcv_packets", "ceems_infiniband_unicast_packets_received_total", "Number of unicast packets received (including errors)", false),
    counter("unicast_xmit_packets", "ceems_infiniband_unicast_packets_transmitted_total", "Number of unicast packets transmitted (including errors)", false),
    counter("VL15_dropped", "ceems_infiniband_vl15_dropped_total", "Number of incoming VL15 packets dropped due to resource limitations.", false),
];

/// `ports/<n>/counters_ext`: the 64-bit counters of kernels before 4.5.
const LEGACY_COUNTERS: &[PortCounter] = &[
    counter(
        "port_multicast_rcv_packets",
        "ceems_infiniband_legacy_multicast_packets_received_total",
        "Number of multicast packets received",
        false,
    ),
    counter(
        "port_multicast_xmit_packets",
        "ceems_infiniband_legacy_multicast_packets_transmitted_total",
        "Number of multicast packets transmitted",
        false,
    ),
    counter(
        "port_rcv_data_64",
        "ceems_infiniband_legacy_data_received_bytes_total",
        "Number of data octets received on all links",
        true,
    ),
    counter(
        "port_rcv_packets_64",
        "ceems_infiniband_legacy_packets_received_total",
        "Number of data packets received on all links",
        false,
    ),
    counter(
        "port_unicast_rcv_packets",
        "ceems_infiniband_legacy_unicast_packets_received_total",
        "Number of unicast packets received",
        false,
    ),
    counter(
        "port_unicast_xmit_packets",
        "ceems_infiniband_legacy_unicast_packets_transmitted_total",
        "Number of unicast packets transmitted",
        false,
    ),
    counter(
        "port_xmit_data_64",
        "ceems_infiniband_legacy_data_transmitted_bytes_total",
        "Number of data octets transmitted on all links",
        true,
    ),
    // CEEMS's text, which says received.
    counter(
        "port_xmit_packets_64",
        "ceems_infiniband_legacy_packets_transmitted_total",
        "Number of data packets received on all links",
        false,
    ),
];

/// The help text of a port counter file and whether the kernel counts it per lane.
pub(crate) fn port_counter(file: &str) -> Option<(&'static str, bool)> {
    COUNTERS
        .iter()
        .find(|c| c.file == file)
        .map(|c| (c.help, c.per_lane))
}

/// A port's `state` or `phys_state`: `4: ACTIVE` → 4.
pub fn parse_state(text: &str) -> Result<u32, ParseError> {
    let mut parts = text.split(':');
    let (Some(id), Some(_name), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(ParseError::new(
            1,
            format!("expected `ID: NAME`, got `{}`", text.trim()),
        ));
    };
    id.trim()
        .parse()
        .map_err(|_| ParseError::new(1, format!("`{}` is not a state number", id.trim())))
}

/// A port's `rate`, `100 Gb/sec (4X EDR)`, in bytes per second. The figure is read at single
/// precision and truncated, as node_exporter does, so the values agree.
pub fn parse_rate(text: &str) -> Result<f64, ParseError> {
    let (gbits, _) = text
        .split_once(' ')
        .ok_or_else(|| ParseError::new(1, format!("expected `N Gb/sec`, got `{}`", text.trim())))?;
    let gbits: f32 = gbits
        .trim()
        .parse()
        .map_err(|_| ParseError::new(1, format!("`{}` is not a rate", gbits.trim())))?;
    if !gbits.is_finite() || gbits < 0.0 {
        return Err(ParseError::new(1, format!("`{gbits}` is not a rate")));
    }
    Ok((f64::from(gbits) * 125_000_000.0).trunc())
}

/// A counter file's value; `None` for the `N/A (no PMA)` of ports without a management agent.
pub fn parse_counter(text: &str) -> Result<Option<u64>, ParseError> {
    let t = text.trim();
    if t.contains("N/A (no PMA)") {
        return Ok(None);
    }
    t.parse()
        .map(Some)
        .map_err(|_| ParseError::new(1, format!("`{t}` is not an unsigned integer")))
}

pub struct InfinibandCollector {
    class: PathBuf,
}

/// Reads a sysfs file as node_exporter does: trailing whitespace removed.
fn read(path: &Path) -> Result<String, CollectError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim_end().to_owned())
        .map_err(|e| CollectError::io(path, e))
}

pub(crate) fn parse_at<T>(
    path: &Path,
    parse: impl FnOnce(&str) -> Result<T, ParseError>,
) -> Result<T, CollectError> {
    parse(&read(path)?).map_err(|source| CollectError::Parse {
        path: path.to_owned(),
        source,
    })
}

/// Entries of a directory by name, sorted.
pub(crate) fn entries(dir: &Path) -> Result<Vec<(String, PathBuf)>, CollectError> {
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .map_err(|e| CollectError::io(dir, e))?
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.to_owned(), e.path())))
        .collect();
    out.sort();
    Ok(out)
}

impl InfinibandCollector {
    fn port(
        &self,
        out: &mut MetricSet,
        device: &str,
        port: &str,
        dir: &Path,
    ) -> Result<(), CollectError> {
        let labels = Labels::new(&[("device", device), ("port", port)]);
        let state = parse_at(&dir.join("state"), parse_state)?;
        let phys = parse_at(&dir.join("phys_state"), parse_state)?;
        let rate = parse_at(&dir.join("rate"), parse_rate)?;
        out.gauge(
            "ceems_infiniband_state_id",
            "State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, 4: active, 5: act defer)",
            labels.clone(),
            f64::from(state),
        );
        out.gauge(
            "ceems_infiniband_physical_state_id",
            "Physical state of the InfiniBand port (0: no change, 1: sleep, 2: polling, 3: disable, 4: shift, 5: link up, 6: link error recover, 7: phytest)",
            labels.clone(),
            f64::from(phys),
        );
        out.gauge(
            "ceems_infiniband_rate_bytes_per_second",
            "Maximum signal transfer rate",
            labels.clone(),
            rate,
        );
        // Intel's irdma and NVIDIA's nvs_ devices have no counters directory.
        if device.starts_with("irdma") || device.starts_with("nvs_") {
            return Ok(());
        }
        for (sub, table, required) in [
            ("counters", COUNTERS, true),
            ("counters_ext", LEGACY_COUNTERS, false),
        ] {
            let counters_dir = dir.join(sub);
            if !required && !counters_dir.is_dir() {
                continue;
            }
            for (name, path) in entries(&counters_dir)? {
                let Some(c) = table.iter().find(|c| c.file == name) else {
                    continue;
                };
                let text = match std::fs::read_to_string(&path) {
                    Ok(t) => t,
                    // Unreadable counters (permissions, unsupported) are skipped, as upstream.
                    Err(e) => {
                        tracing::debug!(path = %path.display(), error = %e, "InfiniBand counter not readable");
                        continue;
                    }
                };
                let value = parse_counter(&text).map_err(|source| CollectError::Parse {
                    path: path.clone(),
                    source,
                })?;
                if let Some(v) = value {
                    let v = if c.per_lane { v.wrapping_mul(4) } else { v };
                    out.counter(c.metric, c.help, labels.clone(), v as f64);
                }
            }
        }
        Ok(())
    }
}

impl Collector for InfinibandCollector {
    fn collect(&self, out: &mut MetricSet) -> Result<(), CollectError> {
        CollectError::read_dir_or_absent(&self.class, "no InfiniBand devices")?;
        for (device, dir) in entries(&self.class)? {
            let read_opt = |file: &str| match std::fs::read_to_string(dir.join(file)) {
                Ok(t) => Ok(t.trim_end().to_owned()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
                Err(e) => Err(CollectError::io(dir.join(file), e)),
            };
            // fw_ver is there for every driver since Linux 4.10; the others may be absent.
            let firmware = read(&dir.join("fw_ver"))?;
            let (board, hca) = (read_opt("board_id")?, read_opt("hca_type")?);
            out.gauge(
                "ceems_infiniband_info",
                "Non-numeric data from /sys/class/infiniband/<device>, value is always 1.",
                Labels::new(&[
                    ("board_id", &board),
                    ("device", &device),
                    ("firmware_version", &firmware),
                    ("hca_type", &hca),
                ]),
                1.0,
            );
            for (port, port_dir) in entries(&dir.join("ports"))? {
                if port.parse::<u32>().is_err() {
                    return Err(CollectError::Other(format!(
                        "{}: `{port}` is not a port number",
                        port_dir.display()
                    )));
                }
                self.port(out, &device, &port, &port_dir)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers() {
        assert_eq!(parse_state("4: ACTIVE\n").unwrap(), 4);
        assert_eq!(parse_state("5: LinkUp").unwrap(), 5);
        assert!(parse_state("ACTIVE").is_err());
        assert!(parse_state("x: ACTIVE").is_err());
        assert!(parse_state("1: a: b").is_err());
        assert_eq!(parse_rate("100 Gb/sec (4X EDR)").unwrap(), 12.5e9);
        assert_eq!(parse_rate("25 Gb/sec (1X EDR)").unwrap(), 3.125e9);
        assert_eq!(parse_rate("2.5 Gb/sec (1X SDR)").unwrap(), 312_500_000.0);
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("-1 Gb/sec").is_err());
        assert!(parse_rate("NaN Gb/sec").is_err());
        assert_eq!(parse_counter("3599\n").unwrap(), Some(3599));
        assert_eq!(parse_counter("N/A (no PMA)\n").unwrap(), None);
        assert!(parse_counter("lots").is_err());
    }

    #[test]
    fn reads_a_port_and_multiplies_data_by_lanes() {
        let tmp = tempfile::tempdir().unwrap();
        let dev = tmp.path().join("class/infiniband/mlx5_0");
        let port = dev.join("ports/1");
        std::fs::create_dir_all(port.join("counters")).unwrap();
        std::fs::create_dir_all(port.join("counters_ext")).unwrap();
        std::fs::write(dev.join("fw_ver"), "14.28.2006\n").unwrap();
        std::fs::write(port.join("state"), "4: ACTIVE\n").unwrap();
        std::fs::write(port.join("phys_state"), "5: LinkUp\n").unwrap();
        std::fs::write(port.join("rate"), "40 Gb/sec (4X QDR)\n").unwrap();
        std::fs::write(port.join("counters/port_rcv_data"), "10\n").unwrap();
        std::fs::write(port.join("counters/symbol_error"), "N/A (no PMA)\n").unwrap();
        std::fs::write(port.join("counters/unknown_counter"), "7\n").unwrap();
        std::fs::write(port.join("counters_ext/port_xmit_data_64"), "5\n").unwrap();
        let c = InfinibandCollector {
            class: tmp.path().join("class/infiniband"),
        };
        let mut out = MetricSet::new();
        c.collect(&mut out).unwrap();
        let mut text = String::new();
        out.encode_text(&mut text);
        for line in [
            r#"ceems_infiniband_info{board_id="",device="mlx5_0",firmware_version="14.28.2006",hca_type=""} 1"#,
            r#"ceems_infiniband_port_data_received_bytes_total{device="mlx5_0",port="1"} 40"#,
            r#"ceems_infiniband_legacy_data_transmitted_bytes_total{device="mlx5_0",port="1"} 20"#,
            r#"ceems_infiniband_rate_bytes_per_second{device="mlx5_0",port="1"} 5e+09"#,
            r#"ceems_infiniband_physical_state_id{device="mlx5_0",port="1"} 5"#,
        ] {
            assert!(text.contains(line), "no {line} in\n{text}");
        }
        assert!(!text.contains("symbol_error"), "{text}");

        // A malformed counter fails the collector with the file named.
        std::fs::write(port.join("counters/link_downed"), "twelve\n").unwrap();
        let err = c.collect(&mut MetricSet::new()).unwrap_err().to_string();
        assert!(err.contains("link_downed"), "{err}");
    }

    #[test]
    fn no_class_directory_is_absence() {
        let c = InfinibandCollector {
            class: PathBuf::from("/nonexistent/class/infiniband"),
        };
        assert!(matches!(
            c.collect(&mut MetricSet::new()),
            Err(CollectError::Absent(_))
        ));
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in "\\PC*") {
            let _ = parse_state(&s);
            let _ = parse_rate(&s);
            let _ = parse_counter(&s);
        }
    }
}
