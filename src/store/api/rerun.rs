//! `POST /api/v1/findings/rerun/admin` (ceems's): judges stored jobs again with the rules in
//! force, after the site edited its rules; what `ceems tool findings --rerun` calls.

use super::*;
use crate::store::findings::Thresholds;
use crate::store::rules::SiteRules;

impl Api {
    /// Judges again the jobs of `clusters` (or those of `cluster_id`) that ended between
    /// `from` and `to` (by default the last day) and those still running. Answers how many
    /// jobs were judged and by how many site rules.
    pub async fn rerun_findings(
        &self,
        query: Option<&str>,
        user: Option<&str>,
        (thresholds, rules): (&Thresholds, &SiteRules),
        clusters: &[String],
        now: i64,
    ) -> Answer {
        self.rerun(query, user, thresholds, rules, clusters, now)
            .await
            .unwrap_or_else(Answer::from)
    }

    async fn rerun(
        &self,
        query: Option<&str>,
        user: Option<&str>,
        thresholds: &Thresholds,
        rules: &SiteRules,
        clusters: &[String],
        now: i64,
    ) -> Result<Answer, ApiError> {
        let user = self.user(user)?;
        self.require_admin(user).await?;
        let p = Params::parse(query);
        p.only(&["from", "to", "cluster_id"])?;
        let window = window(&p, now)?;
        let wanted = p.all("cluster_id");
        if let Some(unknown) = wanted.iter().find(|c| !clusters.contains(c)) {
            return Err(ApiError::bad(format!(
                "`cluster_id`: no cluster `{unknown}` (known: {})",
                clusters.join(", ")
            )));
        }
        let mut judged = 0;
        for c in clusters
            .iter()
            .filter(|c| wanted.is_empty() || wanted.contains(c))
        {
            judged += self
                .store
                .rejudge_findings(c, thresholds, rules, window, now)
                .await
                .map_err(|e| ApiError::Internal(format!("cluster {c}: {e}")))?;
        }
        tracing::info!(
            user,
            from = window.0,
            to = window.1,
            jobs = judged,
            site_rules = rules.len(),
            "findings judged again"
        );
        Ok(Answer::data(json!({
            "jobs": judged,
            "site_rules": rules.len(),
            "from": window.0,
            "to": window.1,
        })))
    }
}
