//! The derived keyword index: the in-memory queue of staged operations, the indexer thread
//! that commits them in groups, and recovery (outbox replay, rebuild) at open.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use fjall::Readable;

use super::super::codec::{self, ScopeMeta};
use super::{st, Shared};
use crate::error::{Error, Result};
use crate::fts::FtsDoc;
use crate::model::{RecordId, ScopeKey};
use crate::store::index::{IndexOp, Mark};

/// Index operations between their outbox entry and the tantivy commit that covers them.
#[derive(Default)]
pub(super) struct Ops {
    /// The next operation number.
    pub(super) next: u64,
    /// Allocated but not yet staged: the watermark must stay below the smallest.
    pub(super) in_flight: BTreeSet<u64>,
    /// Durable, not yet in a committed index: operation → the records it made active, with
    /// their tokens, so `retrieve` can match them without reading them.
    pub(super) pending: BTreeMap<u64, Vec<PendingDoc>>,
    /// Index changes of pending operations not yet handed to the index writer.
    pub(super) queue: Vec<IndexOp>,
    /// Index changes (documents added or removed) of the pending operations, and per operation.
    pub(super) changes: usize,
    pub(super) changes_of: BTreeMap<u64, usize>,
}

impl Ops {
    /// Registers a durable operation whose index changes wait for the next commit.
    pub(super) fn add(&mut self, op: u64, changes: Vec<IndexOp>, docs: Vec<PendingDoc>) {
        self.changes += changes.len();
        self.changes_of.insert(op, changes.len());
        self.queue.extend(changes);
        self.pending.insert(op, docs);
    }

    /// Forgets an operation a committed index now answers for.
    fn remove(&mut self, op: u64) {
        self.pending.remove(&op);
        if let Some(n) = self.changes_of.remove(&op) {
            self.changes = self.changes.saturating_sub(n);
        }
    }
}

/// A record whose index document is staged but not committed.
pub(super) struct PendingDoc {
    pub(super) scope: ScopeKey,
    pub(super) seq: u64,
    /// The record's FTS body, as the index will hold it (shared with its index operation).
    pub(super) doc: std::sync::Arc<FtsDoc>,
}

impl PendingDoc {
    pub(super) fn from_op(op: &IndexOp) -> Option<PendingDoc> {
        let IndexOp::Upsert { id, fts, .. } = op else {
            return None;
        };
        let RecordId { scope, seq } = RecordId::parse(id)?;
        Some(PendingDoc {
            scope,
            seq,
            doc: std::sync::Arc::clone(fts),
        })
    }
}

impl Shared {
    pub(super) fn watermark(ops: &Ops) -> u64 {
        match ops.in_flight.first() {
            Some(&first) => first.saturating_sub(1),
            None => ops.next.saturating_sub(1),
        }
    }

    pub(super) fn run_indexer(&self) {
        loop {
            {
                // `stop` is set under this lock, so the check and the wait cannot miss it.
                let mut ops = self.queue.ops.lock();
                if !self.queue.stop.load(Ordering::SeqCst) && ops.changes < self.queue.commit_every
                {
                    self.queue
                        .wake
                        .wait_for(&mut ops, self.queue.commit_interval);
                }
            }
            if self.commit_index().is_err() {
                self.queue.degraded.store(true, Ordering::SeqCst);
            }
            if let Err(e) = self.prune_decisions() {
                log::warn!("[store] pruning the decision journal failed: {e}");
            }
            if self.queue.stop.load(Ordering::SeqCst) {
                return;
            }
        }
    }

    /// Commits everything staged, then trims the outbox up to the watermark.
    pub(super) fn commit_index(&self) -> Result<()> {
        // One committer at a time (the indexer thread, or a flush).
        let _committing = self.queue.committing.lock();
        let (watermark, covered, queue) = {
            let mut ops = self.queue.ops.lock();
            if ops.pending.is_empty() {
                return Ok(());
            }
            // Everything at or below the watermark has left `in_flight`, so its changes are in
            // this queue or were staged by an earlier round.
            let w = Self::watermark(&ops);
            let covered = ops
                .pending
                .range(..=w)
                .map(|(op, _)| *op)
                .collect::<Vec<_>>();
            (w, covered, std::mem::take(&mut ops.queue))
        };
        if let Err(e) = self.index.stage(&queue) {
            // Nothing is lost: the outbox keeps these operations for the next open.
            self.queue.degraded.store(true, Ordering::SeqCst);
            return Err(e);
        }
        let mark = self.durable_mark(watermark)?;
        self.witness_ids(&queue)?;
        self.index.commit(mark)?;
        let mut batch = self.db.batch();
        for op in &covered {
            batch.remove(&self.ks.outbox, op.to_be_bytes());
        }
        self.commit_batch(batch)
            .map_err(st("trimming the index outbox"))?;
        let mut ops = self.queue.ops.lock();
        for op in covered {
            ops.remove(op);
        }
        self.queue.drained.notify_all();
        Ok(())
    }

