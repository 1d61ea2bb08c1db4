//! Jobs from `sacct` into the store: the window since the last committed run (with an overlap,
//! since running jobs change), in batches that each commit in one transaction; the window only
//! moves with the last batch, so a crash re-ingests at most the uncommitted rest.

use std::path::PathBuf;
use std::time::Duration;

use super::db::{Store, StoreError};
use super::sacct::{self, FIELDS};
use crate::collect::command;

/// Largest sacct answer read (about six million jobs).
pub const MAX_SACCT_OUTPUT: u64 = 1 << 30;
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

/// How to run sacct.
#[derive(Debug, Clone)]
pub struct Sacct {
    pub path: PathBuf,
    pub timeout: Duration,
}

impl Sacct {
    /// The arguments for jobs since `seconds_ago` until now, every user, allocations only.
    pub fn args(seconds_ago: i64) -> Vec<String> {
        vec![
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
        ]
    }

    pub fn run(&self, seconds_ago: i64) -> Result<String, command::CommandError> {
        command::run_env(
            &self.path,
            &Self::args(seconds_ago),
            &[("SLURM_TIME_FORMAT", "%s")],
            self.timeout,
            MAX_SACCT_OUTPUT,
        )
    }
}

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngestReport {
    pub rows: usize,
    pub malformed: usize,
}

/// Ingests the window of `cluster` ending now. The first run looks back `first_window`.
pub async fn ingest_once(
    store: &Store,
    cluster: &str,
    sacct: &Sacct,
    first_window: Duration,
    now: i64,
) -> Result<IngestReport, IngestError> {
    let start = match store.window_start(cluster).await? {
        Some(s) => s,
        None => now - i64::try_from(first_window.as_secs()).unwrap_or(i64::MAX / 2),
    };
    let s = sacct.clone();
    let output = tokio::task::spawn_blocking(move || s.run(now - start))
        .await
        .map_err(|e| command::CommandError::Wait {
            program: sacct.path.display().to_string(),
            source: std::io::Error::other(e),
        })??;
    let (jobs, errors) = sacct::parse_output(&output);
    for e in &errors {
        tracing::warn!(cluster, line = e.line, error = %e.message, "skipping malformed sacct line");
    }
    let next = now - i64::try_from(OVERLAP.as_secs()).unwrap_or(0);
    let chunks: Vec<&[sacct::Job]> = jobs.chunks(BATCH_ROWS).collect();
    let last = chunks.len().saturating_sub(1);
    for (i, chunk) in chunks.iter().enumerate() {
        if i == last {
            store.ingest(cluster, chunk, next.max(start), now).await?;
        } else {
            store.upsert_jobs(cluster, chunk, now).await?;
        }
    }
    if jobs.is_empty() {
        store.ingest(cluster, &[], next.max(start), now).await?;
    }
    Ok(IngestReport {
        rows: jobs.len(),
        malformed: errors.len(),
    })
}
