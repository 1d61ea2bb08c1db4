//! `ceems lb` in front of two real Prometheus servers (Debian's) that scrape the series of two
//! users' jobs: each user gets their own job's series and nothing else, however the query is
//! dressed up; an admin gets everything; a stopped Prometheus does not stop the answers.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ceems::manager::slurm::sacct;
use ceems::store::db::Store;
use common::http::{Response, TestServer};
use common::lab::{prometheus_tools, wait_until, Prometheus};
use common::{runnable, start_subcommand};
use serde_json::Value;

/// Job 1 is alice's (project physics), job 2 bob's (chemistry); both running since 2026-11-21.
const SACCT: &str = "\
1|debug|normal|physics|alice|2001|alice|2001|1795358897|1795358897|Unknown|00:00:29|29|0:0|RUNNING|billing=1,cpu=1,mem=300M,node=1|localhost|/tmp|60|wrap
2|debug|normal|chemistry|bob|2002|bob|2002|1795358897|1795358897|Unknown|00:00:29|29|0:0|RUNNING|billing=1,cpu=1,mem=300M,node=1|localhost|/tmp|60|wrap
";

/// A node whose two jobs burn CPU time as time passes.
fn node() -> TestServer {
    TestServer::start(
        false,
        Arc::new(|_| {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs_f64();
            Response::raw(
                200,
                format!(
                    "# TYPE ceems_compute_unit_cpu_user_seconds_total counter\n\
                     ceems_compute_unit_cpu_user_seconds_total{{manager=\"slurm\",uuid=\"1\"}} {now}\n\
                     ceems_compute_unit_cpu_user_seconds_total{{manager=\"slurm\",uuid=\"2\"}} {}\n",
                    now * 2.0
                ),
            )
            .with_header("Content-Type", "text/plain; version=0.0.4")
        }),
    )
}

/// The stats-server's database as it would be after ingesting [`SACCT`].
fn database(dir: &std::path::Path) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = Store::open(&dir.join("ceems.db")).await.unwrap();
        let (jobs, errors) = sacct::parse_output(SACCT);
        assert!(errors.is_empty(), "{errors:?}");
        store.ingest("lab", &jobs, 100, 1).await.unwrap();
    });
}

/// (status, JSON body) of a request through the proxy.
fn ask(
    lb: &common::Running,
    user: Option<&str>,
    path_and_query: &str,
    form: Option<&str>,
) -> (u16, Value) {
    let mut req = match form {
        Some(_) => ureq::post(&lb.url(path_and_query)),
        None => ureq::get(&lb.url(path_and_query)),
    };
    if let Some(u) = user {
        req = req.set("X-Grafana-User", u);
    }
    // A client cannot make itself admin with a header of its own.
    req = req.set("X-Admin-User", "admin");
    let answer = match form {
        Some(body) => req
            .set("Content-Type", "application/x-www-form-urlencoded")
            .send_string(body),
        None => req.call(),
    };
    let resp = match answer {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{path_and_query}: {e}"),
    };
    let status = resp.status();
    let body = resp.into_string().unwrap();
    (
        status,
        serde_json::from_str(&body).unwrap_or_else(|_| panic!("not JSON: {body}")),
    )
}

fn encode(q: &str) -> String {
    form_urlencoded::byte_serialize(q.as_bytes()).collect()
}

fn query(q: &str) -> String {
    format!("/api/v1/query?query={}", encode(q))
}

/// Asserts that `user` gets 200 for `path` with exactly the series of `jobs`; the answer.
fn assert_gets(lb: &common::Running, user: &str, path: &str, jobs: &[&str]) -> Value {
    let (status, answer) = ask(lb, Some(user), path, None);
    assert_eq!(
        (status, uuids(&answer)),
        (200, jobs.iter().map(|j| j.to_string()).collect()),
        "{path}: {answer}"
    );
    answer
}

/// The `uuid` labels of a query answer's series.
fn uuids(answer: &Value) -> Vec<String> {
    let mut u: Vec<String> = answer["data"]["result"]
        .as_array()
        .unwrap_or_else(|| panic!("no result: {answer}"))
        .iter()
        .map(|s| s["metric"]["uuid"].as_str().unwrap_or("").to_owned())
        .collect();
    u.sort();
    u
}

