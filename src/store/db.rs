//! The SQLite database of the stats-server: WAL mode, embedded migrations, and job batches
//! written in one transaction each, upserted on (cluster, job id, start time) so that a window
//! ingested twice changes nothing.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, Postgres};
use sqlx::sqlite::{
    Sqlite, SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::ConnectOptions as _;

use super::shared_read::SharedRead;
use super::sql::{bind_args, Arg, Backend, DbRow, Sql};
use crate::manager::{Associations, UnitRecord};

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
    /// Bumped by every write, so readers can tell a cached answer is stale (SQLite's; on
    /// PostgreSQL the database holds it, see `generation()`).
    generation: std::sync::atomic::AtomicU64,
    /// The PostgreSQL generation's reads, shared by the requests that wait at once.
    generation_reads: Arc<SharedRead<Result<u64, Arc<sqlx::Error>>>>,
}

/// Whether `url` names a PostgreSQL database (anything else is a SQLite file).
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// Where a PostgreSQL URL points, without its password, for messages.
pub fn describe_postgres_url(url: &str) -> String {
    match PgConnectOptions::from_str(url) {
        Ok(o) => describe_postgres(&o),
        Err(_) => "postgresql database (unreadable URL)".to_owned(),
    }
}

fn describe_postgres(o: &PgConnectOptions) -> String {
    format!(
        "postgresql database {} on {}:{} as {}",
        o.get_database().unwrap_or("(default)"),
        o.get_host(),
        o.get_port(),
        o.get_username()
    )
}

impl Store {
    /// Opens (creating) the database at `path` and brings its schema up to date.
    pub async fn open(path: &Path) -> Result<Store, StoreError> {
        let url = format!("sqlite://{}", path.display());
        let open_err = |error| StoreError::Open {
            path: path.display().to_string(),
            error,
        };
        let opts = SqliteConnectOptions::from_str(&url)
            .map_err(open_err)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // In WAL mode NORMAL loses no committed transaction when the process dies; only a
            // power loss can take the last ones.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            // Index pages of a large batch stay in memory (the default is 2 MiB).
            .pragma("cache_size", "-32768")
            // Fewer, larger checkpoints during a big ingestion (160 MB of WAL instead of 4):
            // each copies pages back on the writer's thread (1M jobs: 95k -> 103k rows/s).
            .pragma("wal_autocheckpoint", "40000")
            // The WAL file shrinks back after a checkpoint has emptied it.
            .pragma("journal_size_limit", "67108864")
            .foreign_keys(true)
            .log_slow_statements(SLOW_STATEMENT_LOG, SLOW_STATEMENT);
        // sqlx takes no lock to migrate SQLite, and switching a new database to WAL does not
        // wait for another connection: two processes opening one new database (the server and
        // an admin's tool) would fail or apply a migration twice. An exclusive flock makes the
        // second wait until the first is done. It is taken on the database's directory, never
        // on the file: closing any descriptor of the file would drop SQLite's fcntl locks on
        // it, and another process would then take the live WAL for a crashed one.
        let lock_err = |error| StoreError::Lock {
            path: path.display().to_string(),
            error,
        };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let file = std::fs::File::open(dir).map_err(lock_err)?;
        let lock = tokio::task::spawn_blocking(move || {
            nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
                .map_err(|(_, errno)| std::io::Error::from(errno))
        })
        .await
        .map_err(|e| lock_err(std::io::Error::other(e)))?
        .map_err(lock_err)?;
        let pool = SqlitePoolOptions::new()
            // WAL lets readers run beside the writer; API requests take the rest.
            .max_connections(8)
            .connect_with(opts)
            .await
            .map_err(open_err)?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        drop(lock);
        Ok(Store {
            pool: Pool::Sqlite(pool),
            generation: Default::default(),
            generation_reads: Default::default(),
        })
    }

    /// Connects to the PostgreSQL database at `url` and brings its schema up to date (sqlx
    /// holds an advisory lock while it migrates, so two servers starting together are safe).
    pub async fn connect_postgres(url: &str) -> Result<Store, StoreError> {
        let opts = PgConnectOptions::from_str(url).map_err(|error| StoreError::Open {
            path: describe_postgres_url(url),
            error,
        })?;
        Store::connect_postgres_with(opts).await
    }

    async fn connect_postgres_with(opts: PgConnectOptions) -> Result<Store, StoreError> {
        let open_err = |error| StoreError::Open {
            path: describe_postgres(&opts),
            error,
        };
        let opts = opts
            .clone()
            .application_name("ceems-stats-server")
            .log_slow_statements(SLOW_STATEMENT_LOG, SLOW_STATEMENT);
        let pool = PgPoolOptions::new()
            .max_connections(16)
            // A database that is down fails a request in seconds instead of holding it.
            .acquire_timeout(Duration::from_secs(5))
            // sqlx already pings a connection when it comes back to the pool, which finds a
            // broken one; pinging it again before handing it out cost each request a round trip.
            .test_before_acquire(false)
            .connect_with(opts)
            .await
            .map_err(open_err)?;
        sqlx::migrate!("./migrations/postgres").run(&pool).await?;
        Ok(Store {
            pool: Pool::Postgres(pool),
            generation: Default::default(),
            generation_reads: Default::default(),
        })
    }

    /// Opens a SQLite file or connects to PostgreSQL, as `url` says.
    pub async fn open_url(url: &str) -> Result<Store, StoreError> {
        if is_postgres_url(url) {
            Store::connect_postgres(url).await
        } else {
            let path = url.strip_prefix("sqlite://").unwrap_or(url);
            Store::open(Path::new(path)).await
        }
    }

    pub fn backend(&self) -> Backend {
        match self.pool {
            Pool::Sqlite(_) => Backend::Sqlite,
            Pool::Postgres(_) => Backend::Postgres,
        }
    }

