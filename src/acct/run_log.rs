//! cacct's `logging:` section: one line per run in `directory/cacct.log`, logfmt or JSON.

use std::path::PathBuf;

use serde_json::Value;

/// `logging:`'s file and its format.
#[derive(Debug, Clone)]
pub struct RunLog {
    pub path: PathBuf,
    pub json: bool,
    /// Lines below this level are not written (debug 0, info 1, warn 2, error 3).
    pub level: u8,
}

impl RunLog {
    pub(super) fn level_of(name: &str) -> Option<u8> {
        ["debug", "info", "warn", "error"]
            .iter()
            .position(|l| *l == name)
            .map(|i| i as u8)
    }

    /// Appends one line; a log that cannot be written is said once on standard error.
    pub fn write(&self, level: &str, message: &str, fields: &[(&str, &str)]) {
        if RunLog::level_of(level).unwrap_or(1) < self.level {
            return;
        }
        let time = jiff::Timestamp::now().to_string();
        let line = match self.json {
            true => {
                let mut m = serde_json::Map::new();
                m.insert("time".into(), time.into());
                m.insert("level".into(), level.into());
                m.insert("msg".into(), message.into());
                for (k, v) in fields {
                    m.insert((*k).into(), (*v).into());
                }
                Value::Object(m).to_string()
            }
            false => {
                let quote = |v: &str| match v.contains([' ', '"', '=']) || v.is_empty() {
                    true => serde_json::Value::from(v).to_string(),
                    false => v.to_owned(),
                };
                let mut line = format!("time={time} level={level} msg={}", quote(message));
                for (k, v) in fields {
                    line.push_str(&format!(" {k}={}", quote(v)));
                }
                line
            }
        };
        use std::io::Write as _;
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .and_then(|mut f| writeln!(f, "{line}"));
        if let Err(e) = written {
            eprintln!("cannot write to the log {}: {e}", self.path.display());
        }
    }
}
