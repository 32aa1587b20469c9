//! What a store reports about itself: what it holds in memory ([`MemoryUse`]), its engine's
//! background work ([`Upkeep`]) and how long its journal's fsyncs took ([`SyncTimes`]).
//! Plain values the contract answers (`MemoryStore::memory`, `MemoryStore::upkeep`), so the
//! trait names no type of an implementation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What an [`EmbeddedStore`](super::EmbeddedStore) holds in memory, by part, in bytes: the parts a deployment sizes.
/// A process holds more (the allocator's free space, tantivy's merges and searchers, request
/// buffers); `/metrics` shows these beside the process's resident memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUse {
    /// fjall's memtables, the one filling and those sealed and being flushed: written records
    /// not yet in a table file. Each keyspace seals its memtable at a fixed size.
    pub memtables: u64,
    /// The block cache's contents, and the capacity it never exceeds (`cache_bytes`).
    pub block_cache: u64,
    /// See `block_cache`.
    pub block_cache_capacity: u64,
    /// The scope map's derived state (windows, eviction orders, FTS totals, held searches), as
    /// counted against its budget, and that budget: scopes nobody uses are dropped above it.
    pub scope_map: u64,
    /// See `scope_map`.
    pub scope_map_budget: u64,
    /// The keyword index writer's heap (documents staged for the next commit).
    pub index_writer_heap: u64,
    /// Index changes waiting for a commit, a count: bounded by the indexer's backpressure.
    pub index_pending_changes: u64,
}

/// The storage engine's background work now: what a write's tail and a read's cost move with.
/// A store is at rest when none of it is pending.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Upkeep {
    /// Sealed memtables waiting to be written out as tables.
    pub flushes_waiting: u64,
    /// Compactions running now.
    pub compactions_running: u64,
    /// Compactions finished since the store opened.
    pub compactions_done: u64,
    /// Time spent compacting since the store opened, in microseconds.
    pub compacting_micros: u64,
    /// Index changes waiting for a commit (as in [`MemoryUse`]).
    pub index_pending_changes: u64,
    /// Scopes whose decision journal the pruner has yet to count: until it does, a read of
    /// one event of a full journal reads up to `journalCap` keys to find what it hides.
    pub journals_to_count: u64,
    /// Retrieves' use bumps applied in memory and not yet committed to the records.
    pub uses_waiting: u64,
    /// The journal's group fsyncs since the store opened (the durable writes' and the index
    /// commits'), by duration as the syncing thread saw it: the disk's answer and any wait
    /// for a CPU after it.
    pub journal_syncs: SyncTimes,
}

impl Upkeep {
    /// Nothing waits to flush, no compaction runs, the index holds every change, every
    /// journal read so far is counted and every use is committed.
    pub fn at_rest(&self) -> bool {
        self.flushes_waiting == 0
            && self.compactions_running == 0
            && self.index_pending_changes == 0
            && self.journals_to_count == 0
            && self.uses_waiting == 0
    }
}

/// Buckets of [`SyncTimes`]: four a power of two of microseconds, to 2^34 µs (4.8 hours).
const SYNC_BUCKETS: usize = 132;

/// The bucket of `micros`: itself below 8, else four a power of two (each within 25%).
fn sync_bucket(micros: u64) -> usize {
    if micros < 8 {
        return micros as usize;
    }
    let power = 63 - u64::from(micros.leading_zeros());
    let quarter = (micros >> (power - 2)) & 3;
    (4 * (power - 1) + quarter).min(SYNC_BUCKETS as u64 - 1) as usize
}

/// The microseconds bucket `i` starts at (it ends where `i + 1` starts).
fn sync_bucket_start(i: usize) -> u64 {
    if i < 8 {
        return i as u64;
    }
    let (power, quarter) = (i as u64 / 4 + 1, i as u64 % 4);
    (4 + quarter) << (power - 2)
}

/// The fsyncs' durations as they happen: one counter a bucket, no lock (the fsyncing writer
/// adds, a reader copies).
pub(crate) struct SyncClock {
    buckets: Vec<AtomicU64>,
    micros: AtomicU64,
}

impl SyncClock {
    pub(crate) fn new() -> SyncClock {
        SyncClock {
            buckets: (0..SYNC_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            micros: AtomicU64::new(0),
        }
    }

    pub(crate) fn record(&self, took: Duration) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        if let Some(b) = self.buckets.get(sync_bucket(micros)) {
            b.fetch_add(1, Ordering::Relaxed);
        }
        self.micros.fetch_add(micros, Ordering::Relaxed);
    }

    pub(crate) fn read(&self) -> SyncTimes {
        SyncTimes {
            buckets: self
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            micros: self.micros.load(Ordering::Relaxed),
        }
    }
}

