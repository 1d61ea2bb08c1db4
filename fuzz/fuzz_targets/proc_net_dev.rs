#![no_main]
//! Fuzzes the /proc/net/dev parser: any input must give devices or an error, never a panic.

use ceems::collect::netdev::parse_net_dev;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = parse_net_dev(text);
});
