//! Stand-in BMCs over real HTTP(S) on 127.0.0.1. No Redfish emulator that serves chassis power
//! installs here (see shared/notes/bmc.md), so these serve DMTF-shaped documents: CEEMS's own
//! e2e mock (its fixture bodies, by its routes), and a BMC with a session service, basic auth,
//! stale-token 401s, TLS, and the legacy Power or the newer EnvironmentMetrics/PowerSubsystem
//! resources.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerModel {
    /// `Chassis/<id>/Power` with `PowerControl[]`.
    Legacy,
    /// `Chassis/<id>/EnvironmentMetrics` with `PowerWatts.Reading`.
    Environment,
    /// `Chassis/<id>/PowerSubsystem` → supplies → `InputPowerWatts.Reading`.
    Subsystem,
}

#[derive(Debug, Clone)]
pub enum Flavor {
    /// CEEMS's e2e mock: bodies from its fixture folder, no auth.
    CeemsMock(PathBuf),
    Dmtf {
        model: PowerModel,
        credentials: (String, String),
        sessions: bool,
    },
}

/// One request as the stand-in saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: HashMap<String, String>,
}

struct Shared {
    flavor: Flavor,
    watts: Mutex<f64>,
    delay: Mutex<Duration>,
    tokens: Mutex<HashMap<String, u64>>,
    next_session: AtomicU64,
    logins: AtomicU64,
    seen: Mutex<Vec<Seen>>,
    stop: AtomicBool,
}

pub struct StandinBmc {
    pub port: u16,
    pub tls: bool,
    shared: Arc<Shared>,
}

impl Drop for StandinBmc {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

impl StandinBmc {
    pub fn start(flavor: Flavor, tls: bool) -> StandinBmc {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind stand-in BMC");
        let port = listener.local_addr().expect("addr").port();
        let shared = Arc::new(Shared {
            flavor,
            watts: Mutex::new(420.0),
            delay: Mutex::new(Duration::ZERO),
            tokens: Mutex::new(HashMap::new()),
            next_session: AtomicU64::new(1),
            logins: AtomicU64::new(0),
            seen: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        });
        let tls_config = tls.then(server_tls);
        let s = Arc::clone(&shared);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(Ordering::Acquire) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let s = Arc::clone(&s);
                let tls_config = tls_config.clone();
                std::thread::spawn(move || {
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
                    match tls_config {
                        Some(cfg) => {
                            let Ok(server) = rustls::ServerConnection::new(cfg) else {
                                return;
                            };
                            let mut stream = rustls::StreamOwned::new(server, conn);
                            serve_one(&s, &mut stream);
                        }
                        None => {
                            let mut conn = conn;
                            serve_one(&s, &mut conn);
                        }
                    }
                });
            }
        });
        StandinBmc { port, tls, shared }
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    pub fn set_watts(&self, w: f64) {
        *self.shared.watts.lock().unwrap() = w;
    }

    /// Every answer waits this long first (a slow or hung BMC).
    pub fn set_delay(&self, d: Duration) {
        *self.shared.delay.lock().unwrap() = d;
    }

    /// Forgets every session, as a BMC reset does: the next request with a token gets 401.
    pub fn expire_sessions(&self) {
        self.shared.tokens.lock().unwrap().clear();
    }

    pub fn logins(&self) -> u64 {
        self.shared.logins.load(Ordering::Acquire)
    }

    pub fn live_sessions(&self) -> usize {
        self.shared.tokens.lock().unwrap().len()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().unwrap().clone()
    }
}

fn server_tls() -> Arc<rustls::ServerConfig> {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
        .expect("self-signed certificate");
    let der = cert.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![der], key)
        .expect("server certificate");
    Arc::new(cfg)
}

struct Request {
    method: String,
    path: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

fn read_request(stream: &mut dyn Read) -> Option<Request> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let path = parts.next()?.to_owned();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    let len: usize = headers
        .get("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len.min(1 << 20)];
    reader.read_exact(&mut body).ok()?;
    Some(Request {
        method,
        path,
        headers,
        body,
    })
}

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn json(status: u16, v: Value) -> Response {
        Response {
            status,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: v.to_string().into_bytes(),
        }
    }