/// How long the journal's group fsyncs took since the store opened: those durable writes wait
/// on (one fsync makes every batch appended before it durable) and those an index commit makes
/// first. Each is the syncing thread's wall clock around `fdatasync`: the disk's answer plus,
/// on a busy machine, the wait for a CPU once the disk has answered, which can be most of it.
/// Durations are kept in buckets, each within 25% of its start; subtract an earlier reading
/// ([`since`](Self::since)) for an interval.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SyncTimes {
    buckets: Vec<u64>,
    micros: u64,
}

/// What a person reads in a log line: the count, the total and three quantiles, not the
/// buckets.
impl std::fmt::Debug for SyncTimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncTimes")
            .field("count", &self.count())
            .field("total", &self.total())
            .field("p50", &self.quantile(0.5))
            .field("p99", &self.quantile(0.99))
            .field("slowest", &self.quantile(1.0))
            .finish()
    }
}

impl SyncTimes {
    /// The fsyncs counted.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Their total time.
    pub fn total(&self) -> Duration {
        Duration::from_micros(self.micros)
    }

    /// The fsyncs after `earlier` (a reading of the same store).
    pub fn since(&self, earlier: &SyncTimes) -> SyncTimes {
        SyncTimes {
            buckets: self
                .buckets
                .iter()
                .enumerate()
                .map(|(i, n)| n.saturating_sub(earlier.buckets.get(i).copied().unwrap_or(0)))
                .collect(),
            micros: self.micros.saturating_sub(earlier.micros),
        }
    }

    /// The duration that a share `q` (in [0, 1]) of the fsyncs took at most, to the start of
    /// its bucket's upper neighbour (so never below the true quantile, and within 25% of it
    /// from 8 µs on); zero when none was counted.
    pub fn quantile(&self, q: f64) -> Duration {
        let count = self.count();
        if count == 0 {
            return Duration::ZERO;
        }
        let rank = ((q.clamp(0.0, 1.0) * count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Duration::from_micros(sync_bucket_start(i + 1));
            }
        }
        Duration::from_micros(sync_bucket_start(SYNC_BUCKETS))
    }
}

#[cfg(test)]
mod tests {
    use super::{sync_bucket, sync_bucket_start, SyncClock, SYNC_BUCKETS};
    use std::time::Duration;

    #[test]
    fn each_duration_falls_in_the_bucket_that_holds_it() {
        let mut last = 0;
        for micros in (0..5_000u64).chain([1 << 20, (1 << 20) + 1, 3 << 30, 1 << 33]) {
            let b = sync_bucket(micros);
            assert!(b >= last, "buckets follow the durations");
            last = b;
            assert!(
                sync_bucket_start(b) <= micros && micros < sync_bucket_start(b + 1),
                "{micros} µs in bucket {b} ({}..{})",
                sync_bucket_start(b),
                sync_bucket_start(b + 1)
            );
            if micros >= 8 {
                let width = sync_bucket_start(b + 1) - sync_bucket_start(b);
                assert!(4 * width <= sync_bucket_start(b), "within 25% at {micros}");
            }
        }
        assert_eq!(
            sync_bucket(u64::MAX),
            SYNC_BUCKETS - 1,
            "the last bucket holds the rest"
        );
    }

    #[test]
    fn quantiles_bound_the_durations_and_intervals_subtract() {
        let clock = SyncClock::new();
        assert_eq!(clock.read().quantile(0.5), Duration::ZERO, "none counted");
        for _ in 0..98 {
            clock.record(Duration::from_micros(200));
        }
        let before = clock.read();
        clock.record(Duration::from_millis(9));
        clock.record(Duration::from_millis(40));
        let all = clock.read();
        assert_eq!(all.count(), 100);
        assert_eq!(
            all.total(),
            Duration::from_micros(98 * 200 + 9_000 + 40_000)
        );
        let p50 = all.quantile(0.5);
        assert!(p50 > Duration::from_micros(200) && p50 <= Duration::from_micros(250));
        let p99 = all.quantile(0.99);
        assert!(p99 > Duration::from_millis(9) && p99 <= Duration::from_micros(11_250));
        assert!(all.quantile(1.0) > Duration::from_millis(40));
        let after = all.since(&before);
        assert_eq!(
            after.count(),
            2,
            "only the fsyncs after the earlier reading"
        );
        assert_eq!(after.total(), Duration::from_millis(49));
        assert!(
            after.quantile(0.5) > Duration::from_millis(9)
                && after.quantile(0.5) < Duration::from_millis(12)
        );
        // A log line shows the summary, not the buckets.
        let shown = format!("{after:?}");
        assert!(
            shown.starts_with("SyncTimes { count: 2, total: 49ms, p50: "),
            "{shown}"
        );
        assert!(!shown.contains("buckets"), "{shown}");
    }
}
