//! Each family CEEMS v0.11 renamed (docs/compat.md lists them) under today's name by
//! default and under v0.10's with `--compat.metric-names=v0.10`, and the old spellings of the
//! renamed flags and config keys still accepted, with a warning.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::bmc::{Flavor, StandinBmc};
use common::{fixtures, start_exporter, start_listening, stub};

/// (today's name, v0.10's name) of every renamed family.
const RENAMED: [(&str, &str); 8] = [
    (
        "ceems_ipmi_dcmi_power_current_watts",
        "ceems_ipmi_dcmi_current_watts",
    ),
    (
        "ceems_ipmi_dcmi_power_min_watts",
        "ceems_ipmi_dcmi_min_watts",
    ),
    (
        "ceems_ipmi_dcmi_power_max_watts",
        "ceems_ipmi_dcmi_max_watts",
    ),
    (
        "ceems_ipmi_dcmi_power_avg_watts",
        "ceems_ipmi_dcmi_avg_watts",
    ),
    (
        "ceems_redfish_power_current_watts",
        "ceems_redfish_current_watts",
    ),
    ("ceems_redfish_power_min_watts", "ceems_redfish_min_watts"),
    ("ceems_redfish_power_max_watts", "ceems_redfish_max_watts"),
    ("ceems_redfish_power_avg_watts", "ceems_redfish_avg_watts"),
];

/// Families that gained hwmon's `index` label in v0.11.
const INDEXED: [&str; 5] = [
    "ceems_hwmon_power_current_watts",
    "ceems_hwmon_power_min_watts",
    "ceems_hwmon_power_max_watts",
    "ceems_hwmon_power_avg_watts",
    "ceems_hwmon_energy_current_joules",
];

/// `/metrics` of the exporter on CEEMS's fixture tree with IPMI, Redfish and hwmon on, plus
/// `extra` flags.
fn scrape(extra: &[&str]) -> String {
    let dir = fixtures().join("compat");
    let stubs = tempfile::tempdir().unwrap();
    let ipmitool = stub(
        stubs.path(),
        "ipmitool",
        &dir.join("fixtures/ipmi/openipmi/ipmitool_dcmi_power_reading.txt"),
    );
    let bmc = StandinBmc::start(
        Flavor::CeemsMock(dir.join("fixtures/mock-servers/redfish")),
        false,
    );
    let config = stubs.path().join("redfish.yml");
    let original = std::fs::read_to_string(dir.join("fixtures/redfish/config.yml")).unwrap();
    std::fs::write(
        &config,
        original.replace("port: 5000", &format!("port: {}", bmc.port)),
    )
    .unwrap();
    let ipmi_cmd = format!("--collector.ipmi.dcmi.cmd={}", ipmitool.display());
    let redfish_config = format!("--collector.redfish.config.file={}", config.display());
    let mut args = vec![
        "--path.sysfs=sys",
        "--path.procfs=proc",
        "--collector.ipmi",
        "--collector.ipmi.test-mode",
        &ipmi_cmd,
        "--collector.redfish",
        &redfish_config,
        "--collector.hwmon",
        "--web.disable-exporter-metrics",
    ];
    args.extend_from_slice(extra);
    start_exporter(&dir, &args).get("/metrics")
}

fn has_family(text: &str, name: &str) -> bool {
    text.lines().any(|l| l.starts_with(&format!("{name}{{")))
}

#[test]
fn renamed_families_carry_todays_names_by_default_and_v010_names_with_the_switch() {
    let today = scrape(&[]);
    let v010 = scrape(&["--compat.metric-names=v0.10"]);
    for (now, old) in RENAMED {
        assert!(
            has_family(&today, now),
            "{now} missing by default:\n{today}"
        );
        assert!(!has_family(&today, old), "{old} exported by default");
        assert!(
            has_family(&v010, old),
            "{old} missing with v0.10 names:\n{v010}"
        );
        assert!(!has_family(&v010, now), "{now} exported with v0.10 names");
    }
    for family in INDEXED {
        let with_index = |text: &str| {
            text.lines()
                .filter(|l| l.starts_with(&format!("{family}{{")))
                .map(|l| l.contains(",index=\""))
                .collect::<Vec<bool>>()
        };
        let (now, old) = (with_index(&today), with_index(&v010));
        assert!(
            !now.is_empty() && now.iter().all(|i| *i),
            "{family}: {now:?}"
        );
        assert!(
            !old.is_empty() && !old.iter().any(|i| *i),
            "{family}: {old:?}"
        );
    }
    // The collector's own name in its success gauge, which dashboards select by.
    assert!(today.contains("ceems_scrape_collector_success{collector=\"ipmi\"} 1\n"));
    assert!(v010.contains("ceems_scrape_collector_success{collector=\"ipmi_dcmi\"} 1\n"));
    // RAPL: off by default since v0.11, on by default in v0.10.
    assert!(!today.contains("collector=\"rapl\""), "{today}");
    assert!(v010.contains("ceems_scrape_collector_success{collector=\"rapl\"} 1\n"));
}

