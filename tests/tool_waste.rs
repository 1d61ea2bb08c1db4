//! `ceems tool report waste` against a running stats-server: the table and the CSV carry the
//! API's ranking, most wasteful first, and a user who is not an admin is refused.

mod common;

use std::process::Command;

use ceems::store::db::Store;
use ceems::store::sql::Sql;

fn job(id: u32, user: &str, gpus: u32, now: i64) -> String {
    let start = now - 86400;
    format!("{id}|gpu|normal|p-{user}|{user}|100|{user}|100|{start}|{start}|{}|10:00:00|36000|0:0|COMPLETED|billing=1,cpu=4,mem=1G,node=1,gres/gpu={gpus}|localhost|/tmp|60|job {id}", now - 3600)
}

fn tool(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ceems"))
        .args(["tool", "report", "waste"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_waste_report_ranks_the_idle_gpu_user_first_as_a_table_and_as_csv() {
    let tmp = tempfile::tempdir().unwrap();
    let now = ceems::manager::unix_now();
    let db = tmp.path().join("db");
    std::fs::create_dir(&db).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = Store::open(&db.join("ceems.db")).await.unwrap();
        store.register_cluster("lab", "slurm").await.unwrap();
        let lines = [job(1, "alice", 2, now), job(2, "bob", 1, now)];
        let (jobs, errors) = ceems::manager::slurm::sacct::parse_output(&lines.join("\n"));
        assert!(errors.is_empty(), "{errors:?}");
        store.ingest("lab", &jobs, now, now).await.unwrap();
        // alice's 2 GPUs idle and her 4 cores at a quarter; bob's GPU and cores busy.
        for (id, cpu, mean) in [("1", 36_000.0, 0.0), ("2", 144_000.0, 0.9)] {
            let q = Sql::new(
                "UPDATE units SET aggregated_seconds = 36000, cpu_seconds = $2, measured = 1,
                        mean_gpu_utilization = $3, gpu_utilization_max = $3 WHERE uuid = $1",
            )
            .arg(id)
            .arg(cpu)
            .arg(mean);
            store.execute(&q).await.unwrap();
        }
    });
    // A campaign, run by the server at start: alice's idle GPUs pass its bound and share.
    let config = tmp.path().join("ceems.toml");
    std::fs::write(
        &config,
        "[[stats-server.campaigns]]\nname = \"idle-gpus\"\nmin-amount = 10.0\nquiet-weekdays = []\n",
    )
    .unwrap();
    let eml = tmp.path().join("eml");
    let server = common::start_subcommand(
        "stats-server",
        tmp.path(),
        &[
            &format!("--config.file={}", config.display()),
            &format!("--notify.eml-dir={}", eml.display()),
            &format!("--storage.data.path={}", db.display()),
            "--slurm.sacct.path=true",
            "--slurm.sacctmgr.path=",
            "--slurm.run-as-user=",
            "--slurm.cluster-id=lab",
            "--web.admin-users=root",
            "--security.drop-privileges=false",
        ],
        &[],
    );
    let url = server.url("");
    let (ok, csv, err) = tool(&["--url", &url, "--from", "0", "--csv"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 3, "{csv}");
    // alice: 2 GPUs × 10 h idle; 4 × 10 h of cores less 10 h used.
    assert!(lines[1].starts_with("lab,alice,1,20.0,30.0,"), "{csv}");
    assert!(lines[2].starts_with("lab,bob,1,0.0,0.0,"), "{csv}");
    // No power source measured these jobs: the energy columns are empty, not 0.
    assert!(lines[1].ends_with(",,"), "{csv}");
    let (ok, table, err) = tool(&["--url", &url, "--from", "0"]);
    assert!(ok, "{err}");
    let rows: Vec<&str> = table.lines().collect();
    assert!(
        rows[0].starts_with("cluster") && rows[0].contains("idle GPU-h"),
        "{table}"
    );
    assert!(
        rows[1].contains("alice") && rows[1].contains("20.00") && rows[1].trim_end().ends_with('-'),
        "{table}"
    );
    let (ok, _, err) = tool(&["--url", &url, "--from", "0", "--as-user", "alice"]);
    assert!(!ok);
    assert!(err.contains("403"), "{err}");
    let campaign = || -> Vec<String> {
        std::fs::read_dir(&eml)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                    .filter(|m| m.contains("Your jobs on lab"))
                    .collect()
            })
            .unwrap_or_default()
    };
    common::lab::wait_until(
        "the campaign's mail",
        std::time::Duration::from_secs(20),
        || !campaign().is_empty(),
    );
    let mails = campaign();
    assert_eq!(mails.len(), 1, "{mails:?}");
    assert!(mails[0].contains("To: alice@"), "{}", mails[0]);
}
