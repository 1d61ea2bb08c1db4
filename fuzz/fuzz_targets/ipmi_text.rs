#![no_main]
//! Fuzzes the parsers of the IPMI tools' text: the DCMI power reading of ipmi-dcmi / ipmitool
//! / ipmiutil, and the sensor listings of ipmitool and ipmi-sensors. A reading or an error,
//! never a panic.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = ceems::collect::ipmi::parse::text(text);
    let _ = ceems::collect::ipmi::sensors::parse_listing(text);
});