/// Starts the exporter in CEEMS's fixture tree with `args` and `env`; its stderr goes to a file.
fn start_logged(
    args: &[String],
    env: &[(&str, &str)],
    log: &Path,
) -> (common::Running, impl Fn() -> String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ceems"));
    command
        .arg("exporter")
        .args(args)
        .envs(env.iter().copied())
        .current_dir(fixtures().join("compat"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    let running = start_listening(command, "exporter");
    let log = log.to_owned();
    (running, move || std::fs::read_to_string(&log).unwrap())
}

#[test]
fn v010_flags_env_vars_and_config_keys_still_work_and_say_what_replaces_them() {
    let dir = tempfile::tempdir().unwrap();
    let ipmitool = stub(
        dir.path(),
        "ipmitool",
        &fixtures().join("compat/fixtures/ipmi/openipmi/ipmitool_dcmi_power_reading.txt"),
    );
    let series = "ceems_ipmi_dcmi_power_current_watts{hostname=\"\"}";

    // Flags and an environment variable as a v0.10 systemd unit spells them.
    let (exporter, log) = start_logged(
        &[
            "--collector.ipmi_dcmi".into(),
            format!("--collector.ipmi_dcmi.cmd={}", ipmitool.display()),
            "--collector.empty-hostname-label".into(),
        ],
        &[("CEEMS_EXPORTER_COLLECTOR_IPMI_DCMI_TEST_MODE", "true")],
        &dir.path().join("flags.log"),
    );
    let text = exporter.get("/metrics");
    assert!(text.contains(series), "{text}");
    assert!(text.contains("ceems_scrape_collector_success{collector=\"ipmi\"} 1\n"));
    let log = log();
    for (old, new) in [
        ("--collector.ipmi_dcmi", "--collector.ipmi"),
        ("--collector.ipmi_dcmi.cmd", "--collector.ipmi.dcmi.cmd"),
        (
            "--collector.ipmi_dcmi.test-mode",
            "--collector.ipmi.test-mode",
        ),
    ] {
        let said: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(&format!("message=\"{old} (")))
            .collect();
        assert_eq!(said.len(), 1, "{old}: once, not {said:?}\n{log}");
        assert!(
            said[0].contains(&format!("is deprecated, use {new}\"")),
            "{said:?}"
        );
    }

    // Accepted, not advertised.
    let help = Command::new(env!("CARGO_BIN_EXE_ceems"))
        .args(["exporter", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--collector.ipmi.dcmi.cmd"), "{help}");
    assert!(!help.contains("ipmi_dcmi.") && !help.contains("redfish.web-config"));

    // v0.10's table in a config file.
    let config = dir.path().join("ceems.toml");
    std::fs::write(
        &config,
        format!(
            "[exporter.collector.ipmi_dcmi]\nenabled = true\ncmd = \"{}\"\ntest-mode = true\n",
            ipmitool.display()
        ),
    )
    .unwrap();
    let (exporter, log) = start_logged(
        &[
            format!("--config.file={}", config.display()),
            "--collector.empty-hostname-label".into(),
        ],
        &[],
        &dir.path().join("file.log"),
    );
    let text = exporter.get("/metrics");
    assert!(text.contains(series), "{text}");
    let log = log();
    assert!(
        log.contains("`collector.ipmi_dcmi.cmd` is deprecated, use `collector.ipmi.cmd`"),
        "{log}"
    );
    assert!(
        log.contains("`collector.ipmi_dcmi.enabled` is deprecated, use `collector.ipmi.enabled`"),
        "{log}"
    );
}

#[test]
fn the_switch_is_also_a_config_file_key() {
    let dir = tempfile::tempdir().unwrap();
    let ipmitool = stub(
        dir.path(),
        "ipmitool",
        &fixtures().join("compat/fixtures/ipmi/openipmi/ipmitool_dcmi_power_reading.txt"),
    );
    let config = dir.path().join("ceems.toml");
    std::fs::write(
        &config,
        format!(
            "[exporter.compat]\nmetric-names = \"v0.10\"\n\n[exporter.collector.ipmi]\nenabled = true\ncmd = \"{}\"\ntest-mode = true\n",
            ipmitool.display()
        ),
    )
    .unwrap();
    let (exporter, _log) = start_logged(
        &[format!("--config.file={}", config.display())],
        &[],
        &dir.path().join("exporter.log"),
    );
    let text = exporter.get("/metrics");
    assert!(has_family(&text, "ceems_ipmi_dcmi_current_watts"), "{text}");
    assert!(!has_family(&text, "ceems_ipmi_dcmi_power_current_watts"));
}

/// The switch chooses metric names only: today's and v0.10's spellings of the IPMI flags both
/// start the collector, under either generation's names.
#[test]
fn both_spellings_of_the_ipmi_flags_work_in_both_modes() {
    let dir = tempfile::tempdir().unwrap();
    let ipmitool = stub(
        dir.path(),
        "ipmitool",
        &fixtures().join("compat/fixtures/ipmi/openipmi/ipmitool_dcmi_power_reading.txt"),
    );
    for (mode, series) in [
        (
            "v0.11",
            "ceems_ipmi_dcmi_power_current_watts{hostname=\"\"}",
        ),
        ("v0.10", "ceems_ipmi_dcmi_current_watts{hostname=\"\"}"),
    ] {
        for spelling in ["ipmi", "ipmi_dcmi"] {
            let cmd = match spelling {
                "ipmi" => "ipmi.dcmi.cmd",
                _ => "ipmi_dcmi.cmd",
            };
            let args = [
                format!("--compat.metric-names={mode}"),
                format!("--collector.{spelling}"),
                format!("--collector.{cmd}={}", ipmitool.display()),
                format!("--collector.{spelling}.test-mode"),
                "--collector.empty-hostname-label".into(),
            ];
            let (exporter, log) = start_logged(
                &args,
                &[],
                &dir.path().join(format!("{mode}-{spelling}.log")),
            );
            let text = exporter.get("/metrics");
            assert!(
                text.contains(series),
                "{mode} with {args:?}: no {series}\n{text}\n{}",
                log()
            );
        }
    }
}
