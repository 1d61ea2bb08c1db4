//! A job's report for its owner: `GET /report/{cluster}/{jobid}` is an HTML page (no
//! JavaScript, nothing loaded from elsewhere) with the job's facts, its findings and advice,
//! plots of its CPU, memory, GPU use and power drawn here as SVG from Prometheus range
//! queries, and its energy and emissions; `/report/{cluster}/{jobid}.json` says the same for
//! scripts, and `/report/{cluster}/{jobid}.txt` as plain text for a terminal or a mail. The
//! user and admins are as for the API.

use std::collections::HashMap;
use std::sync::Arc;

use hyper::StatusCode;
use serde::Serialize;
use serde_json::{json, Value};

use super::api::{Answer, Api, ApiError};
use super::prometheus::{PromError, RangeQuery};
use super::refresh::{JobRefresh, Refreshed};

mod figures;
mod html;
mod svg;
mod text;

use html::render_html;
pub use html::{escape, FINDING_STYLE};
pub use svg::svg;
use text::render_text;
pub use text::{clean, utc};

/// One plot of the report.
struct PlotSpec {
    title: &'static str,
    unit: &'static str,
    /// `$uuid` and `$rate` (the rate window) are filled in.
    query: &'static str,
    /// The top of the y axis at least: what the job asked for, so a plot shows how much of
    /// it was used.
    y_top: YTop,
    /// Drawn only for a job that asked for GPUs.
    gpus_only: bool,
}

#[derive(Clone, Copy)]
enum YTop {
    Percent,
    MemoryRequest,
    Data,
}

const PLOTS: &[PlotSpec] = &[
    PlotSpec {
        title: "CPU use",
        unit: "% of allocated cores",
        query: r#"100 * sum(rate(ceems_compute_unit_cpu_user_seconds_total{uuid="$uuid"}[$rate]) + rate(ceems_compute_unit_cpu_system_seconds_total{uuid="$uuid"}[$rate])) / sum(ceems_compute_unit_cpus{uuid="$uuid"})"#,
        y_top: YTop::Percent,
        gpus_only: false,
    },
    PlotSpec {
        title: "Memory",
        unit: "bytes",
        query: r#"sum(ceems_compute_unit_memory_used_bytes{uuid="$uuid"})"#,
        y_top: YTop::MemoryRequest,
        gpus_only: false,
    },
    PlotSpec {
        title: "GPU use",
        unit: "%",
        query: r#"100 * avg(ceems_compute_unit_gpu_utilization_ratio{uuid="$uuid"})"#,
        y_top: YTop::Percent,
        gpus_only: true,
    },
    PlotSpec {
        title: "Power",
        unit: "W",
        query: r#"sum(uuid:ceems_host_power_watts:pue{uuid="$uuid"})"#,
        y_top: YTop::Data,
        gpus_only: false,
    },
];

#[derive(Debug, Clone, Serialize)]
pub struct Plot {
    pub title: String,
    pub unit: String,
    pub points: Vec<(f64, f64)>,
    /// The top of the y axis at least (what the job asked for), in the plot's unit.
    pub y_top: Option<f64>,
}

/// What a report holds, in the `.json` form.
#[derive(Debug, Clone, Serialize)]
pub struct ReportData {
    pub job: Value,
    pub findings: Value,
    pub plots: Vec<Plot>,
    /// Why there are no plots, or which ones are missing.
    pub notes: Vec<String>,
}

/// One decision of a policy about the job, as a line: when, which policy, what, how it ended.
fn action_line(a: &Value) -> String {
    let at = a["decided_at"]
        .as_i64()
        .and_then(|t| jiff::Timestamp::from_second(t).ok())
        .map_or_else(String::new, |t| {
            t.strftime("%Y-%m-%d %H:%M UTC").to_string()
        });
    let what = match (a["action"].as_str(), a["stage"].as_i64()) {
        (Some("warn"), Some(n)) => format!("warning {n}"),
        (Some(other), _) => other.to_owned(),
        _ => "action".to_owned(),
    };
    let dry = if a["dry_run"].as_bool() == Some(true) {
        " (dry run)"
    } else {
        ""
    };
    let detail = a["detail"]
        .as_str()
        .filter(|d| !d.is_empty())
        .map_or_else(String::new, |d| format!(": {d}"));
    format!(
        "{at}: policy {}: {what}{dry}, {}{detail}",
        a["policy"].as_str().unwrap_or("?"),
        a["outcome"].as_str().unwrap_or("?")
    )
}

