//! The binary as an operator meets it: subcommands, argv[0] dispatch, config layers, the HTTP
//! contract of /metrics, limits, timeouts and shutdown.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{fixtures, free_port, parse_series, start_exporter};

const BIN: &str = env!("CARGO_BIN_EXE_ceems");

fn fixture_args() -> Vec<&'static str> {
    vec![
        "--path.sysfs=sys",
        "--path.cgroupfs=sys/fs/cgroup",
        "--path.procfs=proc",
        "--collector.cgroups.force-version=v2",
        "--collector.slurm",
    ]
}

#[test]
fn help_lists_every_subcommand() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for sub in [
        "exporter",
        "stats-server",
        "redfish-proxy",
        "check-privileges",
    ] {
        assert!(text.contains(sub), "--help lacks {sub}:\n{text}");
    }
}

/// `stats-server --help` names every manager it reads and where their clusters are set.
#[test]
fn stats_server_help_names_every_manager_and_where_clusters_go() {
    let out = Command::new(BIN)
        .args(["stats-server", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for said in [
        "Slurm",
        "LSF",
        "Kubernetes",
        "OpenPBS",
        "[[stats-server.clusters]]",
        "manager = \"openpbs\"",
        "manager = \"k8s\"",
        "manager = \"lsf\"",
    ] {
        assert!(text.contains(said), "--help lacks {said}:\n{text}");
    }
}

/// What `git rev-parse --short HEAD` says of this checkout; "unknown" outside git, as the
/// build script then says.
fn checkout_revision() -> String {
    Command::new("git")
        .args([
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "rev-parse",
            "--short",
            "HEAD",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned())
}

#[test]
fn build_info_and_version_name_the_revision_of_the_checkout() {
    let revision = checkout_revision();
    let out = Command::new(BIN).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        version.contains(&format!("(revision {revision}, branch ")),
        "{version}"
    );
    assert!(!version.contains("rustc unknown"), "{version}");
    let exporter = start_exporter(&fixtures().join("compat"), &fixture_args());
    let metrics = exporter.get("/metrics");
    let info = metrics
        .lines()
        .find(|l| l.starts_with("ceems_exporter_build_info{"))
        .unwrap_or_else(|| panic!("no build_info:\n{metrics}"));
    assert!(
        info.contains(&format!("revision=\"{revision}\"")),
        "{info} is not revision {revision}"
    );
    assert!(!info.contains("rustversion=\"unknown\""), "{info}");
    assert!(!info.contains("branch=\"unknown\""), "{info}");
}

#[test]
fn link_named_ceems_exporter_runs_the_exporter() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("ceems_exporter");
    std::os::unix::fs::symlink(BIN, &link).unwrap();
    let out = Command::new(&link).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.contains("--collector.slurm"), "{text}");
    assert!(text.contains("Usage: ceems_exporter"), "{text}");
}

