//! The database's own tests, on the backend `testing::store` picks.

use super::{backup_name, prune_backups, testing, Readers, Store};
use crate::manager::slurm::sacct;
use crate::manager::UnitRecord;
use crate::store::sql::{Backend, Sql};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_openers_of_a_new_database_migrate_it_once() {
    let tmp = tempfile::tempdir().unwrap();
    for round in 0..8 {
        let path = tmp.path().join(format!("{round}.db"));
        let (a, b, c) = tokio::join!(Store::open(&path), Store::open(&path), Store::open(&path));
        for store in [a, b, c] {
            let store = store.unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert_eq!(store.count_units("lab").await.unwrap(), 0);
        }
    }
}

const LINES: &str = "\
1|debug|normal|physics|alice|2001|alice|2001|1795358897|1795358897|1795358926|00:00:29|29|0:0|COMPLETED|billing=1,cpu=1,mem=300M,node=1|localhost|/tmp|60|wrap
2|debug|normal|chemistry|bob|2002|bob|2002|1795359473|None|Unknown|00:00:00|0|0:0|PENDING||None assigned|/tmp|60|wrap
";

/// `count` jobs like the first of LINES, numbered from 10, each line as `edit` leaves it.
fn numbered_jobs(count: usize, edit: impl Fn(usize, String) -> String) -> Vec<UnitRecord> {
    let first = LINES.lines().next().unwrap();
    let text: Vec<String> = (0..count)
        .map(|i| edit(i, first.replacen("1|", &format!("{}|", 10 + i), 1)))
        .collect();
    let (jobs, errors) = sacct::parse_output(&text.join("\n"));
    assert!(errors.is_empty(), "{errors:?}");
    jobs
}

#[tokio::test]
async fn findings_are_refreshed_page_by_page_and_only_for_changed_jobs() {
    let tmp = tempfile::tempdir().unwrap();
    let store = testing::store(tmp.path()).await;
    // 12,001 jobs: more than two pages; the last one failed.
    let jobs = numbered_jobs(12_001, |i, line| {
        if i == 12_000 {
            line.replace("COMPLETED", "FAILED")
        } else {
            line
        }
    });
    store.ingest("lab", &jobs, 100, 1).await.unwrap();
    let t = crate::store::findings::Thresholds::default();
    assert_eq!(
        store
            .refresh_findings("lab", &t, &crate::store::rules::SiteRules::default(), 2)
            .await
            .unwrap(),
        12_001
    );
    assert_eq!(
        store
            .refresh_findings("lab", &t, &crate::store::rules::SiteRules::default(), 3)
            .await
            .unwrap(),
        0,
        "nothing changed"
    );
    let failed: String = store
        .fetch_one(&Sql::new("SELECT findings FROM units WHERE uuid = '12010'"))
        .await
        .unwrap()
        .get(0)
        .unwrap();
    assert!(failed.contains("job_failed"), "{failed}");
    // A job written again is judged again.
    store.ingest("lab", &jobs[..1], 100, 4).await.unwrap();
    assert_eq!(
        store
            .refresh_findings("lab", &t, &crate::store::rules::SiteRules::default(), 5)
            .await
            .unwrap(),
        1
    );
}

/// `ceems tool findings --rerun`: the jobs that ended in the window are judged again with a
/// new rule, whatever their findings were; the others keep theirs.
#[tokio::test]
async fn a_rerun_judges_again_only_the_jobs_that_ended_in_its_window() {
    let tmp = tempfile::tempdir().unwrap();
    let store = testing::store(tmp.path()).await;
    // Job 10 ended at 1795358926; job 11 a day later.
    let jobs = numbered_jobs(2, |i, line| {
        line.replace("1795358926", &(1795358926 + 86400 * i as i64).to_string())
    });
    store.ingest("lab", &jobs, 100, 1).await.unwrap();
    let t = crate::store::findings::Thresholds::default();
    let none = crate::store::rules::SiteRules::default();
    store.refresh_findings("lab", &t, &none, 2).await.unwrap();
    let table: toml::Table = "[[r]]\nid = \"tiny\"\nwhen = \"job.alloc_cpus == 1\"\nmessage = \"one core for {job.elapsed_seconds} s\"\n"
        .parse()
        .unwrap();
    let rules = crate::store::rules::SiteRules::parse(table["r"].clone(), None).unwrap();
    let judged = store
        .rejudge_findings("lab", &t, &rules, (1795358900, 1795358999), 3)
        .await
        .unwrap();
    assert_eq!(judged, 1);
    let findings = |uuid: &'static str| {
        let store = &store;
        async move {
            let q = Sql::new("SELECT coalesce(findings, '') FROM units WHERE uuid = $1").arg(uuid);
            store.fetch_one(&q).await.unwrap().get::<String>(0).unwrap()
        }
    };
    assert!(findings("10").await.contains("one core for 29 s"));
    assert!(!findings("11").await.contains("tiny"));
}

