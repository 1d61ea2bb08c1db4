//! The stats-server's jobs and associations from `slurmrestd` instead of `sacct`/`sacctmgr`,
//! for sites that keep heavy command-line calls off slurmdbd. Two ways in: a unix socket with
//! `rest_auth/local` (slurmrestd accepts only its own uid there, so it runs as the
//! stats-server's user), or HTTP(S) with a JWT (`auth/jwt`) read from a file at each call, so
//! a rotated token is picked up.

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use super::rest_json::{self, HostNames};
use crate::host::ParseError;
use crate::manager::{Accounting, AccountingError, Associations, UnitRecords};

/// Largest answer read (about a million jobs with their steps).
pub const MAX_ANSWER: u64 = 4 << 30;
/// Largest answer for one job or the associations.
const MAX_SMALL_ANSWER: u64 = 64 << 20;

/// The OpenAPI data versions read.
pub const VERSIONS: &[&str] = &["v0.0.38"];
/// Versions Slurm 22.05 also serves, refused with the reason.
pub const REFUSED_VERSIONS: &[(&str, &str)] = &[
    ("v0.0.36", "its jobs' start time is their eligible time (Slurm 22.05), which would file a job under the wrong start"),
    ("v0.0.37", "its jobs' start time is their eligible time (Slurm 22.05), which would file a job under the wrong start"),
];

/// Where slurmrestd listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `unix:/run/slurmrestd.sock`
    Unix(PathBuf),
    /// `http://host:6820` or `https://…`, without a trailing slash.
    Http(String),
}

impl std::str::FromStr for Endpoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Endpoint, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if !path.starts_with('/') {
                return Err(format!("`{s}`: a unix socket needs an absolute path"));
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        if s.starts_with("http://") || s.starts_with("https://") {
            return Ok(Endpoint::Http(s.trim_end_matches('/').to_owned()));
        }
        Err(format!(
            "`{s}` is neither unix:/path/to/socket nor an http(s):// URL"
        ))
    }
}

