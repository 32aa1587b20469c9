//! A map that knows its least recently used entry: slots in a vector, linked newest to oldest,
//! so touching, adding and dropping an entry cost O(1) and the oldest is found at once.

use std::collections::HashMap;
use std::hash::Hash;

struct Node<K, V> {
    key: K,
    value: V,
    newer: Option<usize>,
    older: Option<usize>,
}

/// Entries by key, ordered from the most to the least recently used.
pub(super) struct Lru<K, V> {
    index: HashMap<K, usize>,
    nodes: Vec<Option<Node<K, V>>>,
    free: Vec<usize>,
    newest: Option<usize>,
    oldest: Option<usize>,
}

impl<K, V> Default for Lru<K, V> {
    fn default() -> Self {
        Lru {
            index: HashMap::new(),
            nodes: Vec::new(),
            free: Vec::new(),
            newest: None,
            oldest: None,
        }
    }
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    fn node(&mut self, i: usize) -> Option<&mut Node<K, V>> {
        self.nodes.get_mut(i).and_then(Option::as_mut)
    }

    /// The entry of `key`, without touching it.
    pub(super) fn peek_mut(&mut self, key: &K) -> Option<&mut V> {
        let i = *self.index.get(key)?;
        self.node(i).map(|n| &mut n.value)
    }

    /// The entry of `key`, now the most recently used.
    pub(super) fn touch(&mut self, key: &K) -> Option<&mut V> {
        let i = *self.index.get(key)?;
        self.unlink(i);
        self.push_newest(i);
        self.node(i).map(|n| &mut n.value)
    }

    /// Adds `value` under `key` (absent) as the most recently used.
    pub(super) fn insert(&mut self, key: K, value: V) {
        let node = Node {
            key: key.clone(),
            value,
            newer: None,
            older: None,
        };
        let i = match self.free.pop() {
            Some(i) => {
                if let Some(slot) = self.nodes.get_mut(i) {
                    *slot = Some(node);
                }
                i
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        };
        self.index.insert(key, i);
        self.push_newest(i);
    }

    /// Drops the least recently used entries `drop` accepts, oldest first, while `more` says
    /// more must go; returns what was dropped.
    pub(super) fn drop_oldest(
        &mut self,
        mut more: impl FnMut(&Self) -> bool,
        mut drop: impl FnMut(&V) -> bool,
    ) -> Vec<V> {
        let mut out = Vec::new();
        let mut at = self.oldest;
        while more(self) {
            let Some(i) = at else { break };
            let (newer, goes) = match self.nodes.get(i).and_then(Option::as_ref) {
                Some(n) => (n.newer, drop(&n.value)),
                None => break,
            };
            if goes {
                if let Some(node) = self.remove_at(i) {
                    out.push(node.value);
                }
            }
            at = newer;
        }
        out
    }

    /// Every entry, in no order.
    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.nodes.iter_mut().flatten().map(|n| &mut n.value)
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

    fn remove_at(&mut self, i: usize) -> Option<Node<K, V>> {
        self.unlink(i);
        let node = self.nodes.get_mut(i).and_then(Option::take)?;
        self.index.remove(&node.key);
        self.free.push(i);
        Some(node)
    }
}

#[cfg(test)]
mod tests {
    use super::Lru;

    #[test]
    fn the_oldest_goes_first_and_a_touch_makes_an_entry_newest() {
        let mut lru: Lru<u32, u32> = Lru::default();
        for k in 0..4 {
            lru.insert(k, k * 10);
        }
        assert_eq!(lru.touch(&0), Some(&mut 0));
        // Down to two, skipping the entry the caller keeps (2): 1 and 3 go, oldest first.
        let dropped = lru.drop_oldest(|lru| lru.len() > 2, |v| *v != 20);
        assert_eq!(dropped, [10, 30]);
        assert_eq!(lru.len(), 2);
        assert!(lru.peek_mut(&1).is_none());
        assert_eq!(lru.peek_mut(&2), Some(&mut 20));
        // A freed slot is reused.
        lru.insert(9, 90);
        assert_eq!(lru.nodes.len(), 4);
        assert_eq!(lru.touch(&9), Some(&mut 90));
    }
}