/// Only ended multi-node jobs with their aggregates done are due for per-node figures, once;
/// the figures stored have the job judged again.
#[tokio::test]
async fn per_node_figures_are_asked_once_per_ended_multi_node_job_and_judged() {
    let tmp = tempfile::tempdir().unwrap();
    let store = testing::store(tmp.path()).await;
    let jobs = numbered_jobs(2, |i, line| match i {
        0 => line.replace("|localhost|", "|n[1-2]|"),
        _ => line,
    });
    store.ingest("lab", &jobs, 100, 1).await.unwrap();
    store
        .execute(&Sql::new("UPDATE units SET aggregates_status = 'done'"))
        .await
        .unwrap();
    let due = store.multi_node_jobs_due("lab", 10).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].uuid, "10");
    let t = crate::store::findings::Thresholds::default();
    let none = crate::store::rules::SiteRules::default();
    store.refresh_findings("lab", &t, &none, 2).await.unwrap();
    store
        .set_node_cpu_seconds(&[(due[0].row, r#"{"n1":900.0,"n2":0.0}"#.to_owned())])
        .await
        .unwrap();
    assert!(store
        .multi_node_jobs_due("lab", 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        store.refresh_findings("lab", &t, &none, 3).await.unwrap(),
        1
    );
    let q = Sql::new("SELECT coalesce(findings, '') FROM units WHERE uuid = '10'");
    let found: String = store.fetch_one(&q).await.unwrap().get(0).unwrap();
    assert!(
        found.contains("idle_nodes") && found.contains("n2 (0.0 CPU core-seconds)"),
        "{found}"
    );
}

/// The jobs due are found through the partial index, whose predicate leaves out multi-node
/// jobs still waiting for their aggregates (a cluster without Prometheus keeps them so for
/// good, and they took 20 bytes a job in it).
#[tokio::test]
async fn the_jobs_due_are_read_through_a_partial_index_of_aggregated_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let store = testing::store(tmp.path()).await;
    if store.backend() != Backend::Sqlite {
        return;
    }
    let jobs = numbered_jobs(3, |i, line| match i {
        2 => line,
        _ => line.replace("|localhost|", "|n[1-2]|"),
    });
    store.ingest("lab", &jobs, 100, 1).await.unwrap();
    let indexed = || async {
        let q = Sql::new(
            "SELECT count(*) FROM units INDEXED BY units_nodes_due
             WHERE node_cpu_seconds IS NULL AND nodes LIKE '%,%' AND aggregates_status = 'done'",
        );
        store.fetch_one(&q).await.unwrap().get::<i64>(0).unwrap()
    };
    assert_eq!(indexed().await, 0, "pending jobs are not due");
    store
        .execute(&Sql::new(
            "UPDATE units SET aggregates_status = 'done' WHERE uuid = '10'",
        ))
        .await
        .unwrap();
    assert_eq!(indexed().await, 1);
    let plan = Sql::new(&format!("EXPLAIN QUERY PLAN {}", super::nodes::NODES_DUE))
        .arg("lab")
        .arg(10);
    let steps: Vec<String> = store
        .fetch_all(&plan)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<String>(3).unwrap())
        .collect();
    assert!(
        steps
            .iter()
            .any(|s| s.contains("USING INDEX units_nodes_due")),
        "{steps:?}"
    );
}

/// A pod that failed with a timeout is told to change its activeDeadlineSeconds, not
/// Slurm's --time; a Slurm job of the same database keeps Slurm's words.
#[tokio::test]
async fn findings_advise_in_the_words_of_each_cluster_s_manager() {
    let tmp = tempfile::tempdir().unwrap();
    let store = testing::store(tmp.path()).await;
    let jobs = numbered_jobs(1, |_, line| line.replace("COMPLETED", "TIMEOUT"));
    store.register_cluster("kube", "k8s").await.unwrap();
    store.register_cluster("lab", "slurm").await.unwrap();
    store.ingest("kube", &jobs, 100, 1).await.unwrap();
    store.ingest("lab", &jobs, 100, 1).await.unwrap();
    let t = crate::store::findings::Thresholds::default();
    for cluster in ["kube", "lab"] {
        assert_eq!(
            store
                .refresh_findings(cluster, &t, &crate::store::rules::SiteRules::default(), 2)
                .await
                .unwrap(),
            1
        );
    }
    let findings = |cluster: &str| {
        let q = Sql::new("SELECT findings FROM units WHERE cluster_id = $1").arg(cluster);
        let store = &store;
        async move {
            let text: String = store.fetch_one(&q).await.unwrap().get(0).unwrap();
            text
        }
    };
    let pod = findings("kube").await;
    assert!(pod.contains("activeDeadlineSeconds"), "{pod}");
    assert!(!pod.contains("--time"), "{pod}");
    let job = findings("lab").await;
    assert!(job.contains("(--time)"), "{job}");
}

#[tokio::test]
async fn a_bulk_ingestion_leaves_postgresql_planning_with_the_jobs_it_wrote() {
    let tmp = tempfile::tempdir().unwrap();
    let store = testing::store(tmp.path()).await;
    let jobs = numbered_jobs(2_000, |_, line| line);
    store.ingest("lab", &jobs, 100, 1).await.unwrap();
    let analyzed = store.analyze_after_bulk_write(jobs.len()).await.unwrap();
    if store.backend() == Backend::Sqlite {
        assert!(!analyzed, "SQLite has no statistics to refresh here");
        return;
    }
    assert!(analyzed);
    let tuples: f64 = store
        .fetch_one(&Sql::new(
            "SELECT reltuples::float8 FROM pg_class WHERE oid = 'units'::regclass",
        ))
        .await
        .unwrap()
        .get(0)
        .unwrap();
    assert_eq!(tuples, 2_000.0);
    // A few more jobs in a table of 2,000 wait for autovacuum.
    assert!(!store.analyze_after_bulk_write(100).await.unwrap());
}

#[tokio::test]
async fn a_batch_of_unseen_jobs_that_holds_a_stored_one_is_upserted() {
    let tmp = tempfile::tempdir().unwrap();
    let store = testing::store(tmp.path()).await;
    let listing = |state: &str| numbered_jobs(3, |_, line| line.replace("COMPLETED", state));
    // An ingestion that died after writing job 10; the next one lists it again, ended.
    let running = listing("RUNNING");
    store
        .upsert_jobs("lab", &running[..1], 1, Some(i64::MIN))
        .await
        .unwrap();
    let ended = listing("FAILED");
    assert_eq!(
        store
            .upsert_jobs("lab", &ended, 2, Some(i64::MIN))
            .await
            .unwrap(),
        3
    );
    assert_eq!(store.count_units("lab").await.unwrap(), 3);
    let states: Vec<String> = store
        .fetch_all(&Sql::new("SELECT state FROM units ORDER BY uuid"))
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0).unwrap())
        .collect();
    assert_eq!(states, ["FAILED", "FAILED", "FAILED"]);
}

