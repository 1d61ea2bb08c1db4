//! Opening the database: a SQLite file (WAL, migrated under a lock) or a PostgreSQL pool.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::ConnectOptions as _;

use super::{Pool, Schema, Store, StoreError};

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

/// sqlx logs a slow statement with its whole text: a batch insert's thousands of placeholders
/// would flood an operator's journal at `warn`, and the update's own logs say how long it took.
const SLOW_STATEMENT_LOG: log::LevelFilter = log::LevelFilter::Debug;
const SLOW_STATEMENT: Duration = Duration::from_secs(1);

/// SQLite's page caches, every connection's together, unless the server is told otherwise.
pub const DEFAULT_PAGE_CACHE_BYTES: u64 = 32 << 20;
/// Connections that read beside the writer.
const SQLITE_READERS: u32 = 8;

/// `PRAGMA cache_size` for `bytes` (negative: KiB), at least SQLite's floor of a few pages.
fn cache_size_pragma(bytes: u64) -> String {
    format!("-{}", (bytes / 1024).max(64))
}

/// The settings of every connection to the SQLite file at `path`.
pub fn sqlite_options(path: &Path) -> Result<SqliteConnectOptions, sqlx::Error> {
    Ok(
        SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // In WAL mode NORMAL loses no committed transaction when the process dies; only a
            // power loss can take the last ones.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            // Fewer, larger checkpoints during a big ingestion (160 MB of WAL instead of 4):
            // each copies pages back on the writer's thread (1M jobs: 95k -> 103k rows/s).
            .pragma("wal_autocheckpoint", "40000")
            // The WAL file shrinks back after a checkpoint has emptied it.
            .pragma("journal_size_limit", "67108864")
            .foreign_keys(true)
            .log_slow_statements(SLOW_STATEMENT_LOG, SLOW_STATEMENT),
    )
}

/// `options` (see [`sqlite_options`]) as the writer's, with its half of SQLite's
/// `page_cache_bytes`; the ingestion's floor (`scripts/ingest_floor.rs`) writes with them.
pub fn sqlite_writer_options(
    options: SqliteConnectOptions,
    page_cache_bytes: u64,
) -> SqliteConnectOptions {
    options.pragma("cache_size", cache_size_pragma(page_cache_bytes / 2))
}

impl Store {
    /// Opens (creating) the database at `path` and brings its schema up to date.
    pub async fn open(path: &Path) -> Result<Store, StoreError> {
        Store::open_with_page_cache(path, DEFAULT_PAGE_CACHE_BYTES).await
    }

