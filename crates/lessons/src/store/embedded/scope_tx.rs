//! The one way to change a scope: [`change`] runs the protocol around a [`ScopeTx`].
//!
//! Every operation that changes a scope's records (a write, a forget, a sweep, an import, an
//! id reservation) runs the same steps, in this order, here and nowhere else: refuse a store
//! that lost writes or holds unreadable data; take the scope's write lock with its use bumps
//! settled; load its checked bookkeeping; let the operation build one batch through
//! [`ScopeTx`]'s methods, which keep the active count, the next id and the index changes from
//! what the batch changes, and count and journal a forget or a sweep themselves; commit the
//! batch; release the lock; wait until the batch is durable; let the indexer's backpressure
//! slow the caller when the index falls behind.
//!
//! **Invariant:** a batch that changes nothing is not committed, and nothing is waited on.
//! **Invariant:** an insert never replaces a record: an id the scope holds is refused as damage.

use super::group::Ticket;
use super::journal_entries;
use super::phases::{self, Phase};
use super::scopes::Scope;
use super::shared::Shared;
use super::tx::{with_status, DedupKeys, Tx};
use crate::decisions::{Decision, DecisionEvent};
use crate::error::{Error, ErrorKind, Result};
use crate::model::{Record, ScopeKey, Status};
use crate::store::codec::ScopeMeta;
use crate::store::counters::DayCounters;
use crate::store::index::IndexOp;

/// One scope's change being built, under the scope's write lock (see the module docs).
pub(super) struct ScopeTx<'a> {
    s: &'a Shared,
    scope: &'a ScopeKey,
    state: &'a Scope,
    /// The bookkeeping as loaded and checked, and as this batch leaves it.
    loaded: ScopeMeta,
    meta: ScopeMeta,
    tx: Tx,
    index: Vec<IndexOp>,
    /// Whether any method added to the batch.
    touched: bool,
    now: i64,
}

