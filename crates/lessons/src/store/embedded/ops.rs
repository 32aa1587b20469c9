//! The `MemoryStore` contract over fjall and tantivy. Each method validates, then hands over:
//! a write to `write`, a retrieve to `retrieve`; the rest (list, forget, sweep, get, scopes,
//! export, import, stats, the journal) are short enough to read here.

use super::group::Ticket;
use super::scope_tx;
use super::shared::Shared;
use super::window::WINDOW_LEN;
use super::EmbeddedStore;
use crate::decisions::{Decision, DecisionEvent, DecisionQuery};
use crate::error::Result;
use crate::model::{Kind, Record, RecordId, Retrieved, ScopeKey, WriteCounts};
use crate::store::api::MemoryStore;
use crate::store::codec;
use crate::store::counters::DayStats;
use crate::store::upkeep::{MemoryUse, Upkeep};
use crate::store::validate::{
    group_import, validate_decision_query, validate_forget_id, validate_limit, validate_query,
    ListFilter,
};
use crate::store::values::{ImportReport, ListQuery, SweepReceipt, Window, WriteOptions};
use crate::store::CheckedWrite;
use crate::time::format_day;

/// Retired records an export reads from one snapshot: a few seconds of reading, so the
/// memtables it keeps alive stay within tens of megabytes under a busy writer.
const EXPORT_SNAPSHOT_RECORDS: usize = 20_000;

impl MemoryStore for EmbeddedStore {
    fn write_checked(
        &self,
        write: &CheckedWrite<'_>,
        options: &WriteOptions,
    ) -> Result<WriteCounts> {
        super::write::write(&self.shared, write, options)
    }

    fn list(&self, scope: &ScopeKey, query: &ListQuery) -> Result<Vec<Record>> {
        validate_limit(query.limit)?;
        validate_query(query.query.as_deref().unwrap_or(""))?;
        let s = &*self.shared;
        // The window (newest facts, no query) comes from the scope's decoded window.
        if query.is_window() && query.limit <= WINDOW_LEN {
            return Ok(Window::new(s.scopes.window(&s.records, scope)?, query.limit).to_records());
        }
        list_scan(s, scope, query)
    }

    fn window(&self, scope: &ScopeKey, limit: usize) -> Result<Window> {
        validate_limit(limit)?;
        // `WINDOW_LEN` is the largest valid limit, so the decoded window always suffices.
        let s = &*self.shared;
        Ok(Window::new(s.scopes.window(&s.records, scope)?, limit))
    }

    fn retrieve_marked(
        &self,
        scope: &ScopeKey,
        query: &str,
        limit: usize,
    ) -> Result<Vec<Retrieved>> {
        super::retrieve::retrieve(&self.shared, scope, query, limit)
    }

    fn forget(&self, scope: &ScopeKey, id: &str) -> Result<bool> {
        validate_forget_id(id)?;
        let s = &*self.shared;
        let Some(RecordId { scope: sc, seq }) = RecordId::parse(id) else {
            return Ok(false);
        };
        if &sc != scope {
            return Ok(false);
        }
        scope_tx::change(s, scope, |tx| {
            let Some(old) = s.records.load_active(scope, seq)? else {
                return Ok(false);
            };
            tx.retire_for(&old, seq, DecisionEvent::Forgotten)?;
            Ok(true)
        })
    }

    fn sweep(&self, scope: &ScopeKey, dry_run: bool) -> Result<SweepReceipt> {
        let s = &*self.shared;
        // Facts up to the scope's gate mark are known not to be status: only newer ones are
        // read, so a sweep of a scope swept before costs what was written since.
        let marked = |snapshot: Option<&fjall::Snapshot>,
                      known: Option<u64>|
         -> Result<(Vec<Record>, Option<u64>)> {
            let (mut marked, newest) =
                s.records
                    .active_facts_where(snapshot, scope, known, crate::gate::is_status)?;
            // The scan reads newest first; the answer lists ids in ascending sequence.
            marked.reverse();
            Ok((marked, newest))
        };
        let receipt = |marked: &[Record]| SweepReceipt {
            swept: marked.len() as u64,
            ids: marked.iter().map(|r| r.id.clone()).collect(),
        };
        let state = s.scopes.get(scope);
        // One snapshot first, without the scope's lock: a dry run answers from it, and a sweep
        // with nothing to retire (the usual case: the gate keeps status out of new writes) is
        // done without making the scope's writers wait for a read of its records.
        let (known, commits) = state.gate_mark();
        let (seen, newest) = marked(Some(&s.records.snapshot()), known)?;
        if seen.is_empty() {
            if let Some(newest) = newest {
                state.mark_gated(commits, newest);
            }
            return Ok(receipt(&seen));
        }
        if dry_run {
            return Ok(receipt(&seen));
        }
        scope_tx::change(s, scope, |tx| {
            // Under the scope's lock, settled: the usage read live matches the records (a
            // swept record keeps its use in its retired copy), and the mark matches them too.
            let (known, _) = tx.state().gate_mark();
            let (marked, _) = marked(None, known)?;
            for r in &marked {
                let Some(seq) = r.seq() else { continue };
                tx.retire_for(r, seq, DecisionEvent::Swept)?;
            }
            Ok(receipt(&marked))
        })
    }

