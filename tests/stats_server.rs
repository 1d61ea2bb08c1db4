//! `ceems stats-server` ingestion: killed with SIGKILL in the middle of a 200,000-job window
//! from a stand-in sacct, then restarted with small caches, the database is sound and holds
//! every job once, and the server's peak memory stayed within its budget.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ceems::store::db::Store;
use common::{free_port, Running};

const JOBS: usize = 200_000;

/// sacct records shaped like the lab's, one job each.
fn sacct_output(n: usize) -> String {
    let mut out = String::with_capacity(n * 160);
    for i in 0..n {
        let (user, uid, account) = if i % 3 == 0 {
            ("alice", 2001, "physics")
        } else {
            ("bob", 2002, "chemistry")
        };
        let start = 1_795_000_000 + i as i64;
        out.push_str(&format!(
            "{}|debug|normal|{account}|{user}|{uid}|{user}|{uid}|{start}|{start}|{}|00:01:00|60|0:0|COMPLETED|billing=1,cpu=2,mem=2G,node=1|cn[{:03}-{:03}]|/home/{user}|30|job {i}\n",
            1000 + i,
            start + 60,
            i % 100,
            i % 100 + 1,
        ));
    }
    out
}

/// The server with small caches, as a site short of memory sets them.
fn start_server(dir: &Path, sacct: &Path) -> Running {
    start_server_with(
        dir,
        sacct,
        &[
            "--storage.update-interval=1h",
            SMALL_WEB_CACHE,
            SMALL_SQLITE_CACHE,
        ],
    )
}

const SMALL_WEB_CACHE: &str = "--web.cache-size=2MiB";
const SMALL_SQLITE_CACHE: &str = "--storage.sqlite.cache-size=4MiB";

