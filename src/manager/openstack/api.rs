//! The compute (Nova) and identity (Keystone) APIs of one cloud: a Keystone token got with the
//! configured credentials and renewed before it expires (and once on a 401), and each list
//! followed page by page. The credentials are sent to Keystone only, and never logged.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;

use crate::web::client::{agent_with_tls, ClientTls, Timeouts};

#[derive(Debug, thiserror::Error)]
pub enum OpenStackError {
    #[error("{url}: {message}")]
    Request { url: String, message: String },
    #[error("{url}: status {code}: {body}")]
    Status {
        url: String,
        code: u16,
        body: String,
    },
    #[error("{url}: not the answer expected: {message}")]
    Parse { url: String, message: String },
    #[error("Keystone {url}: {message}")]
    Token { url: String, message: String },
    #[error("{url}: more than {MAX_PAGES} pages")]
    TooManyPages { url: String },
}

/// A list longer than this many pages is refused rather than followed for ever.
const MAX_PAGES: usize = 10_000;
/// How long a token lives when Keystone does not say (its default).
const TOKEN_LIFE: Duration = Duration::from_secs(3600);
/// Renewed this long before it expires, for clock skew and slow requests.
const TOKEN_MARGIN: Duration = Duration::from_secs(300);

/// One cloud's endpoints, client and credentials.
pub struct CloudApi {
    compute: String,
    identity: String,
    agent: ureq::Agent,
    headers: Vec<(String, String)>,
    /// `{"auth": …}`, posted to Keystone.
    auth_body: String,
    token: Mutex<Option<(String, Instant)>>,
}

