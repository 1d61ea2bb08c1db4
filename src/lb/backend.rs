//! The Prometheus-API stores of one cluster: which one answers next (round-robin or least
//! connections), which are left out after failing their health check or a request, and the
//! relay of one request to them over plain HTTP.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

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
    #[error("backend URL `{0}`: only http://host:port[/path] is supported")]
    Url(String),
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

/// One store: `http://host:port` and a path prefix (Thanos or VictoriaMetrics behind a path).
#[derive(Debug)]
pub struct Backend {
    pub url: String,
    authority: String,
    prefix: String,
    healthy: AtomicBool,
    in_flight: AtomicUsize,
    idle: Idle,
}

impl Backend {
    pub fn parse(url: &str) -> Result<Backend, BackendError> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| BackendError::Url(url.to_owned()))?;
        let (authority, prefix) = match rest.find('/') {
            Some(at) => (&rest[..at], rest[at..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.is_empty() || !authority.contains(':') {
            return Err(BackendError::Url(url.to_owned()));
        }
        Ok(Backend {
            url: url.to_owned(),
            authority: authority.to_owned(),
            prefix: prefix.to_owned(),
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
                tracing::warn!(backend = %self.url, "backend left out until it answers its health check");
            }
        }
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
        let stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|e| format!("cannot connect: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP handshake: {e}"))?;
        tokio::spawn(conn);
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
    pub fn new(
        cluster: &str,
        urls: &[String],
        strategy: Strategy,
        timeout: Duration,
    ) -> Result<Pool, BackendError> {
        Ok(Pool {
            cluster: cluster.to_owned(),
            backends: urls
                .iter()
                .map(|u| Backend::parse(u).map(Arc::new))
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

    /// Asks every backend's `/-/ready` each `interval`, for as long as the pool lives.
    pub fn spawn_health_checks(self: &Arc<Self>, interval: Duration) {
        let pool = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(pool) = pool.upgrade() else { return };
                for b in &pool.backends {
                    let ok = b
                        .send(
                            Method::GET,
                            "/-/ready",
                            &[],
                            Bytes::new(),
                            pool.timeout.min(interval),
                        )
                        .await
                        .is_ok_and(|r| r.status().is_success());
                    b.set_healthy(ok);
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
        for bad in ["https://x:1", "127.0.0.1:9090", "http://", "http://host"] {
            assert!(Backend::parse(bad).is_err(), "{bad}");
        }
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
