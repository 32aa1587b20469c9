//! `InMemoryStore`: the store contract over plain vectors, written straight from the rules.
//!
//! It shares no code with the planner or the embedded store's key layout on purpose: it is the
//! model the property tests hold the embedded store to. Every operation scans the scope.
//! `retrieve` has no BM25 stage: every active record with a match token is a candidate, in
//! newest-first order, so it agrees with the embedded store whenever a scope has no more
//! matching records than the BM25 candidate count.

use std::collections::BTreeMap;

use parking_lot::Mutex;

use super::api::MemoryStore;
use super::counters::{DayCounters, DayStats};
use super::validate::{
    group_import, validate_decision_query, validate_forget_id, validate_limit, validate_query,
    CheckedWrite, ListFilter,
};
use super::values::{ImportReport, ListQuery, SweepReceipt, WriteOptions};
use crate::decisions::{Decision, DecisionEvent, DecisionQuery};
use crate::error::Result;
use crate::limits::DEFAULT_CAP;
use crate::model::{Kind, Record, RecordId, ScopeKey, Status, WriteCounts};
use crate::rank::rank;
use crate::text::{normalize, tokenize};
use crate::time::{day_of, format_day, system_clock, Clock};

#[derive(Default)]
struct State {
    /// Each scope's records by sequence number.
    scopes: BTreeMap<ScopeKey, BTreeMap<u64, Record>>,
    counters: BTreeMap<(i64, ScopeKey), DayCounters>,
    /// Each scope's decision journal, oldest first (no pruning: the model keeps everything).
    decisions: BTreeMap<ScopeKey, Vec<Decision>>,
}

/// The store contract over plain vectors; see the module docs.
pub struct InMemoryStore {
    state: Mutex<State>,
    clock: Clock,
    cap: usize,
}

impl Default for InMemoryStore {
    fn default() -> Self {
        InMemoryStore::new()
    }
}

impl InMemoryStore {
    /// An empty store on the wall clock with the default cap.
    pub fn new() -> InMemoryStore {
        InMemoryStore::with_clock(system_clock())
    }

    /// An empty store reading time from `clock`.
    pub fn with_clock(clock: Clock) -> InMemoryStore {
        InMemoryStore {
            state: Mutex::new(State::default()),
            clock,
            cap: DEFAULT_CAP,
        }
    }

    /// Sets the default cap (1–10000).
    pub fn with_cap(mut self, cap: usize) -> InMemoryStore {
        self.cap = cap;
        self
    }
}

type Records = BTreeMap<u64, Record>;

fn active_index(records: &Records, scope: &ScopeKey, id: &Option<String>) -> Option<u64> {
    let RecordId { scope: s, seq } = RecordId::parse(id.as_deref()?)?;
    (&s == scope && records.get(&seq)?.status == Status::Active).then_some(seq)
}

/// A decision for each fact the gate refused before this write.
fn rejected_decisions(scope: &ScopeKey, options: &WriteOptions, now: i64) -> Vec<Decision> {
    options
        .rejected
        .iter()
        .map(|f| {
            let mut d = Decision::new(now, scope, DecisionEvent::Rejected);
            d.texts.push(f.text.clone());
            d.markers = f.markers.clone();
            d
        })
        .collect()
}

/// Evicts the least recently used active records past `cap`: a decision for each.
fn evict_over_cap(records: &mut Records, scope: &ScopeKey, cap: usize, now: i64) -> Vec<Decision> {
    let mut active: Vec<(i64, i64, u64)> = records
        .iter()
        .filter(|(_, r)| r.status == Status::Active)
        .map(|(&seq, r)| (r.usage_time(), r.created_at, seq))
        .collect();
    let mut evicted = Vec::new();
    if active.len() > cap {
        active.sort_unstable();
        for &(_, _, seq) in active.iter().take(active.len() - cap) {
            if let Some(r) = records.get_mut(&seq) {
                r.status = Status::Evicted;
                let mut d = Decision::new(now, scope, DecisionEvent::Evicted);
                d.ids.push(r.id.clone());
                d.texts.push(r.text.clone());
                d.age_ms = Some(now.saturating_sub(r.created_at));
                d.use_count = Some(r.use_count);
                evicted.push(d);
            }
        }
    }
    evicted
}

