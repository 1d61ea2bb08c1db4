#![no_main]
//! Fuzzes what the stats-server reads from outside: sacct and sacctmgr output, and
//! Prometheus's instant and range answers.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    use ceems::manager::slurm::sacct;
    use ceems::store::prometheus;
    let _ = sacct::parse_output(text);
    let _ = sacct::parse_associations(text);
    let _ = sacct::parse_tres(text);
    let _ = prometheus::parse_vector(text);
    let _ = prometheus::parse_matrix(text);
});
