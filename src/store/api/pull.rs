//! Units a request names by id that the database does not hold yet (a job started after the
//! last periodic update): pulled from their manager before the answer, as the report page
//! does, so that the owner of a job started a minute ago sees it in Grafana. Bounded: a few
//! ids per request, a few pulls per user per second, each job at most every two seconds
//! (`JobRefresh`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::*;
use crate::store::refresh::JobRefresh;

/// Most ids of one request pulled.
const PER_REQUEST: usize = 5;
/// Most pulls one user starts in a second.
const PER_USER_PER_SECOND: u32 = 5;

pub(super) struct OnDemand {
    refresh: Arc<JobRefresh>,
    budget: PullBudget,
}

/// Per user: the second of their last pulls and how many were started in it.
#[derive(Default)]
struct PullBudget(Mutex<HashMap<String, (i64, u32)>>);

impl PullBudget {
    /// Whether `user` may start one more pull in second `now`.
    fn take(&self, user: &str, now: i64) -> bool {
        let mut users = self.0.lock().unwrap_or_else(|p| p.into_inner());
        users.retain(|_, (second, _)| *second == now);
        let (_, used) = users.entry(user.to_owned()).or_insert((now, 0));
        *used += 1;
        *used <= PER_USER_PER_SECOND
    }
}

impl Api {
    /// The on-demand pull of units named by id, through the report's refresh.
    pub fn with_on_demand_pull(mut self, refresh: Arc<JobRefresh>) -> Api {
        self.on_demand = Some(OnDemand {
            refresh,
            budget: PullBudget::default(),
        });
        self
    }

    /// Pulls the ids of `uuid=` (on the clusters of `cluster_id=`, else every cluster the
    /// refresh reaches) that no unit holds yet.
    pub(super) async fn pull_unknown(&self, p: &Params, user: &str, now: i64) {
        let Some(on_demand) = &self.on_demand else {
            return;
        };
        let asked: Vec<&String> = p
            .all("uuid")
            .iter()
            .filter(|u| crate::manager::is_unit_id(u))
            .take(PER_REQUEST)
            .collect();
        if asked.is_empty() {
            return;
        }
        let clusters: Vec<String> = match p.all("cluster_id") {
            [] => on_demand.refresh.clusters(),
            named => named.to_vec(),
        };
        let mut q = Sql::new("SELECT cluster_id, uuid FROM units WHERE 1 = 1");
        q.push_in(
            "uuid",
            &asked.iter().map(|u| u.to_string()).collect::<Vec<_>>(),
        )
        .push_in("cluster_id", &clusters);
        let known: std::collections::HashSet<(String, String)> = match self.fetch(q).await {
            Ok(rows) => rows
                .iter()
                .filter_map(|r| Some((r.get(0).ok()?, r.get(1).ok()?)))
                .collect(),
            Err(_) => return,
        };
        let mut pulls = Vec::new();
        'ids: for cluster in &clusters {
            for uuid in &asked {
                if known.contains(&(cluster.clone(), uuid.to_string())) {
                    continue;
                }
                if !on_demand.budget.take(user, now) {
                    tracing::debug!(user, "on-demand pulls past the per-user budget");
                    break 'ids;
                }
                pulls.push(on_demand.refresh.refresh(cluster, uuid, now));
            }
        }
        // Together: the refresh's own gate bounds how many run at once, and the answer waits
        // for the slowest rather than for their sum.
        futures_util::future::join_all(pulls).await;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_user_s_pulls_are_bounded_per_second() {
        let budget = super::PullBudget::default();
        let first = (0..7).filter(|_| budget.take("alice", 100)).count();
        assert_eq!(first, super::PER_USER_PER_SECOND as usize);
        assert!(budget.take("bob", 100), "another user has their own budget");
        assert!(budget.take("alice", 101), "the next second starts afresh");
    }
}
