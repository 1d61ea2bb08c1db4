//! The stats-server on an OpenStack cloud: Nova and Keystone stand-ins over real HTTPS on
//! 127.0.0.1, each with its own certificate (both trusted through one CA file), shaped like
//! the real services: tokens from `POST /v3/auth/tokens` in `X-Subject-Token`, servers listed
//! in pages whose `next` links name the cloud's public host, deleted servers on their own
//! query, users listed in pages. The cloud then revokes the token (a 401 forces a new one),
//! deletes a server between two pulls, loses one from both lists, and answers a malformed
//! page, which fails the pull and writes nothing of it.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::http::{Request, Response, TestServer};
use serde_json::{json, Value};

const SECRET: &str = "s3cret-app-credential";

/// What the stand-ins serve, changed by the test between pulls.
#[derive(Default)]
struct Cloud {
    /// The token Nova and Keystone accept now; empty: none (revoked).
    valid_token: String,
    tokens_issued: usize,
    running: Vec<Value>,
    deleted: Vec<Value>,
    /// Servers Nova answers only when asked for by id (`uuid=`), as for a report.
    by_id_only: Vec<Value>,
    /// The second page of servers is not JSON.
    malformed_page: bool,
    malformed_answered: usize,
}

fn nova_server(
    id: &str,
    user: &str,
    project: &str,
    status: &str,
    terminated: Option<&str>,
) -> Value {
    json!({
        "id": id, "name": format!("vm-{id}"), "status": status,
        "tenant_id": project, "user_id": user,
        "created": "2026-11-25T10:00:00Z", "updated": "2026-11-25T10:00:30Z",
        "OS-SRV-USG:launched_at": "2026-11-25T10:00:30.000000",
        "OS-SRV-USG:terminated_at": terminated,
        "OS-EXT-STS:power_state": 1, "OS-EXT-AZ:availability_zone": "nova",
        "OS-EXT-SRV-ATTR:reservation_id": format!("r-{id}"), "metadata": {}, "tags": [],
        "flavor": {"vcpus": 4, "ram": 8192, "disk": 20, "swap": "", "original_name": "g1.large",
                   "extra_specs": {"pci_passthrough:alias": "a100:1"}}
    })
}

fn authorized(cloud: &Cloud, req: &Request) -> bool {
    !cloud.valid_token.is_empty() && req.header("x-auth-token") == Some(cloud.valid_token.as_str())
}

fn keystone(cloud: Arc<Mutex<Cloud>>) -> TestServer {
    TestServer::start(
        true,
        Arc::new(move |req: &Request| {
            let mut c = cloud.lock().unwrap();
            let query = req.target.split_once('?').map_or("", |(_, q)| q);
            match (req.method.as_str(), req.path()) {
                ("POST", "/identity/v3/auth/tokens") => {
                    let body: Value = serde_json::from_slice(&req.body).unwrap_or_default();
                    let credential = &body["auth"]["identity"]["application_credential"];
                    if credential["secret"] != SECRET {
                        return Response::json(401, json!({"error": {"code": 401}}));
                    }
                    c.tokens_issued += 1;
                    c.valid_token = format!("token-{}", c.tokens_issued);
                    Response::json(
                        201,
                        json!({"token": {"expires_at": "2099-01-01T00:00:00.000000Z"}}),
                    )
                    .with_header("X-Subject-Token", &c.valid_token)
                }
                _ if !authorized(&c, req) => Response::json(401, json!({"error": {"code": 401}})),
                ("GET", "/identity/v3/users") if query.contains("marker=u1") => Response::json(
                    200,
                    json!({"users": [{"id": "u2", "name": "bob"}], "links": {"next": null}}),
                ),
                ("GET", "/identity/v3/users") => Response::json(
                    200,
                    json!({"users": [{"id": "u1", "name": "alice"}],
                           "links": {"next": "https://keystone.cloud.example/identity/v3/users?marker=u1"}}),
                ),
                ("GET", "/identity/v3/users/u1/projects") => Response::json(
                    200,
                    json!({"projects": [{"id": "p1", "name": "physics"}], "links": {"next": null}}),
                ),
                ("GET", "/identity/v3/users/u2/projects") => Response::json(
                    200,
                    json!({"projects": [{"id": "p2", "name": "chemistry"}], "links": {"next": null}}),
                ),
                _ => Response::raw(404, "not found"),
            }
        }),
    )
}

