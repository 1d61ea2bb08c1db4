//! `emissions`: the carbon intensity of electricity (gCO2eq/kWh) that turns energy into
//! emissions, from a static table shipped in the binary (`owid`), a world average (`global`),
//! or real-time services (`rte`, `emaps`, `wt`). Meant for one node with internet access.

pub mod remote;
pub mod tables;

use std::time::Duration;

use serde::Deserialize;

use super::{CollectError, Collector, CollectorSpec, Context};
use crate::config::{Kind, Opt};
use crate::metrics::{Labels, MetricSet};
use crate::web::client::{self, Timeouts};
use remote::{ElectricityMaps, Refresher, RemoteProvider, Rte, WattTime};

pub const SPEC: CollectorSpec = CollectorSpec {
    name: "emissions",
    default_enabled: false,
    capabilities: &[],
    options,
    build,
    self_test: None,
    sub_collectors: &[],
};

pub const PROVIDERS: &[&str] = &["owid", "global", "rte", "emaps", "wt"];

fn options() -> Vec<Opt> {
    vec![
        Opt::new(
            "collector.emissions.provider",
            Kind::List,
            "Emission factor provider (repeatable): owid (static table), global (world average), rte (France, real time), emaps (Electricity Maps, EMAPS_API_TOKEN), wt (WattTime, WT_USERNAME/WT_PASSWORD/WT_REGION)",
        )
        .default("owid")
        .possible(PROVIDERS),
        Opt::new(
            "collector.emissions.country-code",
            Kind::Str,
            "ISO 3166-1 alpha-2 code of the country whose factor is exported (owid: every country when unset; emaps: the zone asked for)",
        ),
        Opt::new(
            "collector.emissions.update-interval",
            Kind::Duration,
            "How often real-time providers are asked, in the background",
        )
        .default("30m"),
        Opt::new(
            "collector.emissions.request-timeout",
            Kind::Duration,
            "Longest a provider may take to answer",
        )
        .default("30s")
        .hidden(),
        Opt::new("collector.emissions.rte-url", Kind::Str, "eCO2mix API URL")
            .default(remote::RTE_URL)
            .hidden(),
        Opt::new(
            "collector.emissions.emaps-url",
            Kind::Str,
            "Electricity Maps API URL",
        )
        .default(remote::EMAPS_URL)
        .hidden(),
        Opt::new("collector.emissions.wt-url", Kind::Str, "WattTime API URL")
            .default(remote::WATTTIME_URL)
            .hidden(),
    ]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Settings {
    provider: Vec<String>,
    #[serde(default)]
    country_code: Option<String>,
    #[serde(deserialize_with = "crate::config::de_duration")]
    update_interval: Duration,
    #[serde(deserialize_with = "crate::config::de_duration")]
    request_timeout: Duration,
    rte_url: String,
    emaps_url: String,
    wt_url: String,
}

/// One emission factor.
#[derive(Debug, Clone, PartialEq)]
pub struct Factor {
    pub country_code: String,
    pub country: String,
    pub g_per_kwh: f64,
}

/// Credentials of the remote providers, from the environment (CEEMS's variable names).
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    pub emaps_token: Option<String>,
    pub wt_username: Option<String>,
    pub wt_password: Option<String>,
    pub wt_region: Option<String>,
}

impl Credentials {
    pub fn from_env() -> Credentials {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Credentials {
            emaps_token: var("EMAPS_API_TOKEN"),
            wt_username: var("WT_USERNAME"),
            wt_password: var("WT_PASSWORD"),
            wt_region: var("WT_REGION"),
        }
    }
}

/// What the collector is built from.
#[derive(Debug, Clone)]
pub struct EmissionsConfig {
    pub providers: Vec<String>,
    pub country_code: Option<String>,
    pub update_interval: Duration,
    pub request_timeout: Duration,
    pub rte_url: String,
    pub emaps_url: String,
    pub wt_url: String,
    pub credentials: Credentials,
}

struct StaticFactors {
    id: &'static str,
    name: &'static str,
    factors: Vec<Factor>,
}

pub struct EmissionsCollector {
    fixed: Vec<StaticFactors>,
    refreshers: Vec<Refresher>,
}

fn build(ctx: &Context) -> Result<Box<dyn Collector>, CollectError> {
    let s: Settings = ctx.settings()?;
    let cfg = EmissionsConfig {
        providers: s.provider,
        country_code: s.country_code,
        update_interval: s.update_interval,
        request_timeout: s.request_timeout,
        rte_url: s.rte_url,
        emaps_url: s.emaps_url,
        wt_url: s.wt_url,
        credentials: Credentials::from_env(),
    };
    EmissionsCollector::new(&cfg)
        .map(|c| Box::new(c) as Box<dyn Collector>)
        .map_err(CollectError::Other)
}

