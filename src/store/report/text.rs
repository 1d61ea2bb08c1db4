//! The report as plain text, for `curl` on a login node and for mails: the page's facts,
//! findings and advice, and each plot as a line of Unicode block characters.

use std::fmt::Write as _;

use super::{Plot, ReportData};

/// Columns of a sparkline.
const WIDTH: usize = 60;
const BLOCKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// Text from the job's record made safe for a terminal: control characters (newlines, escape
/// sequences that could rewrite the screen) are shown as escapes, not sent.
pub fn clean(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let shown: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            shown
        })
        .collect()
}

fn human_duration(s: i64) -> String {
    let s = s.max(0);
    format!("{}:{:02}:{:02}", s / 3600, (s % 3600) / 60, s % 60)
}

/// A unix time as `2026-11-23 20:50:16 UTC`, or `-`.
pub fn utc(t: Option<i64>) -> String {
    match t.and_then(|t| u64::try_from(t).ok()) {
        Some(t) => humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(t),
        )
        .to_string()
        .replace('T', " ")
        .replace('Z', " UTC"),
        None => "-".to_owned(),
    }
}

/// The plot's values in `WIDTH` columns (each the mean of its points), drawn from 0 to the
/// larger of the plot's top (what the job asked for) and its highest value.
pub(super) fn sparkline(plot: &Plot) -> String {
    let values: Vec<f64> = plot
        .points
        .iter()
        .map(|(_, v)| *v)
        .filter(|v| v.is_finite())
        .collect();
    if values.is_empty() {
        return String::new();
    }
    let columns = values.len().min(WIDTH);
    let top = values
        .iter()
        .copied()
        .fold(plot.y_top.unwrap_or(0.0), f64::max);
    (0..columns)
        .map(|c| {
            let (from, to) = (c * values.len() / columns, (c + 1) * values.len() / columns);
            let chunk = &values[from..to.max(from + 1)];
            let mean = chunk.iter().sum::<f64>() / chunk.len() as f64;
            let level = if top > 0.0 {
                ((mean.max(0.0) / top) * (BLOCKS.len() - 1) as f64).round() as usize
            } else {
                0
            };
            BLOCKS[level.min(BLOCKS.len() - 1)]
        })
        .collect()
}

fn amount(value: f64, unit: &str) -> String {
    if unit == "bytes" {
        let gib = value / 1073741824.0;
        return if gib >= 1.0 {
            format!("{gib:.1} GiB")
        } else {
            format!("{:.0} MiB", value / 1048576.0)
        };
    }
    let unit = unit.split_whitespace().next().unwrap_or("");
    format!("{value:.0}{}{unit}", if unit == "%" { "" } else { " " })
}

