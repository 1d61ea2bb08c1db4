//! What the site's rules cost the findings pass: JOBS ended jobs with their aggregates in a
//! SQLite store, judged again three times by the built-in findings alone, then with three
//! site rules (CEL) beside them. Prints each pass's wall time and the cost per job per rule.
//! Run by `scripts/bench-rules.sh`.
//!   bench-rules JOBS DIR

use std::time::Instant;

use ceems::manager::{Allocation, UnitRecord};
use ceems::store::db::Store;
use ceems::store::findings::Thresholds;
use ceems::store::rules::SiteRules;
use ceems::store::sql::Sql;

const RULES: &str = r#"
[[r]]
id = "short_gpu_job"
when = "job.alloc_gpus > 0 && job.ended && job.elapsed_seconds < 600"
message = "It held {job.alloc_gpus} GPU(s) for {human_duration(job.elapsed_seconds)}."
[[r]]
id = "gpu_partition_without_gpu"
when = "job.partition == 'gpu' && job.alloc_gpus == 0"
message = "It ran on the GPU partition without a GPU ({job.alloc_cpus} cores)."
[[r]]
id = "peak_far_below_request"
severity = "info"
when = "job.ended && job.memory_use_percent < 10.0 && job.alloc_mem_bytes > 8589934592"
message = "Its memory peaked at {human_bytes(job.memory_peak_bytes)}."
advice = "Ask for `{memory_request(job.memory_peak_bytes * 1.25)}` next time."
"#;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() == 3, "usage: bench-rules JOBS DIR");
    let jobs: usize = args[1].parse()?;
    let dir = std::path::Path::new(&args[2]);
    let now = 1_800_000_000i64;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = Store::open(&dir.join("ceems.db")).await?;
        store.register_cluster("bench", "slurm").await?;
        let records: Vec<UnitRecord> = (0..jobs)
            .map(|i| UnitRecord {
                uuid: (1_000_000 + i).to_string(),
                partition: if i % 3 == 0 { "gpu" } else { "cpu" }.into(),
                user: format!("u{}", i % 500),
                start: Some(now - 7200),
                submit: Some(now - 7300),
                end: Some(now - 7200 + 300 + (i % 6600) as i64),
                elapsed_seconds: 300 + (i % 6600) as u64,
                state: "COMPLETED".into(),
                allocation: Allocation { cpus: 8, mem_bytes: 64 << 30, gpus: (i % 2) as u64, billing: 8, nodes: 1 },
                nodes: vec![format!("n{:04}", i / 4)],
                time_limit_seconds: Some(86400),
                name: "job".into(),
                ..UnitRecord::default()
            })
            .collect();
        store.ingest("bench", &records, now, now).await?;
        store
            .execute(&Sql::new(
                "UPDATE units SET aggregated_seconds = elapsed_seconds, cpu_seconds = 2 * elapsed_seconds,
                        memory_peak_bytes = 4294967296, measured = 1, aggregates_status = 'done'",
            ))
            .await?;
        let table: toml::Table = RULES.parse()?;
        let rules = SiteRules::parse(table["r"].clone(), None)?;
        let t = Thresholds::default();
        let pass = |name: &'static str, rules: SiteRules| {
            let store = &store;
            let t = &t;
            async move {
                let mut best = f64::MAX;
                for _ in 0..3 {
                    let began = Instant::now();
                    let n = store
                        .rejudge_findings("bench", t, &rules, (0, now), now)
                        .await?;
                    anyhow::ensure!(n == jobs, "judged {n} of {jobs}");
                    best = best.min(began.elapsed().as_secs_f64());
                }
                println!("{name:<28} {jobs:>8} jobs  {best:>7.3} s  {:>6.2} us/job", 1e6 * best / jobs as f64);
                Ok::<f64, anyhow::Error>(best)
            }
        };
        let alone = pass("built-in findings", SiteRules::default()).await?;
        let with = pass("with 3 site rules", rules).await?;
        println!(
            "site rules: {:.2} us per job per rule; the pass {:.2}x the built-in one",
            1e6 * (with - alone) / jobs as f64 / 3.0,
            with / alone
        );
        Ok(())
    })
}
