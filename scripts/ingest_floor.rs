//! The floor of the stats-server's ingestion for `scripts/bench-stats-server.sh`: the jobs of
//! a sacct answer (parsed and judged first, untimed: the findings the server writes with a new
//! row, by the default thresholds) inserted into an empty database with the server's schema
//! and indexes (its migrations), in transactions of the server's batch size, by the server's
//! own INSERTs without their upsert (no pending rows, no parsing, no ordering): on
//! SQLite with the writer's settings (WAL, synchronous NORMAL, its page cache, its
//! checkpoints), 500 rows per statement; on PostgreSQL one statement of unnested column arrays
//! per transaction, on one connection. Prints the rows per second.
//!
//!     cargo run --release --example ingest-floor -- SACCT_TEXT (DB_FILE | postgres://…)

use std::time::Instant;

use ceems::manager::UnitRecord;
use ceems::store::db::{
    findings_of_new_jobs, postgres_insert, sqlite_insert, Store, ROWS_PER_STATEMENT,
};
use ceems::store::findings::Thresholds;
use ceems::store::ingest::BATCH_ROWS;
use ceems::store::rules::SiteRules;

const CLUSTER: &str = "floor";
const MANAGER: &str = "slurm";

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
    let refs: Vec<&UnitRecord> = jobs.iter().collect();
    let mut findings = findings_of_new_jobs(
        &refs,
        MANAGER,
        &Thresholds::default(),
        &SiteRules::default(),
    );
    drop(refs);
    let started = Instant::now();
    if ceems::store::db::is_postgres_url(db) {
        // The schema, then a connection of our own.
        drop(Store::connect_postgres(db).await?);
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(db)
            .await?;
        let started = Instant::now();
        for (batch, found) in jobs.chunks(BATCH_ROWS).zip(findings.chunks_mut(BATCH_ROWS)) {
            insert_postgres(&pool, batch, found, now).await?;
        }
        report(jobs.len(), started);
    } else {
        drop(Store::open(std::path::Path::new(db)).await?);
        let path = std::path::Path::new(db);
        let opts = ceems::store::db::sqlite_writer_options(
            ceems::store::db::sqlite_options(path)?,
            ceems::store::db::DEFAULT_PAGE_CACHE_BYTES,
        );
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(opts)
            .await?;
        let started = Instant::now();
        for (batch, found) in jobs.chunks(BATCH_ROWS).zip(findings.chunks_mut(BATCH_ROWS)) {
            insert_sqlite(&pool, batch, found, now).await?;
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
    findings: &mut [Option<String>],
    now: i64,
) -> anyhow::Result<()> {
    let jobs: Vec<&UnitRecord> = batch.iter().collect();
    let mut tx = pool.begin().await?;
    for (chunk, found) in jobs
        .chunks(ROWS_PER_STATEMENT)
        .zip(findings.chunks_mut(ROWS_PER_STATEMENT))
    {
        sqlite_insert(CLUSTER, MANAGER, chunk, taken(found), now)
            .build()
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

async fn insert_postgres(
    pool: &sqlx::PgPool,
    batch: &[UnitRecord],
    findings: &mut [Option<String>],
    now: i64,
) -> anyhow::Result<()> {
    let jobs: Vec<&UnitRecord> = batch.iter().collect();
    let mut tx = pool.begin().await?;
    postgres_insert(&mut tx, CLUSTER, MANAGER, &jobs, taken(findings), now).await?;
    tx.commit().await?;
    Ok(())
}

/// The findings judged beforehand, moved out (not copied) for the statement that binds them.
fn taken(findings: &mut [Option<String>]) -> Vec<Option<String>> {
    findings.iter_mut().map(Option::take).collect()
}
