//! slurmrestd as the job source in the real Slurm lab: Debian's slurmrestd 22.05 on a unix
//! socket with `rest_auth/local` (run as the same user as the stats-server), then on HTTP with
//! `rest_auth/jwt` and a token from `scontrol token`. A stats-server reading its `dbv0.0.38`
//! API either way ingests the same jobs, users and projects as one reading `sacct`
//! and `sacctmgr`, field by field: completed, failed, cancelled, held and time-limited jobs
//! of two users. The one difference is Slurm's: slurmrestd 22.05 says a script that exited 3
//! succeeded, so a failed job's exit code is recorded as unknown.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::lab::{as_user, lab, start_stats_server_with, submit, wait_until, CancelOnDrop};
use common::{runnable, KillOnDrop};

/// The user slurmrestd and the stats-server run as: `rest_auth/local` accepts only its own.
const SERVICE_USER: &str = "daemon";

fn slurmrestd_tools() -> Result<(), String> {
    common::ensure_tools(
        || Path::new("/usr/sbin/slurmrestd").exists(),
        &["slurmrestd"],
        &[],
    )
}

/// slurmrestd as [`SERVICE_USER`] with `auth` on `listen`, killed when dropped.
fn slurmrestd(auth: &str, listen: &str) -> KillOnDrop {
    let mut command = Command::new("setpriv");
    command.args([
        &format!("--reuid={SERVICE_USER}"),
        &format!("--regid={SERVICE_USER}"),
        "--clear-groups",
        "/usr/sbin/slurmrestd",
        "-a",
        auth,
        listen,
    ]);
    if auth == "rest_auth/jwt" {
        // How slurmrestd 22.05 is told to pass clients' tokens through.
        command.env("SLURM_JWT", "daemon");
    }
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start slurmrestd");
    KillOnDrop(child)
}

/// slurmrestd with `rest_auth/local` on a unix socket in a directory of its user's, once the
/// socket is there.
fn slurmrestd_on_socket() -> (tempfile::TempDir, std::path::PathBuf, KillOnDrop) {
    let dir = tempfile::tempdir().unwrap();
    let owner = nix::unistd::User::from_name(SERVICE_USER).unwrap().unwrap();
    nix::unistd::chown(dir.path(), Some(owner.uid), None).unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let socket = dir.path().join("slurmrestd.sock");
    let restd = slurmrestd("rest_auth/local", &format!("unix:{}", socket.display()));
    wait_until("slurmrestd's socket", Duration::from_secs(10), || {
        socket.exists()
    });
    (dir, socket, restd)
}

/// Every job the server holds, every field but the times of its own writes, by job id.
fn jobs(server: &common::Running) -> std::collections::BTreeMap<String, serde_json::Value> {
    // CEEMS's fields and ours.
    let fields: String = ceems::store::api::UNIT_FIELDS
        .iter()
        .map(|f| format!("&field={f}"))
        .collect();
    let body = ureq::get(&server.url(&format!("/api/v1/units/admin?from=0{fields}")))
        .set("X-Grafana-User", "root")
        .call()
        .expect("units")
        .into_string()
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            let mut u = u.clone();
            let o = u.as_object_mut().unwrap();
            o.remove("last_updated_at_ts");
            o.remove("aggregates_updated_at_ts");
            // sacct says who cancelled (`CANCELLED by 0`), slurmrestd does not.
            if let Some(state) = o.get_mut("state") {
                if let Some(s) = state.as_str().and_then(|s| s.split(" by ").next()) {
                    *state = s.into();
                }
            }
            (o["uuid"].as_str().unwrap().to_owned(), u)
        })
        .collect()
}

/// When `server` last finished an update (ingestion, findings, usage); 0 before its first.
fn last_update(server: &common::Running) -> f64 {
    let text = ureq::get(&server.url("/metrics"))
        .call()
        .ok()
        .and_then(|r| r.into_string().ok())
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("ceems_stats_last_update_timestamp_seconds"))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .fold(0.0, f64::max)
}

fn get(server: &common::Running, path: &str, user: &str) -> serde_json::Value {
    let body = ureq::get(&server.url(path))
        .set("X-Grafana-User", user)
        .call()
        .expect(path)
        .into_string()
        .unwrap();
    serde_json::from_str(&body).unwrap()
}

