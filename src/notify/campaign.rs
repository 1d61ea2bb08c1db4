//! Waste campaigns: each round, a user whose waste over the window passes both an absolute
//! bound and a share of the cluster's gets one mail listing the jobs, their figures and what
//! to change; nobody gets the same campaign again within its gap, nothing goes on the site's
//! quiet days, and in test mode only the admins are mailed. Each mail is queued in the
//! transaction that records it in `campaign_mails`, so a kill never sends one twice.

use std::time::Duration;

use lettre::message::Mailbox;
use serde::Deserialize;

use super::outbox::{deliver, enqueue, Round};
use super::smtp::Delivery;
use super::{compose, message_id, Addresses};
use crate::store::db::{Store, StoreError};
use crate::store::sql::Sql;
use crate::store::waste::{sums, WASTE_FIELDS};

/// One campaign as a site writes it (`[[stats-server.campaigns]]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Campaign {
    pub name: String,
    /// What it is about: `idle_gpu_hours`, `lost_cpu_hours`, `unused_memory_tb_hours` or
    /// `overrequested_core_hours`.
    #[serde(default = "default_figure")]
    pub figure: String,
    /// The span looked back over.
    #[serde(default = "week", deserialize_with = "crate::config::de_duration")]
    pub window: Duration,
    /// A user's figure over the window must reach this (in the figure's unit)…
    #[serde(default = "default_min")]
    pub min_amount: f64,
    /// …and this share of the cluster's.
    #[serde(default = "default_share")]
    pub min_share: f64,
    /// Nobody gets this campaign's mail again within this.
    #[serde(default = "week", deserialize_with = "crate::config::de_duration")]
    pub gap: Duration,
    /// Days of the week without mail (`Sat`, `Sun`, …), in UTC.
    #[serde(default = "weekend")]
    pub quiet_weekdays: Vec<String>,
    /// Dates without mail (`2026-12-25`).
    #[serde(default)]
    pub holidays: Vec<String>,
    /// Mail only the admins, each message as the user would have had it.
    #[serde(default)]
    pub test_mode: bool,
    #[serde(default)]
    pub admins: Vec<String>,
    #[serde(default = "default_contact")]
    pub contact: String,
    /// GPU use (ratio) below which a GPU counts as idle.
    #[serde(default = "default_gpu_idle")]
    pub gpu_idle_below: f64,
    /// The admins get the ranking of the cluster's users on the figure, once a gap.
    #[serde(default = "yes")]
    pub admin_ranking: bool,
}

fn yes() -> bool {
    true
}

fn default_figure() -> String {
    "idle_gpu_hours".into()
}
fn week() -> Duration {
    Duration::from_secs(7 * 86400)
}
fn default_min() -> f64 {
    24.0
}
fn default_share() -> f64 {
    0.05
}
fn weekend() -> Vec<String> {
    vec!["Sat".into(), "Sun".into()]
}
fn default_contact() -> String {
    "Questions? Reply to this message.".into()
}
fn default_gpu_idle() -> f64 {
    0.01
}

/// The figures a campaign may be about, with their words.
const ABOUT: &[(&str, &str, &str)] = &[
    (
        "idle_gpu_hours",
        "GPU-hours held at under 1 % use",
        "ask for GPUs only when the code uses them",
    ),
    (
        "lost_cpu_hours",
        "CPU core-hours allocated and left idle",
        "ask for the cores the code keeps busy",
    ),
    (
        "unused_memory_tb_hours",
        "TB-hours of memory asked for and never used",
        "ask for the memory the job peaks at, plus a margin",
    ),
    (
        "overrequested_core_hours",
        "core-hours of time limits never reached",
        "ask for a time limit near the run time",
    ),
];

