//! What runs on timers once the server is up: the update of every cluster, backups, and the
//! counters served on /metrics.

use super::*;

/// Counters of one cluster, served on /metrics.
#[derive(Default)]
pub(super) struct Stats {
    pub(super) rows: AtomicU64,
    pub(super) malformed: AtomicU64,
    pub(super) failures: AtomicU64,
    pub(super) last_success: AtomicU64,
    /// When the last full update (jobs, aggregates, findings, usage) of the cluster ended.
    pub(super) last_update: AtomicU64,
    pub(super) aggregated: AtomicU64,
    pub(super) aggregate_failures: AtomicU64,
    pub(super) aggregate_queries: AtomicU64,
    pub(super) aggregate_splits: AtomicU64,
    /// How long the last aggregate run took, in milliseconds.
    pub(super) aggregate_millis: AtomicU64,
    /// Jobs the last aggregate run left for the next, past its budget.
    pub(super) aggregate_deferred: AtomicU64,
    pub(super) association_failures: AtomicU64,
    /// The stages of the update failing now, for /health.
    pub(super) failing: Failing,
}

/// The stages of a cluster's update whose last run failed: since when and why. A stage that
/// succeeds again is dropped.
#[derive(Default)]
pub(super) struct Failing(
    std::sync::Mutex<std::collections::BTreeMap<&'static str, (i64, String)>>,
);

impl Failing {
    pub(super) fn failed(&self, stage: &'static str, error: &dyn std::fmt::Display) {
        let mut stages = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let since = stages.get(stage).map_or_else(unix_now, |(since, _)| *since);
        stages.insert(stage, (since, format!("{error:#}")));
    }

    pub(super) fn succeeded(&self, stage: &'static str) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(stage);
    }

    /// One line per failing stage of `cluster`.
    fn lines(&self, cluster: &str) -> Vec<String> {
        let stages = self.0.lock().unwrap_or_else(|e| e.into_inner());
        stages
            .iter()
            .map(|(stage, (since, error))| {
                let since = jiff::Timestamp::from_second(*since)
                    .map_or_else(|_| since.to_string(), |t| t.to_string());
                format!("cluster {cluster}: {stage} failing since {since}: {error}")
            })
            .collect()
    }
}

/// `/health`: OK while every stage of every cluster's last update worked; else 503 and what
/// fails (the API may still answer: `/api/v1/health` says whether it can).
pub(super) fn health(sources: &[Source]) -> (hyper::StatusCode, String) {
    let lines: Vec<String> = sources
        .iter()
        .flat_map(|s| s.stats.failing.lines(&s.cluster.id))
        .collect();
    match lines.is_empty() {
        true => (hyper::StatusCode::OK, "OK\n".to_owned()),
        false => (
            hyper::StatusCode::SERVICE_UNAVAILABLE,
            format!("degraded\n{}\n", lines.join("\n")),
        ),
    }
}

pub(super) use crate::manager::unix_now;

/// A cluster with what it needs at run time.
pub(super) struct Source {
    pub(super) cluster: Cluster,
    pub(super) prometheus: Option<Arc<HttpPrometheus>>,
    /// This cluster's own queries (CEEMS's series), instead of the server's.
    pub(super) queries: Option<Queries>,
    pub(super) stats: Stats,
}

/// What the digests did since start, served on /metrics.
#[derive(Default)]
pub(super) struct MailStats {
    pub(super) sent: AtomicU64,
    pub(super) deferred: AtomicU64,
    pub(super) refused: AtomicU64,
}

