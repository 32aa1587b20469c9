//! Group commit: every batch is numbered and appended to fjall's journal, and one fsync covers
//! every batch appended before it started, shared by the writers waiting on it.
//!
//! **Invariant:** batch numbers follow the journal's order: a number is taken and its batch
//! committed under one lock, and the number goes into the batch itself (`meta`, `last
//! batch`), so the records always say which batch was the last to survive (see `evidence`).
//! **Invariant:** once a write or an fsync failed at the disk, nothing more is committed or
//! acknowledged: the OS may have dropped the journal's dirty pages while a later fsync still
//! reports success.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fjall::{Database, Keyspace, OwnedWriteBatch, PersistMode};
use parking_lot::{Condvar, Mutex};

use super::phases::{self, Phase};
use crate::error::{Error, ErrorKind, Result};
use crate::store::codec;
use crate::store::engine::st;
use crate::store::fjall_files;
use crate::store::upkeep::{SyncClock, SyncTimes};

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

/// The batches committed to the records: their numbers, their fsyncs, and the latch that
/// refuses everything after a disk failure.
pub(super) struct GroupCommit {
    db: Database,
    /// Where each batch records its number.
    meta: Keyspace,
    /// The keyspaces a batch may write to, whose unflushed memtables halt a commit.
    keyspaces: Vec<Keyspace>,
    /// Acknowledge a write only after its batch is fsynced.
    sync_writes: bool,
    state: Mutex<SyncState>,
    synced: Condvar,
    /// The number of the last batch committed.
    batches: Mutex<u64>,
    /// A write or a sync of the records failed (a full disk).
    failed: AtomicBool,
    /// The active journal file, opened by us to fsync it without fjall's journal lock. Only
    /// the writer running a group's fsync touches it.
    journal: Mutex<ActiveJournal>,
    /// How long each of those fsyncs took.
    sync_clock: SyncClock,
}

/// Group commit: writers append their batch to the journal, then one fsync covers every batch
/// appended before it started.
#[derive(Default)]
struct SyncState {
    /// Batches appended (a ticket each).
    appended: u64,
    /// Every ticket at or below this is on disk.
    synced: u64,
    /// The highest ticket an fsync started so far covers: a writer at or below it waits for
    /// that fsync instead of starting one (if it fails, `failed` says so).
    covering: u64,
    /// fsyncs running now.
    syncing: usize,
}

/// fjall halts a commit while a keyspace it writes has this many memtables waiting for their
/// flush (`Keyspace::local_backpressure`, after the journal append, inside `commit`).
const ENGINE_HALT_SEALED: usize = 4;

/// How often a write held back by unflushed memtables looks again: a flush takes milliseconds.
const FLUSH_POLL: Duration = Duration::from_millis(2);

/// fsyncs of the journal that may run at once. A batch appended while one runs is not covered
/// by it; a second one started at once, rather than after it, shortens that batch's wait.
const MAX_SYNCS: usize = 2;

impl GroupCommit {
    /// The group commit of `db`, whose journal files are in `records`, after batch `last`;
    /// its batches write to `keyspaces`.
    pub(super) fn new(
        db: Database,
        meta: Keyspace,
        keyspaces: Vec<Keyspace>,
        records: PathBuf,
        sync_writes: bool,
        last: u64,
    ) -> GroupCommit {
        GroupCommit {
            db,
            meta,
            keyspaces,
            sync_writes,
            state: Mutex::new(SyncState::default()),
            synced: Condvar::new(),
            batches: Mutex::new(last),
            failed: AtomicBool::new(false),
            journal: Mutex::new(ActiveJournal::new(records)),
            sync_clock: SyncClock::new(),
        }
    }

    /// How long the journal's group fsyncs took since open.
    pub(super) fn sync_times(&self) -> SyncTimes {
        self.sync_clock.read()
    }

    /// Commits `batch` numbered (visible to readers at once), then calls `after` under the
    /// same lock, so what `after` counts follows the journal's order. `doing` names the batch
    /// in an error.
    pub(super) fn commit(
        &self,
        mut batch: OwnedWriteBatch,
        doing: &str,
        after: impl FnOnce(),
    ) -> Result<()> {
        phases::time(Phase::FlushWait, || self.wait_for_flushes());
        let mut last = phases::time(Phase::CommitLock, || self.batches.lock());
        // fjall poisons itself after its own failures; `sync`'s fsync is ours.
        if self.failed() {
            return Err(crate::store::engine::storage(doing, fjall::Error::Poisoned));
        }
        let number = *last + 1;
        batch.insert(&self.meta, codec::LAST_BATCH, number.to_be_bytes());
        if let Err(e) = phases::time(Phase::Commit, || batch.commit()) {
            self.failed.store(true, Ordering::SeqCst);
            return Err(crate::store::engine::storage(doing, e));
        }
        *last = number;
        after();
        Ok(())
    }

