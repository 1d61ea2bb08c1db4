//! One policy cycle over one cluster: resume the cancels a stopped server left, find the
//! running jobs a stage is due for, ask Prometheus what they used, and act on the idle ones
//! exactly once: each decision is claimed in the store before its mail or cancel goes out.

use std::sync::Arc;

use lettre::message::Mailbox;

use super::config::{Action, Policy, Resource, Window};
use super::decide::{self, Use, Watched};
use super::message::{self, Cost, Facts, Next};
use super::state::{self, Decision};
use super::usage::{self, Ask};
use crate::manager::{Accounting, UnitRecord};
use crate::notify::outbox::{deliver, enqueue};
use crate::notify::smtp::Delivery;
use crate::notify::{compose, message_id, Addresses};
use crate::store::db::{Store, StoreError, Tx};
use crate::store::prometheus::{PromError, Prometheus};

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Prometheus(#[from] PromError),
    #[error("{0}")]
    Task(String),
}

impl From<sqlx::Error> for PolicyError {
    fn from(e: sqlx::Error) -> PolicyError {
        PolicyError::Store(StoreError::Sql(e))
    }
}

/// How the policies' mail goes out.
pub struct Mailer {
    pub from: Mailbox,
    pub addresses: Addresses,
    pub delivery: Delivery,
}

/// The policies and what they act with.
pub struct Engine {
    pub policies: Vec<Policy>,
    /// None: no mail is configured (then no policy warns or has admins).
    pub mailer: Option<Mailer>,
    /// `--web.external-url`, for the report links.
    pub base_url: String,
    /// Jobs per query.
    pub batch: usize,
    /// PromQL of the energy and emissions of a job's nodes (the updater's): `(host power in
    /// W, GPU energy in J, emissions in g/s)`; an empty one is not asked.
    pub cost_queries: (String, String, String),
    /// Tries of a cancel the manager fails, before it is reported as failed.
    pub max_attempts: i64,
}

/// A cluster as a cycle sees it.
pub struct Target {
    pub id: String,
    pub accounting: Arc<dyn Accounting>,
    pub prometheus: Option<Arc<dyn Prometheus>>,
}

/// What one cycle did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Cycle {
    pub watched: usize,
    pub queries: usize,
    pub warned: usize,
    pub cancelled: usize,
    pub dry_run: usize,
    pub failed: usize,
    /// Jobs a stage was due for that Prometheus had no series of.
    pub no_data: usize,
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, PolicyError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| PolicyError::Task(e.to_string()))
}

impl Engine {
    /// One cycle over `target` at `now`.
    pub async fn cycle(
        &self,
        store: &Store,
        target: &Target,
        now: i64,
    ) -> Result<Cycle, PolicyError> {
        let mut cycle = Cycle::default();
        let mut outbox = Vec::new();
        self.resume(store, target, now, &mut cycle, &mut outbox)
            .await?;
        let jobs = state::running(store, &target.id).await?;
        for policy in self
            .policies
            .iter()
            .filter(|p| p.clusters.is_empty() || p.clusters.contains(&target.id))
        {
            let done = state::done(store, &target.id, &policy.name, policy.dry_run).await?;
            let mut due = Vec::new();
            for job in &jobs {
                if let Some(why) = decide::spared(policy, job) {
                    tracing::trace!(policy = %policy.name, job = %job.uuid, why, "not watched");
                    continue;
                }
                cycle.watched += 1;
                let last = done.get(&(job.uuid.clone(), job.started_at)).copied();
                if let Some(d) = decide::due(policy, job.started_at, last, now) {
                    due.push((job, d));
                }
            }
            if due.is_empty() {
                continue;
            }
            let Some(prometheus) = &target.prometheus else {
                tracing::warn!(policy = %policy.name, cluster = %target.id, "no Prometheus for this cluster: the policy cannot see what jobs use");
                continue;
            };
            let asks: Vec<Ask> = due
                .iter()
                .map(|(j, d)| Ask {
                    uuid: j.uuid.clone(),
                    window: d.window,
                    whole_life: policy.window == Window::SinceStart,
                })
                .collect();
            let answers = self
                .ask(prometheus, policy.query().to_owned(), asks, now)
                .await?;
            cycle.queries += answers.queries;
            let mut idle = Vec::new();
            for (job, d) in &due {
                let devices = answers
                    .by_uuid
                    .get(&job.uuid)
                    .map(Vec::as_slice)
                    .unwrap_or(&[]);
                match decide::judge(policy, devices) {
                    Use::NoData => cycle.no_data += 1,
                    Use::Busy { .. } => {}
                    Use::Idle { mean } => idle.push((*job, *d, mean)),
                }
            }
            if idle.is_empty() {
                continue;
            }
            let costs = self
                .costs(prometheus, policy, &idle, now, &mut cycle)
                .await?;
            for ((job, d, _), cost) in idle.into_iter().zip(costs) {
                self.act(
                    store,
                    target,
                    policy,
                    job,
                    d,
                    cost,
                    now,
                    &mut cycle,
                    &mut outbox,
                )
                .await?;
            }
        }
        // Every queued message, this cycle's and any an SMTP server deferred before: a
        // warning cannot wait for the next digest.
        if let Some(mailer) = &self.mailer {
            let round = deliver(store, &mailer.delivery, now).await?;
            if round != Default::default() || !outbox.is_empty() {
                tracing::info!(
                    queued = outbox.len(),
                    sent = round.sent,
                    deferred = round.deferred,
                    refused = round.refused,
                    "policy mail"
                );
            }
        }
        Ok(cycle)
    }

