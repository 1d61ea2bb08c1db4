//! The node's GPUs, as batch jobs see them: NVIDIA through NVML (or `nvidia-smi` XML when the
//! library is absent), AMD through `rocm-smi` (or `amd-smi` JSON). MIG instances count as
//! GPUs. Which vendor is auto-detected from PCI vendor ids unless `--collector.gpu.type` says.

pub mod amd;
pub mod nvidia;
pub mod nvidia_smi;
pub mod nvml;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::host::command::{self, CommandError};
pub use crate::host::gpu::GpuDevice;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vendor {
    Nvidia,
    Amd,
    None,
}

impl Vendor {
    pub fn from_flag(s: &str) -> Option<Vendor> {
        match s {
            "nvidia" => Some(Vendor::Nvidia),
            "amd" => Some(Vendor::Amd),
            "nogpu" | "none" => Some(Vendor::None),
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("{tool}: {message}")]
    Parse { tool: &'static str, message: String },
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error("{0}")]
    Other(String),
}

/// `[exporter.collector.gpu]`: which GPUs and through which tools.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct GpuSettings {
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub nvidia_smi_path: Option<PathBuf>,
    #[serde(default)]
    pub rocm_smi_path: Option<PathBuf>,
    #[serde(default)]
    pub amd_smi_path: Option<PathBuf>,
}

/// PCI vendor ids of display controllers under `<sysfs>/bus/pci/devices`.
pub fn vendor_from_pci(sysfs: &Path) -> Vendor {
    let Ok(entries) = std::fs::read_dir(sysfs.join("bus/pci/devices")) else {
        return Vendor::None;
    };
    let mut found = Vendor::None;
    for e in entries.flatten() {
        let read = |f: &str| std::fs::read_to_string(e.path().join(f)).unwrap_or_default();
        // Class 0x03xxxx: display controllers (VGA, 3D).
        if !read("class").trim().starts_with("0x03") {
            continue;
        }
        match read("vendor").trim() {
            "0x10de" => return Vendor::Nvidia,
            "0x1002" => found = Vendor::Amd,
            _ => {}
        }
    }
    found
}

/// How long a GPU tool may take at start-up.
const TOOL_TIMEOUT: Duration = Duration::from_secs(30);

fn tool_path(configured: &Option<PathBuf>, name: &str) -> Option<PathBuf> {
    match configured {
        Some(p) if !p.as_os_str().is_empty() => Some(p.clone()),
        _ => command::find_program(name, std::env::var_os("PATH").as_deref()),
    }
}

/// The node's GPUs for a manager's units (`what`: "jobs", "pods"): a GPU tool that fails
/// leaves the units without GPU series, said in the log, rather than stopping the collector.
pub fn discover_for_units(settings: &GpuSettings, sysfs: &Path, what: &str) -> Vec<GpuDevice> {
    discover(settings, sysfs).unwrap_or_else(|e| {
        tracing::error!(error = %e, "cannot list the node's GPUs; {what} get no GPU series");
        Vec::new()
    })
}

/// The node's GPUs, numbered as [`GpuDevice::index`] says.
pub fn discover(settings: &GpuSettings, sysfs: &Path) -> Result<Vec<GpuDevice>, GpuError> {
    let vendor = match settings.kind.as_deref() {
        Some(k) if !k.is_empty() => Vendor::from_flag(k).ok_or_else(|| {
            GpuError::Other(format!(
                "unknown --collector.gpu.type `{k}` (nvidia, amd or nogpu)"
            ))
        })?,
        _ => vendor_from_pci(sysfs),
    };
    match vendor {
        Vendor::None => Ok(Vec::new()),
        Vendor::Nvidia => {
            // Only the device list: no energy is read.
            match nvml::RealNvml::load(std::time::Duration::ZERO) {
                Ok(lib) => {
                    return nvml::Nvml::devices(&lib).map_err(|e| GpuError::Other(e.to_string()))
                }
                Err(e) => tracing::info!(error = %e, "NVML not loaded; asking nvidia-smi"),
            }
            let path = tool_path(&settings.nvidia_smi_path, "nvidia-smi").ok_or_else(|| {
                GpuError::Other(
                    "NVIDIA GPUs but neither libnvidia-ml.so.1 nor nvidia-smi (--collector.gpu.nvidia-smi-path)"
                        .into(),
                )
            })?;
            let xml = command::run(
                &path,
                &["--query".into(), "--xml-format".into()],
                TOOL_TIMEOUT,
            )?;
            nvidia_smi::parse(&xml)
        }
        Vendor::Amd => {
            if let Some(path) = tool_path(&settings.rocm_smi_path, "rocm-smi") {
                let csv = command::run(
                    &path,
                    &[
                        "--showproductname".into(),
                        "--showserial".into(),
                        "--showbus".into(),
                        "--csv".into(),
                    ],
                    TOOL_TIMEOUT,
                )?;
                return amd::parse_rocm_smi_csv(&csv);
            }
            let path = tool_path(&settings.amd_smi_path, "amd-smi").ok_or_else(|| {
                GpuError::Other(
                    "AMD GPUs but neither rocm-smi (--collector.gpu.rocm-smi-path) nor amd-smi"
                        .into(),
                )
            })?;
            let json = command::run(&path, &["list".into(), "--json".into()], TOOL_TIMEOUT)?;
            amd::parse_amd_smi_json(&json)
        }
    }
}

