//! The eBPF sub-collector (`--collector.ebpf.*`): file system IO and network traffic per unit,
//! inside the unit collectors as in CEEMS. The kernel side (`bpf/ceems.bpf.c`) counts per
//! cgroup; here each unit's cgroups (its directory and every one below, as long as the unit
//! lives) are summed under the unit's uuid. A unit that ends has its cgroups' entries removed
//! from the maps.
//!
//! A program that cannot be loaded or attached (an old kernel, no BTF, lockdown) turns the
//! sub-collector off with one log line; the unit collector goes on without it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Deserialize;

use crate::collect::Capability;
use crate::host::cgroup::CgroupVersion;
use crate::host::ebpf::{self, ProgramGroup, Programs, Snapshot};
use crate::metrics::{Labels, MetricSet};

/// `[exporter.collector.ebpf]`: CEEMS's `--collector.ebpf.*` flags.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct EbpfSettings {
    #[serde(default)]
    pub io_metrics: bool,
    #[serde(default)]
    pub network_metrics: bool,
    #[serde(default)]
    pub fs_mount_points: Vec<String>,
}

impl EbpfSettings {
    pub fn enabled(&self) -> bool {
        self.io_metrics || self.network_metrics
    }
}

/// Loading tracepoint programs and reading their maps (`CAP_SYS_ADMIN` on kernels before 5.8,
/// which have neither `CAP_BPF` nor `CAP_PERFMON`), and finding the tracepoints' ids in
/// tracefs, which is root's alone.
pub fn capabilities() -> &'static [Capability] {
    const SPLIT: &[Capability] = &[
        Capability::CAP_BPF,
        Capability::CAP_DAC_READ_SEARCH,
        Capability::CAP_PERFMON,
    ];
    const ADMIN: &[Capability] = &[Capability::CAP_DAC_READ_SEARCH, Capability::CAP_SYS_ADMIN];
    if super::perf::kernel_knows(Capability::CAP_BPF) {
        SPLIT
    } else {
        ADMIN
    }
}

/// A unit as the eBPF sub-collector needs it.
pub struct EbpfUnit<'a> {
    pub uuid: &'a str,
    pub dir: &'a Path,
    pub rel: &'a Path,
}

/// A unit's cgroups in the hierarchy that keys the maps.
#[derive(Default)]
struct UnitCgroups {
    /// Every cgroup id seen, kept for the unit's life so a step's counts stay after it ends.
    ids: HashSet<u64>,
    /// The subtree as last walked: walked again only when it changed (a step came or went).
    shape: Option<crate::host::cgroup::SubtreeShape>,
}

#[derive(Default)]
struct State {
    cgroups: HashMap<String, UnitCgroups>,
    /// dev_t → mount point, refreshed when an unknown device shows up.
    mounts: HashMap<u32, String>,
}

/// The eBPF sub-collector of one unit collector.
pub struct EbpfStats {
    programs: Arc<Mutex<Programs>>,
    io: bool,
    network: bool,
    mount_filter: Vec<String>,
    /// v2: the hierarchy's root; v1: the memory controller's, whose cgroup ids key the maps.
    keyed_root: Option<PathBuf>,
    version: CgroupVersion,
    procfs: PathBuf,
    capabilities: &'static [Capability],
    state: Mutex<State>,
}

impl EbpfStats {
    /// None when no eBPF flag is on, or (logged) when the programs cannot be loaded here.
    pub fn for_collector(
        ctx: &crate::collect::Context,
        version: CgroupVersion,
    ) -> Option<EbpfStats> {
        EbpfStats::new(
            &ctx.common.ebpf,
            &ctx.paths.procfs,
            &ctx.paths.cgroupfs,
            version,
        )
    }

