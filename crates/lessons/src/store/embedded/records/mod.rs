//! The records on disk: fjall and its keyspaces, read by point lookups and prefix scans, and
//! written only through a [`Tx`](super::tx::Tx) (one scope's batch) or a batch the caller commits.
//!
//! Keyspaces (key layouts in `store::codec`): `active` (active records by scope, kind and
//! reversed sequence), `retired` (every other status), `usage` (a retrieve's use of an active
//! record), `norms` (dedup keys), `scopes` (each scope's bookkeeping), `counters` (per scope per
//! day), `outbox` (index changes not yet in a committed index), `decisions` (the decision
//! journal), `meta` (format, last batch, journal tallies).
//!
//! This file holds the keyspaces, the store's metadata (format, last batch), the scopes'
//! bookkeeping, the day counters and the index outbox; `tuning` opens fjall, `reads` reads
//! the records, `edits` writes a transaction's changes, `dedup` derives the dedup keys from the
//! records, `audit` checks the keyspaces against each other for `doctor`.
//!
//! **Invariant:** only this module (this folder) names a keyspace's contents; the other files
//! ask it. The two exceptions own what they name and are handed their keyspace at open:
//! `DecisionJournal` (the `decisions` keyspace and its tallies in `meta`) and `GroupCommit`
//! (the batch numbers in `meta`). `doctor` asks `audit`, the format upgrade asks `dedup`.

mod audit;
mod dedup;
mod edits;
mod reads;
mod tuning;

pub(super) use audit::NormProblem;

use std::collections::BTreeSet;

use fjall::{Database, Keyspace, OwnedWriteBatch};

use crate::error::{Error, ErrorKind, Result};
use crate::model::{Kind, ScopeKey};
use crate::store::codec::{self, ScopeMeta};
use crate::store::counters::DayCounters;
use crate::store::engine::st;

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

/// The records engine: the database and its keyspaces.
pub(super) struct Records {
    db: Database,
    ks: Keyspaces,
}

impl Records {
    /// The database handle, for the types that commit and sync it.
    pub(super) fn db(&self) -> &Database {
        &self.db
    }

    /// The keyspaces, for the types that own one's contents (the decision journal, the
    /// group commit's batch numbers) and for the close's flush of every memtable.
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

    /// Marks the store as being upgraded from format `from` to the current one: `[current,
    /// from]`, which a build that knows only `from` refuses (it would misread what the upgrade
    /// has rewritten so far), and this one finishes. Outside any batch: the upgrade's first
    /// durable batch, later in fjall's journal, makes it durable.
    pub(super) fn mark_format_upgrading(&self, from: u8) -> Result<()> {
        self.ks
            .meta
            .insert("format", [codec::STORE_FORMAT, from])
            .map_err(st("writing the format version"))
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
}