    /// As [`Store::open`], SQLite's page caches holding at most `page_cache_bytes` in all:
    /// half for the writer (a large batch's index pages; its sorts spill to disk past it),
    /// the rest shared by the readers (the kernel caches the file too).
    pub async fn open_with_page_cache(
        path: &Path,
        page_cache_bytes: u64,
    ) -> Result<Store, StoreError> {
        let open_err = |error| StoreError::Open {
            path: path.display().to_string(),
            error,
        };
        let opts = sqlite_options(path).map_err(open_err)?;
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
        // WAL lets readers run beside the writer. Each connection has its own page cache.
        let reader_cache = (page_cache_bytes - page_cache_bytes / 2) / u64::from(SQLITE_READERS);
        let pool = SqlitePoolOptions::new()
            .max_connections(SQLITE_READERS)
            .connect_with(
                opts.clone()
                    .pragma("cache_size", cache_size_pragma(reader_cache)),
            )
            .await
            .map_err(open_err)?;
        // One writer, as SQLite allows: a transaction waits here for the previous one.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(sqlite_writer_options(opts, page_cache_bytes))
            .await
            .map_err(open_err)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        super::ceems_import::set_aside(&pool, path, now).await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        let imported = super::ceems_import::copy_rows(&pool).await?;
        let store = Store {
            pool: Pool::Sqlite(pool),
            sqlite_writer: Some(writer),
            generation: Default::default(),
            generation_reads: Default::default(),
            changes: Default::default(),
            insert_judge: Default::default(),
            schema: Schema::Ours,
        };
        // A CEEMS database's usage, in our terms, before anyone asks.
        for cluster in &imported {
            store.rebuild_usage(cluster, now).await?;
        }
        drop(lock);
        Ok(store)
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

    pub(super) async fn connect_postgres_with(opts: PgConnectOptions) -> Result<Store, StoreError> {
        let open_err = |error| StoreError::Open {
            path: describe_postgres(&opts),
            error,
        };
        let pool = pg_pool(opts.clone().application_name("ceems-stats-server"))
            .await
            .map_err(open_err)?;
        sqlx::migrate!("./migrations/postgres").run(&pool).await?;
        Ok(Store {
            pool: Pool::Postgres(pool),
            sqlite_writer: None,
            generation: Default::default(),
            generation_reads: Default::default(),
            changes: Default::default(),
            insert_judge: Default::default(),
            schema: Schema::Ours,
        })
    }

    /// Opens the stats-server's database, SQLite or PostgreSQL as `url` says, for reading
    /// only: no file is created, no migration run, and PostgreSQL sessions are read-only. Fails
    /// when the database has no jobs table yet. A CEEMS API server's own SQLite file is read
    /// as it is (its schema's ownership and admins).
    pub async fn open_read_only(url: &str) -> Result<Store, StoreError> {
        let store = if is_postgres_url(url) {
            let open_err = |error| StoreError::Open {
                path: describe_postgres_url(url),
                error,
            };
            let opts = PgConnectOptions::from_str(url)
                .map_err(open_err)?
                .application_name("ceems-lb")
                .options([("default_transaction_read_only", "on")]);
            let pool = pg_pool(opts).await.map_err(open_err)?;
            Store {
                pool: Pool::Postgres(pool),
                sqlite_writer: None,
                generation: Default::default(),
                generation_reads: Default::default(),
                changes: Default::default(),
                insert_judge: Default::default(),
                schema: Schema::Ours,
            }
        } else {
            let path = url.strip_prefix("sqlite://").unwrap_or(url);
            let open_err = |error| StoreError::Open {
                path: path.to_owned(),
                error,
            };
            let opts = SqliteConnectOptions::from_str(&format!("sqlite://{path}"))
                .map_err(open_err)?
                .read_only(true)
                .busy_timeout(Duration::from_secs(10))
                .log_slow_statements(SLOW_STATEMENT_LOG, SLOW_STATEMENT);
            let pool = SqlitePoolOptions::new()
                .max_connections(8)
                .connect_with(opts)
                .await
                .map_err(open_err)?;
            Store {
                pool: Pool::Sqlite(pool),
                sqlite_writer: None,
                generation: Default::default(),
                generation_reads: Default::default(),
                changes: Default::default(),
                insert_judge: Default::default(),
                schema: Schema::Ours,
            }
        };
        let mut store = store;
        store
            .fetch_optional(&crate::store::sql::Sql::new("SELECT 1 FROM units LIMIT 1"))
            .await?;
        // CEEMS's own ceems.db, as its ceems_lb reads it: its users are `username`.
        if let Pool::Sqlite(pool) = &store.pool {
            let ceems: Option<(String,)> = sqlx::query_as(
                "SELECT name FROM pragma_table_info('units') WHERE name = 'username'",
            )
            .fetch_optional(pool)
            .await?;
            if ceems.is_some() {
                store.schema = Schema::Ceems;
            }
        }
        Ok(store)
    }

    /// Opens a SQLite file (its page caches holding at most `page_cache_bytes`) or connects
    /// to PostgreSQL (whose memory is its server's), as `url` says.
    pub async fn open_url(url: &str, page_cache_bytes: u64) -> Result<Store, StoreError> {
        if is_postgres_url(url) {
            Store::connect_postgres(url).await
        } else {
            let path = url.strip_prefix("sqlite://").unwrap_or(url);
            Store::open_with_page_cache(Path::new(path), page_cache_bytes).await
        }
    }
}

/// A pool of PostgreSQL connections with the server's settings.
async fn pg_pool(opts: PgConnectOptions) -> Result<sqlx::PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(16)
        // A database that is down fails a request in seconds instead of holding it.
        .acquire_timeout(Duration::from_secs(5))
        // sqlx already pings a connection when it comes back to the pool, which finds a
        // broken one; pinging it again before handing it out cost each request a round trip.
        .test_before_acquire(false)
        .connect_with(opts.log_slow_statements(SLOW_STATEMENT_LOG, SLOW_STATEMENT))
        .await
}
