//! `EmbeddedStore`: records in fjall, keyword search in tantivy, one atomic batch per write.
//!
//! Write path (per scope, under that scope's lock): read the scope's bookkeeping, read what the
//! planner needs (point lookups, never a scan), plan, then apply everything — inserts, bumps,
//! flips, evictions, the scope's bookkeeping, the day's counters and one outbox entry — as one
//! fjall batch, fsynced unless the store was opened [`Durability::Buffered`]. Only then are the
//! index changes staged in tantivy's writer and the write acknowledged.
//!
//! Index consistency: the outbox entry names every record whose index document the write
//! changes. Writers only queue the index changes in memory; the indexer thread stages them into
//! tantivy and commits in groups (every 1,024 operations or 1 s) with the highest operation it
//! covers as the commit's payload (the watermark), then trims the outbox up to it. A write never
//! waits behind an index commit. On open, outbox entries above the watermark are replayed; a missing
//! watermark or a document count that disagrees with the records triggers a rebuild.
//!
//! Read-your-writes: operations not yet in a committed index are kept in memory by scope;
//! `retrieve` adds their records to the BM25 candidates, so a write is visible to `retrieve` as
//! soon as `write` returns. Stale index entries are harmless: every hit is hydrated from fjall
//! and dropped unless active.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use fjall::{Database, Keyspace, KeyspaceCreateOptions, OwnedWriteBatch, PersistMode, Readable};
use parking_lot::{Condvar, Mutex};

use super::codec::{self, ScopeMeta};
use super::{
    day_of, format_day, list_filter_matches, system_clock, validate_limit, validate_query,
    validate_write, Clock, DayCounters, DayStats, ImportReport, ListQuery, MemoryStore,
    SweepReceipt, WriteOptions,
};
use crate::error::{Error, ErrorKind, Result};
use crate::index::{IndexOp, KeywordIndex};
use crate::model::{parse_record_id, Candidate, Kind, Record, ScopeKey, Status, WriteCounts};
use crate::plan::{self, ActiveMeta, DEFAULT_CAP, MAX_CAP};
use crate::rank::{candidate_count, match_tokens, rank, record_tokens};
use crate::text::{normalize, tokenize};

/// When a write is acknowledged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// After the batch is fsynced: survives power loss. The default.
    #[default]
    Sync,
    /// After the batch is in the OS page cache: survives a crash of this process, not a power
    /// loss; several times faster.
    Buffered,
}

/// Configures and opens an [`EmbeddedStore`]. The directory goes to the last call.
#[derive(Clone)]
pub struct EmbeddedStoreBuilder {
    cap: usize,
    durability: Durability,
    clock: Option<Clock>,
    commit_every: usize,
    commit_interval: Duration,
    cache_bytes: u64,
}

/// The default block cache: enough for the hot windows of a few hundred scopes.
pub const DEFAULT_CACHE_BYTES: u64 = 64 << 20;

impl Default for EmbeddedStoreBuilder {
    fn default() -> Self {
        EmbeddedStoreBuilder {
            cap: DEFAULT_CAP,
            durability: Durability::Sync,
            clock: None,
            commit_every: 1024,
            commit_interval: Duration::from_secs(1),
            cache_bytes: DEFAULT_CACHE_BYTES,
        }
    }
}

impl EmbeddedStoreBuilder {
    /// The default cap of active records per scope (1–10000; default 500).
    pub fn cap(mut self, cap: usize) -> Self {
        self.cap = cap;
        self
    }

    /// When writes are acknowledged (default: after fsync).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Where the store reads the time (default: the wall clock).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Commit the keyword index after this many operations (default 1024) or this often
    /// (default 1 s), whichever comes first. Each commit fsyncs several files; rarer commits keep
    /// that IO away from the writes' own fsyncs. Uncommitted writes are still retrievable.
    pub fn index_commit(mut self, every: usize, interval: Duration) -> Self {
        self.commit_every = every.max(1);
        self.commit_interval = interval;
        self
    }

    /// The records' block cache in bytes (default 64 MiB). Reads stay as fast at 500,000
    /// records as at 2,500 while the blocks they touch fit in it.
    pub fn cache_bytes(mut self, bytes: u64) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// Opens (or creates) the store in `dir`.
    pub fn open(self, dir: impl AsRef<Path>) -> Result<EmbeddedStore> {
        EmbeddedStore::open_with(self, dir.as_ref())
    }
}

struct Keyspaces {
    active: Keyspace,
    retired: Keyspace,
    norms: Keyspace,
    scopes: Keyspace,
    counters: Keyspace,
    outbox: Keyspace,
    meta: Keyspace,
}

/// Index operations between their outbox entry and the tantivy commit that covers them.
#[derive(Default)]
struct Ops {
    /// The next operation number.
    next: u64,
    /// Allocated but not yet staged: the watermark must stay below the smallest.
    in_flight: BTreeSet<u64>,
    /// Durable, not yet in a committed index: operation → the records it made active, with
    /// their tokens, so `retrieve` can match them without reading them.
    pending: BTreeMap<u64, Vec<PendingDoc>>,
    /// Index changes of pending operations not yet handed to the index writer.
    queue: Vec<IndexOp>,
}

/// A record whose index document is staged but not committed.
struct PendingDoc {
    scope: ScopeKey,
    seq: u64,
    /// The record's distinct tokens (text and keywords), sorted.
    tokens: Vec<String>,
}

impl PendingDoc {
    fn from_op(op: &IndexOp) -> Option<PendingDoc> {
        let IndexOp::Upsert {
            id, text, keywords, ..
        } = op
        else {
            return None;
        };
        let (scope, seq) = parse_record_id(id)?;
        let mut tokens: Vec<String> = record_tokens(text, keywords).into_iter().collect();
        tokens.sort_unstable();
        Some(PendingDoc { scope, seq, tokens })
    }

    fn matches(&self, wanted: &[String]) -> bool {
        wanted.iter().any(|w| self.tokens.binary_search(w).is_ok())
    }
}

type LruKey = (i64, i64, u64);

/// The eviction order of a record: least recently used, then older, then lower seq.
fn lru_key(r: &Record, seq: u64) -> LruKey {
    (r.usage_time(), r.created_at, seq)
}

/// One scope's batch being built, with the eviction-order edits to apply once it commits.
struct Tx {
    batch: OwnedWriteBatch,
    lru: Vec<(Option<LruKey>, Option<LruKey>)>,
}

/// A journal position to wait on for durability (`None`: the store does not fsync writes).
#[must_use]
struct Ticket(Option<u64>);

