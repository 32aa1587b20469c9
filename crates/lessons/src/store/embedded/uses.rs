//! Retrieved records' uses on their way to the records. A retrieve applies its use bump to the
//! scope's derived state at once and hands the bump's batch here, so a read never waits on
//! fjall's journal lock (which every commit takes and fjall's flush worker holds through an
//! fsync): the use committer thread (`retrieve::commit_uses`) commits the batches in the order
//! they came.
//!
//! **Invariant:** batches are committed in the order they were handed over, so two bumps of one
//! record reach the records in their order.
//! **Invariant:** a batch counts as unsettled in its scope (`Scope::unsettle`) from the moment
//! its bump is applied to the derived state until it is committed or dropped, and anyone about
//! to read the scope's records from fjall waits for that count to fall to zero
//! (`Scope::settle`): no read of the records, and no write planned on them, misses a use the
//! derived state holds.
//! **Invariant:** bounded: a retrieve waits while `MAX_WAITING` batches wait.

use std::collections::VecDeque;
use std::sync::Arc;

use fjall::OwnedWriteBatch;
use parking_lot::{Condvar, Mutex};

use super::scopes::Scope;
use crate::model::ScopeKey;

/// Use batches that may wait at once: at a few hundred bytes each, under a megabyte; a
/// committer that stalls that long (fjall's journal held through a slow fsync) makes the next
/// retrieves wait, as they did when each committed its own batch.
const MAX_WAITING: usize = 4_096;

/// One retrieve's use bump, applied to its scope's derived state and not yet committed.
/// Dropping it (committed or not) settles it in its scope.
pub(super) struct PendingUse {
    pub(super) scope: ScopeKey,
    pub(super) state: Arc<Scope>,
    batch: Option<OwnedWriteBatch>,
}

impl PendingUse {
    /// A bump of `state`'s scope already counted unsettled there.
    pub(super) fn new(scope: ScopeKey, state: Arc<Scope>, batch: OwnedWriteBatch) -> PendingUse {
        PendingUse {
            scope,
            state,
            batch: Some(batch),
        }
    }

    /// The batch, to commit (once).
    pub(super) fn take_batch(&mut self) -> Option<OwnedWriteBatch> {
        self.batch.take()
    }
}

impl Drop for PendingUse {
    fn drop(&mut self) {
        self.state.settle_one();
    }
}

/// The use batches waiting for the committer, in the order they were handed over.
pub(super) struct UseQueue {
    state: Mutex<QueueState>,
    changed: Condvar,
}

#[derive(Default)]
struct QueueState {
    waiting: VecDeque<PendingUse>,
    /// Batches handed over since open.
    handed: u64,
    /// Of them, those committed (or dropped at a stop).
    done: u64,
    stopped: bool,
}

impl UseQueue {
    pub(super) fn new() -> UseQueue {
        UseQueue {
            state: Mutex::new(QueueState::default()),
            changed: Condvar::new(),
        }
    }

    /// Hands over a bump (the caller holds its scope's write lock), waiting while the queue is
    /// full. After a stop nothing is committed any more, and the bump is dropped.
    pub(super) fn push(&self, pending: PendingUse) {
        let mut q = self.state.lock();
        while q.waiting.len() >= MAX_WAITING && !q.stopped {
            self.changed.wait(&mut q);
        }
        if q.stopped {
            drop(q);
            drop(pending);
            return;
        }
        q.waiting.push_back(pending);
        q.handed += 1;
        self.changed.notify_all();
    }

    /// Every bump waiting, in order, once there is one; `None` once stopped (what still waits
    /// is dropped, as a crash would lose it). The caller reports them with [`done`](Self::done).
    pub(super) fn take(&self) -> Option<Vec<PendingUse>> {
        let mut q = self.state.lock();
        loop {
            if q.stopped {
                let dropped = q.waiting.len() as u64;
                let rest: Vec<PendingUse> = q.waiting.drain(..).collect();
                q.done += dropped;
                self.changed.notify_all();
                drop(q);
                drop(rest);
                return None;
            }
            if !q.waiting.is_empty() {
                let round: Vec<PendingUse> = q.waiting.drain(..).collect();
                self.changed.notify_all();
                return Some(round);
            }
            self.changed.wait(&mut q);
        }
    }

    /// `n` bumps taken are committed (or failed and were given up).
    pub(super) fn done(&self, n: usize) {
        let mut q = self.state.lock();
        q.done += n as u64;
        self.changed.notify_all();
    }

    /// Returns once every bump handed over before the call is committed, or the committer
    /// stopped (then nothing more will be).
    pub(super) fn drained(&self) {
        let mut q = self.state.lock();
        let target = q.handed;
        while q.done < target && !q.stopped {
            self.changed.wait(&mut q);
        }
    }

    /// Bumps handed over and not yet committed.
    pub(super) fn waiting(&self) -> u64 {
        let q = self.state.lock();
        q.handed - q.done
    }

    /// Stops the committer: it returns from [`take`](Self::take), dropping what still waits.
    /// Call [`drained`](Self::drained) first to commit everything.
    pub(super) fn stop(&self) {
        self.state.lock().stopped = true;
        self.changed.notify_all();
    }
}
