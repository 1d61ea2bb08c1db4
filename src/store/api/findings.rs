//! One job's findings, and the admins' summary of them.

use super::*;

impl Api {
    /// The job `cluster`/`job` (its latest run, should the id have been reused) if `user`
    /// owns it or is an admin: 400 for a non-numeric id, 404 when unknown, 403 otherwise.
    pub async fn authorize_job(
        &self,
        cluster: &str,
        job: &str,
        user: &str,
    ) -> Result<i64, ApiError> {
        if !crate::manager::is_unit_id(job) {
            return Err(ApiError::bad(format!("`{job}` is not a job id")));
        }
        let q = Sql::new(
            "SELECT id, usr FROM units WHERE cluster_id = $1 AND uuid = $2
             ORDER BY started_at DESC LIMIT 1",
        )
        .arg(cluster)
        .arg(job);
        let row = self
            .store
            .fetch_optional(&q)
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        let Some(row) = row else {
            return Err(ApiError::NotFound(format!(
                "no job {job} on cluster {cluster}"
            )));
        };
        let owner: String = row.get(1).map_err(query_failed)?;
        if owner != user && !self.store.is_admin(user).await.unwrap_or(false) {
            return Err(ApiError::Forbidden(format!("job {job} is not {user}'s")));
        }
        row.get(0).map_err(query_failed)
    }

    /// Every unit field of the row `id`, CEEMS's and ours, as a JSON object (null when the
    /// job is gone), its times in the server's zone.
    pub async fn unit(&self, id: i64) -> Result<Value, ApiError> {
        let mut rows = self.unit_rows(&[id]).await?;
        self.add_actions(&mut rows).await?;
        let Some(row) = rows.first() else {
            return Ok(Value::Null);
        };
        let json = row.render(FieldSet::ALL_UNIT, &self.time_zone, &self.emissions_key);
        serde_json::from_str(&json).map_err(|e| ApiError::Internal(e.to_string()))
    }

    pub(super) async fn job_findings(
        &self,
        cluster: &str,
        job: &str,
        user: &str,
    ) -> Result<Answer, ApiError> {
        let row = self.authorize_job(cluster, job, user).await?;
        let backend = self.store.backend();
        let mut q = Sql::new(&format!(
            "SELECT {} FROM units WHERE id = ",
            backend.json_object(&format!(
                "'cluster_id', cluster_id, 'uuid', uuid, 'user', usr, 'findings', {}",
                backend.json_column("coalesce(findings, '[]')")
            ))
        ));
        q.bind(row);
        let rows = self.fetch(q).await?;
        let json: String = rows
            .first()
            .and_then(|r| r.get(0).ok())
            .unwrap_or_else(|| "null".to_owned());
        Ok(Answer::raw_data(&json))
    }

    /// The most frequent findings per project over jobs that ended in the window.
    pub(super) async fn findings_summary(&self, p: &Params, now: i64) -> Result<Answer, ApiError> {
        p.only(&["from", "to", "cluster_id", "project"])?;
        let (from, to) = window(p, now)?;
        let (finding, each) = match self.store.backend() {
            Backend::Sqlite => (
                "json_extract(f.value, '$.id')",
                "json_each(units.findings) AS f",
            ),
            Backend::Postgres => (
                "f.value->>'id'",
                "json_array_elements(units.findings::json) AS f(value)",
            ),
        };
        let mut q = Sql::new(&format!(
            "SELECT cluster_id, project, {finding} AS finding, count(*) AS n, count(DISTINCT usr)
             FROM units, {each}
             WHERE findings IS NOT NULL AND ended_at >= "
        ));
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
}
