//! `cacct`'s work: a user's jobs from the stats-server's API, printed as CEEMS's `cacct`
//! prints them, and their time series from the TSDB. The command line, the user and the
//! privileges are `cmd::cacct`'s.

mod client;
mod fields;
pub mod queries;
mod run_log;
pub mod series;
mod summary;
pub mod table;

pub use client::{Client, Munge};
use fields::Number;
pub use fields::{fields, help_format, Field, DEFAULT_FIELDS, FIELDS};
pub use run_log::RunLog;

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::config::http_client::{ClientSettings, ClientWeb};
pub use queries::SeriesQuery;
use table::{ColumnWidth, Style, Table};

#[derive(Debug, thiserror::Error)]
pub enum AcctError {
    #[error("unknown field `{0}` (--helpformat lists them)")]
    UnknownField(String),
    #[error("no config file ({names}) in {dirs}; the stats-server's address goes in /etc/ceems/config.yml (see /usr/share/doc/ceems/guide/slurm.md)", names = CONFIG_NAMES.join(", "))]
    NoConfig { dirs: String },
    #[error("{path}: {reason}")]
    Config { path: PathBuf, reason: String },
    /// CEEMS's words: a user asked for others' jobs.
    #[error("forbidden. It is likely that the user is attempting to view statistics of others")]
    Forbidden,
    #[error("server did not return any data due to unknown error")]
    Server,
    #[error("job {0} is not one of yours (or the stats-server does not know it)")]
    NotYours(String),
    #[error("job {0} is in several clusters ({1}): set ceems_api_server.cluster_id")]
    Ambiguous(String, String),
    #[error("{url}: {reason}")]
    Request { url: String, reason: String },
}

/// cacct's config file: where the API server and the TSDB are and how they are reached.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    ceems_api_server: ApiServer,
    #[serde(default)]
    tsdb: Tsdb,
    /// CEEMS v0.16's log of cacct's runs.
    #[serde(default)]
    logging: Logging,
}

