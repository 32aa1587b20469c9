//! The [`MemoryStore`] trait: the one contract the embedded, in-memory and remote stores
//! implement, and every layer above them calls.
//!
//! **Invariant:** every method validates its input and answers `Invalid` with a reason; none
//! panics on any input. A default method is built only from the trait's other methods.

use super::counters::DayStats;
use super::upkeep::{MemoryUse, Upkeep};
use super::validate::{validate_decision_query, CheckedWrite};
use super::values::{ImportReport, ListQuery, SweepReceipt, Window, WriteOptions};
use crate::decisions::{Decision, DecisionQuery};
use crate::error::Result;
use crate::model::{Candidate, Record, Retrieved, ScopeKey, WriteCounts};
use crate::time::Millis;

/// The memory store contract, shared by the embedded, in-memory and remote stores.
///
/// Every method validates its input and answers [`ErrorKind::Invalid`](crate::error::ErrorKind) with a
/// reason; none panics on any input. A store implements fourteen methods; seven more (`write`,
/// `window`, `retrieve`, `visit_decisions`, `now`, `memory`, `upkeep`) have defaults built from
/// them, which a store overrides to answer faster or to say more.
///
/// | what | methods |
/// |---|---|
/// | change a scope | [`write`](Self::write) (checks, then [`write_checked`](Self::write_checked)), [`forget`](Self::forget), [`sweep`](Self::sweep) |
/// | a run's reads | [`window`](Self::window) (the newest facts, no usage bump), [`retrieve`](Self::retrieve) (keyword hits, bumps usage), [`list`](Self::list) |
/// | one record, the scopes | [`get`](Self::get), [`scopes`](Self::scopes), [`active_count`](Self::active_count) |
/// | what happened | [`stats`](Self::stats) (day counters), [`decisions`](Self::decisions) and [`visit_decisions`](Self::visit_decisions) (the journal) |
/// | backup and moving | [`export`](Self::export), [`import`](Self::import), [`export_decisions`](Self::export_decisions), [`import_decisions`](Self::import_decisions) |
/// | the store itself | [`now`](Self::now) (its clock), [`memory`](Self::memory) and [`upkeep`](Self::upkeep) (for `/metrics`) |
pub trait MemoryStore: Send + Sync {
    /// Writes `candidates` to `scope` (restate, dedup, insert, supersede, then evict to the cap)
    /// as one atomic batch, and answers what happened: [`CheckedWrite::check`], then
    /// [`MemoryStore::write_checked`].
    fn write(
        &self,
        scope: &ScopeKey,
        candidates: &[Candidate],
        options: &WriteOptions,
    ) -> Result<WriteCounts> {
        self.write_checked(&CheckedWrite::check(scope, candidates, options)?, options)
    }

    /// [`MemoryStore::write`] of a write already checked where it entered; `options.cap` is
    /// not read again (the checked write carries it).
    fn write_checked(
        &self,
        write: &CheckedWrite<'_>,
        options: &WriteOptions,
    ) -> Result<WriteCounts>;

    /// Active records, newest first; never bumps usage.
    fn list(&self, scope: &ScopeKey, query: &ListQuery) -> Result<Vec<Record>>;

    /// The window read: the newest `limit` (1–50) active facts of `scope`, as
    /// `list(scope, &ListQuery::window(limit))` answers them, without copying where the store
    /// keeps them decoded (the embedded store does). Never bumps usage.
    fn window(&self, scope: &ScopeKey, limit: usize) -> Result<Window> {
        Ok(Window::from(self.list(scope, &ListQuery::window(limit))?))
    }

    /// The best `limit` active records for `query`; bumps every returned record.
    fn retrieve(&self, scope: &ScopeKey, query: &str, limit: usize) -> Result<Vec<Record>> {
        Ok(Retrieved::records(
            self.retrieve_marked(scope, query, limit)?,
        ))
    }

    /// [`retrieve`](Self::retrieve), each record marked with whether this was its first use,
    /// which the wire answer shows (see [`Retrieved`]).
    fn retrieve_marked(
        &self,
        scope: &ScopeKey,
        query: &str,
        limit: usize,
    ) -> Result<Vec<Retrieved>>;