#[test]
fn metrics_endpoint_contract() {
    let exporter = start_exporter(&fixtures().join("compat"), &fixture_args());
    let resp = ureq::get(&exporter.url("/metrics")).call().unwrap();
    assert_eq!(
        resp.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let plain = resp.into_string().unwrap();
    assert!(plain.contains("ceems_compute_units{hostname="));
    assert!(plain.contains("process_resident_memory_bytes"));
    assert!(plain.contains("ceems_exporter_build_info{"));

    let resp = ureq::get(&exporter.url("/metrics"))
        .set("Accept-Encoding", "gzip")
        .call()
        .unwrap();
    assert_eq!(resp.header("content-encoding"), Some("gzip"));
    let mut zipped = Vec::new();
    resp.into_reader().read_to_end(&mut zipped).unwrap();
    let mut unzipped = String::new();
    flate2::read::GzDecoder::new(&zipped[..])
        .read_to_string(&mut unzipped)
        .unwrap();
    let names = |t: &str| -> Vec<String> {
        parse_series(t)
            .into_keys()
            .filter(|k| k.starts_with("ceems_compute"))
            .collect()
    };
    assert_eq!(names(&unzipped), names(&plain));

    assert_eq!(exporter.get("/health"), "OK\n");
    assert!(exporter.get("/").contains("href=\"/metrics\""));
    match ureq::get(&exporter.url("/nope")).call() {
        Err(ureq::Error::Status(404, _)) => {}
        other => panic!("expected 404, got {other:?}"),
    }
    match ureq::post(&exporter.url("/metrics")).call() {
        Err(ureq::Error::Status(405, _)) => {}
        other => panic!("expected 405, got {other:?}"),
    }
}

/// A v2 tree of `jobs` jobs whose first job's `memory.stat` is a FIFO with no writer: reading
/// it blocks for ever, a stand-in for a hung filesystem. Readable by the unprivileged user the
/// exporter drops to, so that the read does hang.
fn tree_with_a_hung_file(dir: &Path, jobs: usize) -> ceems::testing::JobTree {
    let tree = ceems::testing::generate(
        dir,
        ceems::testing::TreeSpec::new(ceems::host::cgroup::CgroupVersion::V2, jobs),
    )
    .unwrap();
    let stat = tree.job_dir(0).join("memory.stat");
    std::fs::remove_file(&stat).unwrap();
    nix::unistd::mkfifo(&stat, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    tree
}

/// A burst of requests over --web.max-requests: each is answered 503, and the log says so in
/// a line and a count, not a line per request.
#[test]
fn a_burst_of_refused_requests_logs_a_line_and_a_count() {
    let dir = tempfile::tempdir().unwrap();
    // A hung scrape holds the one permit while the burst comes in.
    let tree = tree_with_a_hung_file(dir.path(), 1);
    let log_path = dir.path().join("exporter.log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_ceems"));
    command
        .arg("exporter")
        .arg(format!("--path.cgroupfs={}", tree.cgroupfs().display()))
        .arg(format!("--path.procfs={}", tree.procfs().display()))
        .args([
            "--collector.cgroups.force-version=v2",
            "--collector.slurm",
            "--collector.timeout=4s",
            "--web.max-requests=1",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap());
    let exporter = common::start_listening(command, "exporter");
    let url = exporter.url("/metrics");
    let slow = {
        let url = url.clone();
        std::thread::spawn(move || ureq::get(&url).call().map(|r| r.status()).ok())
    };
    std::thread::sleep(Duration::from_millis(500));
    let refused: usize = (0..10)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                (0..100)
                    .filter(|_| matches!(ureq::get(&url).call(), Err(ureq::Error::Status(503, _))))
                    .count()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .sum();
    assert_eq!(slow.join().unwrap(), Some(200));
    assert!(refused >= 900, "only {refused} of 1,000 refused");
    let lines_about_503 = || {
        std::fs::read_to_string(&log_path)
            .unwrap()
            .lines()
            // Warnings only: an info line's timestamp may hold the digits 503.
            .filter(|l| l.contains("level=warn") && l.contains("503"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    // The count comes when the 10 s window closes.
    let start = Instant::now();
    let lines = loop {
        let lines = lines_about_503();
        if lines
            .iter()
            .any(|l| l.contains("more requests answered 503"))
            || start.elapsed() > Duration::from_secs(20)
        {
            break lines;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        lines.len() <= 3,
        "{} lines for one burst: {lines:#?}",
        lines.len()
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&format!("refused={}", refused - 1))),
        "no line counts the {refused} refused requests: {lines:#?}"
    );
}

#[test]
fn hanging_collector_times_out_and_excess_requests_get_503() {
    let dir = tempfile::tempdir().unwrap();
    let tree = tree_with_a_hung_file(dir.path(), 2);

    let cg = format!("--path.cgroupfs={}", tree.cgroupfs().display());
    let proc = format!("--path.procfs={}", tree.procfs().display());
    let exporter = start_exporter(
        Path::new("/"),
        &[
            &cg,
            &proc,
            "--collector.cgroups.force-version=v2",
            "--collector.slurm",
            "--collector.timeout=2s",
            "--web.max-requests=1",
        ],
    );
    let url = exporter.url("/metrics");
    let slow = std::thread::spawn(move || {
        let start = Instant::now();
        let body = ureq::get(&url).call().unwrap().into_string().unwrap();
        (start.elapsed(), body)
    });
    std::thread::sleep(Duration::from_millis(500));
    match ureq::get(&exporter.url("/metrics")).call() {
        Err(ureq::Error::Status(503, _)) => {}
        other => panic!("second request in flight should get 503, got {other:?}"),
    }
    let (took, body) = slow.join().unwrap();
    assert!(took < Duration::from_secs(4), "scrape took {took:?}");
    let s = parse_series(&body);
    assert_eq!(
        s["ceems_scrape_collector_success{collector=\"slurm\"}"],
        0.0
    );
    assert_eq!(s["ceems_scrape_collector_success{collector=\"cpu\"}"], 1.0);
    assert_eq!(
        s["ceems_scrape_collector_success{collector=\"meminfo\"}"],
        1.0
    );

    // Prometheus's own timeout header shortens the wait below --collector.timeout.
    let start = Instant::now();
    let body = ureq::get(&exporter.url("/metrics"))
        .set("X-Prometheus-Scrape-Timeout-Seconds", "1")
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(start.elapsed() < Duration::from_millis(1500));
    assert!(body.contains("ceems_scrape_collector_success{collector=\"slurm\"} 0"));
}

/// Two Prometheus servers of an HA pair scrape within the same instant: the collect that is
/// running for one is shared with the other, and neither loses the collector's series.
#[test]
fn overlapping_scrapes_both_get_a_slow_collectors_series() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let capture = fixtures()
        .join("compat/fixtures/ipmi/freeipmi/ipmi-dcmi_--get-system-power-statistics.txt");
    let stub = dir.path().join("ipmi-dcmi");
    std::fs::write(
        &stub,
        format!(
            "#!/bin/sh\n/bin/sleep 0.5\nexec /bin/cat '{}'\n",
            capture.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cmd = format!("--collector.ipmi.dcmi.cmd={}", stub.display());
    let exporter = start_exporter(
        Path::new("/"),
        &["--collector.ipmi", "--collector.ipmi.test-mode", &cmd],
    );
    let scrape = |url: String| {
        std::thread::spawn(move || ureq::get(&url).call().unwrap().into_string().unwrap())
    };
    let first = scrape(exporter.url("/metrics"));
    std::thread::sleep(Duration::from_millis(200));
    let second = scrape(exporter.url("/metrics"));
    for body in [first.join().unwrap(), second.join().unwrap()] {
        let s = parse_series(&body);
        assert_eq!(
            s.get("ceems_scrape_collector_success{collector=\"ipmi\"}"),
            Some(&1.0),
            "{body}"
        );
        assert!(
            body.contains("\nceems_ipmi_dcmi_power_current_watts{"),
            "{body}"
        );
    }
}

#[test]
fn sigterm_shuts_down_cleanly() {
    let exporter = start_exporter(&fixtures().join("compat"), &fixture_args());
    let mut running = exporter;
    let pid = nix::unistd::Pid::from_raw(running.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let start = Instant::now();
    loop {
        if let Some(status) = running.child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn run_with(config: &str, env: &[(&str, &str)], args: &[&str]) -> (common::Running, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ceems.toml");
    std::fs::write(&file, config).unwrap();
    let port = free_port();
    let mut cmd = Command::new(BIN);
    cmd.arg("exporter")
        .args(fixture_args())
        .args(args)
        .current_dir(fixtures().join("compat"))
        .env("CEEMS_CONFIG_FILE", &file)
        .env(
            "CEEMS_EXPORTER_WEB_LISTEN_ADDRESS",
            format!("127.0.0.1:{port}"),
        )
        .stdout(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let running = common::Running {
        child: common::KillOnDrop(cmd.spawn().unwrap()),
        port,
    };
    let start = Instant::now();
    while ureq::get(&running.url("/health")).call().is_err() {
        assert!(start.elapsed() < Duration::from_secs(10), "exporter not up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let body = running.get("/metrics");
    (running, body)
}

#[test]
fn config_layers_defaults_file_env_flags() {
    let file = "[exporter.collector.slurm]\npsi-metrics = true\n[exporter.collector.meminfo]\nall-stats = true\n";
    // File over defaults.
    let (_r, body) = run_with(file, &[], &[]);
    assert!(body.contains("ceems_compute_unit_cpu_psi_seconds"));
    assert!(body.contains("ceems_meminfo_Cached_bytes"));
    // Environment over file.
    let env = [("CEEMS_EXPORTER_COLLECTOR_SLURM_PSI_METRICS", "false")];
    let (_r, body) = run_with(file, &env, &[]);
    assert!(!body.contains("ceems_compute_unit_cpu_psi_seconds"));
    // Flags over environment.
    let (_r, body) = run_with(file, &env, &["--collector.slurm.psi-metrics"]);
    assert!(body.contains("ceems_compute_unit_cpu_psi_seconds"));
    // --no-collector.<name> turns a default collector off.
    let (_r, body) = run_with(file, &[], &["--no-collector.meminfo"]);
    assert!(!body.contains("ceems_meminfo_"));
    assert!(body.contains("ceems_cpu_seconds_total"));
    // --collector.disable-defaults keeps only the named ones.
    let (_r, body) = run_with("", &[], &["--collector.disable-defaults"]);
    assert!(!body.contains("ceems_cpu_seconds_total"));
    assert!(body.contains("ceems_scrape_collector_success{collector=\"slurm\"} 1"));
}

#[test]
fn a_malformed_gpu_order_map_stops_start_up_with_one_clear_line() {
    let out = Command::new(BIN)
        .args([
            "exporter",
            "--web.listen-address=127.0.0.1:1",
            "--security.drop-privileges=false",
            "--collector.slurm",
            "--collector.slurm.gpu-order-map=0:0,1:x",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let line = err
        .lines()
        .find(|l| l.starts_with("ceems: error:"))
        .unwrap_or_else(|| panic!("no error line: {err}"));
    assert_eq!(
        line,
        "ceems: error: collector slurm could not start: --collector.slurm.gpu-order-map: `1:x` in the GPU order map is not <slurm index>:<minor>[.<gpu instance id>]"
    );
}

#[test]
fn a_slurmrestd_source_that_cannot_work_stops_start_up_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let data = format!("--storage.data.path={}", dir.path().display());
    for (args, want) in [
        (
            &["--slurm.slurmrestd.url=unix:/run/slurmrestd.sock"][..],
            "--slurm.slurmrestd.api-version v0.0.37 is not read: its jobs' start time is their eligible time (Slurm 22.05), which would file a job under the wrong start; use v0.0.38",
        ),
        (&[][..], "--slurm.source=slurmrestd needs --slurm.slurmrestd.url"),
    ] {
        let out = Command::new(BIN)
            .args([
                "stats-server",
                "--web.listen-address=127.0.0.1:0",
                "--security.drop-privileges=false",
                "--slurm.source=slurmrestd",
                "--slurm.slurmrestd.api-version=v0.0.37",
                &data,
            ])
            .args(args)
            // No slurm.conf: the cluster is `slurm-0`, whatever this host runs.
            .env("SLURM_CONF", "/nonexistent/slurm.conf")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        // Said of the one Slurm cluster the flags describe.
        assert!(
            err.contains(&format!("ceems: error: clusters: `slurm-0`: {want}")),
            "{err}"
        );
    }
}

#[test]
fn a_database_url_that_cannot_work_stops_start_up_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let data = format!("--storage.data.path={}", dir.path().display());
    let port = free_port();
    for (args, want) in [
        (
            vec!["--storage.database-url=mysql://db/ceems".to_owned()],
            "--storage.database-url `mysql://db/ceems`: expected postgres://… or postgresql://… (empty: SQLite in --storage.data.path)".to_owned(),
        ),
        (
            vec![
                "--storage.database-url=postgres://ceems@db/ceems".to_owned(),
                "--storage.data.backup.path=/var/backups/ceems".to_owned(),
            ],
            "--storage.data.backup.path backs up the SQLite file; with --storage.database-url, back PostgreSQL up with its own tools (pg_dump, base backups)".to_owned(),
        ),
        // Nothing listens there: the server says which database it could not reach, and
        // the password stays out of the message.
        (
            vec![format!("--storage.database-url=postgres://ceems:secret@127.0.0.1:{port}/jobs")],
            format!("cannot open the database: postgresql database jobs on 127.0.0.1:{port} as ceems: pool timed out"),
        ),
    ] {
        let out = Command::new(BIN)
            .args([
                "stats-server",
                "--web.listen-address=127.0.0.1:0",
                "--security.drop-privileges=false",
                &data,
            ])
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains(&format!("ceems: error: {want}")), "{err}");
        assert!(!err.contains("secret"), "{err}");
    }
}

#[test]
fn bad_config_is_an_error_naming_key_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    for (text, key) in [
        ("[exporter.web]\nlisten-adress = \":1\"\n", "listen-adress"),
        (
            "[exporter.collector.slurm]\npsi-metrics = \"yes\"\n",
            "psi-metrics",
        ),
        ("[exporter.collector]\ntimeout = \"soon\"\n", "timeout"),
        ("[exporter.collector.slurmm]\nenabled = true\n", "slurmm"),
    ] {
        std::fs::write(&file, text).unwrap();
        let out = Command::new(BIN)
            .args(["exporter", "--web.listen-address=127.0.0.1:1"])
            .arg(format!("--config.file={}", file.display()))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text}: accepted");
        assert!(
            err.contains(key),
            "{text}: error does not name `{key}`: {err}"
        );
        assert!(
            err.contains("bad.toml"),
            "{text}: error does not name the file: {err}"
        );
    }
}

#[test]
fn example_config_documents_every_key_and_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ceems.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    for (sub, opts) in [
        ("exporter", ceems::cmd::exporter::opts()),
        ("redfish-proxy", ceems::cmd::redfish_proxy::opts()),
        ("stats-server", ceems::cmd::stats_server::opts()),
        ("lb", ceems::cmd::lb::opts()),
    ] {
        for opt in opts {
            if opt.hidden {
                // CEEMS's test flags, accepted on the command line only.
                continue;
            }
            if opt.kind == ceems::config::Kind::FileOnly {
                // Tables and arrays of tables: shown (commented) with their header.
                assert!(
                    text.contains(&format!("[{sub}.{}]", opt.key)),
                    "examples/ceems.toml does not show [{sub}.{}] or [[{sub}.{}]]",
                    opt.key,
                    opt.key
                );
                continue;
            }
            let last = opt.key.rsplit('.').next().unwrap();
            let table = opt.key.rsplit_once('.').map(|(t, _)| t).unwrap_or("");
            let section = text
                .split(&format!("[{sub}.{table}]\n"))
                .nth(1)
                .unwrap_or_else(|| panic!("no [{sub}.{table}] in examples/ceems.toml"));
            let section = section.split("\n[").next().unwrap();
            assert!(
                section.contains(&format!("{last} = ")),
                "examples/ceems.toml does not document {sub}.{}",
                opt.key
            );
        }
    }
    // The example is the defaults: loading it must succeed and change nothing.
    let out = Command::new(BIN)
        .args(["exporter", "--web.listen-address=not-an-address"])
        .arg(format!("--config.file={}", path.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid listen address"), "{err}");
    let out = Command::new(BIN)
        .args(["redfish-proxy", "--web.listen-address=not-an-address"])
        .arg(format!("--config.file={}", path.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid listen address"), "{err}");
    let out = Command::new(BIN)
        .args(["stats-server", "--web.listen-address=not-an-address"])
        .arg(format!("--config.file={}", path.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid listen address"), "{err}");
}

/// Starts a stats-server with `args` on a fresh data directory, which must refuse to start;
/// returns what it said.
fn refused_stats_server(args: &[&str]) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .arg("stats-server")
        .args(args)
        .arg(format!("--storage.data.path={}", tmp.path().display()))
        .arg(format!("--web.listen-address=127.0.0.1:{}", free_port()))
        .arg("--security.drop-privileges=false")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{err}");
    err
}

/// A Prometheus URL without a scheme is refused at start, naming the fix, instead of
/// starting and failing at each update.
#[test]
fn a_prometheus_url_without_scheme_is_refused_at_start() {
    let err = refused_stats_server(&["--prometheus.url=localhost:9090"]);
    assert!(
        err.contains("--prometheus.url") && err.contains("write it as http://localhost:9090"),
        "{err}"
    );
}

/// A Slurm run-as user named on purpose that the host lacks is refused at start: sacct would
/// otherwise run as this process's user and list only its jobs, with an info line to say so.
#[test]
fn an_unknown_slurm_run_as_user_is_refused_at_start() {
    let err = refused_stats_server(&["--slurm.run-as-user=nosuchuser-ceems"]);
    assert!(
        err.contains("no user `nosuchuser-ceems` on this host"),
        "{err}"
    );
}

/// One stats-server per SQLite directory: a second one refuses, naming the first's PID.
#[test]
fn a_second_stats_server_on_one_sqlite_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let data = format!("--storage.data.path={}", tmp.path().display());
    let args = [
        data.as_str(),
        "--security.drop-privileges=false",
        "--slurm.sacctmgr.path=",
        "--slurm.run-as-user=",
        // `true` lists no jobs: the server's health does not hang on slurmdbd being up now.
        "--slurm.sacct.path=true",
    ];
    let first = common::start_subcommand("stats-server", tmp.path(), &args, &[]);
    let out = Command::new(BIN)
        .arg("stats-server")
        .args(args)
        .arg(format!("--web.listen-address=127.0.0.1:{}", free_port()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let pid = first.child.0.id();
    assert!(
        err.contains(&format!("another stats-server (pid {pid}) uses")),
        "{err}"
    );
    // Once the first is gone, the directory is free again: a new server starts and answers.
    drop(first);
    let again = common::start_subcommand("stats-server", tmp.path(), &args, &[]);
    assert_eq!(again.get("/health").trim(), "OK");
}

/// A data path that is a file is named as such, and each OS error is said once.
#[test]
fn a_data_path_that_is_a_file_is_named_as_such() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("not-a-dir");
    std::fs::write(&file, "").unwrap();
    let out = Command::new(BIN)
        .arg("stats-server")
        .arg(format!("--storage.data.path={}", file.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{}", free_port()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("not-a-dir is not a directory"), "{err}");
    assert!(!err.contains("File exists"), "{err}");
}

/// Every option's environment variable is `CEEMS_<SUBCOMMAND>_<FLAG>`; the one CEEMS named
/// otherwise is still read, and its use logged as deprecated.
#[test]
fn environment_variables_follow_one_pattern_and_the_old_one_still_works() {
    let run = |var: &str, file: &str| {
        let out = Command::new(BIN)
            .env(var, file)
            .args([
                "exporter",
                "--collector.redfish",
                "--web.listen-address=127.0.0.1:0",
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let new = run(
        "CEEMS_EXPORTER_COLLECTOR_REDFISH_CONFIG_FILE",
        "/nonexistent/new.yml",
    );
    assert!(
        new.contains("/nonexistent/new.yml") && !new.contains("deprecated"),
        "{new}"
    );
    let old = run(
        "CEEMS_EXPORTER_REDFISH_COLL_CONFIG_FILE",
        "/nonexistent/old.yml",
    );
    assert!(old.contains("/nonexistent/old.yml"), "{old}");
    assert!(
        old.contains("CEEMS_EXPORTER_REDFISH_COLL_CONFIG_FILE is deprecated, use CEEMS_EXPORTER_COLLECTOR_REDFISH_CONFIG_FILE"),
        "{old}"
    );
    let help = Command::new(BIN)
        .args(["exporter", "--help"])
        .output()
        .unwrap();
    // Wrapped lines joined: `[env:` and its name may sit on two lines.
    let help = String::from_utf8_lossy(&help.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let vars: Vec<&str> = help
        .split("[env: ")
        .skip(1)
        .map(|rest| rest.split('=').next().unwrap())
        .collect();
    assert!(vars.len() > 50, "{vars:?}");
    for var in vars {
        assert!(
            // GOMAXPROCS: CEEMS's own variable for --runtime.gomaxprocs.
            var.starts_with("CEEMS_EXPORTER_") || var == "CEEMS_CONFIG_FILE" || var == "GOMAXPROCS",
            "{var}"
        );
    }
}

/// `--lb.owner-only` cannot be kept with ownership asked of the API, whose `/units/verify`
/// lets a project's members through: the lb refuses to start, saying so.
#[test]
fn the_lb_refuses_owner_only_with_ownership_from_the_api() {
    let out = Command::new(BIN)
        .args([
            "lb",
            "--lb.backend=lab=http://127.0.0.1:9",
            "--lb.owner-only",
            "--lb.ceems-api-url=http://127.0.0.1:9",
            "--web.listen-address=127.0.0.1:0",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--lb.owner-only needs ownership read from the database"),
        "{err}"
    );
}

/// A list's flag and key are taken in either number (`--lb.backends`, `backend = [...]`), and
/// an unknown key names the nearest known one.
#[test]
fn list_options_take_either_number_and_unknown_keys_get_a_suggestion() {
    let dir = tempfile::tempdir().unwrap();
    // Both spellings reach the lb's check of its backends: a bad URL is named either way.
    for (flag, file) in [
        ("--lb.backends=nonsense", None),
        (
            "--log.level=info",
            Some("[lb.lb]\nbackend = [\"nonsense\"]\n"),
        ),
    ] {
        let mut cmd = Command::new(BIN);
        cmd.args(["lb", flag, "--web.listen-address=127.0.0.1:0"]);
        if let Some(text) = file {
            let path = dir.path().join("plural.toml");
            std::fs::write(&path, text).unwrap();
            cmd.arg(format!("--config.file={}", path.display()));
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains("`nonsense`: expected CLUSTER="),
            "{flag} {file:?}: {err}"
        );
    }
    let path = dir.path().join("typo.toml");
    std::fs::write(
        &path,
        "[stats-server.prometheus]\nulr = \"http://x:9090\"\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["stats-server", &format!("--config.file={}", path.display())])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`prometheus.ulr`: unknown key; did you mean `prometheus.url`?"),
        "{err}"
    );
}

/// `-h` is a summary (where it listens, logs, the collectors' switches, what to point it at);
/// `--help` lists every option.
#[test]
fn short_help_is_a_summary_and_long_help_has_everything() {
    let help = |sub: &str, flag: &str| {
        let out = Command::new(BIN).args([sub, flag]).output().unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (short, long) = (help("exporter", "-h"), help("exporter", "--help"));
    assert!(short.lines().count() * 4 < long.lines().count(), "{short}");
    for shown in [
        "--collector.slurm[",
        "--collector.rapl[",
        "--web.listen-address",
        "--help all",
    ] {
        assert!(short.contains(shown), "-h lacks {shown}: {short}");
    }
    assert!(!short.contains("--collector.slurm.psi-metrics"), "{short}");
    assert!(long.contains("--collector.slurm.psi-metrics"));
    let stats = help("stats-server", "-h");
    assert!(stats.contains("--prometheus.url") && stats.contains("--slurm.cluster-id"));
    assert!(!stats.contains("--prometheus.max-batch"), "{stats}");
    let proxy = help("redfish-proxy", "-h");
    assert!(
        proxy.contains("--redfish.target") && proxy.contains("--redfish.bmc-network"),
        "{proxy}"
    );
}
