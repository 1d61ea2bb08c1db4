//! The stats-server's Prometheus client: instant queries for the per-job aggregates, range
//! queries for the report's plots, both as form POSTs to Prometheus's HTTP API.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum PromError {
    #[error("Prometheus at {url}: {message}")]
    Request { url: String, message: String },
    #[error("Prometheus answered something that is not what was asked: {0}")]
    Shape(String),
}

impl PromError {
    /// The store refused the query for its size (Prometheus's `--query.max-samples`,
    /// VictoriaMetrics's `-search.maxUniqueTimeseries` and `-search.maxSamplesPerQuery`,
    /// Thanos's and Mimir's series and chunk limits): fewer jobs at a time may pass.
    pub fn is_too_large(&self) -> bool {
        let PromError::Request { message, .. } = self else {
            return false;
        };
        let m = message.to_ascii_lowercase();
        [
            "too many samples",
            "matching timeseries exceeds",
            "-search.max",
            "maxuniquetimeseries",
            "maxsamplesperquery",
            "maxseries",
            "max-samples",
            "exceeded the maximum",
            "limit exceeded",
            "exceeds the limit",
        ]
        .iter()
        .any(|hint| m.contains(hint))
    }
}

/// A store's error as a log line can hold it: VictoriaMetrics repeats the whole query (some
/// thousands of job ids) three times before saying why, at the end.
fn shortened(text: &str) -> String {
    const HEAD: usize = 200;
    const TAIL: usize = 400;
    if text.chars().count() <= HEAD + TAIL + 20 {
        return text.to_owned();
    }
    let head: String = text.chars().take(HEAD).collect();
    let tail: Vec<char> = text.chars().rev().take(TAIL).collect();
    let tail: String = tail.into_iter().rev().collect();
    format!("{head} … {tail}")
}

/// An instant query: `(uuid, value)` of each series of the result.
pub trait Prometheus: Send + Sync {
    fn query(&self, promql: &str, at: i64) -> Result<Vec<(String, f64)>, PromError>;
}

/// A range query: the points `(unix time, value)` of the first series.
pub trait RangeQuery: Send + Sync {
    fn query_range(
        &self,
        promql: &str,
        start: i64,
        end: i64,
        step: i64,
    ) -> Result<Vec<(f64, f64)>, PromError>;
}

/// Prometheus's HTTP API at `url`.
pub struct HttpPrometheus {
    pub url: String,
    pub agent: ureq::Agent,
}

impl HttpPrometheus {
    /// Whether `url` can be a Prometheus base URL: `http` or `https`, with a host.
    pub fn check_url(url: &str) -> Result<(), String> {
        let uri: hyper::Uri = url
            .parse()
            .map_err(|e| format!("`{url}` is not a URL: {e}"))?;
        match (uri.scheme_str(), uri.host()) {
            (Some("http" | "https"), Some(host)) if !host.is_empty() => Ok(()),
            (None, _) | (Some(_), None) => Err(format!(
                "`{url}` has no scheme and host; write it as http://{}",
                url.trim_start_matches('/')
            )),
            (Some(scheme), _) => Err(format!("`{url}`: scheme `{scheme}` is not http or https")),
        }
    }

    pub fn new(url: &str, timeout: Duration) -> HttpPrometheus {
        HttpPrometheus {
            url: url.trim_end_matches('/').to_owned(),
            agent: ureq::AgentBuilder::new().timeout(timeout).build(),
        }
    }

    /// The body of `POST <url>/api/v1/<endpoint>` with `form`.
    fn post(&self, endpoint: &str, form: &[(&str, &str)]) -> Result<String, PromError> {
        let url = format!("{}/api/v1/{endpoint}", self.url);
        let err = |message: String| PromError::Request {
            url: url.clone(),
            message,
        };
        match self.agent.post(&url).send_form(form) {
            Ok(r) => r.into_string().map_err(|e| err(e.to_string())),
            // Prometheus explains a bad query in the JSON body of a 400/422.
            Err(ureq::Error::Status(code, r)) => {
                let text = r.into_string().unwrap_or_default();
                Err(err(format!("status {code}: {}", shortened(text.trim()))))
            }
            Err(e) => Err(err(e.to_string())),
        }
    }
}

impl Prometheus for HttpPrometheus {
    fn query(&self, promql: &str, at: i64) -> Result<Vec<(String, f64)>, PromError> {
        let body = self.post("query", &[("query", promql), ("time", &at.to_string())])?;
        parse_vector(&body)
    }
}

impl RangeQuery for HttpPrometheus {
    fn query_range(
        &self,
        promql: &str,
        start: i64,
        end: i64,
        step: i64,
    ) -> Result<Vec<(f64, f64)>, PromError> {
        let body = self.post(
            "query_range",
            &[
                ("query", promql),
                ("start", &start.to_string()),
                ("end", &end.to_string()),
                ("step", &step.to_string()),
            ],
        )?;
        parse_matrix(&body)
    }
}

