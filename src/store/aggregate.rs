//! Per-job aggregates from Prometheus. Each run counts, for every started job, the window from
//! where its last counted window ended to now (or to its end), so a run that fails is retried
//! by the next one over a longer window, and nothing is counted twice.
//!
//! Jobs are asked for in batches, one instant query per aggregate and batch, with `$uuids`
//! (a regex alternation of job ids) and `$range` (the window, `123s`) filled in. Batches are
//! sized to stay under Prometheus's `--query.max-samples`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::Deserialize;

use super::api_yield::YieldTo;
use super::db::{measured, AggregateDelta, AggregateTarget, Store, StoreError};
use super::prometheus::{PromError, Prometheus};

/// How an aggregate's query result adds to a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggregateKind {
    /// The value is what the window added (a counter's increase).
    Total,
    /// The value is a mean rate over the window; it adds `value × seconds`.
    MeanRate,
    /// The value is a mean level; the job keeps a time-weighted mean.
    Mean,
    /// The value is a highest level; the job keeps the highest.
    Max,
}

/// The query of each aggregate. An empty query turns that aggregate off.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct Queries {
    pub cpu_seconds: String,
    pub cpu_power_watts: String,
    pub host_power_watts: String,
    pub gpu_energy_joules: String,
    pub emissions_grams_per_second: String,
    pub memory_bytes: String,
    pub gpu_utilization: String,
    pub io_read_bytes: String,
    pub io_write_bytes: String,
    pub memory_peak_bytes: String,
    pub memory_fail_count: String,
    pub gpu_utilization_max: String,
    /// The highest GPU memory of the job on any GPU, in bytes.
    pub gpu_memory_peak_bytes: String,
    /// Per-node CPU seconds of an ended multi-node job over its life ([`crate::store::nodes`]):
    /// its `uuid` label is `job/hostname/cgrouphostname/instance`.
    pub node_cpu_seconds: String,
    /// CEEMS's queries: series → sub-key → template with `{{.UUIDs}}` (and `{{.Range}}`,
    /// `{{.ScrapeInterval}}`, `{{.RateInterval}}`, `{{.EvaluationInterval}}`). A series named
    /// `avg_…` is a mean weighted by time over the windows, any other a total.
    pub series: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
}

/// Our aggregates off: a cluster configured by CEEMS's file asks only its `series`.
impl Queries {
    pub fn series_only(
        series: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
    ) -> Queries {
        let off = String::new;
        Queries {
            cpu_seconds: off(),
            cpu_power_watts: off(),
            host_power_watts: off(),
            gpu_energy_joules: off(),
            emissions_grams_per_second: off(),
            memory_bytes: off(),
            gpu_utilization: off(),
            io_read_bytes: off(),
            io_write_bytes: off(),
            memory_peak_bytes: off(),
            memory_fail_count: off(),
            gpu_utilization_max: off(),
            gpu_memory_peak_bytes: off(),
            node_cpu_seconds: off(),
            series,
        }
    }
}

impl Default for Queries {
    /// Queries over the exporter's series and the recording rules of
    /// `examples/prometheus/rules/ceems-host-power.rules.yml`.
    fn default() -> Queries {
        let q = |s: &str| s.to_owned();
        Queries {
            cpu_seconds: q(
                r#"sum by (uuid) (increase(ceems_compute_unit_cpu_user_seconds_total{uuid=~"$uuids"}[$range]) + increase(ceems_compute_unit_cpu_system_seconds_total{uuid=~"$uuids"}[$range]))"#,
            ),
            cpu_power_watts: q(
                r#"sum by (uuid) (avg_over_time(uuid:ceems_cpu_power_watts:pue{uuid=~"$uuids"}[$range]))"#,
            ),
            host_power_watts: q(
                r#"sum by (uuid) (avg_over_time(uuid:ceems_host_power_watts:pue{uuid=~"$uuids"}[$range]))"#,
            ),
            gpu_energy_joules: q(
                r#"sum by (uuid) (increase(ceems_compute_unit_gpu_energy_joules_total{uuid=~"$uuids"}[$range]))"#,
            ),
            emissions_grams_per_second: q(
                r#"sum by (uuid) (avg_over_time(uuid:ceems_host_emissions_g_s:pue{uuid=~"$uuids"}[$range]))"#,
            ),
            memory_bytes: q(
                r#"sum by (uuid) (avg_over_time(ceems_compute_unit_memory_used_bytes{uuid=~"$uuids"}[$range]))"#,
            ),
            gpu_utilization: q(
                r#"avg by (uuid) (avg_over_time(ceems_compute_unit_gpu_utilization_ratio{uuid=~"$uuids"}[$range]))"#,
            ),
            io_read_bytes: q(
                r#"sum by (uuid) (increase(ceems_compute_unit_blkio_read_bytes_total{uuid=~"$uuids"}[$range]))"#,
            ),
            io_write_bytes: q(
                r#"sum by (uuid) (increase(ceems_compute_unit_blkio_write_bytes_total{uuid=~"$uuids"}[$range]))"#,
            ),
            memory_peak_bytes: q(
                r#"max by (uuid) (max_over_time(ceems_compute_unit_memory_used_bytes{uuid=~"$uuids"}[$range]))"#,
            ),
            memory_fail_count: q(
                r#"max by (uuid) (max_over_time(ceems_compute_unit_memory_fail_count{uuid=~"$uuids"}[$range]))"#,
            ),
            gpu_utilization_max: q(
                r#"max by (uuid) (max_over_time(ceems_compute_unit_gpu_utilization_ratio{uuid=~"$uuids"}[$range]))"#,
            ),
            gpu_memory_peak_bytes: q(
                r#"max by (uuid) (max_over_time(ceems_compute_unit_gpu_memory_used_bytes{uuid=~"$uuids"}[$range]))"#,
            ),
            node_cpu_seconds: q(
                r#"label_join(sum by (uuid, hostname, cgrouphostname, instance) (increase(ceems_compute_unit_cpu_user_seconds_total{uuid=~"$uuids"}[$range]) + increase(ceems_compute_unit_cpu_system_seconds_total{uuid=~"$uuids"}[$range])), "uuid", "/", "uuid", "hostname", "cgrouphostname", "instance")"#,
            ),
            series: Default::default(),
        }
    }
}

