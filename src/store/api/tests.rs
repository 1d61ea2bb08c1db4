use super::*;
use crate::manager::slurm::sacct;
use crate::manager::Associations;
use std::sync::Arc;

pub(crate) const NOW: i64 = 1_800_000_000;

pub(crate) fn line(id: u32, user: &str, project: &str, start: i64, end: Option<i64>) -> String {
    let (end, state) = match end {
        Some(e) => (e.to_string(), "COMPLETED"),
        None => ("Unknown".to_owned(), "RUNNING"),
    };
    format!("{id}|debug|normal|{project}|{user}|100|{user}|100|{start}|{start}|{end}|00:10:00|600|0:0|{state}|billing=1,cpu=2,mem=1G,node=1|localhost|/tmp|60|job {id}")
}

pub(crate) async fn api_with(lines: &[String], admins: &[&str]) -> (Api, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let store = crate::store::db::testing::store(tmp.path()).await;
    let (jobs, errors) = sacct::parse_output(&lines.join("\n"));
    assert!(errors.is_empty(), "{errors:?}");
    store.register_cluster("lab", "slurm").await.unwrap();
    store.ingest("lab", &jobs, 0, NOW).await.unwrap();
    let mut assoc = Associations::default();
    for j in &jobs {
        if !assoc.projects.contains(&j.account) {
            assoc.projects.push(j.account.clone());
        }
        let m = (j.user.clone(), j.account.clone());
        if !assoc.members.contains(&m) {
            assoc.members.push(m);
        }
    }
    store
        .replace_associations("lab", &assoc, NOW)
        .await
        .unwrap();
    store.rebuild_usage("lab", NOW).await.unwrap();
    store
        .refresh_findings(
            "lab",
            &crate::store::findings::Thresholds::default(),
            &crate::store::rules::SiteRules::default(),
            NOW,
        )
        .await
        .unwrap();
    store
        .set_admins(
            "config",
            &admins.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    (Api::new(Arc::new(store), "X-Grafana-User"), tmp)
}

pub(super) fn data(a: &Answer) -> Vec<Value> {
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    a.json()["data"].as_array().expect("data array").clone()
}

pub(super) fn sample() -> Vec<String> {
    vec![
        line(1, "alice", "physics", NOW - 3600, Some(NOW - 600)),
        line(2, "bob", "chemistry", NOW - 3600, None),
        line(
            3,
            "alice",
            "physics",
            NOW - 10 * 86400,
            Some(NOW - 9 * 86400),
        ),
    ]
}

#[tokio::test]
async fn who_gets_what_on_every_route() {
    let (api, _tmp) = api_with(&sample(), &["root"]).await;
    let user_routes = [
        "/units",
        "/usage/current",
        "/usage/global",
        "/projects",
        "/users",
    ];
    let admin_routes = [
        "/units/admin",
        "/usage/current/admin",
        "/usage/global/admin",
        "/projects/admin",
        "/users/admin",
        "/clusters/admin",
        "/findings/admin",
    ];
    for route in user_routes.iter().chain(&admin_routes) {
        let path = format!("/api/v1{route}");
        let none = api.handle(&path, None, None, NOW).await;
        assert_eq!(
            none.status,
            StatusCode::UNAUTHORIZED,
            "{route} without a user"
        );
        assert_eq!(none.json()["errorType"], "unauthorized");
        let empty = api.handle(&path, None, Some(" "), NOW).await;
        assert_eq!(
            empty.status,
            StatusCode::UNAUTHORIZED,
            "{route} with an empty user"
        );
        let alice = api.handle(&path, None, Some("alice"), NOW).await;
        let expected = if admin_routes.contains(route) {
            StatusCode::FORBIDDEN
        } else {
            StatusCode::OK
        };
        assert_eq!(alice.status, expected, "{route} as alice: {}", alice.text());
        let root = api.handle(&path, None, Some("root"), NOW).await;
        assert_eq!(
            root.status,
            StatusCode::OK,
            "{route} as root: {}",
            root.text()
        );
        assert_eq!(root.json()["status"], "success");
    }
    let health = api.handle("/api/v1/health", None, None, NOW).await;
    assert_eq!(
        (health.status, &health.json()["data"]),
        (StatusCode::OK, &json!("ok"))
    );
    assert_eq!(
        api.handle("/api/v1/nope", None, Some("alice"), NOW)
            .await
            .status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn findings_of_a_job_for_its_owner_and_admins_and_per_project_for_admins() {
    let mut lines = sample();
    lines[0] = lines[0].replace("COMPLETED", "TIMEOUT");
    let (api, _tmp) = api_with(&lines, &["root"]).await;
    let get = |path: &'static str, user: Option<&'static str>| {
        let api = &api;
        let (path, query) = match path.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path, None),
        };
        async move { api.handle(path, query, user, NOW).await }
    };
    let own = get("/api/v1/units/lab/1/findings", Some("alice")).await;
    assert_eq!(own.status, StatusCode::OK, "{}", own.text());
    let f = &own.json()["data"];
    assert_eq!((&f["uuid"], &f["user"]), (&json!("1"), &json!("alice")));
    assert_eq!(f["findings"][0]["id"], "job_failed");
    assert!(f["findings"][0]["message"]
        .as_str()
        .unwrap()
        .contains("TIMEOUT"));
    assert!(f["findings"][0]["advice"]
        .as_str()
        .unwrap()
        .contains("--time"));
    for (path, user, status) in [
        ("/api/v1/units/lab/1/findings", Some("root"), StatusCode::OK),
        (
            "/api/v1/units/lab/1/findings",
            Some("bob"),
            StatusCode::FORBIDDEN,
        ),
        (
            "/api/v1/units/lab/1/findings",
            None,
            StatusCode::UNAUTHORIZED,
        ),
        (
            "/api/v1/units/lab/1;x/findings",
            Some("alice"),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/api/v1/units/lab/42/findings",
            Some("alice"),
            StatusCode::NOT_FOUND,
        ),
        (
            "/api/v1/units/1/findings",
            Some("alice"),
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let a = get(path, user).await;
        assert_eq!(a.status, status, "{path} as {user:?}: {}", a.text());
    }
    // The `findings` field on /units.
    let units = get("/api/v1/units?field=uuid&field=findings", Some("alice")).await;
    assert_eq!(data(&units)[0]["findings"][0]["id"], "job_failed");
    // The admin summary counts finding ids per project.
    let summary = get("/api/v1/findings/admin", Some("root")).await;
    assert_eq!(
        data(&summary),
        [
            json!({"cluster_id": "lab", "project": "physics", "finding": "job_failed", "num_units": 1, "num_users": 1})
        ]
    );
}

#[tokio::test]
async fn units_filter_by_window_and_fields_and_reject_bad_parameters() {
    let (api, _tmp) = api_with(&sample(), &["root"]).await;
    // Default window (the last day): job 1 only for alice; job 3 ended 9 days ago.
    let a = api.handle("/api/v1/units", None, Some("alice"), NOW).await;
    let uuids: Vec<Value> = data(&a).iter().map(|u| u["uuid"].clone()).collect();
    assert_eq!(uuids, [json!("1")]);
    // CEEMS's shape: the allocation nested, times in milliseconds and as text.
    assert_eq!(data(&a)[0]["allocation"]["cpus"], 2);
    assert_eq!(data(&a)[0]["username"], "alice");
    assert_eq!(data(&a)[0]["ended_at_ts"], (NOW - 600) * 1000);
    assert_eq!(data(&a)[0]["elapsed"], "00:10:00");
    assert_eq!(data(&a)[0]["tags"]["partition"], "debug");
    // Ours only when named; a name neither knows is dropped.
    assert!(data(&a)[0].get("alloc_cpus").is_none());
    let a = api
        .handle(
            "/api/v1/units",
            Some("field=alloc_cpus&field=uuid&field=nonsense"),
            Some("alice"),
            NOW,
        )
        .await;
    assert_eq!(data(&a), [json!({"uuid": "1", "alloc_cpus": 2})]);
    // A time zone a request names, or the server's.
    let a = api
        .handle(
            "/api/v1/units",
            Some("field=ended_at&timezone=Europe%2FAthens"),
            Some("alice"),
            NOW,
        )
        .await;
    assert_eq!(data(&a), [json!({"ended_at": "2027-01-15T09:50:00+0200"})]);
    // CEEMS ignores a parameter it does not know, and `user` on a user's route.
    for query in ["sort=uuid", "user=bob", "user=bob&field=username"] {
        let a = api
            .handle("/api/v1/units", Some(query), Some("alice"), NOW)
            .await;
        assert!(
            data(&a)
                .iter()
                .all(|u| u.get("username").is_none_or(|n| n == "alice")),
            "{query}: {}",
            a.text()
        );
    }
    let from = (NOW - 11 * 86400).to_string();
    let a = api
        .handle(
            "/api/v1/units",
            Some(&format!("from={from}&field=uuid&field=state")),
            Some("alice"),
            NOW,
        )
        .await;
    assert_eq!(data(&a).len(), 2);
    assert_eq!(data(&a)[1], json!({"uuid": "3", "state": "COMPLETED"}));
    // Admin: any user's, filtered by user.
    let a = api
        .handle(
            "/api/v1/units/admin",
            Some("user=bob&running"),
            Some("root"),
            NOW,
        )
        .await;
    assert_eq!(data(&a).len(), 1);
    assert_eq!(data(&a)[0]["uuid"], "2");

    for (query, says) in [
        ("from=yesterday", "not a unix time"),
        ("from=-5", "not a unix time"),
        ("field=password", "invalid query fields"),
        ("from=20&to=10", "is after"),
        ("running=maybe", "not true or false"),
        ("timezone=Mars%2FOlympus", "timezone"),
    ] {
        let a = api
            .handle("/api/v1/units", Some(query), Some("alice"), NOW)
            .await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{query}");
        assert_eq!(a.json()["errorType"], "bad_data");
        assert!(
            a.json()["error"].as_str().unwrap().contains(says),
            "{query}: {}",
            a.text()
        );
    }
    // A quote in a value is data, not SQL.
    let a = api
        .handle(
            "/api/v1/units",
            Some("project=%27%20OR%20%271%27%3D%271"),
            Some("alice"),
            NOW,
        )
        .await;
    assert!(data(&a).is_empty());
}

/// As CEEMS: current usage is of the jobs written (listed by the manager) in the window,
/// which is widened to a 15-minute grid; `__terminated` keeps the ended ones; `experimental`
/// counts the jobs by the day they were written.
#[tokio::test]
async fn current_usage_is_of_the_jobs_written_in_the_window() {
    let tmp = tempfile::tempdir().unwrap();
    let store = crate::store::db::testing::store(tmp.path()).await;
    store.register_cluster("lab", "slurm").await.unwrap();
    let written = |lines: Vec<String>| sacct::parse_output(&lines.join("\n")).0;
    // Job 3 was last listed nine days ago; jobs 1 and 2 (running) at NOW.
    let old = written(vec![line(
        3,
        "alice",
        "physics",
        NOW - 10 * 86400,
        Some(NOW - 9 * 86400),
    )]);
    store.ingest("lab", &old, 0, NOW - 9 * 86400).await.unwrap();
    let recent = written(vec![
        line(1, "alice", "physics", NOW - 3600, Some(NOW - 600)),
        line(2, "alice", "physics", NOW - 3600, None),
    ]);
    store.ingest("lab", &recent, 0, NOW).await.unwrap();
    let api = Api::new(Arc::new(store), "X-Grafana-User");
    let units = |query: String| {
        let api = &api;
        async move {
            let a = api
                .handle("/api/v1/usage/current", Some(&query), Some("alice"), NOW)
                .await;
            data(&a)
                .first()
                .map_or(0, |r| r["num_units"].as_i64().unwrap())
        }
    };
    assert_eq!(units(String::new()).await, 2);
    assert_eq!(units("__terminated".into()).await, 1);
    assert_eq!(units(format!("from={}", NOW - 10 * 86400)).await, 3);
    // The grid (NOW is on it): a window ending 100 s before NOW is widened to reach it, one
    // ending 950 s before is not.
    assert_eq!(
        units(format!("from={}&to={}", NOW - 200, NOW - 100)).await,
        2
    );
    assert_eq!(
        units(format!("from={}&to={}", NOW - 1000, NOW - 950)).await,
        0
    );
    // `experimental`, CEEMS's daily usage: the jobs written on the days that start in the
    // window (NOW is 8 h into its UTC day).
    let day = NOW - NOW % 86400;
    assert_eq!(NOW - day, 8 * 3600);
    let daily = |from: i64, to: i64| format!("experimental&from={from}&to={to}");
    assert_eq!(units(daily(NOW - 3600, NOW)).await, 0);
    assert_eq!(units(daily(day - 60, NOW)).await, 2);
    assert_eq!(units(daily(NOW - 10 * 86400, NOW)).await, 3);
}

#[tokio::test]
async fn usage_sums_jobs_per_project_and_user() {
    let (api, _tmp) = api_with(&sample(), &["root"]).await;
    let a = api
        .handle("/api/v1/usage/global", None, Some("alice"), NOW)
        .await;
    assert_eq!(data(&a).len(), 1);
    assert_eq!(data(&a)[0]["num_units"], 2);
    assert_eq!(data(&a)[0]["project"], "physics");
    let a = api
        .handle(
            "/api/v1/usage/global/admin",
            Some("groupby=project"),
            Some("root"),
            NOW,
        )
        .await;
    let projects: Vec<Value> = data(&a).iter().map(|u| u["project"].clone()).collect();
    assert_eq!(projects, [json!("chemistry"), json!("physics")]);
    assert_eq!(data(&a)[0]["username"], "");
    let a = api
        .handle("/api/v1/usage/current", None, Some("alice"), NOW)
        .await;
    // Both of alice's jobs were written at NOW, the old one too.
    assert_eq!(data(&a)[0]["num_units"], 2);
    let a = api
        .handle(
            "/api/v1/usage/current",
            Some("groupby=node"),
            Some("alice"),
            NOW,
        )
        .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    let a = api
        .handle("/api/v1/projects", None, Some("alice"), NOW)
        .await;
    assert_eq!(
        data(&a),
        vec![
            json!({"cluster_id": "lab", "resource_manager": "slurm", "name": "physics",
                    "users": ["alice"]})
        ]
    );
    // CEEMS's usage row: the plain fields always, the series objects, ours when named.
    let a = api
        .handle("/api/v1/usage/current", Some("from=0"), Some("alice"), NOW)
        .await;
    let row = &data(&a)[0];
    assert_eq!(row["username"], "alice");
    assert_eq!(row["groupname"], "alice");
    assert_eq!(row["resource_manager"], "slurm");
    // Wall time from start to end, as CEEMS counts it: 3,000 s and a day.
    assert_eq!(row["total_time_seconds"]["walltime"], 89400);
    assert_eq!(row["total_time_seconds"]["alloc_cputime"], 2 * 89400);
    assert!(row.get("total_elapsed_seconds").is_none());
    let a = api
        .handle(
            "/api/v1/usage/current",
            Some("from=0&field=num_units&field=total_elapsed_seconds&field=bogus"),
            Some("alice"),
            NOW,
        )
        .await;
    assert_eq!(
        data(&a)[0],
        json!({"cluster_id": "", "resource_manager": "", "num_units": 2, "project": "",
               "groupname": "", "username": "", "total_elapsed_seconds": 1200})
    );
}

#[tokio::test]
async fn cached_answers_end_with_the_next_write() {
    let (api, _tmp) = api_with(&sample(), &["root"]).await;
    let first = api.handle("/api/v1/units", None, Some("alice"), NOW).await;
    assert_eq!(data(&first).len(), 1);
    // Within the same minute the answer comes from the cache; a new job is a write.
    let (jobs, _) = sacct::parse_output(&line(9, "alice", "physics", NOW - 120, Some(NOW - 60)));
    api.store.ingest("lab", &jobs, 0, NOW).await.unwrap();
    let second = api
        .handle("/api/v1/units", None, Some("alice"), NOW + 1)
        .await;
    assert_eq!(data(&second).len(), 2, "a stale answer was served");
    // Another user never gets alice's cached answer.
    let bob = api
        .handle("/api/v1/units", None, Some("bob"), NOW + 1)
        .await;
    assert!(data(&bob).iter().all(|u| u["username"] == "bob"));
    // Nor a non-admin an admin's.
    assert_eq!(
        api.handle("/api/v1/units/admin", None, Some("root"), NOW)
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        api.handle("/api/v1/units/admin", None, Some("alice"), NOW)
            .await
            .status,
        StatusCode::FORBIDDEN
    );
}

/// An answer read before a write, and kept after a newer one, neither stands nor evicts it.
#[tokio::test]
async fn a_late_answer_from_before_a_write_does_not_evict_newer_ones() {
    let (api, _tmp) = api_with(&sample(), &[]).await;
    let answer = |text: &'static str| {
        Answer::new(StatusCode::OK, bytes::Bytes::from_static(text.as_bytes()))
    };
    api.remember("new".into(), 2, &answer("new"));
    api.remember("old".into(), 1, &answer("old"));
    let cache = api.cache.lock().unwrap();
    assert_eq!(cache.generation, 2);
    assert_eq!(cache.answers.get("new"), Some(&answer("new")));
    assert!(!cache.answers.contains_key("old"));
}

/// A job's rendering is shared by requests for other windows and field sets only while
/// nothing was written: a job that ended since is shown ended, whatever the window.
#[tokio::test]
async fn rendered_jobs_are_reused_across_windows_only_until_a_write() {
    let (api, _tmp) = api_with(&sample(), &["root"]).await;
    let units = |from: i64, fields: &str| {
        let query = format!("from={from}&running{fields}");
        let api = &api;
        async move {
            data(
                &api.handle("/api/v1/units", Some(&query), Some("bob"), NOW)
                    .await,
            )
        }
    };
    let running = units(NOW - 7200, "").await;
    assert_eq!(running.len(), 1);
    assert_eq!(running[0]["state"], "RUNNING");
    assert_eq!(running[0]["ended_at_ts"], Value::Null);
    // CEEMS's fields that a running job has: no end time in milliseconds, no series yet.
    let keys: Vec<&str> = running[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert!(keys.len() < CEEMS_UNIT_FIELDS, "{keys:?}");
    assert!(keys
        .iter()
        .all(|k| UNIT_FIELDS[..CEEMS_UNIT_FIELDS].contains(k)));
    assert_eq!(running[0]["ended_at"], "Unknown");
    // The same job for another window, then with one field: each set of fields its own.
    let one_field = units(NOW - 7201, "&field=uuid").await;
    assert_eq!(one_field, vec![json!({"uuid": "2"})]);
    assert_eq!(units(NOW - 7202, "").await, running);
    // The job ends: the next answer, for yet another window, says so.
    let (jobs, _) = sacct::parse_output(&line(2, "bob", "chemistry", NOW - 3600, Some(NOW - 60)));
    api.store.ingest("lab", &jobs, 0, NOW).await.unwrap();
    let ended = units(NOW - 7203, "").await;
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0]["state"], "COMPLETED");
    assert_eq!(ended[0]["ended_at_ts"], (NOW - 60) * 1000);
}

