#![no_main]
//! Fuzzes the DCMI Get Power Reading and LAN address response decoders of native IPMI mode.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ceems::collect::ipmi::native::decode_power_response(data);
    let _ = ceems::collect::ipmi::native::decode_lan_ip(data);
});
