#![no_main]
//! Fuzzes the sinfo and squeue record parsers.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = ceems::collect::slurm_cluster::parse_nodes(text);
    let _ = ceems::collect::slurm_cluster::parse_jobs(text);
});
