//! NVML behind a small trait, so the collector's logic is tested with a fake and the real
//! library only on a GPU node. The library is loaded at run time by its versioned name
//! (`libnvidia-ml.so.1`, what the driver installs), so the binary runs where it is absent.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

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

/// NVML's numbering of one device: the physical GPU's index and, for a MIG instance, its
/// index on that GPU. It holds for the life of an NVML session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    pub gpu: u32,
    pub mig: Option<u32>,
}

/// The NVML calls that enumerate devices, so that a fake device table stands in for the
/// driver in tests.
pub trait DeviceTable {
    fn count(&self) -> Result<u32, String>;
    fn minor(&self, gpu: u32) -> Result<u32, String>;
    fn mig_count(&self, gpu: u32) -> u32;
    fn gpu_instance(&self, gpu: u32, mig: u32) -> Option<u32>;
}

/// Where `d` (a GPU by its minor number, or a MIG instance by its GPU instance id) is in
/// NVML's numbering.
pub fn locate(table: &dyn DeviceTable, d: &GpuDevice) -> Result<Location, String> {
    for gpu in 0..table.count()? {
        if table.minor(gpu)? != d.minor {
            continue;
        }
        let Some(gi) = d.gpu_instance_id else {
            return Ok(Location { gpu, mig: None });
        };
        if let Some(mig) =
            (0..table.mig_count(gpu)).find(|m| table.gpu_instance(gpu, *m) == Some(gi))
        {
            return Ok(Location {
                gpu,
                mig: Some(mig),
            });
        }
    }
    Err(format!("no longer present (minor {})", d.minor))
}

/// Locations found once and kept, so that a scrape reads each device through one handle
/// lookup instead of walking the device list for each.
#[derive(Debug, Default)]
pub struct Locations(Mutex<HashMap<(u32, Option<u32>), Location>>);

impl Locations {
    pub fn get(&self, table: &dyn DeviceTable, d: &GpuDevice) -> Result<Location, String> {
        let key = (d.minor, d.gpu_instance_id);
        let mut known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(loc) = known.get(&key) {
            return Ok(*loc);
        }
        let loc = locate(table, d)?;
        known.insert(key, loc);
        Ok(loc)
    }

    /// Forgets where `d` was: it failed, and is looked for again at the next scrape.
    pub fn forget(&self, d: &GpuDevice) {
        let mut known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        known.remove(&(d.minor, d.gpu_instance_id));
    }
}

/// Energy (mJ since the driver loaded) and power (mW, averaged over a second, what
/// `nvmlDeviceGetPowerUsage` gives on the GPUs that have this field) in one
/// `nvmlDeviceGetFieldValues` call. Utilisation, memory, temperature and clocks have no field
/// id in NVML 12 and keep their own calls.
pub const ENERGY_POWER_FIELDS: [u32; 2] = [
    nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_POWER_AVERAGE,
];

/// Joules and watts from the raw [`ENERGY_POWER_FIELDS`] values.
pub fn energy_power(raw: [Option<f64>; 2]) -> (Option<f64>, Option<f64>) {
    (raw[0].map(|mj| mj / 1000.0), raw[1].map(|mw| mw / 1000.0))
}

/// The system's NVML.
pub struct RealNvml {
    lib: nvml_wrapper::Nvml,
    locations: Locations,
    /// Cleared when the driver has no `nvmlDeviceGetFieldValues`: one call per field then.
    fields_work: AtomicBool,
}

impl DeviceTable for RealNvml {
    fn count(&self) -> Result<u32, String> {
        self.lib.device_count().map_err(|e| e.to_string())
    }
    fn minor(&self, gpu: u32) -> Result<u32, String> {
        let dev = self.lib.device_by_index(gpu).map_err(|e| e.to_string())?;
        dev.minor_number().map_err(|e| e.to_string())
    }
    fn mig_count(&self, gpu: u32) -> u32 {
        self.lib
            .device_by_index(gpu)
            .and_then(|d| d.mig_device_count())
            .unwrap_or(0)
    }
    fn gpu_instance(&self, gpu: u32, mig: u32) -> Option<u32> {
        let dev = self.lib.device_by_index(gpu).ok()?;
        self.gpu_instance_id(&dev.mig_device_by_index(mig).ok()?)
    }
}

impl RealNvml {
    pub fn load() -> Result<RealNvml, NvmlError> {
        let lib = nvml_wrapper::Nvml::builder()
            .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
            .init()
            .map_err(|e| NvmlError::Load(e.to_string()))?;
        Ok(RealNvml {
            lib,
            locations: Locations::default(),
            fields_work: AtomicBool::new(true),
        })
    }