    pub fn new(
        settings: &EbpfSettings,
        procfs: &Path,
        cgroupfs: &Path,
        version: CgroupVersion,
    ) -> Option<EbpfStats> {
        if !settings.enabled() {
            return None;
        }
        let (subsys, keyed_root) = match version {
            CgroupVersion::V2 => (-1, None),
            CgroupVersion::V1 => {
                let text = std::fs::read_to_string(procfs.join("cgroups")).unwrap_or_default();
                match ebpf::subsystem_id(&text, "memory") {
                    Ok(Some(id)) => (id, Some(cgroupfs.join("memory"))),
                    _ => {
                        tracing::error!(
                            path = %procfs.join("cgroups").display(),
                            "eBPF sub-collector off: no cgroup v1 memory controller to key jobs by"
                        );
                        return None;
                    }
                }
            }
        };
        let mut groups = Vec::new();
        if settings.io_metrics {
            groups.push(ProgramGroup::Io);
        }
        if settings.network_metrics {
            groups.push(ProgramGroup::Network);
        }
        let caps = capabilities();
        let loaded = crate::security::with_capabilities(caps, move || ebpf::load(&groups, subsys));
        let programs = match loaded {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "eBPF sub-collector off: its programs cannot run on this kernel; the rest of the collector goes on");
                return None;
            }
        };
        for (function, why) in &programs.skipped {
            tracing::warn!(function, error = %why, "eBPF program not attached; what it counts is missing");
        }
        tracing::info!(
            io = settings.io_metrics,
            network = settings.network_metrics,
            mount_points = ?settings.fs_mount_points,
            "eBPF sub-collector on"
        );
        Some(EbpfStats {
            programs: Arc::new(Mutex::new(programs)),
            io: settings.io_metrics,
            network: settings.network_metrics,
            mount_filter: settings.fs_mount_points.clone(),
            keyed_root,
            version,
            procfs: procfs.to_owned(),
            capabilities: caps,
            state: Mutex::new(State::default()),
        })
    }

    /// The directory whose subtree holds the unit's cgroups in the hierarchy that keys the maps.
    fn keyed_dir(&self, unit: &EbpfUnit<'_>) -> PathBuf {
        match (&self.version, &self.keyed_root) {
            (CgroupVersion::V1, Some(root)) => root.join(unit.rel),
            _ => unit.dir.to_owned(),
        }
    }

    pub fn collect(
        &self,
        units: &[EbpfUnit<'_>],
        manager: &str,
        hostname: &str,
        out: &mut MetricSet,
    ) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for unit in units {
            let known = state.cgroups.entry(unit.uuid.to_owned()).or_default();
            if !known.shape.as_ref().is_some_and(|s| s.unchanged()) {
                let dir = self.keyed_dir(unit);
                // Stamped before the walk, so a change during it shows next time.
                known.shape = Some(crate::host::cgroup::shape(&dir));
                subtree_ids(&dir, &mut known.ids);
            }
        }
        let present: HashSet<&str> = units.iter().map(|u| u.uuid).collect();
        let ended: HashSet<u64> = state
            .cgroups
            .iter()
            .filter(|(uuid, _)| !present.contains(uuid.as_str()))
            .flat_map(|(_, known)| known.ids.iter().copied())
            .collect();
        state
            .cgroups
            .retain(|uuid, _| present.contains(uuid.as_str()));

        let programs = Arc::clone(&self.programs);
        let snapshot: Snapshot = crate::security::privileged(self.capabilities, move || {
            let mut p = programs.lock().unwrap_or_else(|p| p.into_inner());
            if !ended.is_empty() {
                p.forget(&ended);
            }
            p.snapshot()
        });
        let State { cgroups, mounts } = &mut *state;
        let owner: HashMap<u64, &str> = cgroups
            .iter()
            .flat_map(|(uuid, known)| known.ids.iter().map(move |id| (*id, uuid.as_str())))
            .collect();
        if self.io {
            let unknown = snapshot
                .reads
                .iter()
                .chain(&snapshot.writes)
                .any(|(k, _)| owner.contains_key(&k.cgroup) && !mounts.contains_key(&k.dev));
            if unknown {
                if let Ok(text) = std::fs::read_to_string(self.procfs.join("self/mountinfo")) {
                    if let Ok(m) = ebpf::mount_points(&text) {
                        *mounts = m;
                    }
                }
            }
            emit_io(
                &self.mount_filter,
                &snapshot,
                &owner,
                mounts,
                manager,
                hostname,
                out,
            );
        }
        if self.network {
            emit_network(&snapshot, &owner, manager, hostname, out);
        }
    }
}

/// The IO series' names and help, reads then writes: bytes, requests, errors.
const IO_SERIES: [[(&str, &str); 3]; 2] = [
    [
        (
            "ceems_ebpf_read_bytes_total",
            "Total number of bytes read from a cgroup",
        ),
        (
            "ceems_ebpf_read_requests_total",
            "Total number of read requests from a cgroup",
        ),
        (
            "ceems_ebpf_read_errors_total",
            "Total number of read errors from a cgroup",
        ),
    ],
    [
        (
            "ceems_ebpf_write_bytes_total",
            "Total number of bytes written from a cgroup",
        ),
        (
            "ceems_ebpf_write_requests_total",
            "Total number of write requests from a cgroup",
        ),
        (
            "ceems_ebpf_write_errors_total",
            "Total number of write errors from a cgroup",
        ),
    ],
];

/// The file operations' series, requests then errors: open, create, unlink.
const FILE_OP_SERIES: [[(&str, &str); 2]; 3] = [
    [
        (
            "ceems_ebpf_open_requests_total",
            "Total number of open requests from a cgroup",
        ),
        (
            "ceems_ebpf_open_errors_total",
            "Total number of open errors from a cgroup",
        ),
    ],
    [
        (
            "ceems_ebpf_create_requests_total",
            "Total number of create requests from a cgroup",
        ),
        (
            "ceems_ebpf_create_errors_total",
            "Total number of create errors from a cgroup",
        ),
    ],
    [
        (
            "ceems_ebpf_unlink_requests_total",
            "Total number of unlink requests from a cgroup",
        ),
        (
            "ceems_ebpf_unlink_errors_total",
            "Total number of unlink errors from a cgroup",
        ),
    ],
];