/// Group commit: writers append their batch to the journal, then one fsync covers every batch
/// appended before it started.
#[derive(Default)]
struct SyncState {
    /// Batches appended (a ticket each).
    appended: u64,
    /// Every ticket at or below this is on disk.
    synced: u64,
    /// A writer is running the fsync now.
    syncing: bool,
}

struct Shared {
    /// An exclusive `flock` on the store directory, held for the store's life: a directory
    /// cannot be deleted and recreated under a running owner the way a lock file can.
    _dir_lock: std::fs::File,
    dir: PathBuf,
    db: Database,
    ks: Keyspaces,
    index: KeywordIndex,
    scope_locks: Mutex<HashMap<ScopeKey, Arc<Mutex<()>>>>,
    /// Scopes whose bookkeeping was checked against their records since open (see
    /// `scope_meta`).
    verified: Mutex<std::collections::HashSet<ScopeKey>>,
    /// Per-scope eviction order, loaded on first need (see `eviction_head`).
    lru: Mutex<HashMap<ScopeKey, BTreeSet<LruKey>>>,
    ops: Mutex<Ops>,
    /// Held while the index is staged and committed.
    committing: Mutex<()>,
    wake: Condvar,
    stop: AtomicBool,
    /// Set when staging or committing the index failed; the outbox keeps the gap for the next
    /// open and `doctor` reports it.
    index_degraded: AtomicBool,
    /// Acknowledge a write only after its batch is fsynced.
    sync_writes: bool,
    sync: Mutex<SyncState>,
    synced: Condvar,
    clock: Clock,
    cap: usize,
    commit_every: usize,
    commit_interval: Duration,
}

/// The embedded store: see the module docs.
pub struct EmbeddedStore {
    shared: Arc<Shared>,
    indexer: Option<JoinHandle<()>>,
}

/// What `doctor` found.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    /// Active records in fjall.
    pub active_records: u64,
    /// Documents in the keyword index.
    pub indexed_documents: u64,
    /// Active records the index does not hold (first 20).
    pub missing_from_index: Vec<String>,
    /// Records whose bookkeeping disagrees with their keys (first 20).
    pub problems: Vec<String>,
    /// Whether an index operation failed since open.
    pub index_degraded: bool,
}

