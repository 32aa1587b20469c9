//! What the store keeps derived from each scope's records (see `scopes`): loaded on first need
//! under the scope's write lock, and kept by every commit to the scope, before the commit is
//! acknowledged.
//!
//! **Invariant:** a read after an acknowledged write sees that write: the commit updates the
//! scope's derived state under the write lock, before the writer returns.

use std::ops::Bound;
use std::sync::Arc;

use parking_lot::RwLock;

use super::super::codec::{self, ScopeMeta};
use super::commit::Change;
use super::order::{lru_key, EvictionOrder, LruKey};
use super::scopes::{Scope, Search};
use super::search::ScopeSearch;
use super::totals::ScopeFts;
use super::window::{Next, WindowData};
use super::{st, Shared, WINDOW_LEN};
use crate::error::Result;
use crate::fts::FtsDoc;
use crate::model::{Kind, Record, ScopeKey, Status};

impl Shared {
    /// A scope's bookkeeping, for a caller that holds the scope's write lock and is about to
    /// write.
    ///
    /// The bookkeeping is derived data: the next sequence number must be above every record the
    /// scope holds, and the active count must be the number of its active records. A damaged
    /// journal or a lost flush can leave it behind its records, and a stale next sequence would
    /// mint an id that already exists. So the first write to a scope after open (or after the
    /// scope left memory) checks it against the records (a few seeks and one scan of at most
    /// `cap` keys) and, when it disagrees, repairs it durably before anything else and logs
    /// what it found. Later writes read it from memory.
    pub(super) fn scope_meta(&self, scope: &ScopeKey, state: &Scope) -> Result<ScopeMeta> {
        if let Some(meta) = state.derived().meta {
            return Ok(meta);
        }
        let stored = self.stored_meta(scope)?;
        let derived = self.derive_meta(scope)?;
        let meta = stored.unwrap_or_default();
        let repaired = ScopeMeta {
            next_seq: meta.next_seq.max(derived.next_seq),
            active: derived.active,
        };
        if repaired != meta && (stored.is_some() || repaired != ScopeMeta::default()) {
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
        self.scopes
            .update(scope, state, |d| d.meta = Some(repaired));
        Ok(repaired)
    }

    /// The scope's FTS totals (active records, their tokens, each term's document count),
    /// loaded from the records on first need and kept by every commit after.
    pub(super) fn fts_stats(&self, scope: &ScopeKey, state: &Scope) -> Result<Arc<ScopeFts>> {
        if let Some(stats) = state.derived().fts.clone() {
            return Ok(stats);
        }
        let _write = state.write.lock();
        if let Some(stats) = state.derived().fts.clone() {
            return Ok(stats);
        }
        let mut stats = ScopeFts::default();
        for g in self.ks.active.prefix(codec::scope_key_prefix(scope)) {
            let r = codec::decode_record(&g.value().map_err(st("reading records"))?, Some(scope))?;
            stats.apply(&FtsDoc::of(&r.text, &r.keywords), true);
        }
        let stats = Arc::new(stats);
        self.scopes
            .update(scope, state, |d| d.fts = Some(Arc::clone(&stats)));
        Ok(stats)
    }

    /// The scope's active records held for retrieve, loaded from the records on first need and
    /// kept by every commit after; `None` when they would take more than the scope's share of
    /// the memory bounds, or the searches held already take theirs, and retrieve asks the
    /// keyword index instead.
    pub(super) fn scope_search(
        &self,
        scope: &ScopeKey,
        state: &Scope,
    ) -> Result<Option<Arc<RwLock<ScopeSearch>>>> {
        let held = |search: &Search| match search {
            Search::Held(s) => Some(Some(Arc::clone(s))),
            Search::Indexed => Some(None),
            Search::Unloaded => None,
        };
        if let Some(known) = held(&state.derived().search) {
            return Ok(known);
        }
        if !self.scopes.search_room() {
            return Ok(None);
        }
        let _write = state.write.lock();
        if let Some(known) = held(&state.derived().search) {
            return Ok(known);
        }
        let prefix = codec::scope_key_prefix(scope);
        let usage = self.usage_overlay(self.ks.usage.prefix(&prefix))?;
        let mut records = Vec::new();
        for g in self.ks.active.prefix(&prefix) {
            let (k, v) = g.into_inner().map_err(st("reading records"))?;
            records.push(Arc::new(usage.record(&k, &v, scope)?));
        }
        let search = ScopeSearch::of(records);
        let (next, out) = if search.bytes() <= self.scopes.search_limit() {
            let shared = Arc::new(RwLock::new(search));
            (Search::Held(Arc::clone(&shared)), Some(shared))
        } else {
            (Search::Indexed, None)
        };
        self.scopes.update(scope, state, |d| d.search = next);
        Ok(out)
    }

    /// The scope's newest `WINDOW_LEN` active facts, decoded and shared: kept up to date by
    /// every commit to the scope, so a window read costs the same whether or not a write came
    /// before it, whatever the size of the store.
    pub(super) fn window(&self, scope: &ScopeKey) -> Result<Arc<Vec<Arc<Record>>>> {
        let state = self.scopes.get(scope);
        if let Some(w) = state.derived().window.as_ref() {
            return Ok(w.shared());
        }
        let _write = state.write.lock();
        if let Some(w) = state.derived().window.as_ref() {
            return Ok(w.shared());
        }
        let facts = self.read_facts(scope, None, WINDOW_LEN + 1)?;
        let window = Arc::new(WindowData::loaded(facts, WINDOW_LEN));
        let shared = window.shared();
        self.scopes
            .update(scope, &state, |d| d.window = Some(window));
        Ok(shared)
    }

    /// Up to `n` active facts of `scope`, newest first, starting after sequence number `after`.
    fn read_facts(
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
            self.usage_overlay(self.ks.usage.range((start, Bound::Included(last.to_vec()))))?;
        let mut out = Vec::with_capacity(read.len());
        for (k, v) in read {
            out.push(Arc::new(usage.record(&k, &v, scope)?));
        }
        Ok(out)
    }

    /// The first `n` active records of `scope` in eviction order (the caller holds the scope's
    /// write lock). The order is loaded from the records on first need.
    pub(super) fn eviction_head(
        &self,
        scope: &ScopeKey,
        state: &Scope,
        n: usize,
    ) -> Result<Vec<LruKey>> {
        if let Some(order) = state.derived().order.as_ref() {
            return Ok(order.head(n));
        }
        let mut order = EvictionOrder::default();
        let prefix = codec::scope_key_prefix(scope);
        let usage = self.usage_overlay(self.ks.usage.prefix(&prefix))?;
        for g in self.ks.active.prefix(&prefix) {
            let (k, v) = g.into_inner().map_err(st("reading records"))?;
            let r = usage.record(&k, &v, scope)?;
            if let Some(seq) = r.seq() {
                order.insert(lru_key(&r, seq));
            }
        }
        let head = order.head(n);
        self.scopes.update(scope, state, |d| d.order = Some(order));
        Ok(head)
    }

    /// Applies a committed batch's changes to the scope's derived state (the caller holds the
    /// scope's write lock, and the batch is visible to readers). Every part follows the batch
    /// or is dropped, to be loaded again on next need: none is left behind it.
    pub(super) fn apply_changes(
        &self,
        scope: &ScopeKey,
        state: &Scope,
        changes: &[Change],
        meta: Option<ScopeMeta>,
    ) {
        let current = state.derived().window.clone();
        // `Some(None)`: the window could not follow and is dropped.
        let window = match current {
            Some(w) if changes.iter().any(touches_facts) => {
                Some(match w.next(changes, WINDOW_LEN) {
                    Next::Ready(w) => Some(w),
                    Next::Refill { kept, after } => {
                        match self.read_facts(scope, after, WINDOW_LEN - kept.len() + 1) {
                            Ok(more) => Some(WindowData::refilled(kept, more, WINDOW_LEN)),
                            Err(e) => {
                                log::warn!(
                                    "[store] {scope}: the window is read again on next need: {e}"
                                );
                                None
                            }
                        }
                    }
                })
            }
            _ => None,
        };
        let search_limit = self.scopes.search_limit();
        self.scopes.update(scope, state, |d| {
            if let Search::Held(search) = &d.search {
                let mut search = search.write();
                search.apply(changes);
                if search.bytes() > search_limit {
                    drop(search);
                    d.search = Search::Indexed;
                }
            }
            if meta.is_some() {
                d.meta = meta;
            }
            if let Some(w) = window {
                d.window = w.map(Arc::new);
            }
            if let Some(order) = d.order.as_mut() {
                for c in changes {
                    let new = c
                        .new
                        .as_ref()
                        .filter(|r| r.status == Status::Active)
                        .map(|r| lru_key(r, c.seq));
                    order.apply(c.old.as_ref().map(|o| o.lru), new);
                }
            }
            if let Some(fts) = d.fts.as_mut() {
                let fts = Arc::make_mut(fts);
                for c in changes {
                    if let Some(doc) = c.old.as_ref().and_then(|o| o.fts.as_ref()) {
                        fts.apply(doc, false);
                    }
                    if c.old.is_none() {
                        if let Some(r) = c.new.as_ref().filter(|r| r.status == Status::Active) {
                            fts.apply(&FtsDoc::of(&r.text, &r.keywords), true);
                        }
                    }
                }
            }
        });
    }
}

fn touches_facts(c: &Change) -> bool {
    c.old.as_ref().is_some_and(|o| o.kind == Kind::Fact)
        || c.new.as_ref().is_some_and(|r| r.kind == Kind::Fact)
}
