//! `/api/v1/waste/admin`: who wasted most over a window, per user, project or partition:
//! GPU-hours held at (near) zero use, core-hours left idle, memory asked for and never used,
//! core-hours of time limits never reached, and the energy and CO2 of that waste. Only figures
//! Prometheus gave count (a job never aggregated adds no waste), and a group none of whose
//! jobs had a power source has no energy (null), not 0 kWh.

use super::*;

use crate::store::waste::{self as figures, WASTE_FIELDS};

impl Api {
    /// The ranking of the groups of `by` (user, project or partition) over jobs that ended in
    /// the window, most wasteful first by `sort` (one of [`WASTE_FIELDS`]).
    pub(super) async fn waste(&self, p: &Params, now: i64) -> Result<Answer, ApiError> {
        p.only(&["from", "to", "cluster_id", "by", "sort", "gpu_idle_below"])?;
        let (from, to) = window(p, now)?;
        let (column, key) = match p.one("by").unwrap_or("user") {
            "user" => ("usr", "username"),
            "project" => ("project", "project"),
            "partition" => ("partition", "partition"),
            other => {
                return Err(ApiError::bad(format!(
                    "`by`: `{other}` is not user, project or partition"
                )))
            }
        };
        let sort = p.one("sort").unwrap_or("idle_gpu_hours");
        let Some(rank) = WASTE_FIELDS.iter().position(|f| *f == sort) else {
            return Err(ApiError::bad(format!(
                "`sort`: `{sort}` is not one of {}",
                WASTE_FIELDS.join(", ")
            )));
        };
        let gpu_idle = match p.one("gpu_idle_below") {
            None => 0.01,
            Some(v) => v
                .parse::<f64>()
                .ok()
                .filter(|v| (0.0..=1.0).contains(v))
                .ok_or_else(|| {
                    ApiError::bad(format!(
                        "`gpu_idle_below`: `{v}` is not a share between 0 and 1"
                    ))
                })?,
        };
        let mut q = Sql::new(&format!(
            "SELECT * FROM (SELECT cluster_id, {column}, count(*), {} FROM units
             WHERE started_at > 0 AND ended_at >= ",
            figures::sums(gpu_idle).join(", ")
        ));
        q.bind(from)
            .push(" AND ended_at <= ")
            .bind(to)
            .push_in("cluster_id", p.all("cluster_id"))
            .push(&format!(
                " GROUP BY cluster_id, {column}) AS g ORDER BY {} DESC NULLS LAST, 5 DESC, 1, 2 LIMIT 1000",
                rank + 4
            ));
        let rows = self.fetch(q).await?;
        let real = |r: &DbRow, i: usize| {
            r.get::<Option<f64>>(i)
                .ok()
                .flatten()
                .map_or(Value::Null, |v| json!((v * 1000.0).round() / 1000.0))
        };
        let data: Vec<Value> = rows
            .iter()
            .map(|r| {
                let mut o = serde_json::Map::new();
                o.insert("cluster_id".into(), cell(r, 0, Col::Text));
                o.insert(key.into(), cell(r, 1, Col::Text));
                o.insert("num_units".into(), cell(r, 2, Col::Int));
                for (i, f) in WASTE_FIELDS.iter().enumerate() {
                    o.insert((*f).into(), real(r, 3 + i));
                }
                Value::Object(o)
            })
            .collect();
        Ok(Answer::data(Value::Array(data)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{api_with, NOW};
    use crate::store::sql::Sql;

    /// A finished job of `user` with `gpus` GPUs and `cpus` cores.
    fn job(id: u32, user: &str, partition: &str, gpus: u32, cpus: u32) -> String {
        let start = NOW - 86400;
        format!("{id}|{partition}|normal|p-{user}|{user}|100|{user}|100|{start}|{start}|{}|00:10:00|600|0:0|COMPLETED|billing=1,cpu={cpus},mem=1G,node=1,gres/gpu={gpus}|localhost|/tmp|60|job {id}", NOW - 3600)
    }

    /// Sets a job's length and what Prometheus gave of it.
    #[allow(clippy::too_many_arguments)]
    async fn aggregates(
        api: &super::Api,
        id: u32,
        elapsed: i64,
        cpu_seconds: f64,
        measured: i64,
        gpu: Option<(f64, f64)>,
        memory: (i64, Option<f64>),
        limit: i64,
        energy: (f64, f64, f64),
    ) {
        let q = Sql::new(
            "UPDATE units SET elapsed_seconds = $2, aggregated_seconds = $2, cpu_seconds = $3,
                    measured = $4, mean_gpu_utilization = $5, gpu_utilization_max = $6,
                    alloc_mem_bytes = $7, memory_peak_bytes = $8, time_limit_seconds = $9,
                    host_energy_joules = $10, gpu_energy_joules = $11, emissions_grams = $12
             WHERE uuid = $1",
        )
        .arg(id.to_string())
        .arg(elapsed)
        .arg(cpu_seconds)
        .arg(measured)
        .arg(gpu.map_or(0.0, |g| g.0))
        .arg(gpu.map(|g| g.1))
        .arg(memory.0)
        .arg(memory.1)
        .arg(limit)
        .arg(energy.0)
        .arg(energy.1)
        .arg(energy.2);
        api.store.execute(&q).await.unwrap();
    }

    #[tokio::test]
    async fn the_most_wasteful_user_comes_first_with_figures_computed_by_hand() {
        let lines = [
            job(1, "alice", "gpu", 2, 4),
            job(2, "bob", "gpu", 1, 2),
            job(3, "carol", "gpu", 1, 1),
            job(4, "carol", "cpu", 0, 1),
        ];
        let (api, _tmp) = api_with(&lines, &["root"]).await;
        // alice: 2 GPUs at 0.1 % for 10 h, 4 cores at 10 %, 90 GB never used, a 20 h limit.
        aggregates(
            &api,
            1,
            36_000,
            14_400.0,
            23,
            Some((0.001, 0.01)),
            (100_000_000_000, Some(1e10)),
            72_000,
            (36e6, 18e6, 1000.0),
        )
        .await;
        // bob: a GPU at 80 % for 5 h, 2 cores at 95 %, all his memory, a limit he reached.
        aggregates(
            &api,
            2,
            18_000,
            34_200.0,
            23,
            Some((0.8, 1.0)),
            (1 << 30, Some((1u64 << 30) as f64)),
            18_000,
            (18e6, 9e6, 500.0),
        )
        .await;
        // carol: a GPU at 0.9 % for 2 h and a core never used, no power source; a job never
        // aggregated, which adds nothing.
        aggregates(
            &api,
            3,
            7_200,
            0.0,
            1,
            Some((0.009, 0.02)),
            (1 << 30, None),
            0,
            (0.0, 0.0, 0.0),
        )
        .await;
        aggregates(
            &api,
            4,
            7_200,
            0.0,
            0,
            None,
            (1 << 30, None),
            0,
            (0.0, 0.0, 0.0),
        )
        .await;

        let answer = api
            .handle("/api/v1/waste/admin", Some("from=0"), Some("root"), NOW)
            .await;
        let body: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
        let rows = body["data"].as_array().unwrap_or_else(|| panic!("{body}"));
        let users: Vec<&str> = rows
            .iter()
            .map(|r| r["username"].as_str().unwrap())
            .collect();
        assert_eq!(users, ["alice", "carol", "bob"], "{body}");
        let alice = &rows[0];
        assert_eq!(alice["idle_gpu_hours"], 20.0);
        assert_eq!(alice["lost_cpu_hours"], 36.0);
        assert_eq!(alice["unused_memory_tb_hours"], 0.9);
        assert_eq!(alice["overrequested_core_hours"], 40.0);
        // 90 % of 10 kWh of the node, and the 5 kWh of the idle GPUs.
        assert_eq!(alice["waste_energy_kwh"], 14.0);
        assert_eq!(alice["waste_emissions_g"], 933.333);
        let carol = &rows[1];
        assert_eq!(
            (
                carol["num_units"].as_i64(),
                carol["idle_gpu_hours"].as_f64()
            ),
            (Some(2), Some(2.0))
        );
        assert_eq!(carol["lost_cpu_hours"], 2.0);
        assert!(
            carol["waste_energy_kwh"].is_null() && carol["waste_emissions_g"].is_null(),
            "no power data is not 0 kWh: {carol}"
        );
        let bob = &rows[2];
        assert_eq!(
            (
                bob["idle_gpu_hours"].as_f64(),
                bob["lost_cpu_hours"].as_f64()
            ),
            (Some(0.0), Some(0.5))
        );
        assert_eq!(bob["waste_energy_kwh"], 0.25);
        assert_eq!(bob["waste_emissions_g"], 16.667);

        // By energy, carol (no figure) comes last; by partition, the CPU partition has only
        // carol's unaggregated job.
        let by_energy = api
            .handle(
                "/api/v1/waste/admin",
                Some("from=0&sort=waste_energy_kwh"),
                Some("root"),
                NOW,
            )
            .await;
        let body: serde_json::Value = serde_json::from_slice(&by_energy.body).unwrap();
        assert_eq!(body["data"][2]["username"], "carol", "{body}");
        let by_partition = api
            .handle(
                "/api/v1/waste/admin",
                Some("from=0&by=partition"),
                Some("root"),
                NOW,
            )
            .await;
        let body: serde_json::Value = serde_json::from_slice(&by_partition.body).unwrap();
        assert_eq!(body["data"][0]["partition"], "gpu");
        assert_eq!(body["data"][0]["idle_gpu_hours"], 22.0);
        // Admins only, and a typo is named.
        let denied = api
            .handle("/api/v1/waste/admin", Some("from=0"), Some("alice"), NOW)
            .await;
        assert_eq!(denied.status, hyper::StatusCode::FORBIDDEN);
        let typo = api
            .handle(
                "/api/v1/waste/admin",
                Some("sort=gpu_hours"),
                Some("root"),
                NOW,
            )
            .await;
        assert!(String::from_utf8_lossy(&typo.body).contains("idle_gpu_hours"));
    }
}
