//! `/usage`: summed use by user and project.

use super::*;

/// Summed usage columns: name, column (the same in `units` and `usage`), and a scale.
pub(super) const USAGE_SUMS: &[(&str, &str, &str)] = &[
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
pub(super) fn usage_columns(pre_aggregated: bool) -> Vec<(&'static str, String)> {
    // PostgreSQL sums integers as numeric: cast back, as SQLite's sums already are.
    let (count, cpu_time) = if pre_aggregated {
        ("CAST(sum(num_units) AS BIGINT)", "sum(alloc_cpu_seconds)")
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
    cols.extend(USAGE_SUMS.iter().map(|(name, col, scale)| match *name {
        "total_elapsed_seconds" => (*name, format!("CAST(sum({col}) AS BIGINT)")),
        _ => (*name, format!("sum({col}){scale}")),
    }));
    cols
}

impl Api {
    /// `groupby`: `user` and/or `project` (default both), always within a cluster.
    pub(super) fn group_columns(p: &Params) -> Result<Vec<(&'static str, &'static str)>, ApiError> {
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
                    return Err(ApiError::bad(format!(
                        "`groupby`: `{other}` is not user or project"
                    )))
                }
            }
        }
        Ok(cols)
    }

    pub(super) fn usage_rows(
        rows: &[DbRow],
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

    pub(super) async fn usage_current(
        &self,
        p: &Params,
        scope: Option<&str>,
        now: i64,
    ) -> Result<Answer, ApiError> {
        p.only(&["from", "to", "cluster_id", "project", "user", "groupby"])?;
        let window = window(p, now)?;
        self.usage(p, scope, "/usage/current", Some(window)).await
    }

    pub(super) async fn usage_global(
        &self,
        p: &Params,
        scope: Option<&str>,
    ) -> Result<Answer, ApiError> {
        p.only(&["cluster_id", "project", "user", "groupby"])?;
        self.usage(p, scope, "/usage/global", None).await
    }

    /// Usage sums per group: over the jobs that overlap `window`, or, without one, over the
    /// pre-aggregated `usage` table (all time).
    pub(super) async fn usage(
        &self,
        p: &Params,
        scope: Option<&str>,
        route: &str,
        window: Option<(i64, i64)>,
    ) -> Result<Answer, ApiError> {
        if scope.is_some() && !p.all("user").is_empty() {
            return Err(ApiError::bad(format!("`user` is for {route}/admin")));
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
}
