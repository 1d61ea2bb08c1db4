//! `cacct --ts.metrics`: each unit's series of the config's range queries from the TSDB, one
//! CSV file per series named after its labels' fingerprint (Prometheus's), and
//! `metadata.json` saying what each file holds (the query's help and title, the node, the
//! job), as CEEMS v0.16 writes them, for pandas and friends.

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::Path;

use serde_json::Value;

use super::{AcctError, Client, SeriesQuery};
use crate::web::generate::write_private;

/// Prometheus's fingerprint of a label set: FNV-1a 64 over the sorted names and values, each
/// followed by 0xff.
pub fn fingerprint(labels: &BTreeMap<String, String>) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut add = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for (name, value) in labels {
        add(name.as_bytes());
        add(&[0xff]);
        add(value.as_bytes());
        add(&[0xff]);
    }
    format!("{hash:016x}")
}

/// Go's shortest decimal form of a float, as Prometheus's client writes a sample.
fn go_float(v: f64) -> String {
    match v {
        v if v.is_nan() => "NaN".into(),
        f64::INFINITY => "+Inf".into(),
        f64::NEG_INFINITY => "-Inf".into(),
        v => format!("{v}"),
    }
}

/// A sample's time as Prometheus's client prints it: seconds, to the millisecond.
fn go_time(seconds: f64) -> String {
    let ms = (seconds * 1000.0).round() as i64;
    match ms % 1000 {
        0 => (ms / 1000).to_string(),
        _ => go_float(ms as f64 / 1000.0),
    }
}

/// Prometheus answers at most 11,000 points a series; never finer than `min_step` seconds.
fn step_seconds(start_ms: i64, end_ms: i64, min_step: i64) -> i64 {
    let span = (end_ms - start_ms).max(0) / 1000;
    (span / 11_000 + 1).max(min_step)
}

/// What the saving of series is bounded by.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Series one query of one job may give; more are not saved.
    pub max_series: usize,
    /// The least step, in seconds.
    pub min_step: i64,
}

/// One saved series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    pub fingerprint: String,
    pub labels: BTreeMap<String, String>,
}

/// The series of each query for each unit, saved in `dir`; what could not be fetched is said
/// on standard error and the rest saved.
pub fn save(
    tsdb: &Client,
    queries: &[&SeriesQuery],
    units: &[Value],
    dir: &Path,
    now_ms: i64,
    limits: Limits,
) -> Result<Vec<Saved>, AcctError> {
    let failed = |reason: String| AcctError::Request {
        url: dir.display().to_string(),
        reason,
    };
    // The caller's only, as CEEMS makes it.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| failed(e.to_string()))?;
    let mut saved = Vec::new();
    for unit in units {
        let Some(uuid) = unit["uuid"].as_str() else {
            continue;
        };
        let start = unit["started_at_ts"].as_i64().unwrap_or(0);
        // Not started: nothing to ask. Still running: up to now.
        if start <= 0 {
            continue;
        }
        let end = match unit["ended_at_ts"].as_i64().unwrap_or(0) {
            e if e >= start => e,
            _ => now_ms,
        };
        for query in queries {
            let promql = query.promql(&[uuid], (end - start) / 1000);
            match range(tsdb, &promql, start, end, limits.min_step) {
                Ok(series) => {
                    let total = series.len();
                    for (labels, samples) in series.into_iter().take(limits.max_series) {
                        if !labels.contains_key("uuid") {
                            continue;
                        }
                        let fp = fingerprint(&labels);
                        // What the file holds, in CEEMS's words: the query's help and title,
                        // the node (its instance without the port) and the job.
                        let node = labels
                            .get("nodename")
                            .or_else(|| labels.get("hostname"))
                            .cloned()
                            .or_else(|| {
                                labels.get("instance").map(|i| {
                                    i.rsplit_once(':').map_or(i.as_str(), |(h, _)| h).to_owned()
                                })
                            })
                            .unwrap_or_default();
                        let labels: BTreeMap<String, String> = [
                            ("help", query.help.clone()),
                            ("metric", query.title.clone()),
                            ("nodename", node),
                            ("uuid", labels.get("uuid").cloned().unwrap_or_default()),
                        ]
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect();
                        let mut csv = String::from("timestamp,value\n");
                        for (t, v) in samples {
                            csv.push_str(&format!("{},{}\n", go_time(t), go_float(v)));
                        }
                        let file = dir.join(format!("{fp}.csv"));
                        if let Err(e) = write_private(&file, csv.as_bytes()) {
                            eprintln!(
                                "failed to open file to write metrics: {e} file: {}",
                                file.display()
                            );
                            continue;
                        }
                        saved.push(Saved {
                            fingerprint: fp,
                            labels,
                        });
                    }
                    if total > limits.max_series {
                        eprintln!(
                            "query {} of job {uuid} gave {total} series: the first {} are saved (tsdb.query_max_series)",
                            query.key, limits.max_series
                        );
                    }
                }
                Err(e) => eprintln!("failed to fetch time series for query {promql} err: {e}"),
            }
        }
    }
    write_private(&dir.join("metadata.json"), metadata(&saved).as_bytes())
        .map_err(|e| failed(format!("metadata.json: {e}")))?;
    Ok(saved)
}

