//! The index changes between their outbox entry and the tantivy commit that covers them: the
//! operation numbers, the changes waiting for the indexer thread, the records retrieve must
//! match itself until then, and how the indexer is woken, slowed and stopped.
//!
//! **Invariant:** the watermark (the highest operation a commit may claim) stays below every
//! operation allocated and not yet added: a commit never claims a write it has not staged.
//! **Invariant:** an operation stays pending (matched by retrieve from memory) until a commit
//! whose searcher is reloaded covers it.
//! **Invariant:** changes reach the index writer only under `committing`, which guards the
//! account of what is staged and not committed; the commit that makes them searchable
//! witnesses every id staged since the last commit.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::fts::FtsDoc;
use crate::model::{RecordId, ScopeKey};
use crate::store::index::{Hit, IndexOp};

/// The index changes waiting for the indexer thread, and its cadence.
pub(super) struct IndexQueue {
    ops: Mutex<Ops>,
    /// Held while the index is staged and committed (one committer at a time), with what is
    /// staged in the index writer and not yet committed.
    committing: Mutex<Staged>,
    wake: Condvar,
    /// Signalled when a commit drained index changes (see `backpressure`).
    drained: Condvar,
    stop: AtomicBool,
    /// Set when staging or committing the index failed; the outbox keeps the gap for the next
    /// open and `doctor` reports it.
    degraded: AtomicBool,
    commit_every: usize,
    commit_interval: Duration,
    /// Changes waiting to be handed to the index writer that wake the indexer before a commit
    /// is due. Staged as they come, a commit's documents are indexed over its interval, not
    /// all in the instant it is due: the writer's channel holds up to 10,000 documents and
    /// its segment up to its heap, and staged in one burst a default commit (16,384 changes)
    /// raises the live heap by 30–45 MB for a fraction of a second, the store's tallest peak
    /// (`cargo run --example deployment`), and takes a core from the writes while it lasts.
    stage_every: usize,
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

/// What the index writer holds that no commit has made searchable: the highest sequence
/// number staged per scope, which the witness of acknowledged ids must cover once the commit
/// holding them is durable.
#[derive(Default)]
pub(super) struct Staged {
    highest: BTreeMap<String, u64>,
}

impl Staged {
    /// Notes changes handed to the index writer.
    pub(super) fn note(&mut self, changes: &[IndexOp]) {
        for c in changes {
            if let Some(RecordId { scope, seq }) = RecordId::parse(c.id()) {
                // A scope is allocated once a commit, not once a change.
                match self.highest.get_mut(scope.as_str()) {
                    Some(highest) => *highest = (*highest).max(seq),
                    None => {
                        self.highest.insert(scope.as_str().to_owned(), seq);
                    }
                }
            }
        }
    }

    /// Each scope with the highest sequence number staged in it.
    pub(super) fn highest(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.highest
            .iter()
            .map(|(scope, seq)| (scope.as_str(), *seq))
    }

    /// The staged changes were committed.
    pub(super) fn committed(&mut self) {
        self.highest.clear();
    }
}

/// What the indexer thread does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Work {
    /// Hand the waiting changes to the index writer.
    Stage,
    /// Commit the index (and stage what waits first).
    Commit,
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
            committing: Mutex::new(Staged::default()),
            wake: Condvar::new(),
            drained: Condvar::new(),
            stop: AtomicBool::new(false),
            degraded: AtomicBool::new(false),
            commit_every,
            commit_interval,
            stage_every: (commit_every / 16).max(1),
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

    /// Registers operation `op`, whose batch is appended, and its index changes, which wait for
    /// the indexer; wakes it when enough have gathered to stage or to commit.
    pub(super) fn add(&self, op: u64, changes: Vec<IndexOp>) {
        let docs: Vec<PendingDoc> = changes.iter().filter_map(PendingDoc::of).collect();
        let wake = {
            let mut ops = self.ops.lock();
            ops.in_flight.remove(&op);
            ops.changes += changes.len();
            ops.changes_of.insert(op, changes.len());
            ops.queue.extend(changes);
            ops.pending.insert(op, docs);
            ops.changes >= self.commit_every || ops.queue.len() >= self.stage_every
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

    /// Taken by whoever stages and commits (the indexer thread, a flush, a rebuild), with
    /// what is staged and not committed.
    pub(super) fn committing(&self) -> MutexGuard<'_, Staged> {
        self.committing.lock()
    }

    /// How many changes wait to be handed to the index writer.
    #[cfg(test)]
    pub(super) fn unstaged_len(&self) -> usize {
        self.ops.lock().queue.len()
    }

    /// Takes the changes not yet handed to the index writer (the caller holds `committing`).
    pub(super) fn unstaged(&self) -> Vec<IndexOp> {
        std::mem::take(&mut self.ops.lock().queue)
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

    /// The indexer thread's wait: a commit once enough changes are pending (unless `by_time`),
    /// `commit_by` passed or the queue is stopped; staging once enough changes wait for the
    /// writer. After a commit failed, the changes it left pending are still enough, so the
    /// indexer retries by time alone (`by_time`) rather than at once, in a loop of fsyncs.
    pub(super) fn wait_for_work(&self, commit_by: Instant, by_time: bool) -> Work {
        // `stop` is set under this lock, so the check and the wait cannot miss it.
        let mut ops = self.ops.lock();
        loop {
            if self.stopped() || (!by_time && ops.changes >= self.commit_every) {
                return Work::Commit;
            }
            if ops.queue.len() >= self.stage_every {
                return Work::Stage;
            }
            if self.wake.wait_until(&mut ops, commit_by).timed_out() {
                return Work::Commit;
            }
        }
    }

    /// When a commit is due after one that ended now.
    pub(super) fn next_commit(&self) -> Instant {
        let now = Instant::now();
        // An interval past what the clock can add means: never by time.
        now.checked_add(self.commit_interval)
            .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365))
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