    /// The handle of `d`: where it was found before, else found now.
    fn handle(&self, d: &GpuDevice) -> Result<nvml_wrapper::Device<'_>, NvmlError> {
        let fail = |message: String| NvmlError::Device {
            index: d.index,
            message,
        };
        let loc = self.locations.get(self, d).map_err(fail)?;
        let gpu = self.lib.device_by_index(loc.gpu);
        let dev = match loc.mig {
            None => gpu,
            Some(m) => gpu.and_then(|g| g.mig_device_by_index(m)),
        };
        dev.map_err(|e| {
            self.locations.forget(d);
            fail(e.to_string())
        })
    }

    /// Energy and power, batched where the driver can.
    fn energy_power(&self, dev: &nvml_wrapper::Device<'_>) -> (Option<f64>, Option<f64>) {
        use nvml_wrapper::enums::device::SampleValue;
        use nvml_wrapper::structs::device::FieldId;
        let mut raw = [None, None];
        if self.fields_work.load(Ordering::Relaxed) {
            match dev.field_values_for(&ENERGY_POWER_FIELDS.map(FieldId)) {
                Ok(samples) => {
                    for (slot, sample) in raw.iter_mut().zip(samples) {
                        *slot = match sample.and_then(|s| s.value) {
                            Ok(SampleValue::F64(v)) => Some(v),
                            Ok(SampleValue::U32(v)) => Some(f64::from(v)),
                            Ok(SampleValue::U64(v)) => Some(v as f64),
                            Ok(SampleValue::I64(v)) => Some(v as f64),
                            Err(_) => None,
                        };
                    }
                }
                Err(nvml_wrapper::error::NvmlError::FailedToLoadSymbol(_)) => {
                    self.fields_work.store(false, Ordering::Relaxed);
                }
                Err(_) => {}
            }
        }
        // Fields this driver or GPU does not answer: their own calls.
        if raw[0].is_none() {
            raw[0] = dev.total_energy_consumption().ok().map(|mj| mj as f64);
        }
        if raw[1].is_none() {
            raw[1] = dev.power_usage().ok().map(f64::from);
        }
        energy_power(raw)
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
                    instances.push((gi, sm, dev.uuid().ok()));
                }
            }
            if instances.is_empty() {
                list.push(GpuDevice {
                    index: 0,
                    minor,
                    uuid,
                    gpu_instance_id: None,
                    instance_uuid: None,
                    sm_count: full_gpu_sm_count(&model),
                    fraction: 1.0,
                    model,
                    bus_id,
                    vgpu,
                });
            } else {
                for (gi, sm, instance_uuid) in instances {
                    list.push(GpuDevice {
                        index: 0,
                        minor,
                        uuid: uuid.clone(),
                        gpu_instance_id: Some(gi),
                        instance_uuid,
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
        let (energy_joules, power_watts) = self.energy_power(&dev);
        if energy_joules.is_none() && power_watts.is_none() && memory.is_none() {
            // Fell off the bus or was reset: look for it again next time.
            self.locations.forget(d);
        }
        Ok(GpuReading {
            energy_joules,
            power_watts,
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A driver's device table: GPUs by minor number, each with its MIG instances' GPU
    /// instance ids; every call is counted.
    struct FakeTable {
        gpus: Vec<(u32, Vec<u32>)>,
        calls: Cell<usize>,
    }

    impl FakeTable {
        fn call(&self) {
            self.calls.set(self.calls.get() + 1);
        }
    }

    impl DeviceTable for FakeTable {
        fn count(&self) -> Result<u32, String> {
            self.call();
            Ok(self.gpus.len() as u32)
        }
        fn minor(&self, gpu: u32) -> Result<u32, String> {
            self.call();
            self.gpus
                .get(gpu as usize)
                .map(|g| g.0)
                .ok_or_else(|| "GPU is lost".to_owned())
        }
        fn mig_count(&self, gpu: u32) -> u32 {
            self.call();
            self.gpus.get(gpu as usize).map_or(0, |g| g.1.len() as u32)
        }
        fn gpu_instance(&self, gpu: u32, mig: u32) -> Option<u32> {
            self.call();
            self.gpus.get(gpu as usize)?.1.get(mig as usize).copied()
        }
    }

    fn device(minor: u32, gi: Option<u32>) -> GpuDevice {
        GpuDevice::for_test(0, minor, gi, 1.0)
    }

    #[test]
    fn devices_are_found_once_then_read_through_their_location() {
        // NVML numbers GPUs by PCI order, which need not be minor order.
        let table = FakeTable {
            gpus: vec![(3, vec![]), (0, vec![]), (1, vec![7, 2, 9])],
            calls: Cell::new(0),
        };
        let locations = Locations::default();
        let mig = device(1, Some(2));
        let whole = device(0, None);
        for _ in 0..3 {
            assert_eq!(
                locations.get(&table, &mig),
                Ok(Location {
                    gpu: 2,
                    mig: Some(1)
                })
            );
            assert_eq!(
                locations.get(&table, &whole),
                Ok(Location { gpu: 1, mig: None })
            );
        }
        let first = table.calls.get();
        assert!(first > 0);
        for _ in 0..100 {
            locations.get(&table, &mig).unwrap();
            locations.get(&table, &whole).unwrap();
        }
        assert_eq!(
            table.calls.get(),
            first,
            "later scrapes walked the device list"
        );
        // A device that failed is looked for again, once.
        locations.forget(&mig);
        locations.get(&table, &mig).unwrap();
        let again = table.calls.get();
        assert!(again > first);
        locations.get(&table, &mig).unwrap();
        assert_eq!(table.calls.get(), again);
    }

    #[test]
    fn absent_devices_are_errors_and_not_remembered() {
        let table = FakeTable {
            gpus: vec![(0, vec![1])],
            calls: Cell::new(0),
        };
        let locations = Locations::default();
        let gone_instance = device(0, Some(5));
        assert!(locations.get(&table, &gone_instance).is_err());
        assert!(locations.get(&table, &device(4, None)).is_err());
        let before = table.calls.get();
        assert!(locations.get(&table, &gone_instance).is_err());
        assert!(
            table.calls.get() > before,
            "an absent device was remembered"
        );
    }

    #[test]
    fn batched_fields_are_in_base_units() {
        assert_eq!(
            energy_power([Some(123_456.0), Some(350_250.0)]),
            (Some(123.456), Some(350.25))
        );
        assert_eq!(energy_power([None, Some(1000.0)]), (None, Some(1.0)));
        assert_eq!(ENERGY_POWER_FIELDS, [83, 185]);
    }
}
