//! The index changes between their outbox entry and the tantivy commit that covers them: the
//! operation numbers, the changes waiting for the indexer thread, the records retrieve must
//! match itself until then, and how the indexer is woken, slowed and stopped.
//!
//! **Invariant:** the watermark (the highest operation a commit may claim) stays below every
//! operation allocated and not yet added: a commit never claims a write it has not staged.
//! **Invariant:** an operation stays pending (matched by retrieve from memory) until a commit
//! whose searcher is reloaded covers it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::fts::FtsDoc;
use crate::model::{RecordId, ScopeKey};
use crate::store::index::{Hit, IndexOp};

/// The index changes waiting for the indexer thread, and its cadence.
pub(super) struct IndexQueue {
    ops: Mutex<Ops>,
    /// Held while the index is staged and committed: one committer at a time.
    committing: Mutex<()>,
    wake: Condvar,
    /// Signalled when a commit drained index changes (see `backpressure`).
    drained: Condvar,
    stop: AtomicBool,
    /// Set when staging or committing the index failed; the outbox keeps the gap for the next
    /// open and `doctor` reports it.
    degraded: AtomicBool,
    commit_every: usize,
    commit_interval: Duration,
}

/// Index operations between their outbox entry and the tantivy commit that covers them.
#[derive(Default)]
struct Ops {
    /// The next operation number.
    next: u64,
    /// Allocated but not yet added: the watermark must stay below the smallest.
    in_flight: BTreeSet<u64>,
    /// Durable, not yet in a committed index: operation → the records it made active, with
    /// their FTS bodies, so `retrieve` can match them without reading them.
    pending: BTreeMap<u64, Vec<PendingDoc>>,
    /// Index changes of pending operations not yet handed to the index writer.
    queue: Vec<IndexOp>,
    /// Index changes (documents added or removed) of the pending operations, and per operation.
    changes: usize,
    changes_of: BTreeMap<u64, usize>,
}

impl Ops {
    fn watermark(&self) -> u64 {
        match self.in_flight.first() {
            Some(&first) => first.saturating_sub(1),
            None => self.next.saturating_sub(1),
        }
    }
}

/// A record whose index document is staged but not committed.
struct PendingDoc {
    scope: ScopeKey,
    seq: u64,
    /// The record's FTS body, as the index will hold it (shared with its index operation).
    doc: Arc<FtsDoc>,
}

impl PendingDoc {
    fn of(op: &IndexOp) -> Option<PendingDoc> {
        let IndexOp::Upsert { id, fts, .. } = op else {
            return None;
        };
        let RecordId { scope, seq } = RecordId::parse(id)?;
        Some(PendingDoc {
            scope,
            seq,
            doc: Arc::clone(fts),
        })
    }
}

/// What one commit round takes: the watermark it may claim, the operations it covers, and the
/// changes to stage.
pub(super) struct Round {
    pub(super) watermark: u64,
    pub(super) covered: Vec<u64>,
    pub(super) changes: Vec<IndexOp>,
}

impl IndexQueue {
    /// A queue whose indexer commits after `commit_every` changes or `commit_interval`.
    pub(super) fn new(commit_every: usize, commit_interval: Duration) -> IndexQueue {
        IndexQueue {
            ops: Mutex::new(Ops::default()),
            committing: Mutex::new(()),
            wake: Condvar::new(),
            drained: Condvar::new(),
            stop: AtomicBool::new(false),
            degraded: AtomicBool::new(false),
            commit_every,
            commit_interval,
        }
    }

    /// Numbers operations from `next` on (at open, past every outbox entry and the watermark).
    pub(super) fn start_at(&self, next: u64) {
        self.ops.lock().next = next;
    }

    /// A new operation number, in flight until [`add`](Self::add) or
    /// [`abandon`](Self::abandon).
    pub(super) fn allocate(&self) -> u64 {
        let mut ops = self.ops.lock();
        let op = ops.next;
        ops.next += 1;
        ops.in_flight.insert(op);
        op
    }

    /// Forgets an operation whose batch did not commit.
    pub(super) fn abandon(&self, op: u64) {
        self.ops.lock().in_flight.remove(&op);
    }

