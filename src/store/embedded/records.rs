//! Reading and writing one scope's records and bookkeeping inside a transaction: the keys a
//! record occupies, the bookkeeping checked against the records, the eviction order.

use std::collections::BTreeSet;
use std::sync::Arc;

use fjall::OwnedWriteBatch;
use parking_lot::Mutex;

use super::super::codec::{self, ScopeMeta};
use super::super::{day_of, DayCounters};
use super::commit::Tx;
use super::{st, Shared};
use crate::error::{Error, ErrorKind, Result};
use crate::fts::{FtsDoc, Totals};
use crate::index::IndexOp;
use crate::model::{Kind, Record, ScopeKey, Status};
use crate::plan::ActiveMeta;
use crate::text::normalize;

pub(super) type LruKey = (i64, i64, u64);

/// The eviction order of a record: least recently used, then older, then lower seq.
pub(super) fn lru_key(r: &Record, seq: u64) -> LruKey {
    (r.usage_time(), r.created_at, seq)
}

impl Shared {
    pub(super) fn scope_lock(&self, scope: &ScopeKey) -> Arc<Mutex<()>> {
        let mut locks = self.scope_locks.lock();
        Arc::clone(locks.entry(scope.clone()).or_default())
    }

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

    /// A scope's bookkeeping, for a caller that holds the scope's lock and is about to write.
    ///
    /// The bookkeeping is derived data: the next sequence number must be above every record the
    /// scope holds, and the active count must be the number of its active records. A damaged
    /// journal or a lost flush can leave it behind its records, and a stale next sequence would
    /// mint an id that already exists. So the first write to a scope after open checks it
    /// against the records (a few seeks and one scan of at most `cap` keys) and, when it
    /// disagrees, repairs it durably before anything else and logs what it found.
    pub(super) fn scope_meta(&self, scope: &ScopeKey) -> Result<ScopeMeta> {
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

    /// The active record `seq` of `scope`, whichever its kind.
    pub(super) fn load_active(&self, scope: &ScopeKey, seq: u64) -> Result<Option<Record>> {
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

    pub(super) fn load_any(&self, scope: &ScopeKey, seq: u64) -> Result<Option<Record>> {
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

    pub(super) fn add_day(
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
    pub(super) fn put_active(&self, tx: &mut Tx, r: &Record, seq: u64) -> Result<()> {
        let scope = &r.scope_key;
        tx.batch.insert(
            &self.ks.active,
            codec::active_key(scope, r.kind, seq),
            codec::encode_record(r, seq)?,
        );
        if r.dedup_key {
            tx.batch.insert(
                &self.ks.norms,
                codec::norm_key(scope, &normalize(&r.text), seq),
                [],
            );
        }
        tx.lru.push((None, Some(lru_key(r, seq))));
        if self.fts_loaded(scope) {
            tx.fts.push((true, FtsDoc::of(&r.text, &r.keywords)));
        }
        Ok(())
    }

    /// Moves an active record to the retired keyspace: `old` (as stored) names the keys to
    /// remove; `kept` (its retired status, plus any bump of the same write) is what stays.
    pub(super) fn retire(&self, tx: &mut Tx, old: &Record, kept: &Record, seq: u64) -> Result<()> {
        let scope = &old.scope_key;
        tx.batch
            .remove(&self.ks.active, codec::active_key(scope, old.kind, seq));
        if old.dedup_key {
            tx.batch.remove(
                &self.ks.norms,
                codec::norm_key(scope, &normalize(&old.text), seq),
            );
        }
        tx.lru.push((Some(lru_key(old, seq)), None));
        if self.fts_loaded(scope) {
            tx.fts.push((false, FtsDoc::of(&old.text, &old.keywords)));
        }
        tx.batch.insert(
            &self.ks.retired,
            codec::retired_key(scope, seq),
            codec::encode_record(kept, seq)?,
        );
        Ok(())
    }

    /// Rewrites an active record whose counts or times changed.
    pub(super) fn update_active(
        &self,
        tx: &mut Tx,
        old: &Record,
        new: &Record,
        seq: u64,
    ) -> Result<()> {
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
    pub(super) fn apply_lru(&self, scope: &ScopeKey, edits: Vec<(Option<LruKey>, Option<LruKey>)>) {
        // Every commit that changes a scope's records passes here, under the scope's lock and
        // before the write is acknowledged: the decoded window is dropped, so the next read
        // after the acknowledgement decodes the records again.
        self.windows.lock().remove(scope);
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

    /// Whether the scope's FTS totals are in memory. Writers hold the scope's lock from planning
    /// to commit and `fts_stats` loads under it, so the answer holds for the whole write: a
    /// scope whose totals are not loaded costs its writes no tokenizing.
    fn fts_loaded(&self, scope: &ScopeKey) -> bool {
        self.fts.lock().contains_key(scope)
    }

    /// Applies a committed transaction's changes to the scope's FTS totals, if loaded.
    pub(super) fn apply_fts(&self, scope: &ScopeKey, changes: Vec<(bool, FtsDoc)>) {
        if changes.is_empty() {
            return;
        }
        let mut all = self.fts.lock();
        if let Some(stats) = all.get_mut(scope) {
            let stats = Arc::make_mut(stats);
            for (entering, doc) in &changes {
                stats.apply(doc, *entering);
            }
        }
    }

    /// The scope's FTS totals (active records, their tokens, each term's document count),
    /// loaded from the records on first need and kept by every commit after.
    pub(super) fn fts_stats(&self, scope: &ScopeKey) -> Result<Arc<ScopeFts>> {
        if let Some(stats) = self.fts.lock().get(scope) {
            return Ok(Arc::clone(stats));
        }
        // Under the scope's lock, so no commit of this scope lands between the scan and the
        // insert (commits apply their changes under it).
        let lock = self.scope_lock(scope);
        let _guard = lock.lock();
        if let Some(stats) = self.fts.lock().get(scope) {
            return Ok(Arc::clone(stats));
        }
        let mut stats = ScopeFts::default();
        for g in self.ks.active.prefix(codec::scope_key_prefix(scope)) {
            let r = codec::decode_record(&g.value().map_err(st("reading records"))?, Some(scope))?;
            stats.apply(&FtsDoc::of(&r.text, &r.keywords), true);
        }
        let stats = Arc::new(stats);
        let mut all = self.fts.lock();
        // Bounded by configuration, not by the number of scopes: any scope can be loaded again.
        if all.len() >= self.fts_scopes {
            if let Some(victim) = all.keys().next().cloned() {
                all.remove(&victim);
            }
        }
        all.insert(scope.clone(), Arc::clone(&stats));
        Ok(stats)
    }

    /// The newest `WINDOW_LEN` active facts of `scope`, decoded, shared: kept until the next
    /// commit to the scope, so a window read costs the same whatever the size of the store.
    pub(super) fn window(&self, scope: &ScopeKey) -> Result<Arc<Vec<Record>>> {
        if let Some(w) = self.windows.lock().get(scope) {
            return Ok(Arc::clone(w));
        }
        // Under the scope's lock, so no commit lands between the scan and the insert.
        let lock = self.scope_lock(scope);
        let _guard = lock.lock();
        if let Some(w) = self.windows.lock().get(scope) {
            return Ok(Arc::clone(w));
        }
        let mut facts = Vec::with_capacity(super::WINDOW_LEN);
        for g in self
            .ks
            .active
            .prefix(codec::active_prefix(scope, Kind::Fact))
            .take(super::WINDOW_LEN)
        {
            facts.push(codec::decode_record(
                &g.value().map_err(st("reading records"))?,
                Some(scope),
            )?);
        }
        let facts = Arc::new(facts);
        let mut all = self.windows.lock();
        if all.len() >= super::WINDOW_SCOPES {
            if let Some(victim) = all.keys().next().cloned() {
                all.remove(&victim);
            }
        }
        all.insert(scope.clone(), Arc::clone(&facts));
        Ok(facts)
    }

    /// The first `n` active records of `scope` in eviction order. The order is kept in memory
    /// per scope, loaded from the records on first need; callers hold the scope's lock.
    pub(super) fn eviction_head(&self, scope: &ScopeKey, n: usize) -> Result<Vec<u64>> {
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
        let mut all = self.lru.lock();
        // Bounded by configuration, not by the number of scopes. Dropping another scope's order
        // is safe without its lock: its commits edit the order only if loaded, and its next
        // load reads the committed records under its lock.
        if all.len() >= super::LRU_SCOPES {
            if let Some(victim) = all.keys().next().cloned() {
                all.remove(&victim);
            }
        }
        all.insert(scope.clone(), order);
        Ok(head)
    }

    pub(super) fn upsert_op(r: &Record) -> IndexOp {
        IndexOp::Upsert {
            id: r.id.clone(),
            scope: r.scope_key.as_str().to_owned(),
            text: r.text.clone(),
            keywords: r.keywords.clone(),
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
}

/// `r` with `status`.
/// A scope's FTS totals as the reference Worker's FTS5 table keeps them over its active rows.
#[derive(Clone, Debug, Default)]
pub(super) struct ScopeFts {
    pub(super) totals: Totals,
    /// Active records holding each term.
    pub(super) hits: crate::text::FnvMap<String, u64>,
}

impl ScopeFts {
    fn apply(&mut self, doc: &FtsDoc, entering: bool) {
        let mut distinct: Vec<&String> = doc.terms.iter().collect();
        distinct.sort_unstable();
        distinct.dedup();
        if entering {
            self.totals.rows += 1;
            self.totals.tokens += u64::from(doc.len);
            for t in distinct {
                *self.hits.entry(t.clone()).or_insert(0) += 1;
            }
        } else {
            self.totals.rows = self.totals.rows.saturating_sub(1);
            self.totals.tokens = self.totals.tokens.saturating_sub(u64::from(doc.len));
            for t in distinct {
                if let Some(n) = self.hits.get_mut(t.as_str()) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        self.hits.remove(t.as_str());
                    }
                }
            }
        }
    }

    /// Active records holding `term`.
    pub(super) fn hits(&self, term: &str) -> u64 {
        self.hits.get(term).copied().unwrap_or(0)
    }
}

pub(super) fn with_status(r: &Record, status: Status) -> Record {
    let mut out = r.clone();
    out.status = status;
    out
}