    /// Waits while a keyspace has as many unflushed memtables as make fjall halt a commit.
    /// fjall's halt runs inside `commit`, under `batches`, where one writer's wait would be
    /// every writer's; waiting here, before the lock, keeps it this writer's own. (A check,
    /// then a commit: another writer may fill a memtable between them, and fjall's own halt,
    /// a short poll in the patched engine, still holds the line.)
    fn wait_for_flushes(&self) {
        while self
            .keyspaces
            .iter()
            .any(|ks| ks.sealed_memtable_count() >= ENGINE_HALT_SEALED)
        {
            std::thread::sleep(FLUSH_POLL);
        }
    }

    /// [`commit`](Self::commit), and the ticket to wait on before acknowledging the batch.
    pub(super) fn append(
        &self,
        batch: OwnedWriteBatch,
        doing: &str,
        after: impl FnOnce(),
    ) -> Result<Ticket> {
        self.commit(batch, doing, after)?;
        if !self.sync_writes {
            return Ok(Ticket(None));
        }
        let mut state = self.state.lock();
        state.appended += 1;
        Ok(Ticket(Some(state.appended)))
    }

    /// Commits `batch` and waits until it is durable.
    pub(super) fn append_durably(&self, batch: OwnedWriteBatch, doing: &str) -> Result<()> {
        let ticket = self.append(batch, doing, || {})?;
        self.wait_durable(ticket)
    }

    /// Runs `f` while no batch commits (a count that must see every batch before it and none
    /// after it).
    pub(super) fn between_commits<T>(&self, f: impl FnOnce() -> T) -> T {
        let _commits = self.batches.lock();
        f()
    }

    /// The number of the last batch committed.
    pub(super) fn last_batch(&self) -> u64 {
        *self.batches.lock()
    }

    /// Makes the next batch number at least `witnessed + 1` (a loss was accepted: no number a
    /// witness saw is reused).
    pub(super) fn skip_past(&self, witnessed: u64) {
        let mut batches = self.batches.lock();
        *batches = (*batches).max(witnessed);
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
        let mut state = self.state.lock();
        loop {
            if state.synced >= ticket {
                return Ok(());
            }
            // A failed fsync may have cost the OS's copy of any batch not yet synced, and a
            // later fsync would not say so: no batch after it is acknowledged.
            self.refuse_after_failure()?;
            if state.covering >= ticket || state.syncing >= MAX_SYNCS {
                self.synced.wait(&mut state);
                continue;
            }
            let target = state.appended;
            state.syncing += 1;
            state.covering = state.covering.max(target);
            drop(state);
            let result = self.sync();
            state = self.state.lock();
            state.syncing -= 1;
            if result.is_ok() {
                state.synced = state.synced.max(target);
            }
            self.synced.notify_all();
            result?;
        }
    }

    /// Whether a write or an fsync of the records failed at the disk.
    pub(super) fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// The answer of every sync (and of `flush` and `close`) once a write or an fsync of the
    /// records failed at the disk.
    pub(super) fn refuse_after_failure(&self) -> Result<()> {
        if self.failed() {
            return Err(Error::new(
                ErrorKind::Storage,
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
    /// commit, as fjall poisons itself after its own.
    pub(super) fn sync(&self) -> Result<()> {
        let result = self
            .db
            .persist(PersistMode::Buffer)
            .map_err(st("writing the journal"))
            .and_then(|()| {
                let (id, file) = self.journal.lock().current()?;
                let started = Instant::now();
                let synced = file.sync_data();
                self.sync_clock.record(started.elapsed());
                synced.map_err(|e| {
                    self.journal.lock().forget(id);
                    Error::io(format!("syncing the journal {id}.jnl"), e)
                })
            });
        if result.is_err() {
            self.failed.store(true, Ordering::SeqCst);
        }
        result
    }

    /// fjall's own `persist(SyncAll)`: the journal and its directory, at a flush or a close.
    pub(super) fn persist_all(&self) -> Result<()> {
        self.refuse_after_failure()?;
        self.db
            .persist(PersistMode::SyncAll)
            .map_err(st("persisting the journal"))
    }
}

/// Our own descriptor of fjall's active journal, to fsync it outside fjall's journal lock.
///
/// Why fsyncing it covers every batch committed before `GroupCommit::sync` moved fjall's buffer
/// to the OS: those bytes are in the journal that was active then. If it is still the active
/// one, it is the highest-numbered file, which `current` finds after the move. If fjall rotated
/// it since, the rotation fsynced it (`SyncAll`) before the next file took its place, so it is
/// already durable and fsyncing the next file is enough, once that file's name is durable: the
/// patched engine's rotation renames a prepared spare to it and fsyncs the directory only after
/// releasing its lock, so `current` fsyncs the directory itself whenever it opens a journal.
struct ActiveJournal {
    records: PathBuf,
    open: Option<(u64, Arc<std::fs::File>)>,
}

impl ActiveJournal {
    fn new(records: PathBuf) -> ActiveJournal {
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
            let next = fjall_files::journal_path(&self.records, id + 1);
            let rotated = next
                .try_exists()
                .map_err(|e| Error::io(format!("looking for {}", next.display()), e))?;
            if !rotated {
                return Ok((*id, Arc::clone(file)));
            }
        }
        let (id, path) = fjall_files::active_journal(&self.records)?;
        // Its name must be durable before any batch in it is acknowledged.
        crate::store::durable::sync_dir(&self.records)?;
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
