//! A GPU as the node's units can hold it; which ones a unit holds is its manager's business,
//! how they are found and read the exporter's.

/// One GPU as a job can hold it: a full GPU or a MIG instance.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuDevice {
    /// Position among the node's devices: full GPUs in minor-number order, a MIG-enabled GPU
    /// replaced by its instances in index order. Slurm numbers GPUs the same way unless
    /// `--collector.slurm.gpu-order-map` says otherwise.
    pub index: usize,
    /// The physical GPU's minor number (`/dev/nvidia<minor>`), or AMD's card number.
    pub minor: u32,
    /// The physical GPU's UUID (NVIDIA) or serial number (AMD), as CEEMS labels it.
    pub uuid: String,
    /// The MIG GPU instance id; None for a full GPU.
    pub gpu_instance_id: Option<u32>,
    /// A MIG instance's own UUID (`MIG-…`), as Kubernetes' device plugin names it; None where
    /// the tool does not say (nvidia-smi) or for a full GPU.
    pub instance_uuid: Option<String>,
    /// Streaming multiprocessors of the device, when known.
    pub sm_count: Option<u32>,
    /// The share of the physical GPU: 1 for a full GPU, the instance's SMs over all
    /// instances' SMs for MIG.
    pub fraction: f64,
    pub model: String,
    /// The physical GPU's PCI address (`00000000:15:00.0`); empty where the tool does not
    /// say it.
    pub bus_id: String,
    /// Whether the physical GPU runs in NVIDIA vGPU mode (its share goes to mdev devices).
    pub vgpu: bool,
}

#[cfg(test)]
impl GpuDevice {
    /// A device as tests describe one: `GPU-<minor>`, an H100, no SM count, no PCI address.
    pub fn for_test(index: usize, minor: u32, gpu_instance_id: Option<u32>, fraction: f64) -> Self {
        GpuDevice {
            index,
            minor,
            uuid: format!("GPU-{minor}"),
            gpu_instance_id,
            instance_uuid: None,
            sm_count: None,
            fraction,
            model: "NVIDIA H100 80GB HBM3".into(),
            bus_id: String::new(),
            vgpu: false,
        }
    }
}

/// A PCI address as (domain, bus, device, function), whatever the zero padding:
/// `00000000:15:00.0` and `0000:15:00.0` are one address.
pub fn pci_address(text: &str) -> Option<(u32, u32, u32, u32)> {
    let hex = |s: &str| u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok();
    let (rest, function) = text.trim().rsplit_once('.')?;
    let mut parts = rest.split(':');
    let (domain, bus, device) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    Some((hex(domain)?, hex(bus)?, hex(device)?, hex(function)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_match_whatever_their_padding() {
        assert_eq!(pci_address("00000000:15:00.0"), Some((0, 0x15, 0, 0)));
        assert_eq!(pci_address("0000:15:00.0"), pci_address("00000000:15:00.0"));
        assert_eq!(pci_address("0000:8a:1f.7"), Some((0, 0x8a, 0x1f, 7)));
        for bad in ["", "15:00.0", "0000:15:00", "0000:zz:00.0", "0:0:0:0.0"] {
            assert_eq!(pci_address(bad), None, "{bad}");
        }
    }
}
