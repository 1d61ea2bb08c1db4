//! Logging through tracing, in logfmt or JSON, to stderr (journald picks it up under systemd).

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

use crate::config::LogConfig;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("unknown log level `{0}` (expected debug, info, warn or error)")]
    Level(String),
    #[error("unknown log format `{0}` (expected logfmt or json)")]
    Format(String),
}

fn level(s: &str) -> Result<LevelFilter, LogError> {
    Ok(match s {
        "debug" => LevelFilter::DEBUG,
        "info" => LevelFilter::INFO,
        "warn" => LevelFilter::WARN,
        "error" => LevelFilter::ERROR,
        other => return Err(LogError::Level(other.to_owned())),
    })
}

/// Installs the global subscriber. Calling it twice keeps the first one.
pub fn init(cfg: &LogConfig) -> Result<(), LogError> {
    let filter = level(&cfg.level)?;
    let layer = match cfg.format.as_str() {
        "logfmt" => tracing_logfmt::builder()
            .with_span_name(false)
            .with_span_path(false)
            .layer()
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
        "json" => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
        other => return Err(LogError::Format(other.to_owned())),
    };
    // Crates that log through `log` come along, except aya's loader: it warns about the
    // eBPF object's per-task map, which the loader is told to accept.
    let _ = tracing_log::LogTracer::builder()
        .ignore_crate("aya::bpf")
        .init();
    let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer));
    Ok(())
}
