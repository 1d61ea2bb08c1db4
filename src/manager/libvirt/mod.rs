//! libvirt: QEMU/KVM virtual machines (OpenStack Nova's instances) as compute units. A VM's
//! cgroup is `machine.slice/machine-qemu\x2d<id>\x2d<name>.scope` under systemd, or
//! `machine/qemu-<id>-<name>.libvirt-qemu` without it (libvirt's own layout); its UUID and
//! the GPUs passed to it come from its domain XML in `--collector.libvirt.xml-dir`.
//!
//! GPUs: a PCI device is the GPU at that address; an mdev (NVIDIA vGPU) is found in
//! `nvidia-smi vgpu --query`, and a GPU or MIG instance shared by several vGPUs counts a
//! share for each, as CEEMS does.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Deserialize;

use crate::collect::gpu::nvidia_smi::VgpuHost;
use crate::collect::gpu::{self, GpuDevice, GpuSettings};
use crate::collect::units::{cgroup_version, SubCollector, UnitCollector};
use crate::collect::{Capability, CollectError, Collector, CollectorSpec, Context};
use crate::config::{Kind, Opt};
use crate::host::cgroup::detail::DetailOptions;
use crate::host::cgroup::{
    subdirs, CgroupVersion, FileFault, Populated, ReadOptions, V1Controllers,
};
use crate::host::gpu::pci_address;
use crate::manager::{ResourceManager, UnitCgroup, UnitGpus};

pub mod domain;

use domain::{Domain, HostDevice};

pub const MANAGER: &str = "libvirt";

/// How a VM is given resources, in findings' advice.
pub const REQUEST_WORDS: super::RequestWords = super::RequestWords {
    cores: "the VM's vCPUs (its flavor)",
    memory: "the VM's memory (its flavor)",
    gpus: "the GPUs passed to the VM (its flavor)",
    time: "the VM's lifetime",
};

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "libvirt",
    default_enabled: false,
    // Domain XMLs are root's alone (0600 in a 0700 directory).
    capabilities: &[Capability::CAP_DAC_READ_SEARCH],
    options,
    build,
    self_test: None,
    sub_collectors: &[SubCollector::Perf, SubCollector::Ebpf],
};

fn options() -> Vec<Opt> {
    vec![
        Opt::flag(
            "collector.libvirt.swap-memory-metrics",
            "Export swap usage of VMs (ceems_compute_unit_memsw_*)",
        ),
        Opt::flag(
            "collector.libvirt.psi-metrics",
            "Export pressure stall information of VMs (cgroups v2 only)",
        ),
        Opt::flag(
            "collector.libvirt.blkio-metrics",
            "Export VMs' block IO bytes and requests per device",
        ),
        Opt::new(
            "collector.libvirt.xml-dir",
            Kind::Str,
            "Directory of libvirt's domain XML files, which name each VM's UUID and GPUs (default: the runtime /run/libvirt/qemu, which holds transient domains too, then /etc/libvirt/qemu)",
        ),
    ]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Settings {
    swap_memory_metrics: bool,
    psi_metrics: bool,
    blkio_metrics: bool,
    #[serde(default)]
    xml_dir: Option<PathBuf>,
}

/// Where libvirt keeps domain XML: the live domains' (running, transient ones included),
/// then the defined ones'.
pub const XML_DIRS: [&str; 2] = ["/run/libvirt/qemu", "/etc/libvirt/qemu"];

/// A VM known from its domain XML; None when the XML could not be read (said once).
type Known = Option<Domain>;

/// libvirt as a resource manager: its VMs and the GPUs passed to them.
pub struct LibvirtManager {
    version: CgroupVersion,
    /// The v1 controller or v2 root that holds `machine.slice` and `machine`.
    base: PathBuf,
    /// v1: the memory controller, where libvirt always places VMs, for a host where the active
    /// subsystem holds none (libvirt leaves a `cpuacct` mounted apart from `cpu` alone).
    fallback: Option<PathBuf>,
    /// Searched in order for `<name>.xml`.
    xml_dirs: Vec<PathBuf>,
    /// VM cgroup directory → its domain, until the directory goes.
    domains: Mutex<HashMap<PathBuf, Known>>,
    populated: Mutex<Populated>,
    gpus: Option<VmGpus>,
}

/// The node's GPUs, and its vGPUs' mdev devices as of the last VM that started.
struct VmGpus {
    devices: Vec<GpuDevice>,
    settings: GpuSettings,
    vgpus: Mutex<Vec<VgpuHost>>,
}

/// The `libvirt` collector: VMs read and emitted as units.
pub type LibvirtCollector = UnitCollector<LibvirtManager>;

fn build(ctx: &Context) -> Result<Box<dyn Collector>, CollectError> {
    let s: Settings = ctx.settings()?;
    let version = cgroup_version(ctx)?;
    let root = &ctx.paths.cgroupfs;
    let xml_dirs: Vec<PathBuf> = match s.xml_dir.filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => vec![dir],
        None => XML_DIRS.iter().map(PathBuf::from).collect(),
    };
    let mut manager = LibvirtManager::new(
        root,
        version,
        &ctx.common.cgroups.active_subsystem,
        &xml_dirs,
    );
    match gpu::discover(&ctx.common.gpu, &ctx.paths.sysfs) {
        Ok(devices) if !devices.is_empty() => {
            tracing::info!(gpus = devices.len(), "VMs are mapped to the node's GPUs");
            manager.gpus = Some(VmGpus {
                devices,
                settings: ctx.common.gpu.clone(),
                vgpus: Mutex::new(Vec::new()),
            });
        }
        Ok(_) => {}
        Err(e) => {
            tracing::error!(error = %e, "cannot list the node's GPUs; VMs get no GPU series")
        }
    }
    tracing::info!(version = ?version, base = %manager.base.display(), xml_dirs = ?manager.xml_dirs, "libvirt collector discovers VMs");
    let collector = UnitCollector::new(
        manager,
        root,
        &ctx.paths.procfs,
        version,
        &ctx.hostname,
        ReadOptions {
            swap: s.swap_memory_metrics,
            psi: s.psi_metrics,
        },
        SPEC.capabilities,
    )
    .with_detail(DetailOptions {
        io: s.blkio_metrics,
        ..DetailOptions::default()
    })
    .with_context(ctx, version)?;
    Ok(Box::new(collector))
}

