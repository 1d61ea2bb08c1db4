//! `ceems tool` (and a `ceems_tool` link): CEEMS's `ceems_tool` commands an operator runs by
//! hand: a web config to start with, and checks of web configs and of the running servers.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use std::os::unix::fs::DirBuilderExt as _;

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
                        .arg(url("http://localhost:9020", "The stats-server's URL"))
                        .arg(http_config()),
                )
                .subcommand(
                    Command::new("lb-healthy")
                        .about("Check that the lb answers its /health")
                        .arg(url("http://localhost:9030", "The lb's URL"))
                        .arg(http_config()),
                ),
        )
        .subcommand(
            Command::new("tsdb")
                .about("What a Prometheus scrapes, and the configs that fit it")
                .subcommand_required(true)
                .arg(
                    Arg::new("compat.metric-names")
                        .long("compat.metric-names")
                        .value_name("GENERATION")
                        .global(true)
                        .default_value("v0.11")
                        .value_parser(crate::collect::MetricNames::VALUES.to_vec())
                        .help("Rules and configs of this CEEMS generation: v0.11 (today's: the prof_* GPU rules, the IO and network rule groups, the relabel note) or v0.10 (for v0.10's dashboards)"),
                )
                .subcommand(
                    Command::new("create-recording-rules")
                        .about("Write recording rules for each scrape job of ceems exporters: the node power source it has (Cray, Redfish, IPMI DCMI or RAPL), the GPU exporter on its hosts, PUE and emission factor")
                        .arg(url("http://localhost:9090", "The Prometheus server's URL"))
                        .arg(http_config())
                        .args(window_args())
                        .arg(
                            Arg::new("pue")
                                .long("pue")
                                .value_name("PUE")
                                .default_value("1")
                                .value_parser(clap::value_parser!(f64))
                                .help("Power usage effectiveness of the data centre, multiplying every power"),
                        )
                        .arg(
                            Arg::new("emission-factor")
                                .long("emission-factor")
                                .value_name("G_PER_KWH")
                                .default_value("0")
                                .value_parser(clap::value_parser!(f64))
                                .help("A static emission factor (gCO2/kWh); 0: the emission factor series Prometheus has for --country-code, else OWID's figure for it"),
                        )
                        .arg(
                            Arg::new("country-code")
                                .long("country-code")
                                .value_name("ISO2")
                                .default_value("")
                                .help("ISO 3166-1 alpha-2 code of the country whose emission factor is used"),
                        )
                        .arg(
                            Arg::new("eval-interval")
                                .long("eval-interval")
                                .value_name("DURATION")
                                .default_value("0s")
                                .help("Evaluation interval of the per-unit rules (0s: Prometheus's evaluation_interval)"),
                        )
                        .arg(
                            Arg::new("output-dir")
                                .long("output-dir")
                                .value_name("DIR")
                                .default_value("rules")
                                .help("Directory the rules files are written to (made if missing)"),
                        )
                        .arg(
                            Arg::new("disable-providers")
                                .long("disable-providers")
                                .action(ArgAction::SetTrue)
                                .hide(true),
                        ),
                )
                .subcommand(
                    Command::new("create-relabel-configs")
                        .about("Print the metric_relabel_configs that give the GPU exporters' series (DCGM, AMD SMI, AMD device metrics) the labels of ceems's GPU series, for each scrape job exporting them")
                        .arg(url("http://localhost:9090", "The Prometheus server's URL"))
                        .arg(http_config())
                        .args(window_args()),
                )
                .subcommand(
                    Command::new("create-ceems-tsdb-updater-queries")
                        .about("Print the stats-server's TSDB updater queries for the recorded series (and emission providers) this Prometheus has")
                        .arg(url("http://localhost:9090", "The Prometheus server's URL"))
                        .arg(http_config())
                        .args(window_args()),
                ),
        )
        .subcommand(
            Command::new("findings")
                .about("The stats-server's findings (ceems's): --rerun judges the stored jobs of a window again with the rules in force, after the site's rules changed (reload them with SIGHUP first)")
                .arg(Arg::new("rerun").long("rerun").action(ArgAction::SetTrue).help("Judge the jobs that ended between --from and --to (and those running) again"))
                .arg(url("http://localhost:9020", "The stats-server's URL"))
                .arg(http_config())
                .arg(Arg::new("from").long("from").value_name("TIME").help("Jobs that ended from then: RFC 3339 or unix seconds [default: 1 day before --to]"))
                .arg(Arg::new("to").long("to").value_name("TIME").help("... until then [default: now]"))
                .arg(Arg::new("cluster").long("cluster").value_name("ID").action(ArgAction::Append).help("Only this cluster (repeatable)"))
                .args(admin_args()),
        )
        .subcommand(
            Command::new("report")
                .about("Reports from the stats-server's database (ceems's)")
                .subcommand_required(true)
                .subcommand(
                    Command::new("waste")
                        .about("Who wasted most over a window: GPU-hours held idle, CPU-hours lost, unused memory, unreached time limits, and the energy and CO2 of it, per user, project or partition, most wasteful first")
                        .arg(url("http://localhost:9020", "The stats-server's URL"))
                        .arg(http_config())
                        .arg(Arg::new("from").long("from").value_name("TIME").help("Jobs that ended from then: RFC 3339 or unix seconds [default: 30 days before --to]"))
                        .arg(Arg::new("to").long("to").value_name("TIME").help("... until then [default: now]"))
                        .arg(Arg::new("by").long("by").value_name("GROUP").default_value("user").value_parser(["user", "project", "partition"]).help("Rank users, projects or partitions"))
                        .arg(Arg::new("sort").long("sort").value_name("FIGURE").default_value("idle_gpu_hours").help("The figure ranked by: idle_gpu_hours, lost_cpu_hours, unused_memory_tb_hours, overrequested_core_hours, waste_energy_kwh or waste_emissions_g"))
                        .arg(Arg::new("cluster").long("cluster").value_name("ID").action(ArgAction::Append).help("Only this cluster (repeatable)"))
                        .args(admin_args())
                        .arg(Arg::new("csv").long("csv").action(ArgAction::SetTrue).help("CSV with the API's field names instead of a table")),
                ),
        )
}

