//! A policy as a site writes it: one `[[stats-server.policies]]` table (or one item of
//! `policies:` beside CEEMS's YAML sections), with defaults a site can start from.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// What a policy watches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Resource {
    /// Mean GPU use over the job's GPUs.
    #[default]
    Gpu,
    /// CPU use over the job's allocated cores (CPU efficiency).
    Cpu,
}

/// Over which time a job's use is judged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Window {
    /// From the job's start until now: a stage fires once the job is that old and has used
    /// nothing since it started.
    #[default]
    SinceStart,
    /// The last `after` of each stage: a stage fires once the job used nothing for that long.
    Trailing,
}

/// What a stage does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Warn,
    Cancel,
}

/// One stage: its action once the job has been idle this long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stage {
    pub after: Duration,
    pub action: Action,
}

/// One policy: which jobs it watches, when one counts as idle, what is done and when, and who
/// is spared.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Policy {
    /// Its name in logs, mails, the database and the metrics' `policy` label.
    pub name: String,
    /// Clusters (ids) it watches; empty: every cluster.
    #[serde(default)]
    pub clusters: Vec<String>,
    /// Partitions (LSF and PBS queues) it watches; empty: all.
    #[serde(default)]
    pub partitions: Vec<String>,
    #[serde(default)]
    pub qos: Vec<String>,
    /// Accounts (projects, namespaces) it watches; empty: all.
    #[serde(default)]
    pub accounts: Vec<String>,
    #[serde(default)]
    pub resource: Resource,
    /// Jobs with fewer GPUs are not watched (default: 1 for a GPU policy, 0 for a CPU one).
    #[serde(default)]
    pub min_gpus: Option<u64>,
    /// Jobs with more GPUs are not watched (`max-gpus = 0`: CPU-only jobs).
    #[serde(default)]
    pub max_gpus: Option<u64>,
    /// A job is idle while its mean use is below this share of what it holds (0.01: 1 %).
    #[serde(default = "default_below")]
    pub below: f64,
    #[serde(default)]
    pub window: Window,
    /// When warnings go out, in order (`[]`: none).
    #[serde(default = "default_warn_after", deserialize_with = "de_durations")]
    pub warn_after: Vec<Duration>,
    /// When the job is cancelled (`""`: never; warnings only).
    #[serde(
        default = "default_cancel_after",
        deserialize_with = "de_optional_duration"
    )]
    pub cancel_after: Option<Duration>,
    /// Decide, log and mail the admins; warn and cancel no one.
    #[serde(default = "yes")]
    pub dry_run: bool,
    /// Addresses that get a copy of every action (and a dry run's only mail).
    #[serde(default)]
    pub admins: Vec<String>,
    /// How a user appeals, in the mail.
    #[serde(default = "default_contact")]
    pub contact: String,
    #[serde(default)]
    pub exempt_users: Vec<String>,
    #[serde(default)]
    pub exempt_accounts: Vec<String>,
    #[serde(default)]
    pub exempt_partitions: Vec<String>,
    #[serde(default)]
    pub exempt_qos: Vec<String>,
    /// Job names (prefixes) of interactive sessions.
    #[serde(default = "default_interactive_names")]
    pub interactive_names: Vec<String>,
    /// Interactive sessions whose time limit is below this are spared (`"0s"`: none are).
    #[serde(
        default = "default_interactive_under",
        deserialize_with = "de_duration"
    )]
    pub interactive_under: Duration,
    /// A job that uses at least this share of its GPUs (each above `below`) is spared
    /// (0: off).
    #[serde(default)]
    pub spare_used_gpu_share: f64,
    /// A job whose name (a pod: an annotation's value) holds this text is spared; empty: users
    /// cannot opt out.
    #[serde(default)]
    pub opt_out_marker: String,
    /// The PromQL of each job's use as a ratio, one series per device, with `$uuids` and
    /// `$range`; empty: the recorded series of CEEMS's rules.
    #[serde(default)]
    pub query: String,
}

