#![no_main]
//! Fuzzes what `ceems lb` reads from a request: its URL and form parameters, the PromQL or
//! selectors in them, unit-id patterns, and the answers it filters labels out of.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (head, body) = data.split_at(data.len() / 2);
    let url = String::from_utf8_lossy(head);
    let form = Some("application/x-www-form-urlencoded");
    if let Ok(params) = ceems::lb::parameters(Some(&url), form, body) {
        for endpoint in [ceems::lb::Endpoint::Query, ceems::lb::Endpoint::Series] {
            let _ = ceems::lb::requested_scope(endpoint, &params);
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = ceems::lb::query::literal_alternatives(text);
        let _ = ceems::lb::endpoint(text);
        let _ = ceems::lb::filter_answer("/api/v1/query", data, &["hostname".to_owned()]);
        let _ = ceems::lb::filter_answer("/api/v1/label/x/values", data, &["x".to_owned()]);
    }
});
