//! `ceems_tool tsdb create-recording-rules`: CEEMS's `tool-recording-rules` scenario as its e2e
//! script runs it (seven exporters of ours on the pack's trees, one per kind of node, the
//! Redfish mock, the GPU exporters' stand-ins and a real Prometheus with the pack's config;
//! the tool run three times: with the emission factor series, with OWID's static factor, with
//! a factor given), every file checked with `promtool check rules` and equal to CEEMS's
//! expected rules; then the script's backfill and the updater queries it prints.

mod common;

use common::tool_pack::ceems_tool;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::bmc::{Flavor, StandinBmc};

/// The v0.10.2 pack's expected rules are v0.10's: the tool writes them when asked to.
const V010: &str = "--compat.metric-names=v0.10";

/// A rule as Prometheus reads it: its record and its expression without comments or spaces.
type Rule = (String, String);
/// A group: name, interval, rules.
type Group = (String, String, Vec<Rule>);

/// What Prometheus reads of a rules file (comments and layout are the writer's own).
fn groups(text: &str) -> Vec<Group> {
    let value: serde_json::Value =
        serde_norway::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let string = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    value["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let rules = g["rules"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    let expr: String = string(&r["expr"])
                        .lines()
                        .map(|l| l.split('#').next().unwrap_or_default())
                        .collect::<String>()
                        .split_whitespace()
                        .collect();
                    (string(&r["record"]), expr)
                })
                .collect();
            (string(&g["name"]), string(&g["interval"]), rules)
        })
        .collect()
}

/// The files of the expected output, in order: each file's name line, then its text.
fn expected_files(text: &str) -> Vec<(String, String)> {
    let name = regex::Regex::new(r"^[a-z0-9-]+\.rules$").unwrap();
    let mut files: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if name.is_match(line) {
            files.push((line.to_owned(), String::new()));
        } else if let Some((_, body)) = files.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    files
}

/// One exporter of the scenario, on the v0.10 pack's trees (the pack's names: its expected
/// rules were made on exporters of that generation).
fn exporter(
    pack: &Path,
    sysfs: &str,
    flags: &[&str],
    env: &[(&str, std::ffi::OsString)],
) -> common::Running {
    let mut args = vec![
        sysfs,
        "--path.cgroupfs=sys/fs/cgroup",
        "--path.procfs=proc",
        "--collector.cgroups.force-version=v1",
        "--collector.slurm",
        "--compat.metric-names=v0.10",
        "--collector.empty-hostname-label",
        "--web.disable-exporter-metrics",
    ];
    args.extend_from_slice(flags);
    common::start_exporter_env(pack, &args, env)
}

/// An exporter of today's names on the v0.10 pack's trees, as CEEMS v0.16's script starts
/// its IPMI nodes (`--collector.ipmi.test-mode`, a forced hostname), with `flags` besides.
fn todays_exporter(pack: &Path, flags: &[&str]) -> common::Running {
    let mut args = vec![
        "--path.sysfs=sys",
        "--path.cgroupfs=sys/fs/cgroup",
        "--path.procfs=proc",
        "--collector.cgroups.force-version=v1",
        "--collector.slurm",
        "--collector.ipmi",
        "--collector.ipmi.test-mode",
        "--collector.force-hostname=testhost-1",
        "--web.disable-exporter-metrics",
    ];
    args.extend_from_slice(flags);
    common::start_exporter(pack, &args)
}

/// Stand-ins of `ipmi-dcmi`, `ipmitool`, `nvidia-smi` and `rocm-smi` in `dir/stubs`, printing
/// the v0.10 pack's captures of them.
fn pack_tools(dir: &Path) -> [PathBuf; 4] {
    let capture = common::fixtures().join("compat/fixtures");
    [
        (
            "ipmi-dcmi",
            "ipmi/freeipmi/ipmi-dcmi_--get-system-power-statistics.txt",
        ),
        ("ipmitool", "ipmi/openipmi/ipmitool_dcmi_power_reading.txt"),
        (
            "nvidia-smi",
            "nvidia-smi/nvidia-smi_--query_--xml-format.xml",
        ),
        (
            "rocm-smi",
            "rocm-smi/rocm-smi_--showproductname_--showserial_--showbus_--csv.txt",
        ),
    ]
    .map(|(name, file)| common::stub(&dir.join("stubs"), name, &capture.join(file)))
}

