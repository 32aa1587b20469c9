//! Where the server's store calls run. A bot's run calls the store a few times (its window, a
//! retrieve or two, its reflection's write) and waits on each; an operator's call (a review of
//! every scope, a sweep, an import, the stats behind `/metrics`) reads far more and is not
//! waited on by a run. Each kind has its own blocking threads, so however long an operator's
//! call takes, a run's call never queues behind it for a thread. (`/export` streams from a
//! thread of its own, at a lower CPU priority: see `handler`.)
//!
//! **Invariant:** the runtime's blocking pool has exactly the lanes' threads, and a call holds
//! its lane's permit until its closure returns (not until its caller stops waiting), so a lane
//! never has more calls running than it has threads.

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::contract::PostRoute;

/// Which threads a store call runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// What a bot's run calls, and the page's reads of one scope.
    Run,
    /// What an operator calls now and then, reading every scope or a whole journal.
    Operator,
}

impl Lane {
    /// The lane of each route, declared here only.
    pub(crate) const fn of(route: PostRoute) -> Lane {
        match route {
            PostRoute::Retrieve
            | PostRoute::Write
            | PostRoute::List
            | PostRoute::Forget
            | PostRoute::Get
            | PostRoute::Scopes
            | PostRoute::Context
            | PostRoute::Prompt
            | PostRoute::Reflect
            | PostRoute::Window
            | PostRoute::Count => Lane::Run,
            PostRoute::Sweep
            | PostRoute::Export
            | PostRoute::Import
            | PostRoute::Stats
            | PostRoute::Journal
            | PostRoute::Review => Lane::Operator,
        }
    }
}

/// A run's store calls at once: a few per core. More only oversubscribe the cores (a run's
/// calls are CPU and fsync, not waiting), which measured as a longer latency tail.
const RUN_THREADS: usize = 3;

/// An operator's store calls at once: one, so they take at most one core from the runs.
const OPERATOR_THREADS: usize = 1;

/// The runtime's blocking pool: every lane's threads.
pub(crate) const BLOCKING_THREADS: usize = RUN_THREADS + OPERATOR_THREADS;

/// The lanes' permits: a permit held is one of that lane's threads taken.
pub(crate) struct Lanes {
    run: Arc<Semaphore>,
    operator: Arc<Semaphore>,
}

impl Lanes {
    pub(crate) fn new() -> Lanes {
        Lanes {
            run: Arc::new(Semaphore::new(RUN_THREADS)),
            operator: Arc::new(Semaphore::new(OPERATOR_THREADS)),
        }
    }

    /// Runs `work` on a blocking thread of `lane`, once the lane has one free. `None`: the
    /// call was cancelled (the runtime is shutting down).
    pub(crate) async fn call<T: Send + 'static>(
        &self,
        lane: Lane,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let permits = match lane {
            Lane::Run => &self.run,
            Lane::Operator => &self.operator,
        };
        let permit = Arc::clone(permits).acquire_owned().await.ok()?;
        tokio::task::spawn_blocking(move || {
            let answer = work();
            drop(permit);
            answer
        })
        .await
        .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[test]
    fn a_run_call_is_answered_while_the_operator_lane_is_busy_and_operator_calls_take_turns() {
        let runtime = crate::server::runtime().expect("runtime");
        runtime.block_on(async {
            let lanes = Arc::new(Lanes::new());
            let (release, held) = std::sync::mpsc::channel::<()>();
            let first = tokio::spawn({
                let lanes = Arc::clone(&lanes);
                async move {
                    lanes
                        .call(Lane::Operator, move || held.recv().is_ok())
                        .await
                }
            });
            // Let the first operator call take its thread.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let second_ran = Arc::new(AtomicBool::new(false));
            let second = tokio::spawn({
                let lanes = Arc::clone(&lanes);
                let ran = Arc::clone(&second_ran);
                async move {
                    lanes
                        .call(Lane::Operator, move || ran.store(true, Ordering::SeqCst))
                        .await
                }
            });
            // Every run call is answered while the operator's call holds its thread, more of
            // them than the run lane has threads.
            let runs: Vec<_> = (0..4 * RUN_THREADS)
                .map(|i| {
                    let lanes = Arc::clone(&lanes);
                    tokio::spawn(async move { lanes.call(Lane::Run, move || i * 2).await })
                })
                .collect();
            for (i, run) in runs.into_iter().enumerate() {
                let answer = tokio::time::timeout(Duration::from_secs(10), run)
                    .await
                    .expect("a run call is answered beside a busy operator lane")
                    .expect("joined");
                assert_eq!(answer, Some(i * 2));
            }
            assert!(
                !second_ran.load(Ordering::SeqCst),
                "a second operator call waits for the first"
            );
            release.send(()).expect("release");
            assert_eq!(first.await.expect("joined"), Some(true));
            assert_eq!(second.await.expect("joined"), Some(()));
            assert!(second_ran.load(Ordering::SeqCst));
        });
    }
}
