//! Units from a cluster's accounting into the store: the window since the last committed run
//! (with an overlap, since running units change), in batches that each commit in one
//! transaction; the window only moves with the last batch, so a crash re-ingests at most the
//! uncommitted rest. Any manager's [`Accounting`] feeds it.

use std::sync::Arc;
use std::time::Duration;

use super::db::{Store, StoreError};
use crate::manager::{Accounting, AccountingError, UnitRecord};

/// Rows per transaction.
pub const BATCH_ROWS: usize = 10_000;
/// Each window starts this much before the end of the last one.
pub const OVERLAP: Duration = Duration::from_secs(15 * 60);

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error(transparent)]
    Accounting(#[from] AccountingError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the accounting task of cluster `{cluster}` failed: {message}")]
    Task { cluster: String, message: String },
}

/// One cluster the server pulls from.
#[derive(Clone)]
pub struct Cluster {
    /// Its name in the database and the API.
    pub id: String,
    pub accounting: Arc<dyn Accounting>,
}

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngestReport {
    pub rows: usize,
    pub malformed: usize,
}

async fn blocking<T: Send + 'static>(
    cluster: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, IngestError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| IngestError::Task {
            cluster: cluster.to_owned(),
            message: e.to_string(),
        })
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
    let accounting = Arc::clone(&cluster.accounting);
    let units = blocking(id, move || accounting.units_since(now - start)).await??;
    let next = (now - i64::try_from(OVERLAP.as_secs()).unwrap_or(0)).max(start);
    // Parsing runs on its own thread while the previous batch is written: each takes about
    // half the time of an ingestion.
    let (batches, mut ready) = tokio::sync::mpsc::channel::<Vec<UnitRecord>>(2);
    let cluster_id = id.to_owned();
    let parser = tokio::task::spawn_blocking(move || {
        let mut malformed = 0usize;
        let mut batch = Vec::with_capacity(BATCH_ROWS);
        for unit in units {
            match unit {
                Ok(unit) => batch.push(unit),
                Err(e) => {
                    malformed += 1;
                    tracing::warn!(cluster = %cluster_id, line = e.line, error = %e.message, "skipping a malformed accounting record");
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
    let mut pending: Option<Vec<UnitRecord>> = None;
    while let Some(batch) = ready.recv().await {
        if let Some(previous) = pending.replace(batch) {
            store.upsert_jobs(id, &previous, now).await?;
            report.rows += previous.len();
        }
    }
    report.malformed = parser.await.map_err(|e| IngestError::Task {
        cluster: id.to_owned(),
        message: e.to_string(),
    })?;
    let last = pending.unwrap_or_default();
    store.ingest(id, &last, next, now).await?;
    report.rows += last.len();
    Ok(report)
}

/// Replaces the users, projects and their associations of `cluster` with its accounting's;
/// None when this cluster's are not pulled.
pub async fn sync_associations(
    store: &Store,
    cluster: &Cluster,
    now: i64,
) -> Result<Option<usize>, IngestError> {
    let accounting = Arc::clone(&cluster.accounting);
    let Some(answer) = blocking(&cluster.id, move || accounting.associations()).await? else {
        return Ok(None);
    };
    let (assoc, errors) = answer?;
    for e in &errors {
        tracing::warn!(cluster = %cluster.id, line = e.line, error = %e.message, "skipping a malformed association");
    }
    store.replace_associations(&cluster.id, &assoc, now).await?;
    Ok(Some(assoc.members.len()))
}
