//! Where the server's store calls run. A bot's run calls the store a few times (its window, a
//! retrieve or two, its reflection's write) and waits on each; an operator's call (a review of
//! every scope, a sweep, an import, the stats behind `/metrics`) reads far more and is not
//! waited on by a run. Each kind has its own blocking threads, so however long an operator's
//! call takes, a run's call never queues behind it for a thread. (`/export` streams from a
//! thread of its own, at a lower CPU priority: see `handler`.)
//!
//! A run's reads and its writes each take at most all but one of the run threads. A write
//! holds its thread while it waits for its fsync, and a disk whose cache flush stalls (seconds,
//! on a virtual disk: an fsync by another process stalls as long) would otherwise hold every
//! run thread, and the windows and retrieves that need none of the disk would wait as long.
//! Reads are CPU only, and more of them at once than 3 only oversubscribe the cores.
//!
//! **Invariant:** the runtime's blocking pool has exactly the lanes' threads, and a call holds
//! its lane's permit until its closure returns (not until its caller stops waiting), so a lane
//! never has more calls running than it has threads.
//! **Invariant:** reads and writes each hold at most `RUN_THREADS - 1` run threads, so a read
//! never waits for a thread behind writes (nor a write behind reads).

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::contract::PostRoute;

/// Which threads a store call runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// What a bot's run reads, and the page's reads of one scope.
    Read,
    /// What a bot's run writes: on a run thread, never on the last one free.
    Write,
    /// What an operator calls now and then, reading every scope or a whole journal.
    Operator,
}

impl Lane {
    /// The lane of each route, declared here only.
    pub(crate) const fn of(route: PostRoute) -> Lane {
        match route {
            PostRoute::Retrieve
            | PostRoute::List
            | PostRoute::Get
            | PostRoute::Scopes
            | PostRoute::Context
            | PostRoute::Prompt
            | PostRoute::Window
            | PostRoute::Count => Lane::Read,
            PostRoute::Write | PostRoute::Forget | PostRoute::Reflect => Lane::Write,
            PostRoute::Sweep
            | PostRoute::Export
            | PostRoute::Import
            | PostRoute::Stats
            | PostRoute::Journal
            | PostRoute::Review => Lane::Operator,
        }
    }
}

/// The threads a run's calls run on.
const RUN_THREADS: usize = 4;

/// A run's reads at once: a few per core. More only oversubscribe the cores (a read is CPU,
/// not waiting), which lengthens the latency tail.
const READ_THREADS: usize = 3;

/// A run's writes at once: every run thread but one, kept for reads.
const WRITE_THREADS: usize = RUN_THREADS - 1;

/// An operator's store calls at once: one, so they take at most one core from the runs.
const OPERATOR_THREADS: usize = 1;

/// The runtime's blocking pool: every lane's threads.
pub(crate) const BLOCKING_THREADS: usize = RUN_THREADS + OPERATOR_THREADS;

/// The lanes' permits: a permit held is one of that lane's threads taken.
pub(crate) struct Lanes {
    run: Arc<Semaphore>,
    /// Of the run threads, those reads may hold.
    reads: Arc<Semaphore>,
    /// Of the run threads, those writes may hold.
    writes: Arc<Semaphore>,
    operator: Arc<Semaphore>,
}