#[test]
fn ceems_tool_recording_rules_scenario() {
    common::lab::prometheus_tools().expect("prometheus");
    let pack = common::fixtures().join("compat");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let capture = |p: &str| pack.join("fixtures").join(p);
    let [ipmi_dcmi, ipmitool, nvidia_smi, rocm_smi] = pack_tools(dir);
    // The Redfish mock, its config reading host and port from the environment as the
    // script's does.
    let bmc = StandinBmc::start(Flavor::CeemsMock(capture("mock-servers/redfish")), false);
    let redfish_config = dir.join("redfish.yml");
    std::fs::write(
        &redfish_config,
        std::fs::read_to_string(capture("redfish/config.yml"))
            .unwrap()
            .replace("host: localhost", "host: ${REDFISH_HOST}")
            .replace("port: 5000", "port: $REDFISH_PORT"),
    )
    .unwrap();
    let redfish_env = [
        ("REDFISH_HOST", "localhost".into()),
        ("REDFISH_PORT", bmc.port.to_string().into()),
    ];
    let flag = |name: &str, path: &Path| format!("--{name}={}", path.display());
    let (ipmi_dcmi, ipmitool) = (
        flag("collector.ipmi_dcmi.cmd", &ipmi_dcmi),
        flag("collector.ipmi_dcmi.cmd", &ipmitool),
    );
    let nvidia = flag("collector.gpu.nvidia-smi-path", &nvidia_smi);
    let amd = flag("collector.gpu.rocm-smi-path", &rocm_smi);
    let redfish = flag("collector.redfish.config.file", &redfish_config);
    let redfish_flags = [
        "--collector.redfish",
        &redfish,
        "--collector.redfish.config.file.expand-env-vars",
    ];
    let ipmi = ["--collector.ipmi_dcmi", "--collector.ipmi_dcmi.test-mode"];
    // The script's sixth exporter has no --path.sysfs, and the host of its expected rules
    // had no RAPL: an empty tree says the same on any host.
    let no_rapl = dir.join("empty-sys");
    std::fs::create_dir_all(&no_rapl).unwrap();
    let no_rapl = flag("path.sysfs", &no_rapl);
    let exporters = [
        // IPMI and RAPL.
        exporter(
            &pack,
            "--path.sysfs=sys",
            &[&["--collector.gpu.type=nogpu"][..], &ipmi, &[&ipmi_dcmi]].concat(),
            &[],
        ),
        // RAPL only.
        exporter(
            &pack,
            "--path.sysfs=sys",
            &["--collector.gpu.type=nogpu"],
            &[],
        ),
        // Redfish, one chassis kept by Prometheus's relabelling.
        exporter(
            &pack,
            "--path.sysfs=sys",
            &[&["--collector.gpu.type=nogpu"][..], &redfish_flags].concat(),
            &redfish_env,
        ),
        // Redfish (two chassis), RAPL and NVIDIA GPUs.
        exporter(
            &pack,
            "--path.sysfs=sys",
            &[
                &["--collector.gpu.type=nvidia", &nvidia][..],
                &redfish_flags,
            ]
            .concat(),
            &redfish_env,
        ),
        // Cray counters and AMD GPUs.
        exporter(
            &pack,
            "--path.sysfs=sys",
            &[
                "--collector.gpu.type=amd",
                &amd,
                "--collector.cray_pm_counters",
            ],
            &[],
        ),
        // IPMI (counting the GPUs in) and NVIDIA GPUs, no RAPL.
        exporter(
            &pack,
            &no_rapl,
            &[
                &["--collector.gpu.type=nvidia", &nvidia][..],
                &ipmi,
                &[&ipmitool],
            ]
            .concat(),
            &[],
        ),
    ];
    let emissions = common::start_exporter(
        &pack,
        &[
            "--collector.disable-defaults",
            "--collector.emissions",
            "--collector.emissions.provider=owid",
            "--collector.empty-hostname-label",
            "--web.disable-exporter-metrics",
        ],
    );
    let mut targets: Vec<(&str, String)> = ["9010", "9011", "9012", "9013", "9014", "9015"]
        .iter()
        .zip(&exporters)
        .map(|(port, e)| (*port, e.url("")))
        .collect();
    targets.push(("9016", emissions.url("")));
    let targets: Vec<(String, String)> = targets
        .into_iter()
        .map(|(port, url)| (format!("localhost:{port}"), url))
        .collect();
    let targets: Vec<(&str, String)> = targets
        .iter()
        .map(|(p, u)| (p.as_str(), u.clone()))
        .collect();
    let every_job = "count by (job) ({__name__=~\"ceems_compute_unit_cpu_user_seconds_total|ceems_emissions_gCo2_kWh|DCGM_FI_DEV_POWER_USAGE_INSTANT|amd_gpu_power|gpu_power_usage\"})";
    let scrape_start = now();
    let (prometheus, url, gpu_exporters) = common::tool_pack::pack_prometheus(
        common::tool_pack::Pack::V010,
        dir,
        &targets,
        every_job,
        11,
    );
    // A few scrapes of every target, as the script's sleep gives.
    std::thread::sleep(std::time::Duration::from_secs(3));

    let rules = dir.join("rules");
    let url_flag = format!("--url={url}");
    let out_flag = format!("--output-dir={}", rules.display());
    let runs: [(&[&str], &str); 3] = [
        (&["--country-code=FR"], "0\n"),
        (&["--country-code=FR", "--disable-providers"], "1\n"),
        (&["--emission-factor=50"], "1\n"),
    ];
    let mut written: Vec<(String, String)> = Vec::new();
    for (flags, input) in runs {
        let args = [
            &["tsdb", "create-recording-rules", &url_flag, &out_flag, V010][..],
            flags,
        ]
        .concat();
        written.extend(write_rules(dir, &args, input, &rules));
    }
    // A job with two chassis and an answer that names neither: refused, and said why.
    let args = ["tsdb", "create-recording-rules", &url_flag, &out_flag, V010];
    let (status, log) = ceems_tool(dir, &args, "7\n");
    assert_eq!(status, 1, "{log}");
    assert!(
        log.contains("[1]: Chassis_2") && log.contains("choice 7 out of range"),
        "{log}"
    );
    let fixture = std::fs::read_to_string(
        common::fixtures()
            .join("ceems-api/cmd/ceems_tool/testdata/output/e2e-test-recording-rules-output.txt"),
    )
    .unwrap();
    let (rules_part, queries_part) =
        fixture.split_at(fixture.find("Queries for TSDB updater:").unwrap());
    assert_same_rules(&written, &expected_files(rules_part));

    // The script's backfill of one job's rules, Prometheus restarted on the same TSDB, and
    // the updater queries for what it then records.
    let backfill = Command::new("promtool")
        .args(["tsdb", "create-blocks-from", "rules"])
        .arg(format!("--url={url}"))
        .arg(format!("--start={scrape_start}"))
        .arg(format!("--end={}", now()))
        .arg("--eval-interval=500ms")
        .arg(format!("--output-dir={}", dir.join("tsdb").display()))
        .arg(rules.join("cpu-only-ipmi.rules"))
        .output()
        .unwrap();
    assert!(
        backfill.status.success(),
        "{}",
        String::from_utf8_lossy(&backfill.stderr)
    );
    drop((prometheus, gpu_exporters));
    let (_prometheus, url, _gpu_exporters) = common::tool_pack::pack_prometheus(
        common::tool_pack::Pack::V010,
        dir,
        &targets,
        "count by (__name__) ({__name__=~\"uuid:.*\"})",
        2,
    );
    let (status, out) = ceems_tool(
        dir,
        &[
            "tsdb",
            "create-ceems-tsdb-updater-queries",
            &format!("--url={url}"),
            V010,
        ],
        "",
    );
    assert_eq!(status, 0, "{out}");
    assert_eq!(out, queries_part);
}

