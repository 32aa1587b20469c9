//! `EmbeddedStore`: records in fjall, keyword search in tantivy, one atomic batch per write.
//!
//! Write path (per scope, under that scope's lock): read the scope's bookkeeping, read what the
//! planner needs (point lookups, never a scan), plan, then apply everything — inserts, bumps,
//! flips, evictions, the scope's bookkeeping, the day's counters and one outbox entry — as one
//! fjall batch, fsynced unless the store was opened [`Durability::Buffered`]. Only then are the
//! index changes queued in memory for the indexer thread, and the write acknowledged.
//!
//! Index consistency: the outbox entry names every record whose index document the write
//! changes. Writers only queue the index changes in memory; the indexer thread stages them into
//! tantivy and commits in groups (every 4,096 document changes or 1 s) with the highest
//! operation it covers as the commit's payload (the watermark), then trims the outbox up to it. A
//! write never waits behind an index commit. On open, outbox entries above the watermark are replayed; a missing
//! watermark or a document count that disagrees with the records triggers a rebuild.
//!
//! Read-your-writes: operations not yet in a committed index are kept in memory by scope;
//! `retrieve` adds their records to the BM25 candidates, so a write is visible to `retrieve` as
//! soon as `write` returns. Stale index entries are harmless: every hit is hydrated from fjall
//! and dropped unless active.

mod builder;
mod commit;
mod decisions;
mod derived;
mod doctor;
mod evidence;
mod indexer;
mod ops;
mod order;
mod records;
mod retrieve;
mod scopes;
mod search;
mod totals;
mod window;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use parking_lot::{Condvar, Mutex};

use super::codec;
use crate::error::{Error, ErrorKind, Result};
use crate::limits::MAX_CAP;
use crate::model::ScopeKey;
use crate::store::index::KeywordIndex;
use crate::time::{system_clock, Clock};
use commit::SyncState;
use indexer::Ops;
use scopes::Scopes;

/// The newest facts a scope's window holds: any fact list without a query up to the largest
/// limit is answered from it.
const WINDOW_LEN: usize = crate::limits::MAX_LIMIT;

pub use builder::{Durability, EmbeddedStoreBuilder, DEFAULT_CACHE_BYTES};
pub use doctor::Health;
pub(crate) use evidence::{read_next_ids, NextIds};

struct Keyspaces {
    active: Keyspace,
    retired: Keyspace,
    norms: Keyspace,
    scopes: Keyspace,
    counters: Keyspace,
    outbox: Keyspace,
    meta: Keyspace,
    decisions: Keyspace,
    usage: Keyspace,
}

impl Keyspaces {
    fn all(&self) -> [&Keyspace; 9] {
        [
            &self.active,
            &self.retired,
            &self.norms,
            &self.scopes,
            &self.counters,
            &self.outbox,
            &self.meta,
            &self.decisions,
            &self.usage,
        ]
    }
}

struct Shared {
    /// An exclusive `flock` on the store directory, held for the store's life: a directory
    /// cannot be deleted and recreated under a running owner the way a lock file can.
    _dir_lock: std::fs::File,
    dir: PathBuf,
    db: Database,
    ks: Keyspaces,
    index: KeywordIndex,
    /// Each scope's write lock and its derived state, bounded (see `scopes`).
    scopes: Scopes,
    /// The index changes waiting for the indexer, and its cadence.
    queue: IndexQueue,
    /// Batches, their numbers and their fsyncs, shared by concurrent writers.
    group: GroupCommit,
    /// The decision journal's keys and retention.
    journal: JournalPolicy,
    /// What the store knows of lost or damaged data.
    witness: Witnesses,
    clock: Clock,
    cap: usize,
}

/// The index changes waiting for the indexer thread, and how it is woken and stopped.
struct IndexQueue {
    ops: Mutex<Ops>,
    /// Held while the index is staged and committed.
    committing: Mutex<()>,
    wake: Condvar,
    /// Signalled when a commit drained index changes (see `index_backpressure`).
    drained: Condvar,
    stop: AtomicBool,
    /// Set when staging or committing the index failed; the outbox keeps the gap for the next
    /// open and `doctor` reports it.
    degraded: AtomicBool,
    commit_every: usize,
    commit_interval: Duration,
}

/// Batches committed to the records, numbered, and fsynced together (see `commit`).
struct GroupCommit {
    /// Acknowledge a write only after its batch is fsynced.
    sync_writes: bool,
    state: Mutex<SyncState>,
    synced: Condvar,
    /// The number of the last batch committed (see `commit_batch`).
    batches: Mutex<u64>,
    /// A write or a sync of the records failed (a full disk): fjall takes no more writes, and a
    /// close must not wait for a flush that cannot happen.
    write_failed: AtomicBool,
    /// The active journal file, opened by us to fsync it without fjall's journal lock (see
    /// `commit::ActiveJournal`). Only the writer running the group's fsync touches it.
    active_journal: Mutex<commit::ActiveJournal>,
}

