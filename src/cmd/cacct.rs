//! `ceems cacct` (and a `cacct` link): a user's jobs, their usage, energy and emissions in the
//! terminal, from the stats-server's API, as CEEMS's `cacct` prints them.
//!
//! The user is the caller's real uid's name. The config (the API server's credentials) is read
//! from /etc/ceems, which a setgid `cacct` may read and its caller may not; the granted group is
//! given up right after, before any request or file write.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Arg, ArgAction, ArgMatches, Command};

use crate::acct;

/// Where the config is looked for first.
const CONFIG_DIR: &str = "/etc/ceems";

pub fn command() -> Command {
    let text = |name: &'static str, help: &'static str| {
        Arg::new(name).long(name).value_name("LIST").help(help)
    };
    let boolean_defaulting = |name: &'static str, default: &'static str, help: &'static str| {
        Arg::new(name)
            .long(name)
            .value_name("BOOL")
            .num_args(0..=1)
            .require_equals(true)
            .default_value(default)
            .default_missing_value("true")
            .value_parser(clap::builder::BoolishValueParser::new())
            .help(help)
    };
    let boolean = |name: &'static str, help: &'static str| boolean_defaulting(name, "false", help);
    let fields: Vec<&str> = acct::FIELDS.iter().map(|f| f.key).collect();
    Command::new("cacct")
        .about("Energy, emissions, usage and performance of your jobs, from the stats-server (CEEMS's cacct)")
        .arg(text("account", "Comma separated list of accounts to select jobs to display. By default, all accounts are selected."))
        .arg(
            Arg::new("starttime")
                .long("starttime")
                .value_name("TIME")
                .help("Select jobs eligible after this local time. Valid format is YYYY-MM-DD[THH:MM[:SS]] (default: 00:00:00 of the current day)."),
        )
        .arg(
            Arg::new("endtime")
                .long("endtime")
                .value_name("TIME")
                .help("Select jobs eligible before this local time. Valid format is YYYY-MM-DD[THH:MM[:SS]] (default: now)."),
        )
        .arg(text("job", "Comma separated list of jobs to display information. Default is all jobs in the period.").short('j'))
        .arg(boolean("report", "Print the report of the job given with --job: its findings with advice, energy, emissions, what it asked for and used (the text its mail carries)."))
        .arg(text("user", "Comma separated list of user names to select jobs to display (admins only). By default, the running user is used."))
        .arg(text("format", "Comma separated list of fields (Use --helpformat for list of available fields)."))
        .arg(boolean("helpformat", "List of available fields."))
        .arg(boolean(
            "long",
            Box::leak(format!("Equivalent to specifying --format=\"{}\".", fields.join(",")).into_boxed_str()),
        ))
        .arg(text("ts.metrics", "Comma separated list of the config's time series (range queries, --helpformat lists them) whose data is saved in CSV format for each job."))
        .arg(boolean("ts", "Deprecated: every time series of the config, as --ts.metrics naming them all.").hide(true))
        .arg(boolean_defaulting(
            "summary",
            "true",
            "Print the summary of the usage by account and user: of every job in the window, or with --job of the jobs named (--summary=false: none).",
        ))
        .arg(
            Arg::new("account-filter")
                .long("account-filter")
                .value_name("REGEXP")
                .hide(true)
                .help("Only jobs of accounts matching this regular expression."),
        )
        .arg(
            Arg::new("ts.out-dir")
                .long("ts.out-dir")
                .value_name("DIR")
                .default_value("out")
                .help("Directory to save time series data."),
        )
        .arg(boolean("csv", "Produce CSV output."))
        .arg(boolean("html", "Produce HTML output."))
        .arg(boolean("markdown", "Produce markdown output."))
        // CEEMS's test-build flags: honoured for root only, never in a setuid or setgid run.
        .arg(Arg::new("current-user").long("current-user").hide(true).action(ArgAction::Set))
        .arg(Arg::new("config-path").long("config-path").hide(true).action(ArgAction::Set))
}

/// CEEMS's way of failing (v0.16): `error: …` and status 1.
fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::FAILURE
}

fn list(m: &ArgMatches, name: &str) -> Vec<String> {
    m.get_one::<String>(name)
        .map(|s| {
            s.split(',')
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// A local time as cacct's flags take it.
fn parse_time(text: &str) -> Option<jiff::Timestamp> {
    let zone = jiff::tz::TimeZone::system();
    for format in ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M"] {
        if let Ok(t) = jiff::civil::DateTime::strptime(format, text) {
            return t.to_zoned(zone.clone()).ok().map(|z| z.timestamp());
        }
    }
    let day = jiff::civil::Date::strptime("%Y-%m-%d", text).ok()?;
    day.to_zoned(zone).ok().map(|z| z.timestamp())
}

/// The caller: the real uid's user name. `--current-user` only for root in a plain run.
fn caller(m: &ArgMatches) -> Result<String, String> {
    let uid = nix::unistd::getuid();
    if let Some(name) = m.get_one::<String>("current-user") {
        if !uid.is_root() || crate::security::set_id() {
            return Err("--current-user is for tests, run by root: refused".into());
        }
        return Ok(name.clone());
    }
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(u)) => Ok(u.name),
        Ok(None) => Err(format!("failed to get current user: uid {uid} has no name")),
        Err(e) => Err(format!("failed to get current user: {e}")),
    }
}

