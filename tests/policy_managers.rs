//! A policy's cancel through each manager's own tool, end to end through the stats-server:
//! LSF's `bkill` (a stand-in command that logs its arguments), the Kubernetes API (a stand-in
//! API server that records the DELETE it is sent) and OpenPBS's real `qdel` on the PBS lab
//! (`scripts/openpbs-lab.sh`), with a Prometheus stand-in that answers every job's use as 0.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use common::http::{Request, Response, TestServer};
use common::lab::wait_until;
use serde_json::json;

/// Prometheus's query API, answering each job of a GPU-use query with one idle GPU and no
/// other series (no power data).
fn prometheus() -> TestServer {
    TestServer::start(
        false,
        Arc::new(|req: &Request| {
            let query = form_urlencoded::parse(&req.body)
                .find(|(k, _)| k == "query")
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default();
            let ids = query
                .split("uuid=~\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or_default()
                .replace("\\\\", "");
            let usage = query.contains("ceems_gpu_usage") || query.contains("ceems_cpu_usage");
            let result: Vec<serde_json::Value> = match usage {
                true => ids
                    .split('|')
                    .map(|id| json!({"metric": {"uuid": id, "gpuuuid": "GPU-0"}, "value": [1.8e9, "0"]}))
                    .collect(),
                false => Vec::new(),
            };
            Response::json(
                200,
                json!({"status": "success", "data": {"resultType": "vector", "result": result}}),
            )
        }),
    )
}

const POLICY: &str = "[[stats-server.policies]]\nname = \"idle-gpus\"\nwarn-after = [\"1s\", \"2s\"]\ncancel-after = \"3s\"\ndry-run = false\nadmins = [\"ops@example.org\"]\n";

fn start(dir: &Path, config: &str, prometheus: &TestServer) -> common::Running {
    let file = dir.join("ceems.toml");
    std::fs::write(&file, config).unwrap();
    common::start_subcommand(
        "stats-server",
        dir,
        &[
            &format!("--config.file={}", file.display()),
            &format!("--storage.data.path={}", dir.join("data").display()),
            &format!("--prometheus.url={}", prometheus.url()),
            &format!("--notify.eml-dir={}", dir.join("eml").display()),
            "--storage.update-interval=1s",
            "--policy.interval=1s",
            "--web.admin-users=root",
        ],
        &[],
    )
}

/// Subjects of the messages written, sorted.
fn subjects(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir.join("eml"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let text = std::fs::read_to_string(e.path()).ok()?;
                    let s = text.lines().find_map(|l| l.strip_prefix("Subject: "))?;
                    s.starts_with("[ceems").then(|| s.to_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

fn scratch() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    // The server drops to nobody when started as root.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    tmp
}

const BJOBS: &str = r#"{"COMMAND":"bjobs","JOBS":1,"RECORDS":[
 {"JOBID":"8001","JOBINDEX":"0","USER":"alice","USER_GROUP":"phys","QUEUE":"gpu","JOB_NAME":"train","PROJ_NAME":"physics","STAT":"RUN","ALLOC_SLOT":"cn01:cn01","NALLOC_SLOT":"2","SUBMIT_TIME":"Nov 25 10:00:00 2026","START_TIME":"Nov 25 10:00:30 2026","RUN_TIME":"90 second(s)","GPU_NUM":"1","MEM":"1 Gbytes","MEMLIMIT":"","MEM_EFFICIENCY":"50.00%","EXEC_CWD":"/home/alice","RUNTIMELIMIT":""}
]}"#;

#[test]
fn lsf_jobs_are_ended_with_bkill_naming_their_owner_once() {
    let tmp = scratch();
    let dir = tmp.path();
    let bin = dir.join("lsf-bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(dir.join("bjobs.json"), BJOBS).unwrap();
    for (name, body) in [
        (
            "bjobs",
            format!("exec /bin/cat '{}'", dir.join("bjobs.json").display()),
        ),
        ("bacct", "exit 0".to_owned()),
        (
            "bkill",
            format!(
                "echo \"$@\" >> '{}'\necho \"Job <$3> is being terminated\"",
                dir.join("bkill.args").display()
            ),
        ),
    ] {
        let path = bin.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let prom = prometheus();
    let config = format!(
        "[[stats-server.clusters]]\nid = \"lsf1\"\nmanager = \"lsf\"\nlsf-bin-dir = \"{}\"\n\n{POLICY}",
        bin.display()
    );
    let server = start(dir, &config, &prom);
    let args = dir.join("bkill.args");
    wait_until("bkill", Duration::from_secs(60), || args.exists());
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        std::fs::read_to_string(&args).unwrap(),
        "-u alice 8001\n",
        "one bkill, naming the owner"
    );
    let sent = subjects(dir);
    assert_eq!(
        sent.iter()
            .filter(|s| s.starts_with("[ceems] Job 8001"))
            .count(),
        3,
        "{sent:?}"
    );
    let units = common::api_get(
        &server,
        "/api/v1/units?cluster_id=lsf1&uuid=8001&field=uuid&field=actions",
        "alice",
    );
    let actions = &units["data"][0]["actions"];
    assert_eq!(actions[2]["outcome"], "cancelled", "{units}");
    assert_eq!(
        actions[2]["detail"], "Job <8001> is being terminated",
        "{units}"
    );
}

#[test]
fn pods_are_deleted_through_the_api_with_their_uid_as_precondition_once() {
    const UID: &str = "aaaaaaaa-0000-4000-8000-000000000001";
    let pod = json!({
        "kind": "Pod",
        "metadata": {"name": "trainer-0", "namespace": "ml", "uid": UID, "resourceVersion": "90",
                     "creationTimestamp": "2026-11-25T10:00:00Z",
                     "annotations": {"ceems.io/created-by": "alice"}},
        "spec": {"nodeName": "gpu-01", "containers": [
            {"resources": {"limits": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running", "qosClass": "Burstable", "startTime": "2026-11-25T10:00:10Z"}
    });
    let api = TestServer::start(
        true,
        Arc::new(move |req: &Request| {
            if req.header("authorization") != Some("Bearer s3cret") {
                return Response::json(401, json!({"kind": "Status", "code": 401}));
            }
            match (req.method.as_str(), req.path()) {
                ("GET", "/api/v1/pods") if !req.target.contains("watch=1") => Response::json(
                    200,
                    json!({"kind": "PodList", "metadata": {"resourceVersion": "100"}, "items": [pod.clone()]}),
                ),
                ("GET", "/api/v1/pods") => Response::raw(200, Vec::new()),
                ("GET", "/apis/rbac.authorization.k8s.io/v1/rolebindings") => {
                    Response::json(200, json!({"items": []}))
                }
                ("DELETE", "/api/v1/namespaces/ml/pods/trainer-0") => {
                    Response::json(200, pod.clone())
                }
                _ => Response::json(404, json!({"kind": "Status", "code": 404})),
            }
        }),
    );
    let tmp = scratch();
    let dir = tmp.path();
    let kubeconfig = dir.join("kubeconfig.yml");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nclusters:\n- name: lab\n  cluster:\n    server: {}\n    certificate-authority-data: {}\ncontexts:\n- name: lab\n  context: {{cluster: lab, user: ceems}}\ncurrent-context: lab\nusers:\n- name: ceems\n  user: {{token: s3cret}}\n",
            api.url(),
            base64::engine::general_purpose::STANDARD.encode(&api.cert_pem)
        ),
    )
    .unwrap();
    std::fs::set_permissions(&kubeconfig, std::fs::Permissions::from_mode(0o644)).unwrap();
    let prom = prometheus();
    let config = format!(
        "[[stats-server.clusters]]\nid = \"kube\"\nmanager = \"k8s\"\nkubeconfig = \"{}\"\n\n{POLICY}",
        kubeconfig.display()
    );
    let _server = start(dir, &config, &prom);
    let deletes = || -> Vec<Request> {
        api.seen()
            .into_iter()
            .filter(|r| r.method == "DELETE")
            .collect()
    };
    wait_until("the pod's deletion", Duration::from_secs(60), || {
        !deletes().is_empty()
    });
    std::thread::sleep(Duration::from_secs(3));
    let sent = deletes();
    assert_eq!(sent.len(), 1, "deleted once");
    assert_eq!(sent[0].path(), "/api/v1/namespaces/ml/pods/trainer-0");
    let body: serde_json::Value = serde_json::from_slice(&sent[0].body).unwrap();
    assert_eq!(body["preconditions"]["uid"], UID, "{body}");
    assert_eq!(body["kind"], "DeleteOptions");
    let subjects = subjects(dir);
    assert!(
        subjects
            .iter()
            .any(|s| s.contains(&format!("Job {UID} was cancelled"))),
        "{subjects:?}"
    );
}

/// A CPU job of alice's on the real PBS complex, idle (a sleep): a CPU policy ends it with
/// the real qdel, run by the stats-server as root (a PBS manager).
#[test]
fn pbs_jobs_are_ended_with_the_real_qdel_once() {
    use common::lab::lab_script;
    if !common::runnable("policy_openpbs_lab", lab_script("openpbs-lab.sh")) {
        return;
    }
    const PBS_BIN: &str = "/opt/pbs/bin";
    let pbs = |user: &str, program: &str, args: &[&str]| -> String {
        let out = std::process::Command::new("runuser")
            .args(["-u", user, "--", &format!("{PBS_BIN}/{program}")])
            .args(args)
            .current_dir("/tmp")
            .output()
            .expect("runuser");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let job = pbs(
        "alice",
        "qsub",
        &[
            "-N",
            "idle",
            "-l",
            "select=1:ncpus=1",
            "-l",
            "walltime=00:05:00",
            "-o",
            "/dev/null",
            "-e",
            "/dev/null",
            "--",
            "/bin/sleep",
            "300",
        ],
    );
    assert!(!job.is_empty(), "qsub gave no id");
    struct Qdel(String);
    impl Drop for Qdel {
        fn drop(&mut self) {
            let _ = std::process::Command::new(format!("{PBS_BIN}/qdel"))
                .arg(&self.0)
                .status();
        }
    }
    let _qdel = Qdel(job.clone());
    let state = || -> String {
        let out = pbs("root", "qstat", &["-x", "-f", "-F", "json", &job]);
        serde_json::from_str::<serde_json::Value>(&out)
            .ok()
            .and_then(|v| v["Jobs"][&job]["job_state"].as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    wait_until("the PBS job running", Duration::from_secs(60), || {
        state() == "R"
    });
    let tmp = scratch();
    let dir = tmp.path();
    let prom = prometheus();
    let config = format!(
        "[[stats-server.clusters]]\nid = \"pbslab\"\nmanager = \"openpbs\"\nopenpbs-accounting-dir = \"/var/spool/pbs/server_priv/accounting\"\nopenpbs-bin-dir = \"{PBS_BIN}\"\n\n[[stats-server.policies]]\nname = \"idle-cores\"\nresource = \"cpu\"\nmax-gpus = 0\nwarn-after = [\"2s\"]\ncancel-after = \"4s\"\ndry-run = false\n"
    );
    let file = dir.join("ceems.toml");
    std::fs::write(&file, config).unwrap();
    let server = common::start_subcommand(
        "stats-server",
        dir,
        &[
            &format!("--config.file={}", file.display()),
            &format!("--storage.data.path={}", dir.join("data").display()),
            &format!("--prometheus.url={}", prom.url()),
            &format!("--notify.eml-dir={}", dir.join("eml").display()),
            "--storage.update-interval=1s",
            "--storage.first-window=1h",
            "--policy.interval=1s",
            "--web.admin-users=root",
            "--security.drop-privileges=false",
        ],
        &[],
    );
    let seen = || {
        common::api_get(&server, &format!("/api/v1/units?cluster_id=pbslab&uuid={job}&field=uuid&field=started_at_ts&field=state&field=actions&field=alloc_gpus"), "alice")
    };
    let start = std::time::Instant::now();
    while !matches!(state().as_str(), "F" | "E") {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no qdel: {} at {:?}",
            seen(),
            std::time::SystemTime::now()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    std::thread::sleep(Duration::from_secs(3));
    let units = common::api_get(
        &server,
        &format!("/api/v1/units?cluster_id=pbslab&uuid={job}&field=uuid&field=actions"),
        "alice",
    );
    let actions = units["data"][0]["actions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let outcomes: Vec<(&str, &str)> = actions
        .iter()
        .map(|a| {
            (
                a["action"].as_str().unwrap_or(""),
                a["outcome"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [("warn", "mailed"), ("cancel", "cancelled")],
        "{units}"
    );
    let history = pbs("root", "tracejob", &["-n", "1", &job]);
    assert!(
        history.contains("delete") || history.contains("Delete"),
        "{history}"
    );
    assert_eq!(
        subjects(dir)
            .iter()
            .filter(|s| s.contains(&format!("Job {job} was cancelled")))
            .count(),
        1
    );
}

/// A policy that cannot work stops the start and says why, naming the key.
#[test]
fn a_malformed_or_unmailable_policy_stops_the_start_naming_why() {
    let tmp = scratch();
    let refused = |policy: &str| -> String {
        let file = tmp.path().join("ceems.toml");
        std::fs::write(&file, policy).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ceems"))
            .args(["stats-server", &format!("--config.file={}", file.display())])
            .arg(format!(
                "--storage.data.path={}",
                tmp.path().join("data").display()
            ))
            .arg(format!(
                "--web.listen-address=127.0.0.1:{}",
                common::free_port()
            ))
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = refused("[[stats-server.policies]]\nname = \"idle\"\nwarn-after = [\"an hour\"]\n");
    assert!(
        err.contains("policies[0].warn-after") && err.contains("an hour"),
        "{err}"
    );
    let err = refused("[[stats-server.policies]]\nname = \"idle\"\ndry-run = false\n");
    assert!(
        err.contains("`idle` mails users or admins, but no mail is set up"),
        "{err}"
    );
}
