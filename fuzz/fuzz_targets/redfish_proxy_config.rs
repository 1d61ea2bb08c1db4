//! CEEMS's redfish_proxy YAML file and the networks it lists.
#![no_main]

use ceems::config::redfish_proxy_yaml::to_table;
use ceems::proxy::networks;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = to_table(text);
    let _ = networks(&text.split(',').map(str::to_owned).collect::<Vec<_>>());
});
