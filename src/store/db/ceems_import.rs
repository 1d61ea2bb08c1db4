//! A CEEMS API server's SQLite database (`ceems.db`) opened in place: its history is kept and
//! served. Before anything is changed the file is copied (`VACUUM INTO`); CEEMS's tables are
//! then renamed `ceems_<table>` (nothing is dropped), our schema is made beside them, and
//! their rows are copied into ours in one transaction, once.

use std::path::Path;

use sqlx::sqlite::SqlitePool;

use super::StoreError;

/// CEEMS's tables, renamed `ceems_<name>` when set aside.
const CEEMS_TABLES: &[&str] = &[
    "units",
    "usage",
    "daily_usage",
    "users",
    "projects",
    "admin_users",
];

async fn has_table(pool: &SqlitePool, name: &str) -> Result<bool, sqlx::Error> {
    let row: Option<(String,)> =
        sqlx::query_as("SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?")
            .bind(name)
            .fetch_optional(pool)
            .await?;
    Ok(row.is_some())
}

async fn has_column(pool: &SqlitePool, table: &str, column: &str) -> Result<bool, sqlx::Error> {
    let row: Option<(String,)> =
        sqlx::query_as("SELECT name FROM pragma_table_info(?) WHERE name = ?")
            .bind(table)
            .bind(column)
            .fetch_optional(pool)
            .await?;
    Ok(row.is_some())
}

/// Whether `units` is CEEMS's (its users are `username`; ours are `usr`).
async fn units_are_ceems(pool: &SqlitePool) -> Result<bool, sqlx::Error> {
    let row: Option<(String,)> =
        sqlx::query_as("SELECT name FROM pragma_table_info('units') WHERE name = 'username'")
            .fetch_optional(pool)
            .await?;
    Ok(row.is_some())
}

/// Before our migrations: when the database is CEEMS's, copies the file to
/// `<path>.ceems-<unix time>.bak` and renames CEEMS's tables out of our way. Returns the copy.
pub(super) async fn set_aside(
    pool: &SqlitePool,
    path: &Path,
    now: i64,
) -> Result<Option<std::path::PathBuf>, StoreError> {
    if has_table(pool, "_sqlx_migrations").await? || !units_are_ceems(pool).await? {
        return Ok(None);
    }
    let backup = path.with_extension(format!("db.ceems-{now}.bak"));
    sqlx::query("VACUUM INTO ?")
        .bind(backup.display().to_string())
        .execute(pool)
        .await?;
    let mut tx = pool.begin().await?;
    for table in CEEMS_TABLES {
        if has_table(pool, table).await? {
            sqlx::query(&format!("ALTER TABLE {table} RENAME TO ceems_{table}"))
                .execute(&mut *tx)
                .await?;
        }
    }
    tx.commit().await?;
    tracing::info!(backup = %backup.display(), "a CEEMS database: copied, its tables kept as ceems_*, its rows copied into ours");
    Ok(Some(backup))
}

/// After our migrations: copies CEEMS's rows into our tables, once (a crash before the commit
/// copies them at the next start). Returns the clusters whose usage is to be rebuilt.
pub(super) async fn copy_rows(pool: &SqlitePool) -> Result<Vec<String>, StoreError> {
    if !has_table(pool, "ceems_units").await? {
        return Ok(Vec::new());
    }
    let mut tx = pool.begin().await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS ceems_import (id INTEGER PRIMARY KEY CHECK (id = 1), copied_at INTEGER NOT NULL)")
        .execute(&mut *tx)
        .await?;
    let done: Option<(i64,)> = sqlx::query_as("SELECT copied_at FROM ceems_import")
        .fetch_optional(&mut *tx)
        .await?;
    if done.is_some() {
        return Ok(Vec::new());
    }
    for (table, statement) in COPY {
        // Older CEEMS databases lack some of the tables.
        if has_table(pool, table).await? {
            sqlx::query(statement).execute(&mut *tx).await?;
        }
    }
    // CEEMS v0.15's custom stats (its migration 000010), where the database has them.
    if has_column(pool, "ceems_units", "total_custom_stats").await? {
        sqlx::query(COPY_CUSTOM_STATS).execute(&mut *tx).await?;
    }
    sqlx::query("INSERT INTO ceems_import (id, copied_at) VALUES (1, CAST(strftime('%s', 'now') AS INTEGER))")
        .execute(&mut *tx)
        .await?;
    let clusters: Vec<(String,)> = sqlx::query_as("SELECT id FROM clusters ORDER BY id")
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(clusters.into_iter().map(|(c,)| c).collect())
}

/// CEEMS's custom stats of each job into its series object, beside the other series.
const COPY_CUSTOM_STATS: &str = "UPDATE units SET series = json_set(series,
        '$.total_custom_stats', json(coalesce(c.total_custom_stats, '{}')),
        '$.avg_custom_stats', json(coalesce(c.avg_custom_stats, '{}')),
        '$.min_custom_stats', json(coalesce(c.min_custom_stats, '{}')),
        '$.max_custom_stats', json(coalesce(c.max_custom_stats, '{}')))
     FROM ceems_units c
     WHERE c.cluster_id = units.cluster_id AND c.uuid = units.uuid
       AND coalesce(c.started_at_ts, 0) / 1000 = units.started_at";

