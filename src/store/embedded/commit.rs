//! Group commit: a write's batch goes to the journal, then one fsync covers every batch
//! appended before it; and the outbox entry that ties a write to its index changes.

use std::sync::Arc;

use fjall::{OwnedWriteBatch, PersistMode};

use super::super::codec::{self, ScopeMeta};
use super::decisions::Growth;
use super::indexer::PendingDoc;
use super::order::LruKey;
use super::scopes::Scope;
use super::{st, Shared};
use crate::error::{Error, Result};
use crate::fts::FtsDoc;
use crate::model::{Kind, Record, ScopeKey};
use crate::store::index::IndexOp;

/// One scope's batch being built, with what it changes in the scope's active set.
pub(super) struct Tx {
    pub(super) batch: OwnedWriteBatch,
    /// Records entering, changing or leaving the active set, in order: the commit applies them
    /// to the scope's derived state (window, eviction order, FTS totals).
    pub(super) changes: Vec<Change>,
    /// The scope's bookkeeping after this batch, when the batch changes it.
    pub(super) meta: Option<ScopeMeta>,
    /// Whether the scope's FTS totals are loaded, so a leaving record's document is needed.
    fts: bool,
    /// Dedup keys this transaction read or edits: their values, and whether edited (written
    /// at commit).
    pub(super) norms: DedupKeys,
    /// The scope's counters of one day after this transaction (written at commit).
    pub(super) day: Option<(i64, crate::store::DayCounters)>,
    /// The scope's counters of the day as the derived state last knew them.
    pub(super) cached_day: Option<(i64, crate::store::DayCounters)>,
    /// Decision-journal entries this transaction adds.
    pub(super) journaled: Growth,
}

/// Dedup keys read or edited by a transaction: their values, and whether edited.
pub(super) type DedupKeys = std::collections::BTreeMap<Vec<u8>, (Vec<u64>, bool)>;

/// One record's change in a scope's active set.
pub(super) struct Change {
    pub(super) seq: u64,
    /// What it was, if it was active.
    pub(super) old: Option<Old>,
    /// What it is now (its status says whether it is still active); `None`: it left.
    pub(super) new: Option<Arc<Record>>,
}

/// What a record that was active leaves behind in the derived state.
pub(super) struct Old {
    pub(super) kind: Kind,
    pub(super) lru: LruKey,
    /// Its FTS document, when the scope's FTS totals are loaded and it leaves the active set.
    pub(super) fts: Option<FtsDoc>,
}

impl Tx {
    /// What `r` (active, about to leave the active set) leaves behind.
    pub(super) fn old(&self, r: &Record, seq: u64) -> Old {
        super::records::old_of(r, seq, self.fts)
    }
}

/// A journal position to wait on for durability (`None`: the store does not fsync writes).
#[must_use]
pub(super) struct Ticket(Option<u64>);

impl Ticket {
    /// The later of two positions: waiting on it waits for both (one fsync covers every batch
    /// appended before it).
    pub(super) fn and(self, other: Ticket) -> Ticket {
        Ticket(self.0.max(other.0))
    }

    pub(super) fn none() -> Ticket {
        Ticket(None)
    }
}

/// Group commit: writers append their batch to the journal, then one fsync covers every batch
/// appended before it started.
#[derive(Default)]
pub(super) struct SyncState {
    /// Batches appended (a ticket each).
    appended: u64,
    /// Every ticket at or below this is on disk.
    synced: u64,
    /// The highest ticket an fsync started so far covers: a writer at or below it waits for
    /// that fsync instead of starting one (if it fails, `write_failed` says so).
    covering: u64,
    /// fsyncs running now.
    syncing: usize,
}

/// fsyncs of the journal that may run at once. A batch appended while one runs is not covered
/// by it; a second one started at once, rather than after it, shortens that batch's wait.
const MAX_SYNCS: usize = 2;

/// Our own descriptor of fjall's active journal, to fsync it outside fjall's journal lock.
///
/// Why fsyncing it covers every batch committed before `Shared::sync_journal` moved fjall's
/// buffer to the OS: those bytes are in the journal that was active then. If it is still the
/// active one, it is the highest-numbered file, which `current` finds after the move. If fjall
/// rotated it since, the rotation fsynced it (`SyncAll`) before creating the next file, and
/// fsynced the directory after, so it is already durable and fsyncing the next file is enough.
pub(super) struct ActiveJournal {
    records: std::path::PathBuf,
    open: Option<(u64, Arc<std::fs::File>)>,
}

