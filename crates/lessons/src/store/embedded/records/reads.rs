//! The records' reads: point lookups and prefix scans of `active` and `retired`, each active
//! record read with its use from `usage`, and the dedup keys as committed.
//!
//! **Invariant:** a record is read with the usage entry of the same version: under the scope's
//! write lock (live reads) or from one snapshot (`*_at`, `*_from`), never a mix of the two.

use std::ops::Bound;
use std::sync::Arc;

use fjall::{Keyspace, Readable};

use super::Records;
use crate::error::Result;
use crate::model::{Kind, Record, ScopeKey};
use crate::store::codec;
use crate::store::engine::st;

impl Records {
    /// The active record `seq` of `scope`, whichever its kind, with its use. Read live: the
    /// caller holds the scope's write lock, so the record and its usage entry cannot change
    /// between the two reads (an unlocked reader uses `load_active_at`).
    pub(in crate::store::embedded) fn load_active(
        &self,
        scope: &ScopeKey,
        seq: u64,
    ) -> Result<Option<Record>> {
        self.load_active_from(None, scope, seq)
    }

    /// `load_active` from one snapshot: consistent without the scope's lock.
    pub(in crate::store::embedded) fn load_active_at(
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
    pub(in crate::store::embedded) fn holds(&self, scope: &ScopeKey, seq: u64) -> Result<bool> {
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
    pub(in crate::store::embedded) fn load_any(
        &self,
        scope: &ScopeKey,
        seq: u64,
    ) -> Result<Option<Record>> {
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

    /// The text of record `seq` of `scope`, active or retired, from `snapshot`: where a
    /// decision-journal entry that left its text out finds it (`codec::text_record`). Nothing
    /// but the record is read: a text does not depend on the record's use. `retired` says
    /// where to look first (an eviction's record is retired for good).
    pub(in crate::store::embedded) fn text_at(
        &self,
        snapshot: &fjall::Snapshot,
        scope: &ScopeKey,
        seq: u64,
        retired: bool,
    ) -> Result<Option<String>> {
        let mut keys = [
            (&self.ks.active, codec::active_key(scope, Kind::Fact, seq)),
            (
                &self.ks.active,
                codec::active_key(scope, Kind::Summary, seq),
            ),
            (&self.ks.retired, codec::retired_key(scope, seq)),
        ];
        if retired {
            keys.rotate_right(1);
        }
        for (ks, key) in keys {
            if let Some(v) = snapshot.get(ks, key).map_err(st("reading a record"))? {
                return codec::decode_record_text(&v).map(Some);
            }
        }
        Ok(None)
    }

    /// Every active record of `scope` (of one kind, or both), newest first within a kind, with
    /// its use: under the scope's write lock, or from `snapshot`.
    pub(in crate::store::embedded) fn active_of(
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
    pub(in crate::store::embedded) fn active_facts_where(
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
    pub(in crate::store::embedded) fn scan<'a>(
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
    pub(in crate::store::embedded) fn retired_of<'a>(
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
    pub(in crate::store::embedded) fn every_active<'a>(
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
    pub(in crate::store::embedded) fn facts_after(
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
    pub(in crate::store::embedded) fn dedup_key(&self, key: &[u8]) -> Result<Vec<u64>> {
        match self.ks.norms.get(key).map_err(st("reading a dedup key"))? {
            Some(v) => codec::decode_seqs(&v),
            None => Ok(Vec::new()),
        }
    }
}

/// Active records read in key order, each with its use (see [`Records::scan`]).
pub(in crate::store::embedded) struct ActiveScan<'a> {
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
