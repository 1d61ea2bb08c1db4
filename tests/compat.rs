//! CEEMS compatibility: run the exporter on CEEMS's own fixture trees with the flags of its e2e
//! scenarios and compare every series of the families this exporter implements (name, labels
//! and value) with CEEMS's expected output.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;

use common::bmc::{Flavor, StandinBmc};
use common::{fixtures, name_of, parse_series, start_exporter_env, stub};

/// The series compared here: every `ceems_` series but the build's identity, scrape
/// durations (their presence is checked apart) and ours alone (docs/compat.md).
fn in_scope(series: &str) -> bool {
    let name = name_of(series);
    name.starts_with("ceems_")
        && ![
            "ceems_exporter_build_info",
            "ceems_scrape_collector_duration_seconds",
            "ceems_compute_unit_gpu_sm_count",
        ]
        .contains(&name)
}

fn types(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .filter(|(name, _)| in_scope(name))
        .map(|(n, t)| (n.to_owned(), t.to_owned()))
        .collect()
}

/// How a scenario reaches its IPMI tool: the stand-in's name, and whether it is given by a
/// flag (CEEMS's current or deprecated spelling) or found on PATH.
enum Ipmi {
    Flag(&'static str, &'static str),
    OnPath(&'static str),
}

/// The captured output each stand-in prints.
fn ipmi_capture(tool: &str) -> &'static str {
    match tool {
        "ipmi-dcmi" => "fixtures/ipmi/freeipmi/ipmi-dcmi_--get-system-power-statistics.txt",
        "ipmitool" => "fixtures/ipmi/openipmi/ipmitool_dcmi_power_reading.txt",
        "ipmiutil" => "fixtures/ipmi/ipmiutils/ipmiutil_dcmi_power.txt",
        "capmc" => "fixtures/ipmi/capmc/capmc_get_system_power_-w_600.txt",
        other => panic!("no capture for {other}"),
    }
}

/// The GPU tool a scenario asks, through a stand-in printing CEEMS's capture.
enum Gpu {
    None,
    Nvidia,
    Amd,
}

/// Which generation of names a run speaks and is compared with: v0.10 with CEEMS's v0.10 pack
/// (every value), today's with the upstream outputs of the same scenario (families).
#[derive(Clone, Copy, PartialEq)]
enum Generation {
    V010,
    Current,
}

/// The expected output of a scenario in the v0.10 pack or the upstream outputs.
fn expected_file(scenario: &str, generation: Generation) -> std::path::PathBuf {
    // The one expected file without the suffix.
    let file = match scenario {
        "cgroupsv2-nvidia-gpu-reordering" => format!("e2e-test-{scenario}.txt"),
        _ => format!("e2e-test-{scenario}-output.txt"),
    };
    match generation {
        Generation::V010 => fixtures().join("compat/expected").join(file),
        Generation::Current => fixtures()
            .join("ceems-upstream/expected/exporter")
            .join(file),
    }
}

/// The exporter's /metrics on the v0.10 pack's trees, started as the scenario's command line
/// of that generation starts CEEMS: v0.10's spellings and empty hostnames, or today's flags
/// (the `ipmi` collector, `--collector.redfish.config.file` with environment expansion, RAPL
/// named, a forced hostname).
fn scrape(
    scenario: &str,
    flags: &[&str],
    ipmi: &Ipmi,
    redfish: bool,
    gpu: &Gpu,
    generation: Generation,
) -> String {
    let dir = fixtures().join("compat");
    let stubs = tempfile::tempdir().expect("tempdir");
    let mut args = vec!["--path.sysfs=sys"];
    // A scenario of another manager brings trees of its own (see `lsf_trees`).
    for (flag, pack) in [
        ("--path.cgroupfs=", "--path.cgroupfs=sys/fs/cgroup"),
        ("--path.procfs=", "--path.procfs=proc"),
    ] {
        if !flags.iter().any(|f| f.starts_with(flag)) {
            args.push(pack);
        }
    }
    args.extend(["--web.disable-exporter-metrics", "--log.level=debug"]);
    match generation {
        // CEEMS v0.10's command lines, old spellings included; RAPL is on by default there.
        Generation::V010 => args.extend([
            "--compat.metric-names=v0.10",
            "--collector.empty-hostname-label",
        ]),
        Generation::Current => {
            args.extend(["--collector.force-hostname=testhost-1", "--collector.rapl"])
        }
    }
    // Upstream's scenario without GPUs reads emission factors too.
    if generation == Generation::Current && scenario == "cgroupsv2-nogpu" {
        args.push("--collector.emissions");
    }
    let other_manager = [
        "--collector.libvirt",
        "--collector.lsf",
        "--collector.k8s",
        "--collector.openpbs",
    ];
    if !other_manager.iter().any(|m| flags.contains(m)) {
        args.push("--collector.slurm");
    }
    args.extend_from_slice(flags);
    let gpu_flags: Vec<String> = match gpu {
        Gpu::None => Vec::new(),
        Gpu::Nvidia => {
            let path = stub(
                stubs.path(),
                "nvidia-smi",
                &dir.join("fixtures/nvidia-smi/nvidia-smi_--query_--xml-format.xml"),
            );
            // `nvidia-smi vgpu --query` prints the vGPU capture.
            let vgpu = dir.join("fixtures/nvidia-smi/nvidia-smi_vgpu_--query.txt");
            let script = std::fs::read_to_string(&path).expect("stub");
            std::fs::write(
                &path,
                script.replacen(
                    "exec",
                    &format!(
                        "[ \"$1\" = vgpu ] && exec /bin/cat '{}'\nexec",
                        vgpu.display()
                    ),
                    1,
                ),
            )
            .expect("stub");
            vec![
                "--collector.gpu.type=nvidia".into(),
                format!("--collector.gpu.nvidia-smi-path={}", path.display()),
            ]
        }
        Gpu::Amd => {
            let path = stub(
                stubs.path(),
                "rocm-smi",
                &dir.join(
                    "fixtures/rocm-smi/rocm-smi_--showproductname_--showserial_--showbus_--csv.txt",
                ),
            );
            vec![
                "--collector.gpu.type=amd".into(),
                format!("--collector.gpu.rocm-smi-path={}", path.display()),
            ]
        }
    };
    args.extend(gpu_flags.iter().map(String::as_str));
    let mut env = Vec::new();
    let ipmi_flag;
    match ipmi {
        Ipmi::Flag(flag, tool) => {
            let flag = match generation {
                Generation::V010 => flag,
                Generation::Current => &CURRENT_FLAG,
            };
            let path = stub(stubs.path(), tool, &dir.join(ipmi_capture(tool)));
            ipmi_flag = format!("--{flag}={}", path.display());
            args.push(&ipmi_flag);
        }
        Ipmi::OnPath(tool) => {
            stub(stubs.path(), tool, &dir.join(ipmi_capture(tool)));
            // Only the stand-in: CEEMS's scenario assumes no other IPMI tool is installed,
            // and this machine may have real ones on its PATH.
            env.push(("PATH", std::ffi::OsString::from(stubs.path())));
        }
    }
    args.extend(match generation {
        Generation::V010 => ["--collector.ipmi_dcmi", "--collector.ipmi_dcmi.test-mode"],
        Generation::Current => ["--collector.ipmi", "--collector.ipmi.test-mode"],
    });
    // CEEMS's mock listens on :5000; ours on a free port, named in a copy of its config.
    let _bmc;
    let redfish_flag;
    if redfish {
        let bmc = StandinBmc::start(
            Flavor::CeemsMock(dir.join("fixtures/mock-servers/redfish")),
            false,
        );
        let original = std::fs::read_to_string(dir.join("fixtures/redfish/config.yml"))
            .expect("redfish config");
        let config = stubs.path().join("redfish.yml");
        match generation {
            Generation::V010 => {
                std::fs::write(
                    &config,
                    original.replace("port: 5000", &format!("port: {}", bmc.port)),
                )
                .expect("write config");
                redfish_flag = format!("--collector.redfish.web-config={}", config.display());
                args.extend(["--collector.redfish", &redfish_flag]);
            }
            // As upstream's config: the BMC from the environment.
            Generation::Current => {
                std::fs::write(
                    &config,
                    original
                        .replace("host: localhost", "host: ${REDFISH_HOST}")
                        .replace("port: 5000", "port: $REDFISH_PORT"),
                )
                .expect("write config");
                env.push(("REDFISH_HOST", "localhost".into()));
                env.push(("REDFISH_PORT", bmc.port.to_string().into()));
                redfish_flag = format!("--collector.redfish.config.file={}", config.display());
                args.extend([
                    "--collector.redfish",
                    &redfish_flag,
                    "--collector.redfish.config.file.expand-env-vars",
                ]);
            }
        }
        _bmc = bmc;
    }
    // CEEMS's fake rdma dispatches on its first two words (SCENARIOS.md): `statistic qp …`
    // prints the counters capture, which says no link counts per process.
    let rdma_flag;
    if flags.contains(&"--collector.rdma.stats") {
        let captures = dir.join("fixtures/rdma");
        let path = stubs.path().join("rdma");
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\ncase \"$1 $2\" in\n\"resource show\") exec /bin/cat '{0}/rdma_resource_show_'\"$3\".txt ;;\n\"statistic qp\") exec /bin/cat '{0}/rdma_statistic_qp_show.txt' ;;\nesac\nexit 1\n",
                captures.display()
            ),
        )
        .expect("rdma stub");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        rdma_flag = format!("--collector.rdma.cmd={}", path.display());
        args.push(&rdma_flag);
    }
    let exporter = start_exporter_env(&dir, &args, &env);
    exporter.get("/metrics")
}