#[tokio::test]
async fn a_window_ingested_twice_changes_nothing_and_a_started_job_replaces_its_pending_row() {
    let tmp = tempfile::tempdir().unwrap();
    let store = testing::store(tmp.path()).await;
    let (jobs, errors) = sacct::parse_output(LINES);
    assert!(errors.is_empty());
    store.ingest("lab", &jobs, 100, 1).await.unwrap();
    store.ingest("lab", &jobs, 100, 2).await.unwrap();
    assert_eq!(store.count_units("lab").await.unwrap(), 2);
    assert_eq!(store.window_start("lab").await.unwrap(), Some(100));
    assert_eq!(store.window_start("other").await.unwrap(), None);

    let started = LINES.lines().nth(1).unwrap().replace(
        "1795359473|None|Unknown|00:00:00|0|0:0|PENDING||None assigned",
        "1795359473|1795359480|Unknown|00:00:05|5|0:0|RUNNING|billing=1,cpu=1,mem=100M,node=1|localhost",
    );
    let (jobs, _) = sacct::parse_output(&started);
    store.ingest("lab", &jobs, 200, 3).await.unwrap();
    assert_eq!(
        store.count_units("lab").await.unwrap(),
        2,
        "pending row not replaced"
    );
    let state: String = store
        .fetch_one(&Sql::new("SELECT state FROM units WHERE uuid = '2'"))
        .await
        .unwrap()
        .get(0)
        .unwrap();
    assert_eq!(state, "RUNNING");
    if store.backend() == Backend::Sqlite {
        assert_eq!(store.integrity_check().await.unwrap(), "ok");
        let mode: String = store
            .fetch_one(&Sql::new("PRAGMA journal_mode"))
            .await
            .unwrap()
            .get(0)
            .unwrap();
        assert_eq!(mode, "wal");
    }
}

#[tokio::test]
async fn retention_deletes_only_jobs_that_ended_before_the_cutoff_and_backups_are_pruned() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(&tmp.path().join("ceems.db")).await.unwrap();
    let (jobs, _) = sacct::parse_output(LINES);
    store.ingest("lab", &jobs, 100, 1).await.unwrap();
    // Job 1 ended at 1795358926; job 2 is pending (no end): it stays whatever the cutoff.
    assert_eq!(store.delete_ended_before(1795358926).await.unwrap(), 0);
    assert_eq!(store.delete_ended_before(1795358927).await.unwrap(), 1);
    assert_eq!(store.delete_ended_before(i64::MAX).await.unwrap(), 0);
    assert_eq!(store.count_units("lab").await.unwrap(), 1);

    let dir = tmp.path().join("backups");
    std::fs::create_dir(&dir).unwrap();
    for t in [10, 20, 30] {
        store.backup_to(&dir.join(backup_name(t))).await.unwrap();
    }
    std::fs::write(dir.join("notes.txt"), "kept").unwrap();
    let gone = prune_backups(&dir, 2).unwrap();
    assert_eq!(gone, vec![dir.join(backup_name(10))]);
    let mut left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [backup_name(20), backup_name(30), "notes.txt".to_owned()]
    );
    // A backup is a database in its own right, with the job in it.
    let copy = Store::open(&dir.join(backup_name(30))).await.unwrap();
    assert_eq!(copy.count_units("lab").await.unwrap(), 1);
    assert_eq!(copy.integrity_check().await.unwrap(), "ok");
}