#[test]
fn users_see_their_own_jobs_only_and_admins_see_all() {
    if !runnable(
        "users_see_their_own_jobs_only_and_admins_see_all",
        prometheus_tools(),
    ) {
        return;
    }
    let node = node();
    let prometheus = [
        Prometheus::start(&[node.port], &[]),
        Prometheus::start(&[node.port], &[]),
    ];
    let rate = "rate(ceems_compute_unit_cpu_user_seconds_total[1m])";
    for p in &prometheus {
        wait_until("two samples of each job", Duration::from_secs(60), || {
            p.query(rate).len() == 2
        });
    }
    let data = tempfile::tempdir().unwrap();
    database(data.path());
    let backends: Vec<String> = prometheus
        .iter()
        .map(|p| format!("--lb.backend=lab={}", p.url()))
        .collect();
    let mut args: Vec<&str> = backends.iter().map(String::as_str).collect();
    let storage = format!("--storage.data.path={}", data.path().display());
    args.extend([
        storage.as_str(),
        "--web.admin-users=admin",
        "--lb.health-check-interval=1s",
        "--lb.filter-label=lab=manager",
        "--security.drop-privileges=false",
    ]);
    let lb = start_subcommand("lb", data.path(), &args, &[]);

    let alice_rate = r#"rate(ceems_compute_unit_cpu_user_seconds_total{uuid="1"}[1m])"#;
    let answer = assert_gets(&lb, "alice", &query(alice_rate), &["1"]);
    // The label the site hides from its users is gone.
    let metric = &answer["data"]["result"][0]["metric"];
    assert!(metric.get("manager").is_none(), "{metric}");
    // CEEMS's datasource URL names the cluster in the path.
    assert_gets(&lb, "alice", &format!("/lab{}", query(alice_rate)), &["1"]);
    // A job the stats-server has not pulled yet is said to be that, not someone else's.
    let (status, answer) = ask(
        &lb,
        Some("alice"),
        &query(r#"ceems_compute_unit_cpu_user_seconds_total{uuid="77"}"#),
        None,
    );
    assert_eq!(status, 403, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .starts_with("job 77 is not known to the stats-server yet"),
        "{answer}"
    );
    // A datasource naming a cluster this lb does not serve is told which it serves.
    let (status, answer) = ask(
        &lb,
        Some("alice"),
        &format!("/slurm-0{}", query(alice_rate)),
        None,
    );
    assert_eq!(status, 404, "{answer}");
    assert_eq!(
        answer["error"], "no cluster `slurm-0` here: this lb serves lab",
        "{answer}"
    );
    // The same through a POST form, as Grafana sends long queries.
    let (status, answer) = ask(
        &lb,
        Some("alice"),
        "/api/v1/query",
        Some(&format!("query={}", encode(alice_rate))),
    );
    assert_eq!((status, uuids(&answer)), (200, vec!["1".to_owned()]));
    // Series and label values of her own job.
    let (status, answer) = ask(
        &lb,
        Some("alice"),
        &format!("/api/v1/series?match[]={}", encode(r#"{uuid="1"}"#)),
        None,
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["data"].as_array().map(Vec::len), Some(1), "{answer}");

    let refused = [
        query(r#"rate(ceems_compute_unit_cpu_user_seconds_total{uuid="2"}[1m])"#),
        query(r#"ceems_compute_unit_cpu_user_seconds_total{uuid=~"1|2"}"#),
        query(r#"ceems_compute_unit_cpu_user_seconds_total{uuid=~"1|.*"}"#),
        query(rate),
        query(r#"max_over_time(ceems_compute_unit_cpu_user_seconds_total{uuid="2"}[1m:5s])"#),
        query(
            r#"label_replace(ceems_compute_unit_cpu_user_seconds_total{uuid="2"}, "uuid", "1", "", "")"#,
        ),
        format!("/api/v1/series?match[]={}", encode("up")),
        "/api/v1/labels".to_owned(),
        "/api/v1/admin/tsdb/snapshot".to_owned(),
        "/api/v1/status/config".to_owned(),
    ];
    for path in &refused {
        let (status, answer) = ask(&lb, Some("alice"), path, None);
        assert_eq!(status, 403, "{path}: {answer}");
        assert_eq!(answer["status"], "error", "{answer}");
        assert_eq!(answer["errorType"], "forbidden", "{answer}");
        // Another's job and a path of the store's own are refused in CEEMS's words; what
        // only ceems refuses (patterns, selectors without a unit) says why.
        let said = answer["error"].as_str().unwrap_or("");
        let ceems_words = match path.as_str() {
            "/api/v1/status/config" | "/api/v1/admin/tsdb/snapshot" => {
                Some("user do not have permissions to access this resource")
            }
            p if p == query(r#"rate(ceems_compute_unit_cpu_user_seconds_total{uuid="2"}[1m])"#) => {
                Some("user do not have permissions to view metrics of this job/pod/vm")
            }
            _ => None,
        };
        match ceems_words {
            Some(words) => assert_eq!(said, words, "{path}"),
            None => assert!(!said.is_empty(), "{path}: {answer}"),
        }
    }
    // Bob's job smuggled in the body of a request whose URL names alice's.
    let (status, answer) = ask(
        &lb,
        Some("alice"),
        &query(alice_rate),
        Some(&format!(
            "query={}",
            encode(r#"ceems_compute_unit_cpu_user_seconds_total{uuid="2"}"#)
        )),
    );
    assert_eq!(status, 403, "{answer}");
    // No user: 401, in CEEMS's words, which say what to set in Grafana.
    let (status, answer) = ask(&lb, None, &query(alice_rate), None);
    assert_eq!(
        (status, answer["errorType"].as_str()),
        (401, Some("unauthorized"))
    );
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|e| e.contains("send_user_header = true")),
        "{answer}"
    );
    // bob gets his own job, not alice's.
    let (status, _) = ask(&lb, Some("bob"), &query(alice_rate), None);
    assert_eq!(status, 403);
    // The admin gets every job, with or without a uuid.
    let (status, answer) = ask(&lb, Some("admin"), &query(rate), None);
    assert_eq!(
        (status, uuids(&answer)),
        (200, vec!["1".to_owned(), "2".to_owned()]),
        "{answer}"
    );
    // As in CEEMS, the admin may also read the stores' status; never their admin API.
    let (status, answer) = ask(&lb, Some("admin"), "/api/v1/status/config", None);
    assert_eq!(status, 200, "{answer}");
    assert!(answer["data"]["yaml"].as_str().is_some(), "{answer}");
    let (status, _) = ask(&lb, Some("admin"), "/api/v1/admin/tsdb/snapshot", None);
    assert_eq!(status, 403);

    // 1,000 queries at once: each is answered, or refused with 503 beyond the 256 served at
    // once, and the proxy's memory stays bounded.
    let url = lb.url(&query(alice_rate));
    let threads: Vec<_> = (0..1000)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                match ureq::get(&url).set("X-Grafana-User", "alice").call() {
                    Ok(r) => r.status(),
                    Err(ureq::Error::Status(code, _)) => code,
                    Err(e) => panic!("{e}"),
                }
            })
        })
        .collect();
    let statuses: Vec<u16> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let ok = statuses.iter().filter(|s| **s == 200).count();
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 503),
        "{statuses:?}"
    );
    assert!(ok >= 256, "only {ok} of 1,000 answered");
    let status = std::fs::read_to_string(format!("/proc/{}/status", lb.child.0.id())).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    println!(
        "lb peak resident memory after 1,000 concurrent queries: {peak_kib} KiB ({ok} answered)"
    );
    assert!(peak_kib < 200 * 1024, "peak RSS {peak_kib} KiB");

    // One Prometheus stopped: every answer still comes, from the other.
    let [first, second] = prometheus;
    drop(first);
    for _ in 0..6 {
        assert_gets(&lb, "alice", &query(alice_rate), &["1"]);
    }

    // CEEMS's own YAML file, shared with its API server, configures the same.
    let yaml = data.path().join("ceems_lb.yml");
    std::fs::write(
        &yaml,
        format!(
            "ceems_api_server:\n  data:\n    path: {}\n  admin:\n    users: [admin]\nclusters:\n  - id: lab\n    manager: slurm\nceems_lb:\n  strategy: least-connection\n  backends:\n    - id: lab\n      tsdb_urls:\n        - {}\n",
            data.path().display(),
            second.url()
        ),
    )
    .unwrap();
    let config = format!("--config.file={}", yaml.display());
    let lb = start_subcommand(
        "lb",
        data.path(),
        &[&config, "--security.drop-privileges=false"],
        &[],
    );
    assert_gets(&lb, "alice", &format!("/lab{}", query(alice_rate)), &["1"]);
    assert_eq!(ask(&lb, Some("bob"), &query(alice_rate), None).0, 403);
    assert_eq!(ask(&lb, Some("admin"), &query(rate), None).0, 200);
}