fn check(scenario: &str, flags: &[&str], ipmi: Ipmi, redfish: bool, gpu: Gpu) {
    check_v010(scenario, flags, &ipmi, redfish, &gpu);
    check_upstream(scenario, flags, &ipmi, redfish, &gpu);
}

/// Every series of the v0.10 pack's scenario, value included, with `--compat.metric-names=v0.10`.
fn check_v010(scenario: &str, flags: &[&str], ipmi: &Ipmi, redfish: bool, gpu: &Gpu) {
    // CEEMS ran with --path.sysfs=pkg/collector/testdata/sys; we run with sys.
    let mut expected_text = std::fs::read_to_string(expected_file(scenario, Generation::V010))
        .expect("expected output")
        .replace("path=\"pkg/collector/testdata/sys/", "path=\"sys/");
    // Block IO: CEEMS's gauges are counters here, named as Prometheus names counters
    // (docs/compat.md).
    for (ceems, ours) in BLKIO_RENAMES {
        expected_text = expected_text
            .replace(
                &format!("# TYPE {ceems} gauge"),
                &format!("# TYPE {ours} counter"),
            )
            .replace(ceems, ours);
    }
    let actual_text = scrape(scenario, flags, ipmi, redfish, gpu, Generation::V010);

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
                if !documented_deviation(scenario, series, *want, *got) {
                    diffs.push(format!("value    {series}: want {want}, got {got}"))
                }
            }
            Some(_) => {}
        }
    }
    for (series, got) in &actual {
        if !expected.contains_key(series) {
            diffs.push(format!("extra    {series} {got}"));
        }
    }
    let all = parse_series(&expected_text).len();
    println!(
        "{scenario}: {} of {all} expected series compared ({} differences)",
        expected.len(),
        diffs.len()
    );
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
    // A duration for each collector that reports success.
    let collectors = |text: &str, name: &str| -> Vec<String> {
        parse_series(text)
            .into_keys()
            .filter(|k| name_of(k) == name)
            .collect()
    };
    let durations = collectors(&actual_text, "ceems_scrape_collector_duration_seconds");
    for success in collectors(&expected_text, "ceems_scrape_collector_success") {
        let duration = success.replace(
            "ceems_scrape_collector_success",
            "ceems_scrape_collector_duration_seconds",
        );
        assert!(durations.contains(&duration), "{scenario}: no {duration}");
    }
}

/// A family as an exposition declares it: its type, its help, and the label names of its
/// samples.
#[derive(Debug, Default, PartialEq)]
struct Family {
    kind: String,
    help: String,
    labels: BTreeSet<Vec<String>>,
}

/// The label names of a sample line (`name{a="x",b="y"} 1`), in their order.
fn label_names(line: &str) -> Vec<String> {
    let Some(open) = line.find('{') else {
        return Vec::new();
    };
    let mut names = Vec::new();
    let mut rest = &line[open + 1..];
    while let Some(eq) = rest.find("=\"") {
        names.push(rest[..eq].trim_start_matches(',').to_owned());
        // Skip the quoted value, escapes included.
        let mut chars = rest[eq + 2..].char_indices();
        let mut end = rest.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    end = eq + 2 + i + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &rest[end..];
        if rest.starts_with('}') {
            break;
        }
    }
    names
}

