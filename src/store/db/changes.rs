//! What each of the last commits changed, so that `/units`' cache keeps what they left alone:
//! the updater commits a batch of jobs' aggregates every few hundred milliseconds while it
//! runs, and starting the whole cache over at each sent every request to the database.

use std::collections::VecDeque;
use std::sync::Arc;

/// Commits remembered; a cache further behind starts over.
const KEPT: usize = 256;
/// Units remembered over all of them (2 MiB): past it the oldest commits are forgotten first.
const KEPT_UNITS: usize = 256 * 1024;

/// The last commits, each with the generation it moved to.
#[derive(Debug, Default)]
pub struct ChangeLog {
    /// (generation after the commit, the units whose own row it changed; `None`: anything,
    /// such as jobs added or ended, whose spans change).
    commits: VecDeque<(u64, Option<Arc<[i64]>>)>,
    /// Of all of them.
    units: usize,
}

impl ChangeLog {
    pub fn push(&mut self, generation: u64, units: Option<Arc<[i64]>>) {
        self.units += units.as_ref().map_or(0, |u| u.len());
        self.commits.push_back((generation, units));
        while self.commits.len() > KEPT || (self.units > KEPT_UNITS && self.commits.len() > 1) {
            if let Some((_, Some(forgotten))) = self.commits.pop_front() {
                self.units -= forgotten.len();
            }
        }
    }

    /// The units changed by the commits after generation `from` up to `to`, when each of
    /// them changed only units' own rows and all are remembered; `None` otherwise.
    pub fn units_changed(&self, from: u64, to: u64) -> Option<Vec<i64>> {
        if from >= to {
            return Some(Vec::new());
        }
        // The commit that moved past `from` must still be here.
        if self.commits.front().is_none_or(|(g, _)| *g > from + 1) {
            return None;
        }
        let mut units = Vec::new();
        for (g, changed) in &self.commits {
            if *g <= from || *g > to {
                continue;
            }
            units.extend_from_slice(changed.as_deref()?);
        }
        Some(units)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_commits_that_changed_known_rows_are_followed() {
        let mut log = ChangeLog::default();
        log.push(1, Some(Arc::from([10, 11])));
        log.push(2, Some(Arc::from([12])));
        log.push(3, None);
        log.push(4, Some(Arc::from([13])));
        assert_eq!(log.units_changed(0, 2), Some(vec![10, 11, 12]));
        assert_eq!(log.units_changed(1, 2), Some(vec![12]));
        assert_eq!(log.units_changed(2, 2), Some(vec![]));
        // A job added or ended in between: the spans changed too.
        assert_eq!(log.units_changed(2, 4), None);
        assert_eq!(log.units_changed(3, 4), Some(vec![13]));
        // Forgotten commits are not guessed at.
        for g in 5..(5 + KEPT as u64) {
            log.push(g, Some(Arc::from([g as i64])));
        }
        assert_eq!(log.units_changed(3, 10), None);
        let last = 4 + KEPT as u64;
        assert_eq!(log.units_changed(last - 1, last), Some(vec![last as i64]));
    }

    #[test]
    fn the_units_remembered_are_bounded_whatever_the_commits() {
        let mut log = ChangeLog::default();
        // Three million jobs' rows rewritten in 600 commits of 5,000 units.
        for g in 1..=600u64 {
            log.push(g, Some(Arc::from(vec![g as i64; 5000])));
            assert!(log.units <= KEPT_UNITS, "{} units after {g}", log.units);
        }
        assert_eq!(log.units_changed(599, 600).map(|u| u.len()), Some(5000));
        assert_eq!(log.units_changed(500, 600), None);
    }
}
