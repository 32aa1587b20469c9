//! The `MemoryStore` contract over fjall and tantivy: write, list, retrieve, forget, sweep,
//! get, scopes, export, import, stats. Retrieve's steps (search, pool, rank, usage) are
//! `retrieve.rs`'s; the trait's method hands over to them.

use std::collections::HashMap;

use fjall::Readable;

use super::super::codec::{self, ScopeMeta};
use super::super::{
    validate_limit, validate_query, validate_write, DayStats, ImportReport, ListQuery, MemoryStore,
    SweepReceipt, Window, WriteOptions,
};
use super::commit::Ticket;
use super::records::with_status;
use super::{st, EmbeddedStore, Shared};
use crate::decisions::{Decision, DecisionEvent, DecisionQuery};
use crate::error::{Error, ErrorKind, Result};
use crate::model::{
    Candidate, Kind, Record, RecordId, ScopeKey, Status, ValidCandidate, WriteCounts,
};
use crate::store::index::IndexOp;
use crate::store::plan::{self};
use crate::text::normalize;
use crate::time::format_day;

impl MemoryStore for EmbeddedStore {
    fn write(
        &self,
        scope: &ScopeKey,
        candidates: &[Candidate],
        options: &WriteOptions,
    ) -> Result<WriteCounts> {
        let s = &*self.shared;
        let (valid, cap) = validate_write(scope, candidates, options, s.cap)?;
        if valid.is_empty() && options.tally.is_none() {
            return Ok(WriteCounts::default());
        }
        s.refuse_if_damaged()?;
        let state = s.scopes.get(scope);
        let guard = state.write.lock();
        let now = (s.clock)();
        let meta = s.scope_meta(scope, &state)?;
        let (snapshot, mut read) = s.read_for_plan(scope, &state, &meta, &valid, cap)?;
        let mut plan = plan::plan_write(scope, &snapshot, &valid, now, cap);
        if !s.read_evicted(scope, &mut plan, &mut read)? {
            // The order in memory named a record that is not active: plan again from an order
            // rebuilt from the records.
            log::warn!("[store] {scope}: the eviction order was behind the records; rebuilt");
            s.scopes.update(scope, &state, |d| d.order = None);
            let (snapshot, again) = s.read_for_plan(scope, &state, &meta, &valid, cap)?;
            read = again;
            plan = plan::plan_write(scope, &snapshot, &valid, now, cap);
            if !s.read_evicted(scope, &mut plan, &mut read)? {
                return Err(Error::new(
                    ErrorKind::Damaged,
                    format!(
                        "{scope}: a record to evict is not active; run `lessons doctor --repair`"
                    ),
                ));
            }
        }
        let at = Target {
            scope,
            state: &state,
            meta: &meta,
        };
        let ticket = s.apply_plan(at, &valid, &plan, read, now, options)?;
        drop(guard);
        s.wait_durable(ticket)?;
        s.index_backpressure();
        Ok(plan.counts)
    }

