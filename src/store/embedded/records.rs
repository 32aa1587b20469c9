//! The records on disk: fjall and its keyspaces, read by point lookups and prefix scans, and
//! written only through a [`Tx`] (one scope's batch) or a batch the caller commits.
//!
//! Keyspaces (key layouts in `store::codec`): `active` (active records by scope, kind and
//! reversed sequence), `retired` (every other status), `usage` (a retrieve's use of an active
//! record), `norms` (dedup keys), `scopes` (each scope's bookkeeping), `counters` (per scope per
//! day), `outbox` (index changes not yet in a committed index), `decisions` (the decision
//! journal), `meta` (format, last batch, journal tallies).
//!
//! **Invariant:** only this file names a keyspace's contents; the other files ask it.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

use fjall::{Database, Keyspace, KeyspaceCreateOptions, OwnedWriteBatch, Readable};

use super::tx::Tx;
use crate::error::{Error, ErrorKind, Result};
use crate::model::{Kind, Record, ScopeKey};
use crate::store::codec::{self, ScopeMeta};
use crate::store::counters::DayCounters;
use crate::store::engine::st;
use crate::text::normalize;
use crate::time::day_of;

/// The keyspaces, by what they hold.
pub(super) struct Keyspaces {
    pub(super) active: Keyspace,
    pub(super) retired: Keyspace,
    pub(super) norms: Keyspace,
    pub(super) scopes: Keyspace,
    pub(super) counters: Keyspace,
    pub(super) outbox: Keyspace,
    pub(super) meta: Keyspace,
    pub(super) decisions: Keyspace,
    pub(super) usage: Keyspace,
}

impl Keyspaces {
    /// Every keyspace with what it holds, in words.
    pub(super) fn named(&self) -> [(&'static str, &Keyspace); 9] {
        [
            ("records (active)", &self.active),
            ("records (retired)", &self.retired),
            ("the records' use", &self.usage),
            ("the dedup keys", &self.norms),
            ("the scopes' bookkeeping", &self.scopes),
            ("the day counters", &self.counters),
            ("the index outbox", &self.outbox),
            ("the store's metadata", &self.meta),
            ("the decision journal", &self.decisions),
        ]
    }
}

/// The memtable of the three keyspaces that take most of a write's bytes (records, retired
/// records, the decision journal). Each memtable flush fsyncs fjall's journal under the lock
/// every commit takes, and each flush feeds compactions whose writes slow the journal's own
/// fsyncs: at 8 MiB the decision journal flushes every second under 8 writers and a write's p99
/// is 9–10× its p50; at 32 MiB about 6×. 16 MiB is the memory side of that trade: a memtable
/// holds about 1.4 bytes per byte it counts (skiplist nodes, allocations), and with every
/// memtable at 32 MiB a long-running server's heap is some 100 MB larger (`cargo run
/// --example deployment`). Up to 3 × 16 MiB, plus a sealed memtable while it flushes.
const LARGE_MEMTABLE: u64 = 16 << 20;
/// The flushed tables a heavy keyspace (records, retired records, the decision journal) lets
/// gather before it merges them into the next level (fjall's default: 4). A memtable holds
/// keys of every scope, so each flushed table overlaps the whole of the next level, and each
/// merge rewrites that level: merging every 8 tables instead of every 4 rewrites it half as
/// often. Under 8 writers at 200,000 records (`cargo bench --bench writes`, the steady round)
/// the store writes 15–18 KB of disk a write against 21–22 KB merging at 4, the disk every
/// durable write's fsync shares. The cost is up to 7 unmerged tables for a read to look in;
/// the review and the store's reads (`--bench review`, `--bench store`) are no slower.
///
/// fjall keeps a keyspace's settings (this, and the memtable sizes above) from the open that
/// created it: a store created by an earlier version keeps the settings it was created with,
/// and an export imported into a new store takes these.
const L0_TABLES: u8 = 8;
/// The memtable of the other keyspaces (small entries: bookkeeping, counters, keys).
const SMALL_MEMTABLE: u64 = 4 << 20;
/// The journal fjall keeps before it flushes the keyspaces that pin the oldest file: above
/// every memtable's size together (3 × 16 + 6 × 4 MiB), so a journal rotation does not force
/// flushes of memtables still filling. An open after a crash replays at most this much
/// (about 1.4 µs per entry, some 1.3 s); after a clean close it replays nothing.
const MAX_JOURNAL_BYTES: u64 = 128 << 20;

/// fjall's background threads (flushes and compactions): fjall's own choice (a thread per core,
/// at most 4), but never fewer than 3. With more than one, fjall's first worker hands every
/// compaction request it receives back to the queue so that it stays free for flushes; with two,
/// while the other compacts, it takes the same request straight back and spins, re-queueing it,
/// until that compaction ends (on 2 cores, about a seventh of the machine under 8 writers, by
/// `perf`). With a third, a free worker takes the request. One worker would not spin, but a
/// single worker can block forever sending itself a flush when rotation requests fill its queue.
fn worker_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .clamp(3, 4)
}

