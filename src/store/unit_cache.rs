//! What `/api/v1/units` keeps between requests, valid while the store's generation is
//! unchanged (every write bumps it): each user's jobs as time spans, each job rendered as
//! JSON, and whole answers by the jobs in them.
//!
//! Grafana moves `from`/`to` at every refresh, so requests rarely repeat while the jobs they
//! select do. Selecting a user's jobs from these spans costs a scan of a few thousand
//! integers; SQLite costs a read transaction and a row per job, and rendering far more.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::api::Answer;

/// Most bytes kept (spans, rendered jobs, answers) unless the server is told otherwise.
pub const BUDGET_BYTES: usize = 24 << 20;
/// What a kept entry costs beyond its JSON or spans (its key, the map's slot, the
/// allocation's header), so that the budget is what the process holds.
const ENTRY_BYTES: usize = 64;
/// A user with more jobs than this is not kept as spans: their windows go to SQLite's index.
pub const MAX_SPANS_PER_USER: usize = 200_000;

/// A user's jobs as kept.
#[derive(Debug, Clone, PartialEq)]
pub enum UserSpans {
    Kept(Arc<[JobSpan]>),
    /// More than `MAX_SPANS_PER_USER`.
    TooMany,
}

/// A job's life, as `/units` selects by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobSpan {
    pub id: i64,
    /// 0 while pending.
    pub started_at: i64,
    /// `i64::MAX` while not ended.
    pub ended_at: i64,
    /// Not ended and in state RUNNING.
    pub running: bool,
}

/// The ids of the jobs among `spans` that ended in `from..=to`, or, with `running`, that are
/// running (CEEMS's window); newest start first, at most `limit`. The same selection as the
/// API's SQL (`Sql::push_ended_in`).
pub fn select<'a>(
    spans: impl IntoIterator<Item = &'a JobSpan>,
    from: i64,
    to: i64,
    running: bool,
    limit: usize,
) -> Vec<i64> {
    let mut hits: Vec<(i64, i64)> = spans
        .into_iter()
        .filter(|s| s.ended_at >= from && (s.ended_at <= to || (running && s.running)))
        .map(|s| (s.started_at, s.id))
        .collect();
    hits.sort_unstable_by(|a, b| b.cmp(a));
    hits.truncate(limit);
    hits.into_iter().map(|(_, id)| id).collect()
}

/// A job rendered as a JSON object.
pub type Rendered = Arc<str>;

pub struct UnitCache {
    inner: RwLock<Inner>,
    budget: Budget,
}

/// Bytes the cache may hold.
#[derive(Debug, Clone, Copy)]
struct Budget {
    /// Of the spans and rendered jobs.
    kept: usize,
    /// Of the answers. Past it only the answers start over: they are made again from the
    /// rendered jobs without the database, while starting the whole cache over sent every
    /// request in flight to it at once (SQLite, 200 connections, a moving window: a pause of
    /// 200-300 ms every few seconds).
    answers: usize,
}

impl Default for UnitCache {
    fn default() -> UnitCache {
        UnitCache::with_budget(BUDGET_BYTES)
    }
}

#[derive(Default)]
struct Inner {
    generation: u64,
    /// Of the spans and rendered jobs.
    bytes: usize,
    answer_bytes: usize,
    /// Each user's jobs.
    spans: HashMap<String, UserSpans>,
    /// Each job's JSON object by field set.
    rows: HashMap<(u64, i64), Rendered>,
    /// Whole answers by field set and the ids of their jobs, in order.
    answers: HashMap<(u64, Box<[i64]>), Answer>,
    /// Bytes let go since the heap was last trimmed.
    dropped: usize,
}

impl Inner {
    /// Makes room for `size` more bytes of spans or rendered jobs, starting over past their
    /// share of the budget; false when this cache is newer than `generation` and must not
    /// take what was read before it.
    fn admit(&mut self, budget: Budget, generation: u64, size: usize) -> bool {
        if generation < self.generation || size > budget.kept {
            return false;
        }
        if generation > self.generation || self.bytes + size > budget.kept {
            *self = Inner {
                generation,
                dropped: self.dropped + self.bytes + self.answer_bytes,
                ..Default::default()
            };
        }
        self.bytes += size;
        true
    }