/// `logging:`: a line per run (who, what was asked, how it went) in `directory/cacct.log`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Logging {
    #[serde(default)]
    enabled: bool,
    #[serde(default)]
    level: String,
    #[serde(default)]
    format: String,
    #[serde(default)]
    directory: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApiServer {
    #[serde(default)]
    cluster_id: String,
    #[serde(default)]
    user_header_name: String,
    #[serde(default)]
    web: ClientWeb,
    /// Ours: a MUNGE credential names the caller (the server's `--web.munge-credentials`).
    #[serde(default)]
    munge: bool,
    #[serde(default)]
    munge_socket: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Tsdb {
    #[serde(default)]
    web: ClientWeb,
    /// v0.16's list of `{name, title, help, query, kind}`, or v0.10's `name: query` map.
    #[serde(default)]
    queries: serde_norway::Value,
    /// Jobs whose series `--ts.metrics` saves at once, at most.
    #[serde(default)]
    max_units_for_range_queries: Option<usize>,
    /// Series a range query of one job may give, at most (the rest are not saved).
    #[serde(default)]
    query_max_series: Option<usize>,
    /// Read and not used: CEEMS's least share of a range's samples a series must have.
    #[serde(default)]
    #[allow(dead_code)]
    query_min_samples: Option<f64>,
    #[serde(default)]
    query_timeout: Option<String>,
    /// The least step of a range query (`--ts.metrics`).
    #[serde(default)]
    scrape_interval: Option<String>,
    #[serde(default)]
    evaluation_interval: Option<String>,
    /// Ours: for a TSDB behind `ceems lb --web.munge-credentials`.
    #[serde(default)]
    munge: bool,
    #[serde(default)]
    munge_socket: String,
}

/// The config with every file it names read.
#[derive(Debug, Clone)]
pub struct Settings {
    pub cluster_id: String,
    pub user_header: String,
    pub api: ClientSettings,
    pub tsdb: ClientSettings,
    /// The config's queries, in its order.
    pub queries: Vec<SeriesQuery>,
    /// Whether they were written in v0.10's map form.
    pub old_queries_form: bool,
    pub max_units_for_range_queries: usize,
    pub query_max_series: usize,
    pub query_timeout: std::time::Duration,
    /// The least step of a range query.
    pub min_step_seconds: i64,
    pub api_munge: Option<Munge>,
    pub tsdb_munge: Option<Munge>,
    /// Where each run is logged (`logging.enabled`).
    pub log: Option<RunLog>,
}

/// The names cacct's config file may have, in each directory.
pub const CONFIG_NAMES: &[&str] = &["config.yml", "config.yaml", "cacct.yml", "cacct.yaml"];

/// The first config file in `dirs`, read with the files it names.
pub fn load_settings(dirs: &[PathBuf]) -> Result<Settings, AcctError> {
    let found = dirs
        .iter()
        .flat_map(|d| CONFIG_NAMES.iter().map(move |n| d.join(n)))
        .find(|p| p.is_file());
    let Some(path) = found else {
        let list: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        return Err(AcctError::NoConfig {
            dirs: list.join(", "),
        });
    };
    let bad = |reason: String| AcctError::Config {
        path: path.clone(),
        reason,
    };
    let text = std::fs::read_to_string(&path).map_err(|e| bad(e.to_string()))?;
    let config: Config = match text.trim().is_empty() {
        true => Config::default(),
        false => serde_norway::from_str(&text).map_err(|e| bad(e.to_string()))?,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    if config.ceems_api_server.web.url.is_empty() {
        return Err(bad("ceems_api_server.web.url is not set".into()));
    }
    let (queries, old_queries_form) = queries::parse(&config.tsdb.queries).map_err(bad)?;
    let duration =
        |key: &str, v: Option<String>, default: u64| match v.as_deref().filter(|v| !v.is_empty()) {
            None => Ok(std::time::Duration::from_secs(default)),
            Some(v) => humantime::parse_duration(v)
                .map_err(|e| bad(format!("{key}: `{v}` is not a duration: {e}"))),
        };
    duration(
        "tsdb.evaluation_interval",
        config.tsdb.evaluation_interval.clone(),
        60,
    )?;
    let log = match config.logging.enabled {
        false => None,
        true => {
            let l = &config.logging;
            let level = match l.level.as_str() {
                "" => 1,
                name => RunLog::level_of(name).ok_or_else(|| {
                    bad(format!(
                        "logging.level: `{name}` is none of debug, info, warn, error"
                    ))
                })?,
            };
            let json = match l.format.as_str() {
                "" | "logfmt" => false,
                "json" => true,
                other => {
                    return Err(bad(format!(
                        "logging.format: `{other}` is neither logfmt nor json"
                    )))
                }
            };
            let dir = match l.directory.as_str() {
                "" => return Err(bad("logging.directory: where the log goes is needed".into())),
                d => PathBuf::from(d),
            };
            Some(RunLog {
                path: dir.join("cacct.log"),
                json,
                level,
            })
        }
    };
    let header = match config.ceems_api_server.user_header_name.as_str() {
        "" => "X-Grafana-User".to_owned(),
        h => h.to_owned(),
    };
    Ok(Settings {
        cluster_id: config.ceems_api_server.cluster_id,
        user_header: header,
        api: config
            .ceems_api_server
            .web
            .resolve(dir)
            .map_err(|e| bad(format!("ceems_api_server.web: {e}")))?,
        tsdb: config
            .tsdb
            .web
            .resolve(dir)
            .map_err(|e| bad(format!("tsdb.web: {e}")))?,
        queries,
        old_queries_form,
        max_units_for_range_queries: config.tsdb.max_units_for_range_queries.unwrap_or(10),
        query_max_series: config.tsdb.query_max_series.unwrap_or(20),
        query_timeout: duration("tsdb.query_timeout", config.tsdb.query_timeout, 60)?,
        min_step_seconds: duration("tsdb.scrape_interval", config.tsdb.scrape_interval, 10)?
            .as_secs()
            .max(1) as i64,
        log,
        api_munge: Munge::of(
            config.ceems_api_server.munge,
            &config.ceems_api_server.munge_socket,
        ),
        tsdb_munge: Munge::of(config.tsdb.munge, &config.tsdb.munge_socket),
    })
}

/// What the user asked for.
#[derive(Debug, Clone, Default)]
pub struct Query {
    pub from: i64,
    pub to: i64,
    pub accounts: Vec<String>,
    pub jobs: Vec<String>,
    /// Others' jobs (an admin's request); empty: the caller's.
    pub users: Vec<String>,
    pub fields: Vec<&'static Field>,
    /// The config's instant queries asked for: one column each.
    pub instant: Vec<SeriesQuery>,
    /// Only jobs whose account matches (`--account-filter`).
    pub account_filter: Option<regex::Regex>,
}

/// Where an instant query's value of a job is kept in its record, for the table.
fn instant_key(q: &SeriesQuery) -> String {
    format!("series:{}", q.key)
}

/// An instant query's answer as CEEMS prints it: `[{"labels":{…},"value":…}]`, the job's
/// `uuid` left out; a scalar (`[time, "value"]`) is one sample without labels.
fn instant_samples(data: &Value) -> Value {
    let sample = |labels: serde_json::Map<String, Value>, value: &Value| {
        let value = value
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(Value::Null, |v| go_json(&Value::from(v)));
        serde_json::json!({"labels": labels, "value": value})
    };
    let samples = match (data["resultType"].as_str(), &data["result"]) {
        (Some("scalar"), result) => vec![sample(Default::default(), &result[1])],
        (_, Value::Array(list)) => list
            .iter()
            .map(|s| {
                let mut labels = s["metric"].as_object().cloned().unwrap_or_default();
                labels.remove("uuid");
                sample(labels, &s["value"][1])
            })
            .collect(),
        _ => Vec::new(),
    };
    Value::Array(samples)
}

/// Each job's value of each instant query (over the job's life, at its end or now), kept in
/// its record as CEEMS prints it: `[{"labels":{…},"value":…}]`, the job's `uuid` left out.
pub fn fill_instant(tsdb: &Client, instant: &[SeriesQuery], units: &mut [Value], now: i64) {
    for unit in units.iter_mut() {
        let Some(uuid) = unit["uuid"].as_str().map(str::to_owned) else {
            continue;
        };
        let start = unit["started_at_ts"].as_i64().unwrap_or(0) / 1000;
        let end = match unit["ended_at_ts"].as_i64().unwrap_or(0) / 1000 {
            e if e >= start && e > 0 => e,
            _ => now,
        };
        for q in instant {
            let promql = q.promql(&[&uuid], end - start);
            let params = [
                ("query".to_owned(), promql.clone()),
                ("time".to_owned(), end.to_string()),
            ];
            let answer = tsdb
                .get("/api/v1/query", &params, &[])
                .map_err(|e| e.to_string())
                .and_then(|(status, body)| {
                    serde_json::from_slice::<Value>(&body)
                        .map_err(|e| format!("HTTP {status}: not a Prometheus answer: {e}"))
                });
            let answer = match answer {
                Ok(a) if a["status"] == "success" => a,
                Ok(a) => {
                    eprintln!(
                        "failed to query {promql}: {}",
                        a["error"].as_str().unwrap_or("no error given")
                    );
                    continue;
                }
                Err(e) => {
                    eprintln!("failed to query {promql}: {e}");
                    continue;
                }
            };
            unit[instant_key(q)] = Value::from(instant_samples(&answer["data"]).to_string());
        }
    }
}

/// The caller's (or, for an admin, the listed users') units and current usage.
pub fn fetch(
    api: &Client,
    settings: &Settings,
    caller: &str,
    q: &Query,
) -> Result<(Vec<Value>, Vec<Value>), AcctError> {
    let mut params: Vec<(String, String)> = vec![
        ("from".into(), q.from.to_string()),
        ("to".into(), q.to.to_string()),
    ];
    // An empty cluster id (the example config's) means every cluster, not a cluster named "".
    if !settings.cluster_id.is_empty() {
        params.insert(0, ("cluster_id".into(), settings.cluster_id.clone()));
    }
    let mut tags: Vec<&str> = q.fields.iter().map(|f| f.tag).collect();
    // The times the series are asked for.
    tags.extend(["started_at_ts", "ended_at_ts"]);
    // The jobs' allocation times, which their own summary is weighted by.
    let times_added = !q.jobs.is_empty() && !tags.contains(&"total_time_seconds");
    if times_added {
        tags.push("total_time_seconds");
    }
    params.extend(tags.iter().map(|t| ("field".to_owned(), (*t).to_owned())));
    params.extend(q.accounts.iter().map(|a| ("project".to_owned(), a.clone())));
    params.extend(q.jobs.iter().map(|j| ("uuid".to_owned(), j.clone())));
    // `--user=all`: an admin's every user.
    let all = q.users.iter().any(|u| u == "all");
    if !all {
        params.extend(q.users.iter().map(|u| ("user".to_owned(), u.clone())));
    }
    let admin = if q.users.is_empty() { "" } else { "/admin" };
    let header = [(settings.user_header.as_str(), caller)];
    let mut units = data(
        "/api/v1/units",
        api.get(&format!("/api/v1/units{admin}"), &params, &header)?,
    )?;
    if let Some(filter) = &q.account_filter {
        units.retain(|u| filter.is_match(&text(&u["project"])));
    }
    if !q.jobs.is_empty() {
        // The summary of the jobs named, not of every job in the window (CEEMS's).
        let metrics: Vec<&str> = q
            .fields
            .iter()
            .filter(|f| f.number.is_some())
            .map(|f| f.tag)
            .collect();
        let usage = summary::of_units(&units, &metrics);
        if times_added {
            for u in &mut units {
                if let Some(u) = u.as_object_mut() {
                    u.remove("total_time_seconds");
                }
            }
        }
        return Ok((units, usage));
    }
    params.push(("field".into(), "username".into()));
    params.push(("field".into(), "num_units".into()));
    if tags.contains(&"elapsed") {
        params.push(("field".into(), "total_time_seconds".into()));
    }
    let usage = data(
        "/api/v1/usage/current",
        api.get(&format!("/api/v1/usage/current{admin}"), &params, &header)?,
    )?;
    Ok((units, usage))
}

/// The text report of the caller's job `job` (the stats-server's `/report/{cluster}/{job}.txt`,
/// what its mail carries). Without a cluster in the config, the job's own is asked first.
pub fn report(
    api: &Client,
    settings: &Settings,
    caller: &str,
    job: &str,
) -> Result<String, AcctError> {
    let header = [(settings.user_header.as_str(), caller)];
    let cluster = match settings.cluster_id.as_str() {
        "" => {
            let params = [
                ("uuid".to_owned(), job.to_owned()),
                ("field".to_owned(), "cluster_id".to_owned()),
                ("from".to_owned(), "0".to_owned()),
            ];
            let units = data("/api/v1/units", api.get("/api/v1/units", &params, &header)?)?;
            let mut clusters: Vec<String> = units.iter().map(|u| text(&u["cluster_id"])).collect();
            clusters.sort();
            clusters.dedup();
            match clusters.as_slice() {
                [one] => one.clone(),
                [] => return Err(AcctError::NotYours(job.to_owned())),
                _ => return Err(AcctError::Ambiguous(job.to_owned(), clusters.join(", "))),
            }
        }
        c => c.to_owned(),
    };
    let path = format!(
        "/report/{}/{}.txt",
        form_urlencoded::byte_serialize(cluster.as_bytes()).collect::<String>(),
        form_urlencoded::byte_serialize(job.as_bytes()).collect::<String>()
    );
    match api.get(&path, &[], &header)? {
        (200, body) => Ok(String::from_utf8_lossy(&body).into_owned()),
        (401, _) => Err(AcctError::Forbidden),
        (403 | 404, _) => Err(AcctError::NotYours(job.to_owned())),
        (status, body) => Err(AcctError::Request {
            url: path,
            reason: format!("HTTP {status}: {}", String::from_utf8_lossy(&body).trim()),
        }),
    }
}

/// The `data` list of an API answer, or why there is none.
fn data(path: &str, (status, body): (u16, Vec<u8>)) -> Result<Vec<Value>, AcctError> {
    if status == 401 || status == 403 {
        return Err(AcctError::Forbidden);
    }
    let answer: Value = serde_json::from_slice(&body).map_err(|_| AcctError::Request {
        url: path.to_owned(),
        reason: format!("HTTP {status}: not an API answer"),
    })?;
    if answer["status"] == "error" || status >= 400 {
        return Err(AcctError::Server);
    }
    Ok(match &answer["data"] {
        Value::Array(list) => list.clone(),
        _ => Vec::new(),
    })
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => go_json(other).to_string(),
    }
}

/// A value as Go's encoder writes it: a whole float without its `.0` (`970588160`), keys
/// sorted.
fn go_json(v: &Value) -> Value {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => Value::from(f as i64),
            _ => v.clone(),
        },
        Value::Array(list) => Value::Array(list.iter().map(go_json).collect()),
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), go_json(v))).collect())
        }
        other => other.clone(),
    }
}