fn yes() -> bool {
    true
}
fn default_below() -> f64 {
    0.01
}
fn default_warn_after() -> Vec<Duration> {
    vec![Duration::from_secs(3600), Duration::from_secs(6300)]
}
fn default_cancel_after() -> Option<Duration> {
    Some(Duration::from_secs(7200))
}
fn default_contact() -> String {
    "If the job is idle on purpose, reply to this message before it is cancelled.".to_owned()
}
fn default_interactive_names() -> Vec<String> {
    vec!["interactive".to_owned(), "sys/dashboard".to_owned()]
}
fn default_interactive_under() -> Duration {
    Duration::from_secs(8 * 3600)
}

fn parse_duration(raw: &str) -> Result<Duration, String> {
    humantime::parse_duration(raw.trim()).map_err(|e| format!("`{raw}` is not a duration: {e}"))
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    parse_duration(&String::deserialize(d)?).map_err(serde::de::Error::custom)
}

fn de_durations<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Duration>, D::Error> {
    Vec::<String>::deserialize(d)?
        .iter()
        .map(|s| parse_duration(s))
        .collect::<Result<_, _>>()
        .map_err(serde::de::Error::custom)
}

fn de_optional_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let raw = String::deserialize(d)?;
    match raw.trim() {
        "" | "never" => Ok(None),
        s => parse_duration(s)
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

/// The default query of each resource: the series CEEMS's recording rules write, in percent.
const GPU_QUERY: &str =
    r#"avg_over_time(uuid:ceems_gpu_usage:ratio{uuid=~"$uuids"}[$range]) / 100"#;
const CPU_QUERY: &str =
    r#"avg_over_time(uuid:ceems_cpu_usage:ratio_irate{uuid=~"$uuids"}[$range]) / 100"#;

impl Policy {
    /// Its stages in order: the warnings, then the cancel.
    pub fn stages(&self) -> Vec<Stage> {
        let mut stages: Vec<Stage> = self
            .warn_after
            .iter()
            .map(|&after| Stage {
                after,
                action: Action::Warn,
            })
            .collect();
        stages.extend(self.cancel_after.map(|after| Stage {
            after,
            action: Action::Cancel,
        }));
        stages
    }

    pub fn min_gpus(&self) -> u64 {
        self.min_gpus.unwrap_or(match self.resource {
            Resource::Gpu => 1,
            Resource::Cpu => 0,
        })
    }

    /// The PromQL template of the job's use.
    pub fn query(&self) -> &str {
        match (self.query.is_empty(), self.resource) {
            (false, _) => &self.query,
            (true, Resource::Gpu) => GPU_QUERY,
            (true, Resource::Cpu) => CPU_QUERY,
        }
    }

    fn check(&self) -> Result<(), String> {
        let name_ok = !self.name.is_empty()
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !name_ok {
            return Err(format!(
                "name: `{}` must be letters, digits, `-`, `_` or `.`",
                self.name.escape_debug()
            ));
        }
        if !(0.0..=1.0).contains(&self.below) {
            return Err(format!(
                "below: {} is not a share between 0 and 1 (0.01 is 1 %)",
                self.below
            ));
        }
        if !(0.0..=1.0).contains(&self.spare_used_gpu_share) {
            return Err(format!(
                "spare-used-gpu-share: {} is not a share between 0 and 1",
                self.spare_used_gpu_share
            ));
        }
        let stages = self.stages();
        if stages.is_empty() {
            return Err(
                "warn-after and cancel-after are both empty: the policy would do nothing".into(),
            );
        }
        if stages.windows(2).any(|w| w[0].after >= w[1].after) {
            return Err(
                "warn-after and cancel-after must grow: each stage comes after the one before"
                    .into(),
            );
        }
        if stages[0].after.is_zero() {
            return Err("the first stage must come after some time, not 0s".into());
        }
        if self.resource == Resource::Gpu && self.min_gpus() == 0 {
            return Err("min-gpus: a GPU policy watches jobs with GPUs (1 or more)".into());
        }
        if let (Some(max), min) = (self.max_gpus, self.min_gpus()) {
            if max < min {
                return Err(format!("max-gpus {max} is below min-gpus {min}"));
            }
        }
        let query = self.query();
        if !query.contains("$uuids") || !query.contains("$range") {
            return Err("query: must hold $uuids and $range".into());
        }
        for a in &self.admins {
            a.parse::<lettre::Address>()
                .map_err(|e| format!("admins: `{a}`: {e}"))?;
        }
        Ok(())
    }
}

/// The policies of the `policies` array: each checked, names unique. A bad one is an error
/// naming its position and key.
pub fn parse(value: toml::Value) -> Result<Vec<Policy>, String> {
    let policies: Vec<Policy> = serde_path_to_error::deserialize(value).map_err(|e| {
        let key = crate::config::join_key("policies", &e.path().to_string());
        format!("{key}: {}", e.into_inner())
    })?;
    let mut seen = std::collections::HashSet::new();
    for (i, p) in policies.iter().enumerate() {
        p.check()
            .map_err(|e| format!("policies[{i}] (`{}`): {e}", p.name))?;
        if !seen.insert(p.name.as_str()) {
            return Err(format!("policies[{i}]: a second policy named `{}`", p.name));
        }
    }
    Ok(policies)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policies(text: &str) -> Result<Vec<Policy>, String> {
        let table: toml::Table = text.parse().unwrap();
        parse(table["policies"].clone())
    }

    #[test]
    fn a_named_policy_gets_defaults_a_site_can_start_from() {
        let p = &policies("[[policies]]\nname = \"idle-gpus\"\n").unwrap()[0];
        assert!(p.dry_run, "a new policy acts on nothing until told");
        assert_eq!(p.resource, Resource::Gpu);
        assert_eq!(p.min_gpus(), 1);
        let stages = p.stages();
        let after: Vec<u64> = stages.iter().map(|s| s.after.as_secs()).collect();
        assert_eq!(after, [3600, 6300, 7200]);
        assert_eq!(stages[2].action, Action::Cancel);
        assert!(p.query().contains("uuid:ceems_gpu_usage:ratio"));
    }

    #[test]
    fn a_malformed_policy_names_its_key() {
        let err = policies("[[policies]]\nname = \"a\"\nwarn-after = [\"soon\"]\n").unwrap_err();
        assert!(
            err.contains("policies[0].warn-after") && err.contains("soon"),
            "{err}"
        );
        let err = policies("[[policies]]\nname = \"a\"\nbelow = 5\n").unwrap_err();
        assert!(err.contains("below: 5"), "{err}");
        let err =
            policies("[[policies]]\nname = \"a\"\nwarn-after = [\"2h\"]\ncancel-after = \"1h\"\n")
                .unwrap_err();
        assert!(err.contains("must grow"), "{err}");
        let err = policies("[[policies]]\nname = \"a\"\ncancle-after = \"1h\"\n").unwrap_err();
        assert!(err.contains("cancle-after"), "{err}");
        let err = policies("[[policies]]\nname = \"a\"\n[[policies]]\nname = \"a\"\n").unwrap_err();
        assert!(err.contains("second policy named `a`"), "{err}");
        let err = policies("[[policies]]\nname = \"a\"\nwarn-after = []\ncancel-after = \"\"\n")
            .unwrap_err();
        assert!(err.contains("do nothing"), "{err}");
    }

    #[test]
    fn any_stage_may_be_left_out() {
        let p = &policies("[[policies]]\nname = \"warn-only\"\ncancel-after = \"\"\nresource = \"cpu\"\nmax-gpus = 0\n").unwrap()[0];
        assert!(p.stages().iter().all(|s| s.action == Action::Warn));
        assert_eq!(p.min_gpus(), 0);
        let p = &policies(
            "[[policies]]\nname = \"cancel-only\"\nwarn-after = []\ncancel-after = \"30m\"\n",
        )
        .unwrap()[0];
        assert_eq!(p.stages().len(), 1);
    }
}