    fn raw(status: u16, body: Vec<u8>) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body,
        }
    }
}

fn serve_one<S: Read + Write>(s: &Shared, stream: &mut S) {
    let Some(req) = read_request(stream) else {
        return;
    };
    s.seen.lock().unwrap().push(Seen {
        method: req.method.clone(),
        path: req.path.clone(),
        headers: req.headers.clone(),
    });
    let delay = *s.delay.lock().unwrap();
    if !delay.is_zero() {
        std::thread::sleep(delay);
    }
    let resp = match &s.flavor {
        Flavor::CeemsMock(dir) => ceems_mock(dir, &req),
        Flavor::Dmtf {
            model,
            credentials,
            sessions,
        } => dmtf(s, *model, credentials, *sessions, &req),
    };
    let mut head = format!(
        "HTTP/1.1 {} X\r\nContent-Length: {}\r\nConnection: close\r\n",
        resp.status,
        resp.body.len()
    );
    for (k, v) in &resp.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(&resp.body);
    let _ = stream.flush();
}

/// CEEMS's e2e mock, by the rules of its `routes.tsv`.
fn ceems_mock(dir: &std::path::Path, req: &Request) -> Response {
    let path = req.path.split('?').next().unwrap_or("");
    let file = |name: String| match std::fs::read(dir.join(&name)) {
        Ok(b) => Response::raw(200, b),
        Err(_) => Response::raw(
            500,
            std::fs::read(dir.join("error_body.txt")).unwrap_or_default(),
        ),
    };
    let id_file = |id: &str| id.to_lowercase().replace('-', "_");
    if path == "/redfish/v1/Chassis" {
        return file("chassis_collection.json".into());
    }
    if let Some(rest) = path.strip_prefix("/redfish/v1/Chassis/") {
        if let Some(id) = rest.strip_suffix("/Power") {
            if !id.contains('/') {
                return file(format!("{}_power.json", id_file(id)));
            }
        } else if !rest.contains('/') && !rest.is_empty() {
            return file(format!("{}.json", id_file(rest)));
        }
    }
    if path.starts_with("/redfish/v1/") {
        return file("service_root.json".into());
    }
    Response::raw(404, b"404 page not found\n".to_vec())
}

fn authorised(s: &Shared, creds: &(String, String), req: &Request) -> bool {
    if let Some(t) = req.headers.get("x-auth-token") {
        return s.tokens.lock().unwrap().contains_key(t);
    }
    if let Some(basic) = req
        .headers
        .get("authorization")
        .and_then(|a| a.strip_prefix("Basic "))
    {
        use base64::Engine as _;
        let want =
            base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", creds.0, creds.1));
        return basic == want;
    }
    false
}

