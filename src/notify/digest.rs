//! One user's digest: each job with findings, what to change, and a link to its report, as
//! plain text and as HTML.

use std::fmt::Write as _;

use crate::store::findings::Finding;
use crate::store::report::{clean, escape, utc, FINDING_STYLE};

/// A job of the digest, as the store holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobFindings {
    pub cluster: String,
    pub uuid: String,
    pub name: String,
    pub state: String,
    pub ended_at: Option<i64>,
    pub findings: Vec<Finding>,
}

/// Where the reports are: `--web.external-url` without its trailing slash.
pub fn report_url(base: &str, job: &JobFindings) -> String {
    let segment = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    format!(
        "{}/report/{}/{}",
        base.trim_end_matches('/'),
        segment(&job.cluster),
        segment(&job.uuid)
    )
}

/// The subject names how many jobs, never a job's name: names come from users and do not
/// belong in a header.
pub fn subject(jobs: &[JobFindings]) -> String {
    match jobs.len() {
        1 => "ceems: one of your jobs could use less".to_owned(),
        n => format!("ceems: {n} of your jobs could use less"),
    }
}

pub fn text(user: &str, jobs: &[JobFindings], base: &str) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "Hello {},\n\nThese jobs of yours ended with findings worth a look. Each report has the \
         details and plots of what the job used.\n",
        clean(user)
    );
    for job in jobs {
        let _ = writeln!(
            t,
            "Job {} \"{}\" on {}, {} at {}",
            clean(&job.uuid),
            clean(&job.name),
            clean(&job.cluster),
            clean(&job.state),
            utc(job.ended_at)
        );
        for f in &job.findings {
            let _ = writeln!(
                t,
                "  - [{}] {}\n    What to change: {}",
                f.severity.name(),
                clean(&f.message),
                clean(&f.advice)
            );
        }
        let _ = writeln!(t, "  Report: {}\n", report_url(base, job));
    }
    t.push_str("You get this mail once per job. Ask your HPC support to stop it.\n");
    t
}

pub fn html(user: &str, jobs: &[JobFindings], base: &str) -> String {
    let mut h = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<title>Your jobs</title><style>\
body{{font-family:sans-serif;max-width:48rem;margin:1rem auto;padding:0 1rem;color:#222}}\
.job{{margin:1.2rem 0}}{FINDING_STYLE}</style></head><body>\n"
    );
    let _ = writeln!(
        h,
        "<p>Hello {},</p><p>These jobs of yours ended with findings worth a look. Each report \
         has the details and plots of what the job used.</p>",
        escape(user)
    );
    for job in jobs {
        let url = escape(&report_url(base, job));
        let _ = writeln!(
            h,
            "<section class=\"job\"><h2>Job {} <q>{}</q> on {}</h2><p>{} at {}. \
             <a href=\"{url}\">Report</a></p>",
            escape(&job.uuid),
            escape(&job.name),
            escape(&job.cluster),
            escape(&job.state),
            utc(job.ended_at)
        );
        for f in &job.findings {
            let class = f.severity.name();
            let _ = writeln!(
                h,
                "<div class=\"finding {class}\"><p><strong>{}</strong>: {}</p>\
                 <p class=\"advice\">What to change: {}</p></div>",
                f.severity.name(),
                escape(&f.message),
                escape(&f.advice)
            );
        }
        h.push_str("</section>\n");
    }
    h.push_str(
        "<p>You get this mail once per job. Ask your HPC support to stop it.</p></body></html>\n",
    );
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::findings::Severity;

    fn job(name: &str) -> JobFindings {
        JobFindings {
            cluster: "lab".into(),
            uuid: "42".into(),
            name: name.into(),
            state: "FAILED".into(),
            ended_at: Some(1_800_000_000),
            findings: vec![Finding {
                id: "job_failed".into(),
                severity: Severity::Warning,
                message: "It ended in state FAILED.".into(),
                advice: "Read the job's error output.".into(),
            }],
        }
    }

    #[test]
    fn both_parts_name_the_job_its_findings_advice_and_report() {
        let jobs = [job("sim")];
        let t = text("alice", &jobs, "https://ceems.example.org/");
        assert!(
            t.contains("Job 42 \"sim\" on lab, FAILED at 2027-01-15 08:00:00 UTC"),
            "{t}"
        );
        assert!(t.contains("[warning] It ended in state FAILED."), "{t}");
        assert!(
            t.contains("What to change: Read the job's error output."),
            "{t}"
        );
        assert!(
            t.contains("Report: https://ceems.example.org/report/lab/42\n"),
            "{t}"
        );
        let h = html("alice", &jobs, "https://ceems.example.org");
        assert!(
            h.contains("<a href=\"https://ceems.example.org/report/lab/42\">"),
            "{h}"
        );
        assert!(h.contains("Read the job&#39;s error output."), "{h}");
        assert_eq!(subject(&jobs), "ceems: one of your jobs could use less");
    }

    #[test]
    fn names_from_users_cannot_add_markup_lines_or_links() {
        let jobs = [JobFindings {
            cluster: "lab/../x".into(),
            ..job("<script>alert(1)</script>\r\nBcc: eve@example.org\u{1b}[2J")
        }];
        let h = html("<b>mallory</b>", &jobs, "https://c");
        assert!(!h.contains("<script") && !h.contains("<b>"), "{h}");
        assert!(h.contains("&lt;script&gt;"), "{h}");
        let t = text("mallory\nBcc: eve", &jobs, "https://c");
        assert!(!t.contains("\nBcc:"), "a raw newline from a name: {t}");
        assert!(
            !t.contains('\u{1b}'),
            "an escape sequence reached the text: {t}"
        );
        assert!(t.contains("/report/lab%2F..%2Fx/42"), "{t}");
    }
}