/// Changes `scope` through `build`, and returns its answer once the change is durable.
pub(super) fn change<T>(
    s: &Shared,
    scope: &ScopeKey,
    build: impl FnOnce(&mut ScopeTx<'_>) -> Result<T>,
) -> Result<T> {
    let (out, ticket) = change_unsettled(s, scope, build)?;
    settle(s, ticket)?;
    Ok(out)
}

/// [`change`] without the wait: the caller passes the ticket (alone, or joined with the
/// tickets of other scopes' changes) to [`settle`] before it acknowledges anything.
pub(super) fn change_unsettled<T>(
    s: &Shared,
    scope: &ScopeKey,
    build: impl FnOnce(&mut ScopeTx<'_>) -> Result<T>,
) -> Result<(T, Ticket)> {
    s.witness.refuse_if_damaged()?;
    let state = s.scopes.get(scope);
    // The scope's records with every use bump the derived state holds.
    let guard = phases::time(Phase::ScopeLock, || state.lock_settled());
    let meta = phases::time(Phase::ScopeLoad, || s.scope_meta(scope, &state))?;
    let mut tx = ScopeTx {
        s,
        scope,
        state: &state,
        loaded: meta,
        meta,
        tx: s.tx(&state),
        index: Vec::new(),
        touched: false,
        now: (s.clock)(),
    };
    let out = build(&mut tx)?;
    let ticket = tx.commit()?;
    drop(guard);
    Ok((out, ticket))
}

/// Waits until the batches of `ticket` are durable, then applies the indexer's backpressure.
pub(super) fn settle(s: &Shared, ticket: Ticket) -> Result<()> {
    phases::time(Phase::Durable, || s.group.wait_durable(ticket))?;
    phases::time(Phase::Backpressure, || s.queue.backpressure());
    Ok(())
}

impl ScopeTx<'_> {
    /// The scope's key.
    pub(super) fn scope(&self) -> &ScopeKey {
        self.scope
    }

    /// The scope's state in memory (its write lock is held).
    pub(super) fn state(&self) -> &Scope {
        self.state
    }

    /// The scope's bookkeeping as loaded, before this change.
    pub(super) fn loaded(&self) -> ScopeMeta {
        self.loaded
    }

    /// The time this change is dated by.
    pub(super) fn now(&self) -> i64 {
        self.now
    }

    /// Starts from the dedup keys a plan already read, so they are not read again; before any
    /// other edit.
    pub(super) fn read_dedup_keys(&mut self, keys: DedupKeys) {
        self.tx.read_dedup_keys(keys);
    }

    /// Adds record `r` as `seq`, active or retired by its status. Refused when the scope holds
    /// `seq` already (its bookkeeping is behind its records).
    pub(super) fn insert(&mut self, r: &Record, seq: u64) -> Result<()> {
        if self.s.records.holds(self.scope, seq)? {
            return Err(Error::new(
                ErrorKind::Damaged,
                format!(
                    "refusing to overwrite {}: the scope's bookkeeping is behind its records; run `lessons doctor --repair`",
                    self.scope.record_id(seq)
                ),
            ));
        }
        if r.status == Status::Active {
            self.s.records.put_active(&mut self.tx, r, seq)?;
            self.meta.active += 1;
            self.index.push(IndexOp::upsert(r));
        } else {
            self.s.records.put_retired(&mut self.tx, r, seq)?;
        }
        self.reserve(seq + 1);
        self.touched = true;
        Ok(())
    }

    /// Rewrites active record `seq` (`old` as read) as `new`, still active.
    pub(super) fn update(&mut self, old: &Record, new: &Record, seq: u64) -> Result<()> {
        self.s.records.update_active(&mut self.tx, old, new, seq)?;
        self.touched = true;
        Ok(())
    }

    /// Moves active record `seq` (`old` as read) out of the active set, as `kept` (its
    /// retired status, with any change of the same batch).
    pub(super) fn retire(&mut self, old: &Record, kept: &Record, seq: u64) -> Result<()> {
        self.s.records.retire(&mut self.tx, old, kept, seq)?;
        self.meta.active = self.meta.active.saturating_sub(1);
        self.index.push(IndexOp::Delete { id: old.id.clone() });
        self.touched = true;
        Ok(())
    }

    /// Forgets (`DecisionEvent::Forgotten`) or sweeps (`DecisionEvent::Swept`) active record
    /// `seq`: retired with that status, counted in the day's counters and journaled.
    pub(super) fn retire_for(&mut self, r: &Record, seq: u64, event: DecisionEvent) -> Result<()> {
        let (status, count): (Status, fn(&mut DayCounters)) = match event {
            DecisionEvent::Forgotten => (Status::Forgotten, |d| d.forgotten += 1),
            DecisionEvent::Swept => (Status::Swept, |d| d.swept += 1),
            other => {
                return Err(Error::invalid(format!(
                    "{other:?} is not an event a record is retired for on its own"
                )))
            }
        };
        self.retire(r, &with_status(r, status), seq)?;
        self.count(count)?;
        self.journal(&[journal_entries::of_retire(self.now, r, event)])
    }

    /// Makes the scope's next id at least `next_seq`.
    pub(super) fn reserve(&mut self, next_seq: u64) {
        self.meta.next_seq = self.meta.next_seq.max(next_seq);
    }

    /// Changes the scope's counters of the day.
    pub(super) fn count(&mut self, f: impl FnOnce(&mut DayCounters)) -> Result<()> {
        self.s
            .records
            .add_day(&mut self.tx, self.scope, self.now, f)?;
        self.touched = true;
        Ok(())
    }

    /// Adds entries to the scope's decision journal.
    pub(super) fn journal(&mut self, entries: &[Decision]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        self.s.journal.add(&mut self.tx, entries)?;
        self.touched = true;
        Ok(())
    }

    /// Commits the batch, if it changes anything; the ticket says when it is durable.
    fn commit(self) -> Result<Ticket> {
        let ScopeTx {
            s,
            scope,
            state,
            loaded,
            meta,
            mut tx,
            index,
            touched,
            ..
        } = self;
        let bookkeeping = meta != loaded;
        if !touched && !bookkeeping {
            return Ok(Ticket::none());
        }
        if bookkeeping {
            tx.set_meta(meta);
        }
        s.commit(scope, state, tx, index)
    }
}
