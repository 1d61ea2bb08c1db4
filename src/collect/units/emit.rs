//! The `ceems_compute_unit_*` series of one unit, from what the host layer read of it.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::host::cgroup::detail::UnitDetail;
use crate::host::cgroup::parse::HcaUsage;
use crate::host::cgroup::{ReadOptions, UnitStats};
use crate::host::processes::{cap_executables, JobProcesses};
use crate::metrics::{Labels, MetricSet};

/// Help texts and names of the per-unit series, as CEEMS exports them.
pub mod names {
    pub const UNITS: &str = "ceems_compute_units";
    pub const UNITS_HELP: &str = "Total number of jobs";
    pub const COLLECT_ERROR: &str = "ceems_compute_collect_error";
    pub const COLLECT_ERROR_HELP: &str = "Indicates collection error, 0=no error, 1=error";
}

/// Emits the `ceems_compute_unit_*` series of one unit.
pub fn emit_unit(out: &mut MetricSet, labels: &Labels, s: &UnitStats, opts: ReadOptions) {
    let g = |out: &mut MetricSet, name: &str, help: &str, v: f64| {
        out.gauge(name, help, labels.clone(), v)
    };
    out.counter(
        "ceems_compute_unit_cpu_user_seconds_total",
        "Total job CPU user seconds",
        labels.clone(),
        s.cpu_user_seconds,
    );
    out.counter(
        "ceems_compute_unit_cpu_system_seconds_total",
        "Total job CPU system seconds",
        labels.clone(),
        s.cpu_system_seconds,
    );
    g(
        out,
        "ceems_compute_unit_cpus",
        "Total number of job CPUs",
        s.cpus,
    );
    g(
        out,
        "ceems_compute_unit_memory_rss_bytes",
        "Memory RSS used in bytes",
        s.memory_rss_bytes,
    );
    g(
        out,
        "ceems_compute_unit_memory_cache_bytes",
        "Memory cache used in bytes",
        s.memory_cache_bytes,
    );
    g(
        out,
        "ceems_compute_unit_memory_used_bytes",
        "Memory used in bytes",
        s.memory_used_bytes,
    );
    g(
        out,
        "ceems_compute_unit_memory_total_bytes",
        "Memory total in bytes",
        s.memory_total_bytes,
    );
    g(
        out,
        "ceems_compute_unit_memory_fail_count",
        "Memory fail count",
        s.memory_fail_count,
    );
    if opts.swap {
        g(
            out,
            "ceems_compute_unit_memsw_used_bytes",
            "Swap used in bytes",
            s.memsw_used_bytes,
        );
        g(
            out,
            "ceems_compute_unit_memsw_total_bytes",
            "Swap total in bytes",
            s.memsw_total_bytes,
        );
        g(
            out,
            "ceems_compute_unit_memsw_fail_count",
            "Swap fail count",
            s.memsw_fail_count,
        );
    }
    if opts.psi {
        g(
            out,
            "ceems_compute_unit_cpu_psi_seconds",
            "Total CPU PSI in seconds",
            s.cpu_psi_seconds,
        );
        g(
            out,
            "ceems_compute_unit_memory_psi_seconds",
            "Total memory PSI in seconds",
            s.memory_psi_seconds,
        );
    }
}

/// The unit's RDMA handles and objects per device, from the rdma controller.
pub fn emit_rdma_current(out: &mut MetricSet, base: &[(&str, &str)], usage: &[HcaUsage]) {
    for u in usage {
        let mut pairs = base.to_vec();
        pairs.push(("device", &u.device));
        let labels = Labels::new(&pairs);
        out.gauge(
            "ceems_compute_unit_rdma_hca_handles",
            "Current number of RDMA HCA handles",
            labels.clone(),
            u.handles as f64,
        );
        out.gauge(
            "ceems_compute_unit_rdma_hca_objects",
            "Current number of RDMA HCA objects",
            labels,
            u.objects as f64,
        );
    }
}

