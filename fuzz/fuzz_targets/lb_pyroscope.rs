#![no_main]
//! Fuzzes what `ceems lb` reads from a Pyroscope call: the protobuf or Connect JSON message of
//! each method a user may call, and the label selectors in it.

use ceems::lb::pyroscope::{asked, scope, Call, Encoding};
use libfuzzer_sys::fuzz_target;

/// The PromQL parser panics on some number literals (an upstream bug); `lb::query` catches
/// that panic, as the server must. libFuzzer's panic hook aborts even on a caught panic, so the
/// default hook is put back: a panic nothing catches still aborts the run.
static CAUGHT_PANICS_ARE_FINE: std::sync::Once = std::sync::Once::new();

fuzz_target!(|data: &[u8]| {
    CAUGHT_PANICS_ARE_FINE.call_once(|| drop(std::panic::take_hook()));
    for call in [
        Call::SelectMergeStacktraces,
        Call::LabelNames,
        Call::LabelValues,
    ] {
        for encoding in [Encoding::Proto, Encoding::Json] {
            if let Ok(a) = asked(call, encoding, data) {
                let _ = scope(&a);
            }
        }
    }
    if let Ok(selector) = std::str::from_utf8(data) {
        let _ = ceems::lb::query::scope_of_labelled_selector(selector, "service_name");
    }
});
