//! The digest round: jobs that ended with findings and were never looked at are grouped by
//! user; each user's message is queued in the database in the same transaction that marks its
//! jobs, then the outbox is sent. A message the SMTP server cannot take now stays queued for
//! the next round; one it refuses for good is logged and kept as refused.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, SystemTime};

use lettre::address::Envelope;
use lettre::message::Mailbox;

use super::digest::{self, JobFindings};
use super::smtp::{Delivery, MailError};
use super::{compose, message_id, Addresses};
use crate::store::db::{Store, StoreError, Tx};
use crate::store::findings::{Finding, Severity, Thresholds};
use crate::store::sql::Sql;

/// What the notifier sends, and to whom.
pub struct Notifier {
    pub from: Mailbox,
    pub addresses: Addresses,
    /// Jobs whose most severe finding is below this get no mail.
    pub min_severity: Severity,
    pub opt_out: HashSet<String>,
    /// `--web.external-url`, for the links to reports.
    pub base_url: String,
    /// Clusters whose aggregates come from Prometheus: their jobs wait until those are done,
    /// so a digest never says less than the report will.
    pub aggregated_clusters: HashSet<String>,
    pub delivery: Delivery,
    pub period: Duration,
    /// What the findings were judged by, for the subjects' words.
    pub thresholds: Thresholds,
}

/// What one round did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Round {
    /// Messages queued this round.
    pub queued: usize,
    /// Jobs looked at that need no mail.
    pub quiet_jobs: usize,
    pub sent: usize,
    pub deferred: usize,
    pub refused: usize,
}

const LAST_ROUND: &str = "last_round";
const FLOOR: &str = "floor";

async fn state(store: &Store, key: &str) -> Result<Option<i64>, StoreError> {
    let q = Sql::new("SELECT value FROM notify_state WHERE key = $1").arg(key);
    match store.fetch_optional(&q).await? {
        Some(r) => Ok(Some(r.get(0)?)),
        None => Ok(None),
    }
}

