//! Queries and write transactions on either backend, the generation that tells a cached answer
//! is stale, and the leases that let one of several servers do a task.

use std::sync::Arc;

use sqlx::postgres::Postgres;

use super::{Pool, Store, StoreError, Tx};
use crate::store::sql::{bind_args, Arg, DbRow, Sql};

impl Store {
    /// A write transaction. On SQLite it takes the write lock at once: a deferred one that
    /// read first fails with "database is locked" when another writer (the digests, say)
    /// committed meanwhile, instead of waiting its turn.
    pub async fn write_tx(&self) -> Result<Tx, StoreError> {
        Ok(match &self.pool {
            Pool::Sqlite(p) => Tx::Sqlite(
                self.sqlite_writer
                    .as_ref()
                    .unwrap_or(p)
                    .begin_with("BEGIN IMMEDIATE")
                    .await?,
            ),
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

    /// Hands each row of `q` to `each` as it comes and keeps none: an answer over every job
    /// is never in memory whole (sqlx copies each value of a row it hands over).
    pub async fn for_each_row(
        &self,
        q: &Sql,
        mut each: impl FnMut(DbRow) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        use futures_util::TryStreamExt as _;
        match &self.pool {
            Pool::Sqlite(p) => {
                let text = q.sqlite_text();
                let mut rows = bind_args!(sqlx::query(&text), &q.args).fetch(p);
                while let Some(row) = rows.try_next().await? {
                    each(DbRow::Sqlite(row))?;
                }
            }
            Pool::Postgres(p) => {
                let mut rows = bind_args!(sqlx::query(q.text()), &q.args).fetch(p);
                while let Some(row) = rows.try_next().await? {
                    each(DbRow::Postgres(row))?;
                }
            }
        }
        Ok(())
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

    pub async fn fetch_all(&mut self, q: &Sql) -> Result<Vec<DbRow>, sqlx::Error> {
        Ok(match self {
            Tx::Sqlite(t) => {
                let text = q.sqlite_text();
                bind_args!(sqlx::query(&text), &q.args)
                    .fetch_all(&mut **t)
                    .await?
                    .into_iter()
                    .map(DbRow::Sqlite)
                    .collect()
            }
            Tx::Postgres(t) => bind_args!(sqlx::query(q.text()), &q.args)
                .fetch_all(&mut **t)
                .await?
                .into_iter()
                .map(DbRow::Postgres)
                .collect(),
        })
    }

    /// [`Store::for_each_row`] inside this transaction.
    pub async fn for_each_row(
        &mut self,
        q: &Sql,
        mut each: impl FnMut(DbRow) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        use futures_util::TryStreamExt as _;
        match self {
            Tx::Sqlite(t) => {
                let text = q.sqlite_text();
                let mut rows = bind_args!(sqlx::query(&text), &q.args).fetch(&mut **t);
                while let Some(row) = rows.try_next().await? {
                    each(DbRow::Sqlite(row))?;
                }
            }
            Tx::Postgres(t) => {
                let mut rows = bind_args!(sqlx::query(q.text()), &q.args).fetch(&mut **t);
                while let Some(row) = rows.try_next().await? {
                    each(DbRow::Postgres(row))?;
                }
            }
        }
        Ok(())
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
