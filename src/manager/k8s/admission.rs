//! The admission webhook's decision (`ceems k8s-admission-controller`): who created a pod or a
//! workload, written as `ceems.io/created-by` and `ceems.io/created-by-uid` into the pod, or
//! into a workload's pod template, so that every pod names the person behind it.
//!
//! As CEEMS's controller decides: a pod keeps a creator it already names unless that is a
//! service account and a person now asks; a workload's template takes the workload's own
//! creator, keeps one it names, or takes the requester. Ours besides: an update cannot change
//! the creator the old object named, and annotations of other keys are kept.

use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;

pub const CREATED_BY: &str = "ceems.io/created-by";
pub const CREATED_BY_UID: &str = "ceems.io/created-by-uid";
const SERVICE_ACCOUNT: &str = "system:serviceaccount";
const POD_PATH: &str = "/metadata/annotations";
const TEMPLATE_PATH: &str = "/spec/template/metadata/annotations";
const JOB_TEMPLATE_PATH: &str = "/spec/jobTemplate/spec/template/metadata/annotations";

/// The webhook's two endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// Answers with the patch that adds the annotations.
    Mutate,
    /// Admits everything; says in the log when the annotations are missing.
    Validate,
}

/// Why a review is not answered with an `AdmissionReview`.
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    #[error("could not deserialize request: {0}")]
    NotJson(#[from] serde_json::Error),
    #[error("unsupported group version kind: {api_version}, Kind={kind}")]
    NotAReview { api_version: String, kind: String },
    #[error("malformed admission review: request is nil")]
    NoRequest,
    #[error("operation {0} is not registered")]
    NotHandled(String),
}

#[derive(Debug, Deserialize)]
struct Review {
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    request: Option<Request>,
}

#[derive(Debug, Deserialize)]
struct Request {
    #[serde(default)]
    uid: String,
    #[serde(default)]
    operation: String,
    #[serde(rename = "userInfo", default)]
    user_info: UserInfo,
    #[serde(default)]
    object: Option<Value>,
    #[serde(rename = "oldObject", default)]
    old_object: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
struct UserInfo {
    #[serde(default)]
    username: String,
    #[serde(default)]
    uid: String,
}

/// A creator: a user name and its uid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Creator {
    pub name: String,
    pub uid: String,
}

impl Creator {
    fn is_service_account(&self) -> bool {
        self.name.contains(SERVICE_ACCOUNT)
    }
}

/// What the webhook answers and what it decided, for the log.
#[derive(Debug)]
pub struct Answer {
    /// The `AdmissionReview` response, with its newline (as Go's encoder writes it).
    pub body: String,
    /// The creator the object names once admitted, when it is one the webhook handles.
    pub creator: Option<String>,
    /// Whether the object lacked the annotations (a patch was, or would have been, sent).
    pub patched: bool,
}

/// Answers one `AdmissionReview` (v1 or v1beta1) posted to `hook`.
pub fn review(body: &[u8], hook: Hook) -> Result<Answer, AdmissionError> {
    let review: Review = serde_json::from_slice(body)?;
    let known = ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"];
    if review.kind != "AdmissionReview" || !known.contains(&review.api_version.as_str()) {
        return Err(AdmissionError::NotAReview {
            api_version: review.api_version,
            kind: review.kind,
        });
    }
    let request = review.request.ok_or(AdmissionError::NoRequest)?;
    let (allowed, message, patch, creator) = match request.operation.as_str() {
        "CREATE" | "UPDATE" => {
            let (ops, creator) = decide(&request);
            (true, None, ops, creator)
        }
        "DELETE" | "CONNECT" => return Err(AdmissionError::NotHandled(request.operation)),
        other => (
            false,
            Some(format!("Invalid operation: {other}")),
            Vec::new(),
            None,
        ),
    };
    let patched = !patch.is_empty();
    let mut response = format!(
        "{{\"uid\":{},\"allowed\":{allowed},\"status\":{{\"metadata\":{{}}",
        json_string(&request.uid)
    );
    if let Some(m) = &message {
        response.push_str(&format!(",\"message\":{}", json_string(m)));
    }
    response.push('}');
    if hook == Hook::Mutate && patched {
        let ops: Vec<String> = patch.iter().map(PatchOp::to_json).collect();
        let bytes = format!("[{}]", ops.join(","));
        response.push_str(&format!(
            ",\"patch\":\"{}\",\"patchType\":\"JSONPatch\"",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        ));
    }
    response.push('}');
    Ok(Answer {
        body: format!(
            "{{\"kind\":\"AdmissionReview\",\"apiVersion\":{},\"response\":{response}}}\n",
            json_string(&review.api_version)
        ),
        creator: creator.map(|c| c.name),
        patched,
    })
}