async fn set_state(store: &Store, key: &str, value: i64) -> Result<(), StoreError> {
    store
        .execute(
            &Sql::new(
                "INSERT INTO notify_state (key, value) VALUES ($1, $2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            )
            .arg(key)
            .arg(value),
        )
        .await?;
    Ok(())
}

/// A job the round looks at.
struct Candidate {
    row: i64,
    user: String,
    job: JobFindings,
}

impl Notifier {
    /// Seconds until the next round is due; rounds are spaced by the period across restarts.
    pub async fn wait(&self, store: &Store, now: i64) -> Result<Duration, StoreError> {
        let period = i64::try_from(self.period.as_secs()).unwrap_or(i64::MAX / 2);
        Ok(match state(store, LAST_ROUND).await? {
            Some(last) => Duration::from_secs(u64::try_from(last + period - now).unwrap_or(0)),
            None => Duration::ZERO,
        })
    }

    /// Queues this period's digests, then sends every queued message.
    pub async fn round(&self, store: &Store, now: i64) -> Result<Round, StoreError> {
        let mut round = self.queue(store, now).await?;
        self.send_queued(store, now, &mut round).await?;
        set_state(store, LAST_ROUND, now).await?;
        Ok(round)
    }

    /// The jobs not looked at yet that ended after the floor: the first round's time less a
    /// period or a day, whichever is longer, so turning mail on does not mail a year of old
    /// jobs.
    async fn candidates(&self, store: &Store, now: i64) -> Result<Vec<Candidate>, StoreError> {
        let floor = match state(store, FLOOR).await? {
            Some(f) => f,
            None => {
                let f = now - i64::try_from(self.period.as_secs().max(86400)).unwrap_or(0);
                set_state(store, FLOOR, f).await?;
                f
            }
        };
        let q = Sql::new(
            "SELECT u.id, u.usr, u.cluster_id, u.uuid, u.name, u.state, u.ended_at,
                    u.findings, u.aggregates_status
             FROM units u
             WHERE u.ended_at IS NOT NULL AND u.ended_at >= $1 AND u.started_at > 0
               AND u.findings_updated_at IS NOT NULL
               AND u.findings_updated_at >= u.last_updated_at
               AND u.findings_updated_at >= coalesce(u.aggregates_updated_at, 0)
               AND NOT EXISTS (SELECT 1 FROM mailed_units m WHERE m.unit_id = u.id)
             ORDER BY u.usr, u.ended_at, u.id",
        )
        .arg(floor);
        let rows = store.fetch_all(&q).await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let cluster: String = r.get(2)?;
            let status: String = r.get(8)?;
            if self.aggregated_clusters.contains(&cluster)
                && !matches!(status.as_str(), "done" | "too_short")
            {
                continue;
            }
            let findings: Option<String> = r.get(7)?;
            let row: i64 = r.get(0)?;
            let findings: Vec<Finding> = match findings.as_deref().map(serde_json::from_str) {
                None => Vec::new(),
                Some(Ok(f)) => f,
                Some(Err(e)) => {
                    tracing::warn!(row, error = %e, "unreadable findings of a job; not mailed");
                    Vec::new()
                }
            };
            out.push(Candidate {
                row,
                user: r.get(1)?,
                job: JobFindings {
                    cluster,
                    uuid: r.get(3)?,
                    name: r.get(4)?,
                    state: r.get(5)?,
                    ended_at: r.get(6)?,
                    findings,
                },
            });
        }
        Ok(out)
    }

    async fn queue(&self, store: &Store, now: i64) -> Result<Round, StoreError> {
        let mut round = Round::default();
        let mut quiet = Vec::new();
        let mut by_user: BTreeMap<String, Vec<Candidate>> = BTreeMap::new();
        for mut c in self.candidates(store, now).await? {
            let worth = c
                .job
                .findings
                .iter()
                .any(|f| f.severity >= self.min_severity);
            if !worth || self.opt_out.contains(&c.user) {
                quiet.push(c.row);
                continue;
            }
            // The mail names the findings that are worth it, and the energy note with them.
            c.job
                .findings
                .retain(|f| f.severity >= self.min_severity || f.id == "energy");
            by_user.entry(c.user.clone()).or_default().push(c);
        }
        let mut tx = store.write_tx().await?;
        for (user, jobs) in &by_user {
            let found: Vec<JobFindings> = jobs.iter().map(|c| c.job.clone()).collect();
            let id = message_id("digest", user, now, &self.from);
            let built = self.addresses.of(user).and_then(|to| {
                let composed = compose(
                    &self.from,
                    to.clone(),
                    &digest::subject(&found, &self.thresholds),
                    &id,
                    SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(now).unwrap_or(0)),
                    digest::text(user, &found, &self.base_url),
                    Some(digest::html(user, &found, &self.base_url)),
                )?;
                Ok((to, composed))
            });
            let queued = built.is_ok();
            if let Err(e) = &built {
                tracing::warn!(user = %user.escape_debug(), error = %e, "a user's digest is skipped");
                round.refused += 1;
            }
            let message = enqueue(&mut tx, user, &self.from, built, &id, now).await?;
            for c in jobs {
                mark(&mut tx, c.row, Some(message)).await?;
            }
            round.queued += usize::from(queued);
        }
        for row in &quiet {
            mark(&mut tx, *row, None).await?;
        }
        tx.commit().await?;
        round.quiet_jobs = quiet.len();
        Ok(round)
    }

    async fn send_queued(
        &self,
        store: &Store,
        now: i64,
        round: &mut Round,
    ) -> Result<(), StoreError> {
        let sent = deliver(store, &self.delivery, now).await?;
        round.sent += sent.sent;
        round.deferred += sent.deferred;
        round.refused += sent.refused;
        Ok(())
    }
}

/// Queues one message in `tx` and returns its row; a message that cannot be built or has no
/// recipient is kept as refused, with why.
pub async fn enqueue(
    tx: &mut Tx,
    user: &str,
    from: &Mailbox,
    built: Result<(lettre::Address, super::Composed), String>,
    message_id: &str,
    now: i64,
) -> Result<i64, StoreError> {
    let (rcpt, raw, status, error) = match built {
        Ok((to, composed)) => (to.to_string(), composed.raw, "queued", None),
        Err(e) => (String::new(), Vec::new(), "refused", Some(e)),
    };
    let q = Sql::new(
        "INSERT INTO mail_outbox (usr, mail_from, rcpt_to, message_id, raw, created_at, status, last_error)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
    )
    .arg(user)
    .arg(from.email.to_string())
    .arg(rcpt)
    .arg(message_id)
    .arg(raw)
    .arg(now)
    .arg(status)
    .arg(error);
    Ok(tx.fetch_one(&q).await?.get(0)?)
}

