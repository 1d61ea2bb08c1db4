//! The stats-server on an LSF cluster: `bacct` and `bjobs` stand-ins print LSF 10.1's long
//! format and `-json` shape (finished jobs, an array element, a running job, a record that
//! cannot be read); the jobs reach `/units` with `resource_manager = "lsf"`, LSF's states in the
//! server's words, each user sees only their own, an admin sees all.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

const BJOBS: &str = r#"{"COMMAND":"bjobs","JOBS":2,"RECORDS":[
 {"JOBID":"8001","JOBINDEX":"0","USER":"alice","USER_GROUP":"phys","QUEUE":"gpu","JOB_NAME":"train2","PROJ_NAME":"physics","STAT":"RUN","ALLOC_SLOT":"cn01:cn01","NALLOC_SLOT":"2","SUBMIT_TIME":"Nov 25 10:00:00 2026","START_TIME":"Nov 25 10:00:30 2026","RUN_TIME":"90 second(s)","GPU_NUM":"1","MEM":"1 Gbytes","MEMLIMIT":"","MEM_EFFICIENCY":"50.00%","EXEC_CWD":"/home/alice","RUNTIMELIMIT":"60.0/cn01"},
 {"JOBID":"7001","USER":"alice","USER_GROUP":"phys","STAT":"DONE"}
]}"#;