fn json_string(s: &str) -> String {
    Value::from(s).to_string()
}

/// One JSON patch operation, written as CEEMS writes them (`from` always there).
#[derive(Debug, Clone, PartialEq)]
pub struct PatchOp {
    pub path: String,
    pub value: Value,
}

impl PatchOp {
    fn to_json(&self) -> String {
        format!(
            "{{\"op\":\"add\",\"path\":{},\"from\":\"\",\"value\":{}}}",
            json_string(&self.path),
            self.value
        )
    }
}

/// The patch for a CREATE or UPDATE, and the creator the object names after it.
fn decide(request: &Request) -> (Vec<PatchOp>, Option<Creator>) {
    let requester = Creator {
        name: request.user_info.username.clone(),
        uid: request.user_info.uid.clone(),
    };
    let Some(object) = &request.object else {
        return (Vec::new(), None);
    };
    let Some(shape) = Shape::of(object) else {
        return (Vec::new(), None);
    };
    let target = annotations(object, shape.path);
    let current = creator_in(target);
    let mut wanted = match shape.workload {
        // A pod keeps its creator unless a person takes it over from a service account.
        false => match &current {
            Some(c) if c.is_service_account() && !requester.is_service_account() => requester,
            Some(c) => c.clone(),
            None => requester,
        },
        // A workload's template takes the workload's own creator, keeps its own, or takes
        // the requester.
        true => match (creator_in(annotations(object, POD_PATH)), &current) {
            (Some(own), _) if !own.is_service_account() => own,
            (_, Some(c)) if !c.is_service_account() => c.clone(),
            _ => requester,
        },
    };
    // An update keeps the creator the old object named: editing the annotation does not
    // make a pod someone else's.
    if request.operation == "UPDATE" {
        let old = request
            .old_object
            .as_ref()
            .and_then(|old| creator_in(annotations(old, shape.path)));
        if let Some(old) = old.filter(|o| !o.is_service_account()) {
            wanted = old;
        }
    }
    if current.as_ref() == Some(&wanted) {
        return (Vec::new(), Some(wanted));
    }
    (set(shape.path, target, &wanted), Some(wanted))
}

/// Where a kind of object keeps the annotations of its pods.
struct Shape {
    path: &'static str,
    workload: bool,
}

impl Shape {
    fn of(object: &Value) -> Option<Shape> {
        let api = object["apiVersion"].as_str().unwrap_or("");
        let kind = object["kind"].as_str().unwrap_or("");
        let (path, workload) = match (api, kind) {
            ("v1", "Pod") => (POD_PATH, false),
            ("apps/v1", "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet")
            | ("batch/v1", "Job") => (TEMPLATE_PATH, true),
            ("batch/v1", "CronJob") => (JOB_TEMPLATE_PATH, true),
            _ => return None,
        };
        Some(Shape { path, workload })
    }
}

/// The annotations at `path` (a JSON pointer) of `object`, if it is a map.
fn annotations<'a>(object: &'a Value, path: &str) -> Option<&'a serde_json::Map<String, Value>> {
    object.pointer(path)?.as_object()
}

fn creator_in(annotations: Option<&serde_json::Map<String, Value>>) -> Option<Creator> {
    let map = annotations?;
    let name = map.get(CREATED_BY)?.as_str().filter(|n| !n.is_empty())?;
    Some(Creator {
        name: name.to_owned(),
        uid: map
            .get(CREATED_BY_UID)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
    })
}

