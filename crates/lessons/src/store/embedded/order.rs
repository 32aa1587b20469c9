//! A scope's eviction order: its active records, least recently used first.

use std::collections::BTreeSet;

use super::tx::LruKey;

/// A scope's active records in eviction order, kept in memory: an on-disk usage index gets a
/// tombstone at its head with every bump and eviction, so each eviction scan walks all earlier
/// ones (a full scope's write slows from 0.3 ms to 4 ms within a few thousand writes).
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct EvictionOrder(BTreeSet<LruKey>);

impl EvictionOrder {
    pub(super) fn insert(&mut self, key: LruKey) {
        self.0.insert(key);
    }

    /// Applies one record's move: out of its old place, into its new one.
    pub(super) fn apply(&mut self, old: Option<LruKey>, new: Option<LruKey>) {
        if let Some(k) = old {
            self.0.remove(&k);
        }
        if let Some(k) = new {
            self.0.insert(k);
        }
    }

    /// The keys of the first `n` records to evict (a key ends with the record's sequence
    /// number).
    pub(super) fn head(&self, n: usize) -> Vec<LruKey> {
        self.0.iter().take(n).copied().collect()
    }

    /// About how many bytes it holds.
    pub(super) fn bytes(&self) -> usize {
        self.0.len() * 40
    }
}
