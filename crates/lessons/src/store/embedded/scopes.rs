//! The scopes the store keeps in memory: each scope's write lock and what the store keeps
//! derived from its records between commits (checked bookkeeping, the decoded window, the
//! eviction order, the FTS totals, the records held for retrieve), in one map bounded by a
//! count and a byte budget, least recently used dropped first. Each part is loaded from the
//! records on first need, under the scope's write lock, and kept by every commit to the scope.
//!
//! **Invariant:** everything a `Scope` holds besides its lock is derived from the records and
//! may be dropped at any time; the next use loads it again under the scope's write lock. It may
//! run ahead of the records only by the use bumps it counts unsettled, and every load waits for
//! those to settle first, so nothing loaded lags what was dropped.
//! **Invariant:** a read after an acknowledged write sees that write: the commit applies its
//! changes here under the scope's write lock, before the writer returns.
//! **Invariant:** a scope in use (its `Arc` held by a reader or a writer) is never dropped, so
//! two writers of one scope always share one lock.
//! **Invariant:** memory is bounded by configuration, not by the number of scopes ever named: a
//! read-only client naming a million scopes costs at most `max_scopes` entries, and the held
//! state about `max_bytes` (each part's size is estimated, see its `bytes`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};

use super::lru::Lru;
use super::order::EvictionOrder;
use super::phases::{self, Phase};
use super::records::Records;
use super::search::ScopeSearch;
use super::totals::ScopeFts;
use super::tx::{lru_key, Change, LruKey};
use super::window::{Next, WindowData, WINDOW_LEN};
use crate::error::Result;
use crate::fts::FtsDoc;
use crate::model::{Record, ScopeKey};
use crate::store::codec::ScopeMeta;
use crate::store::counters::DayCounters;

/// One scope in memory.
pub(super) struct Scope {
    /// Held by a writer from reading what it plans on to applying its commit here, and by a
    /// load of derived state, so no commit lands between a load's read and its install.
    pub(super) write: Mutex<()>,
    derived: Mutex<Derived>,
    /// Use bumps applied to the derived state whose batches the use committer has yet to
    /// commit (see `uses`): until it has, the records lag the derived state.
    unsettled: Mutex<usize>,
    settled: Condvar,
}

/// What the store keeps derived from one scope's records; `None`: not loaded.
#[derive(Default)]
pub(super) struct Derived {
    /// The bookkeeping, checked against the records since open (see `Shared::scope_meta`).
    pub(super) meta: Option<ScopeMeta>,
    /// The newest facts, decoded and shared.
    window: Option<Arc<WindowData>>,
    /// The eviction order of the active records.
    order: Option<EvictionOrder>,
    /// The totals retrieve's `bm25()` scores with.
    fts: Option<Arc<ScopeFts>>,
    /// The counters of the day the scope was last written, as committed.
    pub(super) day: Option<(i64, DayCounters)>,
    /// The active records held for retrieve.
    search: Search,
    /// Every active fact up to this sequence number is known not to be status (the gate is
    /// fixed for the process), so a sweep reads only newer ones. Kept by every commit: an
    /// older fact that enters or changes as status drops it.
    gated: Option<u64>,
    /// Commits applied since the scope entered the map: a read taken without the scope's lock
    /// installs what it found only if no commit came since it began.
    commits: u64,
}

/// Whether a scope's active records are held in memory for retrieve.
#[derive(Default)]
enum Search {
    /// Not loaded.
    #[default]
    Unloaded,
    /// Held, and kept by every commit. Readers share it under its read lock; a commit takes
    /// the write lock (under the scope's write lock) to apply its changes.
    Held(Arc<RwLock<ScopeSearch>>),
    /// Too large for the memory bounds: retrieve asks the keyword index.
    Indexed,
}

impl Search {
    fn bytes(&self) -> usize {
        match self {
            Search::Held(s) => s.read().bytes(),
            _ => 0,
        }
    }
}

