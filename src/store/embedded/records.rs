//! Reading and writing one scope's records inside a transaction: the keys a record occupies
//! (the record, its dedup key), and each record's entry in the transaction's change list,
//! which the commit applies to the scope's derived state.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::super::codec::{self, ScopeMeta};
use super::super::DayCounters;
use super::commit::{Change, Old, Tx};
use super::order::lru_key;
use super::{st, Shared};
use crate::error::{Error, ErrorKind, Result};
use crate::fts::FtsDoc;
use crate::model::{Kind, Record, ScopeKey, Status};
use crate::store::index::IndexOp;
use crate::store::plan::ActiveMeta;
use crate::text::normalize;
use crate::time::day_of;

impl Shared {
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
        let get = |ks: &fjall::Keyspace, key: &[u8]| match snapshot {
            Some(snap) => fjall::Readable::get(snap, ks, key),
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

    /// The usage entries over a range of `usage` keys, for a scan of the same `active` range.
    pub(super) fn usage_overlay(&self, entries: fjall::Iter) -> Result<UsageOverlay> {
        let mut out = Vec::new();
        for g in entries {
            let (k, v) = g.into_inner().map_err(st("reading records' use"))?;
            out.push((k, codec::decode_usage(&v)?));
        }
        Ok(UsageOverlay(out))
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
        match fjall::Readable::get(&snapshot, &self.ks.retired, codec::retired_key(scope, seq))
            .map_err(st("reading a record"))?
        {
            Some(v) => codec::decode_record(&v, Some(scope)).map(Some),
            None => Ok(None),
        }
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
        let mut counters = match tx.day.take() {
            Some((d, c)) if d == day => c,
            _ => match tx.cached_day.take().filter(|(d, _)| *d == day) {
                Some((_, c)) => c,
                None => {
                    let key = codec::counters_key(day, scope);
                    match self.ks.counters.get(&key).map_err(st("reading counters"))? {
                        Some(v) => codec::decode(&v, "a day's counters")?,
                        None => DayCounters::default(),
                    }
                }
            },
        };
        f(&mut counters);
        tx.day = Some((day, counters));
        Ok(())
    }

    pub(super) fn upsert_op(r: &Record) -> IndexOp {
        IndexOp::Upsert {
            id: r.id.clone(),
            scope: r.scope_key.as_str().to_owned(),
            fts: Arc::new(FtsDoc::of(&r.text, &r.keywords)),
        }
    }

    /// A record's place in the eviction order, for a plan that may evict it: its text is
    /// never compared, so it is not normalized.
    pub(super) fn eviction_meta_of(r: &Record, seq: u64) -> ActiveMeta {
        ActiveMeta {
            seq,
            norm: String::new(),
            dedup_key: false,
            created_at: r.created_at,
            last_used_at: r.last_used_at,
            use_count: r.use_count,
            confidence: r.confidence,
        }
    }

    pub(super) fn meta_of(r: &Record, seq: u64) -> ActiveMeta {
        ActiveMeta {
            seq,
            norm: normalize(&r.text),
            dedup_key: r.dedup_key,
            created_at: r.created_at,
            last_used_at: r.last_used_at,
            use_count: r.use_count,
            confidence: r.confidence,
        }
    }

    /// Writes an active record's keys (the record and its dedup key) and notes it entering.
    pub(super) fn put_active(&self, tx: &mut Tx, r: &Record, seq: u64) -> Result<()> {
        let scope = &r.scope_key;
        tx.batch.insert(
            &self.ks.active,
            codec::active_key(scope, r.kind, seq),
            codec::encode_record(r, seq)?,
        );
        if r.dedup_key {
            self.edit_dedup_key(tx, codec::norm_key(scope, &normalize(&r.text)), seq, true)?;
        }
        tx.changes.push(Change {
            seq,
            old: None,
            new: Some(Arc::new(r.clone())),
        });
        Ok(())
    }

    /// Moves an active record to the retired keyspace: `old` (as stored) names the keys to
    /// remove; `kept` (its retired status, plus any bump of the same write) is what stays.
    pub(super) fn retire(&self, tx: &mut Tx, old: &Record, kept: &Record, seq: u64) -> Result<()> {
        let scope = &old.scope_key;
        let key = codec::active_key(scope, old.kind, seq);
        if old.last_used_at.is_some() {
            // `kept` carries the use: the entry goes with the record.
            tx.batch.remove(&self.ks.usage, key.clone());
        }
        tx.batch.remove(&self.ks.active, key);
        if old.dedup_key {
            self.edit_dedup_key(
                tx,
                codec::norm_key(scope, &normalize(&old.text)),
                seq,
                false,
            )?;
        }
        tx.batch.insert(
            &self.ks.retired,
            codec::retired_key(scope, seq),
            codec::encode_record(kept, seq)?,
        );
        let old = tx.old(old, seq);
        tx.changes.push(Change {
            seq,
            old: Some(old),
            new: None,
        });
        Ok(())
    }

    /// The sequence numbers a dedup key lists, as committed (a point read).
    pub(super) fn dedup_key(&self, key: &[u8]) -> Result<Vec<u64>> {
        match self.ks.norms.get(key).map_err(st("reading a dedup key"))? {
            Some(v) => codec::decode_seqs(&v),
            None => Ok(Vec::new()),
        }
    }

    /// Adds `seq` to (or takes it from) a dedup key within `tx`: the key's value is read once
    /// per transaction, edited in memory, and written with the transaction.
    fn edit_dedup_key(&self, tx: &mut Tx, key: Vec<u8>, seq: u64, add: bool) -> Result<()> {
        if !tx.norms.contains_key(&key) {
            let seqs = self.dedup_key(&key)?;
            tx.norms.insert(key.clone(), (seqs, false));
        }
        if let Some((seqs, dirty)) = tx.norms.get_mut(&key) {
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

    /// Rewrites an active record whose counts or times changed: `new` was built from the
    /// record as read (its use included), so its usage entry is folded in and removed.
    pub(super) fn update_active(
        &self,
        tx: &mut Tx,
        old: &Record,
        new: &Record,
        seq: u64,
    ) -> Result<()> {
        let scope = &new.scope_key;
        let key = codec::active_key(scope, new.kind, seq);
        if old.last_used_at.is_some() {
            // Only a record used before can have a usage entry.
            tx.batch.remove(&self.ks.usage, key.clone());
        }
        tx.batch
            .insert(&self.ks.active, key, codec::encode_record(new, seq)?);
        tx.changes
            .push(changed_in_place(old, Arc::new(new.clone()), seq));
        Ok(())
    }
}

impl Shared {
    /// Records a retrieve's use of an active record (`new` is `old`, used once more): a small
    /// usage entry, not the record rewritten. The text and everything derived from it stay.
    pub(super) fn bump_active(&self, tx: &mut Tx, old: &Record, new: Arc<Record>, seq: u64) {
        if let Some(u) = codec::Usage::of(&new) {
            tx.batch.insert(
                &self.ks.usage,
                codec::active_key(&new.scope_key, new.kind, seq),
                codec::encode_usage(u),
            );
        }
        tx.changes.push(changed_in_place(old, new, seq));
    }
}

/// The change of an active record that stays active with the same text (its counts, times or
/// provenance changed): the FTS totals are untouched, the eviction order moves it.
fn changed_in_place(old: &Record, new: Arc<Record>, seq: u64) -> Change {
    Change {
        seq,
        old: Some(Old {
            kind: old.kind,
            lru: lru_key(old, seq),
            fts: None,
        }),
        new: Some(new),
    }
}

/// A scope's usage entries over one range of keys, in key order: what a scan of the same
/// range of `active` overlays on the records it decodes. Read under the scope's lock or from
/// the scan's snapshot, so each entry belongs to the record version the scan reads.
pub(super) struct UsageOverlay(Vec<(fjall::UserKey, codec::Usage)>);

impl UsageOverlay {
    /// `r` (read at `key` in `active`) with its use.
    pub(super) fn apply(&self, key: &[u8], r: &mut Record) {
        let found = self.0.binary_search_by(|(k, _)| k.as_ref().cmp(key));
        if let Some((_, u)) = found.ok().and_then(|at| self.0.get(at)) {
            u.apply(r);
        }
    }

    /// `decode_record` of a scanned `active` entry, with its use.
    pub(super) fn record(&self, key: &[u8], value: &[u8], scope: &ScopeKey) -> Result<Record> {
        let mut r = codec::decode_record(value, Some(scope))?;
        self.apply(key, &mut r);
        Ok(r)
    }
}

/// `r` with `status`.
pub(super) fn with_status(r: &Record, status: Status) -> Record {
    let mut out = r.clone();
    out.status = status;
    out
}

/// What leaves the active set with a record: its kind, its place in the eviction order, and
/// (when the scope's FTS totals are loaded) its FTS document.
pub(super) fn old_of(r: &Record, seq: u64, fts: bool) -> Old {
    Old {
        kind: r.kind,
        lru: lru_key(r, seq),
        fts: fts.then(|| FtsDoc::of(&r.text, &r.keywords)),
    }
}