/// CEEMS v0.16's `tool-recording-rules-multiple-emissions` scenario as its script runs it:
/// one exporter of ours with IPMI, RAPL and emissions, one with emissions only, Prometheus
/// with the pack's `prometheus-emissions.yml`, and the tool run three times (the factor
/// series, OWID's static factor, a factor given). Every file passes `promtool check rules`
/// and equals CEEMS's expected rules (today's: the IO and network groups, and the factors of
/// one emissions target although two have them).
#[test]
fn ceems_tool_recording_rules_multiple_emissions_scenario() {
    common::lab::prometheus_tools().expect("prometheus");
    let pack = common::fixtures().join("compat");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let [ipmi_dcmi, ..] = pack_tools(dir);
    let ipmi_flag = format!("--collector.ipmi.dcmi.cmd={}", ipmi_dcmi.display());
    let node = todays_exporter(
        &pack,
        &[
            "--collector.gpu.type=nogpu",
            &ipmi_flag,
            "--collector.rapl",
            "--collector.emissions",
        ],
    );
    let emissions = common::start_exporter(
        &pack,
        &[
            "--collector.disable-defaults",
            "--collector.emissions",
            "--collector.emissions.provider=owid",
            "--collector.force-hostname=testhost-1",
            "--web.disable-exporter-metrics",
        ],
    );
    let targets = [
        ("localhost:9010", node.url("")),
        ("localhost:9011", emissions.url("")),
    ];
    let (_prometheus, url, _gpus) = common::tool_pack::pack_prometheus_with(
        common::tool_pack::Pack::V016,
        "prometheus-emissions.yml",
        dir,
        &targets,
        "count by (job) ({__name__=~\"ceems_compute_unit_cpu_user_seconds_total|ceems_emissions_gCo2_kWh\"})",
        2,
    );
    std::thread::sleep(Duration::from_secs(3));
    let rules = dir.join("rules");
    let url_flag = format!("--url={url}");
    let out_flag = format!("--output-dir={}", rules.display());
    let mut written: Vec<(String, String)> = Vec::new();
    for flags in [
        &["--country-code=FR"][..],
        &["--country-code=FR", "--disable-providers"],
        &["--emission-factor=50"],
    ] {
        let args = [
            &["tsdb", "create-recording-rules", &url_flag, &out_flag][..],
            flags,
        ]
        .concat();
        written.extend(write_rules(dir, &args, "", &rules));
    }
    let fixture = std::fs::read_to_string(common::fixtures().join(
        "ceems-v0.16/cmd/ceems_tool/testdata/output/e2e-test-recording-rules-multiple-emissions-output.txt",
    ))
    .unwrap();
    assert_same_rules(&written, &expected_files(&fixture));
}