    async fn ask(
        &self,
        prometheus: &Arc<dyn Prometheus>,
        template: String,
        asks: Vec<Ask>,
        now: i64,
    ) -> Result<usage::Answers, PolicyError> {
        let p = Arc::clone(prometheus);
        let batch = self.batch;
        Ok(blocking(move || usage::ask(p.as_ref(), &template, &asks, batch, now)).await??)
    }

    /// What the idle windows cost, from the series the API's energy and emissions come from.
    async fn costs(
        &self,
        prometheus: &Arc<dyn Prometheus>,
        policy: &Policy,
        idle: &[(&Watched, decide::Due, f64)],
        now: i64,
        cycle: &mut Cycle,
    ) -> Result<Vec<Cost>, PolicyError> {
        let asks: Vec<Ask> = idle
            .iter()
            .map(|(j, d, _)| Ask {
                uuid: j.uuid.clone(),
                window: d.window,
                whole_life: policy.window == Window::SinceStart,
            })
            .collect();
        let (power, gpu, emissions) = &self.cost_queries;
        let mut figures = Vec::new();
        for template in [power, gpu, emissions] {
            if template.is_empty() {
                figures.push(None);
                continue;
            }
            let a = self
                .ask(prometheus, template.clone(), asks.clone(), now)
                .await?;
            cycle.queries += a.queries;
            figures.push(Some(a.by_uuid));
        }
        let sum = |i: usize, uuid: &str| -> Option<f64> {
            figures[i].as_ref()?.get(uuid).map(|v| v.iter().sum())
        };
        Ok(idle
            .iter()
            .map(|(job, d, mean)| {
                let held = match policy.resource {
                    Resource::Gpu => job.gpus,
                    Resource::Cpu => job.cpus,
                };
                let window = d.window as f64;
                let host_j = sum(0, &job.uuid).map(|w| w * window);
                let gpu_j = sum(1, &job.uuid);
                let energy_kwh = match (host_j, gpu_j) {
                    (None, None) => None,
                    (h, g) => Some((h.unwrap_or(0.0) + g.unwrap_or(0.0)) / 3.6e6),
                };
                Cost {
                    mean_use: *mean,
                    window_seconds: d.window,
                    held,
                    idle_hours: held as f64 * window / 3600.0,
                    energy_kwh,
                    emissions_grams: sum(2, &job.uuid).map(|g| g * window),
                }
            })
            .collect())
    }

    #[allow(clippy::too_many_arguments)]
    async fn act(
        &self,
        store: &Store,
        target: &Target,
        policy: &Policy,
        job: &Watched,
        due: decide::Due,
        cost: Cost,
        now: i64,
        cycle: &mut Cycle,
        outbox: &mut Vec<i64>,
    ) -> Result<(), PolicyError> {
        let action = due.what.action;
        let decision = Decision {
            cluster: target.id.clone(),
            uuid: job.uuid.clone(),
            started_at: job.started_at,
            user: job.user.clone(),
            policy: policy.name.clone(),
            stage: due.stage,
            action: match action {
                Action::Warn => "warn",
                Action::Cancel => "cancel",
            },
            dry_run: policy.dry_run,
            decided_at: now,
            figures: serde_json::to_value(&cost).unwrap_or_default(),
        };
        let facts = self.facts(policy, job, action, due.stage, &cost, None);
        let mut tx = store.write_tx().await?;
        if policy.dry_run || action == Action::Warn {
            let outcome = if policy.dry_run { "dry-run" } else { "mailed" };
            let Some(id) = state::claim(&mut tx, &decision, outcome).await? else {
                return Ok(());
            };
            let ids = self
                .queue(&mut tx, &decision, &facts, policy.dry_run, now)
                .await?;
            state::finish(&mut tx, id, outcome, "", Some(now), &ids).await?;
            tx.commit().await?;
            outbox.extend(ids);
            match policy.dry_run {
                true => cycle.dry_run += 1,
                false => cycle.warned += 1,
            }
            tracing::info!(policy = %policy.name, cluster = %target.id, job = %job.uuid, user = %job.user, stage = due.stage, action = decision.action, dry_run = policy.dry_run, mean_use = cost.mean_use, "policy decided");
            return Ok(());
        }
        let Some(id) = state::claim(&mut tx, &decision, "pending").await? else {
            return Ok(());
        };
        tx.commit().await?;
        tracing::info!(policy = %policy.name, cluster = %target.id, job = %job.uuid, user = %job.user, stage = due.stage, "policy cancels the job");
        let pending = state::Pending {
            id,
            attempts: 0,
            decision,
        };
        self.cancel(store, target, policy, pending, now, cycle, outbox)
            .await
    }

