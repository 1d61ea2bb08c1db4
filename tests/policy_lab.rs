//! Policies on the real Slurm lab (`scripts/slurm-lab.sh`, two gres GPUs): Debian's Prometheus
//! scrapes a stand-in for the node's GPU series (the `nvidia` collector's per-GPU use and
//! per-job `ceems_compute_unit_gpu_index_flag`, each job on the GPU Slurm gave it) and records
//! CEEMS's GPU rules; the stats-server's policy, with stages scaled to seconds, mails through
//! aiosmtpd and cancels with the real scancel.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::http::{Response, TestServer};
use common::lab::{
    as_user, lab, postgres_schema, postgres_tools, prometheus_tools, start_stats_server_with,
    submit, wait_until, CancelOnDrop, Prometheus,
};
use common::mail::{aiosmtpd, Received, SmtpSink};
use common::runnable;

/// (job, GPU index, use as a ratio) of each running job, served as the node's GPU series.
type Gpus = Arc<Mutex<Vec<(String, u32, f64)>>>;

fn gpu_stand_in(gpus: &Gpus) -> TestServer {
    let gpus = Arc::clone(gpus);
    TestServer::start(
        false,
        Arc::new(move |_| {
            let held = gpus.lock().unwrap();
            let mut text = String::from("# TYPE ceems_nvidia_gpu_utilization_ratio gauge\n");
            for i in 0..2u32 {
                let used = held.iter().find(|(_, g, _)| *g == i).map_or(0.0, |h| h.2);
                text.push_str(&format!(
                    "ceems_nvidia_gpu_utilization_ratio{{gpuuuid=\"GPU-{i}\",gpuiid=\"\",index=\"{i}\",hostname=\"localhost\"}} {used}\n"
                ));
            }
            text.push_str("# TYPE ceems_compute_unit_gpu_index_flag gauge\n");
            for (job, i, _) in held.iter() {
                text.push_str(&format!(
                    "ceems_compute_unit_gpu_index_flag{{uuid=\"{job}\",gpuuuid=\"GPU-{i}\",gpuiid=\"\",index=\"{i}\",hostname=\"localhost\",manager=\"slurm\"}} 1\n"
                ));
            }
            Response::raw(200, text).with_header("Content-Type", "text/plain; version=0.0.4")
        }),
    )
}

/// The GPU Slurm gave a running job (`GRES=gpu:1(IDX:N)`).
fn gpu_of(job: &str) -> u32 {
    let mut idx = None;
    wait_until(
        &format!("job {job} running on a GPU"),
        Duration::from_secs(90),
        || {
            let out = as_user("root", &format!("scontrol show job -d {job}"));
            idx = out
                .split("IDX:")
                .nth(1)
                .and_then(|r| r.chars().next())
                .and_then(|c| c.to_digit(10));
            out.contains("JobState=RUNNING") && idx.is_some()
        },
    );
    idx.unwrap()
}

fn config(dir: &Path, smtp: u16, extra: &str) -> String {
    let path = dir.join("policies.toml");
    std::fs::write(
        &path,
        format!(
            "[stats-server.notify]\nfrom = \"HPC <hpc@example.org>\"\naddress-template = \"{{user}}@example.org\"\n\
             [stats-server.notify.smtp]\nhost = \"127.0.0.1\"\nport = {smtp}\ntls = \"none\"\n\
             [[stats-server.policies]]\nname = \"idle-gpus\"\nwarn-after = [\"8s\", \"16s\"]\ncancel-after = \"24s\"\n\
             admins = [\"ops@example.org\"]\nexempt-users = [\"carol\"]\n{extra}"
        ),
    )
    .unwrap();
    format!("--config.file={}", path.display())
}