    fn get(&self, id: &str) -> Result<Option<Record>> {
        match RecordId::parse(id) {
            Some(RecordId { scope, seq }) => {
                self.shared.scopes.settle(&scope);
                self.shared.records.load_any(&scope, seq)
            }
            None => Ok(None),
        }
    }

    fn scopes(&self) -> Result<Vec<ScopeKey>> {
        Ok(self.shared.records.all_scopes()?.into_iter().collect())
    }

    fn export(&self, sink: &mut dyn FnMut(Record) -> Result<()>) -> Result<()> {
        // Every use retrieved before the export began is in what it reads.
        self.shared.uses.drained();
        let records = &self.shared.records;
        for scope in self.scopes()? {
            // Oldest first: the retired records stream in key (sequence) order and the active
            // ones (at most the cap) are merged in, so an export holds one scope's active
            // records, never its history, however long the store has lived.
            let mut snap = records.snapshot();
            let mut active = records.active_of(Some(&snap), &scope, None)?;
            active.sort_unstable_by_key(|r| std::cmp::Reverse(r.seq()));
            // A snapshot keeps every memtable written after it in memory until it is dropped,
            // so the history is read from a fresh one every `EXPORT_SNAPSHOT_RECORDS`, on from
            // the last key read. A record retired since the active ones were read then shows
            // in its retired state only; one already exported as active is behind the last
            // key and is not read again. Either way each record is exported once.
            let mut after = None;
            loop {
                let mut read = 0;
                for retired in records.retired_of(&snap, &scope, after.take()) {
                    let (key, retired) = retired?;
                    while let Some(a) = active.pop_if(|a| a.seq() <= retired.seq()) {
                        if a.seq() != retired.seq() {
                            sink(a)?;
                        }
                    }
                    sink(retired)?;
                    after = Some(key);
                    read += 1;
                    if read == EXPORT_SNAPSHOT_RECORDS {
                        break;
                    }
                }
                if read < EXPORT_SNAPSHOT_RECORDS {
                    break;
                }
                snap = records.snapshot();
            }
            while let Some(a) = active.pop() {
                sink(a)?;
            }
        }
        Ok(())
    }

    fn import(&self, records: &[Record]) -> Result<ImportReport> {
        let (groups, repeats) = group_import(records)?;
        let s = &*self.shared;
        let mut report = ImportReport {
            skipped: repeats,
            ..ImportReport::default()
        };
        // One batch per scope, and one fsync for them all at the end: an import acknowledges
        // nothing before it returns.
        let mut durable = Ticket::none();
        for (scope, list) in groups {
            let ((), ticket) = scope_tx::change_unsettled(s, scope, |tx| {
                for (seq, r) in list {
                    if s.records.holds(scope, seq)? {
                        report.skipped += 1;
                        continue;
                    }
                    tx.insert(r, seq)?;
                    report.imported += 1;
                }
                Ok(())
            })?;
            durable = durable.and(ticket);
        }
        scope_tx::settle(s, durable)?;
        Ok(report)
    }

    fn active_count(&self, scope: &ScopeKey) -> Result<u64> {
        // The bookkeeping is written in the same batch as the records it counts, so it is
        // read, not derived: one point read, not a scan of the scope. (`doctor` compares the
        // two; a scope with no bookkeeping yet is counted.)
        let records = &self.shared.records;
        match records.stored_meta(scope)? {
            Some(meta) => Ok(meta.active),
            None => Ok(records.derive_meta(scope)?.active),
        }
    }

