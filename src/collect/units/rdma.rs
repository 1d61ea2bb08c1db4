//! `--collector.rdma.stats`, with the slurm collector: the RDMA resources each job's processes hold (memory regions,
//! completion queues, queue pairs, from the `rdma` tool of iproute2), the hardware counters of
//! their queue pairs where the link counts them per process, and each port's traffic from
//! `<sysfs>/class/infiniband`. Runs inside the unit collector, as in CEEMS, so its series carry
//! the collector's `manager` and its failures are logged, not fatal to the scrape.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::Deserialize;

use crate::collect::infiniband::{self, port_counter};
use crate::collect::Capability;
use crate::host::command::{self, CommandError};
use crate::host::rdma::{self, QpCounters, Resource, ResourceKind, QP_COUNTERS};
use crate::host::ParseError;
use crate::metrics::{Labels, MetricSet};

/// `[exporter.collector.rdma]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RdmaSettings {
    #[serde(default)]
    pub stats: bool,
    #[serde(default)]
    pub cmd: Option<PathBuf>,
}

/// What turning per-process queue pair counters on or off needs (the kernel's RDMA netlink
/// checks it for `rdma statistic qp set`).
pub const CAPABILITIES: &[Capability] = &[Capability::CAP_NET_ADMIN];

/// Port counter files exported per port, as CEEMS names them under `ceems_rdma_`.
const PORT_COUNTERS: &[(&str, &str)] = &[
    (
        "port_rcv_constraint_errors",
        "port_constraint_errors_received_total",
    ),
    (
        "port_xmit_constraint_errors",
        "port_constraint_errors_transmitted_total",
    ),
    ("port_rcv_data", "port_data_received_bytes_total"),
    ("port_xmit_data", "port_data_transmitted_bytes_total"),
    ("port_rcv_discards", "port_discards_received_total"),
    ("port_xmit_discards", "port_discards_transmitted_total"),
    ("port_rcv_errors", "port_errors_received_total"),
    ("port_rcv_packets", "port_packets_received_total"),
    ("port_xmit_packets", "port_packets_transmitted_total"),
];

/// Help texts of the per-process queue pair counters, in the order of [`QP_COUNTERS`].
const QP_COUNTER_HELP: [&str; QP_COUNTERS.len()] = [
    "Number of received write requests for the associated QPs",
    "Number of received read requests for the associated QPs",
    "Number of received atomic request for the associated QPs",
    "Number of times requester detected CQEs completed with errors",
    "Number of times requester detected CQEs completed with flushed errors",
    "Number of times requester detected remote access errors",
    "Number of times requester detected remote invalid request errors",
    "Number of times responder detected CQEs completed with errors",
    "Number of times responder detected CQEs completed with flushed errors",
    "Number of times responder detected local length errors",
    "Number of times responder detected remote access errors",
];

/// A Mellanox link and what this exporter did to its per-process counting.
#[derive(Debug)]
struct Link {
    name: String,
    per_process: bool,
    /// Turned on by this exporter: turned off again when it stops.
    turned_on: bool,
    /// A failure to turn it on was logged at warning level once.
    warned: bool,
    /// Scrapes to let pass before trying again after a failure: doubles up to
    /// [`MAX_BACKOFF`], so a node that never allows it does not run the tool at every scrape.
    backoff: u32,
    wait: u32,
}

/// Longest wait, in scrapes, between two tries to turn per-process counting on.
const MAX_BACKOFF: u32 = 64;

/// The RDMA part of a unit collector.
pub struct RdmaStats {
    cmd: Option<PathBuf>,
    class: PathBuf,
    timeout: Duration,
    links: Mutex<Vec<Link>>,
}

#[derive(Debug, thiserror::Error)]
enum RdmaError {
    #[error("the rdma tool of iproute2 was not found")]
    NoTool,
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error("`{program} {args}` printed something unexpected: {source}")]
    Parse {
        program: String,
        args: String,
        source: ParseError,
    },
}