#[tokio::test]
async fn a_user_reads_the_units_they_ran_and_those_of_their_projects() {
    let tmp = tempfile::tempdir().unwrap();
    let store = testing::store(tmp.path()).await;
    // Job 1: alice in physics; job 2: bob in chemistry.
    let (jobs, errors) = sacct::parse_output(LINES);
    assert!(errors.is_empty(), "{errors:?}");
    store.ingest("lab", &jobs, 100, 1).await.unwrap();
    let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let readable = |user: &'static str, cluster: &'static str| {
        let store = &store;
        let wanted = ids(&["1", "2", "3"]);
        async move {
            store
                .units_readable_by(cluster, user, &wanted)
                .await
                .unwrap()
                .into_iter()
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(readable("alice", "lab").await, ["1"]);
    assert_eq!(readable("bob", "lab").await, ["2"]);
    assert!(
        readable("alice", "other").await.is_empty(),
        "another cluster"
    );
    assert!(readable("carol", "lab").await.is_empty());
    // carol joins chemistry: she reads its jobs too.
    let members = crate::manager::Associations {
        projects: vec!["chemistry".into()],
        members: vec![("carol".into(), "chemistry".into())],
        ..Default::default()
    };
    store
        .replace_associations("lab", &members, 2)
        .await
        .unwrap();
    assert_eq!(readable("carol", "lab").await, ["2"]);
    // Where only owners read (the lb's --lb.owner-only), her project's job is not hers.
    let theirs = |user: &'static str, readers: Readers| {
        let store = &store;
        async move {
            let tenures = store
                .unit_tenures("lab", user, &ids(&["1", "2"]), readers)
                .await
                .unwrap();
            let mut theirs: Vec<String> = tenures
                .into_iter()
                .filter(|t| t.theirs)
                .map(|t| t.uuid)
                .collect();
            theirs.sort();
            theirs
        }
    };
    assert_eq!(theirs("carol", Readers::OwnerAndProjects).await, ["2"]);
    assert!(theirs("carol", Readers::Owner).await.is_empty());
    assert_eq!(theirs("bob", Readers::Owner).await, ["2"]);
    assert!(store
        .units_readable_by("lab", "alice", &[])
        .await
        .unwrap()
        .is_empty());
}

/// A job id that came back: alice's job 1 ended, then bob's job 1 ran. Each is told apart by
/// its times, and each user reads only theirs.
#[tokio::test]
async fn a_job_id_that_wrapped_is_two_tenures_each_its_users() {
    let tmp = tempfile::tempdir().unwrap();
    let store = testing::store(tmp.path()).await;
    let bobs = "1|debug|normal|chemistry|bob|2002|bob|2002|1795400000|1795400000|Unknown|00:01:00|60|0:0|RUNNING|billing=1,cpu=1,mem=300M,node=1|localhost|/tmp|60|wrap\n";
    let (jobs, errors) = sacct::parse_output(&format!("{LINES}{bobs}"));
    assert!(errors.is_empty(), "{errors:?}");
    store.ingest("lab", &jobs, 100, 1).await.unwrap();
    let mut tenures = store
        .unit_tenures("lab", "alice", &["1".to_owned()], Readers::OwnerAndProjects)
        .await
        .unwrap();
    tenures.sort_by_key(|t| t.start);
    let seen: Vec<(Option<i64>, Option<i64>, bool)> =
        tenures.iter().map(|t| (t.start, t.end, t.theirs)).collect();
    assert_eq!(
        seen,
        [
            (Some(1795358897), Some(1795358926), true),
            (Some(1795400000), None, false)
        ]
    );
    let bob = store
        .unit_tenures(
            "lab",
            "bob",
            &["1".to_owned(), "2".to_owned()],
            Readers::OwnerAndProjects,
        )
        .await
        .unwrap();
    assert_eq!(bob.iter().filter(|t| t.theirs).count(), 2, "{bob:?}");
    // Job 2 is pending: no start yet.
    assert!(bob.iter().any(|t| t.uuid == "2" && t.start.is_none()));
}

/// A SQLite database at `path` with the migrations before `version` only, as an older release
/// left it.
async fn database_before(path: &std::path::Path, version: i64) -> sqlx::SqlitePool {
    use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true);
    let pool = SqlitePool::connect_with(options).await.unwrap();
    let mut previous = sqlx::migrate!("./migrations");
    let before: Vec<_> = previous
        .migrations
        .iter()
        .filter(|m| m.version < version)
        .cloned()
        .collect();
    previous.migrations = before.into();
    previous.run(&pool).await.unwrap();
    pool
}

/// A SQLite database written by the release before migration 0010 opens with its jobs, and
/// its usage, rebuilt by the migration, already holds the group and allocated times CEEMS's
/// usage answers need.
#[tokio::test]
async fn a_database_of_the_previous_schema_opens_with_its_usage_rebuilt() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("ceems.db");
    let pool = database_before(&path, 10).await;
    for (uuid, user, cpus, gpus) in [("1", "alice", 4, 0), ("2", "alice", 2, 1)] {
        sqlx::query(
            "INSERT INTO units (cluster_id, uuid, started_at, usr, grp, project, alloc_cpus,
                alloc_gpus, alloc_mem_bytes, elapsed_seconds, ended_at, last_updated_at)
             VALUES ('lab', ?, 1000, ?, 'physicists', 'physics', ?, ?, 1073741824, 600, 1600,
                1600)",
        )
        .bind(uuid)
        .bind(user)
        .bind(cpus)
        .bind(gpus)
        .execute(&pool)
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO usage (cluster_id, project, usr, num_units, elapsed_seconds, cpu_seconds,
            alloc_cpu_seconds, cpu_energy_joules, host_energy_joules, gpu_energy_joules,
            emissions_grams, io_read_bytes, io_write_bytes, last_updated_at)
         VALUES ('lab', 'physics', 'alice', 2, 1200, 0, 0, 0, 0, 0, 0, 0, 0, 1600)",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;

    let store = Store::open(&path).await.unwrap();
    assert_eq!(store.count_units("lab").await.unwrap(), 2);
    let rows = store
        .fetch_all(&Sql::new(
            "SELECT grp, num_units, alloc_cpu_wall_seconds, alloc_gpu_wall_seconds,
                alloc_mem_mib_wall_seconds FROM usage",
        ))
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(row.get::<String>(0).unwrap(), "physicists");
    assert_eq!(row.get::<i64>(1).unwrap(), 2);
    assert_eq!(row.get::<f64>(2).unwrap(), 6.0 * 600.0);
    assert_eq!(row.get::<f64>(3).unwrap(), 600.0);
    assert_eq!(row.get::<f64>(4).unwrap(), 2.0 * 1024.0 * 600.0);
}