/// The records engine: the database and its keyspaces.
pub(super) struct Records {
    db: Database,
    ks: Keyspaces,
}

impl Records {
    /// Opens fjall in `records` (its journal checked already) with a block cache of
    /// `cache_bytes`; `dir` names the store in errors.
    pub(super) fn open(dir: &Path, records: &Path, cache_bytes: u64) -> Result<Records> {
        let db = match Database::builder(records)
            // Uncompressed, so `store::journal` can verify and salvage it without a decompressor.
            .journal_compression(fjall::CompressionType::None)
            .max_journaling_size(MAX_JOURNAL_BYTES)
            .cache_size(cache_bytes)
            .worker_threads(worker_threads())
            .open()
        {
            Ok(db) => db,
            Err(fjall::Error::Locked) => return Err(crate::store::engine::locked(dir)),
            Err(e) => {
                return Err(crate::store::engine::storage(
                    format!("opening {}", dir.display()),
                    e,
                ))
            }
        };
        let open_ks = |name: &str| {
            let memtable = match name {
                "active" | "retired" | "decisions" => LARGE_MEMTABLE,
                _ => SMALL_MEMTABLE,
            };
            db.keyspace(name, || {
                let options = KeyspaceCreateOptions::default().max_memtable_size(memtable);
                if memtable == LARGE_MEMTABLE {
                    options.compaction_strategy(Arc::new(
                        fjall::compaction::Leveled::default().with_l0_threshold(L0_TABLES),
                    ))
                } else {
                    options
                }
            })
            .map_err(|e| crate::store::engine::storage(format!("opening keyspace {name}"), e))
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
        Ok(Records { db, ks })
    }

    /// The database handle, for the types that commit and sync it.
    pub(super) fn db(&self) -> &Database {
        &self.db
    }

    /// The keyspaces, for the types that own one's contents (the decision journal, the
    /// group commit's batch numbers) and for `doctor`, which reads them all.
    pub(super) fn keyspaces(&self) -> &Keyspaces {
        &self.ks
    }

    pub(super) fn batch(&self) -> OwnedWriteBatch {
        self.db.batch()
    }

    pub(super) fn snapshot(&self) -> fjall::Snapshot {
        self.db.snapshot()
    }

    // ---- metadata ----

    /// The format byte, if the store has one.
    pub(super) fn format(&self) -> Result<Option<Vec<u8>>> {
        Ok(self
            .ks
            .meta
            .get("format")
            .map_err(st("reading the format version"))?
            .map(|v| v.to_vec()))
    }

    /// Marks the store with the current format (outside any batch: before any write).
    pub(super) fn mark_format(&self) -> Result<()> {
        self.ks
            .meta
            .insert("format", [codec::STORE_FORMAT])
            .map_err(st("writing the format version"))
    }

    /// The number of the last batch the records hold (0 for a new store).
    pub(super) fn last_batch(&self) -> Result<u64> {
        match self
            .ks
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

    // ---- scopes and their bookkeeping ----

    pub(super) fn stored_meta(&self, scope: &ScopeKey) -> Result<Option<ScopeMeta>> {
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

    /// Writes `scope`'s bookkeeping into `batch`.
    pub(super) fn put_meta(
        &self,
        batch: &mut OwnedWriteBatch,
        scope: &ScopeKey,
        meta: &ScopeMeta,
    ) -> Result<()> {
        batch.insert(&self.ks.scopes, scope.as_str(), codec::encode(meta)?);
        Ok(())
    }

    /// What a scope's bookkeeping must be, read from its records: one past the highest sequence
    /// number it holds (active or retired), and the number of active records.
    pub(super) fn derive_meta(&self, scope: &ScopeKey) -> Result<ScopeMeta> {
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

    /// Active records over every scope, as the scopes' bookkeeping counts them.
    pub(super) fn active_total(&self) -> Result<u64> {
        let mut total = 0;
        for g in self.ks.scopes.iter() {
            let v = g.value().map_err(st("reading scopes"))?;
            total += codec::decode::<ScopeMeta>(&v, "a scope's bookkeeping")?.active;
        }
        Ok(total)
    }

    /// Every scope that holds a record or bookkeeping, found by seeking from one scope's
    /// prefix to the next (a scope key never holds NUL, so NUL ends each prefix).
    pub(super) fn all_scopes(&self) -> Result<BTreeSet<ScopeKey>> {
        let mut out = BTreeSet::new();
        for ks in [&self.ks.active, &self.ks.retired] {
            let mut from: Vec<u8> = Vec::new();
            loop {
                let Some(g) = ks.range(from.clone()..).next() else {
                    break;
                };
                let k = g.key().map_err(st("reading records"))?;
                let Some(scope) = codec::scope_bytes(&k) else {
                    return Err(Error::new(
                        ErrorKind::Damaged,
                        "a record key holds no scope separator",
                    ));
                };
                let name = std::str::from_utf8(scope).map_err(|_| {
                    Error::new(ErrorKind::Damaged, "a record key's scope is not UTF-8")
                })?;
                out.insert(ScopeKey::parse(name).map_err(|e| {
                    Error::new(ErrorKind::Damaged, format!("a record key's scope: {e}"))
                })?);
                from = scope.to_vec();
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

    // ---- records ----

    /// The active record `seq` of `scope`, whichever its kind, with its use. Read live: the
    /// caller holds the scope's write lock, so the record and its usage entry cannot change
    /// between the two reads (an unlocked reader uses `load_active_at`).
    pub(super) fn load_active(&self, scope: &ScopeKey, seq: u64) -> Result<Option<Record>> {
        self.load_active_from(None, scope, seq)
    }

    /// `load_active` from one snapshot: consistent without the scope's lock.
    pub(super) fn load_active_at(
        &self,
        snapshot: &fjall::Snapshot,
        scope: &ScopeKey,
        seq: u64,
    ) -> Result<Option<Record>> {
        self.load_active_from(Some(snapshot), scope, seq)
    }

    fn load_active_from(
        &self,
        snapshot: Option<&fjall::Snapshot>,
        scope: &ScopeKey,
        seq: u64,
    ) -> Result<Option<Record>> {
        let get = |ks: &Keyspace, key: &[u8]| match snapshot {
            Some(snap) => snap.get(ks, key),
            None => ks.get(key),
        };
        for kind in [Kind::Fact, Kind::Summary] {
            let key = codec::active_key(scope, kind, seq);
            if let Some(v) = get(&self.ks.active, &key).map_err(st("reading a record"))? {
                let mut r = codec::decode_record(&v, Some(scope))?;
                if let Some(u) = get(&self.ks.usage, &key).map_err(st("reading a record's use"))? {
                    codec::decode_usage(&u)?.apply(&mut r);
                }
                return Ok(Some(r));
            }
        }
        Ok(None)
    }

    /// Whether `scope` holds record `seq`, active or retired (the caller holds the scope's
    /// write lock). Existence does not depend on a record's use, so nothing is decoded and no
    /// snapshot is taken: a write checks every id it mints with this.
    pub(super) fn holds(&self, scope: &ScopeKey, seq: u64) -> Result<bool> {
        for kind in [Kind::Fact, Kind::Summary] {
            if self
                .ks
                .active
                .contains_key(codec::active_key(scope, kind, seq))
                .map_err(st("reading a record"))?
            {
                return Ok(true);
            }
        }
        self.ks
            .retired
            .contains_key(codec::retired_key(scope, seq))
            .map_err(st("reading a record"))
    }

    /// Any record of `scope` by sequence number, from one snapshot (an unlocked read).
    pub(super) fn load_any(&self, scope: &ScopeKey, seq: u64) -> Result<Option<Record>> {
        let snapshot = self.db.snapshot();
        if let Some(r) = self.load_active_at(&snapshot, scope, seq)? {
            return Ok(Some(r));
        }
        match snapshot
            .get(&self.ks.retired, codec::retired_key(scope, seq))
            .map_err(st("reading a record"))?
        {
            Some(v) => codec::decode_record(&v, Some(scope)).map(Some),
            None => Ok(None),
        }
    }

    /// Every active record of `scope` (of one kind, or both), newest first within a kind, with
    /// its use: under the scope's write lock, or from `snapshot`.
    pub(super) fn active_of(
        &self,
        snapshot: Option<&fjall::Snapshot>,
        scope: &ScopeKey,
        kind: Option<Kind>,
    ) -> Result<Vec<Record>> {
        let prefix = match kind {
            Some(kind) => codec::active_prefix(scope, kind),
            None => codec::scope_key_prefix(scope),
        };
        self.scan(snapshot, scope, &prefix)?.collect()
    }

    /// The active facts of `scope` newer than `newer_than` whose text `keep` selects, newest
    /// first, each with its use, and the newest sequence number read: a record is decoded in
    /// full only once selected. Under the scope's write lock, or from `snapshot`.
    pub(super) fn active_facts_where(
        &self,
        snapshot: Option<&fjall::Snapshot>,
        scope: &ScopeKey,
        newer_than: Option<u64>,
        keep: impl Fn(&str) -> bool,
    ) -> Result<(Vec<Record>, Option<u64>)> {
        let mut scan = self.scan(snapshot, scope, &codec::active_prefix(scope, Kind::Fact))?;
        let mut out = Vec::new();
        let mut newest = None;
        for g in scan.records.by_ref() {
            let (k, v) = g.into_inner().map_err(st("reading records"))?;
            let seq = codec::active_key_parts(&k).map(|(_, seq)| seq);
            // Newest first: past `newer_than`, every later key is older still.
            if seq.zip(newer_than).is_some_and(|(seq, floor)| seq <= floor) {
                break;
            }
            newest = newest.or(seq);
            if keep(codec::record_text(&v)?) {
                out.push(scan.usage.record(&k, &v, scope)?);
            }
        }
        Ok((out, newest))
    }

    /// The active records under `prefix` (a prefix of `scope`'s keys), in key order, each with
    /// its use: under the scope's write lock, or from `snapshot`.
    pub(super) fn scan<'a>(
        &self,
        snapshot: Option<&fjall::Snapshot>,
        scope: &'a ScopeKey,
        prefix: &[u8],
    ) -> Result<ActiveScan<'a>> {
        let (records, usage) = match snapshot {
            Some(snap) => (
                snap.prefix(&self.ks.active, prefix),
                snap.prefix(&self.ks.usage, prefix),
            ),
            None => (self.ks.active.prefix(prefix), self.ks.usage.prefix(prefix)),
        };
        Ok(ActiveScan {
            records,
            usage: UsageOverlay::read(usage)?,
            scope,
        })
    }

    /// `scope`'s retired records from `snapshot`, oldest first (their keys end in the sequence
    /// number, big-endian), after the key `after` when given, each with its key.
    pub(super) fn retired_of<'a>(
        &'a self,
        snapshot: &'a fjall::Snapshot,
        scope: &'a ScopeKey,
        after: Option<Vec<u8>>,
    ) -> impl Iterator<Item = Result<(Vec<u8>, Record)>> + 'a {
        let start = match after {
            Some(key) => Bound::Excluded(key),
            None => Bound::Included(codec::scope_key_prefix(scope)),
        };
        let end = Bound::Included(codec::retired_key(scope, u64::MAX));
        snapshot
            .range(&self.ks.retired, (start, end))
            .map(move |g| {
                let (k, v) = g.into_inner().map_err(st("reading records"))?;
                Ok((k.to_vec(), codec::decode_record(&v, Some(scope))?))
            })
    }

    /// Every active record of every scope, from `snapshot` (without their use: for the index).
    pub(super) fn every_active<'a>(
        &'a self,
        snapshot: &'a fjall::Snapshot,
    ) -> impl Iterator<Item = Result<Record>> + 'a {
        snapshot.iter(&self.ks.active).map(|g| {
            let v = g.value().map_err(st("reading records"))?;
            codec::decode_record(&v, None)
        })
    }

    /// Up to `n` active facts of `scope`, newest first, starting after sequence number `after`
    /// (the caller holds the scope's write lock).
    pub(super) fn facts_after(
        &self,
        scope: &ScopeKey,
        after: Option<u64>,
        n: usize,
    ) -> Result<Vec<Arc<Record>>> {
        let prefix = codec::active_prefix(scope, Kind::Fact);
        // The first key after every key that starts with the prefix (its last byte, the kind,
        // is 0 or 1, so it can be raised).
        let mut end = prefix.clone();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let start = match after {
            Some(seq) => Bound::Excluded(codec::active_key(scope, Kind::Fact, seq)),
            None => Bound::Included(prefix.clone()),
        };
        let mut read = Vec::with_capacity(n);
        for g in self
            .ks
            .active
            .range((start.clone(), Bound::Excluded(end)))
            .take(n)
        {
            let (k, v) = g.into_inner().map_err(st("reading records"))?;
            if !k.starts_with(&prefix) {
                break;
            }
            read.push((k, v));
        }
        let Some((last, _)) = read.last() else {
            return Ok(Vec::new());
        };
        // The usage of exactly the keys read; the caller holds the scope's lock, so it is
        // the usage of these versions of the records.
        let usage =
            UsageOverlay::read(self.ks.usage.range((start, Bound::Included(last.to_vec()))))?;
        let mut out = Vec::with_capacity(read.len());
        for (k, v) in read {
            out.push(Arc::new(usage.record(&k, &v, scope)?));
        }
        Ok(out)
    }

    /// The sequence numbers a dedup key lists, as committed (a point read).
    pub(super) fn dedup_key(&self, key: &[u8]) -> Result<Vec<u64>> {
        match self.ks.norms.get(key).map_err(st("reading a dedup key"))? {
            Some(v) => codec::decode_seqs(&v),
            None => Ok(Vec::new()),
        }
    }

    // ---- counters ----

    /// Every scope's counters from day `since` on: (day, scope, counters).
    pub(super) fn counters_since(&self, since: i64) -> Result<Vec<(i64, ScopeKey, DayCounters)>> {
        let mut out = Vec::new();
        for g in self.ks.counters.range(codec::counters_from(since)..) {
            let (k, v) = g.into_inner().map_err(st("reading counters"))?;
            let (day, scope) = codec::parse_counters_key(&k)
                .ok_or_else(|| Error::format("a counters key does not parse"))?;
            out.push((day, scope, codec::decode(&v, "a day's counters")?));
        }
        Ok(out)
    }

    // ---- the outbox ----

    /// Adds outbox entry `op`, naming the records whose index documents the batch changes.
    pub(super) fn put_outbox(
        &self,
        batch: &mut OwnedWriteBatch,
        op: u64,
        ids: &[&str],
    ) -> Result<()> {
        batch.insert(&self.ks.outbox, op.to_be_bytes(), codec::encode(&ids)?);
        Ok(())
    }

    /// Every outbox entry, in operation order.
    pub(super) fn outbox(&self) -> Result<Vec<(u64, Vec<String>)>> {
        let mut entries = Vec::new();
        for g in self.ks.outbox.iter() {
            let (k, v) = g.into_inner().map_err(st("reading the index outbox"))?;
            let op = codec::trailing_seq(&k)
                .ok_or_else(|| Error::format("an outbox key is not 8 bytes"))?;
            entries.push((op, codec::decode(&v, "an outbox entry")?));
        }
        Ok(entries)
    }

    /// A batch that removes outbox entries `ops`.
    pub(super) fn trim_outbox(&self, ops: impl IntoIterator<Item = u64>) -> OwnedWriteBatch {
        let mut batch = self.db.batch();
        for op in ops {
            batch.remove(&self.ks.outbox, op.to_be_bytes());
        }
        batch
    }

    // ---- a transaction's edits ----

    /// Writes an active record's keys (the record and its dedup key) and notes it entering.
    pub(super) fn put_active(&self, tx: &mut Tx, r: &Record, seq: u64) -> Result<()> {
        let scope = &r.scope_key;
        tx.batch().insert(
            &self.ks.active,
            codec::active_key(scope, r.kind, seq),
            codec::encode_record(r, seq)?,
        );
        if r.dedup_key {
            self.edit_dedup_key(tx, codec::norm_key(scope, &normalize(&r.text)), seq, true)?;
        }
        tx.entered(r, seq);
        Ok(())
    }

    /// Writes a record that never was active (an import's, or one a write inserted and evicted
    /// at once) straight to the retired keyspace.
    pub(super) fn put_retired(&self, tx: &mut Tx, r: &Record, seq: u64) -> Result<()> {
        tx.batch().insert(
            &self.ks.retired,
            codec::retired_key(&r.scope_key, seq),
            codec::encode_record(r, seq)?,
        );
        Ok(())
    }

    /// Moves an active record to the retired keyspace: `old` (as stored) names the keys to
    /// remove; `kept` (its retired status, plus any bump of the same write) is what stays.
    pub(super) fn retire(&self, tx: &mut Tx, old: &Record, kept: &Record, seq: u64) -> Result<()> {
        let scope = &old.scope_key;
        let key = codec::active_key(scope, old.kind, seq);
        if old.last_used_at.is_some() {
            // `kept` carries the use: the entry goes with the record.
            tx.batch().remove(&self.ks.usage, key.clone());
        }
        tx.batch().remove(&self.ks.active, key);
        if old.dedup_key {
            self.edit_dedup_key(
                tx,
                codec::norm_key(scope, &normalize(&old.text)),
                seq,
                false,
            )?;
        }
        self.put_retired(tx, kept, seq)?;
        tx.left(old, seq);
        Ok(())
    }

    /// Rewrites an active record whose counts or times changed: `new` was built from the
    /// record as read (its use included), so its usage entry is folded in and removed.
    pub(super) fn update_active(
        &self,
        tx: &mut Tx,
        old: &Record,
        new: &Record,
        seq: u64,
    ) -> Result<()> {
        let key = codec::active_key(&new.scope_key, new.kind, seq);
        if old.last_used_at.is_some() {
            // Only a record used before can have a usage entry.
            tx.batch().remove(&self.ks.usage, key.clone());
        }
        tx.batch()
            .insert(&self.ks.active, key, codec::encode_record(new, seq)?);
        tx.changed(old, Arc::new(new.clone()), seq);
        Ok(())
    }

    /// Records a retrieve's use of an active record (`new` is `old`, used once more): a small
    /// usage entry, not the record rewritten. The text and everything derived from it stay.
    pub(super) fn bump_active(&self, tx: &mut Tx, old: &Record, new: Arc<Record>, seq: u64) {
        if let Some(u) = codec::Usage::of(&new) {
            tx.batch().insert(
                &self.ks.usage,
                codec::active_key(&new.scope_key, new.kind, seq),
                codec::encode_usage(u),
            );
        }
        tx.changed(old, new, seq);
    }

    /// Adds `seq` to (or takes it from) a dedup key within `tx`: the key's value is read once
    /// per transaction, edited in memory, and written with the transaction.
    fn edit_dedup_key(&self, tx: &mut Tx, key: Vec<u8>, seq: u64, add: bool) -> Result<()> {
        let norms = tx.dedup_keys();
        if !norms.contains_key(&key) {
            let seqs = self.dedup_key(&key)?;
            norms.insert(key.clone(), (seqs, false));
        }
        if let Some((seqs, dirty)) = norms.get_mut(&key) {
            match (seqs.binary_search(&seq), add) {
                (Err(at), true) => seqs.insert(at, seq),
                (Ok(at), false) => {
                    seqs.remove(at);
                }
                _ => return Ok(()),
            }
            *dirty = true;
        }
        Ok(())
    }

    /// Changes the scope's counters of the day of `now` within `tx` (written at commit). The
    /// day's counters are read once: after that, from the scope's derived state.
    pub(super) fn add_day(
        &self,
        tx: &mut Tx,
        scope: &ScopeKey,
        now: i64,
        f: impl FnOnce(&mut DayCounters),
    ) -> Result<()> {
        let day = day_of(now);
        let mut counters = match tx.take_day(day) {
            Some(c) => c,
            None => {
                let key = codec::counters_key(day, scope);
                match self.ks.counters.get(&key).map_err(st("reading counters"))? {
                    Some(v) => codec::decode(&v, "a day's counters")?,
                    None => DayCounters::default(),
                }
            }
        };
        f(&mut counters);
        tx.set_day(day, counters);
        Ok(())
    }

    /// Writes what `tx` keeps in memory until its commit (the scope's bookkeeping, the dedup
    /// keys it edited, the day's counters) into its batch.
    pub(super) fn seal(&self, tx: &mut Tx, scope: &ScopeKey) -> Result<()> {
        let (meta, norms, day, batch) = tx.unsealed();
        if let Some(m) = meta {
            batch.insert(&self.ks.scopes, scope.as_str(), codec::encode(m)?);
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
        if let Some((d, counters)) = day {
            batch.insert(
                &self.ks.counters,
                codec::counters_key(*d, scope),
                codec::encode(counters)?,
            );
        }
        Ok(())
    }
}

/// Active records read in key order, each with its use (see [`Records::scan`]).
pub(super) struct ActiveScan<'a> {
    records: fjall::Iter,
    usage: UsageOverlay,
    scope: &'a ScopeKey,
}

impl Iterator for ActiveScan<'_> {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Result<Record>> {
        let g = self.records.next()?;
        Some(
            g.into_inner()
                .map_err(st("reading records"))
                .and_then(|(k, v)| self.usage.record(&k, &v, self.scope)),
        )
    }
}

/// A scope's usage entries over one range of keys, in key order: what a scan of the same
/// range of `active` overlays on the records it decodes. Read under the scope's lock or from
/// the scan's snapshot, so each entry belongs to the record version the scan reads.
struct UsageOverlay(Vec<(fjall::UserKey, codec::Usage)>);

impl UsageOverlay {
    fn read(entries: fjall::Iter) -> Result<UsageOverlay> {
        let mut out = Vec::new();
        for g in entries {
            let (k, v) = g.into_inner().map_err(st("reading records' use"))?;
            out.push((k, codec::decode_usage(&v)?));
        }
        Ok(UsageOverlay(out))
    }

    /// `decode_record` of a scanned `active` entry, with its use.
    fn record(&self, key: &[u8], value: &[u8], scope: &ScopeKey) -> Result<Record> {
        let mut r = codec::decode_record(value, Some(scope))?;
        let found = self.0.binary_search_by(|(k, _)| k.as_ref().cmp(key));
        if let Some((_, u)) = found.ok().and_then(|at| self.0.get(at)) {
            u.apply(&mut r);
        }
        Ok(r)
    }
}
