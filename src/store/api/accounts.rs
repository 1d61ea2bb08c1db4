//! `/projects`, `/users` and `/clusters`.

use super::*;

impl Api {
    /// Projects with their members; a user gets only their own projects, and only themselves
    /// as a member.
    pub(super) async fn projects(
        &self,
        p: &Params,
        scope: Option<&str>,
    ) -> Result<Answer, ApiError> {
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
    pub(super) async fn users(&self, p: &Params, scope: Option<&str>) -> Result<Answer, ApiError> {
        p.only(&["cluster_id", "user"])?;
        if scope.is_some() && !p.all("user").is_empty() {
            return Err(ApiError::bad("`user` is for /users/admin"));
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

    pub(super) async fn clusters(&self, p: &Params) -> Result<Answer, ApiError> {
        p.only(&[])?;
        let q = Sql::new(
            "SELECT u.cluster_id, count(*), min(NULLIF(u.started_at, 0)), max(u.last_updated_at),
                    (SELECT window_start FROM ingest_state s WHERE s.cluster_id = u.cluster_id),
                    (SELECT c.manager FROM clusters c WHERE c.id = u.cluster_id)
             FROM units u GROUP BY u.cluster_id ORDER BY u.cluster_id",
        );
        let rows = self.fetch(q).await?;
        let data: Vec<Value> = rows
            .iter()
            .map(|r| {
                json!({
                    "id": cell(r, 0, Col::Text),
                    "manager": cell(r, 5, Col::Text),
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
pub(super) fn grouped(rows: &[DbRow], name: &str, members: &str) -> Value {
    let mut out: Vec<Value> = Vec::new();
    let mut last: Option<(String, String)> = None;
    for r in rows {
        let cluster: String = r.get(0).unwrap_or_default();
        let n: String = r.get(1).unwrap_or_default();
        let member: Option<String> = r.get(2).ok().flatten();
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
