//! The SQLite database of the stats-server: WAL mode, embedded migrations, and job batches
//! written in one transaction each, upserted on (cluster, job id, start time) so that a window
//! ingested twice changes nothing.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::Row;

use super::sacct::Job;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database {path}: {source}")]
    Open { path: String, source: sqlx::Error },
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("database: {0}")]
    Sql(#[from] sqlx::Error),
}

pub struct Store {
    pool: SqlitePool,
}

impl Store {
    /// Opens (creating) the database at `path` and brings its schema up to date.
    pub async fn open(path: &Path) -> Result<Store, StoreError> {
        let url = format!("sqlite://{}", path.display());
        let open_err = |source| StoreError::Open {
            path: path.display().to_string(),
            source,
        };
        let opts = SqliteConnectOptions::from_str(&url)
            .map_err(open_err)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // In WAL mode NORMAL loses no committed transaction when the process dies; only a
            // power loss can take the last ones.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(opts)
            .await
            .map_err(open_err)?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        Ok(Store { pool })
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Writes one batch of jobs in one transaction. A job that has started replaces its pending
    /// row (start 0). Returns the rows written.
    pub async fn upsert_jobs(
        &self,
        cluster: &str,
        jobs: &[Job],
        now: i64,
    ) -> Result<usize, StoreError> {
        let mut tx = self.pool.begin().await?;
        upsert(&mut tx, cluster, jobs, now).await?;
        tx.commit().await?;
        Ok(jobs.len())
    }
}

/// Rows per INSERT: 23 parameters each stays far below SQLite's limit of 32766.
const ROWS_PER_STATEMENT: usize = 500;

async fn upsert(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    cluster: &str,
    jobs: &[Job],
    now: i64,
) -> Result<(), StoreError> {
    let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    for chunk in jobs.chunks(ROWS_PER_STATEMENT) {
        // A job that has started replaces the row it had while pending.
        let started: Vec<&str> = chunk
            .iter()
            .filter(|j| j.start.unwrap_or(0) != 0)
            .map(|j| j.job_id.as_str())
            .collect();
        if !started.is_empty() {
            let mut q = sqlx::QueryBuilder::<sqlx::Sqlite>::new(
                "DELETE FROM units WHERE started_at = 0 AND cluster_id = ",
            );
            q.push_bind(cluster).push(" AND uuid IN (");
            let mut ids = q.separated(", ");
            for id in &started {
                ids.push_bind(*id);
            }
            ids.push_unseparated(")");
            q.build().execute(&mut **tx).await?;
        }
        let mut q = sqlx::QueryBuilder::<sqlx::Sqlite>::new(
            "INSERT INTO units (cluster_id, uuid, started_at, name, project, grp, gid, usr, uid,
                partition, qos, submitted_at, ended_at, elapsed_seconds, state, exit_code,
                alloc_cpus, alloc_mem_bytes, alloc_gpus, billing, nodes, workdir, last_updated_at) ",
        );
        q.push_values(chunk, |mut row, j| {
            row.push_bind(cluster)
                .push_bind(j.job_id.as_str())
                .push_bind(j.start.unwrap_or(0))
                .push_bind(j.name.as_str())
                .push_bind(j.account.as_str())
                .push_bind(j.group.as_str())
                .push_bind(j.gid)
                .push_bind(j.user.as_str())
                .push_bind(j.uid)
                .push_bind(j.partition.as_str())
                .push_bind(j.qos.as_str())
                .push_bind(j.submit)
                .push_bind(j.end)
                .push_bind(int(j.elapsed_seconds))
                .push_bind(j.state.as_str())
                .push_bind(j.exit_code.as_str())
                .push_bind(int(j.tres.cpus))
                .push_bind(int(j.tres.mem_bytes))
                .push_bind(int(j.tres.gpus))
                .push_bind(int(j.tres.billing))
                .push_bind(j.nodes.join(","))
                .push_bind(j.workdir.as_str())
                .push_bind(now);
        });
        q.push(
            " ON CONFLICT (cluster_id, uuid, started_at) DO UPDATE SET
                name = excluded.name, project = excluded.project, grp = excluded.grp,
                gid = excluded.gid, usr = excluded.usr, uid = excluded.uid,
                partition = excluded.partition, qos = excluded.qos,
                submitted_at = excluded.submitted_at, ended_at = excluded.ended_at,
                elapsed_seconds = excluded.elapsed_seconds, state = excluded.state,
                exit_code = excluded.exit_code, alloc_cpus = excluded.alloc_cpus,
                alloc_mem_bytes = excluded.alloc_mem_bytes, alloc_gpus = excluded.alloc_gpus,
                billing = excluded.billing, nodes = excluded.nodes, workdir = excluded.workdir,
                last_updated_at = excluded.last_updated_at",
        );
        q.build().execute(&mut **tx).await?;
    }
    Ok(())
}

