//! Findings and the job report end to end on the real Slurm lab, with the exporter on the lab's
//! cgroups, a stand-in Redfish BMC for the node's power, Debian's Prometheus, and Debian's
//! chromium rendering the page headless with JavaScript off: a job that asks for 2 cores and
//! sleeps gets the CPU-efficiency finding, one that burns both cores does not, one thread on
//! the two cores is diagnosed as serial code, and the owner's
//! report page shows the finding and a drawn plot per series Prometheus has.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::bmc::{Flavor, PowerModel, StandinBmc};
use common::browser::{browse, chromium, screenshot};
use common::lab::{
    lab, prometheus_scraping, prometheus_tools, start_stats_server_configured, submit,
    wait_jobs_gone, wait_until, write_burner, CancelOnDrop, BURNER,
};
use common::{runnable, start_exporter};

/// What a site's auth proxy does in front of the stats-server: it adds the user header. A
/// browser cannot set it, so chromium goes through this one. It records each response's
/// status line by request line.
struct UserProxy {
    port: u16,
    seen: Arc<Mutex<Vec<(String, String)>>>,
}

impl UserProxy {
    fn start(upstream: u16, user: &'static str) -> UserProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let log = Arc::clone(&log);
                std::thread::spawn(move || {
                    let _ = relay(client, upstream, user, &log);
                });
            }
        });
        UserProxy { port, seen }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

fn relay(
    mut client: TcpStream,
    upstream: u16,
    user: &str,
    log: &Mutex<Vec<(String, String)>>,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if client.read(&mut byte)? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default().to_owned();
    let mut forwarded =
        format!("{request_line}\r\nX-Grafana-User: {user}\r\nConnection: close\r\n");
    for l in lines.filter(|l| !l.is_empty()) {
        let name = l.split(':').next().unwrap_or_default().to_ascii_lowercase();
        if name != "connection" && name != "x-grafana-user" {
            forwarded.push_str(l);
            forwarded.push_str("\r\n");
        }
    }
    forwarded.push_str("\r\n");
    let mut server = TcpStream::connect(("127.0.0.1", upstream))?;
    server.write_all(forwarded.as_bytes())?;
    let mut response = Vec::new();
    server.read_to_end(&mut response)?;
    let status = String::from_utf8_lossy(&response)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    log.lock().unwrap().push((request_line, status));
    client.write_all(&response)?;
    client.shutdown(Shutdown::Both)
}

fn get(server: &common::Running, path: &str, user: Option<&str>) -> (u16, String) {
    let mut req = ureq::get(&server.url(path));
    if let Some(u) = user {
        req = req.set("X-Grafana-User", u);
    }
    match req.call() {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("GET {path}: {e}"),
    }
}