    /// The same for an answer: past the answers' share, only they start over.
    fn admit_answer(&mut self, budget: Budget, generation: u64, size: usize) -> bool {
        if size > budget.answers || !self.admit(budget, generation, 0) {
            return false;
        }
        if self.answer_bytes + size > budget.answers {
            self.answers.clear();
            self.dropped += self.answer_bytes;
            self.answer_bytes = 0;
        }
        self.answer_bytes += size;
        true
    }
}

impl UnitCache {
    /// A cache of at most `bytes`, a quarter of it for whole answers; 0 keeps nothing.
    pub fn with_budget(bytes: usize) -> UnitCache {
        UnitCache {
            inner: Default::default(),
            budget: Budget {
                kept: bytes - bytes / 4,
                answers: bytes / 4,
            },
        }
    }

    /// Moves the cache to `generation`, keeping what the commits since did not change:
    /// `changed(from)` names the units whose own rows they changed when nothing else changed
    /// (an update's aggregates), `None` otherwise (then the cache starts over at the next
    /// admission, as before). Those units' rendered rows and the answers that hold them go.
    pub fn catch_up(&self, generation: u64, changed: impl FnOnce(u64) -> Option<Vec<i64>>) {
        let from = match self.inner.read() {
            Ok(inner) if inner.generation < generation => inner.generation,
            _ => return,
        };
        let Some(units) = changed(from) else {
            return;
        };
        let Ok(mut inner) = self.inner.write() else {
            return;
        };
        // Another request moved it meanwhile.
        if inner.generation != from {
            return;
        }
        let units: std::collections::HashSet<i64> = units.into_iter().collect();
        let mut freed = 0;
        inner.rows.retain(|(_, id), json| {
            let keep = !units.contains(id);
            if !keep {
                freed += ENTRY_BYTES + json.len();
            }
            keep
        });
        let mut answers_freed = 0;
        inner.answers.retain(|(_, ids), answer| {
            let keep = !ids.iter().any(|id| units.contains(id));
            if !keep {
                answers_freed += ENTRY_BYTES + answer.body.len() + ids.len() * 8;
            }
            keep
        });
        inner.bytes = inner.bytes.saturating_sub(freed);
        inner.answer_bytes = inner.answer_bytes.saturating_sub(answers_freed);
        inner.generation = generation;
    }

