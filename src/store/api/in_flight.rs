//! Identical requests answered once: when a commit moves the generation, every dashboard
//! panel asking the same question misses the cache at once, and each made the answer again
//! (200 connections, one user: 200 renderings of the same jobs every few hundred
//! milliseconds while the updater commits). A request that finds the same question, at the
//! same generation, being answered waits for that answer instead.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tokio::sync::oneshot;

/// A question being answered: the generation it was read at, and who waits for it.
type Flight<T> = (u64, Vec<oneshot::Sender<T>>);

/// Answers being made, by request key.
pub struct InFlight<T> {
    flights: Mutex<HashMap<String, Flight<T>>>,
}

impl<T> Default for InFlight<T> {
    fn default() -> Self {
        InFlight {
            flights: Mutex::new(HashMap::new()),
        }
    }
}

/// What a request does about its question.
pub enum Turn<'a, T> {
    /// Makes the answer, and hands it to those who wait through [`Leader::finish`].
    Lead(Leader<'a, T>),
    /// Waits for the answer being made; an error means its maker gave up: make it then.
    Wait(oneshot::Receiver<T>),
    /// The same question is being answered at another generation: answer alone.
    Alone,
}

impl<T: Clone> InFlight<T> {
    pub fn join(&self, key: &str, generation: u64) -> Turn<'_, T> {
        let mut flights = self.flights.lock().unwrap_or_else(PoisonError::into_inner);
        match flights.get_mut(key) {
            Some((g, waiting)) if *g == generation => {
                let (tx, rx) = oneshot::channel();
                waiting.push(tx);
                Turn::Wait(rx)
            }
            Some(_) => Turn::Alone,
            None => {
                flights.insert(key.to_owned(), (generation, Vec::new()));
                Turn::Lead(Leader {
                    flights: self,
                    key: key.to_owned(),
                    generation,
                })
            }
        }
    }
}

impl<T> InFlight<T> {
    fn take(&self, key: &str, generation: u64) -> Vec<oneshot::Sender<T>> {
        let mut flights = self.flights.lock().unwrap_or_else(PoisonError::into_inner);
        match flights.get(key) {
            Some((g, _)) if *g == generation => flights
                .remove(key)
                .map(|(_, waiting)| waiting)
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }
}

/// The request that makes an answer. Dropped without finishing (its client went away), it
/// lets those waiting go and make the answer themselves.
pub struct Leader<'a, T> {
    flights: &'a InFlight<T>,
    key: String,
    generation: u64,
}

impl<T: Clone> Leader<'_, T> {
    pub fn finish(self, answer: &T) {
        for waiting in self.flights.take(&self.key, self.generation) {
            // One that gave up no longer listens.
            let _ = waiting.send(answer.clone());
        }
    }
}

impl<T> Drop for Leader<'_, T> {
    fn drop(&mut self) {
        // After `finish` there is nothing left to take.
        drop(self.flights.take(&self.key, self.generation));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_question_at_the_same_generation_is_answered_once() {
        let flights = InFlight::<u32>::default();
        let Turn::Lead(leader) = flights.join("alice /units", 7) else {
            panic!("the first asker leads");
        };
        let Turn::Wait(mut second) = flights.join("alice /units", 7) else {
            panic!("the second waits");
        };
        assert!(matches!(flights.join("alice /units", 8), Turn::Alone));
        assert!(matches!(flights.join("bob /units", 7), Turn::Lead(_)));
        leader.finish(&42);
        assert_eq!(second.try_recv(), Ok(42));
        // Done: the next asker leads again.
        assert!(matches!(flights.join("alice /units", 7), Turn::Lead(_)));
    }

    #[test]
    fn a_leader_that_gives_up_lets_the_others_go() {
        let flights = InFlight::<u32>::default();
        let leader = flights.join("k", 1);
        let Turn::Wait(mut waiting) = flights.join("k", 1) else {
            panic!("the second waits");
        };
        drop(leader);
        assert!(waiting.try_recv().is_err());
        assert!(matches!(flights.join("k", 1), Turn::Lead(_)));
    }
}
