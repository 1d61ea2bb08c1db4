#![no_main]
//! Fuzzes the Redfish proxy target entries and the path allow-list.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = ceems::proxy::Targets::parse(&[text.to_owned()]);
    let _ = ceems::proxy::AllowList::defaults().allows(text);
});
