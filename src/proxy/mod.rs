//! The Redfish proxy: lets exporters on compute nodes reach their BMC on a management network,
//! and nothing else. A request is relayed only to a configured BMC, only for an allow-listed
//! read-only power path (plus session login and logout), with the client's own `Authorization`
//! and the routing header removed.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response, StatusCode};
use ipnet::IpNet;

use crate::web::client::{self, Timeouts};
use crate::web::REDFISH_URL_HEADER;
use crate::web::{Body, PeerAddr};

/// Paths relayed when the operator lists none: the service root, sessions, and the chassis
/// power resources. `*` stands for exactly one path segment.
pub const DEFAULT_ALLOWED: &[&str] = &[
    "/redfish/v1",
    "/redfish/v1/SessionService/Sessions",
    "/redfish/v1/SessionService/Sessions/*",
    "/redfish/v1/Sessions",
    "/redfish/v1/Sessions/*",
    "/redfish/v1/Chassis",
    "/redfish/v1/Chassis/*",
    "/redfish/v1/Chassis/*/Power",
    "/redfish/v1/Chassis/*/PowerSubsystem",
    "/redfish/v1/Chassis/*/PowerSubsystem/PowerSupplies",
    "/redfish/v1/Chassis/*/PowerSubsystem/PowerSupplies/*",
    "/redfish/v1/Chassis/*/PowerSubsystem/PowerSupplies/*/Metrics",
    "/redfish/v1/Chassis/*/EnvironmentMetrics",
];

/// Request headers passed on to the BMC; everything else (Authorization, X-Redfish-Url,
/// hop-by-hop headers, cookies) stays here.
const FORWARDED_REQUEST_HEADERS: &[&str] = &[
    "accept",
    "content-type",
    "x-auth-token",
    "odata-version",
    "if-none-match",
];
/// Response headers passed back to the exporter.
const FORWARDED_RESPONSE_HEADERS: &[&str] = &[
    "content-type",
    "x-auth-token",
    "location",
    "etag",
    "odata-version",
];

/// Largest request body relayed (a session login is ~100 bytes).
const MAX_REQUEST_BODY: usize = 64 << 10;
/// Largest BMC response relayed.
const MAX_RESPONSE_BODY: u64 = 4 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProxyConfigError {
    #[error("target `{0}`: expected IP[+IP…]=URL, e.g. 10.0.0.11=https://10.1.0.11")]
    TargetSyntax(String),
    #[error("target `{target}`: `{ip}` is not an IP address")]
    TargetIp { target: String, ip: String },
    #[error("target `{target}`: `{url}` is not an http(s) URL with a host")]
    TargetUrl { target: String, url: String },
    #[error("target `{target}`: {ip} is already mapped to {other}")]
    Duplicate {
        target: String,
        ip: IpAddr,
        other: String,
    },
    #[error("allowed API resource `{0}` must start with /redfish/v1 and contain no `..`")]
    Resource(String),
    #[error("`{0}` is not an IP address or network (e.g. 10.1.0.0/16)")]
    Network(String),
}

/// Parses IP addresses and CIDR networks; a bare address is a network of one.
pub fn networks(entries: &[String]) -> Result<Vec<IpNet>, ProxyConfigError> {
    entries
        .iter()
        .map(|e| {
            let e = e.trim();
            e.parse::<IpNet>()
                .or_else(|_| e.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| ProxyConfigError::Network(e.to_owned()))
        })
        .collect()
}

