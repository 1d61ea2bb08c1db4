//! A pod as the API server describes it, and the stats-server's record of it: project = its
//! namespace (or a configured annotation), user = the annotation that names who created it
//! (CEEMS's admission controller writes `ceems.io/created-by`), else `<project>:svc`;
//! allocation from its containers' limits.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::manager::civil::parse_rfc3339;
use crate::manager::{Allocation, Reported, UnitRecord};

/// The user CEEMS gives a pod no person created, after its project: `<project>:svc`.
pub const SERVICE_USER: &str = "svc";

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
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    #[serde(default)]
    pub node_name: String,
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
    #[serde(default, deserialize_with = "quantities")]
    pub limits: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "quantities")]
    pub requests: BTreeMap<String, String>,
}

/// Quantities as text: the API writes them as strings, but a number (`"cpu": 2`, as
/// Kubernetes' own decoder accepts and CEEMS's test data has) reads as its text.
fn quantities<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Quantity {
        Text(String),
        Number(serde_json::Number),
    }
    let map = BTreeMap::<String, Quantity>::deserialize(d)?;
    Ok(map
        .into_iter()
        .map(|(k, q)| {
            let text = match q {
                Quantity::Text(t) => t,
                Quantity::Number(n) => n.to_string(),
            };
            (k, text)
        })
        .collect())
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
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct Condition {
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub reason: String,
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

/// Who the pod is of: (user, project). The project is the first project annotation present,
/// else the namespace; the user the first user annotation, else, as CEEMS names a pod no
/// person created, `<project>:svc`.
pub fn owner(pod: &Pod, policy: &PodPolicy) -> (String, String) {
    let annotations = &pod.metadata.annotations;
    let annotation = |keys: &[String]| {
        keys.iter()
            .find_map(|k| annotations.get(k))
            .filter(|v| !v.is_empty())
            .cloned()
    };
    let project =
        annotation(&policy.project_annotations).unwrap_or_else(|| pod.metadata.namespace.clone());
    let user = annotation(&policy.user_annotations)
        .filter(|u| !u.contains("serviceaccount"))
        .unwrap_or_else(|| format!("{project}:{SERVICE_USER}"));
    (user, project)
}

/// The pod's record, `deleted_at` when the watch saw it go.
pub fn record(pod: &Pod, policy: &PodPolicy, deleted_at: Option<i64>, now: i64) -> UnitRecord {
    let m = &pod.metadata;
    let (user, account) = owner(pod, policy);
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
    let created = m.creation_timestamp.as_deref().and_then(parse_rfc3339);
    let mut reported = reported(pod, policy, created, end, now);
    if state == "CANCELLED" {
        // Deleted before it finished: CEEMS, which does not watch, has no word for it.
        reported.state.clear();
    }
    UnitRecord {
        uuid: m.uid.clone(),
        partition: String::new(),
        qos: pod.status.qos_class.clone(),
        account,
        group: String::new(),
        gid: None,
        user,
        uid: None,
        submit: created,
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
        reported,
    }
}

/// What CEEMS answers of a pod, in its words: the phase as state (`Running/Ready`,
/// `Running/<reason>` while a container is not ready), the time since its creation as
/// elapsed (`N/A` before it starts), the allocation by resource name and its tags. The
/// state stored beside it stays ours (`COMPLETED`, `CANCELLED`, …), for findings and reports.
fn reported(
    pod: &Pod,
    policy: &PodPolicy,
    created: Option<i64>,
    end: Option<i64>,
    now: i64,
) -> Reported {
    let phase = pod.status.phase.as_str();
    let state = match phase {
        "Running" => pod
            .status
            .conditions
            .iter()
            .find(|c| c.kind == "Ready")
            .map_or_else(
                || "Running".to_owned(),
                |c| match c.status.as_str() {
                    "True" => "Running/Ready".to_owned(),
                    _ => format!("Running/{}", c.reason),
                },
            ),
        "Succeeded" | "Failed" | "Pending" => phase.to_owned(),
        _ => "Unknown".to_owned(),
    };
    let elapsed = match (phase, created) {
        ("Running" | "Succeeded" | "Failed", Some(c)) => {
            crate::manager::elapsed_text(end.unwrap_or(now) - c)
        }
        _ => "N/A".to_owned(),
    };
    let number = |v: f64| match v.fract() == 0.0 && v.abs() < 1e15 {
        true => serde_json::Value::from(v as i64),
        false => serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, Into::into),
    };
    let mut allocation = serde_json::Map::new();
    // CEEMS's floor: a pod without limits holds a thousandth of a CPU and a byte.
    allocation.insert("vcpus".into(), number(total(pod, "cpu").max(0.001)));
    allocation.insert("mem".into(), number(total(pod, "memory").max(1.0)));
    for name in &policy.gpu_resources {
        let n = total(pod, name);
        if n > 0.0 {
            allocation.insert(name.clone(), number(n));
        }
    }
    let mut tags = serde_json::Map::new();
    tags.insert("qos".into(), pod.status.qos_class.clone().into());
    let map = |m: &BTreeMap<String, String>| {
        serde_json::Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), v.clone().into()))
                .collect(),
        )
    };
    if !pod.metadata.annotations.is_empty() {
        tags.insert("annotations".into(), map(&pod.metadata.annotations));
    }
    if !pod.metadata.labels.is_empty() {
        tags.insert("labels".into(), map(&pod.metadata.labels));
    }
    Reported {
        state,
        elapsed,
        allocation,
        tags,
        ..Reported::default()
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
        // CEEMS's `<project>:svc`.
        let policy = PodPolicy {
            user_annotations: vec!["nobody/here".into()],
            project_annotations: vec!["team".into()],
            ..PodPolicy::default()
        };
        let r = record(&pod, &policy, None, 0);
        assert_eq!(
            (r.user.as_str(), r.account.as_str()),
            ("vision:svc", "vision")
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