const WEEKDAYS: &[&str] = &["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];

/// The campaigns of the `campaigns` array, each checked; a bad one names its position and key.
pub fn parse(value: toml::Value) -> Result<Vec<Campaign>, String> {
    let campaigns: Vec<Campaign> = serde_path_to_error::deserialize(value).map_err(|e| {
        let key = crate::config::join_key("campaigns", &e.path().to_string());
        format!("{key}: {}", e.into_inner())
    })?;
    for (i, c) in campaigns.iter().enumerate() {
        let bad = |m: String| format!("campaigns[{i}] (`{}`): {m}", c.name);
        if !ABOUT.iter().any(|(f, _, _)| *f == c.figure) {
            let known: Vec<&str> = ABOUT.iter().map(|a| a.0).collect();
            return Err(bad(format!(
                "figure: `{}` is not one of {}",
                c.figure,
                known.join(", ")
            )));
        }
        if !(0.0..=1.0).contains(&c.min_share) {
            return Err(bad(format!(
                "min-share: {} is not a share between 0 and 1",
                c.min_share
            )));
        }
        if let Some(d) = c
            .quiet_weekdays
            .iter()
            .find(|d| !WEEKDAYS.contains(&d.as_str()))
        {
            return Err(bad(format!(
                "quiet-weekdays: `{d}` is not one of {}",
                WEEKDAYS.join(", ")
            )));
        }
        for h in &c.holidays {
            h.parse::<jiff::civil::Date>()
                .map_err(|e| bad(format!("holidays: `{h}`: {e}")))?;
        }
        for a in &c.admins {
            a.parse::<lettre::Address>()
                .map_err(|e| bad(format!("admins: `{a}`: {e}")))?;
        }
        if c.test_mode && c.admins.is_empty() {
            return Err(bad(
                "test-mode mails only the admins, and there are none".into()
            ));
        }
    }
    Ok(campaigns)
}

impl Campaign {
    /// Whether `now` falls on a quiet day.
    pub fn quiet(&self, now: i64) -> bool {
        let Ok(t) = jiff::Timestamp::from_second(now) else {
            return false;
        };
        let date = t.to_zoned(jiff::tz::TimeZone::UTC).date();
        let day = WEEKDAYS[date.weekday().to_monday_zero_offset() as usize];
        self.quiet_weekdays.iter().any(|d| d == day)
            || self
                .holidays
                .iter()
                .any(|h| h.parse::<jiff::civil::Date>().is_ok_and(|h| h == date))
    }

    /// What its figure is, and what to change, in words.
    fn words(&self) -> (&'static str, &'static str) {
        let (_, what, advice) = ABOUT
            .iter()
            .find(|a| a.0 == self.figure)
            .copied()
            .unwrap_or(ABOUT[0]);
        (what, advice)
    }

    fn index(&self) -> usize {
        WASTE_FIELDS
            .iter()
            .position(|f| *f == self.figure)
            .unwrap_or(0)
    }
}

/// How campaign mail goes out.
pub struct Campaigns {
    pub campaigns: Vec<Campaign>,
    pub from: Mailbox,
    pub addresses: Addresses,
    pub delivery: Delivery,
    /// `--web.external-url`, for the reports' links.
    pub base_url: String,
}

/// What one round did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CampaignRound {
    pub mailed_users: usize,
    pub quiet: bool,
    pub sent: Round,
}

impl Campaigns {
    /// One round at `now`: every campaign, every cluster; then the queued mail is sent.
    pub async fn round(&self, store: &Store, now: i64) -> Result<CampaignRound, StoreError> {
        let mut round = CampaignRound::default();
        for c in &self.campaigns {
            if c.quiet(now) {
                round.quiet = true;
                continue;
            }
            round.mailed_users += self.campaign(store, c, now).await?;
        }
        round.sent = deliver(store, &self.delivery, now).await?;
        Ok(round)
    }