/// This host's addresses: 127.0.0.0/8 and ::1.
pub fn loopback_networks() -> Vec<IpNet> {
    ["127.0.0.0/8", "::1/128"]
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// IPv4 clients on a dual-stack socket show up as ::ffff:a.b.c.d.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

fn within(networks: &[IpNet], ip: IpAddr) -> bool {
    let ip = canonical(ip);
    networks.iter().any(|n| n.contains(&ip))
}

/// A BMC name that resolves outside the configured BMC networks.
#[derive(Debug, thiserror::Error)]
#[error("{netloc} resolves to {addresses}, outside the BMC networks (--redfish.bmc-network)")]
struct OutsideBmcNetworks {
    netloc: String,
    addresses: String,
}

/// Name resolution for BMCs named by clients: only addresses inside the BMC networks are
/// returned, so a connection can go nowhere else, whatever the name resolves to when.
struct BoundedResolver {
    networks: Vec<IpNet>,
}

impl ureq::Resolver for BoundedResolver {
    fn resolve(&self, netloc: &str) -> std::io::Result<Vec<std::net::SocketAddr>> {
        let all: Vec<std::net::SocketAddr> =
            std::net::ToSocketAddrs::to_socket_addrs(netloc)?.collect();
        let inside: Vec<_> = all
            .iter()
            .copied()
            .filter(|a| within(&self.networks, a.ip()))
            .collect();
        if inside.is_empty() {
            let addresses = all
                .iter()
                .map(|a| a.ip().to_string())
                .collect::<Vec<_>>()
                .join(", ");
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                OutsideBmcNetworks {
                    netloc: netloc.to_owned(),
                    addresses,
                },
            ));
        }
        Ok(inside)
    }
}

/// `https://bmc:443/anything` → `https://bmc:443`: BMCs are addressed by origin only.
fn origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if scheme != "http" && scheme != "https" {
        return None;
    }
    let host = rest.split('/').next()?;
    if host.is_empty() || host.contains('@') || host.contains(['?', '#', ' ']) {
        return None;
    }
    Some(format!("{scheme}://{host}"))
}

/// Compute-node addresses → BMC origin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Targets {
    by_ip: HashMap<IpAddr, String>,
}

impl Targets {
    /// Parses `IP[+IP…]=URL` entries.
    pub fn parse(entries: &[String]) -> Result<Targets, ProxyConfigError> {
        let mut by_ip = HashMap::new();
        for entry in entries {
            let (ips, url) = entry
                .split_once('=')
                .ok_or_else(|| ProxyConfigError::TargetSyntax(entry.clone()))?;
            let url = origin(url.trim()).ok_or_else(|| ProxyConfigError::TargetUrl {
                target: entry.clone(),
                url: url.trim().to_owned(),
            })?;
            for ip in ips.split('+').map(str::trim) {
                let addr: IpAddr = ip.parse().map_err(|_| ProxyConfigError::TargetIp {
                    target: entry.clone(),
                    ip: ip.to_owned(),
                })?;
                if let Some(other) = by_ip.insert(addr, url.clone()) {
                    if other != url {
                        return Err(ProxyConfigError::Duplicate {
                            target: entry.clone(),
                            ip: addr,
                            other,
                        });
                    }
                }
            }
        }
        Ok(Targets { by_ip })
    }

    pub fn for_ip(&self, ip: IpAddr) -> Option<&str> {
        self.by_ip.get(&canonical(ip)).map(String::as_str)
    }

    /// Whether `origin` is one of the configured BMCs.
    pub fn knows(&self, origin: &str) -> bool {
        self.by_ip.values().any(|u| u == origin)
    }

    pub fn len(&self) -> usize {
        self.by_ip.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_ip.is_empty()
    }
}

/// Allow-listed path patterns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowList {
    patterns: Vec<Vec<String>>,
}

fn segments(path: &str) -> Vec<&str> {
    path.trim_end_matches('/')
        .split('/')
        .skip(1)
        .collect::<Vec<_>>()
}

impl AllowList {
    pub fn new(patterns: &[String]) -> Result<AllowList, ProxyConfigError> {
        let mut out = Vec::with_capacity(patterns.len());
        for p in patterns {
            if !p.starts_with("/redfish/v1") || p.contains("..") {
                return Err(ProxyConfigError::Resource(p.clone()));
            }
            out.push(segments(p).into_iter().map(str::to_owned).collect());
        }
        Ok(AllowList { patterns: out })
    }

