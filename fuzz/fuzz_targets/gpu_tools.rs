#![no_main]
//! Fuzzes the GPU tools' parsers: nvidia-smi XML and vGPU text, rocm-smi CSV, amd-smi JSON, and the Slurm
//! GPU order map and gres.conf.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    use ceems::collect::gpu::{amd, nvidia_smi};
    use ceems::manager::slurm::gpu_env as jobs;
    let _ = nvidia_smi::parse(text);
    let _ = nvidia_smi::parse_vgpu_query(text);
    let _ = amd::parse_rocm_smi_csv(text);
    let _ = amd::parse_amd_smi_json(text);
    let _ = jobs::OrderMap::parse(text);
    let _ = jobs::parse_gres_conf(text, "n1");
    let _ = jobs::from_environ(data);
});
