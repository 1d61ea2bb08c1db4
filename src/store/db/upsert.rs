//! Writing a cluster's units: batches upserted on (cluster, job id, start time), on SQLite as
//! rows of placeholders and on PostgreSQL as unnested column arrays, and the ingestion window.

use sqlx::postgres::Postgres;
use sqlx::sqlite::Sqlite;

use super::{Store, StoreError, Tx};
use crate::manager::UnitRecord;
use crate::store::sql::Sql;

impl Store {
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
        upsert(self, &mut tx, cluster, jobs, now, unseen_after).await?;
        tx.commit().await?;
        self.written();
        Ok(jobs.len())
    }

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
        upsert(self, &mut tx, cluster, jobs, now, None).await?;
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
}

/// Rows per INSERT: 28 parameters each stays far below SQLite's limit of 32766.
pub const ROWS_PER_STATEMENT: usize = 500;

const UNIT_COLUMNS: &str = "cluster_id, uuid, started_at, name, project, grp, gid, usr, uid,
    partition, qos, submitted_at, ended_at, elapsed_seconds, state, exit_code, alloc_cpus,
    alloc_mem_bytes, alloc_gpus, billing, nodes, workdir, time_limit_seconds, last_updated_at,
    reported, resource_manager, findings, findings_updated_at";

/// A job already stored keeps its findings: the pass judges it again, with its aggregates,
/// since its row changed after them.
const UPSERT_SET: &str = "ON CONFLICT (cluster_id, uuid, started_at) DO UPDATE SET
    name = excluded.name, project = excluded.project, grp = excluded.grp, gid = excluded.gid,
    usr = excluded.usr, uid = excluded.uid, partition = excluded.partition, qos = excluded.qos,
    submitted_at = excluded.submitted_at, ended_at = excluded.ended_at,
    elapsed_seconds = excluded.elapsed_seconds, state = excluded.state,
    exit_code = excluded.exit_code, alloc_cpus = excluded.alloc_cpus,
    alloc_mem_bytes = excluded.alloc_mem_bytes, alloc_gpus = excluded.alloc_gpus,
    billing = excluded.billing, nodes = excluded.nodes, workdir = excluded.workdir,
    time_limit_seconds = excluded.time_limit_seconds, last_updated_at = excluded.last_updated_at,
    reported = excluded.reported";

/// One cluster's jobs to write, and what every row of them shares.
#[derive(Clone, Copy)]
struct Batch<'a> {
    cluster: &'a str,
    manager: &'a str,
    jobs: &'a [&'a UnitRecord],
    pending: bool,
    now: i64,
}

async fn upsert(
    store: &Store,
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
    // Written on each row for CEEMS's load balancer, which reads it there.
    let manager: String = match tx
        .fetch_optional(&Sql::new("SELECT manager FROM clusters WHERE id = $1").arg(cluster))
        .await?
    {
        Some(row) => row.get(0)?,
        None => String::new(),
    };
    let batch = Batch {
        cluster,
        manager: &manager,
        jobs: &latest,
        pending,
        now,
    };
    match tx {
        Tx::Sqlite(t) => upsert_sqlite(store, t, &batch).await,
        Tx::Postgres(t) => upsert_postgres(store, t, &batch, unseen_after).await,
    }
}

/// A plain INSERT of `chunk` (at most [`ROWS_PER_STATEMENT`] jobs) on SQLite, as the upsert
/// writes them, with each job's findings at insert ([`findings_of_new_jobs`]; none: empty);
/// the ingestion's floor (`scripts/ingest_floor.rs`) runs it alone.
///
/// [`findings_of_new_jobs`]: super::findings_of_new_jobs
pub fn sqlite_insert<'a>(
    cluster: &'a str,
    manager: &'a str,
    chunk: &'a [&'a UnitRecord],
    findings: Vec<Option<String>>,
    now: i64,
) -> sqlx::QueryBuilder<'a, Sqlite> {
    let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let mut q = sqlx::QueryBuilder::<Sqlite>::new("INSERT INTO units (");
    q.push(UNIT_COLUMNS).push(") ");
    let judged = findings.into_iter().chain(std::iter::repeat(None));
    q.push_values(chunk.iter().copied().zip(judged), |mut row, (j, found)| {
        let judged_at = found.is_some().then_some(now);
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
            .push_bind(now)
            .push_bind(j.reported.to_json())
            .push_bind(manager)
            .push_bind(found)
            .push_bind(judged_at);
    });
    q
}