/// The `ceems_` families that have samples, but the build's identity and scrape durations
/// (upstream's e2e script drops their samples).
fn families(text: &str) -> BTreeMap<String, Family> {
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    let mut declared: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            declared.entry(name.to_owned()).or_default().help = help.to_owned();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            declared.entry(name.to_owned()).or_default().kind = kind.to_owned();
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let name = name_of(line);
            if !name.starts_with("ceems_")
                || name == "ceems_exporter_build_info"
                || name == "ceems_scrape_collector_duration_seconds"
            {
                continue;
            }
            let family = out.entry(name.to_owned()).or_default();
            if let Some(d) = declared.get(name) {
                family.kind.clone_from(&d.kind);
                family.help.clone_from(&d.help);
            }
            family.labels.insert(label_names(line));
        }
    }
    out
}

/// The `collector` label values of `ceems_scrape_collector_success`.
fn collectors(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("ceems_scrape_collector_success{collector=\""))
        .filter_map(|rest| rest.split_once('"').map(|(name, _)| name.to_owned()))
        .collect()
}

/// Today's families of the scenario against upstream's newest outputs of the same name:
/// names, types, help and label names, but for the deviations `docs/compat.md` lists. Values
/// are not compared: upstream's fixture trees changed since the v0.10 pack.
fn check_upstream(scenario: &str, flags: &[&str], ipmi: &Ipmi, redfish: bool, gpu: &Gpu) -> String {
    let expected_text = std::fs::read_to_string(expected_file(scenario, Generation::Current))
        .expect("upstream output");
    let actual_text = scrape(scenario, flags, ipmi, redfish, gpu, Generation::Current);
    let mut expected = families(&expected_text);
    let actual = families(&actual_text);
    assert!(expected.len() > 10, "{scenario}: too few upstream families");
    for (ceems, ours) in BLKIO_RENAMES {
        if let Some(mut f) = expected.remove(ceems) {
            f.kind = "counter".into();
            expected.insert(ours.to_owned(), f);
        }
    }
    let mut diffs = Vec::new();
    for (name, want) in &expected {
        match actual.get(name) {
            None => diffs.push(format!("missing  {name} {want:?}")),
            Some(got) if got != want => diffs.push(format!(
                "differs  {name}\n    upstream {want:?}\n    ours     {got:?}"
            )),
            Some(_) => {}
        }
    }
    for (name, got) in &actual {
        if !expected.contains_key(name) {
            diffs.push(format!("extra    {name} {got:?}"));
        }
    }
    // Dashboards select collectors by name: `ipmi`, not v0.10's `ipmi_dcmi`.
    let (want, got) = (collectors(&expected_text), collectors(&actual_text));
    if want != got {
        diffs.push(format!(
            "differs  collector names\n    upstream {want:?}\n    ours     {got:?}"
        ));
    }
    println!(
        "{scenario}: {} upstream families compared ({} differences)",
        expected.len(),
        diffs.len()
    );
    assert!(
        diffs.is_empty(),
        "{scenario}: {} differences from upstream CEEMS:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
    actual_text
}

/// CEEMS's block IO gauges and the counters that replace them: the one family-level deviation
/// from upstream, listed in docs/compat.md.
const BLKIO_RENAMES: [(&str, &str); 4] = [
    (
        "ceems_compute_unit_blkio_read_total_bytes",
        "ceems_compute_unit_blkio_read_bytes_total",
    ),
    (
        "ceems_compute_unit_blkio_write_total_bytes",
        "ceems_compute_unit_blkio_write_bytes_total",
    ),
    (
        "ceems_compute_unit_blkio_read_total_requests",
        "ceems_compute_unit_blkio_read_requests_total",
    ),
    (
        "ceems_compute_unit_blkio_write_total_requests",
        "ceems_compute_unit_blkio_write_requests_total",
    ),
];

/// `(hca_handle, hca_object)` of each device line of the fixtures' `rdma.current` files.
const HCA_OBJECTS: &[(f64, f64)] = &[
    (479.0, 340.0),
    (1479.0, 1340.0),
    (2479.0, 2340.0),
    (289.0, 1000.0),
];

/// Values that differ from CEEMS's on purpose, each listed in docs/compat.md.
fn documented_deviation(scenario: &str, series: &str, want: f64, got: f64) -> bool {
    let name = name_of(series);
    // CEEMS reports each device's HCA handles as its objects too; ours are the
    // `hca_object=` values of the fixtures' rdma.current.
    if name == "ceems_compute_unit_rdma_hca_objects" {
        return HCA_OBJECTS.contains(&(want, got));
    }
    if !scenario.starts_with("cgroupsv1") {
        return false;
    }
    // v1's "no limit" (the largest page-aligned value) becomes the host's memory.
    let v1_unlimited = 9_223_372_036_854_771_712f64;
    if name.ends_with("_total_bytes") && name.starts_with("ceems_compute_unit_mem") {
        return want >= v1_unlimited && got > 0.0 && got < v1_unlimited;
    }
    // v1 block IO of the whole subtree (`*_recursive`), where CEEMS reads the unit's own
    // directory only: never less than CEEMS's.
    name.starts_with("ceems_compute_unit_blkio_") && got >= want
}

const FLAG: &str = "collector.ipmi_dcmi.cmd";
/// The spelling v0.10 deprecated and v0.11 made current; several v0.10 scenarios use it.
const DOTTED_FLAG: &str = "collector.ipmi.dcmi.cmd";
/// Today's spelling.
const CURRENT_FLAG: &str = DOTTED_FLAG;

#[test]
fn cgroupsv1() {
    check(
        "cgroupsv1",
        &[
            "--collector.cgroups.force-version=v1",
            "--collector.cray_pm_counters",
        ],
        Ipmi::Flag(FLAG, "ipmi-dcmi"),
        true,
        Gpu::Nvidia,
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
        Ipmi::Flag(FLAG, "ipmi-dcmi"),
        false,
        Gpu::Nvidia,
    );
}

#[test]
fn cgroupsv2_nogpu() {
    check(
        "cgroupsv2-nogpu",
        &[
            "--collector.cgroups.force-version=v2",
            "--collector.infiniband",
        ],
        Ipmi::OnPath("capmc"),
        false,
        Gpu::None,
    );
}

#[test]
fn cgroupsv2_procfs() {
    check(
        "cgroupsv2-procfs",
        &[
            "--collector.cgroups.force-version=v2",
            "--collector.cray_pm_counters",
        ],
        Ipmi::Flag(DOTTED_FLAG, "ipmiutil"),
        false,
        Gpu::Nvidia,
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
        Ipmi::Flag(DOTTED_FLAG, "capmc"),
        true,
        Gpu::Amd,
    );
}

#[test]
fn cgroupsv2_nvidia_ipmiutil() {
    check(
        "cgroupsv2-nvidia-ipmiutil",
        &[
            "--collector.cgroups.force-version=v2",
            "--collector.rdma.stats",
            "--collector.netdev",
            "--collector.netdev.device-include=eth0",
        ],
        Ipmi::OnPath("ipmiutil"),
        true,
        Gpu::Nvidia,
    );
}

#[test]
fn cgroupsv2_nvidia_gpu_reordering() {
    check(
        "cgroupsv2-nvidia-gpu-reordering",
        &[
            "--collector.cgroups.force-version=v2",
            "--collector.rdma.stats",
            "--collector.cray_pm_counters",
            "--collector.slurm.gpu-order-map=0:0,1:1,2:4,3:5,4:2.1,5:2.5,6:2.13,7:3.1,8:3.5,9:3.13,10:6,11:7",
        ],
        Ipmi::OnPath("ipmiutil"),
        false,
        Gpu::Nvidia,
    );
}

#[test]
fn cgroupsv2_amd_ipmitool() {
    check(
        "cgroupsv2-amd-ipmitool",
        &["--collector.cgroups.force-version=v2", "--collector.hwmon"],
        Ipmi::OnPath("ipmitool"),
        true,
        Gpu::Amd,
    );
}

/// The exporter on CEEMS's fixture trees with the Alloy discoverer and the slurm collector.
fn libvirt(version: &str, redfish: bool) {
    let force = format!("--collector.cgroups.force-version={version}");
    check(
        &format!("cgroups{version}-libvirt"),
        &[
            &force,
            "--collector.libvirt",
            "--collector.libvirt.xml-dir=fixtures/qemu",
            "--collector.libvirt.swap-memory-metrics",
            "--collector.libvirt.psi-metrics",
            "--collector.libvirt.blkio-metrics",
        ],
        Ipmi::Flag(DOTTED_FLAG, "capmc"),
        redfish,
        Gpu::Nvidia,
    );
}

#[test]
fn cgroupsv1_libvirt() {
    libvirt("v1", false);
}

#[test]
fn cgroupsv2_libvirt() {
    libvirt("v2", true);
}

fn discoverer(extra: &[&str]) -> common::Running {
    let mut args = vec![
        "--path.sysfs=sys",
        "--path.cgroupfs=sys/fs/cgroup",
        "--path.procfs=proc",
        "--collector.slurm",
    ];
    // CEEMS's document turns it on by naming the resource manager; its tests by the flag.
    if !extra.iter().any(|a| a.starts_with(RESOURCE_MANAGER)) {
        args.push("--discoverer.alloy-targets");
    }
    args.extend_from_slice(extra);
    start_exporter_env(&fixtures().join("compat"), &args, &[])
}

/// CEEMS's two discoverer scenarios: `/alloy-targets` must be JSON-equal to its output,
/// ignoring order.
const RESOURCE_MANAGER: &str = "--discoverer.alloy-targets.resource-manager";

fn check_targets(version: &str, enable: &[&str]) {
    let dir = fixtures().join("compat");
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(format!(
            "expected/e2e-test-discoverer-cgroups{version}-slurm-output.txt"
        )))
        .expect("expected targets"),
    )
    .expect("expected JSON");
    let force = format!("--collector.cgroups.force-version={version}");
    let mut args = vec![force.as_str(), "--collector.empty-hostname-label"];
    args.extend_from_slice(enable);
    let exporter = discoverer(&args);
    let actual: serde_json::Value =
        serde_json::from_str(&exporter.get("/alloy-targets")).expect("targets are JSON");
    let sorted = |v: &serde_json::Value| {
        let mut items: Vec<String> = v
            .as_array()
            .expect("an array")
            .iter()
            .map(|t| t.to_string())
            .collect();
        items.sort();
        items
    };
    assert_eq!(sorted(&actual), sorted(&expected));
}

