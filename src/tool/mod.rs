//! `ceems tool tsdb …`'s work: what an operator's Prometheus scrapes, asked of its API, and the
//! configs that fit it (CEEMS's `ceems_tool`). The command line is `cmd::tool`'s.

pub mod relabel;
pub mod rules;
pub mod updater;
pub mod waste;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::config::http_client::ClientSettings;

#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("cannot parse {0:?} to a valid timestamp")]
    Time(String),
    #[error("start time is not before end time")]
    Window,
    #[error("{url}: {reason}")]
    Request { url: String, reason: String },
    #[error("{0}")]
    Input(String),
}

/// A time as CEEMS's tool takes it: unix seconds or RFC 3339; seconds since the epoch.
pub fn parse_time(text: &str) -> Result<f64, ToolError> {
    if let Ok(seconds) = text.parse::<f64>() {
        if seconds.is_finite() {
            return Ok(seconds);
        }
    }
    text.parse::<jiff::Timestamp>()
        .map(|t| t.as_millisecond() as f64 / 1000.0)
        .map_err(|_| ToolError::Time(text.to_owned()))
}

/// `--start` and `--end` (empty: three hours ago and now).
pub fn window(start: &str, end: &str, now: f64) -> Result<(f64, f64), ToolError> {
    let end = match end {
        "" => now,
        e => parse_time(e)?,
    };
    let start = match start {
        "" => now - 3.0 * 3600.0,
        s => parse_time(s)?,
    };
    if start >= end {
        return Err(ToolError::Window);
    }
    Ok((start, end))
}

/// `d` as Go's `time.Duration` writes it (`500ms`, `2s`, `2m0s`, `1h30m0s`), which CEEMS's
/// tool writes into rules.
pub fn go_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    // Whole and fractional parts of `ns` in units of `unit` ns, trailing zeros dropped.
    let decimal = |ns: u128, unit: u128| {
        let (whole, frac) = (ns / unit, ns % unit);
        match frac {
            0 => whole.to_string(),
            f => {
                let width = unit.ilog10() as usize;
                let digits = format!("{f:0width$}");
                format!("{whole}.{}", digits.trim_end_matches('0'))
            }
        }
    };
    match ns {
        0 => "0s".into(),
        n if n < 1_000 => format!("{n}ns"),
        n if n < 1_000_000 => format!("{}µs", decimal(n, 1_000)),
        n if n < 1_000_000_000 => format!("{}ms", decimal(n, 1_000_000)),
        n => {
            let (h, m) = (n / 3_600_000_000_000, (n / 60_000_000_000) % 60);
            let s = decimal(n % 60_000_000_000, 1_000_000_000);
            match (h, m) {
                (0, 0) => format!("{s}s"),
                (0, m) => format!("{m}m{s}s"),
                (h, m) => format!("{h}h{m}m{s}s"),
            }
        }
    }
}

/// A client of one Prometheus.
pub struct Prometheus {
    agent: ureq::Agent,
    settings: ClientSettings,
}

impl Prometheus {
    pub fn new(settings: ClientSettings, timeout: Duration) -> Result<Prometheus, ToolError> {
        let agent =
            crate::web::client::agent_for(&settings, crate::web::client::Timeouts::all(timeout))
                .map_err(|reason| ToolError::Request {
                    url: settings.url.clone(),
                    reason,
                })?;
        Ok(Prometheus { agent, settings })
    }

    pub fn url(&self) -> &str {
        &self.settings.url
    }

    /// The `data` of a GET of API `path` with `params`.
    pub fn get(&self, path: &str, params: &[(&str, String)]) -> Result<Value, ToolError> {
        let url = format!("{}{path}", self.settings.url.trim_end_matches('/'));
        let failed = |reason: String| ToolError::Request {
            url: url.clone(),
            reason,
        };
        let mut request = self.agent.get(&url);
        for (k, v) in &self.settings.headers {
            request = request.set(k, v);
        }
        for (k, v) in params {
            request = request.query(k, v);
        }
        let body = match request.call() {
            Ok(r) => r.into_string(),
            Err(ureq::Error::Status(_, r)) => r.into_string(),
            Err(e) => return Err(failed(e.to_string())),
        }
        .map_err(|e| failed(e.to_string()))?;
        let answer: Value = serde_json::from_str(&body)
            .map_err(|e| failed(format!("not a Prometheus answer ({e}): {body:.200}")))?;
        if answer["status"] != "success" {
            return Err(failed(format!(
                "{}: {}",
                answer["errorType"].as_str().unwrap_or("error"),
                answer["error"].as_str().unwrap_or("no reason given")
            )));
        }
        Ok(answer["data"].clone())
    }