impl Health {
    /// Nothing to repair.
    pub fn is_ok(&self) -> bool {
        self.active_records == self.indexed_documents
            && self.missing_from_index.is_empty()
            && self.problems.is_empty()
            && !self.index_degraded
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
        if !(1..=MAX_CAP).contains(&b.cap) {
            return Err(Error::invalid(format!(
                "cap must be between 1 and {MAX_CAP}"
            )));
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let dir_lock = lock_store_dir(dir)?;
        // fjall's own lock is a file: one deleted (or never made, by a copy) would let fjall fail
        // with "No such file or directory", or a second process lock a fresh file. The directory
        // lock above is what excludes other processes, so recreating fjall's file is safe.
        let records = dir.join("records");
        if records.join("version").exists() && !records.join("lock").exists() {
            std::fs::File::create(records.join("lock")).map_err(|e| {
                Error::io(format!("recreating {}", records.join("lock").display()), e)
            })?;
        }
        super::journal::check_before_open(dir, &records)?;
        let db = match Database::builder(&records)
            // Uncompressed, so `journal` can verify and salvage it without a decompressor.
            .journal_compression(fjall::CompressionType::None)
            .max_journaling_size(64 << 20)
            .cache_size(b.cache_bytes)
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
        };
        match ks
            .meta
            .get("format")
            .map_err(st("reading the format version"))?
        {
            Some(v) if v.as_ref() == [codec::FORMAT_VERSION] => {}
            Some(v) => {
                return Err(Error::format(format!(
                    "the store {} has format version {:?}; this build reads version {}",
                    dir.display(),
                    v.as_ref(),
                    codec::FORMAT_VERSION
                )))
            }
            None => ks
                .meta
                .insert("format", [codec::FORMAT_VERSION])
                .map_err(st("writing the format version"))?,
        }
        let opened = KeywordIndex::open(&dir.join("index"))?;
        let shared = Arc::new(Shared {
            _dir_lock: dir_lock,
            dir: dir.to_owned(),
            db,
            ks,
            index: opened.index,
            scope_locks: Mutex::new(HashMap::new()),
            verified: Mutex::new(std::collections::HashSet::new()),
            lru: Mutex::new(HashMap::new()),
            ops: Mutex::new(Ops::default()),
            committing: Mutex::new(()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            index_degraded: AtomicBool::new(false),
            sync_writes: b.durability == Durability::Sync,
            sync: Mutex::new(SyncState::default()),
            synced: Condvar::new(),
            clock: b.clock.unwrap_or_else(system_clock),
            cap: b.cap,
            commit_every: b.commit_every,
            commit_interval: b.commit_interval,
        });
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
    /// keyword index from them.
    pub fn repair(&self) -> Result<Health> {
        self.shared.repair_bookkeeping()?;
        self.shared.rebuild_index()?;
        self.shared.index_degraded.store(false, Ordering::SeqCst);
        self.shared.check()
    }

    /// Stops the indexer, commits the index and persists the records. Only a failure to
    /// persist the records is an error: every write was acknowledged after its own batch was
    /// durable, and an index commit that fails (a full disk) is logged and redone from the
    /// outbox at the next open, so it must not make a caller report an applied write as failed.
    pub fn close(mut self) -> Result<()> {
        self.stop_indexer();
        if let Err(e) = self.shared.commit_index() {
            log::warn!(
                "[store] the keyword index was not committed ({e}); the next open brings it up to date from the records"
            );
        }
        self.shared
            .db
            .persist(PersistMode::SyncAll)
            .map_err(st("persisting the journal"))
    }

    fn stop_indexer(&mut self) {
        if let Some(handle) = self.indexer.take() {
            {
                let _ops = self.shared.ops.lock();
                self.shared.stop.store(true, Ordering::SeqCst);
                self.shared.wake.notify_all();
            }
            let _ = handle.join();
        }
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        self.stop_indexer();
        let _ = self.flush();
    }
}

impl Shared {
    fn scope_lock(&self, scope: &ScopeKey) -> Arc<Mutex<()>> {
        let mut locks = self.scope_locks.lock();
        Arc::clone(locks.entry(scope.clone()).or_default())
    }

    fn tx(&self) -> Tx {
        Tx {
            batch: self.db.batch(),
            lru: Vec::new(),
        }
    }

    /// Appends `batch` to the journal (visible to readers at once) and returns the ticket to
    /// wait on before acknowledging it.
    fn append(&self, batch: OwnedWriteBatch) -> Result<Ticket> {
        batch.commit().map_err(st("committing a write"))?;
        if !self.sync_writes {
            return Ok(Ticket(None));
        }
        let mut state = self.sync.lock();
        state.appended += 1;
        Ok(Ticket(Some(state.appended)))
    }

    /// Returns once the batch of `ticket` is fsynced. Concurrent writers share fsyncs: the one
    /// that finds no fsync running runs one for every batch appended so far; the others wait for
    /// it (and run the next one if theirs came too late). Callers wait after releasing their
    /// scope's lock, so the next write to the scope plans while this one syncs.
    fn wait_durable(&self, ticket: Ticket) -> Result<()> {
        let Ticket(Some(ticket)) = ticket else {
            return Ok(());
        };
        let mut state = self.sync.lock();
        loop {
            if state.synced >= ticket {
                return Ok(());
            }
            if state.syncing {
                self.synced.wait(&mut state);
                continue;
            }
            state.syncing = true;
            let target = state.appended;
            drop(state);
            let result = self.db.persist(PersistMode::SyncData);
            state = self.sync.lock();
            state.syncing = false;
            if result.is_ok() {
                state.synced = state.synced.max(target);
            }
            self.synced.notify_all();
            result.map_err(st("syncing the journal"))?;
        }
    }

    fn stored_meta(&self, scope: &ScopeKey) -> Result<Option<ScopeMeta>> {
        match self
            .ks
            .scopes
            .get(scope.as_str())
            .map_err(st("reading a scope"))?
        {
            Some(v) => codec::decode(&v, "a scope's bookkeeping").map(Some),
            None => Ok(None),
        }
    }

    /// A scope's bookkeeping, for a caller that holds the scope's lock and is about to write.
    ///
    /// The bookkeeping is derived data: the next sequence number must be above every record the
    /// scope holds, and the active count must be the number of its active records. A damaged
    /// journal or a lost flush can leave it behind its records, and a stale next sequence would
    /// mint an id that already exists. So the first write to a scope after open checks it
    /// against the records (a few seeks and one scan of at most `cap` keys) and, when it
    /// disagrees, repairs it durably before anything else and logs what it found.
    fn scope_meta(&self, scope: &ScopeKey) -> Result<ScopeMeta> {
        let stored = self.stored_meta(scope)?;
        if self.verified.lock().contains(scope) {
            return Ok(stored.unwrap_or_default());
        }
        let derived = self.derive_meta(scope)?;
        let meta = stored.unwrap_or_default();
        let repaired = ScopeMeta {
            next_seq: meta.next_seq.max(derived.next_seq),
            active: derived.active,
        };
        if repaired != meta {
            log::warn!(
                "[store] {scope}: bookkeeping said next seq {} and {} active, its records say {} and {}; repaired",
                meta.next_seq,
                meta.active,
                repaired.next_seq,
                repaired.active
            );
            let mut batch = self.db.batch();
            batch.insert(&self.ks.scopes, scope.as_str(), codec::encode(&repaired)?);
            let ticket = self.append(batch)?;
            self.wait_durable(ticket)?;
        }
        self.verified.lock().insert(scope.clone());
        Ok(repaired)
    }

    /// What a scope's bookkeeping must be, read from its records: one past the highest sequence
    /// number it holds (active or retired), and the number of active records.
    fn derive_meta(&self, scope: &ScopeKey) -> Result<ScopeMeta> {
        let mut next_seq = 0;
        for kind in [Kind::Fact, Kind::Summary] {
            // `!seq` keys: the first key of a kind is its highest sequence number.
            if let Some(g) = self
                .ks
                .active
                .prefix(codec::active_prefix(scope, kind))
                .next()
            {
                let k = g.key().map_err(st("reading records"))?;
                if let Some(inv) = codec::trailing_seq(&k) {
                    next_seq = next_seq.max((!inv).saturating_add(1));
                }
            }
        }
        if let Some(g) = self
            .ks
            .retired
            .prefix(codec::scope_key_prefix(scope))
            .next_back()
        {
            let k = g.key().map_err(st("reading records"))?;
            if let Some(seq) = codec::trailing_seq(&k) {
                next_seq = next_seq.max(seq.saturating_add(1));
            }
        }
        let mut active = 0u64;
        for g in self.ks.active.prefix(codec::scope_key_prefix(scope)) {
            g.key().map_err(st("reading records"))?;
            active += 1;
        }
        Ok(ScopeMeta { next_seq, active })
    }

    /// Every scope that holds a record or bookkeeping, found by seeking from one scope's
    /// prefix to the next (a scope key never holds NUL, so NUL ends each prefix).
    fn all_scopes(&self) -> Result<BTreeSet<ScopeKey>> {
        let mut out = BTreeSet::new();
        for ks in [&self.ks.active, &self.ks.retired] {
            let mut from: Vec<u8> = Vec::new();
            loop {
                let Some(g) = ks.range(from.clone()..).next() else {
                    break;
                };
                let k = g.key().map_err(st("reading records"))?;
                let Some(nul) = k.iter().position(|&b| b == 0) else {
                    return Err(Error::new(
                        ErrorKind::Damaged,
                        "a record key holds no scope separator",
                    ));
                };
                let name = std::str::from_utf8(&k[..nul]).map_err(|_| {
                    Error::new(ErrorKind::Damaged, "a record key's scope is not UTF-8")
                })?;
                out.insert(ScopeKey::parse(name).map_err(|e| {
                    Error::new(ErrorKind::Damaged, format!("a record key's scope: {e}"))
                })?);
                from = k[..nul].to_vec();
                from.push(1);
            }
        }
        for g in self.ks.scopes.iter() {
            let k = g.key().map_err(st("reading scopes"))?;
            let name =
                std::str::from_utf8(&k).map_err(|_| Error::format("a scope key is not UTF-8"))?;
            out.insert(ScopeKey::parse(name).map_err(|e| Error::format(e.to_string()))?);
        }
        Ok(out)
    }

    /// The active record `seq` of `scope`, whichever its kind.
    fn load_active(&self, scope: &ScopeKey, seq: u64) -> Result<Option<Record>> {
        for kind in [Kind::Fact, Kind::Summary] {
            if let Some(v) = self
                .ks
                .active
                .get(codec::active_key(scope, kind, seq))
                .map_err(st("reading a record"))?
            {
                return codec::decode_record(&v, Some(scope)).map(Some);
            }
        }
        Ok(None)
    }

    fn load_any(&self, scope: &ScopeKey, seq: u64) -> Result<Option<Record>> {
        if let Some(r) = self.load_active(scope, seq)? {
            return Ok(Some(r));
        }
        match self
            .ks
            .retired
            .get(codec::retired_key(scope, seq))
            .map_err(st("reading a record"))?
        {
            Some(v) => codec::decode_record(&v, Some(scope)).map(Some),
            None => Ok(None),
        }
    }

    fn add_day(
        &self,
        batch: &mut OwnedWriteBatch,
        scope: &ScopeKey,
        now: i64,
        f: impl FnOnce(&mut DayCounters),
    ) -> Result<()> {
        let key = codec::counters_key(day_of(now), scope);
        let mut day: DayCounters =
            match self.ks.counters.get(&key).map_err(st("reading counters"))? {
                Some(v) => codec::decode(&v, "a day's counters")?,
                None => DayCounters::default(),
            };
        f(&mut day);
        batch.insert(&self.ks.counters, key, codec::encode(&day)?);
        Ok(())
    }

    /// Writes an active record's keys: the record and its dedup key.
    fn put_active(&self, tx: &mut Tx, r: &Record, seq: u64) -> Result<()> {
        let scope = &r.scope_key;
        tx.batch.insert(
            &self.ks.active,
            codec::active_key(scope, r.kind, seq),
            codec::encode_record(r, seq)?,
        );
        tx.batch.insert(
            &self.ks.norms,
            codec::norm_key(scope, &normalize(&r.text), seq),
            [],
        );
        tx.lru.push((None, Some(lru_key(r, seq))));
        Ok(())
    }

    /// Moves an active record to the retired keyspace: `old` (as stored) names the keys to
    /// remove; `kept` (its retired status, plus any bump of the same write) is what stays.
    fn retire(&self, tx: &mut Tx, old: &Record, kept: &Record, seq: u64) -> Result<()> {
        let scope = &old.scope_key;
        tx.batch
            .remove(&self.ks.active, codec::active_key(scope, old.kind, seq));
        tx.batch.remove(
            &self.ks.norms,
            codec::norm_key(scope, &normalize(&old.text), seq),
        );
        tx.lru.push((Some(lru_key(old, seq)), None));
        tx.batch.insert(
            &self.ks.retired,
            codec::retired_key(scope, seq),
            codec::encode_record(kept, seq)?,
        );
        Ok(())
    }

    /// Rewrites an active record whose counts or times changed.
    fn update_active(&self, tx: &mut Tx, old: &Record, new: &Record, seq: u64) -> Result<()> {
        let scope = &new.scope_key;
        tx.batch.insert(
            &self.ks.active,
            codec::active_key(scope, new.kind, seq),
            codec::encode_record(new, seq)?,
        );
        if old.usage_time() != new.usage_time() {
            tx.lru
                .push((Some(lru_key(old, seq)), Some(lru_key(new, seq))));
        }
        Ok(())
    }

    /// Applies a committed transaction's eviction-order edits, if that scope's order is loaded.
    fn apply_lru(&self, scope: &ScopeKey, edits: Vec<(Option<LruKey>, Option<LruKey>)>) {
        let mut lru = self.lru.lock();
        if let Some(order) = lru.get_mut(scope) {
            for (old, new) in edits {
                if let Some(k) = old {
                    order.remove(&k);
                }
                if let Some(k) = new {
                    order.insert(k);
                }
            }
        }
    }

    /// The first `n` active records of `scope` in eviction order. The order is kept in memory
    /// per scope, loaded from the records on first need; callers hold the scope's lock.
    fn eviction_head(&self, scope: &ScopeKey, n: usize) -> Result<Vec<u64>> {
        if let Some(order) = self.lru.lock().get(scope) {
            return Ok(order.iter().take(n).map(|k| k.2).collect());
        }
        let mut order = BTreeSet::new();
        for g in self.ks.active.prefix(codec::scope_key_prefix(scope)) {
            let r = codec::decode_record(&g.value().map_err(st("reading records"))?, Some(scope))?;
            if let Some(seq) = r.seq() {
                order.insert(lru_key(&r, seq));
            }
        }
        let head = order.iter().take(n).map(|k| k.2).collect();
        self.lru.lock().insert(scope.clone(), order);
        Ok(head)
    }

    fn allocate_op(&self) -> u64 {
        let mut ops = self.ops.lock();
        let op = ops.next;
        ops.next += 1;
        ops.in_flight.insert(op);
        op
    }

    /// Commits `batch` (durably) with an outbox entry naming the records of `ops_for_index`
    /// (when any), stages those index changes, and registers them as pending.
    fn commit_with_outbox(
        &self,
        scope: &ScopeKey,
        tx: Tx,
        ops_for_index: Vec<IndexOp>,
    ) -> Result<Ticket> {
        let Tx { mut batch, lru } = tx;
        if ops_for_index.is_empty() {
            let ticket = self.append(batch)?;
            self.apply_lru(scope, lru);
            return Ok(ticket);
        }
        let op = self.allocate_op();
        let ids: Vec<&str> = ops_for_index.iter().map(IndexOp::id).collect();
        let result = codec::encode(&ids).and_then(|v| {
            batch.insert(&self.ks.outbox, op.to_be_bytes(), v);
            self.append(batch)
        });
        let ticket = match result {
            Ok(t) => t,
            Err(e) => {
                self.ops.lock().in_flight.remove(&op);
                return Err(e);
            }
        };
        self.apply_lru(scope, lru);
        // The writer never touches tantivy: the indexer thread stages and commits, so a write
        // never waits behind an index commit. Until then `pending` answers for it.
        let docs: Vec<PendingDoc> = ops_for_index
            .iter()
            .filter_map(PendingDoc::from_op)
            .collect();
        let wake = {
            let mut ops = self.ops.lock();
            ops.in_flight.remove(&op);
            ops.queue.extend(ops_for_index);
            ops.pending.insert(op, docs);
            ops.pending.len() >= self.commit_every
        };
        if wake {
            self.wake.notify_one();
        }
        Ok(ticket)
    }

    fn upsert_op(r: &Record) -> IndexOp {
        IndexOp::Upsert {
            id: r.id.clone(),
            scope: r.scope_key.as_str().to_owned(),
            text: r.text.clone(),
            keywords: r.keywords.clone(),
        }
    }

    fn meta_of(r: &Record, seq: u64) -> ActiveMeta {
        ActiveMeta {
            seq,
            norm: normalize(&r.text),
            created_at: r.created_at,
            last_used_at: r.last_used_at,
            use_count: r.use_count,
            confidence: r.confidence,
        }
    }

    // ---- the indexer ----

    /// The highest operation with every operation at or below it staged.
    fn watermark(ops: &Ops) -> u64 {
        match ops.in_flight.first() {
            Some(&first) => first.saturating_sub(1),
            None => ops.next.saturating_sub(1),
        }
    }

    fn run_indexer(&self) {
        loop {
            {
                // `stop` is set under this lock, so the check and the wait cannot miss it.
                let mut ops = self.ops.lock();
                if !self.stop.load(Ordering::SeqCst) && ops.pending.len() < self.commit_every {
                    self.wake.wait_for(&mut ops, self.commit_interval);
                }
            }
            if self.commit_index().is_err() {
                self.index_degraded.store(true, Ordering::SeqCst);
            }
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
        }
    }

    /// Commits everything staged, then trims the outbox up to the watermark.
    fn commit_index(&self) -> Result<()> {
        // One committer at a time (the indexer thread, or a flush).
        let _committing = self.committing.lock();
        let (watermark, covered, queue) = {
            let mut ops = self.ops.lock();
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
            self.index_degraded.store(true, Ordering::SeqCst);
            return Err(e);
        }
        self.index.commit(watermark)?;
        let mut batch = self.db.batch();
        for op in &covered {
            batch.remove(&self.ks.outbox, op.to_be_bytes());
        }
        batch.commit().map_err(st("trimming the index outbox"))?;
        let mut ops = self.ops.lock();
        for op in covered {
            ops.pending.remove(&op);
        }
        Ok(())
    }

    // ---- recovery and doctor ----

    fn recover(&self, watermark: Option<u64>) -> Result<()> {
        let mut entries: Vec<(u64, Vec<String>)> = Vec::new();
        for g in self.ks.outbox.iter() {
            let (k, v) = g.into_inner().map_err(st("reading the index outbox"))?;
            let op = codec::trailing_seq(&k)
                .ok_or_else(|| Error::format("an outbox key is not 8 bytes"))?;
            entries.push((op, codec::decode(&v, "an outbox entry")?));
        }
        let last = entries.last().map(|(op, _)| *op);
        let top = last.unwrap_or(0).max(watermark.unwrap_or(0));
        self.ops.lock().next = top + 1;
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
                    self.index.commit(top)?;
                }
                let mut batch = self.db.batch();
                for (op, _) in &entries {
                    batch.remove(&self.ks.outbox, op.to_be_bytes());
                }
                batch.commit().map_err(st("trimming the index outbox"))?;
                if self.index.num_docs() != self.active_total()? {
                    self.rebuild_index_at(top)?;
                }
            }
        }
        Ok(())
    }

    /// The index operation that brings `id`'s document up to date with fjall.
    fn current_op(&self, id: &str) -> Result<IndexOp> {
        let active = match parse_record_id(id) {
            Some((scope, seq)) => self.load_active(&scope, seq)?,
            None => None,
        };
        Ok(match active {
            Some(r) => Self::upsert_op(&r),
            None => IndexOp::Delete { id: id.to_owned() },
        })
    }

    fn active_total(&self) -> Result<u64> {
        let mut total = 0;
        for g in self.ks.scopes.iter() {
            let v = g.value().map_err(st("reading scopes"))?;
            total += codec::decode::<ScopeMeta>(&v, "a scope's bookkeeping")?.active;
        }
        Ok(total)
    }

    fn rebuild_index(&self) -> Result<()> {
        // Hold every pending operation back: the rebuild reads the records as they are now.
        self.commit_index()?;
        let top = Self::watermark(&self.ops.lock());
        self.rebuild_index_at(top)
    }

    fn rebuild_index_at(&self, watermark: u64) -> Result<()> {
        let snapshot = self.db.snapshot();
        let docs = snapshot.iter(&self.ks.active).map(|g| {
            let v = g.value().map_err(st("reading records"))?;
            codec::decode_record(&v, None).map(|r| Self::upsert_op(&r))
        });
        self.index.rebuild(docs, watermark)
    }

    /// Dedup keys that disagree with the active records.
    fn norm_problems(&self) -> Result<Vec<(ScopeKey, u64, NormProblem)>> {
        let mut out = Vec::new();
        let snapshot = self.db.snapshot();
        for g in snapshot.iter(&self.ks.active) {
            let v = g.value().map_err(st("reading records"))?;
            let r = codec::decode_record(&v, None)?;
            let Some(seq) = r.seq() else { continue };
            let key = codec::norm_key(&r.scope_key, &normalize(&r.text), seq);
            if snapshot
                .get(&self.ks.norms, &key)
                .map_err(st("reading the dedup index"))?
                .is_none()
            {
                out.push((r.scope_key.clone(), seq, NormProblem::Missing));
            }
        }
        for g in snapshot.iter(&self.ks.norms) {
            let k = g.key().map_err(st("reading the dedup index"))?;
            let (Some(seq), Some(nul)) = (codec::trailing_seq(&k), k.iter().position(|&b| b == 0))
            else {
                continue;
            };
            let Some(scope) = std::str::from_utf8(&k[..nul])
                .ok()
                .and_then(|n| ScopeKey::parse(n).ok())
            else {
                continue;
            };
            let holds = match self.load_active(&scope, seq)? {
                Some(r) => codec::norm_key(&scope, &normalize(&r.text), seq) == k.as_ref(),
                None => false,
            };
            if !holds {
                out.push((scope, seq, NormProblem::Dangling));
            }
        }
        Ok(out)
    }

    /// Rewrites every scope's bookkeeping and dedup keys from its records, one scope at a time
    /// under its lock. Returns how many entries it changed.
    fn repair_bookkeeping(&self) -> Result<u64> {
        let mut changed = 0;
        let problems = self.norm_problems()?;
        for scope in self.all_scopes()? {
            let lock = self.scope_lock(&scope);
            let _guard = lock.lock();
            let derived = self.derive_meta(&scope)?;
            let stored = self.stored_meta(&scope)?;
            let mut batch = self.db.batch();
            let meta = ScopeMeta {
                next_seq: stored.map_or(0, |m| m.next_seq).max(derived.next_seq),
                active: derived.active,
            };
            if stored != Some(meta) {
                batch.insert(&self.ks.scopes, scope.as_str(), codec::encode(&meta)?);
                changed += 1;
            }
            for (_, seq, problem) in problems.iter().filter(|(sc, _, _)| *sc == scope) {
                match problem {
                    NormProblem::Missing => {
                        if let Some(r) = self.load_active(&scope, *seq)? {
                            batch.insert(
                                &self.ks.norms,
                                codec::norm_key(&scope, &normalize(&r.text), *seq),
                                [],
                            );
                            changed += 1;
                        }
                    }
                    NormProblem::Dangling => {
                        // The key's hash is unknown here: remove every key of this seq that
                        // does not match the record's text.
                        let wanted = match self.load_active(&scope, *seq)? {
                            Some(r) => Some(codec::norm_key(&scope, &normalize(&r.text), *seq)),
                            None => None,
                        };
                        for g in self.ks.norms.prefix(codec::scope_key_prefix(&scope)) {
                            let k = g.key().map_err(st("reading the dedup index"))?;
                            if codec::trailing_seq(&k) == Some(*seq)
                                && wanted.as_deref() != Some(k.as_ref())
                            {
                                batch.remove(&self.ks.norms, k.to_vec());
                                changed += 1;
                            }
                        }
                    }
                }
            }
            let ticket = self.append(batch)?;
            self.wait_durable(ticket)?;
            self.verified.lock().insert(scope.clone());
            // The eviction order is rebuilt from the records on next need.
            self.lru.lock().remove(&scope);
        }
        Ok(changed)
    }

    fn check(&self) -> Result<Health> {
        let mut health = Health {
            index_degraded: self.index_degraded.load(Ordering::SeqCst),
            indexed_documents: self.index.num_docs(),
            ..Health::default()
        };
        let mut per_scope: HashMap<ScopeKey, u64> = HashMap::new();
        let snapshot = self.db.snapshot();
        for g in snapshot.iter(&self.ks.active) {
            let (k, v) = g.into_inner().map_err(st("reading records"))?;
            let r = codec::decode_record(&v, None)?;
            health.active_records += 1;
            *per_scope.entry(r.scope_key.clone()).or_default() += 1;
            let Some(seq) = r.seq() else { continue };
            if r.status != Status::Active
                || k.as_ref() != codec::active_key(&r.scope_key, r.kind, seq).as_slice()
            {
                push_first(
                    &mut health.problems,
                    format!("{} is stored under the wrong key or status", r.id),
                );
            }
            if !self.index.contains(&r.id)? {
                push_first(&mut health.missing_from_index, r.id.clone());
            }
        }
        for scope in self.all_scopes()? {
            let derived = self.derive_meta(&scope)?;
            match self.stored_meta(&scope)? {
                None if derived != ScopeMeta::default() => push_first(
                    &mut health.problems,
                    format!("{scope} holds records but has no bookkeeping"),
                ),
                None => {}
                Some(meta) => {
                    if meta.active != derived.active {
                        push_first(
                            &mut health.problems,
                            format!(
                                "{scope} counts {} active records but holds {}",
                                meta.active, derived.active
                            ),
                        );
                    }
                    if meta.next_seq < derived.next_seq {
                        push_first(
                            &mut health.problems,
                            format!(
                                "{scope} would mint its next id at {} but holds records up to {}",
                                meta.next_seq,
                                derived.next_seq - 1
                            ),
                        );
                    }
                }
            }
        }
        for (scope, seq, norm_key) in self.norm_problems()? {
            push_first(
                &mut health.problems,
                match norm_key {
                    NormProblem::Missing => {
                        format!("{} has no dedup key", scope.record_id(seq))
                    }
                    NormProblem::Dangling => format!(
                        "a dedup key points at {}, which is not an active record with that text",
                        scope.record_id(seq)
                    ),
                },
            );
        }
        Ok(health)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NormProblem {
    /// An active record has no dedup key.
    Missing,
    /// A dedup key names no active record with that text.
    Dangling,
}

/// `r` with `status`.
fn with_status(r: &Record, status: Status) -> Record {
    let mut out = r.clone();
    out.status = status;
    out
}

fn push_first(list: &mut Vec<String>, item: String) {
    if list.len() < 20 {
        list.push(item);
    }
}

impl MemoryStore for EmbeddedStore {
    fn write(
        &self,
        scope: &ScopeKey,
        candidates: &[Candidate],
        options: &WriteOptions,
    ) -> Result<WriteCounts> {
        let s = &*self.shared;
        let (valid, cap) = validate_write(scope, candidates, options, s.cap)?;
        if valid.is_empty() && options.tally.is_none() {
            return Ok(WriteCounts::default());
        }
        let lock = s.scope_lock(scope);
        let guard = lock.lock();
        let now = (s.clock)();
        let meta = s.scope_meta(scope)?;

        // Read exactly what the planner can need.
        let needs = plan::needs(scope, &valid, meta.active as usize, cap);
        let mut loaded: HashMap<u64, Record> = HashMap::new();
        let mut snapshot = plan::Snapshot {
            next_seq: meta.next_seq,
            active_count: meta.active as usize,
            ..plan::Snapshot::default()
        };
        for &seq in &needs.seqs {
            if let Some(r) = s.load_active(scope, seq)? {
                snapshot.records.insert(seq, Shared::meta_of(&r, seq));
                loaded.insert(seq, r);
            }
        }
        for norm in &needs.norms {
            let mut hits = Vec::new();
            for g in s.ks.norms.prefix(codec::norm_prefix(scope, norm)) {
                let k = g.key().map_err(st("reading the dedup index"))?;
                let Some(seq) = codec::trailing_seq(&k) else {
                    continue;
                };
                if let Some(r) = s.load_active(scope, seq)? {
                    // The key is a hash: confirm the text really normalizes to `norm`.
                    if normalize(&r.text) == *norm {
                        hits.push(Shared::meta_of(&r, seq));
                        loaded.insert(seq, r);
                    }
                }
            }
            hits.sort_by_key(|m| m.seq);
            snapshot.by_norm.insert(norm.clone(), hits);
        }
        if needs.eviction_head > 0 {
            for seq in s.eviction_head(scope, needs.eviction_head)? {
                if let Some(r) = s.load_active(scope, seq)? {
                    snapshot.eviction_head.push(Shared::meta_of(&r, seq));
                    loaded.insert(seq, r);
                }
            }
        }

        let plan = plan::plan_write(scope, &snapshot, &valid, now, cap);

        let mut tx = s.tx();
        let mut index_ops: Vec<IndexOp> = Vec::new();
        let mut active = meta.active;
        for (&seq, touched) in plan.existing_changes() {
            let Some(old) = loaded.get(&seq) else {
                return Err(Error::new(
                    ErrorKind::Storage,
                    format!("planned a change to unread record {seq}"),
                ));
            };
            let mut new = old.clone();
            new.use_count = touched.meta.use_count;
            new.last_used_at = touched.meta.last_used_at;
            new.confidence = touched.meta.confidence;
            new.status = touched.status;
            if touched.status == Status::Active {
                s.update_active(&mut tx, old, &new, seq)?;
            } else {
                s.retire(&mut tx, old, &new, seq)?;
                active -= 1;
                index_ops.push(IndexOp::Delete { id: old.id.clone() });
            }
        }
        let mut summaries = 0;
        for insert in &plan.inserts {
            let c = &valid[insert.candidate];
            let Some(touched) = plan.touched.get(&insert.seq) else {
                continue;
            };
            let r = Record {
                id: scope.record_id(insert.seq),
                scope_key: scope.clone(),
                kind: c.kind,
                text: c.text.clone(),
                keywords: c.keywords.clone(),
                source_thread_key: c.source_thread_key.clone(),
                source_run_id: c.source_run_id.clone(),
                provenance: c.provenance.clone(),
                created_at: now,
                last_used_at: touched.meta.last_used_at,
                use_count: touched.meta.use_count,
                confidence: touched.meta.confidence,
                supersedes: insert.supersedes.clone(),
                status: touched.status,
            };
            // The bookkeeping was checked against the records, so this cannot fire unless the
            // store changed under us; a write must never replace a record, whatever happened.
            if s.load_any(scope, insert.seq)?.is_some() {
                return Err(Error::new(
                    ErrorKind::Damaged,
                    format!(
                        "refusing to overwrite {}: the scope's bookkeeping is behind its records; run `lessons doctor --repair`",
                        scope.record_id(insert.seq)
                    ),
                ));
            }
            if c.kind == Kind::Summary {
                summaries += 1;
            }
            if touched.status == Status::Active {
                s.put_active(&mut tx, &r, insert.seq)?;
                active += 1;
                index_ops.push(Shared::upsert_op(&r));
            } else {
                tx.batch.insert(
                    &s.ks.retired,
                    codec::retired_key(scope, insert.seq),
                    codec::encode_record(&r, insert.seq)?,
                );
            }
        }
        let new_meta = ScopeMeta {
            next_seq: plan.next_seq,
            active,
        };
        if new_meta != meta {
            tx.batch
                .insert(&s.ks.scopes, scope.as_str(), codec::encode(&new_meta)?);
        }
        s.add_day(&mut tx.batch, scope, now, |d| {
            d.add_write(&plan.counts, summaries, options.tally.as_ref())
        })?;
        let ticket = s.commit_with_outbox(scope, tx, index_ops)?;
        drop(guard);
        s.wait_durable(ticket)?;
        Ok(plan.counts)
    }

    fn list(&self, scope: &ScopeKey, query: &ListQuery) -> Result<Vec<Record>> {
        validate_limit(query.limit)?;
        let q = query.query.as_deref().unwrap_or("");
        validate_query(q)?;
        let q = normalize(q);
        let s = &*self.shared;
        let keep = |r: &Record| list_filter_matches(r, &q);
        let mut out = Vec::with_capacity(query.limit);
        if let Some(kind) = query.kind {
            for g in s.ks.active.prefix(codec::active_prefix(scope, kind)) {
                let v = g.value().map_err(st("reading records"))?;
                let r = codec::decode_record(&v, Some(scope))?;
                if keep(&r) {
                    out.push(r);
                    if out.len() == query.limit {
                        break;
                    }
                }
            }
            return Ok(out);
        }
        // Both kinds, newest first: merge two newest-first scans of one consistent snapshot.
        let snap = s.db.snapshot();
        let mut facts = snap
            .prefix(&s.ks.active, codec::active_prefix(scope, Kind::Fact))
            .peekable();
        let mut sums = snap
            .prefix(&s.ks.active, codec::active_prefix(scope, Kind::Summary))
            .peekable();
        let mut next_fact: Option<Record> = None;
        let mut next_sum: Option<Record> = None;
        while out.len() < query.limit {
            if next_fact.is_none() {
                if let Some(g) = facts.next() {
                    next_fact = Some(codec::decode_record(
                        &g.value().map_err(st("reading records"))?,
                        Some(scope),
                    )?);
                }
            }
            if next_sum.is_none() {
                if let Some(g) = sums.next() {
                    next_sum = Some(codec::decode_record(
                        &g.value().map_err(st("reading records"))?,
                        Some(scope),
                    )?);
                }
            }
            let take_fact = match (&next_fact, &next_sum) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some(f), Some(m)) => f.seq() > m.seq(),
            };
            let r = if take_fact {
                next_fact.take()
            } else {
                next_sum.take()
            };
            if let Some(r) = r.filter(|r| keep(r)) {
                out.push(r);
            }
        }
        Ok(out)
    }

    fn retrieve(&self, scope: &ScopeKey, query: &str, limit: usize) -> Result<Vec<Record>> {
        validate_limit(limit)?;
        validate_query(query)?;
        let tokens = tokenize(query);
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let s = &*self.shared;
        let wanted = match_tokens(&tokens);
        // Writes staged since the last index commit, read before the search: the indexer
        // reloads the searcher before it forgets a pending write, so every acknowledged write
        // is in one of the two.
        let pending: Vec<u64> = s
            .ops
            .lock()
            .pending
            .values()
            .flatten()
            .filter(|d| &d.scope == scope && d.matches(&wanted))
            .map(|d| d.seq)
            .collect();
        let ids = s
            .index
            .search(scope.as_str(), &wanted, candidate_count(limit))?;
        let mut seqs: Vec<u64> = ids
            .iter()
            .filter_map(|id| parse_record_id(id))
            .filter(|(sc, _)| sc == scope)
            .map(|(_, seq)| seq)
            .collect();
        for seq in pending {
            if !seqs.contains(&seq) {
                seqs.push(seq);
            }
        }
        let mut candidates = Vec::with_capacity(seqs.len());
        for seq in seqs {
            if let Some(r) = s.load_active(scope, seq)? {
                candidates.push(r);
            }
        }
        let now = (s.clock)();
        let ranked = rank(&tokens, candidates, now, limit);
        if ranked.is_empty() {
            return Ok(ranked);
        }
        // Bump under the scope lock, re-reading each record: a write may have changed it.
        let lock = s.scope_lock(scope);
        let _guard = lock.lock();
        // Usage bumps are not worth an fsync each: they survive a process crash, and a power
        // loss costs at most the last bumps, never a record.
        let mut tx = s.tx();
        let mut out = Vec::with_capacity(ranked.len());
        let mut unbumped = Vec::with_capacity(ranked.len());
        for r in ranked {
            let Some(seq) = r.seq() else { continue };
            let Some(old) = s.load_active(scope, seq)? else {
                continue;
            };
            let mut new = old.clone();
            new.use_count += 1;
            new.last_used_at = Some(now);
            s.update_active(&mut tx, &old, &new, seq)?;
            out.push(new);
            unbumped.push(old);
        }
        // A read must answer even when its bump cannot be written (a full disk): the bump is
        // bookkeeping, the records are the answer. The failure is logged, not returned.
        match tx.batch.commit() {
            Ok(()) => s.apply_lru(scope, tx.lru),
            Err(e) => {
                log::warn!(
                    "[store] {scope}: retrieve answered without recording its use: {}",
                    crate::error::describe_fjall(&e)
                );
                for (r, bumped) in out.iter_mut().zip(unbumped) {
                    *r = bumped;
                }
            }
        }
        Ok(out)
    }

    fn forget(&self, scope: &ScopeKey, id: &str) -> Result<bool> {
        let s = &*self.shared;
        let Some((sc, seq)) = parse_record_id(id) else {
            return Ok(false);
        };
        if &sc != scope {
            return Ok(false);
        }
        let lock = s.scope_lock(scope);
        let guard = lock.lock();
        let Some(old) = s.load_active(scope, seq)? else {
            return Ok(false);
        };
        let now = (s.clock)();
        let mut meta = s.scope_meta(scope)?;
        let mut tx = s.tx();
        s.retire(&mut tx, &old, &with_status(&old, Status::Forgotten), seq)?;
        meta.active = meta.active.saturating_sub(1);
        tx.batch
            .insert(&s.ks.scopes, scope.as_str(), codec::encode(&meta)?);
        s.add_day(&mut tx.batch, scope, now, |d| d.forgotten += 1)?;
        let ticket =
            s.commit_with_outbox(scope, tx, vec![IndexOp::Delete { id: old.id.clone() }])?;
        drop(guard);
        s.wait_durable(ticket)?;
        Ok(true)
    }

    fn sweep(&self, scope: &ScopeKey, dry_run: bool) -> Result<SweepReceipt> {
        let s = &*self.shared;
        let lock = s.scope_lock(scope);
        let guard = lock.lock();
        let mut marked = Vec::new();
        for g in s.ks.active.prefix(codec::active_prefix(scope, Kind::Fact)) {
            let r = codec::decode_record(&g.value().map_err(st("reading records"))?, Some(scope))?;
            if crate::gate::is_status(&r.text) {
                marked.push(r);
            }
        }
        let receipt = SweepReceipt {
            swept: marked.len() as u64,
            ids: marked.iter().map(|r| r.id.clone()).collect(),
        };
        if dry_run || marked.is_empty() {
            return Ok(receipt);
        }
        let now = (s.clock)();
        let mut meta = s.scope_meta(scope)?;
        let mut tx = s.tx();
        let mut ops = Vec::new();
        for r in &marked {
            let Some(seq) = r.seq() else { continue };
            s.retire(&mut tx, r, &with_status(r, Status::Swept), seq)?;
            ops.push(IndexOp::Delete { id: r.id.clone() });
        }
        meta.active = meta.active.saturating_sub(marked.len() as u64);
        tx.batch
            .insert(&s.ks.scopes, scope.as_str(), codec::encode(&meta)?);
        s.add_day(&mut tx.batch, scope, now, |d| d.swept += receipt.swept)?;
        let ticket = s.commit_with_outbox(scope, tx, ops)?;
        drop(guard);
        s.wait_durable(ticket)?;
        Ok(receipt)
    }

    fn get(&self, id: &str) -> Result<Option<Record>> {
        match parse_record_id(id) {
            Some((scope, seq)) => self.shared.load_any(&scope, seq),
            None => Ok(None),
        }
    }

    fn scopes(&self) -> Result<Vec<ScopeKey>> {
        Ok(self.shared.all_scopes()?.into_iter().collect())
    }

    fn export(&self, sink: &mut dyn FnMut(Record) -> Result<()>) -> Result<()> {
        let s = &*self.shared;
        let snap = s.db.snapshot();
        for scope in self.scopes()? {
            let prefix = codec::scope_key_prefix(&scope);
            let mut records = Vec::new();
            for ks in [&s.ks.active, &s.ks.retired] {
                for g in snap.prefix(ks, &prefix) {
                    records.push(codec::decode_record(
                        &g.value().map_err(st("reading records"))?,
                        Some(&scope),
                    )?);
                }
            }
            records.sort_by_key(|r| r.seq());
            for r in records {
                sink(r)?;
            }
        }
        Ok(())
    }

    fn import(&self, records: &[Record]) -> Result<ImportReport> {
        let (groups, repeats) = super::group_import(records)?;
        let s = &*self.shared;
        let mut report = ImportReport {
            skipped: repeats,
            ..ImportReport::default()
        };
        for (scope, list) in groups {
            let lock = s.scope_lock(scope);
            let guard = lock.lock();
            let mut meta = s.scope_meta(scope)?;
            let mut tx = s.tx();
            let mut ops = Vec::new();
            for (seq, r) in list {
                if s.load_any(scope, seq)?.is_some() {
                    report.skipped += 1;
                    continue;
                }
                if r.status == Status::Active {
                    s.put_active(&mut tx, r, seq)?;
                    meta.active += 1;
                    ops.push(Shared::upsert_op(r));
                } else {
                    tx.batch.insert(
                        &s.ks.retired,
                        codec::retired_key(scope, seq),
                        codec::encode_record(r, seq)?,
                    );
                }
                meta.next_seq = meta.next_seq.max(seq + 1);
                report.imported += 1;
            }
            tx.batch
                .insert(&s.ks.scopes, scope.as_str(), codec::encode(&meta)?);
            let ticket = s.commit_with_outbox(scope, tx, ops)?;
            drop(guard);
            s.wait_durable(ticket)?;
        }
        Ok(report)
    }

    fn stats(&self, since: i64) -> Result<Vec<DayStats>> {
        let mut out = Vec::new();
        for g in self.shared.ks.counters.range(codec::counters_from(since)..) {
            let (k, v) = g.into_inner().map_err(st("reading counters"))?;
            let (day, scope) = codec::parse_counters_key(&k)
                .ok_or_else(|| Error::format("a counters key does not parse"))?;
            out.push(DayStats {
                day: format_day(day),
                scope_key: scope,
                counters: codec::decode(&v, "a day's counters")?,
            });
        }
        Ok(out)
    }
}