impl RdmaStats {
    /// `None` unless `settings.stats`, or when the node has no RDMA device (logged).
    pub fn from_settings(
        settings: &RdmaSettings,
        sysfs: &Path,
        timeout: Duration,
    ) -> Option<RdmaStats> {
        if !settings.stats {
            return None;
        }
        let class = sysfs.join("class/infiniband");
        if !class.is_dir() {
            tracing::warn!(path = %class.display(), "no RDMA device: --collector.rdma.stats exports nothing");
            return None;
        }
        let cmd = match &settings.cmd {
            Some(c) => Some(c.clone()),
            None => {
                let found = command::find_program("rdma", std::env::var_os("PATH").as_deref());
                if found.is_none() {
                    tracing::warn!("the rdma tool (iproute2) is not on PATH: only port counters are exported; install iproute2 or set --collector.rdma.cmd");
                }
                found
            }
        };
        let stats = RdmaStats {
            cmd,
            class,
            timeout,
            links: Mutex::new(Vec::new()),
        };
        let links = match stats.run(&["statistic", "qp", "mode"]) {
            Ok(text) => rdma::qp_modes(&text),
            Err(RdmaError::NoTool) => Vec::new(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the RDMA links' queue pair counter modes");
                Vec::new()
            }
        };
        if !links.is_empty() {
            tracing::info!(
                links = links.len(),
                "per-process queue pair counters available"
            );
        }
        *stats.lock_links() = links
            .into_iter()
            .map(|m| Link {
                name: m.link,
                per_process: m.per_process,
                turned_on: false,
                warned: false,
                backoff: 0,
                wait: 0,
            })
            .collect();
        Some(stats)
    }

    fn lock_links(&self) -> std::sync::MutexGuard<'_, Vec<Link>> {
        self.links.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn run(&self, args: &[&str]) -> Result<String, RdmaError> {
        let Some(cmd) = &self.cmd else {
            return Err(RdmaError::NoTool);
        };
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        Ok(command::run(cmd, &args, self.timeout)?)
    }

    fn parsed<T>(
        &self,
        args: &[&str],
        parse: impl FnOnce(&str) -> Result<T, ParseError>,
    ) -> Result<T, RdmaError> {
        let text = self.run(args)?;
        parse(&text).map_err(|source| RdmaError::Parse {
            program: "rdma".to_owned(),
            args: args.join(" "),
            source,
        })
    }

    /// Turns per-process counting on for the links where it is off (a link in use cannot
    /// switch, so this is tried again, less and less often, until it holds).
    fn turn_on_per_process(&self) {
        let mut links = self.lock_links();
        for link in links.iter_mut().filter(|l| !l.per_process) {
            if link.wait > 0 {
                link.wait -= 1;
                continue;
            }
            let args = [
                "statistic",
                "qp",
                "set",
                "link",
                &link.name,
                "auto",
                "type,pid",
                "on",
            ];
            match crate::security::with_capabilities_for_child(CAPABILITIES, || self.run(&args)) {
                Ok(_) => {
                    tracing::info!(link = %link.name, "per-process queue pair counters turned on");
                    link.per_process = true;
                    link.turned_on = true;
                }
                Err(e) => {
                    link.backoff = (link.backoff * 2).clamp(1, MAX_BACKOFF);
                    link.wait = link.backoff;
                    if link.warned {
                        tracing::debug!(link = %link.name, error = %e, "cannot turn on per-process queue pair counters")
                    } else {
                        tracing::warn!(link = %link.name, error = %e, "cannot turn on per-process queue pair counters; trying again later (a link in use cannot switch)");
                        link.warned = true;
                    }
                }
            }
        }
    }