/// Who an admin request of the stats-server is made as.
fn admin_args() -> [Arg; 2] {
    [
        Arg::new("as-user").long("as-user").value_name("USER").default_value("root").help("The admin the request is made as (one of the stats-server's --web.admin-users), in its --web.user-header-name"),
        Arg::new("user-header-name").long("user-header-name").value_name("HEADER").default_value("X-Grafana-User").help("The stats-server's --web.user-header-name"),
    ]
}

/// `--http.config.file`: Prometheus's HTTP client config (basic auth, TLS, headers).
fn http_config() -> Arg {
    Arg::new("http.config.file")
        .long("http.config.file")
        .value_name("FILE")
        .help("HTTP client config file (Prometheus's: basic_auth, authorization, tls_config, http_headers) to reach the server")
}

/// `--start` and `--end` of the series looked at.
fn window_args() -> [Arg; 2] {
    [
        Arg::new("start").long("start").value_name("TIME").help(
            "Start of the series looked at: RFC 3339 or a unix timestamp (default: 3 hours ago)",
        ),
        Arg::new("end")
            .long("end")
            .value_name("TIME")
            .help("End of the series looked at: RFC 3339 or a unix timestamp (default: now)"),
    ]
}

/// The URL and the client settings of `--http.config.file`.
fn client_settings(
    m: &ArgMatches,
    url: &str,
) -> anyhow::Result<crate::config::http_client::ClientSettings> {
    let mut settings = match m.get_one::<String>("http.config.file") {
        Some(file) => {
            anyhow::ensure!(
                !url.contains('@'),
                "Cannot set base auth in the server URL and use a http.config.file at the same time"
            );
            let path = std::path::Path::new(file);
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("Failed to load HTTP config file: {file}"))?;
            let web: crate::config::http_client::ClientWeb = serde_norway::from_str(&text)
                .with_context(|| format!("Failed to load HTTP config file: {file}"))?;
            web.resolve(path.parent().unwrap_or(std::path::Path::new(".")))
                .with_context(|| format!("Failed to load HTTP config file: {file}"))?
        }
        None => crate::config::http_client::ClientSettings::default(),
    };
    settings.url = match url.contains("://") {
        true => url.trim_end_matches('/').to_owned(),
        false => format!("http://{}", url.trim_end_matches('/')),
    };
    Ok(settings)
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
        Some(("tsdb", m)) => match m.subcommand() {
            Some(("create-recording-rules", m)) => create_recording_rules(m),
            Some(("create-relabel-configs", m)) => create_relabel_configs(m),
            Some(("create-ceems-tsdb-updater-queries", m)) => create_updater_queries(m),
            _ => anyhow::bail!("ceems tool tsdb: name a command"),
        },
        Some(("findings", m)) => findings(m),
        Some(("report", m)) => match m.subcommand() {
            Some(("waste", m)) => report_waste(m),
            _ => anyhow::bail!("ceems tool report: name a command (waste)"),
        },
        _ => anyhow::bail!("ceems tool: name a command (config, check, tsdb, findings, report)"),
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
    match &g.password {
        Some(password) => {
            eprintln!("plain text password for basic auth is {password}");
            eprintln!(
                "store the plain text password securely as you will need it to configure Prometheus"
            );
        }
        None => eprintln!("no basic auth (--basic-auth=false)"),
    }
    if let Some(cert) = &g.certificate {
        eprintln!(
            "certificate {} (a client verifies the server with it: Prometheus's ca_file, a Kubernetes webhook's caBundle as base64)",
            cert.display()
        );
    }
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

