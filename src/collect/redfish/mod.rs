//! `redfish`: chassis power from the BMC's Redfish API, directly or through
//! `ceems redfish-proxy`.

pub mod model;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;

use super::{CollectError, Collector, CollectorSpec, Context, MetricNames};
use crate::config::{Kind, Opt};
use crate::metrics::{Labels, MetricSet};
use crate::web::client::{self, Timeouts};
use crate::web::REDFISH_URL_HEADER;
use model::{ChassisLinks, ChassisPower};

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "redfish",
    default_enabled: false,
    capabilities: &[],
    options,
    build,
    self_test: None,
    sub_collectors: &[],
};

/// Where the operator puts BMC credentials instead of the file.
pub const USERNAME_ENV: &str = "CEEMS_EXPORTER_REDFISH_USERNAME";
pub const PASSWORD_ENV: &str = "CEEMS_EXPORTER_REDFISH_PASSWORD";
/// Largest Redfish document read; real ones are a few KiB.
const MAX_BODY: u64 = 4 << 20;

fn options() -> Vec<Opt> {
    vec![
        Opt::new(
            "collector.redfish.config.file",
            Kind::Str,
            "Redfish client configuration file (YAML, `redfish_web_config:` as in CEEMS)",
        )
        .key("collector.redfish.config-file")
        .env_renamed_from("CEEMS_EXPORTER_REDFISH_COLL_CONFIG_FILE")
        .renamed_from("collector.redfish.web-config"),
        Opt::flag(
            "collector.redfish.config.file.expand-env-vars",
            "Replace ${VAR} and $VAR in the configuration file by the environment's values (empty when unset), as CEEMS does",
        )
        .key("collector.redfish.expand-env-vars"),
    ]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Settings {
    #[serde(default)]
    config_file: Option<PathBuf>,
    expand_env_vars: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    redfish_web_config: WebConfig,
}

/// The `redfish_web_config` table of the collector's YAML file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebConfig {
    #[serde(default = "default_protocol")]
    pub protocol: String,
    /// BMC host; `{hostname}` is replaced by this node's host name. CEEMS's fixture spells it
    /// `host`.
    #[serde(default, alias = "host")]
    pub hostname: String,
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<String>,
    #[serde(default)]
    pub use_session_token: bool,
    #[serde(default)]
    pub insecure_skip_verify: bool,
    #[serde(default = "default_timeout", with = "humantime_serde_compat")]
    pub timeout: Duration,
    /// `ceems redfish-proxy` URL; requests go there with the BMC in `X-Redfish-Url`.
    #[serde(default)]
    pub external_url: Option<String>,
}

fn default_protocol() -> String {
    "https".to_owned()
}

fn default_timeout() -> Duration {
    Duration::from_secs(5)
}

/// Durations written as `5s` (or a bare number of seconds).
mod humantime_serde_compat {
    use std::time::Duration;

