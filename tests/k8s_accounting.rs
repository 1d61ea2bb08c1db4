//! The stats-server on a Kubernetes cluster: a stand-in API server over real HTTPS on
//! 127.0.0.1 (behind a kubeconfig with its CA and a token) serves a pod list, then watches
//! shaped like the real API's (events one JSON per line; one watch that ends and is resumed
//! from its last version; one answered `410 Gone`, which forces a new list), and RoleBindings.
//! The pods reach `/units` with `resource_manager = "k8s"`, their owner, project, allocation
//! and end; a user sees their own pods, and their projects are the namespaces RoleBindings
//! give them. A large cluster is listed in pages (`limit`, `continue`), again from the start
//! when a page's token expires.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::http::{Request, Response, TestServer};
use common::kube_api::stats_server_of;
use serde_json::{json, Value};

fn pod(uid: &str, ns: &str, owner: Option<&str>, phase: &str, version: &str) -> Value {
    let mut annotations = serde_json::Map::new();
    if let Some(o) = owner {
        annotations.insert("ceems.io/created-by".into(), json!(o));
    }
    let mut status =
        json!({"phase": phase, "qosClass": "Burstable", "startTime": "2026-11-25T10:00:10Z"});
    if phase == "Succeeded" {
        status["containerStatuses"] = json!([{"state": {"terminated": {"exitCode": 0, "finishedAt": "2026-11-25T10:30:10Z"}}}]);
    }
    json!({
        "kind": "Pod",
        "metadata": {"name": format!("pod-{uid}"), "namespace": ns, "uid": uid, "resourceVersion": version,
                     "creationTimestamp": "2026-11-25T10:00:00Z", "annotations": annotations},
        "spec": {"nodeName": "gpu-01", "serviceAccountName": "trainer", "containers": [
            {"resources": {"limits": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}}}]},
        "status": status
    })
}

fn lines(events: &[(&str, Value)]) -> Vec<u8> {
    events
        .iter()
        .map(|(kind, object)| format!("{}\n", json!({"type": kind, "object": object})))
        .collect::<String>()
        .into_bytes()
}