/// `metadata.json` as Go's encoder writes it: tab-indented, HTML characters escaped, a newline
/// at the end.
pub fn metadata(saved: &[Saved]) -> String {
    let list: Vec<Value> = saved
        .iter()
        .map(|s| serde_json::json!({"fingerprint": s.fingerprint, "labels": s.labels}))
        .collect();
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"\t");
    let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
    serde::Serialize::serialize(&list, &mut ser).unwrap_or_default();
    let text = String::from_utf8_lossy(&out)
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026");
    format!("{text}\n")
}

type Series = Vec<(BTreeMap<String, String>, Vec<(f64, f64)>)>;

/// A range query's series.
fn range(
    tsdb: &Client,
    promql: &str,
    start_ms: i64,
    end_ms: i64,
    min_step: i64,
) -> Result<Series, String> {
    let params = [
        ("query".to_owned(), promql.to_owned()),
        ("start".to_owned(), go_time(start_ms as f64 / 1000.0)),
        ("end".to_owned(), go_time(end_ms as f64 / 1000.0)),
        (
            "step".to_owned(),
            format!("{}s", step_seconds(start_ms, end_ms, min_step)),
        ),
    ];
    let (status, body) = tsdb
        .get("/api/v1/query_range", &params, &[])
        .map_err(|e| e.to_string())?;
    let answer: Value = serde_json::from_slice(&body)
        .map_err(|e| format!("HTTP {status}: not a Prometheus answer: {e}"))?;
    if answer["status"] != "success" {
        let why = answer["error"].as_str().unwrap_or("no error given");
        return Err(format!("HTTP {status}: status {}: {why}", answer["status"]));
    }
    let mut series = Vec::new();
    for s in answer["data"]["result"].as_array().into_iter().flatten() {
        let labels: BTreeMap<String, String> = s["metric"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        let samples = s["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| {
                let t = p[0].as_f64()?;
                let v: f64 = p[1].as_str()?.parse().ok()?;
                Some((t, v))
            })
            .collect();
        series.push((labels, samples));
    }
    Ok(series)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_prometheus_s() {
        let labels: BTreeMap<String, String> = [("instance", "localhost:9090"), ("uuid", "147973")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        // CEEMS's cacct-tsdata scenario names this series' file so.
        assert_eq!(fingerprint(&labels), "554b56cadf9dea4b");
    }

    #[test]
    fn samples_are_written_as_go_writes_them() {
        assert_eq!(go_time(12345.0), "12345");
        assert_eq!(go_time(12345.5), "12345.5");
        assert_eq!(go_float(29.38529014), "29.38529014");
        assert_eq!(go_float(f64::INFINITY), "+Inf");
        assert_eq!(step_seconds(0, 3_600_000, 10), 10);
        assert_eq!(step_seconds(0, 7 * 86_400_000, 10), 55);
        assert_eq!(step_seconds(0, 3_600_000, 30), 30);
    }

    #[test]
    fn metadata_is_go_s_indented_json() {
        let saved = [Saved {
            fingerprint: "ab".into(),
            labels: [("uuid".to_owned(), "<1>".to_owned())]
                .into_iter()
                .collect(),
        }];
        assert_eq!(
            metadata(&saved),
            "[\n\t{\n\t\t\"fingerprint\": \"ab\",\n\t\t\"labels\": {\n\t\t\t\"uuid\": \"\\u003c1\\u003e\"\n\t\t}\n\t}\n]\n"
        );
        assert_eq!(metadata(&[]), "[]\n");
    }
}
