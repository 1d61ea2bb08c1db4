//! `ceems redfish-proxy`: relays exporters' Redfish requests to the BMCs of their nodes (:5000).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{ArgMatches, Command};
use serde::Deserialize;

use crate::config::{self, Kind, LogConfig, Opt};
use crate::proxy::{self, AllowList, Proxy, ProxyConfig, Targets, DEFAULT_ALLOWED};
use crate::web::{self, client::Timeouts};

pub fn opts() -> Vec<Opt> {
    let mut opts = web::server_opts(":5000");
    opts.extend([
        Opt::new(
            "web.max-requests",
            Kind::Int,
            "Requests served at once; more get 503 (0: no limit)",
        )
        .default("200"),
        Opt::new(
            "web.header-read-timeout",
            Kind::Duration,
            "A client must send its request headers within this time",
        )
        .default("10s"),
        Opt::new(
            "web.read-timeout",
            Kind::Duration,
            "Longest wait for data from a client (request body, idle keep-alive)",
        )
        .default("60s"),
        Opt::new(
            "web.write-timeout",
            Kind::Duration,
            "Longest wait for a client to take a response write",
        )
        .default("30s"),
        Opt::new(
            "web.trusted-proxy",
            Kind::List,
            "Front proxy (IP or CIDR, repeatable) whose X-Real-IP or X-Forwarded-For names the client; from any other peer these headers are ignored. Default: a proxy on this host (127.0.0.0/8, ::1)",
        )
        .key("web.trusted-proxies"),
        Opt::new(
            "redfish.target",
            Kind::List,
            "Compute node address(es) and the BMC they may reach, as IP[+IP…]=URL (repeatable), e.g. 10.0.0.11=https://10.1.0.11",
        )
        .key("redfish.targets"),
        Opt::new(
            "redfish.bmc-network",
            Kind::List,
            "BMC network (CIDR, repeatable) where a BMC named in X-Redfish-Url may be when no target is configured for the client; names are resolved and only addresses inside these networks are connected to. With neither targets nor networks: only BMCs on this host",
        )
        .key("redfish.bmc-networks"),
        Opt::new(
            "redfish.allowed-api-resource",
            Kind::List,
            "Redfish path relayed to BMCs (repeatable; `*` matches one path segment). Default: service root, sessions, chassis and their power resources",
        )
        .key("redfish.allowed-api-resources")
        .default(&DEFAULT_ALLOWED.join(",")),
        Opt::flag(
            "redfish.insecure-skip-verify",
            "Accept any BMC certificate (self-signed BMCs); prefer installing the BMC CA",
        ),
        Opt::new(
            "redfish.connect-timeout",
            Kind::Duration,
            "Longest wait to connect to a BMC",
        )
        .default("3s"),
        Opt::new(
            "redfish.timeout",
            Kind::Duration,
            "Longest a BMC may take to answer one request; then the client gets 504",
        )
        .default("10s"),
    ]);
    opts.extend(crate::security::opts());
    opts.extend(config::log_opts());
    opts.extend(config::runtime::opts("2"));
    opts
}

