//! An LSF cluster's entry of the stats-server: where its commands are, and their environment.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::accounting::LsfAccounting;
use crate::manager::registry::{name_values, AccountingSpec, ClusterEntry, SetupError};
use crate::manager::Accounting;

pub const ACCOUNTING: AccountingSpec = AccountingSpec {
    manager: super::MANAGER,
    example: r#"{ id = "lsf", manager = "lsf", lsf-bin-dir = "/opt/lsf/bin", lsf-env = ["LSF_ENVDIR=/opt/lsf/conf"] }"#,
    build,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct LsfCluster {
    /// The directory of `bacct` and `bjobs` (None: found on PATH).
    #[serde(default)]
    lsf_bin_dir: Option<PathBuf>,
    /// `NAME=value` variables its commands need (`LSF_ENVDIR=/opt/lsf/conf`).
    #[serde(default)]
    lsf_env: Vec<String>,
    /// Projects' members from the jobs of each pull, as CEEMS's (only where LSF enforces
    /// projects: `bsub -P` otherwise takes any name).
    #[serde(default)]
    lsf_projects_from_jobs: bool,
}

/// Longest a `bacct` or `bjobs` may take.
const TIMEOUT: Duration = Duration::from_secs(300);

fn build(entry: &ClusterEntry<'_>) -> Result<Arc<dyn Accounting>, SetupError> {
    let c: LsfCluster = entry.parse(super::MANAGER)?;
    let bin_dir = match c.lsf_bin_dir {
        Some(dir) => dir,
        None => LsfAccounting::find_bin_dir().ok_or_else(|| {
            entry.error("no bacct on PATH; set lsf-bin-dir to LSF's bin directory")
        })?,
    };
    let env = name_values(&c.lsf_env).map_err(|bad| entry.error(format!("lsf-env: {bad}")))?;
    tracing::info!(cluster = %entry.id, bin_dir = %bin_dir.display(), projects_from_jobs = c.lsf_projects_from_jobs, "LSF jobs from bacct and bjobs");
    Ok(Arc::new(
        LsfAccounting::new(&bin_dir, env, TIMEOUT)
            .with_projects_from_jobs(c.lsf_projects_from_jobs),
    ))
}
