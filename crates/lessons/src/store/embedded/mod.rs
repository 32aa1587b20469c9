//! `EmbeddedStore`: records in fjall, keyword search in tantivy, one atomic batch per write.
//!
//! A write, top down (`ops` → `write` → `shared` → `group`): under the scope's lock, read the
//! scope's bookkeeping and exactly what the planner needs (point lookups, never a scan), plan
//! (pure), turn the plan into one transaction (`tx`, filled by `records`), and commit it: the
//! records, bumps, flips, evictions, the scope's bookkeeping, the day's counters, the decision
//! journal's entries and one outbox entry go to fjall as one numbered batch; the scope's derived
//! state (`scopes`) follows it and the index changes are queued (`queue`). The writer releases
//! the scope's lock and waits for the group's fsync (`group`) before it is acknowledged.
//!
//! Index consistency: the outbox entry names every record whose index document the write
//! changes. The indexer thread (`indexer`) stages the queued changes into tantivy and commits
//! in groups (every 16,384 document changes or 5 s) with the highest operation it covers as the
//! commit's payload (the watermark), then trims the outbox up to it. A write never waits behind
//! an index commit. On open, outbox entries above the watermark are replayed; a missing
//! watermark or a document count that disagrees with the records triggers a rebuild.
//!
//! Read-your-writes: operations not yet in a committed index are kept in the queue by scope,
//! and `retrieve` matches their records itself, so a write is visible to `retrieve` as soon as
//! `write` returns. Stale index entries are harmless: every hit is hydrated from fjall and
//! dropped unless active.

mod builder;
mod decisions;
mod doctor;
mod evidence;
mod group;
mod indexer;
mod journal_entries;
mod journal_merge;
mod journal_texts;
mod lru;
mod ops;
mod order;
pub(crate) mod phases;
mod queue;
mod records;
mod retrieve;
mod scope_tx;
mod scopes;
mod search;
mod shared;
mod totals;
mod tx;
mod upgrade;
mod uses;
mod window;
mod write;

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};
use crate::model::ScopeKey;
use crate::store::engine::{describe_fjall, locked};
use crate::store::index::KeywordIndex;
use crate::store::{durable, fjall_files};
use crate::time::system_clock;
use decisions::DecisionJournal;
use evidence::Witnesses;
use group::GroupCommit;
use queue::IndexQueue;
use records::Records;
use scopes::Scopes;
use shared::Shared;
use upgrade::Upgrade;
use uses::UseQueue;

pub use builder::{Durability, EmbeddedStoreBuilder, DEFAULT_CACHE_BYTES};
pub use doctor::Health;
pub(crate) use evidence::{read_next_ids, NextIds};

/// The embedded store: see the module docs.
pub struct EmbeddedStore {
    shared: Arc<Shared>,
    indexer: Option<JoinHandle<()>>,
    /// The use committer (`retrieve::commit_uses`).
    committer: Option<JoinHandle<()>>,
}

impl EmbeddedStoreBuilder {
    /// Opens (or creates) the store in `dir`.
    pub fn open(self, dir: impl AsRef<Path>) -> Result<EmbeddedStore> {
        let dir = dir.as_ref();
        EmbeddedStore::open_checked(self, dir).map_err(|e| explain_with_the_disk(e, dir))
    }
}

impl EmbeddedStore {
    /// A builder with the defaults: cap 500, fsync per write, wall clock.
    pub fn builder() -> EmbeddedStoreBuilder {
        EmbeddedStoreBuilder::default()
    }

    /// Opens (or creates) a store in `dir` with the defaults.
    pub fn open(dir: impl AsRef<Path>) -> Result<EmbeddedStore> {
        EmbeddedStore::builder().open(dir)
    }