/// CEEMS's rows in our tables: times from milliseconds, the allocation and tags from their
/// JSON, the series objects as they are, sacct's words kept for CEEMS's answers.
const COPY: &[(&str, &str)] = &[
    ("ceems_units", "INSERT OR IGNORE INTO clusters (id, manager)
     SELECT DISTINCT cluster_id, coalesce(NULLIF(resource_manager, ''), 'slurm') FROM ceems_units
     WHERE cluster_id IS NOT NULL"),
    ("ceems_units", "INSERT OR IGNORE INTO units (cluster_id, uuid, started_at, name, project, grp, gid, usr, uid,
        partition, qos, submitted_at, ended_at, elapsed_seconds, state, exit_code, alloc_cpus,
        alloc_mem_bytes, alloc_gpus, billing, nodes, workdir, last_updated_at, aggregated_seconds,
        aggregates_until, aggregates_updated_at, aggregates_status, series, reported,
        resource_manager)
     SELECT cluster_id, uuid, coalesce(started_at_ts, 0) / 1000, coalesce(name, ''),
        coalesce(project, ''), coalesce(groupname, ''), json_extract(tags, '$.gid'),
        coalesce(username, ''), json_extract(tags, '$.uid'),
        coalesce(json_extract(tags, '$.partition'), ''), coalesce(json_extract(tags, '$.qos'), ''),
        NULLIF(created_at_ts, 0) / 1000, NULLIF(ended_at_ts, 0) / 1000,
        coalesce(json_extract(total_time_seconds, '$.walltime'), 0),
        CASE WHEN instr(coalesce(state, ''), ' ') > 0 THEN substr(state, 1, instr(state, ' ') - 1)
             ELSE coalesce(state, '') END,
        coalesce(json_extract(tags, '$.exit_code'), ''),
        coalesce(json_extract(allocation, '$.cpus'), json_extract(allocation, '$.vcpus'), 0),
        coalesce(json_extract(allocation, '$.mem'), 0), coalesce(json_extract(allocation, '$.gpus'), 0),
        coalesce(json_extract(allocation, '$.billing'), 0),
        replace(coalesce(json_extract(tags, '$.nodelistexp'), ''), '|', ','),
        coalesce(json_extract(tags, '$.workdir'), ''),
        coalesce(CAST(strftime('%s', last_updated_at) AS INTEGER), 0),
        coalesce(json_extract(total_time_seconds, '$.walltime'), 0),
        coalesce(NULLIF(ended_at_ts, 0) / 1000, CAST(strftime('%s', last_updated_at) AS INTEGER)),
        CAST(strftime('%s', last_updated_at) AS INTEGER),
        CASE WHEN coalesce(ended_at_ts, 0) > 0 THEN 'done' ELSE 'partial' END,
        json_object('avg_cpu_usage', json(coalesce(avg_cpu_usage, '{}')),
            'avg_cpu_mem_usage', json(coalesce(avg_cpu_mem_usage, '{}')),
            'total_cpu_energy_usage_kwh', json(coalesce(total_cpu_energy_usage_kwh, '{}')),
            'total_cpu_emissions_gms', json(coalesce(total_cpu_emissions_gms, '{}')),
            'avg_gpu_usage', json(coalesce(avg_gpu_usage, '{}')),
            'avg_gpu_mem_usage', json(coalesce(avg_gpu_mem_usage, '{}')),
            'total_gpu_energy_usage_kwh', json(coalesce(total_gpu_energy_usage_kwh, '{}')),
            'total_gpu_emissions_gms', json(coalesce(total_gpu_emissions_gms, '{}')),
            'total_io_write_stats', json(coalesce(total_io_write_stats, '{}')),
            'total_io_read_stats', json(coalesce(total_io_read_stats, '{}')),
            'total_ingress_stats', json(coalesce(total_ingress_stats, '{}')),
            'total_egress_stats', json(coalesce(total_egress_stats, '{}'))),
        json_object('state', coalesce(state, ''), 'elapsed', coalesce(elapsed, ''),
            'nodelist', coalesce(json_extract(tags, '$.nodelist'), ''),
            'nodes', coalesce(json_extract(allocation, '$.nodes'), 0)),
        coalesce(NULLIF(resource_manager, ''), 'slurm')
     FROM ceems_units WHERE cluster_id IS NOT NULL AND uuid IS NOT NULL"),
    // Where the next pull starts: where CEEMS's last one ended.
    ("ceems_units", "INSERT OR IGNORE INTO ingest_state (cluster_id, window_start)
     SELECT cluster_id, max(last_updated_at) FROM units GROUP BY cluster_id"),
    ("ceems_users", "INSERT OR IGNORE INTO users (cluster_id, name, uid, last_updated_at)
     SELECT cluster_id, name, coalesce(uid, ''), coalesce(CAST(strftime('%s', last_updated_at) AS INTEGER), 0)
     FROM ceems_users WHERE cluster_id IS NOT NULL AND name IS NOT NULL"),
    ("ceems_projects", "INSERT OR IGNORE INTO projects (cluster_id, name, uid, last_updated_at)
     SELECT cluster_id, name, coalesce(uid, ''), coalesce(CAST(strftime('%s', last_updated_at) AS INTEGER), 0)
     FROM ceems_projects WHERE cluster_id IS NOT NULL AND name IS NOT NULL"),
    ("ceems_users", "INSERT OR IGNORE INTO associations (cluster_id, usr, project)
     SELECT u.cluster_id, u.name, p.value FROM ceems_users u, json_each(coalesce(u.projects, '[]')) p
     WHERE u.cluster_id IS NOT NULL AND u.name IS NOT NULL AND json_valid(coalesce(u.projects, '[]'))"),
    ("ceems_users", "UPDATE projects SET users = coalesce((SELECT json_group_array(usr) FROM
        (SELECT a.usr FROM associations a WHERE a.cluster_id = projects.cluster_id
         AND a.project = projects.name ORDER BY a.usr)), '[]')"),
];