/// Jobs aggregated before migration 0014 keep their energy: each figure counts as measured;
/// a job never aggregated has none.
#[tokio::test]
async fn jobs_aggregated_before_the_measured_bits_keep_their_figures() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("ceems.db");
    let pool = database_before(&path, 14).await;
    for (uuid, updated) in [("1", Some(1600)), ("2", None)] {
        sqlx::query(
            "INSERT INTO units (cluster_id, uuid, started_at, usr, project, host_energy_joules,
                ended_at, last_updated_at, aggregates_updated_at)
             VALUES ('lab', ?, 1000, 'alice', 'physics', 7.2e6, 1600, 1600, ?)",
        )
        .bind(uuid)
        .bind(updated)
        .execute(&pool)
        .await
        .unwrap();
    }
    pool.close().await;

    let store = Store::open(&path).await.unwrap();
    let rows = store
        .fetch_all(&Sql::new("SELECT uuid, measured FROM units ORDER BY uuid"))
        .await
        .unwrap();
    let bits: Vec<(String, i64)> = rows
        .iter()
        .map(|r| (r.get(0).unwrap(), r.get(1).unwrap()))
        .collect();
    assert_eq!(bits, [("1".to_owned(), 31), ("2".to_owned(), 0)]);
    assert_eq!(store.count_units("lab").await.unwrap(), 2);
}

/// CEEMS's series over windows: a mean weighted by the seconds each covered, a total added;
/// over a usage group: a mean weighted by the allocated time of what it measures, a total
/// added.
#[test]
fn series_add_up_over_windows_and_over_jobs() {
    use super::{merge_series, SeriesFold, SeriesWeights};
    let first = merge_series(
        "{}",
        0,
        100,
        &[
            ("avg_cpu_usage".into(), "global".into(), 50.0),
            ("total_io_read_stats".into(), "bytes".into(), 1000.0),
        ],
    );
    let second = merge_series(
        &first,
        100,
        300,
        &[
            ("avg_cpu_usage".into(), "global".into(), 10.0),
            ("total_io_read_stats".into(), "bytes".into(), 500.0),
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&second).unwrap();
    assert_eq!(v["avg_cpu_usage"]["global"], 20.0);
    assert_eq!(v["total_io_read_stats"]["bytes"], 1500.0);

    // usr3's two jobs of CEEMS's pack: CPU use weighs by CPU time, memory use by memory time;
    // a job without GPUs adds nothing to the GPU use but its energy to the total.
    let big = SeriesWeights {
        walltime: 2962.0,
        cputime: 23696.0,
        cpumemtime: 970588160.0,
        gputime: 23696.0,
        gpumemtime: 2962.0,
    };
    let small = SeriesWeights {
        walltime: 497.0,
        cputime: 7952.0,
        cpumemtime: 162856960.0,
        gputime: 0.0,
        gpumemtime: 0.0,
    };
    let mut fold = SeriesFold::default();
    fold.add(
        r#"{"avg_cpu_usage":{"global":29.72084252},"avg_cpu_mem_usage":{"global":29.72084252},
            "avg_gpu_usage":{"global":29.72084252},"total_cpu_energy_usage_kwh":{"total":1.0}}"#,
        &big,
    );
    fold.add(
        r#"{"avg_cpu_usage":{"global":50.1362011},"avg_cpu_mem_usage":{"global":50.1362011},
            "avg_gpu_usage":{"global":50.1362011},"total_cpu_energy_usage_kwh":{"total":2.0}}"#,
        &small,
    );
    fold.add("not json", &big);
    let sums = serde_json::Value::Object(fold.finish());
    let mean = |name: &str| (sums[name]["global"].as_f64().unwrap() * 1e8).round() / 1e8;
    assert_eq!(mean("avg_cpu_usage"), 34.8504852);
    assert_eq!(mean("avg_cpu_mem_usage"), 32.65418546);
    assert_eq!(mean("avg_gpu_usage"), 29.72084252);
    assert_eq!(sums["total_cpu_energy_usage_kwh"]["total"], 3.0);
    // Nothing allocated, nothing to weigh: 0, as CEEMS answers a job without GPUs.
    let mut fold = SeriesFold::default();
    fold.add(r#"{"avg_gpu_usage":{"global":53.5}}"#, &small);
    assert_eq!(
        serde_json::Value::Object(fold.finish())["avg_gpu_usage"]["global"],
        0.0
    );
}