/// Emits the detail series of one unit with its `base` labels; devices are named through
/// `devices`.
pub fn emit_detail(
    out: &mut MetricSet,
    base: &[(&str, &str)],
    d: &UnitDetail,
    devices: &HashMap<(u32, u32), String>,
) {
    let labels = &Labels::new(base);
    let with = |name: &str, value: &str| {
        let mut pairs = base.to_vec();
        pairs.push((name, value));
        Labels::new(&pairs)
    };
    if let Some(m) = &d.memory {
        for (name, help, v) in [
            (
                "ceems_compute_unit_memory_rss_huge_bytes",
                "Anonymous transparent huge pages in bytes",
                m.rss_huge,
            ),
            (
                "ceems_compute_unit_memory_mapped_file_bytes",
                "Memory-mapped file pages in bytes",
                m.mapped_file,
            ),
            (
                "ceems_compute_unit_memory_active_file_bytes",
                "Active file cache in bytes",
                m.active_file,
            ),
            (
                "ceems_compute_unit_memory_inactive_file_bytes",
                "Inactive file cache in bytes",
                m.inactive_file,
            ),
            (
                "ceems_compute_unit_memory_unevictable_bytes",
                "Unevictable memory in bytes",
                m.unevictable,
            ),
            (
                "ceems_compute_unit_memory_shmem_bytes",
                "Shared memory (tmpfs, shm) in bytes",
                m.shmem,
            ),
        ] {
            out.gauge(name, help, labels.clone(), v);
        }
        if let Some(max) = m.max_used {
            out.gauge(
                "ceems_compute_unit_memory_max_used_bytes",
                "Highest memory use of the job in bytes",
                labels.clone(),
                max,
            );
        }
    }
    for (core, secs) in d.per_core_seconds.iter().enumerate() {
        out.counter(
            "ceems_compute_unit_cpu_per_core_seconds_total",
            "Total job CPU seconds per core (cgroups v1)",
            with("core", &core.to_string()),
            *secs,
        );
    }
    for io in &d.io {
        let device = devices
            .get(&(io.major, io.minor))
            .cloned()
            .unwrap_or_else(|| format!("{}:{}", io.major, io.minor));
        let l = with("device", &device);
        for (name, help, v) in [
            (
                "ceems_compute_unit_blkio_read_bytes_total",
                "Total block IO read bytes",
                io.rbytes,
            ),
            (
                "ceems_compute_unit_blkio_write_bytes_total",
                "Total block IO write bytes",
                io.wbytes,
            ),
            (
                "ceems_compute_unit_blkio_read_requests_total",
                "Total block IO read requests",
                io.rios,
            ),
            (
                "ceems_compute_unit_blkio_write_requests_total",
                "Total block IO write requests",
                io.wios,
            ),
        ] {
            out.counter(name, help, l.clone(), v as f64);
        }
    }
}

/// Emits one job's process series.
pub fn emit_processes(
    out: &mut MetricSet,
    base: &[(&str, &str)],
    j: &JobProcesses,
    exe_limit: usize,
    ticks_per_second: f64,
) {
    let with = |name: &str, value: &str| {
        let mut pairs = base.to_vec();
        pairs.push((name, value));
        Labels::new(&pairs)
    };
    for (state, n) in &j.processes_by_state {
        out.gauge(
            "ceems_compute_unit_processes",
            "Processes of the job by state",
            with("state", state),
            *n as f64,
        );
    }
    for (state, n) in &j.threads_by_state {
        out.gauge(
            "ceems_compute_unit_threads",
            "Threads of the job by state",
            with("state", state),
            *n as f64,
        );
    }
    out.gauge(
        "ceems_compute_unit_open_fds",
        "Open file descriptors of the job's processes",
        Labels::new(base),
        j.open_fds as f64,
    );
    for (exe, ticks) in cap_executables(&j.ticks_by_exe, exe_limit) {
        out.gauge(
            "ceems_compute_unit_process_cpu_seconds",
            "CPU seconds (user and system) of the job's live processes per executable; drops when a process exits",
            with("exe", &exe),
            ticks as f64 / ticks_per_second,
        );
    }
}