impl Store {
    /// Where the next sacct window of `cluster` starts, if a batch was ever committed.
    pub async fn window_start(&self, cluster: &str) -> Result<Option<i64>, StoreError> {
        Ok(
            sqlx::query("SELECT window_start FROM ingest_state WHERE cluster_id = ?1")
                .bind(cluster)
                .fetch_optional(&self.pool)
                .await?
                .map(|r| r.get::<i64, _>(0)),
        )
    }

    /// Writes a batch and moves the window in the same transaction, so a crash leaves either
    /// both or neither.
    pub async fn ingest(
        &self,
        cluster: &str,
        jobs: &[Job],
        next_window: i64,
        now: i64,
    ) -> Result<usize, StoreError> {
        let mut tx = self.pool.begin().await?;
        upsert(&mut tx, cluster, jobs, now).await?;
        sqlx::query(
            "INSERT INTO ingest_state (cluster_id, window_start) VALUES (?1, ?2)
             ON CONFLICT (cluster_id) DO UPDATE SET window_start = excluded.window_start",
        )
        .bind(cluster)
        .bind(next_window)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(jobs.len())
    }

    pub async fn count_units(&self, cluster: &str) -> Result<i64, StoreError> {
        Ok(
            sqlx::query("SELECT count(*) FROM units WHERE cluster_id = ?1")
                .bind(cluster)
                .fetch_one(&self.pool)
                .await?
                .get::<i64, _>(0),
        )
    }

    /// `PRAGMA integrity_check`: "ok" for a sound file.
    pub async fn integrity_check(&self) -> Result<String, StoreError> {
        Ok(sqlx::query("PRAGMA integrity_check")
            .fetch_one(&self.pool)
            .await?
            .get::<String, _>(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sacct;

    const LINES: &str = "\
1|debug|normal|physics|alice|2001|alice|2001|1795358897|1795358897|1795358926|00:00:29|29|0:0|COMPLETED|billing=1,cpu=1,mem=300M,node=1|localhost|/tmp|wrap
2|debug|normal|chemistry|bob|2002|bob|2002|1795359473|None|Unknown|00:00:00|0|0:0|PENDING||None assigned|/tmp|wrap
";

    #[tokio::test]
    async fn a_window_ingested_twice_changes_nothing_and_a_started_job_replaces_its_pending_row() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(&tmp.path().join("ceems.db")).await.unwrap();
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
        let state: String = sqlx::query("SELECT state FROM units WHERE uuid = '2'")
            .fetch_one(store.pool())
            .await
            .unwrap()
            .get(0);
        assert_eq!(state, "RUNNING");
        assert_eq!(store.integrity_check().await.unwrap(), "ok");
        let mode: String = sqlx::query("PRAGMA journal_mode")
            .fetch_one(store.pool())
            .await
            .unwrap()
            .get(0);
        assert_eq!(mode, "wal");
    }
}