    /// Flips an active record of `scope` to `forgotten`; `false` if there was none.
    fn forget(&self, scope: &ScopeKey, id: &str) -> Result<bool>;

    /// Flips every active fact of `scope` that carries a gate marker to `swept`.
    fn sweep(&self, scope: &ScopeKey, dry_run: bool) -> Result<SweepReceipt>;

    /// The record with this id, whatever its status.
    fn get(&self, id: &str) -> Result<Option<Record>>;

    /// Every scope that holds a record.
    fn scopes(&self) -> Result<Vec<ScopeKey>>;

    /// Every record, scope by scope, in sequence order.
    fn export(&self, sink: &mut dyn FnMut(Record) -> Result<()>) -> Result<()>;

    /// Writes whole records as they are (ids, statuses and counts kept); ids already held are
    /// skipped. Import never evicts.
    fn import(&self, records: &[Record]) -> Result<ImportReport>;

    /// Counters per scope per day, from day `since` (days since the epoch, UTC) on.
    fn stats(&self, since: i64) -> Result<Vec<DayStats>>;

    /// How many active records `scope` holds.
    fn active_count(&self, scope: &ScopeKey) -> Result<u64>;

    /// A scope's decision journal, newest first, filtered by `query`.
    fn decisions(&self, scope: &ScopeKey, query: &DecisionQuery) -> Result<Vec<Decision>>;

    /// [`decisions`](Self::decisions)' entries handed to `visit` one at a time, newest first,
    /// until it answers `false` or `query.limit` were handed, for a reader that learns how far
    /// it must read only as it reads (a review's evidence). The embedded store reads once and
    /// no further than `visit` goes. A store that answers whole pages (this default, which the
    /// remote store uses) asks for `page` entries first, then twice as many each time, and
    /// hands only the entries past those already handed; an entry written between two pages
    /// moves the rest by one, so it may hand one entry twice.
    fn visit_decisions(
        &self,
        scope: &ScopeKey,
        query: &DecisionQuery,
        page: usize,
        visit: &mut dyn FnMut(Decision) -> bool,
    ) -> Result<()> {
        visit_in_pages(self, scope, query, page, visit)
    }

    /// Every journal entry, oldest first within a scope, for backup or moving (with
    /// [`MemoryStore::export`]); importing them in this order keeps their order.
    fn export_decisions(&self, sink: &mut dyn FnMut(Decision) -> Result<()>) -> Result<()>;

    /// Adds journal entries read from an export; returns how many were added.
    fn import_decisions(&self, entries: &[Decision]) -> Result<u64>;

    /// What the store holds in memory, by part, for `/metrics`; `None` for a store that does
    /// not account for it (one in memory, one behind a server). The embedded store always
    /// answers it.
    fn memory(&self) -> Option<MemoryUse> {
        None
    }

    /// The storage engine's background work, for `/metrics`; `None` for a store without one.
    /// The embedded store always answers it.
    fn upkeep(&self) -> Option<Upkeep> {
        None
    }

    /// The time the store dates its writes by (milliseconds since the epoch). A caller that
    /// dates a read against them (a review's days, a run's context, the counters' day) asks
    /// here, so a store opened on another clock (a test's, a bench's, an import's) is read on
    /// the days it was written on.
    fn now(&self) -> Millis {
        crate::time::system_clock()()
    }
}

/// [`MemoryStore::visit_decisions`] for a store that answers whole pages: `page` entries first,
/// then twice as many each time, handing only the entries past those already handed.
fn visit_in_pages<S: MemoryStore + ?Sized>(
    store: &S,
    scope: &ScopeKey,
    query: &DecisionQuery,
    page: usize,
    visit: &mut dyn FnMut(Decision) -> bool,
) -> Result<()> {
    validate_decision_query(query)?;
    let all = query.limit;
    let mut limit = page.clamp(1, all);
    let mut handed = 0;
    loop {
        let asked = DecisionQuery {
            limit,
            ..query.clone()
        };
        let entries = store.decisions(scope, &asked)?;
        let answered = entries.len();
        for d in entries.into_iter().skip(handed) {
            handed += 1;
            if !visit(d) {
                return Ok(());
            }
        }
        if answered < limit || limit >= all {
            return Ok(());
        }
        limit = limit.saturating_mul(2).min(all);
    }
}