pub(super) fn metrics(
    sources: &[Source],
    mail: &MailStats,
    api: &ApiActivity,
    policies: &super::policies::PolicyStats,
) -> String {
    let mut set = MetricSet::new();
    policies.encode(&mut set);
    set.counter(
        "ceems_stats_aggregate_yield_seconds_total",
        "Time queries for job aggregates waited for the API to be quiet (--prometheus.yield-to-api)",
        Labels::empty(),
        api.yielded().as_secs_f64(),
    );
    for (status, v) in [
        ("sent", &mail.sent),
        ("deferred", &mail.deferred),
        ("refused", &mail.refused),
    ] {
        set.counter(
            "ceems_stats_mail_messages_total",
            "Digest deliveries by outcome: sent, deferred (retried next period) or refused",
            Labels::new(&[("status", status)]),
            v.load(Ordering::Relaxed) as f64,
        );
    }
    for s in sources {
        let labels = Labels::new(&[("cluster_id", &s.cluster.id)]);
        let st = &s.stats;
        for (name, help, v) in [
            (
                "ceems_stats_ingested_rows_total",
                "Job rows written from sacct",
                &st.rows,
            ),
            (
                "ceems_stats_sacct_malformed_lines_total",
                "sacct lines skipped as malformed",
                &st.malformed,
            ),
            (
                "ceems_stats_ingest_failures_total",
                "Ingestion runs that failed",
                &st.failures,
            ),
            (
                "ceems_stats_aggregated_units_total",
                "Job aggregate updates written from Prometheus",
                &st.aggregated,
            ),
            (
                "ceems_stats_aggregate_failures_total",
                "Aggregate runs that failed (retried at the next run)",
                &st.aggregate_failures,
            ),
            (
                "ceems_stats_aggregate_queries_total",
                "Queries sent to Prometheus for job aggregates",
                &st.aggregate_queries,
            ),
            (
                "ceems_stats_aggregate_split_batches_total",
                "Batches of jobs Prometheus refused for their size, asked again in halves",
                &st.aggregate_splits,
            ),
            (
                "ceems_stats_sacctmgr_failures_total",
                "Runs of sacctmgr that failed",
                &st.association_failures,
            ),
        ] {
            set.counter(name, help, labels.clone(), v.load(Ordering::Relaxed) as f64);
        }
        set.gauge(
            "ceems_stats_last_ingest_timestamp_seconds",
            "When the last ingestion succeeded",
            labels.clone(),
            st.last_success.load(Ordering::Relaxed) as f64,
        );
        set.gauge(
            "ceems_stats_last_aggregate_duration_seconds",
            "How long the last run of job aggregates from Prometheus took",
            labels.clone(),
            st.aggregate_millis.load(Ordering::Relaxed) as f64 / 1000.0,
        );
        set.gauge(
            "ceems_stats_aggregate_deferred_jobs",
            "Jobs the last run of aggregates left for the next one, past --prometheus.update-budget (a backlog)",
            labels.clone(),
            st.aggregate_deferred.load(Ordering::Relaxed) as f64,
        );
        set.gauge(
            "ceems_stats_last_update_timestamp_seconds",
            "When the last update of jobs, aggregates, findings and usage ended",
            labels,
            st.last_update.load(Ordering::Relaxed) as f64,
        );
    }
    let mut body = String::new();
    set.encode_text(&mut body);
    body
}

/// What the update loop does and how often.
pub(super) struct UpdatePlan {
    pub(super) queries: Queries,
    pub(super) limits: Limits,
    pub(super) thresholds: Thresholds,
    pub(super) rules: crate::store::rules::SharedRules,
    pub(super) interval: Duration,
    pub(super) first_window: Duration,
    pub(super) retention: Duration,
}

