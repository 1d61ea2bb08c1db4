//! cacct's HTTP client: the config's TLS and credentials, or a MUNGE credential made for each
//! request; bodies gunzipped.

use std::io::Read as _;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::http_client::ClientSettings;

use super::AcctError;

/// Each request carries a fresh MUNGE credential made for it (`munge --string`).
#[derive(Debug, Clone)]
pub struct Munge {
    /// munged's socket; none: its default.
    pub socket: Option<PathBuf>,
}

impl Munge {
    pub(super) fn of(on: bool, socket: &str) -> Option<Munge> {
        on.then(|| Munge {
            socket: (!socket.is_empty()).then(|| PathBuf::from(socket)),
        })
    }

    /// A credential of the caller's uid whose payload is `request`.
    fn credential(&self, request: &str) -> Result<String, String> {
        let mut command = std::process::Command::new("munge");
        if let Some(socket) = &self.socket {
            command.arg(format!("--socket={}", socket.display()));
        }
        let out = command
            .arg(format!("--string={request}"))
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("cannot run munge: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "munge: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }
}

/// A client of one server with these settings.
pub struct Client {
    agent: ureq::Agent,
    settings: ClientSettings,
    munge: Option<Munge>,
}

impl Client {
    pub fn new(
        settings: &ClientSettings,
        munge: Option<Munge>,
        timeout: Duration,
    ) -> Result<Client, AcctError> {
        let agent =
            crate::web::client::agent_for(settings, crate::web::client::Timeouts::all(timeout))
                .map_err(|reason| AcctError::Request {
                    url: settings.url.clone(),
                    reason,
                })?;
        Ok(Client {
            agent,
            settings: settings.clone(),
            munge,
        })
    }

    /// GET `path` with `params` (and `extra` headers): the status and the body, gunzipped.
    pub(super) fn get(
        &self,
        path: &str,
        params: &[(String, String)],
        extra: &[(&str, &str)],
    ) -> Result<(u16, Vec<u8>), AcctError> {
        let base = self.settings.url.trim_end_matches('/');
        let mut url = format!("{base}{path}");
        if !params.is_empty() {
            let mut query = form_urlencoded::Serializer::new(String::new());
            for (k, v) in params {
                query.append_pair(k, v);
            }
            url = format!("{url}?{}", query.finish());
        }
        let failed = |reason: String| AcctError::Request {
            url: url.clone(),
            reason,
        };
        let mut request = self.agent.get(&url).set("Accept-Encoding", "gzip");
        let munge = match &self.munge {
            // The credential is made for this request: the path and query the server sees.
            Some(m) => {
                let after_host = url.splitn(4, '/').nth(3).unwrap_or_default();
                let credential = m
                    .credential(&format!("GET /{after_host}"))
                    .map_err(&failed)?;
                request = request.set("Authorization", &format!("MUNGE {credential}"));
                true
            }
            None => false,
        };
        for (k, v) in &self.settings.headers {
            if !(munge && k.eq_ignore_ascii_case("authorization")) {
                request = request.set(k, v);
            }
        }
        for (k, v) in extra {
            request = request.set(k, v);
        }
        let response = match request.call() {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => return Err(failed(e.to_string())),
        };
        let status = response.status();
        let gzip = response
            .header("Content-Encoding")
            .is_some_and(|e| e.eq_ignore_ascii_case("gzip"));
        let mut body = Vec::new();
        let limit = 256 << 20;
        let read = match gzip {
            true => flate2::read::GzDecoder::new(response.into_reader().take(limit))
                .take(limit)
                .read_to_end(&mut body),
            false => response.into_reader().take(limit).read_to_end(&mut body),
        };
        read.map_err(|e| failed(e.to_string()))?;
        Ok((status, body))
    }
}
