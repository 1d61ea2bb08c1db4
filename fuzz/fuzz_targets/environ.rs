#![no_main]
//! Fuzzes the environ parser: any input must give a value or an error, never a panic.

use ceems::host::procfs;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = procfs::slurm_job_id(data);
    let _ = procfs::environ_var(data, "SLURM_JOB_ID");
});
