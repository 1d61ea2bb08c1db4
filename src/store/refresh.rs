//! A report asked for before the periodic update has reached its job (Slurm's end-of-job mail
//! asks the moment the job ends): that one job is pulled from accounting, its aggregates
//! brought up to date from Prometheus and its findings computed, in bounded time. When
//! Prometheus holds too few samples of the job, the report says its figures are partial.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::aggregate::{self, Limits, Queries};
use super::db::Store;
use super::findings::Thresholds;
use super::prometheus::Prometheus;
use super::rules::SharedRules;
use super::sql::Sql;
use crate::manager::{Accounting, RecordError};

/// Where one cluster's jobs and series come from.
pub struct RefreshSource {
    pub accounting: Arc<dyn Accounting>,
    pub prometheus: Option<Arc<dyn Prometheus>>,
}

pub struct JobRefresh {
    store: Arc<Store>,
    sources: HashMap<String, RefreshSource>,
    queries: Queries,
    limits: Limits,
    thresholds: Thresholds,
    /// The site's rules in force (swapped by SIGHUP).
    rules: SharedRules,
    /// At most this many jobs are refreshed at once; others wait their turn within the timeout.
    gate: tokio::sync::Semaphore,
    /// When each job was last refreshed: a job polled until it ends is pulled at most every
    /// `MIN_GAP` seconds.
    recent: Mutex<HashMap<(String, String), i64>>,
    timeout: Duration,
}

const MIN_GAP: i64 = 2;
const AT_ONCE: usize = 2;

/// What the report learns from a refresh.
#[derive(Debug, Default, PartialEq)]
pub struct Refreshed {
    /// Why the job's figures are partial, when they are.
    pub partial: Option<String>,
}

impl JobRefresh {
    pub fn new(
        store: Arc<Store>,
        sources: HashMap<String, RefreshSource>,
        queries: Queries,
        limits: Limits,
        thresholds: Thresholds,
        timeout: Duration,
    ) -> JobRefresh {
        JobRefresh {
            store,
            sources,
            queries,
            limits,
            thresholds,
            rules: SharedRules::default(),
            gate: tokio::sync::Semaphore::new(AT_ONCE),
            recent: Mutex::new(HashMap::new()),
            timeout,
        }
    }

    /// Judges with the site's rules too.
    pub fn with_rules(mut self, rules: SharedRules) -> JobRefresh {
        self.rules = rules;
        self
    }

    /// The clusters whose jobs can be pulled.
    pub fn clusters(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.sources.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Brings job `job` of `cluster` up to date unless the store already holds its final
    /// figures. Failures are logged, never returned: the report then shows what the store has.
    pub async fn refresh(&self, cluster: &str, job: &str, now: i64) -> Refreshed {
        let Some(source) = self.sources.get(cluster) else {
            return Refreshed::default();
        };
        // Nothing but a unit id reaches a manager's command (an argument, never a shell's).
        if !crate::manager::is_unit_id(job) {
            return Refreshed::default();
        }
        match self.state(cluster, job).await {
            Ok(Some(s)) if s.ended && (s.is_final() || source.prometheus.is_none()) => {
                return Refreshed::default()
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(cluster, job, error = %e, "cannot read the job to refresh it");
                return Refreshed::default();
            }
        }
        {
            let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
            let key = (cluster.to_owned(), job.to_owned());
            if recent.get(&key).is_some_and(|t| now - t < MIN_GAP) {
                return Refreshed::default();
            }
            recent.retain(|_, t| now - *t < 60);
            recent.insert(key, now);
        }
        let work = async {
            let _permit = self.gate.acquire().await.ok();
            self.pull(cluster, job, source, now).await
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                tracing::warn!(cluster, job, error = %e, "on-demand update of a job failed");
                Refreshed::default()
            }
            Err(_) => {
                tracing::warn!(cluster, job, timeout = ?self.timeout, "on-demand update of a job timed out");
                Refreshed {
                    partial: Some(format!(
                        "Partial: this job could not be brought up to date within {}s; its figures are those of the last periodic update.",
                        self.timeout.as_secs()
                    )),
                }
            }
        }
    }

