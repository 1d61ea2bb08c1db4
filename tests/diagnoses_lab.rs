//! The diagnoses that give the request to paste, on real jobs of the Slurm lab, each beside a
//! job shaped not to trigger it: memory asked for and not used (and one that used most of its
//! request), a time limit far above the run time (and one near it), a one-GPU job a MIG slice
//! would serve (and a busy one). The exporter reads the jobs' cgroups; the lab's GPUs are gres
//! stand-ins, so a stand-in serves the jobs' GPU series, as the nvidia collector names them.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::http::{Response, TestServer};
use common::lab::{
    findings_of as findings, lab, prometheus_tools, start_stats_server_configured, submit,
    wait_jobs_gone, wait_until, CancelOnDrop, Found, Prometheus,
};
use common::{runnable, start_exporter};

/// (job, GPU use as a ratio, GPU memory used in bytes) of each GPU job.
type GpuJobs = Arc<Mutex<Vec<(String, f64, f64)>>>;

fn gpu_series(jobs: &GpuJobs) -> TestServer {
    let jobs = Arc::clone(jobs);
    TestServer::start(
        false,
        Arc::new(move |_| {
            let mut text = String::from("# TYPE ceems_compute_unit_gpu_utilization_ratio gauge\n");
            let held = jobs.lock().unwrap();
            for (job, used, _) in held.iter() {
                text.push_str(&format!(
                    "ceems_compute_unit_gpu_utilization_ratio{{uuid=\"{job}\",hostname=\"localhost\",manager=\"slurm\"}} {used}\n"
                ));
            }
            text.push_str("# TYPE ceems_compute_unit_gpu_memory_used_bytes gauge\n");
            for (job, _, bytes) in held.iter() {
                text.push_str(&format!(
                    "ceems_compute_unit_gpu_memory_used_bytes{{uuid=\"{job}\",hostname=\"localhost\",manager=\"slurm\"}} {bytes}\n"
                ));
            }
            Response::raw(200, text).with_header("Content-Type", "text/plain; version=0.0.4")
        }),
    )
}

/// The advice of the finding `id`, if the job has it.
fn advice<'a>(found: &'a [Found], id: &str) -> Option<&'a str> {
    found.iter().find(|f| f.id == id).map(|f| f.advice.as_str())
}

#[test]
fn each_diagnosis_on_a_lab_job_that_earns_it_and_not_on_one_that_does_not() {
    if !runnable("diagnoses_lab", lab().and_then(|_| prometheus_tools())) {
        return;
    }
    let exporter = start_exporter(std::path::Path::new("/"), &["--collector.slurm"]);
    let gpu_jobs: GpuJobs = Arc::default();
    let gpus = gpu_series(&gpu_jobs);
    let prom = Prometheus::start_with(&[exporter.port, gpus.port], "1s", &[], "");
    wait_until("Prometheus scraping", Duration::from_secs(60), || {
        prom.targets_up().is_ok()
    });
    // 700 MiB written, so resident, for the job's whole run.
    let hog = "/tmp/ceems-lab-memory.py";
    std::fs::write(hog, "import time\nx = b'x' * (700 << 20)\ntime.sleep(25)\n").unwrap();
    // 2 GiB and ten minutes asked for, 25 s of sleep.
    let asked_much = submit(
        "alice",
        "-J diag-asked-much -c 1 --mem=2G --time=10 --wrap 'sleep 25'",
    );
    // 1200 MiB and a minute asked for, 700 MiB used for 25 s.
    let asked_right = submit(
        "alice",
        &format!("-J diag-asked-right -c 1 --mem=1200M --time=1 --wrap 'python3 {hog}'"),
    );
    // One GPU each: one kept 5% busy with 2 GiB of its memory, one 90% with 30 GiB.
    let gpu_small = submit(
        "alice",
        "-J diag-gpu-small --gres=gpu:1 -c 1 --mem=100M --time=10 --wrap 'sleep 25'",
    );
    let gpu_busy = submit(
        "alice",
        "-J diag-gpu-busy --gres=gpu:1 -c 1 --mem=100M --time=10 --wrap 'sleep 25'",
    );
    gpu_jobs.lock().unwrap().extend([
        (gpu_small.clone(), 0.05, 2e9),
        (gpu_busy.clone(), 0.9, 30e9),
    ]);
    let jobs = [
        asked_much.clone(),
        asked_right.clone(),
        gpu_small.clone(),
        gpu_busy.clone(),
    ];
    let _cancel = CancelOnDrop(jobs.to_vec());
    wait_jobs_gone(&jobs, Duration::from_secs(240));

    // Time limits are judged from a minute (an hour by default).
    let (server, _data, _config) = start_stats_server_configured(
        &prom.url(),
        "2s",
        "[stats-server.findings]\ntime-limit-min-seconds = 60.0\n",
    );
    wait_until("the jobs' aggregates", Duration::from_secs(90), || {
        jobs.iter().all(|job| {
            let v = common::api_get(
                &server,
                &format!("/api/v1/units?from=0&uuid={job}&field=aggregates_status"),
                "alice",
            );
            v["data"][0]["aggregates_status"] == "done"
        })
    });
    // The findings follow the aggregates in the same update.
    std::thread::sleep(Duration::from_secs(3));
    let much = findings(&server, &asked_much);
    let right = findings(&server, &asked_right);
    let small = findings(&server, &gpu_small);
    let busy = findings(&server, &gpu_busy);
    println!("findings:\n asked much {much:?}\n asked right {right:?}\n gpu small {small:?}\n gpu busy {busy:?}");

    let memory = advice(&much, "memory_underused").unwrap_or_else(|| panic!("{much:?}"));
    assert!(memory.contains("`--mem="), "{memory}");
    let time = advice(&much, "time_limit_overestimated").unwrap_or_else(|| panic!("{much:?}"));
    // 25 s and a half, to the minute: well under the ten minutes asked for.
    assert!(time.contains("`--time=00:01:00`"), "{time}");
    for id in ["memory_underused", "time_limit_overestimated"] {
        assert!(advice(&right, id).is_none(), "{id}: {right:?}");
    }
    let mig = advice(&small, "mig_fit").unwrap_or_else(|| panic!("{small:?}"));
    assert!(mig.contains("MIG slice"), "{mig}");
    for id in ["mig_fit", "gpu_low_use", "cores_per_gpu", "memory_per_gpu"] {
        assert!(advice(&busy, id).is_none(), "{id}: {busy:?}");
    }
}