fn nova(cloud: Arc<Mutex<Cloud>>) -> TestServer {
    TestServer::start(
        true,
        Arc::new(move |req: &Request| {
            let mut c = cloud.lock().unwrap();
            if !authorized(&c, req) {
                return Response::json(401, json!({"error": {"code": 401}}));
            }
            if req.header("x-openstack-nova-api-version") != Some("latest") {
                return Response::json(400, json!({"error": "no flavor details without 2.47"}));
            }
            if req.path() != "/compute/v2.1/servers/detail" {
                return Response::raw(404, "not found");
            }
            let query: Vec<(String, String)> = form_urlencoded::parse(
                req.target.split_once('?').map_or("", |(_, q)| q).as_bytes(),
            )
            .into_owned()
            .collect();
            let has = |k: &str| query.iter().any(|(key, _)| key == k);
            if !query.iter().any(|(k, v)| k == "all_tenants" && v == "true") {
                return Response::json(200, json!({"servers": []}));
            }
            if let Some((_, id)) = query.iter().find(|(k, _)| k == "uuid") {
                let list = match has("deleted") {
                    true => &c.deleted,
                    false => &c.by_id_only,
                };
                let found: Vec<&Value> = list.iter().filter(|s| s["id"] == id.as_str()).collect();
                return Response::json(200, json!({"servers": found}));
            }
            if has("deleted") {
                assert!(
                    has("changes-since") && has("changes-before"),
                    "{}",
                    req.target
                );
                return Response::json(200, json!({"servers": c.deleted}));
            }
            // One server a page; the link names the cloud's public host.
            if !has("marker") {
                let first: Vec<Value> = c.running.iter().take(1).cloned().collect();
                let mut page = json!({"servers": first});
                if let Some(id) = first.first().and_then(|s| s["id"].as_str()) {
                    page["servers_links"] = json!([{"rel": "next",
                        "href": format!("https://nova.cloud.example/v2.1/servers/detail?all_tenants=true&marker={id}")}]);
                }
                return Response::json(200, page);
            }
            if c.malformed_page {
                c.malformed_answered += 1;
                return Response::raw(200, "{\"servers\": [{\"id\": ");
            }
            let rest: Vec<Value> = c.running.iter().skip(1).cloned().collect();
            Response::json(200, json!({"servers": rest}))
        }),
    )
}

/// The admin's view of every unit: uuid → (state, ended_at_ts (left out, 0, while it runs), user, project).
fn units(
    server: &common::Running,
) -> std::collections::BTreeMap<String, (String, i64, String, String)> {
    let answer = common::api_get(
        server,
        "/api/v1/units/admin?from=0&to=4000000000&running&field=uuid&field=state&field=ended_at_ts&field=username&field=project",
        "root",
    );
    answer["data"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|u| {
            (
                u["uuid"].as_str().unwrap_or("").to_owned(),
                (
                    u["state"].as_str().unwrap_or("").to_owned(),
                    u["ended_at_ts"].as_i64().unwrap_or(0),
                    u["username"].as_str().unwrap_or("").to_owned(),
                    u["project"].as_str().unwrap_or("").to_owned(),
                ),
            )
        })
        .collect()
}

