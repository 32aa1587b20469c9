//! The store: the [`MemoryStore`] contract and its implementations.
//!
//! - [`EmbeddedStore`]: records in fjall, keyword search in tantivy, one atomic batch per write.
//! - [`InMemoryStore`]: the same contract over plain vectors, written straight from the rules
//!   (scans, no planner, no index): the model the embedded store is tested against, and a fast
//!   store for tests of later layers.
//!
//! **Invariant:** only this module knows key encodings and fjall.

pub(crate) mod codec;
mod durable;
pub(crate) mod embedded;
pub(crate) mod engine;
mod fjall_files;
pub(crate) mod index;
mod memory;
pub(crate) mod plan;
mod salvage;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use crate::model::Tally;
pub use crate::time::{system_clock, Clock, Millis};
pub use embedded::{
    Durability, EmbeddedStore, EmbeddedStoreBuilder, Health, MemoryUse, SyncTimes, Upkeep,
    DEFAULT_CACHE_BYTES,
};
pub use memory::InMemoryStore;
pub use salvage::{salvage, SalvageReport};

use crate::decisions::{Decision, DecisionQuery};
use crate::error::{Error, Result};
use crate::limits::{MAX_BATCH, MAX_CAP, MAX_JOURNAL_LIMIT, MAX_LIMIT, MAX_QUERY_UNITS};
use crate::model::{Candidate, Kind, Record, Retrieved, ScopeKey, ValidCandidate, WriteCounts};
use crate::text::utf16_len;

/// Options of one write.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WriteOptions {
    /// The scope's cap for this write (1–10000); the store's default when absent.
    pub cap: Option<usize>,
    /// Reflection counts recorded atomically with the write.
    pub tally: Option<Tally>,
    /// Facts the gate refused in the reflection behind this write, journaled with it.
    pub rejected: Vec<crate::decisions::RejectedFact>,
}

/// Filters of `list`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListQuery {
    /// At most this many records (1–50).
    pub limit: usize,
    /// Only this kind.
    pub kind: Option<Kind>,
    /// Only records holding any of this query's tokens as a whole token of their text or
    /// keywords (a query without tokens, the empty string included, matches nothing).
    pub query: Option<String>,
}

impl ListQuery {
    /// The newest `limit` records of any kind.
    pub fn newest(limit: usize) -> ListQuery {
        ListQuery {
            limit,
            kind: None,
            query: None,
        }
    }

    /// The window read: the newest `limit` facts.
    pub fn window(limit: usize) -> ListQuery {
        ListQuery {
            limit,
            kind: Some(Kind::Fact),
            query: None,
        }
    }

    /// Whether this is a window read (facts, no query), which [`MemoryStore::window`] answers.
    pub fn is_window(&self) -> bool {
        self.kind == Some(Kind::Fact) && self.query.is_none()
    }
}

/// A scope's newest facts, newest first, shared with the store that read them.
///
/// The embedded store keeps each scope's window decoded and up to date with every commit, and a
/// `Window` points into it: reading it copies no record (each is shared, `Arc<Record>`), and a
/// later write builds a new window rather than changing this one, so a `Window` never changes
/// while it is held.
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    records: Arc<Vec<Arc<Record>>>,
    len: usize,
}

impl Window {
    /// The first `limit` of `records` (all of them if fewer).
    pub fn new(records: Arc<Vec<Arc<Record>>>, limit: usize) -> Window {
        let len = limit.min(records.len());
        Window { records, len }
    }

    /// The records, copied out.
    pub fn to_records(&self) -> Vec<Record> {
        self.iter().map(|r| Record::clone(r)).collect()
    }
}

impl From<Vec<Record>> for Window {
    fn from(records: Vec<Record>) -> Window {
        let len = records.len();
        Window {
            records: Arc::new(records.into_iter().map(Arc::new).collect()),
            len,
        }
    }
}

impl std::ops::Deref for Window {
    type Target = [Arc<Record>];

    fn deref(&self) -> &[Arc<Record>] {
        // `len <= records.len()` by construction; `get` keeps that unprovable step panic-free.
        self.records.get(..self.len).unwrap_or(&[])
    }
}

/// The answer of a sweep.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepReceipt {
    /// Facts flipped to `swept` (or that would be, under a dry run).
    pub swept: u64,
    /// Their ids (always collected; the wire shows them under a dry run).
    pub ids: Vec<String>,
}

/// The answer of an import.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportReport {
    /// Records written.
    pub imported: u64,
    /// Records whose id the store already held (left untouched).
    pub skipped: u64,
}

