//! `ceems k8s-admission-controller`: CEEMS's two scenarios as its script runs them (its link
//! name and flags, `waitport`, the requests posted as `curl -d @file` posts them, the outputs
//! compared byte for byte), then as the kube-apiserver calls it: over HTTPS with the
//! certificate `ceems tool config create-web-config --tls` makes, a Deployment by alice, the
//! pod its ReplicaSet then creates, bob's update, and reviews that must be refused.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine as _;
use serde_json::{json, Value};

fn testdata() -> PathBuf {
    common::fixtures().join("ceems-v0.16/cmd/ceems_k8s_admission_controller/testdata")
}

/// The controller started as CEEMS's script starts it, through its CEEMS name.
fn start(dir: &Path, extra: &[&str]) -> (common::KillOnDrop, u16) {
    let link = dir.join("ceems_k8s_admission_controller");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ceems"), &link).unwrap();
    }
    let port = common::free_port();
    let child = Command::new(&link)
        .args(["--log.level=debug", "--web.listen-address"])
        .arg(format!("127.0.0.1:{port}"))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (common::KillOnDrop(child), port)
}

/// `curl -k -s -X POST -H "Content-Type: application/json" -d @file URL`: curl's `-d @file`
/// drops the file's line breaks.
fn post(url: &str, body: &[u8], extra: &[&str]) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("body");
    std::fs::write(&file, body).unwrap();
    let out = Command::new("curl")
        .args([
            "-k",
            "-s",
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
        ])
        .args(extra)
        .arg("-d")
        .arg(format!("@{}", file.display()))
        .args(["-w", "\n%{http_code}", url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (body.to_owned(), code.to_owned())
}

#[test]
fn ceems_admission_scenarios_answer_as_ceems_does() {
    let dir = tempfile::tempdir().unwrap();
    let (_running, port) = start(dir.path(), &[]);
    common::waitport(port);
    let requests = testdata().join("requests");
    let url =
        |endpoint: &str| format!("http://127.0.0.1:{port}/ceems-admission-controller/{endpoint}");
    let mut basic = String::new();
    for endpoint in ["validate", "mutate"] {
        for request in [
            "create-request-without-annotations.json",
            "create-request-with-annotations.json",
            "update-request-without-annotations.json",
            "update-request-with-annotations.json",
        ] {
            for version in ["v1", "v1beta1"] {
                let name = request.replace("request", &format!("{version}request"));
                let body = std::fs::read(requests.join(name)).unwrap();
                basic.push_str(&post(&url(endpoint), &body, &[]).0);
            }
        }
    }
    let expected =
        |name: &str| std::fs::read_to_string(testdata().join("output").join(name)).unwrap();
    assert_eq!(
        basic,
        expected("e2e-test-admission-basic-response-output.txt")
    );
    let mut advanced = String::new();
    for request in [
        "deployment-request-with-annotations-sa.json",
        "deployment-request-with-annotations.json",
        "deployment-request-with-template-annotations-sa.json",
        "deployment-request-with-template-annotations.json",
        "deployment-request-without-annotations-sa.json",
        "deployment-request-without-annotations.json",
    ] {
        let body = std::fs::read(requests.join(request)).unwrap();
        advanced.push_str(&post(&url("mutate"), &body, &[]).0);
    }
    assert_eq!(
        advanced,
        expected("e2e-test-admission-advanced-response-output.txt")
    );
}

/// A review of `object` by `user` as the kube-apiserver sends it.
fn review(operation: &str, user: &str, object: &Value, old: Option<&Value>) -> Vec<u8> {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
           "request": {"uid": format!("{user}-{operation}"), "operation": operation,
                       "kind": {"group": "", "version": "v1", "kind": object["kind"]},
                       "namespace": "physics",
                       "userInfo": {"username": user, "uid": format!("uid-{user}")},
                       "object": object, "oldObject": old}})
    .to_string()
    .into_bytes()
}

