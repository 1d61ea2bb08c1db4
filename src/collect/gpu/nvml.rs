//! NVML behind a small trait, so the collector's logic is tested with a fake and the real
//! library only on a GPU node. The library is loaded at run time by its versioned name
//! (`libnvidia-ml.so.1`, what the driver installs), so the binary runs where it is absent.

use nvml_wrapper::enum_wrappers::device::GpuVirtualizationMode;

use super::{finish, full_gpu_sm_count, GpuDevice};

#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    #[error("cannot load libnvidia-ml.so.1: {0}")]
    Load(String),
    #[error("GPU {index}: {message}")]
    Device { index: usize, message: String },
    #[error("NVML: {0}")]
    Other(String),
}

/// What one reading of a device says; fields NVML does not support for it (MIG instances lack
/// most) are None.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuReading {
    /// Energy since the driver loaded.
    pub energy_joules: Option<f64>,
    pub power_watts: Option<f64>,
    /// 0..1.
    pub utilization: Option<f64>,
    pub memory_utilization: Option<f64>,
    pub memory_used_bytes: Option<f64>,
    pub memory_total_bytes: Option<f64>,
    pub temperature_celsius: Option<f64>,
    pub sm_clock_hertz: Option<f64>,
    pub memory_clock_hertz: Option<f64>,
    /// Active clock throttle reasons, by name.
    pub throttle_reasons: Option<Vec<&'static str>>,
    /// `(pid, GPU memory in bytes)` of the compute processes on the device.
    pub processes: Vec<(u32, u64)>,
}

/// The names `throttle_reasons` may hold, for a 0/1 series each.
pub const THROTTLE_REASONS: &[&str] = &[
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
];

pub trait Nvml: Send + Sync {
    /// Full GPUs and MIG instances, numbered as [`GpuDevice::index`] says.
    fn devices(&self) -> Result<Vec<GpuDevice>, NvmlError>;
    /// A reading of one device; an error means the device itself failed (fell off the bus).
    fn read(&self, device: &GpuDevice) -> Result<GpuReading, NvmlError>;
}

/// The system's NVML.
pub struct RealNvml {
    lib: nvml_wrapper::Nvml,
}

impl RealNvml {
    pub fn load() -> Result<RealNvml, NvmlError> {
        let lib = nvml_wrapper::Nvml::builder()
            .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
            .init()
            .map_err(|e| NvmlError::Load(e.to_string()))?;
        Ok(RealNvml { lib })
    }

    /// The physical GPU of `minor` and, for a MIG device, the instance of `gi`.
    fn handle(&self, d: &GpuDevice) -> Result<nvml_wrapper::Device<'_>, NvmlError> {
        let err = |e: nvml_wrapper::error::NvmlError| NvmlError::Device {
            index: d.index,
            message: e.to_string(),
        };
        let count = self.lib.device_count().map_err(err)?;
        for i in 0..count {
            let gpu = self.lib.device_by_index(i).map_err(err)?;
            if gpu.minor_number().map_err(err)? != d.minor {
                continue;
            }
            let Some(gi) = d.gpu_instance_id else {
                return Ok(gpu);
            };
            for m in 0..gpu.mig_device_count().unwrap_or(0) {
                let Ok(mig) = gpu.mig_device_by_index(m) else {
                    continue;
                };
                if self.gpu_instance_id(&mig) == Some(gi) {
                    return Ok(mig);
                }
            }
        }
        Err(NvmlError::Device {
            index: d.index,
            message: format!("no longer present (minor {})", d.minor),
        })
    }

    fn gpu_instance_id(&self, dev: &nvml_wrapper::Device<'_>) -> Option<u32> {
        let sym = self.lib.lib().nvmlDeviceGetGpuInstanceId.as_ref().ok()?;
        let mut id = 0u32;
        // SAFETY: the handle is a live MIG device handle of this NVML instance and `id` is a
        // valid out-pointer; NVML writes one u32.
        let ret = unsafe { sym(dev.handle(), &mut id) };
        (ret == 0).then_some(id)
    }
}