#[test]
fn discoverer_cgroupsv2_slurm() {
    check_targets("v2", &[]);
}

#[test]
fn discoverer_cgroupsv1_slurm() {
    // As CEEMS's document writes it: the resource manager alone.
    check_targets("v1", &["--discoverer.alloy-targets.resource-manager=slurm"]);
}

/// With `--discoverer.alloy-targets.env-var`, only processes whose environment sets one of the
/// variables are targets (users opt in to profiling).
#[test]
fn discoverer_keeps_only_opted_in_processes() {
    let targets = |var: &str| -> Vec<String> {
        let flag = format!("--discoverer.alloy-targets.env-var={var}");
        let exporter = discoverer(&[&flag, "--collector.cgroups.force-version=v2"]);
        let v: serde_json::Value = serde_json::from_str(&exporter.get("/alloy-targets")).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|t| t["labels"]["__process_pid__"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(targets("NO_SUCH_VARIABLE").is_empty());
    let with_job_id = targets("SLURM_JOB_ID");
    assert!(!with_job_id.is_empty());
    // 36242 sets SLURM_JOB_ID; 56231 (a job process without it) is left out.
    assert!(with_job_id.contains(&"36242".to_owned()), "{with_job_id:?}");
    assert!(
        !with_job_id.contains(&"56231".to_owned()),
        "{with_job_id:?}"
    );
}

/// The pack's `proc/` under `dir`, each process in its place but those `extra_env` gives
/// variables for: their `environ` is the pack's with these added, as a manager sets them.
fn proc_overlay(dir: &std::path::Path, extra_env: impl Fn(u32) -> Option<Vec<String>>) {
    let pack = fixtures().join("compat/proc");
    let proc_dir = dir.join("proc");
    std::fs::create_dir_all(&proc_dir).expect("mkdir");
    for entry in std::fs::read_dir(pack).expect("procfs").flatten() {
        let pid: Option<u32> = entry.file_name().to_str().and_then(|n| n.parse().ok());
        let Some(vars) = pid.and_then(&extra_env) else {
            std::os::unix::fs::symlink(entry.path(), proc_dir.join(entry.file_name()))
                .expect("symlink");
            continue;
        };
        let ours = proc_dir.join(entry.file_name());
        std::fs::create_dir_all(&ours).expect("mkdir");
        for file in std::fs::read_dir(entry.path()).expect("pid dir").flatten() {
            if file.file_name() != "environ" {
                std::os::unix::fs::symlink(file.path(), ours.join(file.file_name()))
                    .expect("symlink");
            }
        }
        let mut environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        // The pack's captures end in "\0\n".
        if environ.ends_with(b"\n") {
            environ.pop();
        }
        for v in vars {
            environ.extend_from_slice(v.as_bytes());
            environ.push(0);
        }
        std::fs::write(ours.join("environ"), environ).expect("environ");
    }
}

/// Upstream's LSF jobs: id, cgroup directory name, and the pids its trees put in them.
const LSF_JOBS: [(&str, &str, &[u32]); 3] = [
    ("1009248", "job.1009248.35399.1775318419", &[46231, 46281]),
    ("1009249", "job.1009249.35400.1775318420", &[46235, 46236]),
    ("1009250", "job.1009250.27224.1775318481", &[26242, 46233]),
];

/// What LSF sets in the processes of upstream's MIG job: instance 1 of gpu-2 and of gpu-5.
const LSF_MIG_DEVICES: &str = "MIG-GPU-956348bc-d43d-23ed-53d4-857749fa2b67/1/0,MIG-GPU-feba7e40-d724-01ff-b00f-3a439a28a6c7/1/0";

/// Copies the regular files directly in `from` (not its subdirectories) into `to`.
fn copy_files(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir").flatten() {
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
        }
    }
}

