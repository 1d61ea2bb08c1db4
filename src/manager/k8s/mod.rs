//! Kubernetes pods as compute units (`--collector.k8s`). The kubelet puts a pod's containers
//! in one cgroup per pod, under its QoS class: with the cgroupfs driver
//! `kubepods/[burstable|besteffort/]pod<uid>/<container>`, with the systemd driver
//! `kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope`
//! (a Guaranteed pod sits directly under `kubepods`), in each v1 controller or in the v2
//! hierarchy. A pod's directory counts all its containers. Its CPUs are the share the kubelet
//! gave it (`cpu.shares`, or v2's `cpu.weight`), as millicores.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;

pub mod accounting;
pub mod admission;
pub mod api;
pub mod pod;
pub mod podresources;
pub mod setup;

use crate::collect::gpu::{self, GpuDevice};
use crate::collect::units::discovery::populated_units;
use crate::collect::units::{cgroup_version, SubCollector, UnitCollector};
use crate::collect::{CollectError, Collector, CollectorSpec, Context};
use crate::config::{Kind, Opt};
use crate::host::cgroup::detail::DetailOptions;
use crate::host::cgroup::{
    subdirs, CgroupVersion, FileFault, Populated, ReadOptions, V1Controllers,
};
use crate::manager::{ResourceManager, UnitCgroup, UnitGpus};

use api::KubeClient;

pub const MANAGER: &str = "k8s";

/// How a pod asks Kubernetes for resources, in findings' advice.
pub const REQUEST_WORDS: super::RequestWords = super::RequestWords {
    cores: "the pod's resources.requests.cpu",
    memory: "the pod's resources.requests.memory and limits.memory",
    gpus: "the pod's resources.limits, nvidia.com/gpu or amd.com/gpu",
    time: "the pod's activeDeadlineSeconds",
};

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "k8s",
    default_enabled: false,
    // The pod-resources socket is a file: its mode grants access, not a capability.
    capabilities: &[],
    options,
    build,
    self_test: None,
    sub_collectors: &[SubCollector::Perf, SubCollector::Ebpf],
};

/// Which GPUs pods hold is asked again at least this often, even when the pods stay the same.
const GPUS_MAX_AGE: Duration = Duration::from_secs(15 * 60);
/// After a failed lookup, the same pods are asked for again only this much later.
const GPUS_RETRY_AFTER: Duration = Duration::from_secs(60);
/// Longest the API server or the kubelet may take to answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The kubelet's parent cgroups of its pods, per cgroup driver.
const SLICES: [&str; 2] = ["kubepods", "kubepods.slice"];

