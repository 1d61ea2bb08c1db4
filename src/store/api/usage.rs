//! `/usage`: use summed by cluster, project and user, as CEEMS's `Usage` rows.

use super::*;
use crate::store::db::{SeriesFold, SeriesWeights, USAGE_SUMS};

/// `/usage/current` rounds its window out to this grid, as CEEMS does.
const USAGE_GRID_SECONDS: i64 = 900;

/// One group's sums, by the names of `USAGE_SUMS`.
struct UsageRow {
    cluster_id: String,
    manager: String,
    num_units: i64,
    project: String,
    group: String,
    user: String,
    sums: Vec<f64>,
    /// CEEMS's series of its jobs; when there are any, the series objects are these.
    series: Map<String, Value>,
}

impl UsageRow {
    fn read(r: &DbRow) -> Result<UsageRow, sqlx::Error> {
        Ok(UsageRow {
            cluster_id: r.get(0)?,
            project: r.get(1)?,
            user: r.get(2)?,
            group: r.get::<Option<String>>(3)?.unwrap_or_default(),
            manager: r.get::<Option<String>>(4)?.unwrap_or_default(),
            num_units: r.get(5)?,
            sums: (0..USAGE_SUMS.len())
                .map(|i| r.get::<Option<f64>>(6 + i).map(Option::unwrap_or_default))
                .collect::<Result<_, _>>()?,
            series: Map::new(),
        })
    }

    fn sum(&self, name: &str) -> f64 {
        USAGE_SUMS
            .iter()
            .position(|(n, _)| *n == name)
            .and_then(|i| self.sums.get(i).copied())
            .unwrap_or(0.0)
    }

    /// CEEMS writes its six plain fields always (empty when not asked for) and a series
    /// only when asked for and not empty.
    fn render(&self, fields: FieldSet, emissions_key: &str) -> String {
        let mut out = JsonObject::default();
        let has = |name: &str| fields.has(USAGE_FIELDS, name);
        let text = |name: &str, v: &str| Value::from(if has(name) { v } else { "" });
        out.value("cluster_id", text("cluster_id", &self.cluster_id));
        out.value("resource_manager", text("resource_manager", &self.manager));
        let units = if has("num_units") { self.num_units } else { 0 };
        out.value("num_units", Value::from(units));
        out.value("project", text("project", &self.project));
        out.value("groupname", text("groupname", &self.group));
        out.value("username", text("username", &self.user));
        let agg = self.sum("aggregated_seconds") > 0.0;
        let gpus = self.sum("alloc_gpu_seconds") > 0.0;
        for name in &USAGE_FIELDS[6..] {
            if !has(name) {
                continue;
            }
            if !self.series.is_empty() && SERIES.contains(name) {
                stored_series(&mut out, &self.series, name);
                continue;
            }
            let s = |n: &str| self.sum(n);
            match *name {
                "total_time_seconds" => out.value(
                    name,
                    total_time(&TimeSums {
                        walltime: s("wall_seconds"),
                        cputime: s("alloc_cpu_wall_seconds"),
                        cpumemtime: s("alloc_mem_mib_wall_seconds"),
                        gputime: s("alloc_gpu_wall_seconds"),
                        gpumemtime: s("gpu_wall_seconds"),
                    }),
                ),
                "avg_cpu_usage" if agg => out.series(
                    name,
                    "global",
                    percent(s("cpu_seconds"), s("alloc_cpu_seconds")),
                ),
                "avg_cpu_mem_usage" if agg => out.series(
                    name,
                    "global",
                    percent(s("memory_byte_seconds"), s("alloc_memory_byte_seconds")),
                ),
                "total_cpu_energy_usage_kwh" if agg && s("host_energy_units") > 0.0 => out.series(
                    name,
                    "total",
                    Some(s("host_energy_joules") / JOULES_PER_KWH),
                ),
                "total_cpu_emissions_gms" if agg && s("emissions_units") > 0.0 => {
                    out.series(name, emissions_key, Some(s("emissions_grams")))
                }
                "avg_gpu_usage" if gpus => out.series(
                    name,
                    "global",
                    percent(s("gpu_utilization_seconds"), s("alloc_gpu_seconds")),
                ),
                "total_gpu_energy_usage_kwh" if gpus && s("gpu_energy_units") > 0.0 => {
                    out.series(name, "total", Some(s("gpu_energy_joules") / JOULES_PER_KWH))
                }
                "total_io_write_stats" if agg => {
                    out.series(name, "bytes", Some(s("io_write_bytes")))
                }
                "total_io_read_stats" if agg => out.series(name, "bytes", Some(s("io_read_bytes"))),
                "total_elapsed_seconds" => {
                    out.value(name, Value::from(s("elapsed_seconds").round() as i64))
                }
                "total_cpu_seconds" => out.value(name, number(s("cpu_seconds"))),
                // Ours: null, not 0, where none of the group's jobs has the figure.
                "total_host_energy_usage_kwh" if s("host_energy_units") == 0.0 => {
                    out.value(name, Value::Null)
                }
                "total_emissions_gms" if s("emissions_units") == 0.0 => {
                    out.value(name, Value::Null)
                }
                "total_host_energy_usage_kwh" => {
                    out.value(name, number(s("host_energy_joules") / JOULES_PER_KWH))
                }
                "total_cpu_package_energy_kwh" => {
                    out.value(name, number(s("cpu_energy_joules") / JOULES_PER_KWH))
                }
                "total_emissions_gms" => out.value(name, number(s("emissions_grams"))),
                "total_io_read_bytes" => out.value(name, number(s("io_read_bytes"))),
                "total_io_write_bytes" => out.value(name, number(s("io_write_bytes"))),
                // A series we have no value of.
                _ => {}
            }
        }
        out.finish()
    }
}

