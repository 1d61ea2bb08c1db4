//! NVML behind a small trait, so the collector's logic is tested with a fake and the real
//! library only on a GPU node. The library is loaded at run time by its versioned name
//! (`libnvidia-ml.so.1`, what the driver installs), so the binary runs where it is absent.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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
    /// Its compute processes are listed only when `want_processes` (a job holds a GPU).
    fn read(&self, device: &GpuDevice, want_processes: bool) -> Result<GpuReading, NvmlError>;
    /// Feeds each GPU's energy meter a power sample, between scrapes (see [`EnergyMeter`]).
    fn sample_power(&self) {}
}

/// Counter reads that take less than this are made at every scrape.
const CHEAP_COUNTER: Duration = Duration::from_micros(200);

/// A GPU's energy counter, read from the hardware at most once per `interval` when that read is
/// dear (on Hopper GPUs, `nvmlDeviceGetTotalEnergyConsumption` costs about 4 ms of CPU, a
/// thousand times a power reading), and between two reads advanced by power samples (NVML's
/// one-second average, taken every two seconds). Each hardware read sets it right again; it never
/// goes back, except when the driver's own counter restarts (a driver reload).
#[derive(Debug, Clone)]
pub struct EnergyMeter {
    interval: Duration,
    /// The last hardware reading: when, in joules.
    counter: Option<(Instant, f64)>,
    /// Joules from power samples since that reading.
    since_counter: f64,
    last_sample: Option<Instant>,
    served: f64,
    /// The last hardware read was cheap: read at every scrape.
    cheap: bool,
}

impl EnergyMeter {
    /// `interval` zero: the hardware counter at every scrape, however dear.
    pub fn new(interval: Duration) -> EnergyMeter {
        EnergyMeter {
            interval,
            counter: None,
            since_counter: 0.0,
            last_sample: None,
            served: 0.0,
            cheap: false,
        }
    }

    /// Whether this scrape reads the hardware counter.
    pub fn wants_counter(&self, now: Instant) -> bool {
        self.cheap
            || self.interval.is_zero()
            || self
                .counter
                .is_none_or(|(at, _)| now.saturating_duration_since(at) >= self.interval)
    }

    /// A hardware reading, and what it cost.
    pub fn counter(&mut self, now: Instant, joules: f64, cost: Duration) {
        if self.counter.is_some_and(|(_, before)| joules < before) {
            // The driver restarted its counter: so does this one.
            self.served = 0.0;
        }
        self.counter = Some((now, joules));
        self.since_counter = 0.0;
        self.last_sample = Some(now);
        self.cheap = cost < CHEAP_COUNTER;
    }

    /// A power sample: NVML's average over the second before `now`.
    pub fn power(&mut self, now: Instant, watts: f64) {
        if let Some(last) = self.last_sample {
            self.since_counter +=
                watts.max(0.0) * now.saturating_duration_since(last).as_secs_f64();
        }
        self.last_sample = Some(now);
    }

    /// Joules since the driver loaded; None before a first hardware reading.
    pub fn joules(&mut self) -> Option<f64> {
        let (_, base) = self.counter?;
        self.served = self.served.max(base + self.since_counter);
        Some(self.served)
    }
}

/// The NVML calls that read one device, so that a fake stands in for the driver and a
/// scrape's calls can be counted. Each is one NVML call, except `clocks` (two).
pub trait DeviceReader {
    /// mW, NVML's one-second average.
    fn power_milliwatts(&self, at: Location) -> Option<f64>;
    /// mJ since the driver loaded.
    fn energy_millijoules(&self, at: Location) -> Option<f64>;
    /// GPU and memory use, 0..1.
    fn utilization(&self, at: Location) -> Option<(f64, f64)>;
    /// Used and total bytes.
    fn memory(&self, at: Location) -> Option<(f64, f64)>;
    fn throttle_reasons(&self, at: Location) -> Option<Vec<&'static str>>;
    fn temperature_celsius(&self, at: Location) -> Option<f64>;
    /// SM and memory clocks, in hertz.
    fn clocks_hertz(&self, at: Location) -> (Option<f64>, Option<f64>);
    /// `(pid, GPU memory)` of the compute processes.
    fn processes(&self, at: Location) -> Vec<(u32, u64)>;
}

