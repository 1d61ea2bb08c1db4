//! The stats-server's waste campaigns: read from `[[stats-server.campaigns]]`, checked at
//! start, and run every `--campaign.interval` under a lease shared by servers on one database.

use super::*;
use crate::notify::campaign::{self, Campaigns};

pub(super) fn opts() -> Vec<Opt> {
    vec![
        Opt::new(
            "campaigns",
            Kind::FileOnly,
            "Waste campaigns: a periodic mail to users whose waste over a window passes a bound and a share of the cluster's; see docs/reference/stats-server.md",
        ),
        Opt::new(
            "campaign.interval",
            Kind::Duration,
            "How often the campaigns look for users to mail",
        )
        .default("1d"),
    ]
}

/// The campaigns, or None when there are none; they need mail set up.
pub(super) fn campaigns(
    settings: &Layered,
    notify: &NotifySettings,
    base_url: String,
) -> anyhow::Result<Option<(Campaigns, Duration)>> {
    let Some(value) = settings.table.get("campaigns").cloned() else {
        return Ok(None);
    };
    let list = campaign::parse(value).map_err(anyhow::Error::msg)?;
    if list.is_empty() {
        return Ok(None);
    }
    #[derive(Deserialize)]
    struct Interval {
        #[serde(deserialize_with = "config::de_duration")]
        interval: Duration,
    }
    let every: Interval = settings.get("campaign")?;
    anyhow::ensure!(
        every.interval >= Duration::from_secs(1),
        "--campaign.interval must be at least 1s"
    );
    let delivery = match notify.eml_dir.is_empty() {
        false => Delivery::Directory(PathBuf::from(&notify.eml_dir)),
        true => match notify.mail.server()? {
            Some(server) => notify.mail.delivery(&server)?,
            None => anyhow::bail!(
                "campaigns: `{}` mails users, but no mail is set up: set --notify.smtp.host (or --notify.eml-dir to write the messages as files)",
                list[0].name
            ),
        },
    };
    Ok(Some((
        Campaigns {
            campaigns: list,
            from: notify.mail.sender()?,
            addresses: notify.mail.addresses()?,
            delivery,
            base_url,
        },
        every.interval,
    )))
}

pub(super) async fn campaign_loop(store: Arc<Store>, campaigns: Campaigns, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(lease) = leased(&store, "campaigns").await else {
            continue;
        };
        match campaigns.round(&store, unix_now()).await {
            Ok(r) => tracing::info!(
                users = r.mailed_users,
                quiet_day = r.quiet,
                sent = r.sent.sent,
                deferred = r.sent.deferred,
                refused = r.sent.refused,
                "campaign round"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "campaign round failed; retried at the next interval")
            }
        }
        lease.release().await;
    }
}