/// The decision journal's key counter and what pruning keeps.
struct JournalPolicy {
    /// Makes journal keys unique within a millisecond: seeded from the open time in
    /// nanoseconds, so it also grows across reopens.
    counter: std::sync::atomic::AtomicU64,
    days: u32,
    cap: usize,
    /// What the pruner knows of each scope's journal written since open (see `decisions`).
    /// Changed only under `GroupCommit::batches`, with the commits that grow a journal.
    tallies: Mutex<std::collections::HashMap<ScopeKey, decisions::Tally>>,
}

/// Lost and damaged data: what refuses writes, and which ids were ever acknowledged.
struct Witnesses {
    /// Set when the store can prove it lost acknowledged writes, or holds data that does not
    /// read: every write is refused with what happened and what to do (see `evidence`).
    damage: Mutex<Option<evidence::Damage>>,
    /// The witness of acknowledged ids, as last written (see `evidence::NextIds`).
    next_ids: Mutex<evidence::NextIds>,
}

/// The embedded store: see the module docs.
pub struct EmbeddedStore {
    shared: Arc<Shared>,
    indexer: Option<JoinHandle<()>>,
}

/// Opens fjall over `records` and its keyspaces, after checking its journal.
fn open_records(dir: &Path, records: &Path, cache_bytes: u64) -> Result<(Database, Keyspaces)> {
    // fjall's own lock is a file: one deleted (or never made, by a copy) would let fjall fail
    // with "No such file or directory", or a second process lock a fresh file. The directory
    // lock taken first is what excludes other processes, so recreating fjall's file is safe.
    if records.join("version").exists() && !records.join("lock").exists() {
        std::fs::File::create(records.join("lock"))
            .map_err(|e| Error::io(format!("recreating {}", records.join("lock").display()), e))?;
    }
    super::journal::check_before_open(dir, records)?;
    let db = match Database::builder(records)
        // Uncompressed, so `journal` can verify and salvage it without a decompressor.
        .journal_compression(fjall::CompressionType::None)
        .max_journaling_size(64 << 20)
        .cache_size(cache_bytes)
        .open()
    {
        Ok(db) => db,
        Err(fjall::Error::Locked) => return Err(locked(dir)),
        Err(e) => return Err(Error::storage(format!("opening {}", dir.display()), e)),
    };
    // Small memtables keep the journal that every open replays short.
    let open_ks = |name: &str| {
        db.keyspace(name, || {
            KeyspaceCreateOptions::default().max_memtable_size(8 << 20)
        })
        .map_err(|e| Error::storage(format!("opening keyspace {name}"), e))
    };
    let ks = Keyspaces {
        active: open_ks("active")?,
        retired: open_ks("retired")?,
        norms: open_ks("norms")?,
        scopes: open_ks("scopes")?,
        counters: open_ks("counters")?,
        outbox: open_ks("outbox")?,
        meta: open_ks("meta")?,
        decisions: open_ks("decisions")?,
        usage: open_ks("usage")?,
    };
    Ok((db, ks))
}

/// Whether the store is format 1 (its dedup keys to be rebuilt); a new store is marked with
/// the current format, a format 2 store too (it holds no usage entry yet, and the mark keeps
/// older builds from opening it), an unknown one refused.
fn needs_upgrade(ks: &Keyspaces, dir: &Path) -> Result<bool> {
    let format = ks
        .meta
        .get("format")
        .map_err(st("reading the format version"))?;
    match format.as_deref() {
        Some([codec::STORE_FORMAT]) => Ok(false),
        // Version 1 differs only in its dedup keys, which are derived.
        Some([1]) => Ok(true),
        Some([2]) => {
            log::info!(
                "[store] upgrading {} to format {}: retrieves record use in its own keyspace",
                dir.display(),
                codec::STORE_FORMAT
            );
            ks.meta
                .insert("format", [codec::STORE_FORMAT])
                .map_err(st("writing the format version"))?;
            Ok(false)
        }
        Some(v) => Err(Error::format(format!(
            "the store {} has format version {:?}; this build reads versions 1 to {}",
            dir.display(),
            v,
            codec::STORE_FORMAT
        ))),
        None => {
            ks.meta
                .insert("format", [codec::STORE_FORMAT])
                .map_err(st("writing the format version"))?;
            Ok(false)
        }
    }
}