/// What happened in one scope on one UTC day.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DayCounters {
    /// Facts an extractor offered.
    pub offered: u64,
    /// Facts the gate rejected.
    pub rejected: u64,
    /// Rejections by marker name (a fact with two markers counts under both).
    pub rejected_by: BTreeMap<String, u64>,
    /// Candidates that restated a record.
    pub restated: u64,
    /// Facts inserted.
    pub inserted: u64,
    /// Candidates deduplicated onto a record.
    pub deduped: u64,
    /// Records superseded.
    pub superseded: u64,
    /// Records evicted by the cap.
    pub evicted: u64,
    /// Facts swept for carrying a marker.
    pub swept: u64,
    /// Records forgotten.
    pub forgotten: u64,
    /// Summaries inserted.
    pub summaries: u64,
}

impl DayCounters {
    /// The counters as (name, value), in the order every rendering shows them (the day line,
    /// `lessons stats`, `/metrics`); `rejected_by` is the detail of `rejected`.
    pub fn events(&self) -> [(&'static str, u64); 10] {
        [
            ("offered", self.offered),
            ("rejected", self.rejected),
            ("restated", self.restated),
            ("inserted", self.inserted),
            ("deduped", self.deduped),
            ("superseded", self.superseded),
            ("evicted", self.evicted),
            ("swept", self.swept),
            ("forgotten", self.forgotten),
            ("summaries", self.summaries),
        ]
    }

    fn events_mut(&mut self) -> [&mut u64; 10] {
        [
            &mut self.offered,
            &mut self.rejected,
            &mut self.restated,
            &mut self.inserted,
            &mut self.deduped,
            &mut self.superseded,
            &mut self.evicted,
            &mut self.swept,
            &mut self.forgotten,
            &mut self.summaries,
        ]
    }

    /// Adds a reflection's gate counts.
    pub fn add_tally(&mut self, t: &Tally) {
        self.offered += t.offered;
        self.rejected += t.rejected;
        for (marker, n) in &t.rejected_by {
            *self.rejected_by.entry(marker.clone()).or_default() += n;
        }
    }

    /// `name n, name n, …` for every event; `rejected_detail` adds the markers after
    /// `rejected` (`rejected 2 (sha 1, count 1)`).
    pub fn line(&self, rejected_detail: bool) -> String {
        let mut parts = Vec::with_capacity(10);
        for (name, n) in self.events() {
            if name == "rejected" && rejected_detail && !self.rejected_by.is_empty() {
                let by: Vec<String> = self
                    .rejected_by
                    .iter()
                    .map(|(m, n)| format!("{m} {n}"))
                    .collect();
                parts.push(format!("{name} {n} ({})", by.join(", ")));
            } else {
                parts.push(format!("{name} {n}"));
            }
        }
        parts.join(", ")
    }

    /// Adds what one write did.
    pub fn add_write(&mut self, counts: &WriteCounts, summaries: u64, tally: Option<&Tally>) {
        self.restated += counts.restated;
        // Facts only: summaries have their own counter.
        self.inserted += counts.inserted.saturating_sub(summaries);
        self.deduped += counts.deduped;
        self.superseded += counts.superseded;
        self.evicted += counts.evicted;
        self.summaries += summaries;
        if let Some(t) = tally {
            self.add_tally(t);
        }
    }

    /// Adds another day's counters.
    pub fn merge(&mut self, o: &DayCounters) {
        for (mine, (_, theirs)) in self.events_mut().into_iter().zip(o.events()) {
            *mine += theirs;
        }
        for (marker, n) in &o.rejected_by {
            *self.rejected_by.entry(marker.clone()).or_default() += n;
        }
    }
}

/// One scope's counters on one day.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DayStats {
    /// `YYYY-MM-DD`, UTC.
    pub day: String,
    /// The scope.
    pub scope_key: ScopeKey,
    /// The counters.
    pub counters: DayCounters,
}