pub(super) fn render_text(cluster: &str, job: &str, data: &ReportData) -> String {
    let j = &data.job;
    let text = |k: &str| clean(j[k].as_str().unwrap_or(""));
    let num = |k: &str| super::figures::figure(j, k).unwrap_or(0.0);
    let (energy, emissions) = super::figures::energy_and_emissions(j);
    let mut t = String::new();
    let _ = writeln!(
        t,
        "Job {} \"{}\" on {}\n",
        clean(job),
        text("name"),
        clean(cluster)
    );
    let rows = [
        ("User", text("username")),
        ("Project", text("project")),
        ("Partition", text("partition")),
        (
            "State",
            format!("{} (exit code {})", text("state"), text("exit_code")),
        ),
        (
            "Started",
            utc(j["started_at_ts"].as_i64().map(|ms| ms / 1000)),
        ),
        ("Ended", utc(j["ended_at_ts"].as_i64().map(|ms| ms / 1000))),
        (
            "Elapsed",
            format!(
                "{}{}",
                human_duration(j["elapsed_seconds"].as_i64().unwrap_or(0)),
                match j["time_limit_seconds"].as_i64() {
                    Some(l) => format!(" of {} asked for", human_duration(l)),
                    None => String::new(),
                }
            ),
        ),
        (
            "Asked for",
            format!(
                "{} CPU cores, {:.1} GiB of memory, {} GPU(s)",
                num("alloc_cpus"),
                num("alloc_mem_bytes") / 1073741824.0,
                num("alloc_gpus")
            ),
        ),
        ("Nodes", text("nodes")),
        ("Energy", energy),
        ("Emissions", emissions),
        (
            "CPU time",
            format!(
                "{:.0} s (mean use {})",
                num("total_cpu_seconds"),
                match j["avg_cpu_usage"]["global"].as_f64() {
                    Some(u) => format!("{u:.0}% of the allocated cores"),
                    None => "unknown".to_owned(),
                }
            ),
        ),
    ];
    for (name, value) in rows {
        let _ = writeln!(t, "  {name:<10} {value}");
    }
    t.push_str("\nFindings\n");
    match data.findings.as_array() {
        Some(list) if !list.is_empty() => {
            for f in list {
                let _ = writeln!(
                    t,
                    "  [{}] {}\n      {}",
                    clean(&f["severity"].as_str().unwrap_or("info").to_uppercase()),
                    clean(f["message"].as_str().unwrap_or("")),
                    clean(f["advice"].as_str().unwrap_or(""))
                );
            }
        }
        _ => t.push_str(
            "  Nothing to report: no rule found a problem with this job (or its data is not in yet).\n",
        ),
    }
    if let Some(list) = data.job["actions"].as_array().filter(|l| !l.is_empty()) {
        t.push_str("\nWhat the site's policies did\n");
        for a in list {
            let _ = writeln!(t, "  {}", clean(&super::action_line(a)));
        }
    }
    if !data.plots.is_empty() || !data.notes.is_empty() {
        t.push_str("\nOver the job's life\n");
    }
    for p in &data.plots {
        let values = p.points.iter().map(|(_, v)| *v).filter(|v| v.is_finite());
        let (mut low, mut high, mut sum, mut n) = (f64::MAX, f64::MIN, 0.0, 0usize);
        for v in values {
            (low, high, sum, n) = (low.min(v), high.max(v), sum + v, n + 1);
        }
        let mean = if n > 0 { sum / n as f64 } else { 0.0 };
        let _ = writeln!(
            t,
            "  {:<10} {}  min {}, mean {}, max {}{}",
            p.title,
            sparkline(p),
            amount(if n > 0 { low } else { 0.0 }, &p.unit),
            amount(mean, &p.unit),
            amount(if n > 0 { high } else { 0.0 }, &p.unit),
            match p.unit.split_once(' ') {
                Some((_, what)) => format!(" ({what})"),
                None => String::new(),
            }
        );
    }
    for n in &data.notes {
        let _ = writeln!(t, "  {}", clean(n));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_not_sent() {
        assert_eq!(clean("a\nb\x1b[2Jc\r"), "a\\nb\\u{1b}[2Jc\\r");
        assert_eq!(clean("<script>é"), "<script>é");
    }

    #[test]
    fn a_hostile_job_name_cannot_add_lines_or_drive_the_terminal() {
        let data = ReportData {
            job: serde_json::json!({
                "name": "x\nFindings\n  Nothing to report\u{1b}[2J<script>",
                "user": "alice",
                "state": "COMPLETED",
            }),
            findings: serde_json::json!([]),
            plots: Vec::new(),
            notes: Vec::new(),
        };
        let t = render_text("lab", "7\r", &data);
        assert!(!t.contains('\u{1b}') && !t.contains('\r'), "{t:?}");
        assert_eq!(t.matches("\nFindings\n").count(), 1, "{t}");
        assert!(t.starts_with("Job 7\\r \"x\\nFindings"), "{t}");
    }

    #[test]
    fn sparklines_fit_the_width_and_reach_the_top() {
        let plot = |points: Vec<f64>, top: Option<f64>| Plot {
            title: "CPU use".into(),
            unit: "%".into(),
            points: points
                .into_iter()
                .enumerate()
                .map(|(i, v)| (i as f64, v))
                .collect(),
            y_top: top,
        };
        let ramp = sparkline(&plot((0..240).map(f64::from).collect(), None));
        assert_eq!(ramp.chars().count(), WIDTH);
        assert!(ramp.starts_with('▁') && ramp.ends_with('█'), "{ramp}");
        // Half of what the job asked for all along: the middle block, not the top one.
        let half = sparkline(&plot(vec![50.0; 10], Some(100.0)));
        assert_eq!(half.chars().count(), 10);
        assert!(half.chars().all(|c| c == '▅' || c == '▄'), "{half}");
        assert_eq!(sparkline(&plot(vec![0.0, 0.0], None)), "▁▁");
        assert_eq!(sparkline(&plot(vec![f64::NAN], None)), "");
    }
}
