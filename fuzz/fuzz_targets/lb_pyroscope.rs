#![no_main]
//! Fuzzes what `ceems lb` reads from a Pyroscope call: the protobuf or Connect JSON message of
//! each method a user may call, and the label selectors in it.

use ceems::lb::pyroscope::{asked, scope, Call, Encoding};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for call in [Call::SelectMergeStacktraces, Call::LabelNames, Call::LabelValues] {
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
