//! `ceems stats-server`: jobs from Slurm's accounting into SQLite (:9020). This first part
//! ingests and serves `/health` and its own `/metrics`; the JSON API comes next.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{ArgMatches, Command};
use hyper::{Method, StatusCode};
use serde::Deserialize;

use crate::config::{self, Kind, LogConfig, Opt};
use crate::metrics::{Labels, MetricSet, TEXT_CONTENT_TYPE};
use crate::store::db::Store;
use crate::store::ingest::{self, Sacct};
use crate::web;

pub fn opts() -> Vec<Opt> {
    let mut opts = web::server_opts(":9020");
    opts.extend([
        Opt::new(
            "storage.data.path",
            Kind::Str,
            "Directory of the SQLite database (ceems.db)",
        )
        .default("/var/lib/ceems"),
        Opt::new(
            "storage.update-interval",
            Kind::Duration,
            "How often jobs are pulled from sacct",
        )
        .default("15m"),
        Opt::new(
            "storage.first-window",
            Kind::Duration,
            "How far back the first pull of an empty database looks",
        )
        .default("1d"),
        Opt::new("slurm.sacct.path", Kind::Str, "sacct command").default("sacct"),
        Opt::new(
            "slurm.sacct.timeout",
            Kind::Duration,
            "Kill sacct after this long",
        )
        .default("5m"),
        Opt::new(
            "slurm.cluster-id",
            Kind::Str,
            "Name of the cluster in the database",
        )
        .default("slurm-0"),
    ]);
    opts.extend(crate::security::opts());
    opts.extend(config::log_opts());
    opts
}

pub fn command() -> Command {
    config::build_command(
        Command::new("stats-server")
            .about("Pull jobs from sacct into SQLite; JSON API for Grafana (:9020)"),
        &opts(),
    )
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Storage {
    data: DataPath,
    #[serde(deserialize_with = "config::de_duration")]
    update_interval: Duration,
    #[serde(deserialize_with = "config::de_duration")]
    first_window: Duration,
}

#[derive(Debug, Deserialize)]
struct DataPath {
    path: std::path::PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct SlurmSettings {
    sacct: SacctSettings,
    cluster_id: String,
}

#[derive(Debug, Deserialize)]
struct SacctSettings {
    path: std::path::PathBuf,
    #[serde(deserialize_with = "config::de_duration")]
    timeout: Duration,
}

/// Counters of the ingestion, served on /metrics.
#[derive(Default)]
struct Stats {
    rows: AtomicU64,
    malformed: AtomicU64,
    failures: AtomicU64,
    last_success: AtomicU64,
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

pub fn run(matches: &ArgMatches) -> anyhow::Result<ExitCode> {
    let settings = config::load("stats-server", &opts(), matches)?;
    let log: LogConfig = settings.get("log")?;
    crate::log::init(&log)?;
    let listen: String = settings.get("web.listen-address")?;
    let storage: Storage = settings.get("storage")?;
    let slurm: SlurmSettings = settings.get("slurm")?;
    let listener = web::bind_std(&listen)?;
    let security: crate::security::SecuritySettings = settings.get("security")?;
    crate::security::drop_privileges(&security, &[])
        .context("cannot drop privileges (--security.drop-privileges=false to run as started)")?
        .log("stats-server");
    let options = web::ServeOptions::new(64)
        .with_security(web::toolkit::WebSecurity::from_settings(&settings)?);
    std::fs::create_dir_all(&storage.data.path)
        .with_context(|| format!("cannot create {}", storage.data.path.display()))?;
    let db_path = storage.data.path.join("ceems.db");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ceems-stats-server")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let store = Arc::new(
            Store::open(&db_path)
                .await
                .with_context(|| format!("cannot open {}", db_path.display()))?,
        );
        tracing::info!(db = %db_path.display(), cluster = %slurm.cluster_id, "stats-server started");
        let stats = Arc::new(Stats::default());
        let sacct = Sacct {
            path: slurm.sacct.path,
            timeout: slurm.sacct.timeout,
        };
        {
            let (store, stats, cluster) = (Arc::clone(&store), Arc::clone(&stats), slurm.cluster_id.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(storage.update_interval);
                loop {
                    tick.tick().await;
                    match ingest::ingest_once(&store, &cluster, &sacct, storage.first_window, unix_now()).await {
                        Ok(r) => {
                            stats.rows.fetch_add(r.rows as u64, Ordering::Relaxed);
                            stats.malformed.fetch_add(r.malformed as u64, Ordering::Relaxed);
                            stats.last_success.store(unix_now() as u64, Ordering::Relaxed);
                            tracing::info!(cluster = %cluster, rows = r.rows, malformed = r.malformed, "jobs ingested");
                        }
                        Err(e) => {
                            stats.failures.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(cluster = %cluster, error = %e, "ingestion failed; retrying at the next interval");
                        }
                    }
                }
            });
        }
        let listener = web::into_async(listener)
            .with_context(|| format!("cannot listen on {listen}"))?;
        tracing::info!(address = %listen, "listening");
        let cluster = slurm.cluster_id;
        let handler: web::Handler = Arc::new(move |req| {
            let stats = Arc::clone(&stats);
            let cluster = cluster.clone();
            Box::pin(async move {
                if req.method() != Method::GET {
                    return web::text_response(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
                }
                match req.uri().path() {
                    "/health" => web::text_response(StatusCode::OK, "OK\n"),
                    "/metrics" => {
                        let labels = Labels::new(&[("cluster_id", &cluster)]);
                        let mut set = MetricSet::new();
                        for (name, help, v) in [
                            ("ceems_stats_ingested_rows_total", "Job rows written from sacct", &stats.rows),
                            ("ceems_stats_sacct_malformed_lines_total", "sacct lines skipped as malformed", &stats.malformed),
                            ("ceems_stats_ingest_failures_total", "Ingestion runs that failed", &stats.failures),
                        ] {
                            set.counter(name, help, labels.clone(), v.load(Ordering::Relaxed) as f64);
                        }
                        set.gauge(
                            "ceems_stats_last_ingest_timestamp_seconds",
                            "When the last ingestion succeeded",
                            labels,
                            stats.last_success.load(Ordering::Relaxed) as f64,
                        );
                        let mut body = String::new();
                        set.encode_text(&mut body);
                        web::body_response(body, TEXT_CONTENT_TYPE, web::accepts_gzip(&req))
                    }
                    _ => web::text_response(StatusCode::NOT_FOUND, "not found (the JSON API is not implemented yet)\n"),
                }
            })
        });
        web::serve(listener, options, handler, web::shutdown_signal()).await;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}
