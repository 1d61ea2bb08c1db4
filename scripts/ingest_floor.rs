//! The floor of the stats-server's ingestion for `scripts/bench-stats-server.sh`: the jobs of
//! a sacct answer (parsed first, untimed) inserted into an empty database with the server's
//! schema and indexes (its migrations), in transactions of the server's batch size, by plain
//! INSERTs through sqlx: no upsert, no pending rows, no parsing, no ordering. On SQLite with the
//! writer's settings (WAL, synchronous NORMAL, its page cache, its checkpoints), 500 rows per
//! statement; on PostgreSQL one statement of unnested column arrays per transaction, on one
//! connection. Prints the rows per second.
//!
//!     cargo run --release --example ingest-floor -- SACCT_TEXT (DB_FILE | postgres://…)

use std::str::FromStr as _;
use std::time::Instant;

use ceems::manager::UnitRecord;
use ceems::store::db::Store;
use ceems::store::ingest::BATCH_ROWS;

/// The columns every stored job has; the rest keep their defaults.
const COLUMNS: &str = "cluster_id, uuid, started_at, name, project, grp, gid, usr, uid,
    partition, qos, submitted_at, ended_at, elapsed_seconds, state, exit_code, alloc_cpus,
    alloc_mem_bytes, alloc_gpus, billing, nodes, workdir, time_limit_seconds, last_updated_at,
    reported, resource_manager";
const ROWS_PER_STATEMENT: usize = 500;
const CLUSTER: &str = "floor";

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, sacct, db] = args.as_slice() else {
        eprintln!("usage: ingest-floor SACCT_TEXT (DB_FILE | postgres://…)");
        std::process::exit(2);
    };
    let text = std::fs::read_to_string(sacct)?;
    let (jobs, errors) = ceems::manager::slurm::sacct::parse_output(&text);
    drop(text);
    anyhow::ensure!(errors.is_empty(), "{} malformed lines", errors.len());
    let now = jobs.iter().filter_map(|j| j.end).max().unwrap_or(0);
    let started = Instant::now();
    if ceems::store::db::is_postgres_url(db) {
        // The schema, then a connection of our own.
        drop(Store::connect_postgres(db).await?);
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(db)
            .await?;
        let started = Instant::now();
        for batch in jobs.chunks(BATCH_ROWS) {
            insert_postgres(&pool, batch, now).await?;
        }
        report(jobs.len(), started);
    } else {
        drop(Store::open(std::path::Path::new(db)).await?);
        let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&format!("sqlite://{db}"))?
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .synchronous(sqlx::sqlite::SqliteSynchronous::Normal)
            .pragma("wal_autocheckpoint", "40000")
            .pragma(
                "cache_size",
                format!("-{}", ceems::store::db::DEFAULT_PAGE_CACHE_BYTES / 2 / 1024),
            );
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(opts)
            .await?;
        let started = Instant::now();
        for batch in jobs.chunks(BATCH_ROWS) {
            insert_sqlite(&pool, batch, now).await?;
        }
        report(jobs.len(), started);
    }
    eprintln!(
        "(with the schema's creation: {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn report(rows: usize, started: Instant) {
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "floor: {rows} jobs in {seconds:.1} s = {:.0} rows/s",
        rows as f64 / seconds
    );
}

async fn insert_sqlite(
    pool: &sqlx::SqlitePool,
    batch: &[UnitRecord],
    now: i64,
) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    for chunk in batch.chunks(ROWS_PER_STATEMENT) {
        let mut q =
            sqlx::QueryBuilder::<sqlx::Sqlite>::new(format!("INSERT INTO units ({COLUMNS}) "));
        q.push_values(chunk, |mut row, j| {
            row.push_bind(CLUSTER)
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
                .push_bind("slurm");
        });
        q.build().execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

async fn insert_postgres(
    pool: &sqlx::PgPool,
    batch: &[UnitRecord],
    now: i64,
) -> anyhow::Result<()> {
    let text = |f: fn(&UnitRecord) -> String| batch.iter().map(f).collect::<Vec<String>>();
    let number = |f: fn(&UnitRecord) -> Option<i64>| batch.iter().map(f).collect::<Vec<_>>();
    let insert = format!(
        "INSERT INTO units ({COLUMNS})
         SELECT $1, unnest($2::text[]), unnest($3::bigint[]), unnest($4::text[]),
            unnest($5::text[]), unnest($6::text[]), unnest($7::bigint[]), unnest($8::text[]),
            unnest($9::bigint[]), unnest($10::text[]), unnest($11::text[]),
            unnest($12::bigint[]), unnest($13::bigint[]), unnest($14::bigint[]),
            unnest($15::text[]), unnest($16::text[]), unnest($17::bigint[]),
            unnest($18::bigint[]), unnest($19::bigint[]), unnest($20::bigint[]),
            unnest($21::text[]), unnest($22::text[]), unnest($23::bigint[]), $24,
            unnest($25::text[]), $26"
    );
    let mut tx = pool.begin().await?;
    sqlx::query(&insert)
        .bind(CLUSTER)
        .bind(text(|j| j.uuid.clone()))
        .bind(number(|j| Some(j.start.unwrap_or(0))))
        .bind(text(|j| j.name.clone()))
        .bind(text(|j| j.account.clone()))
        .bind(text(|j| j.group.clone()))
        .bind(number(|j| j.gid.map(i64::from)))
        .bind(text(|j| j.user.clone()))
        .bind(number(|j| j.uid.map(i64::from)))
        .bind(text(|j| j.partition.clone()))
        .bind(text(|j| j.qos.clone()))
        .bind(number(|j| j.submit))
        .bind(number(|j| j.end))
        .bind(number(|j| Some(int(j.elapsed_seconds))))
        .bind(text(|j| j.state.clone()))
        .bind(text(|j| j.exit_code.clone()))
        .bind(number(|j| Some(int(j.allocation.cpus))))
        .bind(number(|j| Some(int(j.allocation.mem_bytes))))
        .bind(number(|j| Some(int(j.allocation.gpus))))
        .bind(number(|j| Some(int(j.allocation.billing))))
        .bind(text(|j| j.nodes.join(",")))
        .bind(text(|j| j.workdir.clone()))
        .bind(number(|j| j.time_limit_seconds.map(int)))
        .bind(now)
        .bind(text(|j| j.reported.to_json()))
        .bind("slurm")
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}
