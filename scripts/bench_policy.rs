//! One store of JOBS running GPU jobs (half of them idle) and two policy cycles over it,
//! reading their series from the Prometheus-compatible store at URL: each cycle's wall time,
//! the queries it sent and the decisions it took. Run by `scripts/bench-policy.sh`.
//!   bench-policy JOBS URL DIR NOW

use std::sync::Arc;
use std::time::Instant;

use ceems::manager::{
    Accounting, AccountingError, Allocation, Associations, UnitRecord, UnitRecords,
};
use ceems::policy::{Engine, Target};
use ceems::store::db::Store;
use ceems::store::prometheus::{HttpPrometheus, Prometheus};

/// A manager the dry run never asks.
struct Unasked;

impl Accounting for Unasked {
    fn manager(&self) -> &'static str {
        "slurm"
    }
    fn units_since(&self, _: i64) -> Result<UnitRecords, AccountingError> {
        Ok(Box::new(std::iter::empty()))
    }
    fn unit(&self, _: &str) -> Result<UnitRecords, AccountingError> {
        Ok(Box::new(std::iter::empty()))
    }
    fn associations(
        &self,
    ) -> Option<Result<(Associations, Vec<ceems::host::ParseError>), AccountingError>> {
        None
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() == 5, "usage: bench-policy JOBS URL DIR NOW");
    let jobs: usize = args[1].parse()?;
    let (url, dir, now): (&str, &str, i64) = (&args[2], &args[3], args[4].parse()?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = Store::open(&std::path::Path::new(dir).join("ceems.db")).await?;
        store.register_cluster("bench", "slurm").await?;
        let records: Vec<UnitRecord> = (0..jobs)
            .map(|i| UnitRecord {
                uuid: (1_000_000 + i).to_string(),
                partition: "gpu".into(),
                qos: "normal".into(),
                account: format!("p{}", i % 50),
                user: format!("u{}", i % 500),
                start: Some(now - 7200),
                submit: Some(now - 7300),
                state: "RUNNING".into(),
                allocation: Allocation { cpus: 8, mem_bytes: 64 << 30, gpus: 1, billing: 8, nodes: 1 },
                nodes: vec![format!("gpu{:04}", i / 4)],
                name: "train".into(),
                ..UnitRecord::default()
            })
            .collect();
        store.ingest("bench", &records, now, now).await?;
        let policies = ceems::policy::config::parse(toml::Value::Array(vec![toml::Value::Table(
            "name = \"idle-gpus\"\nwarn-after = [\"1h\"]\ncancel-after = \"\"\ndry-run = true\n".parse()?,
        )]))
        .map_err(anyhow::Error::msg)?;
        let engine = Engine {
            policies,
            mailer: None,
            base_url: "http://bench".into(),
            batch: 1000,
            cost_queries: (
                r#"sum by (uuid) (avg_over_time(uuid:ceems_host_power_watts:pue{uuid=~"$uuids"}[$range]))"#.into(),
                String::new(),
                r#"sum by (uuid) (avg_over_time(uuid:ceems_host_emissions_g_s:pue{uuid=~"$uuids"}[$range]))"#.into(),
            ),
            max_attempts: 3,
        };
        let target = Target {
            id: "bench".into(),
            accounting: Arc::new(Unasked),
            prometheus: Some(Arc::new(HttpPrometheus::new(url, std::time::Duration::from_secs(120))) as Arc<dyn Prometheus>),
        };
        for (n, at) in [(1, now), (2, now + 60)] {
            let began = Instant::now();
            let c = engine.cycle(&store, &target, at).await?;
            println!(
                "jobs={jobs} cycle={n}: {:.2} s, {} queries, {} decisions, {} watched, {} without data",
                began.elapsed().as_secs_f64(),
                c.queries,
                c.dry_run,
                c.watched,
                c.no_data
            );
        }
        Ok(())
    })
}
