#![no_main]
//! Fuzzes the sysfs InfiniBand parsers (port state, rate, counters): any input must give a
//! value or an error, never a panic.

use ceems::collect::infiniband::{parse_counter, parse_rate, parse_state};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = parse_state(text);
    let _ = parse_rate(text);
    let _ = parse_counter(text);
});
