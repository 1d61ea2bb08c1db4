//! A Kubernetes cluster's entry of the stats-server: its API server, and how a pod names its
//! user, its project and its GPUs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::accounting::{K8sAccounting, WATCH_SECONDS};
use super::api::{KubeClient, SERVICE_ACCOUNT_DIR};
use super::pod::PodPolicy;
use crate::manager::registry::{AccountingSpec, ClusterEntry, SetupError};
use crate::manager::Accounting;

pub const ACCOUNTING: AccountingSpec = AccountingSpec {
    manager: super::MANAGER,
    example: r#"{ id = "k8s", manager = "k8s", kubeconfig = "/etc/ceems/kubeconfig" }"#,
    build,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct K8sCluster {
    /// The API server's kubeconfig (None: the in-cluster service account).
    #[serde(default)]
    kubeconfig: Option<PathBuf>,
    /// Annotations naming a pod's user (default `ceems.io/created-by`).
    #[serde(default)]
    k8s_user_annotations: Option<Vec<String>>,
    /// Annotations naming a pod's project (default: none, the namespace).
    #[serde(default)]
    k8s_project_annotations: Option<Vec<String>>,
    /// Extended resources that are GPUs (default `nvidia.com/gpu`, `amd.com/gpu`).
    #[serde(default)]
    k8s_gpu_resources: Option<Vec<String>>,
    /// CEEMS's `ns_users_list_file` (`users: {namespace: [user]}`), read at each pull; absent,
    /// none.
    #[serde(default)]
    k8s_ns_users_file: Option<PathBuf>,
}

fn build(entry: &ClusterEntry<'_>) -> Result<Arc<dyn Accounting>, SetupError> {
    let c: K8sCluster = entry.parse(super::MANAGER)?;
    let client = |timeout: Duration| {
        match &c.kubeconfig {
            Some(path) => KubeClient::from_kubeconfig(path, timeout),
            None => KubeClient::in_cluster(Path::new(SERVICE_ACCOUNT_DIR), timeout),
        }
        .map_err(|e| entry.error(format!("the Kubernetes API server: {e}")))
    };
    let lists = client(Duration::from_secs(60))?;
    // A watch is held open by the server for WATCH_SECONDS.
    let watches = client(Duration::from_secs(WATCH_SECONDS + 30))?;
    let defaults = PodPolicy::default();
    let policy = PodPolicy {
        user_annotations: c.k8s_user_annotations.unwrap_or(defaults.user_annotations),
        project_annotations: c
            .k8s_project_annotations
            .unwrap_or(defaults.project_annotations),
        gpu_resources: c.k8s_gpu_resources.unwrap_or(defaults.gpu_resources),
    };
    tracing::info!(cluster = %entry.id, kubeconfig = ?c.kubeconfig, "pods followed from the Kubernetes API server");
    Ok(Arc::new(
        K8sAccounting::start(lists, watches, policy, entry.id)
            .with_ns_users_file(c.k8s_ns_users_file),
    ))
}
