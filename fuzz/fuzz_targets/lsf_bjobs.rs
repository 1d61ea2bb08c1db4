#![no_main]
//! Fuzzes what LSF tells the exporter: `bjobs -json` documents and job cgroup names.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = ceems::manager::lsf::bjobs::parse(text, "node1");
    let _ = ceems::manager::lsf::bjobs::job_of_cgroup(text);
});
