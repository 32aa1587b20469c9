//! `doctor`: does the index hold exactly the active records, do the bookkeeping and the dedup
//! keys agree with the records, does every journal entry that left its text to a record name one
//! the store holds; and `--repair`, which rewrites them from the records.

use std::collections::HashMap;

use super::records::NormProblem;
use super::shared::Shared;
use crate::error::Result;
use crate::model::{RecordId, ScopeKey};
use crate::store::codec::ScopeMeta;

/// What `doctor` found.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    /// Active records in fjall.
    pub active_records: u64,
    /// Documents in the keyword index.
    pub indexed_documents: u64,
    /// Active records the index does not hold (first 20).
    pub missing_from_index: Vec<String>,
    /// Records whose bookkeeping disagrees with their keys (first 20).
    pub problems: Vec<String>,
    /// Whether an index operation failed since open.
    pub index_degraded: bool,
    /// Why the store refuses writes, if it does: acknowledged writes it can prove lost, or
    /// data that does not read. `--repair` cannot fix unreadable data; `--salvage` copies
    /// what reads into a new store.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub damage: Option<String>,
    /// Records the keyword index knows that the records no longer hold: acknowledged and lost
    /// (first 20). Their ids are never handed out again.
    pub lost: Vec<String>,
    /// Values that do not read or decode, by keyspace (first 20).
    pub unreadable: Vec<String>,
}

impl Health {
    /// Nothing to repair.
    pub fn is_ok(&self) -> bool {
        self.active_records == self.indexed_documents
            && self.missing_from_index.is_empty()
            && self.problems.is_empty()
            && !self.index_degraded
            && self.damage.is_none()
            && self.lost.is_empty()
            && self.unreadable.is_empty()
    }
}

/// Rewrites every scope's bookkeeping and dedup keys from its records, one scope at a time
/// under its lock. Returns how many entries it changed.
pub(super) fn repair_bookkeeping(s: &Shared) -> Result<u64> {
    let mut changed = 0;
    for scope in s.records.all_scopes()? {
        let state = s.scopes.get(&scope);
        let _guard = state.write.lock();
        let derived = s.records.derive_meta(&scope)?;
        let stored = s.records.stored_meta(&scope)?;
        let mut batch = s.records.batch();
        let meta = ScopeMeta {
            next_seq: stored.map_or(0, |m| m.next_seq).max(derived.next_seq),
            active: derived.active,
        };
        if stored != Some(meta) {
            s.records.put_meta(&mut batch, &scope, &meta)?;
            changed += 1;
        }
        changed += s.records.rewrite_dedup_keys(&mut batch, &scope)?;
        let snapshot = s.records.snapshot();
        for (_, seq) in s.records.orphan_usage(&snapshot, Some(&scope))? {
            s.records.remove_usage(&mut batch, &scope, seq);
            changed += 1;
        }
        s.group.append_durably(batch, "repairing the bookkeeping")?;
        // Everything derived from the scope is read again from its records on next need.
        s.scopes.reset(&scope, &state);
    }
    Ok(changed)
}

