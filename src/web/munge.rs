//! MUNGE credentials as a way in, for clients on the cluster's own hosts (`cacct`): the request
//! carries `Authorization: MUNGE <credential>`, the local munged decodes it (through
//! `unmunge`), and the credential's uid names the user. munged's replay cache makes each
//! credential good once and for its time to live, and its payload must be the request's own
//! `METHOD path?query`: one seen on the wire opens nothing else. No password is installed on
//! the clients; the header that names the user is set from the credential, whatever the
//! client sent.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use hyper::header::HeaderName;

/// The scheme of the `Authorization` header.
pub const SCHEME: &str = "MUNGE ";

/// How a server checks MUNGE credentials.
#[derive(Debug, Clone)]
pub struct MungeAuth {
    /// `unmunge`, by path or name.
    pub unmunge: PathBuf,
    /// munged's socket; none: its default.
    pub socket: Option<PathBuf>,
    /// The header the server reads the user from: set from the credential.
    pub user_header: HeaderName,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MungeError {
    /// munged's own words: expired, replayed, invalid (another key), …
    #[error("credential refused by munged: {0}")]
    Refused(String),
    #[error("credential made for another request")]
    OtherRequest,
    #[error("uid {0} has no user name here")]
    UnknownUid(u32),
    #[error("cannot run unmunge: {0}")]
    Unmunge(String),
}

/// What `unmunge -N -k STATUS,UID` wrote: the status's number and the uid.
fn metadata(text: &str) -> (Option<i64>, Option<u32>) {
    let value = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim().to_owned())
    };
    (
        value("STATUS:").and_then(|v| v.parse().ok()),
        value("UID:").and_then(|v| v.parse().ok()),
    )
}

impl MungeAuth {
    /// The credential of an `Authorization` header of this scheme.
    pub fn credential(authorization: &str) -> Option<&str> {
        authorization
            .strip_prefix(SCHEME)
            .map(str::trim)
            .filter(|c| !c.is_empty())
    }

    /// The user a credential names, if munged vouches for it and it was made for `request`
    /// (`METHOD path?query`). Blocks on unmunge: run it off the async workers.
    pub fn verify_blocking(&self, credential: &str, request: &str) -> Result<String, MungeError> {
        let mut command = Command::new(&self.unmunge);
        if let Some(socket) = &self.socket {
            command.arg(format!("--socket={}", socket.display()));
        }
        let mut child = command
            .args(["--numeric", "--keys=STATUS,UID"])
            .args(["--metadata=/dev/stderr", "--output=/dev/stdout"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| MungeError::Unmunge(format!("{}: {e}", self.unmunge.display())))?;
        if let Some(mut stdin) = child.stdin.take() {
            // A credential is one armoured line; nothing else reaches unmunge.
            let line: String = credential.chars().filter(|c| !c.is_control()).collect();
            let _ = stdin.write_all(line.as_bytes());
        }
        let out = child
            .wait_with_output()
            .map_err(|e| MungeError::Unmunge(e.to_string()))?;
        let meta = String::from_utf8_lossy(&out.stderr);
        let (status, uid) = metadata(&meta);
        if status != Some(0) || !out.status.success() {
            let why = meta
                .lines()
                .find(|l| l.starts_with("unmunge: Error:"))
                .map(|l| l.trim_start_matches("unmunge: Error:").trim().to_owned())
                .or_else(|| status.map(status_name))
                .unwrap_or_else(|| format!("unmunge exited with {}", out.status));
            return Err(MungeError::Refused(why));
        }
        if out.stdout != request.as_bytes() {
            return Err(MungeError::OtherRequest);
        }
        let uid = uid.ok_or_else(|| MungeError::Unmunge("no UID in its answer".into()))?;
        match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
            Ok(Some(user)) => Ok(user.name),
            _ => Err(MungeError::UnknownUid(uid)),
        }
    }
}

/// munged's status numbers (`munge_err_t`) in its words.
fn status_name(status: i64) -> String {
    match status {
        6 => "cannot reach munged".into(),
        7 => "munged timed out".into(),
        8 => "Invalid credential format".into(),
        9 => "Invalid credential version".into(),
        10 => "Invalid cipher type".into(),
        11 => "Invalid MAC (another key?)".into(),
        12 => "Invalid compression type".into(),
        13 => "Unrecognized security realm".into(),
        14 => "Invalid credential".into(),
        15 => "Expired credential".into(),
        16 => "Rewound credential (clock skew)".into(),
        17 => "Replayed credential".into(),
        18 => "Unauthorized credential decode".into(),
        n => format!("status {n}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unmunge_s_numeric_metadata_is_read() {
        assert_eq!(
            metadata("STATUS:          0\nUID:             2001\n"),
            (Some(0), Some(2001))
        );
        assert_eq!(metadata("STATUS:          17\n"), (Some(17), None));
        assert_eq!(metadata("garbage"), (None, None));
    }

    #[test]
    fn only_the_munge_scheme_carries_a_credential() {
        assert_eq!(
            MungeAuth::credential("MUNGE MUNGE:abc:"),
            Some("MUNGE:abc:")
        );
        assert_eq!(MungeAuth::credential("Basic Y2VlbXM="), None);
        assert_eq!(MungeAuth::credential("MUNGE "), None);
    }

    #[test]
    fn a_missing_unmunge_is_said() {
        let auth = MungeAuth {
            unmunge: "/nonexistent/unmunge".into(),
            socket: None,
            user_header: HeaderName::from_static("x-grafana-user"),
        };
        let err = auth.verify_blocking("MUNGE:x:", "GET /").unwrap_err();
        assert!(err.to_string().contains("/nonexistent/unmunge"), "{err}");
    }
}
