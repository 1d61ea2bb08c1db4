//! The Prometheus-API stores of one cluster: which one answers next (round-robin or least
//! connections), which are left out when they cannot be reached or fail a request, and the
//! relay of one request to them over HTTP or HTTPS, with the store's own credentials and
//! headers.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;

use crate::web::client::{rustls_config, ClientTls};

/// Largest answer relayed: a big range query over many series is tens of MiB.
pub const MAX_ANSWER_BYTES: usize = 256 << 20;

/// Idle connections kept per store.
const MAX_IDLE_CONNECTIONS: usize = 32;

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// Kept-alive connections to one store, waiting for the next request.
#[derive(Default)]
struct Idle(std::sync::Mutex<Vec<Sender>>);

impl std::fmt::Debug for Idle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Idle")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("backend URL `{0}`: expected http(s)://host[:port][/path]")]
    Url(String),
    #[error("backend {url}: {message}")]
    Access { url: String, message: String },
    #[error("no store configured for cluster {0}")]
    NoneHealthy(String),
    #[error("{url}: {message}")]
    Failed { url: String, message: String },
}

/// How the next backend is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    RoundRobin,
    LeastConnection,
}

/// How the lb reaches one store besides its URL (CEEMS's `web` of a backend).
#[derive(Debug, Clone, Default)]
pub struct StoreAccess {
    /// User and password, sent as basic auth.
    pub basic_auth: Option<(String, String)>,
    pub bearer_token: Option<String>,
    /// Sent with every request (after the client's, which cannot replace them).
    pub headers: Vec<(String, String)>,
    /// For `https://` stores: roots, client certificate, `insecure_skip_verify`.
    pub tls: ClientTls,
}

impl StoreAccess {
    /// Every header a request carries for this access: the configured ones, then the
    /// credentials as `authorization` (flagged as the secret ones).
    pub fn request_headers(&self) -> Vec<(String, String, bool)> {
        use base64::Engine;
        let mut all: Vec<(String, String, bool)> = self
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone(), false))
            .collect();
        if let Some((user, password)) = &self.basic_auth {
            let pair =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            all.push(("authorization".into(), format!("Basic {pair}"), true));
        }
        if let Some(token) = &self.bearer_token {
            all.push(("authorization".into(), format!("Bearer {token}"), true));
        }
        all
    }
}

/// A store and how to reach it.
#[derive(Debug, Clone)]
pub struct StoreSpec {
    pub url: String,
    pub access: StoreAccess,
}

impl StoreSpec {
    /// A store reached without credentials.
    pub fn plain(url: &str) -> StoreSpec {
        StoreSpec {
            url: url.to_owned(),
            access: StoreAccess::default(),
        }
    }
}

/// TLS towards one store.
#[derive(Clone)]
struct StoreTls {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl std::fmt::Debug for StoreTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StoreTls({:?})", self.name)
    }
}

/// One store: `http(s)://host[:port]` and a path prefix (Thanos or VictoriaMetrics behind a
/// path).
#[derive(Debug)]
pub struct Backend {
    pub url: String,
    /// As the Host header says it.
    authority: String,
    /// Where to connect: the authority with its scheme's port when it has none.
    address: String,
    prefix: String,
    tls: Option<StoreTls>,
    /// The store's credentials and headers, sent with every request.
    added: Vec<(HeaderName, HeaderValue)>,
    healthy: AtomicBool,
    in_flight: AtomicUsize,
    idle: Idle,
}

impl Backend {
    /// A store reached without credentials.
    pub fn parse(url: &str) -> Result<Backend, BackendError> {
        Backend::new(&StoreSpec::plain(url))
    }

