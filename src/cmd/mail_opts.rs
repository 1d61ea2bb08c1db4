//! The mail options the stats-server's digests and `ceems mailprog` share: the SMTP server,
//! the sender and users' addresses. The SMTP password is read from a file or the environment,
//! never from a flag, so it shows in no process list.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use serde::Deserialize;

use crate::config::{self, Kind, Opt};
use crate::notify::smtp::{Delivery, Security, SmtpServer};
use crate::notify::Addresses;

/// The environment variable that holds the SMTP password when no file is given.
pub const PASSWORD_ENV: &str = "CEEMS_SMTP_PASSWORD";

/// The options under `prefix` (`notify.` for the stats-server, empty for mailprog).
pub fn opts(prefix: &str) -> Vec<Opt> {
    let o = |name: &str, kind, help: &str| Opt::new(&format!("{prefix}{name}"), kind, help);
    vec![
        o(
            "smtp.host",
            Kind::Str,
            "SMTP server that takes the mail (empty: none)",
        )
        .default(""),
        o(
            "smtp.port",
            Kind::Int,
            "Its port (0: 587 with starttls, 465 with tls, 25 with none)",
        )
        .default("0"),
        o(
            "smtp.tls",
            Kind::Str,
            "starttls (required), tls (implicit, from the first byte) or none (a relay on this host or a trusted network only)",
        )
        .default("starttls"),
        o(
            "smtp.ca-file",
            Kind::Str,
            "PEM file of CA certificates trusted for the SMTP server besides the public roots",
        )
        .default(""),
        o(
            "smtp.username",
            Kind::Str,
            "User to log in as (empty: no login)",
        )
        .default(""),
        o(
            "smtp.password-file",
            Kind::Str,
            "File that holds the SMTP password (else the CEEMS_SMTP_PASSWORD environment variable)",
        )
        .default(""),
        o(
            "smtp.timeout",
            Kind::Duration,
            "Give up on the SMTP server after this long",
        )
        .default("30s"),
        o(
            "from",
            Kind::Str,
            "Sender of the mail (empty: ceems@<this host's name>)",
        )
        .default(""),
        o(
            "address-template",
            Kind::Str,
            "A user's address; {user} is the user's name",
        )
        .default("{user}@localhost"),
        o(
            "addresses-file",
            Kind::Str,
            "File of `user address` lines that override the template",
        )
        .default(""),
    ]
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct SmtpSettings {
    pub host: String,
    pub port: i64,
    pub tls: String,
    pub ca_file: String,
    pub username: String,
    pub password_file: String,
    #[serde(deserialize_with = "config::de_duration")]
    pub timeout: Duration,
}

/// The shared options as the loader gives them.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct MailSettings {
    pub smtp: SmtpSettings,
    pub from: String,
    pub address_template: String,
    pub addresses_file: String,
}

impl MailSettings {
    /// The SMTP server, or None when no host is set.
    pub fn server(&self) -> anyhow::Result<Option<SmtpServer>> {
        let s = &self.smtp;
        if s.host.is_empty() {
            return Ok(None);
        }
        let security: Security = s
            .tls
            .parse()
            .map_err(|e| anyhow::anyhow!("smtp.tls: {e}"))?;
        let port = match s.port {
            0 => security.default_port(),
            p => u16::try_from(p).with_context(|| format!("smtp.port {p} is not a port"))?,
        };
        let login = match s.username.as_str() {
            "" => None,
            user => Some((user.to_owned(), password(&s.password_file)?)),
        };
        if login.is_some() && security == Security::None && !is_loopback(&s.host) {
            anyhow::bail!(
                "smtp.tls=none would send the SMTP password in clear to {}: use starttls or tls",
                s.host
            );
        }
        Ok(Some(SmtpServer {
            host: s.host.clone(),
            port,
            security,
            ca_file: (!s.ca_file.is_empty()).then(|| PathBuf::from(&s.ca_file)),
            login,
            timeout: s.timeout,
        }))
    }

    pub fn delivery(&self, server: &SmtpServer) -> anyhow::Result<Delivery> {
        Delivery::smtp(server).map_err(anyhow::Error::msg)
    }

    pub fn sender(&self) -> anyhow::Result<lettre::message::Mailbox> {
        let from = match self.from.as_str() {
            "" => format!(
                "ceems <ceems@{}>",
                nix::unistd::gethostname()
                    .ok()
                    .and_then(|h| h.into_string().ok())
                    .unwrap_or_else(|| "localhost".to_owned())
            ),
            f => f.to_owned(),
        };
        from.parse()
            .with_context(|| format!("from: `{from}` is not an address"))
    }

    pub fn addresses(&self) -> anyhow::Result<Addresses> {
        let file = (!self.addresses_file.is_empty()).then(|| Path::new(&self.addresses_file));
        Addresses::with_file(&self.address_template, file).map_err(anyhow::Error::msg)
    }
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback())
}

fn password(file: &str) -> anyhow::Result<String> {
    if !file.is_empty() {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read smtp.password-file {file}"))?;
        return Ok(text.trim_end_matches(['\n', '\r']).to_owned());
    }
    std::env::var(PASSWORD_ENV).map_err(|_| {
        anyhow::anyhow!(
            "smtp.username is set but there is no password: set smtp.password-file or {PASSWORD_ENV}"
        )
    })
}
