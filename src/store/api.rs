//! The stats-server's JSON API under `/api/v1`, in CEEMS's envelope:
//! `{"status":"success","data":[…]}` or `{"status":"error","errorType":…,"error":…}`.
//!
//! The user is the value of a header that Grafana sets (`X-Grafana-User`). A user sees only
//! their own jobs and usage; the `/admin` routes are for the configured admins. Every value
//! from a request reaches SQL as a bound parameter; column names come from a fixed list.

use std::collections::BTreeMap;

use hyper::StatusCode;
use serde_json::{json, Map, Value};
use sqlx::Row;

use super::db::Store;
use super::unit_cache::{self, JobSpan, Rendered, UnitCache, UserSpans};

/// A field of `/units`: its name in the API, its SQL expression, and its type.
struct UnitField {
    name: &'static str,
    sql: &'static str,
}

#[derive(Clone, Copy)]
enum Col {
    Int,
    Real,
    Text,
}

const UNIT_FIELDS: &[UnitField] = &[
    UnitField { name: "cluster_id", sql: "cluster_id" },
    UnitField { name: "resource_manager", sql: "'slurm'" },
    UnitField { name: "uuid", sql: "uuid" },
    UnitField { name: "name", sql: "name" },
    UnitField { name: "project", sql: "project" },
    UnitField { name: "group", sql: "grp" },
    UnitField { name: "user", sql: "usr" },
    UnitField { name: "partition", sql: "partition" },
    UnitField { name: "qos", sql: "qos" },
    UnitField { name: "created_at_ts", sql: "submitted_at" },
    UnitField { name: "started_at_ts", sql: "NULLIF(started_at, 0)" },
    UnitField { name: "ended_at_ts", sql: "ended_at" },
    UnitField { name: "elapsed_seconds", sql: "elapsed_seconds" },
    UnitField { name: "state", sql: "state" },
    UnitField { name: "exit_code", sql: "exit_code" },
    UnitField { name: "alloc_cpus", sql: "alloc_cpus" },
    UnitField { name: "alloc_mem_bytes", sql: "alloc_mem_bytes" },
    UnitField { name: "alloc_gpus", sql: "alloc_gpus" },
    UnitField { name: "billing", sql: "billing" },
    UnitField { name: "nodes", sql: "nodes" },
    UnitField { name: "workdir", sql: "workdir" },
    UnitField { name: "total_cpu_seconds", sql: "cpu_seconds" },
    UnitField {
        name: "avg_cpu_usage",
        sql: "CASE WHEN alloc_cpus * aggregated_seconds > 0 THEN 100.0 * cpu_seconds / (alloc_cpus * aggregated_seconds) END" },
    UnitField { name: "avg_cpu_mem_usage_bytes", sql: "mean_memory_bytes" },
    UnitField { name: "avg_gpu_usage", sql: "100.0 * mean_gpu_utilization" },
    UnitField { name: "total_cpu_energy_usage_kwh", sql: "cpu_energy_joules / 3.6e6" },
    UnitField { name: "total_host_energy_usage_kwh", sql: "host_energy_joules / 3.6e6" },
    UnitField { name: "total_gpu_energy_usage_kwh", sql: "gpu_energy_joules / 3.6e6" },
    UnitField { name: "total_emissions_gms", sql: "emissions_grams" },
    UnitField { name: "total_io_read_bytes", sql: "io_read_bytes" },
    UnitField { name: "total_io_write_bytes", sql: "io_write_bytes" },
    UnitField { name: "aggregates_status", sql: "aggregates_status" },
    UnitField { name: "aggregates_updated_at_ts", sql: "aggregates_updated_at" },
    UnitField { name: "last_updated_at_ts", sql: "last_updated_at" },
    UnitField { name: "time_limit_seconds", sql: "time_limit_seconds" },
    UnitField { name: "memory_peak_bytes", sql: "memory_peak_bytes" },
    UnitField { name: "findings", sql: "json(coalesce(findings, '[]'))" },
];

/// The fields a `/units` request asks for, as a set over `UNIT_FIELDS` (rendered in that
/// order, each once).
#[derive(Clone, Copy)]
struct FieldSet(u64);

const _: () = assert!(UNIT_FIELDS.len() <= 64, "FieldSet holds one bit per field");

impl FieldSet {
    const ALL: FieldSet = FieldSet(u64::MAX >> (64 - UNIT_FIELDS.len()));