/// Reports over the API's store and each cluster's Prometheus.
pub struct Reports {
    api: Arc<Api>,
    prometheus: HashMap<String, Arc<dyn RangeQuery>>,
    /// The exporters' scrape interval, for rate windows.
    scrape_interval: i64,
    /// Brings a job the periodic update has not reached up to date first.
    refresh: Option<Arc<JobRefresh>>,
}

/// Points per plot at most: the step is fitted to the job's length.
const MAX_POINTS: i64 = 240;

/// The page's response: status, content type and body.
pub struct Page {
    pub status: StatusCode,
    pub content_type: &'static str,
    pub body: String,
}

/// The forms a report comes in, by the path's suffix.
#[derive(Clone, Copy, PartialEq)]
enum Form {
    Html,
    Json,
    Text,
}

impl Page {
    fn error(e: ApiError, form: Form) -> Page {
        let status = e.status();
        match form {
            Form::Json => {
                return Page {
                    status,
                    content_type: "application/json",
                    body: Answer::from(e).text().to_owned(),
                }
            }
            Form::Text => {
                return Page {
                    status,
                    content_type: "text/plain; charset=utf-8",
                    body: format!("{status}: {}\n", text::clean(&e.to_string())),
                }
            }
            Form::Html => {}
        }
        Page {
            status,
            content_type: "text/html; charset=utf-8",
            body: format!(
                "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Job report</title></head><body><h1>{status}</h1><p>{}</p></body></html>\n",
                escape(&e.to_string())
            ),
        }
    }
}

impl Reports {
    pub fn new(
        api: Arc<Api>,
        prometheus: HashMap<String, Arc<dyn RangeQuery>>,
        scrape_interval: i64,
    ) -> Reports {
        Reports {
            api,
            prometheus,
            scrape_interval: scrape_interval.max(1),
            refresh: None,
        }
    }

    pub fn with_refresh(mut self, refresh: Arc<JobRefresh>) -> Reports {
        self.refresh = Some(refresh);
        self
    }

    /// Answers `GET /report/{cluster}/{jobid}[.json|.txt]` for `user` at `now`.
    pub async fn handle(&self, path: &str, user: Option<&str>, now: i64) -> Page {
        let rest = path.strip_prefix("/report/").unwrap_or("");
        let (rest, form) = if let Some(r) = rest.strip_suffix(".json") {
            (r, Form::Json)
        } else if let Some(r) = rest.strip_suffix(".txt") {
            (r, Form::Text)
        } else {
            (rest, Form::Html)
        };
        let Some((cluster, job)) = rest.split_once('/') else {
            return Page::error(
                ApiError::NotFound("expected /report/{cluster}/{jobid}".into()),
                form,
            );
        };
        let user = match self.api.user(user) {
            Ok(u) => u,
            Err(a) => return Page::error(a, form),
        };
        let refreshed = match &self.refresh {
            Some(r) => r.refresh(cluster, job, now).await,
            None => Refreshed::default(),
        };
        let id = match self.api.authorize_job(cluster, job, user).await {
            Ok(id) => id,
            Err(a) => return Page::error(a, form),
        };
        let mut data = match self.data(id, cluster, job, now).await {
            Ok(d) => d,
            Err(a) => return Page::error(a, form),
        };
        if let Some(partial) = refreshed.partial {
            data.notes.insert(0, partial);
        }
        let (content_type, body) = match form {
            Form::Html => ("text/html; charset=utf-8", render_html(cluster, job, &data)),
            Form::Text => (
                "text/plain; charset=utf-8",
                render_text(cluster, job, &data),
            ),
            Form::Json => (
                "application/json",
                json!({"status": "success", "data": data}).to_string(),
            ),
        };
        Page {
            status: StatusCode::OK,
            content_type,
            body,
        }
    }