/// Sends the queued messages, oldest first (the digests' and the policies'). Each is claimed
/// (`sending`) before it goes, so two senders never send one message; one that a crash left
/// `sending` is not sent again, since it may have gone.
pub async fn deliver(store: &Store, delivery: &Delivery, now: i64) -> Result<Round, StoreError> {
    let mut round = Round::default();
    let queued = store
        .fetch_all(&Sql::new(
            "SELECT id, usr, mail_from, rcpt_to, raw FROM mail_outbox
             WHERE status = 'queued' ORDER BY id",
        ))
        .await?;
    for (i, r) in queued.iter().enumerate() {
        let id: i64 = r.get(0)?;
        let claimed = store
            .execute(
                &Sql::new(
                    "UPDATE mail_outbox SET status = 'sending' WHERE id = $1 AND status = 'queued'",
                )
                .arg(id),
            )
            .await?;
        if claimed == 0 {
            continue;
        }
        let user: String = r.get(1)?;
        let from: String = r.get(2)?;
        let to: String = r.get(3)?;
        let envelope = (|| {
            Envelope::new(
                Some(from.parse().map_err(|e| format!("sender `{from}`: {e}"))?),
                vec![to.parse().map_err(|e| format!("recipient `{to}`: {e}"))?],
            )
            .map_err(|e| e.to_string())
        })();
        let raw: Vec<u8> = r.get(4)?;
        let result = match envelope {
            Ok(envelope) => {
                delivery
                    .send(&envelope, &raw, &format!("mail-{id:08}"))
                    .await
            }
            Err(e) => Err(MailError::Refused(e)),
        };
        let (status, error) = match &result {
            Ok(()) => ("sent", None),
            Err(MailError::Refused(e)) => ("refused", Some(e.clone())),
            Err(e) => ("queued", Some(e.to_string())),
        };
        let sent_at = (status == "sent").then_some(now);
        store
            .execute(
                &Sql::new(
                    "UPDATE mail_outbox SET status = $2, attempts = attempts + 1, last_error = $3,
                            sent_at = $4
                     WHERE id = $1",
                )
                .arg(id)
                .arg(status)
                .arg(error.clone())
                .arg(sent_at),
            )
            .await?;
        match result {
            Ok(()) => round.sent += 1,
            Err(MailError::Refused(e)) => {
                round.refused += 1;
                tracing::warn!(user = %user.escape_debug(), message = id, error = %e, "a message was refused; not retried");
            }
            Err(e) => {
                // The server is down or says later: the rest would fail the same way.
                let left = queued.len() - i;
                round.deferred += left;
                tracing::warn!(messages = left, error = %e, "messages not delivered; retried later");
                break;
            }
        }
    }
    Ok(round)
}