impl Api {
    /// A made-up usage row, the `i`th of a demo answer.
    pub(super) fn demo_usage_row(&self, i: i64) -> String {
        let row = UsageRow {
            cluster_id: "demo-0".into(),
            manager: "slurm".into(),
            num_units: 10 + i,
            project: format!("project{}", i % 3),
            group: format!("group{i}"),
            user: format!("user{i}"),
            sums: USAGE_SUMS
                .iter()
                .enumerate()
                .map(|(k, _)| 1000.0 * (1 + i + k as i64) as f64)
                .collect(),
            series: Map::new(),
        };
        row.render(FieldSet::first(CEEMS_USAGE_FIELDS), &self.emissions_key)
    }

    /// `groupby`: `user` and/or `project` (default both), always within a cluster. A group
    /// left out reads as empty.
    fn group_columns(p: &Params) -> Result<(bool, bool), ApiError> {
        let wanted = p.all("groupby");
        if wanted.is_empty() {
            return Ok((true, true));
        }
        let (mut project, mut user) = (false, false);
        for g in wanted {
            match g.as_str() {
                "project" => project = true,
                "user" => user = true,
                other => {
                    return Err(ApiError::bad(format!(
                        "`groupby`: `{other}` is not user or project"
                    )))
                }
            }
        }
        Ok((project, user))
    }

    pub(super) async fn usage_current(
        &self,
        p: &Params,
        scope: Option<&str>,
        now: i64,
    ) -> Result<Answer, ApiError> {
        let (from, to) = window(p, now)?;
        // As CEEMS: the window widened to its 15-minute grid, so that a dashboard's moving
        // `now` hits the same rows (and the same cache) for a while.
        let grid = |t: i64, up: bool| {
            let down = t.div_euclid(USAGE_GRID_SECONDS) * USAGE_GRID_SECONDS;
            if up && down < t {
                down + USAGE_GRID_SECONDS
            } else {
                down
            }
        };
        self.usage(p, scope, Some((grid(from, false), grid(to, true))))
            .await
    }

    pub(super) async fn usage_global(
        &self,
        p: &Params,
        scope: Option<&str>,
    ) -> Result<Answer, ApiError> {
        self.usage(p, scope, None).await
    }

