//! A site's own rule of the findings: added to the config file, reloaded with SIGHUP, run again
//! over a stored job with `ceems tool findings --rerun`; its finding shows in the API, the job's
//! report and the next digest. A broken rule is refused with its line and the old rules stay.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::lab::wait_until;

/// A completed job of `user` with `gpus` GPUs that ran `seconds` and ended an hour ago.
fn job(id: u32, user: &str, gpus: u32, seconds: i64, now: i64) -> String {
    let (start, end) = (now - 3600 - seconds, now - 3600);
    format!("{id}|gpu|normal|p-{user}|{user}|100|{user}|100|{start}|{start}|{end}|10:00:00|{seconds}|0:0|COMPLETED|billing=1,cpu=4,mem=1G,node=1,gres/gpu={gpus}|localhost|/tmp|60|job {id}")
}

const RULE: &str = r#"
[[stats-server.finding-rules]]
id = "short_gpu_job"
severity = "warning"
when = "job.alloc_gpus > 0 && job.ended && job.elapsed_seconds < 600"
message = "It held {job.alloc_gpus} GPU(s) for {human_duration(job.elapsed_seconds)}."
advice = "Try short GPU runs on the debug partition."
"#;

fn rerun(url: &str) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ceems"))
        .args(["tool", "findings", "--rerun", "--from", "0", "--url", url])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn finding_ids(server: &common::Running, job: u32) -> Vec<String> {
    let answer = common::api_get(
        server,
        &format!("/api/v1/units/lab/{job}/findings"),
        "alice",
    );
    answer["data"]["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["id"].as_str().map(str::to_owned))
        .collect()
}

fn hang_up(server: &common::Running) {
    let pid = nix::unistd::Pid::from_raw(server.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
}

fn mails(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_site_rule_reloaded_with_sighup_judges_stored_jobs_again_and_a_broken_one_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let now = ceems::manager::unix_now();
    let sacct_out = tmp.path().join("sacct.out");
    std::fs::write(&sacct_out, job(1, "alice", 2, 300, now) + "\n").unwrap();
    let sacct = common::stub(&tmp.path().join("bin"), "sacct", &sacct_out);
    let config = tmp.path().join("ceems.toml");
    std::fs::write(&config, "[stats-server]\n").unwrap();
    let (db, eml) = (tmp.path().join("db"), tmp.path().join("eml"));
    let log = tmp.path().join("stats-server.log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_ceems"));
    command
        .arg("stats-server")
        .args([
            &format!("--config.file={}", config.display()),
            &format!("--notify.eml-dir={}", eml.display()),
            "--notify.period=1s",
            &format!("--storage.data.path={}", db.display()),
            "--storage.update-interval=1s",
            &format!("--slurm.sacct.path={}", sacct.display()),
            "--slurm.sacctmgr.path=",
            "--slurm.run-as-user=",
            "--slurm.cluster-id=lab",
            "--web.admin-users=root",
            "--security.drop-privileges=false",
        ])
        .current_dir(tmp.path())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let server = common::start_listening(command, "stats-server");
    let url = server.url("");
    wait_until("job 1 stored", Duration::from_secs(20), || {
        rerun(&url)
            .1
            .starts_with("1 jobs judged again (0 site rules")
    });
    assert!(!finding_ids(&server, 1).contains(&"short_gpu_job".to_owned()));

    // The rule added; SIGHUP; the stored job judged again.
    std::fs::write(&config, format!("[stats-server]\n{RULE}")).unwrap();
    hang_up(&server);
    wait_until("the rule reloaded", Duration::from_secs(10), || {
        rerun(&url).1.contains("(1 site rules in force)")
    });
    let answer = common::api_get(&server, "/api/v1/units/lab/1/findings", "alice");
    assert!(
        finding_ids(&server, 1).contains(&"short_gpu_job".to_owned()),
        "{answer}"
    );
    assert!(
        answer
            .to_string()
            .contains("It held 2 GPU(s) for 5 min 0 s."),
        "{answer}"
    );
    let report = ureq::get(&server.url("/report/lab/1"))
        .set("X-Grafana-User", "alice")
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(
        report.contains("It held 2 GPU(s) for 5 min 0 s."),
        "{report}"
    );
    // The admins' summary counts it.
    let summary = common::api_get(&server, "/api/v1/findings/admin?from=0", "root");
    assert!(summary.to_string().contains("short_gpu_job"), "{summary}");
    // A user is refused.
    let refused = Command::new(env!("CARGO_BIN_EXE_ceems"))
        .args([
            "tool",
            "findings",
            "--rerun",
            "--url",
            &url,
            "--as-user",
            "alice",
        ])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("admin privileges"));

    // A job that ends now is judged by the rule as it comes in, and the next digest says so.
    std::fs::write(
        &sacct_out,
        format!(
            "{}\n{}\n",
            job(1, "alice", 2, 300, now),
            job(3, "alice", 1, 200, now)
        ),
    )
    .unwrap();
    wait_until("the digest of job 3", Duration::from_secs(20), || {
        mails(&eml)
            .iter()
            .any(|m| m.contains("It held 1 GPU(s) for 3 min 20 s."))
    });
    let digest = mails(&eml)
        .into_iter()
        .find(|m| m.contains("It held 1 GPU(s) for 3 min 20 s."))
        .unwrap();
    assert!(digest.contains("To: alice@"), "{digest}");
    assert!(
        digest.contains("Try short GPU runs on the debug partition."),
        "{digest}"
    );

    // A broken rule: refused with its line; the rule in force stays.
    let broken = format!("[stats-server]\n{RULE}\n[[stats-server.finding-rules]]\nid = \"typo\"\nwhen = \"job.gpus > 0\"\nmessage = \"m\"\n");
    let line = broken.lines().position(|l| l.contains("job.gpus")).unwrap() + 1;
    std::fs::write(&config, &broken).unwrap();
    hang_up(&server);
    wait_until("the refusal logged", Duration::from_secs(10), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("site rules not reloaded"))
    });
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains(&format!("line {line}: finding-rules[1].when"))
            && logged.contains("no field `gpus`"),
        "{logged}"
    );
    let (ok, said, err) = rerun(&url);
    assert!(ok, "{err}");
    assert!(said.contains("(1 site rules in force)"), "{said}");
    assert!(finding_ids(&server, 1).contains(&"short_gpu_job".to_owned()));
}

#[test]
fn a_broken_rule_in_the_config_file_stops_the_start_naming_its_line() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("ceems.toml");
    std::fs::write(
        &config,
        "[stats-server]\n\n[[stats-server.finding-rules]]\nid = \"r\"\nwhen = \"job.alloc_gpus >\"\nmessage = \"m\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ceems"))
        .args([
            "stats-server",
            &format!("--config.file={}", config.display()),
            &format!("--storage.data.path={}", tmp.path().display()),
            "--slurm.sacct.path=true",
            "--security.drop-privileges=false",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 5: finding-rules[0].when") && err.contains("line 1, column"),
        "{err}"
    );
}
