#![no_main]
//! Fuzzes the /proc/<pid>/stat parser: a value or an error, never a panic.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = ceems::host::procfs::pid_stat(text);
});