fn number(v: f64, n: Number) -> String {
    match n {
        Number::Percent => format!("{v:.2}"),
        Number::Amount => format!("{v:.6}"),
    }
}

/// Why the energy columns asked for are missing from the table, when no job has a figure:
/// said on standard error, so that an empty column does not pass for 0 kWh.
pub fn missing_energy_note(units: &[Value], fields: &[&Field]) -> Option<String> {
    let energy = ["total_cpu_energy_usage_kwh", "total_cpu_emissions_gms"];
    let asked = fields.iter().any(|f| energy.contains(&f.tag));
    let any = units.iter().any(|u| {
        energy
            .iter()
            .any(|t| u[*t].as_object().is_some_and(|m| !m.is_empty()))
    });
    (asked && !units.is_empty() && !any).then(|| {
        "no energy or emissions figures for these jobs: their nodes' exporters have no power collector (ipmi, redfish, rapl, hwmon or cray_pm_counters), or the stats-server has not aggregated them yet".to_owned()
    })
}

/// `HH:MM:SS`, with `D-` in front past a day.
fn elapsed(seconds: i64) -> String {
    let (d, s) = (seconds / 86400, seconds % 86400);
    let hms = format!("{:02}:{:02}:{:02}", s / 3600, s % 3600 / 60, s % 60);
    match d {
        0 => hms,
        d => format!("{d}-{hms}"),
    }
}