/// A stand-in LSF command: refuses to answer unless run with `TZ=UTC`, logs its arguments.
fn command(dir: &Path, name: &str, output: &Path) {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\n[ \"$TZ\" = UTC ] || {{ echo 'TZ is not UTC' >&2; exit 3; }}\n[ \"$LSF_ENVDIR\" = /opt/lsf/conf ] || {{ echo 'no LSF_ENVDIR' >&2; exit 4; }}\necho \"$@\" >> '{log}'\nexec /bin/cat '{out}'\n",
            log = dir.join(format!("{name}.args")).display(),
            out = output.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The `data` rows of an API answer.
fn units(server: &common::Running, path: &str, user: &str) -> Vec<Value> {
    common::api_get(server, path, user)["data"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn field<'a>(units: &'a [Value], uuid: &str, name: &str) -> Option<&'a Value> {
    units.iter().find(|u| u["uuid"] == uuid).map(|u| &u[name])
}

/// A stats-server on an LSF cluster whose stand-ins print the fixture's bacct answer (with a
/// record that cannot be read) and `bjobs`; `entry` is added to the cluster's entry. Returns
/// the server and the stand-ins' directory.
fn lsf_server(dir: &Path, bjobs: &str, entry: &str) -> (common::Running, std::path::PathBuf) {
    // The server drops to nobody when started as root.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let bin = dir.join("lsf-bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o777)).unwrap();
    let fixture = std::fs::read_to_string(common::fixtures().join("lsf/bacct-l.txt")).unwrap();
    // A record that cannot be read is skipped, not the end of the answer.
    let broken = "\nJob <99x>, User <mallory>, Status <DONE>\n------------------------------------------------------------------------------\n";
    let bacct_out = dir.join("bacct.txt");
    let at = fixture.find("\nJob <7002[3]>").unwrap();
    std::fs::write(
        &bacct_out,
        format!("{}{broken}{}", &fixture[..at], &fixture[at..]),
    )
    .unwrap();
    let bjobs_out = dir.join("bjobs.json");
    std::fs::write(&bjobs_out, bjobs).unwrap();
    command(&bin, "bacct", &bacct_out);
    command(&bin, "bjobs", &bjobs_out);
    let config = dir.join("ceems.toml");
    std::fs::write(
        &config,
        format!(
            "[stats-server.web]\nadmin-users = [\"root\"]\n\n[[stats-server.clusters]]\nid = \"lsf1\"\nmanager = \"lsf\"\nlsf-bin-dir = \"{}\"\nlsf-env = [\"LSF_ENVDIR=/opt/lsf/conf\"]\n{entry}",
            bin.display()
        ),
    )
    .unwrap();
    let server = common::start_subcommand(
        "stats-server",
        dir,
        &[
            &format!("--config.file={}", config.display()),
            &format!("--storage.data.path={}", dir.join("data").display()),
            "--storage.update-interval=1h",
        ],
        &[],
    );
    (server, bin)
}

#[test]
fn lsf_jobs_reach_the_api_with_their_owner_state_and_allocation() {
    let tmp = tempfile::tempdir().unwrap();
    let (server, bin) = lsf_server(tmp.path(), BJOBS, "");
    let all = "/api/v1/units/admin?from=0&running&field=uuid&field=username&field=project&field=groupname&field=partition&field=state&field=exit_code&field=alloc_cpus&field=alloc_gpus&field=alloc_mem_bytes&field=nodes&field=elapsed_seconds&field=resource_manager&field=time_limit_seconds&field=name&field=allocation&field=tags";
    let start = Instant::now();
    let admin = loop {
        let got = units(&server, all, "root");
        if got.len() >= 3 {
            break got;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "not ingested: {got:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut ids: Vec<&str> = admin.iter().filter_map(|u| u["uuid"].as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["7001", "7002[3]", "8001"], "{admin:?}");
    for u in &admin {
        assert_eq!(u["resource_manager"], "lsf", "{u}");
    }
    // bacct's finished GPU job, its group from bjobs; CEEMS 0.14's words: LSF's status, no
    // name, an allocation without billing, LSF's tags.
    assert_eq!(field(&admin, "7001", "state"), Some(&Value::from("DONE")));
    let job = admin.iter().find(|u| u["uuid"] == "7001").unwrap();
    assert!(job.get("name").is_none(), "{job}");
    assert_eq!(
        job["allocation"],
        serde_json::json!({"cpus": 4, "gpus": 2, "mem": job["allocation"]["mem"], "nodes": 2}),
        "{job}"
    );
    let tags = job["tags"].as_object().unwrap();
    let keys: Vec<&str> = tags.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        ["exit_status", "nodelist", "queue", "res_req", "workdir"],
        "{job}"
    );
    assert_eq!(tags["exit_status"], "done", "{job}");
    assert!(tags["nodelist"].as_str().unwrap().contains('|'), "{job}");
    assert_eq!(
        field(&admin, "7001", "groupname"),
        Some(&Value::from("phys"))
    );
    assert_eq!(
        field(&admin, "7001", "project"),
        Some(&Value::from("physics"))
    );
    assert_eq!(field(&admin, "7001", "alloc_gpus"), Some(&Value::from(2)));
    assert_eq!(field(&admin, "7001", "alloc_cpus"), Some(&Value::from(4)));
    assert_eq!(
        field(&admin, "7001", "elapsed_seconds"),
        Some(&Value::from(3600))
    );
    assert_eq!(
        field(&admin, "7002[3]", "state"),
        Some(&Value::from("EXIT"))
    );
    assert_eq!(
        field(&admin, "7002[3]", "time_limit_seconds"),
        Some(&Value::from(1800))
    );
    // bjobs' running job.
    assert_eq!(field(&admin, "8001", "state"), Some(&Value::from("RUN")));
    assert_eq!(
        field(&admin, "8001", "alloc_mem_bytes"),
        Some(&Value::from(2u64 << 30))
    );
    assert_eq!(
        field(&admin, "8001", "partition"),
        Some(&Value::from("gpu"))
    );

    // Each user sees only their own: LSF's projects are names anyone may give.
    let mine = "/api/v1/units?from=0&running&field=uuid";
    let mut alice: Vec<String> = units(&server, mine, "alice")
        .iter()
        .filter_map(|u| u["uuid"].as_str().map(str::to_owned))
        .collect();
    alice.sort();
    assert_eq!(alice, ["7001", "8001"]);
    let bob = units(&server, mine, "bob");
    assert_eq!(bob.len(), 1, "{bob:?}");
    assert_eq!(bob[0]["uuid"], "7002[3]");
    assert!(units(&server, mine, "mallory").is_empty());
    assert!(units(&server, "/api/v1/projects", "bob").is_empty());

    // Reports as for Slurm jobs: the owner gets the job's, another user does not.
    // The status and body of a report as `user`.
    let report = |job: &str, user: &str| -> (u16, String) {
        match ureq::get(&server.url(&format!("/report/lsf1/{job}.json")))
            .set("X-Grafana-User", user)
            .call()
        {
            Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
            Err(e) => panic!("{e}"),
        }
    };
    let body: serde_json::Value = serde_json::from_str(&report("7002[3]", "bob").1).unwrap();
    // The job in LSF's words, as the API answers it; the finding says why it ended.
    assert_eq!(body["data"]["job"]["state"], "EXIT", "{body}");
    assert!(
        body["data"]["findings"].to_string().contains("time limit"),
        "{body}"
    );
    assert_eq!(report("7002[3]", "alice").0, 403, "alice read bob's job");

    // bacct was asked for a window of whole minutes; bjobs for every user's jobs.
    let args = std::fs::read_to_string(bin.join("bacct.args")).unwrap();
    let first = args.lines().next().unwrap();
    assert!(first.starts_with("-u all -l -gpu -UF -C "), "{first}");
    let window = first.rsplit(' ').next().unwrap();
    let (from, to) = window.split_once(',').unwrap();
    for t in [from, to] {
        assert_eq!(t.len(), "2026/11/25/10:00".len(), "{window}");
        assert_eq!(&t[4..5], "/", "{window}");
    }
    assert!(from < to, "{window}");
    let bjobs_args = std::fs::read_to_string(bin.join("bjobs.args")).unwrap();
    assert!(
        bjobs_args.starts_with("-u all -a -json -o jobid "),
        "{bjobs_args}"
    );
}

/// With `lsf-projects-from-jobs` (a site whose projects LSF enforces), as CEEMS 0.14+: the
/// projects' members are the users of the jobs each pull fetched, so alice reads bob's job in
/// their project physics, and carol, who ran nothing there, does not.
#[test]
fn with_projects_from_jobs_a_project_s_members_are_its_jobs_users() {
    let tmp = tempfile::tempdir().unwrap();
    let bobs = BJOBS.replace(
        r#" {"JOBID":"7001""#,
        r#" {"JOBID":"8002","JOBINDEX":"0","USER":"bob","USER_GROUP":"phys","QUEUE":"gpu","JOB_NAME":"sim","PROJ_NAME":"physics","STAT":"RUN","ALLOC_SLOT":"cn02","NALLOC_SLOT":"1","SUBMIT_TIME":"Nov 25 10:00:00 2026","START_TIME":"Nov 25 10:00:30 2026","RUN_TIME":"90 second(s)","GPU_NUM":"0","MEM":"1 Gbytes","MEMLIMIT":"","MEM_EFFICIENCY":"50.00%","EXEC_CWD":"/home/bob","RUNTIMELIMIT":"60.0/cn02"},
 {"JOBID":"7001""#,
    );
    let (server, _) = lsf_server(tmp.path(), &bobs, "lsf-projects-from-jobs = true\n");
    let start = Instant::now();
    let projects = loop {
        let got = units(&server, "/api/v1/projects", "alice");
        if !got.is_empty() {
            break got;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no projects for alice"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let physics = projects.iter().find(|p| p["name"] == "physics");
    let physics = physics.unwrap_or_else(|| panic!("{projects:?}"));
    assert_eq!(
        physics["users"],
        serde_json::json!(["alice", "bob"]),
        "{physics}"
    );
    // Through the ownership check the lb and CEEMS's lb use.
    let verify =
        |user: &str| match ureq::get(&server.url("/api/v1/units/verify?cluster_id=lsf1&uuid=8002"))
            .set("X-Grafana-User", user)
            .call()
        {
            Ok(r) => r.status(),
            Err(ureq::Error::Status(code, _)) => code,
            Err(e) => panic!("{e}"),
        };
    assert_eq!(verify("alice"), 200);
    assert_eq!(verify("bob"), 200);
    assert_eq!(verify("carol"), 403);
}

#[test]
fn an_lsf_cluster_with_slurm_keys_or_an_unknown_manager_is_refused_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    for (entry, says) in [
        (
            "manager = \"lsf\"\nsacct-path = \"/usr/bin/sacct\"",
            "unknown field `sacct-path`, expected one of `lsf-bin-dir`, `lsf-env`, `lsf-projects-from-jobs`, for manager = \"lsf\"",
        ),
        ("manager = \"pbs\"", "manager `pbs`"),
        ("lsf-bin-dir = \"/opt\"", "unknown field `lsf-bin-dir`"),
        (
            "manager = \"lsf\"\nlsf-bin-dir = \"/opt\"\nlsf-env = [\"LSF_ENVDIR\"]",
            "not NAME=value",
        ),
    ] {
        let config = tmp.path().join("c.toml");
        std::fs::write(
            &config,
            format!("[[stats-server.clusters]]\nid = \"x\"\n{entry}\n"),
        )
        .unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ceems"))
            .args([
                "stats-server",
                &format!("--config.file={}", config.display()),
                &format!("--storage.data.path={}", tmp.path().join("data").display()),
                "--web.listen-address=127.0.0.1:0",
            ])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{entry}: started");
        assert!(stderr.contains(says), "{entry}: {stderr}");
    }
}
