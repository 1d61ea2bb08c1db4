//! `ceems mailprog`: Slurm's `MailProg` and PBS's `mailer`. slurmctld runs it as
//! `mail -s SUBJECT USER` when a job asked for mail (`--mail-type`); the PBS server runs it as
//! `sendmail -f FROM "USER@HOST …"` with the message on its standard input (`qsub -m e`). It
//! sends the manager's usual message with the job's report from the stats-server appended, as
//! Princeton's jobstats does. The job has only just ended, so it waits (within `--timeout`)
//! until the stats-server has seen the end; the stats-server then computes that one job's
//! figures on demand. Without a report, the manager's message still goes.

use std::ffi::OsString;
use std::io::Read;
use std::path::Path;
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
            "The job's cluster in the stats-server (empty: Slurm's SLURM_CLUSTER_NAME, or the PBS server of the job id)",
        )
        .default(""),
        Opt::new(
            "timeout",
            Kind::Duration,
            "How long to wait for the job's report before sending the manager's message without it",
        )
        .default("60s"),
        Opt::new(
            "pbs.conf",
            Kind::Str,
            "PBS: its pbs.conf, where qstat is found (PBS_EXEC) to name a job's owner",
        )
        .default("/etc/pbs.conf"),
    ];
    opts.extend(super::mail_opts::opts(""));
    opts.extend(config::log_opts());
    opts
}