impl LibvirtManager {
    pub fn new(
        cgroupfs: &Path,
        version: CgroupVersion,
        active_subsystem: &str,
        xml_dirs: &[PathBuf],
    ) -> LibvirtManager {
        let (base, fallback) = match version {
            CgroupVersion::V1 => {
                let controllers = V1Controllers::resolve(cgroupfs);
                let base = controllers.subsystem_dir(cgroupfs, active_subsystem);
                let memory = Some(controllers.memory).filter(|m| *m != base);
                (base, memory)
            }
            CgroupVersion::V2 => (cgroupfs.to_owned(), None),
        };
        LibvirtManager {
            version,
            base,
            fallback,
            xml_dirs: xml_dirs.to_vec(),
            domains: Mutex::new(HashMap::new()),
            populated: Mutex::new(Populated::default()),
            gpus: None,
        }
    }

    /// The domain of a VM named `name`, read as root would from the first directory that
    /// holds its XML.
    fn read_domain(&self, name: &str) -> Result<Domain, String> {
        let paths: Vec<PathBuf> = self
            .xml_dirs
            .iter()
            .map(|d| d.join(format!("{name}.xml")))
            .collect();
        let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        let found = crate::security::privileged(SPEC.capabilities, move || {
            for path in paths {
                match std::fs::read_to_string(&path) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    read => return Some((path, read)),
                }
            }
            None
        });
        match found {
            Some((path, Ok(text))) => {
                domain::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
            }
            Some((path, Err(e))) => Err(format!("cannot read {}: {e}", path.display())),
            None => Err(format!("no domain XML at {}", shown.join(" or "))),
        }
    }

    /// Asks `nvidia-smi vgpu --query` again, when a GPU of the node is in vGPU mode.
    fn refresh_vgpus(&self) {
        let Some(g) = &self.gpus else { return };
        if !g.devices.iter().any(|d| d.vgpu) {
            return;
        }
        match gpu::vgpu_query(&g.settings) {
            Ok(hosts) => *g.vgpus.lock().unwrap_or_else(|p| p.into_inner()) = hosts,
            Err(e) => tracing::warn!(error = %e, "cannot list vGPUs; VMs' vGPUs are not mapped"),
        }
    }
}

