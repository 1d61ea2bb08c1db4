//! Two-node jobs on the real Slurm lab (`-p multi`: this host's node and node2, a second slurmd
//! in namespaces of its own), the exporter reading both nodes' cgroups (`slurm_<node>`,
//! labelled `cgrouphostname`), Debian's Prometheus and the stats-server's per-node pass: a job
//! of one core per node that works on one node only gets `idle_nodes` naming the other and
//! `thin_spread`; one of two cores per node busy on both gets neither (the thin-spread bound
//! set to one core per node: the lab's nodes have two).

mod common;

use std::time::Duration;

use common::lab::{
    findings_of as findings, lab, prometheus_scraping, prometheus_tools,
    start_stats_server_configured, submit, wait_jobs_gone, write_burner, CancelOnDrop, Found,
    BURNER,
};
use common::{runnable, start_exporter};

/// CPU seconds of `job` by node, as Prometheus recorded the exporter's counters.
fn node_seconds(prom: &common::lab::Prometheus, job: &str) -> Vec<(String, f64)> {
    let counter = |family: &str| {
        format!(
            "max_over_time(ceems_compute_unit_cpu_{family}_seconds_total{{uuid=\"{job}\"}}[15m])"
        )
    };
    prom.query(&format!(
        "sum by (cgrouphostname) ({} + {})",
        counter("user"),
        counter("system")
    ))
    .iter()
    .map(|r| {
        let node = r["metric"]["cgrouphostname"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        let seconds = r["value"][1]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        (node, seconds)
    })
    .collect()
}

fn ids(found: &[Found]) -> Vec<&str> {
    found.iter().map(|f| f.id.as_str()).collect()
}

/// What the finding `id` says, if the job has it.
fn message<'a>(found: &'a [Found], id: &str) -> Option<&'a str> {
    found
        .iter()
        .find(|f| f.id == id)
        .map(|f| f.message.as_str())
}

#[test]
fn two_node_jobs_are_judged_node_by_node() {
    if !runnable("multi_node_lab", lab().and_then(|_| prometheus_tools())) {
        return;
    }
    let node2 = std::process::Command::new("sinfo")
        .args(["-h", "-n", "node2", "-o", "%t"])
        .output()
        .unwrap();
    let state = String::from_utf8_lossy(&node2.stdout).trim().to_owned();
    assert!(
        ["idle", "mix", "alloc"].contains(&state.as_str()),
        "the lab's node2 is `{state}`: see /run/ceems-lab/node2/log/slurmd.log"
    );
    let exporter = start_exporter(std::path::Path::new("/"), &["--collector.slurm"]);
    let prom = prometheus_scraping(exporter.port);
    write_burner();
    // One core on each node: it burns on localhost, node2's task sleeps.
    let one_node = submit(
        "alice",
        &format!(
            "-J two-one-idle -p multi -N2 --ntasks-per-node=1 --mem-per-cpu=100M --time=10 \
             --wrap 'srun sh -c \"if [ \\$SLURMD_NODENAME = localhost ]; then python3 {BURNER} 70; else sleep 70; fi\"'"
        ),
    );
    // Two cores on each node, all four tasks busy. The two nodes share this host's two cores,
    // so each node's pair gets about one core's time: some 70 CPU-seconds a node.
    let both = submit(
        "alice",
        &format!(
            "-J two-both-busy -p multi -N2 --ntasks-per-node=2 --mem-per-cpu=100M --time=10 \
             --wrap 'srun python3 {BURNER} 70'"
        ),
    );
    let _cancel = CancelOnDrop(vec![one_node.clone(), both.clone()]);
    wait_jobs_gone(&[one_node.clone(), both.clone()], Duration::from_secs(300));

    let (server, _data, _config) = start_stats_server_configured(
        &prom.url(),
        "2s",
        "[stats-server.findings]\nthin-spread-cores-per-node = 1.0\n",
    );
    // Judged again once each job's CPU time per node is in (the per-node pass asks for the
    // ended multi-node jobs at each update); failures below show what was found instead.
    let began = std::time::Instant::now();
    while began.elapsed() < Duration::from_secs(90)
        && !ids(&findings(&server, &one_node)).contains(&"idle_nodes")
    {
        std::thread::sleep(Duration::from_millis(500));
    }
    // Two more updates: the busy job was asked for in the same pass or the next.
    std::thread::sleep(Duration::from_secs(5));
    let idle = findings(&server, &one_node);
    let busy = findings(&server, &both);
    println!("findings: one node idle {idle:?}, both busy {busy:?}");
    let said = message(&idle, "idle_nodes").unwrap_or_else(|| panic!("no idle_nodes: {idle:?}"));
    assert!(
        said.starts_with("1 of its 2 nodes did almost nothing: node2 (")
            && said.contains(" on localhost."),
        "{said}"
    );
    let thin = message(&idle, "thin_spread").unwrap_or_else(|| panic!("no thin_spread: {idle:?}"));
    assert_eq!(thin, "It spread 2 cores over 2 nodes (1.0 per node).");
    // Judged (its busiest node is over the 60 CPU-seconds below which no node is called
    // idle), and neither idle nor thin.
    assert!(!ids(&busy).contains(&"idle_nodes"), "{busy:?}");
    assert!(!ids(&busy).contains(&"thin_spread"), "{busy:?}");
    let per_node = node_seconds(&prom, &both);
    assert_eq!(per_node.len(), 2, "{per_node:?}");
    assert!(
        per_node.iter().all(|(_, s)| *s >= 60.0),
        "both nodes busy: {per_node:?}"
    );
}
