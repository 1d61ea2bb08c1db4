//! A real SMTP server for the mail tests: aiosmtpd (PyPI) running `tests/tools/smtp-sink.py`
//! on 127.0.0.1, each accepted message kept as a file with its envelope and decoded parts.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{ensure_tools, free_port, KillOnDrop};

pub fn aiosmtpd() -> Result<(), String> {
    ensure_tools(
        || {
            Command::new("python3")
                .args(["-c", "import aiosmtpd"])
                .status()
                .is_ok_and(|s| s.success())
        },
        &[],
        &["aiosmtpd"],
    )
}

/// One message as the server took it.
#[derive(Debug, Clone)]
pub struct Received {
    pub envelope: serde_json::Value,
    pub raw: String,
}

impl Received {
    pub fn rcpt(&self) -> Vec<String> {
        self.envelope["rcpt_tos"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The text part, its lines ended by `\n` (SMTP sends `\r\n`).
    pub fn text(&self) -> String {
        self.part("plain")
    }

    pub fn html(&self) -> String {
        self.part("html")
    }

    fn part(&self, kind: &str) -> String {
        self.envelope[kind]
            .as_str()
            .unwrap_or("")
            .replace("\r\n", "\n")
    }
}

pub struct SmtpSink {
    pub port: u16,
    pub dir: PathBuf,
    process: Option<KillOnDrop>,
    extra: Vec<String>,
}

impl SmtpSink {
    /// A plain server on a free port, writing into `dir`.
    pub fn start(dir: &Path) -> SmtpSink {
        SmtpSink::start_with(dir, &[])
    }

    /// Writes a config file for `ceems mailprog` in `dir` that mails through this server from
    /// `from`, with reports from the stats-server at `stats_server`; returns the file and the
    /// log file mailprog's stderr goes to (both readable and writable by the lab's daemons).
    pub fn mailprog_config(
        &self,
        dir: &Path,
        stats_server: &str,
        from: &str,
    ) -> (PathBuf, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let config = dir.join("ceems.toml");
        std::fs::write(
            &config,
            format!(
                "[mailprog]\nstats-server.url = \"{stats_server}\"\nweb.external-url = \"https://ceems.lab.example\"\n\
                 from = \"{from}\"\ntimeout = \"90s\"\n\
                 [mailprog.smtp]\nhost = \"127.0.0.1\"\nport = {}\ntls = \"none\"\n",
                self.port
            ),
        )
        .expect("write mailprog's config");
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let log = dir.join("mailprog.log");
        std::fs::write(&log, "").expect("create mailprog's log");
        std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        (config, log)
    }

    /// With the script's extra arguments (`--cert`, `--key`, `--login`).
    pub fn start_with(dir: &Path, extra: &[&str]) -> SmtpSink {
        let mut sink = SmtpSink {
            port: free_port(),
            dir: dir.to_owned(),
            process: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        sink.resume();
        sink
    }

    /// Stops it: the port then refuses connections.
    pub fn stop(&mut self) {
        self.process = None;
    }

    /// Starts it again on the same port and directory.
    pub fn resume(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/smtp-sink.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg(format!("--port={}", self.port))
            .arg(format!("--dir={}", self.dir.display()))
            .args(&self.extra)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the SMTP sink");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        let guard = KillOnDrop(child);
        BufReader::new(stdout).read_line(&mut line).expect("read");
        assert_eq!(line.trim(), "ready", "the SMTP sink did not start");
        self.process = Some(guard);
    }

    /// The messages received so far, oldest first.
    pub fn received(&self) -> Vec<Received> {
        let mut names: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        names.retain(|p| p.extension().is_some_and(|e| e == "eml"));
        names.sort();
        names
            .iter()
            .map(|eml| Received {
                envelope: serde_json::from_str(
                    &std::fs::read_to_string(eml.with_extension("json")).expect("envelope"),
                )
                .expect("envelope JSON"),
                raw: String::from_utf8_lossy(&std::fs::read(eml).expect("message")).into_owned(),
            })
            .collect()
    }
}
