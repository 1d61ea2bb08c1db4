//! What the running jobs used, from Prometheus, asked in batches as the updater asks: one
//! query per batch of jobs that share a window, whatever the number of jobs.

use std::collections::HashMap;

use crate::store::prometheus::{PromError, Prometheus};

/// A job asked about: its id and the window (seconds, back from now) of the question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub uuid: String,
    pub window: i64,
    /// The window is the job's whole life so far: its series start with it, so a longer range
    /// asks the same question. A window shorter than the life (a trailing one) is asked as is.
    pub whole_life: bool,
}

/// The answers to one template, by job: one value per series (per device), and the queries
/// it took.
#[derive(Debug, Default)]
pub struct Answers {
    pub by_uuid: HashMap<String, Vec<f64>>,
    pub queries: usize,
}

/// Whole-life windows are rounded up to a whole minute, so jobs started close together share
/// a query.
const WINDOW_STEP: i64 = 60;

/// Asks `template` (`$uuids`, `$range`) about `asks` at `now`, `batch` jobs a query: jobs
/// asked over their whole life sorted by window, each batch with the longest of its jobs';
/// the others grouped by their own window.
pub fn ask(
    prometheus: &dyn Prometheus,
    template: &str,
    asks: &[Ask],
    batch: usize,
    now: i64,
) -> Result<Answers, PromError> {
    let mut lives: Vec<&Ask> = asks.iter().filter(|a| a.whole_life).collect();
    lives.sort_by_key(|a| a.window);
    let mut by_window: std::collections::BTreeMap<i64, Vec<&Ask>> = Default::default();
    for a in asks.iter().filter(|a| !a.whole_life) {
        by_window.entry(a.window.max(1)).or_default().push(a);
    }
    let mut groups: Vec<(i64, &[&Ask])> = lives
        .chunks(batch.max(1))
        .map(|chunk| {
            let longest = chunk.iter().map(|a| a.window).max().unwrap_or(0).max(1);
            let window = (longest + WINDOW_STEP - 1) / WINDOW_STEP * WINDOW_STEP;
            (window, chunk)
        })
        .collect();
    for (window, jobs) in &by_window {
        groups.extend(jobs.chunks(batch.max(1)).map(|chunk| (*window, chunk)));
    }
    let mut answers = Answers::default();
    for (window, chunk) in groups {
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
                whole_life: true,
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

    #[test]
    fn trailing_windows_are_each_asked_over_their_own_span() {
        let asks: Vec<Ask> = [("1", 600), ("2", 1200), ("3", 600)]
            .iter()
            .map(|(id, w)| Ask {
                uuid: (*id).into(),
                window: *w,
                whole_life: false,
            })
            .collect();
        let p = Recorder(Mutex::new(Vec::new()));
        let a = ask(&p, r#"increase(x{uuid=~"$uuids"}[$range])"#, &asks, 100, 0).unwrap();
        assert_eq!(a.queries, 2);
        let sent = p.0.lock().unwrap();
        assert!(
            sent[0].contains("1|3") && sent[0].ends_with("[600s])"),
            "{}",
            sent[0]
        );
        assert!(
            sent[1].contains("\"2\"") && sent[1].ends_with("[1200s])"),
            "{}",
            sent[1]
        );
    }
}
