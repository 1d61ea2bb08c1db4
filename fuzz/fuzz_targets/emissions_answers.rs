#![no_main]
//! Fuzzes the emission providers answer parsers and the OWID table parser.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    use ceems::collect::emissions::{remote, tables};
    let _ = tables::owid_rows(text);
    if let Ok(doc) = serde_json::from_str::<serde_json::Value>(text) {
        let _ = remote::parse_rte(&doc);
        let _ = remote::parse_emaps(&doc);
        let _ = remote::parse_watttime(&doc);
    }
});
