//! Which stage of a policy is due for a running job, and whether its use makes it idle: pure
//! decisions over what the store and Prometheus said, so every rule is tested without either.

use super::config::{Policy, Stage};

/// A running job as the store holds it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Watched {
    pub cluster: String,
    pub uuid: String,
    pub started_at: i64,
    pub user: String,
    pub account: String,
    pub partition: String,
    pub qos: String,
    pub name: String,
    pub gpus: u64,
    pub cpus: u64,
    pub time_limit_seconds: Option<i64>,
    /// The manager's own tags (a pod's annotations), where it has them.
    pub tags: String,
    /// Which manager runs it, for the words of the mail.
    pub manager: String,
}

/// The last stage a policy took for a job, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    pub stage: usize,
    pub at: i64,
}

/// A stage that is due: its number (1 for the first), what it does and the window (seconds)
/// over which the job must have been idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    pub stage: usize,
    pub what: Stage,
    pub window: i64,
}

/// Why a job in a policy's clusters is not watched, or is spared.
pub fn spared(policy: &Policy, job: &Watched) -> Option<String> {
    let listed = |list: &[String], v: &str| list.is_empty() || list.iter().any(|x| x == v);
    if !listed(&policy.partitions, &job.partition)
        || !listed(&policy.qos, &job.qos)
        || !listed(&policy.accounts, &job.account)
    {
        return Some("outside the policy's partitions, QOS or accounts".into());
    }
    if job.gpus < policy.min_gpus() || policy.max_gpus.is_some_and(|max| job.gpus > max) {
        return Some(format!("holds {} GPUs", job.gpus));
    }
    let exempt = |list: &[String], v: &str| list.iter().any(|x| x == v);
    if exempt(&policy.exempt_users, &job.user) {
        return Some(format!("user {} is exempt", job.user));
    }
    if exempt(&policy.exempt_accounts, &job.account) {
        return Some(format!("account {} is exempt", job.account));
    }
    if exempt(&policy.exempt_partitions, &job.partition) {
        return Some(format!("partition {} is exempt", job.partition));
    }
    if exempt(&policy.exempt_qos, &job.qos) {
        return Some(format!("QOS {} is exempt", job.qos));
    }
    let interactive = policy
        .interactive_names
        .iter()
        .any(|n| !n.is_empty() && job.name.starts_with(n.as_str()));
    let short = job
        .time_limit_seconds
        .is_some_and(|t| t > 0 && (t as u64) < policy.interactive_under.as_secs());
    if interactive && short {
        return Some("a short interactive session".into());
    }
    let marker = &policy.opt_out_marker;
    if !marker.is_empty()
        && (job.name.contains(marker.as_str()) || job.tags.contains(marker.as_str()))
    {
        return Some(format!("opted out ({marker})"));
    }
    None
}

/// The next stage due for a job started at `started_at` that got `done` so far, at `now`:
/// the job is old enough, and the stage before went out long enough ago that the user had the
/// notice the policy promised.
pub fn due(policy: &Policy, started_at: i64, done: Option<Done>, now: i64) -> Option<Due> {
    let stages = policy.stages();
    let next = done.map_or(1, |d| d.stage + 1);
    let what = *stages.get(next - 1)?;
    let elapsed = now - started_at;
    let after = secs(what.after);
    if elapsed < after {
        return None;
    }
    if let (Some(d), Some(before)) = (done, next.checked_sub(2).and_then(|i| stages.get(i))) {
        if now - d.at < after - secs(before.after) {
            return None;
        }
    }
    let window = match policy.window {
        super::config::Window::SinceStart => elapsed,
        super::config::Window::Trailing => after,
    };
    Some(Due {
        stage: next,
        what,
        window,
    })
}

fn secs(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 4)
}

/// What a job's use over the window says.
#[derive(Debug, Clone, PartialEq)]
pub enum Use {
    /// Prometheus has no series of it: nothing is decided on no data.
    NoData,
    /// It used enough, or enough of its GPUs.
    Busy {
        mean: f64,
        why: String,
    },
    Idle {
        mean: f64,
    },
}