/// A user's window in SQL is one range of the index `units_by_user_end`: were the query
/// and the index to spell the end differently, every request with a filter besides the
/// user would read all of the user's jobs.
#[tokio::test]
async fn a_users_window_is_searched_as_a_range_of_the_index() {
    let (api, _tmp) = api_with(&sample(), &[]).await;
    if api.store.backend() != Backend::Sqlite {
        // SQLite's planner; PostgreSQL's reads a table this small whole whatever the index.
        return;
    }
    let mut q = Sql::new("EXPLAIN QUERY PLAN SELECT id, started_at FROM units WHERE 1 = 1");
    q.push_in("usr", &["alice".to_owned()])
        .push_ended_in(NOW - 86400, NOW, false);
    let plan: Vec<String> = api
        .fetch(q)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<String>(3).unwrap())
        .collect();
    assert!(
        plan.iter()
            .any(|p| p.contains("INDEX units_by_user_end (usr=? AND <expr>>? AND <expr><?)")),
        "{plan:?}"
    );
}

mod no_leaks {
    use super::*;
    use proptest::prelude::*;

    const USERS: &[&str] = &["alice", "bob", "carol", "dave"];
    const PROJECTS: &[&str] = &["physics", "chemistry", "biology"];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Whatever the jobs and whatever a user asks for, a non-admin's answers name no
        /// other user and hold no other user's job.
        #[test]
        fn a_user_never_sees_another_users_jobs(
            jobs in proptest::collection::vec((0usize..4, 0usize..3, 0i64..20, proptest::option::of(1i64..10)), 1..40),
            asker in 0usize..4,
        ) {
            let lines: Vec<String> = jobs
                .iter()
                .enumerate()
                .map(|(i, (u, p, start_h, len_h))| {
                    let start = NOW - start_h * 3600;
                    line(i as u32 + 1, USERS[*u], PROJECTS[*p], start, len_h.map(|l| (start + l * 3600).min(NOW)))
                })
                .collect();
            let owner: Vec<&str> = jobs.iter().map(|(u, ..)| USERS[*u]).collect();
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let (api, _tmp) = api_with(&lines, &["root"]).await;
                let me = USERS[asker];
                let others: Vec<String> = (1..=jobs.len())
                    .filter(|i| owner[i - 1] != me)
                    .map(|i| i.to_string())
                    .collect();
                let all_projects = PROJECTS.iter().map(|p| format!("project={p}")).collect::<Vec<_>>().join("&");
                let all_uuids = others.iter().map(|u| format!("uuid={u}")).collect::<Vec<_>>().join("&");
                let wide = format!("from=0&to={}", NOW + 1);
                let asks = [
                    ("/api/v1/units", format!("{wide}&running")),
                    ("/api/v1/units", format!("{wide}&{all_projects}")),
                    ("/api/v1/units", format!("{wide}&{all_uuids}")),
                    ("/api/v1/usage/current", format!("{wide}&{all_projects}")),
                    ("/api/v1/usage/current", format!("{wide}&groupby=project")),
                    ("/api/v1/usage/global", all_projects.clone()),
                    ("/api/v1/usage/global", "groupby=project".to_owned()),
                    ("/api/v1/users", String::new()),
                    ("/api/v1/users", format!("user={}", USERS.join("&user="))),
                ];
                let mine = owner.iter().filter(|o| **o == me).count();
                // Usage shows, as CEEMS's does, the members of the projects one is in.
                let my_projects: Vec<usize> = jobs.iter().filter(|(u, ..)| USERS[*u] == me).map(|(_, p, ..)| *p).collect();
                let mates: Vec<&str> = jobs.iter().filter(|(_, p, ..)| my_projects.contains(p)).map(|(u, ..)| USERS[*u]).collect();
                for (path, query) in asks {
                    let a = api.handle(path, Some(&query), Some(me), NOW).await;
                    prop_assert_eq!(a.status, StatusCode::OK, "{} {}", path, a.text());
                    let text = a.text().to_owned();
                    let usage = path.contains("/usage/");
                    for other in USERS.iter().filter(|u| **u != me && !(usage && mates.contains(u))) {
                        prop_assert!(!text.contains(&format!("\"{other}\"")), "{} {} shows {}: {}", path, query, other, text);
                    }
                    for row in a.json()["data"].as_array().unwrap() {
                        if let Some(uuid) = row.get("uuid").and_then(Value::as_str) {
                            prop_assert!(!others.iter().any(|o| o == uuid), "{} shows job {}", path, uuid);
                        }
                        if let Some(n) = row.get("num_units").and_then(Value::as_u64) {
                            if row["username"] == me || row["username"] == "" && !usage {
                                prop_assert!(n as usize <= mine, "{} counts {} jobs; {} has {}", path, n, me, mine);
                            }
                        }
                    }
                }
                // A project's members, as CEEMS lists them, are only those of the asker's
                // own projects.
                let a = api.handle("/api/v1/projects", Some(&all_projects), Some(me), NOW).await;
                for p in a.json()["data"].as_array().unwrap() {
                    let users = p["users"].as_array().unwrap();
                    prop_assert!(users.iter().any(|u| u == me), "{} is not in {}", me, p);
                }
                // The admin sees them all.
                let a = api.handle("/api/v1/units/admin", Some(&format!("{wide}&running")), Some("root"), NOW).await;
                prop_assert_eq!(a.json()["data"].as_array().unwrap().len(), jobs.len());
                Ok(())
            })?;
        }

        /// A user's window answered from the cached spans selects the same jobs, in the
        /// same order, as SQL does (a filter on the cluster sends a request to SQL).
        #[test]
        fn spans_select_what_sql_selects(
            jobs in proptest::collection::vec((0usize..2, 0i64..48, proptest::option::of(0i64..12)), 1..40),
            windows in proptest::collection::vec((0i64..48, 0i64..24, any::<bool>()), 1..6),
        ) {
            let lines: Vec<String> = jobs
                .iter()
                .enumerate()
                .map(|(i, (u, start_h, len_h))| {
                    let start = NOW - start_h * 1800;
                    line(i as u32 + 1, USERS[*u], "physics", start, len_h.map(|l| (start + l * 1800).min(NOW)))
                })
                .collect();
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let (api, _tmp) = api_with(&lines, &["root"]).await;
                let uuids = |a: Answer| -> Vec<String> {
                    a.json()["data"].as_array().unwrap().iter()
                        .map(|u| u["uuid"].as_str().unwrap().to_owned()).collect()
                };
                for (from_h, len_h, running) in windows {
                    let from = NOW - from_h * 1800;
                    let to = from + len_h * 1800;
                    let window = format!("from={from}&to={to}&field=uuid{}", if running { "&running" } else { "" });
                    for me in ["alice", "bob"] {
                        let spans = uuids(api.handle("/api/v1/units", Some(&window), Some(me), NOW).await);
                        let sql = uuids(api.handle("/api/v1/units", Some(&format!("{window}&cluster_id=lab")), Some(me), NOW).await);
                        prop_assert_eq!(&spans, &sql, "{} {}", me, window);
                        let admin = uuids(api.handle("/api/v1/units/admin", Some(&format!("{window}&user={me}")), Some("root"), NOW).await);
                        prop_assert_eq!(&admin, &sql, "root for {} {}", me, window);
                    }
                }
                Ok(())
            })?;
        }
    }
}