impl ActiveJournal {
    pub(super) fn new(records: std::path::PathBuf) -> ActiveJournal {
        ActiveJournal {
            records,
            open: None,
        }
    }

    /// The highest-numbered journal file, opened (shared, so its fsync runs without this
    /// struct's lock and two fsyncs may overlap).
    fn current(&mut self) -> Result<(u64, Arc<std::fs::File>)> {
        if let Some((id, file)) = &self.open {
            // One stat per fsync: a rotation creates exactly the next number.
            let next = self.records.join(format!("{}.jnl", id + 1));
            let rotated = next
                .try_exists()
                .map_err(|e| Error::io(format!("looking for {}", next.display()), e))?;
            if !rotated {
                return Ok((*id, Arc::clone(file)));
            }
        }
        let (id, path) = super::super::journal::journal_files(&self.records)?
            .pop()
            .ok_or_else(|| {
                Error::io(
                    format!("finding the journal in {}", self.records.display()),
                    std::io::Error::from(std::io::ErrorKind::NotFound),
                )
            })?;
        let file = Arc::new(
            std::fs::File::open(&path)
                .map_err(|e| Error::io(format!("opening {}", path.display()), e))?,
        );
        self.open = Some((id, Arc::clone(&file)));
        Ok((id, file))
    }

    /// Drops the descriptor of journal `id` (its fsync failed): the next one opens it afresh.
    fn forget(&mut self, id: u64) {
        if self.open.as_ref().is_some_and(|(open, _)| *open == id) {
            self.open = None;
        }
    }
}

impl Shared {
    /// A transaction on `state`'s scope (the caller holds its write lock).
    pub(super) fn tx(&self, state: &Scope) -> Tx {
        // One lock of the derived state (it is not reentrant).
        let (fts, cached_day) = {
            let d = state.derived();
            (d.fts.is_some(), d.day.clone())
        };
        Tx {
            batch: self.db.batch(),
            changes: Vec::new(),
            meta: None,
            fts,
            norms: std::collections::BTreeMap::new(),
            day: None,
            cached_day,
            journaled: Growth::default(),
        }
    }

    /// Commits `batch` numbered: the next batch number goes into the batch itself (`meta`,
    /// `last batch`), so the records always say which batch was the last to survive (see
    /// `evidence`). Numbers follow the journal's order: they are taken and committed under one
    /// lock.
    pub(super) fn commit_batch(&self, batch: OwnedWriteBatch) -> fjall::Result<()> {
        self.commit_growing(batch, &[])
    }

