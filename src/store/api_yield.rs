//! The updater yields to the API. Its queries make the TSDB read a day of samples, work that
//! takes the same cores as the answers Grafana waits for (on a 2-core server running
//! VictoriaMetrics beside it, `/units` p99 at 200 connections: 11-12 ms while an update runs,
//! 7 ms idle). So each query first waits until the API has been quiet for a moment, at most a
//! bound: a dashboard's burst delays the update a little, a flood slows it without stopping it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The API is busy while a request is in flight or one ended less than this long ago.
const QUIET: Duration = Duration::from_millis(20);
/// How often a waiting query looks again.
const POLL: Duration = Duration::from_millis(5);

/// Requests in flight, when the API last answered, and how long the updater waited for it.
#[derive(Debug)]
pub struct ApiActivity {
    started: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds after `started` of the last request's start or end, plus one (0: none yet).
    last_request_ms: AtomicU64,
    yielded_ms: AtomicU64,
}

impl Default for ApiActivity {
    fn default() -> Self {
        ApiActivity {
            started: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_request_ms: AtomicU64::new(0),
            yielded_ms: AtomicU64::new(0),
        }
    }
}

/// A request being answered; the API is busy until a moment after it is dropped.
pub struct Request<'a>(&'a ApiActivity);

impl Drop for Request<'_> {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ApiActivity {
    /// Notes a request to the API, in flight until the returned value is dropped (called by
    /// its handler, so cheap: a few atomic operations).
    pub fn request(&self) -> Request<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.touch();
        Request(self)
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64 + 1
    }

    fn touch(&self) {
        self.last_request_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    fn busy(&self) -> bool {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return true;
        }
        match self.last_request_ms.load(Ordering::Relaxed) {
            0 => false,
            last => self.now_ms().saturating_sub(last) < QUIET.as_millis() as u64,
        }
    }

    /// Waits while the API is busy, at most `at_most`; returns how long it waited.
    pub async fn until_quiet(&self, at_most: Duration) -> Duration {
        let began = Instant::now();
        while self.busy() && began.elapsed() < at_most {
            tokio::time::sleep(POLL.min(at_most.saturating_sub(began.elapsed()))).await;
        }
        let waited = began.elapsed();
        self.yielded_ms
            .fetch_add(waited.as_millis() as u64, Ordering::Relaxed);
        waited
    }

    /// How long queries have waited for the API in all, since start.
    pub fn yielded(&self) -> Duration {
        Duration::from_millis(self.yielded_ms.load(Ordering::Relaxed))
    }
}

/// What an update's queries yield to: the API's activity, and the most one query waits.
#[derive(Debug, Clone)]
pub struct YieldTo {
    pub api: std::sync::Arc<ApiActivity>,
    pub at_most: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_query_goes_at_once_when_the_api_is_quiet_and_a_moment_after_a_request() {
        let api = ApiActivity::default();
        let at_most = Duration::from_secs(5);
        assert!(api.until_quiet(at_most).await < QUIET);
        drop(api.request());
        let waited = api.until_quiet(at_most).await;
        assert!(waited >= QUIET - Duration::from_millis(2), "{waited:?}");
        assert!(waited < at_most, "{waited:?}");
    }

    #[tokio::test]
    async fn a_request_in_flight_holds_a_query_for_its_bound_only() {
        let api = ApiActivity::default();
        let report = api.request();
        let at_most = Duration::from_millis(60);
        let waited = api.until_quiet(at_most).await;
        assert!(
            waited >= at_most && waited < Duration::from_secs(5),
            "{waited:?}"
        );
        drop(report);
        assert!(api.yielded() >= at_most);
    }
}
