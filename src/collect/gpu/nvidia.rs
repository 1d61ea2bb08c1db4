//! The `nvidia` collector (off by default): NVML readings per GPU, and per job the GPU energy,
//! power, use and memory of the GPUs the slurm collector mapped to it, weighted by the job's
//! share. NVML that fails to load, or a GPU that fails, never fails the scrape of the others.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::nvml::{GpuReading, Nvml, NvmlError, RealNvml, THROTTLE_REASONS};
use super::GpuDevice;
use crate::collect::units::{self, UnitGpus};
use crate::collect::{CollectError, Collector, CollectorSpec, Context};
use crate::config::{Kind, Opt};
use crate::metrics::{Labels, MetricSet};

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "nvidia",
    default_enabled: false,
    // /dev/nvidia* are world-usable; NVML needs no capability.
    capabilities: &[],
    options,
    build,
    self_test: None,
    sub_collectors: &[],
};

fn options() -> Vec<Opt> {
    vec![Opt::new(
        "collector.nvidia.energy-counter-interval",
        Kind::Duration,
        "Read a GPU's energy counter from the hardware at most this often when the read is dear (about 4 ms of CPU on Hopper GPUs), carrying it between reads with the GPU's power sampled every 2 s; 0s reads it at every scrape",
    )
    .default("5m")]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Settings {
    #[serde(deserialize_with = "crate::config::de_duration")]
    energy_counter_interval: Duration,
}

/// How often the energy meters get a power sample (NVML's power is a one-second average).
/// Each wake-up of the sampler costs about 40 µs of CPU on a GPU node (measured on an H200 by
/// scripts/gpu-check.sh), whatever the number of GPUs: every 2 s keeps a GPU's cost per 15 s
/// scrape under a millisecond, and the counter read every interval corrects the drift.
const POWER_SAMPLE_PERIOD: Duration = Duration::from_secs(2);

fn build(ctx: &Context) -> Result<Box<dyn Collector>, CollectError> {
    let s: Settings = ctx.settings()?;
    let nvml = Arc::new(LazyNvml::new(s.energy_counter_interval));
    if !s.energy_counter_interval.is_zero() {
        let weak = Arc::downgrade(&nvml);
        let sampler = std::thread::Builder::new()
            .name("ceems-gpu-power".into())
            .spawn(move || loop {
                std::thread::sleep(POWER_SAMPLE_PERIOD);
                match weak.upgrade() {
                    Some(nvml) => nvml.sample_power(),
                    None => break,
                }
            });
        if let Err(e) = sampler {
            tracing::warn!(error = %e, "no power sampler: GPU energy is carried between counter reads by each scrape's power");
        }
    }
    Ok(Box::new(NvidiaCollector::new(
        Box::new(nvml),
        &ctx.paths.procfs,
        &ctx.hostname,
    )))
}

/// NVML loaded on first use and retried at most once a minute, so a node whose driver loads
/// after the exporter starts gets its series.
struct LazyNvml {
    energy_interval: Duration,
    state: Mutex<(Option<RealNvml>, Option<Instant>)>,
}

impl LazyNvml {
    fn new(energy_interval: Duration) -> LazyNvml {
        LazyNvml {
            energy_interval,
            state: Mutex::new((None, None)),
        }
    }
}

impl LazyNvml {
    fn with<T>(&self, f: impl FnOnce(&RealNvml) -> Result<T, NvmlError>) -> Result<T, NvmlError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.0.is_none() {
            if state
                .1
                .is_some_and(|t| t.elapsed() < Duration::from_secs(60))
            {
                return Err(NvmlError::Load("not loaded (retried every minute)".into()));
            }
            state.1 = Some(Instant::now());
            state.0 = Some(RealNvml::load(self.energy_interval)?);
        }
        match &state.0 {
            Some(lib) => f(lib),
            None => Err(NvmlError::Load("not loaded".into())),
        }
    }
}

impl Nvml for LazyNvml {
    fn devices(&self) -> Result<Vec<GpuDevice>, NvmlError> {
        self.with(|n| n.devices())
    }
    fn read(&self, device: &GpuDevice, want_processes: bool) -> Result<GpuReading, NvmlError> {
        self.with(|n| n.read(device, want_processes))
    }
    fn sample_power(&self) {
        // Only a loaded library: the sampler never loads it.
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = &state.0 {
            n.sample_power();
        }
    }
}

