//! Jobs from `sacct` into the store: the window since the last committed run (with an overlap,
//! since running jobs change), in batches that each commit in one transaction; the window only
//! moves with the last batch, so a crash re-ingests at most the uncommitted rest. Users and
//! projects come from `sacctmgr`.

use std::time::Duration;

use super::db::{Store, StoreError};
use super::runner::SlurmCommand;
use super::sacct::{self, FIELDS};
use crate::host::command;

/// The resource manager of the clusters ingested here, as the schema records it.
pub const MANAGER: &str = "slurm";
/// Largest sacct answer read (about six million jobs).
pub const MAX_SACCT_OUTPUT: u64 = 1 << 30;
/// Largest sacctmgr answer read.
pub const MAX_SACCTMGR_OUTPUT: u64 = 64 << 20;
/// Rows per transaction.
pub const BATCH_ROWS: usize = 10_000;
/// Each window starts this much before the end of the last one.
pub const OVERLAP: Duration = Duration::from_secs(15 * 60);

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error(transparent)]
    Command(#[from] command::CommandError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One Slurm cluster the server pulls from.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// Its name in the database and the API.
    pub id: String,
    pub sacct: SlurmCommand,
    pub sacctmgr: Option<SlurmCommand>,
    /// `--clusters=<name>` for both commands, for a slurmdbd that serves several clusters.
    pub slurm_name: Option<String>,
}

impl Cluster {
    /// The sacct arguments for jobs since `seconds_ago` until now, every user, allocations only.
    pub fn sacct_args(&self, seconds_ago: i64) -> Vec<String> {
        let mut args = vec![
            "-D".into(),
            "-X".into(),
            "--noheader".into(),
            "--allusers".into(),
            "--parsable2".into(),
            "--format".into(),
            FIELDS.join(","),
            // Relative times: sacct reads absolute ones in the server's local time zone.
            "--starttime".into(),
            format!("now-{}", seconds_ago.max(0)),
            "--endtime".into(),
            "now".into(),
        ];
        if let Some(name) = &self.slurm_name {
            args.push(format!("--clusters={name}"));
        }
        args
    }

    pub fn run_sacct(&self, seconds_ago: i64) -> Result<String, command::CommandError> {
        self.sacct.run(
            &self.sacct_args(seconds_ago),
            &[("SLURM_TIME_FORMAT", "%s")],
            MAX_SACCT_OUTPUT,
        )
    }

    pub fn sacctmgr_args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            "list",
            "associations",
            "--noheader",
            "--parsable2",
            "format=account,user",
        ]
        .map(str::to_owned)
        .to_vec();
        if let Some(name) = &self.slurm_name {
            args.push(format!("cluster={name}"));
        }
        args
    }
}

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngestReport {
    pub rows: usize,
    pub malformed: usize,
}

async fn blocking<T: Send + 'static>(
    program: &std::path::Path,
    f: impl FnOnce() -> Result<T, command::CommandError> + Send + 'static,
) -> Result<T, command::CommandError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| command::CommandError::Wait {
            program: program.display().to_string(),
            source: std::io::Error::other(e),
        })?
}

/// Ingests the window of `cluster` ending now. The first run looks back `first_window`.
pub async fn ingest_once(
    store: &Store,
    cluster: &Cluster,
    first_window: Duration,
    now: i64,
) -> Result<IngestReport, IngestError> {
    let id = cluster.id.as_str();
    let start = match store.window_start(id).await? {
        Some(s) => s,
        None => now - i64::try_from(first_window.as_secs()).unwrap_or(i64::MAX / 2),
    };
    let c = cluster.clone();
    let output = blocking(&cluster.sacct.path, move || c.run_sacct(now - start)).await?;
    let next = (now - i64::try_from(OVERLAP.as_secs()).unwrap_or(0)).max(start);
    // Parsing runs on its own thread while the previous batch is written: each takes about
    // half the time of an ingestion.
    let (batches, mut ready) = tokio::sync::mpsc::channel::<Vec<sacct::Job>>(2);
    let cluster_id = id.to_owned();
    let parser = tokio::task::spawn_blocking(move || {
        let mut malformed = 0usize;
        let mut batch = Vec::with_capacity(BATCH_ROWS);
        for (i, line) in output.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match sacct::parse_line(i + 1, line) {
                Ok(job) => batch.push(job),
                Err(e) => {
                    malformed += 1;
                    tracing::warn!(cluster = %cluster_id, line = e.line, error = %e.message, "skipping malformed sacct line");
                }
            }
            if batch.len() == BATCH_ROWS {
                batch.sort_unstable_by(|a, b| a.user.cmp(&b.user));
                let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH_ROWS));
                if batches.blocking_send(full).is_err() {
                    // The writer failed and said why.
                    return malformed;
                }
            }
        }
        batch.sort_unstable_by(|a, b| a.user.cmp(&b.user));
        let _ = batches.blocking_send(batch);
        malformed
    });
    let mut report = IngestReport::default();
    // The last batch commits with the next window, so the window moves only once every
    // row is in.
    let mut pending: Option<Vec<sacct::Job>> = None;
    while let Some(batch) = ready.recv().await {
        if let Some(previous) = pending.replace(batch) {
            store.upsert_jobs(id, &previous, now).await?;
            report.rows += previous.len();
        }
    }
    report.malformed = parser.await.map_err(|e| command::CommandError::Wait {
        program: cluster.sacct.path.display().to_string(),
        source: std::io::Error::other(e),
    })?;
    let last = pending.unwrap_or_default();
    store.ingest(id, &last, next, now).await?;
    report.rows += last.len();
    Ok(report)
}

/// Replaces the users, projects and their associations of `cluster` with sacctmgr's.
pub async fn sync_associations(
    store: &Store,
    cluster: &Cluster,
    now: i64,
) -> Result<Option<usize>, IngestError> {
    let Some(cmd) = cluster.sacctmgr.clone() else {
        return Ok(None);
    };
    let args = cluster.sacctmgr_args();
    let path = cmd.path.clone();
    let output = blocking(&path, move || cmd.run(&args, &[], MAX_SACCTMGR_OUTPUT)).await?;
    let (assoc, errors) = sacct::parse_associations(&output);
    for e in &errors {
        tracing::warn!(cluster = %cluster.id, line = e.line, error = %e.message, "skipping malformed sacctmgr line");
    }
    store.replace_associations(&cluster.id, &assoc, now).await?;
    Ok(Some(assoc.members.len()))
}
