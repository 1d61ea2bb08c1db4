//! The HTTP layer shared by the exporter, the stats-server and the redfish-proxy: listening,
//! a cap on requests in flight, gzip, and graceful shutdown.

pub mod client;
pub mod cors;
pub mod generate;
pub mod lenient_target;
pub mod munge;
pub mod rate;
pub mod spare;
pub mod toolkit;

use std::convert::Infallible;
use std::future::Future;
use std::io::Write as _;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE, VARY};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The header in which an exporter names its BMC to `ceems redfish-proxy` (the collector sends
/// it, the proxy reads it).
pub const REDFISH_URL_HEADER: &str = "X-Redfish-Url";

/// The largest request line and headers every server reads; hyper answers a larger one 431
/// and closes. No client of ours sends more (Grafana's headers, Prometheus's scrapes, an
/// exporter's Redfish calls are a few hundred bytes), and it bounds what a connection holds.
pub const MAX_REQUEST_HEAD_BYTES: usize = 8 * 1024;

pub type Body = Full<Bytes>;
pub type BoxFuture = Pin<Box<dyn Future<Output = Response<Body>> + Send>>;
pub type Handler = Arc<dyn Fn(Request<Incoming>) -> BoxFuture + Send + Sync>;

/// How long in-flight requests may run after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum WebError {
    #[error("invalid listen address `{0}`: expected host:port or :port")]
    Address(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
}

/// Binds a listen address as Prometheus exporters take it: `:9010` means every interface.
/// Synchronous, so a daemon can bind before it drops privileges (ports below 1024).
pub fn bind_std(listen: &str) -> Result<std::net::TcpListener, WebError> {
    let bind_err = |source| WebError::Bind {
        addr: listen.to_owned(),
        source,
    };
    let listener = if let Some(port) = listen.strip_prefix(':') {
        let port: u16 = port
            .parse()
            .map_err(|_| WebError::Address(listen.to_owned()))?;
        // Dual-stack first; hosts with IPv6 disabled get IPv4 only.
        match std::net::TcpListener::bind(SocketAddr::from(([0u16; 8], port))) {
            Ok(l) => l,
            Err(_) => {
                std::net::TcpListener::bind(SocketAddr::from(([0u8; 4], port))).map_err(bind_err)?
            }
        }
    } else {
        if !listen.contains(':') {
            return Err(WebError::Address(listen.to_owned()));
        }
        std::net::TcpListener::bind(listen).map_err(bind_err)?
    };
    listener.set_nonblocking(true).map_err(bind_err)?;
    Ok(listener)
}

/// Hands a listener bound with [`bind_std`] to the async runtime (call inside it).
pub fn into_async(listener: std::net::TcpListener) -> std::io::Result<TcpListener> {
    TcpListener::from_std(listener)
}

/// Serves `handler` on `listener` until SIGTERM or SIGINT, on a runtime of its own of
/// `workers` threads named `thread_name`: for the servers that do nothing but answer (the
/// Redfish proxy, the admission webhook).
pub fn serve_until_signal(
    thread_name: &str,
    workers: usize,
    listener: std::net::TcpListener,
    options: ServeOptions,
    handler: Handler,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name(thread_name)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = into_async(listener)?;
        serve(listener, options, handler, shutdown_signal()).await;
        Ok(())
    })
}

pub fn text_response(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// Whether the client accepts gzip (a `gzip` coding whose q-value is not 0).
pub fn accepts_gzip<B>(req: &Request<B>) -> bool {
    req.headers()
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or_default();
            let zero_q = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !zero_q
        })
}

/// A 200 response with `body`, gzip-compressed when `gzip` is set.
pub fn body_response(
    body: impl Into<Bytes>,
    content_type: &'static str,
    gzip: bool,
) -> Response<Body> {
    let body: Bytes = body.into();
    let compressed = if gzip { gzipped(&body) } else { None };
    encoded_response(body, compressed, content_type)
}

/// `body` gzip-compressed for one response, at the fastest level; None if it cannot be (then
/// it is sent as it is).
pub fn gzipped(body: &[u8]) -> Option<Bytes> {
    gzipped_at(body, flate2::Compression::fast())
}

