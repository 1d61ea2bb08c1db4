//! A policy's whole course over a real store (SQLite, or PostgreSQL in the second pass), with
//! a manager and a Prometheus that answer as told and record what they were asked.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::config::parse;
use super::cycle::{Engine, Mailer, Target};
use super::state;
use crate::manager::slurm::sacct;
use crate::manager::{Accounting, AccountingError, Associations, UnitRecord, UnitRecords};
use crate::notify::smtp::Delivery;
use crate::notify::Addresses;
use crate::store::db::Store;
use crate::store::prometheus::{PromError, Prometheus};
use crate::store::sql::Sql;

const START: i64 = 1_800_000_000;

/// A Slurm manager as a test tells it: its jobs, and the cancels it was asked.
#[derive(Default)]
struct Manager {
    jobs: Mutex<HashMap<String, UnitRecord>>,
    cancelled: Mutex<Vec<String>>,
    failing: Mutex<bool>,
}

impl Accounting for Manager {
    fn manager(&self) -> &'static str {
        "slurm"
    }
    fn units_since(&self, _: i64) -> Result<UnitRecords, AccountingError> {
        Ok(Box::new(Vec::new().into_iter()))
    }
    fn unit(&self, id: &str) -> Result<UnitRecords, AccountingError> {
        let jobs = self.jobs.lock().unwrap();
        Ok(Box::new(jobs.get(id).cloned().map(Ok).into_iter()))
    }
    fn associations(
        &self,
    ) -> Option<Result<(Associations, Vec<crate::host::ParseError>), AccountingError>> {
        None
    }
    fn cancel(&self, unit: &UnitRecord) -> Result<String, AccountingError> {
        if *self.failing.lock().unwrap() {
            return Err(AccountingError::Other(
                "scancel: Unable to contact slurm controller".into(),
            ));
        }
        self.cancelled.lock().unwrap().push(unit.uuid.clone());
        if let Some(j) = self.jobs.lock().unwrap().get_mut(&unit.uuid) {
            j.state = "CANCELLED".into();
        }
        Ok(format!("scancel --user={} {}", unit.user, unit.uuid))
    }
}

/// Each job's GPU use, 100 W per job's nodes and 0.01 g/s.
struct Usage(HashMap<String, f64>, Mutex<usize>);

impl Prometheus for Usage {
    fn query(&self, promql: &str, _at: i64) -> Result<Vec<(String, f64)>, PromError> {
        *self.1.lock().unwrap() += 1;
        let ids = promql.split('"').nth(1).unwrap_or_default();
        Ok(ids
            .split('|')
            .filter_map(|id| {
                let v = match () {
                    _ if promql.contains("ceems_gpu_usage") => *self.0.get(id)?,
                    _ if promql.contains("host_power") => 100.0,
                    _ if promql.contains("emissions") => 0.01,
                    _ => return None,
                };
                Some((id.to_owned(), v))
            })
            .collect())
    }
}

fn gpu_job(id: u32, user: &str) -> String {
    format!("{id}|gpu|normal|physics|{user}|100|{user}|100|{START}|{START}|Unknown|00:10:00|600|0:0|RUNNING|billing=1,cpu=2,mem=1G,node=1,gres/gpu=1|localhost|/tmp|60|train")
}

struct Setup {
    store: Arc<Store>,
    manager: Arc<Manager>,
    prometheus: Arc<Usage>,
    eml: std::path::PathBuf,
    _tmp: tempfile::TempDir,
}

async fn setup(jobs: &[(u32, &str, f64)]) -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let store = crate::store::db::testing::store(tmp.path()).await;
    let lines: Vec<String> = jobs
        .iter()
        .map(|(id, user, _)| gpu_job(*id, user))
        .collect();
    let (records, errors) = sacct::parse_output(&lines.join("\n"));
    assert!(errors.is_empty(), "{errors:?}");
    store.register_cluster("lab", "slurm").await.unwrap();
    store.ingest("lab", &records, 0, START + 30).await.unwrap();
    let manager = Manager::default();
    for r in records {
        manager.jobs.lock().unwrap().insert(r.uuid.clone(), r);
    }
    let usage = jobs.iter().map(|(id, _, u)| (id.to_string(), *u)).collect();
    Setup {
        store: Arc::new(store),
        manager: Arc::new(manager),
        prometheus: Arc::new(Usage(usage, Mutex::new(0))),
        eml: tmp.path().join("eml"),
        _tmp: tmp,
    }
}

