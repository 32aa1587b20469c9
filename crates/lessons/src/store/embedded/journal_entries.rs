//! A write's plan and a retire, told as decision journal entries: what the store decided
//! about each fact, in the words the journal keeps.
//!
//! **Invariant:** pure: the entries follow from the plan, the records it read and the time,
//! and nothing here reads or writes the store.

use std::collections::HashMap;

use crate::decisions::{Decision, DecisionEvent, RejectedFact};
use crate::model::{Record, RecordId, ScopeKey, Status, ValidCandidate};
use crate::store::plan::{self, Outcome};

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