impl<T: Nvml> Nvml for Arc<T> {
    fn devices(&self) -> Result<Vec<GpuDevice>, NvmlError> {
        self.as_ref().devices()
    }
    fn read(&self, device: &GpuDevice, want_processes: bool) -> Result<GpuReading, NvmlError> {
        self.as_ref().read(device, want_processes)
    }
    fn sample_power(&self) {
        self.as_ref().sample_power()
    }
}

/// How often the device list is asked again (MIG layouts change only by an admin's hand).
const INVENTORY_TTL: Duration = Duration::from_secs(300);

pub struct NvidiaCollector {
    nvml: Box<dyn Nvml>,
    procfs: PathBuf,
    hostname: String,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    devices: Vec<GpuDevice>,
    listed_at: Option<Instant>,
    /// Failed readings per GPU (uuid, gpu instance id).
    errors: HashMap<(String, String), u64>,
    /// The energy counter of each physical GPU when a job was first seen on it, so a job's
    /// counter starts at its own start.
    baselines: HashMap<(String, String), f64>,
    /// Each job's energy so far, kept when a reading fails so the counter never drops.
    job_energy: HashMap<String, f64>,
}

fn gi(d: &GpuDevice) -> String {
    d.gpu_instance_id.map(|g| g.to_string()).unwrap_or_default()
}

impl NvidiaCollector {
    pub fn new(nvml: Box<dyn Nvml>, procfs: &Path, hostname: &str) -> NvidiaCollector {
        NvidiaCollector {
            nvml,
            procfs: procfs.to_owned(),
            hostname: hostname.to_owned(),
            state: Mutex::new(State::default()),
        }
    }

    /// The unit of `held` a process belongs to, whatever its manager: the one whose cgroup is
    /// the process's, or above it, in a line of `/proc/<pid>/cgroup`.
    fn unit_of<'a>(&self, pid: u32, held: &'a [UnitGpus]) -> Option<&'a str> {
        let text =
            std::fs::read_to_string(self.procfs.join(pid.to_string()).join("cgroup")).ok()?;
        text.lines()
            .filter_map(|l| l.splitn(3, ':').nth(2))
            .find_map(|path| {
                let path = Path::new(path.trim_start_matches('/'));
                held.iter()
                    .find(|u| !u.rel.as_os_str().is_empty() && path.starts_with(&u.rel))
            })
            .map(|u| u.uuid.as_str())
    }

    fn emit_device(
        &self,
        out: &mut MetricSet,
        pairs: &[(&str, &str)],
        r: &GpuReading,
        physical: bool,
    ) {
        let labels = &Labels::new(pairs);
        let mut g = |name: &str, help: &str, v: Option<f64>| {
            if let Some(v) = v {
                out.gauge(name, help, labels.clone(), v);
            }
        };
        g(
            "ceems_nvidia_gpu_utilization_ratio",
            "Share of the last sample period in which a kernel ran on the GPU",
            r.utilization,
        );
        g(
            "ceems_nvidia_gpu_memory_utilization_ratio",
            "Share of the last sample period in which GPU memory was read or written",
            r.memory_utilization,
        );
        g(
            "ceems_nvidia_gpu_memory_used_bytes",
            "GPU memory in use",
            r.memory_used_bytes,
        );
        g(
            "ceems_nvidia_gpu_memory_total_bytes",
            "GPU memory installed",
            r.memory_total_bytes,
        );
        if !physical {
            return;
        }
        g(
            "ceems_nvidia_gpu_power_watts",
            "Power drawn by the GPU",
            r.power_watts,
        );
        g(
            "ceems_nvidia_gpu_temperature_celsius",
            "GPU die temperature",
            r.temperature_celsius,
        );
        g(
            "ceems_nvidia_gpu_sm_clock_hertz",
            "Streaming multiprocessor clock",
            r.sm_clock_hertz,
        );
        g(
            "ceems_nvidia_gpu_memory_clock_hertz",
            "GPU memory clock",
            r.memory_clock_hertz,
        );
        if let Some(j) = r.energy_joules {
            out.counter(
                "ceems_nvidia_gpu_energy_joules_total",
                "Energy used by the GPU since the driver loaded",
                labels.clone(),
                j,
            );
        }
        if let Some(active) = &r.throttle_reasons {
            for reason in THROTTLE_REASONS {
                out.gauge(
                    "ceems_nvidia_gpu_clocks_throttled",
                    "1 when this reason holds the GPU's clocks down",
                    Labels::new(&[pairs, &[("reason", *reason)]].concat()),
                    if active.contains(reason) { 1.0 } else { 0.0 },
                );
            }
        }
    }
}

