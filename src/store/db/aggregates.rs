//! Per-job aggregates from Prometheus and the usage built from them.

use super::{Pool, Store, StoreError};
use crate::store::sql::{Backend, DbRow, Sql};

/// A job whose aggregates are due: the window from `from` to `to` is not yet counted.
#[derive(Debug, Clone, Default, PartialEq)]
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
    pub gpu_memory_peak_bytes: Option<f64>,
    /// Values of CEEMS's series queries for this window: (series, sub-key, value).
    pub series: Vec<(String, String, f64)>,
    /// The [`measured`] figures Prometheus answered for this job in this window.
    pub measured: i64,
}

/// Which figures Prometheus gave a job at least once (the bits of `units.measured`): a job
/// whose nodes have no power source shows no energy rather than 0 kWh, and a job without CPU
/// series yet is not judged on its CPU use.
pub mod measured {
    pub const CPU: i64 = 1;
    pub const HOST_ENERGY: i64 = 2;
    pub const EMISSIONS: i64 = 4;
    pub const CPU_PACKAGE_ENERGY: i64 = 8;
    pub const GPU_ENERGY: i64 = 16;

    /// Whether `bits` hold `figure`.
    pub fn has(bits: i64, figure: i64) -> bool {
        bits & figure != 0
    }
}

/// CEEMS's series of several jobs (or usage rows) summed into one usage row: totals added,
/// means weighted as CEEMS weighs them (by the allocated time of what they measure, see
/// `SeriesWeights::of`), 0 when nothing weighs, `min_…` and `max_…` the least and greatest.
#[derive(Default)]
pub struct SeriesFold {
    sums: std::collections::BTreeMap<(String, String), SeriesSum>,
}

#[derive(Default)]
struct SeriesSum {
    /// Σ value, and Σ value × weight and Σ weight for means.
    plain: f64,
    weighted: f64,
    weights: f64,
    /// The least and the greatest value (`min_…` and `max_…` series).
    least: Option<f64>,
    greatest: Option<f64>,
}

/// How values of one of CEEMS's series add up, by its name: over a job's windows and over
/// the jobs of a usage group (CEEMS's custom stats: `total_`, `avg_`, `min_`, `max_`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Combine {
    Total,
    Mean,
    Least,
    Greatest,
}

impl Combine {
    fn of(series: &str) -> Combine {
        match series.split('_').next() {
            Some("avg") => Combine::Mean,
            Some("min") => Combine::Least,
            Some("max") => Combine::Greatest,
            _ => Combine::Total,
        }
    }
}

/// What a job (or a usage row) weighs in the means of a usage group: CEEMS's
/// `total_time_seconds` (wall time, and CPUs, MiB, GPUs allocated times it).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct SeriesWeights {
    pub walltime: f64,
    pub cputime: f64,
    pub cpumemtime: f64,
    pub gputime: f64,
    pub gpumemtime: f64,
}

/// The columns of `USAGE_SUMS` that make `SeriesWeights`, in its order.
pub const SERIES_WEIGHT_SUMS: [&str; 5] = [
    "wall_seconds",
    "alloc_cpu_wall_seconds",
    "alloc_mem_mib_wall_seconds",
    "alloc_gpu_wall_seconds",
    "gpu_wall_seconds",
];