/// `body` gzip-compressed once for many responses (a cached answer), at zlib's default level:
/// a day of one user's jobs (173 KB) compresses to 15 KB instead of 22 KB in 1.3 ms instead of
/// 0.5, and copying the body is most of what such a response costs.
pub fn gzipped_once(body: &[u8]) -> Option<Bytes> {
    gzipped_at(body, flate2::Compression::default())
}

fn gzipped_at(body: &[u8], level: flate2::Compression) -> Option<Bytes> {
    let mut enc = flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 4), level);
    enc.write_all(body)
        .and_then(|_| enc.finish())
        .ok()
        .map(Bytes::from)
}

/// A 200 response: `compressed` (`body` gzipped earlier) when there is one, else `body`.
pub fn encoded_response(
    body: Bytes,
    compressed: Option<Bytes>,
    content_type: &'static str,
) -> Response<Body> {
    let mut headers = Vec::with_capacity(3);
    headers.push((CONTENT_TYPE, HeaderValue::from_static(content_type)));
    let bytes = match compressed {
        Some(z) => {
            headers.push((CONTENT_ENCODING, HeaderValue::from_static("gzip")));
            z
        }
        None => body,
    };
    headers.push((VARY, HeaderValue::from_static("Accept-Encoding")));
    let mut resp = Response::new(Full::new(bytes));
    for (k, v) in headers {
        resp.headers_mut().insert(k, v);
    }
    resp
}

/// The options every server has: where it listens and its web config file.
pub fn server_opts(default_listen: &str) -> Vec<crate::config::Opt> {
    use crate::config::{Kind, Opt};
    vec![
        Opt::new(
            "web.listen-address",
            Kind::Str,
            "Address to listen on: host:port, or :port for every interface",
        )
        .default(default_listen),
        Opt::new(
            "web.config.file",
            Kind::Str,
            "Web config file (exporter-toolkit YAML): TLS, client certificates, basic auth, headers",
        ),
    ]
}

/// `--web.user-header-name`: the header that names the user, as Grafana sends it.
pub fn user_header_opt() -> crate::config::Opt {
    crate::config::Opt::new(
        "web.user-header-name",
        crate::config::Kind::Str,
        "Request header that names the user (Grafana sends X-Grafana-User)",
    )
    .default("X-Grafana-User")
}

/// `--web.munge-credentials` and how they are checked: for servers that users reach from the
/// cluster's hosts (cacct), without a password there.
pub fn munge_opts() -> Vec<crate::config::Opt> {
    use crate::config::{Kind, Opt};
    vec![
        Opt::new(
            "web.munge-credentials",
            Kind::Flag,
            "Accept MUNGE credentials (Authorization: MUNGE …, as cacct sends them) in place of basic auth: the local munged vouches for the caller's uid, whose name becomes the user header",
        )
        .default("false"),
        Opt::new(
            "web.munge-socket",
            Kind::Str,
            "munged's socket for --web.munge-credentials (empty: munged's default)",
        )
        .default(""),
        Opt::new(
            "web.unmunge-path",
            Kind::Str,
            "The unmunge program that decodes credentials for --web.munge-credentials",
        )
        .default("unmunge"),
    ]
}

/// The MUNGE check of `--web.munge-credentials`, if on; it sets `user_header`.
pub fn munge_auth(
    settings: &crate::config::Layered,
    user_header: &hyper::header::HeaderName,
) -> anyhow::Result<Option<munge::MungeAuth>> {
    if !settings.get::<bool>("web.munge-credentials")? {
        return Ok(None);
    }
    let socket: String = settings.get("web.munge-socket")?;
    let unmunge: String = settings.get("web.unmunge-path")?;
    tracing::info!(socket = %socket, unmunge = %unmunge, "MUNGE credentials accepted");
    Ok(Some(munge::MungeAuth {
        unmunge: unmunge.into(),
        socket: (!socket.is_empty()).then(|| socket.into()),
        user_header: user_header.clone(),
    }))
}

/// The client's address, put in every request's extensions.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub SocketAddr);