/// `--from` and `--to` as unix seconds; `--from` is `default_span` seconds before `--to`.
fn admin_window(m: &ArgMatches, default_span: f64) -> anyhow::Result<(i64, i64)> {
    let text = |name: &str| m.get_one::<String>(name).map_or("", |s| s.as_str());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let to = match text("to") {
        "" => now,
        t => crate::tool::parse_time(t).with_context(|| format!("--to `{t}`"))?,
    };
    let from = match text("from") {
        "" => to - default_span,
        t => crate::tool::parse_time(t).with_context(|| format!("--from `{t}`"))?,
    };
    anyhow::ensure!(from < to, "--from must come before --to");
    Ok((from as i64, to as i64))
}

/// Calls an admin route of the stats-server at `--url` as `--as-user`; its body, or why not.
fn admin_call(
    m: &ArgMatches,
    method: &str,
    route: &str,
    query: String,
    why_of: impl Fn(String) -> String,
) -> anyhow::Result<String> {
    let text = |name: &str| m.get_one::<String>(name).map_or("", |s| s.as_str());
    let settings = client_settings(m, text("url"))?;
    let url = format!("{}{route}?{query}", settings.url);
    let agent = web::client::agent_for(
        &settings,
        web::client::Timeouts::all(Duration::from_secs(120)),
    )
    .map_err(anyhow::Error::msg)
    .context("cannot make an HTTP client")?;
    let mut request = agent
        .request(method, &url)
        .set(text("user-header-name"), text("as-user"));
    for (k, v) in &settings.headers {
        request = request.set(k, v);
    }
    match request.call() {
        Ok(r) => Ok(r.into_string()?),
        Err(ureq::Error::Status(status, r)) => {
            let why = why_of(r.into_string().unwrap_or_default());
            anyhow::bail!("{url}: status {status}: {why}")
        }
        Err(e) => anyhow::bail!("{url}: {e}"),
    }
}

/// `ceems tool report waste`: the stats-server's ranking, as a table or CSV on stdout.
fn report_waste(m: &ArgMatches) -> anyhow::Result<ExitCode> {
    let text = |name: &str| m.get_one::<String>(name).map_or("", |s| s.as_str());
    let (from, to) = admin_window(m, 30.0 * 86400.0)?;
    let mut query = form_urlencoded::Serializer::new(String::new());
    query
        .append_pair("from", &from.to_string())
        .append_pair("to", &to.to_string())
        .append_pair("by", text("by"))
        .append_pair("sort", text("sort"));
    for c in m.get_many::<String>("cluster").into_iter().flatten() {
        query.append_pair("cluster_id", c);
    }
    let body = admin_call(m, "GET", "/api/v1/waste/admin", query.finish(), |why| {
        crate::tool::waste::rows(&why).err().unwrap_or(why)
    })?;
    let rows = crate::tool::waste::rows(&body).map_err(anyhow::Error::msg)?;
    let by = text("by");
    match m.get_flag("csv") {
        true => print!("{}", crate::tool::waste::csv(&rows, by)),
        false => print!("{}", crate::tool::waste::table(&rows, by)),
    }
    Ok(ExitCode::SUCCESS)
}

