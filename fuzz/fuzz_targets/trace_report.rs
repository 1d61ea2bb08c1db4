#![no_main]
//! Fuzzes the job trace report parser: a report or an error, never a panic.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ceems::collect::trace::parse_report(data);
});