/// Upstream's LSF trees, built from the paths its expected outputs and SCENARIOS.md name
/// (`lsf/cluster1/job.<id>.<internal id>.<timestamp>`, v1 per controller with a
/// `job-mps-service` child, v2 with processes in `leaf`), each job's files taken from the v0.10
/// pack's Slurm job of the same id; `proc/` is the pack's, the jobs' processes with LSF's
/// environment.
fn lsf_trees(version: &str) -> tempfile::TempDir {
    let pack = fixtures().join("compat");
    let tmp = tempfile::tempdir().expect("tempdir");
    let cgroup = tmp.path().join("cgroup");
    let root = pack.join("sys/fs/cgroup");
    copy_files(&root, &cgroup);
    let procs = |dir: &std::path::Path, pids: &[u32]| {
        let text: String = pids.iter().map(|p| format!("{p}\n")).collect();
        std::fs::write(dir.join("cgroup.procs"), text).expect("procs");
    };
    if version == "v1" {
        for entry in std::fs::read_dir(&root).expect("cgroupfs").flatten() {
            let controller = entry.path();
            let slurm = controller.join("slurm");
            // The controllers upstream's trees give LSF's jobs.
            let used = ["cpu,cpuacct", "memory", "cpuset"].map(std::ffi::OsStr::new);
            if !slurm.is_dir() || !used.contains(&entry.file_name().as_os_str()) {
                continue;
            }
            let ours = cgroup.join(entry.file_name());
            copy_files(&controller, &ours);
            copy_files(&slurm, &ours.join("lsf"));
            copy_files(&slurm, &ours.join("lsf/cluster1"));
            for (id, name, pids) in LSF_JOBS {
                let from = slurm.join(format!("uid_1000/job_{id}"));
                if !from.is_dir() {
                    continue;
                }
                let job = ours.join("lsf/cluster1").join(name);
                copy_files(&from, &job);
                procs(&job, pids);
                if id == "1009248" {
                    // LSF's MPS daemon's cgroup, merged into the job.
                    let mps = job.join("job-mps-service");
                    std::fs::create_dir_all(&mps).expect("mkdir");
                    procs(&mps, pids);
                }
            }
        }
    } else {
        let slurm = root.join("system.slice/slurmstepd.scope");
        copy_files(&root.join("system.slice"), &cgroup.join("lsf"));
        copy_files(&root.join("system.slice"), &cgroup.join("lsf/cluster1"));
        for (id, name, pids) in LSF_JOBS {
            let job = cgroup.join("lsf/cluster1").join(name);
            copy_files(&slurm.join(format!("job_{id}")), &job);
            procs(&job, &[]);
            copy_files(&slurm.join(format!("job_{id}")), &job.join("leaf"));
            procs(&job.join("leaf"), pids);
            // As upstream's: LSF enables cpu, memory and pids for its jobs, not rdma.
            for dir in [job.clone(), job.join("leaf")] {
                std::fs::write(dir.join("cgroup.subtree_control"), "cpu memory pids\n")
                    .expect("write");
                for rdma in ["rdma.current", "rdma.max"] {
                    let _ = std::fs::remove_file(dir.join(rdma));
                }
            }
        }
    }
    proc_overlay(tmp.path(), |pid| {
        let (id, _, _) = LSF_JOBS.iter().find(|(_, _, pids)| pids.contains(&pid))?;
        let mut vars = vec![format!("LSB_BATCH_JID={id}")];
        if *id == "1009248" {
            vars.push(format!("CUDA_VISIBLE_DEVICES={LSF_MIG_DEVICES}"));
        }
        Some(vars)
    });
    tmp
}