fn engine(s: &Setup, extra: &str) -> Engine {
    let text = format!(
        "[[policies]]\nname = \"idle-gpus\"\nwarn-after = [\"60s\", \"120s\"]\ncancel-after = \"180s\"\nadmins = [\"ops@example.org\"]\nexempt-users = [\"carol\"]\n{extra}"
    );
    let table: toml::Table = text.parse().unwrap();
    Engine {
        policies: parse(table["policies"].clone()).unwrap(),
        mailer: Some(Mailer {
            from: "ceems <ceems@example.org>".parse().unwrap(),
            addresses: Addresses::with_file("{user}@example.org", None).unwrap(),
            delivery: Delivery::Directory(s.eml.clone()),
        }),
        base_url: "https://ceems.example.org".into(),
        batch: 100,
        cost_queries: (
            r#"sum by (uuid) (avg_over_time(uuid:ceems_host_power_watts:pue{uuid=~"$uuids"}[$range]))"#.into(),
            String::new(),
            r#"sum by (uuid) (avg_over_time(uuid:ceems_host_emissions_g_s:pue{uuid=~"$uuids"}[$range]))"#.into(),
        ),
        max_attempts: 2,
    }
}

fn target(s: &Setup) -> Target {
    Target {
        id: "lab".into(),
        accounting: Arc::clone(&s.manager) as Arc<dyn Accounting>,
        prometheus: Some(Arc::clone(&s.prometheus) as Arc<dyn Prometheus>),
    }
}