/// `ceems tool findings --rerun`: the stored jobs of the window judged again by the server.
fn findings(m: &ArgMatches) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        m.get_flag("rerun"),
        "ceems tool findings: --rerun is what it does (judge stored jobs again with the rules in force)"
    );
    let (from, to) = admin_window(m, 86400.0)?;
    let mut query = form_urlencoded::Serializer::new(String::new());
    query
        .append_pair("from", &from.to_string())
        .append_pair("to", &to.to_string());
    for c in m.get_many::<String>("cluster").into_iter().flatten() {
        query.append_pair("cluster_id", c);
    }
    let error_of = |body: String| {
        serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_owned))
            .unwrap_or(body)
    };
    let body = admin_call(
        m,
        "POST",
        "/api/v1/findings/rerun/admin",
        query.finish(),
        error_of,
    )?;
    let answer: serde_json::Value =
        serde_json::from_str(&body).context("the stats-server's answer")?;
    let count = |key: &str| {
        answer["data"][key]
            .as_i64()
            .with_context(|| format!("the stats-server's answer has no data.{key}: {body}"))
    };
    println!(
        "{} jobs judged again ({} site rules in force)",
        count("jobs")?,
        count("site_rules")?
    );
    Ok(ExitCode::SUCCESS)
}

fn check_healthy(m: &ArgMatches) -> anyhow::Result<ExitCode> {
    let settings = client_settings(m, m.get_one::<String>("url").map_or("", |u| u))?;
    let url = settings.url.clone();
    let agent = web::client::agent_for(
        &settings,
        web::client::Timeouts::all(Duration::from_secs(10)),
    )
    .map_err(anyhow::Error::msg)
    .context("cannot make an HTTP client")?;
    let mut request = agent.get(&format!("{url}/health"));
    for (k, v) in &settings.headers {
        request = request.set(k, v);
    }
    match request.call() {
        Ok(r) => {
            let body = r.into_string().unwrap_or_default();
            eprintln!("  SUCCESS:  {}", body.trim_end());
            Ok(ExitCode::SUCCESS)
        }
        // A degraded stats-server says what fails (503 and one line per failing stage).
        Err(ureq::Error::Status(status, r)) => {
            let why = r.into_string().unwrap_or_default();
            match why.trim() {
                "" => anyhow::bail!("check failed: URL={url}, status={status}"),
                why => anyhow::bail!("check failed: URL={url}, status={status}: {why}"),
            }
        }
        Err(e) => anyhow::bail!("check failed: URL={url}: {e}"),
    }
}

/// The Prometheus of `--url` and the window of `--start` and `--end`.
fn prometheus_and_window(m: &ArgMatches) -> anyhow::Result<(crate::tool::Prometheus, (f64, f64))> {
    let settings = client_settings(m, m.get_one::<String>("url").map_or("", |u| u))?;
    let text = |name: &str| m.get_one::<String>(name).map_or("", |s| s.as_str());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let window = crate::tool::window(text("start"), text("end"), now)
        .context("error parsing start and/or end time(s)")?;
    Ok((
        crate::tool::Prometheus::new(settings, Duration::from_secs(120))?,
        window,
    ))
}

fn create_updater_queries(m: &ArgMatches) -> anyhow::Result<ExitCode> {
    let (prometheus, window) = prometheus_and_window(m)?;
    let names = crate::tool::updater::series();
    let mut found: Vec<String> = Vec::new();
    for s in prometheus
        .series(&names, window)
        .context("error fetching labelsets")?
    {
        if let Some(name) = s.get("__name__").filter(|n| !found.contains(n)) {
            found.push(name.clone());
        }
    }
    let providers = prometheus
        .label_values("provider", &[crate::tool::updater::PROVIDER_SERIES], window)
        .context("error fetching emission factor providers")?;
    eprintln!("Queries for TSDB updater:");
    eprintln!(
        "{}",
        crate::tool::updater::queries(&found, &providers, generation(m))
    );
    Ok(ExitCode::SUCCESS)
}