impl Collector for NvidiaCollector {
    fn collect(&self, out: &mut MetricSet) -> Result<(), CollectError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.listed_at.is_none_or(|t| t.elapsed() > INVENTORY_TTL) {
            state.devices = self
                .nvml
                .devices()
                .map_err(|e| CollectError::Other(e.to_string()))?;
            state.listed_at = Some(Instant::now());
        }
        let devices = state.devices.clone();
        // Processes' GPU memory is only for jobs: no job on a GPU, no process list.
        let held = units::published();
        let want_processes = held.iter().any(|u| !u.devices.is_empty());
        // Physical GPUs (for energy, power, clocks), then MIG instances (their own memory).
        let mut physical: Vec<GpuDevice> = Vec::new();
        for d in &devices {
            if !physical.iter().any(|p| p.minor == d.minor) {
                physical.push(GpuDevice {
                    gpu_instance_id: None,
                    instance_uuid: None,
                    ..d.clone()
                });
            }
        }
        let mut readings: HashMap<(u32, Option<u32>), GpuReading> = HashMap::new();
        let mut failed = false;
        let targets = physical.iter().map(|p| (p, true)).chain(
            devices
                .iter()
                .filter(|d| d.gpu_instance_id.is_some())
                .map(|d| (d, false)),
        );
        for (d, is_physical) in targets {
            let mig_parent = is_physical
                && devices
                    .iter()
                    .any(|x| x.minor == d.minor && x.gpu_instance_id.is_some());
            let index = if mig_parent {
                String::new()
            } else {
                d.index.to_string()
            };
            let gpuiid = gi(d);
            let pairs = [
                ("gpuiid", gpuiid.as_str()),
                ("gpuuuid", d.uuid.as_str()),
                ("hostname", self.hostname.as_str()),
                ("index", index.as_str()),
            ];
            match self.nvml.read(d, want_processes) {
                Ok(r) => {
                    self.emit_device(out, &pairs, &r, is_physical);
                    readings.insert((d.minor, d.gpu_instance_id), r);
                }
                Err(e) => {
                    failed = true;
                    tracing::warn!(gpu = %d.uuid, index = d.index, error = %e, "GPU not read; skipped");
                    *state.errors.entry((d.uuid.clone(), gi(d))).or_default() += 1;
                }
            }
        }
        for ((uuid, gpuiid), n) in &state.errors {
            out.counter(
                "ceems_nvidia_gpu_read_errors_total",
                "Readings of the GPU that failed (the GPU is skipped in that scrape)",
                Labels::new(&[
                    ("gpuiid", gpuiid),
                    ("gpuuuid", uuid),
                    ("hostname", &self.hostname),
                ]),
                *n as f64,
            );
        }
        if failed && readings.is_empty() && !devices.is_empty() {
            return Err(CollectError::Other("no GPU could be read".into()));
        }
        self.emit_jobs(&mut state, &held, &readings, out);
        Ok(())
    }
}