    async fn state(&self, cluster: &str, job: &str) -> Result<Option<JobState>, anyhow::Error> {
        let q = Sql::new(
            "SELECT ended_at IS NOT NULL, aggregates_status, started_at, coalesce(ended_at, 0)
             FROM units WHERE cluster_id = $1 AND uuid = $2 ORDER BY started_at DESC LIMIT 1",
        )
        .arg(cluster)
        .arg(job);
        let Some(r) = self.store.fetch_optional(&q).await? else {
            return Ok(None);
        };
        Ok(Some(JobState {
            ended: r.flag(0)?,
            status: r.get(1)?,
            started_at: r.get(2)?,
            ended_at: r.get(3)?,
        }))
    }

    async fn pull(
        &self,
        cluster: &str,
        job: &str,
        source: &RefreshSource,
        now: i64,
    ) -> Result<Refreshed, anyhow::Error> {
        let known = self.state(cluster, job).await?;
        if !known.as_ref().is_some_and(|s| s.ended) {
            let accounting = Arc::clone(&source.accounting);
            let id = job.to_owned();
            let records = tokio::task::spawn_blocking(move || accounting.unit(&id)).await??;
            let mut kept = Vec::new();
            for record in records {
                match record {
                    Ok(r) => kept.push(r),
                    Err(RecordError::Malformed(e)) => {
                        tracing::warn!(cluster, job, line = e.line, error = %e.message, "skipping a malformed accounting record");
                    }
                    Err(RecordError::Broken(e)) => return Err(e.into()),
                }
            }
            let records = kept;
            self.store.upsert_jobs(cluster, &records, now, None).await?;
        }
        let mut out = Refreshed::default();
        if let Some(prometheus) = &source.prometheus {
            aggregate::update(
                &self.store,
                Arc::clone(prometheus),
                &self.queries,
                &self.limits,
                cluster,
                Some(job),
                now,
            )
            .await?;
            if let Some(s) = self.state(cluster, job).await? {
                let delay = i64::try_from(self.limits.query_delay.as_secs()).unwrap_or(0);
                out.partial = self.coverage(prometheus, job, &s, now - delay).await;
            }
        }
        self.store
            .refresh_findings(
                cluster,
                &self.thresholds,
                &super::rules::current(&self.rules),
                now,
            )
            .await?;
        Ok(out)
    }

    /// A note when Prometheus holds fewer than half the samples a job of this length has at
    /// the exporters' scrape interval (or fewer than two).
    async fn coverage(
        &self,
        prometheus: &Arc<dyn Prometheus>,
        job: &str,
        s: &JobState,
        now: i64,
    ) -> Option<String> {
        if s.status == "too_short" {
            return Some(format!(
                "Partial: the job ran {} s, shorter than the shortest job given aggregates (--prometheus.cutoff, {} s).",
                s.ended_at - s.started_at,
                self.limits.cutoff.as_secs()
            ));
        }
        if !s.ended || s.started_at <= 0 {
            return None;
        }
        let lived = (s.ended_at - s.started_at).max(1);
        let scrape = i64::try_from(self.limits.scrape_interval.as_secs())
            .unwrap_or(15)
            .max(1);
        let promql = format!(
            r#"max by (uuid) (count_over_time(ceems_compute_unit_memory_used_bytes{{uuid="{job}"}}[{}s]))"#,
            (now - s.started_at).max(1)
        );
        let p = Arc::clone(prometheus);
        let samples = tokio::task::spawn_blocking(move || p.query(&promql, now))
            .await
            .ok()?
            .ok()?
            .first()
            .map(|(_, v)| *v)
            .unwrap_or(0.0);
        let expected = (lived / scrape).max(1) as f64;
        (samples < 2.0 || samples < expected / 2.0).then(|| {
            format!(
                "Partial: Prometheus holds {samples:.0} sample(s) of this job over its {lived} s (about {expected:.0} at one every {scrape} s), so its figures cover only part of its life."
            )
        })
    }
}