/// The table cacct prints: a row per unit (the columns no unit fills left out, one column per
/// source of a per-source metric), a `Summary` row, and a footer row per account of the
/// caller's (or listed users') current usage.
pub fn table(
    units: &[Value],
    usages: &[Value],
    caller: &str,
    users: &[String],
    instant: &[SeriesQuery],
    summary: bool,
) -> Table {
    let mut t = Table::new(Style::Light);
    t.suppress_empty_columns();
    t.set_widths(
        FIELDS
            .iter()
            .map(|f| ColumnWidth {
                name: f.title.to_owned(),
                min: f.min,
                max: f.max,
            })
            .chain(instant.iter().map(|q| ColumnWidth {
                name: q.title.clone(),
                min: 5,
                max: 10,
            }))
            .collect(),
    );
    // The sources of each per-source metric, in the order units name them.
    let sources: Vec<Vec<String>> = FIELDS
        .iter()
        .map(|f| {
            let mut keys: Vec<String> = Vec::new();
            if f.number.is_some() {
                for u in units {
                    let mut own: Vec<&String> = u[f.tag]
                        .as_object()
                        .map(|m| m.keys().collect())
                        .unwrap_or_default();
                    own.sort();
                    for k in own {
                        if !keys.contains(k) {
                            keys.push(k.clone());
                        }
                    }
                }
            }
            keys
        })
        .collect();
    let (mut titles, mut subtitles) = (Vec::new(), Vec::new());
    for (f, keys) in FIELDS.iter().zip(&sources) {
        match keys.len() {
            0 | 1 => {
                titles.push(f.title.to_owned());
                subtitles.push(String::new());
            }
            _ => {
                titles.extend(keys.iter().map(|_| f.title.to_owned()));
                subtitles.extend(keys.iter().cloned());
            }
        }
    }
    for q in instant {
        titles.push(q.title.clone());
        subtitles.push(String::new());
    }
    let width = titles.len();
    t.header(titles, true);
    t.header(subtitles, false);
    let metrics = |record: &Value, row: &mut Vec<String>| {
        for (f, keys) in FIELDS.iter().zip(&sources) {
            let Some(n) = f.number else { continue };
            let values = &record[f.tag];
            if keys.is_empty() {
                row.push(String::new());
            }
            for k in keys {
                row.push(values[k].as_f64().map(|v| number(v, n)).unwrap_or_default());
            }
        }
    };
    // By job id, as CEEMS v0.16's cacct lists them.
    let mut units: Vec<&Value> = units.iter().collect();
    units.sort_by_key(|u| text(&u["uuid"]));
    for u in units {
        let mut row: Vec<String> = FIELDS
            .iter()
            .filter(|f| f.number.is_none())
            .map(|f| text(&u[f.tag]))
            .collect();
        metrics(u, &mut row);
        row.extend(instant.iter().map(|q| text(&u[instant_key(q)])));
        t.row(row, false);
    }
    if !summary {
        return t;
    }
    t.separator();
    let mut summary = vec!["Summary".to_owned()];
    summary.extend(std::iter::repeat_n(String::new(), width));
    t.row(summary, true);
    t.separator();
    for usage in usages {
        let user = text(&usage["username"]);
        if user != caller && !users.contains(&user) && !users.iter().any(|u| u == "all") {
            continue;
        }
        let wall = usage["total_time_seconds"]["walltime"]
            .as_f64()
            .unwrap_or(0.0) as i64;
        let mut row: Vec<String> = FIELDS
            .iter()
            .filter(|f| f.number.is_none())
            .map(|f| match f.key {
                "jobid" => usage["num_units"].as_i64().unwrap_or(0).to_string(),
                "account" => text(&usage["project"]),
                "group" => text(&usage["groupname"]),
                "user" => user.clone(),
                "elapsed" if wall > 0 => elapsed(wall),
                _ => String::new(),
            })
            .collect();
        metrics(usage, &mut row);
        row.extend(instant.iter().map(|_| String::new()));
        t.footer(row);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elapsed_times_read_as_sacct_writes_them() {
        assert_eq!(elapsed(2962), "00:49:22");
        assert_eq!(elapsed(86400 + 61), "1-00:01:01");
    }

    #[test]
    fn a_missing_config_names_the_files_and_places_looked_for() {
        let dir = tempfile::tempdir().unwrap();
        let e = load_settings(&[dir.path().to_owned()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("config.yml") && e.contains(&dir.path().display().to_string()),
            "{e}"
        );
    }

    #[test]
    fn jobs_without_energy_figures_are_said_to_have_none() {
        let (asked, _) = fields(&["jobid".into(), "hostenergy".into()], &[]).unwrap();
        let bare = [serde_json::json!({"uuid": "1"})];
        let note = missing_energy_note(&bare, &asked).unwrap();
        assert!(note.contains("no power collector"), "{note}");
        let measured = [
            serde_json::json!({"uuid": "1"}),
            serde_json::json!({"uuid": "2", "total_cpu_energy_usage_kwh": {"total": 0.0}}),
        ];
        assert_eq!(missing_energy_note(&measured, &asked), None);
        let (plain, _) = fields(&["jobid".into()], &[]).unwrap();
        assert_eq!(missing_energy_note(&bare, &plain), None);
        assert_eq!(missing_energy_note(&[], &asked), None);
    }

    #[test]
    fn an_unknown_field_is_named() {
        let err = fields(&["jobid".into(), "bogus".into()], &[]).unwrap_err();
        assert!(err.to_string().contains("`bogus`"));
        assert_eq!(fields(&["JobID".into()], &[]).unwrap().0[0].tag, "uuid");
    }

    /// A site's v0.10-era file (queries as a map) still loads, and its log says so; v0.16's
    /// loads with its list and its limits.
    #[test]
    fn both_generations_of_cacct_yml_load() {
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let old = load_settings(&[fixtures.join("ceems-api/cmd/cacct/testdata")]).unwrap();
        assert!(old.old_queries_form);
        assert_eq!(old.queries[0].key, "cpu_usage");
        assert!(old.log.is_none());
        let new = load_settings(&[fixtures.join("ceems-v0.16/cmd/cacct/testdata")]).unwrap();
        assert!(!new.old_queries_form);
        assert_eq!(new.max_units_for_range_queries, 2);
        let keys: Vec<&str> = new.queries.iter().map(|q| q.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "cpuUsage",
                "avgUsageSomethingVector",
                "avgUsageSomethingScalar"
            ]
        );

        let dir = tempfile::tempdir().unwrap();
        let text =
            std::fs::read_to_string(fixtures.join("ceems-api/cmd/cacct/testdata/config.yml"))
                .unwrap();
        std::fs::write(
            dir.path().join("config.yml"),
            format!(
                "{text}\nlogging:\n  enabled: true\n  format: json\n  directory: {}\n",
                dir.path().display()
            ),
        )
        .unwrap();
        let logged = load_settings(&[dir.path().to_owned()]).unwrap();
        let log = logged.log.unwrap();
        log.write("warn", "old form", &[("user", "usr1")]);
        log.write("debug", "below the level", &[]);
        let lines = std::fs::read_to_string(dir.path().join("cacct.log")).unwrap();
        assert_eq!(lines.lines().count(), 1, "{lines}");
        let line: Value = serde_json::from_str(lines.trim()).unwrap();
        assert_eq!(
            (line["level"].as_str(), line["user"].as_str()),
            (Some("warn"), Some("usr1"))
        );
        std::fs::write(
            dir.path().join("config.yml"),
            format!("{text}\nlogging:\n  enabled: true\n  format: xml\n  directory: /tmp\n"),
        )
        .unwrap();
        let e = load_settings(&[dir.path().to_owned()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("logging.format"), "{e}");
    }

    #[test]
    fn instant_answers_are_written_as_ceems_writes_them() {
        let vector = serde_json::json!({"resultType": "vector", "result": [
            {"metric": {"uuid": "1", "instance": "n1:9010"}, "value": [12345, "21.5"]}]});
        assert_eq!(
            instant_samples(&vector).to_string(),
            r#"[{"labels":{"instance":"n1:9010"},"value":21.5}]"#
        );
        let scalar = serde_json::json!({"resultType": "scalar", "result": [12345, "3"]});
        assert_eq!(
            instant_samples(&scalar).to_string(),
            r#"[{"labels":{},"value":3}]"#
        );
        assert_eq!(
            instant_samples(&serde_json::json!({"result": "x"})).to_string(),
            "[]"
        );
    }

    #[test]
    fn objects_are_written_as_go_writes_them() {
        let v = serde_json::json!({"walltime": 2962.0, "mem": 343597383680.0, "ratio": 0.5});
        assert_eq!(
            text(&v),
            r#"{"mem":343597383680,"ratio":0.5,"walltime":2962}"#
        );
    }

    #[test]
    fn a_source_one_unit_lacks_is_an_empty_cell_under_its_own_title() {
        let units: Vec<Value> = vec![
            serde_json::json!({"uuid": "1", "avg_cpu_usage": {"a": 1.0, "b": 2.0}}),
            serde_json::json!({"uuid": "2", "avg_cpu_usage": {"b": 3.0}}),
        ];
        let out = table(&units, &[], "u", &[], &[], true).render_csv();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[1], ",a,b", "{out}");
        assert_eq!(lines[2], "1,1.00,2.00", "{out}");
        assert_eq!(lines[3], "2,,3.00", "{out}");
    }
}