    fn facts<'a>(
        &self,
        policy: &'a Policy,
        job: &'a Watched,
        action: Action,
        stage: usize,
        cost: &'a Cost,
        cancelled: Option<String>,
    ) -> Facts<'a> {
        let stages = policy.stages();
        let warnings = policy.warn_after.len();
        // This stage and the next, where both are (a row of the database names the stage).
        let this = stage.checked_sub(1).and_then(|i| stages.get(i));
        let next = this.zip(stages.get(stage)).map(|(this, n)| Next {
            action: n.action,
            in_seconds: i64::try_from(n.after.saturating_sub(this.after).as_secs()).unwrap_or(0),
        });
        Facts {
            policy,
            job,
            action,
            warning: (stage.min(warnings), warnings),
            cost,
            next,
            report_url: format!("{}/report/{}/{}", self.base_url, job.cluster, job.uuid),
            cancelled,
        }
    }

    /// Queues the user's message (not in a dry run) and the admins' copies; their outbox rows.
    async fn queue(
        &self,
        tx: &mut Tx,
        d: &Decision,
        facts: &Facts<'_>,
        dry_run: bool,
        now: i64,
    ) -> Result<Vec<i64>, PolicyError> {
        let Some(m) = &self.mailer else {
            return Ok(Vec::new());
        };
        let key = format!(
            "{}/{}/{}/{}/{}",
            d.cluster, d.uuid, d.started_at, d.policy, d.stage
        );
        let date = std::time::SystemTime::UNIX_EPOCH
            + std::time::Duration::from_secs(u64::try_from(now).unwrap_or(0));
        let mut ids = Vec::new();
        let mut send = async |user: &str,
                              to: Result<lettre::Address, String>,
                              text: message::Text,
                              kind: &str| {
            let id = message_id("policy", &format!("{key}/{kind}"), now, &m.from);
            let built = to.and_then(|to| {
                compose(
                    &m.from,
                    to.clone(),
                    &text.subject,
                    &id,
                    date,
                    text.body,
                    None,
                )
                .map(|c| (to, c))
            });
            enqueue(tx, user, &m.from, built, &id, now).await
        };
        if !dry_run {
            let text = message::to_user(facts);
            ids.push(send(&d.user, m.addresses.of(&d.user), text, "user").await?);
        }
        for admin in &facts.policy.admins {
            let to = admin.parse::<lettre::Address>().map_err(|e| e.to_string());
            let text = message::to_admins(facts, dry_run);
            ids.push(send(admin, to, text, admin).await?);
        }
        Ok(ids)
    }

    /// Cancels one claimed job: the manager's answer for its id must still be this user's
    /// running job of this start, else nothing is done.
    #[allow(clippy::too_many_arguments)]
    async fn cancel(
        &self,
        store: &Store,
        target: &Target,
        policy: &Policy,
        pending: state::Pending,
        now: i64,
        cycle: &mut Cycle,
        outbox: &mut Vec<i64>,
    ) -> Result<(), PolicyError> {
        let d = &pending.decision;
        let acct = Arc::clone(&target.accounting);
        let uuid = d.uuid.clone();
        let start = d.started_at;
        // The record of this tenure of the id, else another one (the id given again).
        let fresh = blocking(move || -> Result<Option<UnitRecord>, String> {
            let records: Vec<UnitRecord> = acct
                .unit(&uuid)
                .map_err(|e| e.to_string())?
                .flatten()
                .filter(|r| r.uuid == uuid)
                .collect();
            let ours = records.iter().position(|r| r.start == Some(start));
            Ok(match ours {
                Some(i) => records.into_iter().nth(i),
                None => records.into_iter().last(),
            })
        })
        .await?;
        let user = d.user.as_str();
        let verdict = match fresh {
            Err(e) => Err(format!("cannot ask the manager about the job: {e}")),
            Ok(None) => Ok(("gone", "the manager no longer knows the job".to_owned(), None)),
            Ok(Some(u)) if u.user != user || u.start != Some(start) => Ok((
                "refused",
                format!(
                    "the manager's job {} is user {}'s, started at {:?}: not the job decided on ({user}'s, started at {start}); left alone",
                    u.uuid, u.user, u.start
                ),
                None,
            )),
            Ok(Some(u)) if u.state != "RUNNING" => Ok(("gone", format!("the job had ended ({})", u.state), None)),
            Ok(Some(u)) => {
                let acct = Arc::clone(&target.accounting);
                let unit = u.clone();
                match blocking(move || acct.cancel(&unit)).await? {
                    Ok(said) => Ok(("cancelled", said, Some(u))),
                    Err(e) => Err(e.to_string()),
                }
            }
        };
        let mut tx = store.write_tx().await?;
        match verdict {
            Ok((outcome, detail, unit)) => {
                let mut ids = Vec::new();
                if let Some(u) = unit {
                    let job = watched(&target.id, &u, target.accounting.manager());
                    let cost: Cost = serde_json::from_value(d.figures.clone()).unwrap_or_default();
                    let facts = self.facts(
                        policy,
                        &job,
                        Action::Cancel,
                        d.stage,
                        &cost,
                        Some(detail.clone()),
                    );
                    ids = self.queue(&mut tx, d, &facts, false, now).await?;
                    cycle.cancelled += 1;
                }
                state::finish(&mut tx, pending.id, outcome, &detail, Some(now), &ids).await?;
                tx.commit().await?;
                outbox.extend(ids);
                tracing::info!(policy = %d.policy, cluster = %target.id, job = %d.uuid, outcome, detail, "policy cancel");
            }
            Err(e) => {
                let spent = pending.attempts + 1 >= self.max_attempts;
                let outcome = if spent { "failed" } else { "pending" };
                state::finish(&mut tx, pending.id, outcome, &e, spent.then_some(now), &[]).await?;
                tx.commit().await?;
                match spent {
                    true => {
                        cycle.failed += 1;
                        tracing::error!(policy = %d.policy, cluster = %target.id, job = %d.uuid, attempts = pending.attempts + 1, error = %e, "policy cancel failed; given up");
                    }
                    false => {
                        tracing::warn!(policy = %d.policy, cluster = %target.id, job = %d.uuid, error = %e, "policy cancel failed; retried next cycle")
                    }
                }
            }
        }
        Ok(())
    }

    /// The cancels a stopped server claimed and did not finish: done now, after the same
    /// checks. A policy no longer configured (or now a dry run) does not act.
    async fn resume(
        &self,
        store: &Store,
        target: &Target,
        now: i64,
        cycle: &mut Cycle,
        outbox: &mut Vec<i64>,
    ) -> Result<(), PolicyError> {
        for pending in state::pending(store, &target.id).await? {
            match self
                .policies
                .iter()
                .find(|p| p.name == pending.decision.policy && !p.dry_run)
            {
                Some(policy) => {
                    tracing::info!(policy = %policy.name, job = %pending.decision.uuid, "resuming a cancel a stopped server left");
                    self.cancel(store, target, policy, pending, now, cycle, outbox)
                        .await?;
                }
                None => {
                    let mut tx = store.write_tx().await?;
                    let why = "the policy is no longer configured to cancel";
                    state::finish(&mut tx, pending.id, "dropped", why, Some(now), &[]).await?;
                    tx.commit().await?;
                }
            }
        }
        Ok(())
    }
}

/// A job as the manager described it, for the words of the mail.
fn watched(cluster: &str, u: &UnitRecord, manager: &str) -> Watched {
    Watched {
        cluster: cluster.to_owned(),
        uuid: u.uuid.clone(),
        started_at: u.start.unwrap_or(0),
        user: u.user.clone(),
        account: u.account.clone(),
        partition: u.partition.clone(),
        qos: u.qos.clone(),
        name: u.name.clone(),
        gpus: u.allocation.gpus,
        cpus: u.allocation.cpus,
        time_limit_seconds: u.time_limit_seconds.and_then(|t| i64::try_from(t).ok()),
        tags: String::new(),
        manager: manager.to_owned(),
    }
}
