//! The summary of the jobs `--job` names, made from their own rows: CEEMS's cacct prints the
//! usage of every job in the window under it, which reads as the named jobs' figures.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// The allocation time a mean is weighted by, as the stats-server weighs a usage group's
/// means (CEEMS's): CPU use by CPU time, memory by memory time, GPU by GPU time.
fn weight_key(tag: &str) -> &'static str {
    match tag {
        "avg_cpu_usage" => "alloc_cputime",
        "avg_cpu_mem_usage" => "alloc_cpumemtime",
        "avg_gpu_usage" => "alloc_gputime",
        "avg_gpu_mem_usage" => "alloc_gpumemtime",
        _ => "walltime",
    }
}

/// Per account and user, in that order, rows shaped as `/usage/current` answers them:
/// `project`, `username`, `num_units`, `total_time_seconds.walltime`, and for each of `tags`
/// (per-source maps) the sum of `total_*` and the weighted mean of `avg_*` (0 where nothing
/// was allocated, as the server answers).
pub fn of_units(units: &[Value], tags: &[&str]) -> Vec<Value> {
    #[derive(Default)]
    struct Group {
        jobs: i64,
        walltime: f64,
        /// tag -> source -> (sum of value x weight, or of values; sum of weights)
        sums: BTreeMap<String, BTreeMap<String, (f64, f64)>>,
    }
    let mut groups: BTreeMap<(String, String), Group> = BTreeMap::new();
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    for u in units {
        let g = groups
            .entry((text(&u["project"]), text(&u["username"])))
            .or_default();
        g.jobs += 1;
        let times = &u["total_time_seconds"];
        g.walltime += times["walltime"].as_f64().unwrap_or(0.0);
        for tag in tags {
            let Some(values) = u[*tag].as_object() else {
                continue;
            };
            let weight = times[weight_key(tag)].as_f64().unwrap_or(0.0);
            let sums = g.sums.entry((*tag).to_owned()).or_default();
            for (source, v) in values {
                let Some(v) = v.as_f64() else { continue };
                let (value, weights) = sums.entry(source.clone()).or_default();
                match tag.starts_with("avg_") {
                    true => {
                        *value += v * weight;
                        *weights += weight;
                    }
                    false => *value += v,
                }
            }
        }
    }
    groups
        .into_iter()
        .map(|((project, user), g)| {
            let mut row = Map::new();
            row.insert("project".into(), Value::from(project));
            row.insert("username".into(), Value::from(user));
            row.insert("num_units".into(), Value::from(g.jobs));
            row.insert(
                "total_time_seconds".into(),
                serde_json::json!({"walltime": g.walltime}),
            );
            for (tag, sources) in g.sums {
                let values: Map<String, Value> = sources
                    .into_iter()
                    .map(|(source, (value, weights))| {
                        let v = match tag.starts_with("avg_") {
                            true if weights > 0.0 => value / weights,
                            true => 0.0,
                            false => value,
                        };
                        (source, Value::from(v))
                    })
                    .collect();
                row.insert(tag, Value::Object(values));
            }
            Value::Object(row)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn the_named_jobs_are_summed_and_their_means_weighted_by_what_they_held() {
        let units = [
            json!({"project": "acc1", "username": "usr1",
                   "total_time_seconds": {"walltime": 100, "alloc_cputime": 400},
                   "avg_cpu_usage": {"global": 10.0},
                   "total_cpu_energy_usage_kwh": {"total": 1.5}}),
            json!({"project": "acc1", "username": "usr1",
                   "total_time_seconds": {"walltime": 50, "alloc_cputime": 100},
                   "avg_cpu_usage": {"global": 60.0},
                   "total_cpu_energy_usage_kwh": {"total": 0.5}}),
            json!({"project": "acc2", "username": "usr1",
                   "total_time_seconds": {"walltime": 10, "alloc_cputime": 0},
                   "avg_cpu_usage": {"global": 99.0}}),
        ];
        let rows = super::of_units(&units, &["avg_cpu_usage", "total_cpu_energy_usage_kwh"]);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0]["project"], "acc1");
        assert_eq!(rows[0]["num_units"], 2);
        assert_eq!(rows[0]["total_time_seconds"]["walltime"], 150.0);
        // (10 x 400 + 60 x 100) / 500
        assert_eq!(rows[0]["avg_cpu_usage"]["global"], 20.0);
        assert_eq!(rows[0]["total_cpu_energy_usage_kwh"]["total"], 2.0);
        // Nothing allocated: 0, as the server answers such a group.
        assert_eq!(rows[1]["avg_cpu_usage"]["global"], 0.0);
        assert!(rows[1].get("total_cpu_energy_usage_kwh").is_none());
    }
}