    fn list(&self, scope: &ScopeKey, query: &ListQuery) -> Result<Vec<Record>> {
        validate_limit(query.limit)?;
        validate_query(query.query.as_deref().unwrap_or(""))?;
        let filter = super::super::ListFilter::new(query.query.as_deref());
        let s = &*self.shared;
        // The window (newest facts, no query) comes from the scope's decoded window.
        if query.is_window() && query.limit <= super::WINDOW_LEN {
            return Ok(Window::new(s.window(scope)?, query.limit).to_records());
        }
        let keep = |r: &Record| filter.keeps(r);
        let mut out = Vec::with_capacity(query.limit);
        // Unlocked: every read below is of one snapshot, so each record comes with its own use.
        let snap = s.db.snapshot();
        if let Some(kind) = query.kind {
            let prefix = codec::active_prefix(scope, kind);
            let usage = s.usage_overlay(snap.prefix(&s.ks.usage, &prefix))?;
            for g in snap.prefix(&s.ks.active, &prefix) {
                let (k, v) = g.into_inner().map_err(st("reading records"))?;
                let r = usage.record(&k, &v, scope)?;
                if keep(&r) {
                    out.push(r);
                    if out.len() == query.limit {
                        break;
                    }
                }
            }
            return Ok(out);
        }
        // Both kinds, newest first: merge two newest-first scans of one consistent snapshot.
        let usage = s.usage_overlay(snap.prefix(&s.ks.usage, codec::scope_key_prefix(scope)))?;
        let mut facts = snap
            .prefix(&s.ks.active, codec::active_prefix(scope, Kind::Fact))
            .peekable();
        let mut sums = snap
            .prefix(&s.ks.active, codec::active_prefix(scope, Kind::Summary))
            .peekable();
        let mut next_fact: Option<Record> = None;
        let mut next_sum: Option<Record> = None;
        while out.len() < query.limit {
            if next_fact.is_none() {
                if let Some(g) = facts.next() {
                    let (k, v) = g.into_inner().map_err(st("reading records"))?;
                    next_fact = Some(usage.record(&k, &v, scope)?);
                }
            }
            if next_sum.is_none() {
                if let Some(g) = sums.next() {
                    let (k, v) = g.into_inner().map_err(st("reading records"))?;
                    next_sum = Some(usage.record(&k, &v, scope)?);
                }
            }
            let take_fact = match (&next_fact, &next_sum) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some(f), Some(m)) => f.seq() > m.seq(),
            };
            let r = if take_fact {
                next_fact.take()
            } else {
                next_sum.take()
            };
            if let Some(r) = r.filter(|r| keep(r)) {
                out.push(r);
            }
        }
        Ok(out)
    }

    fn window(&self, scope: &ScopeKey, limit: usize) -> Result<Window> {
        validate_limit(limit)?;
        // `WINDOW_LEN` is the largest valid limit, so the decoded window always suffices.
        Ok(Window::new(self.shared.window(scope)?, limit))
    }

    fn retrieve(&self, scope: &ScopeKey, query: &str, limit: usize) -> Result<Vec<Record>> {
        Ok(crate::model::Retrieved::records(
            self.retrieve_marked(scope, query, limit)?,
        ))
    }

    fn retrieve_marked(
        &self,
        scope: &ScopeKey,
        query: &str,
        limit: usize,
    ) -> Result<Vec<crate::model::Retrieved>> {
        self.shared.retrieve_marked(scope, query, limit)
    }

    fn forget(&self, scope: &ScopeKey, id: &str) -> Result<bool> {
        crate::store::validate_forget_id(id)?;
        let s = &*self.shared;
        let Some(RecordId { scope: sc, seq }) = RecordId::parse(id) else {
            return Ok(false);
        };
        if &sc != scope {
            return Ok(false);
        }
        s.refuse_if_damaged()?;
        let state = s.scopes.get(scope);
        let guard = state.write.lock();
        let Some(old) = s.load_active(scope, seq)? else {
            return Ok(false);
        };
        let now = (s.clock)();
        let mut meta = s.scope_meta(scope, &state)?;
        let mut tx = s.tx(&state);
        s.retire(&mut tx, &old, &with_status(&old, Status::Forgotten), seq)?;
        meta.active = meta.active.saturating_sub(1);
        tx.meta = Some(meta);
        s.add_day(&mut tx, scope, now, |d| d.forgotten += 1)?;
        s.journal_tx(
            &mut tx,
            &[super::decisions::of_retire(
                now,
                &old,
                DecisionEvent::Forgotten,
            )],
        )?;
        let ticket = s.commit_with_outbox(
            scope,
            &state,
            tx,
            vec![IndexOp::Delete { id: old.id.clone() }],
        )?;
        drop(guard);
        s.wait_durable(ticket)?;
        Ok(true)
    }

    fn sweep(&self, scope: &ScopeKey, dry_run: bool) -> Result<SweepReceipt> {
        let s = &*self.shared;
        let state = s.scopes.get(scope);
        let guard = state.write.lock();
        let mut marked = Vec::new();
        let prefix = codec::active_prefix(scope, Kind::Fact);
        // Under the scope's lock: the usage read live matches the records (a swept record
        // keeps its use in its retired copy).
        let usage = s.usage_overlay(s.ks.usage.prefix(&prefix))?;
        for g in s.ks.active.prefix(&prefix) {
            let (k, v) = g.into_inner().map_err(st("reading records"))?;
            let r = usage.record(&k, &v, scope)?;
            if crate::gate::is_status(&r.text) {
                marked.push(r);
            }
        }
        // The scan reads newest first; the answer lists ids in ascending sequence.
        marked.reverse();
        let receipt = SweepReceipt {
            swept: marked.len() as u64,
            ids: marked.iter().map(|r| r.id.clone()).collect(),
        };
        if dry_run || marked.is_empty() {
            return Ok(receipt);
        }
        s.refuse_if_damaged()?;
        let now = (s.clock)();
        let mut meta = s.scope_meta(scope, &state)?;
        let mut tx = s.tx(&state);
        let mut ops = Vec::new();
        for r in &marked {
            let Some(seq) = r.seq() else { continue };
            s.retire(&mut tx, r, &with_status(r, Status::Swept), seq)?;
            ops.push(IndexOp::Delete { id: r.id.clone() });
        }
        meta.active = meta.active.saturating_sub(marked.len() as u64);
        tx.meta = Some(meta);
        s.add_day(&mut tx, scope, now, |d| d.swept += receipt.swept)?;
        let swept: Vec<_> = marked
            .iter()
            .map(|r| super::decisions::of_retire(now, r, DecisionEvent::Swept))
            .collect();
        s.journal_tx(&mut tx, &swept)?;
        let ticket = s.commit_with_outbox(scope, &state, tx, ops)?;
        drop(guard);
        s.wait_durable(ticket)?;
        Ok(receipt)
    }

    fn get(&self, id: &str) -> Result<Option<Record>> {
        match RecordId::parse(id) {
            Some(RecordId { scope, seq }) => self.shared.load_any(&scope, seq),
            None => Ok(None),
        }
    }

    fn scopes(&self) -> Result<Vec<ScopeKey>> {
        Ok(self.shared.all_scopes()?.into_iter().collect())
    }

    fn export(&self, sink: &mut dyn FnMut(Record) -> Result<()>) -> Result<()> {
        let s = &*self.shared;
        let snap = s.db.snapshot();
        for scope in self.scopes()? {
            let prefix = codec::scope_key_prefix(&scope);
            let mut records = Vec::new();
            let usage = s.usage_overlay(snap.prefix(&s.ks.usage, &prefix))?;
            for g in snap.prefix(&s.ks.active, &prefix) {
                let (k, v) = g.into_inner().map_err(st("reading records"))?;
                records.push(usage.record(&k, &v, &scope)?);
            }
            for g in snap.prefix(&s.ks.retired, &prefix) {
                records.push(codec::decode_record(
                    &g.value().map_err(st("reading records"))?,
                    Some(&scope),
                )?);
            }
            records.sort_by_key(|r| r.seq());
            for r in records {
                sink(r)?;
            }
        }
        Ok(())
    }

    fn import(&self, records: &[Record]) -> Result<ImportReport> {
        let (groups, repeats) = super::super::group_import(records)?;
        let s = &*self.shared;
        s.refuse_if_damaged()?;
        let mut report = ImportReport {
            skipped: repeats,
            ..ImportReport::default()
        };
        // One batch per scope, and one fsync for them all at the end: an import acknowledges
        // nothing before it returns.
        let mut durable = super::commit::Ticket::none();
        for (scope, list) in groups {
            let state = s.scopes.get(scope);
            let guard = state.write.lock();
            let mut meta = s.scope_meta(scope, &state)?;
            let mut tx = s.tx(&state);
            let mut ops = Vec::new();
            for (seq, r) in list {
                if s.holds(scope, seq)? {
                    report.skipped += 1;
                    continue;
                }
                if r.status == Status::Active {
                    s.put_active(&mut tx, r, seq)?;
                    meta.active += 1;
                    ops.push(Shared::upsert_op(r));
                } else {
                    tx.batch.insert(
                        &s.ks.retired,
                        codec::retired_key(scope, seq),
                        codec::encode_record(r, seq)?,
                    );
                }
                meta.next_seq = meta.next_seq.max(seq + 1);
                report.imported += 1;
            }
            tx.meta = Some(meta);
            durable = durable.and(s.commit_with_outbox(scope, &state, tx, ops)?);
            drop(guard);
        }
        s.wait_durable(durable)?;
        s.index_backpressure();
        Ok(report)
    }

    fn active_count(&self, scope: &ScopeKey) -> Result<u64> {
        Ok(self.shared.derive_meta(scope)?.active)
    }

    fn decisions(&self, scope: &ScopeKey, query: &DecisionQuery) -> Result<Vec<Decision>> {
        super::super::validate_decision_query(query)?;
        self.shared.read_decisions(scope, query)
    }

    fn export_decisions(&self, sink: &mut dyn FnMut(Decision) -> Result<()>) -> Result<()> {
        self.shared.export_decisions(sink)
    }

    fn import_decisions(&self, entries: &[Decision]) -> Result<u64> {
        self.shared.refuse_if_damaged()?;
        self.shared.import_decisions(entries)
    }

    fn stats(&self, since: i64) -> Result<Vec<DayStats>> {
        let mut out = Vec::new();
        for g in self.shared.ks.counters.range(codec::counters_from(since)..) {
            let (k, v) = g.into_inner().map_err(st("reading counters"))?;
            let (day, scope) = codec::parse_counters_key(&k)
                .ok_or_else(|| Error::format("a counters key does not parse"))?;
            out.push(DayStats {
                day: format_day(day),
                scope_key: scope,
                counters: codec::decode(&v, "a day's counters")?,
            });
        }
        Ok(out)
    }
}

