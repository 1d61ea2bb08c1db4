//! Kubernetes pods on the real kernel (as root, this machine's writable cgroup v1
//! hierarchies): a pod as the kubelet's cgroupfs driver makes it (Burstable,
//! `kubepods/burstable/pod<uid>/<container>`) and one as its systemd driver makes it
//! (BestEffort, `kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_>.slice/cri-containerd-<id>.scope`),
//! a burning process in each container; the scrape's CPU seconds and memory are the kernel's
//! for the pod, its uuid is the pod UID, its CPUs the share the kubelet wrote, and a pod that
//! ends leaves the scrape.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::cgroup::{cpuacct_dir, make_dirs, spawn_in, v1_skip_reason, JobCgroups, CGROUPFS};
use common::{label_of, name_of, parse_series, read_number, start_exporter, unit_value};

/// A pod: its directory in the cpuacct, memory and cpu hierarchies (`shares` written in the
/// cpu one, as the kubelet does), a burner in its container.
fn pod(pod_rel: &str, container: &str, shares: u64) -> JobCgroups {
    let cpuacct = cpuacct_dir().expect("checked");
    let hierarchies: Vec<PathBuf> = [
        cpuacct,
        Path::new(CGROUPFS).join("memory"),
        Path::new(CGROUPFS).join("cpu"),
    ]
    .into_iter()
    .collect::<std::collections::BTreeSet<_>>()
    .into_iter()
    .collect();
    let mut job = JobCgroups::new();
    let mut containers = Vec::new();
    for h in &hierarchies {
        let dir = h.join(pod_rel).join(container);
        make_dirs(&dir, &mut job.dirs, false);
        if h.join(pod_rel).join("cpu.shares").exists() {
            std::fs::write(h.join(pod_rel).join("cpu.shares"), shares.to_string()).unwrap();
        }
        containers.push(dir);
    }
    // Burns 2 s of CPU time, however busy the machine, then holds still.
    let burner = "b = b'\\x01' * (48 << 20)\nimport time\nwhile time.process_time() < 2.0: pass\ntime.sleep(60)\n";
    job.children.push(spawn_in(
        &containers,
        &format!("exec python3 -c \"{burner}\""),
        &[],
    ));
    job
}

#[test]
fn pods_of_both_cgroup_drivers_are_read_as_the_kernel_accounts_them() {
    if let Some(reason) = v1_skip_reason() {
        println!("SKIPPED: {reason}");
        return;
    }
    let cpuacct = cpuacct_dir().expect("checked");
    let memory = Path::new(CGROUPFS).join("memory");
    let tag = format!("{:08x}", std::process::id());
    let burstable_uid = format!("{tag}-1111-4aa2-a9fa-9e3d220ba4c5");
    let besteffort_uid = format!("{tag}-2222-4aa2-a9fa-9e3d220ba4c5");
    let burstable_rel = format!("kubepods/burstable/pod{burstable_uid}");
    let besteffort_rel = format!(
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
        besteffort_uid.replace('-', "_")
    );
    let burstable = pod(&burstable_rel, "f92b308ade447d0f99dc4a68", 512);
    let besteffort = pod(&besteffort_rel, "cri-containerd-8b170d17.scope", 2);
    let start = Instant::now();
    for rel in [&burstable_rel, &besteffort_rel] {
        let usage = cpuacct.join(rel).join("cpuacct.usage");
        while read_number(&usage) < 1.5e9 {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the burners did not burn"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    std::thread::sleep(Duration::from_millis(800));

    let exporter = start_exporter(
        Path::new("/"),
        &[
            "--collector.k8s",
            "--collector.cgroups.force-version=v1",
            "--web.disable-exporter-metrics",
        ],
    );
    let series = parse_series(&exporter.get("/metrics"));
    for (uid, rel, cpus) in [
        (&burstable_uid, &burstable_rel, 0.5),
        (&besteffort_uid, &besteffort_rel, 0.001),
    ] {
        let kernel_cpu = read_number(&cpuacct.join(rel).join("cpuacct.usage")) / 1e9;
        let scraped_cpu = unit_value(&series, "ceems_compute_unit_cpu_user_seconds_total", uid)
            .unwrap_or_else(|| panic!("no pod {uid} in the scrape: {series:?}"))
            + unit_value(&series, "ceems_compute_unit_cpu_system_seconds_total", uid).unwrap();
        assert!(scraped_cpu > 1.5, "{uid}: {scraped_cpu}");
        assert!(
            (scraped_cpu - kernel_cpu).abs() <= 0.05 * kernel_cpu,
            "{uid} cpu: exporter {scraped_cpu}, kernel {kernel_cpu}"
        );
        let kernel_used = read_number(&memory.join(rel).join("memory.usage_in_bytes"));
        let scraped_used =
            unit_value(&series, "ceems_compute_unit_memory_used_bytes", uid).unwrap();
        assert!(
            (scraped_used - kernel_used).abs() <= 0.05 * kernel_used,
            "{uid} memory: exporter {scraped_used}, kernel {kernel_used}"
        );
        assert_eq!(
            unit_value(&series, "ceems_compute_unit_cpus", uid),
            Some(cpus),
            "{uid}"
        );
        let manager = series
            .keys()
            .find(|k| {
                name_of(k) == "ceems_compute_unit_cpus" && label_of(k, "uuid") == Some(uid.as_str())
            })
            .and_then(|k| label_of(k, "manager"));
        assert_eq!(manager, Some("k8s"));
    }

    // The Burstable pod ends: it leaves the scrape, the other stays.
    drop(burstable);
    let series = parse_series(&exporter.get("/metrics"));
    assert_eq!(
        unit_value(&series, "ceems_compute_unit_cpus", &burstable_uid),
        None
    );
    assert!(unit_value(&series, "ceems_compute_unit_cpus", &besteffort_uid).is_some());
    drop(besteffort);
}