    fn parse(names: &[String]) -> Result<FieldSet, Answer> {
        if names.is_empty() {
            return Ok(FieldSet::ALL);
        }
        let mut set = 0u64;
        for name in names {
            let i = UNIT_FIELDS
                .iter()
                .position(|u| u.name == name)
                .ok_or_else(|| {
                    Answer::bad(format!(
                        "unknown field `{name}` (known: {})",
                        UNIT_FIELDS
                            .iter()
                            .map(|u| u.name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                })?;
            set |= 1 << i;
        }
        Ok(FieldSet(set))
    }

    /// `'name', expr, …` for SQLite's `json_object`.
    fn json_pairs(self) -> String {
        UNIT_FIELDS
            .iter()
            .enumerate()
            .filter(|(i, _)| self.0 & (1 << i) != 0)
            .map(|(_, f)| format!("'{}', {}", f.name, f.sql))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Jobs per `RENDER_CHUNK` rendered by one query, under SQLite's bound-variable limit.
const RENDER_CHUNK: usize = 4096;

/// Summed usage columns: name, column (the same in `units` and `usage`), and a scale.
const USAGE_SUMS: &[(&str, &str, &str)] = &[
    ("total_elapsed_seconds", "elapsed_seconds", ""),
    ("total_cpu_seconds", "cpu_seconds", ""),
    (
        "total_cpu_energy_usage_kwh",
        "cpu_energy_joules",
        " / 3.6e6",
    ),
    (
        "total_host_energy_usage_kwh",
        "host_energy_joules",
        " / 3.6e6",
    ),
    (
        "total_gpu_energy_usage_kwh",
        "gpu_energy_joules",
        " / 3.6e6",
    ),
    ("total_emissions_gms", "emissions_grams", ""),
    ("total_io_read_bytes", "io_read_bytes", ""),
    ("total_io_write_bytes", "io_write_bytes", ""),
];

/// Usage columns per group, over jobs (`units`) or over the pre-aggregated `usage` rows.
fn usage_columns(pre_aggregated: bool) -> Vec<(&'static str, String)> {
    let (count, cpu_time) = if pre_aggregated {
        ("sum(num_units)", "sum(alloc_cpu_seconds)")
    } else {
        ("count(*)", "sum(alloc_cpus * aggregated_seconds)")
    };
    let mut cols = vec![
        ("num_units", count.to_owned()),
        (
            "avg_cpu_usage",
            format!("100.0 * sum(cpu_seconds) / NULLIF({cpu_time}, 0)"),
        ),
    ];
    cols.extend(
        USAGE_SUMS
            .iter()
            .map(|(name, col, scale)| (*name, format!("sum({col}){scale}"))),
    );
    cols
}

/// Default window of `/units` and `/usage/current` when `from` is not given.
pub const DEFAULT_WINDOW_SECONDS: i64 = 24 * 3600;
/// Most rows one `/units` answer holds.
pub const MAX_UNITS: i64 = 100_000;

/// The start of a successful answer, up to its data.
const SUCCESS_HEAD: &str = r#"{"status":"success","data":"#;

/// An API answer: status and JSON body, shared (not copied) by the cache and the response.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: StatusCode,
    pub body: bytes::Bytes,
}

impl Answer {
    fn data(data: Value) -> Answer {
        Answer {
            status: StatusCode::OK,
            body: json!({"status": "success", "data": data})
                .to_string()
                .into(),
        }
    }

    /// `data` already serialized (by SQLite's JSON functions).
    fn raw_data(data: &str) -> Answer {
        let mut body = String::with_capacity(SUCCESS_HEAD.len() + data.len() + 1);
        body.push_str(SUCCESS_HEAD);
        body.push_str(data);
        Answer::success_body(body)
    }

    /// `body` is `SUCCESS_HEAD`, the data, and an open brace to close.
    fn success_body(mut body: String) -> Answer {
        body.push('}');
        Answer {
            status: StatusCode::OK,
            body: body.into(),
        }
    }

    pub fn error(status: StatusCode, kind: &str, message: impl Into<String>) -> Answer {
        Answer {
            status,
            body: json!({"status": "error", "errorType": kind, "error": message.into()})
                .to_string()
                .into(),
        }
    }

    /// The body as text (it is always JSON, so UTF-8).
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap_or_default()
    }

    /// The body parsed, for tests and tools.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    fn bad(message: impl Into<String>) -> Answer {
        Answer::error(StatusCode::BAD_REQUEST, "bad_data", message)
    }
}

/// Most answers kept, and most bytes in them; past either, the cache starts over.
const CACHE_ENTRIES: usize = 4096;
const CACHE_BYTES: usize = 64 << 20;

/// Answers by request, valid while the store's generation is unchanged: Grafana asks the same
/// questions at every refresh of every viewer's dashboard, and data changes only when the
/// update loop writes.
#[derive(Default)]
struct Cache {
    generation: u64,
    bytes: usize,
    answers: std::collections::HashMap<String, Answer>,
}

/// The API over a store.
pub struct Api {
    store: std::sync::Arc<Store>,
    pub user_header: String,
    cache: std::sync::Mutex<Cache>,
    units: UnitCache,
}

/// Query parameters, each possibly repeated.
#[derive(Debug, Default)]
pub struct Params(BTreeMap<String, Vec<String>>);

impl Params {
    pub fn parse(query: Option<&str>) -> Params {
        let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            m.entry(k.into_owned()).or_default().push(v.into_owned());
        }
        Params(m)
    }

    fn all(&self, key: &str) -> &[String] {
        self.0.get(key).map(Vec::as_slice).unwrap_or(&[])
    }

    fn one(&self, key: &str) -> Option<&str> {
        self.all(key).last().map(String::as_str)
    }

    fn time(&self, key: &str) -> Result<Option<i64>, Answer> {
        match self.one(key) {
            None | Some("") => Ok(None),
            Some(v) => v
                .parse::<i64>()
                .ok()
                .filter(|t| *t >= 0)
                .map(Some)
                .ok_or_else(|| {
                    Answer::bad(format!("`{key}`: `{v}` is not a unix time in seconds"))
                }),
        }
    }

    fn flag(&self, key: &str) -> Result<bool, Answer> {
        match self.one(key) {
            None => Ok(false),
            Some("" | "true" | "1") => Ok(true),
            Some("false" | "0") => Ok(false),
            Some(v) => Err(Answer::bad(format!("`{key}`: `{v}` is not true or false"))),
        }
    }

    /// Rejects parameters the route does not know, so a typo is not silently ignored.
    fn only(&self, known: &[&str]) -> Result<(), Answer> {
        match self.0.keys().find(|k| !known.contains(&k.as_str())) {
            Some(k) => Err(Answer::bad(format!(
                "unknown query parameter `{k}` (known: {})",
                known.join(", ")
            ))),
            None => Ok(()),
        }
    }
}

/// A value bound to a `?` of a query.
#[derive(Debug, Clone)]
enum Arg {
    Int(i64),
    Text(String),
}

impl From<i64> for Arg {
    fn from(v: i64) -> Arg {
        Arg::Int(v)
    }
}

impl From<&str> for Arg {
    fn from(v: &str) -> Arg {
        Arg::Text(v.to_owned())
    }
}

/// SQL text with `?` placeholders and the values bound to them, in order.
#[derive(Debug, Default)]
struct Sql {
    text: String,
    args: Vec<Arg>,
}

/// The end time of a job that has not ended, in the index `units_by_user_end` (migration 0005):
/// the query must spell the same expression for SQLite to search that index by range.
const OPEN_END: &str = "coalesce(ended_at, 9223372036854775807)";

impl Sql {
    fn new(text: &str) -> Sql {
        Sql {
            text: text.to_owned(),
            args: Vec::new(),
        }
    }

    fn push(&mut self, text: &str) -> &mut Sql {
        self.text.push_str(text);
        self
    }

    fn bind(&mut self, value: impl Into<Arg>) -> &mut Sql {
        self.text.push('?');
        self.args.push(value.into());
        self
    }

    /// ` AND col IN (?, ?, …)` with the values bound, or nothing for no values.
    fn push_in(&mut self, col: &str, values: &[String]) -> &mut Sql {
        if let Some((first, rest)) = values.split_first() {
            self.push(" AND ")
                .push(col)
                .push(" IN (")
                .bind(first.as_str());
            for v in rest {
                self.push(", ").bind(v.as_str());
            }
            self.push(")");
        }
        self
    }

    /// ` AND` jobs whose life overlaps `from`..`to`: ended after `from`, or still running, and
    /// started before `to`; with `running`, also every job still running whenever it started.
    fn push_overlap(&mut self, from: i64, to: i64, running: bool) -> &mut Sql {
        self.push(" AND ").push(OPEN_END).push(" >= ").bind(from);
        self.push(" AND (started_at <= ").bind(to);
        if running {
            self.push(" OR (ended_at IS NULL AND state = 'RUNNING')");
        }
        self.push(")")
    }
}

fn query_failed(e: impl std::fmt::Display) -> Answer {
    tracing::warn!(error = %e, "API query failed");
    Answer::error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "database query failed",
    )
}

/// Time window of a request: `[from, to]`, by default the last day.
fn window(p: &Params, now: i64) -> Result<(i64, i64), Answer> {
    let to = p.time("to")?.unwrap_or(now);
    let from = p.time("from")?.unwrap_or(to - DEFAULT_WINDOW_SECONDS);
    if from > to {
        return Err(Answer::bad(format!("`from` ({from}) is after `to` ({to})")));
    }
    Ok((from, to))
}

fn cell(row: &sqlx::sqlite::SqliteRow, i: usize, kind: Col) -> Value {
    match kind {
        Col::Int => row
            .try_get::<Option<i64>, _>(i)
            .ok()
            .flatten()
            .map_or(Value::Null, Value::from),
        Col::Real => row
            .try_get::<Option<f64>, _>(i)
            .ok()
            .flatten()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::Null, Value::Number),
        Col::Text => row
            .try_get::<Option<String>, _>(i)
            .ok()
            .flatten()
            .map_or(Value::Null, Value::from),
    }
}