    async fn campaign(&self, store: &Store, c: &Campaign, now: i64) -> Result<usize, StoreError> {
        let from = now - i64::try_from(c.window.as_secs()).unwrap_or(i64::MAX / 4);
        let figure = &sums(c.gpu_idle_below)[c.index()];
        let q = Sql::new(&format!(
            "SELECT cluster_id, usr, {figure} FROM units
             WHERE started_at > 0 AND ended_at >= $1 AND ended_at <= $2
             GROUP BY cluster_id, usr"
        ))
        .arg(from)
        .arg(now);
        let rows = store.fetch_all(&q).await?;
        let mut by_cluster: std::collections::BTreeMap<String, Vec<(String, f64)>> =
            Default::default();
        for r in rows {
            let amount: Option<f64> = r.get(2)?;
            by_cluster
                .entry(r.get(0)?)
                .or_default()
                .push((r.get(1)?, amount.unwrap_or(0.0)));
        }
        let mut mailed = 0;
        for (cluster, mut users) in by_cluster {
            let total: f64 = users.iter().map(|u| u.1).sum();
            let mut told = Vec::new();
            for (user, amount) in &users {
                let (user, amount) = (user.as_str(), *amount);
                let share = if total > 0.0 { amount / total } else { 0.0 };
                if amount < c.min_amount || share < c.min_share || amount <= 0.0 {
                    continue;
                }
                if self.mailed_within(store, c, &cluster, user, now).await? {
                    told.push(user.to_owned());
                    continue;
                }
                let jobs = self.jobs(store, c, &cluster, user, from, now).await?;
                if self
                    .mail(store, c, &cluster, user, amount, share, &jobs, now)
                    .await?
                {
                    mailed += 1;
                    told.push(user.to_owned());
                }
            }
            // The admins' ranking: an empty user in campaign_mails keeps it to once a gap.
            if c.admin_ranking
                && !c.admins.is_empty()
                && total > 0.0
                && !self.mailed_within(store, c, &cluster, "", now).await?
            {
                users.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                self.ranking(store, c, &cluster, &users, total, &told, now)
                    .await?;
            }
        }
        Ok(mailed)
    }

    async fn mailed_within(
        &self,
        store: &Store,
        c: &Campaign,
        cluster: &str,
        user: &str,
        now: i64,
    ) -> Result<bool, StoreError> {
        let since = now - i64::try_from(c.gap.as_secs()).unwrap_or(i64::MAX / 4);
        let q = Sql::new(
            "SELECT count(*) FROM campaign_mails
             WHERE campaign = $1 AND cluster_id = $2 AND usr = $3 AND test_mode = $4 AND sent_at > $5",
        )
        .arg(&c.name)
        .arg(cluster)
        .arg(user)
        .arg(i64::from(c.test_mode))
        .arg(since);
        let n: i64 = store.fetch_one(&q).await?.get(0)?;
        Ok(n > 0)
    }

    /// The user's jobs with some of the figure, most first (20 at most): id, name, figure.
    async fn jobs(
        &self,
        store: &Store,
        c: &Campaign,
        cluster: &str,
        user: &str,
        from: i64,
        now: i64,
    ) -> Result<Vec<(String, String, f64)>, StoreError> {
        let figure = &sums(c.gpu_idle_below)[c.index()];
        let q = Sql::new(&format!(
            "SELECT * FROM (SELECT uuid, name, {figure} AS f FROM units
             WHERE cluster_id = $1 AND usr = $2 AND started_at > 0 AND ended_at >= $3 AND ended_at <= $4
             GROUP BY id, uuid, name) AS j WHERE f > 0 ORDER BY f DESC, uuid LIMIT 20"
        ))
        .arg(cluster)
        .arg(user)
        .arg(from)
        .arg(now);
        let mut out = Vec::new();
        for r in store.fetch_all(&q).await? {
            let f: Option<f64> = r.get(2)?;
            out.push((r.get(0)?, r.get(1)?, f.unwrap_or(0.0)));
        }
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    async fn mail(
        &self,
        store: &Store,
        c: &Campaign,
        cluster: &str,
        user: &str,
        amount: f64,
        share: f64,
        jobs: &[(String, String, f64)],
        now: i64,
    ) -> Result<bool, StoreError> {
        let (what, advice) = c.words();
        let days = c.window.as_secs() / 86400;
        let subject =
            format!("[ceems] Your jobs on {cluster} over the last {days} days: {amount:.1} {what}");
        let mut body = format!(
            "Hello {user},\n\nOver the last {days} days your jobs on cluster {cluster} had {amount:.1} {what}: {:.0} % of the cluster's.\n\nThe jobs with the most:\n",
            share * 100.0
        );
        for (uuid, name, f) in jobs {
            body.push_str(&format!(
                "  {uuid:<12} {:<24} {f:>10.1}   {}/report/{cluster}/{uuid}\n",
                name.chars()
                    .filter(|c| !c.is_control())
                    .take(24)
                    .collect::<String>(),
                self.base_url
            ));
        }
        body.push_str(&format!(
            "\nWhat to change: {advice}; each report says how, in your scheduler's words.\n\n{}\n",
            c.contact
        ));
        let recipients: Vec<Recipient> = match c.test_mode {
            true => c
                .admins
                .iter()
                .map(|a| admin(a, format!("[ceems test] for {user}: {subject}")))
                .collect(),
            false => vec![(user.to_owned(), self.addresses.of(user), subject.clone())],
        };
        let mail = Mail {
            user,
            amount,
            share,
            body,
        };
        self.queue(store, c, cluster, recipients, mail, now).await?;
        tracing::info!(campaign = %c.name, cluster, user, amount, share, test_mode = c.test_mode, "campaign mail queued");
        Ok(true)
    }