fn dmtf(
    s: &Shared,
    model: PowerModel,
    creds: &(String, String),
    sessions: bool,
    req: &Request,
) -> Response {
    let path = req
        .path
        .split('?')
        .next()
        .unwrap_or("")
        .trim_end_matches('/');
    let sessions_path = "/redfish/v1/SessionService/Sessions";
    // The service root is readable without credentials, as the standard says.
    if path == "/redfish/v1" {
        return Response::json(
            200,
            json!({
                "@odata.id": "/redfish/v1/",
                "@odata.type": "#ServiceRoot.v1_15_0.ServiceRoot",
                "Id": "RootService",
                "RedfishVersion": "1.15.0",
                "Chassis": {"@odata.id": "/redfish/v1/Chassis"},
                "SessionService": {"@odata.id": "/redfish/v1/SessionService"},
                "Links": {"Sessions": {"@odata.id": sessions_path}},
            }),
        );
    }
    if path == sessions_path && req.method == "POST" {
        if !sessions {
            return Response::json(405, json!({"error": {"message": "sessions disabled"}}));
        }
        let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let ok = body["UserName"] == creds.0.as_str() && body["Password"] == creds.1.as_str();
        if !ok {
            return Response::json(401, json!({"error": {"message": "bad credentials"}}));
        }
        s.logins.fetch_add(1, Ordering::AcqRel);
        let n = s.next_session.fetch_add(1, Ordering::AcqRel);
        let token = format!("token-{n}-{}", std::process::id());
        s.tokens.lock().unwrap().insert(token.clone(), n);
        let location = format!("{sessions_path}/{n}");
        let mut r = Response::json(
            201,
            json!({"@odata.id": location, "Id": n.to_string(), "UserName": creds.0}),
        );
        r.headers.push(("X-Auth-Token".into(), token));
        r.headers.push(("Location".into(), location));
        return r;
    }
    if !authorised(s, creds, req) {
        return Response::json(
            401,
            json!({"error": {"message": "authentication required"}}),
        );
    }
    if req.method == "DELETE" {
        if let Some(n) = path.strip_prefix(&format!("{sessions_path}/")) {
            let n: u64 = n.parse().unwrap_or(0);
            s.tokens.lock().unwrap().retain(|_, v| *v != n);
            return Response::raw(204, Vec::new());
        }
    }
    let watts = *s.watts.lock().unwrap();
    let chassis = "/redfish/v1/Chassis/1U";
    match path {
        "/redfish/v1/Chassis" => Response::json(
            200,
            json!({
                "@odata.id": "/redfish/v1/Chassis",
                "Members@odata.count": 1,
                "Members": [{"@odata.id": chassis}],
            }),
        ),
        p if p == chassis => {
            let mut doc =
                json!({"@odata.id": chassis, "Id": "1U", "Name": "Computer System Chassis"});
            match model {
                PowerModel::Legacy => {
                    doc["Power"] = json!({"@odata.id": format!("{chassis}/Power")})
                }
                PowerModel::Environment => {
                    doc["EnvironmentMetrics"] =
                        json!({"@odata.id": format!("{chassis}/EnvironmentMetrics")})
                }
                PowerModel::Subsystem => {
                    doc["PowerSubsystem"] =
                        json!({"@odata.id": format!("{chassis}/PowerSubsystem")})
                }
            }
            Response::json(200, doc)
        }
        p if p == format!("{chassis}/Power") && model == PowerModel::Legacy => Response::json(
            200,
            json!({
                "@odata.id": p,
                "PowerControl": [{
                    "MemberId": "0",
                    "PowerConsumedWatts": watts,
                    "PowerMetrics": {
                        "IntervalInMin": 1,
                        "MinConsumedWatts": watts - 20.0,
                        "MaxConsumedWatts": watts + 30.0,
                        "AverageConsumedWatts": watts - 5.0,
                    },
                }],
            }),
        ),
        p if p == format!("{chassis}/EnvironmentMetrics") && model == PowerModel::Environment => {
            Response::json(
                200,
                json!({"@odata.id": p, "PowerWatts": {"Reading": watts}}),
            )
        }
        p if p == format!("{chassis}/PowerSubsystem") && model == PowerModel::Subsystem => {
            Response::json(
                200,
                json!({"@odata.id": p, "PowerSupplies": {"@odata.id": format!("{p}/PowerSupplies")}}),
            )
        }
        p if p == format!("{chassis}/PowerSubsystem/PowerSupplies") => Response::json(
            200,
            json!({"Members": [{"@odata.id": format!("{p}/0")}, {"@odata.id": format!("{p}/1")}]}),
        ),
        p if p.starts_with(&format!("{chassis}/PowerSubsystem/PowerSupplies/")) => {
            if let Some(base) = p.strip_suffix("/Metrics") {
                let _ = base;
                Response::json(200, json!({"InputPowerWatts": {"Reading": watts / 2.0}}))
            } else {
                Response::json(
                    200,
                    json!({"@odata.id": p, "Metrics": {"@odata.id": format!("{p}/Metrics")}}),
                )
            }
        }
        _ => Response::json(404, json!({"error": {"message": "no such resource"}})),
    }
}
