#![no_main]
//! Fuzzes what Kubernetes tells ceems: pod-resources answers (protobuf), pod lists and watch
//! events (JSON), RoleBindings, quantities and RFC 3339 times.

use libfuzzer_sys::fuzz_target;
use prost::Message;

use ceems::manager::k8s::{accounting, api, pod, podresources};

fuzz_target!(|data: &[u8]| {
    if let Ok(answer) = podresources::ListPodResourcesResponse::decode(data) {
        let pods = podresources::pod_devices(&answer);
        let _ = ceems::manager::k8s::share_devices(&pods, &Default::default(), &[]);
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = api::parse_pod_list(text);
    let _ = accounting::parse_bindings(text);
    let mut store = accounting::PodStore::default();
    let _ = store.apply_list(text, 0);
    for line in text.lines() {
        let _ = store.apply_event(line, 0);
    }
    let policy = pod::PodPolicy::default();
    let _ = store.records(&policy, 3600, 0).count();
    let _ = pod::parse_quantity(text);
    let _ = ceems::manager::civil::parse_rfc3339(text);
});