/// CEEMS's custom stats (v0.15): `total_custom_stats` adds up, `avg_custom_stats` is a mean
/// weighted by time, `min_custom_stats` and `max_custom_stats` keep the least and greatest,
/// over a job's windows and over the jobs of a usage group.
#[test]
fn custom_stats_add_up_as_totals_means_least_and_greatest() {
    use super::{merge_series, SeriesFold, SeriesWeights};
    let window = |stored: &str, before: i64, seconds: i64, v: f64| {
        let all = ["total", "avg", "min", "max"]
            .map(|k| (format!("{k}_custom_stats"), "bytes".to_owned(), v));
        merge_series(stored, before, seconds, &all)
    };
    let job = window(&window("{}", 0, 100, 40.0), 100, 300, 8.0);
    let v: serde_json::Value = serde_json::from_str(&job).unwrap();
    assert_eq!(v["total_custom_stats"]["bytes"], 48.0);
    assert_eq!(v["avg_custom_stats"]["bytes"], 16.0);
    assert_eq!(v["min_custom_stats"]["bytes"], 8.0);
    assert_eq!(v["max_custom_stats"]["bytes"], 40.0);

    let other = window("{}", 0, 400, 100.0);
    let weight = |walltime: f64| SeriesWeights {
        walltime,
        ..SeriesWeights::default()
    };
    let mut fold = SeriesFold::default();
    fold.add(&job, &weight(400.0));
    fold.add(&other, &weight(100.0));
    let usage = serde_json::Value::Object(fold.finish());
    assert_eq!(usage["total_custom_stats"]["bytes"], 148.0);
    assert_eq!(
        usage["avg_custom_stats"]["bytes"],
        (16.0 * 400.0 + 100.0 * 100.0) / 500.0
    );
    assert_eq!(usage["min_custom_stats"]["bytes"], 8.0);
    assert_eq!(usage["max_custom_stats"]["bytes"], 100.0);
}

/// The API over a store that holds the pack's 24 jobs (12 on each cluster), grafana an admin.
async fn pack_api(store: Store) -> crate::store::api::Api {
    assert_eq!(store.count_units("slurm-0").await.unwrap(), 12);
    assert_eq!(store.count_units("slurm-1").await.unwrap(), 12);
    store
        .set_admins("config", &["grafana".into()])
        .await
        .unwrap();
    crate::store::api::Api::new(std::sync::Arc::new(store), "X-Grafana-User")
}

/// CEEMS's own database (the pack's `ceems.db`, 24 jobs on two clusters) opens in place: a
/// copy is made first, CEEMS's tables stay as `ceems_*`, and every job is answered with its
/// series, users and projects; a second opening copies nothing twice.
#[tokio::test]
async fn a_ceems_database_is_opened_with_its_whole_history() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("ceems.db");
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/ceems-api/pkg/api/testdata/ceems.db"
        ),
        &path,
    )
    .unwrap();
    let store = Store::open(&path).await.unwrap();
    let backups: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".ceems-"))
        .collect();
    assert_eq!(backups.len(), 1, "no copy made before the change");
    let kept = store
        .fetch_one(&Sql::new("SELECT count(*) FROM ceems_units"))
        .await
        .unwrap();
    assert_eq!(kept.get::<i64>(0).unwrap(), 24);
    drop(store);
    let store = Store::open(&path).await.unwrap();
    let api = pack_api(store).await;
    let now = 1_800_000_000;
    let all = api
        .handle(
            "/api/v1/units/admin",
            Some("from=0&running&cluster_id=slurm-0"),
            Some("grafana"),
            now,
        )
        .await;
    let units = all.json()["data"].as_array().cloned().unwrap_or_default();
    assert_eq!(units.len(), 12, "{}", all.text());
    let job = units.iter().find(|u| u["uuid"] == "1481508").unwrap();
    assert_eq!(job["username"], "usr2");
    assert_eq!(job["state"], "CANCELLED by 1002");
    assert_eq!(job["started_at_ts"], 1676990946000i64);
    assert_eq!(job["allocation"]["cpus"], 16);
    assert_eq!(job["tags"]["nodelist"], "compute-[0-2]");
    assert_eq!(job["total_io_read_stats"]["bytes"], 1481508.0);
    let users = api.handle("/api/v1/users", None, Some("usr1"), now).await;
    let slurm0 = users.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["cluster_id"] == "slurm-0")
        .cloned()
        .unwrap();
    assert_eq!(slurm0["projects"], serde_json::json!(["acc1", "acc2"]));
    let usage = api
        .handle(
            "/api/v1/usage/global",
            Some("cluster_id=slurm-0"),
            Some("usr1"),
            now,
        )
        .await;
    assert!(
        usage.json()["data"].as_array().is_some_and(|rows| rows
            .iter()
            .any(|r| r["username"] == "usr1" && r.get("total_io_read_stats").is_some())),
        "{}",
        usage.text()
    );
}

