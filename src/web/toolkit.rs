//! `--web.config.file`: TLS, basic auth and response headers in the YAML format of Prometheus's
//! exporter-toolkit, so existing web-config files keep working. Unsupported or weak settings
//! (TLS 1.0/1.1, CBC suites, unverified client certificates) are refused at start-up with the
//! key that holds them. Certificates are re-read when their files change.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use hyper::header::{HeaderName, HeaderValue};
use rustls::crypto::{ring, CryptoProvider, SupportedKxGroup};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{ServerConfig, SupportedCipherSuite, SupportedProtocolVersion};
use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum WebConfigError {
    #[error("cannot read web config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("web config {path}: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("web config {path}: key `{key}`: {message}")]
    Invalid {
        path: PathBuf,
        key: String,
        message: String,
    },
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileFormat {
    #[serde(default)]
    tls_server_config: Option<TlsServerConfig>,
    #[serde(default)]
    http_server_config: Option<HttpServerConfig>,
    #[serde(default)]
    basic_auth_users: Option<HashMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsServerConfig {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    #[serde(default)]
    client_auth_type: Option<String>,
    #[serde(default)]
    client_ca_file: Option<PathBuf>,
    #[serde(default)]
    cipher_suites: Option<Vec<String>>,
    #[serde(default)]
    curve_preferences: Option<Vec<String>>,
    #[serde(default)]
    min_version: Option<String>,
    #[serde(default)]
    max_version: Option<String>,
    #[serde(default)]
    prefer_server_cipher_suites: Option<bool>,
    #[serde(default)]
    client_allowed_sans: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpServerConfig {
    #[serde(default)]
    http2: Option<bool>,
    #[serde(default)]
    headers: HashMap<String, String>,
}

/// Response headers exporter-toolkit lets a web config set.
const SETTABLE_HEADERS: &[&str] = &[
    "strict-transport-security",
    "x-content-type-options",
    "x-frame-options",
    "x-xss-protection",
    "content-security-policy",
];

/// What a web config file asks of a server.
pub struct WebSecurity {
    pub tls: Option<Arc<ServerConfig>>,
    pub auth: Option<Arc<BasicAuth>>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl std::fmt::Debug for WebSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebSecurity")
            .field("tls", &self.tls.is_some())
            .field("basic_auth", &self.auth.is_some())
            .field("headers", &self.headers.len())
            .finish()
    }
}

fn tls_version(name: &str) -> Result<&'static SupportedProtocolVersion, String> {
    match name {
        "TLS12" => Ok(&rustls::version::TLS12),
        "TLS13" => Ok(&rustls::version::TLS13),
        "TLS10" | "TLS11" => Err(format!(
            "{name} is not supported: TLS 1.0 and 1.1 are broken; use TLS12 or TLS13"
        )),
        other => Err(format!("unknown TLS version `{other}` (TLS12 or TLS13)")),
    }
}

/// Go's names of the TLS 1.2 suites that are offered; TLS 1.3 suites are always all on, as in Go.
fn cipher_suite(name: &str) -> Result<SupportedCipherSuite, String> {
    use ring::cipher_suite as cs;
    if name.contains("_CBC_") {
        return Err(format!(
            "`{name}` is a CBC suite, which is not supported (padding-oracle attacks); use a GCM or ChaCha20-Poly1305 suite"
        ));
    }
    Ok(match name {
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" => cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384" => cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305"
        | "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256" => {
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        }
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" => cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384" => cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305" | "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256" => {
            cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
        }
        other => return Err(format!("unknown or unsupported cipher suite `{other}`")),
    })
}

fn curve(name: &str) -> Result<&'static dyn SupportedKxGroup, String> {
    match name {
        "X25519" => Ok(ring::kx_group::X25519),
        "CurveP256" => Ok(ring::kx_group::SECP256R1),
        "CurveP384" => Ok(ring::kx_group::SECP384R1),
        other => Err(format!(
            "unsupported curve `{other}` (X25519, CurveP256 or CurveP384)"
        )),
    }
}