    /// A write transaction. On SQLite it takes the write lock at once: a deferred one that
    /// read first fails with "database is locked" when another writer (the digests, say)
    /// committed meanwhile, instead of waiting its turn.
    pub async fn write_tx(&self) -> Result<Tx, StoreError> {
        Ok(match &self.pool {
            Pool::Sqlite(p) => Tx::Sqlite(p.begin_with("BEGIN IMMEDIATE").await?),
            Pool::Postgres(p) => Tx::Postgres(p.begin().await?),
        })
    }

    pub async fn fetch_all(&self, q: &Sql) -> Result<Vec<DbRow>, sqlx::Error> {
        Ok(match &self.pool {
            Pool::Sqlite(p) => {
                let text = q.sqlite_text();
                bind_args!(sqlx::query(&text), &q.args)
                    .fetch_all(p)
                    .await?
                    .into_iter()
                    .map(DbRow::Sqlite)
                    .collect()
            }
            Pool::Postgres(p) => bind_args!(sqlx::query(q.text()), &q.args)
                .fetch_all(p)
                .await?
                .into_iter()
                .map(DbRow::Postgres)
                .collect(),
        })
    }

    pub async fn fetch_optional(&self, q: &Sql) -> Result<Option<DbRow>, sqlx::Error> {
        Ok(match &self.pool {
            Pool::Sqlite(p) => {
                let text = q.sqlite_text();
                bind_args!(sqlx::query(&text), &q.args)
                    .fetch_optional(p)
                    .await?
                    .map(DbRow::Sqlite)
            }
            Pool::Postgres(p) => bind_args!(sqlx::query(q.text()), &q.args)
                .fetch_optional(p)
                .await?
                .map(DbRow::Postgres),
        })
    }

    pub async fn fetch_one(&self, q: &Sql) -> Result<DbRow, sqlx::Error> {
        self.fetch_optional(q)
            .await?
            .ok_or(sqlx::Error::RowNotFound)
    }

    /// Runs a statement that writes; returns the rows it changed. On PostgreSQL it commits
    /// with a move of the shared generation.
    pub async fn execute(&self, q: &Sql) -> Result<u64, sqlx::Error> {
        Ok(match &self.pool {
            Pool::Sqlite(p) => {
                let text = q.sqlite_text();
                bind_args!(sqlx::query(&text), &q.args)
                    .execute(p)
                    .await?
                    .rows_affected()
            }
            Pool::Postgres(p) => {
                let mut tx = Tx::Postgres(p.begin().await?);
                let n = tx.execute(q).await?;
                tx.commit().await?;
                n
            }
        })
    }

    /// Changes whenever data was committed: through this store on SQLite (one server per
    /// file), by any server sharing the database on PostgreSQL. An answer made after reading
    /// a generation is at least as new as the data of that generation.
    pub async fn generation(&self) -> Result<u64, StoreError> {
        match &self.pool {
            Pool::Sqlite(_) => Ok(self.generation.load(std::sync::atomic::Ordering::Acquire)),
            Pool::Postgres(p) => {
                let pool = p.clone();
                let read = move || {
                    let pool = pool.clone();
                    async move {
                        let v: i64 = sqlx::query_scalar(GENERATION)
                            .fetch_one(&pool)
                            .await
                            .map_err(Arc::new)?;
                        Ok(u64::try_from(v).unwrap_or(0))
                    }
                };
                match self.generation_reads.read(read).await {
                    Some(answer) => answer.map_err(StoreError::Shared),
                    None => Err(StoreError::Shared(Arc::new(sqlx::Error::WorkerCrashed))),
                }
            }
        }
    }

    /// A lease on `task` (a cluster's update, the digests): at most one server sharing a
    /// PostgreSQL database holds it, and a server that dies loses it with its connection.
    /// `None` while another holds it. On SQLite, always this server's.
    pub async fn lease(&self, task: &str) -> Result<Option<Lease>, StoreError> {
        let Pool::Postgres(p) = &self.pool else {
            return Ok(Some(Lease { conn: None }));
        };
        let mut conn = p.acquire().await?;
        let got: bool = sqlx::query_scalar(
            "SELECT pg_try_advisory_lock(hashtextextended('ceems stats-server ' || $1, 0))",
        )
        .bind(task)
        .fetch_one(&mut *conn)
        .await?;
        Ok(got.then(|| Lease {
            conn: Some((conn, task.to_owned())),
        }))
    }

    fn written(&self) {
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// How many transactions an ingestion writes at once: SQLite takes one writer at a time;
    /// PostgreSQL spreads a batch's indexes and checks over as many backends.
    pub fn concurrent_writers(&self) -> usize {
        match self.pool {
            Pool::Sqlite(_) => 1,
            Pool::Postgres(_) => POSTGRES_WRITERS,
        }
    }

    /// Writes one batch of jobs in one transaction. A job that has started replaces its pending
    /// row (start 0). Returns the rows written.
    ///
    /// `unseen_after`: jobs that started after it were listed by no completed ingestion, so a
    /// batch of only those is most likely new (see [`upsert_postgres`]).
    pub async fn upsert_jobs(
        &self,
        cluster: &str,
        jobs: &[UnitRecord],
        now: i64,
        unseen_after: Option<i64>,
    ) -> Result<usize, StoreError> {
        let mut tx = self.write_tx().await?;
        upsert(&mut tx, cluster, jobs, now, unseen_after).await?;
        tx.commit().await?;
        self.written();
        Ok(jobs.len())
    }
}

impl Tx {
    pub async fn fetch_optional(&mut self, q: &Sql) -> Result<Option<DbRow>, sqlx::Error> {
        Ok(match self {
            Tx::Sqlite(t) => {
                let text = q.sqlite_text();
                bind_args!(sqlx::query(&text), &q.args)
                    .fetch_optional(&mut **t)
                    .await?
                    .map(DbRow::Sqlite)
            }
            Tx::Postgres(t) => bind_args!(sqlx::query(q.text()), &q.args)
                .fetch_optional(&mut **t)
                .await?
                .map(DbRow::Postgres),
        })
    }

