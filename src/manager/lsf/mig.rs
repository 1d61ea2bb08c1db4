//! The MIG instances an LSF job holds. bjobs' `GPU_ALLOC` gives them by size only (`2:1/0`),
//! so they are read from the `CUDA_VISIBLE_DEVICES` LSF sets in the job's processes:
//! `MIG-<GPU uuid>/<GPU instance>/<compute instance>`, comma-separated. Only processes whose
//! `LSB_BATCH_JID` is the job's count: a process of another job can sit in its cgroup.

use crate::host::gpu::GpuDevice;

/// One MIG instance of `CUDA_VISIBLE_DEVICES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigInstance {
    /// The physical GPU's UUID (`GPU-…`).
    pub gpu_uuid: String,
    pub gpu_instance: u32,
    pub compute_instance: u32,
}

/// The MIG instances of a `CUDA_VISIBLE_DEVICES` value; whole GPUs, ordinals and MIG UUIDs
/// without instance ids (`MIG-<uuid>`, which only NVML could resolve) are skipped.
pub fn visible_instances(value: &str) -> Vec<MigInstance> {
    value
        .split(',')
        .filter_map(|item| {
            let rest = item.trim().strip_prefix("MIG-")?;
            let mut parts = rest.rsplitn(3, '/');
            let compute_instance = parts.next()?.parse().ok()?;
            let gpu_instance = parts.next()?.parse().ok()?;
            let gpu_uuid = parts.next().filter(|u| !u.is_empty())?.to_owned();
            Some(MigInstance {
                gpu_uuid,
                gpu_instance,
                compute_instance,
            })
        })
        .collect()
}

/// The variable naming the job in its processes' environment.
pub const JOB_ID_VAR: &str = "LSB_BATCH_JID";
/// Where LSF puts a job's devices: `CUDA_VISIBLE_DEVICES`, or `CUDA_VISIBLE_DEVICES1` for its
/// second task family.
pub const VISIBLE_VARS: &[&str] = &["CUDA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES1"];

/// The positions in `devices` of the instances a `CUDA_VISIBLE_DEVICES` value names (the
/// compute instance is not a device of its own: it shares its GPU instance).
pub fn instance_positions(value: &str, devices: &[GpuDevice]) -> Vec<usize> {
    let instances = visible_instances(value);
    (0..devices.len())
        .filter(|at| {
            let d = &devices[*at];
            instances.iter().any(|i| {
                d.gpu_instance_id == Some(i.gpu_instance)
                    && d.uuid.eq_ignore_ascii_case(&i.gpu_uuid)
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_of_cuda_visible_devices() {
        let got = visible_instances("MIG-GPU-956348bc-d43d-23ed-53d4-857749fa2b67/1/0, MIG-GPU-feba7e40/2/1,0,GPU-1234,MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f,MIG-/1/0,MIG-GPU-x/a/0");
        assert_eq!(
            got,
            [
                MigInstance {
                    gpu_uuid: "GPU-956348bc-d43d-23ed-53d4-857749fa2b67".into(),
                    gpu_instance: 1,
                    compute_instance: 0
                },
                MigInstance {
                    gpu_uuid: "GPU-feba7e40".into(),
                    gpu_instance: 2,
                    compute_instance: 1
                },
            ]
        );
    }

    #[test]
    fn only_the_jobs_own_processes_say_which_instances_it_holds() {
        use crate::manager::environ::job_environ_value;
        let tmp = tempfile::tempdir().unwrap();
        let environ = |pid: u32, vars: &[&str]| {
            let dir = tmp.path().join(pid.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            let mut blob = vars.join("\0");
            blob.push('\0');
            std::fs::write(dir.join("environ"), blob).unwrap();
        };
        environ(
            10,
            &["LSB_BATCH_JID=77", "CUDA_VISIBLE_DEVICES=MIG-GPU-a/3/0"],
        );
        environ(
            11,
            &["LSB_BATCH_JID=42[2]", "CUDA_VISIBLE_DEVICES1=MIG-GPU-b/1/0"],
        );
        let value =
            job_environ_value(tmp.path(), &[9, 10, 11], JOB_ID_VAR, "42[2]", VISIBLE_VARS).unwrap();
        let got = visible_instances(&value);
        assert_eq!(got.len(), 1);
        assert_eq!(
            (got[0].gpu_uuid.as_str(), got[0].gpu_instance),
            ("GPU-b", 1)
        );
        assert_eq!(
            job_environ_value(tmp.path(), &[10, 11], JOB_ID_VAR, "5", VISIBLE_VARS),
            None
        );

        let mut devices: Vec<GpuDevice> = (0..3)
            .map(|i| GpuDevice::for_test(i, 0, Some(i as u32), 1.0 / 3.0))
            .collect();
        for d in &mut devices {
            d.uuid = "gpu-B".into();
        }
        let held = instance_positions(&value, &devices);
        assert_eq!(held, [1]);
        assert_eq!(devices[held[0]].gpu_instance_id, Some(1));
    }
}