fn options() -> Vec<Opt> {
    vec![
        Opt::new(
            "collector.k8s.kubeconfig.file",
            Kind::Str,
            "kubeconfig of the Kubernetes API server, to name the pods the kubelet's pod-resources API lists (empty: the in-cluster service account)",
        )
        .default("")
        .renamed_from("collector.k8s.kube-config-file"),
        Opt::new(
            "collector.k8s.kubelet-podresources-socket.file",
            Kind::Str,
            "The kubelet's pod-resources socket, which says which GPUs each pod holds",
        )
        .default("/var/lib/kubelet/pod-resources/kubelet.sock")
        .renamed_from("collector.k8s.kubelet-socket-file"),
        Opt::flag(
            "collector.k8s.psi-metrics",
            "Export pressure stall information of pods (cgroups v2 only)",
        ),
    ]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Settings {
    kubeconfig: FileSetting,
    kubelet_podresources_socket: FileSetting,
    psi_metrics: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSetting {
    file: String,
}

/// The `k8s` collector: pods read and emitted as units.
pub type K8sCollector = UnitCollector<K8sManager>;

fn build(ctx: &Context) -> Result<Box<dyn Collector>, CollectError> {
    let s: Settings = ctx.settings()?;
    let version = cgroup_version(ctx)?;
    let mut manager = K8sManager::new(
        &ctx.paths.cgroupfs,
        version,
        &ctx.common.cgroups.active_subsystem,
    );
    manager.devices = gpu::discover_for_units(&ctx.common.gpu, &ctx.paths.sysfs, "pods");
    let socket = PathBuf::from(&s.kubelet_podresources_socket.file);
    if !manager.devices.is_empty() {
        if !socket.exists() {
            tracing::warn!(socket = %socket.display(), "no kubelet pod-resources socket: which GPUs pods hold is not known");
        } else {
            let kube = match s.kubeconfig.file.trim() {
                "" => KubeClient::in_cluster(Path::new(api::SERVICE_ACCOUNT_DIR), CALL_TIMEOUT),
                file => KubeClient::from_kubeconfig(Path::new(file), CALL_TIMEOUT),
            };
            match kube {
                Ok(kube) => {
                    manager.lookup = Some(GpuLookup {
                        socket,
                        kube,
                        node: std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()),
                    })
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot reach the Kubernetes API server; which GPUs pods hold is not known")
                }
            }
        }
    }
    let found: Vec<String> = manager
        .slices()
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    if found.len() > 1 {
        tracing::warn!(slices = ?found, "pods under both kubepods and kubepods.slice: the kubelet's cgroup driver changed without a reboot");
    }
    tracing::info!(version = ?version, root = %manager.root.display(), slices = ?found, socket = %s.kubelet_podresources_socket.file, kubeconfig = %s.kubeconfig.file, "k8s collector discovers pods");
    let collector = UnitCollector::new(
        manager,
        &ctx.paths.cgroupfs,
        &ctx.paths.procfs,
        version,
        &ctx.hostname,
        // Swap is always read for pods, as CEEMS does.
        ReadOptions {
            swap: true,
            psi: s.psi_metrics,
        },
        SPEC.capabilities,
    )
    // Block IO too, always, as CEEMS reads it for pods.
    .with_detail(DetailOptions {
        io: true,
        ..DetailOptions::default()
    })
    .with_context(ctx, version)?;
    Ok(Box::new(collector))
}

/// The pod UID of a pod cgroup's name: `pod<uid>` (cgroupfs) or
/// `kubepods-<qos>-pod<uid_with_underscores>.slice` (systemd). Static pods' UIDs are hashes
/// without dashes.
pub fn pod_of_cgroup(name: &str) -> Option<String> {
    let name = name.strip_suffix(".slice").unwrap_or(name);
    let at = name.rfind("pod")?;
    let before = &name[..at];
    // `pod` starts the name or follows the slice's `-`.
    if !(before.is_empty() || before.ends_with('-')) {
        return None;
    }
    let uid = &name[at + 3..];
    let ok = !uid.is_empty()
        && uid.len() <= 64
        && uid
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b'-' || b == b'_');
    ok.then(|| uid.replace('_', "-").to_ascii_lowercase())
}

/// Whether a child of a `kubepods` slice holds pods of a QoS class rather than being a pod.
fn is_qos_dir(name: &str) -> bool {
    let name = name.strip_suffix(".slice").unwrap_or(name);
    ["burstable", "besteffort"]
        .iter()
        .any(|q| name == *q || name.ends_with(&format!("-{q}")))
}

/// CPUs of a v1 `cpu.shares` value: the kubelet writes 1024 per CPU (at least 2), so the
/// millicores are `shares * 1000 / 1024`, rounded down as the kubelet rounds up.
pub fn cpus_of_shares(shares: u64) -> f64 {
    (shares.saturating_mul(1000) / 1024) as f64 / 1000.0
}

/// CPUs of a v2 `cpu.weight`: the kubelet maps shares [2, 262144] onto weights [1, 10000];
/// the shares are found back the way runc converts them.
pub fn cpus_of_weight(weight: u64) -> f64 {
    let shares = 2 + (weight.clamp(1, 10_000) - 1) * 262_142 / 9_999;
    cpus_of_shares(shares)
}

/// Kubernetes as a resource manager: its pods.
pub struct K8sManager {
    version: CgroupVersion,
    /// The v1 controller or v2 root that holds the kubelet's slices.
    root: PathBuf,
    /// Where `cpu.shares` is on v1: the `cpu` controller's hierarchy.
    cpu_root: PathBuf,
    populated: Mutex<Populated>,
    devices: Vec<GpuDevice>,
    /// How pods' GPUs are found; None without GPUs, socket or API server.
    lookup: Option<GpuLookup>,
    held: Mutex<HeldGpus>,
}

/// Where the pods' devices come from: the kubelet's pod-resources API names pods by
/// namespace and name, the API server gives their UIDs.
pub struct GpuLookup {
    pub socket: PathBuf,
    pub kube: KubeClient,
    /// `NODE_NAME`: only this node's pods are listed.
    pub node: Option<String>,
}

/// The last answer: each pod's devices (positions in `devices`) with how many of the
/// device's allocations are the pod's.
#[derive(Default)]
struct HeldGpus {
    asked_for: BTreeSet<String>,
    at: Option<Instant>,
    failed_at: Option<Instant>,
    pods: HashMap<String, Vec<(usize, f64)>>,
}