fn load_certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("{}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in the file", cert.display()));
    }
    let key_der =
        PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
    let signing =
        ring::sign::any_supported_type(&key_der).map_err(|e| format!("{}: {e}", key.display()))?;
    let ck = CertifiedKey::new(certs, signing);
    ck.keys_match().map_err(|e| {
        format!(
            "{} and {} do not belong together: {e}",
            cert.display(),
            key.display()
        )
    })?;
    Ok(ck)
}

type Stamp = [(Option<SystemTime>, u64); 2];

fn stamp(cert: &Path, key: &Path) -> Stamp {
    let one = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| (m.modified().ok(), m.len()))
            .unwrap_or((None, 0))
    };
    [one(cert), one(key)]
}

/// Serves the certificate of `cert_file`/`key_file`, re-reading them when either changes. A
/// change that does not load (a half-written file) keeps the old certificate.
#[derive(Debug)]
pub struct ReloadingCert {
    cert_file: PathBuf,
    key_file: PathBuf,
    state: Mutex<(Stamp, Arc<CertifiedKey>)>,
}

impl ReloadingCert {
    pub fn new(cert_file: PathBuf, key_file: PathBuf) -> Result<ReloadingCert, String> {
        let s = stamp(&cert_file, &key_file);
        let key = load_certified_key(&cert_file, &key_file)?;
        Ok(ReloadingCert {
            cert_file,
            key_file,
            state: Mutex::new((s, Arc::new(key))),
        })
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let now = stamp(&self.cert_file, &self.key_file);
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if now != state.0 {
            state.0 = now;
            match load_certified_key(&self.cert_file, &self.key_file) {
                Ok(k) => {
                    tracing::info!(cert = %self.cert_file.display(), "TLS certificate reloaded");
                    state.1 = Arc::new(k);
                }
                Err(error) => {
                    tracing::warn!(%error, "new TLS certificate does not load; keeping the old one")
                }
            }
        }
        Some(Arc::clone(&state.1))
    }
}

/// Basic auth against bcrypt hashes. Verification runs off the async workers and its results
/// are cached; an unknown user costs the same bcrypt as a known one.
pub struct BasicAuth {
    users: HashMap<String, String>,
    dummy_hash: String,
    cache: Mutex<HashMap<[u8; 32], bool>>,
}

/// Cached verdicts kept at most; the cache is emptied when full.
const AUTH_CACHE_MAX: usize = 1024;

impl BasicAuth {
    pub fn new(users: HashMap<String, String>) -> Result<BasicAuth, (String, String)> {
        let mut cost = bcrypt::DEFAULT_COST;
        for (user, hash) in &users {
            let parts = hash
                .parse::<bcrypt::HashParts>()
                .map_err(|e| (user.clone(), format!("not a bcrypt hash: {e}")))?;
            cost = parts.get_cost();
        }
        // Same cost as the real hashes, so an unknown user takes as long as a wrong password.
        let dummy_hash = bcrypt::hash_with_salt("ceems-dummy", cost, [7u8; 16])
            .map(|h| h.format_for_version(bcrypt::Version::TwoB))
            .map_err(|e| (String::new(), e.to_string()))?;
        Ok(BasicAuth {
            users,
            dummy_hash,
            cache: Mutex::new(HashMap::new()),
        })
    }

    fn cache_key(user: &str, password: &str, hash: &str) -> [u8; 32] {
        use sha2::Digest as _;
        let mut h = sha2::Sha256::new();
        for part in [user, password, hash] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.finalize().into()
    }

