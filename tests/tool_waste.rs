//! `ceems tool report waste` against a running stats-server: the table and the CSV carry the
//! API's ranking, most wasteful first, and a user who is not an admin is refused.

mod common;

use std::process::Command;
use std::sync::{Arc, Mutex};

use ceems::store::db::Store;
use ceems::store::sql::Sql;

fn job(id: u32, user: &str, gpus: u32, now: i64) -> String {
    let start = now - 86400;
    format!("{id}|gpu|normal|p-{user}|{user}|100|{user}|100|{start}|{start}|{}|10:00:00|36000|0:0|COMPLETED|billing=1,cpu=4,mem=1G,node=1,gres/gpu={gpus}|localhost|/tmp|60|job {id}", now - 3600)
}

fn tool(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ceems"))
        .args(["tool", "report", "waste"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A database at `db` holding `jobs` (id, user, GPUs, CPU seconds, mean GPU use) of the last
/// day: each ran 10 hours on 4 cores.
fn seed(db: &std::path::Path, jobs: &[(u32, &str, u32, f64, f64)], now: i64) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = Store::open(&db.join("ceems.db")).await.unwrap();
        store.register_cluster("lab", "slurm").await.unwrap();
        let lines: Vec<String> = jobs
            .iter()
            .map(|(id, user, gpus, _, _)| job(*id, user, *gpus, now))
            .collect();
        let (parsed, errors) = ceems::manager::slurm::sacct::parse_output(&lines.join("\n"));
        assert!(errors.is_empty(), "{errors:?}");
        store.ingest("lab", &parsed, now, now).await.unwrap();
        for (id, _, _, cpu, mean) in jobs {
            let q = Sql::new(
                "UPDATE units SET aggregated_seconds = 36000, cpu_seconds = $2, measured = 1,
                        mean_gpu_utilization = $3, gpu_utilization_max = $3 WHERE uuid = $1",
            )
            .arg(id.to_string())
            .arg(*cpu)
            .arg(*mean);
            store.execute(&q).await.unwrap();
        }
    });
}

/// A directory with a database of the last day: alice's 2 GPUs idle and her 4 cores at a
/// quarter; bob's GPU and cores busy.
fn alice_idle_bob_busy() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("db");
    std::fs::create_dir(&db).unwrap();
    seed(
        &db,
        &[
            (1, "alice", 2, 36_000.0, 0.0),
            (2, "bob", 1, 144_000.0, 0.9),
        ],
        ceems::manager::unix_now(),
    );
    (tmp, db)
}

/// The stats-server on `db` with a campaign on idle GPUs (10 GPU-hours, any day), every
/// second, delivering as `delivery` says.
fn server(dir: &std::path::Path, db: &std::path::Path, delivery: &[&str]) -> common::Running {
    let config = dir.join("ceems.toml");
    std::fs::write(
        &config,
        "[[stats-server.campaigns]]\nname = \"idle-gpus\"\nmin-amount = 10.0\nquiet-weekdays = []\n",
    )
    .unwrap();
    let args = [
        format!("--config.file={}", config.display()),
        format!("--storage.data.path={}", db.display()),
        "--campaign.interval=1s".into(),
        "--slurm.sacct.path=true".into(),
        "--slurm.sacctmgr.path=".into(),
        "--slurm.run-as-user=".into(),
        "--slurm.cluster-id=lab".into(),
        "--web.admin-users=root".into(),
        "--security.drop-privileges=false".into(),
    ];
    let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
    all.extend(delivery);
    common::start_subcommand("stats-server", dir, &all, &[])
}

