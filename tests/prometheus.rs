//! A real Prometheus (Debian's package) scraping the exporter, and `promtool check metrics` on
//! the exporter's output.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::bmc::{Flavor, StandinBmc};
use common::lab::Prometheus;
use common::{fixtures, runnable, start_exporter, stub, Running};

fn require_tools(test: &str) -> bool {
    runnable(test, common::lab::prometheus_tools())
}

fn exporter_on_fixtures(extra: &[&str]) -> Running {
    let mut args = vec![
        "--path.sysfs=sys",
        "--path.cgroupfs=sys/fs/cgroup",
        "--path.procfs=proc",
        "--collector.cgroups.force-version=v2",
        "--collector.slurm",
    ];
    args.extend_from_slice(extra);
    start_exporter(&fixtures().join("compat"), &args)
}

#[test]
fn prometheus_scrapes_the_exporter() {
    if !require_tools("prometheus_scrapes_the_exporter") {
        return;
    }
    let exporter = exporter_on_fixtures(&[]);
    let prom = Prometheus::start(&[exporter.port], &[]);

    let start = Instant::now();
    let mut last = String::new();
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "Prometheus never saw the exporter up with job metrics; last state: {last}"
        );
        std::thread::sleep(Duration::from_millis(500));
        if let Err(why) = prom.targets_up() {
            last = why;
            continue;
        }
        let up = prom.query("up{job=\"ceems\"}");
        let cpu = prom.query(
            "ceems_compute_unit_cpu_user_seconds_total{uuid=\"1009248\",cgrouphostname=\"\"}",
        );
        if up.first().map(|r| r["value"][1] == "1") == Some(true) && !cpu.is_empty() {
            assert_eq!(cpu[0]["value"][1], "60375.292848");
            break;
        }
        last = format!("up={up:?} cpu={cpu:?}");
    }
    drop(prom);
}