/// A database of today's CEEMS (its ten migrations applied in order, as CEEMS's migrator
/// applies them: `daily_usage`, `total_egress_stats`, the admins one per row, v0.15's custom
/// stats) with the pack's 24 jobs, users and projects in it, opens with every job answered.
#[tokio::test]
async fn a_database_of_ceems_latest_schema_is_opened_with_every_row() {
    use sqlx::Executor;
    let fixtures =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ceems-api");
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("ceems.db");
    {
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true);
        // One connection: the pack's database is attached to it.
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .unwrap();
        let mut migrations: Vec<_> = std::fs::read_dir(fixtures.join("pkg/api/db/migrations"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        migrations.sort();
        assert_eq!(migrations.len(), 9);
        migrations
            .push(fixtures.join(
                "../ceems-v0.16/pkg/api/db/migrations/000010_add_custom_metrics_cols.up.sql",
            ));
        for m in &migrations {
            pool.execute(std::fs::read_to_string(m).unwrap().as_str())
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", m.display()));
        }
        pool.execute("CREATE TABLE schema_migrations (version uint64, dirty bool); INSERT INTO schema_migrations VALUES (10, 0)")
            .await
            .unwrap();
        let pack = fixtures.join("pkg/api/testdata/ceems.db");
        sqlx::query("ATTACH DATABASE ? AS pack")
            .bind(pack.display().to_string())
            .execute(&pool)
            .await
            .unwrap();
        for table in ["units", "usage", "users", "projects"] {
            let columns: Vec<(String,)> = sqlx::query_as(&format!(
                "SELECT name FROM pragma_table_info('{table}', 'pack') WHERE name <> 'id'"
            ))
            .fetch_all(&pool)
            .await
            .unwrap();
            let columns: Vec<String> = columns.into_iter().map(|(c,)| format!("\"{c}\"")).collect();
            let columns = columns.join(", ");
            pool.execute(
                format!("INSERT INTO main.{table} ({columns}) SELECT {columns} FROM pack.{table}")
                    .as_str(),
            )
            .await
            .unwrap_or_else(|e| panic!("{table}: {e}"));
        }
        // A custom stat as CEEMS v0.15 writes one.
        pool.execute(
            "UPDATE units SET total_custom_stats = '{\"bytes\":147975}' WHERE uuid = '147975'",
        )
        .await
        .unwrap();
        // A day of CEEMS's daily usage and an admin as its migration 8 keeps them.
        pool.execute(
            "INSERT INTO daily_usage (cluster_id, project, username, num_units, last_updated_at)
                      VALUES ('slurm-0', 'acc1', 'usr1', 2, '2023-02-21T00:00:00')",
        )
        .await
        .unwrap();
        pool.execute("INSERT INTO admin_users (name, tags, last_updated_at) VALUES ('grafana', '[\"ceems\"]', '2023-02-21T00:00:00')")
            .await
            .unwrap();
        pool.close().await;
    }
    let store = Store::open(&path).await.unwrap();
    for table in ["ceems_units", "ceems_daily_usage", "ceems_admin_users"] {
        let kept = store
            .fetch_one(&Sql::new(&format!("SELECT count(*) FROM {table}")))
            .await
            .unwrap();
        assert!(kept.get::<i64>(0).unwrap() > 0, "{table} not kept");
    }
    let api = pack_api(store).await;
    let now = 1_800_000_000;
    let mine = api
        .handle(
            "/api/v1/units",
            Some("from=0&running&cluster_id=slurm-0"),
            Some("usr3"),
            now,
        )
        .await;
    let units = mine.json()["data"].as_array().cloned().unwrap_or_default();
    let job = units
        .iter()
        .find(|u| u["uuid"] == "147975")
        .unwrap_or_else(|| panic!("{}", mine.text()));
    assert_eq!(job["project"], "acc3");
    // The series of migration 9's renamed column.
    assert_eq!(
        job["total_egress_stats"]["packets"],
        serde_json::json!(147975000.0)
    );
    // Migration 10's custom stats; an empty one is left out, as CEEMS leaves it.
    assert_eq!(
        job["total_custom_stats"],
        serde_json::json!({"bytes": 147975.0})
    );
    assert!(job.get("avg_custom_stats").is_none(), "{job}");
    let projects = api
        .handle("/api/v1/projects", None, Some("usr1"), now)
        .await;
    let names: Vec<String> = projects.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["cluster_id"] == "slurm-0")
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(names, ["acc1", "acc2"], "{}", projects.text());
}

