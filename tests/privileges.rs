//! The privilege helper on the real kernel (needs root): the exporter started as root runs as
//! nobody with an empty effective set and exactly the declared capabilities permitted, and
//! still reads another user's job environment because the read raises CAP_SYS_PTRACE on its
//! own short-lived thread. Without the capabilities, the same read fails.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, KillOnDrop, Running};

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

/// A process of user `daemon` with `SLURM_JOB_ID` in its environment, in a fake cgroup v2
/// tree whose job directory has an opaque name (Slurm 26.05): the exporter must read the
/// process's environ to know the job.
fn foreign_job(root: &Path, job_id: &str) -> KillOnDrop {
    let child = Command::new("setpriv")
        .args(["--reuid=daemon", "--regid=daemon", "--clear-groups", "--"])
        .args(["env", &format!("SLURM_JOB_ID={job_id}"), "sleep", "120"])
        .spawn()
        .expect("setpriv");
    let job = KillOnDrop(child);
    let dir = root.join("system.slice/slurmstepd.scope/0f6c1d2e-opaque");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("cgroup.procs"), format!("{}\n", job.0.id())).unwrap();
    std::fs::write(dir.join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
    std::fs::write(
        dir.join("cpu.stat"),
        "usage_usec 1000\nuser_usec 600\nsystem_usec 400\n",
    )
    .unwrap();
    std::fs::write(dir.join("memory.current"), "4096\n").unwrap();
    // Readable by nobody, as /sys/fs/cgroup is.
    for p in [
        root.to_path_buf(),
        root.join("system.slice"),
        root.join("system.slice/slurmstepd.scope"),
        dir.clone(),
    ] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // The environ of a process that has just exec'd may still be setpriv's: wait for sleep.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", job.0.id())).unwrap_or_default();
        if cmdline.starts_with(b"sleep") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    job
}

/// `ceems`, run through `prefix` (e.g. setpriv and its options) when one is given.
fn ceems(prefix: &[&str]) -> Command {
    let mut cmd = Command::new(
        prefix
            .first()
            .copied()
            .unwrap_or(env!("CARGO_BIN_EXE_ceems")),
    );
    if !prefix.is_empty() {
        cmd.args(&prefix[1..]).arg(env!("CARGO_BIN_EXE_ceems"));
    }
    cmd
}

