#![no_main]
//! Fuzzes what the Redfish collector reads from BMC documents: every extractor on any JSON.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    use ceems::collect::redfish::model;
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let _ = model::service_root(&doc);
    let _ = model::chassis_collection(&doc);
    let _ = model::chassis(&doc);
    let _ = model::power(&doc);
    let _ = model::environment_power(&doc);
    let _ = model::power_supplies(&doc);
    let _ = model::collection(&doc);
    let _ = model::supply_metrics(&doc);
    let _ = model::supply_input_power(&doc);
});
