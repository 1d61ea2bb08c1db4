//! One user's digest: each job with findings, what to change, and a link to its report, as
//! plain text and as HTML.

use std::fmt::Write as _;

use crate::store::findings::{Finding, Severity, Thresholds};
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

/// The subject says what was found, the most severe first ("ceems: a job failed, 2 jobs used
/// under 25% of their CPUs"), never a job's name: names come from users and do not belong in a
/// header. `t` are the thresholds the findings were judged by.
pub fn subject(jobs: &[JobFindings], t: &Thresholds) -> String {
    // Each kind of finding once, with the jobs that have it and its highest severity.
    let mut kinds: Vec<(&str, Severity, usize)> = Vec::new();
    for job in jobs {
        let mut seen: Vec<&str> = Vec::new();
        for f in &job.findings {
            if seen.contains(&f.id.as_str()) {
                continue;
            }
            seen.push(&f.id);
            match kinds.iter_mut().find(|(id, _, _)| *id == f.id) {
                Some(kind) => {
                    kind.1 = kind.1.max(f.severity);
                    kind.2 += 1;
                }
                None => kinds.push((&f.id, f.severity, 1)),
            }
        }
    }
    // The energy note goes with every digest; it is news only alone.
    if kinds.len() > 1 {
        kinds.retain(|(id, _, _)| *id != "energy");
    }
    // Stable: kinds of one severity keep the order of the first job's findings.
    kinds.sort_by_key(|kind| std::cmp::Reverse(kind.1));
    let mut said: Vec<String> = kinds
        .iter()
        .take(SUBJECT_KINDS)
        .map(|(id, _, n)| found(id, *n, t))
        .collect();
    if kinds.len() > SUBJECT_KINDS {
        said.push("and more".to_owned());
    }
    if said.is_empty() {
        return match jobs.len() {
            1 => "ceems: one of your jobs".to_owned(),
            n => format!("ceems: {n} of your jobs"),
        };
    }
    format!("ceems: {}", said.join(", "))
}

/// Kinds of findings a subject names; the rest are "and more".
const SUBJECT_KINDS: usize = 2;

/// What `n` jobs having the finding `id` did, in words.
fn found(id: &str, n: usize, t: &Thresholds) -> String {
    let (jobs, its) = match n {
        1 => ("a job".to_owned(), "its"),
        n => (format!("{n} jobs"), "their"),
    };
    let pct = |v: f64| format!("{v:.0}%");
    match id {
        "job_failed" => format!("{jobs} failed"),
        "serial_code" => format!("{jobs} ran serial code on several cores"),
        "idle_nodes" => format!("{jobs} left some of {its} nodes idle"),
        "thin_spread" => format!("{jobs} spread thin over nodes"),
        "mig_fit" => format!("{jobs} would fit a MIG slice"),
        "cores_per_gpu" => format!("{jobs} asked for more cores per GPU than used"),
        "memory_per_gpu" => format!("{jobs} asked for more memory per GPU than used"),
        "memory_exhausted" => format!("{jobs} ran out of memory"),
        "gpu_unused" => format!("{jobs} never used {its} GPUs"),
        "gpu_low_use" => format!(
            "{jobs} kept {its} GPUs under {} busy",
            pct(t.gpu_utilization_below)
        ),
        "cpu_efficiency" => format!(
            "{jobs} used under {} of {its} CPUs",
            pct(t.cpu_efficiency_below)
        ),
        "memory_underused" => format!(
            "{jobs} used under {} of {its} memory",
            pct(t.memory_use_below)
        ),
        "time_limit_overestimated" => format!(
            "{jobs} ran under {} of {its} time limit",
            pct(t.time_limit_use_below)
        ),
        "energy" => format!("the energy and emissions of {jobs}"),
        other => format!("{jobs}: {}", other.replace('_', " ")),
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
        assert_eq!(
            subject(&jobs, &Thresholds::default()),
            "ceems: a job failed"
        );
    }

    /// A job with findings of these ids and severities.
    fn with(found: &[(&str, Severity)]) -> JobFindings {
        JobFindings {
            findings: found
                .iter()
                .map(|(id, severity)| Finding {
                    id: (*id).into(),
                    severity: *severity,
                    message: String::new(),
                    advice: String::new(),
                })
                .collect(),
            ..job("sim")
        }
    }

    #[test]
    fn subjects_say_what_was_found_most_severe_first() {
        use Severity::{Critical, Info, Warning};
        let t = Thresholds::default();
        let low_cpu = with(&[("cpu_efficiency", Warning), ("energy", Info)]);
        let failed = with(&[("job_failed", Warning), ("energy", Info)]);
        assert_eq!(
            subject(&[failed.clone(), low_cpu.clone(), low_cpu.clone()], &t),
            "ceems: a job failed, 2 jobs used under 25% of their CPUs"
        );
        let oom = with(&[("memory_exhausted", Critical), ("job_failed", Warning)]);
        assert_eq!(
            subject(&[low_cpu.clone(), oom], &t),
            "ceems: a job ran out of memory, a job used under 25% of its CPUs, and more"
        );
        let strict = Thresholds {
            cpu_efficiency_below: 50.0,
            ..Thresholds::default()
        };
        assert_eq!(
            subject(&[low_cpu], &strict),
            "ceems: a job used under 50% of its CPUs"
        );
        assert_eq!(
            subject(&[with(&[("energy", Info)])], &t),
            "ceems: the energy and emissions of a job"
        );
        assert_eq!(
            subject(
                &[
                    with(&[("gpu_unused", Critical)]),
                    with(&[("gpu_unused", Critical)])
                ],
                &t
            ),
            "ceems: 2 jobs never used their GPUs"
        );
        // A finding listed twice in one job counts that job once.
        let twice = with(&[("job_failed", Warning), ("job_failed", Warning)]);
        assert_eq!(subject(&[twice], &t), "ceems: a job failed");
        assert_eq!(subject(&[with(&[])], &t), "ceems: one of your jobs");
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
