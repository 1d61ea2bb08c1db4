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
    /// Streaming multiprocessors of the device, when known.
    pub sm_count: Option<u32>,
    /// The share of the physical GPU: 1 for a full GPU, the instance's SMs over all
    /// instances' SMs for MIG.
    pub fraction: f64,
    pub model: String,
}