#[tokio::test]
async fn each_cluster_answers_with_its_own_manager() {
    let (api, _tmp) = api_with(&sample(), &["root"]).await;
    let (jobs, _) = sacct::parse_output(&line(9, "carol", "bio", NOW - 60, None));
    api.store.ingest("cloud", &jobs, 0, NOW).await.unwrap();
    api.store
        .register_cluster("cloud", "openstack")
        .await
        .unwrap();
    let clusters = data(
        &api.handle("/api/v1/clusters/admin", None, Some("root"), NOW)
            .await,
    );
    let managers: Vec<(&str, &str)> = clusters
        .iter()
        .map(|c| (c["id"].as_str().unwrap(), c["manager"].as_str().unwrap()))
        .collect();
    assert_eq!(managers, [("cloud", "openstack"), ("lab", "slurm")]);
    let units = data(
        &api.handle(
            "/api/v1/units/admin",
            Some("field=uuid&field=resource_manager&running"),
            Some("root"),
            NOW,
        )
        .await,
    );
    let of = |uuid: &str| {
        units
            .iter()
            .find(|u| u["uuid"] == uuid)
            .map(|u| u["resource_manager"].clone())
    };
    assert_eq!(of("9"), Some(Value::from("openstack")));
    assert_eq!(of("1"), Some(Value::from("slurm")));
    // A cloud's users and projects have ids besides their names, answered as `uid`.
    let keystone = Associations {
        projects: vec!["bio".into()],
        members: vec![("carol".into(), "bio".into())],
        user_uids: [("carol".to_owned(), "c4701".to_owned())].into(),
        project_uids: [("bio".to_owned(), "b10".to_owned())].into(),
    };
    api.store
        .replace_associations("cloud", &keystone, NOW)
        .await
        .unwrap();
    let projects = data(
        &api.handle("/api/v1/projects", None, Some("carol"), NOW)
            .await,
    );
    assert_eq!(
        projects,
        [
            json!({"uid": "b10", "cluster_id": "cloud", "resource_manager": "openstack",
                "name": "bio", "users": ["carol"]})
        ]
    );
    let users = data(&api.handle("/api/v1/users", None, Some("carol"), NOW).await);
    assert_eq!(users[0]["uid"], "c4701");
}