/// The operations that make the annotations at `path` name `who`: the whole map where it holds
/// nothing else (CEEMS's patch), else each key on its own, so other annotations stay.
fn set(
    path: &str,
    current: Option<&serde_json::Map<String, Value>>,
    who: &Creator,
) -> Vec<PatchOp> {
    let only_ours =
        current.is_none_or(|m| m.keys().all(|k| k == CREATED_BY || k == CREATED_BY_UID));
    match only_ours {
        true => vec![PatchOp {
            path: path.to_owned(),
            value: serde_json::json!({CREATED_BY: who.name, CREATED_BY_UID: who.uid}),
        }],
        false => [(CREATED_BY, &who.name), (CREATED_BY_UID, &who.uid)]
            .into_iter()
            .map(|(key, value)| PatchOp {
                // JSON pointer: `/` in a key is `~1`.
                path: format!("{path}/{}", key.replace('~', "~0").replace('/', "~1")),
                value: Value::from(value.as_str()),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ask(operation: &str, user: &str, object: Value, old: Value) -> (Vec<PatchOp>, String) {
        let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u1", "operation": operation,
                        "userInfo": {"username": user, "uid": format!("{user}-uid")},
                        "object": object, "oldObject": old}});
        let answer = review(body.to_string().as_bytes(), Hook::Mutate).unwrap();
        let v: Value = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(v["response"]["uid"], "u1");
        let ops = match v["response"]["patch"].as_str() {
            None => Vec::new(),
            Some(p) => {
                let raw = base64::engine::general_purpose::STANDARD.decode(p).unwrap();
                let ops: Vec<Value> = serde_json::from_slice(&raw).unwrap();
                ops.into_iter()
                    .map(|o| PatchOp {
                        path: o["path"].as_str().unwrap().to_owned(),
                        value: o["value"].clone(),
                    })
                    .collect()
            }
        };
        (ops, answer.creator.unwrap_or_default())
    }

    fn pod(annotations: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"annotations": annotations}})
    }

    #[test]
    fn a_pod_from_a_template_keeps_its_person_and_a_service_account_gives_way() {
        let rs = "system:serviceaccount:kube-system:replicaset-controller";
        let alices = json!({CREATED_BY: "alice", CREATED_BY_UID: "alice-uid"});
        let (ops, who) = ask("CREATE", rs, pod(alices.clone()), Value::Null);
        assert!(ops.is_empty() && who == "alice");
        let sa = json!({CREATED_BY: rs, CREATED_BY_UID: "9"});
        let (ops, who) = ask("CREATE", "alice", pod(sa), Value::Null);
        assert_eq!(who, "alice");
        assert_eq!(ops[0].value, alices);
    }

    #[test]
    fn an_update_cannot_take_another_s_pod_and_other_annotations_stay() {
        let alices = json!({CREATED_BY: "alice", CREATED_BY_UID: "alice-uid", "team": "a"});
        let bobs = json!({CREATED_BY: "bob", CREATED_BY_UID: "bob-uid", "team": "a"});
        let (ops, who) = ask("UPDATE", "bob", pod(bobs), pod(alices));
        assert_eq!(who, "alice");
        assert_eq!(
            ops,
            [
                PatchOp {
                    path: "/metadata/annotations/ceems.io~1created-by".into(),
                    value: json!("alice")
                },
                PatchOp {
                    path: "/metadata/annotations/ceems.io~1created-by-uid".into(),
                    value: json!("alice-uid")
                }
            ]
        );
    }

    #[test]
    fn a_workload_s_template_names_its_person() {
        let deploy = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                            "spec": {"template": {"metadata": {"labels": {"app": "x"}}}}});
        let (ops, who) = ask("CREATE", "alice", deploy, Value::Null);
        assert_eq!(who, "alice");
        assert_eq!(ops[0].path, TEMPLATE_PATH);
        let cron = json!({"apiVersion": "batch/v1", "kind": "CronJob"});
        let (ops, _) = ask("CREATE", "alice", cron, Value::Null);
        assert_eq!(ops[0].path, JOB_TEMPLATE_PATH);
        // Objects without pods are admitted untouched.
        let svc = json!({"apiVersion": "v1", "kind": "Service"});
        assert!(ask("CREATE", "alice", svc, Value::Null).0.is_empty());
    }

    proptest::proptest! {
        /// Any review, however cut or garbled, is answered or refused by name; never a panic.
        #[test]
        fn any_body_is_answered_or_refused(cut in 0usize..400, byte in 0u8..=255, at in 0usize..400) {
            let good = serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1beta1",
                "kind": "AdmissionReview", "request": {"uid": "x", "operation": "UPDATE",
                "userInfo": {"username": "a"}, "object": pod(json!({CREATED_BY: 1})),
                "oldObject": {"apiVersion": "v1", "kind": "Pod", "metadata": {"annotations": []}}}}))
                .unwrap();
            let mut body = good[..cut.min(good.len())].to_vec();
            if let Some(b) = body.get_mut(at) {
                *b = byte;
            }
            if let Ok(answer) = review(&body, Hook::Mutate) {
                let v: Value = serde_json::from_str(&answer.body).unwrap();
                proptest::prop_assert!(v["response"]["allowed"].is_boolean());
            }
        }
    }

    #[test]
    fn malformed_reviews_are_named_errors() {
        assert!(matches!(
            review(b"{not json", Hook::Mutate),
            Err(AdmissionError::NotJson(_))
        ));
        assert!(matches!(
            review(br#"{"apiVersion":"v1","kind":"Pod"}"#, Hook::Mutate),
            Err(AdmissionError::NotAReview { .. })
        ));
        assert!(matches!(
            review(
                br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
                Hook::Mutate
            ),
            Err(AdmissionError::NoRequest)
        ));
        let odd = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"PATCH","object":{"kind":7,"metadata":[]}}}"#;
        let answer = review(odd, Hook::Mutate).unwrap();
        assert!(
            answer.body.contains("\"allowed\":false")
                && answer.body.contains("Invalid operation: PATCH")
        );
    }
}