fn wait_for(what: &str, log: &std::path::Path, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what}\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_clouds_servers_users_and_projects_are_pulled_through_its_apis() {
    let cloud = Arc::new(Mutex::new(Cloud {
        running: vec![
            nova_server("aaaa-1", "u1", "p1", "ACTIVE", None),
            nova_server("bbbb-2", "u2", "p2", "SUSPENDED", None),
        ],
        deleted: vec![nova_server(
            "cccc-3",
            "u1",
            "p1",
            "DELETED",
            Some("2026-11-25T11:00:30.000000"),
        )],
        ..Cloud::default()
    }));
    let (nova, keystone) = (nova(Arc::clone(&cloud)), keystone(Arc::clone(&cloud)));
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // The server drops to nobody when started as root.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let ca = dir.join("cloud-ca.pem");
    std::fs::write(&ca, format!("{}{}", nova.cert_pem, keystone.cert_pem)).unwrap();
    std::fs::set_permissions(&ca, std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = dir.join("ceems.toml");
    std::fs::write(
        &config,
        format!(
            "[stats-server.web]\nadmin-users = [\"root\"]\n\n[[stats-server.clusters]]\nid = \"cloud\"\nmanager = \"openstack\"\n\
             openstack-compute-url = \"{}/compute/v2.1\"\nopenstack-identity-url = \"{}/identity\"\nopenstack-ca-file = \"{}\"\n\
             openstack-auth = {{ identity = {{ methods = [\"application_credential\"], application_credential = {{ id = \"app-1\", secret = \"{SECRET}\" }} }} }}\n",
            nova.url(),
            keystone.url(),
            ca.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let data = dir.join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o777)).unwrap();
    let log = dir.join("server.log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_ceems"));
    command
        .args([
            "stats-server",
            &format!("--config.file={}", config.display()),
            &format!("--storage.data.path={}", data.display()),
            "--storage.update-interval=1s",
            "--log.level=debug",
        ])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let server = common::start_listening(command, "stats-server");

    // Both pages of servers and the deleted one, with Keystone's names.
    wait_for("the first pull", &log, || units(&server).len() == 3);
    let u = units(&server);
    assert_eq!(
        u["aaaa-1"],
        ("ACTIVE".into(), 0, "alice".into(), "physics".into())
    );
    assert_eq!(
        u["bbbb-2"],
        ("SUSPENDED".into(), 0, "bob".into(), "chemistry".into())
    );
    assert_eq!(u["cccc-3"].0, "DELETED");
    assert_eq!(u["cccc-3"].1, 1_795_604_430_000);
    // A user sees their own servers and their projects.
    let mine = common::api_get(
        &server,
        "/api/v1/units?from=0&to=4000000000&running&field=uuid&field=allocation",
        "alice",
    );
    let ids: Vec<&str> = mine["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|u| u["uuid"].as_str())
        .collect();
    assert_eq!(ids.len(), 2, "{mine}");
    assert!(ids.contains(&"aaaa-1") && ids.contains(&"cccc-3"), "{mine}");
    assert_eq!(mine["data"][0]["allocation"]["name"], "g1.large", "{mine}");
    let projects = common::api_get(&server, "/api/v1/projects", "alice");
    assert_eq!(projects["data"][0]["name"], "physics", "{projects}");
    // A report asked for before any pull listed the server: Nova is asked for that one.
    cloud
        .lock()
        .unwrap()
        .by_id_only
        .push(nova_server("eeee-5", "u2", "p2", "ACTIVE", None));
    let report = common::api_get(&server, "/report/cloud/eeee-5.json", "bob");
    assert_eq!(report["data"]["job"]["uuid"], "eeee-5", "{report}");

    // The token is revoked and bob's server deleted: a 401, a new token, the server ended.
    {
        let mut c = cloud.lock().unwrap();
        c.valid_token.clear();
        let gone = c.running.remove(1);
        let mut gone = gone;
        gone["status"] = json!("DELETED");
        gone["OS-SRV-USG:terminated_at"] = json!("2026-11-25T12:00:30.000000");
        c.deleted.push(gone);
    }
    wait_for("bob's server ended after a new token", &log, || {
        units(&server)
            .get("bbbb-2")
            .is_some_and(|u| u.1 == 1_795_608_030_000)
    });
    assert!(cloud.lock().unwrap().tokens_issued >= 2);
    // Later pulls' windows no longer list its deletion: its end stays when Nova said.
    cloud
        .lock()
        .unwrap()
        .deleted
        .retain(|s| s["id"] != "bbbb-2");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(units(&server)["bbbb-2"].1, 1_795_608_030_000);

    // A new server on the first page and a second page that is not JSON: the pull fails,
    // and nothing of it is written, not even the first page's server.
    {
        let mut c = cloud.lock().unwrap();
        c.running
            .insert(0, nova_server("dddd-4", "u2", "p2", "ACTIVE", None));
        c.malformed_page = true;
    }
    wait_for("two failed pulls", &log, || {
        cloud.lock().unwrap().malformed_answered >= 2
    });
    assert!(!units(&server).contains_key("dddd-4"));
    assert_eq!(
        units(&server)["aaaa-1"].1,
        0,
        "a failed pull closes nothing"
    );
    // Nova answers again, without alice's server in either list: it is closed when last seen.
    {
        let mut c = cloud.lock().unwrap();
        c.malformed_page = false;
        c.running.retain(|s| s["id"] != "aaaa-1");
    }
    wait_for("the new server and alice's closed", &log, || {
        let u = units(&server);
        u.contains_key("dddd-4") && u.get("aaaa-1").is_some_and(|a| a.1 > 0)
    });
    assert_eq!(units(&server)["aaaa-1"].0, "DELETED");

    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("not the answer expected"),
        "the malformed page is named"
    );
    for secret in [SECRET, "token-1", "token-2"] {
        assert!(!text.contains(secret), "`{secret}` is in the log");
    }

    // The credentials' file is readable by everyone: check-privileges says so, then not.
    let check = |mode: u32| {
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(mode)).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_ceems"))
            .args(["check-privileges", "--output=json", "stats-server"])
            .arg(format!("--config.file={}", config.display()))
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        report["parts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["part"] == "openstack credentials")
            .cloned()
            .unwrap_or_else(|| panic!("{report}"))
    };
    let open = check(0o644);
    assert_eq!(open["test"]["outcome"], "error", "{open}");
    assert!(
        open["test"]["error"]
            .as_str()
            .unwrap()
            .contains("chmod o-r"),
        "{open}"
    );
    assert_eq!(check(0o640)["test"]["outcome"], "ok");
}
