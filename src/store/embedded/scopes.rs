//! The scopes the store keeps in memory: each scope's write lock and what the store keeps
//! derived from its records between commits (checked bookkeeping, the decoded window, the
//! eviction order, the FTS totals, the records held for retrieve), in one map bounded by a count and a byte budget, least
//! recently used dropped first.
//!
//! **Invariant:** everything a `Scope` holds besides its lock is derived from the records and
//! may be dropped at any time; the next use loads it again under the scope's write lock.
//! **Invariant:** a scope in use (its `Arc` held by a reader or a writer) is never dropped, so
//! two writers of one scope always share one lock.
//! **Invariant:** memory is bounded by configuration, not by the number of scopes ever named: a
//! read-only client naming a million scopes costs at most `max_scopes` entries.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard, RwLock};

use super::order::EvictionOrder;
use super::search::ScopeSearch;
use super::totals::ScopeFts;
use super::window::WindowData;
use crate::model::ScopeKey;
use crate::store::codec::ScopeMeta;

/// One scope in memory.
pub(super) struct Scope {
    /// Held by a writer from reading what it plans on to applying its commit here, and by a
    /// load of derived state, so no commit lands between a load's read and its install.
    pub(super) write: Mutex<()>,
    derived: Mutex<Derived>,
}

/// What the store keeps derived from one scope's records; `None`: not loaded.
#[derive(Default)]
pub(super) struct Derived {
    /// The bookkeeping, checked against the records since open (see `scope_meta`).
    pub(super) meta: Option<ScopeMeta>,
    /// The newest facts, decoded and shared.
    pub(super) window: Option<Arc<WindowData>>,
    /// The eviction order of the active records.
    pub(super) order: Option<EvictionOrder>,
    /// The totals retrieve's `bm25()` scores with.
    pub(super) fts: Option<Arc<ScopeFts>>,
    /// The counters of the day the scope was last written, as committed.
    pub(super) day: Option<(i64, crate::store::DayCounters)>,
    /// The active records held for retrieve.
    pub(super) search: Search,
}

/// Whether a scope's active records are held in memory for retrieve.
#[derive(Default)]
pub(super) enum Search {
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
    pub(super) fn bytes(&self) -> usize {
        match self {
            Search::Held(s) => s.read().bytes(),
            _ => 0,
        }
    }
}

impl Derived {
    /// About how many bytes this holds.
    fn bytes(&self) -> usize {
        const ENTRY: usize = 256;
        ENTRY
            + self.window.as_ref().map_or(0, |w| w.bytes())
            + self.order.as_ref().map_or(0, EvictionOrder::bytes)
            + self.fts.as_ref().map_or(0, |f| f.bytes())
            + self.search.bytes()
    }
}

impl Scope {
    /// Reads the derived state (hold it briefly: writers update it after every commit).
    pub(super) fn derived(&self) -> MutexGuard<'_, Derived> {
        self.derived.lock()
    }
}

/// How many scopes and bytes the map may hold.
#[derive(Clone, Copy, Debug)]
pub(super) struct Bounds {
    pub(super) max_scopes: usize,
    pub(super) max_bytes: usize,
}

impl Default for Bounds {
    /// 16,384 scopes and 192 MiB: a 500-record scope's derived state is about 150 KB at most
    /// (50 decoded facts, its eviction order, its FTS totals), most scopes hold far less.
    fn default() -> Bounds {
        Bounds {
            max_scopes: 16_384,
            max_bytes: 192 << 20,
        }
    }
}

/// A slot of the least-recently-used list.
struct Node {
    key: ScopeKey,
    scope: Arc<Scope>,
    /// Bytes counted for this scope in `Scopes::bytes`, and of them its held search's in
    /// `Scopes::search_bytes`.
    bytes: usize,
    search: usize,
    newer: Option<usize>,
    older: Option<usize>,
}

#[derive(Default)]
struct Lru {
    index: HashMap<ScopeKey, usize>,
    nodes: Vec<Option<Node>>,
    free: Vec<usize>,
    newest: Option<usize>,
    oldest: Option<usize>,
}

impl Lru {
    fn node(&mut self, i: usize) -> Option<&mut Node> {
        self.nodes.get_mut(i).and_then(Option::as_mut)
    }

    fn unlink(&mut self, i: usize) {
        let (newer, older) = match self.node(i) {
            Some(n) => (n.newer.take(), n.older.take()),
            None => return,
        };
        match newer {
            Some(n) => {
                if let Some(node) = self.node(n) {
                    node.older = older;
                }
            }
            None => self.newest = older,
        }
        match older {
            Some(o) => {
                if let Some(node) = self.node(o) {
                    node.newer = newer;
                }
            }
            None => self.oldest = newer,
        }
    }