/// One scrape's reading of the device at `at`: a MIG instance answers only its memory, use and
/// processes; a physical GPU also its power, energy (through `meter`), temperature, clocks and
/// throttling.
pub fn read_device(
    reader: &dyn DeviceReader,
    at: Location,
    meter: Option<&mut EnergyMeter>,
    want_processes: bool,
) -> GpuReading {
    let utilization = reader.utilization(at);
    let memory = reader.memory(at);
    let mut reading = GpuReading {
        utilization: utilization.map(|u| u.0),
        memory_utilization: utilization.map(|u| u.1),
        memory_used_bytes: memory.map(|m| m.0),
        memory_total_bytes: memory.map(|m| m.1),
        processes: if want_processes {
            reader.processes(at)
        } else {
            Vec::new()
        },
        ..Default::default()
    };
    if at.mig.is_some() {
        return reading;
    }
    let now = Instant::now();
    reading.power_watts = reader.power_milliwatts(at).map(|mw| mw / 1000.0);
    reading.energy_joules = match meter {
        None => reader.energy_millijoules(at).map(|mj| mj / 1000.0),
        Some(meter) => {
            if meter.wants_counter(now) {
                let began = Instant::now();
                if let Some(mj) = reader.energy_millijoules(at) {
                    meter.counter(now, mj / 1000.0, began.elapsed());
                }
            } else if let Some(w) = reading.power_watts {
                meter.power(now, w);
            }
            meter.joules()
        }
    };
    reading.temperature_celsius = reader.temperature_celsius(at);
    (reading.sm_clock_hertz, reading.memory_clock_hertz) = reader.clocks_hertz(at);
    reading.throttle_reasons = reader.throttle_reasons(at);
    reading
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

/// The system's NVML.
pub struct RealNvml {
    lib: nvml_wrapper::Nvml,
    locations: Locations,
    /// Each physical GPU's energy meter, by its location.
    meters: Mutex<HashMap<u32, (Location, EnergyMeter)>>,
    energy_interval: Duration,
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
    /// Loads the driver's library; a GPU's energy counter is read from the hardware at most
    /// once per `energy_interval` when that read is dear (see [`EnergyMeter`]).
    pub fn load(energy_interval: Duration) -> Result<RealNvml, NvmlError> {
        let lib = nvml_wrapper::Nvml::builder()
            .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
            .init()
            .map_err(|e| NvmlError::Load(e.to_string()))?;
        Ok(RealNvml {
            lib,
            locations: Locations::default(),
            meters: Mutex::new(HashMap::new()),
            energy_interval,
        })
    }

    fn device_at(&self, at: Location) -> Option<nvml_wrapper::Device<'_>> {
        let gpu = self.lib.device_by_index(at.gpu).ok()?;
        match at.mig {
            None => Some(gpu),
            Some(m) => gpu.mig_device_by_index(m).ok(),
        }
    }

    /// Where `d` is: where it was found before, else found now.
    fn location(&self, d: &GpuDevice) -> Result<Location, NvmlError> {
        self.locations
            .get(self, d)
            .map_err(|message| NvmlError::Device {
                index: d.index,
                message,
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

    fn read(&self, d: &GpuDevice, want_processes: bool) -> Result<GpuReading, NvmlError> {
        let at = self.location(d)?;
        let reading = if at.mig.is_some() {
            read_device(self, at, None, want_processes)
        } else {
            let mut meters = self.meters.lock().unwrap_or_else(|p| p.into_inner());
            let (_, meter) = meters
                .entry(d.minor)
                .or_insert_with(|| (at, EnergyMeter::new(self.energy_interval)));
            read_device(self, at, Some(meter), want_processes)
        };
        if reading.energy_joules.is_none()
            && reading.power_watts.is_none()
            && reading.memory_used_bytes.is_none()
        {
            // Fell off the bus or was reset: look for it again next time.
            self.locations.forget(d);
            self.meters
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&d.minor);
        }
        Ok(reading)
    }

    fn sample_power(&self) {
        let mut meters = self.meters.lock().unwrap_or_else(|p| p.into_inner());
        for (at, meter) in meters.values_mut() {
            if let Some(mw) = self.power_milliwatts(*at) {
                meter.power(Instant::now(), mw / 1000.0);
            }
        }
    }
}

impl DeviceReader for RealNvml {
    fn power_milliwatts(&self, at: Location) -> Option<f64> {
        self.device_at(at)?.power_usage().ok().map(f64::from)
    }
    fn energy_millijoules(&self, at: Location) -> Option<f64> {
        self.device_at(at)?
            .total_energy_consumption()
            .ok()
            .map(|mj| mj as f64)
    }
    fn utilization(&self, at: Location) -> Option<(f64, f64)> {
        let u = self.device_at(at)?.utilization_rates().ok()?;
        Some((f64::from(u.gpu) / 100.0, f64::from(u.memory) / 100.0))
    }
    fn memory(&self, at: Location) -> Option<(f64, f64)> {
        let m = self.device_at(at)?.memory_info().ok()?;
        Some((m.used as f64, m.total as f64))
    }
    fn throttle_reasons(&self, at: Location) -> Option<Vec<&'static str>> {
        use nvml_wrapper::bitmasks::device::ThrottleReasons;
        let r = self.device_at(at)?.current_throttle_reasons().ok()?;
        Some(
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
            .collect(),
        )
    }
    fn temperature_celsius(&self, at: Location) -> Option<f64> {
        use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
        let t = self
            .device_at(at)?
            .temperature(TemperatureSensor::Gpu)
            .ok()?;
        Some(f64::from(t))
    }
    fn clocks_hertz(&self, at: Location) -> (Option<f64>, Option<f64>) {
        use nvml_wrapper::enum_wrappers::device::Clock;
        let Some(dev) = self.device_at(at) else {
            return (None, None);
        };
        let hz = |c: Clock| dev.clock_info(c).ok().map(|mhz| f64::from(mhz) * 1e6);
        (hz(Clock::SM), hz(Clock::Memory))
    }
    fn processes(&self, at: Location) -> Vec<(u32, u64)> {
        use nvml_wrapper::enums::device::UsedGpuMemory;
        let Some(dev) = self.device_at(at) else {
            return Vec::new();
        };
        dev.running_compute_processes()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some((p.pid, b)),
                UsedGpuMemory::Unavailable => None,
            })
            .collect()
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

    /// A driver that answers every call and counts each, by name.
    #[derive(Default)]
    struct CountingReader {
        calls: std::cell::RefCell<HashMap<&'static str, usize>>,
        energy_mj: Cell<f64>,
        power_mw: Cell<f64>,
        /// How long the energy counter takes to answer (Hopper's: about 4 ms).
        energy_cost: Cell<Duration>,
    }

    impl CountingReader {
        fn count(&self, call: &'static str) {
            *self.calls.borrow_mut().entry(call).or_default() += 1;
        }
        fn calls(&self) -> HashMap<&'static str, usize> {
            std::mem::take(&mut *self.calls.borrow_mut())
        }
    }

    impl DeviceReader for CountingReader {
        fn power_milliwatts(&self, _: Location) -> Option<f64> {
            self.count("power");
            Some(self.power_mw.get())
        }
        fn energy_millijoules(&self, _: Location) -> Option<f64> {
            self.count("energy");
            std::thread::sleep(self.energy_cost.get());
            Some(self.energy_mj.get())
        }
        fn utilization(&self, _: Location) -> Option<(f64, f64)> {
            self.count("utilization");
            Some((0.5, 0.25))
        }
        fn memory(&self, _: Location) -> Option<(f64, f64)> {
            self.count("memory");
            Some((1e9, 8e10))
        }
        fn throttle_reasons(&self, _: Location) -> Option<Vec<&'static str>> {
            self.count("throttle_reasons");
            Some(vec!["sw_power_cap"])
        }
        fn temperature_celsius(&self, _: Location) -> Option<f64> {
            self.count("temperature");
            Some(40.0)
        }
        fn clocks_hertz(&self, _: Location) -> (Option<f64>, Option<f64>) {
            self.count("clocks");
            (Some(1.98e9), Some(2.6e9))
        }
        fn processes(&self, _: Location) -> Vec<(u32, u64)> {
            self.count("processes");
            vec![(42, 1 << 30)]
        }
    }

    const GPU: Location = Location { gpu: 0, mig: None };

    #[test]
    fn a_scrape_makes_one_call_per_figure_and_lists_processes_only_for_jobs() {
        let driver = CountingReader::default();
        driver.energy_mj.set(5_000_000.0);
        driver.power_mw.set(300_000.0);
        driver.energy_cost.set(Duration::from_millis(1));
        let mut meter = EnergyMeter::new(Duration::from_secs(300));
        let first = read_device(&driver, GPU, Some(&mut meter), true);
        assert_eq!(first.energy_joules, Some(5000.0));
        assert_eq!(first.power_watts, Some(300.0));
        assert_eq!(first.processes, [(42, 1 << 30)]);
        let one_each: HashMap<&str, usize> = [
            "power",
            "energy",
            "utilization",
            "memory",
            "throttle_reasons",
            "temperature",
            "clocks",
            "processes",
        ]
        .into_iter()
        .map(|c| (c, 1))
        .collect();
        assert_eq!(driver.calls(), one_each);
        // No job holds a GPU: no process list. The dear energy counter waits for its interval.
        let later = read_device(&driver, GPU, Some(&mut meter), false);
        assert!(later.processes.is_empty());
        let calls = driver.calls();
        assert_eq!(calls.get("processes"), None, "{calls:?}");
        assert_eq!(calls.get("energy"), None, "{calls:?}");
        assert_eq!(calls.values().sum::<usize>(), 6, "{calls:?}");
        assert!(later.energy_joules.unwrap() >= 5000.0);
        // A MIG instance: its memory, use and processes only.
        let mig = read_device(
            &driver,
            Location {
                gpu: 0,
                mig: Some(1),
            },
            None,
            true,
        );
        assert_eq!(mig.memory_used_bytes, Some(1e9));
        assert_eq!((mig.power_watts, mig.energy_joules), (None, None));
        let calls = driver.calls();
        let mut names: Vec<&str> = calls.keys().copied().collect();
        names.sort();
        assert_eq!(names, ["memory", "processes", "utilization"]);
    }

    #[test]
    fn a_cheap_counter_is_read_at_every_scrape_a_dear_one_once_per_interval() {
        let t0 = Instant::now();
        let s = |secs: f64| t0 + Duration::from_secs_f64(secs);
        let mut cheap = EnergyMeter::new(Duration::from_secs(300));
        cheap.counter(s(0.0), 100.0, Duration::from_micros(5));
        assert!(cheap.wants_counter(s(1.0)));
        let mut dear = EnergyMeter::new(Duration::from_secs(300));
        assert!(dear.wants_counter(s(0.0)), "no reading yet");
        dear.counter(s(0.0), 100.0, Duration::from_millis(4));
        assert!(!dear.wants_counter(s(299.0)));
        assert!(dear.wants_counter(s(300.0)));
        let mut every = EnergyMeter::new(Duration::ZERO);
        every.counter(s(0.0), 100.0, Duration::from_millis(4));
        assert!(
            every.wants_counter(s(0.5)),
            "an interval of zero reads every scrape"
        );
    }

    #[test]
    fn power_samples_carry_the_counter_between_readings_and_it_never_goes_back() {
        let t0 = Instant::now();
        let s = |secs: f64| t0 + Duration::from_secs_f64(secs);
        let mut m = EnergyMeter::new(Duration::from_secs(300));
        assert_eq!(m.joules(), None);
        m.counter(s(0.0), 1000.0, Duration::from_millis(4));
        // 200 W for 10 s, sampled each second.
        for i in 1..=10 {
            m.power(s(f64::from(i)), 200.0);
        }
        assert_eq!(m.joules(), Some(3000.0));
        // The hardware says a little less than the samples: held, not lowered.
        m.counter(s(10.0), 2990.0, Duration::from_millis(4));
        assert_eq!(m.joules(), Some(3000.0));
        m.power(s(11.0), 100.0);
        assert_eq!(m.joules(), Some(3090.0));
        // A little more: the hardware's figure.
        m.counter(s(12.0), 3200.0, Duration::from_millis(4));
        assert_eq!(m.joules(), Some(3200.0));
        // The driver reloaded: the counter restarts with it.
        m.counter(s(13.0), 5.0, Duration::from_millis(4));
        assert_eq!(m.joules(), Some(5.0));
    }
}