/// The number of the last batch the records hold (0 for a new store).
fn read_last_batch(ks: &Keyspaces) -> Result<u64> {
    match ks
        .meta
        .get(codec::LAST_BATCH)
        .map_err(st("reading the last batch"))?
    {
        Some(v) => Ok(u64::from_be_bytes(v.as_ref().try_into().map_err(|_| {
            Error::format("the store's last batch number is not 8 bytes")
        })?)),
        None => Ok(0),
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

fn locked(dir: &Path) -> Error {
    Error::new(
        ErrorKind::Locked,
        format!(
            "the store {} is held by another process (a running `lessons serve`?); pass --server URL to use that server instead",
            dir.display()
        ),
    )
}

impl Shared {
    /// Refuses a write to a store that lost acknowledged writes or holds unreadable data.
    fn refuse_if_damaged(&self) -> Result<()> {
        match &*self.witness.damage.lock() {
            Some(d) => Err(d.refusal(&self.dir)),
            None => Ok(()),
        }
    }
}

fn st(doing: &str) -> impl FnOnce(fjall::Error) -> Error + '_ {
    move |e| Error::storage(doing, e)
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

    fn open_with(b: EmbeddedStoreBuilder, dir: &Path) -> Result<EmbeddedStore> {
        Self::open_checked(b, dir).map_err(|e| explain_with_the_disk(e, dir))
    }

    fn open_checked(b: EmbeddedStoreBuilder, dir: &Path) -> Result<EmbeddedStore> {
        if !(1..=MAX_CAP).contains(&b.cap) {
            return Err(Error::invalid(format!(
                "cap must be between 1 and {MAX_CAP}"
            )));
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let dir_lock = lock_store_dir(dir)?;
        let records = dir.join("records");
        let clean_close = evidence::read_clean_close(dir)?;
        let next_ids = evidence::read_next_ids(dir)?;
        let (db, ks) = open_records(dir, &records, b.cache_bytes)?;
        let upgrade = needs_upgrade(&ks, dir)?;
        let opened = KeywordIndex::open(&dir.join("index"))?;
        let last_batch = read_last_batch(&ks)?;
        let tallies = decisions::load_tallies(&ks.meta, last_batch);
        let damage = match evidence::read_marker(dir)? {
            Some(d) => Some(d),
            None => lost_writes(last_batch, opened.watermark, clean_close),
        };
        if let Some(d) = &damage {
            log::error!("[store] {}", d.describe(dir));
        }
        let shared = Arc::new(Shared {
            _dir_lock: dir_lock,
            dir: dir.to_owned(),
            db,
            ks,
            index: opened.index,
            scopes: Scopes::new(b.scope_cache),
            queue: IndexQueue {
                ops: Mutex::new(Ops::default()),
                committing: Mutex::new(()),
                wake: Condvar::new(),
                drained: Condvar::new(),
                stop: AtomicBool::new(false),
                degraded: AtomicBool::new(false),
                commit_every: b.commit_every,
                commit_interval: b.commit_interval,
            },
            group: GroupCommit {
                sync_writes: b.durability == Durability::Sync,
                state: Mutex::new(SyncState::default()),
                synced: Condvar::new(),
                batches: Mutex::new(last_batch),
                write_failed: AtomicBool::new(false),
                active_journal: Mutex::new(commit::ActiveJournal::new(records.clone())),
            },
            journal: JournalPolicy {
                counter: std::sync::atomic::AtomicU64::new(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos() as u64),
                ),
                days: b.journal_days,
                cap: b.journal_cap,
                tallies: Mutex::new(tallies),
            },
            witness: Witnesses {
                damage: Mutex::new(damage),
                next_ids: Mutex::new(next_ids),
            },
            clock: b.clock.unwrap_or_else(system_clock),
            cap: b.cap,
        });
        if upgrade {
            shared.upgrade_dedup_keys()?;
        }
        shared.recover(opened.watermark)?;
        let worker = Arc::clone(&shared);
        let indexer = std::thread::Builder::new()
            .name("lessons-indexer".into())
            .spawn(move || worker.run_indexer())
            .map_err(|e| Error::io("starting the indexer thread", e))?;
        Ok(EmbeddedStore {
            shared,
            indexer: Some(indexer),
        })
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Commits the keyword index now and makes every acknowledged write durable on disk.
    pub fn flush(&self) -> Result<()> {
        self.shared.commit_index()?;
        // A later fsync would succeed over pages the OS may have dropped.
        self.shared.refuse_after_disk_failure()?;
        self.shared
            .db
            .persist(PersistMode::SyncAll)
            .map_err(st("persisting the journal"))
    }

    /// Checks that the index holds exactly the active records.
    pub fn check(&self) -> Result<Health> {
        self.shared.commit_index()?;
        self.shared.check()
    }

    /// Rewrites the scopes' bookkeeping and dedup keys from the records, then rebuilds the
    /// keyword index from them. A store that lost acknowledged writes (its journal was cut)
    /// accepts the loss: each scope's next id moves past every id the index knew, so none is
    /// handed out again. Data that does not read is refused: only a salvage reads around it.
    pub fn repair(&self) -> Result<Health> {
        self.shared.accept_loss()?;
        self.shared.repair_bookkeeping()?;
        self.shared.rebuild_index()?;
        self.shared.queue.degraded.store(false, Ordering::SeqCst);
        self.shared.check()
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
        let s = &*self.shared;
        let state = s.scopes.get(scope);
        let guard = state.write.lock();
        let meta = s.scope_meta(scope, &state)?;
        if meta.next_seq >= next_seq {
            return Ok(());
        }
        let mut tx = s.tx(&state);
        tx.meta = Some(codec::ScopeMeta { next_seq, ..meta });
        let ticket = s.commit_with_outbox(scope, &state, tx, Vec::new())?;
        drop(guard);
        s.wait_durable(ticket)
    }

    /// Drops the store the way a killed process leaves it: the journal holds every batch, but
    /// nothing is moved into tables and no clean close is recorded. For fault tests, which
    /// cannot kill their own process.
    #[doc(hidden)]
    pub fn close_as_crash(mut self) {
        self.stop_indexer();
    }

    fn close_inner(&mut self) -> Result<()> {
        self.stop_indexer();
        let s = &*self.shared;
        if let Err(e) = s.commit_index() {
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
        if !s.group.write_failed.load(Ordering::SeqCst) {
            if let Err(e) = s.save_tallies() {
                log::warn!("[store] {e}; the next open counts each scope's decision journal again");
            }
        }
        let in_tables = if s.group.write_failed.load(Ordering::SeqCst) {
            log::warn!(
                "[store] a write failed at the disk: records stay in the journal, which the next open replays"
            );
            false
        } else {
            flush_memtables(s)
        };
        s.refuse_after_disk_failure()?;
        s.db.persist(PersistMode::SyncAll)
            .map_err(st("persisting the journal"))?;
        // Every batch is in tables and no write can start: the journal is spent.
        if in_tables {
            match super::journal::empty_flushed(&s.dir.join("records")) {
                Ok(bytes) => log::debug!("[store] emptied {bytes} bytes of spent journal at close"),
                Err(e) => log::warn!(
                    "[store] the spent journal was not emptied ({e}); the next open replays it"
                ),
            }
        }
        if let Err(e) = evidence::write_clean_close(&s.dir, s.last_batch()) {
            log::warn!("[store] the clean close was not recorded: {e}");
        }
        Ok(())
    }

    fn stop_indexer(&mut self) {
        if let Some(handle) = self.indexer.take() {
            {
                let _ops = self.shared.queue.ops.lock();
                self.shared.queue.stop.store(true, Ordering::SeqCst);
                self.shared.queue.wake.notify_all();
            }
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

/// Moves every keyspace's memtable into a table, waiting at most a few seconds: a flush that
/// cannot finish (the disk filled since the last write) must not hold a close forever, and
/// what it did not flush the journal still holds. (fjall's own `rotate_memtable_and_wait`
/// waits without a bound.) True when every record is in tables: no keyspace has a sealed
/// memtable left, and none has anything in its active one (a rotation finds nothing to seal).
fn flush_memtables(shared: &Shared) -> bool {
    for ks in shared.ks.all() {
        if let Err(e) = ks.rotate_memtable() {
            log::warn!(
                "[store] records were left in the journal at close: {}",
                crate::error::describe_fjall(&e)
            );
            return false;
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while shared
        .ks
        .all()
        .iter()
        .any(|ks| ks.sealed_memtable_count() > 0)
    {
        if std::time::Instant::now() > deadline {
            log::warn!(
                "[store] moving the records into tables did not finish in 10 s; the journal keeps them"
            );
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // No write runs at close, so this only confirms that every active memtable is empty.
    let empty = shared
        .ks
        .all()
        .iter()
        .all(|ks| matches!(ks.rotate_memtable(), Ok(false)) && ks.sealed_memtable_count() == 0);
    // fjall's count of memtable bytes also covers any keyspace the store does not name; a
    // flush worker lowers it just after it retires the memtable it flushed.
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while empty && shared.db.write_buffer_size() > 0 {
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

/// The damage a reopened store can prove: its records end at a batch before the last one a
/// witness saw (see `evidence`).
fn lost_writes(
    recovered: u64,
    index: Option<crate::store::index::Mark>,
    clean_close: Option<u64>,
) -> Option<evidence::Damage> {
    let from_index = index
        .and_then(|m| m.batch)
        .map(|s| (s, "the keyword index"));
    let from_close = clean_close.map(|s| (s, "the last clean close"));
    let (witnessed, witness) = [from_index, from_close]
        .into_iter()
        .flatten()
        .max_by_key(|(s, _)| *s)?;
    (recovered < witnessed).then_some(evidence::Damage::Lost {
        recovered,
        witnessed,
        witness,
    })
}