/// The traffic series, packets then bytes: ingress, egress, retransmissions.
const TRAFFIC_SERIES: [[(&str, &str); 2]; 3] = [
    [
        (
            "ceems_ebpf_ingress_packets_total",
            "Total number of ingress packets from a cgroup",
        ),
        (
            "ceems_ebpf_ingress_bytes_total",
            "Total number of ingress bytes from a cgroup",
        ),
    ],
    [
        (
            "ceems_ebpf_egress_packets_total",
            "Total number of egress packets from a cgroup",
        ),
        (
            "ceems_ebpf_egress_bytes_total",
            "Total number of egress bytes from a cgroup",
        ),
    ],
    [
        (
            "ceems_ebpf_retrans_packets_total",
            "Total number of retransmission packets from a cgroup",
        ),
        (
            "ceems_ebpf_retrans_bytes_total",
            "Total number of retransmission bytes from a cgroup",
        ),
    ],
];

fn emit_io(
    mount_filter: &[String],
    snapshot: &Snapshot,
    owner: &HashMap<u64, &str>,
    mounts: &HashMap<u32, String>,
    manager: &str,
    hostname: &str,
    out: &mut MetricSet,
) {
    for (map, series) in [&snapshot.reads, &snapshot.writes]
        .into_iter()
        .zip(&IO_SERIES)
    {
        let mut sums: BTreeMap<(&str, &str), [u64; 3]> = BTreeMap::new();
        for (key, value) in map {
            let (Some(uuid), Some(mount)) = (owner.get(&key.cgroup), mounts.get(&key.dev)) else {
                continue;
            };
            // CEEMS's filter: a mount point containing one of the given strings.
            if !mount_filter.is_empty() && !mount_filter.iter().any(|m| mount.contains(m.as_str()))
            {
                continue;
            }
            let sum = sums.entry((uuid, mount.as_str())).or_default();
            sum[0] += value.bytes;
            sum[1] += value.calls;
            sum[2] += value.errors;
        }
        for ((uuid, mount), values) in sums {
            let labels = Labels::new(&[
                ("hostname", hostname),
                ("manager", manager),
                ("mountpoint", mount),
                ("uuid", uuid),
            ]);
            for ((name, help), value) in series.iter().zip(values) {
                out.counter(name, help, labels.clone(), value as f64);
            }
        }
    }
    let mut ops: BTreeMap<&str, [u64; 6]> = BTreeMap::new();
    for (cgroup, v) in &snapshot.file_ops {
        let Some(uuid) = owner.get(cgroup) else {
            continue;
        };
        let sum = ops.entry(uuid).or_default();
        for (s, x) in sum.iter_mut().zip([
            v.open_calls,
            v.open_errors,
            v.create_calls,
            v.create_errors,
            v.unlink_calls,
            v.unlink_errors,
        ]) {
            *s += x;
        }
    }
    for (uuid, values) in ops {
        let labels = Labels::new(&[("hostname", hostname), ("manager", manager), ("uuid", uuid)]);
        emit_pairs(out, &labels, &FILE_OP_SERIES, &values);
    }
}

/// The cgroup ids of `dir` and every cgroup below it (a cgroup's id is its inode number).
fn subtree_ids(dir: &Path, ids: &mut HashSet<u64>) {
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(meta) = std::fs::metadata(&d) else {
            continue;
        };
        ids.insert(meta.ino());
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
}

fn proto_name(proto: u16) -> Option<&'static str> {
    match proto {
        6 => Some("tcp"),
        17 => Some("udp"),
        _ => None,
    }
}

fn family_name(family: u16) -> Option<&'static str> {
    match family {
        2 => Some("ipv4"),
        10 => Some("ipv6"),
        _ => None,
    }
}

fn emit_network(
    snapshot: &Snapshot,
    owner: &HashMap<u64, &str>,
    manager: &str,
    hostname: &str,
    out: &mut MetricSet,
) {
    let mut sums: BTreeMap<(&str, &str, &str), [u64; 6]> = BTreeMap::new();
    for (key, v) in &snapshot.traffic {
        // Unix sockets and other families are not network traffic.
        let (Some(uuid), Some(proto), Some(family)) = (
            owner.get(&key.cgroup),
            proto_name(key.proto),
            family_name(key.family),
        ) else {
            continue;
        };
        let sum = sums.entry((uuid, proto, family)).or_default();
        for (s, x) in sum.iter_mut().zip([
            v.ingress_packets,
            v.ingress_bytes,
            v.egress_packets,
            v.egress_bytes,
            v.retrans_packets,
            v.retrans_bytes,
        ]) {
            *s += x;
        }
    }
    for ((uuid, proto, family), values) in sums {
        let labels = Labels::new(&[
            ("family", family),
            ("hostname", hostname),
            ("manager", manager),
            ("proto", proto),
            ("uuid", uuid),
        ]);
        emit_pairs(out, &labels, &TRAFFIC_SERIES, &values);
    }
}

