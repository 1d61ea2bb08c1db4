//! A web config file to start with (`ceems tool config create-web-config`, as CEEMS's
//! `ceems_tool`): basic auth for user `ceems` with a random password stored as its bcrypt
//! hash, and a self-signed certificate for the named hosts. Every server's
//! `--web.config.file` reads it.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The user the generated file admits, as CEEMS's tool names it.
pub const BASIC_AUTH_USER: &str = "ceems";
/// Where the certificate and its key go, beside the file (which names them relatively).
pub const CERT_FILE: &str = "cert.pem";
pub const KEY_FILE: &str = "key.pem";
/// The generated file's name.
pub const WEB_CONFIG_FILE: &str = "web-config.yml";

/// Length and alphabet of a generated password, as CEEMS's.
const PASSWORD_LENGTH: usize = 24;
const PASSWORD_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
/// bcrypt's cost, as CEEMS's tool and Prometheus's docs use.
const BCRYPT_COST: u32 = 10;

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot hash the password: {0}")]
    Hash(#[from] bcrypt::BcryptError),
    #[error("cannot make a certificate for {hosts:?}: {reason}")]
    Certificate { hosts: Vec<String>, reason: String },
    #[error("a certificate needs at least one host name or address (--tls.host)")]
    NoHost,
}

/// What was written.
#[derive(Debug)]
pub struct Generated {
    pub web_config: PathBuf,
    /// The basic-auth password in plain text, shown once; None without basic auth.
    pub password: Option<String>,
    pub certificate: Option<PathBuf>,
}

/// Writes `web-config.yml` (mode 0600) in `dir`, made if missing: basic auth when asked, and a
/// self-signed certificate valid `validity` for `tls_hosts` when some are given.
pub fn web_config(
    dir: &Path,
    basic_auth: bool,
    tls_hosts: Option<&[String]>,
    validity: Duration,
) -> Result<Generated, GenerateError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| GenerateError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut yaml = String::new();
    let certificate = match tls_hosts {
        None => None,
        Some([]) => return Err(GenerateError::NoHost),
        Some(hosts) => {
            let (cert, key) = self_signed(hosts, validity)?;
            let (cert_path, key_path) = (dir.join(CERT_FILE), dir.join(KEY_FILE));
            write_private(&key_path, key.as_bytes()).map_err(io(&key_path))?;
            std::fs::write(&cert_path, cert).map_err(io(&cert_path))?;
            yaml.push_str(&format!(
                "tls_server_config:\n  cert_file: {CERT_FILE}\n  key_file: {KEY_FILE}\n"
            ));
            Some(cert_path)
        }
    };
    let password = match basic_auth {
        false => None,
        true => {
            let password = random_password().map_err(io(Path::new("/dev/urandom")))?;
            let hash = bcrypt::hash(&password, BCRYPT_COST)?;
            yaml.push_str(&format!("basic_auth_users:\n  {BASIC_AUTH_USER}: {hash}\n"));
            Some(password)
        }
    };
    let web_config = dir.join(WEB_CONFIG_FILE);
    write_private(&web_config, yaml.as_bytes()).map_err(io(&web_config))?;
    Ok(Generated {
        web_config,
        password,
        certificate,
    })
}

/// Writes a file only its owner may read.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}

/// A password from the kernel's random source, each character drawn without bias.
fn random_password() -> std::io::Result<String> {
    let mut random = std::fs::File::open("/dev/urandom")?;
    let mut password = String::with_capacity(PASSWORD_LENGTH);
    // The largest multiple of the alphabet's size below 256: bytes above are drawn again.
    let limit = 256 - 256 % PASSWORD_ALPHABET.len();
    let mut byte = [0u8; 1];
    while password.len() < PASSWORD_LENGTH {
        random.read_exact(&mut byte)?;
        if usize::from(byte[0]) < limit {
            password.push(char::from(
                PASSWORD_ALPHABET[usize::from(byte[0]) % PASSWORD_ALPHABET.len()],
            ));
        }
    }
    Ok(password)
}

/// A self-signed ECDSA P-256 certificate and its PKCS #8 key, PEM.
fn self_signed(hosts: &[String], validity: Duration) -> Result<(String, String), GenerateError> {
    let failed = |reason: String| GenerateError::Certificate {
        hosts: hosts.to_vec(),
        reason,
    };
    let day = |t: jiff::Timestamp| {
        let d = t.to_zoned(jiff::tz::TimeZone::UTC).date();
        rcgen::date_time_ymd(i32::from(d.year()), d.month() as u8, d.day() as u8)
    };
    let now = jiff::Timestamp::now();
    let until = jiff::SignedDuration::try_from(validity)
        .ok()
        .and_then(|v| now.checked_add(v).ok())
        .ok_or_else(|| failed(format!("a validity of {validity:?} ends too late")))?;
    let mut params =
        rcgen::CertificateParams::new(hosts.to_vec()).map_err(|e| failed(e.to_string()))?;
    params.not_before = day(now);
    params.not_after = day(until);
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "ceems");
    // Not a CA (CEEMS's is): rustls refuses a CA's certificate as a server's, and a client
    // that is given this certificate as its root trusts it as it is.
    params.is_ca = rcgen::IsCa::NoCa;
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = rcgen::KeyPair::generate().map_err(|e| failed(e.to_string()))?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| failed(e.to_string()))?;
    Ok((cert.pem(), key.serialize_pem()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file loads as a web config: TLS with the certificate beside it, basic auth that
    /// admits the password shown and nothing else.
    #[test]
    fn the_written_file_is_a_web_config_that_admits_the_password_shown() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("config");
        let hosts = ["example.com".to_owned(), "127.0.0.1".to_owned()];
        let g = web_config(&dir, true, Some(&hosts), Duration::from_secs(86400)).unwrap();
        let password = g.password.unwrap();
        assert_eq!(password.len(), PASSWORD_LENGTH);
        assert!(password.bytes().all(|b| PASSWORD_ALPHABET.contains(&b)));
        let security = crate::web::toolkit::WebSecurity::load(&g.web_config).unwrap();
        assert!(security.tls.is_some());
        let auth = security.auth.unwrap();
        let basic = |user: &str, pw: &str| {
            use base64::Engine as _;
            let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pw}"));
            auth.verify_blocking(Some(&format!("Basic {token}")))
        };
        assert!(basic(BASIC_AUTH_USER, &password));
        assert!(!basic(BASIC_AUTH_USER, "guess"));
        use std::os::unix::fs::PermissionsExt as _;
        for f in [WEB_CONFIG_FILE, KEY_FILE] {
            let mode = std::fs::metadata(dir.join(f)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{f}");
        }
        // Two runs, two passwords.
        let again = web_config(&dir, true, None, Duration::from_secs(1)).unwrap();
        assert_ne!(again.password.unwrap(), password);
        assert!(crate::web::toolkit::WebSecurity::load(&again.web_config)
            .unwrap()
            .tls
            .is_none());
        assert!(matches!(
            web_config(&dir, false, Some(&[]), Duration::from_secs(1)),
            Err(GenerateError::NoHost)
        ));
    }
}
