//! Each resource manager's accounting for the stats-server's side, built from a cluster's
//! settings.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

use super::settings::{clusters, ClusterSettings, SlurmSettings};
use crate::config::Layered;
use crate::manager::k8s::accounting::{self as k8s_accounting, K8sAccounting};
use crate::manager::k8s::api::{self as k8s_api, KubeClient};
use crate::manager::k8s::pod::PodPolicy;
use crate::manager::lsf::accounting::LsfAccounting;
use crate::manager::openpbs::accounting::PbsAccounting;

/// An LSF cluster's accounting: its commands' directory, configured or found on PATH.
pub(super) fn lsf_accounting(c: &ClusterSettings) -> anyhow::Result<LsfAccounting> {
    let bin_dir = match &c.lsf_bin_dir {
        Some(dir) => dir.clone(),
        None => LsfAccounting::find_bin_dir().with_context(|| {
            format!(
                "clusters: `{}`: no bacct on PATH; set lsf-bin-dir to LSF's bin directory",
                c.id
            )
        })?,
    };
    let env = c
        .lsf_env
        .iter()
        .filter_map(|v| v.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    tracing::info!(cluster = %c.id, bin_dir = %bin_dir.display(), "LSF jobs from bacct and bjobs");
    Ok(LsfAccounting::new(&bin_dir, env, LSF_TIMEOUT))
}

/// The accounting log directories of the configured OpenPBS complexes, for check-privileges.
pub fn openpbs_accounting_dirs(settings: &Layered) -> anyhow::Result<Vec<PathBuf>> {
    let slurm: SlurmSettings = settings.get("slurm")?;
    let (conf_dir, _) = PbsAccounting::from_pbs_conf(std::path::Path::new(PBS_CONF));
    Ok(clusters(settings, &slurm)?
        .into_iter()
        .filter(|c| c.manager == crate::manager::openpbs::MANAGER)
        .filter_map(|c| c.openpbs_accounting_dir.or_else(|| conf_dir.clone()))
        .collect())
}

/// An OpenPBS complex's accounting: its server's log, qstat where it is installed.
pub(super) fn openpbs_accounting(c: &ClusterSettings) -> anyhow::Result<PbsAccounting> {
    let (conf_dir, conf_bin) = PbsAccounting::from_pbs_conf(std::path::Path::new(PBS_CONF));
    let dir = c.openpbs_accounting_dir.clone().or(conf_dir);
    let bin_dir = c.openpbs_bin_dir.clone().or(conf_bin).or_else(|| {
        crate::host::command::find_program("qstat", std::env::var_os("PATH").as_deref())
            .and_then(|p| p.parent().map(std::path::Path::to_owned))
    });
    if let Some(d) = &dir {
        anyhow::ensure!(
            d.is_dir(),
            "clusters: `{}`: PBS's accounting directory {} is not there; set openpbs-accounting-dir",
            c.id,
            d.display()
        );
    }
    anyhow::ensure!(
        dir.is_some() || bin_dir.is_some(),
        "clusters: `{}`: neither PBS's accounting log nor qstat was found; set openpbs-accounting-dir or openpbs-bin-dir",
        c.id
    );
    let env = c
        .openpbs_env
        .iter()
        .filter_map(|v| v.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    tracing::info!(
        cluster = %c.id,
        accounting_dir = ?dir,
        qstat_dir = ?bin_dir,
        "OpenPBS jobs from the server's accounting log{}",
        if dir.is_none() { " (absent: from qstat -x)" } else { "" }
    );
    Ok(PbsAccounting::new(dir, bin_dir, env, PBS_TIMEOUT))
}

/// A Kubernetes cluster's accounting: its pods followed from the API server.
pub(super) fn k8s_accounting(c: &ClusterSettings) -> anyhow::Result<K8sAccounting> {
    let client = |timeout: Duration| match &c.kubeconfig {
        Some(path) => KubeClient::from_kubeconfig(path, timeout),
        None => KubeClient::in_cluster(std::path::Path::new(k8s_api::SERVICE_ACCOUNT_DIR), timeout),
    };
    let lists = client(Duration::from_secs(60))
        .with_context(|| format!("clusters: `{}`: the Kubernetes API server", c.id))?;
    // A watch is held open by the server for WATCH_SECONDS.
    let watches = client(Duration::from_secs(k8s_accounting::WATCH_SECONDS + 30))
        .with_context(|| format!("clusters: `{}`: the Kubernetes API server", c.id))?;
    let defaults = PodPolicy::default();
    let policy = PodPolicy {
        user_annotations: c
            .k8s_user_annotations
            .clone()
            .unwrap_or(defaults.user_annotations),
        project_annotations: c
            .k8s_project_annotations
            .clone()
            .unwrap_or(defaults.project_annotations),
        gpu_resources: c
            .k8s_gpu_resources
            .clone()
            .unwrap_or(defaults.gpu_resources),
    };
    tracing::info!(cluster = %c.id, kubeconfig = ?c.kubeconfig, "pods followed from the Kubernetes API server");
    Ok(K8sAccounting::start(lists, watches, policy, &c.id)
        .with_ns_users_file(c.k8s_ns_users_file.clone()))
}

/// Longest a `bacct` or `bjobs` may take.
const LSF_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a `qstat` may take.
const PBS_TIMEOUT: Duration = Duration::from_secs(120);
/// Where PBS says where it is installed.
const PBS_CONF: &str = "/etc/pbs.conf";