    /// Raises the witness of acknowledged ids to cover `ops` (written, once the journal is
    /// durable, ahead of the index commit that covers them).
    fn witness_ids(&self, ops: &[IndexOp]) -> Result<()> {
        let mut ids = self.witness.next_ids.lock();
        let mut raised = false;
        for op in ops {
            if let Some(RecordId { scope, seq }) = RecordId::parse(op.id()) {
                let next = ids.entry(scope.as_str().to_owned()).or_default();
                if *next <= seq {
                    *next = seq + 1;
                    raised = true;
                }
            }
        }
        if raised {
            super::evidence::write_next_ids(&self.dir, &ids)?;
        }
        Ok(())
    }

    /// The payload of an index commit covering `op`: the journal is made durable first, so the
    /// index never holds a record whose batch could still be lost, and the commit records how
    /// far the durable journal reached (the witness `evidence` checks at open).
    fn durable_mark(&self, op: u64) -> Result<Mark> {
        // Read before the sync: a batch takes its number while it is appended, so every batch
        // up to this one is in the journal when the sync starts.
        let batch = self.last_batch();
        self.sync_journal()?;
        Ok(Mark {
            op,
            batch: Some(batch),
        })
    }

    // ---- recovery and doctor ----

    /// Brings the index up to date with the records at open. A store that lost writes keeps
    /// its index untouched: the index is the evidence of which ids were lost.
    pub(super) fn recover(&self, watermark: Option<Mark>) -> Result<()> {
        let damaged = self.witness.damage.lock().is_some();
        let watermark = watermark.map(|m| m.op);
        let mut entries: Vec<(u64, Vec<String>)> = Vec::new();
        for g in self.ks.outbox.iter() {
            let (k, v) = g.into_inner().map_err(st("reading the index outbox"))?;
            let op = codec::trailing_seq(&k)
                .ok_or_else(|| Error::format("an outbox key is not 8 bytes"))?;
            entries.push((op, codec::decode(&v, "an outbox entry")?));
        }
        let last = entries.last().map(|(op, _)| *op);
        let top = last.unwrap_or(0).max(watermark.unwrap_or(0));
        self.queue.ops.lock().next = top + 1;
        if damaged {
            return Ok(());
        }
        match watermark {
            None => self.rebuild_index_at(top)?,
            Some(w) => {
                let mut replay = Vec::new();
                for (op, ids) in &entries {
                    if *op > w {
                        for id in ids {
                            replay.push(self.current_op(id)?);
                        }
                    }
                }
                if !replay.is_empty() {
                    self.index.stage(&replay)?;
                }
                if !replay.is_empty() || last.is_some() {
                    let mark = self.durable_mark(top)?;
                    self.witness_ids(&replay)?;
                    self.index.commit(mark)?;
                }
                let mut batch = self.db.batch();
                for (op, _) in &entries {
                    batch.remove(&self.ks.outbox, op.to_be_bytes());
                }
                self.commit_batch(batch)
                    .map_err(st("trimming the index outbox"))?;
                if self.index.num_docs() != self.active_total()? {
                    self.rebuild_index_at(top)?;
                }
            }
        }
        Ok(())
    }

    /// The index operation that brings `id`'s document up to date with fjall.
    pub(super) fn current_op(&self, id: &str) -> Result<IndexOp> {
        let active = match RecordId::parse(id) {
            Some(RecordId { scope, seq }) => self.load_active(&scope, seq)?,
            None => None,
        };
        Ok(match active {
            Some(r) => Self::upsert_op(&r),
            None => IndexOp::Delete { id: id.to_owned() },
        })
    }

    pub(super) fn active_total(&self) -> Result<u64> {
        let mut total = 0;
        for g in self.ks.scopes.iter() {
            let v = g.value().map_err(st("reading scopes"))?;
            total += codec::decode::<ScopeMeta>(&v, "a scope's bookkeeping")?.active;
        }
        Ok(total)
    }

    pub(super) fn rebuild_index(&self) -> Result<()> {
        // Hold every pending operation back: the rebuild reads the records as they are now.
        self.commit_index()?;
        let top = Self::watermark(&self.queue.ops.lock());
        self.rebuild_index_at(top)
    }

    pub(super) fn rebuild_index_at(&self, watermark: u64) -> Result<()> {
        let mark = self.durable_mark(watermark)?;
        let snapshot = self.db.snapshot();
        let docs = snapshot.iter(&self.ks.active).map(|g| {
            let v = g.value().map_err(st("reading records"))?;
            codec::decode_record(&v, None).map(|r| Self::upsert_op(&r))
        });
        self.index.rebuild(docs, mark)
    }
}