/// Every interval: jobs, users and projects, aggregates and usage of each cluster, then
/// retention.
pub(super) async fn update_loop(store: Arc<Store>, sources: Arc<Vec<Source>>, plan: UpdatePlan) {
    let UpdatePlan {
        queries,
        limits,
        thresholds,
        rules,
        interval,
        first_window,
        retention,
    } = plan;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for s in sources.iter() {
            let id = s.cluster.id.as_str();
            let st = &s.stats;
            // Servers sharing a database update a cluster one at a time.
            let lease = match store.lease(&format!("update {id}")).await {
                Ok(Some(lease)) => {
                    st.failing.succeeded("update");
                    lease
                }
                Ok(None) => {
                    tracing::info!(
                        cluster = id,
                        "another stats-server on this database is updating the cluster; skipped"
                    );
                    continue;
                }
                Err(e) => {
                    st.failures.fetch_add(1, Ordering::Relaxed);
                    st.failing.failed("update", &e);
                    tracing::warn!(cluster = id, error = %e, "update not started; retrying at the next interval");
                    continue;
                }
            };
            // Where each update's time goes, logged at its end.
            let began = std::time::Instant::now();
            let mut phases: Vec<(&str, f64)> = Vec::with_capacity(5);
            let phase_end = |name, phases: &mut Vec<(&str, f64)>| {
                let at = began.elapsed().as_secs_f64();
                let before: f64 = phases.iter().map(|(_, s)| s).sum();
                phases.push((name, at - before));
            };
            let ingested = ingest::ingest_once(&store, &s.cluster, first_window, unix_now()).await;
            crate::host::heap::hand_back_freed();
            match ingested {
                Ok(r) => {
                    st.rows.fetch_add(r.rows as u64, Ordering::Relaxed);
                    st.malformed
                        .fetch_add(r.malformed as u64, Ordering::Relaxed);
                    st.last_success.store(unix_now() as u64, Ordering::Relaxed);
                    st.failing.succeeded("ingestion");
                    tracing::info!(
                        cluster = id,
                        rows = r.rows,
                        malformed = r.malformed,
                        "jobs ingested"
                    );
                }
                Err(e) => {
                    st.failures.fetch_add(1, Ordering::Relaxed);
                    st.failing.failed("ingestion", &e);
                    tracing::warn!(cluster = id, error = %e, "ingestion failed; retrying at the next interval");
                }
            }
            phase_end("jobs", &mut phases);
            // After the jobs: members taken from the jobs (LSF's opt-in) are this pull's.
            match ingest::sync_associations(&store, &s.cluster, unix_now()).await {
                Ok(Some(n)) => {
                    st.failing.succeeded("users and projects");
                    tracing::debug!(cluster = id, associations = n, "users and projects updated")
                }
                Ok(None) => st.failing.succeeded("users and projects"),
                Err(e) => {
                    st.association_failures.fetch_add(1, Ordering::Relaxed);
                    st.failing.failed("users and projects", &e);
                    tracing::warn!(cluster = id, error = %e, "users and projects not updated");
                }
            }
            phase_end("users and projects", &mut phases);
            if let Some(prometheus) = &s.prometheus {
                let began = std::time::Instant::now();
                let result = aggregate::update(
                    &store,
                    Arc::clone(prometheus) as Arc<dyn Prometheus>,
                    s.queries.as_ref().unwrap_or(&queries),
                    &limits,
                    id,
                    None,
                    unix_now(),
                )
                .await;
                crate::host::heap::hand_back_freed();
                st.aggregate_millis
                    .store(began.elapsed().as_millis() as u64, Ordering::Relaxed);
                match result {
                    Ok(r) => {
                        st.aggregated.fetch_add(r.updated as u64, Ordering::Relaxed);
                        st.failing.succeeded("aggregates from Prometheus");
                        st.aggregate_queries
                            .fetch_add(r.queries as u64, Ordering::Relaxed);
                        st.aggregate_splits
                            .fetch_add(r.splits as u64, Ordering::Relaxed);
                        st.aggregate_deferred
                            .store(r.deferred as u64, Ordering::Relaxed);
                        tracing::info!(
                            cluster = id,
                            jobs = r.updated,
                            too_short = r.too_short,
                            queries = r.queries,
                            split_batches = r.splits,
                            deferred = r.deferred,
                            "aggregates updated"
                        );
                    }
                    Err(e) => {
                        st.aggregate_failures.fetch_add(1, Ordering::Relaxed);
                        st.failing.failed("aggregates from Prometheus", &e);
                        tracing::warn!(cluster = id, error = %e, "aggregates not updated; retried at the next interval");
                    }
                }
                let template = &s.queries.as_ref().unwrap_or(&queries).node_cpu_seconds;
                let prometheus = Arc::clone(prometheus) as Arc<dyn Prometheus>;
                match crate::store::nodes::update(&store, prometheus, template, id, unix_now())
                    .await
                {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(
                        cluster = id,
                        jobs = n,
                        "per-node CPU time of multi-node jobs stored"
                    ),
                    Err(e) => {
                        tracing::warn!(cluster = id, error = %e, "per-node CPU time not stored; retried at the next interval")
                    }
                }
            }
            phase_end("aggregates", &mut phases);
            match store
                .refresh_findings(
                    id,
                    &thresholds,
                    &crate::store::rules::current(&rules),
                    unix_now(),
                )
                .await
            {
                Ok(0) => {}
                Ok(n) => tracing::info!(cluster = id, jobs = n, "findings updated"),
                Err(e) => tracing::warn!(cluster = id, error = %e, "findings not updated"),
            }
            crate::host::heap::hand_back_freed();
            phase_end("findings", &mut phases);
            if let Err(e) = store.rebuild_usage(id, unix_now()).await {
                tracing::warn!(cluster = id, error = %e, "usage not rebuilt");
            }
            crate::host::heap::hand_back_freed();
            phase_end("usage", &mut phases);
            let seconds: Vec<String> = phases
                .iter()
                .map(|(name, s)| format!("{name} {s:.1} s"))
                .collect();
            tracing::info!(
                cluster = id,
                seconds = format!("{:.1}", began.elapsed().as_secs_f64()),
                phases = seconds.join(", "),
                "cluster updated"
            );
            st.last_update.store(unix_now() as u64, Ordering::Relaxed);
            lease.release().await;
        }
        let Some(lease) = leased(&store, "retention").await else {
            continue;
        };
        let before = unix_now() - i64::try_from(retention.as_secs()).unwrap_or(i64::MAX / 2);
        match store.delete_ended_before(before).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(jobs = n, "deleted jobs past the retention period"),
            Err(e) => tracing::warn!(error = %e, "retention failed"),
        }
        lease.release().await;
    }
}