    pub async fn fetch_one(&mut self, q: &Sql) -> Result<DbRow, sqlx::Error> {
        self.fetch_optional(q)
            .await?
            .ok_or(sqlx::Error::RowNotFound)
    }

    /// Runs a statement; returns the rows it changed.
    pub async fn execute(&mut self, q: &Sql) -> Result<u64, sqlx::Error> {
        Ok(match self {
            Tx::Sqlite(t) => {
                let text = q.sqlite_text();
                bind_args!(sqlx::query(&text), &q.args)
                    .execute(&mut **t)
                    .await?
                    .rows_affected()
            }
            Tx::Postgres(t) => bind_args!(sqlx::query(q.text()), &q.args)
                .execute(&mut **t)
                .await?
                .rows_affected(),
        })
    }

    pub async fn commit(self) -> Result<(), sqlx::Error> {
        match self {
            Tx::Sqlite(t) => t.commit().await,
            Tx::Postgres(mut t) => {
                sqlx::query(BUMP_GENERATION).execute(&mut *t).await?;
                t.commit().await
            }
        }
    }
}

/// Ingestion's writers on PostgreSQL (of the pool's 16 connections).
const POSTGRES_WRITERS: usize = 2;

const GENERATION: &str = "SELECT value FROM store_generation WHERE id = 1";
const BUMP_GENERATION: &str = "UPDATE store_generation SET value = value + 1 WHERE id = 1";

/// A task only this server does while it holds this (see [`Store::lease`]).
pub struct Lease {
    conn: Option<(sqlx::pool::PoolConnection<Postgres>, String)>,
}

impl Lease {
    /// Lets another server take the task.
    pub async fn release(mut self) {
        if let Some((mut conn, task)) = self.conn.take() {
            let unlocked = sqlx::query(
                "SELECT pg_advisory_unlock(hashtextextended('ceems stats-server ' || $1, 0))",
            )
            .bind(&task)
            .execute(&mut *conn)
            .await;
            if let Err(e) = unlocked {
                tracing::warn!(task, error = %e, "cannot release a lease; closing its connection");
                drop(conn.detach());
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Not released (an error or a panic on the way): the lock goes with the session, which
        // must not go back to the pool holding it.
        if let Some((conn, _)) = self.conn.take() {
            drop(conn.detach());
        }
    }
}

/// sqlx logs a slow statement with its whole text: a batch insert's thousands of placeholders
/// would flood an operator's journal at `warn`, and the update's own logs say how long it took.
const SLOW_STATEMENT_LOG: log::LevelFilter = log::LevelFilter::Debug;
const SLOW_STATEMENT: Duration = Duration::from_secs(1);

/// Rows per INSERT: 24 parameters each stays far below SQLite's limit of 32766.
const ROWS_PER_STATEMENT: usize = 500;

const UNIT_COLUMNS: &str = "cluster_id, uuid, started_at, name, project, grp, gid, usr, uid,
    partition, qos, submitted_at, ended_at, elapsed_seconds, state, exit_code, alloc_cpus,
    alloc_mem_bytes, alloc_gpus, billing, nodes, workdir, time_limit_seconds, last_updated_at";

const UPSERT_SET: &str = "ON CONFLICT (cluster_id, uuid, started_at) DO UPDATE SET
    name = excluded.name, project = excluded.project, grp = excluded.grp, gid = excluded.gid,
    usr = excluded.usr, uid = excluded.uid, partition = excluded.partition, qos = excluded.qos,
    submitted_at = excluded.submitted_at, ended_at = excluded.ended_at,
    elapsed_seconds = excluded.elapsed_seconds, state = excluded.state,
    exit_code = excluded.exit_code, alloc_cpus = excluded.alloc_cpus,
    alloc_mem_bytes = excluded.alloc_mem_bytes, alloc_gpus = excluded.alloc_gpus,
    billing = excluded.billing, nodes = excluded.nodes, workdir = excluded.workdir,
    time_limit_seconds = excluded.time_limit_seconds, last_updated_at = excluded.last_updated_at";

async fn upsert(
    tx: &mut Tx,
    cluster: &str,
    jobs: &[UnitRecord],
    now: i64,
    unseen_after: Option<i64>,
) -> Result<(), StoreError> {
    // PostgreSQL refuses to update one row twice in a statement: of a job listed twice in a
    // batch, the last listing is written, as SQLite would leave it.
    let mut seen = std::collections::HashSet::with_capacity(jobs.len());
    let mut latest: Vec<&UnitRecord> = jobs
        .iter()
        .rev()
        .filter(|j| seen.insert((j.uuid.as_str(), j.start.unwrap_or(0))))
        .collect();
    latest.reverse();
    // A job that has started replaces the row it had while pending; with no pending row in
    // the cluster nor in this batch, there is nothing to replace.
    let pending = latest.iter().any(|j| j.start.unwrap_or(0) == 0)
        || tx
            .fetch_optional(
                &Sql::new("SELECT 1 FROM units WHERE cluster_id = $1 AND started_at = 0 LIMIT 1")
                    .arg(cluster),
            )
            .await?
            .is_some();
    match tx {
        Tx::Sqlite(t) => upsert_sqlite(t, cluster, &latest, pending, now).await,
        Tx::Postgres(t) => upsert_postgres(t, cluster, &latest, pending, now, unseen_after).await,
    }
}

/// SQLite's upsert: rows of 24 placeholders, ROWS_PER_STATEMENT at a time. Built with sqlx's
/// own builder, which binds the jobs' strings without copying them; each statement is built
/// while SQLite's thread runs the one before, instead of that thread waiting for it.
async fn upsert_sqlite(
    tx: &mut sqlx::Transaction<'static, Sqlite>,
    cluster: &str,
    jobs: &[&UnitRecord],
    pending: bool,
    now: i64,
) -> Result<(), StoreError> {
    fn insert<'a>(
        cluster: &'a str,
        chunk: &'a [&'a UnitRecord],
        now: i64,
    ) -> sqlx::QueryBuilder<'a, Sqlite> {
        let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let mut q = sqlx::QueryBuilder::<Sqlite>::new("INSERT INTO units (");
        q.push(UNIT_COLUMNS).push(") ");
        q.push_values(chunk.iter().copied(), |mut row, j: &UnitRecord| {
            row.push_bind(cluster)
                .push_bind(j.uuid.as_str())
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
                .push_bind(int(j.allocation.cpus))
                .push_bind(int(j.allocation.mem_bytes))
                .push_bind(int(j.allocation.gpus))
                .push_bind(int(j.allocation.billing))
                .push_bind(j.nodes.join(","))
                .push_bind(j.workdir.as_str())
                .push_bind(j.time_limit_seconds.map(int))
                .push_bind(now);
        });
        q.push(" ").push(UPSERT_SET);
        q
    }
    let mut chunks = jobs.chunks(ROWS_PER_STATEMENT);
    let mut next = chunks.next().map(|c| (c, insert(cluster, c, now)));
    while let Some((chunk, mut q)) = next.take() {
        let started: Vec<&str> = chunk
            .iter()
            .filter(|j| j.start.unwrap_or(0) != 0)
            .map(|j| j.uuid.as_str())
            .collect();
        if pending && !started.is_empty() {
            let mut q = sqlx::QueryBuilder::<Sqlite>::new(
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
        // The statement goes to SQLite's thread at the first poll; the next is built meanwhile.
        let (written, built) = tokio::join!(q.build().execute(&mut **tx), async {
            chunks.next().map(|c| (c, insert(cluster, c, now)))
        });
        written?;
        next = built;
    }
    Ok(())
}

/// PostgreSQL's upsert: each column one array parameter, unnested into rows, so that a batch
/// is one statement of 24 values instead of 24 per job. The arrays are unnested in the select
/// list, which PostgreSQL walks in step row by row; `FROM UNNEST(…)` first copies every array
/// into a tuple store (1M jobs: 25% more rows/s this way).
///
/// A batch whose jobs all started after `unseen_after` is first written as a plain INSERT in a
/// savepoint, and upserted only when one of them is stored after all (an ingestion that died
/// part-way): ON CONFLICT probes the unique index once more per row, a quarter of PostgreSQL's
/// time where the jobs are new (a first ingestion, a catch-up after downtime). Other batches
/// are upserted at once, so that PostgreSQL's log does not show a failed insert every update.
/// Only one server ingests a cluster at a time and each job goes through one writer, so no
/// other transaction inserts the same job meanwhile.
async fn upsert_postgres(
    tx: &mut sqlx::Transaction<'static, Postgres>,
    cluster: &str,
    jobs: &[&UnitRecord],
    pending: bool,
    now: i64,
    unseen_after: Option<i64>,
) -> Result<(), StoreError> {
    use sqlx::Connection as _;
    if pending {
        let started: Vec<&str> = jobs
            .iter()
            .filter(|j| j.start.unwrap_or(0) != 0)
            .map(|j| j.uuid.as_str())
            .collect();
        sqlx::query(
            "DELETE FROM units WHERE started_at = 0 AND cluster_id = $1 AND uuid = ANY($2)",
        )
        .bind(cluster)
        .bind(&started)
        .execute(&mut **tx)
        .await?;
    }
    let columns = UnitColumns::new(jobs);
    let insert = format!(
        "INSERT INTO units ({UNIT_COLUMNS})
         SELECT $1, unnest($2::text[]), unnest($3::bigint[]), unnest($4::text[]),
            unnest($5::text[]), unnest($6::text[]), unnest($7::bigint[]), unnest($8::text[]),
            unnest($9::bigint[]), unnest($10::text[]), unnest($11::text[]),
            unnest($12::bigint[]), unnest($13::bigint[]), unnest($14::bigint[]),
            unnest($15::text[]), unnest($16::text[]), unnest($17::bigint[]),
            unnest($18::bigint[]), unnest($19::bigint[]), unnest($20::bigint[]),
            unnest($21::text[]), unnest($22::text[]), unnest($23::bigint[]), $24"
    );
    let unseen = |j: &&UnitRecord| match (j.start, unseen_after) {
        (Some(start), Some(after)) => start != 0 && start > after,
        _ => false,
    };
    if jobs.iter().all(unseen) {
        let mut attempt = (**tx).begin().await?;
        match columns
            .bind(sqlx::query(&insert), cluster, now)
            .execute(&mut *attempt)
            .await
        {
            Ok(_) => {
                attempt.commit().await?;
                return Ok(());
            }
            Err(sqlx::Error::Database(e))
                if e.kind() == sqlx::error::ErrorKind::UniqueViolation =>
            {
                attempt.rollback().await?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    let upsert = format!("{insert} {UPSERT_SET}");
    columns
        .bind(sqlx::query(&upsert), cluster, now)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A batch's jobs as PostgreSQL's upsert binds them: one array per column, in UNIT_COLUMNS'
/// order after the cluster.
struct UnitColumns<'a> {
    texts: [Vec<&'a str>; 10],
    nodes: Vec<String>,
    counts: [Vec<i64>; 5],
    optional: [Vec<Option<i64>>; 5],
    started_at: Vec<i64>,
}

impl<'a> UnitColumns<'a> {
    fn new(jobs: &[&'a UnitRecord]) -> UnitColumns<'a> {
        fn int(v: u64) -> i64 {
            i64::try_from(v).unwrap_or(i64::MAX)
        }
        let text = |f: fn(&UnitRecord) -> &str| jobs.iter().map(|j| f(j)).collect::<Vec<&str>>();
        let count =
            |f: fn(&UnitRecord) -> u64| jobs.iter().map(|j| int(f(j))).collect::<Vec<i64>>();
        let maybe = |f: fn(&UnitRecord) -> Option<i64>| {
            jobs.iter().map(|j| f(j)).collect::<Vec<Option<i64>>>()
        };
        UnitColumns {
            texts: [
                text(|j| &j.uuid),
                text(|j| &j.name),
                text(|j| &j.account),
                text(|j| &j.group),
                text(|j| &j.user),
                text(|j| &j.partition),
                text(|j| &j.qos),
                text(|j| &j.state),
                text(|j| &j.exit_code),
                text(|j| &j.workdir),
            ],
            nodes: jobs.iter().map(|j| j.nodes.join(",")).collect(),
            counts: [
                count(|j| j.elapsed_seconds),
                count(|j| j.allocation.cpus),
                count(|j| j.allocation.mem_bytes),
                count(|j| j.allocation.gpus),
                count(|j| j.allocation.billing),
            ],
            optional: [
                maybe(|j| j.gid.map(i64::from)),
                maybe(|j| j.uid.map(i64::from)),
                maybe(|j| j.submit),
                maybe(|j| j.end),
                maybe(|j| j.time_limit_seconds.map(int)),
            ],
            started_at: jobs.iter().map(|j| j.start.unwrap_or(0)).collect(),
        }
    }

    fn bind<'q>(
        &'q self,
        query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
        cluster: &'q str,
        now: i64,
    ) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
        let [uuid, name, project, group, user, partition, qos, state, exit_code, workdir] =
            &self.texts;
        let [elapsed, cpus, mem, gpus, billing] = &self.counts;
        let [gid, uid, submitted, ended, time_limit] = &self.optional;
        query
            .bind(cluster)
            .bind(uuid)
            .bind(&self.started_at)
            .bind(name)
            .bind(project)
            .bind(group)
            .bind(gid)
            .bind(user)
            .bind(uid)
            .bind(partition)
            .bind(qos)
            .bind(submitted)
            .bind(ended)
            .bind(elapsed)
            .bind(state)
            .bind(exit_code)
            .bind(cpus)
            .bind(mem)
            .bind(gpus)
            .bind(billing)
            .bind(&self.nodes)
            .bind(workdir)
            .bind(time_limit)
            .bind(now)
    }
}

impl Store {
    /// Records that `cluster`'s jobs come from `manager` (a cluster's manager can change only
    /// by configuration).
    pub async fn register_cluster(&self, cluster: &str, manager: &str) -> Result<(), StoreError> {
        self.execute(
            &Sql::new(
                "INSERT INTO clusters (id, manager) VALUES ($1, $2)
                 ON CONFLICT (id) DO UPDATE SET manager = excluded.manager",
            )
            .arg(cluster)
            .arg(manager),
        )
        .await?;
        self.written();
        Ok(())
    }

    /// Where the next sacct window of `cluster` starts, if a batch was ever committed.
    pub async fn window_start(&self, cluster: &str) -> Result<Option<i64>, StoreError> {
        let q =
            Sql::new("SELECT window_start FROM ingest_state WHERE cluster_id = $1").arg(cluster);
        match self.fetch_optional(&q).await? {
            Some(r) => Ok(Some(r.get(0)?)),
            None => Ok(None),
        }
    }

    /// Writes a batch and moves the window in the same transaction, so a crash leaves either
    /// both or neither.
    pub async fn ingest(
        &self,
        cluster: &str,
        jobs: &[UnitRecord],
        next_window: i64,
        now: i64,
    ) -> Result<usize, StoreError> {
        let mut tx = self.write_tx().await?;
        upsert(&mut tx, cluster, jobs, now, None).await?;
        tx.execute(
            &Sql::new(
                "INSERT INTO ingest_state (cluster_id, window_start) VALUES ($1, $2)
                 ON CONFLICT (cluster_id) DO UPDATE SET window_start = excluded.window_start",
            )
            .arg(cluster)
            .arg(next_window),
        )
        .await?;
        tx.commit().await?;
        self.written();
        Ok(jobs.len())
    }

    pub async fn count_units(&self, cluster: &str) -> Result<i64, StoreError> {
        let q = Sql::new("SELECT count(*) FROM units WHERE cluster_id = $1").arg(cluster);
        Ok(self.fetch_one(&q).await?.get(0)?)
    }

    /// `PRAGMA integrity_check`: "ok" for a sound file.
    pub async fn integrity_check(&self) -> Result<String, StoreError> {
        if self.backend() != Backend::Sqlite {
            return Err(StoreError::SqliteOnly("an integrity check"));
        }
        Ok(self
            .fetch_one(&Sql::new("PRAGMA integrity_check"))
            .await?
            .get(0)?)
    }
}

/// A job whose aggregates are due: the window from `from` to `to` is not yet counted.
#[derive(Debug, Clone, PartialEq)]
pub struct AggregateTarget {
    pub row: i64,
    pub uuid: String,
    /// Counted up to here already (None: never).
    pub counted_until: Option<i64>,
    pub from: i64,
    pub to: i64,
    pub ended: bool,
}

/// What Prometheus said about one job over one window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AggregateDelta {
    pub row: i64,
    /// Where the job's counted window ended when this one was read: the delta applies only if
    /// it still does, so a window counted meanwhile (an on-demand report, another server) is
    /// not counted twice.
    pub counted_until: Option<i64>,
    pub to: i64,
    pub ended: bool,
    /// Seconds of the job's life inside the window.
    pub seconds: i64,
    pub cpu_seconds: f64,
    pub cpu_energy_joules: f64,
    pub host_energy_joules: f64,
    pub gpu_energy_joules: f64,
    pub emissions_grams: f64,
    pub io_read_bytes: f64,
    pub io_write_bytes: f64,
    pub mean_memory_bytes: Option<f64>,
    pub mean_gpu_utilization: Option<f64>,
    pub memory_peak_bytes: Option<f64>,
    pub memory_fail_count: Option<f64>,
    pub gpu_utilization_max: Option<f64>,
}

impl Store {
    /// Replaces the users, projects and associations of `cluster` in one transaction.
    pub async fn replace_associations(
        &self,
        cluster: &str,
        a: &Associations,
        now: i64,
    ) -> Result<(), StoreError> {
        let mut tx = self.write_tx().await?;
        for table in ["users", "projects", "associations"] {
            tx.execute(
                &Sql::new(&format!("DELETE FROM {table} WHERE cluster_id = $1")).arg(cluster),
            )
            .await?;
        }
        for p in &a.projects {
            tx.execute(
                &Sql::new(
                    "INSERT INTO projects (cluster_id, name, last_updated_at) VALUES ($1, $2, $3)",
                )
                .arg(cluster)
                .arg(p)
                .arg(now),
            )
            .await?;
        }
        for (user, project) in &a.members {
            tx.execute(
                &Sql::new(
                    "INSERT INTO users (cluster_id, name, last_updated_at) VALUES ($1, $2, $3)
                     ON CONFLICT DO NOTHING",
                )
                .arg(cluster)
                .arg(user)
                .arg(now),
            )
            .await?;
            tx.execute(
                &Sql::new(
                    "INSERT INTO associations (cluster_id, usr, project) VALUES ($1, $2, $3)
                     ON CONFLICT DO NOTHING",
                )
                .arg(cluster)
                .arg(user)
                .arg(project),
            )
            .await?;
        }
        tx.commit().await?;
        self.written();
        Ok(())
    }

    /// Replaces the admin users that came from `source` (the configuration).
    pub async fn set_admins(&self, source: &str, names: &[String]) -> Result<(), StoreError> {
        let mut tx = self.write_tx().await?;
        tx.execute(&Sql::new("DELETE FROM admin_users WHERE source = $1").arg(source))
            .await?;
        for n in names {
            tx.execute(
                &Sql::new(
                    "INSERT INTO admin_users (name, source) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                )
                .arg(n)
                .arg(source),
            )
            .await?;
        }
        tx.commit().await?;
        self.written();
        Ok(())
    }

    /// A trivial query: the database answers.
    pub async fn integrity_ping(&self) -> Result<(), StoreError> {
        self.fetch_one(&Sql::new("SELECT 1")).await?;
        Ok(())
    }

    pub async fn is_admin(&self, name: &str) -> Result<bool, StoreError> {
        let q = Sql::new("SELECT 1 FROM admin_users WHERE name = $1").arg(name);
        Ok(self.fetch_optional(&q).await?.is_some())
    }

    /// Marks ended jobs shorter than `cutoff` seconds as too short to aggregate, and returns
    /// how many.
    pub async fn mark_too_short(
        &self,
        cluster: &str,
        cutoff: i64,
        now: i64,
    ) -> Result<u64, StoreError> {
        let n = self
            .execute(
                &Sql::new(
                    "UPDATE units SET aggregates_status = 'too_short', aggregates_updated_at = $3
                     WHERE cluster_id = $1 AND aggregates_status = 'pending'
                       AND ended_at IS NOT NULL AND elapsed_seconds < $2",
                )
                .arg(cluster)
                .arg(cutoff)
                .arg(now),
            )
            .await?;
        self.written();
        Ok(n)
    }

    /// Started jobs whose aggregates are not complete, with the window still to count.
    pub async fn aggregate_targets(
        &self,
        cluster: &str,
        only: Option<&str>,
        now: i64,
    ) -> Result<Vec<AggregateTarget>, StoreError> {
        let mut q = Sql::new(
            "SELECT id, uuid, aggregates_until, started_at, ended_at FROM units
             WHERE cluster_id = $1 AND aggregates_status IN ('pending', 'partial')
               AND started_at > 0",
        )
        .arg(cluster);
        if let Some(uuid) = only {
            q.push(" AND uuid = ").bind(uuid);
        }
        let rows = self.fetch_all(&q).await?;
        let mut targets = Vec::with_capacity(rows.len());
        for r in rows {
            let counted_until: Option<i64> = r.get(2)?;
            let started: i64 = r.get(3)?;
            let ended: Option<i64> = r.get(4)?;
            targets.push(AggregateTarget {
                row: r.get(0)?,
                uuid: r.get(1)?,
                counted_until,
                from: counted_until.unwrap_or(started).max(started),
                to: ended.unwrap_or(now).min(now),
                // Ended before `now`: a delayed `now` may still fall inside the job.
                ended: ended.is_some_and(|e| e <= now),
            });
        }
        Ok(targets)
    }

    /// Adds one window's aggregates to their jobs in one transaction.
    pub async fn apply_aggregates(
        &self,
        deltas: &[AggregateDelta],
        now: i64,
    ) -> Result<(), StoreError> {
        let mut tx = self.write_tx().await?;
        for d in deltas {
            // A mean absent from this window keeps its value; weights are the covered seconds.
            // A peak keeps the higher of the stored one and this window's.
            let q = Sql::new(
                "UPDATE units SET
                    cpu_seconds = cpu_seconds + $2,
                    cpu_energy_joules = cpu_energy_joules + $3,
                    host_energy_joules = host_energy_joules + $4,
                    gpu_energy_joules = gpu_energy_joules + $5,
                    emissions_grams = emissions_grams + $6,
                    io_read_bytes = io_read_bytes + $7,
                    io_write_bytes = io_write_bytes + $8,
                    mean_memory_bytes = CASE WHEN $9 IS NULL OR aggregated_seconds + $11 = 0
                        THEN mean_memory_bytes
                        ELSE (mean_memory_bytes * aggregated_seconds + $9 * $11) / (aggregated_seconds + $11) END,
                    mean_gpu_utilization = CASE WHEN $10 IS NULL OR aggregated_seconds + $11 = 0
                        THEN mean_gpu_utilization
                        ELSE (mean_gpu_utilization * aggregated_seconds + $10 * $11) / (aggregated_seconds + $11) END,
                    aggregated_seconds = aggregated_seconds + $11,
                    memory_peak_bytes = CASE WHEN $15 IS NULL THEN memory_peak_bytes
                        WHEN memory_peak_bytes IS NULL OR $15 > memory_peak_bytes THEN $15
                        ELSE memory_peak_bytes END,
                    memory_fail_count = CASE WHEN $16 IS NULL THEN memory_fail_count
                        WHEN memory_fail_count IS NULL OR $16 > memory_fail_count THEN $16
                        ELSE memory_fail_count END,
                    gpu_utilization_max = CASE WHEN $17 IS NULL THEN gpu_utilization_max
                        WHEN gpu_utilization_max IS NULL OR $17 > gpu_utilization_max THEN $17
                        ELSE gpu_utilization_max END,
                    aggregates_until = $12,
                    aggregates_status = CASE WHEN $13 THEN 'done' ELSE 'partial' END,
                    aggregates_updated_at = $14
                 WHERE id = $1 AND aggregates_until IS NOT DISTINCT FROM $18",
            )
            .arg(d.row)
            .arg(d.cpu_seconds)
            .arg(d.cpu_energy_joules)
            .arg(d.host_energy_joules)
            .arg(d.gpu_energy_joules)
            .arg(d.emissions_grams)
            .arg(d.io_read_bytes)
            .arg(d.io_write_bytes)
            .arg(d.mean_memory_bytes)
            .arg(d.mean_gpu_utilization)
            .arg(d.seconds.max(0))
            .arg(d.to)
            .arg(d.ended)
            .arg(now)
            .arg(d.memory_peak_bytes)
            .arg(d.memory_fail_count)
            .arg(d.gpu_utilization_max)
            .arg(d.counted_until);
            tx.execute(&q).await?;
        }
        tx.commit().await?;
        self.written();
        Ok(())
    }

    /// Rebuilds the per-project, per-user usage of `cluster` from its jobs.
    pub async fn rebuild_usage(&self, cluster: &str, now: i64) -> Result<(), StoreError> {
        let mut tx = self.write_tx().await?;
        tx.execute(&Sql::new("DELETE FROM usage WHERE cluster_id = $1").arg(cluster))
            .await?;
        tx.execute(
            &Sql::new(
                "INSERT INTO usage (cluster_id, project, usr, num_units, elapsed_seconds, cpu_seconds,
                    alloc_cpu_seconds, cpu_energy_joules, host_energy_joules, gpu_energy_joules,
                    emissions_grams, io_read_bytes, io_write_bytes, last_updated_at)
                 SELECT cluster_id, project, usr, count(*), sum(elapsed_seconds), sum(cpu_seconds),
                    sum(alloc_cpus * aggregated_seconds), sum(cpu_energy_joules),
                    sum(host_energy_joules), sum(gpu_energy_joules), sum(emissions_grams),
                    sum(io_read_bytes), sum(io_write_bytes), $2
                 FROM units WHERE cluster_id = $1 AND started_at > 0
                 GROUP BY cluster_id, project, usr",
            )
            .arg(cluster)
            .arg(now),
        )
        .await?;
        tx.commit().await?;
        self.written();
        Ok(())
    }

    /// Deletes jobs that ended before `before`. Returns how many.
    pub async fn delete_ended_before(&self, before: i64) -> Result<u64, StoreError> {
        let n = self
            .execute(
                &Sql::new("DELETE FROM units WHERE ended_at IS NOT NULL AND ended_at < $1")
                    .arg(before),
            )
            .await?;
        self.written();
        Ok(n)
    }

    /// Writes a consistent copy of the database to `path` (`VACUUM INTO`) while it stays in use.
    pub async fn backup_to(&self, path: &Path) -> Result<(), StoreError> {
        if self.backend() != Backend::Sqlite {
            return Err(StoreError::SqliteOnly("a backup by the stats-server"));
        }
        self.execute(&Sql::new("VACUUM INTO $1").arg(path.display().to_string()))
            .await?;
        Ok(())
    }
}

impl Store {
    /// On PostgreSQL, refreshes the planner's statistics of the jobs table when `written` rows
    /// are a tenth of it or more: autovacuum does the same, but up to a minute later, and until
    /// then the findings pass after a first ingestion is planned as for an empty table (a scan
    /// of every row per page of 5,000). Returns whether it did.
    pub async fn analyze_after_bulk_write(&self, written: usize) -> Result<bool, StoreError> {
        let Pool::Postgres(pool) = &self.pool else {
            return Ok(false);
        };
        // -1 before the table's first ANALYZE.
        let (tuples,): (f32,) =
            sqlx::query_as("SELECT reltuples FROM pg_class WHERE oid = 'units'::regclass")
                .fetch_one(pool)
                .await?;
        if (written as f64) < f64::from(tuples.max(0.0)) / 10.0 + 50.0 {
            return Ok(false);
        }
        sqlx::query("ANALYZE units").execute(pool).await?;
        Ok(true)
    }

    /// Recomputes the findings of the jobs of `cluster` whose row or aggregates changed since
    /// their findings were written. Returns how many jobs were updated.
    pub async fn refresh_findings(
        &self,
        cluster: &str,
        thresholds: &super::findings::Thresholds,
        now: i64,
    ) -> Result<usize, StoreError> {
        // In pages by row id, so a first run over a million jobs holds one page in memory.
        const PAGE: i64 = 5000;
        // SQLite would pick the cluster's index over the row ids and sort a million rows per
        // page; the unary plus keeps it on the primary key. PostgreSQL plans this well.
        let cluster_col = match self.backend() {
            Backend::Sqlite => "+cluster_id",
            Backend::Postgres => "cluster_id",
        };
        let mut after = 0i64;
        let mut total = 0usize;
        loop {
            let q = Sql::new(&format!(
                "SELECT id, state, exit_code, ended_at IS NOT NULL, elapsed_seconds,
                        time_limit_seconds, alloc_cpus, alloc_mem_bytes, alloc_gpus,
                        aggregated_seconds, cpu_seconds, memory_peak_bytes, memory_fail_count,
                        CASE WHEN gpu_utilization_max IS NULL THEN NULL ELSE mean_gpu_utilization END,
                        gpu_utilization_max, host_energy_joules, gpu_energy_joules, emissions_grams
                 FROM units
                 WHERE id > $2 AND {cluster_col} = $1 AND started_at > 0
                   AND (findings_updated_at IS NULL
                        OR findings_updated_at < last_updated_at
                        OR findings_updated_at < coalesce(aggregates_updated_at, 0))
                 ORDER BY id LIMIT $3"
            ))
            .arg(cluster)
            .arg(after)
            .arg(PAGE);
            let rows = self.fetch_all(&q).await?;
            let Some(last) = rows.last() else {
                break;
            };
            after = last.get(0)?;
            // No finding is stored as NULL (read back as `[]`).
            let mut updates: Vec<(i64, Option<String>)> = Vec::with_capacity(rows.len());
            for r in &rows {
                let facts = super::findings::JobFacts {
                    state: r.get(1)?,
                    exit_code: r.get(2)?,
                    ended: r.flag(3)?,
                    elapsed_seconds: r.get(4)?,
                    time_limit_seconds: r.get(5)?,
                    alloc_cpus: r.get(6)?,
                    alloc_mem_bytes: r.get(7)?,
                    alloc_gpus: r.get(8)?,
                    aggregated_seconds: r.get(9)?,
                    cpu_seconds: r.get(10)?,
                    memory_peak_bytes: r.get(11)?,
                    memory_fail_count: r.get(12)?,
                    mean_gpu_utilization: r.get(13)?,
                    gpu_utilization_max: r.get(14)?,
                    host_energy_joules: r.get(15)?,
                    gpu_energy_joules: r.get(16)?,
                    emissions_grams: r.get(17)?,
                };
                let found = super::findings::evaluate(&facts, thresholds);
                let json = (!found.is_empty())
                    .then(|| serde_json::to_string(&found).ok())
                    .flatten();
                updates.push((r.get(0)?, json));
            }
            // One statement per page: row-by-row updates made a first run over a million
            // jobs take minutes.
            let mut q = Sql::new("UPDATE units SET findings = v.column2, findings_updated_at = ");
            q.bind(now).push(" FROM (VALUES ");
            for (i, (id, json)) in updates.iter().enumerate() {
                q.push(if i == 0 { "(" } else { ", (" })
                    .bind(*id)
                    .push(", ")
                    .bind(json.as_deref())
                    .push(")");
            }
            q.push(") AS v WHERE units.id = v.column1");
            self.execute(&q).await?;
            self.written();
            total += updates.len();
        }
        Ok(total)
    }
}

/// Stores for tests, on the backend the environment asks for: SQLite in a test's directory,
/// or, with `CEEMS_TEST_STORE=postgres`, a schema of its own in the database at
/// `CEEMS_TEST_POSTGRES_URL` (`scripts/postgres-lab.sh` prints one).
#[doc(hidden)]
pub mod testing {
    use super::*;

    /// A new, empty store; `dir` holds the SQLite file.
    pub async fn store(dir: &Path) -> Store {
        match std::env::var("CEEMS_TEST_STORE").as_deref() {
            Ok("postgres") => {
                let url = std::env::var("CEEMS_TEST_POSTGRES_URL")
                    .expect("CEEMS_TEST_STORE=postgres needs CEEMS_TEST_POSTGRES_URL");
                postgres_schema(&url).await
            }
            _ => Store::open(&dir.join("ceems.db"))
                .await
                .expect("open the SQLite test store"),
        }
    }

    /// A store in a new schema of the PostgreSQL database at `url`.
    pub async fn postgres_schema(url: &str) -> Store {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let schema = format!(
            "ceems_test_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let opts = PgConnectOptions::from_str(url).expect("CEEMS_TEST_DATABASE_URL");
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(opts.clone())
            .await
            .expect("connect to the test database");
        static SWEPT: std::sync::Once = std::sync::Once::new();
        let mut sweep = false;
        SWEPT.call_once(|| sweep = true);
        if sweep {
            drop_schemas_of_finished_runs(&admin).await;
        }
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(&admin)
            .await
            .expect("create the test schema");
        admin.close().await;
        Store::connect_postgres_with(opts.options([("search_path", schema.as_str())]))
            .await
            .expect("open the PostgreSQL test store")
    }

    /// Drops the schemas that earlier test runs (processes no longer running) left: a run keeps
    /// its own to the end, and hundreds of left tables would keep autovacuum busy.
    async fn drop_schemas_of_finished_runs(admin: &PgPool) {
        let schemas: Vec<(String,)> = sqlx::query_as(
            "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'ceems\\_test\\_%'",
        )
        .fetch_all(admin)
        .await
        .expect("list the test schemas");
        for (schema,) in schemas {
            let pid = schema.split('_').nth(2).and_then(|p| p.parse::<u32>().ok());
            let running = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
            if pid.is_some() && !running {
                sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                    .execute(admin)
                    .await
                    .expect("drop a finished run's test schema");
            }
        }
    }
}

/// Name of a backup taken at `now`; they sort by time.
pub fn backup_name(now: i64) -> String {
    format!("ceems-{now:012}.db")
}

/// Deletes all but the newest `keep` backups in `dir`. Returns the deleted paths.
pub fn prune_backups(dir: &Path, keep: usize) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut found: Vec<std::path::PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("ceems-") && n.ends_with(".db"))
        })
        .collect();
    found.sort();
    let excess = found.len().saturating_sub(keep);
    let old: Vec<_> = found.drain(..excess).collect();
    for p in &old {
        std::fs::remove_file(p)?;
    }
    Ok(old)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::slurm::sacct;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_openers_of_a_new_database_migrate_it_once() {
        let tmp = tempfile::tempdir().unwrap();
        for round in 0..8 {
            let path = tmp.path().join(format!("{round}.db"));
            let (a, b, c) =
                tokio::join!(Store::open(&path), Store::open(&path), Store::open(&path));
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
        assert_eq!(store.refresh_findings("lab", &t, 2).await.unwrap(), 12_001);
        assert_eq!(
            store.refresh_findings("lab", &t, 3).await.unwrap(),
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
        assert_eq!(store.refresh_findings("lab", &t, 5).await.unwrap(), 1);
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
}