    /// `commit_batch` of a batch that adds decision-journal entries: `grew` says how many to
    /// each scope, counted under the same lock as the commit (see `decisions::Tally`).
    pub(super) fn commit_growing(
        &self,
        mut batch: OwnedWriteBatch,
        grew: &[(&ScopeKey, Growth)],
    ) -> fjall::Result<()> {
        let mut last = self.group.batches.lock();
        // After a failed write or fsync the OS may have dropped the journal's dirty pages
        // while a later fsync still reports success, so nothing more is committed: fjall
        // poisons itself after its own failures, and `sync_journal`'s fsync is ours.
        if self
            .group
            .write_failed
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(fjall::Error::Poisoned);
        }
        let number = *last + 1;
        batch.insert(&self.ks.meta, codec::LAST_BATCH, number.to_be_bytes());
        if let Err(e) = batch.commit() {
            self.group
                .write_failed
                .store(true, std::sync::atomic::Ordering::SeqCst);
            return Err(e);
        }
        *last = number;
        if !grew.is_empty() {
            self.journal_grew(grew);
        }
        Ok(())
    }

    /// The number of the last batch committed.
    pub(super) fn last_batch(&self) -> u64 {
        *self.group.batches.lock()
    }

    /// Appends `batch` to the journal (visible to readers at once) and returns the ticket to
    /// wait on before acknowledging it.
    pub(super) fn append(&self, batch: OwnedWriteBatch) -> Result<Ticket> {
        self.append_growing(batch, &[])
    }

    /// `append` of a batch that adds decision-journal entries (see `commit_growing`).
    pub(super) fn append_growing(
        &self,
        batch: OwnedWriteBatch,
        grew: &[(&ScopeKey, Growth)],
    ) -> Result<Ticket> {
        self.commit_growing(batch, grew)
            .map_err(st("committing a write"))?;
        if !self.group.sync_writes {
            return Ok(Ticket(None));
        }
        let mut state = self.group.state.lock();
        state.appended += 1;
        Ok(Ticket(Some(state.appended)))
    }

    /// Returns once the batch of `ticket` is fsynced. Concurrent writers share fsyncs: a writer
    /// whose batch no running fsync covers starts one for every batch appended so far, unless
    /// `MAX_SYNCS` already run, and the others wait for the one that covers them. Callers wait
    /// after releasing their scope's lock, so the next write to the scope plans while this one
    /// syncs.
    pub(super) fn wait_durable(&self, ticket: Ticket) -> Result<()> {
        let Ticket(Some(ticket)) = ticket else {
            return Ok(());
        };
        let mut state = self.group.state.lock();
        loop {
            if state.synced >= ticket {
                return Ok(());
            }
            // A failed fsync may have cost the OS's copy of any batch not yet synced, and a
            // later fsync would not say so: no batch after it is acknowledged.
            self.refuse_after_disk_failure()?;
            if state.covering >= ticket || state.syncing >= MAX_SYNCS {
                self.group.synced.wait(&mut state);
                continue;
            }
            let target = state.appended;
            state.syncing += 1;
            state.covering = state.covering.max(target);
            drop(state);
            let result = self.sync_journal();
            state = self.group.state.lock();
            state.syncing -= 1;
            if result.is_ok() {
                state.synced = state.synced.max(target);
            }
            self.group.synced.notify_all();
            result?;
        }
    }

    /// The answer of every sync (and of `flush` and `close`) once a write or an fsync of the
    /// records failed at the disk.
    pub(super) fn refuse_after_disk_failure(&self) -> Result<()> {
        if self
            .group
            .write_failed
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(Error::new(
                crate::error::ErrorKind::Storage,
                "a write or an fsync of the journal failed at the disk: what was not acknowledged may not be durable, the store takes no more writes and was not closed cleanly; reopen it (the journal is replayed)",
            ));
        }
        Ok(())
    }

    /// Makes every batch committed so far durable. fjall's own `persist` holds its journal
    /// lock through the fsync, and every commit needs that lock to append, so writers would
    /// queue behind each fsync holding their scopes' locks. Instead the lock is held only to
    /// move fjall's buffered journal bytes to the OS, and the fsync runs on our own descriptor
    /// of the journal file, while the next batches append. A failure refuses every later
    /// commit (`write_failed`), as fjall poisons itself after its own.
    pub(super) fn sync_journal(&self) -> Result<()> {
        let result = self
            .db
            .persist(PersistMode::Buffer)
            .map_err(st("writing the journal"))
            .and_then(|()| {
                let (id, file) = self.group.active_journal.lock().current()?;
                file.sync_data().map_err(|e| {
                    self.group.active_journal.lock().forget(id);
                    Error::io(format!("syncing the journal {id}.jnl"), e)
                })
            });
        if result.is_err() {
            self.group
                .write_failed
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        result
    }

    /// Waits while the index changes not yet committed are more than a bound: every one holds
    /// its record's text until the indexer commits it, so a writer faster than the indexer (a
    /// large import) would otherwise grow memory without limit. Called after a write's scope
    /// lock is released.
    pub(super) fn index_backpressure(&self) {
        let bound = self.queue.commit_every.saturating_mul(8).max(4096);
        let mut ops = self.queue.ops.lock();
        // A failing index (a full disk) keeps its changes for the next open: no point waiting.
        while ops.changes > bound
            && !self.queue.stop.load(std::sync::atomic::Ordering::SeqCst)
            && !self
                .queue
                .degraded
                .load(std::sync::atomic::Ordering::SeqCst)
        {
            self.queue.wake.notify_one();
            self.queue
                .drained
                .wait_for(&mut ops, std::time::Duration::from_millis(100));
        }
    }

    pub(super) fn allocate_op(&self) -> u64 {
        let mut ops = self.queue.ops.lock();
        let op = ops.next;
        ops.next += 1;
        ops.in_flight.insert(op);
        op
    }

    /// Commits `tx` with an outbox entry naming the records of `ops_for_index` (when any),
    /// applies its changes to the scope's derived state, and registers the index changes as
    /// pending. The caller holds the scope's write lock; the returned ticket says when the
    /// batch is durable.
    pub(super) fn commit_with_outbox(
        &self,
        scope: &ScopeKey,
        state: &Scope,
        tx: Tx,
        ops_for_index: Vec<IndexOp>,
    ) -> Result<Ticket> {
        let Tx {
            mut batch,
            changes,
            meta,
            norms,
            day,
            journaled,
            ..
        } = tx;
        let grew = [(scope, journaled)];
        let grew = if journaled.entries > 0 {
            &grew[..]
        } else {
            &[]
        };
        if let Some(m) = meta {
            batch.insert(&self.ks.scopes, scope.as_str(), codec::encode(&m)?);
        }
        for (key, (seqs, dirty)) in norms {
            if !dirty {
                continue;
            }
            if seqs.is_empty() {
                batch.remove(&self.ks.norms, key);
            } else {
                batch.insert(&self.ks.norms, key, codec::encode(&seqs)?);
            }
        }
        if let Some((d, counters)) = &day {
            batch.insert(
                &self.ks.counters,
                codec::counters_key(*d, scope),
                codec::encode(counters)?,
            );
        }
        let op = (!ops_for_index.is_empty()).then(|| self.allocate_op());
        let result = match op {
            Some(op) => {
                let ids: Vec<&str> = ops_for_index.iter().map(IndexOp::id).collect();
                codec::encode(&ids).and_then(|v| {
                    batch.insert(&self.ks.outbox, op.to_be_bytes(), v);
                    self.append_growing(batch, grew)
                })
            }
            None => self.append_growing(batch, grew),
        };
        let ticket = match result {
            Ok(t) => t,
            Err(e) => {
                if let Some(op) = op {
                    self.queue.ops.lock().in_flight.remove(&op);
                }
                return Err(e);
            }
        };
        // The batch is visible: the derived state follows it before anyone is answered.
        self.apply_changes(scope, state, &changes, meta);
        if day.is_some() {
            self.scopes.update(scope, state, |d| d.day = day);
        }
        let Some(op) = op else {
            return Ok(ticket);
        };
        // The writer never touches tantivy: the indexer thread stages and commits, so a write
        // never waits behind an index commit. Until then `pending` answers for it.
        let docs: Vec<PendingDoc> = ops_for_index
            .iter()
            .filter_map(PendingDoc::from_op)
            .collect();
        let wake = {
            let mut ops = self.queue.ops.lock();
            ops.in_flight.remove(&op);
            ops.add(op, ops_for_index, docs);
            ops.changes >= self.queue.commit_every
        };
        if wake {
            self.queue.wake.notify_one();
        }
        Ok(ticket)
    }
}

#[cfg(test)]
mod tests {
    use super::ActiveJournal;

    #[test]
    fn the_active_journal_follows_a_rotation_and_reopens_after_a_failure() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut journal = ActiveJournal::new(dir.path().to_owned());
        assert!(
            journal.current().is_err(),
            "no journal file is an error, not a silent success"
        );
        std::fs::write(dir.path().join("3.jnl"), b"sealed").expect("write");
        std::fs::write(dir.path().join("4.jnl"), b"active").expect("write");
        std::fs::write(dir.path().join("40.sst"), b"not a journal").expect("write");
        let (id, file) = journal.current().expect("found");
        assert_eq!(id, 4, "the highest number is the active journal");
        file.sync_data().expect("a read descriptor fsyncs");
        // fjall's rotation creates exactly the next number.
        std::fs::write(dir.path().join("5.jnl"), b"").expect("write");
        assert_eq!(journal.current().expect("found").0, 5);
        assert_eq!(journal.current().expect("found").0, 5, "kept open");
        journal.forget(4);
        assert!(
            journal.open.is_some(),
            "forgetting another file keeps this one"
        );
        journal.forget(5);
        assert!(journal.open.is_none());
        assert_eq!(journal.current().expect("reopened").0, 5);
    }
}