    /// Registers durable operation `op`, whose index changes wait for the next commit, and
    /// wakes the indexer when enough have gathered.
    pub(super) fn add(&self, op: u64, changes: Vec<IndexOp>) {
        let docs: Vec<PendingDoc> = changes.iter().filter_map(PendingDoc::of).collect();
        let wake = {
            let mut ops = self.ops.lock();
            ops.in_flight.remove(&op);
            ops.changes += changes.len();
            ops.changes_of.insert(op, changes.len());
            ops.queue.extend(changes);
            ops.pending.insert(op, docs);
            ops.changes >= self.commit_every
        };
        if wake {
            self.wake.notify_one();
        }
    }

    /// How many index changes wait for a commit (each holds its record's FTS body until then).
    pub(super) fn pending_changes(&self) -> usize {
        self.ops.lock().changes
    }

    /// The highest operation every lower one of which is added.
    pub(super) fn watermark(&self) -> u64 {
        self.ops.lock().watermark()
    }

    /// The records `scope`'s pending operations made active, with how often each of `terms`
    /// occurs in them: retrieve's view of the writes the index does not answer for yet.
    pub(super) fn pending_hits(&self, scope: &ScopeKey, terms: &[String]) -> Vec<Hit> {
        self.ops
            .lock()
            .pending
            .values()
            .flatten()
            .filter(|d| &d.scope == scope)
            .map(|d| Hit {
                seq: d.seq,
                len: d.doc.len,
                freqs: d.doc.freqs(terms),
            })
            .filter(|h| h.freqs.iter().any(|&f| f > 0))
            .collect()
    }

    /// Taken by whoever stages and commits (the indexer thread, a flush, a rebuild).
    pub(super) fn committing(&self) -> MutexGuard<'_, ()> {
        self.committing.lock()
    }

    /// Takes what the next commit stages and covers (the caller holds `committing`); `None`:
    /// nothing is pending.
    pub(super) fn round(&self) -> Option<Round> {
        let mut ops = self.ops.lock();
        if ops.pending.is_empty() {
            return None;
        }
        // Everything at or below the watermark has left `in_flight`, so its changes are in
        // this queue or were staged by an earlier round.
        let watermark = ops.watermark();
        let covered = ops.pending.range(..=watermark).map(|(op, _)| *op).collect();
        Some(Round {
            watermark,
            covered,
            changes: std::mem::take(&mut ops.queue),
        })
    }

    /// Forgets the operations a committed (and reloaded) index now answers for, and wakes the
    /// writers waiting on the backlog.
    pub(super) fn covered(&self, ops_done: &[u64]) {
        let mut ops = self.ops.lock();
        for op in ops_done {
            ops.pending.remove(op);
            if let Some(n) = ops.changes_of.remove(op) {
                ops.changes = ops.changes.saturating_sub(n);
            }
        }
        self.drained.notify_all();
    }

    /// Waits while the index changes not yet committed are more than a bound: every one holds
    /// its record's text until the indexer commits it, so a writer faster than the indexer (a
    /// large import) would otherwise grow memory without limit. Called after a write's scope
    /// lock is released.
    pub(super) fn backpressure(&self) {
        let bound = self.commit_every.saturating_mul(4).max(4096);
        let mut ops = self.ops.lock();
        // A failing index (a full disk) keeps its changes for the next open: no point waiting.
        while ops.changes > bound && !self.stopped() && !self.degraded() {
            self.wake.notify_one();
            self.drained.wait_for(&mut ops, Duration::from_millis(100));
        }
    }

    /// The indexer thread's wait: until enough changes gathered, the interval passed, or the
    /// queue is stopped.
    pub(super) fn wait_for_work(&self) {
        // `stop` is set under this lock, so the check and the wait cannot miss it.
        let mut ops = self.ops.lock();
        if !self.stopped() && ops.changes < self.commit_every {
            self.wake.wait_for(&mut ops, self.commit_interval);
        }
    }

    /// Stops the indexer thread (it commits once more, then returns).
    pub(super) fn stop(&self) {
        let _ops = self.ops.lock();
        self.stop.store(true, Ordering::SeqCst);
        self.wake.notify_all();
    }

    pub(super) fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// An index operation failed: the outbox keeps its changes for the next open.
    pub(super) fn degrade(&self) {
        self.degraded.store(true, Ordering::SeqCst);
    }

    /// The index was rebuilt from the records.
    pub(super) fn restored(&self) {
        self.degraded.store(false, Ordering::SeqCst);
    }

    pub(super) fn degraded(&self) -> bool {
        self.degraded.load(Ordering::SeqCst)
    }
}