/// CEEMS's `ceems_lb` reads a database ceems wrote: its three queries, as it sends them to the
/// file it opens read-only, find the clusters with their managers, the admins, and of the
/// units asked, those of the user's projects only.
#[tokio::test]
async fn ceems_load_balancer_queries_read_a_database_ceems_wrote() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("ceems.db");
    let store = Store::open(&path).await.unwrap();
    store.register_cluster("lab", "slurm").await.unwrap();
    let (jobs, _) = sacct::parse_output(LINES);
    store.ingest("lab", &jobs, 0, 1_795_360_000).await.unwrap();
    let associations = crate::manager::Associations {
        projects: vec!["physics".into(), "chemistry".into()],
        members: vec![
            ("alice".into(), "physics".into()),
            ("bob".into(), "chemistry".into()),
        ],
        ..Default::default()
    };
    store
        .replace_associations("lab", &associations, 1_795_360_000)
        .await
        .unwrap();
    store
        .set_admins("config", &["grafana".into()])
        .await
        .unwrap();
    drop(store);
    let lb = sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=ro", path.display()))
        .await
        .unwrap();
    let clusters: Vec<(String, String)> =
        sqlx::query_as("SELECT DISTINCT cluster_id, resource_manager FROM units")
            .fetch_all(&lb)
            .await
            .unwrap();
    assert_eq!(clusters, [("lab".to_owned(), "slurm".to_owned())]);
    let admins: Vec<(String, String, String)> =
        sqlx::query_as("SELECT cluster_id,name,tags FROM admin_users")
            .fetch_all(&lb)
            .await
            .unwrap();
    assert_eq!(
        admins,
        [(
            "all".to_owned(),
            "grafana".to_owned(),
            r#"["config"]"#.to_owned()
        )]
    );
    // CEEMS's ownership check: the units of the projects whose users list the user.
    let owned = |user: &'static str| {
        let lb = lb.clone();
        async move {
            let rows: Vec<(String, String)> = sqlx::query_as(
                "SELECT uuid,cluster_id FROM units WHERE project IN (SELECT name FROM projects
                 WHERE EXISTS (SELECT 1 FROM json_each(users) WHERE value IN (?)))
                 AND cluster_id IN (?) AND uuid IN (?,?)",
            )
            .bind(user)
            .bind("lab")
            .bind("1")
            .bind("2")
            .fetch_all(&lb)
            .await
            .unwrap();
            rows.into_iter().map(|(u, _)| u).collect::<Vec<_>>()
        }
    };
    assert_eq!(owned("alice").await, ["1"]);
    assert_eq!(owned("bob").await, ["2"]);
    assert!(owned("mallory").await.is_empty());
}

/// A server judges the jobs an ingestion inserts as it writes them: each new job holds what
/// the findings pass would have stored (built-in rules and the site's), the pass then has
/// nothing left to do, and a pending job waits for it.
#[tokio::test]
async fn jobs_judged_as_inserted_hold_what_the_findings_pass_would_store() {
    use crate::store::findings::Thresholds;
    use crate::store::rules::SiteRules;
    let tmp = tempfile::tempdir().unwrap();
    let store = testing::store(tmp.path()).await;
    store.register_cluster("lab", "slurm").await.unwrap();
    let table: toml::Table = "[[r]]\nid = \"tiny\"\nwhen = \"job.alloc_cpus == 1\"\nmessage = \"one core for {job.elapsed_seconds} s\"\n"
        .parse()
        .unwrap();
    let rules = std::sync::Arc::new(SiteRules::parse(table["r"].clone(), None).unwrap());
    store.judge_inserted_jobs(super::InsertJudge {
        thresholds: Thresholds::default(),
        rules: std::sync::Arc::new(std::sync::RwLock::new(std::sync::Arc::clone(&rules))),
    });
    // More than one statement's rows: failed jobs, jobs that used their time limit, the rest
    // that completed well within it; and a pending job.
    let mut jobs = numbered_jobs(700, |i, line| match i % 3 {
        0 => line.replace("COMPLETED", "FAILED"),
        1 => line.replace("|/tmp|60|", "|/tmp|1|"),
        _ => line,
    });
    let (pending, _) = sacct::parse_output(LINES.lines().nth(1).unwrap());
    jobs.extend(pending);
    store.ingest("lab", &jobs, 100, 1).await.unwrap();
    let stored = || async {
        let q = Sql::new(
            "SELECT uuid, findings, findings_updated_at FROM units WHERE cluster_id = 'lab'
             ORDER BY uuid",
        );
        store
            .fetch_all(&q)
            .await
            .unwrap()
            .iter()
            .map(|r| {
                let row: (String, Option<String>, Option<i64>) =
                    (r.get(0).unwrap(), r.get(1).unwrap(), r.get(2).unwrap());
                row
            })
            .collect::<Vec<_>>()
    };
    let at_insert = stored().await;
    assert_eq!(at_insert.len(), 701);
    let waiting: Vec<&str> = at_insert
        .iter()
        .filter(|(_, _, at)| at.is_none())
        .map(|(uuid, _, _)| uuid.as_str())
        .collect();
    assert_eq!(waiting, ["2"], "only the pending job is left unjudged");
    let said = |id: &str| {
        at_insert
            .iter()
            .filter(|(_, f, _)| f.as_deref().unwrap_or("").contains(id))
            .count()
    };
    assert_eq!(said("job_failed"), 234);
    assert_eq!(said("time_limit_overestimated"), 233);
    assert_eq!(said("one core for 29 s"), 700);
    let t = Thresholds::default();
    assert_eq!(
        store.refresh_findings("lab", &t, &rules, 2).await.unwrap(),
        0,
        "the pass has nothing to judge again"
    );
    // What the pass stores for the same rows, judged afresh, is what was written at insert.
    store
        .execute(&Sql::new(
            "UPDATE units SET findings = NULL, findings_updated_at = NULL",
        ))
        .await
        .unwrap();
    assert_eq!(
        store.refresh_findings("lab", &t, &rules, 1).await.unwrap(),
        700
    );
    assert_eq!(stored().await, at_insert);
}