/// Metric names `docs/compat.md` lists as kept on purpose; `*` ends a prefix.
fn allowed_complaints() -> Vec<String> {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/compat.md"))
        .expect("docs/compat.md");
    let section = doc
        .split("## promtool complaints kept on purpose")
        .nth(1)
        .expect("section in docs/compat.md")
        .split("\n## ")
        .next()
        .unwrap_or_default();
    section
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.starts_with("ceems_"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn promtool_check_metrics_is_clean_but_for_documented_names() {
    if !require_tools("promtool_check_metrics_is_clean_but_for_documented_names") {
        return;
    }
    // Every collector that has fixtures, so every family is linted.
    let dir = fixtures().join("compat");
    let stubs = tempfile::tempdir().unwrap();
    let ipmi = stub(
        stubs.path(),
        "ipmi-dcmi",
        &dir.join("fixtures/ipmi/freeipmi/ipmi-dcmi_--get-system-power-statistics.txt"),
    );
    let bmc = StandinBmc::start(
        Flavor::CeemsMock(dir.join("fixtures/mock-servers/redfish")),
        false,
    );
    let redfish = stubs.path().join("redfish.yml");
    std::fs::write(
        &redfish,
        format!(
            "redfish_web_config:\n  protocol: http\n  hostname: 127.0.0.1\n  port: {}\n",
            bmc.port
        ),
    )
    .unwrap();
    std::fs::write(
        stubs.path().join("sinfo.txt"),
        "localhost|debug*|mixed|1/1/0/2|23081|100|20312\n",
    )
    .unwrap();
    std::fs::write(
        stubs.path().join("squeue.txt"),
        "debug|RUNNING|alice|physics|None|1\ndebug|PENDING|bob|chemistry|Resources|2\n",
    )
    .unwrap();
    let sinfo = stub(stubs.path(), "sinfo", &stubs.path().join("sinfo.txt"));
    let squeue = stub(stubs.path(), "squeue", &stubs.path().join("squeue.txt"));
    let nvidia_smi = stub(
        stubs.path(),
        "nvidia-smi",
        &common::fixtures().join("compat/fixtures/nvidia-smi/nvidia-smi_--query_--xml-format.xml"),
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(stubs.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sinfo_flag = format!("--collector.slurm_cluster.sinfo-path={}", sinfo.display());
    let squeue_flag = format!("--collector.slurm_cluster.squeue-path={}", squeue.display());
    let ipmi_flag = format!("--collector.ipmi.dcmi.cmd={}", ipmi.display());
    let nvidia_smi_flag = format!("--collector.gpu.nvidia-smi-path={}", nvidia_smi.display());
    let redfish_flag = format!("--collector.redfish.config.file={}", redfish.display());
    let exporter = exporter_on_fixtures(&[
        "--collector.slurm.swap-memory-metrics",
        "--collector.slurm.psi-metrics",
        "--collector.meminfo.all-stats",
        "--collector.slurm.memory-detail-metrics",
        "--collector.slurm.io-metrics",
        "--collector.slurm.info-metrics",
        "--collector.slurm.process-metrics",
        "--collector.slurm_cluster",
        &sinfo_flag,
        &squeue_flag,
        "--web.trace-path=/trace",
        "--collector.hwmon",
        "--collector.cray_pm_counters",
        "--collector.rapl",
        "--collector.ipmi",
        &ipmi_flag,
        "--collector.redfish",
        &redfish_flag,
        "--collector.emissions",
        "--collector.emissions.provider=owid",
        "--collector.emissions.provider=global",
        "--collector.gpu.type=nvidia",
        &nvidia_smi_flag,
    ]);
    ureq::post(&exporter.url("/trace"))
        .send_string(r#"{"job_id":"1","samples":[{"pid":1,"cpu_percent":1.5,"rss_bytes":1,"read_bytes":2,"write_bytes":3,"threads":1}]}"#)
        .expect("trace report");
    let body = exporter.get("/metrics");
    assert!(
        body.contains("process_resident_memory_bytes"),
        "exporter metrics missing"
    );
    for family in [
        "ceems_rapl_package_joules_total",
        "ceems_hwmon_power_current_watts",
        "ceems_cray_pm_counters_power_watts",
        "ceems_ipmi_dcmi_power_current_watts",
        "ceems_redfish_power_current_watts",
        "ceems_emissions_gCo2_kWh",
        "ceems_compute_unit_memory_shmem_bytes",
        "ceems_compute_unit_info",
        "ceems_compute_unit_processes",
        "ceems_compute_unit_process_cpu_seconds",
        "ceems_slurm_partition_cpus",
        "ceems_trace_write_bytes_total",
        "ceems_compute_unit_gpu_index_flag",
        "ceems_compute_unit_gpu_sm_count",
    ] {
        assert!(body.contains(&format!("\n{family}{{")), "{family} missing");
    }
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(body.as_bytes())
            .expect("feed promtool");
    }
    let out = child.wait_with_output().expect("promtool output");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let allowed = allowed_complaints();
    assert!(
        !allowed.is_empty(),
        "no allowed names parsed from docs/compat.md"
    );
    let unexpected: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| {
            let name = l.split_whitespace().next().unwrap_or_default();
            !allowed.iter().any(|a| match a.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => name == a,
            })
        })
        .collect();
    assert!(
        unexpected.is_empty(),
        "promtool complaints not listed in docs/compat.md:\n{}",
        unexpected.join("\n")
    );
}

/// The shipped recording rules are valid and their unit tests (synthetic series, including a
/// node whose two jobs' shares must add up to its power) pass.
#[test]
fn recording_rules_pass_promtool_check_and_unit_tests() {
    if !require_tools("recording_rules_pass_promtool_check_and_unit_tests") {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/prometheus/rules");
    let rules: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yml"))
        .collect();
    let tests: Vec<_> = std::fs::read_dir(root.join("tests"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yml"))
        .collect();
    assert!(!rules.is_empty() && !tests.is_empty());
    for (what, files) in [("check", &rules), ("test", &tests)] {
        let out = Command::new("promtool")
            .args([what, "rules"])
            .args(files.iter())
            .current_dir(&root)
            .output()
            .expect("run promtool");
        assert!(
            out.status.success(),
            "promtool {what} rules failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