impl NvidiaCollector {
    fn emit_jobs(
        &self,
        state: &mut State,
        held: &[UnitGpus],
        readings: &HashMap<(u32, Option<u32>), GpuReading>,
        out: &mut MetricSet,
    ) {
        // GPU memory of each job's processes, from every device's process list.
        let mut memory: HashMap<String, f64> = HashMap::new();
        for r in readings.values() {
            for (pid, bytes) in &r.processes {
                if let Some(unit) = self.unit_of(*pid, held) {
                    *memory.entry(unit.to_owned()).or_default() += *bytes as f64;
                }
            }
        }
        let mut live = HashSet::new();
        for job in held {
            let labels = Labels::new(&[
                ("cgrouphostname", &job.cgroup_host),
                ("hostname", &self.hostname),
                ("manager", job.manager),
                ("uuid", &job.uuid),
            ]);
            let mut power = None::<f64>;
            let mut energy = None::<f64>;
            let mut utilization = Vec::new();
            for (_, device, share) in &job.devices {
                let weight = device.fraction * share;
                if let Some(r) = readings.get(&(device.minor, None)) {
                    if let Some(p) = r.power_watts {
                        *power.get_or_insert(0.0) += weight * p;
                    }
                    if let Some(e) = r.energy_joules {
                        let key = (job.uuid.clone(), format!("{}.{}", device.minor, gi(device)));
                        live.insert(key.clone());
                        let base = *state.baselines.entry(key).or_insert(e);
                        *energy.get_or_insert(0.0) += weight * (e - base).max(0.0);
                    }
                    if device.gpu_instance_id.is_none() {
                        if let Some(u) = r.utilization {
                            utilization.push(u);
                        }
                    }
                }
            }
            if let Some(p) = power {
                out.gauge(
                    "ceems_compute_unit_gpu_power_watts",
                    "Power of the job's GPUs, weighted by its share of each",
                    labels.clone(),
                    p,
                );
            }
            let so_far = state.job_energy.entry(job.uuid.clone()).or_insert(0.0);
            if let Some(e) = energy {
                *so_far = so_far.max(e);
            }
            out.counter(
                "ceems_compute_unit_gpu_energy_joules_total",
                "Energy of the job's GPUs since the exporter first saw the job on them, weighted by its share of each",
                labels.clone(),
                *so_far,
            );
            if !utilization.is_empty() {
                out.gauge(
                    "ceems_compute_unit_gpu_utilization_ratio",
                    "Mean use of the job's full GPUs (NVML does not measure MIG instances)",
                    labels.clone(),
                    utilization.iter().sum::<f64>() / utilization.len() as f64,
                );
            }
            out.gauge(
                "ceems_compute_unit_gpu_memory_used_bytes",
                "GPU memory of the job's processes",
                labels,
                memory.get(&job.uuid).copied().unwrap_or(0.0),
            );
        }
        let jobs_now: HashSet<&str> = held.iter().map(|j| j.uuid.as_str()).collect();
        state
            .baselines
            .retain(|k, _| live.contains(k) || jobs_now.contains(k.0.as_str()));
        state
            .job_energy
            .retain(|k, _| jobs_now.contains(k.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn device(index: usize, minor: u32, gi: Option<u32>, fraction: f64) -> GpuDevice {
        GpuDevice::for_test(index, minor, gi, fraction)
    }

    /// GPU 0 full, GPU 1 split in two MIG instances, GPU 2 fallen off the bus.
    struct FakeNvml {
        scrapes: std::sync::Arc<AtomicU32>,
    }

    impl Nvml for FakeNvml {
        fn devices(&self) -> Result<Vec<GpuDevice>, NvmlError> {
            Ok(vec![
                device(0, 0, None, 1.0),
                device(1, 1, Some(1), 0.6),
                device(2, 1, Some(5), 0.4),
                device(3, 2, None, 1.0),
            ])
        }

        fn read(&self, d: &GpuDevice, _want_processes: bool) -> Result<GpuReading, NvmlError> {
            let n = f64::from(self.scrapes.load(Ordering::SeqCst));
            match (d.minor, d.gpu_instance_id) {
                (0, None) => Ok(GpuReading {
                    energy_joules: Some(5000.0 + 100.0 * n),
                    power_watts: Some(200.0),
                    utilization: Some(0.5),
                    memory_used_bytes: Some(2e9),
                    memory_total_bytes: Some(80e9),
                    throttle_reasons: Some(vec!["sw_power_cap"]),
                    processes: vec![(11, 1 << 30), (12, 1 << 20), (14, 1 << 12)],
                    ..Default::default()
                }),
                (1, None) => Ok(GpuReading {
                    energy_joules: Some(9000.0 + 50.0 * n),
                    power_watts: Some(100.0),
                    processes: vec![(13, 1 << 29)],
                    ..Default::default()
                }),
                (1, Some(_)) => Ok(GpuReading {
                    memory_used_bytes: Some(1e9),
                    ..Default::default()
                }),
                _ => Err(NvmlError::Device {
                    index: d.index,
                    message: "GPU is lost".into(),
                }),
            }
        }
    }

    #[test]
    fn per_gpu_and_per_job_series_with_a_lost_gpu_skipped() {
        let procfs = tempfile::tempdir().unwrap();
        let pid = |pid: u32, cgroup: &str| {
            let d = procfs.path().join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cgroup"), cgroup).unwrap();
        };
        pid(
            11,
            "0::/system.slice/slurmstepd.scope/job_7/step_0/user/task_0\n",
        );
        pid(12, "0::/user.slice/user-1000.slice\n");
        // Another job whose id starts alike, and an LSF job's process.
        pid(14, "0::/system.slice/slurmstepd.scope/job_70/step_0\n");
        pid(13, "0::/lsf/lab/job.8.3101.1764000000/tasks\n");
        let scrapes = std::sync::Arc::new(AtomicU32::new(0));
        let fake = FakeNvml {
            scrapes: std::sync::Arc::clone(&scrapes),
        };
        let c = NvidiaCollector::new(Box::new(fake), procfs.path(), "n1");
        let list = c.nvml.devices().unwrap();
        units::publish(vec![
            UnitGpus {
                manager: "slurm",
                uuid: "7".into(),
                rel: "system.slice/slurmstepd.scope/job_7".into(),
                cgroup_host: String::new(),
                devices: vec![(0, list[0].clone(), 1.0)],
            },
            UnitGpus {
                manager: "lsf",
                uuid: "8".into(),
                rel: "lsf/lab/job.8.3101.1764000000".into(),
                cgroup_host: String::new(),
                devices: vec![(1, list[1].clone(), 0.5)],
            },
        ]);
        let scrape = || {
            let mut set = MetricSet::new();
            c.collect(&mut set)
                .expect("a lost GPU does not fail the collector");
            let mut text = String::new();
            set.encode_text(&mut text);
            text
        };
        let first = scrape();
        let has = |text: &str, line: &str| assert!(text.contains(line), "no {line} in\n{text}");
        has(&first, "ceems_nvidia_gpu_power_watts{gpuiid=\"\",gpuuuid=\"GPU-0\",hostname=\"n1\",index=\"0\"} 200\n");
        has(&first, "ceems_nvidia_gpu_energy_joules_total{gpuiid=\"\",gpuuuid=\"GPU-0\",hostname=\"n1\",index=\"0\"} 5000\n");
        has(
            &first,
            "# TYPE ceems_nvidia_gpu_energy_joules_total counter\n",
        );
        // The MIG parent has no index of its own; its instances report their memory.
        has(&first, "ceems_nvidia_gpu_power_watts{gpuiid=\"\",gpuuuid=\"GPU-1\",hostname=\"n1\",index=\"\"} 100\n");
        has(&first, "ceems_nvidia_gpu_memory_used_bytes{gpuiid=\"5\",gpuuuid=\"GPU-1\",hostname=\"n1\",index=\"2\"} 1e+09\n");
        has(&first, "ceems_nvidia_gpu_clocks_throttled{gpuiid=\"\",gpuuuid=\"GPU-0\",hostname=\"n1\",index=\"0\",reason=\"sw_power_cap\"} 1\n");
        has(&first, "ceems_nvidia_gpu_clocks_throttled{gpuiid=\"\",gpuuuid=\"GPU-0\",hostname=\"n1\",index=\"0\",reason=\"hw_slowdown\"} 0\n");
        has(
            &first,
            "ceems_nvidia_gpu_read_errors_total{gpuiid=\"\",gpuuuid=\"GPU-2\",hostname=\"n1\"} 1\n",
        );
        assert!(
            !first.contains("gpuuuid=\"GPU-2\",hostname=\"n1\",index"),
            "the lost GPU has series"
        );
        // Per job: job 7 holds GPU 0; job 8 half of the 0.6 instance of GPU 1.
        let job = |j: &str| {
            let manager = if j == "8" { "lsf" } else { "slurm" };
            format!("{{cgrouphostname=\"\",hostname=\"n1\",manager=\"{manager}\",uuid=\"{j}\"}}")
        };
        has(
            &first,
            &format!("ceems_compute_unit_gpu_power_watts{} 200\n", job("7")),
        );
        has(
            &first,
            &format!("ceems_compute_unit_gpu_power_watts{} 30\n", job("8")),
        );
        has(
            &first,
            &format!("ceems_compute_unit_gpu_energy_joules_total{} 0\n", job("7")),
        );
        has(
            &first,
            &format!("ceems_compute_unit_gpu_utilization_ratio{} 0.5\n", job("7")),
        );
        assert!(
            !first.contains(&format!(
                "ceems_compute_unit_gpu_utilization_ratio{}",
                job("8")
            )),
            "MIG use is not measured"
        );
        has(
            &first,
            &format!(
                "ceems_compute_unit_gpu_memory_used_bytes{} 1.073741824e+09\n",
                job("7")
            ),
        );
        // Any manager's units, by their cgroup: the LSF job's process.
        has(
            &first,
            "ceems_compute_unit_gpu_memory_used_bytes{cgrouphostname=\"\",hostname=\"n1\",manager=\"lsf\",uuid=\"8\"} 5.36870912e+08\n",
        );

        scrapes.fetch_add(1, Ordering::SeqCst);
        let second = scrape();
        has(
            &second,
            &format!(
                "ceems_compute_unit_gpu_energy_joules_total{} 100\n",
                job("7")
            ),
        );
        has(
            &second,
            &format!(
                "ceems_compute_unit_gpu_energy_joules_total{} 15\n",
                job("8")
            ),
        );
        has(
            &second,
            "ceems_nvidia_gpu_read_errors_total{gpuiid=\"\",gpuuuid=\"GPU-2\",hostname=\"n1\"} 2\n",
        );
        units::publish(Vec::new());
    }
}