    /// Emits the RDMA series of `units`, given as `(uuid, pids)`.
    pub fn collect(
        &self,
        units: &[(String, Vec<u32>)],
        manager: &str,
        hostname: &str,
        out: &mut MetricSet,
    ) {
        self.turn_on_per_process();
        let owner: HashMap<u32, &str> = units
            .iter()
            .flat_map(|(uuid, pids)| pids.iter().map(move |p| (*p, uuid.as_str())))
            .collect();
        let per_process = self.lock_links().iter().any(|l| l.per_process);
        let (mrs, cqs, qps, counters) = std::thread::scope(|s| {
            let show = |kind: ResourceKind| {
                s.spawn(move || {
                    self.parsed(&["resource", "show", kind.arg()], |t| {
                        rdma::resources(t, kind)
                    })
                })
            };
            let mrs = show(ResourceKind::MemoryRegion);
            let cqs = show(ResourceKind::CompletionQueue);
            let qps = show(ResourceKind::QueuePair);
            let counters = per_process
                .then(|| s.spawn(|| self.parsed(&["statistic", "qp", "show"], rdma::qp_counters)));
            (joined(mrs), joined(cqs), joined(qps), counters.map(joined))
        });
        let labels = |device: &str, port: &str, uuid: &str| {
            Labels::new(&[
                ("device", device),
                ("hostname", hostname),
                ("manager", manager),
                ("port", port),
                ("uuid", uuid),
            ])
        };
        let families = [
            (
                mrs,
                "memory regions",
                ("ceems_rdma_mrs_active", "Number of active MRs"),
                Some(("ceems_rdma_mrs_len_active", "Length of active MRs")),
            ),
            (
                cqs,
                "completion queues",
                ("ceems_rdma_cqs_active", "Number of active CQs"),
                Some(("ceems_rdma_cqe_len_active", "Length of active CQs")),
            ),
            (
                qps,
                "queue pairs",
                ("ceems_rdma_qps_active", "Number of active QPs"),
                None,
            ),
        ];
        for (listed, what, (count_name, count_help), size) in families {
            let listed = match listed {
                Ok(l) => l,
                // Said once at start-up.
                Err(RdmaError::NoTool) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list RDMA {what}");
                    continue;
                }
            };
            for ((uuid, device, port), (n, len)) in per_unit(&listed, &owner) {
                let labels = labels(device, port, uuid);
                out.gauge(count_name, count_help, labels.clone(), n as f64);
                if let Some((name, help)) = size {
                    out.gauge(name, help, labels, len as f64);
                }
            }
        }
        match counters {
            None => {}
            Some(Err(e)) => {
                tracing::warn!(error = %e, "cannot read per-process queue pair counters")
            }
            Some(Ok(objects)) => {
                for ((uuid, device, port), values) in counters_per_unit(&objects, &owner) {
                    for ((name, help), v) in QP_COUNTERS.iter().zip(QP_COUNTER_HELP).zip(values) {
                        if v > 0 {
                            out.counter(
                                &format!("ceems_rdma_{name}"),
                                help,
                                labels(device, port, uuid),
                                v as f64,
                            );
                        }
                    }
                }
            }
        }
        self.ports(manager, hostname, out);
    }

    /// Each port's state and traffic; counters at 0 are left out, as CEEMS does.
    fn ports(&self, manager: &str, hostname: &str, out: &mut MetricSet) {
        let devices = match infiniband::entries(&self.class) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list RDMA devices");
                return;
            }
        };
        for (device, dir) in devices {
            for (port, port_dir) in infiniband::entries(&dir.join("ports")).unwrap_or_default() {
                let labels = Labels::new(&[
                    ("device", &device),
                    ("hostname", hostname),
                    ("manager", manager),
                    ("port", &port),
                ]);
                match infiniband::parse_at(&port_dir.join("state"), infiniband::parse_state) {
                    Ok(state) if state > 0 => out.gauge(
                        "ceems_rdma_state_id",
                        "State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, 4: active, 5: act defer)",
                        labels.clone(),
                        f64::from(state),
                    ),
                    Ok(_) => {}
                    Err(e) => tracing::debug!(error = %e, "cannot read RDMA port state"),
                }
                for (file, metric) in PORT_COUNTERS {
                    let Some((help, per_lane)) = port_counter(file) else {
                        continue;
                    };
                    let path = port_dir.join("counters").join(file);
                    let Ok(text) = std::fs::read_to_string(&path) else {
                        continue;
                    };
                    match infiniband::parse_counter(&text) {
                        Ok(Some(v)) if v > 0 => {
                            let v = if per_lane { v.wrapping_mul(4) } else { v };
                            out.counter(
                                &format!("ceems_rdma_{metric}"),
                                help,
                                labels.clone(),
                                v as f64,
                            );
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::debug!(path = %path.display(), error = %e, "cannot read RDMA port counter")
                        }
                    }
                }
            }
        }
    }
}

impl Drop for RdmaStats {
    /// Leaves the links as this exporter found them.
    fn drop(&mut self) {
        let links = std::mem::take(&mut *self.lock_links());
        for link in links.iter().filter(|l| l.turned_on) {
            let args = ["statistic", "qp", "set", "link", &link.name, "auto", "off"];
            match crate::security::with_capabilities_for_child(CAPABILITIES, || self.run(&args)) {
                Ok(_) => {
                    tracing::info!(link = %link.name, "per-process queue pair counters turned off")
                }
                Err(e) => {
                    tracing::warn!(link = %link.name, error = %e, "cannot turn per-process queue pair counters off")
                }
            }
        }
    }
}

