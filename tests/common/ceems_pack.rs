//! Stand-ins of the mock servers of CEEMS's API e2e pack (`scripts/mock_servers`), over
//! HTTP as its README describes them, and the pack's API server config pointed at them.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// FNV-1a, 32 bits: the pack's mock Prometheus makes each unit's values from its uuid's.
pub fn fnv1a32(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The pack's mock Prometheus (`scripts/mock_servers`, mode `prom`): each queried unit's
/// value made from its uuid, by the metric name before the selector; a range query gets four
/// samples ten seconds apart. Like CEEMS's mock it serves only `/api/v1/`: no `/-/ready`. As
/// v0.16's mock answers cacct's queries, the ids may be quoted with backticks and the metric
/// is the first selector's, whatever functions wrap it.
pub fn mock_prometheus() -> super::http::TestServer {
    use super::http::{Request, Response};
    let uuids =
        regex::Regex::new(r#"(?:.+?)[^gpu]uuid=[~]{0,1}["`]([a-zA-Z0-9-|]+)["`](?:.*)"#).unwrap();
    let name = regex::Regex::new(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{").unwrap();
    // Its configuration, as the pack's lb scenario shows it passed through.
    let config = std::fs::read(
        super::fixtures().join("ceems-api/pkg/lb/testdata/output/e2e-test-lb-server-tsdb-only.txt"),
    )
    .unwrap();
    super::http::TestServer::start(
        false,
        std::sync::Arc::new(move |req: &Request| {
            let query = match req.method.as_str() {
                "GET" => req
                    .target
                    .split_once('?')
                    .map(|(_, q)| q.to_owned())
                    .unwrap_or_default(),
                _ => String::from_utf8_lossy(&req.body).into_owned(),
            };
            let promql = form_urlencoded::parse(query.as_bytes())
                .find(|(k, _)| k == "query")
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default();
            if req.path() == "/api/v1/status/config" {
                return Response::raw(200, config.clone());
            }
            let range = match req.path() {
                "/api/v1/query" => false,
                "/api/v1/query_range" => true,
                _ => return Response::raw(404, "404 page not found\n"),
            };
            let metric = name
                .captures(&promql)
                .map(|c| c[1].to_owned())
                .unwrap_or_default();
            let ids: Vec<String> = uuids
                .captures_iter(&promql)
                .flat_map(|c| c[1].split('|').map(str::to_owned).collect::<Vec<_>>())
                .collect();
            let value = |h: u32| -> Option<String> {
                let h = u64::from(h);
                let digits = h.to_string().len() as i32;
                Some(match metric.as_str() {
                    "avg_cpu_usage"
                    | "avg_cpu_mem_usage"
                    | "avg_gpu_usage"
                    | "avg_gpu_mem_usage"
                    | "total_cpu_energy_usage_kwh"
                    | "total_gpu_energy_usage_kwh"
                    | "total_cpu_emissions_gms"
                    | "total_gpu_emissions_gms" => (h as f64 / 10f64.powi(digits - 2)).to_string(),
                    "total_io_read_stats_bytes" | "total_io_write_stats_bytes" => h.to_string(),
                    "total_io_read_stats_requests" | "total_io_write_stats_requests" => {
                        (h * 10).to_string()
                    }
                    "total_ingress_stats_bytes" | "total_egress_stats_bytes" => {
                        (h * 100).to_string()
                    }
                    "total_ingress_stats_packets" | "total_egress_stats_packets" => {
                        (h * 1000).to_string()
                    }
                    _ => return None,
                })
            };
            let result: Option<Vec<Value>> = ids
                .iter()
                .map(|id| {
                    value(fnv1a32(id)).map(|v| match range {
                        false => serde_json::json!({"metric": {"instance": "localhost:9090", "uuid": id},
                                                    "value": [12345, v]}),
                        true => serde_json::json!({"metric": {"instance": "localhost:9090", "uuid": id},
                                                   "values": [[12345, v], [12355, v], [12365, v], [12375, v]]}),
                    })
                })
                .collect();
            let (status, kind) = match (range, result.is_some()) {
                (false, _) => ("success", "vector"),
                (true, true) => ("success", "matrix"),
                (true, false) => ("fail", "matrix"),
            };
            // Go's encoder ends the body with a newline.
            let mut answer = Response::json(
                200,
                serde_json::json!({"status": status,
                                   "data": {"result": result, "resultType": kind}}),
            );
            answer.body.push(b'\n');
            answer
        }),
    )
}

/// The pack's Kubernetes API stand-in (`scripts/mock_servers`, mode `k8s-api`): its pod list
/// (whose metadata has no `resourceVersion`) for every `/api/v1/pods`, a watch too, as
/// CEEMS's mock answers, and its RoleBindings.
pub fn mock_kubernetes() -> super::http::TestServer {
    use super::http::{Request, Response};
    let dir = super::fixtures().join("ceems-api/pkg/collector/testdata/k8s");
    let body = |name: &str| std::fs::read(dir.join(name)).unwrap();
    let (pods, bindings) = (body("pods-metadata.json"), body("rolebindings.json"));
    super::http::TestServer::start(
        false,
        std::sync::Arc::new(move |req: &Request| match req.path() {
            "/api/v1/pods" => Response::raw(200, pods.clone()),
            "/apis/rbac.authorization.k8s.io/v1/rolebindings" => {
                Response::raw(200, bindings.clone())
            }
            _ => Response::raw(404, "404 page not found\n"),
        }),
    )
}

/// The pack's Nova stand-in (`scripts/mock_servers`, mode `os-compute`): its deleted servers
/// when the query asks for them, else its thirteen others, for a request with the token its
/// Keystone gave.
pub fn mock_nova() -> super::http::TestServer {
    use super::http::{Request, Response};
    let dir = super::fixtures().join("ceems-api/pkg/api/testdata/openstack/compute");
    let body = |name: &str| std::fs::read(dir.join(name)).unwrap();
    let (servers, deleted) = (body("servers.json"), body("deleted.json"));
    super::http::TestServer::start(
        false,
        std::sync::Arc::new(move |req: &Request| {
            if req.header("x-auth-token") != Some("apitokensecret") {
                return Response::raw(401, "KO");
            }
            let query = req.target.split_once('?').map_or("", |(_, q)| q);
            let asks_deleted =
                form_urlencoded::parse(query.as_bytes()).any(|(k, _)| k == "deleted");
            match (req.path(), asks_deleted) {
                ("/v2.1/servers/detail", true) => Response::raw(200, deleted.clone()),
                ("/v2.1/servers/detail", false) => Response::raw(200, servers.clone()),
                _ => Response::raw(404, "404 page not found\n"),
            }
        }),
    )
}

/// The pack's Keystone stand-in (mode `os-identity`): a token for any JSON body, its users,
/// and each user's projects.
pub fn mock_keystone() -> super::http::TestServer {
    use super::http::{Request, Response};
    let dir = super::fixtures().join("ceems-api/pkg/api/testdata/openstack/identity");
    super::http::TestServer::start(
        false,
        std::sync::Arc::new(move |req: &Request| {
            let path = req.path().to_owned();
            if path == "/v3/auth/tokens" {
                return match serde_json::from_slice::<Value>(&req.body) {
                    Ok(_) => {
                        Response::raw(201, "").with_header("X-Subject-Token", "apitokensecret")
                    }
                    Err(_) => Response::raw(200, "KO"),
                };
            }
            let file = match path.strip_prefix("/v3/users") {
                Some("") => "users".to_owned(),
                Some(rest) => match rest
                    .strip_prefix('/')
                    .and_then(|r| r.strip_suffix("/projects"))
                {
                    Some(id) => id.to_owned(),
                    None => return Response::raw(404, "404 page not found\n"),
                },
                None => return Response::raw(404, "404 page not found\n"),
            };
            match std::fs::read(dir.join(format!("{file}.json"))) {
                Ok(body) => Response::raw(200, body),
                Err(_) => Response::raw(500, "KO"),
            }
        }),
    )
}

/// The pack's stand-ins for one server's run: its Prometheus, Kubernetes, Nova and Keystone.
pub struct Mocks {
    pub prometheus: super::http::TestServer,
    pub kubernetes: super::http::TestServer,
    pub nova: super::http::TestServer,
    pub keystone: super::http::TestServer,
}

impl Mocks {
    pub fn start() -> Mocks {
        Mocks {
            prometheus: mock_prometheus(),
            kubernetes: mock_kubernetes(),
            nova: mock_nova(),
            keystone: mock_keystone(),
        }
    }
}

/// The pack's `config.yml` as its e2e script writes it (data in `dir/data`, which the server
/// makes for the user it runs as), the mocks' URLs in place of localhost's ports (a
/// kubeconfig written in `dir`).
pub fn pack_config(dir: &Path, mocks: &Mocks) -> PathBuf {
    pack_config_of("ceems-api", dir, mocks)
}

/// The API server config of `pack` (`ceems-api`, v0.10.2's, or `ceems-v0.16`) pointed at the
/// stand-ins, written into `dir`; its `cli.path` is the pack's, relative to the pack's root.
pub fn pack_config_of(pack: &str, dir: &Path, mocks: &Mocks) -> PathBuf {
    let config = super::fixtures()
        .join(pack)
        .join("pkg/api/testdata/config.yml");
    let pack = super::fixtures().join("ceems-api/pkg/api/testdata");
    let kubeconfig = dir.join("kubeconfig.yaml");
    std::fs::write(
        &kubeconfig,
        std::fs::read_to_string(pack.join("k8s/kubeconfig.yaml"))
            .unwrap()
            .replace("http://localhost:9080", &mocks.kubernetes.url()),
    )
    .unwrap();
    std::fs::set_permissions(&kubeconfig, std::fs::Permissions::from_mode(0o644)).unwrap();
    let text = std::fs::read_to_string(config)
        .unwrap()
        .replace("TO_REPLACE", &dir.join("data").display().to_string())
        .replace("http://localhost:9090", &mocks.prometheus.url())
        .replace("http://localhost:8080", &mocks.nova.url())
        .replace("http://localhost:7070", &mocks.keystone.url())
        .replace(
            "pkg/api/testdata/k8s/kubeconfig.yaml",
            &kubeconfig.display().to_string(),
        );
    let path = dir.join("config.yml");
    std::fs::write(&path, text).unwrap();
    // Started as root, the server reads it as nobody.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
}