/// The user's own config directory (`$XDG_CONFIG_HOME/ceems` or `~/.config/ceems`).
fn user_config_dir() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".config"),
    };
    Some(base.join("ceems"))
}

pub fn run(m: &ArgMatches) -> anyhow::Result<ExitCode> {
    let flag = |name: &str| m.get_one::<bool>(name).copied().unwrap_or(false);
    // Read with what the file grants (a setgid cacct), then give it up for good, before
    // anything reads the environment or the user's files.
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(dir) = m.get_one::<String>("config-path") {
        if !nix::unistd::getuid().is_root() || crate::security::set_id() {
            return Ok(fail("--config-path is for tests, run by root: refused"));
        }
        dirs.push(PathBuf::from(dir));
    }
    dirs.push(PathBuf::from(CONFIG_DIR));
    let set_id = crate::security::set_id();
    let loaded = acct::load_settings(&dirs);
    crate::security::drop_set_id()?;
    let settings = match loaded {
        Err(acct::AcctError::NoConfig { .. }) if user_config_dir().is_some() => {
            dirs.extend(user_config_dir());
            acct::load_settings(&dirs)
        }
        other => other,
    };
    if flag("helpformat") {
        let series = settings
            .as_ref()
            .map(|s| s.queries.as_slice())
            .unwrap_or(&[]);
        print!("{}", acct::help_format(series));
        return Ok(ExitCode::SUCCESS);
    }
    let settings = match settings {
        Ok(s) => s,
        // What a parser says may quote the protected file: not for its callers' eyes.
        Err(acct::AcctError::Config { path, .. }) if set_id => {
            return Ok(fail(format!(
                "unable to get cacct config: {} is invalid (`ceems cacct` run by root says why)",
                path.display()
            )))
        }
        Err(e) => return Ok(fail(format!("unable to get cacct config: {e}"))),
    };
    let user = match caller(m) {
        Ok(u) => u,
        Err(e) => return Ok(fail(e)),
    };
    let log = settings.log.clone();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = args.join(" ");
    if let Some(log) = &log {
        if settings.old_queries_form {
            log.write(
                "warn",
                "tsdb.queries is in CEEMS v0.10's form (name: query); v0.16's is a list of {name, title, help, query, kind}",
                &[],
            );
        }
    }
    let status = run_with(m, &settings, &user);
    if let Some(log) = &log {
        let outcome = match &status {
            Ok(code) if *code == ExitCode::SUCCESS => "ok",
            _ => "failed",
        };
        log.write(
            "info",
            "cacct run",
            &[("user", &user), ("args", &args), ("outcome", outcome)],
        );
    }
    status
}