/// `/units/verify`: a user's own units and those of their projects pass, any other or an
/// unknown one is CEEMS's 403; `/stats/*/admin` counts units, active ones, projects, users.
#[tokio::test]
async fn units_are_verified_and_clusters_counted_as_ceems_does() {
    let mut lines = sample();
    // carol is in physics with alice.
    lines.push(line(5, "carol", "physics", NOW - 3000, Some(NOW - 100)));
    let (api, _tmp) = api_with(&lines, &["root"]).await;
    let verify = |user: &'static str, uuids: &'static str| {
        let api = &api;
        async move {
            api.handle(
                "/api/v1/units/verify",
                Some(&format!("cluster_id=lab&{uuids}")),
                Some(user),
                NOW,
            )
            .await
        }
    };
    let own_and_mates = verify("alice", "uuid=1&uuid=5").await;
    assert_eq!(
        own_and_mates.status,
        StatusCode::OK,
        "{}",
        own_and_mates.text()
    );
    assert_eq!(
        own_and_mates.json(),
        json!({"status": "success", "data": null})
    );
    for (user, uuids) in [
        ("alice", "uuid=1&uuid=2"),
        ("bob", "uuid=1"),
        ("alice", "uuid=99"),
    ] {
        let denied = verify(user, uuids).await;
        assert_eq!(denied.status, StatusCode::FORBIDDEN, "{user} {uuids}");
        assert_eq!(
            denied.json()["error"],
            "user do not have permissions to view metrics of this job/pod/vm"
        );
    }
    assert_eq!(verify("root", "uuid=2").await.status, StatusCode::OK);
    let stats = api
        .handle("/api/v1/stats/global/admin", None, Some("root"), NOW)
        .await;
    assert_eq!(
        data(&stats),
        [
            json!({"cluster_id": "lab", "resource_manager": "slurm", "num_units": 4,
                "num_inactive_units": 3, "num_active_units": 1, "num_projects": 2,
                "num_users": 3})
        ]
    );
    // The last hour: jobs 1, 2 (running) and 5.
    let stats = api
        .handle(
            "/api/v1/stats/current/admin",
            Some(&format!("from={}&to={NOW}", NOW - 3600)),
            Some("root"),
            NOW,
        )
        .await;
    assert_eq!(data(&stats)[0]["num_units"], 3);
    let refused = api
        .handle("/api/v1/stats/global/admin", None, Some("alice"), NOW)
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
}