impl ResourceManager for LibvirtManager {
    fn name(&self) -> &'static str {
        MANAGER
    }

    fn discover(&self, faults: &mut Vec<FileFault>) -> Result<Vec<UnitCgroup>, CollectError> {
        if !self.base.is_dir() {
            return Err(CollectError::Absent(format!(
                "no cgroup hierarchy at {}",
                self.base.display()
            )));
        }
        let has_vms = |b: &Path| {
            ["machine.slice", "machine"]
                .iter()
                .any(|p| b.join(p).is_dir())
        };
        let base = match &self.fallback {
            Some(f) if !has_vms(&self.base) && has_vms(f) => {
                tracing::debug!(active = %self.base.display(), memory = %f.display(), "no VM in the active subsystem; discovering in the memory controller");
                f
            }
            _ => &self.base,
        };
        let mut found = Vec::new();
        for parent in ["machine.slice", "machine"] {
            for sub in subdirs(&base.join(parent)) {
                if let Some(name) = sub.name().to_str().and_then(domain::name_of_cgroup) {
                    found.push((name, sub.path, sub.ino));
                }
            }
        }
        let mut domains = self.domains.lock().unwrap_or_else(|p| p.into_inner());
        let mut populated = self.populated.lock().unwrap_or_else(|p| p.into_inner());
        let present: HashSet<&Path> = found.iter().map(|(_, d, _)| d.as_path()).collect();
        domains.retain(|k, _| present.contains(k.as_path()));
        populated.retain(|k| present.contains(k));
        let mut units = Vec::new();
        let mut new_vm = false;
        for (name, dir, ino) in &found {
            if !populated.check(self.version, dir, Some(*ino), faults) {
                continue;
            }
            let known = domains.entry(dir.clone()).or_insert_with(|| {
                new_vm = true;
                self.read_domain(name)
                    .map_err(|e| tracing::warn!(vm = %name, error = %e, "VM left out: its domain XML is needed for its UUID"))
                    .ok()
            });
            let Some(d) = known else { continue };
            let rel = dir.strip_prefix(base).unwrap_or(dir).to_path_buf();
            units.push(UnitCgroup {
                uuid: d.uuid.clone(),
                cgroup_host: String::new(),
                rel,
                dir: dir.clone(),
                dir_ino: Some(*ino),
            });
        }
        drop((domains, populated));
        if new_vm {
            self.refresh_vgpus();
        }
        Ok(units)
    }

    fn gpus(&self, units: &[UnitCgroup]) -> Vec<UnitGpus> {
        let Some(g) = &self.gpus else {
            return Vec::new();
        };
        let domains = self.domains.lock().unwrap_or_else(|p| p.into_inner());
        let vgpus = g.vgpus.lock().unwrap_or_else(|p| p.into_inner());
        units
            .iter()
            .filter_map(|u| {
                let d = domains.get(&u.dir)?.as_ref()?;
                let devices = vm_gpus(&d.host_devices, &g.devices, &vgpus);
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
}

/// The GPUs among a VM's host devices, as `(index, device, the VM's share of the device)`.
fn vm_gpus(
    host_devices: &[HostDevice],
    devices: &[GpuDevice],
    vgpus: &[VgpuHost],
) -> Vec<(u32, GpuDevice, f64)> {
    let at = |bus: &str| pci_address(bus);
    let mut out = Vec::new();
    for h in host_devices {
        let found = match h {
            HostDevice::Pci(addr) => devices
                .iter()
                .find(|d| d.gpu_instance_id.is_none() && at(&d.bus_id) == Some(*addr))
                .map(|d| (d, 1.0)),
            HostDevice::Mdev(uuid) => vgpus.iter().find_map(|host| {
                let (_, gi) = host.mdevs.iter().find(|(m, _)| m == uuid)?;
                let sharing = host.mdevs.iter().filter(|(_, g)| g == gi).count().max(1);
                let addr = at(&host.bus_id)?;
                let d = devices
                    .iter()
                    .find(|d| at(&d.bus_id) == Some(addr) && d.gpu_instance_id == *gi)?;
                Some((d, 1.0 / sharing as f64))
            }),
        };
        if let Some((d, share)) = found {
            out.push((u32::try_from(d.index).unwrap_or(u32::MAX), d.clone(), share));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compat(path: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/compat")
            .join(path)
    }

    #[test]
    fn ceems_vms_get_their_gpus_and_vgpu_shares() {
        let devices = gpu::nvidia_smi::parse(
            &std::fs::read_to_string(compat(
                "fixtures/nvidia-smi/nvidia-smi_--query_--xml-format.xml",
            ))
            .unwrap(),
        )
        .unwrap();
        let vgpus = gpu::nvidia_smi::parse_vgpu_query(
            &std::fs::read_to_string(compat("fixtures/nvidia-smi/nvidia-smi_vgpu_--query.txt"))
                .unwrap(),
        )
        .unwrap();
        let of = |n: u32| {
            let xml =
                std::fs::read_to_string(compat(&format!("fixtures/qemu/instance-0000000{n}.xml")))
                    .unwrap();
            let d = domain::parse(&xml).unwrap();
            vm_gpus(&d.host_devices, &devices, &vgpus)
                .into_iter()
                .map(|(i, d, share)| (i, d.gpu_instance_id, d.fraction * share))
                .collect::<Vec<_>>()
        };
        // A vGPU on a GPU shared by two; a vGPU on MIG instance 5 (0.2 of its GPU), shared by two.
        let one = of(1);
        assert_eq!((one[0].0, one[0].1), (0, None));
        assert!((one[0].2 - 0.5).abs() < 1e-9);
        assert_eq!((one[1].0, one[1].1), (3, Some(5)));
        assert!((one[1].2 - 0.1).abs() < 1e-9);
        // Two GPUs passed through whole.
        assert_eq!(of(2), [(1, None, 1.0), (8, None, 1.0)]);
        // One passed through (89:00.0), one vGPU alone on its GPU (85:00.0).
        assert_eq!(of(3), [(11, None, 1.0), (9, None, 1.0)]);
        assert_eq!(of(4), []);
    }

    #[test]
    fn discovery_in_both_layouts_skips_empty_vms_and_those_without_xml() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cgroup");
        let xml = tmp.path().join("qemu");
        std::fs::create_dir_all(&xml).unwrap();
        let vm = |dir: &str, populated: bool| {
            let d = root.join(dir);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join("cgroup.events"),
                format!("populated {}\nfrozen 0\n", u8::from(populated)),
            )
            .unwrap();
        };
        vm(r"machine.slice/machine-qemu\x2d1\x2dvm\x2da.scope", true);
        vm("machine/qemu-2-vm-b.libvirt-qemu", true);
        vm("machine/qemu-3-idle.libvirt-qemu", false);
        vm("machine/qemu-4-no-xml.libvirt-qemu", true);
        // vm-a runs: libvirt's runtime directory holds its live domain in a status, and wins
        // over the defined one (here with another UUID to tell them apart).
        let run = tmp.path().join("run");
        std::fs::create_dir_all(&run).unwrap();
        std::fs::write(
            run.join("vm-a.xml"),
            "<!--\nWARNING: THIS IS AN AUTO-GENERATED FILE.\n-->\n<domstatus state='running' pid='42'>\n  <domain type='kvm' id='1'><name>vm-a</name><uuid>aaaa-1</uuid></domain>\n</domstatus>\n",
        )
        .unwrap();
        for (name, uuid) in [("vm-a", "ffff-9"), ("vm-b", "bbbb-2"), ("idle", "cccc-3")] {
            std::fs::write(
                xml.join(format!("{name}.xml")),
                format!("<domain type='kvm'><name>{name}</name><uuid>{uuid}</uuid></domain>"),
            )
            .unwrap();
        }
        let dirs = [run, xml.clone()];
        let m = LibvirtManager::new(&root, CgroupVersion::V2, "cpuacct", &dirs);
        let mut faults = Vec::new();
        let units = m.discover(&mut faults).unwrap();
        let got: Vec<_> = units
            .iter()
            .map(|u| (u.uuid.as_str(), u.rel.display().to_string()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "aaaa-1",
                    r"machine.slice/machine-qemu\x2d1\x2dvm\x2da.scope".to_owned()
                ),
                ("bbbb-2", "machine/qemu-2-vm-b.libvirt-qemu".to_owned()),
            ]
        );
        // A VM that stops is forgotten with its directory.
        std::fs::remove_dir_all(root.join("machine/qemu-2-vm-b.libvirt-qemu")).unwrap();
        assert_eq!(m.discover(&mut faults).unwrap().len(), 1);
        assert_eq!(
            m.domains.lock().unwrap().len(),
            2,
            "vm-a and the one without XML"
        );
        let absent = LibvirtManager::new(&tmp.path().join("none"), CgroupVersion::V2, "", &dirs);
        assert!(matches!(
            absent.discover(&mut faults),
            Err(CollectError::Absent(_))
        ));
    }
}
