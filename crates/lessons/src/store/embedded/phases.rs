//! Where a write's time goes, phase by phase. Each layer adds the time it spent to the calling
//! thread's tally; `write` starts the tally, reads it when the write returns, keeps it as the
//! thread's last write (a bench reads it to profile the slowest writes, off-CPU waits
//! included) and logs it when the write was slow.
//!
//! **Invariant:** the phases are disjoint (no phase is timed inside another), so they sum to at
//! most the write's total; the rest is what no phase names (validation, encoding's leftovers).

use std::cell::Cell;
use std::time::{Duration, Instant};

use crate::model::ScopeKey;

/// A write slower than this is logged with its phases.
const SLOW_WRITE: Duration = Duration::from_secs(1);

/// The time one write spent in each phase.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WritePhases {
    /// Waiting for the scope's write lock (another write to the same scope).
    pub scope_lock: Duration,
    /// Loading the scope's bookkeeping and eviction order into memory (a scope not in the map).
    pub scope_load: Duration,
    /// Reading what the planner needs (point reads) and planning.
    pub plan: Duration,
    /// Turning the plan into one batch (encoding records, journal entries, counters).
    pub build: Duration,
    /// Before the commit lock: waiting while the engine's flushes are behind (see
    /// `GroupCommit::commit`).
    pub flush_wait: Duration,
    /// Waiting for the commit lock (another batch committing).
    pub commit_lock: Duration,
    /// fjall's commit: the journal append and the memtable inserts (and any write stall).
    pub commit: Duration,
    /// After the scope's lock is released: waiting for an fsync that covers the batch,
    /// running it included.
    pub durable: Duration,
    /// Waiting for the indexer to catch up (too many index changes pending).
    pub backpressure: Duration,
    /// The whole write, from validation to the answer.
    pub total: Duration,
}

/// A phase a layer times.
#[derive(Clone, Copy, Debug)]
pub(super) enum Phase {
    ScopeLock,
    ScopeLoad,
    Plan,
    Build,
    FlushWait,
    CommitLock,
    Commit,
    Durable,
    Backpressure,
}

impl WritePhases {
    fn slot(&mut self, phase: Phase) -> &mut Duration {
        match phase {
            Phase::ScopeLock => &mut self.scope_lock,
            Phase::ScopeLoad => &mut self.scope_load,
            Phase::Plan => &mut self.plan,
            Phase::Build => &mut self.build,
            Phase::FlushWait => &mut self.flush_wait,
            Phase::CommitLock => &mut self.commit_lock,
            Phase::Commit => &mut self.commit,
            Phase::Durable => &mut self.durable,
            Phase::Backpressure => &mut self.backpressure,
        }
    }

    /// The time of every phase together.
    fn sum(&self) -> Duration {
        self.named().iter().map(|(_, d)| *d).sum()
    }

    /// The phases by name, in the write's order (for a log line or a table).
    pub fn named(&self) -> [(&'static str, Duration); 9] {
        [
            ("scope lock", self.scope_lock),
            ("scope load", self.scope_load),
            ("plan", self.plan),
            ("build", self.build),
            ("flush wait", self.flush_wait),
            ("commit lock", self.commit_lock),
            ("commit", self.commit),
            ("durable", self.durable),
            ("backpressure", self.backpressure),
        ]
    }
}

thread_local! {
    /// The write running on this thread, as tallied so far.
    static CURRENT: Cell<WritePhases> = Cell::new(WritePhases::default());
    /// The last write this thread finished.
    static LAST: Cell<WritePhases> = Cell::new(WritePhases::default());
}

/// Adds `elapsed` to this thread's tally for `phase`.
pub(super) fn add(phase: Phase, elapsed: Duration) {
    CURRENT.with(|c| {
        let mut p = c.get();
        *p.slot(phase) += elapsed;
        c.set(p);
    });
}

/// Runs `f`, adding its time to `phase`, less what phases timed inside it took (so a scope
/// load inside the plan counts once, as a load).
pub(super) fn time<T>(phase: Phase, f: impl FnOnce() -> T) -> T {
    let inner_before = CURRENT.with(|c| c.get().sum());
    let started = Instant::now();
    let out = f();
    let elapsed = started.elapsed();
    let inner = CURRENT.with(|c| c.get().sum()).saturating_sub(inner_before);
    add(phase, elapsed.saturating_sub(inner));
    out
}

/// A write's tally, from its start to its answer.
pub(super) struct WriteTally {
    started: Instant,
}

impl WriteTally {
    /// Starts this thread's tally afresh.
    pub(super) fn start() -> WriteTally {
        CURRENT.with(|c| c.set(WritePhases::default()));
        WriteTally {
            started: Instant::now(),
        }
    }

    /// Ends the tally: keeps it as the thread's last write, and logs it if the write was slow.
    pub(super) fn finish(self, scope: &ScopeKey) {
        let mut p = CURRENT.with(Cell::get);
        p.total = self.started.elapsed();
        LAST.with(|l| l.set(p));
        if p.total >= SLOW_WRITE {
            let phases: Vec<String> = p
                .named()
                .iter()
                .filter(|(_, d)| !d.is_zero())
                .map(|(name, d)| format!("{name} {} ms", d.as_millis()))
                .collect();
            log::warn!(
                "[store] {scope}: a write took {} ms ({})",
                p.total.as_millis(),
                phases.join(", ")
            );
        }
    }
}

/// The phases of the last write this thread made to an embedded store.
#[cfg(feature = "__internals")]
pub fn last_write() -> WritePhases {
    LAST.with(Cell::get)
}