/// (recipient, subject) of every message written, sorted.
fn mails(s: &Setup) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::fs::read_dir(&s.eml)
        .map(|d| {
            d.flatten()
                .map(|e| {
                    let text = std::fs::read_to_string(e.path()).unwrap();
                    let header = |name: &str| {
                        text.lines()
                            .find_map(|l| l.strip_prefix(name))
                            .unwrap_or_default()
                            .trim()
                            .to_owned()
                    };
                    (header("To:"), header("Subject:"))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

fn outcomes(actions: &[serde_json::Value]) -> Vec<(String, String)> {
    actions
        .iter()
        .map(|a| {
            (
                a["action"].as_str().unwrap().to_owned(),
                a["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn an_idle_job_is_warned_twice_then_cancelled_once_and_busy_and_exempt_ones_run_on() {
    let s = setup(&[(1, "alice", 0.0), (2, "bob", 0.8), (3, "carol", 0.0)]).await;
    let e = engine(&s, "dry-run = false");
    let t = target(&s);
    for at in [30, 60, 90, 120, 150, 180, 240, 300, 600] {
        e.cycle(&s.store, &t, START + at).await.unwrap();
    }
    assert_eq!(*s.manager.cancelled.lock().unwrap(), ["1"]);
    let alice = of_unit(&s.store, "lab", "1", START).await.unwrap();
    assert_eq!(
        outcomes(&alice),
        [
            ("warn".into(), "mailed".into()),
            ("warn".into(), "mailed".into()),
            ("cancel".into(), "cancelled".into())
        ]
    );
    assert_eq!(alice[2]["figures"]["held"], 1);
    assert!(of_unit(&s.store, "lab", "2", START)
        .await
        .unwrap()
        .is_empty());
    assert!(of_unit(&s.store, "lab", "3", START)
        .await
        .unwrap()
        .is_empty());
    let sent = mails(&s);
    let to = |who: &str| {
        sent.iter()
            .filter(|(to, _)| to.contains(who))
            .map(|(_, s)| s.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(to("alice@").len(), 3, "{sent:?}");
    assert!(
        to("alice@").iter().any(|s| s.contains("was cancelled")),
        "{sent:?}"
    );
    assert_eq!(to("ops@").len(), 3, "{sent:?}");
    assert!(to("bob@").is_empty() && to("carol@").is_empty(), "{sent:?}");
    // The API answers them with the job, to its owner, when asked (ours: `field=actions`).
    let api = crate::store::api::Api::new(Arc::clone(&s.store), "X-Grafana-User");
    let answer = api
        .handle(
            "/api/v1/units",
            Some("cluster_id=lab&uuid=1&field=uuid&field=actions"),
            Some("alice"),
            START + 700,
        )
        .await;
    let body: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
    let actions = &body["data"][0]["actions"];
    assert_eq!(actions.as_array().map(Vec::len), Some(3), "{body}");
    assert_eq!(actions[2]["outcome"], "cancelled", "{body}");
    let plain = api
        .handle(
            "/api/v1/units",
            Some("cluster_id=lab&uuid=1"),
            Some("alice"),
            START + 700,
        )
        .await;
    assert!(
        !String::from_utf8_lossy(&plain.body).contains("actions"),
        "not in CEEMS's answer"
    );
    let totals = state::totals(&s.store).await.unwrap();
    assert!(
        totals.contains(&("idle-gpus".into(), "cancel".into(), "cancelled".into(), 1)),
        "{totals:?}"
    );
    assert!(
        totals.contains(&("idle-gpus".into(), "warn-2".into(), "mailed".into(), 1)),
        "{totals:?}"
    );
}

#[tokio::test]
async fn a_dry_run_cancels_nothing_and_mails_only_the_admins_once_per_stage() {
    let s = setup(&[(1, "alice", 0.0)]).await;
    let e = engine(&s, "");
    for at in [60, 61, 120, 180, 181, 400] {
        e.cycle(&s.store, &target(&s), START + at).await.unwrap();
    }
    assert!(s.manager.cancelled.lock().unwrap().is_empty());
    let sent = mails(&s);
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert!(
        sent.iter()
            .all(|(to, subject)| to.contains("ops@") && subject.starts_with("[ceems dry run]")),
        "{sent:?}"
    );
    // Turned on, the policy starts over: the dry run's rows are not its own.
    let real = engine(&s, "dry-run = false");
    real.cycle(&s.store, &target(&s), START + 401)
        .await
        .unwrap();
    assert!(mails(&s).iter().any(|(to, _)| to.contains("alice@")));
}

#[tokio::test]
async fn a_cancel_a_killed_server_left_is_done_once_by_the_next() {
    let s = setup(&[(1, "alice", 0.0)]).await;
    let e = engine(&s, "dry-run = false");
    for at in [60, 120] {
        e.cycle(&s.store, &target(&s), START + at).await.unwrap();
    }
    // The server claimed the cancel and died before scancel ran.
    let decision = state::Decision {
        cluster: "lab".into(),
        uuid: "1".into(),
        started_at: START,
        user: "alice".into(),
        policy: "idle-gpus".into(),
        stage: 3,
        action: "cancel",
        dry_run: false,
        decided_at: START + 180,
        figures: serde_json::json!({}),
    };
    let mut tx = s.store.write_tx().await.unwrap();
    state::claim(&mut tx, &decision, "pending")
        .await
        .unwrap()
        .unwrap();
    tx.commit().await.unwrap();
    let restarted = engine(&s, "dry-run = false");
    for at in [200, 260, 900] {
        restarted
            .cycle(&s.store, &target(&s), START + at)
            .await
            .unwrap();
    }
    assert_eq!(*s.manager.cancelled.lock().unwrap(), ["1"]);
    let warnings = mails(&s)
        .iter()
        .filter(|(to, s)| to.contains("alice@") && s.contains("warning"))
        .count();
    assert_eq!(warnings, 2, "no third warning");
}

#[tokio::test]
async fn two_servers_at_once_act_once() {
    let s = setup(&[(1, "alice", 0.0)]).await;
    let (a, b) = (engine(&s, "dry-run = false"), engine(&s, "dry-run = false"));
    let t = target(&s);
    for at in [60, 120, 180] {
        let (ra, rb) = tokio::join!(
            a.cycle(&s.store, &t, START + at),
            b.cycle(&s.store, &t, START + at)
        );
        ra.unwrap();
        rb.unwrap();
    }
    assert_eq!(*s.manager.cancelled.lock().unwrap(), ["1"]);
    assert_eq!(
        mails(&s)
            .iter()
            .filter(|(to, _)| to.contains("alice@"))
            .count(),
        3
    );
}

#[tokio::test]
async fn a_job_id_given_again_to_another_user_is_left_alone() {
    let s = setup(&[(1, "alice", 0.0)]).await;
    let e = engine(&s, "dry-run = false");
    for at in [60, 120] {
        e.cycle(&s.store, &target(&s), START + at).await.unwrap();
    }
    // Between the store's last update and the cancel, Slurm gave id 1 to mallory's new job.
    {
        let mut jobs = s.manager.jobs.lock().unwrap();
        let j = jobs.get_mut("1").unwrap();
        j.user = "mallory".into();
        j.start = Some(START + 170);
    }
    e.cycle(&s.store, &target(&s), START + 180).await.unwrap();
    assert!(s.manager.cancelled.lock().unwrap().is_empty());
    let actions = of_unit(&s.store, "lab", "1", START).await.unwrap();
    assert_eq!(actions[2]["outcome"], "refused");
    assert!(
        actions[2]["detail"].as_str().unwrap().contains("mallory"),
        "{actions:?}"
    );
}

#[tokio::test]
async fn a_manager_that_cannot_cancel_is_retried_then_reported() {
    let s = setup(&[(1, "alice", 0.0)]).await;
    let e = engine(&s, "dry-run = false");
    *s.manager.failing.lock().unwrap() = true;
    for at in [60, 120, 180, 240, 300, 360] {
        e.cycle(&s.store, &target(&s), START + at).await.unwrap();
    }
    let actions = of_unit(&s.store, "lab", "1", START).await.unwrap();
    assert_eq!(actions.len(), 3);
    assert_eq!(actions[2]["outcome"], "failed");
    assert!(actions[2]["detail"]
        .as_str()
        .unwrap()
        .contains("slurm controller"));
    assert!(s.manager.cancelled.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_job_prometheus_has_no_series_of_is_never_acted_on() {
    let s = setup(&[(1, "alice", 0.0)]).await;
    let mut e = engine(&s, "dry-run = false");
    e.policies[0].query = r#"avg_over_time(nothing{uuid=~"$uuids"}[$range])"#.into();
    let c = e.cycle(&s.store, &target(&s), START + 600).await.unwrap();
    assert_eq!((c.no_data, c.warned), (1, 0));
    assert!(mails(&s).is_empty());
}

#[tokio::test]
async fn a_warning_the_smtp_server_deferred_goes_at_the_next_cycle_once() {
    let s = setup(&[(1, "alice", 0.0)]).await;
    let mut down = engine(&s, "dry-run = false");
    down.mailer.as_mut().unwrap().delivery = crate::notify::smtp::unreachable();
    down.cycle(&s.store, &target(&s), START + 60).await.unwrap();
    assert!(mails(&s).is_empty());
    let up = engine(&s, "dry-run = false");
    for at in [61, 62] {
        up.cycle(&s.store, &target(&s), START + at).await.unwrap();
    }
    let sent = mails(&s);
    assert_eq!(sent.len(), 2, "the warning and its copy, once: {sent:?}");
}

/// Every decision about one job, oldest first, with the figures it was taken on.
async fn of_unit(
    store: &Store,
    cluster: &str,
    uuid: &str,
    started_at: i64,
) -> Result<Vec<serde_json::Value>, crate::store::db::StoreError> {
    let q = Sql::new(
        "SELECT policy, stage, action, dry_run, decided_at, outcome, detail, done_at, figures
         FROM policy_actions
         WHERE cluster_id = $1 AND uuid = $2 AND started_at = $3
         ORDER BY decided_at, id",
    )
    .arg(cluster)
    .arg(uuid)
    .arg(started_at);
    let mut out = Vec::new();
    for r in store.fetch_all(&q).await? {
        let dry: i64 = r.get(3)?;
        let figures: String = r.get(8)?;
        out.push(serde_json::json!({
            "policy": r.get::<String>(0)?,
            "stage": r.get::<i64>(1)?,
            "action": r.get::<String>(2)?,
            "dry_run": dry != 0,
            "decided_at": r.get::<i64>(4)?,
            "outcome": r.get::<String>(5)?,
            "detail": r.get::<String>(6)?,
            "done_at": r.get::<Option<i64>>(7)?,
            "figures": serde_json::from_str::<serde_json::Value>(&figures).unwrap_or_default(),
        }));
    }
    Ok(out)
}
