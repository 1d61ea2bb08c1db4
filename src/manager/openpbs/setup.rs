//! An OpenPBS complex's entry of the stats-server: its server's accounting log, `qstat`
//! where it is installed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::accounting::PbsAccounting;
use crate::manager::registry::{name_values, AccountingSpec, ClusterEntry, SetupError};
use crate::manager::Accounting;

pub const ACCOUNTING: AccountingSpec = AccountingSpec {
    manager: super::MANAGER,
    example: r#"{ id = "pbs", manager = "openpbs", openpbs-accounting-dir = "/var/spool/pbs/server_priv/accounting" }"#,
    build,
};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct PbsCluster {
    /// The server's accounting log directory (None: `PBS_HOME/server_priv/accounting` from
    /// /etc/pbs.conf).
    #[serde(default)]
    openpbs_accounting_dir: Option<PathBuf>,
    /// The directory of `qstat` (None: `PBS_EXEC/bin` from /etc/pbs.conf, else PATH).
    #[serde(default)]
    openpbs_bin_dir: Option<PathBuf>,
    /// `NAME=value` variables its commands need (`PBS_CONF_FILE=/etc/pbs.conf`).
    #[serde(default)]
    openpbs_env: Vec<String>,
}

/// How long a `qstat` may take.
const TIMEOUT: Duration = Duration::from_secs(120);
/// Where PBS says where it is installed.
const PBS_CONF: &str = "/etc/pbs.conf";

/// The accounting log directory of an OpenPBS entry (its own, else /etc/pbs.conf's), for
/// check-privileges; None for another manager's entry or where none is known.
pub fn accounting_dir(entry: &ClusterEntry<'_>) -> Result<Option<PathBuf>, SetupError> {
    let c: PbsCluster = entry.parse(super::MANAGER)?;
    let (conf_dir, _) = PbsAccounting::from_pbs_conf(Path::new(PBS_CONF));
    Ok(c.openpbs_accounting_dir.or(conf_dir))
}

fn build(entry: &ClusterEntry<'_>) -> Result<Arc<dyn Accounting>, SetupError> {
    let c: PbsCluster = entry.parse(super::MANAGER)?;
    let (conf_dir, conf_bin) = PbsAccounting::from_pbs_conf(Path::new(PBS_CONF));
    let dir = c.openpbs_accounting_dir.or(conf_dir);
    let bin_dir = c.openpbs_bin_dir.or(conf_bin).or_else(|| {
        crate::host::command::find_program("qstat", std::env::var_os("PATH").as_deref())
            .and_then(|p| p.parent().map(Path::to_owned))
    });
    if let Some(d) = dir.as_ref().filter(|d| !d.is_dir()) {
        return Err(entry.error(format!(
            "PBS's accounting directory {} is not there; set openpbs-accounting-dir",
            d.display()
        )));
    }
    if dir.is_none() && bin_dir.is_none() {
        return Err(entry.error(
            "neither PBS's accounting log nor qstat was found; set openpbs-accounting-dir or openpbs-bin-dir",
        ));
    }
    let env =
        name_values(&c.openpbs_env).map_err(|bad| entry.error(format!("openpbs-env: {bad}")))?;
    tracing::info!(
        cluster = %entry.id,
        accounting_dir = ?dir,
        qstat_dir = ?bin_dir,
        "OpenPBS jobs from the server's accounting log{}",
        if dir.is_none() { " (absent: from qstat -x)" } else { "" }
    );
    Ok(Arc::new(PbsAccounting::new(dir, bin_dir, env, TIMEOUT)))
}