/// A JWT for `auth/jwt`: the user it was issued to and the file that holds it.
#[derive(Debug, Clone)]
pub struct Jwt {
    pub user: String,
    pub token_file: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum RestError {
    #[error("slurmrestd at {at}: {message}")]
    Request { at: String, message: String },
    #[error("slurmrestd at {at} answered {status}: {body}")]
    Status {
        at: String,
        status: u16,
        body: String,
    },
    #[error("cannot read the slurmrestd token {}: {source}", file.display())]
    Token {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("slurmrestd at {at}: the answer is larger than {limit} bytes")]
    TooLarge { at: String, limit: u64 },
    #[error(transparent)]
    Answer(#[from] rest_json::RestAnswerError),
}

impl From<RestError> for AccountingError {
    fn from(e: RestError) -> AccountingError {
        AccountingError::Other(e.to_string())
    }
}

/// One Slurm cluster's accounting through slurmrestd.
#[derive(Debug, Clone)]
pub struct RestAccounting {
    pub endpoint: Endpoint,
    /// One of [`VERSIONS`].
    pub version: String,
    pub jwt: Option<Jwt>,
    /// `cluster=<name>`, for a slurmdbd that serves several clusters.
    pub slurm_name: Option<String>,
    pub timeout: Duration,
}

impl RestAccounting {
    fn at(&self, path: &str) -> String {
        match &self.endpoint {
            Endpoint::Unix(p) => format!("unix:{}{path}", p.display()),
            Endpoint::Http(url) => format!("{url}{path}"),
        }
    }

    /// `/slurmdb/<version>/<what>` with the cluster filter.
    fn path(&self, what: &str, query: &[(&str, &str)]) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        for (k, v) in query {
            q.append_pair(k, v);
        }
        if let Some(name) = &self.slurm_name {
            q.append_pair("cluster", name);
        }
        let q = q.finish();
        let sep = if q.is_empty() { "" } else { "?" };
        format!("/slurmdb/{}/{what}{sep}{q}", self.version)
    }

    fn headers(&self) -> Result<Vec<(&'static str, String)>, RestError> {
        let Some(jwt) = &self.jwt else {
            return Ok(Vec::new());
        };
        let token =
            std::fs::read_to_string(&jwt.token_file).map_err(|source| RestError::Token {
                file: jwt.token_file.clone(),
                source,
            })?;
        // `scontrol token` prints `SLURM_JWT=<token>`: a file saved from it works as is.
        let token = token.trim();
        let token = token.strip_prefix("SLURM_JWT=").unwrap_or(token);
        Ok(vec![
            ("X-SLURM-USER-NAME", jwt.user.clone()),
            ("X-SLURM-USER-TOKEN", token.to_owned()),
        ])
    }

    /// The body of `GET path`, at most `limit` bytes.
    pub fn get(&self, path: &str, limit: u64) -> Result<String, RestError> {
        self.request("GET", path, limit)
    }

    /// The body of `method path`, at most `limit` bytes; a status other than 2xx is an error
    /// with slurmrestd's reasons.
    fn request(&self, method: &str, path: &str, limit: u64) -> Result<String, RestError> {
        let at = self.at(path);
        let headers = self.headers()?;
        let (status, body) = match &self.endpoint {
            Endpoint::Unix(socket) => {
                fetch_unix(method, socket, path, &headers, limit, self.timeout)
            }
            Endpoint::Http(url) => fetch_http(
                method,
                &format!("{url}{path}"),
                &headers,
                limit,
                self.timeout,
            ),
        }
        .map_err(|message| match message {
            Fetch::TooLarge => RestError::TooLarge {
                at: at.clone(),
                limit,
            },
            Fetch::Failed(message) => RestError::Request {
                at: at.clone(),
                message,
            },
        })?;
        // slurmrestd puts its reasons in a JSON body even on 4xx/5xx; keep them for the log.
        if !(200..300).contains(&status) {
            return Err(RestError::Status {
                at,
                status,
                body: body.trim().chars().take(500).collect(),
            });
        }
        Ok(body)
    }

    fn jobs(&self, path: &str, limit: u64) -> Result<UnitRecords, AccountingError> {
        let body = self.get(path, limit)?;
        let jobs =
            rest_json::parse_jobs(&body, &mut HostNames::default()).map_err(RestError::from)?;
        Ok(crate::manager::whole_answer(jobs))
    }
}

enum Fetch {
    TooLarge,
    Failed(String),
}

fn read_limited(mut reader: impl Read, limit: u64) -> Result<String, Fetch> {
    let mut body = String::new();
    reader
        .by_ref()
        .take(limit)
        .read_to_string(&mut body)
        .map_err(|e| Fetch::Failed(e.to_string()))?;
    let mut more = [0u8; 1];
    match reader.read(&mut more) {
        Ok(0) => Ok(body),
        _ => Err(Fetch::TooLarge),
    }
}

fn fetch_http(
    method: &str,
    url: &str,
    headers: &[(&str, String)],
    limit: u64,
    timeout: Duration,
) -> Result<(u16, String), Fetch> {
    let agent = ureq::AgentBuilder::new().timeout(timeout).build();
    let mut request = agent.request(method, url);
    for (k, v) in headers {
        request = request.set(k, v);
    }
    match request.call() {
        Ok(r) => {
            let status = r.status();
            Ok((status, read_limited(r.into_reader(), limit)?))
        }
        Err(ureq::Error::Status(status, r)) => {
            Ok((status, read_limited(r.into_reader(), MAX_SMALL_ANSWER)?))
        }
        Err(e) => Err(Fetch::Failed(e.to_string())),
    }
}

/// HTTP/1.1 over the unix socket, on a runtime of its own: callers are blocking threads.
fn fetch_unix(
    method: &str,
    socket: &std::path::Path,
    path: &str,
    headers: &[(&str, String)],
    limit: u64,
    timeout: Duration,
) -> Result<(u16, String), Fetch> {
    use http_body_util::BodyExt;
    let failed = |e: &dyn std::fmt::Display| Fetch::Failed(e.to_string());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| failed(&e))?;
    runtime.block_on(async {
        let exchange = async {
            let stream = tokio::net::UnixStream::connect(socket)
                .await
                .map_err(|e| failed(&e))?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .map_err(|e| failed(&e))?;
            tokio::spawn(connection);
            let mut request = hyper::Request::builder()
                .method(method)
                .uri(path)
                .header("Host", "localhost");
            for (k, v) in headers {
                request = request.header(*k, v);
            }
            let request = request
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .map_err(|e| failed(&e))?;
            let response = sender.send_request(request).await.map_err(|e| failed(&e))?;
            let status = response.status().as_u16();
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            let body = http_body_util::Limited::new(response.into_body(), limit)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        Fetch::TooLarge
                    } else {
                        Fetch::Failed(e.to_string())
                    }
                })?
                .to_bytes();
            let body = String::from_utf8(body.to_vec()).map_err(|e| failed(&e))?;
            Ok((status, body))
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or_else(|_| Err(Fetch::Failed(format!("no answer within {timeout:?}"))))
    })
}