/// Applies a JSON patch's `add` operations to `object` as the API server does.
fn apply(object: &mut Value, answer: &str) {
    let answer: Value = serde_json::from_str(answer).unwrap();
    let Some(patch) = answer["response"]["patch"].as_str() else {
        return;
    };
    assert_eq!(answer["response"]["patchType"], "JSONPatch");
    let ops: Vec<Value> = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(patch)
            .unwrap(),
    )
    .unwrap();
    for op in ops {
        assert_eq!(op["op"], "add");
        let path = op["path"].as_str().unwrap();
        let (parent, key) = path.rsplit_once('/').unwrap();
        let key = key.replace("~1", "/").replace("~0", "~");
        let mut at = &mut *object;
        for part in parent.split('/').skip(1) {
            at = at
                .as_object_mut()
                .unwrap()
                .entry(part.to_owned())
                .or_insert_with(|| json!({}));
        }
        at.as_object_mut().unwrap().insert(key, op["value"].clone());
    }
}

fn created_by(object: &Value, pointer: &str) -> Option<String> {
    object
        .pointer(pointer)?
        .get("ceems.io/created-by")?
        .as_str()
        .map(str::to_owned)
}

#[test]
fn over_https_a_deployment_s_pods_are_its_creator_s_and_stay_so() {
    let dir = tempfile::tempdir().unwrap();
    let tool = Command::new(env!("CARGO_BIN_EXE_ceems"))
        .args([
            "tool",
            "config",
            "create-web-config",
            "--tls",
            "--basic-auth=false",
        ])
        .args(["--tls.host=127.0.0.1", "--output-dir"])
        .arg(dir.path().join("config"))
        .output()
        .unwrap();
    assert!(
        tool.status.success(),
        "{}",
        String::from_utf8_lossy(&tool.stderr)
    );
    let config = dir.path().join("config");
    // The tool says where the certificate is, for the caBundle.
    let said = String::from_utf8_lossy(&tool.stderr);
    let cert = PathBuf::from(
        said.split("certificate ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .unwrap_or_else(|| panic!("no certificate named: {said}")),
    );
    let web_config = format!(
        "--web.config.file={}",
        config.join("web-config.yml").display()
    );
    let (_running, port) = start(dir.path(), &[&web_config]);
    let base = format!("https://127.0.0.1:{port}");
    // Verified with the certificate, as the webhook configuration's caBundle makes the API
    // server verify it.
    let ca = ["--cacert", cert.to_str().unwrap()];
    let mut up = false;
    for _ in 0..50 {
        let out = Command::new("curl")
            .args(["-s", "--cacert", cert.to_str().unwrap()])
            .arg(format!("{base}/health"))
            .output()
            .unwrap();
        if String::from_utf8_lossy(&out.stdout) == "OK\n" {
            up = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(up, "no HTTPS answer");
    let mutate = format!("{base}/ceems-admission-controller/mutate");
    let ask = |body: Vec<u8>| {
        let (answer, code) = post(&mutate, &body, &ca);
        assert_eq!(code, "200", "{answer}");
        answer
    };

    // alice creates a Deployment: its pod template names her.
    let mut deploy = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "train", "namespace": "physics"},
        "spec": {"template": {"metadata": {"labels": {"app": "train"},
                                           "annotations": {"prometheus.io/scrape": "true"}},
                              "spec": {"containers": [{"name": "c", "image": "x"}]}}}});
    let answer = ask(review("CREATE", "alice", &deploy, None));
    apply(&mut deploy, &answer);
    let template = "/spec/template/metadata/annotations";
    assert_eq!(created_by(&deploy, template).as_deref(), Some("alice"));
    assert_eq!(
        deploy.pointer(template).unwrap()["prometheus.io/scrape"],
        "true"
    );

    // The ReplicaSet controller creates the pod from the template: it stays alice's.
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": deploy.pointer("/spec/template/metadata").unwrap().clone(),
        "spec": deploy.pointer("/spec/template/spec").unwrap().clone()});
    let rs = "system:serviceaccount:kube-system:replicaset-controller";
    let answer = ask(review("CREATE", rs, &pod, None));
    assert!(!answer.contains("\"patch\""), "{answer}");
    apply(&mut pod, &answer);
    assert_eq!(
        created_by(&pod, "/metadata/annotations").as_deref(),
        Some("alice")
    );

    // bob edits the annotation in an update: the pod stays alice's.
    let mut edited = pod.clone();
    edited["metadata"]["annotations"]["ceems.io/created-by"] = json!("bob");
    let answer = ask(review("UPDATE", "bob", &edited, Some(&pod)));
    apply(&mut edited, &answer);
    assert_eq!(
        created_by(&edited, "/metadata/annotations").as_deref(),
        Some("alice")
    );

    // A review of 10 MB, and one that is not JSON: refused, and the server keeps answering.
    let big = vec![b' '; 10 << 20];
    let (_, code) = post(&mutate, &big, &ca);
    assert_eq!(code, "413");
    let (said, code) = post(&mutate, b"{\"apiVersion\": ", &ca);
    assert_eq!(code, "400");
    assert!(said.contains("could not deserialize request"), "{said}");
    let (said, code) = post(&mutate, br#"{"kind":"Pod","apiVersion":"v1"}"#, &ca);
    assert_eq!(code, "400");
    assert!(said.contains("unsupported group version kind"), "{said}");
    let answer = ask(review(
        "CREATE",
        "carol",
        &json!({"apiVersion": "v1", "kind": "Pod"}),
        None,
    ));
    assert!(answer.contains("\"patch\""), "{answer}");
}

