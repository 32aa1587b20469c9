//! Configuring and opening an `EmbeddedStore`: cap, durability, clock, index commits, cache.

use std::time::Duration;

use crate::limits::DEFAULT_CAP;
use crate::time::Clock;

/// When a write is acknowledged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// After the batch is fsynced: survives power loss. The default.
    #[default]
    Sync,
    /// After the batch is in the OS page cache: survives a crash of this process, not a power
    /// loss; several times faster.
    Buffered,
}

/// Configures and opens an [`EmbeddedStore`](crate::store::EmbeddedStore). The directory goes to the last call.
#[derive(Clone)]
pub struct EmbeddedStoreBuilder {
    pub(super) cap: usize,
    pub(super) durability: Durability,
    pub(super) clock: Option<Clock>,
    pub(super) commit_every: usize,
    pub(super) commit_interval: Duration,
    pub(super) cache_bytes: u64,
    pub(super) journal_days: u32,
    pub(super) journal_cap: usize,
    pub(super) scope_cache: super::scopes::Bounds,
}

/// The default block cache: the hot blocks of a few hundred scopes. Windows are served from
/// the scope map, and a block the cache misses comes from the OS page cache (a read and a
/// decompression, not a disk seek), so a larger cache buys little and its bytes are resident.
pub const DEFAULT_CACHE_BYTES: u64 = 32 << 20;

impl Default for EmbeddedStoreBuilder {
    fn default() -> Self {
        EmbeddedStoreBuilder {
            cap: DEFAULT_CAP,
            durability: Durability::Sync,
            clock: None,
            commit_every: 16_384,
            commit_interval: Duration::from_secs(5),
            cache_bytes: DEFAULT_CACHE_BYTES,
            journal_days: crate::decisions::DEFAULT_JOURNAL_DAYS,
            journal_cap: crate::decisions::DEFAULT_JOURNAL_CAP,
            scope_cache: super::scopes::Bounds::default(),
        }
    }
}

impl EmbeddedStoreBuilder {
    /// The default cap of active records per scope (1–10000; default 500).
    pub fn cap(mut self, cap: usize) -> Self {
        self.cap = cap;
        self
    }

    /// How long decision-journal entries are kept (default 90 days) and how many per scope
    /// (default 10,000); older and excess entries are pruned off the write path.
    pub fn journal(mut self, days: u32, cap_per_scope: usize) -> Self {
        self.journal_days = days.max(1);
        self.journal_cap = cap_per_scope.max(1);
        self
    }

    /// When writes are acknowledged (default: after fsync).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Where the store reads the time (default: the wall clock).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Commit the keyword index after this many document changes (default 16,384) or this often
    /// (default 5 s), whichever comes first. Each commit fsyncs several files and adds a segment
    /// that merges rewrite; rarer commits keep that IO and CPU away from the writes (at 4,096
    /// changes or 1 s, the index takes a third of the CPU under 8 writers). Uncommitted writes
    /// are still retrievable. Writers wait while more than four times `every` changes are
    /// uncommitted.
    pub fn index_commit(mut self, every: usize, interval: Duration) -> Self {
        self.commit_every = every.max(1);
        self.commit_interval = interval;
        self
    }

    /// The records' block cache in bytes (default 32 MiB). Reads stay as fast at 500,000
    /// records as at 2,500 while the blocks they touch fit in it.
    pub fn cache_bytes(mut self, bytes: u64) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// What the store keeps in memory per scope (the decoded window, the eviction order, the
    /// FTS totals, the active records held for retrieve, the checked bookkeeping, the write
    /// lock): at most `scopes` scopes and about `bytes` bytes, least recently used dropped first
    /// (default 16,384 scopes, 192 MiB). A dropped scope's state is read again from its records
    /// on next need. A scope's active records are held for retrieve only while the records held
    /// take less than half of `bytes`, and only when they take at most a sixteenth of it;
    /// other scopes' retrieves ask the keyword index and read their candidates from disk.
    pub fn scope_cache(mut self, scopes: usize, bytes: usize) -> Self {
        self.scope_cache = super::scopes::Bounds {
            max_scopes: scopes.max(1),
            max_bytes: bytes,
        };
        self
    }
}
