//! OpenPBS end to end on a real PBS complex (`scripts/openpbs-lab.sh`: OpenPBS built from the
//! vendored source, its `pbs_cgroups` hook on this machine's cgroup v1 hierarchies). Jobs are
//! submitted with `qsub` by alice: a job array and a job that asks for mail at its end. The
//! exporter sees each running job under its real id with the CPU time its cgroup holds, the
//! array's sub-jobs as separate units, and ended jobs leave; the stats-server ingests the
//! server's real accounting records (checked against `qstat -x -f -F json`); the end-of-job
//! mail, through the server's `mailer` (`ceems mailprog`), carries the job's report to a real
//! SMTP server (aiosmtpd).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::lab::{lab_script, prometheus_scraping, prometheus_tools, wait_until, LabProgram};
use common::mail::{aiosmtpd, SmtpSink};
use common::{api_get, label_of, name_of, parse_series, read_number, runnable, unit_value};
use serde_json::Value;

const PBS_BIN: &str = "/opt/pbs/bin";
/// The server's `mailer` (`scripts/openpbs-lab.sh` sets it); put back to a no-op when dropped.
const MAILER: &str = "/run/ceems-lab/pbs-mailer";
const IDLE: &str = "#!/bin/sh\ncat >/dev/null\nexit 0\n";
const ACCOUNTING: &str = "/var/spool/pbs/server_priv/accounting";
const CPUACCT_JOBS: &str = "/sys/fs/cgroup/cpuacct/pbs_jobs.service/jobid";
/// Burns its first argument's CPU seconds, then sleeps its second's.
const BURNER: &str = "/tmp/ceems-pbs-burn.py";