/// Judges a job by the mean use of each of its devices over the window (one figure for a CPU
/// policy).
pub fn judge(policy: &Policy, devices: &[f64]) -> Use {
    if devices.is_empty() {
        return Use::NoData;
    }
    let mean = devices.iter().sum::<f64>() / devices.len() as f64;
    if mean >= policy.below {
        return Use::Busy {
            mean,
            why: format!("mean use {:.1} %", mean * 100.0),
        };
    }
    let share = policy.spare_used_gpu_share;
    let used = devices.iter().filter(|&&v| v >= policy.below).count() as f64 / devices.len() as f64;
    if share > 0.0 && used >= share {
        return Use::Busy {
            mean,
            why: format!("uses {:.0} % of its GPUs", used * 100.0),
        };
    }
    Use::Idle { mean }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::config::{parse, Action};

    fn policy(extra: &str) -> Policy {
        let text = format!("[[policies]]\nname = \"p\"\nwarn-after = [\"60s\", \"120s\"]\ncancel-after = \"180s\"\n{extra}");
        let table: toml::Table = text.parse().unwrap();
        parse(table["policies"].clone()).unwrap().remove(0)
    }

    fn job() -> Watched {
        Watched {
            uuid: "7".into(),
            user: "alice".into(),
            account: "physics".into(),
            partition: "gpu".into(),
            qos: "normal".into(),
            name: "train".into(),
            gpus: 1,
            ..Watched::default()
        }
    }

    #[test]
    fn stages_come_in_order_each_after_its_notice() {
        let p = policy("");
        assert_eq!(due(&p, 1000, None, 1059), None, "too young");
        let first = due(&p, 1000, None, 1060).unwrap();
        assert_eq!(
            (first.stage, first.what.action, first.window),
            (1, Action::Warn, 60)
        );
        // A server that was down past every stage still warns first.
        assert_eq!(due(&p, 1000, None, 5000).unwrap().stage, 1);
        // The second warning waits 60 s after the first, however old the job.
        let warned = Done { stage: 1, at: 4990 };
        assert_eq!(due(&p, 1000, Some(warned), 5000), None);
        assert_eq!(due(&p, 1000, Some(warned), 5050).unwrap().stage, 2);
        let cancel = due(&p, 1000, Some(Done { stage: 2, at: 1120 }), 1180).unwrap();
        assert_eq!((cancel.stage, cancel.what.action), (3, Action::Cancel));
        assert_eq!(due(&p, 1000, Some(Done { stage: 3, at: 1180 }), 9999), None);
        // A trailing window judges the stage's own span, not the job's life.
        let t = policy("window = \"trailing\"");
        assert_eq!(due(&t, 1000, None, 5000).unwrap().window, 60);
    }

    #[test]
    fn exemptions_spare_jobs_before_any_query() {
        let p = policy("exempt-users = [\"carol\"]\nopt-out-marker = \"[keep]\"\nmin-gpus = 2");
        assert!(spared(&p, &job()).unwrap().contains("GPUs"));
        let two = Watched { gpus: 2, ..job() };
        assert_eq!(spared(&p, &two), None);
        let carol = Watched {
            user: "carol".into(),
            ..two.clone()
        };
        assert!(spared(&p, &carol).unwrap().contains("carol"));
        let kept = Watched {
            name: "train [keep]".into(),
            ..two.clone()
        };
        assert!(spared(&p, &kept).unwrap().contains("opted out"));
        let session = Watched {
            name: "interactive".into(),
            time_limit_seconds: Some(3600),
            ..two.clone()
        };
        assert!(spared(&p, &session).unwrap().contains("interactive"));
        let long = Watched {
            time_limit_seconds: Some(86400),
            ..session
        };
        assert_eq!(
            spared(&p, &long),
            None,
            "a day-long session is no short one"
        );
        let scoped = policy("partitions = [\"a100\"]");
        assert!(spared(&scoped, &job()).is_some());
    }

    #[test]
    fn no_data_decides_nothing_and_a_used_share_of_gpus_spares() {
        let p = policy("spare-used-gpu-share = 0.25");
        assert_eq!(judge(&p, &[]), Use::NoData);
        assert!(matches!(judge(&p, &[0.0, 0.0]), Use::Idle { .. }));
        assert!(matches!(judge(&p, &[0.5]), Use::Busy { .. }));
        // One GPU of four at 2 %: the mean is under 1 %, but a quarter of them are used.
        assert!(matches!(
            judge(&p, &[0.02, 0.0, 0.0, 0.0]),
            Use::Busy { .. }
        ));
        assert!(matches!(
            judge(&policy(""), &[0.02, 0.0, 0.0, 0.0]),
            Use::Idle { .. }
        ));
    }
}
