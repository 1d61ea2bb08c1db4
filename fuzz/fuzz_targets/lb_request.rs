#![no_main]
//! Fuzzes what `ceems lb` reads from a request: its URL and form parameters, the PromQL or
//! selectors in them and how far back they read, times, unit-id patterns, and the answers it
//! filters labels out of.

use libfuzzer_sys::fuzz_target;

/// The PromQL parser panics on some number literals (an upstream bug); `lb::query` catches
/// that panic, as the server must. libFuzzer's panic hook aborts even on a caught panic, so the
/// default hook is put back: a panic nothing catches still aborts the run.
static CAUGHT_PANICS_ARE_FINE: std::sync::Once = std::sync::Once::new();

fuzz_target!(|data: &[u8]| {
    CAUGHT_PANICS_ARE_FINE.call_once(|| drop(std::panic::take_hook()));
    let (head, body) = data.split_at(data.len() / 2);
    let url = String::from_utf8_lossy(head);
    let form = Some("application/x-www-form-urlencoded");
    if let Ok(params) = ceems::lb::parameters(Some(&url), form, body) {
        for endpoint in [ceems::lb::Endpoint::Query, ceems::lb::Endpoint::Series] {
            let _ = ceems::lb::requested_scope(endpoint, &params);
        }
        let window = ceems::lb::window::Window {
            start: 1000.0,
            end: Some(2000.0),
            others: vec![(3000.0, None)],
        };
        for path in ["/api/v1/query", "/api/v1/query_range", "/api/v1/series"] {
            let reach = ceems::lb::requested_scope(ceems::lb::Endpoint::Query, &params)
                .map(|s| s.reach)
                .unwrap_or_default();
            let _ = ceems::lb::window::fit_prometheus(&window, path, &params, &reach, 2500.0);
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = ceems::lb::query::literal_alternatives(text);
        let _ = ceems::lb::query::reach_of_query(text);
        let _ = ceems::lb::window::parse_time(text);
        let _ = ceems::lb::endpoint(text);
        let _ = ceems::lb::filter_answer("/api/v1/query", data, &["hostname".to_owned()]);
        let _ = ceems::lb::filter_answer("/api/v1/label/x/values", data, &["x".to_owned()]);
    }
});