/// A PBS command as `user`, from /tmp; its trimmed stdout.
fn pbs(user: &str, program: &str, args: &[&str]) -> String {
    let out = Command::new("runuser")
        .args(["-u", user, "--", &format!("{PBS_BIN}/{program}")])
        .args(args)
        .current_dir("/tmp")
        .output()
        .expect("runuser");
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `qsub` as alice, with arguments that hold no spaces; the job id.
fn qsub(args: &str) -> String {
    pbs("alice", "qsub", &args.split(' ').collect::<Vec<_>>())
}

fn qstat_json(id: &str) -> Value {
    let out = pbs("root", "qstat", &["-x", "-t", "-f", "-F", "json", id]);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v["Jobs"][id].clone()
}

fn job_state(id: &str) -> String {
    qstat_json(id)["job_state"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Deletes the jobs still there when the test ends.
struct QdelOnDrop(Vec<String>);

impl Drop for QdelOnDrop {
    fn drop(&mut self) {
        for id in &self.0 {
            let _ = Command::new(format!("{PBS_BIN}/qdel"))
                .args(["-W", "force", id])
                .output();
        }
    }
}

fn units(server: &common::Running) -> Vec<Value> {
    let path = "/api/v1/units/admin?from=0&field=uuid&field=username&field=project&field=groupname&field=partition&field=state&field=exit_code&field=alloc_cpus&field=alloc_mem_bytes&field=elapsed_seconds&field=resource_manager&field=time_limit_seconds&field=nodes";
    api_get(server, path, "root")["data"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// A running job's CPU seconds as its cgroup holds them.
fn kernel_cpu(id: &str) -> Option<f64> {
    let usage = Path::new(CPUACCT_JOBS).join(id).join("cpuacct.usage");
    usage.exists().then(|| read_number(&usage) / 1e9)
}

#[test]
fn pbs_jobs_from_qsub_to_the_scrape_the_database_and_the_mail() {
    if !runnable(
        "openpbs_lab",
        lab_script("openpbs-lab.sh")
            .and_then(|_| prometheus_tools())
            .and_then(|_| aiosmtpd()),
    ) {
        return;
    }
    std::fs::write(
        BURNER,
        "import sys, time\nwhile time.process_time() < float(sys.argv[1]):\n    pass\ntime.sleep(float(sys.argv[2]))\n",
    )
    .unwrap();
    std::fs::set_permissions(BURNER, std::fs::Permissions::from_mode(0o644)).unwrap();

    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exporter = common::start_exporter(
        Path::new("/"),
        &[
            "--collector.openpbs",
            "--collector.cgroups.force-version=v1",
            "--web.disable-exporter-metrics",
        ],
    );
    let prom = prometheus_scraping(exporter.port);
    // The stats-server reads the server's log as nobody (the lab's ACL lets it through
    // server_priv) and asks qstat for single jobs.
    let data = tempfile::tempdir().unwrap();
    std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let config = data.path().join("stats.toml");
    std::fs::write(
        &config,
        format!(
            "[stats-server.web]\nadmin-users = [\"root\"]\n\n[[stats-server.clusters]]\nid = \"pbslab\"\nmanager = \"openpbs\"\nopenpbs-accounting-dir = \"{ACCOUNTING}\"\nopenpbs-bin-dir = \"{PBS_BIN}\"\n"
        ),
    )
    .unwrap();
    let server = common::start_subcommand(
        "stats-server",
        data.path(),
        &[
            &format!("--config.file={}", config.display()),
            &format!("--storage.data.path={}", data.path().join("db").display()),
            &format!("--prometheus.url={}", prom.url()),
            "--storage.update-interval=2s",
            "--storage.first-window=1h",
            "--prometheus.cutoff=5s",
            "--prometheus.scrape-interval=1s",
        ],
        &[],
    );

    // The server runs its mailer in the complex's network namespace: the mailer goes back to
    // this test's to reach the stats-server and the SMTP server on loopback.
    let sink = SmtpSink::start(&tmp.path().join("smtp"));
    let (mail_config, log) =
        sink.mailprog_config(tmp.path(), &server.url(""), "PBS <pbs@lab.example>");
    let script = format!(
        "#!/bin/sh\nexec nsenter --net=/proc/{}/ns/net {} mailprog --config.file={} \"$@\" 2>>{}\n",
        std::process::id(),
        env!("CARGO_BIN_EXE_ceems"),
        mail_config.display(),
        log.display()
    );
    let _mailer = LabProgram::install(MAILER, &script, IDLE);

    // Two sub-jobs fill the node's two CPUs; the mailed job runs once they are done.
    let quiet = "-o /dev/null -e /dev/null -- /usr/bin/python3";
    let array = qsub(&format!(
        "-J 1-2 -N arr -l select=1:ncpus=1:mem=200mb -l walltime=00:05:00 {quiet} {BURNER} 2 10"
    ));
    let mut guard = QdelOnDrop(vec![array.clone()]);
    let mailed = qsub(&format!(
        "-N mailed -m e -M alice@localhost -l select=1:ncpus=1 -l walltime=00:05:00 {quiet} {BURNER} 1 8"
    ));
    guard.0.push(mailed.clone());
    let (seq, server_name) = array.split_once("[]").expect("an array id");
    let subs: Vec<String> = (1..=2)
        .map(|i| format!("{seq}[{i}]{server_name}"))
        .collect();

    // Both sub-jobs run at once, each its own unit with its cgroup's CPU time.
    wait_until("both sub-jobs burning", Duration::from_secs(90), || {
        subs.iter().all(|s| kernel_cpu(s).is_some_and(|c| c >= 1.5))
    });
    let before: Vec<f64> = subs.iter().map(|s| kernel_cpu(s).unwrap()).collect();
    let series = parse_series(&exporter.get("/metrics"));
    let after: Vec<f64> = subs.iter().map(|s| kernel_cpu(s).unwrap()).collect();
    for (i, sub) in subs.iter().enumerate() {
        let scraped = unit_value(&series, "ceems_compute_unit_cpu_user_seconds_total", sub)
            .unwrap_or_else(|| panic!("no sub-job {sub} in the scrape"))
            + unit_value(&series, "ceems_compute_unit_cpu_system_seconds_total", sub).unwrap();
        assert!(
            scraped >= before[i] * 0.95 && scraped <= after[i] * 1.05 + 0.05,
            "{sub}: exporter {scraped} s, cgroup {} to {} s",
            before[i],
            after[i]
        );
        let manager = series
            .keys()
            .find(|k| name_of(k) == "ceems_compute_unit_cpus" && label_of(k, "uuid") == Some(sub))
            .and_then(|k| label_of(k, "manager"));
        assert_eq!(manager, Some("openpbs"), "{sub}");
        // The hook gives each sub-job one CPU of its own.
        assert_eq!(
            unit_value(&series, "ceems_compute_unit_cpus", sub),
            Some(1.0)
        );
    }
    assert_eq!(
        unit_value(&series, "ceems_compute_unit_cpus", &array),
        None,
        "the array's parent is no unit"
    );

    // The mailed job runs, ends and leaves the scrape; so do the sub-jobs.
    wait_until("the mailed job burning", Duration::from_secs(90), || {
        kernel_cpu(&mailed).is_some_and(|c| c > 0.2)
    });
    let series = parse_series(&exporter.get("/metrics"));
    assert!(
        unit_value(&series, "ceems_compute_unit_cpus", &mailed).is_some(),
        "no job {mailed} in the scrape"
    );
    wait_until("the jobs finished", Duration::from_secs(120), || {
        job_state(&mailed) == "F" && subs.iter().all(|s| job_state(s) == "F")
    });
    wait_until(
        "ended jobs leaving the scrape",
        Duration::from_secs(30),
        || {
            let series = parse_series(&exporter.get("/metrics"));
            subs.iter()
                .chain([&mailed])
                .all(|id| unit_value(&series, "ceems_compute_unit_cpus", id).is_none())
        },
    );

    // The stats-server has the server's records of them, as qstat tells them.
    let ids: Vec<&String> = subs.iter().chain([&mailed]).collect();
    wait_until(
        "the accounting records ingested",
        Duration::from_secs(60),
        || {
            let got = units(&server);
            ids.iter().all(|id| {
                got.iter()
                    .any(|u| u["uuid"] == id.as_str() && u["state"] == "COMPLETED")
            })
        },
    );
    let got = units(&server);
    for id in &ids {
        let row = got.iter().find(|u| u["uuid"] == id.as_str()).unwrap();
        let q = qstat_json(id);
        assert_eq!(row["resource_manager"], "openpbs", "{row}");
        // A sub-job's qstat has no euser/egroup: its owner is Job_Owner's user.
        let owner = q["Job_Owner"].as_str().unwrap().split('@').next().unwrap();
        assert_eq!(row["username"], owner, "{row}");
        if let Some(group) = q["egroup"].as_str() {
            assert_eq!(row["groupname"], group, "{row}");
        }
        assert_eq!(row["partition"], q["queue"], "{row}");
        assert_eq!(row["project"], q["project"], "{row}");
        let walltime = q["resources_used"]["walltime"].as_str().unwrap();
        let secs: Vec<u64> = walltime.split(':').map(|p| p.parse().unwrap()).collect();
        assert_eq!(
            row["elapsed_seconds"].as_u64(),
            Some(secs[0] * 3600 + secs[1] * 60 + secs[2]),
            "{row} vs walltime {walltime}"
        );
        assert_eq!(row["time_limit_seconds"].as_u64(), Some(300), "{row}");
        assert_eq!(row["exit_code"], format!("{}:0", q["Exit_status"]), "{row}");
        assert_eq!(row["alloc_cpus"].as_u64(), Some(1), "{row}");
        assert_eq!(row["nodes"], "pbslab", "{row}");
    }
    let sub_row = got.iter().find(|u| u["uuid"] == subs[0].as_str()).unwrap();
    assert_eq!(
        sub_row["alloc_mem_bytes"].as_u64(),
        Some(200 << 20),
        "{sub_row}"
    );
    // Each record once: the log read again at every update doubles nothing.
    for id in &ids {
        assert_eq!(
            got.iter().filter(|u| u["uuid"] == id.as_str()).count(),
            1,
            "{id}"
        );
    }
    // The log is also what a user sees of their own jobs.
    let mine = api_get(&server, "/api/v1/units?from=0&field=uuid", "alice")["data"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        mine.iter().any(|u| u["uuid"] == mailed.as_str()),
        "{mine:?}"
    );
    let theirs = api_get(&server, "/api/v1/units?from=0&field=uuid", "bob")["data"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !theirs.iter().any(|u| u["uuid"] == mailed.as_str()),
        "{theirs:?}"
    );

    // The end-of-job mail: PBS's message, then the job's report.
    let start = std::time::Instant::now();
    while sink.received().is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no mail; mailprog's log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let got = sink.received();
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(got.len(), 1, "{got:#?}\n{log}");
    let m = &got[0];
    let text = m.text();
    println!("{text}\n--- mailprog's log:\n{log}");
    assert_eq!(m.rcpt(), ["alice@localhost"]);
    assert_eq!(
        m.envelope["subject"].as_str(),
        Some(format!("PBS JOB {mailed}").as_str())
    );
    assert!(
        text.starts_with(&format!("PBS Job Id: {mailed}\n")),
        "{text}"
    );
    assert!(text.contains("Execution terminated"), "{text}");
    assert!(text.contains("COMPLETED (exit code 0:0)"), "{text}");
    assert!(text.contains("\n  User       alice\n"), "{text}");
    assert!(
        text.contains(&format!(
            "Report page: https://ceems.lab.example/report/pbslab/{mailed}"
        )),
        "{text}"
    );
    assert!(!text.contains("report is not available"), "{text}");
    // The report's figures came from Prometheus, as for a Slurm job.
    let report = api_get(&server, &format!("/report/pbslab/{mailed}.json"), "alice");
    assert_eq!(
        report["data"]["job"]["aggregates_status"], "done",
        "{report:#}"
    );
}
