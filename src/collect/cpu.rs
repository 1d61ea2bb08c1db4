//! `cpu`: host CPU time per mode from /proc/stat, and the CPU counts.

use std::path::PathBuf;
use std::sync::Mutex;

use super::{CollectError, Collector, CollectorSpec, Context};
use crate::host::procfs::{self, CpuTimes};
use crate::metrics::{Labels, MetricSet};

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "cpu",
    default_enabled: true,
    capabilities: &[],
    options: Vec::new,
    build,
    self_test: None,
    sub_collectors: &[],
};

/// A drop of idle time larger than this means CPUs were hot-unplugged: start again.
const JUMP_BACK_SECONDS: f64 = 3.0;

pub struct CpuCollector {
    stat_path: PathBuf,
    hostname: String,
    host_labels: Labels,
    cpus_per_core: u32,
    ticks: f64,
    /// Last reported times, so counters never go backwards across CPU hotplug.
    last: Mutex<CpuTimes>,
}

fn build(ctx: &Context) -> Result<Box<dyn Collector>, CollectError> {
    let cpuinfo_path = ctx.paths.procfs.join("cpuinfo");
    let cpuinfo =
        std::fs::read_to_string(&cpuinfo_path).map_err(|e| CollectError::io(&cpuinfo_path, e))?;
    Ok(Box::new(CpuCollector {
        stat_path: ctx.paths.procfs.join("stat"),
        hostname: ctx.hostname.clone(),
        host_labels: ctx.hostname_labels(),
        cpus_per_core: procfs::cpus_per_core(&cpuinfo),
        ticks: crate::host::cgroup::clock_ticks(),
        last: Mutex::new(CpuTimes::default()),
    }))
}

fn monotonic(last: CpuTimes, new: CpuTimes) -> CpuTimes {
    let base = if last.idle - new.idle >= JUMP_BACK_SECONDS {
        CpuTimes::default()
    } else {
        last
    };
    let keep = |old: f64, new: f64| if new >= old { new } else { old };
    CpuTimes {
        user: keep(base.user, new.user),
        nice: keep(base.nice, new.nice),
        system: keep(base.system, new.system),
        idle: keep(base.idle, new.idle),
        iowait: keep(base.iowait, new.iowait),
        irq: keep(base.irq, new.irq),
        softirq: keep(base.softirq, new.softirq),
        steal: keep(base.steal, new.steal),
    }
}

impl Collector for CpuCollector {
    fn collect(&self, out: &mut MetricSet) -> Result<(), CollectError> {
        let text = std::fs::read_to_string(&self.stat_path)
            .map_err(|e| CollectError::io(&self.stat_path, e))?;
        let stat = procfs::proc_stat(&text).map_err(|source| CollectError::Parse {
            path: self.stat_path.clone(),
            source,
        })?;
        let t = stat.total;
        let secs = CpuTimes {
            user: t.user / self.ticks,
            nice: t.nice / self.ticks,
            system: t.system / self.ticks,
            idle: t.idle / self.ticks,
            iowait: t.iowait / self.ticks,
            irq: t.irq / self.ticks,
            softirq: t.softirq / self.ticks,
            steal: t.steal / self.ticks,
        };
        let times = {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            *last = monotonic(*last, secs);
            *last
        };
        out.gauge(
            "ceems_cpu_count",
            "Number of CPUs.",
            self.host_labels.clone(),
            stat.cpus as f64,
        );
        out.gauge(
            "ceems_cpu_per_core_count",
            "Number of logical CPUs per physical core.",
            self.host_labels.clone(),
            self.cpus_per_core as f64,
        );
        for (mode, v) in [
            ("user", times.user),
            ("nice", times.nice),
            ("system", times.system),
            ("idle", times.idle),
            ("iowait", times.iowait),
            ("irq", times.irq),
            ("softirq", times.softirq),
            ("steal", times.steal),
        ] {
            out.counter(
                "ceems_cpu_seconds_total",
                "Seconds the CPUs spent in each mode.",
                Labels::new(&[("hostname", &self.hostname), ("mode", mode)]),
                v,
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_never_go_backwards_but_reset_on_hotplug() {
        let a = CpuTimes {
            user: 10.0,
            idle: 100.0,
            ..CpuTimes::default()
        };
        let b = CpuTimes {
            user: 9.0,
            idle: 99.0,
            ..CpuTimes::default()
        };
        assert_eq!(monotonic(a, b).user, 10.0);
        let unplugged = CpuTimes {
            user: 1.0,
            idle: 50.0,
            ..CpuTimes::default()
        };
        assert_eq!(monotonic(a, unplugged).user, 1.0);
    }
}
