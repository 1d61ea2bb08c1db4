//! What the packages ship, checked without installing them (scripts/package-test.sh installs
//! the .deb as root): the systemd units pass `systemd-analyze verify` with no warning, and the
//! man pages and completions come from the real command line.

mod common;

use std::path::Path;
use std::process::Command;

use common::{ensure_tools, runnable};

#[test]
fn systemd_units_verify_cleanly() {
    let present = || {
        Command::new("systemd-analyze")
            .arg("--version")
            .output()
            .is_ok()
    };
    if !runnable(
        "systemd_units_verify_cleanly",
        ensure_tools(present, &["systemd"], &[]),
    ) {
        return;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/systemd");
    let tmp = tempfile::tempdir().unwrap();
    let mut units = Vec::new();
    for name in [
        "ceems_exporter.service",
        "redfish_proxy.service",
        "ceems_api_server.service",
        "ceems_lb.service",
    ] {
        let text = std::fs::read_to_string(src.join(name)).unwrap();
        assert!(text.contains("NoNewPrivileges=yes"), "{name}");
        assert!(text.contains("CapabilityBoundingSet="), "{name}");
        assert!(text.contains("User=ceems"), "{name}");
        // verify checks that ExecStart exists: point it at the binary under test.
        let text = [
            "ceems_exporter",
            "redfish_proxy",
            "ceems_api_server",
            "ceems_lb",
        ]
        .iter()
        .fold(text, |t, link| {
            t.replace(&format!("/usr/bin/{link}"), env!("CARGO_BIN_EXE_ceems"))
        });
        let path = tmp.path().join(name);
        std::fs::write(&path, text).unwrap();
        units.push(path);
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(&units)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    // Unknown or misspelt directives are only warnings: none may appear.
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
}

#[test]
fn the_exporter_unit_grants_what_its_collectors_declare() {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/systemd/ceems_exporter.service"),
    )
    .unwrap();
    let declared: Vec<String> = ceems::registry::COLLECTORS
        .iter()
        .filter(|s| s.default_enabled || s.name == "slurm")
        .flat_map(|s| s.capabilities.iter().map(|c| c.to_string()))
        .collect();
    for line in ["AmbientCapabilities=", "CapabilityBoundingSet="] {
        let granted = unit
            .lines()
            .find_map(|l| l.strip_prefix(line))
            .unwrap_or_else(|| panic!("no {line}"));
        for cap in &declared {
            assert!(granted.contains(cap.as_str()), "{line} lacks {cap}");
        }
    }
}

#[test]
fn man_pages_and_completions_cover_every_subcommand() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ceems"))
        .arg("generate-assets")
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let exporter = std::fs::read_to_string(tmp.path().join("man/ceems-exporter.1")).unwrap();
    assert!(
        exporter.contains("collector.slurm"),
        "exporter man page lacks its flags"
    );
    for sub in ["stats-server", "redfish-proxy", "lb", "check-privileges"] {
        assert!(
            tmp.path().join(format!("man/ceems-{sub}.1")).exists(),
            "{sub}"
        );
    }
    let bash = std::fs::read_to_string(tmp.path().join("completions/ceems.bash")).unwrap();
    assert!(
        bash.contains("--collector.ipmi.dcmi.cmd"),
        "bash completion lacks flags"
    );
    assert!(tmp.path().join("completions/_ceems").exists());
    assert!(tmp.path().join("completions/ceems.fish").exists());
}

/// What the packages install as /etc/ceems/ceems.toml does what the units promise: the
/// exporter collects Slurm jobs and a power source, and the stats-server asks a Prometheus
/// for aggregates (no "no Prometheus URL" warning).
#[test]
fn the_packaged_config_turns_on_jobs_power_and_aggregates() {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/ceems.toml");
    let config = format!("--config.file={}", config.display());
    let dir = tempfile::tempdir().unwrap();
    let exporter = common::start_subcommand(
        "exporter",
        dir.path(),
        &[&config, "--security.drop-privileges=false"],
        &[],
    );
    let metrics = exporter.get("/metrics");
    for collector in ["slurm", "rapl", "cpu", "meminfo"] {
        assert!(
            metrics.contains(&format!(
                "ceems_scrape_collector_success{{collector=\"{collector}\"}}"
            )),
            "the packaged exporter does not run {collector}"
        );
    }
    let log = dir.path().join("stats.log");
    let mut stats = Command::new(env!("CARGO_BIN_EXE_ceems"));
    stats
        .args([
            "stats-server",
            &config,
            &format!("--storage.data.path={}", dir.path().join("data").display()),
            "--slurm.sacct.path=/bin/true",
            "--slurm.sacctmgr.path=",
            "--security.drop-privileges=false",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let stats = common::start_listening(stats, "stats-server");
    drop(stats);
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(!said.contains("no Prometheus URL"), "{said}");
    // The lb cannot guess the cluster's Prometheus: it stops at start and says what to add.
    let out = Command::new(env!("CARGO_BIN_EXE_ceems"))
        .args(["lb", &config, "--web.listen-address=127.0.0.1:0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("`backends` in [lb.lb]"), "{err}");
}