#[test]
fn jobs_through_slurmrestd_equal_those_through_sacct() {
    if !runnable("slurmrestd_lab", lab().and_then(|_| slurmrestd_tools())) {
        return;
    }
    let (dir, socket, _restd) = slurmrestd_on_socket();

    let done = submit("alice", "-J rest-ok -t 5 --wrap 'sleep 1'");
    let failed = submit("bob", "-J 'rest fails|x' --wrap 'exit 3'");
    let cancelled = submit("alice", "-J rest-cancel --wrap 'sleep 300'");
    let held = submit("bob", "-J rest-held --hold --wrap 'true'");
    let _cancel = CancelOnDrop(vec![cancelled.clone(), held.clone()]);
    wait_until(
        "the cancellable job to run",
        Duration::from_secs(60),
        || as_user("root", &format!("squeue -h -j {cancelled} -o %T")) == "RUNNING",
    );
    as_user("root", &format!("scancel {cancelled}"));
    wait_until("the jobs to end", Duration::from_secs(60), || {
        as_user("root", "squeue -h -t R,CG -o %i").is_empty()
    });
    // slurmdbd records an end a moment after squeue forgets the job: the servers below read
    // accounting once, so it must hold the three ends first.
    let ids = format!("{done},{failed},{cancelled}");
    wait_until(
        "accounting to record the ends",
        Duration::from_secs(60),
        || {
            let states = as_user("root", &format!("sacct -n -X -P -j {ids} -o State"));
            states.lines().count() == 3
                && states
                    .lines()
                    .all(|s| !s.starts_with("RUNNING") && !s.starts_with("PENDING"))
        },
    );

    // Ingesting every 2 s: a job that sacct's window missed at the first run comes at the next.
    let (sacct, _d0) = start_stats_server_with("", "2s", &[]);
    let mut reference = Default::default();
    wait_until("the jobs through sacct", Duration::from_secs(30), || {
        reference = jobs(&sacct);
        [&done, &failed, &cancelled]
            .iter()
            .all(|id| reference.contains_key(id.as_str()))
    });
    // The jobs show as soon as they are committed; their findings come at the end of the same
    // update: read them again once an update has ended since.
    let seen = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        .floor();
    wait_until(
        "an update of the sacct server",
        Duration::from_secs(30),
        || last_update(&sacct) > seen,
    );
    reference = jobs(&sacct);
    assert_eq!(reference[&failed]["state"], "FAILED");
    assert_eq!(reference[&cancelled]["state"], "CANCELLED");
    // A held job is never eligible, so neither source lists it in a window.
    assert!(!reference.contains_key(&held));
    let users = get(&sacct, "/api/v1/users/admin", "root");
    let projects = get(&sacct, "/api/v1/projects/admin", "root");

    let url = format!("--slurm.slurmrestd.url=unix:{}", socket.display());
    let (rest, _d1) = start_stats_server_with(
        "",
        "1h",
        &[
            "--slurm.source=slurmrestd",
            &url,
            "--slurm.slurmrestd.api-version=v0.0.38",
            &format!("--security.run-as-user={SERVICE_USER}"),
        ],
    );
    assert_same("unix socket", &rest, &reference, &users, &projects);

    // HTTP with a JWT, as `scontrol token` prints it, read by the server (nobody) from a file.
    let port = common::free_port();
    let _restd_http = slurmrestd("rest_auth/jwt", &format!("127.0.0.1:{port}"));
    let token = dir.path().join("jwt");
    std::fs::write(
        &token,
        as_user(
            "root",
            &format!("scontrol token username={SERVICE_USER} lifespan=600"),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    wait_until("slurmrestd on HTTP", Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let (jwt, _d2) = start_stats_server_with(
        "",
        "1h",
        &[
            "--slurm.source=slurmrestd",
            &format!("--slurm.slurmrestd.url=http://127.0.0.1:{port}"),
            &format!("--slurm.slurmrestd.token-file={}", token.display()),
            &format!("--slurm.slurmrestd.user={SERVICE_USER}"),
        ],
    );
    assert_same("HTTP with a JWT", &jwt, &reference, &users, &projects);
}

/// `server`, reading slurmrestd, holds the jobs, users and projects the sacct one does.
fn assert_same(
    how: &str,
    server: &common::Running,
    reference: &std::collections::BTreeMap<String, serde_json::Value>,
    users: &serde_json::Value,
    projects: &serde_json::Value,
) {
    let mut through_rest = Default::default();
    wait_until(
        "the jobs through slurmrestd",
        Duration::from_secs(30),
        || {
            // Read once its first update has ended, findings included.
            last_update(server) > 0.0 && {
                through_rest = jobs(server);
                through_rest.len() >= reference.len()
            }
        },
    );
    let mut differences = Vec::new();
    for (id, want) in reference {
        // slurmrestd 22.05 says a failed script succeeded; the server records "unknown".
        let mut want = want.clone();
        if want["state"] == "FAILED" {
            let code = format!("exit code {}.", want["exit_code"].as_str().unwrap());
            want["exit_code"] = "".into();
            if let Some(tags) = want["tags"].as_object_mut() {
                tags.remove("exit_code");
            }
            want["findings"] = serde_json::from_str(
                &want["findings"]
                    .to_string()
                    .replace(&code, "exit code unknown."),
            )
            .unwrap();
        }
        match through_rest.get(id) {
            None => differences.push(format!("job {id} missing")),
            Some(got) if *got != want => {
                for (field, v) in want.as_object().unwrap() {
                    if got[field] != *v {
                        differences.push(format!(
                            "job {id} {field}: sacct {v}, slurmrestd {}",
                            got[field]
                        ));
                    }
                }
            }
            Some(_) => {}
        }
    }
    for id in through_rest
        .keys()
        .filter(|id| !reference.contains_key(*id))
    {
        differences.push(format!("job {id} only through slurmrestd"));
    }
    assert!(differences.is_empty(), "{how}: {differences:#?}");
    assert_eq!(&get(server, "/api/v1/users/admin", "root"), users, "{how}");
    assert_eq!(
        &get(server, "/api/v1/projects/admin", "root"),
        projects,
        "{how}"
    );
    println!(
        "{how}: {} jobs equal to sacct's, field by field",
        through_rest.len()
    );
}

/// A policy's cancel through slurmrestd: `DELETE /slurm/v0.0.38/job/{id}` ends the real job,
/// after the job's record was read the same way.
#[test]
fn a_policy_cancel_through_slurmrestd_ends_the_real_job() {
    use ceems::manager::slurm::rest::{Endpoint, RestAccounting};
    use ceems::manager::Accounting;
    if !runnable("slurmrestd_lab", lab().and_then(|_| slurmrestd_tools())) {
        return;
    }
    let (_dir, socket, _restd) = slurmrestd_on_socket();
    // slurmrestd with rest_auth/local acts as its own user: a Slurm operator may cancel
    // others' jobs, as a site makes the user its token names.
    let _ = Command::new("sacctmgr")
        .args([
            "-i",
            "add",
            "user",
            SERVICE_USER,
            "account=physics",
            "adminlevel=Operator",
        ])
        .output();
    let _ = Command::new("sacctmgr")
        .args([
            "-i",
            "modify",
            "user",
            SERVICE_USER,
            "set",
            "adminlevel=Operator",
        ])
        .output();
    let job = submit("alice", "-J rest-policy --wrap 'sleep 300'");
    let _cancel = CancelOnDrop(vec![job.clone()]);
    let acct = RestAccounting {
        endpoint: Endpoint::Unix(socket.clone()),
        version: "v0.0.38".into(),
        jwt: None,
        slurm_name: None,
        timeout: Duration::from_secs(30),
    };
    let mut record = None;
    wait_until(
        "the job running in accounting",
        Duration::from_secs(60),
        || {
            record = acct.unit(&job).ok().and_then(|mut r| {
                r.find_map(|r| r.ok().filter(|r| r.uuid == job && r.state == "RUNNING"))
            });
            record.is_some()
        },
    );
    let record = record.unwrap();
    // The operator level reaches slurmctld a moment after sacctmgr wrote it.
    let mut said = Err(String::new());
    wait_until("slurmrestd's cancel", Duration::from_secs(30), || {
        said = acct.cancel(&record).map_err(|e| e.to_string());
        said.is_ok()
    });
    let said = said.unwrap();
    assert!(
        said.contains(&format!("/slurm/v0.0.38/job/{job}")),
        "{said}"
    );
    wait_until("the job cancelled", Duration::from_secs(60), || {
        as_user("root", &format!("sacct -X -n -P -o State -j {job}")).starts_with("CANCELLED")
    });
}
