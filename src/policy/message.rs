//! The words of a policy's mail: what the job holds and leaves idle, what that cost, what
//! comes next and when, how to ask for less, and how to appeal.

use std::time::Duration;

use super::config::{Action, Policy, Resource};
use super::decide::Watched;

/// What the mail says the idleness cost, kept with the decision as its figures.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Cost {
    /// Mean use over the window, as a share of what the job holds.
    pub mean_use: f64,
    pub window_seconds: i64,
    /// GPUs (a CPU policy: cores) held.
    pub held: u64,
    /// GPU-hours (CPU-hours) held idle over the window.
    pub idle_hours: f64,
    /// Energy of the job's nodes over the window; None: no power data.
    pub energy_kwh: Option<f64>,
    pub emissions_grams: Option<f64>,
}

/// What comes after this action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Next {
    pub action: Action,
    pub in_seconds: i64,
}

/// One message's subject and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text {
    pub subject: String,
    pub body: String,
}

/// Everything a message is written from.
pub struct Facts<'a> {
    pub policy: &'a Policy,
    pub job: &'a Watched,
    pub action: Action,
    /// This warning's number and how many there are.
    pub warning: (usize, usize),
    pub cost: &'a Cost,
    pub next: Option<Next>,
    pub report_url: String,
    /// When the cancel happened, and what the manager said.
    pub cancelled: Option<String>,
}

fn span(seconds: i64) -> String {
    let s = u64::try_from(seconds.max(0)).unwrap_or(0);
    // Whole minutes past an hour: the seconds of a mail's figures mean nothing to a reader.
    let s = if s >= 3600 { s / 60 * 60 } else { s };
    humantime::format_duration(Duration::from_secs(s)).to_string()
}

fn noun(resource: Resource, n: u64) -> String {
    match (resource, n) {
        (Resource::Gpu, 1) => "1 GPU".into(),
        (Resource::Gpu, n) => format!("{n} GPUs"),
        (Resource::Cpu, 1) => "1 CPU core".into(),
        (Resource::Cpu, n) => format!("{n} CPU cores"),
    }
}

/// The user's message.
pub fn to_user(f: &Facts<'_>) -> Text {
    let p = f.policy;
    let job = f.job;
    let held = noun(p.resource, f.cost.held);
    let idle = span(f.cost.window_seconds);
    let subject = match f.action {
        Action::Warn => format!(
            "[ceems] Job {} holds {held} it has not used for {idle}: warning {} of {}",
            job.uuid, f.warning.0, f.warning.1
        ),
        Action::Cancel => format!(
            "[ceems] Job {} was cancelled: its {held} sat idle for {idle}",
            job.uuid
        ),
    };
    let mut b = format!("Hello {},\n\n", job.user);
    let since = match p.window {
        super::config::Window::SinceStart => "since it started",
        super::config::Window::Trailing => "over the last",
    };
    let window = match p.window {
        super::config::Window::SinceStart => format!("{since} {idle} ago"),
        super::config::Window::Trailing => format!("{since} {idle}"),
    };
    b.push_str(&format!(
        "Your job {} ({}) on cluster {} holds {held} and used {:.1} % of it {window}, below the {:.1} % that policy `{}` asks for.\n\n",
        job.uuid,
        job.name,
        job.cluster,
        f.cost.mean_use * 100.0,
        p.below * 100.0,
        p.name
    ));
    b.push_str(&cost_lines(p.resource, f.cost));
    match (f.action, f.next, &f.cancelled) {
        (Action::Cancel, _, Some(said)) => b.push_str(&format!(
            "\nThe job was cancelled by the ceems stats-server's policy `{}` ({said}).\n",
            p.name
        )),
        (_, Some(next), _) => b.push_str(&format!(
            "\nWhat comes next: {} in {} if it stays idle.\n",
            match next.action {
                Action::Warn => "another warning",
                Action::Cancel => "the job will be cancelled",
            },
            span(next.in_seconds)
        )),
        _ => b.push_str("\nThis is the last message about this job; it will not be cancelled.\n"),
    }
    let words = crate::manager::request_words(&job.manager);
    let (what, option) = match p.resource {
        Resource::Gpu => ("GPUs", words.gpus),
        Resource::Cpu => ("cores", words.cores),
    };
    b.push_str(&format!(
        "\nAsk only for the {what} a job uses ({option}), and for a time limit near its run time ({}).\n",
        words.time
    ));
    b.push_str(&format!(
        "The job's report: {}\n\n{}\n",
        f.report_url, p.contact
    ));
    Text { subject, body: b }
}

