//! A small HTTP(S) server on 127.0.0.1 for stand-ins of remote services: one thread per
//! connection, one request per connection, answers from a closure. It records what it was
//! sent and can be made slow.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// Path with its query string.
    pub target: String,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }
}

pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(status: u16, v: Value) -> Response {
        Response {
            status,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: v.to_string().into_bytes(),
        }
    }

    pub fn raw(status: u16, body: impl Into<Vec<u8>>) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    pub fn with_header(mut self, k: &str, v: &str) -> Response {
        self.headers.push((k.to_owned(), v.to_owned()));
        self
    }
}

pub type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

pub struct TestServer {
    pub port: u16,
    pub tls: bool,
    /// The server's self-signed certificate (PEM), for clients that check it.
    pub cert_pem: String,
    stop: Arc<AtomicBool>,
    delay: Arc<Mutex<Duration>>,
    seen: Arc<Mutex<Vec<Request>>>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

impl TestServer {
    pub fn start(tls: bool, handler: Handler) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind stand-in");
        let port = listener.local_addr().expect("addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let delay = Arc::new(Mutex::new(Duration::ZERO));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (tls_config, cert_pem) = match tls.then(self_signed) {
            Some((config, pem)) => (Some(config), pem),
            None => (None, String::new()),
        };
        let (stop2, delay2, seen2) = (Arc::clone(&stop), Arc::clone(&delay), Arc::clone(&seen));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::Acquire) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (handler, delay, seen) = (
                    Arc::clone(&handler),
                    Arc::clone(&delay2),
                    Arc::clone(&seen2),
                );
                let tls_config = tls_config.clone();
                std::thread::spawn(move || {
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
                    let answer = |stream: &mut dyn ReadWrite| {
                        let Some(req) = read_request(stream) else {
                            return;
                        };
                        seen.lock().unwrap().push(req.clone());
                        let d = *delay.lock().unwrap();
                        if !d.is_zero() {
                            std::thread::sleep(d);
                        }
                        write_response(stream, &handler(&req));
                    };
                    match tls_config {
                        Some(cfg) => {
                            let Ok(server) = rustls::ServerConnection::new(cfg) else {
                                return;
                            };
                            answer(&mut rustls::StreamOwned::new(server, conn));
                        }
                        None => answer(&mut { conn }),
                    }
                });
            }
        });
        TestServer {
            port,
            tls,
            cert_pem,
            stop,
            delay,
            seen,
        }
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Every answer waits this long first (a slow or hung service).
    pub fn set_delay(&self, d: Duration) {
        *self.delay.lock().unwrap() = d;
    }

    pub fn seen(&self) -> Vec<Request> {
        self.seen.lock().unwrap().clone()
    }
}

pub trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

fn self_signed() -> (Arc<rustls::ServerConfig>, String) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
        .expect("self-signed certificate");
    let pem = cert.cert.pem();
    let der = cert.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![der], key)
        .expect("server certificate");
    (Arc::new(cfg), pem)
}

fn read_request(stream: &mut dyn ReadWrite) -> Option<Request> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let target = parts.next()?.to_owned();
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
        target,
        headers,
        body,
    })
}

fn write_response(stream: &mut dyn ReadWrite, resp: &Response) {
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
