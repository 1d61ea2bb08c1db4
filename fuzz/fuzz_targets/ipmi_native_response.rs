#![no_main]
//! Fuzzes the native IPMI mode's response decoders: DCMI Get Power Reading, the LAN address,
//! a sensor data record, and a Get Sensor Reading answer for the record it decoded.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ceems::collect::ipmi::native::decode_power_response(data);
    let _ = ceems::collect::ipmi::native::decode_lan_ip(data);
    let (record, reading) = data.split_at(data.len().saturating_sub(4));
    if let Ok(Some(r)) = ceems::collect::ipmi::sdr::decode_record(record) {
        let _ = ceems::collect::ipmi::sdr::decode_reading(&r, reading);
    }
});
