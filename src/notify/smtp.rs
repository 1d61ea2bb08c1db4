//! Where messages go: an SMTP server through lettre (STARTTLS, implicit TLS, or plain on a
//! trusted relay), or, in a dry run, `.eml` files in a directory.

use std::path::PathBuf;
use std::time::Duration;

use lettre::address::Envelope;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};

/// How the connection to the SMTP server is secured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Security {
    /// Plain connection upgraded with STARTTLS, which the server must offer (port 587).
    StartTls,
    /// TLS from the first byte (port 465).
    Implicit,
    /// No TLS: only for a relay on the same host or a trusted network (port 25).
    None,
}

impl std::str::FromStr for Security {
    type Err = String;

    fn from_str(s: &str) -> Result<Security, String> {
        match s {
            "starttls" => Ok(Security::StartTls),
            "tls" => Ok(Security::Implicit),
            "none" => Ok(Security::None),
            other => Err(format!("`{other}` is not one of starttls, tls, none")),
        }
    }
}

impl Security {
    pub fn default_port(self) -> u16 {
        match self {
            Security::StartTls => 587,
            Security::Implicit => 465,
            Security::None => 25,
        }
    }
}

/// An SMTP server and how to log in to it.
#[derive(Debug, Clone)]
pub struct SmtpServer {
    pub host: String,
    pub port: u16,
    pub security: Security,
    /// PEM certificates trusted besides the web PKI roots (a site CA).
    pub ca_file: Option<PathBuf>,
    /// User name and password; the password comes from a file or the environment, never from
    /// a flag.
    pub login: Option<(String, String)>,
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum MailError {
    /// The server refused the recipient or the message for good (5xx): retrying is useless.
    #[error("refused by the SMTP server: {0}")]
    Refused(String),
    /// The server could not be reached or answered "try later" (4xx), or a login failed: the
    /// message waits for the next attempt.
    #[error("not delivered now: {0}")]
    Deferred(String),
    #[error("{0}")]
    Setup(String),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Where messages are delivered.
pub enum Delivery {
    Smtp(Box<AsyncSmtpTransport<Tokio1Executor>>),
    /// Dry run: each message becomes `<name>.eml` here.
    Directory(PathBuf),
}

impl Delivery {
    pub fn smtp(server: &SmtpServer) -> Result<Delivery, MailError> {
        let tls = || -> Result<TlsParameters, MailError> {
            let mut builder = TlsParameters::builder(server.host.clone());
            if let Some(path) = &server.ca_file {
                let pem = std::fs::read(path).map_err(|e| {
                    MailError::Setup(format!("cannot read the CA file {}: {e}", path.display()))
                })?;
                let cert = Certificate::from_pem(&pem).map_err(|e| {
                    MailError::Setup(format!("{} holds no PEM certificate: {e}", path.display()))
                })?;
                builder = builder.add_root_certificate(cert);
            }
            builder
                .build_rustls()
                .map_err(|e| MailError::Setup(format!("TLS settings: {e}")))
        };
        let tls = match server.security {
            Security::StartTls => Tls::Required(tls()?),
            Security::Implicit => Tls::Wrapper(tls()?),
            Security::None => Tls::None,
        };
        let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&server.host)
            .port(server.port)
            .tls(tls)
            .timeout(Some(server.timeout));
        if let Some((user, password)) = &server.login {
            builder = builder.credentials(Credentials::new(user.clone(), password.clone()));
        }
        Ok(Delivery::Smtp(Box::new(builder.build())))
    }

    /// Delivers one formatted message. `name` names its file in a dry run.
    pub async fn send(&self, envelope: &Envelope, raw: &[u8], name: &str) -> Result<(), MailError> {
        match self {
            Delivery::Smtp(transport) => transport
                .send_raw(envelope, raw)
                .await
                .map(|_| ())
                .map_err(classify),
            Delivery::Directory(dir) => {
                let path = dir.join(format!("{name}.eml"));
                let tmp = dir.join(format!(".{name}.eml.tmp"));
                std::fs::create_dir_all(dir)
                    .and_then(|()| std::fs::write(&tmp, raw))
                    .and_then(|()| std::fs::rename(&tmp, &path))
                    .map_err(|source| MailError::Write { path, source })
            }
        }
    }
}

/// A 5xx refuses the recipient or the message for good, except a refused login: that is the
/// site's configuration, and the message waits until it is fixed.
fn classify(e: lettre::transport::smtp::Error) -> MailError {
    let text = e.to_string();
    match e.status().map(|c| c.to_string()) {
        Some(code) if e.is_permanent() && !code.starts_with("53") => MailError::Refused(text),
        _ => MailError::Deferred(text),
    }
}

/// Delivery to an SMTP port nothing listens on: every message is deferred, as when the
/// server is down.
#[cfg(test)]
pub(crate) fn unreachable() -> Delivery {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    Delivery::smtp(&SmtpServer {
        host: "127.0.0.1".into(),
        port,
        security: Security::None,
        ca_file: None,
        login: None,
        timeout: Duration::from_secs(5),
    })
    .expect("an SMTP transport")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn security_names_and_ports() {
        assert_eq!("starttls".parse(), Ok(Security::StartTls));
        assert_eq!(
            "tls".parse::<Security>().map(Security::default_port),
            Ok(465)
        );
        assert_eq!(
            "none".parse::<Security>().map(Security::default_port),
            Ok(25)
        );
        let err = "ssl".parse::<Security>().unwrap_err();
        assert!(err.contains("starttls, tls, none"), "{err}");
    }

    #[tokio::test]
    async fn a_dry_run_writes_the_message_as_an_eml_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out");
        let delivery = Delivery::Directory(dir.clone());
        let envelope = Envelope::new(
            Some("ceems@example.org".parse().unwrap()),
            vec!["alice@example.org".parse().unwrap()],
        )
        .unwrap();
        delivery
            .send(&envelope, b"Subject: x\r\n\r\nbody\r\n", "digest-1")
            .await
            .unwrap();
        assert_eq!(
            std::fs::read(dir.join("digest-1.eml")).unwrap(),
            b"Subject: x\r\n\r\nbody\r\n"
        );
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "a temporary file is left: {names:?}");
    }

    #[tokio::test]
    async fn an_smtp_server_that_is_down_defers_the_message() {
        let delivery = unreachable();
        let envelope = Envelope::new(None, vec!["alice@example.org".parse().unwrap()]).unwrap();
        let err = delivery.send(&envelope, b"x", "x").await.unwrap_err();
        assert!(matches!(err, MailError::Deferred(_)), "{err}");
    }
}
