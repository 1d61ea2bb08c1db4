//! `/units`: a user's jobs in a window.

use super::*;

impl Api {
    /// A user's jobs as spans, from the cache or read once per generation.
    pub(super) async fn user_spans(
        &self,
        generation: u64,
        user: &str,
    ) -> Result<UserSpans, ApiError> {
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
                        id: r.get(0)?,
                        started_at: r.get(1)?,
                        ended_at: r.get(2)?,
                        running: r.flag(3)?,
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
    pub(super) async fn ids_from_spans(
        &self,
        generation: u64,
        users: &[String],
        (from, to): (i64, i64),
        running: bool,
    ) -> Result<Option<Vec<i64>>, ApiError> {
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

    /// `generation` was read before the request's first query: rows rendered from data newer
    /// than it are dropped with it.
    pub(super) async fn units(
        &self,
        p: &Params,
        scope: Option<&str>,
        now: i64,
        generation: u64,
    ) -> Result<Answer, ApiError> {
        // CEEMS ignores what it does not know, `user` on a user's route included (its
        // dashboards send it everywhere).
        let fields = FieldSet::parse(UNIT_FIELDS, CEEMS_UNIT_FIELDS, p.all("field"))?;
        let (zone, zone_key) = self.zone(p)?;
        let (from, to) = window(p, now)?;
        let running = p.flag("running")?;
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
                let mut q = Sql::new(&format!(
                    "SELECT {} FROM (SELECT id, started_at FROM units WHERE 1 = 1",
                    self.store
                        .backend()
                        .join_ids("id", "started_at DESC, id DESC")
                ));
                q.push_in("usr", &users)
                    .push_in("uuid", p.all("uuid"))
                    .push_in("project", p.all("project"))
                    .push_in("cluster_id", p.all("cluster_id"));
                // As in CEEMS, units named by uuid are answered whenever they ended.
                if p.all("uuid").is_empty() {
                    q.push_ended_in(from, to, running);
                }
                q.push(" ORDER BY started_at DESC, id DESC LIMIT ")
                    .bind(MAX_UNITS)
                    .push(") AS newest");
                // The ids in one row: sqlx hands each row over from its thread on its own.
                self.fetch(q)
                    .await?
                    .first()
                    .and_then(|r| r.get::<Option<String>>(0).ok().flatten())
                    .map(|list| list.split(',').filter_map(|id| id.parse().ok()).collect())
                    .unwrap_or_default()
            }
        };
        // The cache key of a rendered job: its fields and the zone its times are in.
        let key = zone_key.map(|z| fields.0 | z << FIELD_BITS);
        if let Some(answer) = key.and_then(|k| self.units.answer(generation, k, &ids)) {
            return Ok(answer);
        }
        let mut rendered = match key {
            Some(k) => self.units.rows(generation, k, &ids),
            None => vec![None; ids.len()],
        };
        let missing: Vec<i64> = ids
            .iter()
            .zip(&rendered)
            .filter(|(_, json)| json.is_none())
            .map(|(id, _)| *id)
            .collect();
        let mut fresh = std::collections::HashMap::with_capacity(missing.len());
        let with_actions = fields.has(UNIT_FIELDS, "actions");
        for chunk in missing.chunks(RENDER_CHUNK) {
            let mut rows = self.unit_rows(chunk).await?;
            if with_actions {
                self.add_actions(&mut rows).await?;
            }
            for row in rows {
                let json = row.render(fields, &zone, &self.emissions_key);
                fresh.insert(row.id, Rendered::from(json));
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
        if let Some(k) = key {
            self.units.keep_answer(generation, k, &fresh, ids, &answer);
        }
        Ok(answer)
    }

    /// What the policies did to each of `rows`, oldest first (in one query).
    pub(super) async fn add_actions(&self, rows: &mut [UnitRow]) -> Result<(), ApiError> {
        let mut q = Sql::new(
            "SELECT u.id, p.policy, p.stage, p.action, p.dry_run, p.decided_at, p.outcome,
                    p.detail, p.done_at
             FROM policy_actions p JOIN units u ON u.cluster_id = p.cluster_id
                 AND u.uuid = p.uuid AND u.started_at = p.started_at
             WHERE u.id IN (",
        );
        for (i, row) in rows.iter().enumerate() {
            q.push(if i == 0 { "" } else { ", " }).bind(row.id);
        }
        q.push(") ORDER BY p.decided_at, p.id");
        let mut by_id: std::collections::HashMap<i64, Vec<serde_json::Value>> =
            std::collections::HashMap::new();
        for r in self.fetch(q).await? {
            let read = || -> Result<(i64, serde_json::Value), sqlx::Error> {
                Ok((
                    r.get(0)?,
                    serde_json::json!({
                        "policy": r.get::<String>(1)?,
                        "stage": r.get::<i64>(2)?,
                        "action": r.get::<String>(3)?,
                        "dry_run": r.get::<i64>(4)? != 0,
                        "decided_at": r.get::<i64>(5)?,
                        "outcome": r.get::<String>(6)?,
                        "detail": r.get::<String>(7)?,
                        "done_at": r.get::<Option<i64>>(8)?,
                    }),
                ))
            };
            let (id, action) = read().map_err(query_failed)?;
            by_id.entry(id).or_default().push(action);
        }
        for row in rows {
            row.actions = Some(serde_json::Value::Array(
                by_id.remove(&row.id).unwrap_or_default(),
            ));
        }
        Ok(())
    }

    /// The rows of the jobs `ids` (those still there).
    pub(super) async fn unit_rows(&self, ids: &[i64]) -> Result<Vec<UnitRow>, ApiError> {
        let mut q = Sql::new("SELECT ");
        q.push(UNIT_COLUMNS).push(" FROM units WHERE id IN (");
        for (i, id) in ids.iter().enumerate() {
            q.push(if i == 0 { "" } else { ", " }).bind(*id);
        }
        q.push(")");
        let rows = self.fetch(q).await?;
        // A row that cannot be read is an error, not a job left out of the answer.
        rows.iter()
            .map(UnitRow::read)
            .collect::<Result<_, _>>()
            .map_err(query_failed)
    }
}