/// The `data` rows of an API answer.
fn units(server: &common::Running, path: &str, user: &str) -> Vec<Value> {
    common::api_get(server, path, user)["data"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn pods_are_listed_watched_resumed_and_listed_again_after_410() {
    const A: &str = "aaaaaaaa-0000-4000-8000-000000000001";
    const B: &str = "bbbbbbbb-0000-4000-8000-000000000002";
    const C: &str = "cccccccc-0000-4000-8000-000000000003";
    let lists = Arc::new(AtomicUsize::new(0));
    let l = Arc::clone(&lists);
    let api = TestServer::start(
        true,
        Arc::new(move |req: &Request| {
            if req.header("authorization") != Some("Bearer s3cret") {
                return Response::json(401, json!({"kind": "Status", "code": 401}));
            }
            let q = req.target.as_str();
            match req.path() {
                "/apis/rbac.authorization.k8s.io/v1/rolebindings" => Response::json(
                    200,
                    json!({"items": [
                        {"metadata": {"name": "edit", "namespace": "ml"}, "subjects": [{"kind": "User", "name": "alice"}]}
                    ]}),
                ),
                "/api/v1/pods" if !q.contains("watch=1") => {
                    let items = match l.fetch_add(1, Ordering::SeqCst) {
                        0 => (
                            json!([
                                pod(A, "ml", Some("alice"), "Running", "90"),
                                pod(B, "web", None, "Pending", "95")
                            ]),
                            "100",
                        ),
                        // B was deleted while no watch ran.
                        _ => (
                            json!([
                                pod(A, "ml", Some("alice"), "Succeeded", "190"),
                                pod(C, "ml", Some("bob"), "Running", "150")
                            ]),
                            "200",
                        ),
                    };
                    Response::json(
                        200,
                        json!({"kind": "PodList", "metadata": {"resourceVersion": items.1}, "items": items.0}),
                    )
                }
                "/api/v1/pods" if q.contains("resourceVersion=100") => Response::raw(
                    200,
                    lines(&[
                        ("MODIFIED", pod(B, "web", None, "Running", "101")),
                        ("ADDED", pod(C, "ml", Some("bob"), "Running", "102")),
                    ]),
                ),
                "/api/v1/pods" if q.contains("resourceVersion=102") => Response::raw(
                    200,
                    lines(&[(
                        "ERROR",
                        json!({"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version: 102 (180)"}),
                    )]),
                ),
                // Later watches end without news.
                "/api/v1/pods" => Response::raw(200, Vec::new()),
                _ => Response::json(404, json!({"kind": "Status", "code": 404})),
            }
        }),
    );
    let (_tmp, server) = stats_server_of(&api, "s3cret");
    let all = "/api/v1/units/admin?from=0&running&field=uuid&field=username&field=project&field=qos&field=state&field=exit_code&field=alloc_cpus&field=alloc_gpus&field=alloc_mem_bytes&field=ended_at_ts&field=resource_manager";
    let start = Instant::now();
    let admin = loop {
        let got = units(&server, all, "root");
        let state = |uid: &str| {
            got.iter()
                .find(|u| u["uuid"] == uid)
                .map(|u| u["state"].as_str().unwrap_or("").to_owned())
        };
        // The phase in CEEMS's words; a pod deleted while it ran is ours, CANCELLED.
        if state(A).as_deref() == Some("Succeeded")
            && state(B).as_deref() == Some("CANCELLED")
            && state(C).as_deref() == Some("Running")
        {
            break got;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "not followed: {got:#?}\nasked: {:?}",
            api.seen()
                .iter()
                .map(|r| r.target.clone())
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let of = |uid: &str| admin.iter().find(|u| u["uuid"] == uid).unwrap().clone();
    let a = of(A);
    assert_eq!(
        (a["username"].as_str(), a["project"].as_str()),
        (Some("alice"), Some("ml"))
    );
    assert_eq!(
        (a["alloc_cpus"].as_u64(), a["alloc_gpus"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(a["alloc_mem_bytes"].as_u64(), Some(4 << 30));
    assert_eq!(a["resource_manager"], "k8s");
    assert!(a["ended_at_ts"].as_i64().is_some(), "{a}");
    let b = of(B);
    // No person created it: CEEMS's `<project>:svc`.
    assert_eq!(b["username"], "web:svc");
    assert!(b["ended_at_ts"].as_i64().is_some(), "{b}");
    assert_eq!(of(C)["username"], "bob");

    // The order of what was asked: list, watch from it, the resumed watch, 410, list again.
    let asked: Vec<String> = api
        .seen()
        .iter()
        .map(|r| r.target.clone())
        .filter(|t| t.starts_with("/api/v1/pods"))
        .collect();
    let at = |needle: &str| {
        asked
            .iter()
            .position(|t| t.contains(needle))
            .unwrap_or_else(|| panic!("never asked for {needle}: {asked:?}"))
    };
    const LIST: &str = "/api/v1/pods?limit=500";
    assert_eq!(asked[0], LIST);
    assert!(
        at("resourceVersion=100") < at("resourceVersion=102"),
        "{asked:?}"
    );
    assert!(
        at("resourceVersion=102") < at("resourceVersion=200"),
        "{asked:?}"
    );
    assert!(
        asked[1..at("resourceVersion=200")].contains(&LIST.to_owned()),
        "{asked:?}"
    );
    assert!(
        asked
            .iter()
            .all(|t| t == LIST || t.contains("watch=1&allowWatchBookmarks=true")),
        "{asked:?}"
    );

    // Each user's units are their own pods; alice's projects are her RoleBindings' namespaces,
    // bob's, as CEEMS has it, the namespace of the pod he runs there.
    let mine = "/api/v1/units?from=0&running&field=uuid";
    let ids = |user: &str| {
        let mut v: Vec<String> = units(&server, mine, user)
            .iter()
            .filter_map(|u| u["uuid"].as_str().map(str::to_owned))
            .collect();
        v.sort();
        v
    };
    assert_eq!(ids("alice"), [A]);
    assert_eq!(ids("bob"), [C]);
    assert!(ids("mallory").is_empty());
    let projects = units(&server, "/api/v1/projects", "alice");
    let names: Vec<&str> = projects.iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(names, ["ml"], "{projects:?}");
    let projects = units(&server, "/api/v1/projects", "bob");
    let names: Vec<&str> = projects.iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(names, ["ml"], "{projects:?}");
    assert!(units(&server, "/api/v1/projects", "mallory").is_empty());
    // Reports as for Slurm jobs: the owner gets the pod's, another user does not.
    // The status and body of a report as `user`.
    let report = |pod: &str, user: &str| -> (u16, String) {
        match ureq::get(&server.url(&format!("/report/kube/{pod}.json")))
            .set("X-Grafana-User", user)
            .call()
        {
            Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
            Err(e) => panic!("{e}"),
        }
    };
    let body: Value = serde_json::from_str(&report(A, "alice").1).unwrap();
    // The pod's phase, as the API answers it.
    assert_eq!(body["data"]["job"]["state"], "Succeeded", "{body}");
    assert_eq!(report(A, "bob").0, 403, "bob read alice's pod");
}

/// 1,203 pods in three pages of at most 500; the first try's token expires (410 Gone) before
/// the second page, so the list starts again, and every pod reaches the database once.
#[test]
fn a_large_cluster_is_listed_in_pages_and_again_when_a_token_expires() {
    const PODS: usize = 1203;
    let uid = |i: usize| format!("dddddddd-0000-4000-8000-{i:012}");
    let expired_once = Arc::new(AtomicUsize::new(0));
    let e = Arc::clone(&expired_once);
    let api = TestServer::start(
        true,
        Arc::new(move |req: &Request| {
            let q = req.target.as_str();
            match req.path() {
                "/apis/rbac.authorization.k8s.io/v1/rolebindings" => {
                    Response::json(200, json!({"items": []}))
                }
                "/api/v1/pods" if !q.contains("watch=1") => {
                    let limit: usize = q
                        .split(['?', '&'])
                        .find_map(|p| p.strip_prefix("limit="))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(usize::MAX);
                    if limit > 500 {
                        return Response::json(
                            500,
                            json!({"kind": "Status", "message": "one giant answer"}),
                        );
                    }
                    let from: usize = q
                        .split(['?', '&'])
                        .find_map(|p| p.strip_prefix("continue=tok-"))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    if from > 0 && e.fetch_add(1, Ordering::SeqCst) == 0 {
                        return Response::json(
                            410,
                            json!({"kind": "Status", "code": 410, "reason": "Expired",
                                   "message": "The provided continue parameter is too old"}),
                        );
                    }
                    let to = (from + limit).min(PODS);
                    let items: Vec<Value> = (from..to)
                        .map(|i| pod(&uid(i), "ml", Some("alice"), "Running", "300"))
                        .collect();
                    let next = if to < PODS {
                        format!("tok-{to}")
                    } else {
                        String::new()
                    };
                    Response::json(
                        200,
                        json!({"kind": "PodList",
                               "metadata": {"resourceVersion": "300", "continue": next},
                               "items": items}),
                    )
                }
                "/api/v1/pods" => Response::raw(200, Vec::new()),
                _ => Response::json(404, json!({"kind": "Status", "code": 404})),
            }
        }),
    );
    let (_tmp, server) = stats_server_of(&api, "t");
    let start = Instant::now();
    let got = loop {
        let got = units(
            &server,
            "/api/v1/units/admin?from=0&running&field=uuid",
            "root",
        );
        if got.len() >= PODS || start.elapsed() > Duration::from_secs(30) {
            break got;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut uuids: Vec<String> = got
        .iter()
        .filter_map(|u| u["uuid"].as_str().map(str::to_owned))
        .collect();
    uuids.sort();
    uuids.dedup();
    assert_eq!(
        (got.len(), uuids.len()),
        (PODS, PODS),
        "pods missing or doubled"
    );
    assert_eq!(uuids.first(), Some(&uid(0)));
    assert_eq!(uuids.last(), Some(&uid(PODS - 1)));
    let lists: Vec<String> = api
        .seen()
        .iter()
        .map(|r| r.target.clone())
        .filter(|t| t.starts_with("/api/v1/pods") && !t.contains("watch=1"))
        .collect();
    // The first page, its expired token, then the three pages of the list begun again.
    assert_eq!(
        lists,
        [
            "/api/v1/pods?limit=500",
            "/api/v1/pods?limit=500&continue=tok-500",
            "/api/v1/pods?limit=500",
            "/api/v1/pods?limit=500&continue=tok-500",
            "/api/v1/pods?limit=500&continue=tok-1000",
        ],
        "{lists:?}"
    );
}

/// CEEMS's mock API server answers every `/api/v1/pods` (a watch too) with its list, whose
/// metadata has no `resourceVersion`: there is nothing to watch from. The pods are listed,
/// served, and listed again later, not in a tight loop (it was asked 182 times in 4 s).
#[test]
fn a_list_without_a_resource_version_is_not_asked_again_at_once() {
    const A: &str = "aaaaaaaa-0000-4000-8000-0000000000a1";
    let asked = Arc::new(AtomicUsize::new(0));
    let a = Arc::clone(&asked);
    let api = TestServer::start(
        true,
        Arc::new(move |req: &Request| match req.path() {
            "/apis/rbac.authorization.k8s.io/v1/rolebindings" => Response::json(
                200,
                json!({"items": [
                    {"metadata": {"name": "edit", "namespace": "ml"}, "subjects": [{"kind": "User", "name": "alice"}]}
                ]}),
            ),
            "/api/v1/pods" => {
                a.fetch_add(1, Ordering::SeqCst);
                let mut listed = pod(A, "ml", Some("alice"), "Running", "");
                listed["metadata"]
                    .as_object_mut()
                    .unwrap()
                    .remove("resourceVersion");
                Response::json(200, json!({"metadata": {}, "items": [listed]}))
            }
            _ => Response::json(404, json!({"kind": "Status", "code": 404})),
        }),
    );
    let (_tmp, server) = stats_server_of(&api, "t");
    let start = std::time::Instant::now();
    while units(&server, "/api/v1/units/admin?running", "root").is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "pod never served"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(3));
    let n = asked.load(Ordering::SeqCst);
    assert!(n <= 2, "the pod list was asked {n} times in a few seconds");
}