pub fn command() -> Command {
    config::build_command(
        Command::new("redfish-proxy")
            .about("Relay exporters' Redfish requests to the BMCs of their nodes (:5000)")
            .long_about(
                "Relay exporters' Redfish requests to the BMCs of their nodes (:5000).\n\n\
                 Only configured BMCs are reached, chosen by the client's address (or the X-Real-IP \
                 a trusted front proxy sets), or by X-Redfish-Url when it names a configured BMC or \
                 one inside --redfish.bmc-network; only allow-listed read-only power paths and \
                 session log-in/log-out are relayed; anything else gets 403.\n\n\
                 --config.file also takes CEEMS's redfish_proxy YAML file (*.yml, *.yaml).",
            ),
        &opts(),
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct WebSettings {
    listen_address: String,
    max_requests: i64,
    #[serde(deserialize_with = "config::de_duration")]
    header_read_timeout: Duration,
    #[serde(deserialize_with = "config::de_duration")]
    read_timeout: Duration,
    #[serde(deserialize_with = "config::de_duration")]
    write_timeout: Duration,
    #[serde(default)]
    trusted_proxies: Vec<String>,
    /// `--web.config.file`, read by [`web::toolkit::WebSecurity::from_settings`].
    #[serde(default)]
    #[allow(dead_code)]
    config: toml::Table,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RedfishSettings {
    #[serde(default)]
    targets: Vec<String>,
    #[serde(default)]
    bmc_networks: Vec<String>,
    allowed_api_resources: Vec<String>,
    insecure_skip_verify: bool,
    #[serde(deserialize_with = "config::de_duration")]
    connect_timeout: Duration,
    #[serde(deserialize_with = "config::de_duration")]
    timeout: Duration,
}

pub fn run(matches: &ArgMatches) -> anyhow::Result<ExitCode> {
    let settings = config::load("redfish-proxy", &opts(), matches)?;
    let log: LogConfig = settings.get("log")?;
    crate::log::init(&log)?;
    settings.log_deprecated();
    let web_settings: WebSettings = settings.get("web")?;
    // Bind (a port below 1024 needs root), then run as nobody with no capability at all.
    let listener = web::bind_std(&web_settings.listen_address)?;
    let security: crate::security::SecuritySettings = settings.get("security")?;
    crate::security::drop_privileges(&security, &[])
        .context("cannot drop privileges (--security.drop-privileges=false to run as started)")?
        .log("redfish-proxy");
    let r: RedfishSettings = settings.get("redfish")?;
    let targets = Targets::parse(&r.targets).context("invalid --redfish.target")?;
    let bmc_networks = proxy::networks(&r.bmc_networks).context("invalid --redfish.bmc-network")?;
    // A front proxy on this host (CEEMS's own e2e script sends X-Real-IP from 127.0.0.1) is
    // believed unless the site names its proxies; a loopback client could name any configured
    // BMC in X-Redfish-Url anyway, so this reaches nothing more.
    let trusted_proxies = match web_settings.trusted_proxies.is_empty() {
        true => proxy::loopback_networks(),
        false => {
            proxy::networks(&web_settings.trusted_proxies).context("invalid --web.trusted-proxy")?
        }
    };
    // CEEMS without targets relays to any URL an exporter names; this proxy never becomes an
    // open relay: without targets or BMC networks, only BMCs on this host may be named.
    let bmc_networks = match targets.is_empty() && bmc_networks.is_empty() {
        true => {
            tracing::warn!(
                "no BMC is configured: exporters may name in X-Redfish-Url only BMCs on this host \
                 (127.0.0.0/8, ::1). List each node's BMC (--redfish.target=10.0.0.11=https://10.1.0.11, \
                 or `targets:` with `host_ip_addrs` and `url` under `redfish_proxy` in the YAML file), \
                 or the networks where exporters' BMCs may be (--redfish.bmc-network=10.1.0.0/16, or \
                 `bmc_networks: [10.1.0.0/16]` under `redfish_proxy`)"
            );
            proxy::loopback_networks()
        }
        false => bmc_networks,
    };
    let allowed = AllowList::new(&r.allowed_api_resources)
        .context("invalid --redfish.allowed-api-resource")?;
    let proxy = Proxy::new(ProxyConfig {
        targets,
        bmc_networks,
        trusted_proxies,
        allowed,
        insecure_skip_verify: r.insecure_skip_verify,
        timeouts: Timeouts {
            connect: r.connect_timeout,
            total: r.timeout,
        },
        body_timeout: web_settings.read_timeout,
    })
    .context("cannot set up TLS for BMC connections")?;
    if r.insecure_skip_verify {
        tracing::warn!("BMC certificates are not verified (--redfish.insecure-skip-verify)");
    }
    let proxy = Arc::new(proxy);
    let options = web::ServeOptions {
        max_requests: usize::try_from(web_settings.max_requests).unwrap_or(0),
        header_read_timeout: web_settings.header_read_timeout,
        read_timeout: Some(web_settings.read_timeout),
        write_timeout: Some(web_settings.write_timeout),
        security: None,
        munge: None,
        rate: None,
    }
    .with_security(web::toolkit::WebSecurity::from_settings(&settings)?);
    tracing::info!(address = %web_settings.listen_address, targets = r.targets.len(), bmc_networks = ?r.bmc_networks, "redfish proxy listening");
    let handler: web::Handler = Arc::new(move |req| {
        let proxy = Arc::clone(&proxy);
        Box::pin(proxy.handle(req))
    });
    let workers = config::runtime::worker_threads(&settings)?;
    web::serve_until_signal("ceems-redfish-proxy", workers, listener, options, handler)
        .with_context(|| format!("cannot serve on {}", web_settings.listen_address))?;
    Ok(ExitCode::SUCCESS)
}
