#![no_main]
//! Fuzzes the Cray pm_counters file-name classifier and value parser.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = ceems::collect::cray_pm_counters::classify(text);
    let _ = ceems::collect::cray_pm_counters::counter_value(text);
    let _ = ceems::collect::hwmon::split_sensor_file(text);
});