    /// The admins' mail: the cluster's users ranked on the figure over the window, and which
    /// of them this campaign told.
    #[allow(clippy::too_many_arguments)]
    async fn ranking(
        &self,
        store: &Store,
        c: &Campaign,
        cluster: &str,
        ranked: &[(String, f64)],
        total: f64,
        told: &[String],
        now: i64,
    ) -> Result<(), StoreError> {
        let (what, _) = c.words();
        let days = c.window.as_secs() / 86400;
        let subject =
            format!("[ceems] {cluster}, last {days} days: {total:.1} {what}; who had the most");
        let mut body = format!(
            "Campaign {}: over the last {days} days, cluster {cluster} had {total:.1} {what}.\nThe users with the most (mailed: told by this campaign within its gap{}):\n\n{:>4}  {:<16} {:>12} {:>7}  mailed\n",
            c.name,
            if c.test_mode { ", in test mode" } else { "" },
            "rank",
            "user",
            c.figure,
            "share"
        );
        for (i, (user, amount)) in ranked.iter().filter(|u| u.1 > 0.0).take(20).enumerate() {
            body.push_str(&format!(
                "{:>4}  {:<16} {amount:>12.1} {:>6.0} %  {}\n",
                i + 1,
                user.chars()
                    .filter(|c| !c.is_control())
                    .take(16)
                    .collect::<String>(),
                100.0 * amount / total,
                if told.contains(user) { "yes" } else { "no" }
            ));
        }
        body.push_str(
            "\n`ceems tool report waste` ranks every figure, by user, project or partition.\n",
        );
        let recipients = c.admins.iter().map(|a| admin(a, subject.clone())).collect();
        let mail = Mail {
            user: "",
            amount: total,
            share: 1.0,
            body,
        };
        self.queue(store, c, cluster, recipients, mail, now).await?;
        tracing::info!(campaign = %c.name, cluster, admins = c.admins.len(), "campaign ranking queued for the admins");
        Ok(())
    }