impl Accounting for RestAccounting {
    fn manager(&self) -> &'static str {
        super::MANAGER
    }

    fn units_since(&self, seconds_ago: i64) -> Result<UnitRecords, AccountingError> {
        // Relative times, as with sacct: slurmrestd reads absolute ones in its local time zone.
        let start = format!("now-{}", seconds_ago.max(0));
        self.jobs(
            &self.path("jobs", &[("start_time", &start), ("end_time", "now")]),
            MAX_ANSWER,
        )
    }

    /// `DELETE /slurm/<version>/job/<id>`: slurmctld's own API, as the token's user (who must
    /// be allowed to cancel others' jobs: the slurm user, root or an operator).
    fn cancel(&self, unit: &crate::manager::UnitRecord) -> Result<String, AccountingError> {
        crate::manager::check_nameable(unit)?;
        let path = format!("/slurm/{}/job/{}", self.version, unit.uuid);
        self.request("DELETE", &path, MAX_SMALL_ANSWER)?;
        Ok(format!("DELETE {path} through slurmrestd"))
    }

    fn unit(&self, id: &str) -> Result<UnitRecords, AccountingError> {
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(AccountingError::Other(format!(
                "job id `{id}` is not numeric"
            )));
        }
        self.jobs(&self.path(&format!("job/{id}"), &[]), MAX_SMALL_ANSWER)
    }

    fn associations(&self) -> Option<Result<(Associations, Vec<ParseError>), AccountingError>> {
        Some(
            self.get(&self.path("associations", &[]), MAX_SMALL_ANSWER)
                .and_then(|body| rest_json::parse_associations(&body).map_err(RestError::from))
                .map_err(AccountingError::from),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        assert_eq!(
            "unix:/run/slurmrestd.sock".parse(),
            Ok(Endpoint::Unix("/run/slurmrestd.sock".into()))
        );
        assert_eq!(
            "unix:///run/s.sock".parse(),
            Ok(Endpoint::Unix("/run/s.sock".into()))
        );
        assert_eq!(
            "http://slurm:6820/".parse(),
            Ok(Endpoint::Http("http://slurm:6820".into()))
        );
        assert!("unix:relative.sock".parse::<Endpoint>().is_err());
        assert!("slurm:6820".parse::<Endpoint>().is_err());
    }

    fn over(endpoint: Endpoint, slurm_name: Option<&str>) -> RestAccounting {
        RestAccounting {
            endpoint,
            version: "v0.0.38".into(),
            jwt: None,
            slurm_name: slurm_name.map(str::to_owned),
            timeout: Duration::from_secs(5),
        }
    }

    #[test]
    fn paths_carry_the_version_the_window_and_the_cluster() {
        let r = over(Endpoint::Http("http://x".into()), Some("lab 2"));
        assert_eq!(
            r.path("jobs", &[("start_time", "now-900"), ("end_time", "now")]),
            "/slurmdb/v0.0.38/jobs?start_time=now-900&end_time=now&cluster=lab+2"
        );
        assert_eq!(
            over(Endpoint::Http("http://x".into()), None).path("associations", &[]),
            "/slurmdb/v0.0.38/associations"
        );
    }

    /// A one-shot HTTP server on a unix socket that records the request and answers `status`
    /// with `body`.
    fn serve_once(
        socket: &std::path::Path,
        status: &'static str,
        body: String,
    ) -> std::thread::JoinHandle<String> {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::os::unix::net::UnixListener::bind(socket).unwrap();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if line == "\r\n" || line.is_empty() {
                    break;
                }
                head.push_str(&line);
            }
            let mut out = stream;
            write!(
                out,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            head
        })
    }

    #[test]
    fn over_a_unix_socket_with_a_token_from_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("rest.sock");
        let token = dir.path().join("token");
        std::fs::write(&token, "SLURM_JWT=abc.def.ghi\n").unwrap();
        let server = serve_once(
            &socket,
            "200 OK",
            r#"{"errors":[],"associations":[{"account":"physics","user":"alice"}]}"#.into(),
        );
        let mut r = over(Endpoint::Unix(socket), Some("lab"));
        r.jwt = Some(Jwt {
            user: "slurm".into(),
            token_file: token,
        });
        let (a, errors) = r.associations().unwrap().unwrap();
        assert!(errors.is_empty());
        assert_eq!(a.members, [("alice".to_owned(), "physics".to_owned())]);
        let head = server.join().unwrap().to_ascii_lowercase();
        assert!(
            head.starts_with("get /slurmdb/v0.0.38/associations?cluster=lab http/1.1"),
            "{head}"
        );
        assert!(head.contains("x-slurm-user-name: slurm"), "{head}");
        assert!(
            head.contains("x-slurm-user-token: abc.def.ghi\r\n"),
            "{head}"
        );
    }

    #[test]
    fn a_refusal_says_what_slurmrestd_said_and_a_dead_socket_says_where() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("rest.sock");
        let server = serve_once(&socket, "401 UNAUTHORIZED", "Authentication failure".into());
        let r = over(Endpoint::Unix(socket.clone()), None);
        let e = r
            .get("/slurmdb/v0.0.38/jobs", 1000)
            .unwrap_err()
            .to_string();
        server.join().unwrap();
        assert!(
            e.contains("401") && e.contains("Authentication failure"),
            "{e}"
        );
        let e = r
            .get("/slurmdb/v0.0.38/jobs", 1000)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&socket.display().to_string()), "{e}");
    }

    #[test]
    fn an_answer_over_the_limit_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("rest.sock");
        let server = serve_once(&socket, "200 OK", "x".repeat(5000));
        let r = over(Endpoint::Unix(socket), None);
        let e = r.get("/slurmdb/v0.0.38/jobs", 1000).unwrap_err();
        server.join().unwrap();
        assert!(matches!(e, RestError::TooLarge { limit: 1000, .. }), "{e}");
    }
}