/// Today's GPU rules relabel DCGM's series themselves: with the v0.16 pack's Prometheus
/// config (no relabel configs), one exporter of ours with IPMI and NVIDIA GPUs and the DCGM
/// exporter's stand-in on the same host, the rules the tool writes are loaded by Prometheus
/// and record each unit's GPU usage and power.
#[test]
fn todays_gpu_rules_need_no_relabel_configs() {
    common::lab::prometheus_tools().expect("prometheus");
    let pack = common::fixtures().join("compat");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let [_, ipmitool, nvidia_smi, _] = pack_tools(dir);
    let ipmi_flag = format!("--collector.ipmi.dcmi.cmd={}", ipmitool.display());
    let nvidia_flag = format!("--collector.gpu.nvidia-smi-path={}", nvidia_smi.display());
    let exporter = todays_exporter(
        &pack,
        &["--collector.gpu.type=nvidia", &nvidia_flag, &ipmi_flag],
    );
    let (prometheus, url, _gpus) = common::tool_pack::pack_prometheus(
        common::tool_pack::Pack::V016,
        dir,
        &[("localhost:9016", exporter.url(""))],
        "count by (job) ({__name__=~\"ceems_compute_unit_gpu_index_flag|DCGM_FI_DEV_POWER_USAGE_INSTANT\",job=~\"cpu-ipmi-nvidia-gpu|ipmi-nvidia-gpu\"})",
        2,
    );
    std::thread::sleep(Duration::from_secs(3));
    let rules = dir.join("rules");
    let (status, log) = ceems_tool(
        dir,
        &[
            "tsdb",
            "create-recording-rules",
            &format!("--url={url}"),
            &format!("--output-dir={}", rules.display()),
            "--emission-factor=50",
        ],
        "",
    );
    assert_eq!(status, 0, "{log}");
    let gpu_file = rules.join("ipmi-nvidia-gpu-gpu.rules");
    let text = std::fs::read_to_string(&gpu_file).unwrap_or_else(|e| panic!("{e}: {log}"));
    assert!(
        text.contains("uuid:ceems_gpu_prof_sm_active:ratio"),
        "{text}"
    );
    // Prometheus reads the rules files of its config again on SIGHUP.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(prometheus.0.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let units = |record: &str| -> usize {
        let answer: serde_json::Value = ureq::get(&format!("{url}/api/v1/query"))
            .query("query", &format!("count({record}) by (uuid)"))
            .call()
            .ok()
            .and_then(|r| r.into_string().ok())
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        answer["data"]["result"].as_array().map_or(0, |r| r.len())
    };
    let start = std::time::Instant::now();
    while units("uuid:ceems_gpu_power_watts:pue") == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no unit's GPU power was recorded from {}",
            gpu_file.display()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(units("uuid:ceems_gpu_usage:ratio") > 0);
    assert!(units("uuid:ceems_gpu_prof_sm_active:ratio") > 0);
}