/// Each pod's share of each device it holds: a device allocated n times (time-slicing
/// replicas `GPU-…::1`, `::2`) is split by how many of them each pod has.
pub fn share_devices(
    pods: &[podresources::PodDevices],
    uid_of: &HashMap<(String, String), String>,
    devices: &[GpuDevice],
) -> HashMap<String, Vec<(usize, f64)>> {
    // A whole GPU by its UUID (`GPU-…`), a MIG instance by its own (`MIG-…`).
    let position = |id: &str| {
        let key = podresources::device_key(id);
        devices.iter().position(|d| match &d.instance_uuid {
            Some(mig) => mig.to_ascii_lowercase() == key,
            None => d.gpu_instance_id.is_none() && d.uuid.to_ascii_lowercase() == key,
        })
    };
    let mut counts: HashMap<String, HashMap<usize, u32>> = HashMap::new();
    let mut totals: HashMap<usize, u32> = HashMap::new();
    for pod in pods {
        let Some(uid) = uid_of.get(&(pod.namespace.clone(), pod.name.clone())) else {
            continue;
        };
        for (_, id) in &pod.devices {
            if let Some(at) = position(id) {
                *counts
                    .entry(uid.clone())
                    .or_default()
                    .entry(at)
                    .or_default() += 1;
                *totals.entry(at).or_default() += 1;
            }
        }
    }
    counts
        .into_iter()
        .map(|(uid, held)| {
            let mut held: Vec<(usize, f64)> = held
                .into_iter()
                .map(|(at, n)| (at, f64::from(n) / f64::from(totals[&at].max(1))))
                .collect();
            held.sort_by_key(|(at, _)| *at);
            (uid, held)
        })
        .collect()
}

impl K8sManager {
    pub fn new(cgroupfs: &Path, version: CgroupVersion, active_subsystem: &str) -> K8sManager {
        let controllers = V1Controllers::resolve(cgroupfs);
        let (root, cpu_root) = match version {
            CgroupVersion::V1 => (
                controllers.subsystem_dir(cgroupfs, active_subsystem),
                // `cpu` may be mounted apart from `cpuacct` (Debian does).
                ["cpu,cpuacct", "cpuacct,cpu", "cpu"]
                    .iter()
                    .map(|c| cgroupfs.join(c))
                    .find(|p| p.is_dir())
                    .unwrap_or_else(|| controllers.subsystem_dir(cgroupfs, "cpu")),
            ),
            CgroupVersion::V2 => (cgroupfs.to_owned(), cgroupfs.to_owned()),
        };
        K8sManager {
            version,
            root,
            cpu_root,
            populated: Mutex::new(Populated::default()),
            devices: Vec::new(),
            lookup: None,
            held: Mutex::new(HeldGpus::default()),
        }
    }

    /// Also map pods to these GPUs through `lookup`.
    pub fn with_gpus(mut self, devices: Vec<GpuDevice>, lookup: GpuLookup) -> K8sManager {
        self.devices = devices;
        self.lookup = Some(lookup);
        self
    }

    /// Asks the API server and the kubelet again when the pods changed or the last answer is
    /// old; a failure keeps the last answer and says why.
    fn refresh_gpus(&self, lookup: &GpuLookup, units: &[UnitCgroup]) {
        let ids: BTreeSet<String> = units.iter().map(|u| u.uuid.clone()).collect();
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let changed = held.asked_for != ids;
        let stale = held.at.is_none_or(|at| at.elapsed() >= GPUS_MAX_AGE);
        let backing_off = held
            .failed_at
            .is_some_and(|at| at.elapsed() < GPUS_RETRY_AFTER);
        if ids.is_empty() || !(changed || (stale && !backing_off)) {
            return;
        }
        held.asked_for = ids;
        let answer = lookup
            .kube
            .pods(lookup.node.as_deref())
            .map_err(|e| e.to_string())
            .and_then(|pods| {
                let listed =
                    podresources::list(&lookup.socket, CALL_TIMEOUT).map_err(|e| e.to_string())?;
                let uid_of = pods
                    .into_iter()
                    .map(|p| ((p.namespace, p.name), p.uid))
                    .collect();
                Ok(share_devices(
                    &podresources::pod_devices(&listed),
                    &uid_of,
                    &self.devices,
                ))
            });
        match answer {
            Ok(pods) => {
                tracing::debug!(pods_with_gpus = pods.len(), "pods' GPUs looked up");
                held.pods = pods;
                held.at = Some(Instant::now());
                held.failed_at = None;
            }
            Err(e) => {
                held.failed_at = Some(Instant::now());
                let hint = if e.contains("Permission denied") {
                    "; `ceems check-privileges exporter --collector.k8s` says how to let this user reach the socket"
                } else {
                    ""
                };
                tracing::warn!(error = %e, "cannot tell which GPUs pods hold; the last answer is kept{hint}");
            }
        }
    }