impl Lanes {
    pub(crate) fn new() -> Lanes {
        Lanes {
            run: Arc::new(Semaphore::new(RUN_THREADS)),
            reads: Arc::new(Semaphore::new(READ_THREADS)),
            writes: Arc::new(Semaphore::new(WRITE_THREADS)),
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
        // A write takes its write permit before its thread, so it never holds a thread while
        // it waits for the permit.
        let share = match lane {
            Lane::Read => Some(Arc::clone(&self.reads).acquire_owned().await.ok()?),
            Lane::Write => Some(Arc::clone(&self.writes).acquire_owned().await.ok()?),
            Lane::Operator => None,
        };
        let threads = match lane {
            Lane::Read | Lane::Write => &self.run,
            Lane::Operator => &self.operator,
        };
        let thread = Arc::clone(threads).acquire_owned().await.ok()?;
        tokio::task::spawn_blocking(move || {
            let answer = work();
            drop(thread);
            drop(share);
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

    /// A held call: what releases it, and its answer.
    type Held = (
        std::sync::mpsc::Sender<()>,
        tokio::task::JoinHandle<Option<bool>>,
    );

    /// Starts a call on `lane` that holds its thread until `release` receives; the call
    /// answers `true` once released.
    fn hold(lanes: &Arc<Lanes>, lane: Lane) -> Held {
        let (release, held) = std::sync::mpsc::channel::<()>();
        let lanes = Arc::clone(lanes);
        let call = tokio::spawn(async move { lanes.call(lane, move || held.recv().is_ok()).await });
        (release, call)
    }

    /// Releases every held call and checks each answered once released.
    async fn release_all(held: Vec<Held>) {
        for (release, call) in held {
            release.send(()).expect("release");
            assert_eq!(call.await.expect("joined"), Some(true));
        }
    }

    /// Starts a call on `lane` that marks `ran`.
    fn mark(
        lanes: &Arc<Lanes>,
        lane: Lane,
        ran: &Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<Option<()>> {
        let lanes = Arc::clone(lanes);
        let ran = Arc::clone(ran);
        tokio::spawn(async move {
            lanes
                .call(lane, move || ran.store(true, Ordering::SeqCst))
                .await
        })
    }

    #[test]
    fn a_read_is_answered_while_writes_hold_all_they_may_and_an_operator_call_its_thread() {
        let runtime = crate::server::runtime().expect("runtime");
        runtime.block_on(async {
            let lanes = Arc::new(Lanes::new());
            let mut held = vec![hold(&lanes, Lane::Operator)];
            for _ in 0..WRITE_THREADS {
                held.push(hold(&lanes, Lane::Write));
            }
            // Let the held calls take their threads.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let operator_ran = Arc::new(AtomicBool::new(false));
            let write_ran = Arc::new(AtomicBool::new(false));
            let second_operator = mark(&lanes, Lane::Operator, &operator_ran);
            let further_write = mark(&lanes, Lane::Write, &write_ran);
            tokio::time::sleep(Duration::from_millis(100)).await;
            // Every read is answered meanwhile, more of them than the run threads.
            let reads: Vec<_> = (0..4 * RUN_THREADS)
                .map(|i| {
                    let lanes = Arc::clone(&lanes);
                    tokio::spawn(async move { lanes.call(Lane::Read, move || i * 2).await })
                })
                .collect();
            for (i, read) in reads.into_iter().enumerate() {
                let answer = tokio::time::timeout(Duration::from_secs(10), read)
                    .await
                    .expect("a read is answered beside held writes and a held operator call")
                    .expect("joined");
                assert_eq!(answer, Some(i * 2));
            }
            assert!(
                !operator_ran.load(Ordering::SeqCst),
                "a second operator call waits for the first"
            );
            assert!(
                !write_ran.load(Ordering::SeqCst),
                "a write waits while writes hold every run thread they may"
            );
            release_all(held).await;
            assert_eq!(second_operator.await.expect("joined"), Some(()));
            assert_eq!(further_write.await.expect("joined"), Some(()));
            assert!(operator_ran.load(Ordering::SeqCst));
            assert!(write_ran.load(Ordering::SeqCst));
        });
    }

    #[test]
    fn a_write_is_answered_while_reads_hold_all_they_may() {
        let runtime = crate::server::runtime().expect("runtime");
        runtime.block_on(async {
            let lanes = Arc::new(Lanes::new());
            let held: Vec<_> = (0..READ_THREADS)
                .map(|_| hold(&lanes, Lane::Read))
                .collect();
            tokio::time::sleep(Duration::from_millis(100)).await;
            let read_ran = Arc::new(AtomicBool::new(false));
            let further_read = mark(&lanes, Lane::Read, &read_ran);
            let write_ran = Arc::new(AtomicBool::new(false));
            let write = mark(&lanes, Lane::Write, &write_ran);
            tokio::time::timeout(Duration::from_secs(10), write)
                .await
                .expect("a write is answered beside held reads")
                .expect("joined");
            assert!(write_ran.load(Ordering::SeqCst));
            assert!(
                !read_ran.load(Ordering::SeqCst),
                "a read waits while reads hold every run thread they may"
            );
            release_all(held).await;
            assert_eq!(further_read.await.expect("joined"), Some(()));
        });
    }
}
