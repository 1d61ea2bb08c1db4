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
    // Crates that log through `log` come along, except aya's loader (it warns about the
    // eBPF object's per-task map, which the loader is told to accept) and ureq's request
    // lines, whose headers carry tokens it does not mask (OpenStack's `X-Auth-Token`).
    let _ = tracing_log::LogTracer::builder()
        .ignore_crate("aya::bpf")
        .ignore_crate("ureq::unit")
        .init();
    let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer));
    Ok(())
}

/// One kind of event that can come in bursts (requests refused under load): the first of a
/// window is logged at once, those that follow only counted, so a burst writes one line per
/// window and the count instead of one line per event.
#[derive(Debug)]
pub struct RepeatedEvent {
    pub window: std::time::Duration,
    /// The events counted since the window's first, logged or not; None: no window open.
    counted: std::sync::Mutex<Option<u64>>,
}

impl RepeatedEvent {
    pub const fn new(window: std::time::Duration) -> RepeatedEvent {
        RepeatedEvent {
            window,
            counted: std::sync::Mutex::new(None),
        }
    }

    /// Counts one event; true when it opens a window: the caller logs it, and calls
    /// [`RepeatedEvent::close`] once `window` has passed.
    pub fn opens_window(&self) -> bool {
        let mut counted = self.counted.lock().unwrap_or_else(|p| p.into_inner());
        match counted.as_mut() {
            Some(n) => {
                *n += 1;
                false
            }
            None => {
                *counted = Some(0);
                true
            }
        }
    }

    /// Ends the window: how many events followed its first (not logged yet).
    pub fn close(&self) -> u64 {
        let mut counted = self.counted.lock().unwrap_or_else(|p| p.into_inner());
        counted.take().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_one_logged_event_and_a_count() {
        let refused = RepeatedEvent::new(std::time::Duration::from_secs(10));
        assert!(refused.opens_window());
        let logged = (0..999).filter(|_| refused.opens_window()).count();
        assert_eq!(logged, 0, "events inside the window were logged");
        assert_eq!(refused.close(), 999);
        // The next burst opens a new window.
        assert!(refused.opens_window());
        assert_eq!(refused.close(), 0);
        assert_eq!(refused.close(), 0);
    }
}
