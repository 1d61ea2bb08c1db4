//! CEEMS's routes besides units and usage: `/units/verify` (which CEEMS's load balancer asks
//! in API mode), `/stats/{current,global}/admin` and `/demo/{units,usage}`.

use super::*;

/// CEEMS's refusal (v0.12 and later) of a unit the user may not read, the lb's words too.
pub(super) const VERIFY_REFUSED: &str =
    "user do not have permissions to view metrics of this job/pod/vm";

impl Api {
    /// 200 when `user` may read every `uuid=` (their own units, their projects' units, or
    /// any as an admin), else CEEMS's 403.
    pub(super) async fn verify(&self, p: &Params, user: &str) -> Result<Answer, ApiError> {
        let denied = || ApiError::Forbidden(VERIFY_REFUSED.into());
        let uuids = p.all("uuid");
        if uuids.is_empty() {
            return Err(ApiError::bad("name the units to verify with uuid="));
        }
        if self.store.is_admin(user).await.map_err(query_failed)? {
            return Ok(Answer::data(Value::Null));
        }
        let clusters = p.all("cluster_id");
        let mut readable = std::collections::BTreeSet::new();
        for cluster in clusters {
            let of_cluster = self
                .store
                .units_readable_by(cluster, user, uuids)
                .await
                .map_err(query_failed)?;
            readable.extend(of_cluster);
        }
        match uuids.iter().all(|u| readable.contains(u)) {
            true => Ok(Answer::data(Value::Null)),
            false => Err(denied()),
        }
    }

    /// Per cluster: its units (those that overlap the window in `current` mode), how many
    /// have ended and how many not, and its projects and users with units.
    pub(super) async fn stats(
        &self,
        p: &Params,
        window: Option<(i64, i64)>,
    ) -> Result<Answer, ApiError> {
        let mut q = Sql::new(
            "SELECT cluster_id, (SELECT c.manager FROM clusters c WHERE c.id = u.cluster_id),
                CAST(count(*) AS BIGINT),
                CAST(sum(CASE WHEN ended_at IS NULL THEN 0 ELSE 1 END) AS BIGINT),
                CAST(sum(CASE WHEN ended_at IS NULL THEN 1 ELSE 0 END) AS BIGINT),
                CAST(count(DISTINCT project) AS BIGINT), CAST(count(DISTINCT usr) AS BIGINT)
             FROM units u WHERE 1 = 1",
        );
        q.push_in("cluster_id", p.all("cluster_id"));
        if let Some((from, to)) = window {
            q.push_overlap(from, to, true);
        }
        q.push(" GROUP BY cluster_id ORDER BY cluster_id");
        let names = [
            "cluster_id",
            "resource_manager",
            "num_units",
            "num_inactive_units",
            "num_active_units",
            "num_projects",
            "num_users",
        ];
        let rows = self.fetch(q).await?;
        let data: Vec<Value> = rows
            .iter()
            .map(|r| {
                let object: Map<String, Value> = names
                    .iter()
                    .enumerate()
                    .map(|(i, name)| {
                        let kind = if i < 2 { Col::Text } else { Col::Int };
                        let v = match cell(r, i, kind) {
                            Value::Null if i < 2 => Value::from(""),
                            Value::Null => Value::from(0),
                            v => v,
                        };
                        ((*name).to_owned(), v)
                    })
                    .collect();
                Value::Object(object)
            })
            .collect();
        Ok(Answer::data(Value::Array(data)))
    }

    /// Sample answers that show the shape of `units` or `usage` without a user or data.
    pub(super) fn demo(&self, resource: &str) -> Result<Answer, ApiError> {
        let rows: Vec<String> = match resource {
            "units" => (0..DEMO_ROWS)
                .map(|i| {
                    UnitRow::demo(i).render(
                        FieldSet::first(CEEMS_UNIT_FIELDS),
                        &self.time_zone,
                        &self.emissions_key,
                    )
                })
                .collect(),
            "usage" => (0..DEMO_ROWS).map(|i| self.demo_usage_row(i)).collect(),
            other => {
                return Err(ApiError::NotFound(format!(
                    "no demo of {other}: units or usage"
                )))
            }
        };
        Ok(Answer::raw_data(&format!("[{}]", rows.join(","))))
    }
}

const DEMO_ROWS: i64 = 10;
