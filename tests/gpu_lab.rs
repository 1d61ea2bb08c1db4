//! GPU mapping on a real Slurm cluster with no GPU: the lab's two gres GPUs are dummy devices
//! (`scripts/slurm-lab.sh`), so Slurm really allocates them and sets `SLURM_JOB_GPUS` (batch
//! jobs) or only `SLURM_STEP_GPUS` (a job made by `srun` alone) in the jobs' processes. The
//! exporter, started as root and dropped to nobody, reads other users' environments with
//! CAP_SYS_PTRACE and maps each job to the GPU Slurm gave it; the GPUs themselves come from a
//! stand-in nvidia-smi printing a two-GPU document.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::lab::{as_user, lab, submit, wait_until};
use common::{parse_series, start_exporter, stub, KillOnDrop};

/// Cancels the jobs when dropped.
struct Cleanup(Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Command::new("scancel").args(&self.0).status();
    }
}

const TWO_GPUS: &str = r#"<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
  <gpu id="00000000:18:00.0"><product_name>NVIDIA H100 80GB HBM3</product_name>
    <uuid>GPU-aaaaaaaa-0000-0000-0000-000000000000</uuid><minor_number>0</minor_number>
    <mig_mode><current_mig>Disabled</current_mig></mig_mode></gpu>
  <gpu id="00000000:2a:00.0"><product_name>NVIDIA H100 80GB HBM3</product_name>
    <uuid>GPU-bbbbbbbb-0000-0000-0000-000000000000</uuid><minor_number>1</minor_number>
    <mig_mode><current_mig>Disabled</current_mig></mig_mode></gpu>
</nvidia_smi_log>
"#;

#[test]
fn real_slurm_jobs_are_mapped_to_the_gpus_slurm_gave_them() {
    if !common::runnable("gpu_lab", lab()) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let xml = tmp.path().join("nvidia-smi.xml");
    std::fs::write(&xml, TWO_GPUS).unwrap();
    let nvidia_smi = stub(tmp.path(), "nvidia-smi", &xml);
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();

    // A batch job (SLURM_JOB_GPUS) of alice's, and a job made by srun alone (only
    // SLURM_STEP_GPUS) of bob's, one GPU each.
    let batch = submit(
        "alice",
        "-J gpu-batch --gres=gpu:1 --mem=100M --wrap 'sleep 60'",
    );
    let srun = Command::new("su")
        .args([
            "bob",
            "-c",
            "cd /tmp && exec srun -J gpu-srun --gres=gpu:1 --mem=100M sleep 60",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("srun");
    // Dropped after `cleanup`: the jobs are cancelled, then srun is killed.
    let _srun = KillOnDrop(srun);
    let mut cleanup = Cleanup(vec![batch.clone()]);
    let mut srun_job = String::new();
    wait_until("both jobs running", Duration::from_secs(60), || {
        let out = as_user("root", "squeue -h -t R -o '%i %j'");
        srun_job = out
            .lines()
            .find(|l| l.ends_with(" gpu-srun"))
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or_default()
            .to_owned();
        out.lines().any(|l| l.starts_with(&format!("{batch} "))) && !srun_job.is_empty()
    });
    cleanup.0.push(srun_job.clone());
    // Which GPU Slurm gave each job.
    let gpu_of = |job: &str| -> String {
        let out = as_user("root", &format!("scontrol show job -d {job}"));
        // `GRES=gpu:1(IDX:0)` on the node line.
        out.split("(IDX:")
            .nth(1)
            .map(|s| s.chars().take_while(char::is_ascii_digit).collect())
            .unwrap_or_else(|| panic!("no GPU index for job {job}: {out}"))
    };
    let (batch_gpu, srun_gpu) = (gpu_of(&batch), gpu_of(&srun_job));
    assert_ne!(batch_gpu, srun_gpu, "Slurm gave both jobs one GPU");

    let exporter = start_exporter(
        Path::new("/"),
        &[
            "--collector.slurm",
            "--collector.gpu.type=nvidia",
            &format!("--collector.gpu.nvidia-smi-path={}", nvidia_smi.display()),
        ],
    );
    let uuid_of = |index: &str| {
        if index == "0" {
            "GPU-aaaaaaaa-0000-0000-0000-000000000000"
        } else {
            "GPU-bbbbbbbb-0000-0000-0000-000000000000"
        }
    };
    let mut flags = Vec::new();
    wait_until("both jobs' GPU flags", Duration::from_secs(30), || {
        flags = parse_series(&exporter.get("/metrics"))
            .into_iter()
            .filter(|(k, _)| k.starts_with("ceems_compute_unit_gpu_index_flag{"))
            .collect();
        flags.len() >= 2
    });
    println!("{flags:#?}");
    for (job, index) in [(&batch, &batch_gpu), (&srun_job, &srun_gpu)] {
        let (series, value) = flags
            .iter()
            .find(|(k, _)| k.contains(&format!("uuid=\"{job}\"")))
            .unwrap_or_else(|| panic!("job {job} has no GPU flag: {flags:?}"));
        assert!(
            series.contains(&format!("index=\"{index}\""))
                && series.contains(&format!("gpuuuid=\"{}\"", uuid_of(index))),
            "job {job} holds GPU {index}: {series}"
        );
        assert_eq!(*value, 1.0);
    }
    assert_eq!(flags.len(), 2, "{flags:?}");
    drop(exporter);

    // A prolog's GPU→job files come first (for exporters that must not read environments):
    // examples/slurm/prolog.sh writes them; here it is told the batch job holds the other GPU,
    // and the exporter believes the file.
    let map = tmp.path().join("gpujobmap");
    let prolog = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/slurm/prolog.sh");
    let status = Command::new("sh")
        .arg(&prolog)
        .env("SLURM_JOB_ID", &batch)
        .env("SLURM_JOB_GPUS", &srun_gpu)
        .env("CEEMS_GPU_MAP_DIR", &map)
        .env("CEEMS_JOB_PROPS_DIR", tmp.path().join("props"))
        .status()
        .expect("prolog");
    assert!(status.success());
    let exporter = start_exporter(
        Path::new("/"),
        &[
            "--collector.slurm",
            "--collector.gpu.type=nvidia",
            &format!("--collector.gpu.nvidia-smi-path={}", nvidia_smi.display()),
            &format!("--collector.slurm.gpu-job-map-path={}", map.display()),
        ],
    );
    let mut from_file = Vec::new();
    wait_until("the batch job's GPU flag", Duration::from_secs(30), || {
        from_file = parse_series(&exporter.get("/metrics"))
            .into_iter()
            .filter(|(k, _)| {
                k.starts_with("ceems_compute_unit_gpu_index_flag{")
                    && k.contains(&format!("uuid=\"{batch}\""))
            })
            .collect();
        !from_file.is_empty()
    });
    assert!(
        from_file[0].0.contains(&format!("index=\"{srun_gpu}\"")),
        "the map file says GPU {srun_gpu}: {from_file:?}"
    );
}