fn run_with(m: &ArgMatches, settings: &acct::Settings, user: &str) -> anyhow::Result<ExitCode> {
    let flag = |name: &str| m.get_one::<bool>(name).copied().unwrap_or(false);
    let mut names = list(m, "format");
    if names.is_empty() || flag("long") {
        names = match flag("long") {
            true => acct::FIELDS
                .iter()
                .map(|f| f.key.to_owned())
                .chain(
                    settings
                        .queries
                        .iter()
                        .filter(|q| q.kind == acct::queries::Kind::Instant)
                        .map(|q| q.key.clone()),
                )
                .collect(),
            false => acct::DEFAULT_FIELDS
                .iter()
                .map(|f| (*f).to_owned())
                .collect(),
        };
    }
    let (fields, instant) = match acct::fields(&names, &settings.queries) {
        Ok(f) => f,
        Err(e) => return Ok(fail(e)),
    };
    // The series to save: those named, or every one with the deprecated --ts.
    let range: Vec<&acct::SeriesQuery> = settings
        .queries
        .iter()
        .filter(|q| q.kind == acct::queries::Kind::Range)
        .collect();
    let mut ts_names = list(m, "ts.metrics");
    if flag("ts") {
        ts_names.extend(range.iter().map(|q| q.key.clone()));
    }
    let mut ts: Vec<&acct::SeriesQuery> = Vec::new();
    for name in &ts_names {
        match range.iter().find(|q| q.key.eq_ignore_ascii_case(name)) {
            Some(q) if !ts.contains(q) => ts.push(q),
            Some(_) => {}
            None => {
                return Ok(fail(format!(
                    "unknown time series `{name}` in --ts.metrics (--helpformat lists them)"
                )))
            }
        }
    }
    let account_filter = match m.get_one::<String>("account-filter") {
        None => None,
        Some(re) => match regex::Regex::new(&format!("^(?:{re})$")) {
            Ok(r) => Some(r),
            Err(e) => return Ok(fail(format!("invalid --account-filter: {e}"))),
        },
    };
    let mut users = list(m, "user");
    if users.len() == 1 && users[0] == user {
        users.clear();
    }
    let now = jiff::Timestamp::now();
    let midnight = now
        .to_zoned(jiff::tz::TimeZone::system())
        .start_of_day()
        .map(|z| z.timestamp())
        .unwrap_or(now);
    let mut window = [midnight, now];
    for (i, name) in ["starttime", "endtime"].into_iter().enumerate() {
        if let Some(text) = m.get_one::<String>(name) {
            match parse_time(text) {
                Some(t) => window[i] = t,
                None => {
                    return Ok(fail(format!(
                        "failed to parse --{name} flag: invalid time format"
                    )))
                }
            }
        }
    }
    let query = acct::Query {
        from: window[0].as_second(),
        to: window[1].as_second(),
        accounts: list(m, "account"),
        jobs: list(m, "job"),
        users,
        fields,
        instant,
        account_filter,
    };
    let timeout = Duration::from_secs(60);
    if flag("report") {
        let [job] = query.jobs.as_slice() else {
            return Ok(fail("--report needs one job: --job=ID"));
        };
        let text = acct::Client::new(&settings.api, settings.api_munge.clone(), timeout)
            .and_then(|api| acct::report(&api, settings, user, job));
        return Ok(match text {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        });
    }
    let fetched = acct::Client::new(&settings.api, settings.api_munge.clone(), timeout)
        .and_then(|api| acct::fetch(&api, settings, user, &query));
    let (mut units, usage) = match fetched {
        Ok(answer) => answer,
        Err(e @ (acct::AcctError::Forbidden | acct::AcctError::Server)) => return Ok(fail(e)),
        Err(e) => return Ok(fail(format!("failed to fetch jobs: {e}"))),
    };
    if units.is_empty() {
        // Said on standard error: standard output stays the table CEEMS's cacct prints.
        let zone = jiff::tz::TimeZone::system();
        let day = |t: i64| {
            jiff::Timestamp::from_second(t)
                .map(|t| {
                    t.to_zoned(zone.clone())
                        .strftime("%Y-%m-%dT%H:%M")
                        .to_string()
                })
                .unwrap_or_else(|_| t.to_string())
        };
        let whose = match query.users.as_slice() {
            [] => format!(" of {user}"),
            users if users.iter().any(|u| u == "all") => String::new(),
            users => format!(" of {}", users.join(", ")),
        };
        let cluster = match settings.cluster_id.as_str() {
            "" => String::new(),
            c => format!(" on cluster {c}"),
        };
        eprintln!(
            "no jobs{whose}{cluster} between {} and {}",
            day(query.from),
            day(query.to)
        );
    }
    if let Some(note) = acct::missing_energy_note(&units, &query.fields) {
        eprintln!("{note}");
    }
    let tsdb = || {
        acct::Client::new(
            &settings.tsdb,
            settings.tsdb_munge.clone(),
            settings.query_timeout,
        )
    };
    if !query.instant.is_empty() {
        match tsdb() {
            Ok(tsdb) => acct::fill_instant(&tsdb, &query.instant, &mut units, now.as_second()),
            Err(e) => eprintln!("failed to query the TSDB: {e}"),
        }
    }
    if !ts.is_empty() {
        let dir = PathBuf::from(m.get_one::<String>("ts.out-dir").map_or("out", |d| d));
        let max = settings.max_units_for_range_queries;
        if units.len() > max {
            eprintln!(
                "too many jobs to fetch time series data. Please provide explicit job IDs (less than {max} at a time) using --job when --ts.metrics is set"
            );
        } else {
            let limits = acct::series::Limits {
                max_series: settings.query_max_series,
                min_step: settings.min_step_seconds,
            };
            let saved = tsdb().and_then(|tsdb| {
                acct::series::save(&tsdb, &ts, &units, &dir, now.as_millisecond(), limits)
            });
            match saved {
                Ok(_) => eprintln!("time series data saved to directory {}", dir.display()),
                Err(e) => eprintln!("failed to fetch time series data {e}"),
            }
        }
    }
    let table = acct::table(
        &units,
        &usage,
        user,
        &query.users,
        &query.instant,
        flag("summary"),
    );
    let text = match (flag("html"), flag("csv"), flag("markdown")) {
        (true, _, _) => table.render_html(),
        (_, true, _) => table.render_csv(),
        (_, _, true) => table.render_markdown(),
        // On a terminal wide enough, cells are not wrapped; elsewhere CEEMS's widths hold.
        _ => match terminal_size::terminal_size_of(std::io::stdout()) {
            Some((terminal_size::Width(columns), _)) => table.render_within(columns.into()),
            None => table.render(),
        },
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_the_flags_three_forms_in_local_time() {
        let zone = jiff::tz::TimeZone::system();
        let want = jiff::civil::date(2022, 2, 20)
            .to_zoned(zone)
            .unwrap()
            .timestamp();
        assert_eq!(parse_time("2022-02-20"), Some(want));
        assert_eq!(
            parse_time("2022-02-20T01:02").map(|t| t.as_second() - want.as_second()),
            Some(3720)
        );
        assert_eq!(
            parse_time("2022-02-20T01:02:03").map(|t| t.as_second() - want.as_second()),
            Some(3723)
        );
        assert_eq!(parse_time("20/02/2022"), None);
    }
}
