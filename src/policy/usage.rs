//! What the running jobs used, from Prometheus, asked in batches as the updater asks: one
//! query per batch of jobs that share a window, whatever the number of jobs.

use std::collections::HashMap;

use crate::store::prometheus::{PromError, Prometheus};

/// A job asked about: its id and the window (seconds, back from now) of the question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub uuid: String,
    pub window: i64,
}

/// The answers to one template, by job: one value per series (per device), and the queries
/// it took.
#[derive(Debug, Default)]
pub struct Answers {
    pub by_uuid: HashMap<String, Vec<f64>>,
    pub queries: usize,
}

/// Windows are rounded up to a whole minute, so jobs started close together share a query.
const WINDOW_STEP: i64 = 60;

/// Asks `template` (`$uuids`, `$range`) about `asks` at `now`: jobs sorted by window, `batch`
/// at a time, each batch with the longest window of its jobs. A job's series start with it,
/// so a longer range than its own adds nothing of another job's.
pub fn ask(
    prometheus: &dyn Prometheus,
    template: &str,
    asks: &[Ask],
    batch: usize,
    now: i64,
) -> Result<Answers, PromError> {
    let mut sorted: Vec<&Ask> = asks.iter().collect();
    sorted.sort_by_key(|a| a.window);
    let mut answers = Answers::default();
    for chunk in sorted.chunks(batch.max(1)) {
        let window = chunk.iter().map(|a| a.window).max().unwrap_or(0).max(1);
        let window = (window + WINDOW_STEP - 1) / WINDOW_STEP * WINDOW_STEP;
        let uuids: Vec<&str> = chunk.iter().map(|a| a.uuid.as_str()).collect();
        let promql = crate::store::aggregate::render(template, &uuids, window);
        answers.queries += 1;
        for (uuid, value) in prometheus.query(&promql, now)? {
            answers.by_uuid.entry(uuid).or_default().push(value);
        }
    }
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Answers each job's figure and keeps the queries.
    struct Recorder(Mutex<Vec<String>>);

    impl Prometheus for Recorder {
        fn query(&self, promql: &str, _at: i64) -> Result<Vec<(String, f64)>, PromError> {
            self.0.lock().unwrap().push(promql.to_owned());
            let ids = promql.split('"').nth(1).unwrap_or_default();
            Ok(ids
                .split('|')
                .map(|id| (id.replace("\\\\", ""), 0.0))
                .collect())
        }
    }

    #[test]
    fn jobs_are_asked_in_batches_sorted_by_window() {
        let asks: Vec<Ask> = (0..250)
            .map(|i| Ask {
                uuid: i.to_string(),
                window: 3600 + i * 10,
            })
            .collect();
        let p = Recorder(Mutex::new(Vec::new()));
        let a = ask(
            &p,
            r#"avg_over_time(x{uuid=~"$uuids"}[$range])"#,
            &asks,
            100,
            0,
        )
        .unwrap();
        assert_eq!(a.queries, 3);
        assert_eq!(a.by_uuid.len(), 250);
        let sent = p.0.lock().unwrap();
        // The first batch's longest window, 3600 + 99 × 10 s, rounded up to the minute.
        assert!(sent[0].ends_with("[4620s])"), "{}", sent[0]);
        assert!(sent[2].contains("|249\""), "{}", sent[2]);
    }
}
