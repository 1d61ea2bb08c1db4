//! Telling users about their jobs: a digest of each user's findings every period (from the
//! stats-server, through an outbox in its database), and Slurm's end-of-job mail with the
//! job's report (`ceems mailprog`). Messages are built by lettre, which encodes every header,
//! so nothing from a job's record can add a header or a recipient.

pub mod campaign;
pub mod digest;
pub mod outbox;
pub mod smtp;

use std::collections::HashMap;
use std::path::Path;
use std::time::SystemTime;

use lettre::address::Envelope;
use lettre::message::header::{HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::Message;

/// How a user's address is found: a per-user file first, else the template.
#[derive(Debug, Clone, Default)]
pub struct Addresses {
    /// `{user}` is replaced by the user's name, e.g. `{user}@example.org`.
    pub template: String,
    pub overrides: HashMap<String, String>,
}

impl Addresses {
    /// Reads the per-user file: `user address` per line, `#` starts a comment.
    pub fn with_file(template: &str, file: Option<&Path>) -> Result<Addresses, String> {
        let mut overrides = HashMap::new();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            for (n, line) in text.lines().enumerate() {
                let line = line.split('#').next().unwrap_or("").trim();
                if line.is_empty() {
                    continue;
                }
                let mut words = line.split_whitespace();
                match (words.next(), words.next(), words.next()) {
                    (Some(user), Some(address), None) => {
                        address.parse::<lettre::Address>().map_err(|e| {
                            format!("{} line {}: `{address}`: {e}", path.display(), n + 1)
                        })?;
                        overrides.insert(user.to_owned(), address.to_owned());
                    }
                    _ => {
                        return Err(format!(
                            "{} line {}: expected `user address`",
                            path.display(),
                            n + 1
                        ))
                    }
                }
            }
        }
        check_template(template)?;
        Ok(Addresses {
            template: template.to_owned(),
            overrides,
        })
    }

    /// The user's address, or why it has none (a name no address can be made of).
    pub fn of(&self, user: &str) -> Result<lettre::Address, String> {
        let text = match self.overrides.get(user) {
            Some(a) => a.clone(),
            None => self.template.replace("{user}", user),
        };
        text.parse().map_err(|e| {
            format!(
                "no valid address for user {user:?} (`{}`): {e}",
                text.escape_debug()
            )
        })
    }
}

fn check_template(template: &str) -> Result<(), String> {
    if !template.contains("{user}") {
        return Err(format!(
            "the address template `{template}` has no {{user}}: every user would get every mail"
        ));
    }
    template
        .replace("{user}", "user")
        .parse::<lettre::Address>()
        .map(|_| ())
        .map_err(|e| format!("the address template `{template}` makes no address: {e}"))
}

/// A message ready to send or to write: its envelope and its bytes.
#[derive(Debug, Clone)]
pub struct Composed {
    pub envelope: Envelope,
    pub raw: Vec<u8>,
}

/// RFC 3834: an automatic message, which auto-responders must not answer.
#[derive(Clone)]
struct AutoSubmitted;

impl lettre::message::header::Header for AutoSubmitted {
    fn name() -> HeaderName {
        HeaderName::new_from_ascii_str("Auto-Submitted")
    }

    fn parse(_: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(AutoSubmitted)
    }

    fn display(&self) -> HeaderValue {
        HeaderValue::new(Self::name(), "auto-generated".to_owned())
    }
}

/// Builds one message: plain text, and an HTML alternative when given.
pub fn compose(
    from: &Mailbox,
    to: lettre::Address,
    subject: &str,
    message_id: &str,
    date: SystemTime,
    text: String,
    html: Option<String>,
) -> Result<Composed, String> {
    let builder = Message::builder()
        .from(from.clone())
        .to(Mailbox::new(None, to))
        .subject(subject)
        .message_id(Some(message_id.to_owned()))
        .date(date)
        .header(AutoSubmitted);
    let message = match html {
        Some(html) => builder.multipart(MultiPart::alternative_plain_html(text, html)),
        None => builder.singlepart(SinglePart::plain(text)),
    }
    .map_err(|e| format!("cannot build the message: {e}"))?;
    Ok(Composed {
        envelope: message.envelope().clone(),
        raw: message.formatted(),
    })
}

/// A Message-ID unique to this message and host: `<kind.time.hash@domain of the sender>`.
pub fn message_id(kind: &str, key: &str, now: i64, from: &Mailbox) -> String {
    use sha2::Digest as _;
    let hash = sha2::Sha256::digest(format!("{kind}\0{key}\0{now}").as_bytes());
    let hex: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("<ceems.{kind}.{now}.{hex}@{}>", from.email.domain())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_come_from_the_file_else_the_template_and_bad_names_have_none() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("addresses");
        std::fs::write(
            &file,
            "# site overrides\nalice  alice.smith@physics.example.org\n\n",
        )
        .unwrap();
        let a = Addresses::with_file("{user}@example.org", Some(&file)).unwrap();
        assert_eq!(
            a.of("alice").unwrap().to_string(),
            "alice.smith@physics.example.org"
        );
        assert_eq!(a.of("bob").unwrap().to_string(), "bob@example.org");
        for bad in ["bob\nBcc: eve@example.org", "a b", "x@y", ""] {
            assert!(a.of(bad).is_err(), "{bad:?} made an address");
        }
        std::fs::write(&file, "alice\n").unwrap();
        let err = Addresses::with_file("{user}@example.org", Some(&file)).unwrap_err();
        assert!(err.contains("line 1: expected `user address`"), "{err}");
        let err = Addresses::with_file("ops@example.org", None).unwrap_err();
        assert!(err.contains("has no {user}"), "{err}");
    }

    #[test]
    fn headers_stay_headers_whatever_the_subject_holds() {
        let from: Mailbox = "ceems <ceems@example.org>".parse().unwrap();
        let m = compose(
            &from,
            "alice@example.org".parse().unwrap(),
            "Slurm Job_id=7 Name=x\r\nBcc: eve@example.org\r\n\r\n<script> Ended",
            &message_id("job", "lab/7", 1_800_000_000, &from),
            SystemTime::UNIX_EPOCH,
            "body\n".into(),
            Some("<p>body</p>".into()),
        )
        .unwrap();
        let raw = String::from_utf8(m.raw).unwrap();
        let head = raw.split("\r\n\r\n").next().unwrap();
        assert!(
            !head
                .lines()
                .any(|l| l.to_ascii_lowercase().starts_with("bcc:")),
            "{head}"
        );
        assert!(head.contains("Auto-Submitted: auto-generated"), "{head}");
        assert!(
            head.contains("Message-ID: <ceems.job.1800000000."),
            "{head}"
        );
        let to: Vec<String> = m.envelope.to().iter().map(|a| a.to_string()).collect();
        assert_eq!(to, ["alice@example.org"]);
        assert!(raw.contains("multipart/alternative"), "{raw}");
    }
}