impl Api {
    pub fn new(store: std::sync::Arc<Store>, user_header: &str) -> Api {
        Api {
            store,
            user_header: user_header.to_owned(),
            cache: Default::default(),
            units: Default::default(),
        }
    }

    fn cached(&self, key: &str) -> Option<Answer> {
        let cache = self.cache.lock().ok()?;
        if cache.generation != self.store.generation() {
            return None;
        }
        cache.answers.get(key).cloned()
    }

    fn remember(&self, key: String, generation: u64, answer: &Answer) {
        let Ok(mut cache) = self.cache.lock() else {
            return;
        };
        // A request that read before a write must not evict answers made after it.
        if generation < cache.generation {
            return;
        }
        let size = key.len() + answer.body.len();
        if cache.generation != generation
            || cache.answers.len() >= CACHE_ENTRIES
            || cache.bytes + size > CACHE_BYTES
        {
            *cache = Cache {
                generation,
                ..Default::default()
            };
        }
        if size <= CACHE_BYTES {
            cache.bytes += size;
            cache.answers.insert(key, answer.clone());
        }
    }

    /// Answers `GET path?query` for `user` (the header's value, if any) at time `now`.
    pub async fn handle(
        &self,
        path: &str,
        query: Option<&str>,
        user: Option<&str>,
        now: i64,
    ) -> Answer {
        let Some(route) = path.strip_prefix("/api/v1") else {
            return Answer::error(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no route {path}"),
            );
        };
        let route = route.trim_end_matches('/');
        if route == "/health" {
            return match self.store.integrity_ping().await {
                Ok(()) => Answer::data(json!("ok")),
                Err(e) => Answer::error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    e.to_string(),
                ),
            };
        }
        let user = match user.map(str::trim) {
            Some(u) if !u.is_empty() => u,
            _ => {
                return Answer::error(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    format!("no user: the request has no {} header", self.user_header),
                )
            }
        };
        let (route, admin_route) = match route.strip_suffix("/admin") {
            Some(r) => (r, true),
            None => (route, false),
        };
        // The default window ends at the next full minute, so that answers can be shared
        // for a minute.
        let now = now.div_euclid(60) * 60 + 60;
        // An admin route's answer is cached only for a user who was an admin at that
        // generation; the admin list is written through the store, which bumps it.
        let key = format!(
            "{user}\0{admin_route}\0{route}\0{}\0{now}",
            query.unwrap_or("")
        );
        if let Some(hit) = self.cached(&key) {
            return hit;
        }
        let generation = self.store.generation();
        if admin_route {
            match self.store.is_admin(user).await {
                Ok(true) => {}
                Ok(false) => {
                    return Answer::error(
                        StatusCode::FORBIDDEN,
                        "forbidden",
                        format!("{user} is not an admin"),
                    )
                }
                Err(e) => {
                    return Answer::error(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal",
                        e.to_string(),
                    )
                }
            }
        }
        let p = Params::parse(query);
        let scope = if admin_route { None } else { Some(user) };
        let result = match route {
            "/units" => self.units(&p, scope, now).await,
            "/usage/current" => self.usage_current(&p, scope, now).await,
            "/usage/global" => self.usage_global(&p, scope).await,
            "/projects" => self.projects(&p, scope).await,
            "/users" => self.users(&p, scope).await,
            "/clusters" if admin_route => self.clusters(&p).await,
            "/findings" if admin_route => self.findings_summary(&p, now).await,
            r if r.starts_with("/units/") && r.ends_with("/findings") && !admin_route => {
                let ids = &r["/units/".len()..r.len() - "/findings".len()];
                match ids.split_once('/') {
                    Some((cluster, job)) => self.job_findings(cluster, job, user).await,
                    None => Err(Answer::bad("expected /units/{cluster}/{jobid}/findings")),
                }
            }
            _ => Err(Answer::error(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no route {path}"),
            )),
        };
        let answer = result.unwrap_or_else(|a| a);
        if answer.status == StatusCode::OK {
            self.remember(key, generation, &answer);
        }
        answer
    }

    async fn fetch(&self, sql: Sql) -> Result<Vec<sqlx::sqlite::SqliteRow>, Answer> {
        let mut q = sqlx::query(&sql.text);
        for arg in &sql.args {
            q = match arg {
                Arg::Int(v) => q.bind(*v),
                Arg::Text(v) => q.bind(v.as_str()),
            };
        }
        q.fetch_all(self.store.pool()).await.map_err(query_failed)
    }

    /// A user's jobs as spans, from the cache or read once per generation.
    async fn user_spans(&self, generation: u64, user: &str) -> Result<UserSpans, Answer> {
        if let Some(spans) = self.units.spans(generation, user) {
            return Ok(spans);
        }
        let mut q = Sql::new("SELECT id, started_at, ");
        q.push(OPEN_END)
            .push(", ended_at IS NULL AND state = 'RUNNING' FROM units WHERE usr = ")
            .bind(user)
            .push(" LIMIT ")
            .bind(unit_cache::MAX_SPANS_PER_USER as i64 + 1);
        let rows = self.fetch(q).await?;
        let spans = if rows.len() > unit_cache::MAX_SPANS_PER_USER {
            UserSpans::TooMany
        } else {
            // A row that cannot be read is an error, not a job left out of every answer.
            let spans: Result<Vec<JobSpan>, sqlx::Error> = rows
                .iter()
                .map(|r| {
                    Ok(JobSpan {
                        id: r.try_get(0)?,
                        started_at: r.try_get(1)?,
                        ended_at: r.try_get(2)?,
                        running: r.try_get(3)?,
                    })
                })
                .collect();
            UserSpans::Kept(spans.map_err(query_failed)?.into())
        };
        self.units.keep_spans(generation, user, spans.clone());
        Ok(spans)
    }

    /// The ids of the jobs of `users` in the window, from their spans; `None` where a user
    /// has too many jobs to keep.
    async fn ids_from_spans(
        &self,
        generation: u64,
        users: &[String],
        (from, to): (i64, i64),
        running: bool,
    ) -> Result<Option<Vec<i64>>, Answer> {
        let mut all = Vec::with_capacity(users.len());
        for user in users {
            match self.user_spans(generation, user).await? {
                UserSpans::Kept(spans) => all.push(spans),
                UserSpans::TooMany => return Ok(None),
            }
        }
        Ok(Some(unit_cache::select(
            all.iter().flat_map(|s| s.iter()),
            from,
            to,
            running,
            MAX_UNITS as usize,
        )))
    }

    async fn units(&self, p: &Params, scope: Option<&str>, now: i64) -> Result<Answer, Answer> {
        p.only(&[
            "uuid",
            "project",
            "cluster_id",
            "running",
            "from",
            "to",
            "field",
            "user",
        ])?;
        if scope.is_some() && !p.all("user").is_empty() {
            return Err(Answer::bad("`user` is for /units/admin"));
        }
        let fields = FieldSet::parse(p.all("field"))?;
        let (from, to) = window(p, now)?;
        let running = p.flag("running")?;
        // Read before the query: rows rendered from data newer than this are dropped with it.
        let generation = self.store.generation();
        let mut users: Vec<String> = match scope {
            Some(u) => vec![u.to_owned()],
            None => p.all("user").to_vec(),
        };
        users.sort_unstable();
        users.dedup();
        let by_user_only = !users.is_empty()
            && ["uuid", "project", "cluster_id"]
                .iter()
                .all(|k| p.all(k).is_empty());
        let spans = match by_user_only {
            true => {
                self.ids_from_spans(generation, &users, (from, to), running)
                    .await?
            }
            false => None,
        };
        let ids = match spans {
            Some(ids) => ids,
            None => {
                let mut q = Sql::new(
                    "SELECT group_concat(id, ',' ORDER BY started_at DESC, id DESC) \
                     FROM (SELECT id, started_at FROM units WHERE 1 = 1",
                );
                q.push_in("usr", &users)
                    .push_in("uuid", p.all("uuid"))
                    .push_in("project", p.all("project"))
                    .push_in("cluster_id", p.all("cluster_id"))
                    .push_overlap(from, to, running)
                    .push(" ORDER BY started_at DESC, id DESC LIMIT ")
                    .bind(MAX_UNITS)
                    .push(")");
                // The ids in one row: sqlx hands each row over from its thread on its own.
                self.fetch(q)
                    .await?
                    .first()
                    .and_then(|r| r.try_get::<Option<String>, _>(0).ok().flatten())
                    .map(|list| list.split(',').filter_map(|id| id.parse().ok()).collect())
                    .unwrap_or_default()
            }
        };
        if let Some(body) = self.units.answer(generation, fields.0, &ids) {
            return Ok(Answer {
                status: StatusCode::OK,
                body,
            });
        }
        let mut rendered = self.units.rows(generation, fields.0, &ids);
        let missing: Vec<i64> = ids
            .iter()
            .zip(&rendered)
            .filter(|(_, json)| json.is_none())
            .map(|(id, _)| *id)
            .collect();
        let mut fresh = std::collections::HashMap::with_capacity(missing.len());
        for chunk in missing.chunks(RENDER_CHUNK) {
            let mut q = Sql::new("SELECT id, json_object(");
            q.push(&fields.json_pairs())
                .push(") FROM units WHERE id IN (");
            for (i, id) in chunk.iter().enumerate() {
                q.push(if i == 0 { "" } else { ", " }).bind(*id);
            }
            q.push(")");
            for row in self.fetch(q).await? {
                if let (Ok(id), Ok(json)) = (row.try_get::<i64, _>(0), row.try_get::<String, _>(1))
                {
                    fresh.insert(id, Rendered::from(json));
                }
            }
        }
        for (id, json) in ids.iter().zip(rendered.iter_mut()) {
            if json.is_none() {
                // A job deleted between the two queries (retention) is left out.
                *json = fresh.get(id).cloned();
            }
        }
        let mut body = String::with_capacity(
            SUCCESS_HEAD.len()
                + 3
                + rendered
                    .iter()
                    .flatten()
                    .map(|j| j.len() + 1)
                    .sum::<usize>(),
        );
        body.push_str(SUCCESS_HEAD);
        body.push('[');
        for (i, json) in rendered.iter().flatten().enumerate() {
            if i > 0 {
                body.push(',');
            }
            body.push_str(json);
        }
        body.push(']');
        let answer = Answer::success_body(body);
        self.units
            .keep_answer(generation, fields.0, &fresh, ids, &answer.body);
        Ok(answer)
    }

    /// `groupby`: `user` and/or `project` (default both), always within a cluster.
    fn group_columns(p: &Params) -> Result<Vec<(&'static str, &'static str)>, Answer> {
        let wanted = p.all("groupby");
        let mut cols = vec![("cluster_id", "cluster_id")];
        if wanted.is_empty() {
            cols.extend([("project", "project"), ("user", "usr")]);
            return Ok(cols);
        }
        for g in wanted {
            match g.as_str() {
                "project" => cols.push(("project", "project")),
                "user" => cols.push(("user", "usr")),
                other => {
                    return Err(Answer::bad(format!(
                        "`groupby`: `{other}` is not user or project"
                    )))
                }
            }
        }
        Ok(cols)
    }

    fn usage_rows(
        rows: &[sqlx::sqlite::SqliteRow],
        groups: &[(&str, &str)],
        sums: &[(&str, String)],
    ) -> Value {
        Value::Array(
            rows.iter()
                .map(|r| {
                    let mut m = Map::new();
                    for (i, (name, _)) in groups.iter().enumerate() {
                        m.insert((*name).to_owned(), cell(r, i, Col::Text));
                    }
                    for (j, (name, _)) in sums.iter().enumerate() {
                        let kind = if *name == "num_units" || *name == "total_elapsed_seconds" {
                            Col::Int
                        } else {
                            Col::Real
                        };
                        m.insert((*name).to_owned(), cell(r, groups.len() + j, kind));
                    }
                    Value::Object(m)
                })
                .collect(),
        )
    }

    async fn usage_current(
        &self,
        p: &Params,
        scope: Option<&str>,
        now: i64,
    ) -> Result<Answer, Answer> {
        p.only(&["from", "to", "cluster_id", "project", "user", "groupby"])?;
        let window = window(p, now)?;
        self.usage(p, scope, "/usage/current", Some(window)).await
    }

    async fn usage_global(&self, p: &Params, scope: Option<&str>) -> Result<Answer, Answer> {
        p.only(&["cluster_id", "project", "user", "groupby"])?;
        self.usage(p, scope, "/usage/global", None).await
    }

    /// Usage sums per group: over the jobs that overlap `window`, or, without one, over the
    /// pre-aggregated `usage` table (all time).
    async fn usage(
        &self,
        p: &Params,
        scope: Option<&str>,
        route: &str,
        window: Option<(i64, i64)>,
    ) -> Result<Answer, Answer> {
        if scope.is_some() && !p.all("user").is_empty() {
            return Err(Answer::bad(format!("`user` is for {route}/admin")));
        }
        let groups = Self::group_columns(p)?;
        let cols: Vec<&str> = groups.iter().map(|g| g.1).collect();
        let mut q = Sql::new("SELECT ");
        q.push(&cols.join(", "));
        let sums = usage_columns(window.is_none());
        for (_, sql) in &sums {
            q.push(", ").push(sql);
        }
        q.push(match window {
            Some(_) => " FROM units WHERE started_at > 0",
            None => " FROM usage WHERE 1 = 1",
        });
        let users: Vec<String> = scope
            .map(|u| vec![u.to_owned()])
            .unwrap_or_else(|| p.all("user").to_vec());
        q.push_in("usr", &users)
            .push_in("project", p.all("project"))
            .push_in("cluster_id", p.all("cluster_id"));
        if let Some((from, to)) = window {
            q.push_overlap(from, to, false);
        }
        q.push(&format!(
            " GROUP BY {} ORDER BY {}",
            cols.join(", "),
            cols.join(", ")
        ));
        let rows = self.fetch(q).await?;
        Ok(Answer::data(Self::usage_rows(&rows, &groups, &sums)))
    }

    /// Projects with their members; a user gets only their own projects, and only themselves
    /// as a member.
    async fn projects(&self, p: &Params, scope: Option<&str>) -> Result<Answer, Answer> {
        p.only(&["cluster_id", "project"])?;
        let mut q = Sql::new(
            "SELECT p.cluster_id, p.name, a.usr FROM projects p
             LEFT JOIN associations a ON a.cluster_id = p.cluster_id AND a.project = p.name
             WHERE 1 = 1",
        );
        if let Some(u) = scope {
            q.push(" AND a.usr = ").bind(u);
        }
        q.push_in("p.cluster_id", p.all("cluster_id"))
            .push_in("p.name", p.all("project"))
            .push(" ORDER BY p.cluster_id, p.name, a.usr");
        let rows = self.fetch(q).await?;
        Ok(Answer::data(grouped(&rows, "name", "users")))
    }

    /// Users with their projects; a user gets only their own record.
    async fn users(&self, p: &Params, scope: Option<&str>) -> Result<Answer, Answer> {
        p.only(&["cluster_id", "user"])?;
        if scope.is_some() && !p.all("user").is_empty() {
            return Err(Answer::bad("`user` is for /users/admin"));
        }
        let mut q = Sql::new(
            "SELECT u.cluster_id, u.name, a.project FROM users u
             LEFT JOIN associations a ON a.cluster_id = u.cluster_id AND a.usr = u.name
             WHERE 1 = 1",
        );
        let users: Vec<String> = scope
            .map(|u| vec![u.to_owned()])
            .unwrap_or_else(|| p.all("user").to_vec());
        q.push_in("u.name", &users)
            .push_in("u.cluster_id", p.all("cluster_id"))
            .push(" ORDER BY u.cluster_id, u.name, a.project");
        let rows = self.fetch(q).await?;
        Ok(Answer::data(grouped(&rows, "name", "projects")))
    }

    /// The job `cluster`/`job` (its latest run, should the id have been reused) if `user`
    /// owns it or is an admin: 400 for a non-numeric id, 404 when unknown, 403 otherwise.
    pub async fn authorize_job(&self, cluster: &str, job: &str, user: &str) -> Result<i64, Answer> {
        if job.is_empty() || !job.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Answer::bad(format!("job id `{job}` is not a number")));
        }
        let row = sqlx::query(
            "SELECT id, usr FROM units WHERE cluster_id = ?1 AND uuid = ?2
             ORDER BY started_at DESC LIMIT 1",
        )
        .bind(cluster)
        .bind(job)
        .fetch_optional(self.store.pool())
        .await
        .map_err(|e| Answer::error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
        let Some(row) = row else {
            return Err(Answer::error(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no job {job} on cluster {cluster}"),
            ));
        };
        let owner: String = row.get(1);
        if owner != user && !self.store.is_admin(user).await.unwrap_or(false) {
            return Err(Answer::error(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("job {job} is not {user}'s"),
            ));
        }
        Ok(row.get(0))
    }

    /// Every unit field of the row `id`, as a JSON object.
    pub async fn unit(&self, id: i64) -> Result<Value, Answer> {
        let mut q = Sql::new("SELECT json_object(");
        q.push(&FieldSet::ALL.json_pairs())
            .push(") FROM units WHERE id = ")
            .bind(id);
        let rows = self.fetch(q).await?;
        let json: String = rows
            .first()
            .and_then(|r| r.try_get(0).ok())
            .unwrap_or_else(|| "null".to_owned());
        serde_json::from_str(&json).map_err(|e| {
            Answer::error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })
    }

    async fn job_findings(&self, cluster: &str, job: &str, user: &str) -> Result<Answer, Answer> {
        let row = self.authorize_job(cluster, job, user).await?;
        let mut q = Sql::new(
            "SELECT json_object('cluster_id', cluster_id, 'uuid', uuid, 'user', usr,
                'findings', json(coalesce(findings, '[]'))) FROM units WHERE id = ",
        );
        q.bind(row);
        let rows = self.fetch(q).await?;
        let json: String = rows
            .first()
            .and_then(|r| r.try_get(0).ok())
            .unwrap_or_else(|| "null".to_owned());
        Ok(Answer::raw_data(&json))
    }

    /// The most frequent findings per project over jobs that ended in the window.
    async fn findings_summary(&self, p: &Params, now: i64) -> Result<Answer, Answer> {
        p.only(&["from", "to", "cluster_id", "project"])?;
        let (from, to) = window(p, now)?;
        let mut q = Sql::new(
            "SELECT cluster_id, project, json_extract(f.value, '$.id') AS finding, count(*) AS n,
                    count(DISTINCT usr)
             FROM units, json_each(units.findings) AS f
             WHERE findings IS NOT NULL AND ended_at >= ",
        );
        q.bind(from)
            .push(" AND ended_at <= ")
            .bind(to)
            .push_in("cluster_id", p.all("cluster_id"))
            .push_in("project", p.all("project"))
            .push(" GROUP BY cluster_id, project, finding ORDER BY n DESC, cluster_id, project, finding LIMIT 1000");
        let rows = self.fetch(q).await?;
        let data: Vec<Value> = rows
            .iter()
            .map(|r| {
                json!({
                    "cluster_id": cell(r, 0, Col::Text),
                    "project": cell(r, 1, Col::Text),
                    "finding": cell(r, 2, Col::Text),
                    "num_units": cell(r, 3, Col::Int),
                    "num_users": cell(r, 4, Col::Int),
                })
            })
            .collect();
        Ok(Answer::data(Value::Array(data)))
    }

    async fn clusters(&self, p: &Params) -> Result<Answer, Answer> {
        p.only(&[])?;
        let q = Sql::new(
            "SELECT u.cluster_id, count(*), min(NULLIF(u.started_at, 0)), max(u.last_updated_at),
                    (SELECT window_start FROM ingest_state s WHERE s.cluster_id = u.cluster_id)
             FROM units u GROUP BY u.cluster_id ORDER BY u.cluster_id",
        );
        let rows = self.fetch(q).await?;
        let data: Vec<Value> = rows
            .iter()
            .map(|r| {
                json!({
                    "id": cell(r, 0, Col::Text),
                    "manager": "slurm",
                    "num_units": cell(r, 1, Col::Int),
                    "first_started_at_ts": cell(r, 2, Col::Int),
                    "last_updated_at_ts": cell(r, 3, Col::Int),
                    "next_window_start_ts": cell(r, 4, Col::Int),
                })
            })
            .collect();
        Ok(Answer::data(Value::Array(data)))
    }
}