impl SeriesWeights {
    /// `SERIES_WEIGHT_SUMS` as select expressions, as reals: over `units` (`per_job`) or
    /// over `usage`.
    pub fn select(per_job: bool) -> String {
        SERIES_WEIGHT_SUMS
            .iter()
            .map(|name| match per_job {
                true => USAGE_SUMS
                    .iter()
                    .find(|(column, _)| column == name)
                    .map_or("0", |(_, expr)| expr),
                false => name,
            })
            .map(|expr| format!("CAST({expr} AS DOUBLE PRECISION)"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The weights selected by `select` from column `first` on.
    pub fn read(r: &DbRow, first: usize) -> Result<SeriesWeights, sqlx::Error> {
        let at = |i: usize| {
            r.get::<Option<f64>>(first + i)
                .map(Option::unwrap_or_default)
        };
        Ok(SeriesWeights {
            walltime: at(0)?,
            cputime: at(1)?,
            cpumemtime: at(2)?,
            gputime: at(3)?,
            gpumemtime: at(4)?,
        })
    }

    /// The weight of a mean: CPU use by CPU time, memory use by memory time, GPU use by GPU
    /// time, GPU memory by GPU wall time, any other mean by wall time.
    fn of(&self, series: &str) -> f64 {
        let w = match series {
            "avg_cpu_usage" => self.cputime,
            "avg_cpu_mem_usage" => self.cpumemtime,
            "avg_gpu_usage" => self.gputime,
            "avg_gpu_mem_usage" => self.gpumemtime,
            _ => self.walltime,
        };
        w.max(0.0)
    }
}

impl SeriesFold {
    /// Adds one job's (or row's) series, `series` its JSON object.
    pub fn add(&mut self, series: &str, weights: &SeriesWeights) {
        let Ok(all) = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(series)
        else {
            return;
        };
        for (name, subs) in all {
            let Some(subs) = subs.as_object() else {
                continue;
            };
            let weight = weights.of(&name);
            for (sub, v) in subs {
                if let Some(v) = v.as_f64() {
                    let e = self.sums.entry((name.clone(), sub.clone())).or_default();
                    e.plain += v;
                    e.weighted += v * weight;
                    e.weights += weight;
                    e.least = Some(e.least.map_or(v, |l| l.min(v)));
                    e.greatest = Some(e.greatest.map_or(v, |g| g.max(v)));
                }
            }
        }
    }

    /// The sums as a JSON object of series.
    pub fn finish(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut out = serde_json::Map::new();
        for ((name, sub), e) in &self.sums {
            let v = match Combine::of(name) {
                Combine::Mean if e.weights > 0.0 => e.weighted / e.weights,
                // As CEEMS: a mean over no allocated time is 0 (a job without GPUs).
                Combine::Mean => 0.0,
                Combine::Least => e.least.unwrap_or_default(),
                Combine::Greatest => e.greatest.unwrap_or_default(),
                Combine::Total => e.plain,
            };
            let subs = out
                .entry(name.clone())
                .or_insert_with(|| serde_json::Value::Object(Default::default()));
            if let (Some(subs), Some(n)) = (subs.as_object_mut(), serde_json::Number::from_f64(v)) {
                subs.insert(sub.clone(), serde_json::Value::Number(n));
            }
        }
        out
    }
}

/// Adds one window's values of CEEMS's series to a job's: a series named `avg_…` is a mean
/// weighted by the seconds each window covered, `min_…` and `max_…` the least and greatest
/// window's, any other a total. `stored` is the job's JSON object, `seconds_before` the
/// seconds its means cover.
pub fn merge_series(
    stored: &str,
    seconds_before: i64,
    window_seconds: i64,
    values: &[(String, String, f64)],
) -> String {
    let mut all: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(stored).unwrap_or_default();
    let (before, window) = (seconds_before.max(0) as f64, window_seconds.max(0) as f64);
    for (series, sub, v) in values {
        let entry = all
            .entry(series.clone())
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
        let Some(subs) = entry.as_object_mut() else {
            continue;
        };
        let old = subs.get(sub).and_then(serde_json::Value::as_f64);
        let new = match (Combine::of(series), old) {
            (_, None) => *v,
            (Combine::Mean, Some(o)) if before + window > 0.0 => {
                (o * before + v * window) / (before + window)
            }
            (Combine::Mean, Some(_)) => *v,
            (Combine::Least, Some(o)) => o.min(*v),
            (Combine::Greatest, Some(o)) => o.max(*v),
            (Combine::Total, Some(o)) => o + v,
        };
        if let Some(n) = serde_json::Number::from_f64(new) {
            subs.insert(sub.clone(), serde_json::Value::Number(n));
        }
    }
    serde_json::Value::Object(all).to_string()
}

impl Store {
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
        // A row at a time: a backlog's 100,000 rows held whole by sqlx cost 50 MB.
        let mut targets = Vec::new();
        self.for_each_row(&q, |r| {
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
            Ok(())
        })
        .await?;
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
            // CEEMS's series, merged here: the job's stored ones, read in this transaction.
            let series = match d.series.is_empty() {
                true => None,
                false => {
                    let row = tx
                        .fetch_optional(
                            &Sql::new("SELECT series, aggregated_seconds FROM units WHERE id = $1")
                                .arg(d.row),
                        )
                        .await?;
                    let (stored, seconds): (String, i64) = match &row {
                        Some(r) => (r.get(0)?, r.get(1)?),
                        None => continue,
                    };
                    Some(merge_series(&stored, seconds, d.seconds, &d.series))
                }
            };
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
                    gpu_memory_peak_bytes = CASE WHEN $21 IS NULL THEN gpu_memory_peak_bytes
                        WHEN gpu_memory_peak_bytes IS NULL OR $21 > gpu_memory_peak_bytes THEN $21
                        ELSE gpu_memory_peak_bytes END,
                    aggregates_until = $12,
                    aggregates_status = CASE WHEN $13 THEN 'done' ELSE 'partial' END,
                    aggregates_updated_at = $14,
                    series = coalesce($19, series),
                    measured = measured | $20
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
            .arg(d.counted_until)
            .arg(series)
            .arg(d.measured)
            .arg(d.gpu_memory_peak_bytes);
            tx.execute(&q).await?;
        }
        tx.commit().await?;
        let rows: Vec<i64> = deltas.iter().map(|d| d.row).collect();
        self.written_units(&rows);
        Ok(())
    }

    /// Rebuilds the per-project, per-user usage of `cluster` from its jobs.
    pub async fn rebuild_usage(&self, cluster: &str, now: i64) -> Result<(), StoreError> {
        let mut tx = self.write_tx().await?;
        tx.execute(&Sql::new("DELETE FROM usage WHERE cluster_id = $1").arg(cluster))
            .await?;
        let columns: Vec<&str> = USAGE_SUMS.iter().map(|(c, _)| *c).collect();
        let sums: Vec<String> = USAGE_SUMS
            .iter()
            .map(|(_, e)| format!("sum({e})"))
            .collect();
        // SQLite sorts every job of the cluster for a GROUP BY. Through the index by user
        // (the unary plus keeps it off the cluster's, which read the rows in job id order,
        // scattered), they come grouped by user: a million jobs 5.7 s -> 3.3 s. The groups are
        // then written in the order they always were.
        let cluster_col = match self.backend() {
            Backend::Sqlite => "+cluster_id",
            Backend::Postgres => "cluster_id",
        };
        tx.execute(
            &Sql::new(&format!(
                "INSERT INTO usage (cluster_id, project, usr, grp, num_units, {}, last_updated_at)
                 SELECT * FROM (
                   SELECT cluster_id, project, usr, max(grp), count(*), {}, $2
                   FROM units WHERE {cluster_col} = $1 AND started_at > 0
                   GROUP BY usr, project, cluster_id) g
                 ORDER BY cluster_id, project, usr",
                columns.join(", "),
                sums.join(", ")
            ))
            .arg(cluster)
            .arg(now),
        )
        .await?;
        // CEEMS's series, summed per group here (JSON the SQL above cannot add up), a row at
        // a time: every job of the cluster's history is read.
        let mut groups: std::collections::BTreeMap<(String, String), SeriesFold> =
            Default::default();
        tx.for_each_row(
            &Sql::new(&format!(
                "SELECT project, usr, series, {} FROM units
                 WHERE {cluster_col} = $1 AND started_at > 0 AND series <> '{{}}'",
                SeriesWeights::select(true)
            ))
            .arg(cluster),
            |r| {
                let key = (r.get::<String>(0)?, r.get::<String>(1)?);
                let weights = SeriesWeights::read(&r, 3)?;
                groups
                    .entry(key)
                    .or_default()
                    .add(&r.get::<String>(2)?, &weights);
                Ok(())
            },
        )
        .await?;
        for ((project, user), fold) in groups {
            let series = serde_json::Value::Object(fold.finish()).to_string();
            tx.execute(
                &Sql::new(
                    "UPDATE usage SET series = $4 WHERE cluster_id = $1 AND project = $2
                     AND usr = $3",
                )
                .arg(cluster)
                .arg(project)
                .arg(user)
                .arg(series),
            )
            .await?;
        }
        tx.commit().await?;
        // The usage table alone: no job's row changed.
        self.written_units(&[]);
        Ok(())
    }
}

/// A job's wall time as CEEMS counts it: from its start to its end, or to the last update
/// while it runs.
macro_rules! wall {
    () => {
        "(CASE WHEN started_at > 0 THEN coalesce(ended_at, last_updated_at) - started_at ELSE 0 END)"
    };
}
const WALL: &str = wall!();

/// What a usage row sums over its jobs: its column in `usage` and the expression over a job
/// (`units`) summed into it. Products are real: a sum of integer products can overflow.
pub const USAGE_SUMS: &[(&str, &str)] = &[
    ("elapsed_seconds", "elapsed_seconds"),
    ("cpu_seconds", "cpu_seconds"),
    ("alloc_cpu_seconds", "1.0 * alloc_cpus * aggregated_seconds"),
    ("cpu_energy_joules", "cpu_energy_joules"),
    ("host_energy_joules", "host_energy_joules"),
    ("gpu_energy_joules", "gpu_energy_joules"),
    ("emissions_grams", "emissions_grams"),
    ("io_read_bytes", "io_read_bytes"),
    ("io_write_bytes", "io_write_bytes"),
    ("aggregated_seconds", "aggregated_seconds"),
    ("wall_seconds", WALL),
    (
        "alloc_cpu_wall_seconds",
        concat!("1.0 * alloc_cpus * ", wall!()),
    ),
    (
        "alloc_mem_mib_wall_seconds",
        concat!("alloc_mem_bytes / 1048576.0 * ", wall!()),
    ),
    (
        "alloc_gpu_wall_seconds",
        concat!("1.0 * alloc_gpus * ", wall!()),
    ),
    (
        "gpu_wall_seconds",
        concat!("CASE WHEN alloc_gpus > 0 THEN ", wall!(), " ELSE 0 END"),
    ),
    (
        "memory_byte_seconds",
        "mean_memory_bytes * aggregated_seconds",
    ),
    (
        "alloc_memory_byte_seconds",
        "1.0 * alloc_mem_bytes * aggregated_seconds",
    ),
    // Jobs with each energy figure measured (the bits of `measured`: 2 HOST_ENERGY,
    // 4 EMISSIONS, 16 GPU_ENERGY): a group of none has none.
    (
        "host_energy_units",
        "CASE WHEN measured & 2 <> 0 THEN 1.0 ELSE 0.0 END",
    ),
    (
        "emissions_units",
        "CASE WHEN measured & 4 <> 0 THEN 1.0 ELSE 0.0 END",
    ),
    (
        "gpu_energy_units",
        "CASE WHEN measured & 16 <> 0 THEN 1.0 ELSE 0.0 END",
    ),
    (
        "gpu_utilization_seconds",
        "mean_gpu_utilization * alloc_gpus * aggregated_seconds",
    ),
    ("alloc_gpu_seconds", "1.0 * alloc_gpus * aggregated_seconds"),
];

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
}
