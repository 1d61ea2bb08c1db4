//! Slurm's end-of-job mail on the real Slurm lab: slurmctld's MailProg is `ceems mailprog`
//! (through `examples/slurm/mailprog.sh`'s pattern), a job submitted with
//! `--mail-type=END --mail-user=alice@localhost` ends, and the message that reaches a real SMTP
//! server (aiosmtpd) is Slurm's, with the job's report appended. The stats-server's periodic
//! update runs once an hour, so the report comes from its on-demand path.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::lab::{
    lab, prometheus_scraping, prometheus_tools, start_stats_server_every, submit, wait_until,
    CancelOnDrop, LabProgram,
};
use common::mail::{aiosmtpd, SmtpSink};
use common::{runnable, start_exporter};

/// The path slurmctld runs (`scripts/slurm-lab.sh` sets it); put back to a no-op when dropped.
const MAILPROG: &str = "/run/ceems-lab/mailprog";
const IDLE: &str = "#!/bin/sh\nexit 0\n";

#[test]
fn slurm_s_end_of_job_mail_carries_the_job_s_report() {
    if !runnable(
        "slurm_mail_lab",
        lab()
            .and_then(|_| prometheus_tools())
            .and_then(|_| aiosmtpd()),
    ) {
        return;
    }
    let exporter = start_exporter(Path::new("/"), &["--collector.slurm"]);
    let prom = prometheus_scraping(exporter.port);
    let (server, _data) = start_stats_server_every(&prom.url(), "1h");

    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sink = SmtpSink::start(&tmp.path().join("smtp"));
    let (config, log) =
        sink.mailprog_config(tmp.path(), &server.url(""), "Slurm <slurm@lab.example>");
    // As examples/slurm/mailprog.sh, with this build and this test's config.
    let _mailprog = LabProgram::install(
        MAILPROG,
        &format!(
            "#!/bin/sh\nexec {} mailprog --config.file={} \"$@\" 2>>{}\n",
            env!("CARGO_BIN_EXE_ceems"),
            config.display(),
            log.display()
        ),
        IDLE,
    );

    let job = submit(
        "alice",
        "-J 'mailed <b>' -c 1 --mem=100M --time=10 --mail-type=END --mail-user=alice@localhost --wrap 'sleep 12'",
    );
    let _cancel = CancelOnDrop(vec![job.clone()]);
    wait_until("Slurm's mail", Duration::from_secs(150), || {
        !sink.received().is_empty()
    });
    let got = sink.received();
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(got.len(), 1, "{got:#?}\n{log}");
    let m = &got[0];
    println!("{}\n--- mailprog's log:\n{log}", m.text());
    assert_eq!(m.rcpt(), ["alice@localhost"]);
    let subject = m.envelope["subject"].as_str().unwrap_or("");
    assert!(
        subject.contains(&format!("Job_id={job} ")) && subject.contains("Ended"),
        "{subject}"
    );
    let text = m.text();
    // Slurm's line, then the report: its header, state and facts, and the link.
    assert!(text.starts_with("Slurm Job_id="), "{text}");
    assert!(
        text.contains(&format!("Job {job} \"mailed <b>\" on lab")),
        "{text}"
    );
    assert!(text.contains("COMPLETED (exit code 0:0)"), "{text}");
    assert!(text.contains("\n  User       alice\n"), "{text}");
    assert!(
        text.contains(&format!(
            "Report page: https://ceems.lab.example/report/lab/{job}"
        )),
        "{text}"
    );
    assert!(!text.contains("report is not available"), "{text}");
    // The stats-server learned of the job on demand, with its aggregates.
    let body = ureq::get(&server.url(&format!("/report/lab/{job}.json")))
        .set("X-Grafana-User", "alice")
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["data"]["job"]["aggregates_status"], "done", "{body}");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(sink.received().len(), 1, "a second mail");
}