#[derive(Deserialize)]
struct PromResponse {
    status: String,
    #[serde(default)]
    data: Option<PromData>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct PromData {
    #[serde(rename = "resultType")]
    result_type: String,
    result: Vec<PromSample>,
}

#[derive(Deserialize)]
struct PromSample {
    metric: HashMap<String, String>,
    value: (f64, String),
}

/// Parses an instant query's JSON answer into `(uuid, value)`.
pub fn parse_vector(body: &str) -> Result<Vec<(String, f64)>, PromError> {
    let r: PromResponse =
        serde_json::from_str(body).map_err(|e| PromError::Shape(e.to_string()))?;
    if r.status != "success" {
        return Err(PromError::Shape(r.error.unwrap_or(r.status)));
    }
    let data = r.data.ok_or_else(|| PromError::Shape("no data".into()))?;
    if data.result_type != "vector" {
        return Err(PromError::Shape(format!(
            "result type {}",
            data.result_type
        )));
    }
    Ok(data
        .result
        .into_iter()
        .filter_map(|s| {
            let v: f64 = s.value.1.parse().ok()?;
            Some((s.metric.get("uuid")?.clone(), v))
        })
        .filter(|(_, v)| v.is_finite())
        .collect())
}

/// The first series of a range query's JSON answer.
pub fn parse_matrix(body: &str) -> Result<Vec<(f64, f64)>, PromError> {
    let v: Value = serde_json::from_str(body).map_err(|e| PromError::Shape(e.to_string()))?;
    if v["status"] != "success" {
        return Err(PromError::Shape(
            v["error"].as_str().unwrap_or("not a success").to_owned(),
        ));
    }
    if v["data"]["resultType"] != "matrix" {
        return Err(PromError::Shape(format!(
            "result type {}",
            v["data"]["resultType"]
        )));
    }
    let Some(first) = v["data"]["result"].as_array().and_then(|r| r.first()) else {
        return Ok(Vec::new());
    };
    Ok(first["values"]
        .as_array()
        .map(|vals| {
            vals.iter()
                .filter_map(|p| {
                    let t = p.get(0)?.as_f64()?;
                    let y: f64 = p.get(1)?.as_str()?.parse().ok()?;
                    y.is_finite().then_some((t, y))
                })
                .collect()
        })
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_need_a_scheme_and_a_host() {
        assert!(HttpPrometheus::check_url("http://localhost:9090").is_ok());
        assert!(HttpPrometheus::check_url("https://tsdb.example.org/prom/").is_ok());
        let err = HttpPrometheus::check_url("localhost:9090").unwrap_err();
        assert!(err.contains("write it as http://localhost:9090"), "{err}");
        assert!(HttpPrometheus::check_url("ftp://host").is_err());
        assert!(HttpPrometheus::check_url("http://").is_err());
        assert!(HttpPrometheus::check_url("not a url").is_err());
    }

    #[test]
    fn a_prometheus_answer_is_read_and_a_bad_one_is_an_error() {
        let ok = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"uuid":"7"},"value":[1,"12.5"]},{"metric":{},"value":[1,"3"]},{"metric":{"uuid":"8"},"value":[1,"NaN"]}]}}"#;
        assert_eq!(parse_vector(ok).unwrap(), vec![("7".to_owned(), 12.5)]);
        assert!(parse_vector(r#"{"status":"error","error":"parse error"}"#)
            .unwrap_err()
            .to_string()
            .contains("parse error"));
        assert!(parse_vector("<html>").is_err());
        assert!(
            parse_vector(r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#)
                .is_err()
        );
    }

    #[test]
    fn a_refusal_for_size_is_told_apart_and_a_long_one_shortened_keeping_why() {
        let ids = (0..3000)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join("|");
        let vm = format!(
            "{{\"error\":\"error when executing query=x{{uuid=~{ids}}}: search error: the number of matching timeseries exceeds 100; either narrow down the search or increase -search.max* command-line flag values at vmselect\"}}"
        );
        let short = shortened(&vm);
        assert!(short.chars().count() < 700, "{}", short.len());
        assert!(short.starts_with("{\"error\":\"error when executing"));
        let refused = |message: String| PromError::Request {
            url: "vm".into(),
            message,
        };
        assert!(refused(format!("status 422: {short}")).is_too_large());
        let prometheus = r#"status 422: {"status":"error","errorType":"execution","error":"query processing would load too many samples into memory in query execution"}"#;
        assert!(refused(prometheus.into()).is_too_large());
        assert!(!refused("status 400: parse error at char 3".into()).is_too_large());
        assert!(!refused("connection refused".into()).is_too_large());
        assert_eq!(shortened("short"), "short");
    }

    #[test]
    fn a_range_answer_is_read_and_a_bad_one_is_an_error() {
        let ok = r#"{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[10,"1.5"],[20,"NaN"],[30,"2"]]}]}}"#;
        assert_eq!(parse_matrix(ok).unwrap(), vec![(10.0, 1.5), (30.0, 2.0)]);
        let empty = r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert!(parse_matrix(empty).unwrap().is_empty());
        assert!(parse_matrix(r#"{"status":"error","error":"bad query"}"#).is_err());
        assert!(parse_matrix("[").is_err());
    }
}