/// The lease on `task`, or None (logged) while another server holds it or the database does
/// not answer.
pub(super) async fn leased(store: &Store, task: &str) -> Option<db::Lease> {
    match store.lease(task).await {
        Ok(Some(lease)) => Some(lease),
        Ok(None) => {
            tracing::info!(
                task,
                "another stats-server on this database is doing it; skipped"
            );
            None
        }
        Err(e) => {
            tracing::warn!(task, error = %e, "cannot take the lease; retrying at the next interval");
            None
        }
    }
}

/// Every period: the digest round. Rounds are spaced by the period across restarts.
pub(super) async fn notify_loop(store: Arc<Store>, notifier: Notifier, stats: Arc<MailStats>) {
    loop {
        let wait = notifier.wait(&store, unix_now()).await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read when the last digest went; trying in a minute");
            Duration::from_secs(60)
        });
        tokio::time::sleep(wait).await;
        let Some(lease) = leased(&store, "digests").await else {
            tokio::time::sleep(Duration::from_secs(60)).await;
            continue;
        };
        // Another server sharing the database may have just sent this period's round.
        if !notifier
            .wait(&store, unix_now())
            .await
            .is_ok_and(|w| w.is_zero())
        {
            lease.release().await;
            continue;
        }
        let round = notifier.round(&store, unix_now()).await;
        lease.release().await;
        match round {
            Ok(r) => {
                stats.sent.fetch_add(r.sent as u64, Ordering::Relaxed);
                stats
                    .deferred
                    .fetch_add(r.deferred as u64, Ordering::Relaxed);
                stats.refused.fetch_add(r.refused as u64, Ordering::Relaxed);
                tracing::info!(
                    queued = r.queued,
                    sent = r.sent,
                    deferred = r.deferred,
                    refused = r.refused,
                    quiet_jobs = r.quiet_jobs,
                    "digest round"
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "digest round failed; trying again in a minute");
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
        }
    }
}

pub(super) async fn backup_loop(store: Arc<Store>, dir: PathBuf, interval: Duration, keep: usize) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot create the backup directory");
            continue;
        }
        let path = dir.join(db::backup_name(unix_now()));
        match store.backup_to(&path).await {
            Ok(()) => {
                tracing::info!(path = %path.display(), "database backed up");
                match db::prune_backups(&dir, keep) {
                    Ok(old) if !old.is_empty() => {
                        tracing::info!(deleted = old.len(), "old backups pruned")
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(dir = %dir.display(), error = %e, "cannot prune backups")
                    }
                }
            }
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "backup failed"),
        }
    }
}
