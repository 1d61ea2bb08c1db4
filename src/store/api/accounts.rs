//! `/projects`, `/users` and `/clusters`.

use super::*;
use crate::store::db::SERVICE_ACCOUNT;

/// The fields of `/clusters/admin`: CEEMS's two, then ours.
const CLUSTER_FIELDS: &[&str] = &[
    "id",
    "manager",
    "num_units",
    "first_started_at_ts",
    "last_updated_at_ts",
    "next_window_start_ts",
];

impl Api {
    /// Projects with all their members; a user gets the projects they are a member of.
    pub(super) async fn projects(
        &self,
        p: &Params,
        scope: Option<&str>,
    ) -> Result<Answer, ApiError> {
        let mut q = Sql::new(
            "SELECT p.cluster_id, p.name, a.usr,
                    (SELECT c.manager FROM clusters c WHERE c.id = p.cluster_id), p.uid
             FROM projects p
             LEFT JOIN associations a ON a.cluster_id = p.cluster_id AND a.project = p.name
             WHERE 1 = 1",
        );
        if let Some(u) = scope {
            q.push(
                " AND EXISTS (SELECT 1 FROM associations m WHERE m.cluster_id = p.cluster_id
                   AND m.project = p.name AND m.usr = ",
            )
            .bind(u)
            .push(")");
        }
        q.push_in("p.cluster_id", p.all("cluster_id"))
            .push_in("p.name", p.all("project"))
            .push(" ORDER BY p.cluster_id, p.name, a.usr");
        let rows = self.fetch(q).await?;
        Ok(Answer::data(grouped(&rows, "name", "users")))
    }

    /// Users with their projects; a user gets only their own record, whatever `user` says.
    /// On `/admin`, `role=admin` lists the admins instead, as CEEMS's load balancer asks.
    pub(super) async fn users(&self, p: &Params, scope: Option<&str>) -> Result<Answer, ApiError> {
        if scope.is_none() && p.one("role") == Some("admin") {
            return self.admins().await;
        }
        let mut q = Sql::new(
            "SELECT u.cluster_id, u.name, a.project,
                    (SELECT c.manager FROM clusters c WHERE c.id = u.cluster_id), u.uid
             FROM users u
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

    /// The admins as CEEMS lists them (`cluster_id` `all`, `tags` where each came from), with
    /// CEEMS's service account, which is always one.
    async fn admins(&self) -> Result<Answer, ApiError> {
        let rows = self
            .fetch(Sql::new(
                "SELECT name, min(source) FROM admin_users GROUP BY name ORDER BY name",
            ))
            .await?;
        let mut data: Vec<Value> = rows
            .iter()
            .map(|r| {
                let name: String = r.get(0).unwrap_or_default();
                let source: String = r.get(1).unwrap_or_default();
                json!({"cluster_id": "all", "resource_manager": "", "name": name,
                       "projects": [], "tags": [source]})
            })
            .collect();
        if !data.iter().any(|u| u["name"] == SERVICE_ACCOUNT) {
            data.push(
                json!({"cluster_id": "all", "resource_manager": "", "name": SERVICE_ACCOUNT,
                             "projects": [], "tags": ["ceems"]}),
            );
        }
        Ok(Answer::data(Value::Array(data)))
    }

    /// The clusters this server pulls from, as CEEMS lists them (`id`, `manager`); our
    /// counts when named with `field=`.
    pub(super) async fn clusters(&self, p: &Params) -> Result<Answer, ApiError> {
        let fields = FieldSet::parse(CLUSTER_FIELDS, 2, p.all("field"))?;
        let q = Sql::new(
            "SELECT c.id, c.manager, count(u.id), min(NULLIF(u.started_at, 0)),
                    max(u.last_updated_at),
                    (SELECT window_start FROM ingest_state s WHERE s.cluster_id = c.id)
             FROM clusters c LEFT JOIN units u ON u.cluster_id = c.id
             GROUP BY c.id, c.manager ORDER BY c.id",
        );
        let rows = self.fetch(q).await?;
        let data: Vec<Value> = rows
            .iter()
            .map(|r| {
                let ms = |i: usize| match cell(r, i, Col::Int) {
                    Value::Number(n) => n.as_i64().map_or(Value::Null, |s| Value::from(s * 1000)),
                    other => other,
                };
                let values = [
                    cell(r, 0, Col::Text),
                    cell(r, 1, Col::Text),
                    cell(r, 2, Col::Int),
                    ms(3),
                    ms(4),
                    ms(5),
                ];
                let object: Map<String, Value> = CLUSTER_FIELDS
                    .iter()
                    .zip(values)
                    .filter(|(name, _)| fields.has(CLUSTER_FIELDS, name))
                    .map(|(name, v)| ((*name).to_owned(), v))
                    .collect();
                Value::Object(object)
            })
            .collect();
        Ok(Answer::data(Value::Array(data)))
    }
}

/// Rows of (cluster, name, member, manager, uid) →
/// `[{uid, cluster_id, resource_manager, name, <members>: [...]}]`, `uid` only where there is
/// one (CEEMS leaves an empty one out).
pub(super) fn grouped(rows: &[DbRow], name: &str, members: &str) -> Value {
    let mut out: Vec<Value> = Vec::new();
    let mut last: Option<(String, String)> = None;
    for r in rows {
        let cluster: String = r.get(0).unwrap_or_default();
        let n: String = r.get(1).unwrap_or_default();
        let member: Option<String> = r.get(2).ok().flatten();
        let manager: Option<String> = r.get(3).ok().flatten();
        let uid: Option<String> = r.get(4).ok().flatten().filter(|u: &String| !u.is_empty());
        if last.as_ref() != Some(&(cluster.clone(), n.clone())) {
            let mut entry = Map::new();
            if let Some(uid) = uid {
                entry.insert("uid".into(), Value::from(uid));
            }
            entry.insert("cluster_id".into(), Value::from(cluster.as_str()));
            entry.insert(
                "resource_manager".into(),
                Value::from(manager.unwrap_or_default()),
            );
            entry.insert(name.into(), Value::from(n.as_str()));
            entry.insert(members.into(), Value::Array(Vec::new()));
            out.push(Value::Object(entry));
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