    /// Queues `mail` to each recipient and records it in `campaign_mails`, in one transaction.
    async fn queue(
        &self,
        store: &Store,
        c: &Campaign,
        cluster: &str,
        recipients: Vec<Recipient>,
        mail: Mail<'_>,
        now: i64,
    ) -> Result<(), StoreError> {
        let date = std::time::SystemTime::UNIX_EPOCH
            + Duration::from_secs(u64::try_from(now).unwrap_or(0));
        let mut tx = store.write_tx().await?;
        let mut first = None;
        for (who, to, subject) in recipients {
            let id = message_id(
                "campaign",
                &format!("{}/{cluster}/{}/{who}", c.name, mail.user),
                now,
                &self.from,
            );
            let built = to.and_then(|to| {
                compose(
                    &self.from,
                    to.clone(),
                    &subject,
                    &id,
                    date,
                    mail.body.clone(),
                    None,
                )
                .map(|m| (to, m))
            });
            let row = enqueue(&mut tx, &who, &self.from, built, &id, now).await?;
            first.get_or_insert(row);
        }
        tx.execute(
            &Sql::new(
                "INSERT INTO campaign_mails (campaign, cluster_id, usr, test_mode, sent_at, figure, share, message_id)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .arg(&c.name)
            .arg(cluster)
            .arg(mail.user)
            .arg(i64::from(c.test_mode))
            .arg(now)
            .arg(mail.amount)
            .arg(mail.share)
            .arg(first),
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }
}

/// Who a message goes to: the name it is queued under, the address (or why none), the subject.
type Recipient = (String, Result<lettre::Address, String>, String);

/// One campaign message: about `user` (empty: the admins' ranking), their figure and share.
struct Mail<'a> {
    user: &'a str,
    amount: f64,
    share: f64,
    body: String,
}

fn admin(address: &str, subject: String) -> Recipient {
    (
        address.to_owned(),
        address
            .parse()
            .map_err(|e: lettre::address::AddressError| e.to_string()),
        subject,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Friday 2027-01-15 08:00 UTC.
    const NOW: i64 = 1_800_000_000;
    const DAY: i64 = 86400;

    /// A month of jobs, one a day each, ending each day from 30 days before NOW to 10 after:
    /// alice's two GPUs idle for 10 h, bob's GPU busy for 10 h, and carol's GPU idle for 3 h
    /// once (short of the bound).
    async fn month(dir: &std::path::Path) -> Store {
        let store = crate::store::db::testing::store(dir).await;
        store.register_cluster("lab", "slurm").await.unwrap();
        let mut lines = Vec::new();
        let mut id = 1;
        for day in -30..=10 {
            let end = NOW + day * DAY - 3600;
            for (user, gpus, hours) in [("alice", 2, 10), ("bob", 1, 10)] {
                let start = end - hours * 3600;
                lines.push(format!("{id}|gpu|normal|p|{user}|100|{user}|100|{start}|{start}|{end}|10:00:00|{}|0:0|COMPLETED|billing=1,cpu=1,mem=1G,node=1,gres/gpu={gpus}|n1|/tmp|60|job{id}", hours * 3600));
                id += 1;
            }
        }
        let start = NOW - 2 * DAY;
        lines.push(format!("{id}|gpu|normal|p|carol|100|carol|100|{start}|{start}|{}|03:00:00|10800|0:0|COMPLETED|billing=1,cpu=1,mem=1G,node=1,gres/gpu=1|n1|/tmp|60|job{id}", start + 10800));
        let (jobs, errors) = crate::manager::slurm::sacct::parse_output(&lines.join("\n"));
        assert!(errors.is_empty(), "{errors:?}");
        store.ingest("lab", &jobs, 0, NOW + 11 * DAY).await.unwrap();
        for (user, use_) in [("alice", 0.0), ("bob", 0.7), ("carol", 0.0)] {
            let q = Sql::new(
                "UPDATE units SET aggregated_seconds = elapsed_seconds, measured = 1,
                        cpu_seconds = elapsed_seconds, mean_gpu_utilization = $2,
                        gpu_utilization_max = $2 WHERE usr = $1",
            )
            .arg(user)
            .arg(use_);
            store.execute(&q).await.unwrap();
        }
        store
    }

    fn campaigns(extra: &str, delivery: Delivery) -> Campaigns {
        let text = format!("[[campaigns]]\nname = \"idle-gpus\"\nholidays = [\"2027-01-25\"]\nadmins = [\"ops@example.org\"]\n{extra}");
        let table: toml::Table = text.parse().unwrap();
        Campaigns {
            campaigns: parse(table["campaigns"].clone()).unwrap(),
            from: "ceems <ceems@example.org>".parse().unwrap(),
            addresses: Addresses::with_file("{user}@example.org", None).unwrap(),
            delivery,
            base_url: "https://ceems.example.org".into(),
        }
    }

    /// (recipient, subject, body) of each message written, in order.
    fn mails(dir: &std::path::Path) -> Vec<(String, String, String)> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        files
            .iter()
            .map(|p| {
                let text = std::fs::read_to_string(p).unwrap();
                let header = |h: &str| {
                    text.lines()
                        .find_map(|l| l.strip_prefix(h))
                        .unwrap_or("")
                        .trim()
                        .to_owned()
                };
                // The body, its quoted-printable soft line breaks undone.
                let body = text.replace("=\r\n", "").replace("=\n", "");
                (header("To:"), header("Subject:"), body)
            })
            .collect()
    }

    #[tokio::test]
    async fn only_the_wasteful_user_is_mailed_once_a_gap_and_never_on_quiet_days() {
        let tmp = tempfile::tempdir().unwrap();
        let store = month(tmp.path()).await;
        let out = tmp.path().join("eml");
        let c = campaigns("", Delivery::Directory(out.clone()));
        let first = c.round(&store, NOW).await.unwrap();
        assert_eq!(first.mailed_users, 1, "{first:?}");
        let (ranking, sent): (Vec<_>, Vec<_>) = mails(&out)
            .into_iter()
            .partition(|m| m.0 == "ops@example.org");
        assert_eq!(sent.len(), 1);
        let (to, subject, body) = &sent[0];
        assert_eq!(to, "alice@example.org");
        // Seven days of two idle GPUs for 10 h: 140 GPU-hours, of the cluster's 143 (carol's 3).
        assert!(subject.contains("140.0 GPU-hours held"), "{subject}");
        assert!(
            body.contains("140.0 GPU-hours held at under 1 % use: 98 % of the cluster")
                && body.contains("/report/lab/"),
            "{body}"
        );
        // Saturday, then a listed holiday: quiet. Monday: within the gap.
        for at in [NOW + DAY, NOW + 10 * DAY, NOW + 3 * DAY] {
            let r = c.round(&store, at).await.unwrap();
            assert_eq!(r.mailed_users, 0, "{r:?}");
        }
        assert_eq!(mails(&out).len(), 2);
        // The admins' ranking: every user with some, most first, and who was mailed.
        assert_eq!(ranking.len(), 1);
        let (_, subject, body) = &ranking[0];
        assert!(
            subject.contains("lab, last 7 days: 143.0 GPU-hours"),
            "{subject}"
        );
        let rows: Vec<Vec<&str>> = body
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|w| w.first().is_some_and(|r| r.parse::<u32>().is_ok()))
            .collect();
        assert_eq!(
            rows,
            [
                vec!["1", "alice", "140.0", "98", "%", "yes"],
                vec!["2", "carol", "3.0", "2", "%", "no"]
            ],
            "{body}"
        );
        // Eight days on (a Saturday's next weekday), the gap is over.
        let again = c.round(&store, NOW + 11 * DAY).await.unwrap();
        assert_eq!(again.mailed_users, 1, "{again:?}");
        let all = mails(&out);
        assert_eq!(all.len(), 4);
        assert!(all
            .iter()
            .all(|m| m.0 == "alice@example.org" || m.0 == "ops@example.org"));
    }

