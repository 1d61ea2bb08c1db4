#![no_main]
//! Fuzzes the pressure parser: any input must give a value or an error, never a panic.

use ceems::host::cgroup::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = parse::pressure(text);
});
