//! Units from a cluster's accounting into the store: the window since the last committed run
//! (with an overlap, since running units change), in batches that each commit in one
//! transaction; the window moves once every other batch is in (with PostgreSQL's last
//! batch), so a crash re-ingests the window again (upserts: nothing is counted twice). Any
//! manager's [`Accounting`] feeds it.

use std::sync::Arc;
use std::time::Duration;

use super::db::{Store, StoreError};
use crate::manager::{Accounting, AccountingError, RecordError, UnitRecord};

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
    let stored = store.window_start(id).await?;
    let start = match stored {
        Some(s) => s,
        None => now - i64::try_from(first_window.as_secs()).unwrap_or(i64::MAX / 2),
    };
    // The last completed ingestion ran at most an overlap after the window it stored.
    let overlap = i64::try_from(OVERLAP.as_secs()).unwrap_or(0);
    let unseen_after = Some(stored.map_or(i64::MIN, |s| s.saturating_add(overlap)));
    let accounting = Arc::clone(&cluster.accounting);
    let units = blocking(id, move || accounting.units_since(now - start)).await??;
    let next = (now - overlap).max(start);
    // Parsing runs on its own thread while the previous batch is written: each takes about
    // half the time of an ingestion. One batch waits between them: each batch in flight is
    // about 6 MB of the server's peak memory (heaptrack).
    let (batches, ready) = tokio::sync::mpsc::channel::<Vec<UnitRecord>>(1);
    let cluster_id = id.to_owned();
    let parser = tokio::task::spawn_blocking(move || {
        let mut malformed = 0usize;
        let mut batch = Vec::with_capacity(BATCH_ROWS);
        for unit in units {
            match unit {
                Ok(unit) => batch.push(unit),
                Err(RecordError::Malformed(e)) => {
                    malformed += 1;
                    tracing::warn!(cluster = %cluster_id, line = e.line, error = %e.message, "skipping a malformed accounting record");
                }
                // The batches sent are written (upserts: the next run writes them again
                // harmlessly); the window stays where it was.
                Err(RecordError::Broken(e)) => return Err(e),
            }
            if batch.len() == BATCH_ROWS {
                batch.sort_unstable_by(|a, b| a.user.cmp(&b.user));
                if batches.blocking_send(std::mem::take(&mut batch)).is_err() {
                    // The writer failed and said why.
                    return Ok(malformed);
                }
                // Only once the last one is taken: a full batch's room while it waits.
                batch.reserve_exact(BATCH_ROWS);
            }
        }
        batch.sort_unstable_by(|a, b| a.user.cmp(&b.user));
        let _ = batches.blocking_send(batch);
        Ok(malformed)
    });
    let written = write_batches(store, id, ready, now, unseen_after).await;
    let malformed = parser.await.map_err(|e| IngestError::Task {
        cluster: id.to_owned(),
        message: e.to_string(),
    })??;
    let (written, last) = written?;
    // Every other row is in: only now does the window move.
    store.ingest(id, &last, next, now).await?;
    let report = IngestReport {
        rows: written + last.len(),
        malformed,
    };
    // The rows are committed: stale statistics only make later queries slower.
    if let Err(e) = store.analyze_after_bulk_write(report.rows).await {
        tracing::warn!(cluster = %id, error = %e, "cannot refresh the planner's statistics of the jobs table");
    }
    Ok(report)
}

/// Writes the batches from `ready` as they come, each in its own transaction: the rows
/// written, and those left to write with the window. With one writer (SQLite) the batches go
/// to it straight (each hop holds a batch) and none is left. With several (PostgreSQL) a job
/// always goes to the same writer, so its listings (pending, then started) are written in the
/// order sacct gave them; the last batch is left whole, to be written after every other in
/// sacct's order, so that a small ingestion's jobs are stored in that order on either store.
async fn write_batches(
    store: &Store,
    cluster: &str,
    mut ready: tokio::sync::mpsc::Receiver<Vec<UnitRecord>>,
    now: i64,
    unseen_after: Option<i64>,
) -> Result<(usize, Vec<UnitRecord>), StoreError> {
    let write = |mut inbox: tokio::sync::mpsc::Receiver<Vec<UnitRecord>>| async move {
        let mut rows = 0;
        while let Some(part) = inbox.recv().await {
            rows += store.upsert_jobs(cluster, &part, now, unseen_after).await?;
        }
        Ok::<usize, StoreError>(rows)
    };
    let writers = store.concurrent_writers();
    if writers <= 1 {
        return Ok((write(ready).await?, Vec::new()));
    }
    let (parts, inboxes): (Vec<_>, Vec<_>) = (0..writers)
        .map(|_| tokio::sync::mpsc::channel::<Vec<UnitRecord>>(1))
        .unzip();
    let distribute = async move {
        let mut held: Option<Vec<UnitRecord>> = None;
        while let Some(batch) = ready.recv().await {
            if let Some(previous) = held.replace(batch) {
                for (part, writer) in split_by_unit(previous, writers).into_iter().zip(&parts) {
                    if !part.is_empty() && writer.send(part).await.is_err() {
                        // A writer failed: the error comes from it.
                        return None;
                    }
                }
            }
        }
        held
    };
    let (held, written) = tokio::join!(
        distribute,
        futures_util::future::try_join_all(inboxes.into_iter().map(write))
    );
    Ok((written?.into_iter().sum(), held.unwrap_or_default()))
}

