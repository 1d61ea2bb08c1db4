//! The per-node CPU time of multi-node jobs: which jobs are due, and their figures stored.

use super::{Store, StoreError};
use crate::store::sql::Sql;

/// An ended multi-node job whose per-node figures are due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodesDue {
    pub row: i64,
    pub uuid: String,
    pub started_at: i64,
    pub ended_at: i64,
}

/// The jobs due: its terms include each of the index's.
pub(super) const NODES_DUE: &str = "SELECT id, uuid, started_at, ended_at FROM units
     WHERE cluster_id = $1 AND node_cpu_seconds IS NULL AND aggregates_status = 'done'
       AND started_at > 0 AND ended_at IS NOT NULL AND nodes LIKE '%,%'
     ORDER BY id LIMIT $2";

impl Store {
    /// Up to `limit` ended jobs of `cluster` on several nodes whose aggregates are done and
    /// whose per-node figures were never asked, oldest row first. Its terms include the
    /// predicate of the partial index `units_nodes_due` (migrations 0017, 0019), which it reads.
    pub async fn multi_node_jobs_due(
        &self,
        cluster: &str,
        limit: i64,
    ) -> Result<Vec<NodesDue>, StoreError> {
        let q = Sql::new(NODES_DUE).arg(cluster).arg(limit);
        let mut out = Vec::new();
        for r in self.fetch_all(&q).await? {
            out.push(NodesDue {
                row: r.get(0)?,
                uuid: r.get(1)?,
                started_at: r.get(2)?,
                ended_at: r.get(3)?,
            });
        }
        Ok(out)
    }

    /// Stores each job's per-node CPU seconds (a JSON object) and has its findings judged
    /// again.
    pub async fn set_node_cpu_seconds(&self, figures: &[(i64, String)]) -> Result<(), StoreError> {
        if figures.is_empty() {
            return Ok(());
        }
        let mut tx = self.write_tx().await?;
        for (row, json) in figures {
            tx.execute(
                &Sql::new(
                    "UPDATE units SET node_cpu_seconds = $1, findings_updated_at = NULL WHERE id = $2",
                )
                .arg(json.as_str())
                .arg(*row),
            )
            .await?;
        }
        tx.commit().await?;
        let rows: Vec<i64> = figures.iter().map(|(row, _)| *row).collect();
        self.written_units(&rows);
        Ok(())
    }
}
