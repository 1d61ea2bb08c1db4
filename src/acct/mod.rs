//! `cacct`'s work: a user's jobs from the stats-server's API, printed as CEEMS's `cacct`
//! prints them, and their time series from the TSDB. The command line, the user and the
//! privileges are `cmd::cacct`'s.

mod client;
pub mod series;
pub mod table;

pub use client::{Client, Munge};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::config::http_client::{ClientSettings, ClientWeb};
use table::{ColumnWidth, Style, Table};

/// How a metric column's values are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Number {
    /// `%.2f`: usages in percent.
    Percent,
    /// `%f`: energies and emissions.
    Amount,
}

/// One column cacct can show.
#[derive(Debug)]
pub struct Field {
    /// What `--format` names it.
    pub key: &'static str,
    /// The API's field.
    pub tag: &'static str,
    /// What `--helpformat` lists.
    pub name: &'static str,
    pub help: &'static str,
    title: &'static str,
    min: usize,
    max: usize,
    /// For the API's per-source maps (one column per source).
    number: Option<Number>,
}

const fn field(
    key: &'static str,
    tag: &'static str,
    name: &'static str,
    help: &'static str,
    title: &'static str,
    (min, max): (usize, usize),
    number: Option<Number>,
) -> Field {
    Field {
        key,
        tag,
        name,
        help,
        title,
        min,
        max,
        number,
    }
}

/// Every field, in the table's order (CEEMS's, with its widths).
pub const FIELDS: &[Field] = &[
    field("jobid", "uuid", "jobID", "Job ID", "Job ID", (3, 7), None),
    field(
        "name",
        "name",
        "Name",
        "Name of the job",
        "Name",
        (5, 8),
        None,
    ),
    field(
        "account",
        "project",
        "Account",
        "Account name",
        "Account",
        (5, 8),
        None,
    ),
    field(
        "group",
        "groupname",
        "group",
        "Group name",
        "Group",
        (5, 5),
        None,
    ),
    field(
        "user",
        "username",
        "user",
        "User name",
        "User",
        (5, 5),
        None,
    ),
    field(
        "createdat",
        "created_at",
        "createdAt",
        "Job creation time",
        "Created",
        (5, 8),
        None,
    ),
    field(
        "startedat",
        "started_at",
        "startedAt",
        "Job start time",
        "Started",
        (5, 12),
        None,
    ),
    field(
        "endedat",
        "ended_at",
        "endedAt",
        "Job end time",
        "Ended",
        (5, 12),
        None,
    ),
    field(
        "elapsed",
        "elapsed",
        "elapsed",
        "Job elapsed time",
        "Elapsed",
        (5, 12),
        None,
    ),
    field(
        "state",
        "state",
        "state",
        "Job state",
        "State",
        (5, 5),
        None,
    ),
    field(
        "cpuusage",
        "avg_cpu_usage",
        "cpuUsage",
        "Average CPU usage over the duration of the job",
        "CPU Usage(%)",
        (5, 6),
        Some(Number::Percent),
    ),
    field(
        "cpumemoryusage",
        "avg_cpu_mem_usage",
        "cpuMemoryUsage",
        "Average CPU memory usage over the duration of the job",
        "CPU Mem. Usage(%)",
        (5, 6),
        Some(Number::Percent),
    ),
    field(
        "hostenergy",
        "total_cpu_energy_usage_kwh",
        "hostEnergy",
        "Total energy usage by the host duration of the job",
        "Host Energy(kWh)",
        (5, 8),
        Some(Number::Amount),
    ),
    field(
        "hostemissions",
        "total_cpu_emissions_gms",
        "hostEmissions",
        "Total eq. emissions due to host energy usage duration of the job",
        "Host Emissions(gms)",
        (5, 12),
        Some(Number::Amount),
    ),
    field(
        "gpuusage",
        "avg_gpu_usage",
        "gpuUsage",
        "Average GPU(s) usage over the duration of the job",
        "GPU Usage(%)",
        (5, 6),
        Some(Number::Percent),
    ),
    field(
        "gpumemoryusage",
        "avg_gpu_mem_usage",
        "gpuMemoryUsage",
        "Average GPU(s) memory usage over the duration of the job",
        "GPU Mem. Usage(%)",
        (5, 6),
        Some(Number::Percent),
    ),
    field(
        "gpuenergy",
        "total_gpu_energy_usage_kwh",
        "gpuEnergy",
        "Total energy usage by the GPU(s) duration of the job",
        "GPU Energy(kWh)",
        (5, 8),
        Some(Number::Amount),
    ),
    field(
        "gpuemissions",
        "total_gpu_emissions_gms",
        "gpuEmissions",
        "Total eq. emissions due to GPU(s) energy usage duration of the job",
        "GPU Emissions(gms)",
        (5, 12),
        Some(Number::Amount),
    ),
];

/// What a table shows without `--format` or `--long`.
pub const DEFAULT_FIELDS: &[&str] = &[
    "jobid",
    "account",
    "elapsed",
    "cpuusage",
    "cpumemoryusage",
    "hostenergy",
    "hostemissions",
    "gpuusage",
    "gpumemoryusage",
    "gpuenergy",
    "gpuemissions",
];

