#![no_main]
//! Fuzzes what the stats-server reads from outside: sacct and sacctmgr output, and
//! Prometheus's instant and range answers.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    use ceems::store::{aggregate, report, sacct};
    let _ = sacct::parse_output(text);
    let _ = sacct::parse_associations(text);
    let _ = sacct::parse_tres(text);
    let _ = aggregate::parse_vector(text);
    let _ = report::parse_matrix(text);
});
