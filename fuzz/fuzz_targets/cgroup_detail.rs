#![no_main]
//! Fuzzes the per-core, blkio and diskstats parsers and the job properties file parser.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    use ceems::host::cgroup::detail;
    let _ = detail::percpu(text);
    let _ = detail::blkio_throttle(text);
    let _ = detail::diskstats_names(text);
    let _ = ceems::manager::slurm::props::parse_props_file(text);
});