impl Shared {
    /// Reads exactly what the planner can need for `valid` (point lookups: one dedup key per
    /// normalized text, never a scan): the snapshot, and the records it was built from.
    fn read_for_plan(
        &self,
        scope: &ScopeKey,
        state: &super::scopes::Scope,
        meta: &ScopeMeta,
        valid: &[ValidCandidate],
        cap: usize,
    ) -> Result<(plan::Snapshot, Read)> {
        let s = self;
        // Read exactly what the planner can need.
        let needs = plan::needs(scope, valid, meta.active as usize, cap);
        let mut loaded: HashMap<u64, Record> = HashMap::new();
        let mut snapshot = plan::Snapshot {
            next_seq: meta.next_seq,
            active_count: meta.active as usize,
            ..plan::Snapshot::default()
        };
        for &seq in &needs.seqs {
            if let Some(r) = s.load_active(scope, seq)? {
                snapshot.records.insert(seq, Shared::meta_of(&r, seq));
                loaded.insert(seq, r);
            }
        }
        let mut norms = std::collections::BTreeMap::new();
        for norm in &needs.norms {
            let mut hits = Vec::new();
            // One point read: a miss is usually answered by the tables' bloom filters. What it
            // read seeds the write's transaction, so an insert does not read the key again.
            let key = codec::norm_key(scope, norm);
            let seqs = s.dedup_key(&key)?;
            for &seq in &seqs {
                if let Some(r) = s.load_active(scope, seq)? {
                    // The key is a hash: confirm the text really normalizes to `norm`.
                    if normalize(&r.text) == *norm {
                        hits.push(Shared::meta_of(&r, seq));
                        loaded.insert(seq, r);
                    }
                }
            }
            hits.sort_by_key(|m| m.seq);
            snapshot.by_norm.insert(norm.clone(), hits);
            norms.insert(key, (seqs, false));
        }
        if needs.eviction_head > 0 {
            // The planner orders the head by its eviction key alone, which the scope's order in
            // memory holds; the records it does evict are read once it has chosen them
            // (`read_evicted`), which is about half the head.
            for key in s.eviction_head(scope, state, needs.eviction_head)? {
                let seq = key.2;
                snapshot.eviction_head.push(match loaded.get(&seq) {
                    Some(r) => Shared::eviction_meta_of(r, seq),
                    None => order_meta(key),
                });
            }
        }

        Ok((
            snapshot,
            Read {
                records: loaded,
                dedup_keys: norms,
            },
        ))
    }

