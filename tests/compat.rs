//! CEEMS compatibility: run the exporter on CEEMS's own fixture trees with the flags of its e2e
//! scenarios and compare every series of the families this exporter implements (name, labels
//! and value) with CEEMS's expected output.

mod common;

use std::collections::BTreeMap;

use common::{fixtures, name_of, parse_series, start_exporter};

/// The families checked here. GPU, RDMA and network series of the same files belong to
/// collectors not written yet.
fn in_scope(series: &str) -> bool {
    let name = name_of(series);
    if name == "ceems_scrape_collector_success" {
        return IMPLEMENTED
            .iter()
            .any(|c| series.contains(&format!("collector=\"{c}\"")));
    }
    name == "ceems_compute_units"
        || (name.starts_with("ceems_compute_unit_")
            && !name.starts_with("ceems_compute_unit_gpu_")
            && !name.starts_with("ceems_compute_unit_rdma_"))
        || name.starts_with("ceems_cpu_")
        || name.starts_with("ceems_meminfo_")
        || ["ceems_rapl_", "ceems_hwmon_", "ceems_cray_pm_counters_"]
            .iter()
            .any(|p| name.starts_with(p))
}

/// Collectors whose families this repository implements.
const IMPLEMENTED: &[&str] = &[
    "cpu",
    "meminfo",
    "slurm",
    "rapl",
    "hwmon",
    "cray_pm_counters",
];

fn types(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .filter(|(name, _)| in_scope(name))
        .map(|(n, t)| (n.to_owned(), t.to_owned()))
        .collect()
}

fn check(scenario: &str, flags: &[&str]) {
    let dir = fixtures().join("compat");
    let file = match scenario {
        // The one expected file without the suffix.
        "cgroupsv2-nvidia-gpu-reordering" => format!("expected/e2e-test-{scenario}.txt"),
        _ => format!("expected/e2e-test-{scenario}-output.txt"),
    };
    // CEEMS ran with --path.sysfs=pkg/collector/testdata/sys; we run with sys.
    let expected_text = std::fs::read_to_string(dir.join(file))
        .expect("expected output")
        .replace("path=\"pkg/collector/testdata/sys/", "path=\"sys/");
    let mut args = vec![
        "--path.sysfs=sys",
        "--path.cgroupfs=sys/fs/cgroup",
        "--path.procfs=proc",
        "--collector.slurm",
        "--collector.empty-hostname-label",
        "--web.disable-exporter-metrics",
        "--log.level=debug",
    ];
    args.extend_from_slice(flags);
    let exporter = start_exporter(&dir, &args);
    let actual_text = exporter.get("/metrics");

    let filter = |text: &str| -> BTreeMap<String, f64> {
        parse_series(text)
            .into_iter()
            .filter(|(k, _)| in_scope(k))
            .collect()
    };
    let expected = filter(&expected_text);
    let actual = filter(&actual_text);
    assert!(expected.len() > 50, "{scenario}: too few expected series");

    let mut diffs = Vec::new();
    for (series, want) in &expected {
        match actual.get(series) {
            None => diffs.push(format!("missing  {series} {want}")),
            Some(got) if (got - want).abs() > 1e-9 * want.abs().max(1.0) => {
                diffs.push(format!("value    {series}: want {want}, got {got}"))
            }
            Some(_) => {}
        }
    }
    for (series, got) in &actual {
        if !expected.contains_key(series) {
            diffs.push(format!("extra    {series} {got}"));
        }
    }
    assert!(
        diffs.is_empty(),
        "{scenario}: {} differences from CEEMS:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
    assert_eq!(
        types(&expected_text),
        types(&actual_text),
        "{scenario}: TYPE lines differ"
    );
}

#[test]
fn cgroupsv1() {
    check(
        "cgroupsv1",
        &[
            "--collector.cgroups.force-version=v1",
            "--collector.cray_pm_counters",
        ],
    );
}

#[test]
fn cgroupsv1_memory_subsystem() {
    check(
        "cgroupsv1-memory-subsystem",
        &[
            "--collector.cgroups.force-version=v1",
            "--collector.cgroups.active-subsystem=memory",
        ],
    );
}

#[test]
fn cgroupsv2_nogpu() {
    check("cgroupsv2-nogpu", &["--collector.cgroups.force-version=v2"]);
}

#[test]
fn cgroupsv2_procfs() {
    check(
        "cgroupsv2-procfs",
        &[
            "--collector.cgroups.force-version=v2",
            "--collector.cray_pm_counters",
        ],
    );
}

#[test]
fn cgroupsv2_all_metrics() {
    // CEEMS's deprecated dotted spellings, as its e2e script passes them.
    check(
        "cgroupsv2-all-metrics",
        &[
            "--collector.cgroups.force-version=v2",
            "--collector.slurm.swap.memory.metrics",
            "--collector.slurm.psi.metrics",
            "--collector.cray_pm_counters",
        ],
    );
}

#[test]
fn cgroupsv2_nvidia_ipmiutil() {
    check(
        "cgroupsv2-nvidia-ipmiutil",
        &["--collector.cgroups.force-version=v2"],
    );
}

#[test]
fn cgroupsv2_nvidia_gpu_reordering() {
    check(
        "cgroupsv2-nvidia-gpu-reordering",
        &[
            "--collector.cgroups.force-version=v2",
            "--collector.cray_pm_counters",
        ],
    );
}

#[test]
fn cgroupsv2_amd_ipmitool() {
    check(
        "cgroupsv2-amd-ipmitool",
        &["--collector.cgroups.force-version=v2", "--collector.hwmon"],
    );
}