impl std::fmt::Debug for CloudApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloudApi")
            .field("compute", &self.compute)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl CloudApi {
    pub fn new(
        compute: &str,
        identity: &str,
        tls: &ClientTls,
        timeout: Duration,
        headers: Vec<(String, String)>,
        auth: &serde_json::Value,
    ) -> Result<CloudApi, String> {
        Ok(CloudApi {
            compute: compute.trim_end_matches('/').to_owned(),
            identity: identity.trim_end_matches('/').to_owned(),
            agent: agent_with_tls(Timeouts::all(timeout), tls)?,
            headers,
            auth_body: serde_json::json!({ "auth": auth }).to_string(),
            token: Mutex::new(None),
        })
    }

    /// A valid token: the kept one, or a new one from Keystone.
    fn token(&self, renew: bool) -> Result<String, OpenStackError> {
        let mut kept = self.token.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((token, expires)) = kept.as_ref() {
            if !renew && Instant::now() < *expires {
                return Ok(token.clone());
            }
        }
        let url = format!("{}/v3/auth/tokens", self.identity);
        let failed = |message: String| OpenStackError::Token {
            url: url.clone(),
            message,
        };
        let response = self
            .agent
            .post(&url)
            .set("Content-Type", "application/json")
            .send_string(&self.auth_body);
        let response = match response {
            Ok(r) if r.status() == 201 => r,
            Ok(r) => return Err(failed(format!("status {} (201 expected)", r.status()))),
            Err(ureq::Error::Status(code, _)) => {
                return Err(failed(format!(
                    "status {code}: the credentials were refused"
                )))
            }
            Err(e) => return Err(failed(e.to_string())),
        };
        let token = response
            .header("X-Subject-Token")
            .filter(|t| !t.is_empty())
            .ok_or_else(|| failed("no X-Subject-Token in the answer".into()))?
            .to_owned();
        // Keystone says when it expires; without that, its default life.
        let body = response.into_string().unwrap_or_default();
        let life = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| crate::manager::civil::parse_rfc3339(v["token"]["expires_at"].as_str()?))
            .map(|at| Duration::from_secs((at - crate::manager::unix_now()).max(0) as u64))
            .unwrap_or(TOKEN_LIFE);
        let expires = Instant::now() + life.saturating_sub(TOKEN_MARGIN);
        *kept = Some((token.clone(), expires));
        tracing::debug!(url = %url, life_s = life.as_secs(), "new Keystone token");
        Ok(token)
    }

    /// `GET url` with the token: renewed and asked once more on a 401.
    fn get<T: DeserializeOwned>(&self, url: &str) -> Result<T, OpenStackError> {
        let mut renew = false;
        loop {
            let token = self.token(renew)?;
            let mut request = self
                .agent
                .get(url)
                .set("Accept", "application/json")
                .set("X-Auth-Token", &token);
            for (name, value) in &self.headers {
                request = request.set(name, value);
            }
            let body = match request.call() {
                Ok(r) => r.into_string().map_err(|e| OpenStackError::Request {
                    url: url.to_owned(),
                    message: e.to_string(),
                })?,
                Err(ureq::Error::Status(401, _)) if !renew => {
                    renew = true;
                    continue;
                }
                Err(ureq::Error::Status(code, r)) => {
                    let mut body = r.into_string().unwrap_or_default();
                    body.truncate(200);
                    return Err(OpenStackError::Status {
                        url: url.to_owned(),
                        code,
                        body: body.trim().to_owned(),
                    });
                }
                Err(e) => {
                    return Err(OpenStackError::Request {
                        url: url.to_owned(),
                        message: e.to_string(),
                    })
                }
            };
            return serde_json::from_str(&body).map_err(|e| OpenStackError::Parse {
                url: url.to_owned(),
                message: e.to_string(),
            });
        }
    }

    /// Every page of a list from `first`: `next` gives a page's next link; only its query is
    /// kept, asked of the configured endpoint (a cloud's links may name its public host).
    fn pages<P: DeserializeOwned>(
        &self,
        first: &str,
        next: impl Fn(&P) -> Option<String>,
    ) -> Result<Vec<P>, OpenStackError> {
        let base = first.split_once('?').map_or(first, |(b, _)| b).to_owned();
        let mut url = first.to_owned();
        let mut pages = Vec::new();
        loop {
            let page: P = self.get(&url)?;
            let following = next(&page)
                .and_then(|href| href.split_once('?').map(|(_, q)| format!("{base}?{q}")));
            pages.push(page);
            match following {
                Some(n) if n != url => url = n,
                _ => return Ok(pages),
            }
            if pages.len() >= MAX_PAGES {
                return Err(OpenStackError::TooManyPages {
                    url: first.to_owned(),
                });
            }
        }
    }

    /// Every server of every project that `query` selects (`deleted=true`, `uuid=…`, a window).
    pub fn servers(
        &self,
        query: &[(&str, String)],
    ) -> Result<Vec<super::server::Server>, OpenStackError> {
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("all_tenants", "true");
        for (k, v) in query {
            q.append_pair(k, v);
        }
        let first = format!("{}/servers/detail?{}", self.compute, q.finish());
        let pages = self.pages(&first, |p: &super::server::ServerPage| {
            p.next().map(str::to_owned)
        })?;
        Ok(pages.into_iter().flat_map(|p| p.servers).collect())
    }

    /// Keystone's users.
    pub fn users(&self) -> Result<Vec<super::server::Named>, OpenStackError> {
        let first = format!("{}/v3/users", self.identity);
        let pages = self.pages(&first, |p: &super::server::UserPage| p.links.next.clone())?;
        Ok(pages.into_iter().flat_map(|p| p.users).collect())
    }

    /// The projects user `id` has a role in.
    pub fn user_projects(&self, id: &str) -> Result<Vec<super::server::Named>, OpenStackError> {
        let id: String = form_urlencoded::byte_serialize(id.as_bytes()).collect();
        let first = format!("{}/v3/users/{id}/projects", self.identity);
        let pages = self.pages(&first, |p: &super::server::ProjectPage| {
            p.links.next.clone()
        })?;
        Ok(pages.into_iter().flat_map(|p| p.projects).collect())
    }
}