async fn mark(tx: &mut Tx, row: i64, message: Option<i64>) -> Result<(), StoreError> {
    tx.execute(
        &Sql::new("INSERT INTO mailed_units (unit_id, message_id) VALUES ($1, $2)")
            .arg(row)
            .arg(message),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::api::tests::{line, NOW};
    use crate::store::findings::Thresholds;

    async fn store_with(lines: &[String], dir: &std::path::Path) -> Store {
        let store = crate::store::db::testing::store(dir).await;
        let (jobs, errors) = crate::manager::slurm::sacct::parse_output(&lines.join("\n"));
        assert!(errors.is_empty(), "{errors:?}");
        store.register_cluster("lab", "slurm").await.unwrap();
        store.ingest("lab", &jobs, 0, NOW).await.unwrap();
        store
            .refresh_findings(
                "lab",
                &Thresholds::default(),
                &crate::store::rules::SiteRules::default(),
                NOW,
            )
            .await
            .unwrap();
        store
    }

    fn failed(id: u32, user: &str) -> String {
        line(id, user, "physics", NOW - 3600, Some(NOW - 600)).replace("COMPLETED", "FAILED")
    }

    fn notifier(delivery: Delivery) -> Notifier {
        Notifier {
            from: "ceems <ceems@example.org>".parse().unwrap(),
            addresses: Addresses::with_file("{user}@example.org", None).unwrap(),
            min_severity: Severity::Warning,
            opt_out: HashSet::from(["dave".to_owned()]),
            base_url: "https://ceems.example.org".into(),
            aggregated_clusters: HashSet::new(),
            delivery,
            period: Duration::from_secs(86400),
            thresholds: Thresholds::default(),
        }
    }

    fn mails(dir: &std::path::Path) -> Vec<String> {
        let mut found: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .map(|e| std::fs::read_to_string(e.path()).unwrap())
                    .collect()
            })
            .unwrap_or_default();
        found.sort();
        found
    }

    #[tokio::test]
    async fn each_user_gets_one_message_naming_only_their_jobs_and_never_twice() {
        let tmp = tempfile::tempdir().unwrap();
        let lines = [
            failed(1, "alice"),
            failed(2, "alice"),
            failed(3, "bob"),
            line(4, "carol", "physics", NOW - 3600, Some(NOW - 600)),
            failed(5, "dave"),
            line(6, "erin", "physics", NOW - 3600, None),
        ];
        let store = store_with(&lines, tmp.path()).await;
        let out = tmp.path().join("eml");
        let n = notifier(Delivery::Directory(out.clone()));
        assert_eq!(n.wait(&store, NOW).await.unwrap(), Duration::ZERO);
        let round = n.round(&store, NOW).await.unwrap();
        assert_eq!(
            (round.queued, round.sent, round.refused),
            (2, 2, 0),
            "{round:?}"
        );
        // carol has nothing to hear about, dave opted out; erin's job still runs.
        assert_eq!(round.quiet_jobs, 2, "{round:?}");
        let sent = mails(&out);
        assert_eq!(sent.len(), 2);
        let alice = sent
            .iter()
            .find(|m| m.contains("To: alice@example.org"))
            .unwrap();
        assert!(
            alice.contains("Job 1 ") && alice.contains("Job 2 "),
            "{alice}"
        );
        assert!(
            // Not a bare "bob": the random MIME boundary may hold it.
            !alice.contains("Job 3 ") && !alice.contains("bob@") && !alice.contains("Hello bob"),
            "{alice}"
        );
        assert!(
            alice.contains("https://ceems.example.org/report/lab/1"),
            "{alice}"
        );
        let bob = sent
            .iter()
            .find(|m| m.contains("To: bob@example.org"))
            .unwrap();
        assert!(bob.contains("Job 3 ") && !bob.contains("Job 1 "), "{bob}");

        // The next round, or a restarted server's, finds nothing new.
        assert!(n.wait(&store, NOW + 60).await.unwrap() > Duration::from_secs(86000));
        let again = n.round(&store, NOW + 86400).await.unwrap();
        assert_eq!(again, Round::default());
        assert_eq!(mails(&out).len(), 2);
    }

    #[tokio::test]
    async fn a_server_that_is_down_gets_the_same_message_next_round_once() {
        let tmp = tempfile::tempdir().unwrap();
        let store = store_with(&[failed(1, "alice"), failed(2, "bob")], tmp.path()).await;
        let down = notifier(super::super::smtp::unreachable());
        let first = down.round(&store, NOW).await.unwrap();
        assert_eq!(
            (first.queued, first.sent, first.deferred),
            (2, 0, 2),
            "{first:?}"
        );
        let out = tmp.path().join("eml");
        let up = notifier(Delivery::Directory(out.clone()));
        let second = up.round(&store, NOW + 86400).await.unwrap();
        assert_eq!((second.queued, second.sent), (0, 2), "{second:?}");
        let third = up.round(&store, NOW + 2 * 86400).await.unwrap();
        assert_eq!(third.sent, 0);
        let sent = mails(&out);
        assert_eq!(sent.len(), 2);
        // Queued at the first round: its date and Message-ID are the first round's.
        assert!(
            sent.iter()
                .all(|m| m.contains(&format!("ceems.digest.{NOW}."))),
            "{sent:?}"
        );
    }

    #[tokio::test]
    async fn a_user_without_a_valid_address_is_skipped_and_the_others_are_mailed() {
        let tmp = tempfile::tempdir().unwrap();
        let store = store_with(&[failed(1, "alice"), failed(2, "bad user")], tmp.path()).await;
        let out = tmp.path().join("eml");
        let round = notifier(Delivery::Directory(out.clone()))
            .round(&store, NOW)
            .await
            .unwrap();
        assert_eq!((round.sent, round.refused), (1, 1), "{round:?}");
        let why: String = store
            .fetch_one(&Sql::new(
                "SELECT last_error FROM mail_outbox WHERE usr = 'bad user'",
            ))
            .await
            .unwrap()
            .get(0)
            .unwrap();
        assert!(why.contains("no valid address"), "{why}");
    }
}