/// The memory store contract, shared by the embedded, in-memory and remote stores.
///
/// Every method validates its input and answers [`ErrorKind::Invalid`](crate::error::ErrorKind) with a
/// reason; none panics on any input.
pub trait MemoryStore: Send + Sync {
    /// Writes `candidates` to `scope` (restate, dedup, insert, supersede, then evict to the cap)
    /// as one atomic batch, and answers what happened.
    fn write(
        &self,
        scope: &ScopeKey,
        candidates: &[Candidate],
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
        validate_decision_query(query)?;
        let all = query.limit;
        let mut limit = page.clamp(1, all);
        let mut handed = 0;
        loop {
            let asked = DecisionQuery {
                limit,
                ..query.clone()
            };
            let entries = self.decisions(scope, &asked)?;
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

    /// Every journal entry, oldest first within a scope, for backup or moving (with
    /// [`MemoryStore::export`]); importing them in this order keeps their order.
    fn export_decisions(&self, sink: &mut dyn FnMut(Decision) -> Result<()>) -> Result<()>;

    /// Adds journal entries read from an export; returns how many were added.
    fn import_decisions(&self, entries: &[Decision]) -> Result<u64>;

    /// What the store holds in memory, by part, for `/metrics`; `None` for a store that does
    /// not account for it (one in memory, one behind a server).
    fn memory(&self) -> Option<MemoryUse> {
        None
    }

    /// The storage engine's background work, for `/metrics`; `None` for a store without one.
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

/// Validates a write's candidates and cap.
pub(crate) fn validate_write(
    scope: &ScopeKey,
    candidates: &[Candidate],
    options: &WriteOptions,
    default_cap: usize,
) -> Result<(Vec<ValidCandidate>, usize)> {
    if candidates.len() > MAX_BATCH {
        return Err(Error::invalid(format!(
            "records must hold at most {MAX_BATCH} candidates"
        )));
    }
    let cap = options.cap.unwrap_or(default_cap);
    if !(1..=MAX_CAP).contains(&cap) {
        return Err(Error::invalid(format!(
            "cap must be between 1 and {MAX_CAP}"
        )));
    }
    let valid = candidates
        .iter()
        .enumerate()
        .map(|(i, c)| c.validate(scope, i))
        .collect::<Result<Vec<_>>>()?;
    Ok((valid, cap))
}

/// An import's records by scope, then by sequence number.
pub(crate) type ImportGroups<'a> = BTreeMap<&'a ScopeKey, BTreeMap<u64, &'a Record>>;

/// An import's records checked and grouped: every record valid (or the whole import refused,
/// naming the first bad one), grouped by scope in id order, a repeated id kept once (the
/// first). Returns the groups and how many repeats were dropped.
pub(crate) fn group_import(records: &[Record]) -> Result<(ImportGroups<'_>, u64)> {
    let mut groups: ImportGroups<'_> = BTreeMap::new();
    let mut repeats = 0;
    for (i, r) in records.iter().enumerate() {
        r.validate()
            .map_err(|e| Error::invalid(format!("records[{i}]: {e}")))?;
        let Some(seq) = r.seq() else { continue };
        match groups.entry(&r.scope_key).or_default().entry(seq) {
            std::collections::btree_map::Entry::Occupied(_) => repeats += 1,
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(r);
            }
        }
    }
    Ok((groups, repeats))
}

pub(crate) fn validate_decision_query(q: &DecisionQuery) -> Result<()> {
    if !(1..=MAX_JOURNAL_LIMIT).contains(&q.limit) {
        return Err(Error::invalid(format!(
            "limit must be an integer between 1 and {MAX_JOURNAL_LIMIT}"
        )));
    }
    Ok(())
}

pub(crate) fn validate_limit(limit: usize) -> Result<()> {
    if (1..=MAX_LIMIT).contains(&limit) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "limit must be between 1 and {MAX_LIMIT}"
        )))
    }
}

/// An id `forget` accepts, by the reference Worker's rule: 1–200 UTF-16 units, no whitespace
/// or control character. Any other id names no record, and saying so beats answering `false`.
pub(crate) fn validate_forget_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && utf16_len(id) <= crate::limits::MAX_REF_UNITS
        && !id
            .chars()
            .any(|c| c.is_whitespace() || crate::text::is_js_whitespace(c) || c.is_control());
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "id must be a non-empty string of at most {} characters with no whitespace",
            crate::limits::MAX_REF_UNITS
        )))
    }
}

pub(crate) fn validate_query(query: &str) -> Result<()> {
    if utf16_len(query) > MAX_QUERY_UNITS {
        Err(Error::invalid(format!(
            "query must be at most {MAX_QUERY_UNITS} UTF-16 units"
        )))
    } else {
        Ok(())
    }
}

/// `list`'s query filter, as the reference Worker applies it: a record passes when one of the
/// query's match terms ([`crate::fts::match_terms`]) equals one of its FTS tokens (case folded,
/// Latin diacritics removed: the Worker's FTS5 MATCH). Without a query nothing is filtered; a
/// query with no token at all (the empty string included) matches nothing, as the Worker's
/// `query === undefined` test has it.
pub(crate) enum ListFilter {
    All,
    Nothing,
    Tokens(std::collections::HashSet<String>),
}

impl ListFilter {
    pub(crate) fn new(query: Option<&str>) -> ListFilter {
        match query {
            None => ListFilter::All,
            Some(q) => {
                let tokens: std::collections::HashSet<String> =
                    crate::fts::match_terms(q).into_iter().collect();
                if tokens.is_empty() {
                    ListFilter::Nothing
                } else {
                    ListFilter::Tokens(tokens)
                }
            }
        }
    }

    pub(crate) fn keeps(&self, record: &Record) -> bool {
        match self {
            ListFilter::All => true,
            ListFilter::Nothing => false,
            ListFilter::Tokens(wanted) => crate::fts::FtsDoc::of(&record.text, &record.keywords)
                .terms()
                .any(|t| wanted.contains(t)),
        }
    }
}
