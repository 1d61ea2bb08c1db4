//! `ceems mailprog`: Slurm's `MailProg`. slurmctld runs it as `mail -s SUBJECT USER` when a job
//! asked for mail (`--mail-type`); it sends Slurm's usual message with the job's report from
//! the stats-server appended, as Princeton's jobstats does. The job has only just ended, so it
//! waits (within `--timeout`) until the stats-server has seen the end; the stats-server then
//! computes that one job's figures on demand. Without a report, Slurm's message still goes.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use clap::{Arg, ArgAction, ArgMatches, Command};
use serde::Deserialize;

use super::mail_opts::MailSettings;
use crate::config::{self, Kind, LogConfig, Opt};
use crate::notify::{compose, message_id};

pub fn opts() -> Vec<Opt> {
    let mut opts = vec![
        Opt::new(
            "stats-server.url",
            Kind::Str,
            "The stats-server, as this host reaches it",
        )
        .default("http://127.0.0.1:9020"),
        Opt::new(
            "stats-server.user-header-name",
            Kind::Str,
            "Header that names the user to the stats-server (its --web.user-header-name)",
        )
        .default("X-Grafana-User"),
        Opt::new(
            "web.external-url",
            Kind::Str,
            "The stats-server as users reach it, for the link in the mail (empty: --stats-server.url)",
        )
        .default(""),
        Opt::new(
            "cluster-id",
            Kind::Str,
            "The job's cluster in the stats-server (empty: Slurm's SLURM_CLUSTER_NAME)",
        )
        .default(""),
        Opt::new(
            "timeout",
            Kind::Duration,
            "How long to wait for the job's report before sending Slurm's message without it",
        )
        .default("60s"),
    ];
    opts.extend(super::mail_opts::opts(""));
    opts.extend(config::log_opts());
    opts
}

pub fn command() -> Command {
    config::build_command(
        Command::new("mailprog").about(
            "Slurm's MailProg: Slurm's end-of-job mail with the job's report appended (slurm.conf: MailProg=, see examples/slurm/mailprog.sh)",
        ),
        &opts(),
    )
    .arg(
        Arg::new("subject")
            .short('s')
            .value_name("SUBJECT")
            .required(true)
            .value_parser(clap::value_parser!(OsString))
            .help("The subject slurmctld gives, e.g. `Slurm Job_id=42 Name=x Ended, ...`"),
    )
    .arg(
        Arg::new("recipients")
            .value_name("RECIPIENT")
            .num_args(1..)
            .required(true)
            .action(ArgAction::Append)
            .value_parser(clap::value_parser!(OsString))
            .help("Addresses, or user names turned into addresses by the template or file"),
    )
}

/// The job the mail is about: slurmctld's environment, else the subject.
fn job_id(subject: &str) -> Option<String> {
    let id = std::env::var("SLURM_JOB_ID").ok().or_else(|| {
        let rest = subject.split("Job_id=").nth(1)?;
        Some(rest.chars().take_while(char::is_ascii_digit).collect())
    })?;
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())).then_some(id)
}

struct ReportSource {
    url: String,
    header: String,
    timeout: Duration,
}