/// A line of the process's own accounting (`VmRSS`, `VmHWM`), in KiB.
fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// The server on `dir`'s database and `sacct`, with `flags` too.
fn start_server_with(dir: &Path, sacct: &Path, flags: &[&str]) -> Running {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_ceems"))
        .args([
            "stats-server",
            &format!("--web.listen-address=127.0.0.1:{port}"),
            &format!("--storage.data.path={}", dir.join("data").display()),
            &format!("--slurm.sacct.path={}", sacct.display()),
            "--slurm.cluster-id=lab",
        ])
        .args(flags)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start stats-server");
    let server = Running {
        child: common::KillOnDrop(child),
        port,
    };
    // It listens once its database is open and migrated: the test reads the database (as
    // root) only after that, so that the files SQLite adds are the server's.
    let start = Instant::now();
    while !server.answers() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the server did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

async fn counts(db: &Path) -> (i64, i64, String) {
    let store = Store::open(db).await.expect("reopen the database");
    let total = store.count_units("lab").await.unwrap();
    let distinct: i64 = store
        .fetch_one(&ceems::store::sql::Sql::new(
            "SELECT count(DISTINCT uuid) FROM units",
        ))
        .await
        .unwrap()
        .get(0)
        .unwrap();
    (total, distinct, store.integrity_check().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_ingestion_and_restarted_the_database_holds_every_job_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // The server drops to nobody when started as root.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(dir.join("sacct.txt"), sacct_output(JOBS)).unwrap();
    let sacct = dir.join("sacct");
    std::fs::write(
        &sacct,
        format!(
            "#!/bin/sh\nexec /bin/cat '{}'\n",
            dir.join("sacct.txt").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&sacct, std::fs::Permissions::from_mode(0o755)).unwrap();
    let db = dir.join("data/ceems.db");

    // Kill it once some batches have committed.
    let mut server = start_server(dir, &sacct);
    let start = Instant::now();
    loop {
        let written = if db.exists() { counts(&db).await.0 } else { 0 };
        if written > 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "nothing committed in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.child.kill().expect("SIGKILL");
    let _ = server.child.wait();
    let (after_kill, distinct, integrity) = counts(&db).await;
    assert_eq!(integrity, "ok");
    assert_eq!(after_kill, distinct, "a job was written twice");
    println!("committed before SIGKILL: {after_kill} of {JOBS} jobs");

    // The restarted server ingests the same window again; nothing is missing or doubled.
    let server = start_server(dir, &sacct);
    let pid = server.child.0.id();
    let started_kib = proc_status_kib(pid, "VmRSS");
    let start = Instant::now();
    loop {
        if counts(&db).await.0 == JOBS as i64 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "ingestion did not finish"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let metrics = server.get("/metrics");
    assert!(
        metrics.contains("ceems_stats_ingested_rows_total{cluster_id=\"lab\"}"),
        "{metrics}"
    );
    let peak_kib = proc_status_kib(pid, "VmHWM");
    let text_kib = std::fs::metadata(dir.join("sacct.txt")).unwrap().len() >> 10;
    println!("restarted: {started_kib} KiB at start, peak {peak_kib} KiB through {text_kib} KiB of sacct output");
    // The budget of this run: its caches, batches of parsed jobs in flight (16 MiB), and less
    // than sacct's answer; holding the answer whole (read, then copied) took twice its size.
    let caches_kib = (2 + 4) << 10;
    assert!(
        peak_kib - started_kib < text_kib + caches_kib + (16 << 10),
        "the peak ({peak_kib} KiB, {started_kib} KiB at start) is over the budget of \
         {caches_kib} KiB of caches, 16 MiB of batches and {text_kib} KiB"
    );
    drop(server);
    let (total, distinct, integrity) = counts(&db).await;
    assert_eq!(
        (total, distinct, integrity.as_str()),
        (JOBS as i64, JOBS as i64, "ok")
    );
}

/// The server's peak memory (its own VmHWM) through ingestion and the update after it, with
/// small caches: the same for a window five times larger, since sacct's answer is read as it
/// comes and every cache has a budget; every job is stored once after several runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peak_memory_does_not_grow_with_the_window() {
    let mut peaks = Vec::new();
    for jobs in [JOBS / 5, JOBS] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::write(dir.join("sacct.txt"), sacct_output(jobs)).unwrap();
        let sacct = dir.join("sacct");
        let text = dir.join("sacct.txt");
        std::fs::write(
            &sacct,
            format!("#!/bin/sh\nexec /bin/cat '{}'\n", text.display()),
        )
        .unwrap();
        std::fs::set_permissions(&sacct, std::fs::Permissions::from_mode(0o755)).unwrap();
        let server = start_server_with(
            dir,
            &sacct,
            &[
                "--slurm.sacctmgr.path=",
                "--slurm.run-as-user=",
                "--storage.first-window=400d",
                "--storage.update-interval=2s",
                SMALL_WEB_CACHE,
                SMALL_SQLITE_CACHE,
                "--security.drop-privileges=false",
            ],
        );
        let pid = server.child.0.id();
        // Each run reads the whole window again (the stand-in ignores it): two runs, two
        // windows' rows.
        let start = Instant::now();
        loop {
            let ingested = server
                .answers()
                .then(|| server.get("/metrics"))
                .and_then(|m| {
                    m.lines()
                        .find(|l| l.starts_with("ceems_stats_ingested_rows_total{"))
                        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                })
                .unwrap_or(0.0);
            if ingested >= 2.0 * jobs as f64 {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(240),
                "{jobs} jobs were not ingested twice in 240 s ({ingested} rows)"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let peak_kib = proc_status_kib(pid, "VmHWM");
        drop(server);
        let (total, distinct, integrity) = counts(&dir.join("data/ceems.db")).await;
        assert_eq!(
            (total, distinct, integrity.as_str()),
            (jobs as i64, jobs as i64, "ok")
        );
        let text_mib = std::fs::metadata(&text).unwrap().len() >> 20;
        println!(
            "{jobs} jobs ({text_mib} MiB of sacct output): peak RSS {} MiB",
            peak_kib >> 10
        );
        peaks.push((jobs, text_mib, peak_kib >> 10));
    }
    let [(_, small_text, small), (_, large_text, large)] = peaks[..] else {
        unreachable!()
    };
    // Holding sacct's answer would add its size, and as much again while it is read and
    // copied; a run's peak varies by a few MiB.
    assert!(
        large < small + (large_text - small_text) * 3 / 4,
        "the peak grew with the window: {peaks:?} (jobs, MiB of output, MiB peak)"
    );
}

/// A stats-server told no cluster id names its Slurm cluster as slurm.conf does (what sacct,
/// the lb's config and cacct use), and says so; without a ClusterName it falls back to
/// `slurm-0` with a warning.
#[test]
fn the_cluster_id_defaults_to_slurm_conf_s_cluster_name() {
    let dir = tempfile::tempdir().unwrap();
    let sacct = dir.path().join("sacct");
    std::fs::write(&sacct, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&sacct, std::fs::Permissions::from_mode(0o755)).unwrap();
    let conf = dir.path().join("slurm.conf");
    for (text, id, said) in [
        (
            "ClusterName=JeanZay\nSlurmUser=slurm\n",
            "jeanzay",
            "ClusterName",
        ),
        ("SlurmUser=slurm\n", "slurm-0", "sets no ClusterName"),
    ] {
        std::fs::write(&conf, text).unwrap();
        let log = dir.path().join("log");
        let data = dir.path().join(id);
        let port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_ceems"))
            .env("SLURM_CONF", &conf)
            .args([
                "stats-server",
                &format!("--web.listen-address=127.0.0.1:{port}"),
                &format!("--storage.data.path={}", data.display()),
                &format!("--slurm.sacct.path={}", sacct.display()),
                "--slurm.sacctmgr.path=",
                "--slurm.run-as-user=",
                "--web.admin-users=root",
                "--security.drop-privileges=false",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let server = Running {
            child: common::KillOnDrop(child),
            port,
        };
        let start = Instant::now();
        while !server.answers() {
            assert!(start.elapsed() < Duration::from_secs(30), "no start");
            std::thread::sleep(Duration::from_millis(50));
        }
        let clusters = common::api_get(&server, "/api/v1/clusters/admin", "root");
        assert_eq!(
            clusters["data"],
            serde_json::json!([{"id": id, "manager": "slurm"}]),
            "{text}"
        );
        let log = std::fs::read_to_string(&log).unwrap();
        assert!(log.contains(said), "{log}");
    }
}

/// A job started after the last update, named by id (as Grafana's job dashboard names it),
/// is pulled from sacct before the answer: its owner sees it at once, another user does not.
#[test]
fn a_job_named_by_id_is_pulled_from_the_manager_before_the_next_update() {
    let dir = tempfile::tempdir().unwrap();
    let sacct = dir.path().join("sacct");
    // Like sacct: the job's line only when asked for it by id; the periodic pull sees none.
    let line = sacct_output(1).replace("1000|", "4242|");
    std::fs::write(
        &sacct,
        format!(
            "#!/bin/sh\ncase \" $* \" in *\" --jobs 4242 \"*) printf '%s' '{}';; esac\n",
            line
        ),
    )
    .unwrap();
    std::fs::set_permissions(&sacct, std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = start_server(dir.path(), &sacct);
    let path = "/api/v1/units?uuid=4242&field=uuid&field=username";
    assert_eq!(
        common::api_get(&server, path, "bob")["data"],
        serde_json::json!([]),
        "bob sees alice's job"
    );
    assert_eq!(
        common::api_get(&server, path, "alice")["data"],
        serde_json::json!([{"uuid": "4242", "username": "alice"}])
    );
    // An id no manager knows stays unknown, and the answer comes.
    let none = common::api_get(&server, "/api/v1/units?uuid=9999", "alice");
    assert_eq!(none["data"], serde_json::json!([]));
}