/// Index of each aggregate in [`Queries::list`].
#[derive(Debug, Clone, Copy)]
enum Field {
    CpuSeconds,
    CpuPower,
    HostPower,
    GpuEnergy,
    Emissions,
    Memory,
    GpuUtilization,
    IoRead,
    IoWrite,
    MemoryPeak,
    MemoryFails,
    GpuUtilizationMax,
    GpuMemoryPeak,
}

impl Queries {
    fn list(&self) -> [(Field, AggregateKind, &str); 13] {
        use AggregateKind::*;
        [
            (Field::CpuSeconds, Total, &self.cpu_seconds),
            (Field::CpuPower, MeanRate, &self.cpu_power_watts),
            (Field::HostPower, MeanRate, &self.host_power_watts),
            (Field::GpuEnergy, Total, &self.gpu_energy_joules),
            (Field::Emissions, MeanRate, &self.emissions_grams_per_second),
            (Field::Memory, Mean, &self.memory_bytes),
            (Field::GpuUtilization, Mean, &self.gpu_utilization),
            (Field::IoRead, Total, &self.io_read_bytes),
            (Field::IoWrite, Total, &self.io_write_bytes),
            (Field::MemoryPeak, Max, &self.memory_peak_bytes),
            (Field::MemoryFails, Max, &self.memory_fail_count),
            (Field::GpuUtilizationMax, Max, &self.gpu_utilization_max),
            (Field::GpuMemoryPeak, Max, &self.gpu_memory_peak_bytes),
        ]
    }

    /// Checks that every query names both placeholders, at start-up.
    pub fn validate(&self) -> Result<(), String> {
        for (series, subs) in &self.series {
            for (sub, q) in subs {
                if !q.contains("{{.UUIDs}}") {
                    return Err(format!(
                        "query {series}.{sub}: `{q}` does not name the units ({{{{.UUIDs}}}})"
                    ));
                }
            }
        }
        let nodes = ("node_cpu_seconds", &self.node_cpu_seconds);
        for (field, q) in self
            .list()
            .map(|(f, _, q)| (format!("{f:?}"), q))
            .into_iter()
            .chain(std::iter::once((nodes.0.to_owned(), nodes.1.as_str())))
        {
            let complete = q.contains("$uuids") && q.contains("$range");
            if !q.is_empty() && !complete {
                return Err(format!(
                    "prometheus query {field} must contain $uuids and $range: {q}"
                ));
            }
        }
        Ok(())
    }
}

/// Limits of one run.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Jobs shorter than this are marked `too_short` and never queried.
    pub cutoff: Duration,
    /// Most jobs in one query.
    pub max_batch: usize,
    /// Prometheus's `--query.max-samples`.
    pub max_samples: u64,
    /// Queries of one batch in flight at once.
    pub parallel_queries: usize,
    /// The exporters' scrape interval, to estimate samples.
    pub scrape_interval: Duration,
    /// Aggregates are counted up to this long before now.
    pub query_delay: Duration,
    /// No batch starts after a run has asked this long: the rest, the longest windows (a
    /// backlog), waits for the next run. Until one batch has answered, batches start anyway.
    pub run_budget: Duration,
    /// Each query first waits while the API is busy, up to a bound (the background updater's;
    /// not a refresh that a request itself waits for).
    pub yield_to: Option<YieldTo>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            cutoff: Duration::from_secs(60),
            max_batch: 1000,
            max_samples: 50_000_000,
            parallel_queries: 4,
            scrape_interval: Duration::from_secs(15),
            query_delay: Duration::ZERO,
            run_budget: Duration::MAX,
            yield_to: None,
        }
    }
}

/// Jobs per query for a window of `range` seconds: each job brings a few series (user and
/// system CPU, a series per node), each `range / scrape_interval` samples.
pub fn batch_size(limits: &Limits, range: i64) -> usize {
    const SERIES_PER_JOB: u64 = 8;
    let samples_per_job =
        (range.max(1) as u64 / limits.scrape_interval.as_secs().max(1) + 1) * SERIES_PER_JOB;
    // Half the limit: the budget is per query and Prometheus counts peaks, not totals.
    let fits = (limits.max_samples / 2 / samples_per_job).max(1);
    usize::try_from(fits)
        .unwrap_or(usize::MAX)
        .clamp(1, limits.max_batch.max(1))
}

/// The longest query a store takes by default: VictoriaMetrics's `-search.maxQueryLen` (16 KiB).
/// A longer one is refused, then asked in halves; sizing batches under it saves the refusal
/// (and, with the batch's other queries already answered, reading their samples twice).
const MAX_QUERY_BYTES: usize = 16 * 1024;

/// Bytes of job ids (with their separators) one query may hold: what the longest template
/// leaves of [`MAX_QUERY_BYTES`], shared by its `$uuids`.
fn id_budget(queries: &Queries) -> usize {
    let ours = queries
        .list()
        .into_iter()
        .map(|(_, _, t)| (t.len(), t.matches("$uuids").count()));
    let ceems = queries
        .series
        .values()
        .flat_map(|subs| subs.values())
        .map(|t| (t.len(), t.matches("{{.UUIDs}}").count()));
    ours.chain(ceems)
        .filter(|(_, n)| *n > 0)
        .map(|(len, n)| MAX_QUERY_BYTES.saturating_sub(len) / n)
        .min()
        .unwrap_or(MAX_QUERY_BYTES)
}