impl Derived {
    /// Forgets everything derived. The commit count goes on (past a reset too), so a read that
    /// began before it cannot install what it found.
    fn reset(&mut self) {
        let commits = self.commits;
        *self = Derived::default();
        self.commits = commits + 1;
    }

    /// About how many bytes this holds.
    fn bytes(&self) -> usize {
        const ENTRY: usize = 256;
        ENTRY
            + self.window.as_ref().map_or(0, |w| w.bytes())
            + self.order.as_ref().map_or(0, EvictionOrder::bytes)
            + self.fts.as_ref().map_or(0, |f| f.bytes())
            + self.search.bytes()
    }

    /// Whether the FTS totals are loaded (a transaction then keeps a leaving record's FTS
    /// document for them).
    pub(super) fn has_fts(&self) -> bool {
        self.fts.is_some()
    }
}

impl Scope {
    /// Reads the derived state (hold it briefly: writers update it after every commit).
    pub(super) fn derived(&self) -> MutexGuard<'_, Derived> {
        self.derived.lock()
    }

    /// What a sweep may skip (every active fact up to this sequence number is not status),
    /// and the commit count to install a newer mark against.
    pub(super) fn gate_mark(&self) -> (Option<u64>, u64) {
        let d = self.derived.lock();
        (d.gated, d.commits)
    }

    /// Records that every active fact up to `through` is not status, as read from a snapshot
    /// taken after `gate_mark` answered `commits`: unless a commit came since, which the
    /// snapshot may not hold.
    pub(super) fn mark_gated(&self, commits: u64, through: u64) {
        let mut d = self.derived.lock();
        if d.commits == commits {
            d.gated = Some(through.max(d.gated.unwrap_or(0)));
        }
    }

    /// Counts a use bump applied to the derived state and handed to the use committer (the
    /// caller holds the write lock).
    pub(super) fn unsettle(&self) {
        *self.unsettled.lock() += 1;
    }

    /// One use bump of this scope is committed, or given up.
    pub(super) fn settle_one(&self) {
        let mut n = self.unsettled.lock();
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.settled.notify_all();
        }
    }

    /// The scope's write lock, taken to read its records from fjall and write: once held, the
    /// records hold every use bump the derived state holds (see `settle`).
    pub(super) fn lock_settled(&self) -> MutexGuard<'_, ()> {
        let guard = self.write.lock();
        self.settle();
        guard
    }

    /// Waits until every use bump applied to the derived state is in the records: called
    /// before reading the scope's records from fjall to load, plan or answer from them. The
    /// committer takes no scope lock, so a caller may wait holding the write lock.
    pub(super) fn settle(&self) {
        let mut n = self.unsettled.lock();
        while *n > 0 {
            self.settled.wait(&mut n);
        }
    }

    /// The held search, as committed (the caller holds the write lock).
    pub(super) fn held_search(&self) -> Option<Arc<RwLock<ScopeSearch>>> {
        match &self.derived.lock().search {
            Search::Held(s) => Some(Arc::clone(s)),
            _ => None,
        }
    }
}

/// How many scopes and bytes the map may hold.
#[derive(Clone, Copy, Debug)]
pub(super) struct Bounds {
    pub(super) max_scopes: usize,
    pub(super) max_bytes: usize,
}

impl Default for Bounds {
    /// 16,384 scopes and 192 MiB. A 500-record scope's derived state is about 150 KB without
    /// its held search (50 decoded facts, its eviction order, its FTS totals), and about
    /// 1.7 MB with it; the searches held take at most half the budget. The counts are
    /// calibrated against the allocator's (`search.rs`), so the budget bounds the heap.
    fn default() -> Bounds {
        Bounds {
            max_scopes: 16_384,
            max_bytes: 192 << 20,
        }
    }
}