/// The example manifests register the webhook at the paths it serves, for pods and every
/// workload kind it handles, never blocking admission, and start it with flags it takes.
#[test]
fn the_example_manifests_match_the_webhook() {
    use serde::Deserialize as _;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/k8s/admission-controller.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let docs: Vec<serde_norway::Value> = serde_norway::Deserializer::from_str(&text)
        .map(|d| serde_norway::Value::deserialize(d).unwrap())
        .collect();
    let of = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"].as_str() == Some(kind))
            .unwrap_or_else(|| panic!("no {kind}"))
            .clone()
    };
    for (kind, path) in [
        (
            "MutatingWebhookConfiguration",
            ceems::cmd::k8s_admission_controller::MUTATE_PATH,
        ),
        (
            "ValidatingWebhookConfiguration",
            ceems::cmd::k8s_admission_controller::VALIDATE_PATH,
        ),
    ] {
        let hook = &of(kind)["webhooks"][0];
        assert_eq!(hook["clientConfig"]["service"]["path"].as_str(), Some(path));
        assert_eq!(hook["failurePolicy"].as_str(), Some("Ignore"));
    }
    let rules =
        serde_norway::to_string(&of("MutatingWebhookConfiguration")["webhooks"][0]["rules"])
            .unwrap();
    for resource in [
        "pods",
        "deployments",
        "statefulsets",
        "daemonsets",
        "replicasets",
        "jobs",
        "cronjobs",
    ] {
        assert!(rules.contains(resource), "{resource} not registered");
    }
    let args: Vec<String> = of("Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let argv = std::iter::once("ceems".to_owned()).chain(args);
    ceems::cmd::cli()
        .try_get_matches_from(argv)
        .expect("the Deployment's args parse");
}

