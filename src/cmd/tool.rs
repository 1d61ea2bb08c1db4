//! `ceems tool` (and a `ceems_tool` link): CEEMS's `ceems_tool` commands an operator runs by
//! hand: a web config to start with, and checks of web configs and of the running servers.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Arg, ArgAction, ArgMatches, Command};

use crate::web;

pub fn command() -> Command {
    let url = |default: &'static str, what: &'static str| {
        Arg::new("url")
            .long("url")
            .value_name("URL")
            .default_value(default)
            .help(what)
    };
    let boolean = |name: &'static str, default: &'static str, help: &'static str| {
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
    Command::new("tool")
        .about("Operators' tooling: web configs and health checks (CEEMS's ceems_tool)")
        .subcommand_required(true)
        .arg_required_else_help(true)
        .subcommand(
            Command::new("config")
                .about("Configuration files")
                .subcommand_required(true)
                .subcommand(
                    Command::new("create-web-config")
                        .about("Write a web config file (--web.config.file of every server): basic auth for user ceems with a random password, printed once; with --tls, a self-signed certificate")
                        .arg(boolean("basic-auth", "true", "Basic auth for user ceems (--basic-auth=false: none)"))
                        .arg(boolean("tls", "false", "A self-signed certificate and its key beside the file"))
                        .arg(
                            Arg::new("tls.host")
                                .long("tls.host")
                                .value_name("HOST")
                                .action(ArgAction::Append)
                                .help("Host name or IP address the certificate is for (repeatable; needed with --tls)"),
                        )
                        .arg(
                            Arg::new("tls.validity")
                                .long("tls.validity")
                                .value_name("DURATION")
                                .default_value("8760h")
                                .help("How long the certificate is valid"),
                        )
                        .arg(
                            Arg::new("output-dir")
                                .long("output-dir")
                                .value_name("DIR")
                                .default_value("config")
                                .help("Directory the files are written to (made if missing)"),
                        ),
                ),
        )
        .subcommand(
            Command::new("check")
                .about("Checks of configs and servers")
                .subcommand_required(true)
                .subcommand(
                    Command::new("web-config")
                        .about("Check web config files as the servers read them")
                        .arg(
                            Arg::new("web-config-files")
                                .value_name("FILE")
                                .required(true)
                                .num_args(1..),
                        ),
                )
                .subcommand(
                    Command::new("api-healthy")
                        .about("Check that the stats-server answers its /health")
                        .arg(url("http://localhost:9020", "The stats-server's URL")),
                )
                .subcommand(
                    Command::new("lb-healthy")
                        .about("Check that the lb answers its /health")
                        .arg(url("http://localhost:9030", "The lb's URL")),
                ),
        )
}

pub fn run(matches: &ArgMatches) -> anyhow::Result<ExitCode> {
    match matches.subcommand() {
        Some(("config", m)) => match m.subcommand() {
            Some(("create-web-config", m)) => create_web_config(m),
            _ => anyhow::bail!("ceems tool config: name a command (create-web-config)"),
        },
        Some(("check", m)) => match m.subcommand() {
            Some(("web-config", m)) => Ok(check_web_configs(
                m.get_many::<String>("web-config-files")
                    .into_iter()
                    .flatten()
                    .map(PathBuf::from),
            )),
            Some(("api-healthy" | "lb-healthy", m)) => check_healthy(m),
            _ => anyhow::bail!("ceems tool check: name a command"),
        },
        _ => anyhow::bail!("ceems tool: name a command (config, check)"),
    }
}

fn create_web_config(m: &ArgMatches) -> anyhow::Result<ExitCode> {
    let flag = |name: &str| m.get_one::<bool>(name).copied().unwrap_or(false);
    let hosts: Vec<String> = m
        .get_many::<String>("tls.host")
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    anyhow::ensure!(
        !flag("tls") || !hosts.is_empty(),
        "--tls.host must be provided with --tls"
    );
    let validity = m.get_one::<String>("tls.validity").map_or("8760h", |v| v);
    let validity = humantime::parse_duration(validity)
        .with_context(|| format!("--tls.validity `{validity}`"))?;
    let dir = PathBuf::from(m.get_one::<String>("output-dir").map_or("config", |d| d));
    let tls = flag("tls").then_some(hosts.as_slice());
    let g = web::generate::web_config(&dir, flag("basic-auth"), tls, validity)?;
    // CEEMS's lines, which scripts read.
    eprintln!("web config file created at {}", g.web_config.display());
    eprintln!(
        "plain text password for basic auth is {}",
        g.password.as_deref().unwrap_or("")
    );
    eprintln!("store the plain text password securely as you will need it to configure Prometheus");
    Ok(ExitCode::SUCCESS)
}

/// Each file as the servers load it: SUCCESS, or FAILED and why.
fn check_web_configs(files: impl Iterator<Item = PathBuf>) -> ExitCode {
    let mut failed = false;
    for f in files {
        match web::toolkit::WebSecurity::load(&f) {
            Ok(_) => eprintln!("{} SUCCESS", f.display()),
            Err(e) => {
                eprintln!("{} FAILED: {e}", f.display());
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn check_healthy(m: &ArgMatches) -> anyhow::Result<ExitCode> {
    let url = m
        .get_one::<String>("url")
        .map_or("", |u| u)
        .trim_end_matches('/');
    let url = match url.contains("://") {
        true => url.to_owned(),
        false => format!("http://{url}"),
    };
    let agent = web::client::agent(web::client::Timeouts::all(Duration::from_secs(10)), false)
        .context("cannot make an HTTP client")?;
    match agent.get(&format!("{url}/health")).call() {
        Ok(r) => {
            let body = r.into_string().unwrap_or_default();
            eprintln!("  SUCCESS:  {}", body.trim_end());
            Ok(ExitCode::SUCCESS)
        }
        Err(ureq::Error::Status(status, _)) => {
            anyhow::bail!("check failed: URL={url}, status={status}")
        }
        Err(e) => anyhow::bail!("check failed: URL={url}: {e}"),
    }
}