/// The fields `--format` names (case does not matter).
pub fn fields(names: &[String]) -> Result<Vec<&'static Field>, AcctError> {
    names
        .iter()
        .map(|n| {
            FIELDS
                .iter()
                .find(|f| f.key.eq_ignore_ascii_case(n.trim()))
                .ok_or_else(|| AcctError::UnknownField(n.clone()))
        })
        .collect()
}

/// `--helpformat`: each field's name and what it is, sorted by key.
pub fn help_format() -> String {
    let mut t = Table::new(Style::Ascii);
    t.header(vec!["Field".into(), "Description".into()], false);
    let mut sorted: Vec<&Field> = FIELDS.iter().collect();
    sorted.sort_by_key(|f| f.key);
    for f in sorted {
        t.row(vec![f.name.into(), f.help.into()], false);
    }
    t.render()
}

#[derive(Debug, thiserror::Error)]
pub enum AcctError {
    #[error("unknown field `{0}` (--helpformat lists them)")]
    UnknownField(String),
    #[error("config file not found in {0}")]
    NoConfig(String),
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
    #[serde(default)]
    queries: BTreeMap<String, String>,
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
    /// Name to PromQL with `%s` where the job ids go.
    pub queries: BTreeMap<String, String>,
    pub api_munge: Option<Munge>,
    pub tsdb_munge: Option<Munge>,
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
        return Err(AcctError::NoConfig(list.join(", ")));
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
        queries: config.tsdb.queries,
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
}

/// The caller's (or, for an admin, the listed users') units and current usage.
pub fn fetch(
    api: &Client,
    settings: &Settings,
    caller: &str,
    q: &Query,
) -> Result<(Vec<Value>, Vec<Value>), AcctError> {
    let mut params: Vec<(String, String)> = vec![
        ("cluster_id".into(), settings.cluster_id.clone()),
        ("from".into(), q.from.to_string()),
        ("to".into(), q.to.to_string()),
    ];
    let mut tags: Vec<&str> = q.fields.iter().map(|f| f.tag).collect();
    // The times the series are asked for.
    tags.extend(["started_at_ts", "ended_at_ts"]);
    params.extend(tags.iter().map(|t| ("field".to_owned(), (*t).to_owned())));
    params.extend(q.accounts.iter().map(|a| ("project".to_owned(), a.clone())));
    params.extend(q.jobs.iter().map(|j| ("uuid".to_owned(), j.clone())));
    params.extend(q.users.iter().map(|u| ("user".to_owned(), u.clone())));
    let admin = if q.users.is_empty() { "" } else { "/admin" };
    let header = [(settings.user_header.as_str(), caller)];
    let units = data(
        "/api/v1/units",
        api.get(&format!("/api/v1/units{admin}"), &params, &header)?,
    )?;
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
        other => other.to_string(),
    }
}

fn number(v: f64, n: Number) -> String {
    match n {
        Number::Percent => format!("{v:.2}"),
        Number::Amount => format!("{v:.6}"),
    }
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
pub fn table(units: &[Value], usages: &[Value], caller: &str, users: &[String]) -> Table {
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
    for u in units {
        let mut row: Vec<String> = FIELDS
            .iter()
            .filter(|f| f.number.is_none())
            .map(|f| text(&u[f.tag]))
            .collect();
        metrics(u, &mut row);
        t.row(row, false);
    }
    t.separator();
    let mut summary = vec!["Summary".to_owned()];
    summary.extend(std::iter::repeat_n(String::new(), width));
    t.row(summary, true);
    t.separator();
    for usage in usages {
        let user = text(&usage["username"]);
        if user != caller && !users.contains(&user) {
            continue;
        }
        let wall = usage["total_time_seconds"]["walltime"]
            .as_f64()
            .unwrap_or(0.0) as i64;
        let mut row = vec![
            usage["num_units"].as_i64().unwrap_or(0).to_string(),
            String::new(),
            text(&usage["project"]),
            text(&usage["groupname"]),
            user,
            String::new(),
            String::new(),
            String::new(),
            if wall > 0 {
                elapsed(wall)
            } else {
                String::new()
            },
            String::new(),
        ];
        metrics(usage, &mut row);
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
    fn an_unknown_field_is_named() {
        let err = fields(&["jobid".into(), "bogus".into()]).unwrap_err();
        assert!(err.to_string().contains("`bogus`"));
        assert_eq!(fields(&["JobID".into()]).unwrap()[0].tag, "uuid");
    }

    #[test]
    fn a_source_one_unit_lacks_is_an_empty_cell_under_its_own_title() {
        let units: Vec<Value> = vec![
            serde_json::json!({"uuid": "1", "avg_cpu_usage": {"a": 1.0, "b": 2.0}}),
            serde_json::json!({"uuid": "2", "avg_cpu_usage": {"b": 3.0}}),
        ];
        let out = table(&units, &[], "u", &[]).render_csv();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[1], ",a,b", "{out}");
        assert_eq!(lines[2], "1,1.00,2.00", "{out}");
        assert_eq!(lines[3], "2,,3.00", "{out}");
    }
}