#[test]
fn without_the_stats_servers_database_it_refuses_to_start_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ceems"))
        .args([
            "lb",
            "--lb.backend=lab=http://127.0.0.1:1",
            "--web.listen-address=127.0.0.1:0",
            "--security.drop-privileges=false",
        ])
        .arg(format!("--storage.data.path={}", dir.path().display()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ceems.db"), "{err}");
    assert!(
        !dir.path().join("ceems.db").exists(),
        "a read-only client created the database"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ceems"))
        .args(["lb", "--web.listen-address=127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("--lb.backend"));
}

/// Every panel of the example "my job" dashboard goes through the gate for the job's owner:
/// each of its queries names the job, and nothing else.
#[test]
fn the_example_dashboard_asks_only_for_the_chosen_job() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/grafana/dashboards/ceems-my-job.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 4);
    for panel in panels {
        assert_eq!(
            panel["datasource"]["uid"], "ceems-lb-lab",
            "{}",
            panel["title"]
        );
        for target in panel["targets"].as_array().unwrap() {
            // As Grafana sends it.
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "1m")
                .replace("$job", "4242");
            let scope = ceems::lb::query::scope_of_query(&expr)
                .unwrap_or_else(|e| panic!("{}: {expr}: {e}", panel["title"]));
            assert_eq!(
                scope.units.into_iter().collect::<Vec<_>>(),
                ["4242"],
                "{expr}"
            );
        }
    }
}

/// A job id that came back: job 7 was alice's, ended, and is now bob's. A node stand-in
/// exposes job 7's series as the cgroups would: alice's job's (value 1) until it ended, none
/// between the two jobs, bob's (value 2) since his began. Through the lb, alice reads her
/// job's samples and never bob's, whatever time she asks for; bob never reads hers.
#[test]
fn a_job_id_that_came_back_is_read_by_each_user_for_their_own_job_only() {
    if !runnable(
        "a_job_id_that_came_back_is_read_by_each_user_for_their_own_job_only",
        prometheus_tools(),
    ) {
        return;
    }
    let now = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    // Whose job 7 is: 1 (alice's), 0 (none), 2 (bob's).
    let owner = Arc::new(std::sync::atomic::AtomicU8::new(1));
    let node = {
        let owner = Arc::clone(&owner);
        TestServer::start(
            false,
            Arc::new(move |_| {
                let series = match owner.load(std::sync::atomic::Ordering::SeqCst) {
                    0 => String::new(),
                    who => format!("ceems_compute_unit_owner{{uuid=\"7\"}} {who}\n"),
                };
                Response::raw(
                    200,
                    format!("# TYPE ceems_compute_unit_owner gauge\n{series}"),
                )
                .with_header("Content-Type", "text/plain; version=0.0.4")
            }),
        )
    };
    let prometheus = Prometheus::start(&[node.port], &[]);
    wait_until("alice's job's samples", Duration::from_secs(60), || {
        prometheus.query("ceems_compute_unit_owner").len() == 1
    });
    // Her job began before the first scrape saw it; this is when it was first seen.
    let seen_alice = now() as i64;
    let alice_start = seen_alice - 5;
    std::thread::sleep(Duration::from_secs(4));
    owner.store(0, std::sync::atomic::Ordering::SeqCst);
    let alice_end = now().ceil() as i64;
    std::thread::sleep(Duration::from_secs(4));
    let bob_start = now().floor() as i64;
    owner.store(2, std::sync::atomic::Ordering::SeqCst);
    std::thread::sleep(Duration::from_secs(4));
    // The stats-server's database: both jobs 7, alice's ended, bob's running.
    let data = tempfile::tempdir().unwrap();
    let sacct = format!(
        "7|debug|normal|physics|alice|2001|alice|2001|{alice_start}|{alice_start}|{alice_end}|00:00:08|8|0:0|COMPLETED|billing=1,cpu=1,mem=300M,node=1|localhost|/tmp|60|wrap\n\
         7|debug|normal|chemistry|bob|2002|bob|2002|{bob_start}|{bob_start}|Unknown|00:00:04|4|0:0|RUNNING|billing=1,cpu=1,mem=300M,node=1|localhost|/tmp|60|wrap\n"
    );
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store = Store::open(&data.path().join("ceems.db")).await.unwrap();
        let (jobs, errors) = sacct::parse_output(&sacct);
        assert!(errors.is_empty(), "{errors:?}");
        store.ingest("lab", &jobs, 100, 1).await.unwrap();
    });
    let backend = format!("--lb.backend=lab={}", prometheus.url());
    let storage = format!("--storage.data.path={}", data.path().display());
    let lb = start_subcommand(
        "lb",
        data.path(),
        &[
            backend.as_str(),
            storage.as_str(),
            "--web.admin-users=admin",
            "--lb.scrape-interval=1s",
            "--security.drop-privileges=false",
        ],
        &[],
    );
    let selector = encode(r#"ceems_compute_unit_owner{uuid="7"}"#);
    // The owners of job 7 in an answer: each sample's value.
    let owners = |user: &str, path: &str| -> (u16, Vec<String>) {
        let (status, answer) = ask(&lb, Some(user), path, None);
        let mut seen: Vec<String> = Vec::new();
        for series in answer["data"]["result"].as_array().into_iter().flatten() {
            let samples = series["values"]
                .as_array()
                .cloned()
                .unwrap_or_else(|| vec![series["value"].clone()]);
            for v in samples {
                let v = v[1].as_str().unwrap_or("").to_owned();
                if !seen.contains(&v) {
                    seen.push(v);
                }
            }
        }
        (status, seen)
    };
    let instant = |t: i64| format!("/api/v1/query?query={selector}&time={t}");
    let range = format!(
        "/api/v1/query_range?query={selector}&start={}&end={}&step=1",
        alice_start - 60,
        now() as i64
    );
    // Alice, inside her job's life: her job's series.
    assert_eq!(
        owners("alice", &instant(seen_alice + 2)),
        (200, vec!["1".into()])
    );
    // Inside bob's: nothing of bob's (her job's last samples, at most).
    let (status, seen) = owners("alice", &instant(bob_start + 2));
    assert!(
        status == 403 || !seen.contains(&"2".to_owned()),
        "{status} {seen:?}"
    );
    // Her dashboard's whole range: her part of it only.
    assert_eq!(owners("alice", &range), (200, vec!["1".into()]));
    // Bob: his job's samples, never hers, whatever range he asks.
    assert_eq!(owners("bob", &range), (200, vec!["2".into()]));
    assert_eq!(
        owners("bob", &instant(seen_alice + 2)).1,
        Vec::<String>::new()
    );
    // A range inside bob's job is not alice's to read at all.
    let (status, _) = owners(
        "alice",
        &format!(
            "/api/v1/query_range?query={selector}&start={bob_start}&end={}&step=1",
            bob_start + 3
        ),
    );
    assert_eq!(status, 403);
    // Reaching into bob's job from hers with a negative offset is refused.
    let ahead = encode(r#"ceems_compute_unit_owner{uuid="7"} offset -1m"#);
    let (status, _) = owners(
        "alice",
        &format!("/api/v1/query?query={ahead}&time={}", seen_alice + 2),
    );
    assert_eq!(status, 403);
    // An admin reads both.
    let (status, mut seen) = owners("admin", &range);
    seen.sort();
    assert_eq!((status, seen), (200, vec!["1".into(), "2".into()]));
}

/// `ceems lb --web.munge-credentials`: a MUNGE credential made by alice (Debian's munged, a key
/// of the test's) reads alice's job only, even with an admin's name in the user header; bob's
/// reads bob's; a credential replayed is refused.
#[test]
fn munge_credentials_name_the_lb_s_user() {
    if !runnable("munge_credentials_name_the_lb_s_user", prometheus_tools()) {
        return;
    }
    let node = node();
    let prometheus = Prometheus::start(&[node.port], &[]);
    let rate = "rate(ceems_compute_unit_cpu_user_seconds_total[1m])";
    wait_until("two samples of each job", Duration::from_secs(60), || {
        prometheus.query(rate).len() == 2
    });
    let data = tempfile::tempdir().unwrap();
    database(data.path());
    let munge_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        munge_dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let munged = common::munge::munged(&munge_dir.path().join("munge"));
    let backend = format!("--lb.backend=lab={}", prometheus.url());
    let storage = format!("--storage.data.path={}", data.path().display());
    let socket = format!("--web.munge-socket={}", munged.socket.display());
    let args = [
        backend.as_str(),
        storage.as_str(),
        "--web.admin-users=admin",
        "--web.munge-credentials",
        socket.as_str(),
        "--security.drop-privileges=false",
    ];
    let lb = start_subcommand("lb", data.path(), &args, &[]);
    let of = |job: &str| {
        query(&format!(
            "rate(ceems_compute_unit_cpu_user_seconds_total{{uuid=\"{job}\"}}[1m])"
        ))
    };
    let get = |user: &str, header: Option<&str>, path: &str| -> (u16, String, String) {
        let cred = common::munge::credential(user, &munged.socket, &format!("GET {path}"), 300);
        let mut req = ureq::get(&lb.url(path)).set("Authorization", &format!("MUNGE {cred}"));
        if let Some(h) = header {
            req = req.set("X-Grafana-User", h);
        }
        let (status, body) = match req.call() {
            Ok(r) => (r.status(), r.into_string().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
            Err(e) => panic!("{e}"),
        };
        (status, body, cred)
    };
    // alice, naming the admin in the header: her job, and not bob's.
    let (status, body, cred) = get("alice", Some("admin"), &of("1"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        uuids(&serde_json::from_str(&body).unwrap()),
        ["1"],
        "{body}"
    );
    let (status, body, _) = get("alice", Some("admin"), &of("2"));
    assert_eq!(status, 403, "{body}");
    let (status, body, _) = get("bob", None, &of("2"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        uuids(&serde_json::from_str(&body).unwrap()),
        ["2"],
        "{body}"
    );
    let path = of("1");
    let replayed = ureq::get(&lb.url(&path))
        .set("Authorization", &format!("MUNGE {cred}"))
        .call();
    assert!(
        matches!(replayed, Err(ureq::Error::Status(401, _))),
        "a replayed credential: {replayed:?}"
    );
}

/// A cluster the lb serves that the stats-server's database has no job of is named at start:
/// its users would be refused every job.
#[test]
fn a_served_cluster_the_database_does_not_know_is_warned_about_at_start() {
    let data = tempfile::tempdir().unwrap();
    database(data.path());
    let log = data.path().join("lb.log");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_ceems"));
    command
        .current_dir(data.path())
        .args([
            "lb",
            &format!("--lb.backend=lab=http://127.0.0.1:{}", common::free_port()),
            &format!(
                "--lb.backend=slurm-0=http://127.0.0.1:{}",
                common::free_port()
            ),
            &format!("--storage.data.path={}", data.path().display()),
            "--security.drop-privileges=false",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let _lb = common::start_listening(command, "lb");
    let mut text = String::new();
    wait_until("the warning", Duration::from_secs(10), || {
        text = std::fs::read_to_string(&log).unwrap();
        text.contains("level=warn") && text.contains("has no job of this cluster")
    });
    let warned: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("has no job of this cluster"))
        .collect();
    assert_eq!(warned.len(), 1, "{text}");
    assert!(
        warned[0].contains("cluster=slurm-0") && warned[0].contains("lab"),
        "{text}"
    );
}