    /// The series named `names` seen between `start` and `end`: their labels, in
    /// Prometheus's order.
    pub fn series(
        &self,
        names: &[&str],
        (start, end): (f64, f64),
    ) -> Result<Vec<BTreeMap<String, String>>, ToolError> {
        let mut params: Vec<(&str, String)> =
            names.iter().map(|n| ("match[]", (*n).to_owned())).collect();
        params.push(("start", start.to_string()));
        params.push(("end", end.to_string()));
        let data = self.get("/api/v1/series", &params)?;
        Ok(data
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                s.as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .collect())
    }
}

impl Prometheus {
    /// The values of label `name` on the series `matches` select between `start` and `end`.
    pub fn label_values(
        &self,
        name: &str,
        matches: &[&str],
        (start, end): (f64, f64),
    ) -> Result<Vec<String>, ToolError> {
        let mut params: Vec<(&str, String)> = matches
            .iter()
            .map(|m| ("match[]", (*m).to_owned()))
            .collect();
        params.push(("start", start.to_string()));
        params.push(("end", end.to_string()));
        let path = format!(
            "/api/v1/label/{}/values",
            form_urlencoded::byte_serialize(name.as_bytes()).collect::<String>()
        );
        let data = self.get(&path, &params)?;
        Ok(data
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect())
    }
}

/// What Prometheus scrapes, by job: its series names and its hosts (instances without port),
/// in the order the series came.
#[derive(Debug, Default)]
pub struct Jobs {
    /// Jobs in order of first appearance.
    pub order: Vec<String>,
    pub series: BTreeMap<String, Vec<String>>,
    pub hosts: BTreeMap<String, Vec<String>>,
}

impl Jobs {
    pub fn of(series: &[BTreeMap<String, String>]) -> Jobs {
        let mut jobs = Jobs::default();
        let push = |list: &mut Vec<String>, item: &str| {
            if !list.iter().any(|i| i == item) {
                list.push(item.to_owned());
            }
        };
        for s in series {
            let get = |k: &str| s.get(k).map_or("", String::as_str);
            let job = get("job");
            push(&mut jobs.order, job);
            push(
                jobs.series.entry(job.to_owned()).or_default(),
                get("__name__"),
            );
            let host = get("instance").split(':').next().unwrap_or_default();
            push(jobs.hosts.entry(job.to_owned()).or_default(), host);
        }
        jobs
    }

    pub fn has(&self, job: &str, name: &str) -> bool {
        self.series
            .get(job)
            .is_some_and(|names| names.iter().any(|n| n == name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_spelled_as_go_spells_them() {
        let ms = Duration::from_millis;
        assert_eq!(go_duration(ms(0)), "0s");
        assert_eq!(go_duration(ms(500)), "500ms");
        assert_eq!(go_duration(ms(2000)), "2s");
        assert_eq!(go_duration(ms(1500)), "1.5s");
        assert_eq!(go_duration(ms(120_000)), "2m0s");
        assert_eq!(go_duration(ms(5_400_000)), "1h30m0s");
        assert_eq!(go_duration(Duration::from_secs(10_800)), "3h0m0s");
        assert_eq!(go_duration(Duration::from_micros(1500)), "1.5ms");
    }

    #[test]
    fn times_are_unix_seconds_or_rfc3339() {
        assert_eq!(parse_time("1700000000.5").unwrap(), 1_700_000_000.5);
        assert_eq!(parse_time("2023-11-14T22:13:20Z").unwrap(), 1_700_000_000.0);
        assert!(parse_time("yesterday")
            .unwrap_err()
            .to_string()
            .contains("yesterday"));
        assert_eq!(
            window("", "", 100_000.0).unwrap(),
            (100_000.0 - 10_800.0, 100_000.0)
        );
        assert!(matches!(window("20", "10", 0.0), Err(ToolError::Window)));
    }

    #[test]
    fn jobs_keep_the_order_of_their_first_series() {
        let s = |job: &str, name: &str, instance: &str| -> BTreeMap<String, String> {
            [("job", job), ("__name__", name), ("instance", instance)]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        };
        let jobs = Jobs::of(&[
            s("b", "x", "h1:9400"),
            s("a", "y", "h2:1"),
            s("b", "y", "h1:9400"),
        ]);
        assert_eq!(jobs.order, ["b", "a"]);
        assert!(jobs.has("b", "y") && !jobs.has("a", "x"));
        assert_eq!(jobs.hosts["b"], ["h1"]);
    }
}
