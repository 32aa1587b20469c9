//! jemalloc, for a binary that takes it as its global allocator (the `lessons` binary does, with
//! the default `jemalloc` feature): its settings for a long-running store, and its own counts.
//!
//! Why: under `lessons serve`'s threads glibc's malloc gives each thread an arena and keeps what
//! it frees, so a server's resident memory grows with its age while the store's bounded parts
//! (`/metrics`' `lessons_held_bytes`) stay flat. jemalloc, given back its freed pages within a
//! fraction of a second, holds the server's heap near what is live
//! (`cargo run --release --example deployment` measures both; docs/performance.md has the
//! figures).
//!
//! A binary declares the allocator itself (the library cannot), then calls [`tune`] first:
//!
//! ```text
//! #[global_allocator]
//! static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
//! fn main() { let _refused = lessons::allocator::tune(); /* … */ }
//! ```

use std::sync::atomic::{AtomicBool, Ordering};

use tikv_jemalloc_ctl::{background_thread, epoch, stats, Access, AsName};

/// Set by [`tune`], which only a binary whose allocator is jemalloc calls: a library built with
/// the feature inside a binary on another allocator would read the counts of an idle jemalloc.
static IN_USE: AtomicBool = AtomicBool::new(false);

/// How long a freed page is kept for reuse before it is given back, in milliseconds.
const DIRTY_DECAY_MS: isize = 200;

/// Sets jemalloc up for a long-running store: a background thread gives freed pages back on
/// its decay clock, so an arena no thread touches lately gives its pages back too (by default
/// only an arena's own next allocation does, after ten seconds); a page freed stays for reuse
/// `DIRTY_DECAY_MS`, then is given back at once (a "muzzy" page, `MADV_FREE`, would still count
/// as resident until the kernel wants it). Answers the settings jemalloc refused, each with its
/// reason; each is left at its default: slower to give back, nothing worse. Call it before a
/// logger exists, so it logs nothing itself. Call it only where jemalloc is the global
/// allocator: it also says so to [`heap`].
pub fn tune() -> Vec<String> {
    IN_USE.store(true, Ordering::Relaxed);
    let mut refused = Vec::new();
    if let Err(e) = background_thread::write(true) {
        refused.push(format!("background_thread ({e})"));
    }
    // `arenas.*` for the arenas made from now on, `arena.0.*` for the one made at start.
    for (key, ms) in [
        ("arenas.dirty_decay_ms\0", DIRTY_DECAY_MS),
        ("arena.0.dirty_decay_ms\0", DIRTY_DECAY_MS),
        ("arenas.muzzy_decay_ms\0", 0),
        ("arena.0.muzzy_decay_ms\0", 0),
    ] {
        if let Err(e) = key.as_bytes().name().write(ms) {
            refused.push(format!("{} ({e})", key.trim_end_matches('\0')));
        }
    }
    refused
}

/// jemalloc's counts of the heap, in bytes, each a snapshot taken at one epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heap {
    /// Live allocations.
    pub allocated: u64,
    /// Pages holding at least one live allocation: `active - allocated` is the free space
    /// inside pages still in use (fragmentation).
    pub active: u64,
    /// jemalloc's own bookkeeping.
    pub metadata: u64,
    /// Resident pages: active, bookkeeping, and freed pages not yet given back.
    pub resident: u64,
}

/// jemalloc's counts, refreshed first. `None` before [`tune`] (jemalloc may not be the
/// allocator) or if it does not answer.
pub fn heap() -> Option<Heap> {
    if !IN_USE.load(Ordering::Relaxed) {
        return None;
    }
    epoch::advance().ok()?;
    Some(Heap {
        allocated: stats::allocated::read().ok()? as u64,
        active: stats::active::read().ok()? as u64,
        metadata: stats::metadata::read().ok()? as u64,
        resident: stats::resident::read().ok()? as u64,
    })
}
