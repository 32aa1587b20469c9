//! The decision journal on disk: entries join the batch of the write they describe; reads are
//! prefix scans newest first; the indexer thread prunes by age and per-scope cap.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use crate::model::RecordId;
use fjall::{OwnedWriteBatch, Readable};

use super::super::codec;
use super::{st, Shared};
use crate::decisions::{Decision, DecisionEvent, DecisionQuery, RejectedFact};
use crate::error::Result;
use crate::model::{Record, ScopeKey, Status, ValidCandidate};
use crate::plan::{self, Outcome};

impl Shared {
    /// Adds `entries` to `batch` (the batch of the write they describe).
    pub(super) fn journal(&self, batch: &mut OwnedWriteBatch, entries: &[Decision]) -> Result<()> {
        let Some(first) = entries.first() else {
            return Ok(());
        };
        for d in entries {
            let counter = self.journal.counter.fetch_add(1, Ordering::Relaxed);
            batch.insert(
                &self.ks.decisions,
                codec::decision_key(&d.scope_key, d.time, counter),
                codec::encode_decision(d)?,
            );
        }
        self.journal.dirty.lock().insert(first.scope_key.clone());
        Ok(())
    }

    pub(super) fn read_decisions(
        &self,
        scope: &ScopeKey,
        query: &DecisionQuery,
    ) -> Result<Vec<Decision>> {
        let mut out = Vec::new();
        for g in self.ks.decisions.prefix(codec::scope_key_prefix(scope)) {
            let (k, v) = g.into_inner().map_err(st("reading the decision journal"))?;
            // Newest first: once past `since`, every later entry is older still.
            if codec::decision_time(&k).is_some_and(|t| t < query.since) {
                break;
            }
            let d = codec::decode_decision(&v)?;
            if query.keeps(&d) {
                out.push(d);
                if out.len() == query.limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    pub(super) fn export_decisions(
        &self,
        sink: &mut dyn FnMut(Decision) -> Result<()>,
    ) -> Result<()> {
        // Oldest first, so an import (which numbers entries in the order it reads them) keeps
        // their order.
        let snap = self.db.snapshot();
        for g in snap.iter(&self.ks.decisions).rev() {
            let v = g.value().map_err(st("reading the decision journal"))?;
            sink(codec::decode_decision(&v)?)?;
        }
        Ok(())
    }

    pub(super) fn import_decisions(&self, entries: &[Decision]) -> Result<u64> {
        for d in entries {
            d.validate()?;
        }
        for chunk in entries.chunks(1000) {
            let mut batch = self.db.batch();
            let mut by_scope: HashMap<&ScopeKey, Vec<Decision>> = HashMap::new();
            for d in chunk {
                by_scope.entry(&d.scope_key).or_default().push(d.clone());
            }
            for list in by_scope.values() {
                self.journal(&mut batch, list)?;
            }
            let ticket = self.append(batch)?;
            self.wait_durable(ticket)?;
        }
        Ok(entries.len() as u64)
    }

    /// Drops entries older than `journal_days` and beyond `journal_cap` per scope, for the
    /// scopes written since the last prune. Runs on the indexer thread, never in a write.
    pub(super) fn prune_decisions(&self) -> Result<()> {
        let dirty: Vec<ScopeKey> = self.journal.dirty.lock().drain().collect();
        if dirty.is_empty() {
            return Ok(());
        }
        let cutoff = (self.clock)().saturating_sub(i64::from(self.journal.days) * 86_400_000);
        for scope in dirty {
            let mut batch = self.db.batch();
            let mut kept = 0usize;
            for g in self.ks.decisions.prefix(codec::scope_key_prefix(&scope)) {
                let k = g.key().map_err(st("reading the decision journal"))?;
                let old = codec::decision_time(&k).is_some_and(|t| t < cutoff);
                if old || kept >= self.journal.cap {
                    batch.remove(&self.ks.decisions, k.to_vec());
                } else {
                    kept += 1;
                }
            }
            // Not fsynced: a prune lost to a crash is redone on the scope's next write.
            self.commit_batch(batch)
                .map_err(st("pruning the decision journal"))?;
        }
        Ok(())
    }
}

/// The journal entries of one planned write: each candidate's outcome, each supersede and
/// eviction, and the facts the reflection's gate refused. `loaded` holds the records the plan
/// read (restate and dedup targets, superseded and evicted records).
pub(super) fn of_write(
    scope: &ScopeKey,
    now: i64,
    valid: &[ValidCandidate],
    plan: &plan::Plan,
    loaded: &HashMap<u64, Record>,
    rejected: &[RejectedFact],
) -> Vec<Decision> {
    let mut out = Vec::new();
    for fact in rejected {
        let mut d = Decision::new(now, scope, DecisionEvent::Rejected);
        d.texts.push(fact.text.clone());
        d.markers = fact.markers.clone();
        out.push(d);
    }
    for (c, outcome) in valid.iter().zip(&plan.outcomes) {
        let (event, seq) = match *outcome {
            Outcome::Restated(seq) => (DecisionEvent::Restated, seq),
            Outcome::Deduped(seq) => (DecisionEvent::Deduped, seq),
            Outcome::Inserted(seq) => (DecisionEvent::Inserted, seq),
        };
        let mut d = Decision::new(now, scope, event);
        d.ids.push(scope.record_id(seq));
        d.texts.push(c.text.clone());
        if event == DecisionEvent::Restated {
            if let Some(target) = loaded.get(&seq) {
                d.texts.push(target.text.clone());
            }
        }
        d.source_thread_key = Some(c.source_thread_key.clone());
        d.source_run_id = c.source_run_id.clone();
        out.push(d);
    }
    for insert in &plan.inserts {
        let Some(old_id) = &insert.supersedes else {
            continue;
        };
        let Some(RecordId { seq: old_seq, .. }) = RecordId::parse(old_id) else {
            continue;
        };
        let retired = plan
            .touched
            .get(&old_seq)
            .is_some_and(|t| t.status == Status::Superseded);
        if !retired {
            continue;
        }
        let mut d = Decision::new(now, scope, DecisionEvent::Superseded);
        d.ids = vec![old_id.clone(), scope.record_id(insert.seq)];
        if let Some(old) = loaded.get(&old_seq) {
            d.texts.push(old.text.clone());
        }
        if let Some(c) = valid.get(insert.candidate) {
            d.texts.push(c.text.clone());
        }
        out.push(d);
    }
    for (seq, touched) in &plan.touched {
        if touched.status != Status::Evicted {
            continue;
        }
        let mut d = Decision::new(now, scope, DecisionEvent::Evicted);
        d.ids.push(scope.record_id(*seq));
        if let Some(r) = loaded.get(seq) {
            d.texts.push(r.text.clone());
            d.age_ms = Some(now.saturating_sub(r.created_at));
            d.use_count = Some(r.use_count);
        } else {
            // Inserted and evicted by the same write.
            let text = plan
                .inserts
                .iter()
                .find(|i| i.seq == *seq)
                .and_then(|i| valid.get(i.candidate))
                .map(|c| c.text.clone());
            d.texts.extend(text);
            d.age_ms = Some(0);
            d.use_count = Some(touched.meta.use_count);
        }
        out.push(d);
    }
    out
}

/// The entry of a record retired by a sweep or a forget.
pub(super) fn of_retire(now: i64, r: &Record, event: DecisionEvent) -> Decision {
    let mut d = Decision::new(now, &r.scope_key, event);
    d.ids.push(r.id.clone());
    d.texts.push(r.text.clone());
    if event == DecisionEvent::Swept {
        d.markers = crate::gate::rejection_marker_names(&r.text)
            .into_iter()
            .map(str::to_owned)
            .collect();
    }
    d
}