/// CEEMS's LSF scenario of `version` on trees built as upstream's: families against its
/// output, and the series LSF decides (CPUs from bjobs, GPUs whole, shared and MIG) by value.
fn lsf(version: &str, redfish: bool) {
    let trees = lsf_trees(version);
    let bjobs = stub(
        trees.path(),
        "bjobs",
        &fixtures().join("lsf/bjobs-ceems.json"),
    );
    let flags = [
        format!("--collector.cgroups.force-version={version}"),
        format!("--path.cgroupfs={}", trees.path().join("cgroup").display()),
        format!("--path.procfs={}", trees.path().join("proc").display()),
        "--collector.lsf".into(),
        format!("--collector.lsf.bjobs-path={}", bjobs.display()),
        "--collector.lsf.swap-memory-metrics".into(),
        "--collector.lsf.psi-metrics".into(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let scenario = format!("cgroups{version}-lsf");
    let ours = check_upstream(
        &scenario,
        &flags,
        &Ipmi::Flag(DOTTED_FLAG, "capmc"),
        redfish,
        &Gpu::Nvidia,
    );
    let expected = std::fs::read_to_string(expected_file(&scenario, Generation::Current))
        .expect("upstream output");
    let decided = |text: &str| -> BTreeMap<String, f64> {
        parse_series(text)
            .into_iter()
            .filter(|(k, _)| {
                [
                    "ceems_compute_unit_cpus",
                    "ceems_compute_unit_gpu_index_flag",
                    "ceems_compute_units",
                ]
                .contains(&name_of(k))
            })
            .collect()
    };
    assert_eq!(decided(&ours), decided(&expected), "{scenario}");
}

#[test]
fn cgroupsv1_lsf() {
    lsf("v1", false);
}

#[test]
fn cgroupsv2_lsf() {
    lsf("v2", true);
}

/// CEEMS's LSF discoverer scenario, on the v2 trees and the v1 ones (whose MIG job has its
/// processes in a `job-mps-service` child too): the same targets, each process once (CEEMS
/// lists a process once per cgroup of its job that holds it).
#[test]
fn discoverer_lsf() {
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join(
            "ceems-upstream/expected/discoverer/e2e-test-discoverer-cgroupsv2-lsf-output.txt",
        ))
        .expect("expected targets"),
    )
    .expect("expected JSON");
    let listed = |v: &serde_json::Value| -> Vec<String> {
        let mut items: Vec<String> = v
            .as_array()
            .expect("an array")
            .iter()
            .map(|t| t.to_string())
            .collect();
        items.sort();
        items
    };
    let mut want = listed(&expected);
    want.dedup();
    for version in ["v2", "v1"] {
        let trees = lsf_trees(version);
        let bjobs = stub(
            trees.path(),
            "bjobs",
            &fixtures().join("lsf/bjobs-ceems.json"),
        );
        let args = [
            "--path.sysfs=sys".to_owned(),
            format!("--path.cgroupfs={}", trees.path().join("cgroup").display()),
            format!("--path.procfs={}", trees.path().join("proc").display()),
            "--discoverer.alloy-targets".into(),
            format!("--collector.cgroups.force-version={version}"),
            "--collector.lsf".into(),
            format!("--collector.lsf.bjobs-path={}", bjobs.display()),
            "--collector.force-hostname=testhost-1".into(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let exporter = start_exporter_env(&fixtures().join("compat"), &args, &[]);
        let actual: serde_json::Value =
            serde_json::from_str(&exporter.get("/alloy-targets")).expect("targets are JSON");
        assert_eq!(listed(&actual), want, "{version}");
    }
}

/// `ceems_compute_unit_cpus` of each pod of an upstream k8s output: uid → CPUs.
fn pod_cpus(expected: &str) -> BTreeMap<String, f64> {
    parse_series(expected)
        .into_iter()
        .filter(|(k, _)| name_of(k) == "ceems_compute_unit_cpus")
        .filter_map(|(k, v)| Some((common::label_of(&k, "uuid")?.to_owned(), v)))
        .collect()
}

/// Upstream's k8s trees, built from its expected output's pods and the paths SCENARIOS.md
/// names (cgroupfs driver: Guaranteed pods directly under `kubepods`, the others under their
/// QoS class, a container below each pod), each pod's files taken from one of the v0.10 pack's
/// Slurm jobs, and `cpu.shares` (v1) or `cpu.weight` (v2) the kubelet would write for the
/// pod's CPUs.
fn k8s_trees(version: &str, pods: &BTreeMap<String, f64>) -> tempfile::TempDir {
    let pack = fixtures().join("compat");
    let tmp = tempfile::tempdir().expect("tempdir");
    let cgroup = tmp.path().join("cgroup");
    let root = pack.join("sys/fs/cgroup");
    copy_files(&root, &cgroup);
    let jobs = ["1009248", "1009249", "1009250"];
    let millicores = |cpus: f64| (cpus * 1000.0).round() as u64;
    // The shares the kubelet writes for these millicores, and the weight runc makes of them.
    let shares = |cpus: f64| (millicores(cpus) * 1024).div_ceil(1000).max(2);
    let weight = |cpus: f64| {
        (1..=10_000u64)
            .find(|w| {
                let s = 2 + (w - 1) * 262_142 / 9_999;
                s * 1000 / 1024 >= millicores(cpus)
            })
            .unwrap_or(1)
    };
    // One of the pack's processes in each pod's container.
    let pids = [
        46231, 46281, 46235, 46236, 46233, 26242, 26231, 26232, 26233, 26235,
    ];
    for (i, (uid, cpus)) in pods.iter().enumerate() {
        let pid = pids[i % pids.len()];
        let qos = match (*cpus, uid.as_str()) {
            (
                _,
                "6c22124f-e9a7-450b-8915-9bf3e0716d78" | "7a303ecc-ce90-4d0c-bb56-49d6bdad19f7",
            ) => "",
            (c, _) if c <= 0.001 => "besteffort/",
            _ => "burstable/",
        };
        let rel = format!("kubepods/{qos}pod{uid}");
        let job = jobs[i % jobs.len()];
        if version == "v1" {
            for controller in ["cpu,cpuacct", "memory", "cpuset"] {
                let from = root
                    .join(controller)
                    .join(format!("slurm/uid_1000/job_{job}"));
                if !from.is_dir() {
                    continue;
                }
                let pod = cgroup.join(controller).join(&rel);
                copy_files(&from, &pod);
                copy_files(&from, &pod.join("f92b308ade447d0f"));
                std::fs::write(
                    pod.join("f92b308ade447d0f/cgroup.procs"),
                    format!("{pid}\n"),
                )
                .expect("procs");
                if controller == "cpu,cpuacct" {
                    std::fs::write(pod.join("cpu.shares"), format!("{}\n", shares(*cpus)))
                        .expect("shares");
                }
            }
        } else {
            let from = root.join(format!("system.slice/slurmstepd.scope/job_{job}"));
            let pod = cgroup.join(&rel);
            copy_files(&from, &pod);
            copy_files(&from, &pod.join("f92b308ade447d0f"));
            std::fs::write(
                pod.join("f92b308ade447d0f/cgroup.procs"),
                format!("{pid}\n"),
            )
            .expect("procs");
            std::fs::write(pod.join("cpu.weight"), format!("{}\n", weight(*cpus))).expect("weight");
            // The pack's Slurm jobs have no block IO; its VMs' io.stat has the kernel's shape.
            let vm_io = root
                .join("machine.slice/machine-qemu\\x2d1\\x2dinstance\\x2d00000002.scope/io.stat");
            std::fs::copy(vm_io, pod.join("io.stat")).expect("io.stat");
            for dir in [pod.clone(), pod.join("f92b308ade447d0f")] {
                for rdma in ["rdma.current", "rdma.max"] {
                    let _ = std::fs::remove_file(dir.join(rdma));
                }
            }
        }
    }
    tmp
}

/// CEEMS's k8s scenario without GPUs (its default, absent, pod-resources socket): families
/// against its output, and the pods and their CPUs by value.
#[test]
fn cgroupsv2_k8s_nogpu() {
    let scenario = "cgroupsv2-k8s-nogpu";
    let expected = std::fs::read_to_string(expected_file(scenario, Generation::Current))
        .expect("upstream output");
    let pods = pod_cpus(&expected);
    assert_eq!(pods.len(), 10);
    let trees = k8s_trees("v2", &pods);
    let flags = [
        "--collector.cgroups.force-version=v2".to_owned(),
        format!("--path.cgroupfs={}", trees.path().join("cgroup").display()),
        "--collector.k8s".into(),
        // As upstream's script writes it: the old spelling.
        "--collector.k8s.kube-config-file=fixtures/k8s/kubeconfig.yml".into(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let ours = check_upstream(
        scenario,
        &flags,
        &Ipmi::Flag(DOTTED_FLAG, "capmc"),
        false,
        &Gpu::None,
    );
    assert_eq!(pod_cpus(&ours), pods);
}

/// `ceems_compute_unit_gpu_index_flag` series of whole GPUs (MIG instances left out).
fn whole_gpu_flags(text: &str) -> BTreeMap<String, f64> {
    parse_series(text)
        .into_iter()
        .filter(|(k, _)| {
            name_of(k) == "ceems_compute_unit_gpu_index_flag"
                && common::label_of(k, "gpuiid") == Some("")
        })
        .collect()
}

/// `(pod, GPU, share)` of whole GPUs' flags: what a pod holds, whatever the device's index.
fn held_gpus(text: &str) -> BTreeSet<(String, String, String)> {
    whole_gpu_flags(text)
        .into_iter()
        .filter(|(k, _)| common::label_of(k, "index") != Some(""))
        .filter_map(|(k, v)| {
            let pod = common::label_of(&k, "uuid")?.to_owned();
            let gpu = common::label_of(&k, "gpuuuid")?.to_owned();
            Some((pod, gpu, format!("{v:.4}")))
        })
        .collect()
}

/// CEEMS's k8s scenarios with GPUs. The kubelet's pod-resources API is a gRPC stand-in on a
/// unix socket, allocating each pod the whole GPUs upstream's output gives it (a shared GPU as
/// time-slicing replicas, `<id>::n`); the API server is an HTTPS stand-in that names the pods,
/// behind a kubeconfig with a CA and a token. Families against upstream's, the pods' CPUs, and
/// which whole GPUs each pod holds with its share by value. MIG instances and AMD partitions
/// are not compared: the device plugins name them by ids the v0.10 pack's GPU captures lack.
fn k8s_with_gpus(version: &str, gpu: Gpu, redfish: bool) {
    use base64::Engine;
    use ceems::manager::k8s::podresources::{
        ContainerDevices, ContainerResources, ListPodResourcesResponse, PodResources,
    };
    let scenario = format!("cgroups{version}-k8s");
    let expected = std::fs::read_to_string(expected_file(&scenario, Generation::Current))
        .expect("upstream output");
    let pods = pod_cpus(&expected);
    let trees = k8s_trees(version, &pods);
    let name_of_pod = |uid: &str| format!("pod-{}", &uid[..8]);
    // Upstream also flags GPUs of a pod with no cgroup on the node (v1's 6c22124f, which only
    // its kubelet mock lists); a pod that is not here has no series here.
    let want: BTreeSet<(String, String, String)> = held_gpus(&expected)
        .into_iter()
        .filter(|(pod, _, _)| pods.contains_key(pod))
        .collect();
    assert!(want.len() >= 2, "{want:?}");
    // Each pod's devices: a share s of a GPU is 4s of its replicas.
    let mut replicas: BTreeMap<String, u32> = BTreeMap::new();
    let mut devices: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (uid, gpu, share) in &want {
        let share: f64 = share.parse().expect("share");
        for _ in 0..(share * 4.0).round() as u32 {
            let n = replicas.entry(gpu.clone()).or_default();
            *n += 1;
            devices
                .entry(uid.clone())
                .or_default()
                .push(format!("{gpu}::{n}"));
        }
    }
    let answer = ListPodResourcesResponse {
        pod_resources: devices
            .iter()
            .map(|(uid, ids)| PodResources {
                name: name_of_pod(uid),
                namespace: "ml".into(),
                containers: vec![ContainerResources {
                    name: "main".into(),
                    devices: vec![ContainerDevices {
                        resource_name: "nvidia.com/gpu".into(),
                        device_ids: ids.clone(),
                    }],
                }],
            })
            .collect(),
    };
    let socket = trees.path().join("kubelet.sock");
    common::kubelet::serve(&socket, std::sync::Arc::new(std::sync::Mutex::new(answer)));
    // The exporter drops to nobody: as an operator's ACL would, let it reach the socket.
    std::fs::set_permissions(trees.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let items: Vec<serde_json::Value> = pods
        .keys()
        .map(|uid| serde_json::json!({"metadata": {"name": name_of_pod(uid), "namespace": "ml", "uid": uid}}))
        .collect();
    let api = common::http::TestServer::start(
        true,
        std::sync::Arc::new(move |req: &common::http::Request| {
            if req.path() != "/api/v1/pods" || req.header("authorization") != Some("Bearer t0ken") {
                return common::http::Response::json(
                    401,
                    serde_json::json!({"kind": "Status", "code": 401}),
                );
            }
            common::http::Response::json(
                200,
                serde_json::json!({"kind": "PodList", "items": items}),
            )
        }),
    );
    let kubeconfig = trees.path().join("kubeconfig.yml");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: {}\n    certificate-authority-data: {}\ncontexts:\n- name: lab\n  context: {{cluster: lab, user: exporter}}\ncurrent-context: lab\nusers:\n- name: exporter\n  user: {{token: t0ken}}\n",
            api.url(),
            base64::engine::general_purpose::STANDARD.encode(&api.cert_pem)
        ),
    )
    .expect("kubeconfig");
    let flags = [
        format!("--collector.cgroups.force-version={version}"),
        format!("--path.cgroupfs={}", trees.path().join("cgroup").display()),
        "--collector.k8s".into(),
        // As upstream's script writes them: the old spellings.
        format!("--collector.k8s.kube-config-file={}", kubeconfig.display()),
        format!("--collector.k8s.kubelet-socket-file={}", socket.display()),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let ours = check_upstream(
        &scenario,
        &flags,
        &Ipmi::Flag(DOTTED_FLAG, "capmc"),
        redfish,
        &gpu,
    );
    assert_eq!(pod_cpus(&ours), pods);
    assert_eq!(held_gpus(&ours), want);
    assert!(!api.seen().is_empty(), "the API server was not asked");
}

#[test]
fn cgroupsv1_k8s() {
    k8s_with_gpus("v1", Gpu::Nvidia, false);
}

/// Upstream reads AMD GPUs with amd-smi, partitions included; here the pack's rocm-smi
/// capture of the same GPUs (serial numbers) gives the whole ones.
#[test]
fn cgroupsv2_k8s() {
    k8s_with_gpus("v2", Gpu::Amd, true);
}

/// The Alloy discoverer on the k8s trees, picked because the k8s collector is on: one target
/// per process of each pod (its containers' included), named by the pod UID.
#[test]
fn discoverer_k8s() {
    let expected =
        std::fs::read_to_string(expected_file("cgroupsv2-k8s-nogpu", Generation::Current))
            .expect("upstream output");
    let pods = pod_cpus(&expected);
    let trees = k8s_trees("v2", &pods);
    // What the trees put in each pod: every cgroup.procs below it.
    let mut want = BTreeSet::new();
    for uid in pods.keys() {
        let qos = ["", "burstable/", "besteffort/"]
            .iter()
            .map(|q| trees.path().join(format!("cgroup/kubepods/{q}pod{uid}")))
            .find(|p| p.is_dir())
            .expect("pod dir");
        for dir in [qos.clone(), qos.join("f92b308ade447d0f")] {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.split_whitespace() {
                want.insert((uid.clone(), pid.to_owned()));
            }
        }
    }
    assert!(!want.is_empty());
    let args = [
        "--path.sysfs=sys".to_owned(),
        format!("--path.cgroupfs={}", trees.path().join("cgroup").display()),
        "--path.procfs=proc".into(),
        "--discoverer.alloy-targets".into(),
        "--collector.cgroups.force-version=v2".into(),
        "--collector.k8s".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let exporter = start_exporter_env(&fixtures().join("compat"), &args, &[]);
    let actual: serde_json::Value =
        serde_json::from_str(&exporter.get("/alloy-targets")).expect("targets are JSON");
    let got: BTreeSet<(String, String)> = actual
        .as_array()
        .expect("an array")
        .iter()
        .map(|t| {
            (
                t["labels"]["service_name"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
                t["labels"]["__process_pid__"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
            )
        })
        .collect();
    assert_eq!(got, want);
}

/// Upstream's OpenPBS jobs: id, and pids of the v0.10 pack's processes put in them.
const PBS_JOBS: [(&str, &str, &[u32]); 3] = [
    ("1009248", "1009248.testhost-1", &[46231, 46281]),
    ("1009249", "1009249[0].testhost-1", &[46235]),
    ("1009250", "1009249[1].testhost-1", &[46236]),
];

/// Upstream's OpenPBS trees (`pbs_jobs.service/jobid/<job id>` of each v1 controller), each
/// job's files from the pack's Slurm job of the same number, its processes with the
/// environment PBS's hook gives them: `PBS_JOBID` and the GPUs of upstream's output.
fn pbs_trees(expected: &str) -> tempfile::TempDir {
    let pack = fixtures().join("compat");
    let tmp = tempfile::tempdir().expect("tempdir");
    let cgroup = tmp.path().join("cgroup");
    let root = pack.join("sys/fs/cgroup");
    copy_files(&root, &cgroup);
    for controller in ["cpu,cpuacct", "memory", "cpuset"] {
        let slurm = root.join(controller).join("slurm");
        let ours = cgroup.join(controller);
        copy_files(&root.join(controller), &ours);
        for (slurm_job, id, pids) in PBS_JOBS {
            let from = slurm.join(format!("uid_1000/job_{slurm_job}"));
            if !from.is_dir() {
                continue;
            }
            let job = ours.join("pbs_jobs.service/jobid").join(id);
            copy_files(&from, &job);
            let procs: String = pids.iter().map(|p| format!("{p}\n")).collect();
            std::fs::write(job.join("cgroup.procs"), procs).expect("procs");
        }
    }
    // Each job's whole GPUs, as upstream's output gives them.
    let gpus = |id: &str| -> Vec<String> {
        parse_series(expected)
            .into_keys()
            .filter(|k| {
                name_of(k) == "ceems_compute_unit_gpu_index_flag"
                    && common::label_of(k, "uuid") == Some(id)
                    && common::label_of(k, "gpuiid") == Some("")
            })
            .filter_map(|k| common::label_of(&k, "gpuuuid").map(str::to_owned))
            .collect()
    };
    proc_overlay(tmp.path(), |pid| {
        let (_, id, _) = PBS_JOBS.iter().find(|(_, _, pids)| pids.contains(&pid))?;
        Some(vec![
            format!("PBS_JOBID={id}"),
            format!("CUDA_VISIBLE_DEVICES={}", gpus(id).join(",")),
        ])
    });
    tmp
}

/// Upstream's OpenPBS output (no e2e scenario runs it upstream; SCENARIOS.md infers its
/// command from the collector's test): every family, the jobs, and their whole GPUs by value
/// (its MIG job's instances are named by MIG UUIDs the pack's nvidia-smi capture lacks).
#[test]
fn cgroupsv1_openpbs() {
    let scenario = "cgroupsv1-openpbs";
    let expected = std::fs::read_to_string(expected_file(scenario, Generation::Current))
        .expect("upstream output");
    let trees = pbs_trees(&expected);
    let flags = [
        "--collector.cgroups.force-version=v1".to_owned(),
        format!("--path.cgroupfs={}", trees.path().join("cgroup").display()),
        format!("--path.procfs={}", trees.path().join("proc").display()),
        "--collector.openpbs".into(),
        "--collector.openpbs.swap-memory-metrics".into(),
        "--collector.openpbs.psi-metrics".into(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let ours = check_upstream(
        scenario,
        &flags,
        &Ipmi::Flag(DOTTED_FLAG, "capmc"),
        false,
        &Gpu::Nvidia,
    );
    let units = |text: &str| -> BTreeSet<String> {
        parse_series(text)
            .into_keys()
            .filter(|k| name_of(k) == "ceems_compute_unit_cpus")
            .filter_map(|k| common::label_of(&k, "uuid").map(str::to_owned))
            .collect()
    };
    assert_eq!(units(&ours), units(&expected));
    assert_eq!(
        held_gpus(&expected).len(),
        4,
        "two GPUs shared by two array sub-jobs"
    );
    assert_eq!(held_gpus(&ours), held_gpus(&expected));
}