/// Limits and security of one server.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Requests beyond this many at once get 503; 0 for no limit.
    pub max_requests: usize,
    /// A client must send its request headers within this time (slow clients hold no slot).
    pub header_read_timeout: Duration,
    /// Longest wait for one read from the client, idle keep-alive included.
    pub read_timeout: Option<Duration>,
    /// Longest wait for one write to the client.
    pub write_timeout: Option<Duration>,
    /// TLS, basic auth and headers from `--web.config.file`.
    pub security: Option<Arc<toolkit::WebSecurity>>,
    /// MUNGE credentials accepted in place of basic auth, naming the user.
    pub munge: Option<Arc<munge::MungeAuth>>,
    /// Requests a minute per client address (CEEMS's `--web.max-requests`), beyond which 429.
    pub rate: Option<Arc<rate::RateLimit>>,
}

impl ServeOptions {
    pub fn new(max_requests: usize) -> ServeOptions {
        ServeOptions {
            max_requests,
            header_read_timeout: Duration::from_secs(30),
            read_timeout: None,
            write_timeout: None,
            security: None,
            munge: None,
            rate: None,
        }
    }

    pub fn with_rate(mut self, rate: Option<rate::RateLimit>) -> ServeOptions {
        self.rate = rate.map(Arc::new);
        self
    }

    pub fn with_munge(mut self, munge: Option<munge::MungeAuth>) -> ServeOptions {
        self.munge = munge.map(Arc::new);
        self
    }

    pub fn with_security(mut self, security: Option<toolkit::WebSecurity>) -> ServeOptions {
        self.security = security.map(Arc::new);
        self
    }
}

fn unauthorized() -> Response<Body> {
    let mut resp = text_response(StatusCode::UNAUTHORIZED, "Unauthorized\n");
    resp.headers_mut().insert(
        hyper::header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"ceems\""),
    );
    resp
}

/// Basic auth (when configured) or a MUNGE credential (when accepted) in front of the
/// handler, and the configured headers after it.
async fn secured(
    security: Option<Arc<toolkit::WebSecurity>>,
    munge: Option<Arc<munge::MungeAuth>>,
    handler: Handler,
    mut req: Request<Incoming>,
) -> Response<Body> {
    let authorization = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let credential = authorization
        .as_deref()
        .and_then(munge::MungeAuth::credential)
        .map(str::to_owned);
    match (munge, credential) {
        (Some(m), Some(credential)) => {
            let request = format!(
                "{} {}",
                req.method(),
                req.uri().path_and_query().map_or("/", |p| p.as_str())
            );
            let auth = Arc::clone(&m);
            let user =
                tokio::task::spawn_blocking(move || auth.verify_blocking(&credential, &request))
                    .await
                    .unwrap_or_else(|e| Err(munge::MungeError::Unmunge(e.to_string())));
            match user.map(|u| HeaderValue::from_str(&u)) {
                Ok(Ok(user)) => {
                    req.headers_mut().insert(m.user_header.clone(), user);
                }
                Ok(Err(_)) => return text_response(StatusCode::UNAUTHORIZED, "Unauthorized\n"),
                // The server's own fault (no unmunge, say): the operator's to fix, not the caller's.
                Err(e @ munge::MungeError::Unmunge(_)) => {
                    tracing::warn!(error = %e, "cannot check a MUNGE credential");
                    return text_response(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "cannot check MUNGE credentials\n",
                    );
                }
                Err(e) => {
                    tracing::info!(error = %e, "MUNGE credential refused");
                    return text_response(StatusCode::UNAUTHORIZED, format!("Unauthorized: {e}\n"));
                }
            }
        }
        _ => {
            if let Some(auth) = security.as_ref().and_then(|s| s.auth.clone()) {
                // bcrypt takes tens of milliseconds: never on an async worker.
                let ok = tokio::task::spawn_blocking(move || {
                    auth.verify_blocking(authorization.as_deref())
                })
                .await
                .unwrap_or(false);
                if !ok {
                    return unauthorized();
                }
            }
        }
    }
    let mut resp = handler(req).await;
    if let Some(sec) = &security {
        for (k, v) in &sec.headers {
            resp.headers_mut().insert(k.clone(), v.clone());
        }
    }
    resp
}

/// Requests answered 503 under a burst: one line, then one with the count per window.
static REFUSED: crate::log::RepeatedEvent = crate::log::RepeatedEvent::new(Duration::from_secs(10));

