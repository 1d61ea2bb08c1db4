#![no_main]
//! Fuzzes what LSF tells the stats-server: `bacct -l` long-format records, `bjobs -json`
//! documents of every user's jobs, and the times both print.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = ceems::manager::lsf::bacct::parse_bacct(text);
    let _ = ceems::manager::lsf::bacct::parse_bjobs(text);
    let _ = ceems::manager::lsf::bacct::parse_time(text);
});
