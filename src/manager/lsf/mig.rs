//! The MIG instances an LSF job holds. bjobs' `GPU_ALLOC` gives them by size only (`2:1/0`),
//! so they are read from the `CUDA_VISIBLE_DEVICES` LSF sets in the job's processes:
//! `MIG-<GPU uuid>/<GPU instance>/<compute instance>`, comma-separated. Only processes whose
//! `LSB_BATCH_JID` is the job's count: a process of another job can sit in its cgroup.

use std::path::Path;

use crate::host::gpu::GpuDevice;
use crate::manager::environ::job_environ_value;

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

/// The instances the first of `pids` that is job `uuid`'s own process makes visible to it
/// (LSF sets `CUDA_VISIBLE_DEVICES`, or `CUDA_VISIBLE_DEVICES1` for its second task family);
/// None when no such process can be read.
pub fn job_instances(procfs: &Path, uuid: &str, pids: &[u32]) -> Option<Vec<MigInstance>> {
    let vars = ["CUDA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES1"];
    job_environ_value(procfs, pids, "LSB_BATCH_JID", uuid, &vars).map(|v| visible_instances(&v))
}

/// The node's devices that are these instances (the compute instance is not a device of its
/// own: it shares its GPU instance).
pub fn devices_of<'a>(instances: &[MigInstance], devices: &'a [GpuDevice]) -> Vec<&'a GpuDevice> {
    devices
        .iter()
        .filter(|d| {
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
        let got = job_instances(tmp.path(), "42[2]", &[9, 10, 11]).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(
            (got[0].gpu_uuid.as_str(), got[0].gpu_instance),
            ("GPU-b", 1)
        );
        assert_eq!(job_instances(tmp.path(), "5", &[10, 11]), None);

        let mut devices: Vec<GpuDevice> = (0..3)
            .map(|i| GpuDevice::for_test(i, 0, Some(i as u32), 1.0 / 3.0))
            .collect();
        for d in &mut devices {
            d.uuid = "gpu-B".into();
        }
        let held = devices_of(&got, &devices);
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].gpu_instance_id, Some(1));
    }
}