    pub fn new(spec: &StoreSpec) -> Result<Backend, BackendError> {
        let url = spec.url.as_str();
        let bad = || BackendError::Url(url.to_owned());
        let (rest, https) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(rest), _) => (rest, false),
            (None, Some(rest)) => (rest, true),
            (None, None) => return Err(bad()),
        };
        let (authority, prefix) = match rest.find('/') {
            Some(at) => (&rest[..at], rest[at..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let host = match authority.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => host,
            _ if authority.ends_with(']') || !authority.contains(':') => authority,
            _ => return Err(bad()),
        };
        if host.is_empty() || authority.contains('@') {
            return Err(bad());
        }
        let address = match host.len() == authority.len() {
            true => format!("{authority}:{}", if https { 443 } else { 80 }),
            false => authority.to_owned(),
        };
        let failed = |message: String| BackendError::Access {
            url: url.to_owned(),
            message,
        };
        let tls = match https {
            false => None,
            true => {
                let name = ServerName::try_from(
                    host.trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_owned(),
                )
                .map_err(|e| failed(format!("host name: {e}")))?;
                let config = rustls_config(&spec.access.tls).map_err(failed)?;
                Some(StoreTls {
                    connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
                    name,
                })
            }
        };
        let header = |name: &str, value: &str, secret: bool| {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| failed(format!("header `{name}`: {e}")))?;
            let mut value = HeaderValue::from_str(value)
                .map_err(|e| failed(format!("header `{name}`: {e}")))?;
            value.set_sensitive(secret);
            Ok::<_, BackendError>((name, value))
        };
        let added = spec
            .access
            .request_headers()
            .iter()
            .map(|(name, value, secret)| header(name, value, *secret))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Backend {
            url: url.to_owned(),
            authority: authority.to_owned(),
            address,
            prefix: prefix.to_owned(),
            tls,
            added,
            healthy: AtomicBool::new(true),
            in_flight: AtomicUsize::new(0),
            idle: Idle::default(),
        })
    }

    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    fn set_healthy(&self, healthy: bool) {
        if self.healthy.swap(healthy, Ordering::Relaxed) != healthy {
            if healthy {
                tracing::info!(backend = %self.url, "backend is back");
            } else {
                tracing::warn!(backend = %self.url, "backend left out until it can be reached again");
            }
        }
    }

    /// Whether a TCP connection to the store opens within `timeout`.
    async fn reachable(&self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&self.address))
            .await
            .is_ok_and(|c| c.is_ok())
    }

    /// An idle kept-alive connection, or a new one (`true` when it was kept).
    async fn connection(&self) -> Result<(Sender, bool), String> {
        loop {
            let kept = self.idle.0.lock().unwrap_or_else(|p| p.into_inner()).pop();
            match kept {
                Some(mut sender) if !sender.is_closed() => {
                    if sender.ready().await.is_ok() {
                        return Ok((sender, true));
                    }
                }
                Some(_) => {}
                None => break,
            }
        }
        let stream = tokio::net::TcpStream::connect(&self.address)
            .await
            .map_err(|e| format!("cannot connect: {e}"))?;
        let _ = stream.set_nodelay(true);
        let handshake = |e: hyper::Error| format!("HTTP handshake: {e}");
        let sender = match &self.tls {
            None => {
                let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(handshake)?;
                tokio::spawn(conn);
                sender
            }
            Some(tls) => {
                let stream = tls
                    .connector
                    .connect(tls.name.clone(), stream)
                    .await
                    .map_err(|e| format!("TLS: {e}"))?;
                let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(handshake)?;
                tokio::spawn(conn);
                sender
            }
        };
        Ok((sender, false))
    }

    /// Sends one request and reads the whole answer, within `timeout`. Connections are kept
    /// alive between requests: a new one per query cost a tenth of a millisecond.
    async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        headers: &[(hyper::header::HeaderName, hyper::header::HeaderValue)],
        body: Bytes,
        timeout: Duration,
    ) -> Result<Response<Full<Bytes>>, String> {
        let request = || {
            let mut req = Request::builder()
                .method(method.clone())
                .uri(format!("{}{path_and_query}", self.prefix))
                .header(hyper::header::HOST, &self.authority);
            for (k, v) in headers {
                req = req.header(k, v);
            }
            for (k, v) in &self.added {
                req = req.header(k, v);
            }
            req.body(Full::new(body.clone()))
                .map_err(|e| format!("bad request: {e}"))
        };
        let exchange = async {
            let (mut sender, kept) = self.connection().await?;
            let resp = match sender.send_request(request()?).await {
                Ok(resp) => resp,
                // The store closed a kept connection as we sent: once more on a new one.
                Err(_) if kept => {
                    let (fresh, _) = self.connection_new().await?;
                    sender = fresh;
                    sender
                        .send_request(request()?)
                        .await
                        .map_err(|e| format!("request failed: {e}"))?
                }
                Err(e) => return Err(format!("request failed: {e}")),
            };
            let (parts, body) = resp.into_parts();
            let body = Limited::new(body, MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| format!("answer: {e}"))?
                .to_bytes();
            if !sender.is_closed() {
                let mut idle = self.idle.0.lock().unwrap_or_else(|p| p.into_inner());
                if idle.len() < MAX_IDLE_CONNECTIONS {
                    idle.push(sender);
                }
            }
            Ok(Response::from_parts(parts, Full::new(body)))
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| format!("no answer within {timeout:?}"))?
    }

    /// A new connection, never a kept one.
    async fn connection_new(&self) -> Result<(Sender, bool), String> {
        self.idle
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.connection().await
    }
}