    /// Reads each record the plan evicts that `read_for_plan` did not, and gives its place in
    /// the plan the record's own metadata: the plan then is exactly the one planned from the
    /// records themselves, since an evicted record is otherwise untouched and its eviction key
    /// is the order's.
    /// False when one of them is not active (the order was behind the records).
    fn read_evicted(
        &self,
        scope: &ScopeKey,
        plan: &mut plan::Plan,
        read: &mut Read,
    ) -> Result<bool> {
        for (&seq, touched) in plan.existing_changes_mut() {
            if touched.status != Status::Evicted || read.records.contains_key(&seq) {
                continue;
            }
            let Some(r) = self.load_active(scope, seq)? else {
                return Ok(false);
            };
            debug_assert_eq!(
                touched.meta.eviction_key(),
                Shared::eviction_meta_of(&r, seq).eviction_key()
            );
            touched.meta = Shared::eviction_meta_of(&r, seq);
            read.records.insert(seq, r);
        }
        Ok(true)
    }

    /// Turns a plan into one transaction (records, bookkeeping, the day's counters, the
    /// outbox entry) and appends it; returns the ticket to wait on for durability.
    fn apply_plan(
        &self,
        at: Target<'_>,
        valid: &[ValidCandidate],
        plan: &plan::Plan,
        read: Read,
        now: i64,
        options: &WriteOptions,
    ) -> Result<Ticket> {
        let loaded = &read.records;
        let s = self;
        let Target { scope, state, meta } = at;
        let mut tx = s.tx(state);
        tx.norms = read.dedup_keys;
        let mut index_ops: Vec<IndexOp> = Vec::new();
        let mut active = meta.active;
        let provenance = merged_provenance(scope, valid, plan, loaded);
        for (&seq, touched) in plan.existing_changes() {
            let Some(old) = loaded.get(&seq) else {
                return Err(Error::new(
                    ErrorKind::Storage,
                    format!("planned a change to unread record {seq}"),
                ));
            };
            let mut new = old.clone();
            new.use_count = touched.meta.use_count;
            new.last_used_at = touched.meta.last_used_at;
            new.confidence = touched.meta.confidence;
            new.status = touched.status;
            if let Some(p) = provenance.get(&seq) {
                new.provenance = p.clone();
            }
            if touched.status == Status::Active {
                s.update_active(&mut tx, old, &new, seq)?;
            } else {
                s.retire(&mut tx, old, &new, seq)?;
                active -= 1;
                index_ops.push(IndexOp::Delete { id: old.id.clone() });
            }
        }
        let mut summaries = 0;
        for insert in &plan.inserts {
            let (Some(c), Some(touched)) =
                (valid.get(insert.candidate), plan.touched.get(&insert.seq))
            else {
                continue;
            };
            let provenance = provenance
                .get(&insert.seq)
                .cloned()
                .unwrap_or_else(|| c.provenance.clone());
            let r = Record {
                last_used_at: touched.meta.last_used_at,
                use_count: touched.meta.use_count,
                confidence: touched.meta.confidence,
                status: touched.status,
                ..c.to_record(scope, insert.seq, provenance, now)
            };
            // The bookkeeping was checked against the records, so this cannot fire unless the
            // store changed under us; a write must never replace a record, whatever happened.
            if s.holds(scope, insert.seq)? {
                return Err(Error::new(
                    ErrorKind::Damaged,
                    format!(
                        "refusing to overwrite {}: the scope's bookkeeping is behind its records; run `lessons doctor --repair`",
                        scope.record_id(insert.seq)
                    ),
                ));
            }
            if c.kind == Kind::Summary {
                summaries += 1;
            }
            if touched.status == Status::Active {
                s.put_active(&mut tx, &r, insert.seq)?;
                active += 1;
                index_ops.push(Shared::upsert_op(&r));
            } else {
                tx.batch.insert(
                    &s.ks.retired,
                    codec::retired_key(scope, insert.seq),
                    codec::encode_record(&r, insert.seq)?,
                );
            }
        }
        let new_meta = ScopeMeta {
            next_seq: plan.next_seq,
            active,
        };
        if new_meta != *meta {
            tx.meta = Some(new_meta);
        }
        s.add_day(&mut tx, scope, now, |d| {
            d.add_write(&plan.counts, summaries, options.tally.as_ref())
        })?;
        s.journal_tx(
            &mut tx,
            &super::decisions::of_write(scope, now, valid, plan, loaded, &options.rejected),
        )?;
        s.commit_with_outbox(scope, state, tx, index_ops)
    }
}