/// An admin naming a user gets, as in CEEMS, the usage of that user's projects: every
/// member's row, no one else's.
#[tokio::test]
async fn an_admin_naming_a_user_gets_the_usage_of_their_projects() {
    let mut lines = sample();
    lines.push(line(6, "carol", "chemistry", NOW - 3000, Some(NOW - 100)));
    let (api, _tmp) = api_with(&lines, &["root"]).await;
    let a = api
        .handle(
            "/api/v1/usage/global/admin",
            Some("user=bob"),
            Some("root"),
            NOW,
        )
        .await;
    let rows: Vec<(Value, Value)> = data(&a)
        .iter()
        .map(|r| (r["project"].clone(), r["username"].clone()))
        .collect();
    assert_eq!(
        rows,
        [
            (json!("chemistry"), json!("bob")),
            (json!("chemistry"), json!("carol"))
        ]
    );
}

/// CEEMS's load balancer asks for the admins with `role=admin` on `/users/admin`: the
/// configured ones and CEEMS's service account; on a user's route the parameter changes
/// nothing (alice gets her own record, not the admins).
#[tokio::test]
async fn the_admins_are_listed_for_ceems_load_balancer() {
    let (api, _tmp) = api_with(&sample(), &["root"]).await;
    let a = api
        .handle(
            "/api/v1/users/admin",
            Some("role=admin"),
            Some("ceems-int-svc"),
            NOW,
        )
        .await;
    let names: Vec<Value> = data(&a).iter().map(|u| u["name"].clone()).collect();
    assert_eq!(names, [json!("root"), json!("ceems-int-svc")]);
    assert_eq!(data(&a)[0]["tags"], json!(["config"]));
    let a = api
        .handle("/api/v1/users", Some("role=admin"), Some("alice"), NOW)
        .await;
    let names: Vec<Value> = data(&a).iter().map(|u| u["name"].clone()).collect();
    assert_eq!(names, [json!("alice")]);
    let a = api
        .handle(
            "/api/v1/users/admin",
            Some("role=admin"),
            Some("alice"),
            NOW,
        )
        .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
}