impl ReportSource {
    /// The report as text once the stats-server knows the job ended, or why there is none.
    fn fetch(&self, cluster: &str, job: &str, user: &str) -> Result<String, String> {
        let base = format!("{}/report/{cluster}/{job}", self.url.trim_end_matches('/'));
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(35))
            .build();
        let get = |path: &str| -> Result<String, String> {
            match agent.get(path).set(&self.header, user).call() {
                Ok(r) => r.into_string().map_err(|e| e.to_string()),
                Err(ureq::Error::Status(code, r)) => Err(format!(
                    "the stats-server answered {code}: {}",
                    r.into_string().unwrap_or_default().trim()
                )),
                Err(e) => Err(format!("cannot reach the stats-server: {e}")),
            }
        };
        let start = Instant::now();
        loop {
            let ended = get(&format!("{base}.json")).map(|body| {
                serde_json::from_str::<serde_json::Value>(&body)
                    .ok()
                    .is_some_and(|v| !v["data"]["job"]["ended_at_ts"].is_null())
            });
            match ended {
                Ok(true) => return get(&format!("{base}.txt")),
                Ok(false) | Err(_) if start.elapsed() < self.timeout => {
                    std::thread::sleep(Duration::from_secs(2))
                }
                Ok(false) => {
                    return Err(format!(
                        "the stats-server had not seen the job end after {}s",
                        self.timeout.as_secs()
                    ))
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// `[mailprog]` as the loader gives it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct MailprogSettings {
    #[serde(flatten)]
    mail: MailSettings,
    cluster_id: String,
    #[serde(deserialize_with = "config::de_duration")]
    timeout: Duration,
}

pub fn run(matches: &ArgMatches) -> anyhow::Result<ExitCode> {
    let settings = config::load("mailprog", &opts(), matches)?;
    let log: LogConfig = settings.get("log")?;
    crate::log::init(&log)?;
    settings.log_deprecated();
    let MailprogSettings {
        mail,
        cluster_id: mut cluster,
        timeout,
    } = settings.get("")?;
    let server = mail
        .server()?
        .context("mailprog needs an SMTP server: set smtp.host in [mailprog]")?;
    let delivery = mail.delivery(&server)?;
    let from = mail.sender()?;
    let addresses = mail.addresses()?;
    let subject = matches
        .get_one::<OsString>("subject")
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let recipients: Vec<String> = matches
        .get_many::<OsString>("recipients")
        .into_iter()
        .flatten()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();

    if cluster.is_empty() {
        cluster = std::env::var("SLURM_CLUSTER_NAME").unwrap_or_default();
    }
    let url: String = settings.get("stats-server.url")?;
    let mut external: String = settings.get("web.external-url")?;
    if external.is_empty() {
        external.clone_from(&url);
    }
    let source = ReportSource {
        url,
        header: settings.get("stats-server.user-header-name")?,
        timeout,
    };
    let job = job_id(&subject);
    let user = std::env::var("SLURM_JOB_USER").unwrap_or_default();
    let mail_type = std::env::var("SLURM_JOB_MAIL_TYPE").unwrap_or_default();
    // A job that only began has no report yet.
    let report = match (&job, mail_type.as_str()) {
        (_, "Began") => None,
        (None, _) => Some("(No report: the job id is neither in SLURM_JOB_ID nor in the subject.)".to_owned()),
        (Some(_), _) if cluster.is_empty() || user.is_empty() => Some(
            "(No report: SLURM_CLUSTER_NAME or SLURM_JOB_USER is not set; set cluster-id in [mailprog].)"
                .to_owned(),
        ),
        (Some(job), _) => Some(match source.fetch(&cluster, job, &user) {
            Ok(text) => format!(
                "{}\n\nReport page: {}/report/{cluster}/{job}\n",
                text.trim_end(),
                external.trim_end_matches('/')
            ),
            Err(why) => {
                tracing::warn!(job = %job, error = %why, "mail sent without the job's report");
                format!("(The job's report is not available: {why}.)")
            }
        }),
    };
    let body = match report {
        Some(r) => format!("{subject}\n\n{r}"),
        None => format!("{subject}\n"),
    };

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let now = SystemTime::now();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let mut failed = 0;
    for rcpt in &recipients {
        let to = if rcpt.contains('@') {
            rcpt.parse::<lettre::Address>()
                .map_err(|e| format!("`{}` is not an address: {e}", rcpt.escape_debug()))
        } else {
            addresses.of(rcpt)
        };
        let sent = to.and_then(|to| {
            let id = message_id(
                "job",
                &format!(
                    "{cluster}/{}/{mail_type}/{to}",
                    job.as_deref().unwrap_or("")
                ),
                secs,
                &from,
            );
            let m = compose(&from, to, &subject, &id, now, body.clone(), None)?;
            runtime
                .block_on(delivery.send(&m.envelope, &m.raw, "job"))
                .map_err(|e| e.to_string())
        });
        if let Err(e) = sent {
            failed += 1;
            tracing::error!(recipient = %rcpt.escape_debug(), error = %e, "Slurm's mail was not sent");
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_comes_from_slurm_s_subject_when_the_environment_has_none() {
        if std::env::var_os("SLURM_JOB_ID").is_some() {
            return;
        }
        assert_eq!(
            job_id("Slurm Job_id=4711 Name=sim Ended, Run time 00:01:02, COMPLETED, ExitCode 0"),
            Some("4711".to_owned())
        );
        assert_eq!(job_id("Slurm Job_id=x Name=sim Began"), None);
        assert_eq!(job_id("no id"), None);
    }
}