    pub fn defaults() -> AllowList {
        let defaults: Vec<String> = DEFAULT_ALLOWED.iter().map(|s| (*s).to_owned()).collect();
        AllowList::new(&defaults).unwrap_or(AllowList {
            patterns: Vec::new(),
        })
    }

    /// Whether `path` (no query) matches a pattern. Dot segments, empty segments and
    /// percent-escapes never match: they are how path filters are bypassed.
    pub fn allows(&self, path: &str) -> bool {
        if path.contains('%') || path.contains("//") || path.contains('\\') {
            return false;
        }
        let segs = segments(path);
        if segs.iter().any(|s| *s == "." || *s == ".." || s.is_empty()) && path != "/" {
            return false;
        }
        self.patterns
            .iter()
            .any(|p| p.len() == segs.len() && p.iter().zip(&segs).all(|(a, b)| a == "*" || a == b))
    }
}

/// What a request may do on an allowed path.
fn method_allowed(method: &Method, path: &str) -> bool {
    let session_collection = path.trim_end_matches('/').ends_with("/Sessions");
    let in_sessions = path.contains("/Sessions/");
    match *method {
        Method::GET | Method::HEAD => true,
        Method::POST => session_collection,
        Method::DELETE => in_sessions,
        _ => false,
    }
}

/// The proxy's settings.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub targets: Targets,
    /// Where a BMC named in `X-Redfish-Url` may be when no target matches the client.
    pub bmc_networks: Vec<IpNet>,
    /// Front proxies whose `X-Real-IP` / `X-Forwarded-For` name the client.
    pub trusted_proxies: Vec<IpNet>,
    pub allowed: AllowList,
    pub insecure_skip_verify: bool,
    pub timeouts: Timeouts,
    /// Longest wait for the request body.
    pub body_timeout: Duration,
}

pub struct Proxy {
    config: ProxyConfig,
    agent: ureq::Agent,
    /// For BMCs within `bmc_networks`: connects only inside them.
    bounded: ureq::Agent,
}

/// The BMC of a request, and how it was chosen.
struct Route {
    bmc: String,
    /// Named by the client within the BMC networks, not configured.
    bounded: bool,
}