    fn open_checked(b: EmbeddedStoreBuilder, dir: &Path) -> Result<EmbeddedStore> {
        crate::store::validate::check_cap(b.cap).map_err(Error::invalid)?;
        durable::create_dir(dir)?;
        let dir_lock = lock_store_dir(dir)?;
        let records_dir = dir.join("records");
        fjall_files::restore_lock(&records_dir)?;
        fjall_files::check_before_open(dir, &records_dir)?;
        let records = crate::store::background::open("the records", || {
            Records::open(dir, &records_dir, b.cache_bytes)
        })?;
        let upgrade = Upgrade::needed(&records, dir)?;
        let opened = crate::store::background::open("the keyword index", || {
            KeywordIndex::open(&dir.join("index"))
        })?;
        // Before anything is acknowledged: the names of `records/` and `index/` in `dir`,
        // and what fjall created in `records/` without syncing it.
        fjall_files::sync_names(dir, &records_dir)?;
        let last_batch = records.last_batch()?;
        let witness = Witnesses::open(dir, last_batch, opened.watermark)?;
        let clock = b.clock.unwrap_or_else(system_clock);
        let ks = records.keyspaces();
        let group = GroupCommit::new(
            records.db().clone(),
            ks.meta.clone(),
            ks.named().map(|(_, ks)| ks.clone()).to_vec(),
            records_dir,
            b.durability == Durability::Sync,
            last_batch,
        );
        let journal = DecisionJournal::new(
            records.db().clone(),
            ks.decisions.clone(),
            ks.meta.clone(),
            (b.journal_days, b.journal_cap),
            last_batch,
            Arc::clone(&clock),
        );
        let shared = Arc::new(Shared {
            _dir_lock: dir_lock,
            dir: dir.to_owned(),
            records,
            index: opened.index,
            scopes: Scopes::new(b.scope_cache),
            queue: IndexQueue::new(b.commit_every, b.commit_interval),
            group,
            journal,
            uses: UseQueue::new(),
            witness,
            clock,
            cap: b.cap,
        });
        upgrade.apply(&shared)?;
        indexer::recover(&shared, opened.watermark)?;
        let worker = Arc::clone(&shared);
        let indexer = std::thread::Builder::new()
            .name("lessons-indexer".into())
            .spawn(move || {
                crate::store::background::lower_this_thread();
                indexer::run(&worker)
            })
            .map_err(|e| Error::io("starting the indexer thread", e))?;
        let mut store = EmbeddedStore {
            shared,
            indexer: Some(indexer),
            committer: None,
        };
        let worker = Arc::clone(&store.shared);
        // On failure the store drops, which stops the indexer it started.
        let committer = std::thread::Builder::new()
            .name("lessons-uses".into())
            .spawn(move || {
                crate::store::background::lower_this_thread();
                retrieve::commit_uses(&worker)
            })
            .map_err(|e| Error::io("starting the use committer thread", e))?;
        store.committer = Some(committer);
        Ok(store)
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Commits the keyword index now and makes every acknowledged write durable on disk.
    pub fn flush(&self) -> Result<()> {
        self.shared.uses.drained();
        indexer::commit(&self.shared)?;
        // A later fsync would succeed over pages the OS may have dropped.
        self.shared.group.persist_all()
    }

    /// Checks that the index holds exactly the active records.
    pub fn check(&self) -> Result<Health> {
        self.shared.uses.drained();
        indexer::commit(&self.shared)?;
        doctor::check(&self.shared)
    }

    /// Rewrites the scopes' bookkeeping and dedup keys from the records, stores whole (without
    /// a text) each journal entry whose record is gone, then rebuilds the keyword index from
    /// the records. A store that lost acknowledged writes (its journal was cut)
    /// accepts the loss: each scope's next id moves past every id the index knew, so none is
    /// handed out again. Data that does not read is refused: only a salvage reads around it.
    pub fn repair(&self) -> Result<Health> {
        let s = &*self.shared;
        s.uses.drained();
        doctor::accept_loss(s)?;
        doctor::repair_bookkeeping(s)?;
        s.journal.repair_orphaned(&s.records, &s.group)?;
        indexer::rebuild(s)?;
        s.queue.restored();
        doctor::check(s)
    }

    /// Stops the indexer, commits the index, moves the records from memory into tables and
    /// persists them, then records the clean close. Only a failure to persist the records is an
    /// error: every write was acknowledged after its own batch was durable, and an index commit
    /// that fails (a full disk) is logged and redone from the outbox at the next open, so it
    /// must not make a caller report an applied write as failed.
    pub fn close(mut self) -> Result<()> {
        self.close_inner()
    }

    /// Makes `scope`'s next id at least `next_seq`, so ids acknowledged for records that were
    /// lost are never handed out again (salvage).
    pub(crate) fn reserve_ids(&self, scope: &ScopeKey, next_seq: u64) -> Result<()> {
        scope_tx::change(&self.shared, scope, |tx| {
            tx.reserve(next_seq);
            Ok(())
        })
    }

    /// Drops the store the way a killed process leaves it: the journal holds every batch, but
    /// nothing is moved into tables and no clean close is recorded. For fault tests, which
    /// cannot kill their own process; not API (the hidden `__internals` feature).
    #[cfg(any(test, feature = "__internals"))]
    #[doc(hidden)]
    pub fn close_as_crash(mut self) {
        self.stop_committer();
        self.stop_indexer();
    }

    fn close_inner(&mut self) -> Result<()> {
        // Every use handed over is committed before the records are flushed.
        self.shared.uses.drained();
        self.stop_committer();
        self.stop_indexer();
        let s = &*self.shared;
        if let Err(e) = indexer::commit(s) {
            log::warn!(
                "[store] the keyword index was not committed ({e}); the next open brings it up to date from the records"
            );
        }
        if let Err(e) = s.index.finish() {
            log::warn!("[store] {e}");
        }
        // Records still only in memtables live only in the journal, which every open replays
        // and which is the only copy if the journal is lost. Flushed to tables, a clean store
        // opens without replaying them and survives the loss of its journal.
        let in_tables = if s.group.failed() {
            log::warn!(
                "[store] a write failed at the disk: records stay in the journal, which the next open replays"
            );
            false
        } else {
            if let Err(e) = s.journal.save_tallies(&s.group) {
                log::warn!("[store] {e}; the next open counts each scope's decision journal again");
            }
            flush_memtables(&s.records)
        };
        s.group.persist_all()?;
        // Every batch is in tables and no write can start: the journal is spent.
        if in_tables {
            match fjall_files::empty_flushed(&s.dir.join("records")) {
                Ok(bytes) => log::debug!("[store] emptied {bytes} bytes of spent journal at close"),
                Err(e) => log::warn!(
                    "[store] the spent journal was not emptied ({e}); the next open replays it"
                ),
            }
        }
        if let Err(e) = s.witness.closed_cleanly(s.group.last_batch()) {
            log::warn!("[store] the clean close was not recorded: {e}");
        }
        Ok(())
    }

    /// Stops the use committer; what it has not committed yet is dropped.
    fn stop_committer(&mut self) {
        self.shared.uses.stop();
        if let Some(handle) = self.committer.take() {
            let _ = handle.join();
        }
    }

    fn stop_indexer(&mut self) {
        if let Some(handle) = self.indexer.take() {
            self.shared.queue.stop();
            let _ = handle.join();
        }
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        if self.indexer.is_some() {
            let _ = self.close_inner();
        }
    }
}

/// Takes the store directory's exclusive lock, or says who holds it.
pub(super) fn lock_store_dir(dir: &Path) -> Result<std::fs::File> {
    let file = std::fs::File::open(dir)
        .map_err(|e| Error::io(format!("opening {} to lock it", dir.display()), e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(locked(dir)),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(Error::io(format!("locking {}", dir.display()), e))
        }
    }
}

/// Moves every keyspace's memtable into a table, waiting at most a few seconds: a flush that
/// cannot finish (the disk filled since the last write) must not hold a close forever, and
/// what it did not flush the journal still holds. (fjall's own `rotate_memtable_and_wait`
/// waits without a bound.) True when every record is in tables: no keyspace has a sealed
/// memtable left, and none has anything in its active one (a rotation finds nothing to seal).
fn flush_memtables(records: &Records) -> bool {
    let all = records.keyspaces().named().map(|(_, ks)| ks);
    for ks in all {
        if let Err(e) = ks.rotate_memtable() {
            log::warn!(
                "[store] records were left in the journal at close: {}",
                describe_fjall(&e)
            );
            return false;
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while all.iter().any(|ks| ks.sealed_memtable_count() > 0) {
        if std::time::Instant::now() > deadline {
            log::warn!(
                "[store] moving the records into tables did not finish in 10 s; the journal keeps them"
            );
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // No write runs at close, so this only confirms that every active memtable is empty.
    let empty = all
        .iter()
        .all(|ks| matches!(ks.rotate_memtable(), Ok(false)) && ks.sealed_memtable_count() == 0);
    // fjall's count of memtable bytes also covers any keyspace the store does not name; a
    // flush worker lowers it just after it retires the memtable it flushed.
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while empty && records.db().write_buffer_size() > 0 {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    empty
}

/// An open that failed in the engines may have failed for the disk: tantivy reports a full disk
/// as "an index writer was killed", fjall sometimes as a poisoned database. When a small write
/// to the store's directory fails too, the error says what the disk said.
fn explain_with_the_disk(e: Error, dir: &Path) -> Error {
    if !matches!(e.kind(), ErrorKind::Index | ErrorKind::Storage) || e.io_kind().is_some() {
        return e;
    }
    let probe = dir.join(".disk-probe");
    let written = std::fs::File::create(&probe).and_then(|mut f| {
        use std::io::Write;
        f.write_all(&[0u8; 256 << 10])?;
        f.sync_all()
    });
    let _ = std::fs::remove_file(&probe);
    match written {
        Ok(()) => e,
        Err(io) => Error::new(
            ErrorKind::Storage,
            format!(
                "{} (the disk refused a write: {io}; free space, then open the store again: every acknowledged write is kept)",
                e.message()
            ),
        )
        .with_source(io),
    }
}