/// The policy's messages about `job` (digests of other jobs left out): (recipient, subject).
fn about(sink: &SmtpSink, job: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = sink
        .received()
        .iter()
        .filter(|m: &&Received| {
            let subject = m.envelope["subject"].as_str().unwrap_or_default();
            subject.starts_with("[ceems") && subject.contains(&format!("ob {job} "))
        })
        .map(|m| {
            (
                m.rcpt().join(","),
                m.envelope["subject"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

fn state(job: &str) -> String {
    as_user("root", &format!("sacct -X -n -P -o state -j {job}"))
}

/// The lab has two GPUs and two cores: one test at a time.
static LAB: Mutex<()> = Mutex::new(());

fn start_gpu_job(
    user: &str,
    name: &str,
    gpus: &Gpus,
    used: f64,
    cancel: &mut CancelOnDrop,
) -> String {
    let job = submit(
        user,
        &format!("-J {name} --gres=gpu:1 -c 1 --mem=100M --wrap 'sleep 300'"),
    );
    cancel.0.push(job.clone());
    let idx = gpu_of(&job);
    gpus.lock().unwrap().push((job.clone(), idx, used));
    job
}

fn prometheus(gpu_port: u16) -> Prometheus {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/prometheus/rules/ceems-gpu-nvidia.rules.yml");
    let prom = Prometheus::start(&[gpu_port], &[&rules]);
    wait_until(
        "Prometheus scraping the GPU stand-in",
        Duration::from_secs(60),
        || prom.targets_up().is_ok(),
    );
    prom
}

/// What each test starts from: the lab to itself, an SMTP sink, the GPU stand-in and a
/// Prometheus recording CEEMS's GPU rules over it; the jobs it starts are cancelled when
/// dropped. None where the lab cannot run.
struct Setup {
    cancel: CancelOnDrop,
    prom: Prometheus,
    gpus: Gpus,
    _stand_in: TestServer,
    sink: SmtpSink,
    tmp: tempfile::TempDir,
    _lab: std::sync::MutexGuard<'static, ()>,
}

impl Setup {
    fn start() -> Option<Setup> {
        if !runnable(
            "policy_lab",
            lab()
                .and_then(|_| prometheus_tools())
                .and_then(|_| aiosmtpd()),
        ) {
            return None;
        }
        let lab = LAB.lock().unwrap_or_else(|e| e.into_inner());
        let tmp = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            tmp.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let sink = SmtpSink::start(&tmp.path().join("mail"));
        let gpus: Gpus = Arc::default();
        let stand_in = gpu_stand_in(&gpus);
        let prom = prometheus(stand_in.port);
        Some(Setup {
            cancel: CancelOnDrop(Vec::new()),
            prom,
            gpus,
            _stand_in: stand_in,
            sink,
            tmp,
            _lab: lab,
        })
    }

    fn job(&mut self, user: &str, name: &str, used: f64) -> String {
        start_gpu_job(user, name, &self.gpus, used, &mut self.cancel)
    }

    /// The stats-server's arguments: the policy's config (with `extra`) and `more`.
    fn args(&self, extra: &str, more: &[String]) -> Vec<String> {
        let mut args = vec![
            config(self.tmp.path(), self.sink.port, extra),
            "--policy.interval=1s".to_owned(),
        ];
        args.extend_from_slice(more);
        args
    }
}

#[test]
fn an_idle_gpu_job_is_warned_twice_then_cancelled_once_across_a_kill() {
    let Some(mut lab) = Setup::start() else {
        return;
    };
    let alice = lab.job("alice", "policy-idle", 0.0);
    let bob = lab.job("bob", "policy-busy", 0.8);
    let args = lab.args("dry-run = false", &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (sink, prom) = (&lab.sink, &lab.prom);
    let (first, data) = start_stats_server_with(&prom.url(), "1s", &args);

    wait_until("alice's second warning", Duration::from_secs(90), || {
        about(sink, &alice)
            .iter()
            .filter(|(to, s)| to == "alice@example.org" && s.contains("warning 2 of 2"))
            .count()
            == 1
    });
    // Killed between the second warning and the cancel; a new server on the same database.
    let mut first = first;
    first.child.kill().unwrap();
    let _ = first.child.wait();
    assert_eq!(state(&alice), "RUNNING", "cancelled before its time");
    let second = common::start_subcommand(
        "stats-server",
        data.path(),
        &[
            &format!("--storage.data.path={}", data.path().join("db").display()) as &str,
            &format!("--prometheus.url={}", prom.url()),
            "--storage.update-interval=1s",
            "--storage.first-window=1h",
            "--prometheus.scrape-interval=1s",
            "--slurm.run-as-user=slurm",
            "--web.admin-users=root",
        ]
        .into_iter()
        .chain(args.iter().copied())
        .collect::<Vec<_>>(),
        &[],
    );
    wait_until("alice's job cancelled", Duration::from_secs(90), || {
        state(&alice).starts_with("CANCELLED")
    });
    wait_until("the cancel's mail", Duration::from_secs(30), || {
        about(sink, &alice)
            .iter()
            .any(|(to, s)| to == "alice@example.org" && s.contains("was cancelled"))
    });
    // A few more cycles: nothing is repeated.
    std::thread::sleep(Duration::from_secs(4));
    let mails = about(sink, &alice);
    let to_alice: Vec<&String> = mails
        .iter()
        .filter(|(to, _)| to == "alice@example.org")
        .map(|(_, s)| s)
        .collect();
    assert_eq!(to_alice.len(), 3, "{mails:?}");
    assert_eq!(
        mails
            .iter()
            .filter(|(to, _)| to == "ops@example.org")
            .count(),
        3,
        "{mails:?}"
    );
    let text = sink
        .received()
        .into_iter()
        .find(|m| {
            m.envelope["subject"]
                .as_str()
                .is_some_and(|s| s.contains(&format!("Job {alice} holds 1 GPU")))
        })
        .map(|m| m.text())
        .unwrap();
    for part in [
        "GPU-hours held idle",
        "--gres=gpu",
        &format!("/report/lab/{alice}"),
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
    assert!(about(sink, &bob).is_empty(), "bob's busy job got mail");
    assert_eq!(state(&bob), "RUNNING");
    let metrics = second.get("/metrics");
    assert!(
        metrics.contains("ceems_stats_policy_actions_total{outcome=\"cancelled\",policy=\"idle-gpus\",stage=\"cancel\"} 1"),
        "{metrics}"
    );
    let report = common::api_get(
        &second,
        &format!("/api/v1/units?cluster_id=lab&uuid={alice}&field=uuid&field=actions"),
        "alice",
    );
    assert_eq!(
        report["data"][0]["actions"].as_array().map(Vec::len),
        Some(3),
        "{report}"
    );
}

#[test]
fn a_dry_run_cancels_nothing_mails_only_the_admins_and_spares_the_exempt() {
    let Some(mut lab) = Setup::start() else {
        return;
    };
    let alice = lab.job("alice", "policy-dry", 0.0);
    let carol = lab.job("carol", "policy-exempt", 0.0);
    let args = lab.args("", &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (sink, prom) = (&lab.sink, &lab.prom);
    let (_server, _data) = start_stats_server_with(&prom.url(), "1s", &args);
    wait_until(
        "the dry run's three decisions",
        Duration::from_secs(90),
        || about(sink, &alice).len() == 3,
    );
    std::thread::sleep(Duration::from_secs(4));
    let mails = about(sink, &alice);
    assert!(
        mails
            .iter()
            .all(|(to, s)| to == "ops@example.org" && s.starts_with("[ceems dry run]")),
        "{mails:?}"
    );
    assert_eq!(mails.len(), 3, "{mails:?}");
    assert!(about(sink, &carol).is_empty(), "carol is exempt");
    assert_eq!(state(&alice), "RUNNING");
    assert_eq!(state(&carol), "RUNNING");
}

#[test]
fn two_stats_servers_on_one_postgresql_cancel_once() {
    let url = match postgres_tools() {
        Ok(url) => url,
        Err(e) => {
            assert!(std::env::var_os("CI").is_none(), "{e}");
            return;
        }
    };
    let Some(mut lab) = Setup::start() else {
        return;
    };
    let alice = lab.job("alice", "policy-pg", 0.0);
    let db = postgres_schema(&url, "policy_lab");
    let args = lab.args("dry-run = false", &[format!("--storage.database-url={db}")]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (sink, prom) = (&lab.sink, &lab.prom);
    let (_a, _da) = start_stats_server_with(&prom.url(), "1s", &args);
    let (_b, _db) = start_stats_server_with(&prom.url(), "1s", &args);
    wait_until("alice's job cancelled", Duration::from_secs(90), || {
        state(&alice).starts_with("CANCELLED")
    });
    std::thread::sleep(Duration::from_secs(5));
    let to_alice = about(sink, &alice)
        .into_iter()
        .filter(|(to, _)| to == "alice@example.org")
        .count();
    assert_eq!(to_alice, 3, "{:?}", about(sink, &alice));
}