    fn read(&self, generation: u64) -> Option<std::sync::RwLockReadGuard<'_, Inner>> {
        self.inner
            .read()
            .ok()
            .filter(|inner| inner.generation == generation)
    }

    /// Once a quarter of the budget has been let go, hands the freed pages back: rendered
    /// jobs and answers are allocated on whichever thread answered, and glibc keeps each
    /// thread's freed pages apart (3,000,000 jobs, each user's first request: 153 MiB, 124
    /// MiB with this).
    fn trim_after(&self, mut inner: std::sync::RwLockWriteGuard<'_, Inner>) {
        if inner.dropped < (self.budget.kept + self.budget.answers) / 4 || inner.dropped == 0 {
            return;
        }
        inner.dropped = 0;
        drop(inner);
        crate::host::heap::hand_back_freed();
    }

    /// Bytes held, as counted against the budget.
    pub fn held(&self) -> usize {
        self.inner
            .read()
            .map_or(0, |inner| inner.bytes + inner.answer_bytes)
    }

    pub fn spans(&self, generation: u64, user: &str) -> Option<UserSpans> {
        self.read(generation)?.spans.get(user).cloned()
    }

    pub fn keep_spans(&self, generation: u64, user: &str, spans: UserSpans) {
        let size = ENTRY_BYTES
            + user.len()
            + match &spans {
                UserSpans::Kept(s) => std::mem::size_of_val(&**s),
                UserSpans::TooMany => 0,
            };
        if let Ok(mut inner) = self.inner.write() {
            if inner.admit(self.budget, generation, size) {
                inner.spans.insert(user.to_owned(), spans);
            }
            self.trim_after(inner);
        }
    }

    pub fn answer(&self, generation: u64, fields: u64, ids: &[i64]) -> Option<Answer> {
        self.read(generation)?
            .answers
            .get(&(fields, Box::from(ids)))
            .cloned()
    }

    /// The rendered jobs of `ids`, in order, `None` where not kept.
    pub fn rows(&self, generation: u64, fields: u64, ids: &[i64]) -> Vec<Option<Rendered>> {
        match self.read(generation) {
            Some(inner) => ids
                .iter()
                .map(|id| inner.rows.get(&(fields, *id)).cloned())
                .collect(),
            None => vec![None; ids.len()],
        }
    }

    /// Keeps newly rendered jobs and the answer made of `ids`.
    pub fn keep_answer(
        &self,
        generation: u64,
        fields: u64,
        rendered: &HashMap<i64, Rendered>,
        ids: Vec<i64>,
        answer: &Answer,
    ) {
        let Ok(mut inner) = self.inner.write() else {
            return;
        };
        for (id, json) in rendered {
            if inner.admit(self.budget, generation, ENTRY_BYTES + json.len()) {
                inner.rows.insert((fields, *id), json.clone());
            }
        }
        let size = ENTRY_BYTES + answer.body.len() + ids.len() * 8;
        if inner.admit_answer(self.budget, generation, size) {
            inner
                .answers
                .insert((fields, ids.into_boxed_slice()), answer.clone());
        }
        self.trim_after(inner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn ok(body: Bytes) -> Answer {
        Answer::new(hyper::StatusCode::OK, body)
    }

    fn span(id: i64, started_at: i64, ended_at: Option<i64>, running: bool) -> JobSpan {
        JobSpan {
            id,
            started_at,
            ended_at: ended_at.unwrap_or(i64::MAX),
            running,
        }
    }

    #[test]
    fn a_window_selects_the_jobs_that_ended_in_it_newest_first() {
        let spans = [
            span(1, 100, Some(200), false),
            span(2, 150, None, true),
            span(3, 300, Some(400), false),
            span(4, 0, None, false),  // pending
            span(5, 500, None, true), // started after the window
        ];
        // Both ends count: a job that ended as the window begins or ends is in it.
        assert_eq!(select(&spans, 200, 400, false, 10), vec![3, 1]);
        assert_eq!(select(&spans, 201, 399, false, 10), Vec::<i64>::new());
        assert_eq!(select(&spans, 0, 1000, false, 10), vec![3, 1]);
        // `running` adds the running jobs whenever they started, not the pending one.
        assert_eq!(select(&spans, 401, 450, true, 10), vec![5, 2]);
        assert_eq!(select(&spans, 0, 1000, true, 3), vec![5, 3, 2]);
    }

    #[test]
    fn a_write_empties_the_cache_and_an_older_read_does_not_refill_it() {
        let cache = UnitCache::default();
        let spans = UserSpans::Kept(Arc::from(vec![span(1, 1, None, true)]));
        cache.keep_spans(1, "alice", spans.clone());
        assert_eq!(cache.spans(1, "alice"), Some(spans.clone()));
        assert!(cache.spans(2, "alice").is_none());
        cache.keep_spans(2, "bob", spans.clone());
        assert!(
            cache.spans(2, "alice").is_none(),
            "generation 1 survived a write"
        );
        // A request that read at generation 1 finishes after generation 2 was kept.
        cache.keep_spans(1, "carol", spans.clone());
        assert!(cache.spans(1, "carol").is_none());
        assert!(cache.spans(2, "bob").is_some());
    }

    #[test]
    fn an_update_of_some_jobs_drops_only_them_and_the_answers_that_hold_them() {
        let cache = UnitCache::default();
        let spans = UserSpans::Kept(Arc::from(vec![span(7, 1, None, true)]));
        cache.keep_spans(3, "alice", spans.clone());
        let rendered = HashMap::from([
            (7, Rendered::from(r#"{"uuid":"7"}"#)),
            (8, Rendered::from(r#"{"uuid":"8"}"#)),
        ]);
        cache.keep_answer(
            3,
            1,
            &rendered,
            vec![7, 8],
            &ok(Bytes::from_static(b"both")),
        );
        cache.keep_answer(3, 1, &rendered, vec![8], &ok(Bytes::from_static(b"eight")));
        cache.catch_up(5, |from| {
            assert_eq!(from, 3);
            Some(vec![7])
        });
        assert_eq!(
            cache.rows(5, 1, &[7, 8]),
            vec![None, rendered.get(&8).cloned()]
        );
        assert_eq!(cache.answer(5, 1, &[7, 8]), None);
        assert_eq!(
            cache.answer(5, 1, &[8]),
            Some(ok(Bytes::from_static(b"eight")))
        );
        assert_eq!(cache.spans(5, "alice"), Some(spans));
        // Already there: not asked again.
        cache.catch_up(5, |_| panic!("asked for no change"));
        // A commit that changed more than rows: nothing of generation 5 is served at 6.
        cache.catch_up(6, |_| None);
        assert_eq!(cache.rows(6, 1, &[8]), vec![None]);
        assert!(cache.spans(6, "alice").is_none());
    }

    #[test]
    fn answers_are_told_apart_by_fields_and_jobs() {
        let cache = UnitCache::default();
        let rendered = HashMap::from([(7, Rendered::from(r#"{"uuid":"7"}"#))]);
        cache.keep_answer(
            3,
            0b1,
            &rendered,
            vec![7],
            &ok(Bytes::from_static(b"seven")),
        );
        assert_eq!(
            cache.answer(3, 0b1, &[7]),
            Some(ok(Bytes::from_static(b"seven")))
        );
        assert_eq!(cache.answer(3, 0b11, &[7]), None);
        assert_eq!(cache.answer(3, 0b1, &[7, 8]), None);
        assert_eq!(
            cache.rows(3, 0b1, &[8, 7]),
            vec![None, rendered.get(&7).cloned()]
        );
        assert_eq!(cache.rows(3, 0b10, &[7]), vec![None]);
    }

    #[test]
    fn past_the_budget_the_cache_starts_over() {
        let cache = UnitCache::default();
        let spans = UserSpans::Kept(Arc::from(vec![span(1, 1, None, true)]));
        cache.keep_spans(1, "alice", spans);
        let big = Rendered::from("x".repeat(BUDGET_BYTES / 4));
        for id in 0..4 {
            cache.keep_answer(
                1,
                1,
                &HashMap::from([(id, big.clone())]),
                vec![],
                &ok(Bytes::new()),
            );
        }
        let kept = (0..4)
            .filter(|i| cache.rows(1, 1, &[*i])[0].is_some())
            .count();
        assert!(
            kept < 4 && cache.rows(1, 1, &[3])[0].is_some(),
            "{kept} kept"
        );
        assert!(
            cache.spans(1, "alice").is_none(),
            "the spans outlived a start over"
        );
    }

    #[test]
    fn answers_past_their_share_start_over_without_the_jobs_they_were_made_of() {
        let cache = UnitCache::default();
        let spans = UserSpans::Kept(Arc::from(vec![span(1, 1, None, true)]));
        cache.keep_spans(1, "alice", spans.clone());
        let row = HashMap::from([(1, Rendered::from(r#"{"uuid":"1"}"#))]);
        let big = ok(Bytes::from(vec![b'x'; BUDGET_BYTES / 8]));
        for ids in 0..5 {
            cache.keep_answer(1, 1, &row, vec![ids], &big);
        }
        let kept = (0..5)
            .filter(|i| cache.answer(1, 1, &[*i]).is_some())
            .count();
        assert!(
            kept < 5 && cache.answer(1, 1, &[4]).is_some(),
            "{kept} kept"
        );
        assert_eq!(cache.spans(1, "alice"), Some(spans));
        assert_eq!(cache.rows(1, 1, &[1]), vec![row.get(&1).cloned()]);
        // An answer larger than the answers' share is not kept.
        let huge = ok(Bytes::from(vec![b'x'; BUDGET_BYTES / 4 + 1]));
        cache.keep_answer(1, 1, &row, vec![9], &huge);
        assert_eq!(cache.answer(1, 1, &[9]), None);
    }

    #[test]
    fn a_site_s_budget_bounds_what_is_kept_and_zero_keeps_nothing() {
        let budget = 1 << 20;
        let cache = UnitCache::with_budget(budget);
        let job = Rendered::from("x".repeat(700));
        for id in 0..10_000i64 {
            cache.keep_spans(
                1,
                &format!("user{id}"),
                UserSpans::Kept(Arc::from(vec![span(id, 1, None, true)])),
            );
            let rendered = HashMap::from([(id, job.clone())]);
            cache.keep_answer(1, 1, &rendered, vec![id], &ok(Bytes::from(vec![b'y'; 900])));
            assert!(cache.held() <= budget, "{} bytes held", cache.held());
        }
        // What is kept is served: the last job is there.
        assert!(cache.rows(1, 1, &[9_999])[0].is_some());

        let none = UnitCache::with_budget(0);
        none.keep_spans(
            1,
            "alice",
            UserSpans::Kept(Arc::from(vec![span(1, 1, None, true)])),
        );
        none.keep_answer(1, 1, &HashMap::from([(1, job)]), vec![1], &ok(Bytes::new()));
        assert_eq!(none.held(), 0);
        assert!(none.spans(1, "alice").is_none());
        assert_eq!(none.answer(1, 1, &[1]), None);
    }
}
