//! A `web:` section of CEEMS's YAML files: a server's URL and Prometheus's HTTP client settings
//! (`basic_auth`, `authorization`, `bearer_token`, `tls_config`, `http_headers`, …), with the
//! files they name read once, relative to the config file's directory, as Prometheus does.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

/// The section as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientWeb {
    #[serde(default)]
    pub url: String,
    #[serde(default)]
    basic_auth: Option<BasicAuth>,
    #[serde(default)]
    authorization: Option<Authorization>,
    #[serde(default)]
    bearer_token: Option<String>,
    #[serde(default)]
    bearer_token_file: Option<String>,
    #[serde(default)]
    oauth2: Option<serde_norway::Value>,
    #[serde(default)]
    tls_config: Option<TlsConfig>,
    #[serde(default)]
    http_headers: BTreeMap<String, Header>,
    /// Prometheus's transport switches: accepted, as every client here behaves the same.
    #[serde(default)]
    follow_redirects: Option<bool>,
    #[serde(default)]
    enable_http2: Option<bool>,
    #[serde(default)]
    proxy_url: Option<String>,
    #[serde(default)]
    no_proxy: Option<String>,
    #[serde(default)]
    proxy_from_environment: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct BasicAuth {
    #[serde(default)]
    username: String,
    #[serde(default)]
    username_file: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    password_file: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Authorization {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    credentials: Option<String>,
    #[serde(default)]
    credentials_file: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsConfig {
    #[serde(default)]
    ca: Option<String>,
    #[serde(default)]
    ca_file: Option<String>,
    #[serde(default)]
    cert: Option<String>,
    #[serde(default)]
    cert_file: Option<String>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    key_file: Option<String>,
    #[serde(default)]
    insecure_skip_verify: bool,
    #[serde(default)]
    server_name: Option<String>,
    #[serde(default)]
    min_version: Option<String>,
    #[serde(default)]
    max_version: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    #[serde(default)]
    values: Vec<String>,
    #[serde(default)]
    secrets: Vec<String>,
    #[serde(default)]
    files: Vec<String>,
}

/// What a client sends and trusts, the named files read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientSettings {
    pub url: String,
    /// Headers of every request, `Authorization` included.
    pub headers: Vec<(String, String)>,
    /// PEM roots; empty: the public ones.
    pub ca_pem: Vec<u8>,
    /// PEM certificate and key of this client.
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    pub insecure_skip_verify: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientConfigError {
    #[error("{path}: {source}")]
    File {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

impl ClientWeb {
    /// The settings, with files relative to `dir`.
    pub fn resolve(&self, dir: &Path) -> Result<ClientSettings, ClientConfigError> {
        let read = |file: &str| -> Result<Vec<u8>, ClientConfigError> {
            let path = dir.join(file);
            std::fs::read(&path).map_err(|source| ClientConfigError::File {
                path: path.display().to_string(),
                source,
            })
        };
        let text = |file: &str| -> Result<String, ClientConfigError> {
            Ok(String::from_utf8_lossy(&read(file)?).trim().to_owned())
        };
        let one_of = |inline: &Option<String>,
                      file: &Option<String>,
                      what: &str|
         -> Result<Option<String>, ClientConfigError> {
            match (inline, file) {
                (Some(_), Some(_)) => Err(ClientConfigError::Invalid(format!(
                    "at most one of {what} and {what}_file"
                ))),
                (Some(v), None) => Ok(Some(v.clone())),
                (None, Some(f)) => text(f).map(Some),
                (None, None) => Ok(None),
            }
        };
        if self.oauth2.is_some() {
            return Err(ClientConfigError::Invalid(
                "oauth2 is not supported: use basic_auth, authorization or http_headers".into(),
            ));
        }
        let proxied = self.proxy_url.is_some()
            || self.no_proxy.is_some()
            || self.proxy_from_environment == Some(true);
        if proxied {
            return Err(ClientConfigError::Invalid(
                "proxies (proxy_url, no_proxy, proxy_from_environment) are not supported".into(),
            ));
        }
        // Every client here follows no redirect and speaks HTTP/1.1: both switches are moot.
        let _ = (self.follow_redirects, self.enable_http2);
        let mut headers = Vec::new();
        let mut credentials = 0;
        if let Some(auth) = &self.basic_auth {
            use base64::Engine as _;
            let user = match &auth.username_file {
                Some(f) => text(f)?,
                None => auth.username.clone(),
            };
            let password = one_of(&auth.password, &auth.password_file, "password")?;
            let pair = base64::engine::general_purpose::STANDARD
                .encode(format!("{user}:{}", password.unwrap_or_default()));
            headers.push(("Authorization".to_owned(), format!("Basic {pair}")));
            credentials += 1;
        }
        if let Some(auth) = &self.authorization {
            let kind = auth.kind.clone().unwrap_or_else(|| "Bearer".to_owned());
            let secret = one_of(&auth.credentials, &auth.credentials_file, "credentials")?;
            headers.push((
                "Authorization".to_owned(),
                format!("{kind} {}", secret.unwrap_or_default()),
            ));
            credentials += 1;
        }
        if let Some(token) = one_of(&self.bearer_token, &self.bearer_token_file, "bearer_token")? {
            headers.push(("Authorization".to_owned(), format!("Bearer {token}")));
            credentials += 1;
        }
        if credentials > 1 {
            return Err(ClientConfigError::Invalid(
                "at most one of basic_auth, authorization and bearer_token".into(),
            ));
        }
        for (name, h) in &self.http_headers {
            let mut values: Vec<String> = h.values.iter().chain(&h.secrets).cloned().collect();
            for f in &h.files {
                values.push(text(f)?);
            }
            for v in values {
                headers.push((name.clone(), v));
            }
        }
        let tls = self.tls_config.clone().unwrap_or_default();
        if tls.server_name.is_some() {
            return Err(ClientConfigError::Invalid(
                "tls_config: server_name is not supported".into(),
            ));
        }
        for version in [&tls.min_version, &tls.max_version].into_iter().flatten() {
            // rustls speaks TLS 1.2 and 1.3; an older minimum changes nothing.
            if !matches!(version.as_str(), "" | "TLS10" | "TLS11" | "TLS12" | "TLS13") {
                return Err(ClientConfigError::Invalid(format!(
                    "tls_config: unknown TLS version `{version}`"
                )));
            }
        }
        let pem = |inline: &Option<String>,
                   file: &Option<String>,
                   what: &str|
         -> Result<Option<Vec<u8>>, ClientConfigError> {
            match (inline, file) {
                (Some(_), Some(_)) => Err(ClientConfigError::Invalid(format!(
                    "tls_config: at most one of {what} and {what}_file"
                ))),
                (Some(v), None) => Ok(Some(v.clone().into_bytes())),
                (None, Some(f)) => read(f).map(Some),
                (None, None) => Ok(None),
            }
        };
        let identity = match (
            pem(&tls.cert, &tls.cert_file, "cert")?,
            pem(&tls.key, &tls.key_file, "key")?,
        ) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => {
                return Err(ClientConfigError::Invalid(
                    "tls_config: a client certificate and its key go together".into(),
                ))
            }
        };
        Ok(ClientSettings {
            url: self.url.clone(),
            headers,
            ca_pem: pem(&tls.ca, &tls.ca_file, "ca")?.unwrap_or_default(),
            identity_pem: identity,
            insecure_skip_verify: tls.insecure_skip_verify,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn web(yaml: &str) -> ClientWeb {
        serde_norway::from_str(yaml).unwrap()
    }

    #[test]
    fn basic_auth_and_headers_become_request_headers() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "s3cret\n").unwrap();
        let s = web("url: http://h:9020\nbasic_auth:\n  username: ceems\n  password: password\nhttp_headers:\n  X-Site:\n    values: [a]\n    files: [token]\n")
            .resolve(dir.path())
            .unwrap();
        assert_eq!(s.url, "http://h:9020");
        assert_eq!(
            s.headers,
            vec![
                ("Authorization".into(), "Basic Y2VlbXM6cGFzc3dvcmQ=".into()),
                ("X-Site".into(), "a".into()),
                ("X-Site".into(), "s3cret".into()),
            ]
        );
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_with_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        let err = |yaml: &str| web(yaml).resolve(dir.path()).unwrap_err().to_string();
        assert!(err("oauth2:\n  client_id: x\n").contains("oauth2"));
        assert!(err("basic_auth:\n  username: a\n  password_file: missing\n").contains("missing"));
        assert!(err("basic_auth:\n  username: a\nbearer_token: t\n").contains("at most one"));
        assert!(err("tls_config:\n  cert: x\n").contains("go together"));
        assert!(serde_norway::from_str::<ClientWeb>("urll: x\n").is_err());
    }
}
