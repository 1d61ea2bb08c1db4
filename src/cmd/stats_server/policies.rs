//! The stats-server's policies: read from `[[stats-server.policies]]` (or CEEMS's YAML
//! `policies:`), checked at start, and run every `--policy.interval` over each cluster.

use super::*;
use crate::policy::{self, Engine, Mailer, Target};

pub(super) fn opts() -> Vec<Opt> {
    vec![
        Opt::new(
            "policies",
            Kind::FileOnly,
            "Policies that warn, then cancel, running jobs that hold GPUs (or cores) and use none; see docs/guide/policies.md",
        ),
        Opt::new(
            "policy.interval",
            Kind::Duration,
            "How often the policies look at the running jobs",
        )
        .default("5m"),
    ]
}

/// `--policy.interval`, at least a second.
pub(super) fn interval(settings: &Layered) -> anyhow::Result<Duration> {
    #[derive(Deserialize)]
    struct Policy {
        #[serde(deserialize_with = "config::de_duration")]
        interval: Duration,
    }
    let p: Policy = settings.get("policy")?;
    anyhow::ensure!(
        p.interval >= Duration::from_secs(1),
        "--policy.interval must be at least 1s"
    );
    Ok(p.interval)
}

/// The engine of the configured policies, or None when there are none. A policy that must
/// mail someone (a user it warns or whose job it cancels, or its admins) while no mail is
/// configured stops the start.
pub(super) fn engine(
    settings: &Layered,
    notify: &NotifySettings,
    base_url: String,
    prom: &PrometheusSettings,
) -> anyhow::Result<Option<Engine>> {
    let Some(value) = settings.table.get("policies").cloned() else {
        return Ok(None);
    };
    let policies = policy::config::parse(value).map_err(anyhow::Error::msg)?;
    if policies.is_empty() {
        return Ok(None);
    }
    let delivery = match notify.eml_dir.is_empty() {
        false => Some(Delivery::Directory(PathBuf::from(&notify.eml_dir))),
        true => match notify.mail.server()? {
            Some(server) => Some(notify.mail.delivery(&server)?),
            None => None,
        },
    };
    let mailer = match delivery {
        Some(delivery) => Some(Mailer {
            from: notify.mail.sender()?,
            addresses: notify.mail.addresses()?,
            delivery,
        }),
        None => {
            if let Some(p) = policies.iter().find(|p| !p.admins.is_empty() || !p.dry_run) {
                anyhow::bail!(
                    "policies: `{}` mails users or admins, but no mail is set up: set --notify.smtp.host (or --notify.eml-dir to write the messages as files)",
                    p.name
                );
            }
            None
        }
    };
    for p in &policies {
        tracing::info!(
            policy = %p.name,
            dry_run = p.dry_run,
            resource = ?p.resource,
            stages = ?p.stages().iter().map(|s| format!("{:?} after {}", s.action, humantime::format_duration(s.after))).collect::<Vec<_>>(),
            "policy loaded"
        );
    }
    let q = &prom.queries;
    Ok(Some(Engine {
        policies,
        mailer,
        base_url,
        batch: usize::try_from(prom.max_batch.max(1)).unwrap_or(1),
        cost_queries: (
            q.host_power_watts.clone(),
            q.gpu_energy_joules.clone(),
            q.emissions_grams_per_second.clone(),
        ),
        max_attempts: 3,
    }))
}

/// What the policies did, served on /metrics.
#[derive(Default)]
pub(super) struct PolicyStats {
    /// (policy, stage, outcome, count) from the database: the same on every server sharing it.
    pub(super) totals: std::sync::Mutex<Vec<(String, String, String, u64)>>,
    pub(super) queries: AtomicU64,
    pub(super) cycle_millis: AtomicU64,
}

impl PolicyStats {
    /// The counters from the database, where every server's actions are (kept as they were
    /// when it does not answer).
    async fn refresh_totals(&self, store: &Store) {
        if let Ok(totals) = policy::state::totals(store).await {
            *self.totals.lock().unwrap_or_else(|e| e.into_inner()) = totals;
        }
    }

    pub(super) fn encode(&self, set: &mut MetricSet) {
        let totals = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        for (policy, stage, outcome, n) in totals.iter() {
            set.counter(
                "ceems_stats_policy_actions_total",
                "Actions of the policies on running jobs, by policy, stage and outcome",
                Labels::new(&[("policy", policy), ("stage", stage), ("outcome", outcome)]),
                *n as f64,
            );
        }
        set.counter(
            "ceems_stats_policy_queries_total",
            "Queries the policies sent to Prometheus",
            Labels::empty(),
            self.queries.load(Ordering::Relaxed) as f64,
        );
        set.gauge(
            "ceems_stats_policy_cycle_duration_seconds",
            "How long the last policy cycle over every cluster took",
            Labels::empty(),
            self.cycle_millis.load(Ordering::Relaxed) as f64 / 1000.0,
        );
    }
}

/// Every interval, under a lease shared by servers on one database: one cycle per cluster.
pub(super) async fn policy_loop(
    store: Arc<Store>,
    sources: Arc<Vec<Source>>,
    engine: Engine,
    interval: Duration,
    stats: Arc<PolicyStats>,
) {
    let targets: Vec<Target> = sources
        .iter()
        .map(|s| Target {
            id: s.cluster.id.clone(),
            accounting: Arc::clone(&s.cluster.accounting),
            prometheus: s
                .prometheus
                .as_ref()
                .map(|p| Arc::clone(p) as Arc<dyn Prometheus>),
        })
        .collect();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        stats.refresh_totals(&store).await;
        let Some(lease) = leased(&store, "policies").await else {
            continue;
        };
        let began = std::time::Instant::now();
        for (target, source) in targets.iter().zip(sources.iter()) {
            match engine.cycle(&store, target, unix_now()).await {
                Ok(c) => {
                    source.stats.failing.succeeded("policies");
                    stats.queries.fetch_add(c.queries as u64, Ordering::Relaxed);
                    tracing::info!(
                        cluster = %target.id,
                        watched = c.watched,
                        queries = c.queries,
                        warned = c.warned,
                        cancelled = c.cancelled,
                        dry_run = c.dry_run,
                        failed = c.failed,
                        no_data = c.no_data,
                        "policy cycle"
                    );
                }
                Err(e) => {
                    source.stats.failing.failed("policies", &e);
                    tracing::warn!(cluster = %target.id, error = %e, "policy cycle failed; retried at the next interval");
                }
            }
        }
        stats
            .cycle_millis
            .store(began.elapsed().as_millis() as u64, Ordering::Relaxed);
        lease.release().await;
        stats.refresh_totals(&store).await;
    }
}