    /// The kubelet's slices present under the root.
    fn slices(&self) -> Vec<PathBuf> {
        SLICES
            .iter()
            .map(|s| self.root.join(s))
            .filter(|p| p.is_dir())
            .collect()
    }

    /// Every pod directory: `(uid, dir, inode)`.
    fn pods(&self) -> Vec<(String, PathBuf, u64)> {
        let mut found = Vec::new();
        for slice in self.slices() {
            for child in subdirs(&slice) {
                let Some(name) = child.name().to_str() else {
                    continue;
                };
                if let Some(uid) = pod_of_cgroup(name) {
                    found.push((uid, child.path, child.ino));
                } else if is_qos_dir(name) {
                    for pod in subdirs(&child.path) {
                        if let Some(uid) = pod.name().to_str().and_then(pod_of_cgroup) {
                            found.push((uid, pod.path, pod.ino));
                        }
                    }
                }
            }
        }
        found
    }
}

impl ResourceManager for K8sManager {
    fn name(&self) -> &'static str {
        MANAGER
    }

    fn discover(&self, faults: &mut Vec<FileFault>) -> Result<Vec<UnitCgroup>, CollectError> {
        if !self.root.is_dir() {
            return Err(CollectError::Absent(format!(
                "no cgroup hierarchy at {}",
                self.root.display()
            )));
        }
        let found = self.pods();
        let mut populated = self.populated.lock().unwrap_or_else(|p| p.into_inner());
        let mut units = populated_units(&mut populated, self.version, &self.root, &found, faults);
        // The same pod under both drivers' slices: the first that holds a process.
        let mut seen = HashSet::new();
        units.retain(|u| seen.insert(u.uuid.clone()));
        Ok(units)
    }

    fn gpus(&self, units: &[UnitCgroup]) -> Vec<UnitGpus> {
        let Some(lookup) = &self.lookup else {
            return Vec::new();
        };
        self.refresh_gpus(lookup, units);
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        units
            .iter()
            .filter_map(|u| {
                let devices: Vec<(u32, GpuDevice, f64)> = held
                    .pods
                    .get(&u.uuid)?
                    .iter()
                    .filter_map(|(at, share)| {
                        let d = self.devices.get(*at)?;
                        Some((d.index as u32, d.clone(), *share))
                    })
                    .collect();
                (!devices.is_empty()).then(|| UnitGpus {
                    manager: MANAGER,
                    uuid: u.uuid.clone(),
                    rel: u.rel.clone(),
                    cgroup_host: String::new(),
                    devices,
                })
            })
            .collect()
    }

    fn cpus(&self, unit: &UnitCgroup) -> Option<f64> {
        let read = |path: PathBuf| -> Option<u64> {
            std::fs::read_to_string(path).ok()?.trim().parse().ok()
        };
        match self.version {
            CgroupVersion::V1 => {
                read(self.cpu_root.join(&unit.rel).join("cpu.shares")).map(cpus_of_shares)
            }
            CgroupVersion::V2 => read(unit.dir.join("cpu.weight")).map(cpus_of_weight),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_uids_of_both_drivers_and_qos_classes() {
        for (name, uid) in [
            (
                "pod483168fc-b347-4aa2-a9fa-9e3d220ba4c5",
                "483168fc-b347-4aa2-a9fa-9e3d220ba4c5",
            ),
            (
                "kubepods-burstable-pod483168fc_b347_4aa2_a9fa_9e3d220ba4c5.slice",
                "483168fc-b347-4aa2-a9fa-9e3d220ba4c5",
            ),
            (
                "kubepods-pod6c22124f_e9a7_450b_8915_9bf3e0716d78.slice",
                "6c22124f-e9a7-450b-8915-9bf3e0716d78",
            ),
            // A static pod: its UID is the hash of its manifest.
            (
                "pod5bd8b8f0e7ea4b1b8a3d2c1e0f9a8b7c",
                "5bd8b8f0e7ea4b1b8a3d2c1e0f9a8b7c",
            ),
        ] {
            assert_eq!(pod_of_cgroup(name).as_deref(), Some(uid), "{name}");
        }
        for name in [
            "burstable",
            "kubepods-besteffort.slice",
            "cri-containerd-f92b308ade447d0f.scope",
            "f92b308ade447d0f99dc4a689267891422f9cdc6db5f0e7ef4772cc5a2f1ccb7",
            "pod",
            "podzz",
            "mypod123",
            "pod1/2",
        ] {
            assert_eq!(pod_of_cgroup(name), None, "{name}");
        }
        assert!(is_qos_dir("burstable") && is_qos_dir("kubepods-besteffort.slice"));
        assert!(!is_qos_dir("pod1234"));
    }

    #[test]
    fn cpus_are_the_kubelets_millicores() {
        // CEEMS's expected outputs: weights 1, 10, 20 and shares 51, 256.
        assert_eq!(cpus_of_weight(1), 0.001);
        assert_eq!(cpus_of_weight(10), 0.231);
        assert_eq!(cpus_of_weight(20), 0.488);
        assert_eq!(cpus_of_shares(51), 0.049);
        assert_eq!(cpus_of_shares(256), 0.25);
        // Two CPUs as the kubelet writes them: v2's weight loses two millicores on the way.
        assert_eq!(cpus_of_shares(2048), 2.0);
        assert_eq!(cpus_of_weight(79), 1.998);
        assert_eq!(cpus_of_weight(u64::MAX), cpus_of_weight(10_000));
    }

    #[test]
    fn pods_share_whole_gpus_replicas_and_mig_instances() {
        let mut devices: Vec<GpuDevice> = vec![
            GpuDevice::for_test(0, 0, None, 1.0),
            GpuDevice::for_test(1, 1, Some(1), 0.5),
            GpuDevice::for_test(2, 1, Some(2), 0.5),
        ];
        devices[1].instance_uuid = Some("MIG-aaaa".into());
        devices[2].instance_uuid = Some("MIG-bbbb".into());
        let pod = |name: &str, ids: &[&str]| podresources::PodDevices {
            namespace: "ml".into(),
            name: name.into(),
            devices: ids
                .iter()
                .map(|i| ("nvidia.com/gpu".to_owned(), (*i).to_owned()))
                .collect(),
        };
        let pods = [
            pod("a", &["GPU-0::1", "GPU-0::2", "GPU-0::3", "MIG-AAAA"]),
            pod("b", &["gpu-0::4", "MIG-bbbb::1", "MIG-bbbb::2"]),
            pod("c", &["MIG-bbbb::3", "GPU-unknown"]),
            pod("not-listed", &["GPU-0::5"]),
        ];
        let uid_of: HashMap<(String, String), String> = ["a", "b", "c"]
            .iter()
            .map(|n| (("ml".to_owned(), (*n).to_owned()), format!("uid-{n}")))
            .collect();
        let held = share_devices(&pods, &uid_of, &devices);
        assert_eq!(held["uid-a"], [(0, 0.75), (1, 1.0)]);
        assert_eq!(held["uid-b"], [(0, 0.25), (2, 2.0 / 3.0)]);
        assert_eq!(held["uid-c"], [(2, 1.0 / 3.0)]);
        assert_eq!(held.len(), 3);
    }

    #[test]
    fn pods_of_both_drivers_are_found_once_each_with_their_qos_layouts() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let pods = [
            "kubepods/pod11111111-0000-0000-0000-000000000001",
            "kubepods/burstable/pod11111111-0000-0000-0000-000000000002",
            "kubepods/besteffort/pod11111111-0000-0000-0000-000000000003/abc123",
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod22222222_0000_0000_0000_000000000001.slice/cri-containerd-abc.scope",
            // Moved to the systemd driver without a reboot: the same pod twice.
            "kubepods.slice/kubepods-pod11111111_0000_0000_0000_000000000001.slice",
        ];
        for p in pods {
            std::fs::create_dir_all(root.join(p)).unwrap();
        }
        std::fs::create_dir_all(root.join("kubepods/burstable/not-a-pod")).unwrap();
        let m = K8sManager::new(root, CgroupVersion::V2, "cpu");
        let mut uids: Vec<String> = m.pods().into_iter().map(|(u, _, _)| u).collect();
        uids.sort();
        uids.dedup();
        assert_eq!(
            uids,
            [
                "11111111-0000-0000-0000-000000000001",
                "11111111-0000-0000-0000-000000000002",
                "11111111-0000-0000-0000-000000000003",
                "22222222-0000-0000-0000-000000000001",
            ]
        );
    }
}