/// SQLite's upsert: rows of 26 placeholders, ROWS_PER_STATEMENT at a time. Built with sqlx's
/// own builder, which binds the jobs' strings without copying them; each statement is built
/// while SQLite's thread runs the one before, instead of that thread waiting for it.
async fn upsert_sqlite(
    store: &Store,
    tx: &mut sqlx::Transaction<'static, Sqlite>,
    batch: &Batch<'_>,
) -> Result<(), StoreError> {
    let Batch {
        cluster,
        manager,
        jobs,
        pending,
        now,
    } = *batch;
    let mut chunks = jobs.chunks(ROWS_PER_STATEMENT);
    let insert = |chunk| {
        let findings = store.findings_at_insert(chunk, manager);
        let mut q = sqlite_insert(cluster, manager, chunk, findings, now);
        q.push(" ").push(UPSERT_SET);
        q
    };
    let mut next = chunks.next().map(|c| (c, insert(c)));
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
            chunks.next().map(|c| (c, insert(c)))
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
    store: &Store,
    tx: &mut sqlx::Transaction<'static, Postgres>,
    batch: &Batch<'_>,
    unseen_after: Option<i64>,
) -> Result<(), StoreError> {
    use sqlx::Connection as _;
    let Batch {
        cluster,
        manager,
        jobs,
        pending,
        now,
    } = *batch;
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
    let columns = UnitColumns::new(jobs, store.findings_at_insert(jobs, manager), now);
    let insert = postgres_insert_sql();
    let unseen = |j: &&UnitRecord| match (j.start, unseen_after) {
        (Some(start), Some(after)) => start != 0 && start > after,
        _ => false,
    };
    if jobs.iter().all(unseen) {
        let mut attempt = (**tx).begin().await?;
        match columns
            .bind(sqlx::query(&insert), cluster, manager, now)
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
        .bind(sqlx::query(&upsert), cluster, manager, now)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// PostgreSQL's plain INSERT of a batch's column arrays ([`UnitColumns::bind`] binds them).
fn postgres_insert_sql() -> String {
    format!(
        "INSERT INTO units ({UNIT_COLUMNS})
         SELECT $1, unnest($2::text[]), unnest($3::bigint[]), unnest($4::text[]),
            unnest($5::text[]), unnest($6::text[]), unnest($7::bigint[]), unnest($8::text[]),
            unnest($9::bigint[]), unnest($10::text[]), unnest($11::text[]),
            unnest($12::bigint[]), unnest($13::bigint[]), unnest($14::bigint[]),
            unnest($15::text[]), unnest($16::text[]), unnest($17::bigint[]),
            unnest($18::bigint[]), unnest($19::bigint[]), unnest($20::bigint[]),
            unnest($21::text[]), unnest($22::text[]), unnest($23::bigint[]), $24,
            unnest($25::text[]), $26, unnest($27::text[]), unnest($28::bigint[])"
    )
}

/// A plain INSERT of `jobs` on PostgreSQL, as the upsert writes them, with their findings at
/// insert (none: empty); the ingestion's floor (`scripts/ingest_floor.rs`) runs it alone.
pub async fn postgres_insert(
    tx: &mut sqlx::Transaction<'static, Postgres>,
    cluster: &str,
    manager: &str,
    jobs: &[&UnitRecord],
    findings: Vec<Option<String>>,
    now: i64,
) -> Result<(), StoreError> {
    let insert = postgres_insert_sql();
    UnitColumns::new(jobs, findings, now)
        .bind(sqlx::query(&insert), cluster, manager, now)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A batch's jobs as PostgreSQL's upsert binds them: one array per column, in UNIT_COLUMNS'
/// order after the cluster.
struct UnitColumns<'a> {
    texts: [Vec<&'a str>; 10],
    nodes: Vec<String>,
    reported: Vec<String>,
    counts: [Vec<i64>; 5],
    optional: [Vec<Option<i64>>; 5],
    started_at: Vec<i64>,
    /// Each job's findings at insert, and when they were made (NULL: the pass judges it).
    findings: Vec<Option<String>>,
    judged_at: Vec<Option<i64>>,
}

impl<'a> UnitColumns<'a> {
    fn new(
        jobs: &[&'a UnitRecord],
        mut findings: Vec<Option<String>>,
        now: i64,
    ) -> UnitColumns<'a> {
        findings.resize(jobs.len(), None);
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
            reported: jobs.iter().map(|j| j.reported.to_json()).collect(),
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
            judged_at: findings
                .iter()
                .map(|f| f.is_some().then_some(now))
                .collect(),
            findings,
        }
    }

    fn bind<'q>(
        &'q self,
        query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
        cluster: &'q str,
        manager: &'q str,
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
            .bind(&self.reported)
            .bind(manager)
            .bind(&self.findings)
            .bind(&self.judged_at)
    }
}