    use serde::Deserialize;

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Seconds(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Seconds(s) => Ok(Duration::from_secs(s)),
            Raw::Text(t) => humantime::parse_duration(&t).map_err(serde::de::Error::custom),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RedfishError {
    #[error("cannot read {path}: {source}")]
    ConfigRead {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("GET {url}: {message}")]
    Request { url: String, message: String },
    #[error("{url}: {source}")]
    Model {
        url: String,
        source: model::ModelError,
    },
}

impl WebConfig {
    /// Reads the YAML file; credentials in the environment win over the file's.
    pub fn load(path: &Path) -> Result<WebConfig, RedfishError> {
        WebConfig::load_with(path, false)
    }

    /// As [`WebConfig::load`]; with `expand_env`, `${VAR}` and `$VAR` in the file are first
    /// replaced by the environment's values.
    pub fn load_with(path: &Path, expand_env: bool) -> Result<WebConfig, RedfishError> {
        let mut text =
            std::fs::read_to_string(path).map_err(|source| RedfishError::ConfigRead {
                path: path.to_owned(),
                source,
            })?;
        if expand_env {
            text = expand_env_vars(&text, |name| std::env::var(name).ok());
        }
        let file: ConfigFile = serde_norway::from_str(&text).map_err(|e| RedfishError::Config {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let mut c = file.redfish_web_config;
        if let Ok(u) = std::env::var(USERNAME_ENV) {
            c.username = Some(u);
        }
        if let Ok(p) = std::env::var(PASSWORD_ENV) {
            c.password = Some(p);
        }
        if c.protocol != "http" && c.protocol != "https" {
            return Err(RedfishError::Config {
                path: path.to_owned(),
                message: format!("protocol `{}`: expected http or https", c.protocol),
            });
        }
        Ok(c)
    }

    /// The same configuration with another request timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> WebConfig {
        self.timeout = timeout;
        self
    }

    /// `protocol://host:port` of the BMC.
    pub fn bmc_url(&self, node_hostname: &str) -> String {
        let host = self.hostname.replace("{hostname}", node_hostname);
        // CEEMS leaves an empty host to Go, which dials the local machine.
        let host = if host.is_empty() { "localhost" } else { &host };
        match self.port {
            Some(p) => format!("{}://{host}:{p}", self.protocol),
            None => format!("{}://{host}", self.protocol),
        }
    }
}

/// A Redfish session: requests with the session token when one was granted, else with basic
/// auth when credentials exist, else bare. A 401 drops the token and logs in again once.
pub struct RedfishClient {
    agent: ureq::Agent,
    /// Where requests go: the proxy, or the BMC itself.
    endpoint: String,
    /// The BMC, sent in `X-Redfish-Url` when going through the proxy.
    via_proxy: Option<String>,
    username: Option<String>,
    password: Option<String>,
    use_session_token: bool,
    sessions_path: String,
    token: Option<(String, Option<String>)>,
    /// The BMC answered a login without a token: stop trying.
    no_sessions: bool,
}

impl RedfishClient {
    pub fn new(cfg: &WebConfig, node_hostname: &str) -> Result<RedfishClient, String> {
        let bmc = cfg.bmc_url(node_hostname);
        let agent = client::agent(Timeouts::all(cfg.timeout), cfg.insecure_skip_verify)
            .map_err(|e| format!("TLS set-up: {e}"))?;
        let (endpoint, via_proxy) = match &cfg.external_url {
            Some(url) if !url.is_empty() => (url.trim_end_matches('/').to_owned(), Some(bmc)),
            _ => (bmc, None),
        };
        Ok(RedfishClient {
            agent,
            endpoint,
            via_proxy,
            username: cfg.username.clone(),
            password: cfg.password.clone(),
            use_session_token: cfg.use_session_token,
            sessions_path: "/redfish/v1/SessionService/Sessions".to_owned(),
            token: None,
            no_sessions: false,
        })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn request(&self, method: &str, path: &str) -> ureq::Request {
        let mut req = self
            .agent
            .request(method, &format!("{}{path}", self.endpoint))
            .set("Accept", "application/json");
        if let Some(bmc) = &self.via_proxy {
            req = req.set(REDFISH_URL_HEADER, bmc);
        }
        req
    }

    fn authorised(&self, req: ureq::Request) -> ureq::Request {
        if let Some((token, _)) = &self.token {
            return req.set("X-Auth-Token", token);
        }
        match (&self.username, &self.password) {
            (Some(u), p) => {
                let raw = format!("{u}:{}", p.as_deref().unwrap_or(""));
                let enc = base64::engine::general_purpose::STANDARD.encode(raw);
                req.set("Authorization", &format!("Basic {enc}"))
            }
            _ => req,
        }
    }

    fn login(&mut self) {
        let body = serde_json::json!({
            "UserName": self.username.as_deref().unwrap_or(""),
            "Password": self.password.as_deref().unwrap_or(""),
        });
        let url = format!("{}{}", self.endpoint, self.sessions_path);
        match self
            .request("POST", &self.sessions_path)
            .set("Content-Type", "application/json")
            .send_string(&body.to_string())
        {
            Ok(resp) => match resp.header("X-Auth-Token") {
                Some(t) => {
                    tracing::debug!(collector = "redfish", %url, "Redfish session created");
                    self.token = Some((t.to_owned(), resp.header("Location").map(str::to_owned)));
                }
                None => {
                    let fallback = if self.username.is_some() {
                        "basic auth"
                    } else {
                        "no credentials"
                    };
                    tracing::info!(collector = "redfish", %url, fallback, "BMC granted no session token");
                    self.no_sessions = true;
                }
            },
            Err(e) => {
                tracing::warn!(collector = "redfish", %url, error = %e, "Redfish login failed; using basic auth");
                self.no_sessions = true;
            }
        }
    }

    /// GETs a Redfish document by its `@odata.id` path.
    pub fn get(&mut self, path: &str) -> Result<Value, RedfishError> {
        let url = format!("{}{path}", self.endpoint);
        // The service root is readable without credentials; it also says where to log in.
        let is_root = path.trim_end_matches('/') == "/redfish/v1";
        for attempt in 0..2 {
            if self.use_session_token && self.token.is_none() && !self.no_sessions && !is_root {
                self.login();
            }
            let err = match self.authorised(self.request("GET", path)).call() {
                Ok(resp) => {
                    let mut body = Vec::new();
                    std::io::Read::read_to_end(
                        &mut std::io::Read::take(resp.into_reader(), MAX_BODY),
                        &mut body,
                    )
                    .map_err(|e| RedfishError::Request {
                        url: url.clone(),
                        message: format!("reading body: {e}"),
                    })?;
                    return serde_json::from_slice(&body).map_err(|e| RedfishError::Request {
                        url,
                        message: format!("body is not JSON: {e}"),
                    });
                }
                Err(ureq::Error::Status(401, _)) if attempt == 0 && self.token.is_some() => {
                    tracing::debug!(
                        collector = "redfish",
                        "session token refused; logging in again"
                    );
                    self.token = None;
                    continue;
                }
                Err(ureq::Error::Status(code, resp)) => {
                    let mut text = String::new();
                    let _ = std::io::Read::read_to_string(
                        &mut std::io::Read::take(resp.into_reader(), 512),
                        &mut text,
                    );
                    format!("HTTP {code}: {}", text.trim())
                }
                Err(e) => e.to_string(),
            };
            return Err(RedfishError::Request { url, message: err });
        }
        Err(RedfishError::Request {
            url,
            message: "HTTP 401 after logging in again".into(),
        })
    }

    /// Uses the service root's Sessions link, when it has one, for logins.
    pub fn set_sessions_path(&mut self, path: &str) {
        self.sessions_path = path.to_owned();
    }

    fn logout(&mut self) {
        if let Some((token, Some(location))) = self.token.take() {
            let path = location
                .strip_prefix(&self.endpoint)
                .unwrap_or(&location)
                .to_owned();
            let _ = self
                .request("DELETE", &path)
                .set("X-Auth-Token", &token)
                .call();
        }
    }
}

impl Drop for RedfishClient {
    fn drop(&mut self) {
        self.logout();
    }
}

fn model_err(url: &str) -> impl FnOnce(model::ModelError) -> RedfishError + '_ {
    move |source| RedfishError::Model {
        url: url.to_owned(),
        source,
    }
}

/// Finds the chassis, following the service root.
pub fn discover(client: &mut RedfishClient) -> Result<Vec<ChassisLinks>, RedfishError> {
    let root_path = "/redfish/v1/";
    let root = client.get(root_path)?;
    let root = model::service_root(&root).map_err(model_err(root_path))?;
    if let Some(s) = &root.sessions {
        client.set_sessions_path(s);
    }
    let collection = client.get(&root.chassis)?;
    let members = model::chassis_collection(&collection).map_err(model_err(&root.chassis))?;
    let mut out = Vec::with_capacity(members.len());
    for m in members {
        let doc = client.get(&m)?;
        out.push(model::chassis(&doc).map_err(model_err(&m))?);
    }
    Ok(out)
}

/// One chassis's power: the legacy Power resource, else EnvironmentMetrics, else the sum of
/// the power supplies' input power.
pub fn chassis_power(
    client: &mut RedfishClient,
    c: &ChassisLinks,
) -> Result<ChassisPower, RedfishError> {
    if let Some(p) = &c.power {
        let doc = client.get(p)?;
        return model::power(&doc).map_err(model_err(p));
    }
    if let Some(e) = &c.environment_metrics {
        let doc = client.get(e)?;
        let w = model::environment_power(&doc).map_err(model_err(e))?;
        return Ok(ChassisPower {
            current: w,
            ..Default::default()
        });
    }
    if let Some(s) = &c.power_subsystem {
        let doc = client.get(s)?;
        let supplies = model::power_supplies(&doc).map_err(model_err(s))?;
        let list = client.get(&supplies)?;
        let mut total = 0.0;
        for supply in model::collection(&list).map_err(model_err(&supplies))? {
            let doc = client.get(&supply)?;
            if let Some(metrics) = model::supply_metrics(&doc) {
                let m = client.get(&metrics)?;
                total += model::supply_input_power(&m).map_err(model_err(&metrics))?;
            }
        }
        return Ok(ChassisPower {
            current: total,
            ..Default::default()
        });
    }
    Err(RedfishError::Model {
        url: c.id.clone(),
        source: model::ModelError(
            "chassis links neither Power, EnvironmentMetrics nor PowerSubsystem".into(),
        ),
    })
}

struct State {
    client: RedfishClient,
    chassis: Option<Vec<ChassisLinks>>,
    /// Last good reading per chassis, served when the BMC fails.
    cache: HashMap<String, ChassisPower>,
}

pub struct RedfishCollector {
    hostname: String,
    state: Mutex<State>,
    /// Which generation's family names to export.
    pub names: MetricNames,
}

/// The families of the current, minimum, maximum and average power, and (both generations)
/// their help.
const POWER_NAMES: [(&str, &str, &str); 4] = [
    (
        "ceems_redfish_power_current_watts",
        "ceems_redfish_current_watts",
        "Current Power consumption in watts",
    ),
    (
        "ceems_redfish_power_min_watts",
        "ceems_redfish_min_watts",
        "Minimum Power consumption in watts",
    ),
    (
        "ceems_redfish_power_max_watts",
        "ceems_redfish_max_watts",
        "Maximum Power consumption in watts",
    ),
    (
        "ceems_redfish_power_avg_watts",
        "ceems_redfish_avg_watts",
        "Average Power consumption in watts",
    ),
];

fn build(ctx: &Context) -> Result<Box<dyn Collector>, CollectError> {
    let s: Settings = ctx.settings()?;
    let path = s.config_file.ok_or_else(|| {
        CollectError::Other(
            "the redfish collector needs --collector.redfish.config.file (BMC address and credentials)".into(),
        )
    })?;
    let mut cfg = WebConfig::load_with(&path, s.expand_env_vars)
        .map_err(|e| CollectError::Other(e.to_string()))?;
    if cfg.hostname.is_empty() {
        cfg.hostname = bmc_address_from_ipmi().unwrap_or_default();
    }
    let node = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut collector =
        RedfishCollector::new(&cfg, &node, &ctx.hostname).map_err(CollectError::Other)?;
    collector.names = ctx.names;
    Ok(Box::new(collector))
}

/// `${NAME}` and `$NAME` replaced by `lookup(NAME)`, or nothing when it has none, as Go's
/// `os.ExpandEnv` does for CEEMS.
fn expand_env_vars(text: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    static VAR: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let var = VAR.get_or_init(|| {
        regex::Regex::new(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
            .expect("a valid pattern")
    });
    var.replace_all(text, |c: &regex::Captures| {
        let name = c.get(1).or_else(|| c.get(2)).map_or("", |m| m.as_str());
        lookup(name).unwrap_or_default()
    })
    .into_owned()
}

/// The BMC's LAN address as the BMC itself reports it through OpenIPMI, for configurations
/// that name no host (CEEMS does the same). None without a device or an answer.
fn bmc_address_from_ipmi() -> Option<String> {
    use crate::collect::ipmi::{native, DEVICES};
    let device = DEVICES.iter().map(Path::new).find(|p| p.exists())?;
    let mut dev = crate::security::privileged(crate::collect::ipmi::SPEC.capabilities, move || {
        native::OpenIpmiDevice::open(device)
    })
    .ok()?;
    match native::read_lan_ip(&mut dev, 1, 1, Duration::from_secs(1)) {
        Ok(ip) if !ip.is_unspecified() => {
            tracing::info!(collector = "redfish", %ip, "BMC address from IPMI LAN configuration");
            Some(ip.to_string())
        }
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(collector = "redfish", error = %e, "cannot read the BMC address over IPMI; using localhost");
            None
        }
    }
}

impl RedfishCollector {
    /// `node` fills `{hostname}` in the BMC address; `hostname` is the label.
    pub fn new(cfg: &WebConfig, node: &str, hostname: &str) -> Result<RedfishCollector, String> {
        let client = RedfishClient::new(cfg, node)?;
        tracing::info!(
            collector = "redfish",
            endpoint = client.endpoint(),
            via_proxy = cfg.external_url.is_some(),
            "reading chassis power from Redfish"
        );
        Ok(RedfishCollector {
            hostname: hostname.to_owned(),
            state: Mutex::new(State {
                client,
                chassis: None,
                cache: HashMap::new(),
            }),
            names: MetricNames::default(),
        })
    }

    fn emit(&self, out: &mut MetricSet, id: &str, p: &ChassisPower) {
        let labels = Labels::new(&[("chassis", id), ("hostname", &self.hostname)]);
        let values = [p.current, p.min, p.max, p.avg];
        for ((now, old, help), v) in POWER_NAMES.into_iter().zip(values) {
            // 0 means "not measured" in Redfish documents, as CEEMS reads them.
            if v > 0.0 {
                out.gauge(self.names.pick(now, old), help, labels.clone(), v);
            }
        }
    }
}

impl Collector for RedfishCollector {
    fn collect(&self, out: &mut MetricSet) -> Result<(), CollectError> {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let state = &mut *guard;
        let chassis = match &state.chassis {
            Some(c) => c.clone(),
            None => match discover(&mut state.client) {
                Ok(c) => {
                    state.chassis = Some(c.clone());
                    c
                }
                Err(e) => {
                    if state.cache.is_empty() {
                        return Err(CollectError::Other(e.to_string()));
                    }
                    for (id, p) in &state.cache {
                        self.emit(out, id, p);
                    }
                    return Err(CollectError::Stale(e.to_string()));
                }
            },
        };
        let mut failure = None;
        for c in &chassis {
            let id = model::sanitize_id(&c.id);
            match chassis_power(&mut state.client, c) {
                Ok(p) => {
                    self.emit(out, &id, &p);
                    state.cache.insert(id, p);
                }
                Err(e) => {
                    if let Some(p) = state.cache.get(&id) {
                        self.emit(out, &id, p);
                    }
                    failure.get_or_insert(e);
                }
            }
        }
        match failure {
            None => Ok(()),
            Some(e) => {
                // The chassis may have changed (BMC reset, firmware update): look again next time.
                state.chassis = None;
                Err(CollectError::Stale(e.to_string()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_file_spellings_and_placeholders() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("redfish.yml");
        std::fs::write(
            &p,
            "redfish_web_config:\n  protocol: http\n  host: bmc-{hostname}\n  port: 5000\n  use_session_token: true\n  timeout: 2s\n",
        )
        .unwrap();
        let c = WebConfig::load(&p).unwrap();
        assert_eq!(c.bmc_url("node7"), "http://bmc-node7:5000");
        assert_eq!(c.timeout, Duration::from_secs(2));
        assert!(c.use_session_token);

        std::fs::write(&p, "redfish_web_config:\n  protocol: ftp\n").unwrap();
        assert!(WebConfig::load(&p).unwrap_err().to_string().contains("ftp"));
        std::fs::write(&p, "redfish_web_config:\n  hostnmae: x\n").unwrap();
        let err = WebConfig::load(&p).unwrap_err().to_string();
        assert!(err.contains("hostnmae"), "{err}");
        std::fs::write(&p, "redfish_web_config:\n  protocol: https\n").unwrap();
        assert_eq!(
            WebConfig::load(&p).unwrap().bmc_url("n"),
            "https://localhost"
        );
    }
}