/// Resources of the units' processes, counted and summed per unit, device and port.
fn per_unit<'a>(
    listed: &'a [Resource],
    owner: &HashMap<u32, &'a str>,
) -> BTreeMap<(&'a str, &'a str, &'a str), (u64, u64)> {
    let mut out: BTreeMap<(&str, &str, &str), (u64, u64)> = BTreeMap::new();
    for r in listed {
        let Some(uuid) = r.pid.and_then(|p| owner.get(&p)) else {
            continue;
        };
        let e = out.entry((uuid, &r.device, &r.port)).or_default();
        e.0 += 1;
        e.1 = e.1.saturating_add(r.size);
    }
    out
}

/// Queue pair counters of the units' processes, summed per unit, device and port.
fn counters_per_unit<'a>(
    objects: &'a [QpCounters],
    owner: &HashMap<u32, &'a str>,
) -> BTreeMap<(&'a str, &'a str, &'a str), [u64; QP_COUNTERS.len()]> {
    let mut out: BTreeMap<(&str, &str, &str), [u64; QP_COUNTERS.len()]> = BTreeMap::new();
    for c in objects {
        let Some(uuid) = owner.get(&c.pid) else {
            continue;
        };
        let sums = out
            .entry((uuid, &c.device, &c.port))
            .or_insert([0; QP_COUNTERS.len()]);
        for (s, v) in sums.iter_mut().zip(c.values) {
            *s = s.saturating_add(v);
        }
    }
    out
}