    /// Whether `Authorization: Basic …` names a user with the right password. Blocks on
    /// bcrypt: call from a blocking thread.
    pub fn verify_blocking(&self, authorization: Option<&str>) -> bool {
        use base64::Engine as _;
        let Some(encoded) = authorization.and_then(|a| a.strip_prefix("Basic ")) else {
            return false;
        };
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
            return false;
        };
        let Ok(text) = String::from_utf8(decoded) else {
            return false;
        };
        let Some((user, password)) = text.split_once(':') else {
            return false;
        };
        let (hash, known) = match self.users.get(user) {
            Some(h) => (h.as_str(), true),
            None => (self.dummy_hash.as_str(), false),
        };
        let key = Self::cache_key(user, password, hash);
        if let Some(v) = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return *v && known;
        }
        let ok = bcrypt::verify(password, hash).unwrap_or(false) && known;
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= AUTH_CACHE_MAX {
            cache.clear();
        }
        cache.insert(key, ok);
        ok
    }
}

/// The `web.config` table of a subcommand's settings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct WebConfigKey {
    #[serde(default)]
    file: Option<PathBuf>,
}

impl WebSecurity {
    /// The security asked for by `--web.config.file` in `settings`, if any.
    pub fn from_settings(settings: &crate::config::Layered) -> anyhow::Result<Option<WebSecurity>> {
        let key: WebConfigKey = settings.get("web.config")?;
        Ok(match key.file {
            Some(path) => Some(WebSecurity::load(&path)?),
            None => None,
        })
    }

    /// Reads and checks a web config file. Relative certificate paths are relative to the file,
    /// as in exporter-toolkit.
    pub fn load(path: &Path) -> Result<WebSecurity, WebConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| WebConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let file: FileFormat = if text.trim().is_empty() {
            FileFormat::default()
        } else {
            serde_norway::from_str(&text).map_err(|e| WebConfigError::Syntax {
                path: path.to_owned(),
                message: e.to_string(),
            })?
        };
        let invalid = |key: &str, message: String| WebConfigError::Invalid {
            path: path.to_owned(),
            key: key.to_owned(),
            message,
        };
        let base = path.parent().unwrap_or(Path::new("."));
        let resolve = |p: &Path| {
            if p.is_absolute() {
                p.to_owned()
            } else {
                base.join(p)
            }
        };

        let named = |p: &Option<PathBuf>| p.as_deref().is_some_and(|p| !p.as_os_str().is_empty());
        let tls = match file.tls_server_config {
            // As exporter-toolkit: no certificate and no key is plain HTTP (CEEMS's
            // `ceems_tool config create-web-config` writes both empty without --tls).
            Some(t) if !named(&t.cert_file) && !named(&t.key_file) => None,
            None => None,
            Some(t) => Some(Arc::new(build_tls(t, &resolve, &invalid)?)),
        };

        let auth = match file.basic_auth_users {
            Some(users) if !users.is_empty() => Some(Arc::new(BasicAuth::new(users).map_err(
                |(user, message)| invalid(&format!("basic_auth_users.{user}"), message),
            )?)),
            _ => None,
        };

        let mut headers = Vec::new();
        if let Some(http) = file.http_server_config {
            if http.http2 == Some(true) {
                tracing::info!("http_server_config.http2: only HTTP/1.1 is served");
            }
            for (name, value) in http.headers {
                let key = format!("http_server_config.headers.{name}");
                if !SETTABLE_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
                    return Err(invalid(
                        &key,
                        format!(
                            "not a header a web config may set ({})",
                            SETTABLE_HEADERS.join(", ")
                        ),
                    ));
                }
                let n = HeaderName::from_bytes(name.as_bytes())
                    .map_err(|e| invalid(&key, e.to_string()))?;
                let v = HeaderValue::from_str(&value).map_err(|e| invalid(&key, e.to_string()))?;
                headers.push((n, v));
            }
        }
        Ok(WebSecurity { tls, auth, headers })
    }
}