struct JobState {
    ended: bool,
    status: String,
    started_at: i64,
    ended_at: i64,
}

impl JobState {
    fn is_final(&self) -> bool {
        matches!(self.status.as_str(), "done" | "too_short")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::{AccountingError, Associations, UnitRecords};
    use crate::store::prometheus::PromError;

    /// sacct as the refresh sees it: job 7 ended 10 s ago, after 100 s.
    struct OneJob {
        asked: Mutex<Vec<String>>,
    }

    impl Accounting for OneJob {
        fn manager(&self) -> &'static str {
            "slurm"
        }
        fn units_since(&self, _: i64) -> Result<UnitRecords, AccountingError> {
            unreachable!("a refresh asks for one job")
        }
        fn unit(&self, id: &str) -> Result<UnitRecords, AccountingError> {
            self.asked.lock().unwrap().push(id.to_owned());
            let line = format!("{id}|debug|normal|physics|alice|2001|alice|2001|1000|1790|1890|00:01:40|100|1:0|FAILED|billing=2,cpu=2,mem=1G,node=1|localhost|/tmp|60|run");
            let (jobs, _) = crate::manager::slurm::sacct::parse_output(&line);
            Ok(Box::new(jobs.into_iter().map(Ok)))
        }
        fn associations(
            &self,
        ) -> Option<Result<(Associations, Vec<crate::host::ParseError>), AccountingError>> {
            None
        }
    }

    /// Prometheus with 3 samples of the job and 1 CPU-s/s.
    struct Sparse;

    impl Prometheus for Sparse {
        fn query(&self, promql: &str, _: i64) -> Result<Vec<(String, f64)>, PromError> {
            let v = if promql.contains("count_over_time") {
                3.0
            } else if promql.contains("cpu_user") {
                100.0
            } else {
                return Ok(Vec::new());
            };
            Ok(vec![("7".to_owned(), v)])
        }
    }

    #[tokio::test]
    async fn a_job_the_store_has_not_seen_is_pulled_aggregated_and_judged_once() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Arc::new(crate::store::db::testing::store(tmp.path()).await);
        let accounting = Arc::new(OneJob {
            asked: Mutex::new(Vec::new()),
        });
        let refresh = JobRefresh::new(
            Arc::clone(&store),
            HashMap::from([(
                "lab".to_owned(),
                RefreshSource {
                    accounting: accounting.clone(),
                    prometheus: Some(Arc::new(Sparse)),
                },
            )]),
            Queries::default(),
            Limits {
                cutoff: Duration::from_secs(30),
                scrape_interval: Duration::from_secs(1),
                ..Limits::default()
            },
            Thresholds::default(),
            Duration::from_secs(10),
        );
        // Not a job id: sacct is not run.
        assert_eq!(
            refresh.refresh("lab", "--help", 1900).await,
            Refreshed::default()
        );
        assert!(accounting.asked.lock().unwrap().is_empty());

        let r = refresh.refresh("lab", "7", 1900).await;
        let note = r.partial.expect("3 samples of a 100 s job at 1 s");
        assert!(
            note.contains("3 sample(s)") && note.contains("100 s"),
            "{note}"
        );
        let r = store
            .fetch_one(&Sql::new(
                "SELECT cpu_seconds, aggregates_status, findings FROM units WHERE uuid = '7'",
            ))
            .await
            .unwrap();
        let (cpu, status, findings): (f64, String, String) =
            (r.get(0).unwrap(), r.get(1).unwrap(), r.get(2).unwrap());
        assert_eq!((cpu, status.as_str()), (100.0, "done"));
        assert!(findings.contains("job_failed"), "{findings}");

        // Final now: the next report asks nothing more.
        assert_eq!(
            refresh.refresh("lab", "7", 1905).await,
            Refreshed::default()
        );
        assert_eq!(*accounting.asked.lock().unwrap(), ["7"]);
    }
}
