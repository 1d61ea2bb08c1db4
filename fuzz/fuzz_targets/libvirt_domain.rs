#![no_main]
//! Fuzzes libvirt's domain XML and VM cgroup directory names.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    use ceems::manager::libvirt::domain;
    let _ = domain::parse(text);
    let _ = domain::name_of_cgroup(text);
});
