//! Digests from `ceems stats-server` to a real SMTP server (aiosmtpd on 127.0.0.1): two users
//! whose jobs have findings get one message each, naming only their own jobs, a user without
//! findings gets none, a refused address is skipped; a restart sends nothing again; with the
//! SMTP server down for a period the new messages arrive the next period, once. Job names with
//! markup and bytes that are not UTF-8 break neither headers nor HTML, and the HTML part is
//! rendered in headless chromium.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::browser::{browse, chromium, screenshot};
use common::mail::{aiosmtpd, Received, SmtpSink};
use common::{parse_series, runnable, start_subcommand, Running};

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// One sacct record (epoch times) of a job that ended ten minutes ago.
fn record(id: u32, user: &str, state: &str, name: &[u8]) -> Vec<u8> {
    let end = now() - 600;
    let start = end - 300;
    let mut line = format!(
        "{id}|debug|normal|physics|{user}|2001|{user}|2001|{start}|{start}|{end}|00:05:00|300|1:0|{state}|billing=1,cpu=2,mem=1G,node=1|localhost|/tmp|60|"
    )
    .into_bytes();
    line.extend_from_slice(name);
    line.push(b'\n');
    line
}

/// A stand-in sacct that prints `records` whatever it is asked.
fn write_sacct(dir: &Path, records: &[Vec<u8>]) -> PathBuf {
    std::fs::write(dir.join("sacct.txt"), records.concat()).unwrap();
    let sacct = dir.join("sacct");
    std::fs::write(
        &sacct,
        format!(
            "#!/bin/sh\nexec cat '{}'\n",
            dir.join("sacct.txt").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&sacct, std::fs::Permissions::from_mode(0o755)).unwrap();
    sacct
}

fn start_server(dir: &Path, sacct: &Path, smtp_port: u16) -> Running {
    start_subcommand(
        "stats-server",
        dir,
        &[
            &format!("--storage.data.path={}", dir.join("data").display()),
            &format!("--slurm.sacct.path={}", sacct.display()),
            "--slurm.sacctmgr.path=",
            "--slurm.run-as-user=",
            "--security.drop-privileges=false",
            "--slurm.cluster-id=lab",
            "--storage.update-interval=1s",
            "--notify.period=2s",
            "--notify.smtp.host=127.0.0.1",
            &format!("--notify.smtp.port={smtp_port}"),
            "--notify.smtp.tls=none",
            "--notify.from=HPC support <hpc@lab.example>",
            "--notify.address-template={user}@lab.example",
            "--web.external-url=https://ceems.lab.example/",
        ],
        &[],
    )
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn mail_counter(server: &Running, status: &str) -> f64 {
    parse_series(&server.get("/metrics"))
        .get(&format!(
            "ceems_stats_mail_messages_total{{status=\"{status}\"}}"
        ))
        .copied()
        .unwrap_or(0.0)
}

fn to(m: &Received) -> String {
    m.rcpt().join(",")
}

#[test]
fn each_user_gets_one_digest_of_their_own_jobs_once_across_restarts_and_an_smtp_outage() {
    if !runnable("mail", aiosmtpd()) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut sink = SmtpSink::start(&dir.join("smtp"));
    let mut records = vec![
        record(101, "alice", "FAILED", b"simulate"),
        record(
            102,
            "alice",
            "TIMEOUT",
            b"<script>alert(1)</script>\xff\xfe",
        ),
        record(103, "bob", "FAILED", b"fit"),
        record(104, "carol", "COMPLETED", b"fine"),
        record(105, "refused", "FAILED", b"nobody reads this"),
    ];
    let sacct = write_sacct(dir, &records);
    let server = start_server(dir, &sacct, sink.port);

    wait_for("two digests", Duration::from_secs(30), || {
        sink.received().len() >= 2 && mail_counter(&server, "refused") >= 1.0
    });
    // More periods pass: nothing more is sent.
    std::thread::sleep(Duration::from_secs(5));
    let got = sink.received();
    assert_eq!(got.len(), 2, "{got:#?}");
    let alice = got
        .iter()
        .find(|m| to(m) == "alice@lab.example")
        .expect("alice's digest");
    let bob = got
        .iter()
        .find(|m| to(m) == "bob@lab.example")
        .expect("bob's digest");
    for job in ["Job 101 ", "Job 102 "] {
        assert!(alice.text().contains(job), "{}", alice.text());
    }
    assert!(alice
        .text()
        .contains("https://ceems.lab.example/report/lab/101"));
    assert!(
        alice.text().contains("What to change: "),
        "{}",
        alice.text()
    );
    assert!(bob.text().contains("Job 103 "), "{}", bob.text());
    for (m, others) in [(alice, ["103", "104", "105"]), (bob, ["101", "102", "104"])] {
        for other in others {
            assert!(
                !m.raw.contains(&format!("Job {other} "))
                    && !m.text().contains(&format!("Job {other} ")),
                "{} names job {other}",
                to(m)
            );
        }
    }
    assert_eq!(mail_counter(&server, "sent"), 2.0);

    // The name with markup and bytes that are not UTF-8: escaped in HTML, one line in text,
    // and the headers are the builder's only.
    let html = alice.html();
    assert!(!html.contains("<script"), "{html}");
    assert!(
        html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{html}"
    );
    assert!(
        alice
            .text()
            .contains("\"<script>alert(1)</script>\u{fffd}\u{fffd}\""),
        "{}",
        alice.text()
    );
    let mut headers: Vec<&str> = alice.envelope["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| h.as_str())
        .collect();
    headers.sort_unstable();
    assert_eq!(
        headers,
        [
            "Auto-Submitted",
            "Content-Type",
            "Date",
            "From",
            "MIME-Version",
            "Message-ID",
            "Subject",
            "To"
        ],
        "unexpected headers"
    );
    assert_eq!(alice.envelope["subject"], "ceems: 2 jobs failed");

    // In a browser: the findings and the link are there, and nothing is loaded or run.
    if runnable("mail (chromium)", chromium()) {
        let page = dir.join("digest.html");
        std::fs::write(&page, html).unwrap();
        let url = format!("file://{}", page.display());
        let dom = browse(&url, &["--dump-dom"]);
        assert!(dom.contains("It ended in state FAILED"), "{dom}");
        assert!(
            dom.contains("href=\"https://ceems.lab.example/report/lab/102\""),
            "{dom}"
        );
        assert!(!dom.contains("<script"), "{dom}");
        screenshot(&url, "900,900", "digest.png", 10_000);
    }

    // A restart, killed as a crash would: no message again.
    drop(server);
    let server = start_server(dir, &sacct, sink.port);
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(sink.received().len(), 2, "a restart sent again");

    // The SMTP server is down while new jobs end: nothing is lost, and once it is back each
    // new message arrives once.
    sink.stop();
    records.push(record(106, "alice", "FAILED", b"again"));
    records.push(record(107, "bob", "NODE_FAIL", b"again"));
    write_sacct(dir, &records);
    wait_for("a deferred round", Duration::from_secs(30), || {
        mail_counter(&server, "deferred") >= 2.0
    });
    sink.resume();
    wait_for("the deferred digests", Duration::from_secs(30), || {
        sink.received().len() >= 4
    });
    std::thread::sleep(Duration::from_secs(5));
    let got = sink.received();
    assert_eq!(got.len(), 4, "{got:#?}");
    let late: Vec<&Received> = got.iter().skip(2).collect();
    let alice = late
        .iter()
        .find(|m| to(m) == "alice@lab.example")
        .expect("alice's second");
    let bob = late
        .iter()
        .find(|m| to(m) == "bob@lab.example")
        .expect("bob's second");
    assert!(alice.text().contains("Job 106 ") && !alice.text().contains("Job 101 "));
    assert!(bob.text().contains("Job 107 ") && !bob.text().contains("Job 103 "));
}

/// `ceems mailprog` to a server that requires STARTTLS and a login: the certificate is
/// checked against the site CA given, the password comes from the environment, and a wrong
/// password sends nothing and says so in the exit status.
#[test]
fn mailprog_logs_in_over_starttls_with_the_password_from_the_environment() {
    if !runnable("mail (STARTTLS)", aiosmtpd()) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    std::fs::write(dir.join("cert.pem"), cert.cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), cert.signing_key.serialize_pem()).unwrap();
    let sink = SmtpSink::start_with(
        &dir.join("smtp"),
        &[
            &format!("--cert={}", dir.join("cert.pem").display()),
            &format!("--key={}", dir.join("key.pem").display()),
            "--login=ceems:s3cret",
        ],
    );
    let send = |password: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ceems"))
            .args([
                "mailprog",
                "--smtp.host=localhost",
                &format!("--smtp.port={}", sink.port),
                "--smtp.tls=starttls",
                &format!("--smtp.ca-file={}", dir.join("cert.pem").display()),
                "--smtp.username=ceems",
                "--from=Slurm <slurm@lab.example>",
                "-s",
                "Slurm Job_id=9 Name=x Began, Queued time 00:00:01",
                "alice@lab.example",
            ])
            .env("CEEMS_SMTP_PASSWORD", password)
            .env("SLURM_JOB_MAIL_TYPE", "Began")
            .env_remove("CEEMS_CONFIG_FILE")
            .output()
            .unwrap()
    };
    let refused = send("wrong");
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("not sent"), "{said}");
    // A refused login (535) is the site's to fix, not the recipient's: not "refused".
    assert!(said.contains("not delivered now"), "{said}");
    assert!(sink.received().is_empty());

    let sent = send("s3cret");
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let got = sink.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].envelope["tls"], true);
    assert_eq!(got[0].envelope["login"], "ceems");
    assert_eq!(got[0].rcpt(), ["alice@lab.example"]);
    // A job that only began: Slurm's line, no report.
    assert_eq!(
        got[0].text().trim_end(),
        "Slurm Job_id=9 Name=x Began, Queued time 00:00:01"
    );
}