/// The campaign's messages written to `eml`.
fn campaign_mails(eml: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(eml)
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .filter(|m| m.contains("Your jobs on lab"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_waste_report_ranks_the_idle_gpu_user_first_as_a_table_and_as_csv() {
    let (tmp, db) = alice_idle_bob_busy();
    // A campaign, run by the server at start: alice's idle GPUs pass its bound and share.
    let eml = tmp.path().join("eml");
    let server = server(
        tmp.path(),
        &db,
        &[&format!("--notify.eml-dir={}", eml.display())],
    );
    let url = server.url("");
    let (ok, csv, err) = tool(&["--url", &url, "--from", "0", "--csv"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 3, "{csv}");
    // alice: 2 GPUs × 10 h idle; 4 × 10 h of cores less 10 h used.
    assert!(lines[1].starts_with("lab,alice,1,20.0,30.0,"), "{csv}");
    assert!(lines[2].starts_with("lab,bob,1,0.0,0.0,"), "{csv}");
    // No power source measured these jobs: the energy columns are empty, not 0.
    assert!(lines[1].ends_with(",,"), "{csv}");
    let (ok, table, err) = tool(&["--url", &url, "--from", "0"]);
    assert!(ok, "{err}");
    let rows: Vec<&str> = table.lines().collect();
    assert!(
        rows[0].starts_with("cluster") && rows[0].contains("idle GPU-h"),
        "{table}"
    );
    assert!(
        rows[1].contains("alice") && rows[1].contains("20.00") && rows[1].trim_end().ends_with('-'),
        "{table}"
    );
    let (ok, _, err) = tool(&["--url", &url, "--from", "0", "--as-user", "alice"]);
    assert!(!ok);
    assert!(err.contains("403"), "{err}");
    common::lab::wait_until(
        "the campaign's mail",
        std::time::Duration::from_secs(20),
        || !campaign_mails(&eml).is_empty(),
    );
    let mails = campaign_mails(&eml);
    assert_eq!(mails.len(), 1, "{mails:?}");
    assert!(mails[0].contains("To: alice@"), "{}", mails[0]);
}

/// An SMTP server that takes each message whole and then never answers (the reply lost, as
/// when a server dies mid-send): the messages it took.
fn smtp_that_hangs_after_data() -> (u16, Arc<Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let taken = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&taken);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                let mut out = stream.try_clone().unwrap();
                let mut lines = BufReader::new(stream);
                let _ = out.write_all(b"220 hang ESMTP\r\n");
                let mut line = String::new();
                while lines.read_line(&mut line).unwrap_or(0) > 0 {
                    let verb = line.to_ascii_uppercase();
                    let reply: &[u8] = if verb.starts_with("EHLO") || verb.starts_with("HELO") {
                        b"250 hang\r\n"
                    } else if verb.starts_with("DATA") {
                        b"354 go on\r\n"
                    } else {
                        b"250 ok\r\n"
                    };
                    line.clear();
                    let _ = out.write_all(reply);
                    if reply.starts_with(b"354") {
                        let mut message = String::new();
                        while lines.read_line(&mut line).unwrap_or(0) > 0 && line != ".\r\n" {
                            message.push_str(&line);
                            line.clear();
                        }
                        log.lock().unwrap().push(message);
                        // Never answered.
                        std::thread::sleep(std::time::Duration::from_secs(3600));
                    }
                }
            });
        }
    });
    (port, taken)
}

/// kill -9 while the campaign's mail is with the SMTP server, before it answered: the
/// restarted server does not send it again (nor queue alice again), and it still mails a
/// user who became due meanwhile.
#[test]
fn a_campaign_killed_while_its_mail_is_sent_never_sends_it_twice() {
    let (tmp, db) = alice_idle_bob_busy();
    let (port, taken) = smtp_that_hangs_after_data();
    let mut first = server(
        tmp.path(),
        &db,
        &[
            "--notify.smtp.host=127.0.0.1",
            &format!("--notify.smtp.port={port}"),
            "--notify.smtp.tls=none",
        ],
    );
    // Only the campaign's mail counts: the findings pass may judge the seeded jobs before the
    // first digest round, whose digest to alice then reaches the server too.
    let campaign_sent = || -> Vec<String> {
        let taken = taken.lock().unwrap();
        taken
            .iter()
            .filter(|m| m.contains("Your jobs on lab"))
            .cloned()
            .collect()
    };
    common::lab::wait_until(
        "alice's mail at the SMTP server",
        std::time::Duration::from_secs(20),
        || !campaign_sent().is_empty(),
    );
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let sent = campaign_sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(
        sent[0].contains("To: alice@") && sent[0].contains("Your jobs on lab"),
        "{}",
        sent[0]
    );
    // carol's idle GPUs come in while the server is down.
    seed(
        &db,
        &[(3, "carol", 2, 36_000.0, 0.0)],
        ceems::manager::unix_now(),
    );
    let eml = tmp.path().join("eml");
    let _second = server(
        tmp.path(),
        &db,
        &[&format!("--notify.eml-dir={}", eml.display())],
    );
    common::lab::wait_until("carol's mail", std::time::Duration::from_secs(20), || {
        !campaign_mails(&eml).is_empty()
    });
    // A few more rounds.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let mails = campaign_mails(&eml);
    assert_eq!(mails.len(), 1, "{mails:?}");
    assert!(mails[0].contains("To: carol@"), "{}", mails[0]);
    assert_eq!(taken.lock().unwrap().len(), 1);
}