/// The backends of one cluster.
#[derive(Debug)]
pub struct Pool {
    pub cluster: String,
    pub backends: Vec<Arc<Backend>>,
    /// Labels removed from every answer of this cluster's stores.
    pub filter_labels: Vec<String>,
    strategy: Strategy,
    next: AtomicUsize,
    timeout: Duration,
}

/// What `in_flight` counts while a request is out.
struct InFlight<'a>(&'a Backend);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Pool {
    /// Stores reached without credentials.
    pub fn new(
        cluster: &str,
        urls: &[String],
        strategy: Strategy,
        timeout: Duration,
    ) -> Result<Pool, BackendError> {
        let specs: Vec<StoreSpec> = urls.iter().map(|u| StoreSpec::plain(u)).collect();
        Pool::of_stores(cluster, &specs, strategy, timeout)
    }

    pub fn of_stores(
        cluster: &str,
        stores: &[StoreSpec],
        strategy: Strategy,
        timeout: Duration,
    ) -> Result<Pool, BackendError> {
        Ok(Pool {
            cluster: cluster.to_owned(),
            backends: stores
                .iter()
                .map(|s| Backend::new(s).map(Arc::new))
                .collect::<Result<_, _>>()?,
            filter_labels: Vec::new(),
            strategy,
            next: AtomicUsize::new(0),
            timeout,
        })
    }

    /// Removes these labels from every answer.
    pub fn with_filter_labels(mut self, labels: Vec<String>) -> Pool {
        self.filter_labels = labels;
        self
    }

    /// The healthy backends in the order to try them.
    fn order(&self) -> Vec<Arc<Backend>> {
        let n = self.backends.len().max(1);
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let all: Vec<Arc<Backend>> = (0..self.backends.len())
            .map(|i| Arc::clone(&self.backends[(start + i) % n]))
            .collect();
        let healthy: Vec<Arc<Backend>> = all.iter().filter(|b| b.healthy()).cloned().collect();
        // With none healthy, every one is tried rather than none: one may be back already.
        let mut order = if healthy.is_empty() { all } else { healthy };
        if self.strategy == Strategy::LeastConnection {
            // Stable: ties keep the round-robin order.
            order.sort_by_key(|b| b.in_flight.load(Ordering::Relaxed));
        }
        order
    }