impl Nvml for RealNvml {
    fn devices(&self) -> Result<Vec<GpuDevice>, NvmlError> {
        let other = |e: nvml_wrapper::error::NvmlError| NvmlError::Other(e.to_string());
        let count = self.lib.device_count().map_err(other)?;
        let mut gpus = Vec::new();
        for i in 0..count {
            let gpu = self.lib.device_by_index(i).map_err(other)?;
            gpus.push((gpu.minor_number().map_err(other)?, gpu));
        }
        gpus.sort_by_key(|(minor, _)| *minor);
        let mut list = Vec::new();
        for (minor, gpu) in gpus {
            let uuid = gpu.uuid().map_err(other)?;
            let model = gpu.name().unwrap_or_default();
            let bus_id = gpu.pci_info().map(|p| p.bus_id).unwrap_or_default();
            let vgpu = matches!(
                gpu.virtualization_mode(),
                Ok(GpuVirtualizationMode::Vgpu | GpuVirtualizationMode::HostVgpu)
            );
            let mig = gpu.mig_mode().map(|m| m.current == 1).unwrap_or(false);
            let mut instances = Vec::new();
            if mig {
                for m in 0..gpu.mig_device_count().unwrap_or(0) {
                    let Ok(dev) = gpu.mig_device_by_index(m) else {
                        continue;
                    };
                    let Some(gi) = self.gpu_instance_id(&dev) else {
                        continue;
                    };
                    let sm = dev.attributes().ok().map(|a| a.multiprocessor_count);
                    instances.push((gi, sm));
                }
            }
            if instances.is_empty() {
                list.push(GpuDevice {
                    index: 0,
                    minor,
                    uuid,
                    gpu_instance_id: None,
                    sm_count: full_gpu_sm_count(&model),
                    fraction: 1.0,
                    model,
                    bus_id,
                    vgpu,
                });
            } else {
                for (gi, sm) in instances {
                    list.push(GpuDevice {
                        index: 0,
                        minor,
                        uuid: uuid.clone(),
                        gpu_instance_id: Some(gi),
                        sm_count: sm,
                        fraction: 1.0,
                        model: model.clone(),
                        bus_id: bus_id.clone(),
                        vgpu,
                    });
                }
            }
        }
        Ok(finish(list))
    }

    fn read(&self, d: &GpuDevice) -> Result<GpuReading, NvmlError> {
        use nvml_wrapper::bitmasks::device::ThrottleReasons;
        use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
        let dev = self.handle(d)?;
        let utilization = dev.utilization_rates().ok();
        let memory = dev.memory_info().ok();
        let reasons = dev.current_throttle_reasons().ok().map(|r| {
            [
                (ThrottleReasons::GPU_IDLE, "gpu_idle"),
                (
                    ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
                    "applications_clocks_setting",
                ),
                (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
                (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
                (ThrottleReasons::SYNC_BOOST, "sync_boost"),
                (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
                (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
                (
                    ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
                    "hw_power_brake_slowdown",
                ),
            ]
            .into_iter()
            .filter(|(bit, _)| r.contains(*bit))
            .map(|(_, name)| name)
            .collect()
        });
        let processes = dev
            .running_compute_processes()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| match p.used_gpu_memory {
                nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => Some((p.pid, b)),
                nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
            })
            .collect();
        Ok(GpuReading {
            energy_joules: dev
                .total_energy_consumption()
                .ok()
                .map(|mj| mj as f64 / 1000.0),
            power_watts: dev.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
            utilization: utilization.as_ref().map(|u| f64::from(u.gpu) / 100.0),
            memory_utilization: utilization.as_ref().map(|u| f64::from(u.memory) / 100.0),
            memory_used_bytes: memory.as_ref().map(|m| m.used as f64),
            memory_total_bytes: memory.as_ref().map(|m| m.total as f64),
            temperature_celsius: dev.temperature(TemperatureSensor::Gpu).ok().map(f64::from),
            sm_clock_hertz: dev.clock_info(Clock::SM).ok().map(|c| f64::from(c) * 1e6),
            memory_clock_hertz: dev
                .clock_info(Clock::Memory)
                .ok()
                .map(|c| f64::from(c) * 1e6),
            throttle_reasons: reasons,
            processes,
        })
    }
}