/// Each pair of series with its two values, in order.
fn emit_pairs(
    out: &mut MetricSet,
    labels: &Labels,
    series: &[[(&str, &str); 2]; 3],
    values: &[u64; 6],
) {
    for (pair, v) in series.iter().zip(values.chunks_exact(2)) {
        for ((name, help), value) in pair.iter().zip(v) {
            out.counter(name, help, labels.clone(), *value as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::ebpf::{FileOps, IoKey, IoValue, NetKey, NetValue};

    #[test]
    fn maps_are_summed_per_unit_and_mount_point() {
        let snapshot = Snapshot {
            reads: vec![
                (
                    IoKey {
                        cgroup: 1,
                        dev: 8 << 20,
                        pad: 0,
                    },
                    IoValue {
                        bytes: 10,
                        calls: 1,
                        errors: 0,
                    },
                ),
                (
                    IoKey {
                        cgroup: 2,
                        dev: 8 << 20,
                        pad: 0,
                    },
                    IoValue {
                        bytes: 5,
                        calls: 2,
                        errors: 1,
                    },
                ),
                // Another job's cgroup and an unknown device: left out.
                (
                    IoKey {
                        cgroup: 9,
                        dev: 8 << 20,
                        pad: 0,
                    },
                    IoValue {
                        bytes: 99,
                        calls: 9,
                        errors: 9,
                    },
                ),
                (
                    IoKey {
                        cgroup: 1,
                        dev: 7,
                        pad: 0,
                    },
                    IoValue {
                        bytes: 99,
                        calls: 9,
                        errors: 9,
                    },
                ),
            ],
            writes: Vec::new(),
            file_ops: vec![(
                2,
                FileOps {
                    open_calls: 3,
                    create_errors: 1,
                    ..FileOps::default()
                },
            )],
            traffic: vec![
                (
                    NetKey {
                        cgroup: 1,
                        proto: 6,
                        family: 2,
                        pad: 0,
                    },
                    NetValue {
                        egress_bytes: 1000,
                        egress_packets: 3,
                        ..NetValue::default()
                    },
                ),
                // AF_UNIX: not network traffic.
                (
                    NetKey {
                        cgroup: 1,
                        proto: 6,
                        family: 1,
                        pad: 0,
                    },
                    NetValue {
                        egress_bytes: 7,
                        ..NetValue::default()
                    },
                ),
            ],
        };
        let owner: HashMap<u64, &str> = [(1, "42"), (2, "42")].into_iter().collect();
        let mounts: HashMap<u32, String> = [(8 << 20, "/scratch".to_owned())].into_iter().collect();
        let mut out = MetricSet::new();
        emit_io(&[], &snapshot, &owner, &mounts, "slurm", "n1", &mut out);
        emit_network(&snapshot, &owner, "slurm", "n1", &mut out);
        let mut text = String::new();
        out.encode_text(&mut text);
        assert!(text.contains("ceems_ebpf_read_bytes_total{hostname=\"n1\",manager=\"slurm\",mountpoint=\"/scratch\",uuid=\"42\"} 15"), "{text}");
        assert!(text.contains("ceems_ebpf_read_errors_total{hostname=\"n1\",manager=\"slurm\",mountpoint=\"/scratch\",uuid=\"42\"} 1"));
        assert!(text.contains(
            "ceems_ebpf_create_errors_total{hostname=\"n1\",manager=\"slurm\",uuid=\"42\"} 1"
        ));
        assert!(text.contains("ceems_ebpf_egress_bytes_total{family=\"ipv4\",hostname=\"n1\",manager=\"slurm\",proto=\"tcp\",uuid=\"42\"} 1000"));
        assert!(!text.contains(" 99\n") && !text.contains("family=\"\""));
        // CEEMS's mount point filter: a substring of the mount point.
        let mut out = MetricSet::new();
        emit_io(
            &["/home".to_owned()],
            &snapshot,
            &owner,
            &mounts,
            "slurm",
            "n1",
            &mut out,
        );
        let mut text = String::new();
        out.encode_text(&mut text);
        assert!(!text.contains("ceems_ebpf_read_bytes_total"), "{text}");
        assert!(text.contains("ceems_ebpf_open_requests_total"));
    }
}
