//! A Slurm cluster's entry of the stats-server: `sacct` and `sacctmgr` (or slurmrestd), with
//! `--slurm.*` for what the entry does not say.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::accounting::SlurmAccounting;
use super::rest::{self, RestAccounting};
use super::runner::{self, RunMode, SlurmCommand};
use crate::config::{self, Layered};
use crate::manager::registry::{name_values, AccountingSpec, ClusterEntry, SetupError};
use crate::manager::Accounting;

pub const ACCOUNTING: AccountingSpec = AccountingSpec {
    manager: super::MANAGER,
    example: r#"{ id = "hpc", manager = "slurm", sacct-path = "/usr/bin/sacct" }"#,
    build,
};

/// A Slurm entry's own keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct SlurmCluster {
    #[serde(default)]
    sacct_path: Option<PathBuf>,
    /// `NAME=value` variables its commands run with (`SLURM_CONF=/etc/slurm/b.conf`; CEEMS's
    /// `cli.environment_variables`).
    #[serde(default)]
    slurm_env: Vec<String>,
    #[serde(default)]
    sacctmgr_path: Option<String>,
    /// The stats-server's policies end jobs with it; default: `scancel` beside sacct.
    #[serde(default)]
    scancel_path: Option<PathBuf>,
    #[serde(default)]
    slurm_cluster_name: Option<String>,
    /// This cluster's slurmrestd, with `--slurm.source=slurmrestd`.
    #[serde(default, deserialize_with = "de_endpoint")]
    slurmrestd_url: Option<rest::Endpoint>,
}

fn de_endpoint<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<rest::Endpoint>, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map(Some).map_err(serde::de::Error::custom)
}

/// `--slurm.*`: every Slurm cluster's defaults.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct SlurmSettings {
    pub source: String,
    pub slurmrestd: SlurmrestdSettings,
    pub sacct: SacctSettings,
    pub sacctmgr: PathSetting,
    pub cluster_id: String,
    pub run_as_user: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct SlurmrestdSettings {
    pub url: String,
    pub api_version: String,
    pub token_file: String,
    pub user: String,
    #[serde(deserialize_with = "config::de_duration")]
    pub timeout: Duration,
}

#[derive(Debug, Deserialize)]
pub struct SacctSettings {
    pub path: PathBuf,
    #[serde(deserialize_with = "config::de_duration")]
    pub timeout: Duration,
}

#[derive(Debug, Deserialize)]
pub struct PathSetting {
    pub path: String,
}

impl SlurmSettings {
    /// slurmrestd's client when it is the source, checked; None for sacct.
    pub fn rest(&self) -> Result<Option<RestAccounting>, String> {
        match self.source.as_str() {
            "sacct" => return Ok(None),
            "slurmrestd" => {}
            other => return Err(format!("--slurm.source `{other}`: sacct or slurmrestd")),
        }
        let r = &self.slurmrestd;
        if r.url.is_empty() {
            return Err("--slurm.source=slurmrestd needs --slurm.slurmrestd.url".into());
        }
        let endpoint = r
            .url
            .parse()
            .map_err(|e| format!("--slurm.slurmrestd.url {e}"))?;
        if let Some((v, why)) = rest::REFUSED_VERSIONS
            .iter()
            .find(|(v, _)| *v == r.api_version)
        {
            return Err(format!(
                "--slurm.slurmrestd.api-version {v} is not read: {why}; use v0.0.38"
            ));
        }
        if !rest::VERSIONS.contains(&r.api_version.as_str()) {
            return Err(format!(
                "--slurm.slurmrestd.api-version `{}`: one of {}",
                r.api_version,
                rest::VERSIONS.join(", ")
            ));
        }
        let jwt = match (r.token_file.is_empty(), r.user.is_empty()) {
            (true, true) => None,
            (false, false) => Some(rest::Jwt {
                user: r.user.clone(),
                token_file: PathBuf::from(&r.token_file),
            }),
            _ => {
                return Err(
                    "--slurm.slurmrestd.token-file and --slurm.slurmrestd.user go together".into(),
                )
            }
        };
        Ok(Some(RestAccounting {
            endpoint,
            version: r.api_version.clone(),
            jwt,
            slurm_name: None,
            timeout: r.timeout,
        }))
    }
}