fn build_tls(
    t: TlsServerConfig,
    resolve: &dyn Fn(&Path) -> PathBuf,
    invalid: &dyn Fn(&str, String) -> WebConfigError,
) -> Result<ServerConfig, WebConfigError> {
    let key = |k: &str| format!("tls_server_config.{k}");
    let cert_file = t
        .cert_file
        .as_deref()
        .map(resolve)
        .ok_or_else(|| invalid(&key("cert_file"), "required for TLS".into()))?;
    let key_file = t
        .key_file
        .as_deref()
        .map(resolve)
        .ok_or_else(|| invalid(&key("key_file"), "required for TLS".into()))?;
    if t.client_allowed_sans.is_some() {
        return Err(invalid(
            &key("client_allowed_sans"),
            "not supported yet; restrict clients with client_ca_file".into(),
        ));
    }
    let min = tls_version(t.min_version.as_deref().unwrap_or("TLS12"))
        .map_err(|m| invalid(&key("min_version"), m))?;
    let max = tls_version(t.max_version.as_deref().unwrap_or("TLS13"))
        .map_err(|m| invalid(&key("max_version"), m))?;
    let order = |v: &SupportedProtocolVersion| {
        if v.version == rustls::ProtocolVersion::TLSv1_2 {
            0
        } else {
            1
        }
    };
    if order(min) > order(max) {
        return Err(invalid(&key("min_version"), "is above max_version".into()));
    }
    let versions: Vec<&'static SupportedProtocolVersion> =
        [&rustls::version::TLS12, &rustls::version::TLS13]
            .into_iter()
            .filter(|v| order(v) >= order(min) && order(v) <= order(max))
            .collect();

    let mut provider = ring::default_provider();
    if let Some(names) = &t.cipher_suites {
        let mut suites: Vec<SupportedCipherSuite> = provider
            .cipher_suites
            .iter()
            .copied()
            .filter(|s| matches!(s, SupportedCipherSuite::Tls13(_)))
            .collect();
        for n in names {
            suites.push(cipher_suite(n).map_err(|m| invalid(&key("cipher_suites"), m))?);
        }
        provider.cipher_suites = suites;
    }
    if let Some(names) = &t.curve_preferences {
        provider.kx_groups = names
            .iter()
            .map(|n| curve(n))
            .collect::<Result<_, _>>()
            .map_err(|m| invalid(&key("curve_preferences"), m))?;
    }
    let provider: Arc<CryptoProvider> = Arc::new(provider);

    let verifier = match t.client_auth_type.as_deref().unwrap_or("NoClientCert") {
        "" | "NoClientCert" => None,
        kind @ ("RequireAndVerifyClientCert" | "VerifyClientCertIfGiven") => {
            let ca = t.client_ca_file.as_deref().map(resolve).ok_or_else(|| {
                invalid(&key("client_ca_file"), format!("required with client_auth_type {kind}"))
            })?;
            let mut roots = rustls::RootCertStore::empty();
            let certs = CertificateDer::pem_file_iter(&ca)
                .map_err(|e| invalid(&key("client_ca_file"), format!("{}: {e}", ca.display())))?;
            for c in certs {
                let c = c.map_err(|e| invalid(&key("client_ca_file"), e.to_string()))?;
                roots
                    .add(c)
                    .map_err(|e| invalid(&key("client_ca_file"), e.to_string()))?;
            }
            let builder =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider));
            let builder = if kind == "VerifyClientCertIfGiven" {
                builder.allow_unauthenticated()
            } else {
                builder
            };
            Some(
                builder
                    .build()
                    .map_err(|e| invalid(&key("client_ca_file"), e.to_string()))?,
            )
        }
        kind @ ("RequestClientCert" | "RequireAnyClientCert") => {
            return Err(invalid(
                &key("client_auth_type"),
                format!("{kind} is not supported: a client certificate that is not verified proves nothing; use RequireAndVerifyClientCert"),
            ))
        }
        other => {
            return Err(invalid(
                &key("client_auth_type"),
                format!("unknown value `{other}`"),
            ))
        }
    };

    let resolver =
        ReloadingCert::new(cert_file, key_file).map_err(|m| invalid(&key("cert_file"), m))?;
    let builder = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .map_err(|e| invalid(&key("cipher_suites"), e.to_string()))?;
    let builder = match verifier {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder.with_cert_resolver(Arc::new(resolver));
    cfg.ignore_client_order = t.prefer_server_cipher_suites.unwrap_or(false);
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn cert(dir: &Path) {
        let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        write(dir, "server.crt", &c.cert.pem());
        write(dir, "server.key", &c.signing_key.serialize_pem());
    }

    fn err(dir: &Path, yaml: &str) -> String {
        let p = write(dir, "web.yml", yaml);
        WebSecurity::load(&p).unwrap_err().to_string()
    }

    #[test]
    fn weak_or_unknown_settings_are_refused_naming_the_key() {
        let tmp = tempfile::tempdir().unwrap();
        cert(tmp.path());
        let tls = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n";
        let e = err(tmp.path(), &format!("{tls}  min_version: TLS10\n"));
        assert!(
            e.contains("tls_server_config.min_version") && e.contains("TLS10"),
            "{e}"
        );
        let e = err(
            tmp.path(),
            &format!("{tls}  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA]\n"),
        );
        assert!(
            e.contains("tls_server_config.cipher_suites") && e.contains("CBC"),
            "{e}"
        );
        let e = err(
            tmp.path(),
            &format!("{tls}  client_auth_type: RequireAnyClientCert\n"),
        );
        assert!(e.contains("client_auth_type"), "{e}");
        let e = err(
            tmp.path(),
            &format!("{tls}  client_auth_type: RequireAndVerifyClientCert\n"),
        );
        assert!(e.contains("client_ca_file"), "{e}");
        let e = err(tmp.path(), "tls_server_config:\n  cert_file: server.crt\n");
        assert!(e.contains("key_file"), "{e}");
        let e = err(tmp.path(), "basic_auth_users:\n  alice: plaintext\n");
        assert!(e.contains("basic_auth_users.alice"), "{e}");
        let e = err(
            tmp.path(),
            "http_server_config:\n  headers:\n    Server: x\n",
        );
        assert!(e.contains("headers.Server"), "{e}");
        // Both files empty, as CEEMS's tool writes them without TLS: plain HTTP.
        let plain = tmp.path().join("plain.yml");
        std::fs::write(
            &plain,
            "tls_server_config:\n  cert_file: \"\"\n  key_file: \"\"\nbasic_auth_users: {}\n",
        )
        .unwrap();
        assert!(WebSecurity::load(&plain).unwrap().tls.is_none());
        let e = err(tmp.path(), "tls_config:\n  cert_file: x\n");
        assert!(e.contains("tls_config"), "{e}");
        let e = err(
            tmp.path(),
            &format!("{tls}  min_version: TLS13\n  max_version: TLS12\n"),
        );
        assert!(e.contains("above max_version"), "{e}");

        let ok = write(
            tmp.path(),
            "ok.yml",
            &format!("{tls}  min_version: TLS12\n  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]\n  curve_preferences: [X25519]\nhttp_server_config:\n  headers:\n    X-Frame-Options: deny\n"),
        );
        let s = WebSecurity::load(&ok).unwrap();
        assert!(s.tls.is_some() && s.auth.is_none() && s.headers.len() == 1);
    }

    #[test]
    fn basic_auth_verdicts() {
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let auth = BasicAuth::new(HashMap::from([("alice".to_owned(), hash)])).unwrap();
        use base64::Engine as _;
        let header = |u: &str, p: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        };
        assert!(auth.verify_blocking(Some(&header("alice", "s3cret"))));
        // Cached, still right.
        assert!(auth.verify_blocking(Some(&header("alice", "s3cret"))));
        assert!(!auth.verify_blocking(Some(&header("alice", "wrong"))));
        assert!(!auth.verify_blocking(Some(&header("mallory", "s3cret"))));
        assert!(!auth.verify_blocking(Some("Basic !!!")));
        assert!(!auth.verify_blocking(Some("Bearer x")));
        assert!(!auth.verify_blocking(None));
    }
}