/// What the planner needs of a record in the eviction head, from its key in the scope's order:
/// the eviction key's fields. The rest is filled from the record if the plan evicts it.
fn order_meta((used, created_at, seq): super::order::LruKey) -> plan::ActiveMeta {
    plan::ActiveMeta {
        seq,
        norm: String::new(),
        dedup_key: false,
        created_at,
        // `used` is `last_used_at`, or `created_at` for a record never used: either reads as
        // the same eviction key.
        last_used_at: (used != created_at).then_some(used),
        use_count: 0,
        confidence: None,
    }
}

/// What a write read to plan: the records it may change, and the dedup keys it looked up.
struct Read {
    records: HashMap<u64, Record>,
    dedup_keys: super::commit::DedupKeys,
}

/// The scope a write applies to: its key, its state in memory (whose write lock the writer
/// holds) and its checked bookkeeping.
#[derive(Clone, Copy)]
struct Target<'a> {
    scope: &'a ScopeKey,
    state: &'a super::scopes::Scope,
    meta: &'a ScopeMeta,
}

/// Each record's provenance after the write, for every record a candidate landed on: a dedup
/// or restate unions the candidate's dependencies into its target's, and a correction carries
/// the dependencies of the record it supersedes; candidates apply in order.
fn merged_provenance(
    scope: &ScopeKey,
    valid: &[ValidCandidate],
    plan: &plan::Plan,
    loaded: &HashMap<u64, Record>,
) -> HashMap<u64, Option<serde_json::Value>> {
    let mut out: HashMap<u64, Option<serde_json::Value>> = HashMap::new();
    let current = |out: &HashMap<u64, Option<serde_json::Value>>, seq: u64| {
        out.get(&seq)
            .cloned()
            .unwrap_or_else(|| loaded.get(&seq).and_then(|r| r.provenance.clone()))
    };
    for (i, outcome) in plan.outcomes.iter().enumerate() {
        let Some(c) = valid.get(i) else { continue };
        match *outcome {
            plan::Outcome::Restated(seq) | plan::Outcome::Deduped(seq) => {
                let merged = crate::provenance::merge_provenance(
                    scope.as_str(),
                    current(&out, seq).as_ref(),
                    c.provenance.as_ref(),
                );
                out.insert(seq, merged);
            }
            plan::Outcome::Inserted(seq) => {
                let target = plan
                    .inserts
                    .iter()
                    .find(|ins| ins.seq == seq)
                    .and_then(|ins| ins.supersedes.as_deref())
                    .and_then(RecordId::parse)
                    .map(|r| r.seq);
                let p = match target {
                    Some(t) => crate::provenance::merge_provenance(
                        scope.as_str(),
                        c.provenance.as_ref(),
                        current(&out, t).as_ref(),
                    ),
                    None => c.provenance.clone(),
                };
                out.insert(seq, p);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Candidate;

    fn fact(i: usize) -> Candidate {
        Candidate::fact(
            format!("lesson {i}: warm the cache of module {i} first"),
            "slack:C1:1",
        )
    }

    #[test]
    fn an_eviction_order_behind_the_records_is_rebuilt_and_the_write_evicts_the_right_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = EmbeddedStore::open(dir.path()).expect("open");
        let scope = ScopeKey::parse("repo:acme/app").expect("scope");
        let options = WriteOptions {
            cap: Some(3),
            ..WriteOptions::default()
        };
        for i in 0..4 {
            store.write(&scope, &[fact(i)], &options).expect("write");
        }
        // The fourth write evicted record 0 and left the order in memory; make it name record 0
        // again, at its head, as an order that missed a commit would.
        let s = &*store.shared;
        let state = s.scopes.get(&scope);
        let held = s.scopes.update(&scope, &state, |d| match d.order.as_mut() {
            Some(order) => {
                order.insert((i64::MIN, i64::MIN, 0));
                true
            }
            None => false,
        });
        assert!(held, "the eviction order is held after an eviction");
        let counts = store.write(&scope, &[fact(4)], &options).expect("write");
        assert_eq!((counts.inserted, counts.evicted), (1, 1), "{counts:?}");
        let evicted = store
            .get("mem:repo:acme/app:1")
            .expect("get")
            .expect("kept as evicted");
        assert_eq!(evicted.status, Status::Evicted);
        assert_eq!(store.active_count(&scope).expect("count"), 3);
        assert!(store.check().expect("check").is_ok());
    }
}
