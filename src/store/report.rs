//! A job's report for its owner: `GET /report/{cluster}/{jobid}` is an HTML page (no
//! JavaScript, nothing loaded from elsewhere) with the job's facts, its findings and advice,
//! plots of its CPU, memory, GPU use and power drawn here as SVG from Prometheus range
//! queries, and its energy and emissions; `/report/{cluster}/{jobid}.json` says the same for
//! scripts. The user and admins are as for the API.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use hyper::StatusCode;
use serde::Serialize;
use serde_json::{json, Value};

use super::api::{Answer, Api, ApiError};
use super::prometheus::{PromError, RangeQuery};

/// One plot of the report.
struct PlotSpec {
    title: &'static str,
    unit: &'static str,
    /// `$uuid` and `$rate` (the rate window) are filled in.
    query: &'static str,
    /// The top of the y axis at least: what the job asked for, so a plot shows how much of
    /// it was used.
    y_top: YTop,
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
    },
    PlotSpec {
        title: "Memory",
        unit: "bytes",
        query: r#"sum(ceems_compute_unit_memory_used_bytes{uuid="$uuid"})"#,
        y_top: YTop::MemoryRequest,
    },
    PlotSpec {
        title: "GPU use",
        unit: "%",
        query: r#"100 * avg(ceems_compute_unit_gpu_utilization_ratio{uuid="$uuid"})"#,
        y_top: YTop::Percent,
    },
    PlotSpec {
        title: "Power",
        unit: "W",
        query: r#"sum(uuid:ceems_host_power_watts:pue{uuid="$uuid"})"#,
        y_top: YTop::Data,
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

/// Reports over the API's store and each cluster's Prometheus.
pub struct Reports {
    api: Arc<Api>,
    prometheus: HashMap<String, Arc<dyn RangeQuery>>,
    /// The exporters' scrape interval, for rate windows.
    scrape_interval: i64,
}

/// Points per plot at most: the step is fitted to the job's length.
const MAX_POINTS: i64 = 240;

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page's response: status, content type and body.
pub struct Page {
    pub status: StatusCode,
    pub content_type: &'static str,
    pub body: String,
}

impl Page {
    fn error(e: ApiError, html: bool) -> Page {
        let status = e.status();
        if !html {
            return Page {
                status,
                content_type: "application/json",
                body: Answer::from(e).text().to_owned(),
            };
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
        }
    }

    /// Answers `GET /report/{cluster}/{jobid}[.json]` for `user` at `now`.
    pub async fn handle(&self, path: &str, user: Option<&str>, now: i64) -> Page {
        let rest = path.strip_prefix("/report/").unwrap_or("");
        let (rest, html) = match rest.strip_suffix(".json") {
            Some(r) => (r, false),
            None => (rest, true),
        };
        let Some((cluster, job)) = rest.split_once('/') else {
            return Page::error(
                ApiError::NotFound("expected /report/{cluster}/{jobid}".into()),
                html,
            );
        };
        let user = match self.api.user(user) {
            Ok(u) => u,
            Err(a) => return Page::error(a, html),
        };
        let id = match self.api.authorize_job(cluster, job, user).await {
            Ok(id) => id,
            Err(a) => return Page::error(a, html),
        };
        let data = match self.data(id, cluster, job, now).await {
            Ok(d) => d,
            Err(a) => return Page::error(a, html),
        };
        if html {
            Page {
                status: StatusCode::OK,
                content_type: "text/html; charset=utf-8",
                body: render_html(cluster, job, &data),
            }
        } else {
            Page {
                status: StatusCode::OK,
                content_type: "application/json",
                body: json!({"status": "success", "data": data}).to_string(),
            }
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
        let start = facts["started_at_ts"].as_i64();
        let end = facts["ended_at_ts"].as_i64().unwrap_or(now).min(now);
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
                for spec in PLOTS {
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

/// Draws a plot as SVG: time since the job's start against the value.
pub fn svg(plot: &Plot) -> String {
    use plotters::prelude::*;
    let mut out = String::new();
    let t0 = plot.points.first().map(|p| p.0).unwrap_or(0.0);
    let data_max = plot.points.iter().map(|p| p.1).fold(0.0, f64::max);
    let top = data_max.max(plot.y_top.unwrap_or(0.0));
    // Bytes in the unit that gives readable ticks.
    let (scale, unit) = match plot.unit.as_str() {
        "bytes" if top >= 1073741824.0 => (1073741824.0, "GiB"),
        "bytes" => (1048576.0, "MiB"),
        u => (1.0, u),
    };
    let span = plot.points.last().map(|p| p.0 - t0).unwrap_or(0.0);
    let (per, x_unit) = match span {
        s if s < 180.0 => (1.0, "seconds"),
        s if s < 3.0 * 3600.0 => (60.0, "minutes"),
        _ => (3600.0, "hours"),
    };
    let pts: Vec<(f64, f64)> = plot
        .points
        .iter()
        .map(|(t, v)| ((t - t0) / per, v / scale))
        .collect();
    let x_max = (span / per).max(1.0 / per);
    let y_max = if top > 0.0 { 1.05 * top / scale } else { 1.0 };
    {
        let root = SVGBackend::with_string(&mut out, (720, 260)).into_drawing_area();
        let drawn = (|| -> Result<(), Box<dyn std::error::Error + '_>> {
            root.fill(&WHITE)?;
            let mut chart = ChartBuilder::on(&root)
                .caption(format!("{} ({unit})", plot.title), ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(56)
                .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
            chart
                .configure_mesh()
                .x_desc(format!("{x_unit} since start"))
                .light_line_style(WHITE.mix(0.0))
                .draw()?;
            chart.draw_series(LineSeries::new(pts.iter().copied(), BLUE.stroke_width(2)))?;
            root.present()?;
            Ok(())
        })();
        if let Err(e) = drawn {
            tracing::warn!(plot = plot.title, error = %e, "cannot draw plot");
        }
    }
    polylines_to_paths(&out)
}

/// plotters writes lines as `<polyline points="x,y x,y"/>`; a `<path>` is what every SVG
/// consumer (and our browser test) reads as a drawn line.
fn polylines_to_paths(svg: &str) -> String {
    let mut out = String::with_capacity(svg.len());
    let mut rest = svg;
    while let Some(i) = rest.find("<polyline") {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let Some(end) = tail.find("/>") else {
            out.push_str(tail);
            return out;
        };
        let element = &tail[..end];
        let points = element
            .split("points=\"")
            .nth(1)
            .and_then(|p| p.split('"').next())
            .unwrap_or("");
        let attrs = element
            .trim_start_matches("<polyline")
            .replace(&format!("points=\"{points}\""), "");
        let mut d = String::new();
        for (k, xy) in points.split_whitespace().enumerate() {
            d.push_str(if k == 0 { "M" } else { " L" });
            d.push_str(xy);
        }
        let _ = write!(out, "<path d=\"{d}\"{}/>", attrs.trim_end());
        rest = &tail[end + 2..];
    }
    out.push_str(rest);
    out
}

fn human_duration(s: i64) -> String {
    let s = s.max(0);
    format!("{}:{:02}:{:02}", s / 3600, (s % 3600) / 60, s % 60)
}

fn render_html(cluster: &str, job: &str, data: &ReportData) -> String {
    let j = &data.job;
    let text = |k: &str| escape(j[k].as_str().unwrap_or(""));
    let num = |k: &str| j[k].as_f64().unwrap_or(0.0);
    let time = |k: &str| match j[k].as_i64().and_then(|t| u64::try_from(t).ok()) {
        Some(t) => {
            let at = humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(t),
            )
            .to_string();
            format!(
                "<time datetime=\"{at}\">{} UTC</time>",
                at.replace('T', " ").trim_end_matches('Z')
            )
        }
        None => "—".to_owned(),
    };
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width\">\
<title>Job {job} on {cluster}</title><style>\
body{{font-family:sans-serif;max-width:60rem;margin:1rem auto;padding:0 1rem;color:#222}}\
table{{border-collapse:collapse}}td,th{{text-align:left;padding:.2rem .8rem .2rem 0}}\
.finding{{border-left:.3rem solid #888;padding:.3rem .8rem;margin:.6rem 0;background:#f6f6f6}}\
.critical{{border-color:#c0392b}}.warning{{border-color:#e67e22}}.info{{border-color:#2980b9}}\
.advice{{color:#555}}svg{{max-width:100%;height:auto}}</style></head><body>\n",
        job = escape(job),
        cluster = escape(cluster)
    );
    let _ = write!(
        h,
        "<h1>Job {} “{}”</h1>\n<table>\
<tr><th>Cluster</th><td>{}</td></tr><tr><th>User</th><td>{}</td></tr>\
<tr><th>Project</th><td>{}</td></tr><tr><th>Partition</th><td>{}</td></tr>\
<tr><th>State</th><td>{} (exit code {})</td></tr>\
<tr><th>Started</th><td>{}</td></tr><tr><th>Ended</th><td>{}</td></tr>\
<tr><th>Elapsed</th><td>{}{}</td></tr>\
<tr><th>Asked for</th><td>{} CPU cores, {:.1} GiB of memory, {} GPU(s)</td></tr>\
<tr><th>Nodes</th><td>{}</td></tr></table>\n",
        escape(job),
        text("name"),
        escape(cluster),
        text("user"),
        text("project"),
        text("partition"),
        text("state"),
        text("exit_code"),
        time("started_at_ts"),
        time("ended_at_ts"),
        human_duration(j["elapsed_seconds"].as_i64().unwrap_or(0)),
        match j["time_limit_seconds"].as_i64() {
            Some(l) => format!(" of {} asked for", human_duration(l)),
            None => String::new(),
        },
        num("alloc_cpus"),
        num("alloc_mem_bytes") / 1073741824.0,
        num("alloc_gpus"),
        text("nodes"),
    );
    h.push_str("<h2>Energy and emissions</h2>\n<table>");
    let _ = writeln!(
        h,
        "<tr><th>Host energy</th><td>{:.3} kWh</td></tr><tr><th>CPU energy</th><td>{:.3} kWh</td></tr>\
<tr><th>GPU energy</th><td>{:.3} kWh</td></tr><tr><th>Emissions</th><td>{:.1} g CO2e</td></tr>\
<tr><th>CPU time</th><td>{:.0} s (mean use {})</td></tr></table>",
        num("total_host_energy_usage_kwh"),
        num("total_cpu_energy_usage_kwh"),
        num("total_gpu_energy_usage_kwh"),
        num("total_emissions_gms"),
        num("total_cpu_seconds"),
        match j["avg_cpu_usage"].as_f64() {
            Some(u) => format!("{u:.0}% of the allocated cores"),
            None => "unknown".to_owned(),
        },
    );
    h.push_str("<h2>Findings</h2>\n");
    match data.findings.as_array() {
        Some(list) if !list.is_empty() => {
            for f in list {
                let sev = f["severity"].as_str().unwrap_or("info");
                let _ = writeln!(
                    h,
                    "<div class=\"finding {}\"><strong>{}</strong> <span>{}</span><p class=\"advice\">{}</p></div>",
                    escape(sev),
                    escape(&sev.to_uppercase()),
                    escape(f["message"].as_str().unwrap_or("")),
                    escape(f["advice"].as_str().unwrap_or(""))
                );
            }
        }
        _ => h.push_str("<p>Nothing to report: no rule found a problem with this job (or its data is not in yet).</p>\n"),
    }
    h.push_str("<h2>Over the job's life</h2>\n");
    for p in &data.plots {
        let _ = writeln!(
            h,
            "<figure class=\"plot\" aria-label=\"{}\">{}</figure>",
            escape(&p.title),
            svg(p)
        );
    }
    for n in &data.notes {
        let _ = writeln!(h, "<p class=\"note\">{}</p>", escape(n));
    }
    h.push_str("</body></html>\n");
    h
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
            ("/report/lab/1x", Some("alice"), StatusCode::BAD_REQUEST),
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
        // CPU and memory are drawn; GPU has no series, power's Prometheus failed.
        assert_eq!(body.matches("<svg").count(), 2, "{body}");
        assert_eq!(body.matches("<figure").count(), 2);
        assert!(
            body.contains("No gpu use plot: Prometheus has no series"),
            "{body}"
        );
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

        let json: Value = serde_json::from_str(
            &r.handle("/report/lab/1.json", Some("alice"), now)
                .await
                .body,
        )
        .unwrap();
        let data = &json["data"];
        assert_eq!(data["job"]["uuid"], "1");
        assert_eq!(data["job"]["user"], "alice");
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
        assert_eq!(data["notes"].as_array().unwrap().len(), 2);
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
