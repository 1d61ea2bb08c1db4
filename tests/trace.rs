//! The job trace endpoint on a running exporter: valid, oversized, malformed and over-limit
//! reports, expiry, the series in /metrics, and the shipped wrapper reporting a real command.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::start_exporter;

fn post(url: &str, body: &str) -> (u16, String) {
    match ureq::post(url)
        .set("Content-Type", "application/json")
        .send_string(body)
    {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("{e}"),
    }
}

fn report(job: &str, pid: u32) -> String {
    format!(
        r#"{{"job_id":"{job}","samples":[{{"pid":{pid},"cpu_percent":50.0,"rss_bytes":2048,"read_bytes":10,"write_bytes":20,"threads":3}}]}}"#
    )
}

#[test]
fn reports_become_series_bad_ones_are_refused_and_old_ones_expire() {
    let exporter = start_exporter(
        Path::new("/"),
        &[
            "--collector.disable-defaults",
            "--web.trace-path=/trace",
            "--web.trace-ttl=2s",
            "--web.trace-max-jobs=2",
        ],
    );
    let url = exporter.url("/trace");
    assert_eq!(post(&url, &report("101", 7)).0, 204);
    let metrics = exporter.get("/metrics");
    assert!(
        metrics.contains("ceems_trace_rss_bytes{hostname=")
            && metrics.contains(",pid=\"7\",uuid=\"101\"} 2048\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("ceems_trace_write_bytes_total{"),
        "{metrics}"
    );
    let entries: serde_json::Value = serde_json::from_str(&exporter.get("/trace")).unwrap();
    assert_eq!(entries[0]["job_id"], "101");

    let (code, msg) = post(&url, &report("102", 8).replace("\"threads\"", "\"thread\""));
    assert_eq!(code, 400, "unknown field: {msg}");
    assert!(msg.contains("thread"), "{msg}");
    let (code, msg) = post(&url, &report("102", 8).replace("50.0", "\"fast\""));
    assert_eq!(code, 400, "non-numeric: {msg}");
    let (code, msg) = post(&url, &" ".repeat((1 << 20) + 10));
    assert_eq!(code, 400, "oversized: {msg}");
    assert!(msg.contains("larger"), "{msg}");

    assert_eq!(post(&url, &report("102", 8)).0, 204);
    let (code, msg) = post(&url, &report("103", 9));
    assert_eq!(code, 429, "third job: {msg}");
    // An update of a traced job is still taken.
    assert_eq!(post(&url, &report("101", 7)).0, 204);

    std::thread::sleep(Duration::from_millis(2200));
    assert!(
        !exporter.get("/metrics").contains("ceems_trace_"),
        "entries did not expire"
    );
    assert_eq!(post(&url, &report("103", 9)).0, 204);
}

#[test]
fn the_wrapper_reports_a_running_command() {
    let exporter = start_exporter(
        Path::new("/"),
        &["--collector.disable-defaults", "--web.trace-path=/trace"],
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/trace/ceems-trace.py");
    let status = Command::new("python3")
        .arg(script)
        .args([
            "--url",
            &exporter.url("/trace"),
            "--interval",
            "0.3",
            "--job-id",
            "555",
            "--",
        ])
        .args(["sh", "-c", "sleep 1.2; exit 3"])
        .status()
        .expect("python3");
    assert_eq!(
        status.code(),
        Some(3),
        "the command's exit status is passed on"
    );
    let metrics = exporter.get("/metrics");
    assert!(
        metrics.contains("ceems_trace_threads{") && metrics.contains("uuid=\"555\""),
        "{metrics}"
    );
}