    #[tokio::test]
    async fn test_mode_mails_only_the_admins_and_a_message_queued_before_a_crash_goes_once() {
        let tmp = tempfile::tempdir().unwrap();
        let store = month(tmp.path()).await;
        let out = tmp.path().join("eml");
        let test = campaigns(
            "test-mode = true\nadmin-ranking = false",
            Delivery::Directory(out.clone()),
        );
        test.round(&store, NOW).await.unwrap();
        let sent = mails(&out);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].0, "ops@example.org");
        assert!(
            sent[0].1.starts_with("[ceems test] for alice:"),
            "{:?}",
            sent[0].1
        );

        // The real campaign queues alice's mail, then the server dies before sending it (the
        // SMTP server is down): the next round sends that one message, and no second.
        let down = campaigns("admin-ranking = false", super::super::smtp::unreachable());
        let r = down.round(&store, NOW).await.unwrap();
        assert_eq!((r.mailed_users, r.sent.sent), (1, 0), "{r:?}");
        let up = campaigns("admin-ranking = false", Delivery::Directory(out.clone()));
        let r = up.round(&store, NOW + 60).await.unwrap();
        assert_eq!((r.mailed_users, r.sent.sent), (0, 1), "{r:?}");
        let to_alice = mails(&out)
            .into_iter()
            .filter(|m| m.0 == "alice@example.org")
            .count();
        assert_eq!(to_alice, 1);
    }

    #[test]
    fn a_campaign_that_cannot_work_names_its_key() {
        let bad = |t: &str| {
            let table: toml::Table = format!("[[campaigns]]\nname = \"c\"\n{t}").parse().unwrap();
            parse(table["campaigns"].clone()).unwrap_err()
        };
        assert!(bad("figure = \"gpu\"").contains("figure: `gpu`"));
        assert!(bad("quiet-weekdays = [\"Saturday\"]").contains("quiet-weekdays"));
        assert!(bad("holidays = [\"25/12\"]").contains("holidays"));
        assert!(bad("test-mode = true").contains("no"));
        let e = bad("gapp = \"1d\"");
        assert!(e.contains("gapp") && e.starts_with("campaigns[0]"), "{e}");
    }
}