pub(super) fn check(s: &Shared) -> Result<Health> {
    let mut health = Health {
        index_degraded: s.queue.degraded(),
        indexed_documents: s.index.num_docs(),
        ..Health::default()
    };
    // Every value of every keyspace is read and decoded: damage anywhere (the decision
    // journal included) is found here, not by the export that needs it later.
    health.unreadable = s.records.unreadable_values();
    if !health.unreadable.is_empty() {
        let what = format!("unreadable data: {}", health.unreadable.join("; "));
        s.witness.found_unreadable(what)?;
        health.damage = s.witness.described();
        return Ok(health);
    }
    // What an earlier check found unreadable reads now (a file was restored).
    s.witness.unreadable_cleared()?;
    health.damage = s.witness.described();
    health.lost = lost_ids(s, 20)?;
    let mut per_scope: HashMap<ScopeKey, u64> = HashMap::new();
    let snapshot = s.records.snapshot();
    s.records.visit_stored_active(&snapshot, &mut |r, placed| {
        health.active_records += 1;
        *per_scope.entry(r.scope_key.clone()).or_default() += 1;
        let Some(placed) = placed else { return Ok(()) };
        if !placed {
            push_first(
                &mut health.problems,
                format!("{} is stored under the wrong key or status", r.id),
            );
        }
        if !s.index.contains(&r.id)? {
            push_first(&mut health.missing_from_index, r.id.clone());
        }
        Ok(())
    })?;
    for (scope, seq) in s.records.orphan_usage(&snapshot, None)? {
        push_first(
            &mut health.problems,
            format!(
                "a usage entry names {}, which is not an active record",
                scope.record_id(seq)
            ),
        );
    }
    for scope in s.records.all_scopes()? {
        let derived = s.records.derive_meta(&scope)?;
        match s.records.stored_meta(&scope)? {
            None if derived != ScopeMeta::default() => push_first(
                &mut health.problems,
                format!("{scope} holds records but has no bookkeeping"),
            ),
            None => {}
            Some(meta) => {
                if meta.active != derived.active {
                    push_first(
                        &mut health.problems,
                        format!(
                            "{scope} counts {} active records but holds {}",
                            meta.active, derived.active
                        ),
                    );
                }
                if meta.next_seq < derived.next_seq {
                    push_first(
                        &mut health.problems,
                        format!(
                            "{scope} would mint its next id at {} but holds records up to {}",
                            meta.next_seq,
                            derived.next_seq - 1
                        ),
                    );
                }
            }
        }
    }
    for (scope, seq, norm_key) in s.records.norm_problems()? {
        push_first(
            &mut health.problems,
            match norm_key {
                NormProblem::Missing => {
                    format!("{} has no dedup key", scope.record_id(seq))
                }
                NormProblem::Dangling => format!(
                    "a dedup key lists {}, which is not an active record with that text",
                    scope.record_id(seq)
                ),
            },
        );
    }
    for d in s.journal.orphaned(&s.records)? {
        push_first(
            &mut health.problems,
            format!(
                "the journal's {} entry of {} names a record the store does not hold: its text is lost",
                d.event.as_str(),
                d.ids.join(", ")
            ),
        );
    }
    Ok(health)
}

/// Acknowledged ids no record of the store has (at most `limit`): those the keyword index
/// holds (active records), and those the witness of acknowledged ids puts past a scope's
/// next id (whatever their records became).
pub(super) fn lost_ids(s: &Shared, limit: usize) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for id in s.index.ids()? {
        let held = match RecordId::parse(&id) {
            Some(RecordId { scope, seq }) => s.records.load_any(&scope, seq)?.is_some(),
            None => false,
        };
        if !held && seen.insert(id.clone()) {
            out.push(id);
            if out.len() == limit {
                return Ok(out);
            }
        }
    }
    let witnessed = s.witness.next_ids();
    for (scope, next) in witnessed {
        let Ok(scope) = ScopeKey::parse(&scope) else {
            continue;
        };
        let from = s.records.stored_meta(&scope)?.unwrap_or_default().next_seq;
        for seq in from..next {
            let id = scope.record_id(seq);
            if s.records.load_any(&scope, seq)?.is_none() && seen.insert(id.clone()) {
                out.push(id);
                if out.len() == limit {
                    return Ok(out);
                }
            }
        }
    }
    Ok(out)
}

/// Accepts a proven loss: every scope's next id moves past the ids the index knows, the
/// batch numbers past every witness, and the index is rebuilt from the records that are
/// left. Refused for unreadable data, which only `salvage` reads around.
pub(super) fn accept_loss(s: &Shared) -> Result<Vec<String>> {
    let Some(witnessed) = s.witness.acceptable_loss()? else {
        return Ok(Vec::new());
    };
    let lost = lost_ids(s, usize::MAX)?;
    let mut next: HashMap<ScopeKey, u64> = HashMap::new();
    for id in &lost {
        if let Some(RecordId { scope, seq }) = RecordId::parse(id) {
            let n = next.entry(scope).or_default();
            *n = (*n).max(seq + 1);
        }
    }
    s.group.skip_past(witnessed);
    let mut batch = s.records.batch();
    for (scope, n) in &next {
        let stored = s.records.stored_meta(scope)?.unwrap_or_default();
        if stored.next_seq < *n {
            let meta = ScopeMeta {
                next_seq: *n,
                ..stored
            };
            s.records.put_meta(&mut batch, scope, &meta)?;
        }
    }
    s.group.append_durably(batch, "accepting the loss")?;
    // The bookkeeping changed outside the write path: what memory holds is read again.
    s.scopes.reset_all();
    s.witness.loss_accepted()?;
    log::warn!(
        "[store] accepted the loss of {} acknowledged record(s); their ids are never handed out again",
        lost.len()
    );
    Ok(lost)
}

pub(super) fn push_first(list: &mut Vec<String>, item: String) {
    if list.len() < 20 {
        list.push(item);
    }
}
