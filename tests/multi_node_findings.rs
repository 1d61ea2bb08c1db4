//! Multi-node jobs, judged node by node: Debian's Prometheus scrapes a stand-in for two nodes'
//! exporters (each job's CPU counters by `hostname`), the stats-server asks it for each ended
//! multi-node job's CPU time per node, and a two-node job whose second node did nothing gets
//! `idle_nodes` naming that node; a job busy on both does not. Here each node has an exporter
//! of its own (`hostname` labels); tests/multi_node_lab.rs runs real two-node jobs on the lab,
//! whose two slurmds share this host's exporter (`cgrouphostname` labels).

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::http::{Response, TestServer};
use common::lab::{prometheus_tools, wait_until, Prometheus};
use common::runnable;

fn now_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Two nodes' job series: job 7 keeps its 4 cores busy on n1 and does nothing on n2; job 8
/// keeps them busy on both. Counters grow from `t0`.
fn two_nodes(t0: f64) -> TestServer {
    TestServer::start(
        false,
        Arc::new(move |_| {
            let busy = 4.0 * (now_f64() - t0).max(0.0);
            let mut text = String::new();
            for family in ["user", "system"] {
                text.push_str(&format!(
                    "# TYPE ceems_compute_unit_cpu_{family}_seconds_total counter\n"
                ));
                for (job, node, seconds) in [
                    ("7", "n1", busy),
                    ("7", "n2", 0.01),
                    ("8", "n1", busy),
                    ("8", "n2", busy),
                ] {
                    let v = if family == "user" { seconds } else { 0.0 };
                    text.push_str(&format!(
                        "ceems_compute_unit_cpu_{family}_seconds_total{{manager=\"slurm\",hostname=\"{node}\",cgrouphostname=\"\",uuid=\"{job}\"}} {v}\n"
                    ));
                }
            }
            Response::raw(200, text).with_header("Content-Type", "text/plain; version=0.0.4")
        }),
    )
}

/// The job's findings as (id, message).
fn findings(server: &common::Running, job: &str) -> Vec<(String, String)> {
    common::lab::findings_of(server, job)
        .into_iter()
        .map(|f| (f.id, f.message))
        .collect()
}

#[test]
fn a_two_node_job_with_an_idle_node_is_told_which_and_a_busy_one_is_not() {
    if !runnable("multi_node_findings", prometheus_tools()) {
        return;
    }
    let t0 = now_f64();
    let nodes = two_nodes(t0);
    let prom = Prometheus::start(&[nodes.port], &[]);
    wait_until("Prometheus scraping", Duration::from_secs(60), || {
        prom.targets_up().is_ok()
    });
    // Both jobs ran 20 s on n1 and n2 while Prometheus scraped.
    std::thread::sleep(Duration::from_secs(25));
    let (start, end) = (t0 as i64 + 2, t0 as i64 + 22);
    let tmp = tempfile::tempdir().unwrap();
    let sacct_out = tmp.path().join("sacct.out");
    let line = |id: u32| {
        format!("{id}|multi|normal|physics|alice|2001|alice|2001|{start}|{start}|{end}|00:00:20|20|0:0|COMPLETED|billing=8,cpu=8,mem=1G,node=2|n[1-2]|/tmp|60|job {id}")
    };
    std::fs::write(&sacct_out, format!("{}\n{}\n", line(7), line(8))).unwrap();
    let sacct = common::stub(&tmp.path().join("bin"), "sacct", &sacct_out);
    let server = common::start_subcommand(
        "stats-server",
        tmp.path(),
        &[
            &format!("--storage.data.path={}", tmp.path().join("db").display()),
            &format!("--prometheus.url={}", prom.url()),
            "--storage.update-interval=1s",
            "--storage.first-window=1h",
            "--prometheus.cutoff=5s",
            "--prometheus.scrape-interval=1s",
            &format!("--slurm.sacct.path={}", sacct.display()),
            "--slurm.sacctmgr.path=",
            "--slurm.run-as-user=",
            "--slurm.cluster-id=lab",
            "--web.admin-users=root",
            "--security.drop-privileges=false",
        ],
        &[],
    );
    wait_until("job 7's idle node", Duration::from_secs(60), || {
        findings(&server, "7").iter().any(|f| f.0 == "idle_nodes")
    });
    let idle = findings(&server, "7");
    let said = &idle.iter().find(|f| f.0 == "idle_nodes").unwrap().1;
    assert!(
        said.starts_with("1 of its 2 nodes did almost nothing: n2 (") && said.contains(" on n1."),
        "{said}"
    );
    let busy = findings(&server, "8");
    assert!(!busy.iter().any(|f| f.0 == "idle_nodes"), "{busy:?}");
    // Four cores per node: not spread thin.
    assert!(
        !idle.iter().chain(&busy).any(|f| f.0 == "thin_spread"),
        "{idle:?}"
    );
}