/// The whole path: alice's Deployment goes through the webhook, its ReplicaSet's pod keeps her
/// (as the API server applies the patches), the Kubernetes stand-in serves that pod in a
/// namespace whose RoleBinding names bob, and the stats-server gives it to alice: hers in
/// `/units`, not bob's; through the lb hers, her project's (bob's too), nobody else's.
#[test]
fn a_deployment_s_pod_is_its_creator_s_in_the_api_and_the_lb() {
    use common::http::{Request, Response, TestServer};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let (_webhook, port) = start(dir.path(), &[]);
    common::waitport(port);
    let mutate = format!("http://127.0.0.1:{port}/ceems-admission-controller/mutate");
    let ask = |body: Vec<u8>| post(&mutate, &body, &[]).0;
    let mut deploy = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "train", "namespace": "physics"},
        "spec": {"template": {"metadata": {"labels": {"app": "train"}},
                              "spec": {"containers": [{"name": "c", "image": "x",
                                  "resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}]}}}});
    let answer = ask(review("CREATE", "alice", &deploy, None));
    apply(&mut deploy, &answer);
    const POD: &str = "dddddddd-0000-4000-8000-000000000004";
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": deploy.pointer("/spec/template/metadata").unwrap().clone(),
        "spec": deploy.pointer("/spec/template/spec").unwrap().clone()});
    let rs = "system:serviceaccount:kube-system:replicaset-controller";
    let answer = ask(review("CREATE", rs, &pod, None));
    apply(&mut pod, &answer);
    // What the API server then stores and lists.
    let meta = pod["metadata"].as_object_mut().unwrap();
    meta.insert("name".into(), json!("train-abc12"));
    meta.insert("namespace".into(), json!("physics"));
    meta.insert("uid".into(), json!(POD));
    meta.insert("resourceVersion".into(), json!("10"));
    meta.insert("creationTimestamp".into(), json!("2026-11-25T10:00:00Z"));
    pod["spec"]["nodeName"] = json!("cpu-01");
    pod["status"] =
        json!({"phase": "Running", "qosClass": "Guaranteed", "startTime": "2026-11-25T10:00:05Z"});
    let listed = pod.clone();
    let api = TestServer::start(
        true,
        Arc::new(move |req: &Request| match req.path() {
            "/apis/rbac.authorization.k8s.io/v1/rolebindings" => Response::json(
                200,
                json!({"items": [{"metadata": {"name": "edit", "namespace": "physics"},
                                  "subjects": [{"kind": "User", "name": "bob"}]}]}),
            ),
            "/api/v1/pods" if !req.target.contains("watch=1") => Response::json(
                200,
                json!({"kind": "PodList", "metadata": {"resourceVersion": "10"}, "items": [listed.clone()]}),
            ),
            "/api/v1/pods" => Response::raw(200, Vec::new()),
            _ => Response::json(404, json!({"kind": "Status", "code": 404})),
        }),
    );
    let (data, server) = common::kube_api::stats_server_of(&api, "t0ken");
    let path = format!("/api/v1/units?running&uuid={POD}&field=uuid&field=username&field=project");
    let mut mine = Value::Null;
    let start_at = std::time::Instant::now();
    while mine["data"].as_array().is_none_or(Vec::is_empty) {
        assert!(
            start_at.elapsed().as_secs() < 30,
            "alice never sees her pod: {mine}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
        mine = common::api_get(&server, &path, "alice");
    }
    assert_eq!(
        mine["data"],
        json!([{"uuid": POD, "username": "alice", "project": "physics"}])
    );
    assert_eq!(common::api_get(&server, &path, "bob")["data"], json!([]));

    // Through the lb (reading the stats-server's database): alice's query is relayed, bob's
    // is refused.
    let store = TestServer::start(
        false,
        Arc::new(|_: &Request| {
            Response::json(
                200,
                json!({"status": "success", "data": {"resultType": "vector", "result": []}}),
            )
        }),
    );
    let lb = common::start_subcommand(
        "lb",
        data.path(),
        &[
            &format!("--lb.backend=kube={}", store.url()),
            &format!("--storage.data.path={}", data.path().join("data").display()),
        ],
        &[],
    );
    let query = format!(
        "/kube/api/v1/query?query=ceems_compute_unit_cpu_user_seconds_total%7Buuid%3D%22{POD}%22%7D"
    );
    let status = |lb: &common::Running, user: &str| match ureq::get(&lb.url(&query))
        .set("X-Grafana-User", user)
        .call()
    {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(s, _)) => s,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(status(&lb, "alice"), 200);
    // bob shares the namespace's project (its RoleBinding), whose jobs the lb lets members
    // read, as CEEMS's does; a user of neither is refused.
    assert_eq!(status(&lb, "bob"), 200);
    assert_eq!(status(&lb, "carol"), 403);
    // A site that keeps each person's pods to them: bob, in the namespace, is refused too.
    let owner_only = common::start_subcommand(
        "lb",
        data.path(),
        &[
            &format!("--lb.backend=kube={}", store.url()),
            &format!("--storage.data.path={}", data.path().join("data").display()),
            "--lb.owner-only",
        ],
        &[],
    );
    assert_eq!(status(&owner_only, "alice"), 200);
    assert_eq!(status(&owner_only, "bob"), 403);
    assert_eq!(status(&owner_only, "carol"), 403);
}