/// A scope's slot in the map, with the bytes counted for it in `Scopes::bytes` and, of them,
/// its held search's in `Scopes::search_bytes`.
struct Entry {
    scope: Arc<Scope>,
    bytes: usize,
    search: usize,
}

/// The map of scopes in memory.
pub(super) struct Scopes {
    lru: Mutex<Lru<ScopeKey, Entry>>,
    /// Bytes of every scope's derived state, as last counted.
    bytes: AtomicUsize,
    /// Of `bytes`, those of the searches held for retrieve.
    search_bytes: AtomicUsize,
    bounds: Bounds,
}

impl Scopes {
    pub(super) fn new(bounds: Bounds) -> Scopes {
        Scopes {
            lru: Mutex::new(Lru::default()),
            bytes: AtomicUsize::new(0),
            search_bytes: AtomicUsize::new(0),
            bounds,
        }
    }

    /// The most bytes one scope's search may hold: a sixteenth of the byte budget, so a few
    /// large scopes cannot crowd out every other.
    fn search_limit(&self) -> usize {
        self.bounds.max_bytes / 16
    }

    /// Whether another scope's search may be held: the searches held take less than half the
    /// byte budget (so many scopes retrieved from do not crowd out every window, and a scope
    /// that finds no room asks the keyword index, as cheap as before searches were held).
    fn search_room(&self) -> bool {
        self.search_bytes.load(Ordering::Relaxed) < self.bounds.max_bytes / 2
    }

    /// Bytes of every scope's derived state, as last counted, and the budget they are held to.
    pub(super) fn bytes(&self) -> (usize, usize) {
        (self.bytes.load(Ordering::Relaxed), self.bounds.max_bytes)
    }

    /// The scope `key`, created if absent, and marked most recently used; scopes over the
    /// bounds that nobody uses are dropped.
    pub(super) fn get(&self, key: &ScopeKey) -> Arc<Scope> {
        let mut lru = self.lru.lock();
        if let Some(e) = lru.touch(key) {
            return Arc::clone(&e.scope);
        }
        let scope = Arc::new(Scope {
            write: Mutex::new(()),
            derived: Mutex::new(Derived::default()),
            unsettled: Mutex::new(0),
            settled: Condvar::new(),
        });
        lru.insert(
            key.clone(),
            Entry {
                scope: Arc::clone(&scope),
                bytes: 0,
                search: 0,
            },
        );
        self.shrink(&mut lru);
        scope
    }

    /// Changes `scope`'s derived state with `f` and counts its new size (the caller holds the
    /// scope's write lock, or only installs a load).
    pub(super) fn update<T>(
        &self,
        key: &ScopeKey,
        scope: &Scope,
        f: impl FnOnce(&mut Derived) -> T,
    ) -> T {
        let (out, after, search) = {
            let mut d = scope.derived.lock();
            let out = f(&mut d);
            (out, d.bytes(), d.search.bytes())
        };
        let mut lru = self.lru.lock();
        let Some(entry) = lru.peek_mut(key) else {
            return out;
        };
        // Only the entry that is this scope counts (a dropped and re-created entry is another).
        if !std::ptr::eq(Arc::as_ptr(&entry.scope), scope) {
            return out;
        }
        let before = std::mem::replace(&mut entry.bytes, after);
        let search_before = std::mem::replace(&mut entry.search, search);
        if search >= search_before {
            self.search_bytes
                .fetch_add(search - search_before, Ordering::Relaxed);
        } else {
            self.search_bytes
                .fetch_sub(search_before - search, Ordering::Relaxed);
        }
        if after >= before {
            self.bytes.fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.bytes.fetch_sub(before - after, Ordering::Relaxed);
        }
        if after > before {
            self.shrink(&mut lru);
        }
        out
    }