fn log_refused(peer: std::net::SocketAddr) {
    if !REFUSED.opens_window() {
        return;
    }
    let window = REFUSED.window;
    tracing::warn!(
        %peer,
        "too many requests in flight (--web.max-requests); answering 503; those that follow in the next {}s are counted in one line",
        window.as_secs()
    );
    tokio::spawn(async move {
        tokio::time::sleep(window).await;
        let more = REFUSED.close();
        if more > 0 {
            tracing::warn!(
                refused = more,
                "{more} more requests answered 503 in {}s: too many in flight (--web.max-requests)",
                window.as_secs()
            );
        }
    });
}

/// Serves `handler` on `listener` until `shutdown` resolves, then lets requests in flight
/// finish for up to 10 s.
pub async fn serve(
    listener: TcpListener,
    options: ServeOptions,
    handler: Handler,
    shutdown: impl Future<Output = ()>,
) {
    let max_requests = options.max_requests;
    let limit = (max_requests > 0).then(|| Arc::new(Semaphore::new(max_requests)));
    let tls = options
        .security
        .as_ref()
        .and_then(|s| s.tls.clone())
        .map(tokio_rustls::TlsAcceptor::from);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let handler = Arc::clone(&handler);
                let limit = limit.clone();
                let security = options.security.clone();
                let munge = options.munge.clone();
                let rate = options.rate.clone();
                let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                    req.extensions_mut().insert(PeerAddr(peer));
                    let handler = Arc::clone(&handler);
                    let security = security.clone();
                    let munge = munge.clone();
                    let limit = limit.clone();
                    let over_rate = rate
                        .as_ref()
                        .and_then(|r| r.admit(peer.ip(), std::time::Instant::now()).err());
                    async move {
                        if let Some(rate::RetryAfter(wait)) = over_rate {
                            tracing::debug!(%peer, "over --web.max-requests: answering 429");
                            let mut resp = text_response(StatusCode::TOO_MANY_REQUESTS, "Too Many Requests\n");
                            resp.headers_mut().insert(
                                hyper::header::RETRY_AFTER,
                                HeaderValue::from(wait.as_secs().max(1)),
                            );
                            return Ok::<_, Infallible>(resp);
                        }
                        let _permit = match &limit {
                            None => None,
                            Some(sem) => match Arc::clone(sem).try_acquire_owned() {
                                Ok(p) => Some(p),
                                Err(_) => {
                                    log_refused(peer);
                                    return Ok::<_, Infallible>(text_response(
                                        StatusCode::SERVICE_UNAVAILABLE,
                                        "too many requests in flight, try again later\n",
                                    ));
                                }
                            },
                        };
                        Ok::<_, Infallible>(secured(security, munge, handler, req).await)
                    }
                });
                let (read_timeout, write_timeout) = (options.read_timeout, options.write_timeout);
                let with_timeouts = move |stream: tokio::net::TcpStream| {
                    let mut stream = tokio_io_timeout::TimeoutStream::new(stream);
                    stream.set_read_timeout(read_timeout);
                    stream.set_write_timeout(write_timeout);
                    Box::pin(stream)
                };
                let http = {
                    let mut b = hyper::server::conn::http1::Builder::new();
                    // Header names as Go's servers write them (`Content-Type`), which
                    // clients that compare them byte for byte expect.
                    b.timer(hyper_util::rt::TokioTimer::new())
                        .title_case_headers(true)
                        .header_read_timeout(options.header_read_timeout)
                        .max_buf_size(MAX_REQUEST_HEAD_BYTES);
                    b
                };
                match &tls {
                    None => {
                        let stream = lenient_target::LenientTarget::new(with_timeouts(stream));
                        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
                        tokio::spawn(async move {
                            if let Err(e) = conn.await {
                                tracing::debug!(%peer, error = %e, "connection ended with an error");
                            }
                        });
                    }
                    Some(acceptor) => {
                        let acceptor = acceptor.clone();
                        let handshake_timeout = options.header_read_timeout;
                        let watcher = graceful.watcher();
                        tokio::spawn(async move {
                            if starts_like_http(&stream, handshake_timeout).await {
                                answer_plain_http_on_tls(stream, peer).await;
                                return;
                            }
                            let stream = with_timeouts(stream);
                            let tls_stream = match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                                Ok(Ok(s)) => s,
                                Ok(Err(e)) => {
                                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                    return;
                                }
                                Err(_) => {
                                    tracing::debug!(%peer, "TLS handshake timed out");
                                    return;
                                }
                            };
                            let tls_stream = lenient_target::LenientTarget::new(tls_stream);
                            let conn = watcher.watch(http.serve_connection(TokioIo::new(tls_stream), service));
                            if let Err(e) = conn.await {
                                tracing::debug!(%peer, error = %e, "connection ended with an error");
                            }
                        });
                    }
                }
            }
            _ = &mut shutdown => {
                tracing::info!("shutting down: no new connections");
                break;
            }
        }
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("all connections closed"),
        _ = tokio::time::sleep(SHUTDOWN_GRACE) => tracing::warn!("requests still in flight after the grace period; closing"),
    }
}

