//! The policies' state in the store: the running jobs they watch, and one row per decision
//! (`policy_actions`), claimed before its mail or cancel goes out and marked done after.

use std::collections::HashMap;

use super::decide::{Done, Watched};
use crate::store::db::{Store, StoreError, Tx};
use crate::store::sql::Sql;

/// The running jobs of `cluster`, as the last update saw them.
pub async fn running(store: &Store, cluster: &str) -> Result<Vec<Watched>, StoreError> {
    let q = Sql::new(
        "SELECT uuid, started_at, usr, project, partition, qos, name, alloc_gpus, alloc_cpus,
                time_limit_seconds, reported, resource_manager
         FROM units
         WHERE cluster_id = $1 AND state = 'RUNNING' AND ended_at IS NULL AND started_at > 0
         ORDER BY started_at, uuid",
    )
    .arg(cluster);
    let mut out = Vec::new();
    for r in store.fetch_all(&q).await? {
        let gpus: i64 = r.get(7)?;
        let cpus: i64 = r.get(8)?;
        out.push(Watched {
            cluster: cluster.to_owned(),
            uuid: r.get(0)?,
            started_at: r.get(1)?,
            user: r.get(2)?,
            account: r.get(3)?,
            partition: r.get(4)?,
            qos: r.get(5)?,
            name: r.get(6)?,
            gpus: u64::try_from(gpus).unwrap_or(0),
            cpus: u64::try_from(cpus).unwrap_or(0),
            time_limit_seconds: r.get(9)?,
            tags: r.get(10)?,
            manager: r.get(11)?,
        });
    }
    Ok(out)
}

/// The last stage `policy` took for each job of `cluster` (by id and start), in a dry run or
/// not.
pub async fn done(
    store: &Store,
    cluster: &str,
    policy: &str,
    dry_run: bool,
) -> Result<HashMap<(String, i64), Done>, StoreError> {
    let q = Sql::new(
        "SELECT uuid, started_at, max(stage), max(decided_at) FROM policy_actions
         WHERE cluster_id = $1 AND policy = $2 AND dry_run = $3
         GROUP BY uuid, started_at",
    )
    .arg(cluster)
    .arg(policy)
    .arg(i64::from(dry_run));
    let mut out = HashMap::new();
    for r in store.fetch_all(&q).await? {
        let stage: i64 = r.get(2)?;
        out.insert(
            (r.get(0)?, r.get(1)?),
            Done {
                stage: usize::try_from(stage).unwrap_or(0),
                at: r.get(3)?,
            },
        );
    }
    Ok(out)
}

/// A decision about to be acted on.
#[derive(Debug, Clone)]
pub struct Decision {
    pub cluster: String,
    pub uuid: String,
    pub started_at: i64,
    pub user: String,
    pub policy: String,
    pub stage: usize,
    /// `warn` or `cancel`.
    pub action: &'static str,
    pub dry_run: bool,
    pub decided_at: i64,
    pub figures: serde_json::Value,
}

/// Writes the decision as `outcome`, in `tx`; its row id, or None when a row for this job,
/// policy and stage is there already (another server, or this one before a restart, took it).
pub async fn claim(tx: &mut Tx, d: &Decision, outcome: &str) -> Result<Option<i64>, StoreError> {
    let q = Sql::new(
        "INSERT INTO policy_actions
            (cluster_id, uuid, started_at, usr, policy, stage, action, dry_run, decided_at,
             figures, outcome)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
         ON CONFLICT DO NOTHING
         RETURNING id",
    )
    .arg(&d.cluster)
    .arg(&d.uuid)
    .arg(d.started_at)
    .arg(&d.user)
    .arg(&d.policy)
    .arg(i64::try_from(d.stage).unwrap_or(i64::MAX))
    .arg(d.action)
    .arg(i64::from(d.dry_run))
    .arg(d.decided_at)
    .arg(d.figures.to_string())
    .arg(outcome);
    match tx.fetch_optional(&q).await? {
        Some(r) => Ok(Some(r.get(0)?)),
        None => Ok(None),
    }
}

/// Records how an action ended (or, with `done_at` None, that it is still to be retried).
pub async fn finish(
    tx: &mut Tx,
    id: i64,
    outcome: &str,
    detail: &str,
    done_at: Option<i64>,
    messages: &[i64],
) -> Result<(), StoreError> {
    let ids: Vec<String> = messages.iter().map(i64::to_string).collect();
    tx.execute(
        &Sql::new(
            "UPDATE policy_actions SET outcome = $2, detail = $3, done_at = $4,
                    attempts = attempts + 1, message_ids = $5
             WHERE id = $1",
        )
        .arg(id)
        .arg(outcome)
        .arg(detail)
        .arg(done_at)
        .arg(ids.join(",")),
    )
    .await?;
    Ok(())
}

/// A cancel claimed and not done yet: its server may have died while acting.
#[derive(Debug, Clone)]
pub struct Pending {
    pub id: i64,
    pub attempts: i64,
    pub decision: Decision,
}

/// The pending cancels of `cluster`.
pub async fn pending(store: &Store, cluster: &str) -> Result<Vec<Pending>, StoreError> {
    let q = Sql::new(
        "SELECT id, attempts, uuid, started_at, usr, policy, stage, dry_run, decided_at, figures
         FROM policy_actions
         WHERE outcome = 'pending' AND cluster_id = $1 AND action = 'cancel'
         ORDER BY id",
    )
    .arg(cluster);
    let mut out = Vec::new();
    for r in store.fetch_all(&q).await? {
        let stage: i64 = r.get(6)?;
        let dry: i64 = r.get(7)?;
        let figures: String = r.get(9)?;
        out.push(Pending {
            id: r.get(0)?,
            attempts: r.get(1)?,
            decision: Decision {
                cluster: cluster.to_owned(),
                uuid: r.get(2)?,
                started_at: r.get(3)?,
                user: r.get(4)?,
                policy: r.get(5)?,
                stage: usize::try_from(stage).unwrap_or(0),
                action: "cancel",
                dry_run: dry != 0,
                decided_at: r.get(8)?,
                figures: serde_json::from_str(&figures).unwrap_or_default(),
            },
        });
    }
    Ok(out)
}

/// How many actions each policy took, by stage name and outcome, since the database began:
/// the counters of `/metrics`, the same on every server sharing the database.
pub async fn totals(store: &Store) -> Result<Vec<(String, String, String, u64)>, StoreError> {
    let q = Sql::new(
        "SELECT policy, action, stage, outcome, count(*) FROM policy_actions
         GROUP BY policy, action, stage, outcome ORDER BY policy, stage, outcome",
    );
    let mut out = Vec::new();
    for r in store.fetch_all(&q).await? {
        let action: String = r.get(1)?;
        let stage: i64 = r.get(2)?;
        let n: i64 = r.get(4)?;
        let stage = match action.as_str() {
            "warn" => format!("warn-{stage}"),
            other => other.to_owned(),
        };
        out.push((r.get(0)?, stage, r.get(3)?, u64::try_from(n).unwrap_or(0)));
    }
    Ok(out)
}