/// The updater commits a batch of jobs' aggregates every moment while it runs: `/units` shows
/// those jobs' new figures at once and keeps the jobs it rendered that did not change.
#[tokio::test]
async fn an_aggregate_commit_drops_only_its_jobs_from_the_cache() {
    use crate::store::db::AggregateDelta;
    let (api, _tmp) = api_with(&sample(), &[]).await;
    let q = Some("from=0&field=uuid&field=name&field=total_cpu_seconds");
    let by_uuid = |a: &Answer| -> Vec<(String, Value, Value)> {
        let mut rows: Vec<_> = data(a)
            .iter()
            .map(|u| {
                let id = u["uuid"].as_str().unwrap_or_default().to_owned();
                (id, u["name"].clone(), u["total_cpu_seconds"].clone())
            })
            .collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        rows
    };
    let first = by_uuid(&api.handle("/api/v1/units", q, Some("alice"), NOW).await);
    assert_eq!(first.len(), 2, "{first:?}");
    // Renamed behind the store's back (no commit through it): what the cache keeps shows.
    api.store
        .execute(&Sql::new("UPDATE units SET name = 'renamed'"))
        .await
        .unwrap();
    let targets = api.store.aggregate_targets("lab", None, NOW).await.unwrap();
    let job = targets.iter().find(|t| t.uuid == "1").unwrap();
    let delta = AggregateDelta {
        row: job.row,
        counted_until: job.counted_until,
        to: job.to,
        ended: true,
        seconds: 600,
        cpu_seconds: 900.0,
        ..Default::default()
    };
    api.store.apply_aggregates(&[delta], NOW).await.unwrap();
    let second = by_uuid(&api.handle("/api/v1/units", q, Some("alice"), NOW).await);
    // Job 1 read again, with its CPU time; job 3 from the cache.
    assert_eq!(second[0].0, "1");
    assert_eq!(second[0].1, json!("renamed"));
    assert_eq!(second[0].2, json!(900.0));
    if api.store.backend() == crate::store::sql::Backend::Sqlite {
        assert_eq!(second[1], first[1]);
    } else {
        // PostgreSQL's generation is the database's: other servers' commits are not known.
        assert_eq!(second[1].1, json!("renamed"));
    }
    // Any other commit (a new job) starts the cache over.
    let (jobs, _) = sacct::parse_output(&line(9, "alice", "physics", NOW - 120, Some(NOW - 60)));
    api.store.ingest("lab", &jobs, 0, NOW).await.unwrap();
    let third = by_uuid(&api.handle("/api/v1/units", q, Some("alice"), NOW).await);
    assert_eq!(third.len(), 3);
    assert_eq!(third[1].1, json!("renamed"), "job 3 from before: {third:?}");
}

/// Grafana asks for gzip: a cached answer is compressed once, for its first such request.
#[tokio::test]
async fn a_cached_answer_is_compressed_once() {
    let (api, _tmp) = api_with(&sample(), &[]).await;
    let first = api.handle("/api/v1/units", None, Some("alice"), NOW).await;
    let compressions = std::sync::atomic::AtomicUsize::new(0);
    let compress = |body: &[u8]| {
        compressions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut z, body).ok()?;
        z.finish().ok().map(bytes::Bytes::from)
    };
    let zipped = first.compressed(compress).expect("gzip");
    let again = api.handle("/api/v1/units", None, Some("alice"), NOW).await;
    assert_eq!(again.compressed(compress), Some(zipped.clone()));
    assert_eq!(compressions.into_inner(), 1, "compressed again");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&zipped[..]), &mut text)
        .unwrap();
    assert_eq!(text.as_bytes(), &first.body[..]);
    assert_eq!(data(&first).len(), 1);
}