/// `batch` in `n` parts, each job in the part its id picks; each part keeps the batch's order.
fn split_by_unit(batch: Vec<UnitRecord>, n: usize) -> Vec<Vec<UnitRecord>> {
    if n <= 1 {
        return vec![batch];
    }
    let mut parts: Vec<Vec<UnitRecord>> = (0..n)
        .map(|_| Vec::with_capacity(batch.len() / n + 1))
        .collect();
    let hasher =
        std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default();
    for unit in batch {
        let i = std::hash::BuildHasher::hash_one(&hasher, &unit.uuid) as usize % n;
        parts[i].push(unit);
    }
    parts
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::{Associations, UnitRecords};
    use crate::store::sql::Sql;

    /// sacct's answer: `lines`, whatever the window; broken off (slurmdbd gone) after this
    /// many jobs when the second field says so.
    struct Listing(String, Option<usize>);

    impl Accounting for Listing {
        fn manager(&self) -> &'static str {
            "slurm"
        }
        fn units_since(&self, _: i64) -> Result<UnitRecords, AccountingError> {
            let (jobs, errors) = crate::manager::slurm::sacct::parse_output(&self.0);
            assert!(errors.is_empty(), "{errors:?}");
            let Some(after) = self.1 else {
                return Ok(Box::new(jobs.into_iter().map(Ok)));
            };
            let broken = RecordError::Broken(AccountingError::Other(
                "sacct exited with 1: slurmdbd went away".to_owned(),
            ));
            let records: Vec<_> = jobs.into_iter().take(after).map(Ok).collect();
            Ok(Box::new(records.into_iter().chain([Err(broken)])))
        }
        fn unit(&self, _: &str) -> Result<UnitRecords, AccountingError> {
            unreachable!("an ingestion asks for a window")
        }
        fn associations(
            &self,
        ) -> Option<Result<(Associations, Vec<crate::host::ParseError>), AccountingError>> {
            None
        }
    }

    /// An answer that breaks off midway fails the run with sacct's words and keeps the
    /// window: the next run reads it again, and every job is stored once.
    #[tokio::test]
    async fn an_answer_broken_off_midway_fails_the_run_and_keeps_the_window() {
        let tmp = tempfile::tempdir().unwrap();
        let store = crate::store::db::testing::store(tmp.path()).await;
        let total = 3 * BATCH_ROWS;
        let lines: Vec<String> = (0..total).map(|i| line(i, "RUNNING")).collect();
        let broken = Cluster {
            id: "lab".to_owned(),
            accounting: Arc::new(Listing(lines.join("\n"), Some(2 * BATCH_ROWS + 5))),
        };
        let err = ingest_once(&store, &broken, Duration::from_secs(3600), 1795359500)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("slurmdbd went away"), "{err}");
        assert_eq!(store.window_start("lab").await.unwrap(), None);
        let whole = Cluster {
            id: "lab".to_owned(),
            accounting: Arc::new(Listing(lines.join("\n"), None)),
        };
        let report = ingest_once(&store, &whole, Duration::from_secs(3600), 1795359600)
            .await
            .unwrap();
        assert_eq!(report.rows, total);
        assert_eq!(store.count_units("lab").await.unwrap(), total as i64);
        assert_eq!(
            store.window_start("lab").await.unwrap(),
            Some(1795359600 - OVERLAP.as_secs() as i64)
        );
    }

    fn line(id: usize, state: &str) -> String {
        let (start, elapsed, tres, nodes) = if state == "PENDING" {
            ("None", 0, "", "None assigned")
        } else {
            (
                "1795359480",
                5,
                "billing=1,cpu=1,mem=100M,node=1",
                "localhost",
            )
        };
        format!("{id}|debug|normal|physics|user{u}|2001|user{u}|2001|1795359473|{start}|Unknown|00:00:{elapsed:02}|{elapsed}|0:0|{state}|{tres}|{nodes}|/tmp|60|wrap", u = id % 7)
    }

    /// Batches are written by several transactions at once on PostgreSQL: a job's later
    /// listing must still win over its earlier one, as when they were written in turn.
    #[tokio::test]
    async fn a_job_listed_again_in_a_later_batch_keeps_its_last_listing() {
        let tmp = tempfile::tempdir().unwrap();
        let store = crate::store::db::testing::store(tmp.path()).await;
        // Batches of jobs 0..BATCH_ROWS pending, the same started, then the rest pending:
        // each started job replaces its pending row, though both are written before the last
        // batch, which moves the window.
        let total = 3 * BATCH_ROWS;
        let mut lines: Vec<String> = (0..BATCH_ROWS).map(|i| line(i, "PENDING")).collect();
        lines.extend((0..BATCH_ROWS).map(|i| line(i, "RUNNING")));
        lines.extend((BATCH_ROWS..total).map(|i| line(i, "PENDING")));
        let cluster = Cluster {
            id: "lab".to_owned(),
            accounting: Arc::new(Listing(lines.join("\n"), None)),
        };
        let report = ingest_once(&store, &cluster, Duration::from_secs(3600), 1795359500)
            .await
            .unwrap();
        assert_eq!(
            report,
            IngestReport {
                rows: total + BATCH_ROWS,
                malformed: 0
            }
        );
        assert_eq!(store.count_units("lab").await.unwrap(), total as i64);
        let by_state = store
            .fetch_all(&Sql::new(
                "SELECT state, count(*) FROM units WHERE cluster_id = 'lab' GROUP BY state ORDER BY state",
            ))
            .await
            .unwrap();
        let by_state: Vec<(String, i64)> = by_state
            .iter()
            .map(|r| (r.get(0).unwrap(), r.get(1).unwrap()))
            .collect();
        assert_eq!(
            by_state,
            [
                ("PENDING".to_owned(), (total - BATCH_ROWS) as i64),
                ("RUNNING".to_owned(), BATCH_ROWS as i64)
            ]
        );
        assert_eq!(
            store.window_start("lab").await.unwrap(),
            Some(1795359500 - OVERLAP.as_secs() as i64)
        );
    }
}