    fn decisions(&self, scope: &ScopeKey, query: &DecisionQuery) -> Result<Vec<Decision>> {
        validate_decision_query(query)?;
        let s = &*self.shared;
        s.journal.read(&s.group, &s.records, scope, query)
    }

    fn visit_decisions(
        &self,
        scope: &ScopeKey,
        query: &DecisionQuery,
        _page: usize,
        visit: &mut dyn FnMut(Decision) -> bool,
    ) -> Result<()> {
        validate_decision_query(query)?;
        let s = &*self.shared;
        s.journal.visit(&s.group, &s.records, scope, query, visit)
    }

    fn export_decisions(&self, sink: &mut dyn FnMut(Decision) -> Result<()>) -> Result<()> {
        self.shared.journal.export(&self.shared.records, sink)
    }

    fn memory(&self) -> Option<MemoryUse> {
        let s = &*self.shared;
        let (scope_map, scope_map_budget) = s.scopes.bytes();
        Some(MemoryUse {
            memtables: s.records.db().write_buffer_size(),
            block_cache: s.records.db().cache_size(),
            block_cache_capacity: s.records.db().cache_capacity(),
            scope_map: scope_map as u64,
            scope_map_budget: scope_map_budget as u64,
            index_writer_heap: crate::store::index::WRITER_HEAP as u64,
            index_pending_changes: s.queue.pending_changes() as u64,
        })
    }

    fn now(&self) -> crate::time::Millis {
        (self.shared.clock)()
    }

    fn upkeep(&self) -> Option<Upkeep> {
        let s = &*self.shared;
        let db = s.records.db();
        Some(Upkeep {
            flushes_waiting: db.outstanding_flushes() as u64,
            compactions_running: db.active_compactions() as u64,
            compactions_done: db.compactions_completed() as u64,
            compacting_micros: u64::try_from(db.time_compacting().as_micros()).unwrap_or(u64::MAX),
            index_pending_changes: s.queue.pending_changes() as u64,
            journals_to_count: s.journal.uncounted() as u64,
            uses_waiting: s.uses.waiting(),
            journal_syncs: s.group.sync_times(),
        })
    }

    fn import_decisions(&self, entries: &[Decision]) -> Result<u64> {
        self.shared.witness.refuse_if_damaged()?;
        self.shared.journal.import(&self.shared.group, entries)
    }

    fn stats(&self, since: i64) -> Result<Vec<DayStats>> {
        Ok(self
            .shared
            .records
            .counters_since(since)?
            .into_iter()
            .map(|(day, scope_key, counters)| DayStats {
                day: format_day(day),
                scope_key,
                counters,
            })
            .collect())
    }
}

/// `list` by scanning the records: of one kind, or both merged newest first, from one
/// snapshot (so each record comes with its own use), filtered before the limit.
fn list_scan(s: &Shared, scope: &ScopeKey, query: &ListQuery) -> Result<Vec<Record>> {
    s.scopes.settle(scope);
    let filter = ListFilter::new(query.query.as_deref());
    let snap = s.records.snapshot();
    let mut out = Vec::with_capacity(query.limit);
    let scan = |kind| {
        s.records
            .scan(Some(&snap), scope, &codec::active_prefix(scope, kind))
    };
    if let Some(kind) = query.kind {
        for r in scan(kind)? {
            let r = r?;
            if filter.keeps(&r) {
                out.push(r);
                if out.len() == query.limit {
                    break;
                }
            }
        }
        return Ok(out);
    }
    let mut facts = scan(Kind::Fact)?.peekable();
    let mut sums = scan(Kind::Summary)?.peekable();
    while out.len() < query.limit {
        let newer_fact = match (facts.peek(), sums.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            // An error is taken first, to be returned.
            (Some(Err(_)), _) => true,
            (_, Some(Err(_))) => false,
            (Some(Ok(f)), Some(Ok(m))) => f.seq() > m.seq(),
        };
        let next = if newer_fact {
            facts.next()
        } else {
            sums.next()
        };
        if let Some(r) = next.transpose()?.filter(|r| filter.keeps(r)) {
            out.push(r);
        }
    }
    Ok(out)
}