fn cost_lines(resource: Resource, cost: &Cost) -> String {
    let unit = match resource {
        Resource::Gpu => "GPU-hours",
        Resource::Cpu => "CPU-hours",
    };
    let mut s = format!(
        "What the idle time cost:\n  {unit} held idle: {:.2}\n",
        cost.idle_hours
    );
    match (cost.energy_kwh, cost.emissions_grams) {
        (None, None) => {
            s.push_str("  energy and emissions: not measured on the job's nodes (no power data)\n")
        }
        (energy, emissions) => {
            if let Some(e) = energy {
                s.push_str(&format!(
                    "  energy of the job's nodes meanwhile: {e:.3} kWh\n"
                ));
            }
            if let Some(g) = emissions {
                s.push_str(&format!("  emissions meanwhile: {g:.0} g CO2e\n"));
            }
        }
    }
    s
}

/// The admins' copy: the user's message, said to be a copy; in a dry run, what would have
/// happened, the user's message being sent to no one.
pub fn to_admins(f: &Facts<'_>, dry_run: bool) -> Text {
    let user = to_user(f);
    let verb = match f.action {
        Action::Warn => "warned",
        Action::Cancel => "cancelled",
    };
    let (subject, head) = match dry_run {
        true => (
            format!("[ceems dry run] policy {} would have {verb} job {} of {}", f.policy.name, f.job.uuid, f.job.user),
            format!(
                "DRY RUN: policy `{}` would have {verb} job {} of user {} on cluster {}. Nothing was sent to the user and nothing was cancelled. The user would have read:\n\n",
                f.policy.name, f.job.uuid, f.job.user, f.job.cluster
            ),
        ),
        false => (
            format!("[ceems copy] {}", user.subject),
            format!("A copy: user {} got this message.\n\n", f.job.user),
        ),
    };
    Text {
        subject,
        body: format!("{head}{}", user.body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        let table: toml::Table =
            "[[policies]]\nname = \"idle-gpus\"\ncontact = \"Write to hpc@example.org.\"\n"
                .parse()
                .unwrap();
        super::super::config::parse(table["policies"].clone())
            .unwrap()
            .remove(0)
    }

    #[test]
    fn a_warning_says_what_the_idleness_cost_what_comes_next_and_how_to_ask_for_less() {
        let p = policy();
        let job = Watched {
            cluster: "lab".into(),
            uuid: "42".into(),
            user: "alice".into(),
            name: "train".into(),
            manager: "slurm".into(),
            ..Watched::default()
        };
        let cost = Cost {
            mean_use: 0.0,
            window_seconds: 3600,
            held: 2,
            idle_hours: 2.0,
            energy_kwh: Some(0.75),
            emissions_grams: Some(41.0),
        };
        let f = Facts {
            policy: &p,
            job: &job,
            action: Action::Warn,
            warning: (1, 2),
            cost: &cost,
            next: Some(Next {
                action: Action::Warn,
                in_seconds: 2700,
            }),
            report_url: "https://ceems.example.org/report/lab/42".into(),
            cancelled: None,
        };
        let t = to_user(&f);
        assert_eq!(
            t.subject,
            "[ceems] Job 42 holds 2 GPUs it has not used for 1h: warning 1 of 2"
        );
        for part in [
            "GPU-hours held idle: 2.00",
            "0.750 kWh",
            "41 g CO2e",
            "another warning in 45m",
            "--gres=gpu",
            "report/lab/42",
            "Write to hpc@example.org.",
        ] {
            assert!(t.body.contains(part), "{part}: {}", t.body);
        }
        let dry = to_admins(&f, true);
        assert!(
            dry.subject.starts_with("[ceems dry run]") && dry.body.contains("Nothing was sent"),
            "{dry:?}"
        );
        let unmeasured = Cost {
            energy_kwh: None,
            emissions_grams: None,
            ..cost
        };
        let t = to_user(&Facts {
            cost: &unmeasured,
            ..f
        });
        assert!(t.body.contains("no power data"), "{}", t.body);
    }
}