/// What Go's server answers, and then closes, when a TLS port gets plain HTTP: clients and
/// scripts that probe a port with plain `curl` read it as "something listens here".
const PLAIN_HTTP_ON_TLS: &[u8] =
    b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";

/// Whether a connection to a TLS port opens with an HTTP request rather than a TLS record,
/// told as Go tells it: by the first five bytes (`GET /`, `HEAD `, `POST `, `PUT /`, `OPTIO`).
async fn starts_like_http(stream: &tokio::net::TcpStream, wait: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + wait;
    let mut head = [0u8; 5];
    loop {
        match tokio::time::timeout_at(deadline, stream.peek(&mut head)).await {
            Ok(Ok(5)) => {
                return matches!(&head, b"GET /" | b"HEAD " | b"POST " | b"PUT /" | b"OPTIO")
            }
            // A TLS handshake record: no need to wait for more.
            Ok(Ok(n)) if n > 0 && head[0] == 0x16 => return false,
            // Closed, failed or silent: the TLS handshake says what follows.
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return false,
            // Fewer than five bytes so far: peek returns at once while they wait.
            Ok(Ok(_)) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// Go's 400 to plain HTTP on a TLS port; what the client sent is read before closing, so the
/// close does not reset the connection under the answer.
async fn answer_plain_http_on_tls(mut stream: tokio::net::TcpStream, peer: SocketAddr) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tracing::debug!(%peer, "plain HTTP on a TLS port: answered 400");
    if stream.write_all(PLAIN_HTTP_ON_TLS).await.is_err() {
        return;
    }
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let drain = async { while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {} };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch SIGTERM");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("received SIGTERM"),
        _ = tokio::signal::ctrl_c() => tracing::info!("received SIGINT"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(accept: &str) -> Request<()> {
        Request::builder()
            .header(ACCEPT_ENCODING, accept)
            .body(())
            .unwrap()
    }

    #[test]
    fn gzip_negotiation() {
        assert!(accepts_gzip(&req("gzip")));
        assert!(accepts_gzip(&req("deflate, gzip;q=0.5")));
        assert!(!accepts_gzip(&req("gzip;q=0")));
        assert!(!accepts_gzip(&req("identity")));
        assert!(!accepts_gzip(&Request::new(())));
    }

    #[test]
    fn an_answer_compressed_once_is_smaller_and_the_same_when_unpacked() {
        use std::io::Read;
        // A page of units as /units writes them: repetitive JSON with varying numbers.
        let body: String = (0..400)
            .map(|i| {
                format!(
                    r#"{{"uuid":"{}","user":"user7","project":"proj{}","state":"COMPLETED","total_time_seconds":{{"walltime":{}}}}},"#,
                    100_000 + i * 7919 % 3331,
                    i % 5,
                    i * 37 % 86_400
                )
            })
            .collect();
        let once = gzipped_once(body.as_bytes()).unwrap();
        let fast = gzipped(body.as_bytes()).unwrap();
        assert!(
            once.len() < fast.len(),
            "{} vs {} bytes",
            once.len(),
            fast.len()
        );
        let mut unpacked = String::new();
        flate2::read::GzDecoder::new(&once[..])
            .read_to_string(&mut unpacked)
            .unwrap();
        assert_eq!(unpacked, body);
    }
}
