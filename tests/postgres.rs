//! The stats-server on PostgreSQL (Debian's, `scripts/postgres-lab.sh`). In the real Slurm lab,
//! with Debian's Prometheus scraping the exporter, a server on PostgreSQL and one on SQLite
//! give the same answer to every API route, the same findings and the same report.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use common::lab::{
    lab, postgres_schema, postgres_tools, prometheus_scraping, prometheus_tools,
    start_stats_server_with, submit, wait_jobs_gone, wait_until, write_burner, CancelOnDrop,
    BURNER,
};
use common::{runnable, start_exporter, Running};

/// Fields that say when a server did something, not what the jobs did.
const SERVER_TIMES: [&str; 3] = [
    "last_updated_at_ts",
    "aggregates_updated_at_ts",
    "next_window_start_ts",
];

fn get(server: &Running, path: &str, user: &str) -> (u16, String) {
    match ureq::get(&server.url(path))
        .set("X-Grafana-User", user)
        .call()
    {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("GET {path}: {e}"),
    }
}

fn json(server: &Running, path: &str, user: &str) -> Value {
    let (status, body) = get(server, path, user);
    assert_eq!(status, 200, "GET {path} as {user}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

/// Where two answers differ: numbers within a relative 1e-12 (SQLite writes 15 significant
/// digits, PostgreSQL the shortest exact form) and server times aside.
fn differences(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            if (x - y).abs() > 1e-12 * x.abs().max(y.abs()) {
                out.push(format!("{path}: {x} on SQLite, {y} on PostgreSQL"));
            }
        }
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                if SERVER_TIMES.contains(&k.as_str()) {
                    continue;
                }
                let p = format!("{path}.{k}");
                match (x.get(k), y.get(k)) {
                    (Some(u), Some(v)) => differences(&p, u, v, out),
                    (u, v) => out.push(format!("{p}: {u:?} on SQLite, {v:?} on PostgreSQL")),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                differences(&format!("{path}[{i}]"), u, v, out);
            }
        }
        _ if a == b => {}
        _ => out.push(format!("{path}: {a} on SQLite, {b} on PostgreSQL")),
    }
}

/// Every unit of a server's answer has its aggregates settled (the answer must carry
/// `aggregates_status`).
fn settled(units: &Value) -> bool {
    units["data"].as_array().is_some_and(|list| {
        !list.is_empty()
            && list.iter().all(|u| {
                matches!(
                    u["aggregates_status"].as_str(),
                    Some(s) if s != "pending" && s != "partial"
                )
            })
    })
}