    async fn data(
        &self,
        id: i64,
        cluster: &str,
        job: &str,
        now: i64,
    ) -> Result<ReportData, ApiError> {
        let facts = self.api.unit(id).await?;
        let findings = facts.get("findings").cloned().unwrap_or(json!([]));
        let mut notes = Vec::new();
        let mut plots = Vec::new();
        // CEEMS's `_ts` are milliseconds.
        let start = facts["started_at_ts"].as_i64().map(|ms| ms / 1000);
        let end = facts["ended_at_ts"]
            .as_i64()
            .map_or(now, |ms| ms / 1000)
            .min(now);
        match (start, self.prometheus.get(cluster)) {
            (None, _) => notes.push("No plots: the job has not started.".to_owned()),
            (_, None) => notes.push(
                "No plots: no Prometheus is configured for this cluster (--prometheus.url)."
                    .to_owned(),
            ),
            (Some(start), Some(prom)) => {
                let length = (end - start).max(1);
                let step = (length / MAX_POINTS).max(self.scrape_interval).max(1);
                let rate = format!("{}s", (4 * self.scrape_interval).max(step));
                let gpus = facts["alloc_gpus"].as_u64().unwrap_or(0) > 0;
                for spec in PLOTS.iter().filter(|s| gpus || !s.gpus_only) {
                    let q = spec.query.replace("$uuid", job).replace("$rate", &rate);
                    let p = Arc::clone(prom);
                    let (s, e) = (start, end + step);
                    let result = tokio::task::spawn_blocking(move || p.query_range(&q, s, e, step))
                        .await
                        .map_err(|e| PromError::Shape(e.to_string()))
                        .and_then(|r| r);
                    match result {
                        Ok(points) if points.len() >= 2 => plots.push(Plot {
                            title: spec.title.to_owned(),
                            unit: spec.unit.to_owned(),
                            points,
                            y_top: match spec.y_top {
                                YTop::Percent => Some(100.0),
                                YTop::MemoryRequest => facts["alloc_mem_bytes"].as_f64(),
                                YTop::Data => None,
                            },
                        }),
                        Ok(_) => notes.push(format!(
                            "No {} plot: Prometheus has no series for this job (a job shorter than a few scrapes, or no such data on its nodes).",
                            spec.title.to_lowercase()
                        )),
                        Err(e) => {
                            notes.push(format!("No {} plot: {e}.", spec.title.to_lowercase()))
                        }
                    }
                }
            }
        }
        Ok(ReportData {
            job: facts,
            findings,
            plots,
            notes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plot_is_an_svg_with_a_path_and_text_is_escaped() {
        let plot = Plot {
            title: "CPU <use>".into(),
            unit: "%".into(),
            points: (0..50)
                .map(|i| (1000.0 + 15.0 * i as f64, i as f64))
                .collect(),
            y_top: None,
        };
        let s = svg(&plot);
        assert!(s.starts_with("<svg"), "{}", &s[..100]);
        assert!(s.contains("<path d=\"M"), "no path in {s}");
        assert!(!s.contains("<polyline"));
        assert!(s.contains("minutes since start"), "12 minutes in minutes");
        assert!(
            s.contains("CPU &lt;use&gt;") || s.contains("CPU &lt;use>"),
            "title not escaped"
        );
        assert_eq!(escape("<a href='x'>&"), "&lt;a href=&#39;x&#39;&gt;&amp;");
    }

    #[test]
    fn memory_is_drawn_in_readable_units_up_to_the_request() {
        let memory = |request: Option<f64>| Plot {
            title: "Memory".into(),
            unit: "bytes".into(),
            points: vec![(0.0, 100.0 * 1048576.0), (60.0, 150.0 * 1048576.0)],
            y_top: request,
        };
        let small = svg(&memory(None));
        assert!(small.contains("Memory (MiB)"), "{small}");
        assert!(
            small.contains("seconds since start"),
            "a minute-long job in seconds"
        );
        // 150 MiB of a 4 GiB request: the axis goes to the request, in GiB.
        let asked = svg(&memory(Some(4.0 * 1073741824.0)));
        assert!(asked.contains("Memory (GiB)"), "{asked}");
        let labels: Vec<&str> = asked
            .split("</text>")
            .filter_map(|t| t.rsplit('>').next())
            .map(str::trim)
            .collect();
        assert!(labels.contains(&"4.0"), "no 4 GiB tick: {labels:?}");
        // A flat zero still gets an axis.
        let idle = svg(&Plot {
            title: "CPU use".into(),
            unit: "%".into(),
            points: vec![(0.0, 0.0), (60.0, 0.0)],
            y_top: Some(100.0),
        });
        assert!(idle.contains("100"), "{idle}");
    }

    /// Prometheus as the report sees it: CPU and memory have points, GPU none, power fails.
    struct FakeRange;

    impl RangeQuery for FakeRange {
        fn query_range(
            &self,
            promql: &str,
            start: i64,
            end: i64,
            step: i64,
        ) -> Result<Vec<(f64, f64)>, PromError> {
            assert!(step >= 1 && start < end, "{start}..{end} step {step}");
            assert!(!promql.contains('$'), "unfilled placeholder in {promql}");
            if promql.contains("gpu") {
                Ok(Vec::new())
            } else if promql.contains("power") {
                Err(PromError::Request {
                    url: "http://prometheus".into(),
                    message: "connection refused".into(),
                })
            } else {
                Ok((0..)
                    .map(|k| start + k * step)
                    .take_while(|t| *t <= end)
                    .map(|t| (t as f64, (t % 7) as f64))
                    .collect())
            }
        }
    }

    async fn reports() -> (Reports, tempfile::TempDir) {
        use crate::store::api::tests::{api_with, line, NOW};
        let lines = vec![
            line(1, "alice", "physics", NOW - 3600, Some(NOW - 600)).replace("COMPLETED", "FAILED"),
            line(2, "bob", "chemistry", NOW - 3600, None),
        ];
        let (api, tmp) = api_with(&lines, &["root"]).await;
        let prometheus =
            HashMap::from([("lab".to_owned(), Arc::new(FakeRange) as Arc<dyn RangeQuery>)]);
        (Reports::new(Arc::new(api), prometheus, 15), tmp)
    }

    #[tokio::test]
    async fn the_owner_and_admins_get_the_page_others_do_not() {
        let (r, _tmp) = reports().await;
        let now = crate::store::api::tests::NOW;
        for (path, user, status) in [
            ("/report/lab/1", Some("alice"), StatusCode::OK),
            ("/report/lab/1", Some("root"), StatusCode::OK),
            ("/report/lab/1", Some("bob"), StatusCode::FORBIDDEN),
            ("/report/lab/1", None, StatusCode::UNAUTHORIZED),
            ("/report/lab/1", Some(" "), StatusCode::UNAUTHORIZED),
            ("/report/lab/1;x", Some("alice"), StatusCode::BAD_REQUEST),
            ("/report/lab/..%2f1", Some("root"), StatusCode::BAD_REQUEST),
            ("/report/lab/99", Some("root"), StatusCode::NOT_FOUND),
            ("/report/other/1", Some("root"), StatusCode::NOT_FOUND),
            ("/report/lab", Some("root"), StatusCode::NOT_FOUND),
            ("/report/lab/1.json", Some("bob"), StatusCode::FORBIDDEN),
        ] {
            let page = r.handle(path, user, now).await;
            assert_eq!(page.status, status, "{path} as {user:?}: {}", page.body);
            if status != StatusCode::OK {
                assert!(
                    !page.body.contains("physics"),
                    "{path} leaks the job: {}",
                    page.body
                );
            }
        }
        let html = r.handle("/report/lab/1", Some("alice"), now).await;
        assert_eq!(html.content_type, "text/html; charset=utf-8");
        let json = r.handle("/report/lab/1.json", Some("alice"), now).await;
        assert_eq!(json.content_type, "application/json");
        let text = r.handle("/report/lab/1.txt", Some("alice"), now).await;
        assert_eq!(text.content_type, "text/plain; charset=utf-8");
        let refused = r.handle("/report/lab/1.txt", Some("bob"), now).await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN);
        assert!(
            refused.body.starts_with("403 Forbidden: ") && !refused.body.contains("physics"),
            "{}",
            refused.body
        );
        let forbidden = r.handle("/report/lab/1", Some("bob"), now).await;
        assert!(
            forbidden.body.contains("<h1>403 Forbidden</h1>"),
            "{}",
            forbidden.body
        );
    }

    #[tokio::test]
    async fn the_page_has_facts_findings_plots_and_says_why_plots_are_missing() {
        let (r, _tmp) = reports().await;
        let now = crate::store::api::tests::NOW;
        let page = r.handle("/report/lab/1", Some("alice"), now).await;
        let body = &page.body;
        assert!(body.contains("ended in state FAILED"), "no finding: {body}");
        assert!(
            body.contains("Read the job&#39;s error output"),
            "no advice: {body}"
        );
        // CPU and memory are drawn; power's Prometheus failed; a job that asked for no GPU
        // gets no GPU plot and no note about one.
        assert_eq!(body.matches("<svg").count(), 2, "{body}");
        assert_eq!(body.matches("<figure").count(), 2);
        assert!(!body.to_lowercase().contains("gpu use"), "{body}");
        assert!(body.contains("No power plot: ") && body.contains("connection refused"));
        for loader in [
            "<script", "<link", "<img", " src=", " href=", "@import", "url(",
        ] {
            assert!(
                !body.contains(loader),
                "the page loads or runs {loader}: {body}"
            );
        }
        assert!(
            body.contains("0:10:00 of 1:00:00 asked for"),
            "elapsed time: {body}"
        );

        // The text form says the same: findings, advice, a line per plot, why others are missing.
        let text = r.handle("/report/lab/1.txt", Some("alice"), now).await.body;
        assert!(text.starts_with("Job 1 "), "{text}");
        assert!(text.contains("ended in state FAILED"), "{text}");
        assert!(text.contains("Read the job's error output"), "{text}");
        assert!(text.contains("0:10:00 of 1:00:00 asked for"), "{text}");
        let drawn: Vec<&str> = text
            .lines()
            .filter(|l| l.contains('▁') || l.contains('█'))
            .collect();
        assert_eq!(drawn.len(), 2, "CPU and memory lines: {text}");
        assert!(drawn[0].trim_start().starts_with("CPU use") && drawn[1].contains("Memory"));
        assert!(text.contains("No power plot") && text.contains("connection refused"));
        assert!(!text.contains("No gpu use plot"), "{text}");
        assert!(!text.contains('<'), "markup in the text form: {text}");

        let json: Value = serde_json::from_str(
            &r.handle("/report/lab/1.json", Some("alice"), now)
                .await
                .body,
        )
        .unwrap();
        let data = &json["data"];
        assert_eq!(data["job"]["uuid"], "1");
        assert_eq!(data["job"]["username"], "alice");
        assert_eq!(data["findings"][0]["id"], "job_failed");
        let titles: Vec<&str> = data["plots"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["title"].as_str())
            .collect();
        assert_eq!(titles, ["CPU use", "Memory"]);
        // 50 minutes at most 240 points: a 15 s step.
        let points = data["plots"][0]["points"].as_array().unwrap();
        assert!(
            points.len() > 150 && points.len() <= 241,
            "{} points",
            points.len()
        );
        // Power's failure alone: no note about GPUs for a job without any.
        assert_eq!(data["notes"].as_array().unwrap().len(), 1, "{data}");
    }

    #[tokio::test]
    async fn a_running_job_is_plotted_until_now_and_no_prometheus_is_said() {
        let (r, _tmp) = reports().await;
        let now = crate::store::api::tests::NOW;
        let json: Value =
            serde_json::from_str(&r.handle("/report/lab/2.json", Some("bob"), now).await.body)
                .unwrap();
        let last = json["data"]["plots"][0]["points"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()[0]
            .as_f64()
            .unwrap();
        assert!(
            last <= (now + 15) as f64 && last >= (now - 15) as f64,
            "last point at {last}"
        );

        let bare = Reports::new(Arc::clone(&r.api), HashMap::new(), 15);
        let page = bare.handle("/report/lab/2", Some("bob"), now).await;
        assert_eq!(page.status, StatusCode::OK);
        assert!(
            page.body.contains("No plots: no Prometheus is configured"),
            "{}",
            page.body
        );
        assert!(page.body.contains("RUNNING"));
        assert!(!page.body.contains("<svg"));
    }
}