/// Whether the stats-server keeps CAP_SETUID/CAP_SETGID: to run Slurm commands as a user.
pub fn needed_capabilities(
    settings: &Layered,
) -> Result<Vec<caps::Capability>, config::ConfigError> {
    let user: String = settings.get("slurm.run-as-user")?;
    let source: String = settings.get("slurm.source")?;
    // slurmrestd does the switching itself: no command runs here.
    Ok(if user.is_empty() || source == "slurmrestd" {
        Vec::new()
    } else {
        runner::CAPABILITIES.to_vec()
    })
}

/// Decides how Slurm commands run, and logs the choice and why. A user named on purpose
/// (`explicit`) that this host does not have is refused; the default one missing is a
/// warning, since sacct then shows only this process's user's jobs.
pub fn run_mode(
    run_as_user: &str,
    explicit: bool,
    probe: &std::path::Path,
) -> Result<RunMode, String> {
    if run_as_user.is_empty() {
        tracing::info!("Slurm commands run as this process's user (--slurm.run-as-user is empty)");
        return Ok(RunMode::Native);
    }
    let facts = runner::Facts::of_process(run_as_user);
    if facts.slurm_user.is_none() {
        let problem = format!("--slurm.run-as-user: no user `{run_as_user}` on this host");
        if explicit {
            return Err(format!(
                "{problem}; name the user Slurm's commands run as (SlurmUser), or set it empty to run them as this process's user"
            ));
        }
        tracing::warn!("{problem}: sacct may list only this process's user's jobs");
    }
    let (mode, why) = runner::choose(&facts, |sudo| runner::sudo_allows(sudo, probe));
    tracing::info!(mode = %mode, reasons = %why.join("; "), "how sacct and sacctmgr run");
    Ok(mode)
}

fn build(entry: &ClusterEntry<'_>) -> Result<Arc<dyn Accounting>, SetupError> {
    let c: SlurmCluster = entry.parse(super::MANAGER)?;
    let slurm: SlurmSettings = entry
        .settings
        .get("slurm")
        .map_err(|e| entry.error(e.to_string()))?;
    let env = name_values(&c.slurm_env).map_err(|bad| entry.error(format!("slurm-env: {bad}")))?;
    if let Some(rest) = slurm.rest().map_err(|e| entry.error(e))? {
        return Ok(Arc::new(RestAccounting {
            endpoint: c.slurmrestd_url.unwrap_or(rest.endpoint),
            slurm_name: c.slurm_cluster_name,
            ..rest
        }));
    }
    let sacct = c.sacct_path.unwrap_or_else(|| slurm.sacct.path.clone());
    let scancel = c
        .scancel_path
        .unwrap_or_else(|| sacct.with_file_name("scancel"));
    let explicit = entry.settings.explicit("slurm.run-as-user");
    let mode = run_mode(&slurm.run_as_user, explicit, &sacct).map_err(|e| entry.error(e))?;
    let command = |path: PathBuf| SlurmCommand {
        path,
        mode: mode.clone(),
        timeout: slurm.sacct.timeout,
        env: env.clone(),
    };
    let sacctmgr = c.sacctmgr_path.unwrap_or(slurm.sacctmgr.path);
    // sacct's times without an offset are in the zone CEEMS reads them in (`data.time_zone`).
    let time_zone = match entry
        .settings
        .get::<String>("storage.data.time-zone")
        .unwrap_or_default()
        .as_str()
    {
        "" => jiff::tz::TimeZone::system(),
        name => jiff::tz::TimeZone::get(name)
            .map_err(|e| entry.error(format!("--storage.data.time-zone `{name}`: {e}")))?,
    };
    Ok(Arc::new(SlurmAccounting {
        sacct: command(sacct),
        sacctmgr: (!sacctmgr.is_empty()).then(|| command(PathBuf::from(sacctmgr))),
        scancel: command(scancel),
        slurm_name: c.slurm_cluster_name,
        time_zone,
    }))
}