/// The mdev devices of the node's vGPU-mode NVIDIA GPUs, from `nvidia-smi vgpu --query`.
pub fn vgpu_query(settings: &GpuSettings) -> Result<Vec<nvidia_smi::VgpuHost>, GpuError> {
    let path = tool_path(&settings.nvidia_smi_path, "nvidia-smi").ok_or_else(|| {
        GpuError::Other("vGPU-mode GPUs but no nvidia-smi (--collector.gpu.nvidia-smi-path)".into())
    })?;
    let text = command::run(&path, &["vgpu".into(), "--query".into()], TOOL_TIMEOUT)?;
    nvidia_smi::parse_vgpu_query(&text)
}

/// Numbers devices in order and fills MIG instances' fractions from their SM counts.
fn finish(mut devices: Vec<GpuDevice>) -> Vec<GpuDevice> {
    let total = |minor: u32, list: &[GpuDevice]| -> u32 {
        list.iter()
            .filter(|d| d.minor == minor && d.gpu_instance_id.is_some())
            .filter_map(|d| d.sm_count)
            .sum()
    };
    let totals: Vec<u32> = devices.iter().map(|d| total(d.minor, &devices)).collect();
    for (i, d) in devices.iter_mut().enumerate() {
        d.index = i;
        d.fraction = match (d.gpu_instance_id, d.sm_count, totals[i]) {
            (Some(_), Some(sm), t) if t > 0 => f64::from(sm) / f64::from(t),
            _ => 1.0,
        };
    }
    devices
}

/// Streaming multiprocessors of full GPUs by model, for `ceems_compute_unit_gpu_sm_count`:
/// NVML and nvidia-smi give SM counts of MIG instances only.
pub fn full_gpu_sm_count(model: &str) -> Option<u32> {
    const TABLE: &[(&str, u32)] = &[
        ("H100 PCIe", 114),
        ("H100 NVL", 132),
        ("H100", 132),
        ("H200", 132),
        ("GH200", 132),
        ("A100", 108),
        ("A30", 56),
        ("A40", 84),
        ("A10", 72),
        ("L40S", 142),
        ("L40", 142),
        ("L4", 58),
        ("V100", 80),
        ("T4", 40),
        ("P100", 56),
    ];
    TABLE
        .iter()
        .find(|(name, _)| model.contains(name))
        .map(|(_, n)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_vendor_ids_choose_the_vendor() {
        let tmp = tempfile::tempdir().unwrap();
        let dev = |name: &str, class: &str, vendor: &str| {
            let d = tmp.path().join("bus/pci/devices").join(name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("class"), class).unwrap();
            std::fs::write(d.join("vendor"), vendor).unwrap();
        };
        assert_eq!(vendor_from_pci(tmp.path()), Vendor::None);
        // An NVIDIA network card is not a GPU; an ASPEED VGA is not one we know.
        dev("0000:01:00.0", "0x020000\n", "0x10de\n");
        dev("0000:02:00.0", "0x030000\n", "0x1a03\n");
        assert_eq!(vendor_from_pci(tmp.path()), Vendor::None);
        dev("0000:c5:00.0", "0x038000\n", "0x1002\n");
        assert_eq!(vendor_from_pci(tmp.path()), Vendor::Amd);
        dev("0000:10:00.0", "0x030200\n", "0x10de\n");
        assert_eq!(vendor_from_pci(tmp.path()), Vendor::Nvidia);
    }

    #[test]
    fn sm_counts_of_known_models() {
        assert_eq!(full_gpu_sm_count("NVIDIA H100 80GB HBM3"), Some(132));
        assert_eq!(full_gpu_sm_count("NVIDIA H100 PCIe"), Some(114));
        assert_eq!(full_gpu_sm_count("NVIDIA A100-PCIE-40GB"), Some(108));
        assert_eq!(full_gpu_sm_count("Quadro RTX 6000"), None);
    }
}
