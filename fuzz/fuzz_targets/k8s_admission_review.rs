#![no_main]
//! Fuzzes the admission webhook's review parser and decision: any body is answered with a
//! review or a named error, never a panic; an answer is JSON with the request's verdict.

use libfuzzer_sys::fuzz_target;

use ceems::manager::k8s::admission::{review, Hook};

fuzz_target!(|data: &[u8]| {
    for hook in [Hook::Mutate, Hook::Validate] {
        if let Ok(answer) = review(data, hook) {
            let v: serde_json::Value =
                serde_json::from_str(&answer.body).expect("the answer is JSON");
            assert!(v["response"]["allowed"].is_boolean());
        }
    }
});
