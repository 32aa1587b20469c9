//! `doctor`: does the index hold exactly the active records, do the bookkeeping and the dedup
//! keys agree with the records; and `--repair`, which rewrites them from the records.

use std::collections::HashMap;

use fjall::Readable;

use super::records::Keyspaces;
use super::shared::Shared;
use crate::error::{Error, ErrorKind, Result};
use crate::model::{Kind, RecordId, ScopeKey, Status};
use crate::store::codec::{self, ScopeMeta};
use crate::store::counters::DayCounters;
use crate::store::engine::{describe_fjall, st};

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

/// Usage entries (of `scope`, or of every scope) whose record is not active: every write
/// that retires or removes a record removes its entry in the same batch, so one is
/// bookkeeping left behind by damage, read by nothing, and removed by a repair.
fn orphan_usage(
    ks: &Keyspaces,
    snapshot: &fjall::Snapshot,
    scope: Option<&ScopeKey>,
) -> Result<Vec<(ScopeKey, u64)>> {
    let entries: Box<dyn Iterator<Item = fjall::Guard>> = match scope {
        Some(s) => Box::new(snapshot.prefix(&ks.usage, codec::scope_key_prefix(s))),
        None => Box::new(snapshot.iter(&ks.usage)),
    };
    let mut out = Vec::new();
    for g in entries {
        let k = g.key().map_err(st("reading records' use"))?;
        let Some((scope, seq)) = codec::active_key_parts(&k)
            .and_then(|(s, seq)| Some((std::str::from_utf8(s).ok()?, seq)))
            .and_then(|(s, seq)| Some((ScopeKey::parse(s).ok()?, seq)))
        else {
            return Err(Error::new(
                ErrorKind::Damaged,
                "a usage entry's key is not a record's key",
            ));
        };
        if fjall::Readable::get(snapshot, &ks.active, k.as_ref())
            .map_err(st("reading a record"))?
            .is_none()
        {
            out.push((scope, seq));
        }
    }
    Ok(out)
}

/// Dedup keys that disagree with the active records: (scope, the key's first listed or
/// wanted record, what is wrong).
fn norm_problems(s: &Shared) -> Result<Vec<(ScopeKey, u64, NormProblem)>> {
    let ks = s.records.keyspaces();
    let snapshot = s.records.snapshot();
    let mut wanted = s.records.wanted_dedup_keys(&snapshot, None)?;
    let mut out = Vec::new();
    for g in snapshot.iter(&ks.norms) {
        let (k, v) = g.into_inner().map_err(st("reading the dedup index"))?;
        let Some(scope) = codec::scope_bytes(&k)
            .and_then(|b| std::str::from_utf8(b).ok())
            .and_then(|n| ScopeKey::parse(n).ok())
        else {
            continue;
        };
        let held = codec::decode_seqs(&v)?;
        let want = wanted.remove(k.as_ref()).unwrap_or_default();
        for &seq in held.iter().filter(|s| !want.contains(s)) {
            out.push((scope.clone(), seq, NormProblem::Dangling));
        }
        for &seq in want.iter().filter(|s| !held.contains(s)) {
            out.push((scope.clone(), seq, NormProblem::Missing));
        }
    }
    for (k, seqs) in wanted {
        let Some(scope) = codec::scope_bytes(&k)
            .and_then(|b| std::str::from_utf8(b).ok())
            .and_then(|n| ScopeKey::parse(n).ok())
        else {
            continue;
        };
        for seq in seqs {
            out.push((scope.clone(), seq, NormProblem::Missing));
        }
    }
    Ok(out)
}

/// Rewrites every scope's bookkeeping and dedup keys from its records, one scope at a time
/// under its lock. Returns how many entries it changed.
pub(super) fn repair_bookkeeping(s: &Shared) -> Result<u64> {
    let ks = s.records.keyspaces();
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
        for (_, seq) in orphan_usage(ks, &snapshot, Some(&scope))? {
            for kind in [Kind::Fact, Kind::Summary] {
                batch.remove(&ks.usage, codec::active_key(&scope, kind, seq));
            }
            changed += 1;
        }
        s.group.append_durably(batch, "repairing the bookkeeping")?;
        // Everything derived from the scope is read again from its records on next need.
        s.scopes.reset(&scope, &state);
    }
    Ok(changed)
}