#[test]
fn every_answer_the_findings_and_the_report_are_the_same_on_postgresql_and_sqlite() {
    let tools = lab()
        .and_then(|_| prometheus_tools())
        .and_then(|_| postgres_tools());
    let url = match tools {
        Ok(url) => url,
        Err(e) => {
            runnable("postgres", Err(e));
            return;
        }
    };
    let exporter = start_exporter(
        Path::new("/"),
        &["--collector.slurm", "--path.cgroupfs=/sys/fs/cgroup"],
    );
    let prom = prometheus_scraping(exporter.port);

    // A busy job, an idle one and a failed one: each gives other findings.
    write_burner();
    let busy = submit(
        "alice",
        &format!("-J pg-busy -c 1 --mem=200M --wrap 'python3 {BURNER} 12'"),
    );
    let idle = submit("bob", "-J pg-idle -c 2 --mem=300M --wrap 'sleep 12'");
    let failed = submit("alice", "-J pg-failed -c 1 --wrap 'sleep 8; exit 3'");
    let ids = [busy.clone(), idle.clone(), failed.clone()];
    let _cancel = CancelOnDrop(ids.to_vec());
    wait_jobs_gone(&ids, Duration::from_secs(180));
    // The last scrapes of the jobs are in before either server counts them.
    std::thread::sleep(Duration::from_secs(5));

    let database = format!(
        "--storage.database-url={}",
        postgres_schema(&url, "answers")
    );
    let (sqlite, _d1) = start_stats_server_with(&prom.url(), "2s", &[]);
    let (postgres, _d2) = start_stats_server_with(&prom.url(), "2s", &[&database]);
    let all = "/api/v1/units/admin?from=0";
    // The status is not in the default answer: asked for by name, or every job looks settled.
    let status = "/api/v1/units/admin?from=0&field=uuid&field=aggregates_status";
    wait_until("both servers' aggregates", Duration::from_secs(120), || {
        settled(&json(&sqlite, status, "root")) && settled(&json(&postgres, status, "root"))
    });
    // The findings follow the aggregates in the same update (every 2 s).
    std::thread::sleep(Duration::from_secs(3));
    let units = json(&sqlite, all, "root");
    let listed: Vec<&str> = units["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|u| u["uuid"].as_str())
        .collect();
    for id in &ids {
        assert!(listed.contains(&id.as_str()), "job {id} not in {listed:?}");
    }

    let mut paths: Vec<(String, &str)> = [
        ("/api/v1/units/admin?from=0", "root"),
        (
            "/api/v1/units/admin?from=0&field=uuid&field=findings&running=true",
            "root",
        ),
        ("/api/v1/units?from=0", "alice"),
        ("/api/v1/units?from=0&project=chemistry", "bob"),
        ("/api/v1/usage/current/admin?from=0", "root"),
        ("/api/v1/usage/current?from=0&groupby=project", "alice"),
        ("/api/v1/usage/global/admin", "root"),
        ("/api/v1/usage/global", "bob"),
        ("/api/v1/projects/admin", "root"),
        ("/api/v1/projects", "alice"),
        ("/api/v1/users/admin", "root"),
        ("/api/v1/users", "bob"),
        ("/api/v1/clusters/admin", "root"),
        ("/api/v1/findings/admin?from=0", "root"),
    ]
    .iter()
    .map(|(p, u)| (p.to_string(), *u))
    .collect();
    for (id, owner) in [(&busy, "alice"), (&idle, "bob"), (&failed, "alice")] {
        paths.push((format!("/api/v1/units/lab/{id}/findings"), owner));
        paths.push((format!("/report/lab/{id}.json"), owner));
    }
    let mut found = Vec::new();
    for (path, user) in &paths {
        let (a, b) = (json(&sqlite, path, user), json(&postgres, path, user));
        differences(path, &a, &b, &mut found);
    }
    // The page and the text report, as a user reads them.
    for (id, owner) in [(&busy, "alice"), (&failed, "alice")] {
        for suffix in ["", ".txt"] {
            let path = format!("/report/lab/{id}{suffix}");
            let (a, b) = (get(&sqlite, &path, owner), get(&postgres, &path, owner));
            assert_eq!(a.0, 200, "{path}: {}", a.1);
            if a != b {
                found.push(format!(
                    "{path}: the two pages differ:\n{}\n---\n{}",
                    a.1, b.1
                ));
            }
        }
    }
    assert!(found.is_empty(), "{found:#?}");

    // The findings are there to compare: the failed job's, at least.
    let findings = json(
        &postgres,
        &format!("/api/v1/units/lab/{failed}/findings"),
        "alice",
    );
    assert!(findings.to_string().contains("job_failed"), "{findings}");
}

/// sacct records of jobs `from..to`, shaped like the lab's.
fn sacct_lines(from: usize, to: usize) -> String {
    let mut out = String::new();
    for i in from..to {
        let (user, uid, account) = match i % 2 {
            0 => ("alice", 2001, "physics"),
            _ => ("bob", 2002, "chemistry"),
        };
        let start = 1_795_000_000 + i as i64;
        out.push_str(&format!(
            "{}|debug|normal|{account}|{user}|{uid}|{user}|{uid}|{start}|{start}|{}|00:01:00|60|0:0|COMPLETED|billing=1,cpu=2,mem=2G,node=1|cn001|/home/{user}|30|job {i}\n",
            10_000 + i,
            start + 60,
        ));
    }
    out
}

/// A stand-in sacct over a file of records that logs, for each call, when it started and
/// ended and for which server (`name`), taking `seconds` as a busy slurmdbd would.
struct FakeSacct {
    dir: tempfile::TempDir,
}

impl FakeSacct {
    fn new(jobs: usize) -> FakeSacct {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // The servers drop to nobody and run sacct as slurm.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::write(dir.path().join("records"), sacct_lines(0, jobs)).unwrap();
        std::fs::write(dir.path().join("calls"), "").unwrap();
        for f in ["records", "calls"] {
            std::fs::set_permissions(dir.path().join(f), std::fs::Permissions::from_mode(0o666))
                .unwrap();
        }
        FakeSacct { dir }
    }

    /// The command for the server `name`.
    fn command(&self, name: &str, seconds: f64) -> String {
        use std::os::unix::fs::PermissionsExt;
        let d = self.dir.path().display();
        let path = self.dir.path().join(format!("sacct-{name}"));
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\necho \"start {name} $(date +%s%N)\" >> {d}/calls\nsleep {seconds}\ncat {d}/records\necho \"end {name} $(date +%s%N)\" >> {d}/calls\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path.display().to_string()
    }

    fn add(&self, from: usize, to: usize) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.path().join("records"))
            .unwrap();
        f.write_all(sacct_lines(from, to).as_bytes()).unwrap();
    }

    /// The calls so far: (server, start, end if it ended), in nanoseconds.
    fn calls(&self) -> Vec<(String, u128, Option<u128>)> {
        let text = std::fs::read_to_string(self.dir.path().join("calls")).unwrap();
        let mut calls: Vec<(String, u128, Option<u128>)> = Vec::new();
        for line in text.lines() {
            let mut w = line.split(' ');
            let (Some(what), Some(name), Some(t)) = (w.next(), w.next(), w.next()) else {
                continue;
            };
            let t: u128 = t.parse().unwrap_or(0);
            match what {
                "start" => calls.push((name.to_owned(), t, None)),
                _ => {
                    if let Some(c) = calls
                        .iter_mut()
                        .rev()
                        .find(|c| c.0 == name && c.2.is_none())
                    {
                        c.2 = Some(t);
                    }
                }
            }
        }
        calls
    }
}