/// `group` in runs of at most `max_jobs` jobs whose ids (escaped, with a separator each) fit
/// in `id_bytes`; a job whose id alone does not fit goes alone.
fn chunks(group: &[AggregateTarget], max_jobs: usize, id_bytes: usize) -> Vec<&[AggregateTarget]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, t) in group.iter().enumerate() {
        let len = alternation(&[t.uuid.as_str()]).len() + 1;
        if i > start && (i - start >= max_jobs.max(1) || bytes + len > id_bytes) {
            out.push(&group[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += len;
    }
    if start < group.len() {
        out.push(&group[start..]);
    }
    out
}

/// `1|2|3`, with regex metacharacters escaped (job ids are digits, but uuids elsewhere may not be).
fn alternation(uuids: &[&str]) -> String {
    uuids
        .iter()
        .map(|u| {
            u.chars()
                .flat_map(|c| {
                    let special = "\\.+*?()|[]{}^$\"".contains(c);
                    // Two backslashes: one for the regex, one for the PromQL string.
                    special
                        .then_some(['\\', '\\'])
                        .into_iter()
                        .flatten()
                        .chain(std::iter::once(c))
                })
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// Fills the placeholders of `template`.
pub fn render(template: &str, uuids: &[&str], range: i64) -> String {
    template
        .replace("$uuids", &alternation(uuids))
        .replace("$range", &format!("{}s", range.max(1)))
}

/// Fills the placeholders of one of CEEMS's templates (Go's `{{.Name}}`), as its updater
/// does: the units, the window, and the intervals a rate needs.
pub fn render_ceems(template: &str, uuids: &[&str], range: i64, scrape_interval: i64) -> String {
    let seconds = |s: i64| format!("{}s", s.max(1));
    template
        .replace("{{.UUIDs}}", &alternation(uuids))
        .replace("{{.Range}}", &seconds(range))
        .replace("{{.ScrapeInterval}}", &seconds(scrape_interval))
        .replace("{{.EvaluationInterval}}", &seconds(scrape_interval))
        .replace("{{.RateInterval}}", &seconds(4 * scrape_interval))
}

#[derive(Debug, thiserror::Error)]
pub enum AggregateError {
    #[error(transparent)]
    Prometheus(#[from] PromError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("aggregation task: {0}")]
    Task(String),
}

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AggregateReport {
    pub updated: usize,
    pub too_short: u64,
    pub queries: usize,
    /// Batches the store refused for their size, asked again in halves.
    pub splits: usize,
    /// Jobs left for the next run, past the run's budget.
    pub deferred: usize,
}

/// Groups due jobs so that one query's window fits all of its jobs: jobs counted up to the
/// same time share it; jobs never counted share the earliest start (the window may reach
/// back before a job began, where it has no series).
fn groups(targets: Vec<AggregateTarget>) -> Vec<(i64, Vec<AggregateTarget>)> {
    let mut by_key: std::collections::BTreeMap<Option<i64>, Vec<AggregateTarget>> =
        Default::default();
    for t in targets {
        by_key.entry(t.counted_until).or_default().push(t);
    }
    by_key
        .into_values()
        .map(|mut ts| {
            // Latest starts first, so a batch of new jobs does not share a backlog's window.
            ts.sort_by_key(|t| std::cmp::Reverse(t.from));
            let from = ts.iter().map(|t| t.from).min().unwrap_or(0);
            (from, ts)
        })
        .collect()
}

/// Updates the aggregates of the jobs of `cluster` up to `now`. A failing query fails the
/// batch (nothing of it is written), so it is retried whole at the next run.
pub async fn update(
    store: &Store,
    prometheus: std::sync::Arc<dyn Prometheus>,
    queries: &Queries,
    limits: &Limits,
    cluster: &str,
    only: Option<&str>,
    now: i64,
) -> Result<AggregateReport, AggregateError> {
    // A remote-write store answers for recent samples only once they have arrived: the world
    // is taken as it was `query_delay` ago, so a job's last samples are not missed for good.
    let now = now - i64::try_from(limits.query_delay.as_secs()).unwrap_or(0);
    let cutoff = i64::try_from(limits.cutoff.as_secs()).unwrap_or(i64::MAX);
    let mut report = AggregateReport {
        too_short: store.mark_too_short(cluster, cutoff, now).await?,
        ..Default::default()
    };
    // Counted up to or past an end that accounting told only later: nothing is left to ask
    // Prometheus, the job is done.
    let (counted, targets): (Vec<AggregateTarget>, Vec<AggregateTarget>) = store
        .aggregate_targets(cluster, only, now)
        .await?
        .into_iter()
        .partition(|t| t.ended && t.counted_until.is_some() && t.to <= t.from);
    if !counted.is_empty() {
        let finished: Vec<AggregateDelta> = counted
            .iter()
            .map(|t| AggregateDelta {
                row: t.row,
                counted_until: t.counted_until,
                to: t.from,
                ended: true,
                seconds: 0,
                ..Default::default()
            })
            .collect();
        store.apply_aggregates(&finished, now).await?;
        report.updated += finished.len();
    }
    let mut first_error = None;
    let groups = groups(targets);
    let id_bytes = id_budget(queries);
    // Each batch's window starts at its earliest job's; the shortest go first (new jobs and
    // the steady state), a backlog's long ones take what the run's budget leaves.
    let mut batches: Vec<(i64, Vec<&AggregateTarget>)> = Vec::new();
    for (from, group) in &groups {
        for batch in chunks(group, batch_size(limits, now - from), id_bytes) {
            // Windows that have not begun yet (a clock step) wait for the next run.
            let batch: Vec<&AggregateTarget> = batch.iter().filter(|t| t.to >= t.from).collect();
            if let Some(from) = batch.iter().map(|t| t.from).min() {
                batches.push((now - from, batch));
            }
        }
    }
    batches.sort_by_key(|(range, _)| *range);
    let began = std::time::Instant::now();
    let mut batches = batches.into_iter();
    while let Some((range, batch)) = batches.next() {
        if report.queries > 0 && began.elapsed() >= limits.run_budget {
            report.deferred = batch.len() + batches.map(|(_, b)| b.len()).sum::<usize>();
            tracing::info!(
                cluster,
                jobs = report.deferred,
                "the run's budget is spent; the longest windows wait for the next run"
            );
            break;
        }
        // A batch the store refuses for its size is asked again in halves; each part
        // that answers is written, whatever becomes of the others.
        let mut parts = vec![batch];
        while let Some(part) = parts.pop() {
            let asked_at = std::time::Instant::now();
            match query_batch(&prometheus, queries, limits, &part, range, now).await {
                Ok((deltas, n)) => {
                    let written_at = std::time::Instant::now();
                    report.queries += n;
                    store.apply_aggregates(&deltas, now).await?;
                    report.updated += deltas.len();
                    tracing::debug!(
                        cluster,
                        jobs = part.len(),
                        queries = n,
                        asking_ms = (written_at - asked_at).as_millis() as u64,
                        writing_ms = written_at.elapsed().as_millis() as u64,
                        "batch of aggregates done"
                    );
                }
                Err(AggregateError::Prometheus(e)) if e.is_too_large() && part.len() > 1 => {
                    report.splits += 1;
                    tracing::info!(cluster, jobs = part.len(), error = %e, "the store refused a batch for its size; asking for it in halves");
                    let (first, second) = part.split_at(part.len() / 2);
                    parts.push(second.to_vec());
                    parts.push(first.to_vec());
                }
                Err(e) => {
                    tracing::warn!(cluster, jobs = part.len(), error = %e, "aggregates not updated; retried at the next run");
                    first_error.get_or_insert(e);
                }
            }
        }
    }
    match first_error {
        Some(e) if report.updated == 0 => Err(e),
        _ => Ok(report),
    }
}

/// One instant query, off the async threads (the client blocks).
pub(crate) async fn ask(
    prometheus: std::sync::Arc<dyn Prometheus>,
    promql: String,
    now: i64,
) -> Result<Vec<(String, f64)>, AggregateError> {
    Ok(
        tokio::task::spawn_blocking(move || prometheus.query(&promql, now))
            .await
            .map_err(|e| AggregateError::Task(e.to_string()))??,
    )
}

async fn query_batch(
    prometheus: &std::sync::Arc<dyn Prometheus>,
    queries: &Queries,
    limits: &Limits,
    batch: &[&AggregateTarget],
    range: i64,
    now: i64,
) -> Result<(Vec<AggregateDelta>, usize), AggregateError> {
    let uuids: Vec<&str> = batch.iter().map(|t| t.uuid.as_str()).collect();
    let mut deltas: Vec<AggregateDelta> = batch
        .iter()
        .map(|t| AggregateDelta {
            row: t.row,
            counted_until: t.counted_until,
            to: t.to,
            ended: t.ended,
            seconds: t.to - t.from,
            ..Default::default()
        })
        .collect();
    let index: HashMap<&str, Vec<usize>> = batch.iter().enumerate().fold(
        HashMap::new(),
        |mut m: HashMap<&str, Vec<usize>>, (i, t)| {
            m.entry(t.uuid.as_str()).or_default().push(i);
            m
        },
    );
    // What each query's answer adds to: one of our aggregates, or one of CEEMS's series.
    enum Adds<'q> {
        Ours(Field, AggregateKind),
        Series(&'q str, &'q str),
    }
    let scrape = i64::try_from(limits.scrape_interval.as_secs()).unwrap_or(15);
    let mut asks: Vec<(Adds<'_>, String)> = queries
        .list()
        .into_iter()
        .filter(|(_, _, template)| !template.is_empty())
        .map(|(field, kind, template)| (Adds::Ours(field, kind), render(template, &uuids, range)))
        .collect();
    for (series, subs) in &queries.series {
        for (sub, template) in subs {
            let promql = render_ceems(template, &uuids, range, scrape);
            asks.push((Adds::Series(series, sub), promql));
        }
    }
    let asked = asks.len();
    let (intos, promqls): (Vec<Adds<'_>>, Vec<String>) = asks.into_iter().unzip();
    // In flight together, as CEEMS's updater sends them; answers taken in order. The futures
    // own what they use (a borrowing future is not Send for every lifetime).
    use futures_util::stream::StreamExt as _;
    let given_up = std::sync::Arc::new(AtomicBool::new(false));
    let mut answers = futures_util::stream::iter(promqls.into_iter().map(|promql| {
        let p = std::sync::Arc::clone(prometheus);
        let given_up = std::sync::Arc::clone(&given_up);
        let yield_to = limits.yield_to.clone();
        async move {
            let given_up = || given_up.load(Ordering::Relaxed);
            // A query of a failed batch does not wait for the API only to be dropped.
            if let Some(y) = yield_to.filter(|_| !given_up()) {
                y.api.until_quiet(y.at_most).await;
            }
            if given_up() {
                return Ok(Vec::new());
            }
            ask(p, promql, now).await
        }
    }))
    .buffered(limits.parallel_queries.max(1));
    let mut intos = intos.into_iter();
    while let (Some(values), Some(into)) = (answers.next().await, intos.next()) {
        let values = match values {
            Ok(values) => values,
            Err(e) => {
                // A query in flight cannot be called back (it blocks a thread): the batch
                // waits for those, starts no more, so none outlives this run.
                given_up.store(true, Ordering::Relaxed);
                while answers.next().await.is_some() {}
                return Err(e);
            }
        };
        for (uuid, v) in values {
            for &i in index.get(uuid.as_str()).into_iter().flatten() {
                let d = &mut deltas[i];
                let (field, kind) = match into {
                    Adds::Series(series, sub) => {
                        d.series.push((series.to_owned(), sub.to_owned(), v));
                        continue;
                    }
                    Adds::Ours(field, kind) => (field, kind),
                };
                d.measured |= match field {
                    Field::CpuSeconds => measured::CPU,
                    Field::CpuPower => measured::CPU_PACKAGE_ENERGY,
                    Field::HostPower => measured::HOST_ENERGY,
                    Field::GpuEnergy => measured::GPU_ENERGY,
                    Field::Emissions => measured::EMISSIONS,
                    _ => 0,
                };
                let add = match kind {
                    AggregateKind::Total => v,
                    AggregateKind::MeanRate => v * d.seconds as f64,
                    AggregateKind::Mean | AggregateKind::Max => v,
                };
                match field {
                    Field::CpuSeconds => d.cpu_seconds += add,
                    Field::CpuPower => d.cpu_energy_joules += add,
                    Field::HostPower => d.host_energy_joules += add,
                    Field::GpuEnergy => d.gpu_energy_joules += add,
                    Field::Emissions => d.emissions_grams += add,
                    Field::Memory => d.mean_memory_bytes = Some(add),
                    Field::GpuUtilization => d.mean_gpu_utilization = Some(add),
                    Field::IoRead => d.io_read_bytes += add,
                    Field::IoWrite => d.io_write_bytes += add,
                    Field::MemoryPeak => d.memory_peak_bytes = Some(add),
                    Field::MemoryFails => d.memory_fail_count = Some(add),
                    Field::GpuUtilizationMax => d.gpu_utilization_max = Some(add),
                    Field::GpuMemoryPeak => d.gpu_memory_peak_bytes = Some(add),
                }
            }
        }
    }
    Ok((deltas, asked))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::slurm::sacct;
    use crate::store::sql::Sql;
    use std::sync::{Arc, Mutex};

    /// Answers each query with a value per job taken from `values`, recording the queries; or
    /// fails while `down` is set.
    #[derive(Default)]
    struct FakePrometheus {
        asked: Mutex<Vec<String>>,
        at: Mutex<Vec<i64>>,
        down: Mutex<bool>,
        /// Refuses, as VictoriaMetrics does, a query naming more jobs than this.
        max_jobs: Mutex<Option<usize>>,
    }

    impl Prometheus for FakePrometheus {
        fn query(&self, promql: &str, at: i64) -> Result<Vec<(String, f64)>, PromError> {
            self.asked.lock().unwrap().push(promql.to_owned());
            self.at.lock().unwrap().push(at);
            if *self.down.lock().unwrap() {
                return Err(PromError::Request {
                    url: "fake".into(),
                    message: "connection refused".into(),
                });
            }
            // Every job used 2 CPU seconds per second of window, drew 100 W, holds 1 GiB.
            let range: f64 = promql
                .split('[')
                .nth(1)
                .and_then(|r| r.split('s').next())
                .and_then(|r| r.parse().ok())
                .unwrap_or(0.0);
            let ids = promql
                .split("uuid=~\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("");
            if let Some(max) = *self.max_jobs.lock().unwrap() {
                if ids.split('|').count() > max {
                    return Err(PromError::Request {
                        url: "fake".into(),
                        message: format!("status 422: {{\"status\":\"error\",\"errorType\":\"422\",\"error\":\"the number of matching timeseries exceeds {max}; either narrow down the search or increase -search.maxUniqueTimeseries command-line flag value\"}}"),
                    });
                }
            }
            let v = if promql.contains("cpu_user") {
                2.0 * range
            } else if promql.contains("host_power") {
                100.0
            } else if promql.contains("memory") {
                1073741824.0
            } else {
                return Ok(Vec::new());
            };
            Ok(ids.split('|').map(|id| (id.to_owned(), v)).collect())
        }
    }

    #[test]
    fn placeholders_are_filled_and_escaped() {
        assert_eq!(
            render(r#"x{uuid=~"$uuids"}[$range]"#, &["1", "2.3"], 90),
            r#"x{uuid=~"1|2\\.3"}[90s]"#
        );
        assert!(Queries::default().validate().is_ok());
        let bad = Queries {
            cpu_seconds: "sum(x)".into(),
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("$uuids"));
    }

    #[test]
    fn batches_keep_their_queries_under_the_store_s_length_limit() {
        let q = Queries::default();
        let budget = id_budget(&q);
        // The CPU query names the jobs twice.
        assert!(
            budget < MAX_QUERY_BYTES / 2 && budget > MAX_QUERY_BYTES / 2 - 400,
            "{budget}"
        );
        let group: Vec<AggregateTarget> = (0..5000)
            .map(|i| AggregateTarget {
                uuid: (10_000_000 + i).to_string(),
                ..Default::default()
            })
            .collect();
        let parts = chunks(&group, 1000, budget);
        assert_eq!(parts.iter().map(|p| p.len()).sum::<usize>(), 5000);
        assert!(parts.len() > 5, "{}", parts.len());
        for part in &parts {
            let ids: Vec<&str> = part.iter().map(|t| t.uuid.as_str()).collect();
            for (_, _, template) in q.list() {
                assert!(render(template, &ids, 86_400).len() <= MAX_QUERY_BYTES);
            }
        }
        // Short ids: the job count binds.
        let short: Vec<AggregateTarget> = (0..2500)
            .map(|i| AggregateTarget {
                uuid: i.to_string(),
                ..Default::default()
            })
            .collect();
        let sizes: Vec<usize> = chunks(&short, 1000, budget)
            .iter()
            .map(|p| p.len())
            .collect();
        assert_eq!(sizes, vec![1000, 1000, 500]);
        assert!(chunks(&[], 1000, budget).is_empty());
    }

    #[test]
    fn batches_shrink_with_the_window() {
        let l = Limits::default();
        assert_eq!(batch_size(&l, 900), 1000);
        let week = batch_size(&l, 7 * 86400);
        assert!((1..1000).contains(&week), "{week}");
        assert_eq!(
            batch_size(
                &Limits {
                    max_samples: 1,
                    ..l
                },
                900
            ),
            1
        );
    }

    #[tokio::test]
    async fn windows_add_up_a_failed_run_is_retried_and_short_jobs_are_skipped() {
        let tmp = tempfile::tempdir().unwrap();
        let store = crate::store::db::testing::store(tmp.path()).await;
        // Job 1 runs from 1000; job 2 ran 1000..1030 (too short); job 3 pending.
        let lines = "\
1|debug|normal|physics|alice|2001|alice|2001|990|1000|Unknown|00:00:00|0|0:0|RUNNING|billing=2,cpu=2,mem=1G,node=1|localhost|/tmp|60|long
2|debug|normal|physics|alice|2001|alice|2001|990|1000|1030|00:00:30|30|0:0|COMPLETED|billing=1,cpu=1,mem=1G,node=1|localhost|/tmp|60|short
3|debug|normal|physics|alice|2001|alice|2001|990|None|Unknown|00:00:00|0|0:0|PENDING||None assigned|/tmp|60|wait
";
        let (jobs, _) = sacct::parse_output(lines);
        store.ingest("lab", &jobs, 0, 1000).await.unwrap();
        let fake = Arc::new(FakePrometheus::default());
        let limits = Limits::default();
        let q = Queries::default();

        let r = update(&store, fake.clone(), &q, &limits, "lab", None, 1600)
            .await
            .unwrap();
        assert_eq!((r.updated, r.too_short), (1, 1));
        assert!(fake
            .asked
            .lock()
            .unwrap()
            .iter()
            .all(|q| q.contains("[600s]")));

        // Prometheus down: nothing written, the window stays where it was.
        *fake.down.lock().unwrap() = true;
        assert!(update(&store, fake.clone(), &q, &limits, "lab", None, 2200)
            .await
            .is_err());
        *fake.down.lock().unwrap() = false;
        fake.asked.lock().unwrap().clear();
        // The job ended at 2500; the next run covers 1600..2500 in one window.
        let ended = lines.lines().next().unwrap().replace(
            "Unknown|00:00:00|0|0:0|RUNNING",
            "2500|00:25:00|1500|0:0|COMPLETED",
        );
        let (jobs, _) = sacct::parse_output(&ended);
        store.ingest("lab", &jobs, 0, 2800).await.unwrap();
        update(&store, fake.clone(), &q, &limits, "lab", None, 2800)
            .await
            .unwrap();
        assert!(fake
            .asked
            .lock()
            .unwrap()
            .iter()
            .all(|q| q.contains("[1200s]")));

        let r = store
            .fetch_one(&Sql::new(
                "SELECT cpu_seconds, host_energy_joules, mean_memory_bytes, aggregated_seconds,
                        aggregates_status, aggregates_until FROM units WHERE uuid = '1'",
            ))
            .await
            .unwrap();
        let row: (f64, f64, f64, i64, String, i64) = (
            r.get(0).unwrap(),
            r.get(1).unwrap(),
            r.get(2).unwrap(),
            r.get(3).unwrap(),
            r.get(4).unwrap(),
            r.get(5).unwrap(),
        );
        // 600 s then 1200 s of window at 2 CPU-s/s; 100 W over the 1500 s the job ran.
        assert_eq!(row.0, 2.0 * 600.0 + 2.0 * 1200.0);
        assert_eq!(row.1, 100.0 * 1500.0);
        assert_eq!(row.2, 1073741824.0);
        assert_eq!((row.3, row.4.as_str(), row.5), (1500, "done", 2500));
        // The GPU memory peak is the highest window's.
        let peak: Option<f64> = store
            .fetch_one(&Sql::new(
                "SELECT gpu_memory_peak_bytes FROM units WHERE uuid = '1'",
            ))
            .await
            .unwrap()
            .get(0)
            .unwrap();
        assert_eq!(peak, Some(1073741824.0));

        // Done jobs are not asked again.
        fake.asked.lock().unwrap().clear();
        let r = update(&store, fake.clone(), &q, &limits, "lab", None, 3400)
            .await
            .unwrap();
        assert_eq!((r.updated, r.queries), (0, 0));
        assert!(fake.asked.lock().unwrap().is_empty());
    }

    /// The uuids whose aggregates are done, in id order.
    async fn done(store: &Store) -> Vec<String> {
        let rows = store
            .fetch_all(&Sql::new(
                "SELECT uuid FROM units WHERE aggregates_status = 'done' ORDER BY id",
            ))
            .await
            .unwrap();
        rows.iter().map(|r| r.get(0).unwrap()).collect()
    }

    /// A run past its budget leaves the longest windows (an outage's backlog) for the next
    /// runs; a job that ended meanwhile goes before them; every job is counted once.
    #[tokio::test]
    async fn a_backlog_is_spread_over_runs_and_new_jobs_go_first() {
        let tmp = tempfile::tempdir().unwrap();
        let store = crate::store::db::testing::store(tmp.path()).await;
        let line = |id: u32, start: i64, end: i64| {
            format!("{id}|debug|normal|physics|alice|2001|alice|2001|990|{start}|{end}|00:05:00|{}|0:0|COMPLETED|billing=1,cpu=1,mem=1G,node=1|localhost|/tmp|60|j{id}\n", end - start)
        };
        // Four jobs of the day before, one of the last minutes.
        let backlog: String = (1..=4).map(|i| line(i, 1000, 1600)).collect();
        let (jobs, _) = sacct::parse_output(&(backlog + &line(5, 9000, 9500)));
        store.ingest("lab", &jobs, 0, 10000).await.unwrap();
        let fake = Arc::new(FakePrometheus::default());
        let limits = Limits {
            max_batch: 1,
            run_budget: Duration::ZERO,
            ..Limits::default()
        };
        let q = Queries::default();
        let run = |now| update(&store, fake.clone(), &q, &limits, "lab", None, now);

        let r = run(10000).await.unwrap();
        assert_eq!((r.updated, r.deferred), (1, 4));
        assert_eq!(done(&store).await, ["5"]);
        let r = run(10600).await.unwrap();
        assert_eq!((r.updated, r.deferred), (1, 3));
        assert_eq!(done(&store).await, ["1", "5"]);
        // A job ends while the backlog is worked off: it is not kept waiting.
        let (jobs, _) = sacct::parse_output(&line(6, 10700, 11000));
        store.ingest("lab", &jobs, 0, 11200).await.unwrap();
        let r = run(11200).await.unwrap();
        assert_eq!((r.updated, r.deferred), (1, 3));
        assert_eq!(done(&store).await, ["1", "5", "6"]);
        for (now, left) in [(11800, 2), (12400, 1), (13000, 0)] {
            assert_eq!(run(now).await.unwrap().deferred, left);
        }
        assert_eq!(done(&store).await, ["1", "2", "3", "4", "5", "6"]);
        let r = run(13600).await.unwrap();
        assert_eq!((r.updated, r.queries, r.deferred), (0, 0, 0));
        // Each job's window was asked once: its counted seconds are its length.
        let rows = store
            .fetch_all(&Sql::new(
                "SELECT aggregated_seconds FROM units ORDER BY id",
            ))
            .await
            .unwrap();
        let seconds: Vec<i64> = rows.iter().map(|r| r.get(0).unwrap()).collect();
        assert_eq!(seconds, [600, 600, 600, 600, 500, 300]);
    }

    /// Prometheus that fails the first query at once and answers the others slowly.
    #[derive(Default)]
    struct FirstFails {
        started: Mutex<usize>,
        answered: Mutex<usize>,
    }

    impl Prometheus for FirstFails {
        fn query(&self, _: &str, _: i64) -> Result<Vec<(String, f64)>, PromError> {
            let first = {
                let mut started = self.started.lock().unwrap();
                *started += 1;
                *started == 1
            };
            if first {
                return Err(PromError::Request {
                    url: "fake".into(),
                    message: "connection refused".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
            *self.answered.lock().unwrap() += 1;
            Ok(Vec::new())
        }
    }

    /// A store with one job that ran 1000..1600, ingested at 1700.
    async fn one_finished_job(dir: &std::path::Path) -> Store {
        let store = crate::store::db::testing::store(dir).await;
        let lines = "1|debug|normal|physics|alice|2001|alice|2001|990|1000|1600|00:10:00|600|0:0|COMPLETED|billing=1,cpu=1,mem=1G,node=1|localhost|/tmp|60|j1\n";
        let (jobs, _) = sacct::parse_output(lines);
        store.ingest("lab", &jobs, 0, 1700).await.unwrap();
        store
    }

    /// A failed run has finished with Prometheus when it says so: the queries already in
    /// flight are waited for, no more are sent, none lands in the next run.
    #[tokio::test]
    async fn a_failed_run_leaves_no_query_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let store = one_finished_job(tmp.path()).await;
        let fake = Arc::new(FirstFails::default());
        let (limits, q) = (Limits::default(), Queries::default());
        assert!(q.list().len() > limits.parallel_queries);
        assert!(update(&store, fake.clone(), &q, &limits, "lab", None, 1700)
            .await
            .is_err());
        let (started, answered) = (
            *fake.started.lock().unwrap(),
            *fake.answered.lock().unwrap(),
        );
        assert!(started <= limits.parallel_queries, "{started} sent");
        assert_eq!(answered, started - 1);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(*fake.started.lock().unwrap(), started);
        assert_eq!(*fake.answered.lock().unwrap(), answered);
    }

    /// While the API answers a request, each of the updater's queries waits its bound, then
    /// goes: the update is slower, not stopped, and counts every job.
    #[tokio::test]
    async fn the_updater_yields_to_a_busy_api_for_a_bounded_time() {
        let tmp = tempfile::tempdir().unwrap();
        let store = one_finished_job(tmp.path()).await;
        let fake = Arc::new(FakePrometheus::default());
        let api = Arc::new(crate::store::api_yield::ApiActivity::default());
        let at_most = Duration::from_millis(40);
        let limits = Limits {
            yield_to: Some(YieldTo {
                api: Arc::clone(&api),
                at_most,
            }),
            ..Limits::default()
        };
        let q = Queries::default();
        let answering = api.request();
        let began = std::time::Instant::now();
        let r = update(&store, fake.clone(), &q, &limits, "lab", None, 1700)
            .await
            .unwrap();
        drop(answering);
        assert_eq!(r.updated, 1);
        assert_eq!(r.queries, fake.asked.lock().unwrap().len());
        // Every query waited; those in flight together waited side by side.
        assert!(
            api.yielded() >= at_most * r.queries as u32,
            "{:?}",
            api.yielded()
        );
        let rounds = r.queries.div_ceil(limits.parallel_queries) as u32;
        assert!(began.elapsed() >= at_most * rounds, "{:?}", began.elapsed());
    }

    /// A store that refuses a batch for its size (VictoriaMetrics's series limit) gets it in
    /// halves until each part passes: every job is counted, once.
    #[tokio::test]
    async fn a_batch_refused_for_its_size_is_asked_in_halves() {
        let tmp = tempfile::tempdir().unwrap();
        let store = crate::store::db::testing::store(tmp.path()).await;
        let lines: String = (1..=9)
            .map(|i| format!("{i}|debug|normal|physics|alice|2001|alice|2001|990|1000|1600|00:10:00|600|0:0|COMPLETED|billing=1,cpu=1,mem=1G,node=1|localhost|/tmp|60|j{i}\n"))
            .collect();
        let (jobs, _) = sacct::parse_output(&lines);
        store.ingest("lab", &jobs, 0, 1700).await.unwrap();
        let fake = Arc::new(FakePrometheus::default());
        *fake.max_jobs.lock().unwrap() = Some(2);
        let (limits, q) = (Limits::default(), Queries::default());
        let r = update(&store, fake.clone(), &q, &limits, "lab", None, 1700)
            .await
            .unwrap();
        assert_eq!(r.updated, 9);
        assert!(r.splits >= 4, "{r:?}");
        let rows = store
            .fetch_all(&Sql::new(
                "SELECT cpu_seconds, aggregates_status FROM units ORDER BY uuid",
            ))
            .await
            .unwrap();
        assert_eq!(rows.len(), 9);
        for row in rows {
            let (cpu, status): (f64, String) = (row.get(0).unwrap(), row.get(1).unwrap());
            assert_eq!((cpu, status.as_str()), (2.0 * 700.0, "done"));
        }
        // Not even one job passes: the run fails, and says why.
        let more: String = lines
            .replace(
                "|1600|00:10:00|600|0:0|COMPLETED",
                "|Unknown|00:00:00|0|0:0|RUNNING",
            )
            .replace("|j", "|k");
        let more = more.lines().map(|l| format!("1{l}\n")).collect::<String>();
        let (jobs, _) = sacct::parse_output(&more);
        store.ingest("lab", &jobs, 0, 1800).await.unwrap();
        *fake.max_jobs.lock().unwrap() = Some(0);
        let e = update(&store, fake.clone(), &q, &limits, "lab", None, 1800)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("maxUniqueTimeseries"), "{e}");
    }

    /// Accounting can learn of a job's end after its aggregates were counted past it (slurmdbd
    /// records the end a moment after slurmctld mails): the job is then done, not left
    /// `partial` for good.
    #[tokio::test]
    async fn a_job_whose_end_is_learned_after_counting_past_it_is_done() {
        let tmp = tempfile::tempdir().unwrap();
        let store = crate::store::db::testing::store(tmp.path()).await;
        let running = "1|debug|normal|physics|alice|2001|alice|2001|990|1000|Unknown|00:00:00|0|0:0|RUNNING|billing=2,cpu=2,mem=1G,node=1|localhost|/tmp|60|a\n";
        let (jobs, _) = sacct::parse_output(running);
        store.ingest("lab", &jobs, 0, 1000).await.unwrap();
        let fake = Arc::new(FakePrometheus::default());
        let (limits, q) = (Limits::default(), Queries::default());
        update(&store, fake.clone(), &q, &limits, "lab", None, 1600)
            .await
            .unwrap();
        // It had ended at 1590, which accounting says only now.
        let ended = running.replace(
            "Unknown|00:00:00|0|0:0|RUNNING",
            "1590|00:09:50|590|0:0|COMPLETED",
        );
        let (jobs, _) = sacct::parse_output(&ended);
        store.ingest("lab", &jobs, 0, 1602).await.unwrap();
        update(&store, fake.clone(), &q, &limits, "lab", None, 1602)
            .await
            .unwrap();
        let r = store
            .fetch_one(&Sql::new(
                "SELECT aggregates_status, cpu_seconds FROM units WHERE uuid = '1'",
            ))
            .await
            .unwrap();
        let (status, cpu): (String, f64) = (r.get(0).unwrap(), r.get(1).unwrap());
        assert_eq!(status, "done");
        assert_eq!(cpu, 2.0 * 600.0, "nothing counted twice");
    }

    #[tokio::test]
    async fn a_query_delay_counts_up_to_that_long_ago_and_finishes_the_job_once_past_its_end() {
        let tmp = tempfile::tempdir().unwrap();
        let store = crate::store::db::testing::store(tmp.path()).await;
        let line = "1|debug|normal|physics|alice|2001|alice|2001|990|1000|1300|00:05:00|300|0:0|COMPLETED|billing=2,cpu=2,mem=1G,node=1|localhost|/tmp|60|a\n";
        let (jobs, _) = sacct::parse_output(line);
        store.ingest("lab", &jobs, 0, 1320).await.unwrap();
        let fake = Arc::new(FakePrometheus::default());
        let limits = Limits {
            query_delay: Duration::from_secs(60),
            ..Limits::default()
        };
        let q = Queries::default();
        let status = || async {
            let r = store
                .fetch_one(&Sql::new(
                    "SELECT aggregates_status, aggregated_seconds, cpu_seconds FROM units",
                ))
                .await
                .unwrap();
            let row: (String, i64, f64) = (r.get(0).unwrap(), r.get(1).unwrap(), r.get(2).unwrap());
            row
        };

        // 20 s after the end, the store may still lack the last samples: counted to 1260.
        update(&store, fake.clone(), &q, &limits, "lab", None, 1320)
            .await
            .unwrap();
        assert!(fake.at.lock().unwrap().iter().all(|&t| t == 1260));
        let (st, seconds, _) = status().await;
        assert_ne!(st, "done");
        assert_eq!(seconds, 260);

        // A minute past the end: the rest of the job, and it is done.
        update(&store, fake.clone(), &q, &limits, "lab", None, 1400)
            .await
            .unwrap();
        assert_eq!(fake.at.lock().unwrap().last(), Some(&1340));
        assert_eq!(
            status().await,
            ("done".to_owned(), 300, 2.0 * (260.0 + 80.0))
        );
    }

    #[tokio::test]
    async fn one_job_can_be_updated_alone_and_a_window_read_twice_counts_once() {
        let tmp = tempfile::tempdir().unwrap();
        let store = crate::store::db::testing::store(tmp.path()).await;
        let lines = "\
1|debug|normal|physics|alice|2001|alice|2001|990|1000|Unknown|00:00:00|0|0:0|RUNNING|billing=2,cpu=2,mem=1G,node=1|localhost|/tmp|60|a
2|debug|normal|physics|alice|2001|alice|2001|990|1000|Unknown|00:00:00|0|0:0|RUNNING|billing=2,cpu=2,mem=1G,node=1|localhost|/tmp|60|b
";
        let (jobs, _) = sacct::parse_output(lines);
        store.ingest("lab", &jobs, 0, 1000).await.unwrap();
        // Two updaters read job 1's window before either writes (an on-demand report beside
        // the update loop): only the first write counts.
        let early = store
            .aggregate_targets("lab", Some("1"), 1600)
            .await
            .unwrap();
        assert_eq!(early.len(), 1);
        let fake = Arc::new(FakePrometheus::default());
        let r = update(
            &store,
            fake.clone(),
            &Queries::default(),
            &Limits::default(),
            "lab",
            Some("1"),
            1600,
        )
        .await
        .unwrap();
        assert_eq!(r.updated, 1);
        assert!(fake
            .asked
            .lock()
            .unwrap()
            .iter()
            .all(|q| q.contains(r#"uuid=~"1""#)));
        let t = &early[0];
        let late = AggregateDelta {
            row: t.row,
            counted_until: t.counted_until,
            to: 1600,
            seconds: 600,
            cpu_seconds: 1200.0,
            ..Default::default()
        };
        store.apply_aggregates(&[late], 1600).await.unwrap();
        let rows: Vec<(String, f64, Option<i64>)> = store
            .fetch_all(&Sql::new(
                "SELECT uuid, cpu_seconds, aggregates_until FROM units ORDER BY uuid",
            ))
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0).unwrap(), r.get(1).unwrap(), r.get(2).unwrap()))
            .collect();
        assert_eq!(rows[0], ("1".to_owned(), 1200.0, Some(1600)));
        assert_eq!(
            rows[1],
            ("2".to_owned(), 0.0, None),
            "job 2 was not asked for"
        );
    }
}
