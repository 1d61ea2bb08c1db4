//! The prolog and epilog of `examples/slurm`: what they write is what the exporter reads.

use std::path::Path;
use std::process::Command;

fn run(script: &str, dir: &Path, env: &[(&str, &str)]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/slurm")
        .join(script);
    let status = Command::new("sh")
        .arg(path)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("CEEMS_JOB_PROPS_DIR", dir.join("props"))
        .env("CEEMS_GPU_MAP_DIR", dir.join("gpus"))
        .envs(env.iter().copied())
        .status()
        .unwrap();
    assert!(status.success(), "{script} failed");
}

#[test]
fn prolog_writes_ceems_formats_and_epilog_removes_only_its_job() {
    let tmp = tempfile::tempdir().unwrap();
    let job = [
        ("SLURM_JOB_ID", "4711"),
        ("SLURM_JOB_USER", "alice"),
        ("SLURM_JOB_ACCOUNT", "physics"),
        ("SLURM_JOB_NODELIST", "node[1-2]"),
        ("SLURM_JOB_WORK_DIR", "/home/alice/run"),
        ("SLURM_JOB_GPUS", "0,2"),
    ];
    run("prolog.sh", tmp.path(), &job);
    let props = std::fs::read_to_string(tmp.path().join("props/4711")).unwrap();
    assert_eq!(props, "alice physics node[1-2] /home/alice/run");
    let parsed = ceems::manager::slurm::props::parse_props_file(&props).unwrap();
    assert_eq!(
        (parsed.user.as_str(), parsed.account.as_str()),
        ("alice", "physics")
    );
    for gpu in ["0", "2"] {
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("gpus").join(gpu)).unwrap(),
            "4711"
        );
    }
    assert!(!tmp.path().join("gpus/1").exists());

    // Another job took GPU 2 since: the epilog of 4711 must leave it.
    std::fs::write(tmp.path().join("gpus/2"), "4712").unwrap();
    run("epilog.sh", tmp.path(), &[("SLURM_JOB_ID", "4711")]);
    assert!(!tmp.path().join("props/4711").exists());
    assert!(!tmp.path().join("gpus/0").exists());
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("gpus/2")).unwrap(),
        "4712"
    );
}