fn start_on(url: &str, sacct: &str, extra: &[&str]) -> Running {
    let cwd = tempfile::tempdir().unwrap();
    common::start_subcommand(
        "stats-server",
        cwd.path(),
        &[
            &[
                &format!("--storage.database-url={url}") as &str,
                &format!("--slurm.sacct.path={sacct}"),
                "--slurm.sacctmgr.path=",
                "--slurm.cluster-id=lab",
                "--storage.update-interval=1s",
                "--storage.first-window=1h",
                "--web.admin-users=root",
                "--prometheus.url=",
            ],
            extra,
        ]
        .concat(),
        &[],
    )
}

fn units_on(server: &Running) -> Option<i64> {
    let (status, body) = get(
        server,
        "/api/v1/clusters/admin?field=id&field=num_units",
        "root",
    );
    if status != 200 {
        return None;
    }
    let v: Value = serde_json::from_str(&body).ok()?;
    v["data"].as_array()?.first()?["num_units"].as_i64()
}

fn psql(url: &str, sql: &str) -> String {
    let out = std::process::Command::new("psql")
        .args([url, "-tA", "-c", sql])
        .output()
        .expect("psql");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn two_servers_share_a_database_one_updates_at_a_time_and_the_other_takes_over_a_kill() {
    let url = match postgres_tools() {
        Ok(url) => url,
        Err(e) => {
            runnable("postgres", Err(e));
            return;
        }
    };
    let schema_url = postgres_schema(&url, "failover");
    let schema = schema_url.rsplit('=').next().unwrap().to_owned();
    let count = |sql: &str| psql(&url, &sql.replace("units", &format!("{schema}.units")));
    let sacct = FakeSacct::new(1000);
    let mut a = start_on(&schema_url, &sacct.command("a", 1.0), &[]);
    let mut b = start_on(&schema_url, &sacct.command("b", 1.0), &[]);
    wait_until("the first 1000 jobs", Duration::from_secs(60), || {
        units_on(&a) == Some(1000) && units_on(&b) == Some(1000)
    });

    // Each server has cached its answer; the other one's writes make both stale at once.
    sacct.add(1000, 1500);
    wait_until(
        "jobs 1000 to 1500 committed",
        Duration::from_secs(60),
        || count("SELECT count(*) FROM units") == "1500",
    );
    assert_eq!((units_on(&a), units_on(&b)), (Some(1500), Some(1500)));

    // Kill -9 the one inside sacct, holding the lease: the other takes over.
    let (victim, survivor, name) = loop {
        let calls = sacct.calls();
        match calls.last() {
            Some((name, _, None)) if name == "a" => break (&mut a, &b, "b"),
            Some((name, _, None)) if name == "b" => break (&mut b, &a, "a"),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    victim.child.kill().expect("SIGKILL");
    let _ = victim.child.wait();
    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    sacct.add(1500, 2000);
    wait_until(
        "the survivor ingesting the last 500 jobs",
        Duration::from_secs(20),
        || units_on(survivor) == Some(2000),
    );
    assert_eq!(count("SELECT count(DISTINCT uuid) FROM units"), "2000");
    assert!(
        sacct.calls().iter().any(|c| c.0 == name && c.1 > killed_at),
        "the survivor ran no sacct after the kill: {:?}",
        sacct.calls()
    );

    // Never both in sacct at once. The killed server's sacct outlives it (its orphan writes
    // its end later): that call ended with the server.
    let victim_name = if name == "a" { "b" } else { "a" };
    let calls: Vec<_> = sacct
        .calls()
        .into_iter()
        .map(|(n, start, end)| {
            let end = match n == victim_name && start < killed_at {
                true => Some(end.map_or(killed_at, |e| e.min(killed_at))),
                false => end,
            };
            (n, start, end)
        })
        .collect();
    for x in calls.iter().filter(|c| c.0 == "a") {
        for y in calls.iter().filter(|c| c.0 == "b") {
            let (xe, ye) = (x.2.unwrap_or(u128::MAX), y.2.unwrap_or(u128::MAX));
            assert!(
                xe <= y.1 || ye <= x.1,
                "a {x:?} and b {y:?} updated at once: {calls:?}"
            );
        }
    }
    let by = |n: &str| calls.iter().filter(|c| c.0 == n).count();
    println!("sacct calls: a {}, b {}", by("a"), by("b"));
}

/// A PostgreSQL of the test's own, to stop and start: Debian's server binaries on a data
/// directory in a tempdir, trusted on 127.0.0.1.
struct OwnPostgres {
    dir: tempfile::TempDir,
    bin: std::path::PathBuf,
    port: u16,
}

impl OwnPostgres {
    fn start() -> OwnPostgres {
        use std::os::unix::fs::PermissionsExt;
        let version = std::fs::read_dir("/usr/lib/postgresql")
            .expect("Debian's postgresql")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .max_by_key(|v| v.parse::<u32>().unwrap_or(0))
            .expect("a PostgreSQL version");
        let bin = Path::new("/usr/lib/postgresql").join(version).join("bin");
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let data = dir.path().join("data");
        run_as_postgres(&format!(
            "{} -D {} --auth=trust -U postgres >/dev/null",
            bin.join("initdb").display(),
            data.display()
        ));
        let pg = OwnPostgres {
            dir,
            bin,
            port: common::free_port(),
        };
        pg.up();
        pg
    }

    fn up(&self) {
        run_as_postgres(&format!(
            "{} -D {} -w -l {} -o '-p {} -k {} -c listen_addresses=127.0.0.1' start >/dev/null",
            self.bin.join("pg_ctl").display(),
            self.dir.path().join("data").display(),
            self.dir.path().join("log").display(),
            self.port,
            self.dir.path().display()
        ));
    }

    /// Stops it at once, as a crash or a lost network would: sessions end mid-transaction.
    fn down(&self) {
        run_as_postgres(&format!(
            "{} -D {} -m immediate stop >/dev/null",
            self.bin.join("pg_ctl").display(),
            self.dir.path().join("data").display()
        ));
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        self.down();
    }
}

fn run_as_postgres(cmd: &str) {
    let out = std::process::Command::new("su")
        .args(["postgres", "-s", "/bin/sh", "-c", cmd])
        .output()
        .expect("su");
    assert!(
        out.status.success() || cmd.contains(" stop"),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_database_that_goes_away_fails_the_update_which_is_retried_and_the_api_says_503() {
    if let Err(e) = postgres_tools() {
        runnable("postgres", Err(e));
        return;
    }
    let pg = OwnPostgres::start();
    let sacct = FakeSacct::new(100);
    let mut server = start_on(&pg.url(), &sacct.command("only", 0.2), &[]);
    wait_until("the first 100 jobs", Duration::from_secs(30), || {
        units_on(&server) == Some(100)
    });

    pg.down();
    sacct.add(100, 150);
    for path in ["/api/v1/units/admin?from=0", "/api/v1/health"] {
        let (status, body) = get(&server, path, "root");
        assert_eq!(status, 503, "{path}: {body}");
        assert!(
            body.contains("unavailable") && body.contains("database"),
            "{path}: {body}"
        );
    }
    // Updates fail meanwhile, and say so on /metrics; the server stays up.
    wait_until(
        "a failed ingestion counted",
        Duration::from_secs(30),
        || {
            common::parse_series(&server.get("/metrics"))
                .get("ceems_stats_ingest_failures_total{cluster_id=\"lab\"}")
                .is_some_and(|v| *v > 0.0)
        },
    );
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "the server exited"
    );

    pg.up();
    wait_until("the update retried", Duration::from_secs(30), || {
        units_on(&server) == Some(150)
    });
    let (status, body) = get(&server, "/api/v1/units/admin?from=0&field=uuid", "root");
    assert_eq!(status, 200, "{body}");
}
