#![no_main]
//! Fuzzes what the stats-server reads from outside: sacct and sacctmgr output, slurmrestd's
//! answers, and Prometheus's instant and range answers.

use libfuzzer_sys::fuzz_target;

struct NoIds;

impl ceems::manager::slurm::rest_json::NameIds for NoIds {
    fn uid(&mut self, _: &str) -> Option<u32> {
        None
    }
    fn gid(&mut self, _: &str) -> Option<u32> {
        None
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    use ceems::manager::slurm::sacct;
    use ceems::store::prometheus;
    let _ = sacct::parse_output(text);
    let _ = sacct::parse_associations(text);
    let _ = sacct::parse_tres(text);
    let _ = ceems::manager::slurm::rest_json::parse_jobs(text, &mut NoIds);
    let _ = ceems::manager::slurm::rest_json::parse_associations(text);
    let _ = prometheus::parse_vector(text);
    let _ = prometheus::parse_matrix(text);
});