pub fn command() -> Command {
    config::build_command(
        Command::new("mailprog").about(
            "Slurm's MailProg and PBS's mailer: the end-of-job mail with the job's report appended (slurm.conf: MailProg=, see examples/slurm/mailprog.sh; qmgr: set server mailer=, see examples/openpbs/mailer.sh)",
        ),
        &opts(),
    )
    .arg(
        Arg::new("subject")
            .short('s')
            .value_name("SUBJECT")
            .value_parser(clap::value_parser!(OsString))
            .help("The subject slurmctld gives, e.g. `Slurm Job_id=42 Name=x Ended, ...`; without it, the message (PBS's) is read from standard input"),
    )
    .arg(
        Arg::new("envelope-from")
            .short('f')
            .value_name("FROM")
            .value_parser(clap::value_parser!(OsString))
            .help("The sender PBS names, as to sendmail (the mail goes from [mailprog]'s sender)"),
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

/// Largest message read from standard input.
const MAX_MESSAGE: u64 = 1 << 20;

/// What the manager asked to send.
#[derive(Debug, PartialEq, Eq)]
struct Incoming {
    subject: String,
    /// The manager's own message, which the report follows.
    text: String,
    job: Option<String>,
    /// The job's owner, who reads its report; empty when unknown.
    user: String,
    /// The cluster the manager names (Slurm's SLURM_CLUSTER_NAME, the PBS server).
    cluster: String,
    /// Why the mail goes, in Slurm's words (`Began`, `Ended`, `Failed`): a mail at the job's
    /// start has no report yet.
    mail_type: String,
}

impl Incoming {
    fn slurm(subject: String) -> Incoming {
        Incoming {
            job: job_id(&subject),
            user: std::env::var("SLURM_JOB_USER").unwrap_or_default(),
            cluster: std::env::var("SLURM_CLUSTER_NAME").unwrap_or_default(),
            mail_type: std::env::var("SLURM_JOB_MAIL_TYPE").unwrap_or_default(),
            text: subject.clone(),
            subject,
        }
    }

    /// A PBS server's message: `To:` and `Subject: PBS JOB <id>` headers, a blank line, then
    /// `PBS Job Id: <id>` and what happened (`Execution terminated`, `Begun execution`).
    fn pbs(message: &str) -> Incoming {
        let (head, body) = message.split_once("\n\n").unwrap_or((message, ""));
        let subject = head
            .lines()
            .find_map(|l| l.strip_prefix("Subject:"))
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        let job = body
            .lines()
            .find_map(|l| l.strip_prefix("PBS Job Id:"))
            .or_else(|| subject.strip_prefix("PBS JOB "))
            .map(str::trim)
            .filter(|id| crate::manager::openpbs::is_job_id(id))
            .map(str::to_owned);
        let cluster = job
            .as_deref()
            .and_then(|id| id.split_once('.'))
            .map(|(_, server)| server.to_owned())
            .unwrap_or_default();
        let said = |what: &str| body.lines().any(|l| l.trim() == what);
        let mail_type = if said("Begun execution") {
            "Began"
        } else if said("Aborted by PBS Server") {
            "Failed"
        } else {
            "Ended"
        };
        Incoming {
            mail_type: mail_type.to_owned(),
            subject,
            text: body.trim_end().to_owned(),
            job,
            user: String::new(),
            cluster,
        }
    }
}

/// A PBS job's owner, from `qstat -x -f -F json <id>` (the server that runs the mailer holds
/// the job's history a while); empty when qstat cannot say.
fn pbs_owner(pbs_conf: &Path, job: &str) -> String {
    use crate::manager::openpbs::accounting::PbsAccounting;
    use crate::manager::Accounting;
    let (_, bin) = PbsAccounting::from_pbs_conf(pbs_conf);
    let bin = bin.or_else(|| {
        crate::host::command::find_program("qstat", std::env::var_os("PATH").as_deref())
            .and_then(|p| p.parent().map(Path::to_owned))
    });
    let Some(bin) = bin else {
        tracing::warn!(conf = %pbs_conf.display(), "no qstat: the job's owner is unknown");
        return String::new();
    };
    let qstat = PbsAccounting::new(None, Some(bin), Vec::new(), Duration::from_secs(30));
    match qstat.unit(job) {
        Ok(mut units) => units
            .find_map(|u| u.ok().map(|u| u.user))
            .unwrap_or_default(),
        Err(e) => {
            tracing::warn!(job = %job, error = %e, "qstat cannot name the job's owner");
            String::new()
        }
    }
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
    let recipients: Vec<String> = matches
        .get_many::<OsString>("recipients")
        .into_iter()
        .flatten()
        .map(|s| s.to_string_lossy().into_owned())
        // PBS passes its addresses as one argument, separated by spaces.
        .flat_map(|s| {
            s.split([' ', ','])
                .filter(|a| !a.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    let incoming = match matches.get_one::<OsString>("subject") {
        Some(subject) => Incoming::slurm(subject.to_string_lossy().into_owned()),
        None => {
            let mut message = Vec::new();
            std::io::stdin()
                .take(MAX_MESSAGE)
                .read_to_end(&mut message)
                .context("cannot read the message from standard input")?;
            let mut incoming = Incoming::pbs(&String::from_utf8_lossy(&message));
            if let Some(job) = &incoming.job {
                let conf: String = settings.get("pbs.conf")?;
                incoming.user = pbs_owner(Path::new(&conf), job);
            }
            incoming
        }
    };
    if cluster.is_empty() {
        cluster.clone_from(&incoming.cluster);
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
    let Incoming {
        subject,
        text,
        job,
        user,
        mail_type,
        ..
    } = incoming;
    // A job that only began has no report yet.
    let report = match &job {
        _ if mail_type == "Began" => None,
        None => Some("(No report: the message names no job id.)".to_owned()),
        Some(_) if cluster.is_empty() || user.is_empty() => Some(
            "(No report: the job's cluster or owner is not known; set cluster-id in [mailprog].)"
                .to_owned(),
        ),
        Some(job) => Some(match source.fetch(&cluster, job, &user) {
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
        Some(r) => format!("{text}\n\n{r}"),
        None => format!("{text}\n"),
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
            tracing::error!(recipient = %rcpt.escape_debug(), error = %e, "the job's mail was not sent");
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
    fn a_pbs_server_s_message_names_the_job_its_server_and_why() {
        let ended = Incoming::pbs(
            "To: alice@pbslab \nSubject: PBS JOB 12[3].pbslab\n\nPBS Job Id: 12[3].pbslab\nJob Name:   sim\nExecution terminated\nExit_status=0\nresources_used.walltime=00:00:05\n",
        );
        assert_eq!(ended.job.as_deref(), Some("12[3].pbslab"));
        assert_eq!(ended.cluster, "pbslab");
        assert_eq!(ended.subject, "PBS JOB 12[3].pbslab");
        assert_eq!(ended.mail_type, "Ended");
        assert!(ended
            .text
            .starts_with("PBS Job Id: 12[3].pbslab\nJob Name:   sim\nExecution terminated"));
        assert!(
            ended.text.ends_with("walltime=00:00:05"),
            "{:?}",
            ended.text
        );
        let began = Incoming::pbs(
            "To: a@b\nSubject: PBS JOB 7.srv\n\nPBS Job Id: 7.srv\nJob Name:   x\nBegun execution\n",
        );
        assert_eq!(began.mail_type, "Began");
        let aborted = Incoming::pbs("Subject: PBS JOB 8.srv\n\nAborted by PBS Server \n");
        assert_eq!(
            (aborted.job.as_deref(), aborted.mail_type.as_str()),
            (Some("8.srv"), "Failed")
        );
        // Not an id a command or a URL may carry.
        assert_eq!(Incoming::pbs("Subject: PBS JOB 1;rm\n\n").job, None);
        assert_eq!(Incoming::pbs("").job, None);
    }

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