/// Rows of (cluster, name, member) → `[{cluster_id, name, <members>: [...]}]`.
fn grouped(rows: &[sqlx::sqlite::SqliteRow], name: &str, members: &str) -> Value {
    let mut out: Vec<Value> = Vec::new();
    let mut last: Option<(String, String)> = None;
    for r in rows {
        let cluster: String = r.try_get(0).unwrap_or_default();
        let n: String = r.try_get(1).unwrap_or_default();
        let member: Option<String> = r.try_get(2).ok().flatten();
        if last.as_ref() != Some(&(cluster.clone(), n.clone())) {
            out.push(json!({"cluster_id": cluster, name: n, members: []}));
            last = Some((cluster, n));
        }
        if let (Some(m), Some(Value::Array(list))) =
            (member, out.last_mut().and_then(|o| o.get_mut(members)))
        {
            list.push(Value::from(m));
        }
    }
    Value::Array(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::store::sacct::{self, Associations};
    use std::sync::Arc;

    pub(crate) const NOW: i64 = 1_800_000_000;

    pub(crate) fn line(id: u32, user: &str, project: &str, start: i64, end: Option<i64>) -> String {
        let (end, state) = match end {
            Some(e) => (e.to_string(), "COMPLETED"),
            None => ("Unknown".to_owned(), "RUNNING"),
        };
        format!("{id}|debug|normal|{project}|{user}|100|{user}|100|{start}|{start}|{end}|00:10:00|600|0:0|{state}|billing=1,cpu=2,mem=1G,node=1|localhost|/tmp|60|job {id}")
    }

    pub(crate) async fn api_with(lines: &[String], admins: &[&str]) -> (Api, tempfile::TempDir) {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(&tmp.path().join("ceems.db")).await.unwrap();
        let (jobs, errors) = sacct::parse_output(&lines.join("\n"));
        assert!(errors.is_empty(), "{errors:?}");
        store.ingest("lab", &jobs, 0, NOW).await.unwrap();
        let mut assoc = Associations::default();
        for j in &jobs {
            if !assoc.projects.contains(&j.account) {
                assoc.projects.push(j.account.clone());
            }
            let m = (j.user.clone(), j.account.clone());
            if !assoc.members.contains(&m) {
                assoc.members.push(m);
            }
        }
        store
            .replace_associations("lab", &assoc, NOW)
            .await
            .unwrap();
        store.rebuild_usage("lab", NOW).await.unwrap();
        store
            .refresh_findings("lab", &crate::store::findings::Thresholds::default(), NOW)
            .await
            .unwrap();
        store
            .set_admins(
                "config",
                &admins.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            )
            .await
            .unwrap();
        (Api::new(Arc::new(store), "X-Grafana-User"), tmp)
    }

    fn data(a: &Answer) -> Vec<Value> {
        assert_eq!(a.status, StatusCode::OK, "{}", a.text());
        a.json()["data"].as_array().expect("data array").clone()
    }

    fn sample() -> Vec<String> {
        vec![
            line(1, "alice", "physics", NOW - 3600, Some(NOW - 600)),
            line(2, "bob", "chemistry", NOW - 3600, None),
            line(
                3,
                "alice",
                "physics",
                NOW - 10 * 86400,
                Some(NOW - 9 * 86400),
            ),
        ]
    }

    #[tokio::test]
    async fn who_gets_what_on_every_route() {
        let (api, _tmp) = api_with(&sample(), &["root"]).await;
        let user_routes = [
            "/units",
            "/usage/current",
            "/usage/global",
            "/projects",
            "/users",
        ];
        let admin_routes = [
            "/units/admin",
            "/usage/current/admin",
            "/usage/global/admin",
            "/projects/admin",
            "/users/admin",
            "/clusters/admin",
            "/findings/admin",
        ];
        for route in user_routes.iter().chain(&admin_routes) {
            let path = format!("/api/v1{route}");
            let none = api.handle(&path, None, None, NOW).await;
            assert_eq!(
                none.status,
                StatusCode::UNAUTHORIZED,
                "{route} without a user"
            );
            assert_eq!(none.json()["errorType"], "unauthorized");
            let empty = api.handle(&path, None, Some(" "), NOW).await;
            assert_eq!(
                empty.status,
                StatusCode::UNAUTHORIZED,
                "{route} with an empty user"
            );
            let alice = api.handle(&path, None, Some("alice"), NOW).await;
            let expected = if admin_routes.contains(route) {
                StatusCode::FORBIDDEN
            } else {
                StatusCode::OK
            };
            assert_eq!(alice.status, expected, "{route} as alice: {}", alice.text());
            let root = api.handle(&path, None, Some("root"), NOW).await;
            assert_eq!(
                root.status,
                StatusCode::OK,
                "{route} as root: {}",
                root.text()
            );
            assert_eq!(root.json()["status"], "success");
        }
        let health = api.handle("/api/v1/health", None, None, NOW).await;
        assert_eq!(
            (health.status, &health.json()["data"]),
            (StatusCode::OK, &json!("ok"))
        );
        assert_eq!(
            api.handle("/api/v1/nope", None, Some("alice"), NOW)
                .await
                .status,
            StatusCode::NOT_FOUND
        );
    }

    #[tokio::test]
    async fn findings_of_a_job_for_its_owner_and_admins_and_per_project_for_admins() {
        let mut lines = sample();
        lines[0] = lines[0].replace("COMPLETED", "TIMEOUT");
        let (api, _tmp) = api_with(&lines, &["root"]).await;
        let get = |path: &'static str, user: Option<&'static str>| {
            let api = &api;
            let (path, query) = match path.split_once('?') {
                Some((p, q)) => (p, Some(q)),
                None => (path, None),
            };
            async move { api.handle(path, query, user, NOW).await }
        };
        let own = get("/api/v1/units/lab/1/findings", Some("alice")).await;
        assert_eq!(own.status, StatusCode::OK, "{}", own.text());
        let f = &own.json()["data"];
        assert_eq!((&f["uuid"], &f["user"]), (&json!("1"), &json!("alice")));
        assert_eq!(f["findings"][0]["id"], "job_failed");
        assert!(f["findings"][0]["message"]
            .as_str()
            .unwrap()
            .contains("TIMEOUT"));
        assert!(f["findings"][0]["advice"]
            .as_str()
            .unwrap()
            .contains("--time"));
        for (path, user, status) in [
            ("/api/v1/units/lab/1/findings", Some("root"), StatusCode::OK),
            (
                "/api/v1/units/lab/1/findings",
                Some("bob"),
                StatusCode::FORBIDDEN,
            ),
            (
                "/api/v1/units/lab/1/findings",
                None,
                StatusCode::UNAUTHORIZED,
            ),
            (
                "/api/v1/units/lab/x1/findings",
                Some("alice"),
                StatusCode::BAD_REQUEST,
            ),
            (
                "/api/v1/units/lab/42/findings",
                Some("alice"),
                StatusCode::NOT_FOUND,
            ),
            (
                "/api/v1/units/1/findings",
                Some("alice"),
                StatusCode::BAD_REQUEST,
            ),
        ] {
            let a = get(path, user).await;
            assert_eq!(a.status, status, "{path} as {user:?}: {}", a.text());
        }
        // The `findings` field on /units.
        let units = get("/api/v1/units?field=uuid&field=findings", Some("alice")).await;
        assert_eq!(data(&units)[0]["findings"][0]["id"], "job_failed");
        // The admin summary counts finding ids per project.
        let summary = get("/api/v1/findings/admin", Some("root")).await;
        assert_eq!(
            data(&summary),
            [
                json!({"cluster_id": "lab", "project": "physics", "finding": "job_failed", "num_units": 1, "num_users": 1})
            ]
        );
    }

    #[tokio::test]
    async fn units_filter_by_window_and_fields_and_reject_bad_parameters() {
        let (api, _tmp) = api_with(&sample(), &["root"]).await;
        // Default window (the last day): job 1 only for alice; job 3 ended 9 days ago.
        let a = api.handle("/api/v1/units", None, Some("alice"), NOW).await;
        let uuids: Vec<Value> = data(&a).iter().map(|u| u["uuid"].clone()).collect();
        assert_eq!(uuids, [json!("1")]);
        assert_eq!(data(&a)[0]["alloc_cpus"], 2);
        assert_eq!(data(&a)[0]["user"], "alice");
        let from = (NOW - 11 * 86400).to_string();
        let a = api
            .handle(
                "/api/v1/units",
                Some(&format!("from={from}&field=uuid&field=state")),
                Some("alice"),
                NOW,
            )
            .await;
        assert_eq!(data(&a).len(), 2);
        assert_eq!(data(&a)[1], json!({"uuid": "3", "state": "COMPLETED"}));
        // Admin: any user's, filtered by user.
        let a = api
            .handle(
                "/api/v1/units/admin",
                Some("user=bob&running"),
                Some("root"),
                NOW,
            )
            .await;
        assert_eq!(data(&a).len(), 1);
        assert_eq!(data(&a)[0]["uuid"], "2");

        for (query, says) in [
            ("from=yesterday", "not a unix time"),
            ("from=-5", "not a unix time"),
            ("field=password", "unknown field `password`"),
            ("from=20&to=10", "is after"),
            ("running=maybe", "not true or false"),
            ("sort=uuid", "unknown query parameter `sort`"),
            ("user=bob", "/units/admin"),
        ] {
            let a = api
                .handle("/api/v1/units", Some(query), Some("alice"), NOW)
                .await;
            assert_eq!(a.status, StatusCode::BAD_REQUEST, "{query}");
            assert_eq!(a.json()["errorType"], "bad_data");
            assert!(
                a.json()["error"].as_str().unwrap().contains(says),
                "{query}: {}",
                a.text()
            );
        }
        // A quote in a value is data, not SQL.
        let a = api
            .handle(
                "/api/v1/units",
                Some("project=%27%20OR%20%271%27%3D%271"),
                Some("alice"),
                NOW,
            )
            .await;
        assert!(data(&a).is_empty());
    }

    #[tokio::test]
    async fn usage_sums_jobs_per_project_and_user() {
        let (api, _tmp) = api_with(&sample(), &["root"]).await;
        let a = api
            .handle("/api/v1/usage/global", None, Some("alice"), NOW)
            .await;
        assert_eq!(data(&a).len(), 1);
        assert_eq!(data(&a)[0]["num_units"], 2);
        assert_eq!(data(&a)[0]["project"], "physics");
        let a = api
            .handle(
                "/api/v1/usage/global/admin",
                Some("groupby=project"),
                Some("root"),
                NOW,
            )
            .await;
        let projects: Vec<Value> = data(&a).iter().map(|u| u["project"].clone()).collect();
        assert_eq!(projects, [json!("chemistry"), json!("physics")]);
        assert!(data(&a)[0].get("user").is_none());
        let a = api
            .handle("/api/v1/usage/current", None, Some("alice"), NOW)
            .await;
        assert_eq!(data(&a)[0]["num_units"], 1);
        let a = api
            .handle(
                "/api/v1/usage/current",
                Some("groupby=node"),
                Some("alice"),
                NOW,
            )
            .await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST);
        let a = api
            .handle("/api/v1/projects", None, Some("alice"), NOW)
            .await;
        assert_eq!(
            data(&a),
            vec![json!({"cluster_id": "lab", "name": "physics", "users": ["alice"]})]
        );
    }

    #[tokio::test]
    async fn cached_answers_end_with_the_next_write() {
        let (api, _tmp) = api_with(&sample(), &["root"]).await;
        let first = api.handle("/api/v1/units", None, Some("alice"), NOW).await;
        assert_eq!(data(&first).len(), 1);
        // Within the same minute the answer comes from the cache; a new job is a write.
        let (jobs, _) = sacct::parse_output(&line(9, "alice", "physics", NOW - 60, None));
        api.store.ingest("lab", &jobs, 0, NOW).await.unwrap();
        let second = api
            .handle("/api/v1/units", None, Some("alice"), NOW + 1)
            .await;
        assert_eq!(data(&second).len(), 2, "a stale answer was served");
        // Another user never gets alice's cached answer.
        let bob = api
            .handle("/api/v1/units", None, Some("bob"), NOW + 1)
            .await;
        assert!(data(&bob).iter().all(|u| u["user"] == "bob"));
        // Nor a non-admin an admin's.
        assert_eq!(
            api.handle("/api/v1/units/admin", None, Some("root"), NOW)
                .await
                .status,
            StatusCode::OK
        );
        assert_eq!(
            api.handle("/api/v1/units/admin", None, Some("alice"), NOW)
                .await
                .status,
            StatusCode::FORBIDDEN
        );
    }

    /// An answer read before a write, and kept after a newer one, neither stands nor evicts it.
    #[tokio::test]
    async fn a_late_answer_from_before_a_write_does_not_evict_newer_ones() {
        let (api, _tmp) = api_with(&sample(), &[]).await;
        let answer = |text: &'static str| Answer {
            status: StatusCode::OK,
            body: bytes::Bytes::from_static(text.as_bytes()),
        };
        api.remember("new".into(), 2, &answer("new"));
        api.remember("old".into(), 1, &answer("old"));
        let cache = api.cache.lock().unwrap();
        assert_eq!(cache.generation, 2);
        assert_eq!(cache.answers.get("new"), Some(&answer("new")));
        assert!(!cache.answers.contains_key("old"));
    }

    /// A job's rendering is shared by requests for other windows and field sets only while
    /// nothing was written: a job that ended since is shown ended, whatever the window.
    #[tokio::test]
    async fn rendered_jobs_are_reused_across_windows_only_until_a_write() {
        let (api, _tmp) = api_with(&sample(), &["root"]).await;
        let units = |from: i64, fields: &str| {
            let query = format!("from={from}{fields}");
            let api = &api;
            async move {
                data(
                    &api.handle("/api/v1/units", Some(&query), Some("bob"), NOW)
                        .await,
                )
            }
        };
        let running = units(NOW - 7200, "").await;
        assert_eq!(running.len(), 1);
        assert_eq!(running[0]["state"], "RUNNING");
        assert_eq!(running[0]["ended_at_ts"], Value::Null);
        assert_eq!(running[0].as_object().unwrap().len(), UNIT_FIELDS.len());
        // The same job for another window, then with one field: each set of fields its own.
        let one_field = units(NOW - 7201, "&field=uuid").await;
        assert_eq!(one_field, vec![json!({"uuid": "2"})]);
        assert_eq!(units(NOW - 7202, "").await, running);
        // The job ends: the next answer, for yet another window, says so.
        let (jobs, _) =
            sacct::parse_output(&line(2, "bob", "chemistry", NOW - 3600, Some(NOW - 60)));
        api.store.ingest("lab", &jobs, 0, NOW).await.unwrap();
        let ended = units(NOW - 7203, "").await;
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0]["state"], "COMPLETED");
        assert_eq!(ended[0]["ended_at_ts"], NOW - 60);
    }

    /// A user's window in SQL is one range of the index `units_by_user_end`: were the query
    /// and the index to spell the end differently, every request with a filter besides the
    /// user would read all of the user's jobs.
    #[tokio::test]
    async fn a_users_window_is_searched_as_a_range_of_the_index() {
        let (api, _tmp) = api_with(&sample(), &[]).await;
        let mut q = Sql::new("EXPLAIN QUERY PLAN SELECT id, started_at FROM units WHERE 1 = 1");
        q.push_in("usr", &["alice".to_owned()])
            .push_overlap(NOW - 86400, NOW, false);
        let plan: Vec<String> = api
            .fetch(q)
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<String, _>(3))
            .collect();
        assert!(
            plan.iter()
                .any(|p| p.contains("INDEX units_by_user_end (usr=? AND <expr>>?)")),
            "{plan:?}"
        );
    }

    /// Every query of the example dashboard is a route that answers, with the columns it reads.
    #[tokio::test]
    async fn the_example_grafana_dashboard_reads_fields_the_api_has() {
        let (api, _tmp) = api_with(&sample(), &["root"]).await;
        let dashboard: Value = serde_json::from_str(include_str!(
            "../../examples/grafana/dashboards/ceems-my-jobs.json"
        ))
        .unwrap();
        let datasource =
            include_str!("../../examples/grafana/provisioning/datasources/ceems-api.yml");
        assert!(datasource.contains("httpHeaderName1: X-Grafana-User"));
        assert!(datasource.contains("httpHeaderValue1: ${__user.login}"));
        let mut checked = 0;
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().unwrap() {
                let url = target["url"].as_str().unwrap();
                let path = &url[url.find("/api/").unwrap()..];
                let query: Vec<String> = target["url_options"]["params"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| {
                        let v = match p["value"].as_str().unwrap() {
                            "${__from:date:seconds}" => (NOW - 7 * 86400).to_string(),
                            "${__to:date:seconds}" => NOW.to_string(),
                            v => v.to_owned(),
                        };
                        format!("{}={v}", p["key"].as_str().unwrap())
                    })
                    .collect();
                let a = api
                    .handle(path, Some(&query.join("&")), Some("alice"), NOW)
                    .await;
                let rows = data(&a);
                assert!(!rows.is_empty(), "{path}?{query:?}: no rows");
                for col in target["columns"].as_array().unwrap() {
                    let sel = col["selector"].as_str().unwrap();
                    assert!(
                        rows[0].get(sel).is_some(),
                        "panel {}: no field {sel} in {path}",
                        panel["title"]
                    );
                }
                checked += 1;
            }
        }
        assert_eq!(checked, 6);
    }

    mod no_leaks {
        use super::*;
        use proptest::prelude::*;

        const USERS: &[&str] = &["alice", "bob", "carol", "dave"];
        const PROJECTS: &[&str] = &["physics", "chemistry", "biology"];

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(24))]
            /// Whatever the jobs and whatever a user asks for, a non-admin's answers name no
            /// other user and hold no other user's job.
            #[test]
            fn a_user_never_sees_another_users_jobs(
                jobs in proptest::collection::vec((0usize..4, 0usize..3, 0i64..20, proptest::option::of(1i64..10)), 1..40),
                asker in 0usize..4,
            ) {
                let lines: Vec<String> = jobs
                    .iter()
                    .enumerate()
                    .map(|(i, (u, p, start_h, len_h))| {
                        let start = NOW - start_h * 3600;
                        line(i as u32 + 1, USERS[*u], PROJECTS[*p], start, len_h.map(|l| (start + l * 3600).min(NOW)))
                    })
                    .collect();
                let owner: Vec<&str> = jobs.iter().map(|(u, ..)| USERS[*u]).collect();
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async {
                    let (api, _tmp) = api_with(&lines, &["root"]).await;
                    let me = USERS[asker];
                    let others: Vec<String> = (1..=jobs.len())
                        .filter(|i| owner[i - 1] != me)
                        .map(|i| i.to_string())
                        .collect();
                    let all_projects = PROJECTS.iter().map(|p| format!("project={p}")).collect::<Vec<_>>().join("&");
                    let all_uuids = others.iter().map(|u| format!("uuid={u}")).collect::<Vec<_>>().join("&");
                    let wide = format!("from=0&to={}", NOW + 1);
                    let asks = [
                        ("/api/v1/units", format!("{wide}&running")),
                        ("/api/v1/units", format!("{wide}&{all_projects}")),
                        ("/api/v1/units", format!("{wide}&{all_uuids}")),
                        ("/api/v1/usage/current", format!("{wide}&{all_projects}")),
                        ("/api/v1/usage/current", format!("{wide}&groupby=project")),
                        ("/api/v1/usage/global", all_projects.clone()),
                        ("/api/v1/usage/global", "groupby=project".to_owned()),
                        ("/api/v1/users", String::new()),
                        ("/api/v1/projects", all_projects.clone()),
                    ];
                    let mine = owner.iter().filter(|o| **o == me).count();
                    for (path, query) in asks {
                        let a = api.handle(path, Some(&query), Some(me), NOW).await;
                        prop_assert_eq!(a.status, StatusCode::OK, "{} {}", path, a.text());
                        let text = a.text().to_owned();
                        for other in USERS.iter().filter(|u| **u != me) {
                            prop_assert!(!text.contains(&format!("\"{other}\"")), "{} {} shows {}: {}", path, query, other, text);
                        }
                        for row in a.json()["data"].as_array().unwrap() {
                            if let Some(uuid) = row.get("uuid").and_then(Value::as_str) {
                                prop_assert!(!others.iter().any(|o| o == uuid), "{} shows job {}", path, uuid);
                            }
                            if let Some(n) = row.get("num_units").and_then(Value::as_u64) {
                                prop_assert!(n as usize <= mine, "{} counts {} jobs; {} has {}", path, n, me, mine);
                            }
                        }
                    }
                    // The admin sees them all.
                    let a = api.handle("/api/v1/units/admin", Some(&format!("{wide}&running")), Some("root"), NOW).await;
                    prop_assert_eq!(a.json()["data"].as_array().unwrap().len(), jobs.len());
                    Ok(())
                })?;
            }

            /// A user's window answered from the cached spans selects the same jobs, in the
            /// same order, as SQL does (a filter on the cluster sends a request to SQL).
            #[test]
            fn spans_select_what_sql_selects(
                jobs in proptest::collection::vec((0usize..2, 0i64..48, proptest::option::of(0i64..12)), 1..40),
                windows in proptest::collection::vec((0i64..48, 0i64..24, any::<bool>()), 1..6),
            ) {
                let lines: Vec<String> = jobs
                    .iter()
                    .enumerate()
                    .map(|(i, (u, start_h, len_h))| {
                        let start = NOW - start_h * 1800;
                        line(i as u32 + 1, USERS[*u], "physics", start, len_h.map(|l| (start + l * 1800).min(NOW)))
                    })
                    .collect();
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async {
                    let (api, _tmp) = api_with(&lines, &["root"]).await;
                    let uuids = |a: Answer| -> Vec<String> {
                        a.json()["data"].as_array().unwrap().iter()
                            .map(|u| u["uuid"].as_str().unwrap().to_owned()).collect()
                    };
                    for (from_h, len_h, running) in windows {
                        let from = NOW - from_h * 1800;
                        let to = from + len_h * 1800;
                        let window = format!("from={from}&to={to}&field=uuid{}", if running { "&running" } else { "" });
                        for me in ["alice", "bob"] {
                            let spans = uuids(api.handle("/api/v1/units", Some(&window), Some(me), NOW).await);
                            let sql = uuids(api.handle("/api/v1/units", Some(&format!("{window}&cluster_id=lab")), Some(me), NOW).await);
                            prop_assert_eq!(&spans, &sql, "{} {}", me, window);
                            let admin = uuids(api.handle("/api/v1/units/admin", Some(&format!("{window}&user={me}")), Some("root"), NOW).await);
                            prop_assert_eq!(&admin, &sql, "root for {} {}", me, window);
                        }
                    }
                    Ok(())
                })?;
            }
        }
    }
}
