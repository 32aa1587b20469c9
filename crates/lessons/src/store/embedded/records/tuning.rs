//! The records engine's tuning and its open: fjall's memtables, level-0 width, journal size
//! and worker threads, chosen for many writers sharing one fsync, and the open that applies
//! them to every keyspace.
//!
//! **Invariant:** fjall keeps a keyspace's settings from the open that created it, so a
//! setting changed here reaches new stores (and imports into them) only.

use std::path::Path;
use std::sync::Arc;

use fjall::{Database, KeyspaceCreateOptions};

use super::{Keyspaces, Records};
use crate::error::Result;

/// The memtable of the three keyspaces that take most of a write's bytes (records, retired
/// records, the decision journal). Each memtable flush fsyncs fjall's journal under the lock
/// every commit takes, and each flush feeds compactions whose writes slow the journal's own
/// fsyncs: at 8 MiB the decision journal flushes every second under 8 writers and a write's p99
/// is 9–10× its p50; at 32 MiB about 6×. 16 MiB is the memory side of that trade: a memtable
/// holds about 1.4 bytes per byte it counts (skiplist nodes, allocations), and with every
/// memtable at 32 MiB a long-running server's heap is some 100 MB larger (`cargo run
/// --example deployment`). Up to 3 × 16 MiB, plus a sealed memtable while it flushes.
const LARGE_MEMTABLE: u64 = 16 << 20;
/// The flushed tables a heavy keyspace (records, retired records, the decision journal) lets
/// gather before it merges them into the next level (fjall's default: 4). A memtable holds
/// keys of every scope, so each flushed table overlaps the whole of the next level, and each
/// merge rewrites that level: merging every 8 tables instead of every 4 rewrites it half as
/// often. Under 8 writers at 200,000 records (`cargo bench --bench writes`, the steady round)
/// the store writes 15–18 KB of disk a write against 21–22 KB merging at 4, the disk every
/// durable write's fsync shares. The cost is up to 7 unmerged tables for a read to look in;
/// the review and the store's reads (`--bench review`, `--bench store`) are no slower.
///
/// fjall keeps a keyspace's settings (this, and the memtable sizes above) from the open that
/// created it: a store created by an earlier version keeps the settings it was created with,
/// and an export imported into a new store takes these.
const L0_TABLES: u8 = 8;
/// The memtable of the other keyspaces (small entries: bookkeeping, counters, keys).
const SMALL_MEMTABLE: u64 = 4 << 20;
/// The journal fjall keeps before it flushes the keyspaces that pin the oldest file: above
/// every memtable's size together (3 × 16 + 6 × 4 MiB), so a journal rotation does not force
/// flushes of memtables still filling. An open after a crash replays at most this much
/// (about 1.4 µs per entry, some 1.3 s); after a clean close it replays nothing.
const MAX_JOURNAL_BYTES: u64 = 128 << 20;

/// fjall's background threads (flushes and compactions): fjall's own choice (a thread per core,
/// at most 4), but never fewer than 3. With more than one, fjall's first worker hands every
/// compaction request it receives back to the queue so that it stays free for flushes; with two,
/// while the other compacts, it takes the same request straight back and spins, re-queueing it,
/// until that compaction ends (on 2 cores, about a seventh of the machine under 8 writers, by
/// `perf`). With a third, a free worker takes the request. One worker would not spin, but a
/// single worker can block forever sending itself a flush when rotation requests fill its queue.
fn worker_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .clamp(3, 4)
}

impl Records {
    /// Opens fjall in `records` (its journal checked already) with a block cache of
    /// `cache_bytes`; `dir` names the store in errors.
    pub(in crate::store::embedded) fn open(
        dir: &Path,
        records: &Path,
        cache_bytes: u64,
    ) -> Result<Records> {
        let db = match Database::builder(records)
            // Uncompressed, so `store::fjall_files` can verify and salvage it without a decompressor.
            .journal_compression(fjall::CompressionType::None)
            .max_journaling_size(MAX_JOURNAL_BYTES)
            .cache_size(cache_bytes)
            .worker_threads(worker_threads())
            .open()
        {
            Ok(db) => db,
            Err(fjall::Error::Locked) => return Err(crate::store::engine::locked(dir)),
            Err(e) => {
                return Err(crate::store::engine::storage(
                    format!("opening {}", dir.display()),
                    e,
                ))
            }
        };
        let open_ks = |name: &str| {
            let memtable = match name {
                "active" | "retired" | "decisions" => LARGE_MEMTABLE,
                _ => SMALL_MEMTABLE,
            };
            db.keyspace(name, || {
                let options = KeyspaceCreateOptions::default().max_memtable_size(memtable);
                if memtable == LARGE_MEMTABLE {
                    options.compaction_strategy(Arc::new(
                        fjall::compaction::Leveled::default().with_l0_threshold(L0_TABLES),
                    ))
                } else {
                    options
                }
            })
            .map_err(|e| crate::store::engine::storage(format!("opening keyspace {name}"), e))
        };
        let ks = Keyspaces {
            active: open_ks("active")?,
            retired: open_ks("retired")?,
            norms: open_ks("norms")?,
            scopes: open_ks("scopes")?,
            counters: open_ks("counters")?,
            outbox: open_ks("outbox")?,
            meta: open_ks("meta")?,
            decisions: open_ks("decisions")?,
            usage: open_ks("usage")?,
        };
        Ok(Records { db, ks })
    }
}