/// `--compat.metric-names` of the `tsdb` commands.
fn generation(m: &ArgMatches) -> crate::collect::MetricNames {
    match m
        .get_one::<String>("compat.metric-names")
        .map(String::as_str)
    {
        Some("v0.10") => crate::collect::MetricNames::V010,
        _ => crate::collect::MetricNames::Current,
    }
}

fn create_relabel_configs(m: &ArgMatches) -> anyhow::Result<ExitCode> {
    let (prometheus, window) = prometheus_and_window(m)?;
    let series = prometheus
        .series(&crate::tool::relabel::GPU_SERIES, window)
        .context("error fetching series label values")?;
    let jobs = crate::tool::Jobs::of(&series);
    // CEEMS's lines, on standard error as it prints them.
    eprintln!("Merge the following scrape_configs with the current config.");
    eprintln!("{}", crate::tool::relabel::scrape_configs(&jobs));
    if generation(m) == crate::collect::MetricNames::Current {
        eprintln!("{}", crate::tool::relabel::RULES_RELABEL_NOTE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Asks on the terminal which of `chassis` reports the node's power (CEEMS's prompt).
fn choose_chassis(job: &str, chassis: &[String]) -> Result<String, crate::tool::ToolError> {
    eprintln!("Multiple chassis found for the Redfish power series of job {job}");
    eprintln!("Choose the chassis that reports host power usage");
    for (i, c) in chassis.iter().enumerate() {
        eprintln!("[{i}]: {c}");
    }
    eprintln!("Enter number between 0 and {}", chassis.len() - 1);
    let mut line = String::new();
    let refused = |reason: String| crate::tool::ToolError::Input(reason);
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| refused(format!("failed to read the choice: {e}")))?;
    let index: usize = line
        .trim()
        .parse()
        .map_err(|_| refused(format!("invalid choice {:?}: not a number", line.trim())))?;
    chassis.get(index).cloned().ok_or_else(|| {
        refused(format!(
            "choice {index} out of range: must be between 0 and {}",
            chassis.len() - 1
        ))
    })
}

fn create_recording_rules(m: &ArgMatches) -> anyhow::Result<ExitCode> {
    use crate::tool::rules;
    let (prometheus, window) = prometheus_and_window(m)?;
    let number = |name: &str| m.get_one::<f64>(name).copied().unwrap_or(0.0);
    let text = |name: &str| m.get_one::<String>(name).map_or("", |s| s.as_str());
    let eval = humantime::parse_duration(text("eval-interval"))
        .with_context(|| format!("--eval-interval `{}`", text("eval-interval")))?;
    let country = text("country-code").to_owned();
    let owid = crate::collect::emissions::tables::shipped()
        .ok()
        .and_then(|t| t.owid.get(&country.to_uppercase()).map(|(_, f)| *f));
    let settings = rules::discover::Settings {
        pue: number("pue"),
        emission_factor: number("emission-factor"),
        eval: (!eval.is_zero()).then_some(eval),
        disable_providers: m.get_flag("disable-providers"),
        owid_factor: owid,
        country,
        generation: generation(m),
    };
    let found = rules::discover::discover(&prometheus, window, &settings, &mut choose_chassis)
        .context("cannot tell what Prometheus scrapes")?;
    for note in &found.notes {
        eprintln!("{note}");
    }
    let dir = PathBuf::from(text("output-dir"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("cannot make the output directory {}", dir.display()))?;
    let write = |name: String, text: String| -> anyhow::Result<()> {
        let path = dir.join(name);
        web::generate::write_private(&path, text.as_bytes())
            .with_context(|| format!("cannot write {}", path.display()))
    };
    if found.jobs.is_empty() {
        eprintln!("no scrape job has ceems's series with a power source (Cray, Redfish, IPMI DCMI or RAPL): no rules written");
    }
    for job in &found.jobs {
        eprintln!(
            "generating recording rules for job {} in file {}.rules",
            job.job, job.job
        );
        write(
            format!("{}.rules", job.job),
            rules::host_rules(job, &found.emissions),
        )?;
        if let Some(gpu) = &job.gpu {
            eprintln!(
                "generating recording rules for GPU for job {} in file {}-gpu.rules",
                gpu.job, gpu.job
            );
            write(
                format!("{}-gpu.rules", gpu.job),
                rules::gpu_rules(job, gpu, &found.emissions),
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
