//! Stand-in BMCs over real HTTP(S) on 127.0.0.1. No Redfish emulator that serves chassis power
//! installs here (see shared/notes/bmc.md), so these serve DMTF-shaped documents: CEEMS's own
//! e2e mock (its fixture bodies, by its routes), and a BMC with a session service, basic auth,
//! stale-token 401s, TLS, and the legacy Power or the newer EnvironmentMetrics/PowerSubsystem
//! resources.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use super::http::{Request, Response, TestServer};

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

struct Shared {
    flavor: Flavor,
    watts: Mutex<f64>,
    tokens: Mutex<HashMap<String, u64>>,
    next_session: AtomicU64,
    logins: AtomicU64,
}

pub struct StandinBmc {
    pub port: u16,
    pub tls: bool,
    server: TestServer,
    shared: Arc<Shared>,
}

impl StandinBmc {
    /// A DMTF BMC with the legacy power model, admin/secret and sessions, drawing `watts`:
    /// what an exporter behind the proxy talks to.
    pub fn with_sessions(watts: f64, tls: bool) -> StandinBmc {
        let b = StandinBmc::start(
            Flavor::Dmtf {
                model: PowerModel::Legacy,
                credentials: ("admin".into(), "secret".into()),
                sessions: true,
            },
            tls,
        );
        b.set_watts(watts);
        b
    }

    pub fn start(flavor: Flavor, tls: bool) -> StandinBmc {
        let shared = Arc::new(Shared {
            flavor,
            watts: Mutex::new(420.0),
            tokens: Mutex::new(HashMap::new()),
            next_session: AtomicU64::new(1),
            logins: AtomicU64::new(0),
        });
        let s = Arc::clone(&shared);
        let server = TestServer::start(
            tls,
            Arc::new(move |req: &Request| match &s.flavor {
                Flavor::CeemsMock(dir) => ceems_mock(dir, req),
                Flavor::Dmtf {
                    model,
                    credentials,
                    sessions,
                } => dmtf(&s, *model, credentials, *sessions, req),
            }),
        );
        StandinBmc {
            port: server.port,
            tls,
            server,
            shared,
        }
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    pub fn set_watts(&self, w: f64) {
        *self.shared.watts.lock().unwrap() = w;
    }

    /// Every answer waits this long first (a slow or hung BMC).
    pub fn set_delay(&self, d: Duration) {
        self.server.set_delay(d);
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

    pub fn seen(&self) -> Vec<Request> {
        self.server.seen()
    }
}

/// CEEMS's e2e mock, by the rules of its `routes.tsv`.
fn ceems_mock(dir: &std::path::Path, req: &Request) -> Response {
    let path = req.path();
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
    Response::raw(404, "404 page not found\n")
}

fn authorised(s: &Shared, creds: &(String, String), req: &Request) -> bool {
    if let Some(t) = req.header("x-auth-token") {
        return s.tokens.lock().unwrap().contains_key(t);
    }
    if let Some(basic) = req
        .header("authorization")
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
    let path = req.path().trim_end_matches('/');
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
        return Response::json(
            201,
            json!({"@odata.id": location, "Id": n.to_string(), "UserName": creds.0}),
        )
        .with_header("X-Auth-Token", &token)
        .with_header("Location", &location);
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
            return Response::raw(204, "");
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
