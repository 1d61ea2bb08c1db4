//! A pod as the API server describes it, and the stats-server's record of it: project = its
//! namespace (or a configured annotation), user = the annotation that names who created it
//! (CEEMS's admission controller writes `ceems.io/created-by`), else its service account;
//! allocation from its containers' limits.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::manager::civil::parse_rfc3339;
use crate::manager::{Allocation, UnitRecord};

/// How pods become units.
#[derive(Debug, Clone)]
pub struct PodPolicy {
    /// Annotations naming the pod's user, first present wins.
    pub user_annotations: Vec<String>,
    /// Annotations naming its project, first present wins; else the namespace.
    pub project_annotations: Vec<String>,
    /// Extended resources that are GPUs.
    pub gpu_resources: Vec<String>,
}

impl Default for PodPolicy {
    fn default() -> PodPolicy {
        PodPolicy {
            user_annotations: vec!["ceems.io/created-by".into()],
            project_annotations: Vec::new(),
            gpu_resources: vec!["nvidia.com/gpu".into(), "amd.com/gpu".into()],
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Pod {
    #[serde(default)]
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: Spec,
    #[serde(default)]
    pub status: Status,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub resource_version: String,
    #[serde(default)]
    pub creation_timestamp: Option<String>,
    #[serde(default)]
    pub deletion_timestamp: Option<String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    #[serde(default)]
    pub node_name: String,
    #[serde(default)]
    pub service_account_name: String,
    #[serde(default)]
    pub containers: Vec<Container>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct Container {
    #[serde(default)]
    pub resources: Resources,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct Resources {
    #[serde(default)]
    pub limits: BTreeMap<String, String>,
    #[serde(default)]
    pub requests: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    #[serde(default)]
    pub phase: String,
    #[serde(default)]
    pub qos_class: String,
    #[serde(default)]
    pub start_time: Option<String>,
    #[serde(default)]
    pub container_statuses: Vec<ContainerStatus>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct ContainerStatus {
    #[serde(default)]
    pub state: ContainerState,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct ContainerState {
    #[serde(default)]
    pub terminated: Option<Terminated>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Terminated {
    #[serde(default)]
    pub exit_code: i64,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub finished_at: Option<String>,
}

/// A Kubernetes quantity (`500m`, `2`, `512Mi`, `1G`, `1.5e3`) as a number of its unit.
pub fn parse_quantity(text: &str) -> Option<f64> {
    let t = text.trim();
    let suffixes: [(&str, f64); 14] = [
        ("Ki", 1024.0),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
    ];
    let (number, scale) = suffixes
        .iter()
        .find_map(|(s, f)| t.strip_suffix(s).map(|n| (n, *f)))
        .unwrap_or((t, 1.0));
    let value: f64 = number.parse().ok()?;
    (value.is_finite() && value >= 0.0).then_some(value * scale)
}

/// The sum of a resource's limits over the pod's containers (requests where no limit).
fn total(pod: &Pod, resource: &str) -> f64 {
    pod.spec
        .containers
        .iter()
        .filter_map(|c| {
            let r = &c.resources;
            r.limits
                .get(resource)
                .or_else(|| r.requests.get(resource))
                .and_then(|q| parse_quantity(q))
        })
        .sum()
}

/// The pod's record, `deleted_at` when the watch saw it go.
pub fn record(pod: &Pod, policy: &PodPolicy, deleted_at: Option<i64>, now: i64) -> UnitRecord {
    let m = &pod.metadata;
    let annotation = |keys: &[String]| {
        keys.iter()
            .find_map(|k| m.annotations.get(k))
            .filter(|v| !v.is_empty())
            .cloned()
    };
    let account = annotation(&policy.project_annotations).unwrap_or_else(|| m.namespace.clone());
    let service_account = match pod.spec.service_account_name.as_str() {
        "" => "default",
        sa => sa,
    };
    let user = annotation(&policy.user_annotations)
        .filter(|u| !u.contains("serviceaccount"))
        .unwrap_or_else(|| format!("system:serviceaccount:{}:{service_account}", m.namespace));
    let terminated: Vec<&Terminated> = pod
        .status
        .container_statuses
        .iter()
        .filter_map(|c| c.state.terminated.as_ref())
        .collect();
    let finished = terminated
        .iter()
        .filter_map(|t| t.finished_at.as_deref().and_then(parse_rfc3339))
        .max();
    let phase = pod.status.phase.as_str();
    let start = pod.status.start_time.as_deref().and_then(parse_rfc3339);
    let end = match phase {
        "Succeeded" | "Failed" => finished
            .or_else(|| m.deletion_timestamp.as_deref().and_then(parse_rfc3339))
            .or(deleted_at),
        _ => deleted_at,
    };
    let oom = terminated.iter().any(|t| t.reason == "OOMKilled");
    let state = match (phase, deleted_at) {
        ("Succeeded", _) => "COMPLETED",
        ("Failed", _) if oom => "OUT_OF_MEMORY",
        ("Failed", _) => "FAILED",
        // Deleted before it finished.
        (_, Some(_)) => "CANCELLED",
        ("Running", None) => "RUNNING",
        ("Pending", None) => "PENDING",
        _ => "UNKNOWN",
    };
    let exit_code = terminated
        .iter()
        .map(|t| t.exit_code)
        .find(|c| *c != 0)
        .or_else(|| terminated.first().map(|t| t.exit_code))
        .map(|c| format!("{c}:0"))
        .unwrap_or_default();
    let gpus: f64 = policy.gpu_resources.iter().map(|r| total(pod, r)).sum();
    UnitRecord {
        uuid: m.uid.clone(),
        partition: String::new(),
        qos: pod.status.qos_class.clone(),
        account,
        group: String::new(),
        gid: None,
        user,
        uid: None,
        submit: m.creation_timestamp.as_deref().and_then(parse_rfc3339),
        start,
        end,
        elapsed_seconds: start
            .map(|s| u64::try_from(end.unwrap_or(now) - s).unwrap_or(0))
            .unwrap_or(0),
        exit_code,
        state: state.to_owned(),
        allocation: Allocation {
            // Whole CPUs: a pod limited to 500m holds part of one.
            cpus: total(pod, "cpu").ceil() as u64,
            mem_bytes: total(pod, "memory") as u64,
            gpus: gpus.round() as u64,
            billing: 0,
            nodes: u64::from(!pod.spec.node_name.is_empty()),
        },
        nodes: [pod.spec.node_name.clone()]
            .into_iter()
            .filter(|n| !n.is_empty())
            .collect(),
        workdir: String::new(),
        time_limit_seconds: None,
        name: m.name.clone(),
        reported: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = r#"{
      "metadata": {"name": "train-7f9c", "namespace": "ml", "uid": "483168fc-b347-4aa2-a9fa-9e3d220ba4c5",
        "resourceVersion": "1201", "creationTimestamp": "2026-11-25T10:00:00Z",
        "annotations": {"ceems.io/created-by": "alice", "team": "vision"}},
      "spec": {"nodeName": "gpu-01", "serviceAccountName": "trainer", "containers": [
        {"resources": {"limits": {"cpu": "1500m", "memory": "4Gi", "nvidia.com/gpu": "2"}}},
        {"resources": {"requests": {"cpu": "250m", "memory": "256Mi"}}}]},
      "status": {"phase": "Failed", "qosClass": "Burstable", "startTime": "2026-11-25T10:00:30Z",
        "containerStatuses": [{"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-11-25T11:00:30Z"}}},
                              {"state": {"terminated": {"exitCode": 0, "finishedAt": "2026-11-25T11:00:00Z"}}}]}
    }"#;

    #[test]
    fn a_pods_record_names_its_owner_project_allocation_and_end() {
        let pod: Pod = serde_json::from_str(POD).unwrap();
        let r = record(&pod, &PodPolicy::default(), None, 0);
        assert_eq!(
            (r.uuid.as_str(), r.name.as_str()),
            ("483168fc-b347-4aa2-a9fa-9e3d220ba4c5", "train-7f9c")
        );
        assert_eq!(
            (r.user.as_str(), r.account.as_str(), r.qos.as_str()),
            ("alice", "ml", "Burstable")
        );
        assert_eq!(
            (r.state.as_str(), r.exit_code.as_str()),
            ("OUT_OF_MEMORY", "137:0")
        );
        assert_eq!(r.elapsed_seconds, 3600);
        assert_eq!(
            r.allocation,
            Allocation {
                cpus: 2,
                mem_bytes: (4 << 30) + (256 << 20),
                gpus: 2,
                billing: 0,
                nodes: 1
            }
        );
        // A project annotation wins over the namespace; without a user annotation the user is
        // the service account.
        let policy = PodPolicy {
            user_annotations: vec!["nobody/here".into()],
            project_annotations: vec!["team".into()],
            ..PodPolicy::default()
        };
        let r = record(&pod, &policy, None, 0);
        assert_eq!(
            (r.user.as_str(), r.account.as_str()),
            ("system:serviceaccount:ml:trainer", "vision")
        );
    }

    #[test]
    fn a_running_pod_deleted_is_ended_and_cancelled() {
        let mut pod: Pod = serde_json::from_str(POD).unwrap();
        pod.status.phase = "Running".into();
        pod.status.container_statuses.clear();
        let now = parse_rfc3339("2026-11-25T10:10:30Z").unwrap();
        let r = record(&pod, &PodPolicy::default(), None, now);
        assert_eq!(
            (r.state.as_str(), r.end, r.elapsed_seconds),
            ("RUNNING", None, 600)
        );
        let r = record(&pod, &PodPolicy::default(), Some(now), now + 60);
        assert_eq!((r.state.as_str(), r.end), ("CANCELLED", Some(now)));
    }

    #[test]
    fn quantities() {
        for (q, v) in [
            ("500m", 0.5),
            ("2", 2.0),
            ("512Mi", 536_870_912.0),
            ("1G", 1e9),
            ("1.5e3", 1500.0),
            ("100k", 1e5),
        ] {
            assert_eq!(parse_quantity(q), Some(v), "{q}");
        }
        for bad in ["", "x", "-1", "1Qi", "NaN"] {
            assert_eq!(parse_quantity(bad), None, "{bad}");
        }
    }
}