    /// Usage sums per group: over the jobs last listed by their manager within `window`, as
    /// CEEMS selects them (a running job is listed again at every pull), or, without one, over
    /// the pre-aggregated `usage` table (all time). A user's route sums their own jobs and
    /// their projects', whatever `user` says.
    pub(super) async fn usage(
        &self,
        p: &Params,
        scope: Option<&str>,
        window: Option<(i64, i64)>,
    ) -> Result<Answer, ApiError> {
        let fields = FieldSet::parse(USAGE_FIELDS, CEEMS_USAGE_FIELDS, p.all("field"))?;
        let (by_project, by_user) = Self::group_columns(p)?;
        let project = if by_project { "project" } else { "''" };
        let user = if by_user { "usr" } else { "''" };
        let group = if by_user { "max(grp)" } else { "''" };
        let mut q = Sql::new(&format!(
            "SELECT cluster_id, {project}, {user}, {group},
                (SELECT c.manager FROM clusters c WHERE c.id = g.cluster_id), "
        ));
        // PostgreSQL sums integers as numeric: cast back, as SQLite's sums already are.
        q.push(match window {
            Some(_) => "CAST(count(*) AS BIGINT)",
            None => "CAST(sum(num_units) AS BIGINT)",
        });
        for (column, expr) in USAGE_SUMS {
            let summed = if window.is_some() { expr } else { column };
            q.push(&format!(", CAST(sum({summed}) AS DOUBLE PRECISION)"));
        }
        q.push(match window {
            Some(_) => " FROM units g WHERE started_at > 0",
            None => " FROM usage g WHERE 1 = 1",
        });
        // CEEMS's test switch: only the jobs that have ended.
        let terminated_only = p.flag("__terminated")?;
        // CEEMS's daily usage: the jobs written on the days (UTC) whose start is in the window.
        let by_day = p.flag("experimental")?;
        let users: Vec<String> = scope
            .map(|u| vec![u.to_owned()])
            .unwrap_or_else(|| p.all("user").to_vec());
        let filter = |q: &mut Sql| {
            match scope {
                // As in CEEMS, a user sees the usage of the projects they are a member of,
                // and their own anywhere.
                Some(user) => {
                    q.push(" AND (usr = ")
                        .bind(user)
                        .push(
                            " OR project IN (SELECT a.project FROM associations a
                               WHERE a.cluster_id = g.cluster_id AND a.usr = ",
                        )
                        .bind(user)
                        .push("))");
                }
                // An admin naming users gets, as in CEEMS, the usage of their projects.
                None if !users.is_empty() => {
                    let list = |q: &mut Sql| {
                        for (i, u) in users.iter().enumerate() {
                            q.push(if i == 0 { "" } else { ", " }).bind(u.as_str());
                        }
                    };
                    q.push(" AND (usr IN (");
                    list(q);
                    q.push(
                        ") OR project IN (SELECT a.project FROM associations a
                           WHERE a.cluster_id = g.cluster_id AND a.usr IN (",
                    );
                    list(q);
                    q.push(")))");
                }
                None => {}
            }
            q.push_in("project", p.all("project"))
                .push_in("cluster_id", p.all("cluster_id"));
            if let Some((from, to)) = window {
                q.push(match by_day {
                    true => " AND (last_updated_at - (last_updated_at % 86400)) BETWEEN ",
                    false => " AND last_updated_at BETWEEN ",
                })
                .bind(from)
                .push(" AND ")
                .bind(to);
                if terminated_only {
                    q.push(" AND ended_at IS NOT NULL");
                }
            }
        };
        filter(&mut q);
        // PostgreSQL takes no constant as a key.
        let mut keys = vec!["cluster_id"];
        keys.extend(by_project.then_some("project"));
        keys.extend(by_user.then_some("usr"));
        let keys = keys.join(", ");
        q.push(&format!(" GROUP BY {keys} ORDER BY {keys}"));
        let rows = self.fetch(q).await?;
        // CEEMS's series, summed per group in Rust: they are JSON.
        let mut s = Sql::new(&format!(
            "SELECT cluster_id, {project}, {user}, series, {} FROM {} g
             WHERE series <> '{{}}'",
            SeriesWeights::select(window.is_some()),
            if window.is_some() { "units" } else { "usage" }
        ));
        filter(&mut s);
        let mut folds: std::collections::HashMap<(String, String, String), SeriesFold> =
            Default::default();
        for r in self.fetch(s).await? {
            let key = (
                r.get(0).map_err(query_failed)?,
                r.get(1).map_err(query_failed)?,
                r.get(2).map_err(query_failed)?,
            );
            let series: String = r.get(3).map_err(query_failed)?;
            let weights = SeriesWeights::read(&r, 4).map_err(query_failed)?;
            folds.entry(key).or_default().add(&series, &weights);
        }
        let mut body = String::from(SUCCESS_HEAD);
        body.push('[');
        for (i, r) in rows.iter().enumerate() {
            let mut row = UsageRow::read(r).map_err(query_failed)?;
            let key = (
                row.cluster_id.clone(),
                row.project.clone(),
                row.user.clone(),
            );
            if let Some(fold) = folds.get(&key) {
                row.series = fold.finish();
            }
            if i > 0 {
                body.push(',');
            }
            body.push_str(&row.render(fields, &self.emissions_key));
        }
        body.push(']');
        Ok(Answer::success_body(body))
    }
}