impl EmissionsCollector {
    /// Starts the background refresh of every remote provider. A provider without its
    /// credentials is skipped with one warning; an unknown country code is an error.
    pub fn new(cfg: &EmissionsConfig) -> Result<EmissionsCollector, String> {
        let tables = tables::shipped().map_err(|e| format!("shipped emission tables: {e}"))?;
        let country = match &cfg.country_code {
            Some(code) => {
                let code = code.trim().to_ascii_uppercase();
                let c = tables
                    .countries
                    .iter()
                    .find(|c| c.alpha_2 == code)
                    .ok_or_else(|| {
                        format!("--collector.emissions.country-code `{code}` is not an ISO 3166-1 alpha-2 code")
                    })?;
                Some((code, c.name.clone()))
            }
            None => None,
        };
        let agent = client::agent(Timeouts::all(cfg.request_timeout), false)
            .map_err(|e| format!("TLS set-up: {e}"))?;
        let mut fixed = Vec::new();
        let mut refreshers = Vec::new();
        let mut remotes: Vec<Box<dyn RemoteProvider>> = Vec::new();
        let mut seen = Vec::new();
        for p in &cfg.providers {
            if seen.contains(p) {
                continue;
            }
            seen.push(p.clone());
            match p.as_str() {
                "owid" => {
                    let mut factors: Vec<Factor> = tables
                        .owid
                        .iter()
                        .filter(|(code, _)| country.as_ref().is_none_or(|(want, _)| *code == want))
                        .map(|(code, (name, v))| Factor {
                            country_code: code.clone(),
                            country: name.clone(),
                            g_per_kwh: *v,
                        })
                        .collect();
                    factors.sort_by(|a, b| a.country_code.cmp(&b.country_code));
                    if factors.is_empty() {
                        tracing::warn!(provider = "owid", country = ?cfg.country_code, "the OWID table has no value for this country");
                    }
                    fixed.push(StaticFactors {
                        id: "owid",
                        name: "OWID",
                        factors,
                    });
                }
                "global" => fixed.push(StaticFactors {
                    id: "global",
                    name: "World Average",
                    factors: vec![Factor {
                        // CEEMS's code for the world, which its dashboards expect.
                        country_code: "ZZ".into(),
                        country: "World".into(),
                        g_per_kwh: tables.world,
                    }],
                }),
                "rte" => remotes.push(Box::new(Rte {
                    url: cfg.rte_url.clone(),
                })),
                "emaps" => match (&cfg.credentials.emaps_token, &country) {
                    (Some(token), Some((zone, name))) => remotes.push(Box::new(ElectricityMaps {
                        url: cfg.emaps_url.clone(),
                        token: token.clone(),
                        zone: zone.clone(),
                        zone_name: name.clone(),
                    })),
                    (None, _) => tracing::warn!(
                        provider = "emaps",
                        "EMAPS_API_TOKEN is not set; Electricity Maps is skipped"
                    ),
                    (_, None) => tracing::warn!(
                        provider = "emaps",
                        "no --collector.emissions.country-code; Electricity Maps is skipped"
                    ),
                },
                "wt" => {
                    let c = &cfg.credentials;
                    match (&c.wt_username, &c.wt_password, &c.wt_region) {
                        (Some(u), Some(pw), Some(r)) => remotes.push(Box::new(WattTime::new(
                            cfg.wt_url.clone(),
                            u.clone(),
                            pw.clone(),
                            r.clone(),
                        ))),
                        _ => tracing::warn!(
                            provider = "wt",
                            "WT_USERNAME, WT_PASSWORD and WT_REGION must all be set; WattTime is skipped"
                        ),
                    }
                }
                other => return Err(format!("unknown emissions provider `{other}`")),
            }
        }
        for r in remotes {
            let id = r.id();
            refreshers.push(
                Refresher::spawn(r, agent.clone(), cfg.update_interval)
                    .map_err(|e| format!("cannot start the {id} refresh thread: {e}"))?,
            );
        }
        Ok(EmissionsCollector { fixed, refreshers })
    }
}

impl Collector for EmissionsCollector {
    fn collect(&self, out: &mut MetricSet) -> Result<(), CollectError> {
        let fixed = self.fixed.iter().map(|f| (f.id, f.name, f.factors.clone()));
        let live = self.refreshers.iter().map(|r| (r.id, r.name, r.latest()));
        for (id, name, factors) in fixed.chain(live) {
            for f in factors {
                out.gauge(
                    "ceems_emissions_gCo2_kWh",
                    "Current emission factor in CO2eq grams per kWh",
                    Labels::new(&[
                        ("country", &f.country),
                        ("country_code", &f.country_code),
                        ("provider", id),
                        ("provider_name", name),
                    ]),
                    f.g_per_kwh,
                );
            }
        }
        Ok(())
    }
}