/// `ceems_compute_unit_uses_scratch{path}` of one job: 1 while it uses the path.
pub fn emit_scratch(out: &mut MetricSet, base: &[(&str, &str)], paths: &[PathBuf], uses: &[bool]) {
    for (path, used) in paths.iter().zip(uses) {
        let path = path.to_string_lossy();
        let mut pairs = base.to_vec();
        pairs.push(("path", &path));
        out.gauge(
            "ceems_compute_unit_uses_scratch",
            "1 while a process of the job has its working directory or an open file under the path",
            Labels::new(&pairs),
            if *used { 1.0 } else { 0.0 },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::cgroup::detail::DetailOptions;
    use crate::host::cgroup::{CgroupReader, CgroupVersion, HostMemory};
    use std::path::Path;

    fn text(d: &UnitDetail) -> String {
        let mut out = MetricSet::new();
        let devices = HashMap::from([((8, 0), "sda".to_owned())]);
        emit_detail(&mut out, &[("uuid", "7")], d, &devices);
        let mut s = String::new();
        out.encode_text(&mut s);
        s
    }

    #[test]
    fn v1_and_v2_files_give_the_same_series() {
        let all = DetailOptions {
            memory: true,
            per_core: true,
            io: true,
        };
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let rel = Path::new("slurm/uid_1/job_7");
        for (ctrl, file, body) in [
            ("memory", "memory.stat", "rss_huge 9\ntotal_rss_huge 2097152\ntotal_mapped_file 4096\ntotal_active_file 1\ntotal_inactive_file 2\ntotal_unevictable 3\ntotal_shmem 8192\n"),
            ("memory", "memory.max_usage_in_bytes", "1048576\n"),
            ("cpuacct", "cpuacct.usage_percpu", "1000000000 500000000 \n"),
            ("blkio", "blkio.throttle.io_service_bytes_recursive", "8:0 Read 4096\n8:0 Write 1048576\nTotal 1052672\n"),
            ("blkio", "blkio.throttle.io_serviced_recursive", "8:0 Read 1\n8:0 Write 16\nTotal 17\n"),
        ] {
            let d = root.join(ctrl).join(rel);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(file), body).unwrap();
        }
        let mut r = CgroupReader::new(root, CgroupVersion::V1, HostMemory::default());
        let mut faults = Vec::new();
        let v1 = text(&r.read_detail(rel, all, &mut faults));
        assert!(faults.is_empty(), "{faults:?}");
        for line in [
            "ceems_compute_unit_memory_rss_huge_bytes{uuid=\"7\"} 2.097152e+06",
            "ceems_compute_unit_memory_shmem_bytes{uuid=\"7\"} 8192",
            "ceems_compute_unit_memory_max_used_bytes{uuid=\"7\"} 1.048576e+06",
            "ceems_compute_unit_cpu_per_core_seconds_total{core=\"1\",uuid=\"7\"} 0.5",
            "ceems_compute_unit_blkio_write_bytes_total{device=\"sda\",uuid=\"7\"} 1.048576e+06",
            "ceems_compute_unit_blkio_write_requests_total{device=\"sda\",uuid=\"7\"} 16",
        ] {
            assert!(v1.contains(line), "{line} missing in\n{v1}");
        }

        let rel2 = Path::new("system.slice/slurmstepd.scope/job_7");
        let d = root.join("v2").join(rel2);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("memory.stat"),
            "anon 1\nanon_thp 2097152\nfile_mapped 4096\nshmem 8192\n",
        )
        .unwrap();
        std::fs::write(
            d.join("io.stat"),
            "8:0 rbytes=4096 wbytes=1048576 rios=1 wios=16 dbytes=0 dios=0\n",
        )
        .unwrap();
        let mut r = CgroupReader::new(&root.join("v2"), CgroupVersion::V2, HostMemory::default());
        let v2 = text(&r.read_detail(rel2, all, &mut faults));
        for line in [
            "ceems_compute_unit_memory_rss_huge_bytes{uuid=\"7\"} 2.097152e+06",
            "ceems_compute_unit_memory_shmem_bytes{uuid=\"7\"} 8192",
            "ceems_compute_unit_blkio_write_bytes_total{device=\"sda\",uuid=\"7\"} 1.048576e+06",
        ] {
            assert!(v2.contains(line), "{line} missing in\n{v2}");
        }
        // No per-core figure on v2, and no peak without memory.peak.
        assert!(!v2.contains("per_core") && !v2.contains("max_used"), "{v2}");
    }
}