    fn push_newest(&mut self, i: usize) {
        let old_newest = self.newest;
        if let Some(n) = self.node(i) {
            n.older = old_newest;
            n.newer = None;
        }
        if let Some(o) = old_newest.and_then(|o| self.node(o)) {
            o.newer = Some(i);
        }
        self.newest = Some(i);
        if self.oldest.is_none() {
            self.oldest = Some(i);
        }
    }

    fn remove(&mut self, i: usize) -> Option<Node> {
        self.unlink(i);
        let node = self.nodes.get_mut(i).and_then(Option::take)?;
        self.index.remove(&node.key);
        self.free.push(i);
        Some(node)
    }
}

/// The map of scopes in memory.
pub(super) struct Scopes {
    lru: Mutex<Lru>,
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
    pub(super) fn search_limit(&self) -> usize {
        self.bounds.max_bytes / 16
    }

    /// Whether another scope's search may be held: the searches held take less than half the
    /// byte budget (so many scopes retrieved from do not crowd out every window, and a scope
    /// that finds no room asks the keyword index, as cheap as before searches were held).
    pub(super) fn search_room(&self) -> bool {
        self.search_bytes.load(Ordering::Relaxed) < self.bounds.max_bytes / 2
    }

    /// The scope `key`, created if absent, and marked most recently used; scopes over the
    /// bounds that nobody uses are dropped.
    pub(super) fn get(&self, key: &ScopeKey) -> Arc<Scope> {
        let mut lru = self.lru.lock();
        if let Some(&i) = lru.index.get(key) {
            lru.unlink(i);
            lru.push_newest(i);
            if let Some(n) = lru.node(i) {
                return Arc::clone(&n.scope);
            }
        }
        let scope = Arc::new(Scope {
            write: Mutex::new(()),
            derived: Mutex::new(Derived::default()),
        });
        let node = Node {
            key: key.clone(),
            scope: Arc::clone(&scope),
            bytes: 0,
            search: 0,
            newer: None,
            older: None,
        };
        let i = match lru.free.pop() {
            Some(i) => {
                if let Some(slot) = lru.nodes.get_mut(i) {
                    *slot = Some(node);
                }
                i
            }
            None => {
                lru.nodes.push(Some(node));
                lru.nodes.len() - 1
            }
        };
        lru.index.insert(key.clone(), i);
        lru.push_newest(i);
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
        let slot = lru.index.get(key).copied();
        let Some(node) = slot.and_then(|i| lru.node(i)) else {
            return out;
        };
        // Only the entry that is this scope counts (a dropped and re-created entry is another).
        if !std::ptr::eq(Arc::as_ptr(&node.scope), scope) {
            return out;
        }
        let before = std::mem::replace(&mut node.bytes, after);
        let search_before = std::mem::replace(&mut node.search, search);
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
    fn shrink(&self, lru: &mut Lru) {
        let over = |lru: &Lru| {
            lru.index.len() > self.bounds.max_scopes
                || self.bytes.load(Ordering::Relaxed) > self.bounds.max_bytes
        };
        let mut at = lru.oldest;
        while over(lru) {
            let Some(i) = at else { break };
            let (older_than_next, unused) = match lru.nodes.get(i).and_then(Option::as_ref) {
                Some(n) => (n.newer, Arc::strong_count(&n.scope) == 1),
                None => break,
            };
            if unused {
                if let Some(node) = lru.remove(i) {
                    self.bytes.fetch_sub(node.bytes, Ordering::Relaxed);
                    self.search_bytes.fetch_sub(node.search, Ordering::Relaxed);
                }
            }
            at = older_than_next;
        }
    }

    /// Scopes in memory.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lru.lock().index.len()
    }

    /// Forgets every scope's derived state (their records changed outside the write path).
    pub(super) fn reset_all(&self) {
        let mut lru = self.lru.lock();
        let nodes: Vec<(ScopeKey, Arc<Scope>)> = lru
            .nodes
            .iter()
            .flatten()
            .map(|n| (n.key.clone(), Arc::clone(&n.scope)))
            .collect();
        for n in lru.nodes.iter_mut().flatten() {
            n.bytes = 0;
            n.search = 0;
        }
        self.bytes.store(0, Ordering::Relaxed);
        self.search_bytes.store(0, Ordering::Relaxed);
        drop(lru);
        for (_, scope) in nodes {
            *scope.derived.lock() = Derived::default();
        }
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
