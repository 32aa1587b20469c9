//! What an open store shares between its callers and its indexer thread: one value of each
//! concern's type, and the few steps that take several of them at once (a transaction, a
//! scope's checked bookkeeping, the commit of a transaction).

use std::path::PathBuf;
use std::sync::Arc;

use super::decisions::DecisionJournal;
use super::evidence::Witnesses;
use super::group::{GroupCommit, Ticket};
use super::queue::IndexQueue;
use super::records::Records;
use super::scopes::{Scope, Scopes};
use super::tx::{Sealed, Tx};
use super::uses::{PendingUse, UseQueue};
use crate::error::Result;
use crate::model::ScopeKey;
use crate::store::codec::ScopeMeta;
use crate::store::index::{IndexOp, KeywordIndex};
use crate::time::Clock;

/// An open store's state, one concern per field.
pub(super) struct Shared {
    /// An exclusive `flock` on the store directory, held for the store's life: a directory
    /// cannot be deleted and recreated under a running owner the way a lock file can.
    pub(super) _dir_lock: std::fs::File,
    pub(super) dir: PathBuf,
    /// The records (fjall), the source of truth.
    pub(super) records: Records,
    /// The keyword index (tantivy), derived from the records.
    pub(super) index: KeywordIndex,
    /// Each scope's write lock and its derived state, bounded.
    pub(super) scopes: Scopes,
    /// The index changes waiting for the indexer, and its cadence.
    pub(super) queue: IndexQueue,
    /// Batches, their numbers and their fsyncs, shared by concurrent writers.
    pub(super) group: GroupCommit,
    /// The decision journal and its retention.
    pub(super) journal: DecisionJournal,
    /// Retrieves' use bumps waiting for the use committer.
    pub(super) uses: UseQueue,
    /// What the store knows of lost or damaged data.
    pub(super) witness: Witnesses,
    pub(super) clock: Clock,
    /// The default cap of active records per scope.
    pub(super) cap: usize,
}

impl Shared {
    /// A transaction on `state`'s scope (the caller holds its write lock).
    pub(super) fn tx(&self, state: &Scope) -> Tx {
        // One lock of the derived state (it is not reentrant).
        let (fts, cached_day) = {
            let d = state.derived();
            (d.has_fts(), d.day.clone())
        };
        Tx::new(self.records.batch(), fts, cached_day)
    }

    /// A scope's bookkeeping, for a caller that holds the scope's write lock and is about to
    /// write.
    ///
    /// The bookkeeping is derived data: the next sequence number must be above every record the
    /// scope holds, and the active count must be the number of its active records. A damaged
    /// journal or a lost flush can leave it behind its records, and a stale next sequence would
    /// mint an id that already exists. So the first write to a scope after open (or after the
    /// scope left memory) checks it against the records (a few seeks and one scan of at most
    /// `cap` keys) and, when it disagrees, repairs it durably before anything else and logs
    /// what it found. Later writes read it from memory.
    pub(super) fn scope_meta(&self, scope: &ScopeKey, state: &Scope) -> Result<ScopeMeta> {
        if let Some(meta) = state.derived().meta {
            return Ok(meta);
        }
        let stored = self.records.stored_meta(scope)?;
        let derived = self.records.derive_meta(scope)?;
        let meta = stored.unwrap_or_default();
        // Ids the witness saw acknowledged are never handed out again, even when no record
        // of them survived and the loss went unseen.
        let witnessed = self.witness.next_id(scope);
        let repaired = ScopeMeta {
            next_seq: meta.next_seq.max(derived.next_seq).max(witnessed),
            active: derived.active,
        };
        if repaired != meta && (stored.is_some() || repaired != ScopeMeta::default()) {
            log::warn!(
                "[store] {scope}: bookkeeping said next seq {} and {} active, its records say {} and {}, the witness of acknowledged ids {}; repaired",
                meta.next_seq,
                meta.active,
                derived.next_seq,
                repaired.active,
                witnessed
            );
            let mut batch = self.records.batch();
            self.records.put_meta(&mut batch, scope, &repaired)?;
            self.group
                .append_durably(batch, "repairing a scope's bookkeeping")?;
        }
        self.scopes
            .update(scope, state, |d| d.meta = Some(repaired));
        Ok(repaired)
    }

    /// Applies a retrieve's use bump (`tx`, which changes nothing but records' use) to the
    /// scope's derived state and hands its batch to the use committer, without waiting for
    /// fjall (the caller holds the scope's write lock). The bump counts as unsettled in the
    /// scope until it is committed, so whoever reads the scope's records from fjall first waits
    /// for it (see `uses`).
    pub(super) fn defer_uses(&self, scope: &ScopeKey, state: &Arc<Scope>, tx: Tx) {
        debug_assert!(tx.only_uses());
        let tx = tx.into_sealed();
        state.unsettle();
        self.scopes
            .apply(&self.records, scope, state, &tx.changes, None, None);
        self.uses
            .push(PendingUse::new(scope.clone(), Arc::clone(state), tx.batch));
    }

    /// Commits `tx`, with an outbox entry naming the records of `index_ops` (when any), applies
    /// its changes to the scope's derived state, and queues the index changes for the indexer.
    /// The caller holds the scope's write lock; the returned ticket says when the batch is
    /// durable. This is the one way a transaction reaches the disk.
    pub(super) fn commit(
        &self,
        scope: &ScopeKey,
        state: &Scope,
        mut tx: Tx,
        index_ops: Vec<IndexOp>,
    ) -> Result<Ticket> {
        self.records.seal(&mut tx, scope)?;
        let Sealed {
            mut batch,
            changes,
            meta,
            day,
            journaled,
        } = tx.into_sealed();
        let op = (!index_ops.is_empty()).then(|| self.queue.allocate());
        if let Some(op) = op {
            let ids: Vec<&str> = index_ops.iter().map(IndexOp::id).collect();
            if let Err(e) = self.records.put_outbox(&mut batch, op, &ids) {
                self.queue.abandon(op);
                return Err(e);
            }
        }
        let grew = [(scope, journaled)];
        let ticket = self.group.append(batch, "committing a write", || {
            if journaled.entries > 0 {
                self.journal.grew(&grew);
            }
        });
        let ticket = match ticket {
            Ok(t) => t,
            Err(e) => {
                if let Some(op) = op {
                    self.queue.abandon(op);
                }
                return Err(e);
            }
        };
        // The batch is visible: the derived state follows it before anyone is answered.
        self.scopes
            .apply(&self.records, scope, state, &changes, meta, day);
        // The writer never touches tantivy: the indexer thread stages and commits, so a write
        // never waits behind an index commit. Until then the queue answers for it.
        if let Some(op) = op {
            self.queue.add(op, index_ops);
        }
        Ok(ticket)
    }
}