    /// Relays the request to the next healthy backend; one that cannot be reached is left out
    /// and the next one tried.
    pub async fn forward(
        &self,
        method: Method,
        path_and_query: &str,
        headers: &[(hyper::header::HeaderName, hyper::header::HeaderValue)],
        body: Bytes,
    ) -> Result<Response<Full<Bytes>>, BackendError> {
        let mut last = None;
        for backend in self.order() {
            backend.in_flight.fetch_add(1, Ordering::Relaxed);
            let _counted = InFlight(&backend);
            match backend
                .send(
                    method.clone(),
                    path_and_query,
                    headers,
                    body.clone(),
                    self.timeout,
                )
                .await
            {
                Ok(resp) if resp.status() != StatusCode::SERVICE_UNAVAILABLE => return Ok(resp),
                Ok(_) => last = Some((backend.url.clone(), "503 Service Unavailable".into())),
                Err(message) => {
                    backend.set_healthy(false);
                    last = Some((backend.url.clone(), message));
                }
            }
        }
        Err(match last {
            Some((url, message)) => BackendError::Failed { url, message },
            None => BackendError::NoneHealthy(self.cluster.clone()),
        })
    }

    /// Checks each `interval`, for as long as the pool lives, that every backend can be
    /// reached. As CEEMS checks: a TCP connection, not an HTTP readiness path, which not every
    /// Prometheus-compatible store serves (Mimir and Cortex answer `/ready`, CEEMS's own mock
    /// nothing but `/api/v1/`).
    pub fn spawn_health_checks(self: &Arc<Self>, interval: Duration) {
        let pool = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(pool) = pool.upgrade() else { return };
                for b in &pool.backends {
                    b.set_healthy(b.reachable(pool.timeout.min(interval)).await);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_urls() {
        let b = Backend::parse("http://127.0.0.1:9090/prom/").unwrap();
        assert_eq!(
            (b.authority.as_str(), b.prefix.as_str()),
            ("127.0.0.1:9090", "/prom")
        );
        let b = Backend::parse("https://prom.example/").unwrap();
        assert_eq!(
            (b.address.as_str(), b.tls.is_some()),
            ("prom.example:443", true)
        );
        let b = Backend::parse("http://[::1]:9090").unwrap();
        assert_eq!(b.address, "[::1]:9090");
        for bad in [
            "127.0.0.1:9090",
            "http://",
            "http://a:b:c",
            "http://u:p@host:1",
            "ftp://x:1",
        ] {
            assert!(Backend::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_stores_credentials_go_with_every_request_and_stay_out_of_logs() {
        let spec = StoreSpec {
            url: "https://prom:9090".into(),
            access: StoreAccess {
                basic_auth: Some(("prometheus".into(), "password".into())),
                headers: vec![("X-Ceems-Test-Header".into(), "slurm-0".into())],
                ..StoreAccess::default()
            },
        };
        let b = Backend::new(&spec).unwrap();
        let auth = b.added.iter().find(|(k, _)| k == "authorization").unwrap();
        assert_eq!(auth.1, "Basic cHJvbWV0aGV1czpwYXNzd29yZA==");
        assert!(!format!("{b:?}").contains("cHJvbWV0aGV1czpwYXNzd29yZA"));
        assert!(b
            .added
            .iter()
            .any(|(k, v)| k == "x-ceems-test-header" && v == "slurm-0"));
    }

    #[test]
    fn round_robin_skips_the_unhealthy_and_least_connection_prefers_the_idle() {
        let urls = ["http://a:1", "http://b:1", "http://c:1"].map(String::from);
        let pool = Pool::new("c", &urls, Strategy::RoundRobin, Duration::from_secs(1)).unwrap();
        let first = |p: &Pool| p.order()[0].url.clone();
        let picks: Vec<String> = (0..3).map(|_| first(&pool)).collect();
        assert_eq!(picks, urls);
        pool.backends[1].set_healthy(false);
        let picks: Vec<String> = (0..3).map(|_| first(&pool)).collect();
        assert!(!picks.contains(&urls[1]), "{picks:?}");
        for b in &pool.backends {
            b.set_healthy(false);
        }
        assert_eq!(pool.order().len(), 3, "with none healthy, all are tried");

        let pool = Pool::new(
            "c",
            &urls,
            Strategy::LeastConnection,
            Duration::from_secs(1),
        )
        .unwrap();
        pool.backends[0].in_flight.store(3, Ordering::Relaxed);
        pool.backends[2].in_flight.store(1, Ordering::Relaxed);
        assert_eq!(first(&pool), urls[1]);
    }
}
