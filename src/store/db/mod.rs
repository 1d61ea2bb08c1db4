//! The stats-server's database, SQLite (one file, WAL) or PostgreSQL (shared by several
//! servers): its connection, transactions and leases, and one file per kind of data it writes.

mod accounts;
mod aggregates;
mod ceems_import;
mod changes;
mod connect;
mod judge;
mod nodes;
mod retention;
#[doc(hidden)]
pub mod testing;
#[cfg(test)]
mod tests;
mod tx;
mod upsert;

use std::sync::Arc;

use sqlx::postgres::{PgPool, Postgres};
use sqlx::sqlite::{Sqlite, SqlitePool};

use super::shared_read::SharedRead;
use super::sql::Backend;

pub use accounts::{Readers, Tenure, SERVICE_ACCOUNT};
pub use aggregates::{
    measured, merge_series, AggregateDelta, AggregateTarget, SeriesFold, SeriesWeights, USAGE_SUMS,
};
pub use connect::{
    describe_postgres_url, is_postgres_url, sqlite_options, sqlite_writer_options,
    DEFAULT_PAGE_CACHE_BYTES,
};
pub use judge::{findings_of_new_jobs, InsertJudge};
pub use nodes::NodesDue;
pub use retention::{backup_name, prune_backups};
pub use tx::Lease;
pub use upsert::{postgres_insert, sqlite_insert, ROWS_PER_STATEMENT};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    // The cause is in the message and not a `source`, so a chain of contexts prints it once.
    #[error("{path}: {error}")]
    Open { path: String, error: sqlx::Error },
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("{path}: {error}")]
    Lock { path: String, error: std::io::Error },
    #[error("database: {0}")]
    Sql(#[from] sqlx::Error),
    /// An error of a read that several callers shared.
    #[error("database: {0}")]
    Shared(Arc<sqlx::Error>),
    #[error("{0} is for SQLite databases only")]
    SqliteOnly(&'static str),
}

enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// A write transaction on either database.
pub enum Tx {
    Sqlite(sqlx::Transaction<'static, Sqlite>),
    Postgres(sqlx::Transaction<'static, Postgres>),
}

pub struct Store {
    pool: Pool,
    /// The connection of SQLite's write transactions, with the large page cache a big batch
    /// wants; the pool's keep small ones (each connection has its own cache).
    sqlite_writer: Option<SqlitePool>,
    /// Bumped by every write, so readers can tell a cached answer is stale (SQLite's; on
    /// PostgreSQL the database holds it, see `generation()`).
    generation: std::sync::atomic::AtomicU64,
    /// The PostgreSQL generation's reads, shared by the requests that wait at once.
    generation_reads: Arc<SharedRead<Result<u64, Arc<sqlx::Error>>>>,
    /// Whose tables these are: ours, or, opened read-only by the lb, CEEMS's own `ceems.db`.
    schema: Schema,
    /// What the last commits through this store changed (SQLite's generations).
    changes: std::sync::Mutex<changes::ChangeLog>,
    /// The rules that judge the jobs an ingestion inserts, in the same statement; unset, the
    /// findings pass judges them afterwards.
    insert_judge: std::sync::OnceLock<InsertJudge>,
}

/// Whose schema a database has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Schema {
    #[default]
    Ours,
    /// CEEMS's API server's (`units.username`, `projects.users` a JSON list).
    Ceems,
}

/// Ingestion's writers on PostgreSQL (of the pool's 16 connections).
const POSTGRES_WRITERS: usize = 2;

impl Store {
    pub fn backend(&self) -> Backend {
        match self.pool {
            Pool::Sqlite(_) => Backend::Sqlite,
            Pool::Postgres(_) => Backend::Postgres,
        }
    }

    /// Marks a commit, so that cached answers made before it are stale.
    fn written(&self) {
        self.commit_changed(None);
    }

    /// Marks a commit that changed only these units' own rows (their aggregates, findings),
    /// or other tables than `units` (no ids): jobs' spans, and other jobs, are as they were.
    fn written_units(&self, units: &[i64]) {
        self.commit_changed(Some(Arc::from(units)));
    }

    fn commit_changed(&self, units: Option<Arc<[i64]>>) {
        // Under the log's lock, so that a reader who saw the new generation finds its entry.
        let mut log = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        let now = self
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel)
            + 1;
        log.push(now, units);
    }

    /// The units whose own rows the commits after generation `from` up to `to` changed, when
    /// nothing else changed and this store knows: SQLite's generations are this store's; on
    /// PostgreSQL other servers write too, and `None` is the answer.
    pub fn units_changed(&self, from: u64, to: u64) -> Option<Vec<i64>> {
        if self.backend() != Backend::Sqlite {
            return None;
        }
        self.changes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .units_changed(from, to)
    }

    /// How many transactions an ingestion writes at once: SQLite takes one writer at a time;
    /// PostgreSQL spreads a batch's indexes and checks over as many backends.
    pub fn concurrent_writers(&self) -> usize {
        match self.pool {
            Pool::Sqlite(_) => 1,
            Pool::Postgres(_) => POSTGRES_WRITERS,
        }
    }
}
