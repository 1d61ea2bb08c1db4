//! The `rdma` tool's outputs and the rdma controller's `rdma.current`.
#![no_main]

use ceems::host::cgroup::parse::rdma_current;
use ceems::host::rdma::{qp_counters, qp_modes, resources, ResourceKind};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for kind in [
        ResourceKind::MemoryRegion,
        ResourceKind::CompletionQueue,
        ResourceKind::QueuePair,
    ] {
        let _ = resources(text, kind);
    }
    let _ = qp_modes(text);
    let _ = qp_counters(text);
    let _ = rdma_current(text);
});
