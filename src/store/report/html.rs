//! The report as a page: no script, nothing loaded from elsewhere.

use std::fmt::Write as _;

use super::{svg, ReportData};

fn human_duration(s: i64) -> String {
    let s = s.max(0);
    format!("{}:{:02}:{:02}", s / 3600, (s % 3600) / 60, s % 60)
}

/// How a finding looks: a bar coloured by its severity (the class), its advice in grey. The
/// report page and the mailed digest share it.
pub const FINDING_STYLE: &str = ".finding{border-left:.3rem solid #888;padding:.3rem .8rem;\
margin:.6rem 0;background:#f6f6f6}.critical{border-color:#c0392b}.warning{border-color:#e67e22}\
.info{border-color:#2980b9}.advice{color:#555}";

pub(super) fn render_html(cluster: &str, job: &str, data: &ReportData) -> String {
    let j = &data.job;
    let text = |k: &str| escape(j[k].as_str().unwrap_or(""));
    let num = |k: &str| super::figures::figure(j, k).unwrap_or(0.0);
    // CEEMS's `_ts` are milliseconds.
    let time = |k: &str| match j[k].as_i64().and_then(|t| u64::try_from(t / 1000).ok()) {
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
{FINDING_STYLE}svg{{max-width:100%;height:auto}}</style></head><body>\n",
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
        text("username"),
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
    let (energy, emissions) = super::figures::energy_and_emissions(j);
    let _ = writeln!(
        h,
        "<tr><th>Energy</th><td>{}</td></tr><tr><th>Emissions</th><td>{}</td></tr>\
<tr><th>CPU time</th><td>{:.0} s (mean use {})</td></tr></table>",
        escape(&energy),
        escape(&emissions),
        num("total_cpu_seconds"),
        match j["avg_cpu_usage"]["global"].as_f64() {
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
    if let Some(list) = data.job["actions"].as_array().filter(|l| !l.is_empty()) {
        h.push_str("<h2>What the site's policies did</h2>\n<ul>\n");
        for a in list {
            let _ = writeln!(h, "<li>{}</li>", escape(&super::action_line(a)));
        }
        h.push_str("</ul>\n");
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

/// Text made safe inside HTML elements and quoted attributes.
pub fn escape(s: &str) -> String {
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
