//! One read shared by every caller that asks while it has not started yet.
//!
//! Each API request on PostgreSQL reads the database's generation before anything else, so
//! that no cached answer is older than the last commit of any server. At hundreds of requests
//! at once, one read per request is most of an answer's cost. A caller here waits for the
//! next read to start after it asked, never for one already under way: the value it gets is
//! at least as new as what was committed when it asked, as if it had read alone.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

pub struct SharedRead<T> {
    state: Mutex<Waiting<T>>,
}

struct Waiting<T> {
    /// A task is reading or about to: it takes `callers` before each read.
    reading: bool,
    callers: Vec<oneshot::Sender<T>>,
}

impl<T> Default for SharedRead<T> {
    fn default() -> Self {
        SharedRead {
            state: Mutex::new(Waiting {
                reading: false,
                callers: Vec::new(),
            }),
        }
    }
}

impl<T: Clone + Send + 'static> SharedRead<T> {
    /// The value of a `read` that started after this call. None only if that read's task
    /// died (it panicked, or the runtime is shutting down).
    pub async fn read<F, Fut>(self: &Arc<Self>, read: F) -> Option<T>
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
    {
        let (answer, wait) = oneshot::channel();
        let start = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.callers.push(answer);
            !std::mem::replace(&mut state.reading, true)
        };
        if start {
            // On a task of its own: a caller that gives up (a closed connection) does not
            // leave the others waiting.
            tokio::spawn(Arc::clone(self).serve(read));
        }
        wait.await.ok()
    }

    /// Reads until nobody waits: each round answers the callers who asked before it began.
    async fn serve<F, Fut>(self: Arc<Self>, read: F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = T>,
    {
        let mut unstick = Unstick {
            shared: &self,
            armed: true,
        };
        loop {
            let round = {
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                if state.callers.is_empty() {
                    state.reading = false;
                    unstick.armed = false;
                    return;
                }
                std::mem::take(&mut state.callers)
            };
            let value = read().await;
            for caller in round {
                // A caller that gave up no longer listens.
                let _ = caller.send(value.clone());
            }
        }
    }
}

/// A read that panicked, or a runtime that shut down, ends the reading task early: its
/// callers are answered None, and the next caller starts a task of its own instead of
/// waiting for one that is gone.
struct Unstick<'a, T> {
    shared: &'a SharedRead<T>,
    armed: bool,
}

impl<T> Drop for Unstick<'_, T> {
    fn drop(&mut self) {
        if self.armed {
            let mut state = self
                .shared
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            state.reading = false;
            state.callers.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    /// A database whose generation moves on at every commit, read slowly.
    #[derive(Default)]
    struct Database {
        generation: AtomicU64,
        reads: AtomicU64,
    }

    impl Database {
        async fn read(self: Arc<Self>) -> u64 {
            self.reads.fetch_add(1, Ordering::SeqCst);
            let seen = self.generation.load(Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            seen
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn every_caller_sees_what_was_committed_before_it_asked_and_callers_share_reads() {
        let db = Arc::new(Database::default());
        let shared = Arc::new(SharedRead::default());
        let mut callers = Vec::new();
        for i in 0..400u64 {
            let (db, shared) = (Arc::clone(&db), Arc::clone(&shared));
            callers.push(tokio::spawn(async move {
                if i % 20 == 0 {
                    db.generation.fetch_add(1, Ordering::SeqCst);
                }
                let committed = db.generation.load(Ordering::SeqCst);
                let reader = Arc::clone(&db);
                let seen = shared
                    .read(move || Arc::clone(&reader).read())
                    .await
                    .expect("the read's task lives");
                assert!(seen >= committed, "saw {seen}, {committed} was committed");
                if i % 50 == 0 {
                    tokio::time::sleep(Duration::from_millis(7)).await;
                }
            }));
        }
        for c in callers {
            c.await.unwrap();
        }
        let reads = db.reads.load(Ordering::SeqCst);
        assert!(
            (1..100).contains(&reads),
            "{reads} reads for 400 callers: not shared"
        );
        // Once nobody waits, the next caller starts a read of its own.
        db.generation.fetch_add(1, Ordering::SeqCst);
        let latest = db.generation.load(Ordering::SeqCst);
        let reader = Arc::clone(&db);
        assert_eq!(
            shared.read(move || Arc::clone(&reader).read()).await,
            Some(latest)
        );
    }

    #[tokio::test]
    async fn a_caller_that_gives_up_does_not_stall_the_others() {
        let db = Arc::new(Database::default());
        let shared = Arc::new(SharedRead::default());
        let reader = Arc::clone(&db);
        let gave_up = tokio::time::timeout(
            Duration::from_millis(1),
            shared.read(move || Arc::clone(&reader).read()),
        )
        .await;
        assert!(gave_up.is_err(), "a 5 ms read answered within 1 ms");
        let reader = Arc::clone(&db);
        assert_eq!(
            tokio::time::timeout(
                Duration::from_secs(5),
                shared.read(move || Arc::clone(&reader).read())
            )
            .await
            .expect("answered"),
            Some(0)
        );
    }

    #[tokio::test]
    async fn a_read_that_panics_answers_none_and_the_next_caller_reads_again() {
        let shared = Arc::new(SharedRead::<u64>::default());
        let broken = shared.read(|| async { panic!("the driver broke") }).await;
        assert_eq!(broken, None);
        let answer = tokio::time::timeout(Duration::from_secs(5), shared.read(|| async { 7 }))
            .await
            .expect("not left waiting for the task that panicked");
        assert_eq!(answer, Some(7));
    }
}