fn json_error(status: StatusCode, message: &str) -> Response<Body> {
    let body = serde_json::json!({"error": {"code": status.as_u16(), "message": message}});
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// What the blocking relay returns.
struct Relayed {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

enum RelayError {
    Timeout(String),
    Unreachable(String),
    Outside(String),
}

impl Proxy {
    pub fn new(config: ProxyConfig) -> Result<Proxy, rustls::Error> {
        let agent = client::agent(config.timeouts, config.insecure_skip_verify)?;
        let bounded = client::agent_builder(config.timeouts, config.insecure_skip_verify)?
            .resolver(BoundedResolver {
                networks: config.bmc_networks.clone(),
            })
            .build();
        Ok(Proxy {
            config,
            agent,
            bounded,
        })
    }

    /// The client's address: the peer's, or the one a trusted front proxy says it forwards
    /// for (`X-Real-IP`, else the last `X-Forwarded-For` hop that is not a trusted proxy).
    fn client<B>(&self, req: &Request<B>) -> Option<IpAddr> {
        let peer = req.extensions().get::<PeerAddr>().map(|p| p.0.ip())?;
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
        };
        let claimed = header("x-real-ip").is_some() || header("x-forwarded-for").is_some();
        if !within(&self.config.trusted_proxies, peer) {
            if claimed {
                tracing::debug!(%peer, "X-Real-IP/X-Forwarded-For ignored: the peer is not a trusted proxy (--web.trusted-proxy)");
            }
            return Some(peer);
        }
        if let Some(ip) = header("x-real-ip").and_then(|v| v.parse::<IpAddr>().ok()) {
            return Some(ip);
        }
        let forwarded = header("x-forwarded-for")
            .into_iter()
            .flat_map(|v| v.rsplit(','))
            .filter_map(|hop| hop.trim().parse::<IpAddr>().ok())
            .find(|ip| !within(&self.config.trusted_proxies, *ip));
        Some(forwarded.unwrap_or(peer))
    }

    /// Which BMC this request is for: the one configured for the client's address, else a
    /// configured BMC named in `X-Redfish-Url`, else one named there within the BMC networks.
    fn target<B>(&self, req: &Request<B>) -> Result<Route, String> {
        let client = self.client(req);
        if let Some(url) = client.and_then(|ip| self.config.targets.for_ip(ip)) {
            return Ok(Route {
                bmc: url.to_owned(),
                bounded: false,
            });
        }
        let named = req
            .headers()
            .get(REDFISH_URL_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::trim);
        if let Some(named) = named {
            return match origin(named) {
                Some(o) if self.config.targets.knows(&o) => Ok(Route {
                    bmc: o,
                    bounded: false,
                }),
                Some(o) if !self.config.bmc_networks.is_empty() => Ok(Route {
                    bmc: o,
                    bounded: true,
                }),
                _ => Err(format!(
                    "BMC `{named}` is not a configured target of this proxy"
                )),
            };
        }
        let who = client.map(|i| i.to_string()).unwrap_or_default();
        Err(format!("no BMC is configured for client {who}"))
    }

    pub async fn handle(self: std::sync::Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_owned();
        if path == "/health" {
            return crate::web::text_response(StatusCode::OK, "ok\n");
        }
        if req.uri().query().is_some() {
            // $expand and friends can reach resources outside the allow-list.
            return json_error(
                StatusCode::FORBIDDEN,
                "query strings are not relayed by this proxy",
            );
        }
        if !self.config.allowed.allows(&path) {
            tracing::info!(%path, "refused: path not allowed");
            return json_error(
                StatusCode::FORBIDDEN,
                &format!("path {path} is not an allowed Redfish API resource"),
            );
        }
        if !method_allowed(req.method(), &path) {
            return json_error(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!("{} is not relayed for {path}", req.method()),
            );
        }
        let Route { bmc, bounded } = match self.target(&req) {
            Ok(r) => r,
            Err(message) => {
                tracing::info!(%path, %message, "refused: unknown target");
                return json_error(StatusCode::FORBIDDEN, &message);
            }
        };
        let method = req.method().to_string();
        let headers: Vec<(String, String)> = req
            .headers()
            .iter()
            .filter(|(k, _)| FORWARDED_REQUEST_HEADERS.contains(&k.as_str()))
            .filter_map(|(k, v)| Some((k.to_string(), v.to_str().ok()?.to_owned())))
            .collect();
        let body = match tokio::time::timeout(
            self.config.body_timeout,
            Limited::new(req.into_body(), MAX_REQUEST_BODY).collect(),
        )
        .await
        {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(e)) => {
                return json_error(StatusCode::BAD_REQUEST, &format!("request body: {e}"))
            }
            Err(_) => {
                return json_error(
                    StatusCode::REQUEST_TIMEOUT,
                    "request body not received in time",
                )
            }
        };
        let url = format!("{bmc}{path}");
        let this = std::sync::Arc::clone(&self);
        let target_url = url.clone();
        let relayed = tokio::task::spawn_blocking(move || {
            this.relay(bounded, &method, &target_url, &headers, &body)
        })
        .await;
        match relayed {
            Ok(Ok(r)) => {
                let mut resp = Response::new(Full::new(Bytes::from(r.body)));
                *resp.status_mut() =
                    StatusCode::from_u16(r.status).unwrap_or(StatusCode::BAD_GATEWAY);
                for (k, v) in r.headers {
                    // A Location on the BMC is given back as a path, so the exporter keeps
                    // going through the proxy.
                    let v = if k == "location" {
                        v.strip_prefix(&bmc).map(str::to_owned).unwrap_or(v)
                    } else {
                        v
                    };
                    if let (Ok(name), Ok(value)) = (
                        hyper::header::HeaderName::from_bytes(k.as_bytes()),
                        HeaderValue::from_str(&v),
                    ) {
                        resp.headers_mut().insert(name, value);
                    }
                }
                resp
            }
            Ok(Err(RelayError::Timeout(m))) => {
                tracing::warn!(%url, error = %m, "BMC timed out");
                json_error(StatusCode::GATEWAY_TIMEOUT, &format!("BMC timed out: {m}"))
            }
            Ok(Err(RelayError::Outside(m))) => {
                tracing::info!(%url, error = %m, "refused: BMC outside the BMC networks");
                json_error(StatusCode::FORBIDDEN, &m)
            }
            Ok(Err(RelayError::Unreachable(m))) => {
                tracing::warn!(%url, error = %m, "BMC unreachable");
                json_error(StatusCode::BAD_GATEWAY, &format!("BMC unreachable: {m}"))
            }
            Err(e) => json_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        }
    }

    fn relay(
        &self,
        bounded: bool,
        method: &str,
        url: &str,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Result<Relayed, RelayError> {
        let agent = if bounded { &self.bounded } else { &self.agent };
        let mut req = agent.request(method, url);
        for (k, v) in headers {
            req = req.set(k, v);
        }
        let result = if body.is_empty() {
            req.call()
        } else {
            req.send_bytes(body)
        };
        let resp = match result {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(ureq::Error::Transport(t)) => {
                let outside = std::error::Error::source(&t)
                    .and_then(|e| e.downcast_ref::<std::io::Error>())
                    .and_then(|e| e.get_ref())
                    .and_then(|e| e.downcast_ref::<OutsideBmcNetworks>());
                if let Some(o) = outside {
                    return Err(RelayError::Outside(o.to_string()));
                }
                let text = t.to_string();
                let lower = text.to_lowercase();
                return Err(
                    if lower.contains("timed out") || lower.contains("timeout") {
                        RelayError::Timeout(text)
                    } else {
                        RelayError::Unreachable(text)
                    },
                );
            }
        };
        let status = resp.status();
        let headers = FORWARDED_RESPONSE_HEADERS
            .iter()
            .filter_map(|h| resp.header(h).map(|v| ((*h).to_owned(), v.to_owned())))
            .collect();
        let mut body = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(resp.into_reader(), MAX_RESPONSE_BODY),
            &mut body,
        )
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                RelayError::Timeout(e.to_string())
            }
            _ => RelayError::Unreachable(e.to_string()),
        })?;
        Ok(Relayed {
            status,
            headers,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn target_entries() {
        let t = Targets::parse(&list(&[
            "10.0.0.11=https://10.1.0.11/redfish",
            "10.0.0.12+fd00::12=http://bmc-12:8000",
        ]))
        .unwrap();
        assert_eq!(
            t.for_ip("10.0.0.11".parse().unwrap()),
            Some("https://10.1.0.11")
        );
        assert_eq!(
            t.for_ip("fd00::12".parse().unwrap()),
            Some("http://bmc-12:8000")
        );
        assert_eq!(
            t.for_ip("::ffff:10.0.0.12".parse().unwrap()),
            Some("http://bmc-12:8000")
        );
        assert_eq!(t.for_ip("10.0.0.13".parse().unwrap()), None);
        assert!(t.knows("http://bmc-12:8000"));
        assert!(!t.knows("http://bmc-13:8000"));

        for bad in [
            "10.0.0.1",
            "node1=https://bmc",
            "10.0.0.1=ftp://bmc",
            "10.0.0.1=https://",
            "10.0.0.1=https://user@bmc",
        ] {
            assert!(Targets::parse(&list(&[bad])).is_err(), "{bad}");
        }
        assert!(matches!(
            Targets::parse(&list(&["10.0.0.1=https://a", "10.0.0.1=https://b"])),
            Err(ProxyConfigError::Duplicate { .. })
        ));
    }

    /// Whom `X-Real-IP` names, asked of a proxy that trusts `trusted`, by a peer at `peer`.
    fn client_named(trusted: Vec<IpNet>, peer: &str) -> Option<IpAddr> {
        let proxy = Proxy::new(ProxyConfig {
            targets: Targets::parse(&list(&["10.0.0.2=http://127.0.0.1:1"])).unwrap(),
            bmc_networks: Vec::new(),
            trusted_proxies: trusted,
            allowed: AllowList::defaults(),
            insecure_skip_verify: false,
            timeouts: crate::web::client::Timeouts {
                connect: Duration::from_secs(1),
                total: Duration::from_secs(1),
            },
            body_timeout: Duration::from_secs(1),
        })
        .unwrap();
        let mut req = Request::builder()
            .header("x-real-ip", "10.0.0.2")
            .body(())
            .unwrap();
        req.extensions_mut()
            .insert(PeerAddr(format!("{peer}:40000").parse().unwrap()));
        proxy.client(&req)
    }

    #[test]
    fn x_real_ip_is_believed_from_this_host_by_default_and_from_named_proxies_only() {
        let node = Some("10.0.0.2".parse().unwrap());
        assert_eq!(client_named(loopback_networks(), "127.0.0.1"), node);
        assert_eq!(client_named(loopback_networks(), "[::1]"), node);
        // Another node claiming 10.0.0.2 is itself.
        assert_eq!(
            client_named(loopback_networks(), "10.0.0.9"),
            Some("10.0.0.9".parse().unwrap())
        );
        // Named proxies replace the default.
        let named = networks(&list(&["10.0.0.9"])).unwrap();
        assert_eq!(client_named(named.clone(), "10.0.0.9"), node);
        assert_eq!(
            client_named(named, "127.0.0.1"),
            Some("127.0.0.1".parse().unwrap())
        );
    }

    #[test]
    fn allow_list() {
        let a = AllowList::defaults();
        for ok in [
            "/redfish/v1/",
            "/redfish/v1",
            "/redfish/v1/Chassis",
            "/redfish/v1/Chassis/1U",
            "/redfish/v1/Chassis/1U/Power",
            "/redfish/v1/Chassis/1U/Power/",
            "/redfish/v1/SessionService/Sessions/17",
        ] {
            assert!(a.allows(ok), "{ok}");
        }
        for refused in [
            "/redfish/v1/AccountService/Accounts",
            "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
            "/redfish/v1/Chassis/1U/../../AccountService",
            "/redfish/v1/Chassis/%2e%2e/AccountService",
            "/redfish/v1/Chassis//Power",
            "/redfish/v1/Chassis/1U/Power/Extra",
            "/",
            "/redfish",
        ] {
            assert!(!a.allows(refused), "{refused}");
        }
        assert!(AllowList::new(&list(&["/etc/passwd"])).is_err());
        assert!(AllowList::new(&list(&["/redfish/v1/../x"])).is_err());
    }

    #[test]
    fn methods() {
        assert!(method_allowed(&Method::GET, "/redfish/v1/Chassis"));
        assert!(method_allowed(
            &Method::POST,
            "/redfish/v1/SessionService/Sessions"
        ));
        assert!(!method_allowed(&Method::POST, "/redfish/v1/Chassis/1U"));
        assert!(method_allowed(
            &Method::DELETE,
            "/redfish/v1/SessionService/Sessions/3"
        ));
        assert!(!method_allowed(&Method::DELETE, "/redfish/v1/Chassis/1U"));
        assert!(!method_allowed(&Method::PATCH, "/redfish/v1/Chassis/1U"));
    }
}