fn joined<T>(h: std::thread::ScopedJoinHandle<'_, T>) -> T {
    h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(device: &str, port: &str, pid: Option<u32>, size: u64) -> Resource {
        Resource {
            device: device.into(),
            port: port.into(),
            pid,
            size,
        }
    }

    #[test]
    fn resources_count_per_unit_and_device_and_skip_other_processes() {
        let listed = vec![
            resource("mlx5_0", "", Some(1), 10),
            resource("mlx5_0", "", Some(2), 5),
            resource("mlx5_1", "", Some(2), 7),
            resource("mlx5_0", "", Some(3), 100),
            resource("mlx5_0", "", None, 100),
        ];
        let owner = HashMap::from([(1, "job1"), (2, "job1")]);
        let got = per_unit(&listed, &owner);
        assert_eq!(got[&("job1", "mlx5_0", "")], (2, 15));
        assert_eq!(got[&("job1", "mlx5_1", "")], (1, 7));
        assert_eq!(got.len(), 2);
    }

    /// A fake `rdma` that logs its arguments and answers as a node with one Mellanox link
    /// whose per-process counting is off.
    fn fake_node(dir: &Path) -> (RdmaSettings, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let port = dir.join("sys/class/infiniband/mlx5_0/ports/1");
        std::fs::create_dir_all(port.join("counters")).unwrap();
        std::fs::write(port.join("state"), "4: ACTIVE\n").unwrap();
        std::fs::write(port.join("counters/port_xmit_data"), "10\n").unwrap();
        std::fs::write(port.join("counters/port_rcv_errors"), "0\n").unwrap();
        let log = dir.join("calls");
        let cmd = dir.join("rdma");
        std::fs::write(
            &cmd,
            format!(
                "#!/bin/sh\necho \"$*\" >> '{}'\ncase \"$*\" in\n\
                 'statistic qp mode') echo 'link mlx5_0/1 qp auto off' ;;\n\
                 'resource show mr') echo 'dev mlx5_0 mrn 4 mrlen 100 pdn 9 pid 11 comm a' ;;\n\
                 'statistic qp show') echo 'link mlx5_0/1 cntn 4 qp-type RC pid 11 comm a rx_write_requests 7' ;;\n\
                 esac\n",
                log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&cmd, std::fs::Permissions::from_mode(0o755)).unwrap();
        (
            RdmaSettings {
                stats: true,
                cmd: Some(cmd),
            },
            log,
        )
    }

    #[test]
    fn turns_per_process_counting_on_and_back_off_and_reads_it() {
        let tmp = tempfile::tempdir().unwrap();
        let (settings, log) = fake_node(tmp.path());
        let stats =
            RdmaStats::from_settings(&settings, &tmp.path().join("sys"), Duration::from_secs(5))
                .expect("a node with an RDMA device");
        let mut out = MetricSet::new();
        stats.collect(&[("42".to_owned(), vec![11])], "slurm", "", &mut out);
        let mut text = String::new();
        out.encode_text(&mut text);
        let job = "{device=\"mlx5_0\",hostname=\"\",manager=\"slurm\",port=\"\",uuid=\"42\"}";
        assert!(
            text.contains(&format!("ceems_rdma_mrs_len_active{job} 100\n")),
            "{text}"
        );
        assert!(text.contains("ceems_rdma_rx_write_requests{device=\"mlx5_0\",hostname=\"\",manager=\"slurm\",port=\"1\",uuid=\"42\"} 7\n"), "{text}");
        // Data counters are per lane; zero counters are left out.
        assert!(text.contains("ceems_rdma_port_data_transmitted_bytes_total{device=\"mlx5_0\",hostname=\"\",manager=\"slurm\",port=\"1\"} 40\n"), "{text}");
        assert!(!text.contains("port_errors_received"), "{text}");
        drop(stats);
        let calls = std::fs::read_to_string(log).unwrap();
        let on = calls.find("statistic qp set link mlx5_0/1 auto type,pid on");
        let off = calls.find("statistic qp set link mlx5_0/1 auto off");
        assert!(on.is_some() && off > on, "{calls}");
    }

    #[test]
    fn a_link_that_refuses_is_tried_less_and_less_often() {
        let tmp = tempfile::tempdir().unwrap();
        let (settings, log) = fake_node(tmp.path());
        let script = std::fs::read_to_string(settings.cmd.as_ref().unwrap()).unwrap();
        // `statistic qp set …` fails, as on a link in use.
        let failing = script.replace("esac", "'statistic qp set'*) exit 1 ;;\nesac");
        std::fs::write(settings.cmd.as_ref().unwrap(), failing).unwrap();
        let stats =
            RdmaStats::from_settings(&settings, &tmp.path().join("sys"), Duration::from_secs(5))
                .unwrap();
        for _ in 0..20 {
            stats.turn_on_per_process();
        }
        let tries = std::fs::read_to_string(&log)
            .unwrap()
            .matches("statistic qp set")
            .count();
        // Scrapes 1, 3, 6, 11 and 20 (waits of 1, 2, 4, 8).
        assert_eq!(tries, 5);
        assert!(!stats.lock_links()[0].per_process);
    }

    #[test]
    fn without_the_tool_the_ports_are_still_exported() {
        let tmp = tempfile::tempdir().unwrap();
        fake_node(tmp.path());
        // As from_settings leaves it when no rdma tool is found.
        let stats = RdmaStats {
            cmd: None,
            class: tmp.path().join("sys/class/infiniband"),
            timeout: Duration::from_secs(1),
            links: Mutex::new(Vec::new()),
        };
        let mut out = MetricSet::new();
        stats.collect(&[("42".to_owned(), vec![11])], "slurm", "", &mut out);
        let mut text = String::new();
        out.encode_text(&mut text);
        assert!(text.contains("ceems_rdma_state_id{"), "{text}");
        assert!(!text.contains("ceems_rdma_mrs_active"), "{text}");
    }

    #[test]
    fn off_without_the_flag_or_without_devices() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut settings, _) = fake_node(tmp.path());
        let t = Duration::from_secs(1);
        assert!(RdmaStats::from_settings(&settings, &tmp.path().join("none"), t).is_none());
        settings.stats = false;
        assert!(RdmaStats::from_settings(&settings, &tmp.path().join("sys"), t).is_none());
    }

    #[test]
    fn queue_pair_counters_of_several_objects_add_up() {
        let mut values = [0; QP_COUNTERS.len()];
        values[0] = 5;
        let objects = vec![
            QpCounters {
                device: "mlx5_0".into(),
                port: "1".into(),
                pid: 7,
                values,
            },
            QpCounters {
                device: "mlx5_0".into(),
                port: "1".into(),
                pid: 8,
                values,
            },
        ];
        let owner = HashMap::from([(7, "42"), (8, "42")]);
        assert_eq!(
            counters_per_unit(&objects, &owner)[&("42", "mlx5_0", "1")][0],
            10
        );
    }
}