pub(super) fn check(s: &Shared) -> Result<Health> {
    let ks = s.records.keyspaces();
    let mut health = Health {
        index_degraded: s.queue.degraded(),
        indexed_documents: s.index.num_docs(),
        ..Health::default()
    };
    // Every value of every keyspace is read and decoded: damage anywhere (the decision
    // journal included) is found here, not by the export that needs it later.
    health.unreadable = unreadable_values(s);
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
    for g in snapshot.iter(&ks.active) {
        let (k, v) = g.into_inner().map_err(st("reading records"))?;
        let r = codec::decode_record(&v, None)?;
        health.active_records += 1;
        *per_scope.entry(r.scope_key.clone()).or_default() += 1;
        let Some(seq) = r.seq() else { continue };
        if r.status != Status::Active
            || k.as_ref() != codec::active_key(&r.scope_key, r.kind, seq).as_slice()
        {
            push_first(
                &mut health.problems,
                format!("{} is stored under the wrong key or status", r.id),
            );
        }
        if !s.index.contains(&r.id)? {
            push_first(&mut health.missing_from_index, r.id.clone());
        }
    }
    for (scope, seq) in orphan_usage(ks, &snapshot, None)? {
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
    for (scope, seq, norm_key) in norm_problems(s)? {
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
    Ok(health)
}

/// Reads and decodes every value of every keyspace; names each keyspace where one fails.
fn unreadable_values(s: &Shared) -> Vec<String> {
    let mut out = Vec::new();
    let snapshot = s.records.snapshot();
    let record = |v: &[u8]| codec::decode_record(v, None).map(drop);
    let decision = |v: &[u8]| codec::decode_decision(v).map(drop);
    let meta = |v: &[u8]| codec::decode::<ScopeMeta>(v, "a scope's bookkeeping").map(drop);
    let day = |v: &[u8]| codec::decode::<DayCounters>(v, "a day's counters").map(drop);
    let outbox = |v: &[u8]| codec::decode::<Vec<String>>(v, "an outbox entry").map(drop);
    let usage = |v: &[u8]| codec::decode_usage(v).map(drop);
    let any = |_: &[u8]| Ok(());
    for (name, ks) in s.records.keyspaces().named() {
        // How each keyspace's values decode (those of `norms` and `meta` are raw bytes).
        let decode: &dyn Fn(&[u8]) -> Result<()> = match name {
            "records (active)" | "records (retired)" => &record,
            "the records' use" => &usage,
            "the scopes' bookkeeping" => &meta,
            "the day counters" => &day,
            "the index outbox" => &outbox,
            "the decision journal" => &decision,
            _ => &any,
        };
        let mut failures = 0u64;
        let mut first: Option<String> = None;
        for g in snapshot.iter(ks) {
            let failed = match g.into_inner() {
                Ok((_, v)) => decode(&v).err().map(|e| e.to_string()),
                Err(e) => Some(describe_fjall(&e)),
            };
            if let Some(reason) = failed {
                failures += 1;
                first.get_or_insert(reason);
                // An iterator that keeps failing is stuck on one bad block.
                if failures > 1000 {
                    break;
                }
            }
        }
        if let Some(reason) = first {
            push_first(
                &mut out,
                format!("{name}: {failures} value(s), first: {reason}"),
            );
        }
    }
    out
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NormProblem {
    /// An active record has no dedup key.
    Missing,
    /// A dedup key names no active record with that text.
    Dangling,
}

pub(super) fn push_first(list: &mut Vec<String>, item: String) {
    if list.len() < 20 {
        list.push(item);
    }
}