fn findings(server: &common::Running, job: &str) -> Vec<String> {
    let (status, body) = get(
        server,
        &format!("/api/v1/units/lab/{job}/findings"),
        Some("alice"),
    );
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["data"]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["id"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn a_sleeping_job_gets_the_cpu_finding_and_its_report_renders_in_a_browser() {
    if !runnable(
        "report_lab",
        lab()
            .and_then(|_| prometheus_tools())
            .and_then(|_| chromium()),
    ) {
        return;
    }
    let bmc = StandinBmc::start(
        Flavor::Dmtf {
            model: PowerModel::Legacy,
            credentials: ("admin".into(), "secret".into()),
            sessions: false,
        },
        false,
    );
    let config_dir = tempfile::tempdir().unwrap();
    let redfish = config_dir.path().join("redfish.yml");
    std::fs::write(
        &redfish,
        format!(
            "redfish_web_config:\n  protocol: http\n  hostname: 127.0.0.1\n  port: {}\n  username: admin\n  password: secret\n  timeout: 2s\n",
            bmc.port
        ),
    )
    .unwrap();
    let exporter = start_exporter(
        Path::new("/"),
        &[
            "--collector.slurm",
            "--collector.redfish",
            &format!("--collector.redfish.config.file={}", redfish.display()),
        ],
    );
    let prom = prometheus_scraping(exporter.port);

    write_burner();
    let sleeper = submit(
        "alice",
        "-J report-sleep -c 2 --mem=200M --time=10 --wrap 'sleep 25'",
    );
    let burner = submit(
        "alice",
        &format!("-J report-burn -c 2 --mem=200M --time=10 --wrap 'python3 {BURNER} 25 & python3 {BURNER} 25; wait'"),
    );
    // One thread on two cores: a serial program; with one of the lab's GPUs, it also asks
    // for more cores and memory per GPU than the bounds set below and than it used.
    let serial = submit(
        "alice",
        &format!(
            "-J report-serial -c 2 --mem=200M --gres=gpu:1 --time=10 --wrap 'python3 {BURNER} 25'"
        ),
    );
    let _cancel = CancelOnDrop(vec![sleeper.clone(), burner.clone(), serial.clone()]);
    let ids = [sleeper.clone(), burner.clone(), serial.clone()];
    wait_jobs_gone(&ids, Duration::from_secs(180));

    let (server, _data, _config) = start_stats_server_configured(
        &prom.url(),
        "2s",
        "[stats-server.findings]\ncores-per-gpu-above = 1.0\nmemory-per-gpu-above-bytes = 104857600.0\n",
    );
    wait_until("findings of both jobs", Duration::from_secs(60), || {
        let done = |job: &str| {
            let (_, body) = get(
                &server,
                &format!("/api/v1/units?from=0&uuid={job}&field=aggregates_status&field=findings"),
                Some("alice"),
            );
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            v["data"][0]["aggregates_status"] == "done"
        };
        done(&sleeper) && done(&burner) && done(&serial)
    });
    // The update loop computes findings right after aggregates; one more pass is enough.
    std::thread::sleep(Duration::from_secs(3));
    let slept = findings(&server, &sleeper);
    let burnt = findings(&server, &burner);
    println!("findings: sleeper {slept:?}, burner {burnt:?}");
    assert!(slept.contains(&"cpu_efficiency".to_owned()), "{slept:?}");
    assert!(!burnt.contains(&"cpu_efficiency".to_owned()), "{burnt:?}");
    let one_thread = findings(&server, &serial);
    println!("findings: serial {one_thread:?}");
    assert!(
        one_thread.contains(&"serial_code".to_owned()),
        "{one_thread:?}"
    );
    for (job, said) in [(&sleeper, &slept), (&burner, &burnt)] {
        assert!(!said.contains(&"serial_code".to_owned()), "{job}: {said:?}");
    }

    // Auth on the page.
    let page = format!("/report/lab/{sleeper}");
    assert_eq!(get(&server, &page, Some("bob")).0, 403);
    assert_eq!(get(&server, &page, None).0, 401);
    assert_eq!(get(&server, "/report/lab/12%20ab", Some("alice")).0, 400);
    let (status, json) = get(&server, &format!("{page}.json"), Some("alice"));
    assert_eq!(status, 200, "{json}");
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    let plots: Vec<&str> = report["data"]["plots"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["title"].as_str())
        .collect();
    println!("plots: {plots:?}; notes: {}", report["data"]["notes"]);
    for title in ["CPU use", "Memory"] {
        assert!(plots.contains(&title), "no {title} plot: {json}");
    }
    // The node's power (the stand-in BMC's) is split by CPU time: the burner has a share.
    let (_, burnt_report) = get(
        &server,
        &format!("/report/lab/{burner}.json"),
        Some("alice"),
    );
    assert!(
        burnt_report.contains(r#""title":"Power""#),
        "no power plot for the burner: {burnt_report}"
    );
    // The job asked for no GPU: no GPU plot, and no note about a missing one.
    assert!(
        !json.contains("No gpu use plot") && !plots.contains(&"GPU use"),
        "{json}"
    );

    // The text form, as `curl` on a login node gets it: the finding and a line per plot.
    let (status, text) = get(&server, &format!("{page}.txt"), Some("alice"));
    assert_eq!(status, 200, "{text}");
    assert!(
        text.contains("It used 0.0 of its 2 CPU cores on average"),
        "{text}"
    );
    let drawn = text
        .lines()
        .filter(|l| l.contains('▁') || l.contains('█'))
        .count();
    assert_eq!(drawn, plots.len(), "{text}");
    assert_eq!(get(&server, &format!("{page}.txt"), Some("bob")).0, 403);
    println!("{text}");

    // In a real browser, through a proxy that sets the user, with JavaScript off.
    let proxy = UserProxy::start(server.port, "alice");
    let dom = browse(&proxy.url(&page), &["--dump-dom"]);
    let seen = proxy.seen.lock().unwrap().clone();
    let loaded = seen
        .iter()
        .find(|(req, _)| req.starts_with(&format!("GET {page} ")))
        .unwrap_or_else(|| panic!("the browser did not ask for the page: {seen:?}"));
    assert!(loaded.1.starts_with("HTTP/1.1 200"), "{loaded:?}");
    assert!(
        dom.contains("It used 0.0 of its 2 CPU cores on average"),
        "the CPU finding is not on the page: {dom}"
    );
    let svgs = dom.matches("<svg").count();
    assert_eq!(svgs, plots.len(), "one SVG per plot: {dom}");
    for figure in dom.split("<figure").skip(1) {
        assert!(
            figure.contains("<path d=\"M"),
            "a plot without a line: {figure}"
        );
    }
    // Nothing else was asked of the server but the page (and the browser's favicon).
    assert!(
        seen.iter()
            .all(|(req, _)| req.starts_with(&format!("GET {page} "))
                || req.starts_with("GET /favicon.ico ")),
        "{seen:?}"
    );

    screenshot(&proxy.url(&page), "1000,1400", "report.png", 20_000);
}