/// Runs the tool with `args` (and `input` for its prompt), checks every file it wrote in
/// `rules` with `promtool check rules`, and returns the files, by name, in name order.
fn write_rules(dir: &Path, args: &[&str], input: &str, rules: &Path) -> Vec<(String, String)> {
    let (status, log) = ceems_tool(dir, args, input);
    assert_eq!(status, 0, "{log}");
    let mut files: Vec<PathBuf> = std::fs::read_dir(rules)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let check = Command::new("promtool")
                .args(["check", "rules"])
                .arg(&file)
                .output()
                .unwrap();
            assert!(
                check.status.success(),
                "{}: {}",
                file.display(),
                String::from_utf8_lossy(&check.stdout) + String::from_utf8_lossy(&check.stderr)
            );
            (
                file.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&file).unwrap(),
            )
        })
        .collect()
}

/// Each file as Prometheus reads it: the same groups, intervals, records and expressions.
fn assert_same_rules(written: &[(String, String)], want: &[(String, String)]) {
    let names =
        |files: &[(String, String)]| files.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(written), names(want));
    for ((name, ours), (_, theirs)) in written.iter().zip(want) {
        let (ours, theirs) = (groups(ours), groups(theirs));
        let group_names = |g: &[Group]| g.iter().map(|g| g.0.clone()).collect::<Vec<_>>();
        assert_eq!(group_names(&ours), group_names(&theirs), "{name}");
        for (g_ours, g_theirs) in ours.iter().zip(&theirs) {
            assert_eq!(g_ours.1, g_theirs.1, "{name}: {}", g_ours.0);
            let records = |g: &Group| g.2.iter().map(|r| r.0.clone()).collect::<Vec<_>>();
            assert_eq!(records(g_ours), records(g_theirs), "{name}: {}", g_ours.0);
            for (r_ours, r_theirs) in g_ours.2.iter().zip(&g_theirs.2) {
                assert_eq!(r_ours.1, r_theirs.1, "{name}: {}", r_ours.0);
            }
        }
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[test]
fn expected_rules_are_read_as_prometheus_reads_them() {
    let files = expected_files("a.rules\ngroups:\n  - name: g\n    interval: 1s\n    rules:\n      - record: r\n        expr: |2\n          sum by (job) (x) # why\n          > 0\nb.rules\ngroups: []\n");
    assert_eq!(files.len(), 2);
    let g = groups(&files[0].1);
    assert_eq!(
        g,
        vec![(
            "g".to_owned(),
            "1s".to_owned(),
            vec![("r".to_owned(), "sumby(job)(x)>0".to_owned())]
        )]
    );
}

/// On the real Slurm lab: the exporter on the lab's cgroups with IPMI (a stand-in printing
/// FreeIPMI's capture: the lab's node has no BMC) and today's names, Prometheus scraping it;
/// the rules the tool writes for it pass `promtool check rules`, and a Prometheus that loads
/// them records each running job's power and emissions, the jobs' power within the node's.
#[test]
fn the_rules_written_for_the_slurm_lab_give_every_job_its_power() {
    use common::lab::{
        lab, prometheus_tools, submit, wait_until, write_burner, CancelOnDrop, Prometheus, BURNER,
    };
    if !common::runnable(
        "the_rules_written_for_the_slurm_lab_give_every_job_its_power",
        lab().and_then(|_| prometheus_tools()),
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ipmi = common::stub(
        &dir.join("stubs"),
        "ipmi-dcmi",
        &common::fixtures()
            .join("compat/fixtures/ipmi/freeipmi/ipmi-dcmi_--get-system-power-statistics.txt"),
    );
    let ipmi_flag = format!("--collector.ipmi.dcmi.cmd={}", ipmi.display());
    let exporter = common::start_exporter(
        Path::new("/"),
        &[
            "--collector.slurm",
            "--collector.ipmi",
            "--collector.ipmi.test-mode",
            &ipmi_flag,
        ],
    );
    let scraping = Prometheus::start(&[exporter.port], &[]);
    write_burner();
    // Long enough to be running through every check below (cancelled when the test ends).
    let burn = format!("-c 1 --mem=100M --wrap 'python3 {BURNER} 90'");
    let ids = vec![
        submit("alice", &format!("-J rules-a {burn}")),
        submit("bob", &format!("-J rules-b {burn}")),
    ];
    let _cancel = CancelOnDrop(ids.clone());
    let has_series = |prom: &Prometheus, name: &str, id: &str| {
        !prom.query(&format!("{name}{{uuid=\"{id}\"}}")).is_empty()
    };
    wait_until(
        "Prometheus to scrape both jobs",
        Duration::from_secs(60),
        || {
            ids.iter()
                .all(|id| has_series(&scraping, "ceems_compute_unit_cpu_user_seconds_total", id))
                && !scraping
                    .query("ceems_ipmi_dcmi_power_current_watts")
                    .is_empty()
        },
    );

    let rules = dir.join("rules");
    let (status, log) = ceems_tool(
        dir,
        &[
            "tsdb",
            "create-recording-rules",
            &format!("--url={}", scraping.url()),
            &format!("--output-dir={}", rules.display()),
            "--country-code=FR",
            "--pue=1.2",
        ],
        "",
    );
    assert_eq!(status, 0, "{log}");
    assert!(
        log.contains("static emission factor 44.179085 g/kWh from OWID"),
        "{log}"
    );
    let written = rules.join("ceems.rules");
    let text = std::fs::read_to_string(&written).unwrap_or_else(|e| panic!("{e}: {log}"));
    assert!(
        text.contains("instance:ceems_ipmi_dcmi_power_current_watts:pue"),
        "today's IPMI series is the node power: {text}"
    );
    let check = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&written)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );

    let recording = Prometheus::start(&[exporter.port], &[&written]);
    let mut power = Vec::new();
    wait_until("each job's recorded power", Duration::from_secs(30), || {
        power = ids
            .iter()
            .filter_map(|id| {
                recording
                    .query(&format!("uuid:ceems_host_power_watts:pue{{uuid=\"{id}\"}}"))
                    .first()
                    .and_then(|s| s["value"][1].as_str()?.parse::<f64>().ok())
            })
            .filter(|w| *w > 0.0)
            .collect();
        power.len() == ids.len()
            && ids
                .iter()
                .all(|id| has_series(&recording, "uuid:ceems_host_emissions_g_s:pue", id))
    });
    // FreeIPMI's capture says 332 W; with a PUE of 1.2 the node is 398.4 W, of which the jobs'
    // shares are a part.
    let node: f64 = recording
        .query("instance:ceems_ipmi_dcmi_power_current_watts:pue")
        .first()
        .and_then(|s| s["value"][1].as_str()?.parse().ok())
        .unwrap();
    assert!((node - 1.2 * 332.0).abs() < 1e-6, "{node}");
    let sum: f64 = power.iter().sum();
    assert!(sum <= node * 1.0001, "{power:?} > {node}");

    // The stats-server's default queries read what these rules record: each job's energy and
    // emissions, for its owner.
    let (server, _data) = common::lab::start_stats_server(&recording.url());
    let fields = "&field=uuid&field=total_cpu_energy_usage_kwh&field=total_cpu_emissions_gms";
    for (user, id) in [("alice", &ids[0]), ("bob", &ids[1])] {
        let mut unit = serde_json::Value::Null;
        wait_until(
            &format!("{user}'s job's energy"),
            Duration::from_secs(60),
            || {
                let units = common::api_get(
                    &server,
                    &format!("/api/v1/units?from=0&uuid={id}{fields}"),
                    user,
                );
                unit = units["data"][0].clone();
                unit["total_cpu_energy_usage_kwh"]["total"]
                    .as_f64()
                    .unwrap_or(0.0)
                    > 0.0
            },
        );
        let emissions = unit["total_cpu_emissions_gms"]
            .as_object()
            .map(|m| m.values().filter_map(|v| v.as_f64()).sum::<f64>())
            .unwrap_or(0.0);
        assert!(emissions > 0.0, "{unit}");
    }
}