impl MemoryStore for InMemoryStore {
    fn now(&self) -> crate::time::Millis {
        (self.clock)()
    }

    fn write_checked(
        &self,
        write: &CheckedWrite<'_>,
        options: &WriteOptions,
    ) -> Result<WriteCounts> {
        let (scope, valid) = (write.scope(), write.valid());
        let cap = write.cap().unwrap_or(self.cap);
        let now = (self.clock)();
        let mut state = self.state.lock();
        let records = state.scopes.entry(scope.clone()).or_default();
        let mut counts = WriteCounts::default();
        let mut summaries = 0;
        let mut journal = rejected_decisions(scope, options, now);
        let mut later: Vec<Decision> = Vec::new();
        let about = |event: DecisionEvent, seq: u64, c: &crate::model::ValidCandidate| {
            let mut d = Decision::new(now, scope, event);
            d.ids.push(scope.record_id(seq));
            d.texts.push(c.text.clone());
            d.source_thread_key = Some(c.source_thread_key.clone());
            d.source_run_id = c.source_run_id.clone();
            d
        };
        for c in valid {
            if let Some(i) = active_index(records, scope, &c.restates) {
                let Some(r) = records.get_mut(&i) else {
                    continue;
                };
                let mut d = about(DecisionEvent::Restated, i, c);
                d.texts.push(r.text.clone());
                journal.push(d);
                r.use_count += 1;
                r.last_used_at = Some(now);
                r.provenance = crate::provenance::merge_provenance(
                    scope.as_str(),
                    r.provenance.as_ref(),
                    c.provenance.as_ref(),
                );
                r.confidence = match (r.confidence, c.confidence) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                };
                counts.restated += 1;
                continue;
            }
            let target = active_index(records, scope, &c.supersedes);
            let norm = &c.norm;
            let hit = match (&c.supersedes, target) {
                _ if !c.dedup => None,
                (None, _) => records
                    .values()
                    .find(|r| {
                        r.status == Status::Active && r.dedup_key && normalize(&r.text) == *norm
                    })
                    .and_then(|r| r.seq()),
                (Some(_), Some(t)) => records
                    .get(&t)
                    .filter(|r| normalize(&r.text) == *norm)
                    .map(|_| t),
                (Some(_), None) => None,
            };
            if let Some((i, r)) = hit.and_then(|i| records.get_mut(&i).map(|r| (i, r))) {
                r.use_count += 1;
                r.provenance = crate::provenance::merge_provenance(
                    scope.as_str(),
                    r.provenance.as_ref(),
                    c.provenance.as_ref(),
                );
                counts.deduped += 1;
                journal.push(about(DecisionEvent::Deduped, i, c));
                continue;
            }
            let seq = records.keys().next_back().map_or(0, |s| s + 1);
            // A correction carries the dependencies of the record it replaces.
            let provenance = match target.and_then(|t| records.get(&t)) {
                Some(old) => crate::provenance::merge_provenance(
                    scope.as_str(),
                    c.provenance.as_ref(),
                    old.provenance.as_ref(),
                ),
                None => c.provenance.clone(),
            };
            records.insert(seq, c.to_record(scope, seq, provenance, now));
            counts.inserted += 1;
            journal.push(about(DecisionEvent::Inserted, seq, c));
            if c.kind == Kind::Summary {
                summaries += 1;
            }
            if let Some(r) = target.and_then(|t| records.get_mut(&t)) {
                r.status = Status::Superseded;
                counts.superseded += 1;
                let mut d = Decision::new(now, scope, DecisionEvent::Superseded);
                d.ids = vec![r.id.clone(), scope.record_id(seq)];
                d.texts = vec![r.text.clone(), c.text.clone()];
                later.push(d);
            }
        }
        journal.append(&mut later);
        for d in evict_over_cap(records, scope, cap, now) {
            counts.evicted += 1;
            journal.push(d);
        }
        state
            .counters
            .entry((day_of(now), scope.clone()))
            .or_default()
            .add_write(&counts, summaries, options.tally.as_ref());
        state
            .decisions
            .entry(scope.clone())
            .or_default()
            .extend(journal);
        Ok(counts)
    }

    fn list(&self, scope: &ScopeKey, query: &ListQuery) -> Result<Vec<Record>> {
        validate_limit(query.limit)?;
        validate_query(query.query.as_deref().unwrap_or(""))?;
        let filter = ListFilter::new(query.query.as_deref());
        let state = self.state.lock();
        Ok(state
            .scopes
            .get(scope)
            .into_iter()
            .flat_map(|rs| rs.values().rev())
            .filter(|r| r.status == Status::Active)
            .filter(|r| query.kind.is_none_or(|k| r.kind == k))
            .filter(|r| filter.keeps(r))
            .take(query.limit)
            .cloned()
            .collect())
    }

    fn retrieve_marked(
        &self,
        scope: &ScopeKey,
        query: &str,
        limit: usize,
    ) -> Result<Vec<crate::model::Retrieved>> {
        validate_limit(limit)?;
        validate_query(query)?;
        let tokens = tokenize(query);
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let terms = crate::fts::match_terms(query);
        let now = (self.clock)();
        let mut state = self.state.lock();
        let Some(records) = state.scopes.get_mut(scope) else {
            return Ok(Vec::new());
        };
        // The reference Worker's prefilter, computed over the scope's active records.
        let pool = crate::fts::pool(
            records
                .iter()
                .filter(|(_, r)| r.status == Status::Active)
                .map(|(seq, r)| (*seq, r.text.as_str(), &r.keywords)),
            &terms,
            crate::fts::pool_size(limit),
        );
        let candidates: Vec<Record> = pool
            .iter()
            .filter_map(|seq| records.get(seq).cloned())
            .collect();
        let ranked = rank(&tokens, candidates, now, limit);
        let mut out = Vec::with_capacity(ranked.len());
        for r in ranked {
            if let Some(stored) = r.seq().and_then(|s| records.get_mut(&s)) {
                let first_use = stored.last_used_at.is_none();
                stored.use_count += 1;
                stored.last_used_at = Some(now);
                out.push(crate::model::Retrieved {
                    record: stored.clone(),
                    first_use,
                });
            }
        }
        Ok(out)
    }

    fn forget(&self, scope: &ScopeKey, id: &str) -> Result<bool> {
        validate_forget_id(id)?;
        let mut state = self.state.lock();
        let now = (self.clock)();
        let Some(records) = state.scopes.get_mut(scope) else {
            return Ok(false);
        };
        let Some(r) =
            active_index(records, scope, &Some(id.to_owned())).and_then(|i| records.get_mut(&i))
        else {
            return Ok(false);
        };
        r.status = Status::Forgotten;
        let mut d = Decision::new(now, scope, DecisionEvent::Forgotten);
        d.ids.push(r.id.clone());
        d.texts.push(r.text.clone());
        state
            .counters
            .entry((day_of(now), scope.clone()))
            .or_default()
            .forgotten += 1;
        state.decisions.entry(scope.clone()).or_default().push(d);
        Ok(true)
    }

    fn sweep(&self, scope: &ScopeKey, dry_run: bool) -> Result<SweepReceipt> {
        let mut state = self.state.lock();
        let now = (self.clock)();
        let mut receipt = SweepReceipt::default();
        let Some(records) = state.scopes.get_mut(scope) else {
            return Ok(receipt);
        };
        let mut journal = Vec::new();
        for r in records.values_mut() {
            if r.status == Status::Active && r.kind == Kind::Fact && crate::gate::is_status(&r.text)
            {
                receipt.ids.push(r.id.clone());
                if !dry_run {
                    r.status = Status::Swept;
                    let mut d = Decision::new(now, scope, DecisionEvent::Swept);
                    d.ids.push(r.id.clone());
                    d.texts.push(r.text.clone());
                    d.markers = crate::gate::rejection_marker_names(&r.text)
                        .into_iter()
                        .map(str::to_owned)
                        .collect();
                    journal.push(d);
                }
            }
        }
        state
            .decisions
            .entry(scope.clone())
            .or_default()
            .extend(journal);
        receipt.swept = receipt.ids.len() as u64;
        if !dry_run && receipt.swept > 0 {
            state
                .counters
                .entry((day_of(now), scope.clone()))
                .or_default()
                .swept += receipt.swept;
        }
        Ok(receipt)
    }

    fn get(&self, id: &str) -> Result<Option<Record>> {
        let Some(RecordId { scope, seq }) = RecordId::parse(id) else {
            return Ok(None);
        };
        let state = self.state.lock();
        Ok(state
            .scopes
            .get(&scope)
            .and_then(|rs| rs.get(&seq))
            .cloned())
    }

    fn scopes(&self) -> Result<Vec<ScopeKey>> {
        Ok(self.state.lock().scopes.keys().cloned().collect())
    }

    fn export(&self, sink: &mut dyn FnMut(Record) -> Result<()>) -> Result<()> {
        let all: Vec<Record> = self
            .state
            .lock()
            .scopes
            .values()
            .flat_map(|rs| rs.values())
            .cloned()
            .collect();
        for r in all {
            sink(r)?;
        }
        Ok(())
    }

    fn import(&self, records: &[Record]) -> Result<ImportReport> {
        let (groups, repeats) = group_import(records)?;
        let mut state = self.state.lock();
        let mut report = ImportReport {
            skipped: repeats,
            ..ImportReport::default()
        };
        for (scope, list) in groups {
            let held = state.scopes.entry(scope.clone()).or_default();
            for (seq, r) in list {
                if held.contains_key(&seq) {
                    report.skipped += 1;
                    continue;
                }
                held.insert(seq, r.clone());
                report.imported += 1;
            }
        }
        Ok(report)
    }

    fn active_count(&self, scope: &ScopeKey) -> Result<u64> {
        let state = self.state.lock();
        Ok(state.scopes.get(scope).map_or(0, |rs| {
            rs.values().filter(|r| r.status == Status::Active).count() as u64
        }))
    }

    fn decisions(&self, scope: &ScopeKey, query: &DecisionQuery) -> Result<Vec<Decision>> {
        validate_decision_query(query)?;
        let state = self.state.lock();
        Ok(state
            .decisions
            .get(scope)
            .into_iter()
            .flat_map(|list| list.iter().rev())
            .filter(|d| query.keeps(d))
            .take(query.limit)
            .cloned()
            .collect())
    }

    fn export_decisions(&self, sink: &mut dyn FnMut(Decision) -> Result<()>) -> Result<()> {
        let all: Vec<Decision> = {
            let state = self.state.lock();
            state
                .decisions
                .values()
                .flat_map(|list| list.iter())
                .cloned()
                .collect()
        };
        for d in all {
            sink(d)?;
        }
        Ok(())
    }

    fn import_decisions(&self, entries: &[Decision]) -> Result<u64> {
        for d in entries {
            d.validate()?;
        }
        let mut state = self.state.lock();
        for d in entries {
            state
                .decisions
                .entry(d.scope_key.clone())
                .or_default()
                .push(d.clone());
        }
        Ok(entries.len() as u64)
    }

    fn stats(&self, since: i64) -> Result<Vec<DayStats>> {
        let state = self.state.lock();
        Ok(state
            .counters
            .iter()
            .filter(|((day, _), _)| *day >= since)
            .map(|((day, scope), c)| DayStats {
                day: format_day(*day),
                scope_key: scope.clone(),
                counters: c.clone(),
            })
            .collect())
    }
}