fn start(prefix: &[&str], args: &[&str]) -> Running {
    let port = free_port();
    let child = ceems(prefix)
        .arg("exporter")
        .args(args)
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .spawn()
        .expect("start exporter");
    let mut running = Running {
        child: KillOnDrop(child),
        port,
    };
    let start = Instant::now();
    while ureq::get(&running.url("/health")).call().is_err() {
        if let Ok(Some(status)) = running.child.try_wait() {
            panic!("exporter exited at start: {status}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "exporter did not answer"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    running
}

fn status_field(pid: u32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

fn mask(caps: &[caps::Capability]) -> u64 {
    caps.iter().fold(0, |m, c| m | (1u64 << c.index()))
}

#[test]
fn exporter_drops_to_nobody_and_raises_ptrace_only_to_read_a_foreign_environ() {
    if !is_root() {
        println!("SKIPPED: needs root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let cg = tmp.path().join("cgroup");
    let job = foreign_job(&cg, "4242");
    let cg_flag = format!("--path.cgroupfs={}", cg.display());
    let args = [
        "--collector.slurm",
        "--collector.rapl",
        "--collector.cgroups.force-version=v2",
        "--path.procfs=/proc",
        cg_flag.as_str(),
    ];

    let exporter = start(
        &[],
        &[&args[..], &["--security.run-as-user=nobody"]].concat(),
    );
    let pid = exporter.child.id();
    assert_eq!(status_field(pid, "Uid"), "65534\t65534\t65534\t65534");
    assert_eq!(status_field(pid, "CapEff"), "0000000000000000");
    assert_eq!(status_field(pid, "CapInh"), "0000000000000000");
    assert_eq!(status_field(pid, "CapAmb"), "0000000000000000");
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    // Exactly what the enabled collectors (cpu, meminfo, rapl, slurm) declare.
    let declared = declared_by(&["cpu", "meminfo", "rapl", "slurm"]);
    assert_eq!(
        u64::from_str_radix(&status_field(pid, "CapPrm"), 16).unwrap(),
        mask(&declared)
    );
    let body = exporter.get("/metrics");
    assert!(
        body.contains("uuid=\"4242\""),
        "the job of user daemon was not found:\n{body}"
    );
    // Still no capability in effect after the read, but on the one privileged thread that
    // made it, which stays for the next scrape's reads.
    assert_eq!(status_field(pid, "CapEff"), "0000000000000000");
    exporter.get("/metrics");
    let mut holders = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        if field("CapEff") != "0000000000000000" {
            holders.push((field("Name"), field("CapEff")));
        }
    }
    // One thread per collector's capability set, each holding that set alone.
    holders.sort();
    let mut expected: Vec<(String, String)> = ["rapl", "slurm"]
        .iter()
        .map(|c| {
            let set = format!("{:016x}", mask(&declared_by(&[c])));
            ("ceems-privilege".to_owned(), set)
        })
        .collect();
    expected.sort();
    assert_eq!(
        holders, expected,
        "threads holding capabilities after two scrapes"
    );
    drop(exporter);

    // The same exporter started as nobody with no capabilities cannot read that environ.
    let unprivileged = start(
        &[
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "--inh-caps=-all",
            "--",
        ],
        &args,
    );
    let body = unprivileged.get("/metrics");
    assert!(
        body.contains("ceems_scrape_collector_success{collector=\"slurm\"} 1"),
        "{body}"
    );
    assert!(
        !body.contains("uuid=\"4242\""),
        "an unprivileged exporter read another user's environ:\n{body}"
    );
    drop(job);
}

fn declared_by(collectors: &[&str]) -> Vec<caps::Capability> {
    ceems::registry::COLLECTORS
        .iter()
        .filter(|s| collectors.contains(&s.name))
        .flat_map(|s| s.capabilities.iter().copied())
        .collect()
}

fn check_privileges(prefix: &[&str], args: &[&str]) -> (i32, serde_json::Value) {
    check_privileges_of("exporter", prefix, args)
}

fn check_privileges_of(sub: &str, prefix: &[&str], args: &[&str]) -> (i32, serde_json::Value) {
    let out = ceems(prefix)
        .args(["check-privileges", "--output=json", sub])
        .args(args)
        .output()
        .expect("run check-privileges");
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), json)
}

/// The part of a check-privileges report named `name`.
fn part(report: &serde_json::Value, name: &str) -> serde_json::Value {
    report["parts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["part"] == name)
        .unwrap_or_else(|| panic!("no part `{name}`: {report:#}"))
        .clone()
}

fn names(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn check_privileges_as_root_as_bare_nobody_and_as_nobody_with_ambient_capabilities() {
    if !is_root() {
        println!("SKIPPED: needs root");
        return;
    }
    // A process of another user for the environ test to read.
    let tmp = tempfile::tempdir().unwrap();
    let _job = foreign_job(&tmp.path().join("cgroup"), "77");
    let args = ["--collector.slurm", "--web.listen-address=127.0.0.1:0"];

    let (code, report) = check_privileges(&[], &args);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["ok"], true);
    let slurm = part(&report, "collector slurm");
    assert_eq!(slurm["test"]["outcome"], "ok", "{slurm:#}");

    let nobody = [
        "setpriv",
        "--reuid=nobody",
        "--regid=nogroup",
        "--clear-groups",
        "--",
    ];
    let (code, report) = check_privileges(&nobody, &args);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["ok"], false);
    let missing = names(&report["missing"]);
    assert!(
        missing.contains(&"CAP_SYS_PTRACE".to_owned()),
        "{missing:?}"
    );
    assert!(
        missing.contains(&"CAP_DAC_READ_SEARCH".to_owned()),
        "{missing:?}"
    );
    let fix = report["fix"]["systemd"][0].as_str().unwrap();
    assert_eq!(
        fix,
        "AmbientCapabilities=CAP_DAC_READ_SEARCH CAP_SYS_PTRACE"
    );
    assert!(report["fix"]["setcap"]
        .as_str()
        .unwrap()
        .starts_with("setcap 'cap_dac_read_search,cap_sys_ptrace=p' "));

    let with_caps = [
        "setpriv",
        "--reuid=nobody",
        "--regid=nogroup",
        "--clear-groups",
        "--inh-caps=+dac_read_search,+sys_ptrace",
        "--ambient-caps=+dac_read_search,+sys_ptrace",
        "--",
    ];
    let (code, report) = check_privileges(&with_caps, &args);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(
        names(&report["process"]["ambient"]),
        ["CAP_DAC_READ_SEARCH", "CAP_SYS_PTRACE"]
    );
}

/// The stats-server runs sacct as the slurm user: `check-privileges stats-server` runs a
/// stand-in sacct as another user (daemon, which every Debian system has) the same way.
#[test]
fn check_privileges_of_the_stats_server_runs_sacct_as_another_user() {
    if !is_root() {
        println!("SKIPPED: needs root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let sacct = tmp.path().join("sacct");
    std::fs::write(&sacct, "#!/bin/sh\n[ \"$(id -un)\" = daemon ] || { echo \"ran as $(id -un)\" >&2; exit 3; }\necho 'slurm 22.05.8'\n").unwrap();
    std::fs::set_permissions(&sacct, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let sacct_flag = format!("--slurm.sacct.path={}", sacct.display());
    // A database directory every user of the test may write.
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let data_flag = format!("--storage.data.path={}", data.display());
    let args = [
        "--slurm.run-as-user=daemon",
        sacct_flag.as_str(),
        data_flag.as_str(),
        "--web.listen-address=127.0.0.1:0",
    ];

    // Root: dropped to nobody keeping CAP_SETUID/CAP_SETGID, the stand-in runs as daemon.
    let (code, report) = check_privileges_of("stats-server", &[], &args);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(
        part(&report, "slurm commands as daemon")["test"]["outcome"],
        "ok",
        "{report:#}"
    );

    let nobody = [
        "setpriv",
        "--reuid=nobody",
        "--regid=nogroup",
        "--clear-groups",
        "--",
    ];
    let (code, report) = check_privileges_of("stats-server", &nobody, &args);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(names(&report["missing"]), ["CAP_SETGID", "CAP_SETUID"]);
    assert_eq!(
        part(&report, "slurm commands as daemon")["test"]["outcome"],
        "denied",
        "{report:#}"
    );
    let sudoers = report["fix"]["sudoers"][0].as_str().unwrap();
    assert!(sudoers.ends_with(&sacct.display().to_string()), "{sudoers}");

    let with_caps = [
        "setpriv",
        "--reuid=nobody",
        "--regid=nogroup",
        "--clear-groups",
        "--inh-caps=+setuid,+setgid",
        "--ambient-caps=+setuid,+setgid",
        "--",
    ];
    let (code, report) = check_privileges_of("stats-server", &with_caps, &args);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(
        part(&report, "slurm commands as daemon")["test"]["outcome"],
        "ok",
        "{report:#}"
    );

    // With slurmrestd as the source no command runs: nothing to test or to need, as nobody.
    let rest = [
        &args[..],
        &[
            "--slurm.source=slurmrestd",
            "--slurm.slurmrestd.url=unix:/run/slurmrestd.sock",
        ],
    ]
    .concat();
    let (code, report) = check_privileges_of("stats-server", &nobody, &rest);
    assert_eq!(code, 0, "{report:#}");
    assert!(names(&report["missing"]).is_empty(), "{report:#}");
    assert!(
        !report["parts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["part"] == "slurm commands as daemon"),
        "{report:#}"
    );
}

#[test]
fn check_privileges_usage_errors_exit_2() {
    for args in [
        &["check-privileges"][..],
        &["check-privileges", "exporter", "--bogus"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ceems"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}

/// First start as root on a fresh node: the data and backup directories do not exist yet. The
/// server creates them for the user it drops to, then opens its database there as that user.
#[test]
fn stats_server_first_start_as_root_creates_its_directories_for_nobody() {
    use std::os::unix::fs::MetadataExt;
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = tmp.path().join("var/lib/ceems");
    let backups = tmp.path().join("backups/ceems");
    let mut command = Command::new(env!("CARGO_BIN_EXE_ceems"));
    command
        .args([
            "stats-server",
            &format!("--storage.data.path={}", data.display()),
            &format!("--storage.data.backup.path={}", backups.display()),
            "--storage.data.backup.interval=1s",
            "--slurm.sacct.path=/bin/true",
            "--slurm.cluster-id=lab",
        ])
        .stdout(Stdio::null());
    // Before the fix it stopped here: "cannot create … as uid 65534: Permission denied".
    let _server = common::start_listening(command, "stats-server");
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    for dir in [
        tmp.path().join("var"),
        tmp.path().join("var/lib"),
        data.clone(),
        backups.clone(),
    ] {
        let meta = std::fs::metadata(&dir).unwrap();
        assert_eq!(
            (meta.uid(), meta.mode() & 0o777),
            (nobody.uid.as_raw(), 0o750),
            "{}",
            dir.display()
        );
    }
    assert_eq!(
        std::fs::metadata(tmp.path()).unwrap().uid(),
        0,
        "an existing directory changed hands"
    );
    let db = std::fs::metadata(data.join("ceems.db")).expect("the database");
    assert_eq!(db.uid(), nobody.uid.as_raw());
    let start = Instant::now();
    while std::fs::read_dir(&backups).unwrap().next().is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no backup written in 10 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `check-privileges lb` says whether the user lb runs as can read the stats-server's
/// database, and how to fix it when it cannot.
#[test]
fn check_privileges_lb_tests_the_database_as_the_daemons_user() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let db = dir.path().join("ceems.db");
    std::fs::write(&db, b"").unwrap();
    let check = || {
        Command::new(env!("CARGO_BIN_EXE_ceems"))
            .args([
                "check-privileges",
                "lb",
                "--lb.backend=lab=http://127.0.0.1:9090",
                "--web.listen-address=127.0.0.1:0",
            ])
            .arg(format!("--storage.data.path={}", dir.path().display()))
            .output()
            .unwrap()
    };
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = check();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("needs read access"), "{text}");
    // The summary names the part that failed and what to do, not an empty "Missing: -".
    let summary = text.rsplit("\n\n").next().unwrap_or_default();
    assert!(
        summary.contains("Not ready: 1 of")
            && summary.contains("the stats-server's database: the OS refused")
            && summary.contains("give the daemon's user that access"),
        "{text}"
    );
    assert!(!text.contains("Missing: -"), "{text}");
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = check();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("Everything the enabled parts need is present."),
        "{text}"
    );
    // No database at all: an error, not "everything is present".
    std::fs::remove_file(&db).unwrap();
    let out = check();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        !text.contains("Everything the enabled parts need is present."),
        "{text}"
    );
    assert!(
        text.contains("the stats-server's database: `read ") && text.contains("fix that"),
        "{text}"
    );
}

/// LSF's collector reads MIG jobs' environments (`CUDA_VISIBLE_DEVICES`, `LSB_BATCH_JID`) of
/// other users' processes: check-privileges says so for it, and tests the read.
#[test]
fn check_privileges_knows_what_the_lsf_collector_needs() {
    if !is_root() {
        println!("SKIPPED: needs root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let _job = foreign_job(&tmp.path().join("cgroup"), "78");
    let args = [
        "--collector.lsf",
        "--collector.lsf.bjobs-path=/bin/true",
        "--web.listen-address=127.0.0.1:0",
    ];
    let (code, report) = check_privileges(&[], &args);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(
        part(&report, "collector lsf")["test"]["outcome"],
        "ok",
        "{report:#}"
    );
    let nobody = [
        "setpriv",
        "--reuid=nobody",
        "--regid=nogroup",
        "--clear-groups",
        "--",
    ];
    let (code, report) = check_privileges(&nobody, &args);
    assert_eq!(code, 1, "{report:#}");
    let missing = names(&report["missing"]);
    assert_eq!(
        missing,
        ["CAP_DAC_READ_SEARCH", "CAP_SYS_PTRACE"],
        "{report:#}"
    );
    assert_ne!(
        part(&report, "collector lsf")["test"]["outcome"],
        "ok",
        "{report:#}"
    );
}

/// The k8s collector reaches the kubelet's pod-resources socket through its file mode, not a
/// capability: check-privileges connects as the daemon would, and a refusal says which ACLs
/// let the daemon's user in.
#[test]
fn check_privileges_tests_the_kubelet_socket_and_says_how_to_grant_it() {
    if !is_root() {
        println!("SKIPPED: needs root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pod-resources");
    std::fs::create_dir(&dir).unwrap();
    let socket = dir.join("kubelet.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600)).unwrap();
    let flag = format!(
        "--collector.k8s.kubelet-podresources-socket.file={}",
        socket.display()
    );
    let args = ["--collector.k8s", &flag, "--web.listen-address=127.0.0.1:0"];
    // Root that keeps its privileges reaches it; root that drops to nobody, as the exporter
    // does by default, does not.
    let kept = [&args[..], &["--security.drop-privileges=false"]].concat();
    let (_, report) = check_privileges(&[], &kept);
    assert_eq!(
        part(&report, "k8s pod-resources socket")["test"]["outcome"],
        "ok",
        "{report:#}"
    );
    let (_, report) = check_privileges(&[], &args);
    assert_eq!(
        part(&report, "k8s pod-resources socket")["test"]["outcome"],
        "denied",
        "{report:#}"
    );
    let nobody = [
        "setpriv",
        "--reuid=nobody",
        "--regid=nogroup",
        "--clear-groups",
        "--",
    ];
    let (_, report) = check_privileges(&nobody, &args);
    let test = part(&report, "k8s pod-resources socket")["test"].clone();
    assert_eq!(test["outcome"], "denied", "{report:#}");
    let error = test["error"].as_str().unwrap();
    assert!(
        error.contains(&format!("setfacl -m u:nobody:rw {}", socket.display())),
        "{error}"
    );
}

#[test]
fn check_privileges_reads_pbs_s_accounting_log_as_the_stats_server_s_user() {
    if !is_root() {
        println!("SKIPPED: needs root");
        return;
    }
    // PBS_HOME's server_priv is root's, mode 750; the log below it is world-readable.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let server_priv = tmp.path().join("server_priv");
    let log = server_priv.join("accounting");
    std::fs::create_dir_all(&log).unwrap();
    std::fs::write(log.join("20261126"), "").unwrap();
    std::fs::set_permissions(&server_priv, std::fs::Permissions::from_mode(0o750)).unwrap();
    let config = tmp.path().join("ceems.toml");
    std::fs::write(
        &config,
        format!(
            "[[stats-server.clusters]]\nid = \"pbs1\"\nmanager = \"openpbs\"\nopenpbs-accounting-dir = \"{}\"\n",
            log.display()
        ),
    )
    .unwrap();
    let args = [
        &format!("--config.file={}", config.display()) as &str,
        "--web.listen-address=127.0.0.1:0",
    ];
    let kept = [&args[..], &["--security.drop-privileges=false"]].concat();
    let (_, report) = check_privileges_of("stats-server", &[], &kept);
    assert_eq!(
        part(&report, "openpbs accounting log")["test"]["outcome"],
        "ok",
        "{report:#}"
    );
    // Dropped to nobody, as the stats-server runs: denied, and told how to grant it.
    let (code, report) = check_privileges_of("stats-server", &[], &args);
    let test = part(&report, "openpbs accounting log")["test"].clone();
    assert_eq!(test["outcome"], "denied", "{report:#}");
    assert_eq!(code, 1, "{report:#}");
    let error = test["error"].as_str().unwrap();
    assert!(
        error.contains(&format!("setfacl -m u:nobody:x {}", server_priv.display())),
        "{error}"
    );
}

/// On a node where the exporter already runs, its port is taken by it: check-privileges
/// says so and passes; a port taken by another program fails, naming it.
#[test]
fn a_port_held_by_the_running_daemon_is_not_a_failure() {
    let fixtures = common::fixtures().join("compat");
    let running = common::start_exporter(
        &fixtures,
        &[
            "--collector.disable-defaults",
            "--collector.meminfo",
            "--path.procfs=proc",
        ],
    );
    // check-privileges of an exporter listening on `port`: its exit code and listener part.
    let check = |port: u16| {
        let listen = format!("--web.listen-address=127.0.0.1:{port}");
        let (code, report) = check_privileges(
            &[],
            &[
                "--collector.disable-defaults",
                "--collector.meminfo",
                &listen,
            ],
        );
        (code, part(&report, "listener"), report)
    };
    let (code, listener, report) = check(running.port);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(listener["test"]["outcome"], "ok", "{listener:#}");
    assert!(
        listener["test"]["operation"]
            .as_str()
            .unwrap()
            .contains("held by the running ceems exporter"),
        "{listener:#}"
    );

    // Another program's port.
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (code, listener, report) = check(other.local_addr().unwrap().port());
    assert_ne!(code, 0, "{report:#}");
    assert_eq!(listener["test"]["outcome"], "error", "{listener:#}");
    let error = listener["test"]["error"].as_str().unwrap();
    assert!(
        error.contains("held by") && error.contains("privileges-"),
        "{error}"
    );
}

/// The stats-server's SQLite directory is tested as the user the daemon runs as: a root-owned
/// directory it cannot write fails the check (the daemon would exit), one it can passes, and
/// a missing one is created at start for that user.
#[test]
fn check_privileges_stats_server_tests_the_data_directory_as_the_daemons_user() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let top = tempfile::tempdir().unwrap();
    std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = top.path().join("data");
    std::fs::create_dir(&dir).unwrap();
    let args = [
        format!("--storage.data.path={}", dir.display()),
        "--slurm.sacct.path=/bin/true".to_owned(),
        "--slurm.sacctmgr.path=".to_owned(),
        "--slurm.run-as-user=".to_owned(),
        "--web.listen-address=127.0.0.1:0".to_owned(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, report) = check_privileges_of("stats-server", &[], &args);
    let data = part(&report, "the database's directory");
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(data["test"]["outcome"], "denied", "{data:#}");
    assert!(
        data["test"]["error"]
            .as_str()
            .unwrap()
            .contains("is not writable by uid 65534"),
        "{data:#}"
    );
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (code, report) = check_privileges_of("stats-server", &[], &args);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(
        part(&report, "the database's directory")["test"]["outcome"],
        "ok"
    );
    std::fs::remove_dir(&dir).unwrap();
    let (code, report) = check_privileges_of("stats-server", &[], &args);
    assert_eq!(
        code, 0,
        "a missing directory is created at start: {report:#}"
    );
}