    /// Drops unused scopes, least recently used first, until the map is within its bounds (or
    /// every scope left is in use).
    fn shrink(&self, lru: &mut Lru<ScopeKey, Entry>) {
        let over = |lru: &Lru<ScopeKey, Entry>| {
            lru.len() > self.bounds.max_scopes
                || self.bytes.load(Ordering::Relaxed) > self.bounds.max_bytes
        };
        // Counted as they go, so `over` sees each drop.
        let unused = |e: &Entry| {
            let goes = Arc::strong_count(&e.scope) == 1;
            if goes {
                self.bytes.fetch_sub(e.bytes, Ordering::Relaxed);
                self.search_bytes.fetch_sub(e.search, Ordering::Relaxed);
            }
            goes
        };
        lru.drop_oldest(over, unused);
    }

    /// Waits until every use bump applied to `key`'s derived state is in the records, if the
    /// scope is in memory: for a reader about to read its records from fjall without its lock.
    pub(super) fn settle(&self, key: &ScopeKey) {
        let scope = self.lru.lock().peek_mut(key).map(|e| Arc::clone(&e.scope));
        if let Some(scope) = scope {
            scope.settle();
        }
    }

    /// Scopes in memory.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lru.lock().len()
    }

    /// Forgets every scope's derived state (their records changed outside the write path).
    pub(super) fn reset_all(&self) {
        let mut lru = self.lru.lock();
        let scopes: Vec<Arc<Scope>> = lru
            .values_mut()
            .map(|e| {
                e.bytes = 0;
                e.search = 0;
                Arc::clone(&e.scope)
            })
            .collect();
        self.bytes.store(0, Ordering::Relaxed);
        self.search_bytes.store(0, Ordering::Relaxed);
        drop(lru);
        for scope in scopes {
            scope.derived.lock().reset();
        }
    }

    /// Forgets one scope's derived state (the caller holds its write lock).
    pub(super) fn reset(&self, key: &ScopeKey, scope: &Scope) {
        self.update(key, scope, Derived::reset);
    }

    /// Forgets the scope's eviction order: it named a record that is not active, and is read
    /// again from the records on next need.
    pub(super) fn drop_order(&self, key: &ScopeKey, scope: &Scope) {
        self.update(key, scope, |d| d.order = None);
    }

    /// Changes the scope's eviction order in place, if it is held: for tests that make it
    /// miss a commit.
    #[cfg(test)]
    pub(super) fn edit_order(
        &self,
        key: &ScopeKey,
        scope: &Scope,
        f: impl FnOnce(&mut EvictionOrder),
    ) -> bool {
        self.update(key, scope, |d| d.order.as_mut().map(f).is_some())
    }

    // ---- the derived parts, loaded on first need ----

    /// The scope's newest `WINDOW_LEN` active facts, decoded and shared: kept up to date by
    /// every commit to the scope, so a window read costs the same whether or not a write came
    /// before it, whatever the size of the store.
    pub(super) fn window(
        &self,
        records: &Records,
        key: &ScopeKey,
    ) -> Result<Arc<Vec<Arc<Record>>>> {
        let scope = self.get(key);
        if let Some(w) = scope.derived().window.as_ref() {
            return Ok(w.shared());
        }
        let _write = scope.write.lock();
        if let Some(w) = scope.derived().window.as_ref() {
            return Ok(w.shared());
        }
        scope.settle();
        let facts = records.facts_after(key, None, WINDOW_LEN + 1)?;
        let window = Arc::new(WindowData::loaded(facts, WINDOW_LEN));
        let shared = window.shared();
        self.update(key, &scope, |d| d.window = Some(window));
        Ok(shared)
    }

    /// The scope's FTS totals (active records, their tokens, each term's document count).
    pub(super) fn fts(
        &self,
        records: &Records,
        key: &ScopeKey,
        scope: &Scope,
    ) -> Result<Arc<ScopeFts>> {
        if let Some(stats) = scope.derived().fts.clone() {
            return Ok(stats);
        }
        let _write = scope.write.lock();
        if let Some(stats) = scope.derived().fts.clone() {
            return Ok(stats);
        }
        let mut stats = ScopeFts::default();
        for r in records.active_of(None, key, None)? {
            stats.apply(&FtsDoc::of(&r.text, &r.keywords), true);
        }
        let stats = Arc::new(stats);
        self.update(key, scope, |d| d.fts = Some(Arc::clone(&stats)));
        Ok(stats)
    }

    /// The scope's active records held for retrieve; `None` when they would take more than
    /// the scope's share of the memory bounds, or the searches held already take theirs, and
    /// retrieve asks the keyword index instead.
    pub(super) fn search(
        &self,
        records: &Records,
        key: &ScopeKey,
        scope: &Scope,
    ) -> Result<Option<Arc<RwLock<ScopeSearch>>>> {
        let held = |search: &Search| match search {
            Search::Held(s) => Some(Some(Arc::clone(s))),
            Search::Indexed => Some(None),
            Search::Unloaded => None,
        };
        if let Some(known) = held(&scope.derived().search) {
            return Ok(known);
        }
        if !self.search_room() {
            return Ok(None);
        }
        let _write = scope.write.lock();
        if let Some(known) = held(&scope.derived().search) {
            return Ok(known);
        }
        scope.settle();
        let active = records.active_of(None, key, None)?;
        let search = ScopeSearch::of(active.into_iter().map(Arc::new));
        let (next, out) = if search.bytes() <= self.search_limit() {
            let shared = Arc::new(RwLock::new(search));
            (Search::Held(Arc::clone(&shared)), Some(shared))
        } else {
            (Search::Indexed, None)
        };
        self.update(key, scope, |d| d.search = next);
        Ok(out)
    }

    /// The first `n` active records of the scope in eviction order (the caller holds the
    /// scope's write lock).
    pub(super) fn eviction_head(
        &self,
        records: &Records,
        key: &ScopeKey,
        scope: &Scope,
        n: usize,
    ) -> Result<Vec<LruKey>> {
        if let Some(order) = scope.derived().order.as_ref() {
            return Ok(order.head(n));
        }
        let order = phases::time(Phase::ScopeLoad, || -> Result<EvictionOrder> {
            scope.settle();
            let mut order = EvictionOrder::default();
            for r in records.active_of(None, key, None)? {
                if let Some(seq) = r.seq() {
                    order.insert(lru_key(&r, seq));
                }
            }
            Ok(order)
        })?;
        let head = order.head(n);
        self.update(key, scope, |d| d.order = Some(order));
        Ok(head)
    }

    /// Applies a committed batch's changes to the scope's derived state (the caller holds the
    /// scope's write lock, and the batch is visible to readers). Every part follows the batch
    /// or is dropped, to be loaded again on next need: none is left behind it.
    pub(super) fn apply(
        &self,
        records: &Records,
        key: &ScopeKey,
        scope: &Scope,
        changes: &[Change],
        meta: Option<ScopeMeta>,
        day: Option<(i64, DayCounters)>,
    ) {
        let current = scope.derived().window.clone();
        // `Some(None)`: the window could not follow and is dropped.
        let window = match current {
            Some(w) if changes.iter().any(Change::touches_facts) => {
                Some(match w.next(changes, WINDOW_LEN) {
                    Next::Ready(w) => Some(w),
                    Next::Refill { kept, after } => {
                        match records.facts_after(key, after, WINDOW_LEN - kept.len() + 1) {
                            Ok(more) => Some(WindowData::refilled(kept, more, WINDOW_LEN)),
                            Err(e) => {
                                log::warn!(
                                    "[store] {key}: the window is read again on next need: {e}"
                                );
                                None
                            }
                        }
                    }
                })
            }
            _ => None,
        };
        let search_limit = self.search_limit();
        self.update(key, scope, |d| {
            d.commits += 1;
            if let Some(through) = d.gated {
                let status_below = changes.iter().any(|c| {
                    c.seq <= through
                        && c.active().is_some_and(|r| {
                            r.kind == crate::model::Kind::Fact && crate::gate::is_status(&r.text)
                        })
                });
                if status_below {
                    d.gated = None;
                }
            }
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
            if day.is_some() {
                d.day = day;
            }
            if let Some(w) = window {
                d.window = w.map(Arc::new);
            }
            if let Some(order) = d.order.as_mut() {
                for c in changes {
                    let new = c.active().map(|r| lru_key(r, c.seq));
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
                        if let Some(r) = c.active() {
                            fts.apply(&FtsDoc::of(&r.text, &r.keywords), true);
                        }
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> ScopeKey {
        ScopeKey::parse(&format!("repo:a/s{i}")).expect("scope")
    }

    #[test]
    fn held_searches_are_counted_until_their_scope_goes() {
        let scopes = Scopes::new(Bounds {
            max_scopes: 1,
            max_bytes: 100,
        });
        let held = |scopes: &Scopes, i: usize| {
            let scope = scopes.get(&key(i));
            scopes.update(&key(i), &scope, |d| {
                let search = ScopeSearch::of(std::iter::empty());
                d.search = Search::Held(Arc::new(RwLock::new(search)));
            });
        };
        assert!(scopes.search_room());
        held(&scopes, 0);
        assert!(
            !scopes.search_room(),
            "an empty search counts its fixed cost"
        );
        // Naming another scope drops the first (one scope at most): its search goes with it.
        drop(scopes.get(&key(1)));
        assert!(scopes.search_room());
        held(&scopes, 1);
        let scope = scopes.get(&key(1));
        scopes.update(&key(1), &scope, |d| d.search = Search::Indexed);
        assert!(scopes.search_room(), "a search let go is uncounted");
        held(&scopes, 1);
        scopes.reset_all();
        assert!(scopes.search_room());
    }

    #[test]
    fn a_million_names_cost_at_most_the_bound() {
        let scopes = Scopes::new(Bounds {
            max_scopes: 64,
            max_bytes: usize::MAX,
        });
        for i in 0..100_000 {
            drop(scopes.get(&key(i)));
        }
        assert_eq!(scopes.len(), 64);
    }

    #[test]
    fn a_scope_in_use_is_never_dropped_and_keeps_its_lock() {
        let scopes = Scopes::new(Bounds {
            max_scopes: 2,
            max_bytes: usize::MAX,
        });
        let held = scopes.get(&key(0));
        let guard = held.write.lock();
        for i in 1..10 {
            drop(scopes.get(&key(i)));
        }
        let again = scopes.get(&key(0));
        assert!(Arc::ptr_eq(&held, &again), "one lock per scope");
        assert!(again.write.try_lock().is_none(), "the same lock, held");
        drop(guard);
    }

    #[test]
    fn the_least_recently_used_goes_first() {
        let scopes = Scopes::new(Bounds {
            max_scopes: 2,
            max_bytes: usize::MAX,
        });
        let a = Arc::as_ptr(&scopes.get(&key(0)));
        drop(scopes.get(&key(1)));
        drop(scopes.get(&key(0))); // 0 is now newer than 1
        drop(scopes.get(&key(2))); // drops 1
        assert_eq!(Arc::as_ptr(&scopes.get(&key(0))), a);
        assert_eq!(scopes.len(), 2);
    }

    #[test]
    fn the_byte_budget_drops_scopes_whose_state_grew() {
        let scopes = Scopes::new(Bounds {
            max_scopes: 100,
            max_bytes: 10_000,
        });
        for i in 0..10 {
            let k = key(i);
            let s = scopes.get(&k);
            scopes.update(&k, &s, |d| {
                let mut order = EvictionOrder::default();
                for seq in 0..50 {
                    order.insert((seq, seq, seq as u64));
                }
                d.order = Some(order);
            });
        }
        assert!(scopes.bytes.load(Ordering::Relaxed) <= 10_000);
        assert!(scopes.len() < 10);
    }
}
