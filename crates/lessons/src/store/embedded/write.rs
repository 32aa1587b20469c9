//! A write, top down: validate, read exactly what the planner needs (point lookups, never a
//! scan), plan (`store::plan`, pure), turn the plan into one transaction, commit it, and wait
//! for its fsync after releasing the scope's lock.

use std::collections::HashMap;

use super::journal_entries;
use super::phases::{self, Phase, WriteTally};
use super::scope_tx::{self, ScopeTx};
use super::scopes::Scope;
use super::shared::Shared;
use super::tx::{DedupKeys, LruKey};
use crate::error::{Error, ErrorKind, Result};
use crate::model::{Kind, Record, RecordId, ScopeKey, Status, ValidCandidate, WriteCounts};
use crate::store::codec::{self, ScopeMeta};
use crate::store::plan;
use crate::store::values::WriteOptions;
use crate::store::CheckedWrite;
use crate::text::normalize;

/// `MemoryStore::write`: restate, dedup, insert, supersede, then evict to the cap, as one
/// atomic batch.
pub(super) fn write(
    s: &Shared,
    write: &CheckedWrite<'_>,
    options: &WriteOptions,
) -> Result<WriteCounts> {
    let tally = WriteTally::start();
    let counts = write_tallied(s, write, options);
    tally.finish(write.scope());
    counts
}

/// `write`, its phases tallied.
fn write_tallied(
    s: &Shared,
    write: &CheckedWrite<'_>,
    options: &WriteOptions,
) -> Result<WriteCounts> {
    let (scope, valid) = (write.scope(), write.valid());
    let cap = write.cap().unwrap_or(s.cap);
    if valid.is_empty() && options.tally.is_none() {
        return Ok(WriteCounts::default());
    }
    scope_tx::change(s, scope, |tx| {
        let meta = tx.loaded();
        let at = Target {
            scope,
            state: tx.state(),
            meta: &meta,
        };
        let now = tx.now();
        let planned = phases::time(Phase::Plan, || -> Result<_> {
            let (mut plan, mut read) = plan_from_records(s, at, valid, now, cap)?;
            let complete = read_evicted(s, scope, &mut plan, &mut read)?;
            Ok((plan, read, complete))
        });
        let (mut plan, mut read, complete) = planned?;
        if !complete {
            // The order in memory named a record that is not active: plan again from an order
            // rebuilt from the records.
            log::warn!("[store] {scope}: the eviction order was behind the records; rebuilt");
            s.scopes.drop_order(scope, tx.state());
            (plan, read) = plan_from_records(s, at, valid, now, cap)?;
            if !read_evicted(s, scope, &mut plan, &mut read)? {
                return Err(Error::new(
                    ErrorKind::Damaged,
                    format!(
                        "{scope}: a record to evict is not active; run `lessons doctor --repair`"
                    ),
                ));
            }
        }
        phases::time(Phase::Build, || apply_plan(tx, valid, &plan, read, options))?;
        Ok(plan.counts)
    })
}

/// Reads what the planner needs for `valid` and plans the write.
fn plan_from_records(
    s: &Shared,
    at: Target<'_>,
    valid: &[ValidCandidate],
    now: i64,
    cap: usize,
) -> Result<(plan::Plan, Read)> {
    let (snapshot, read) = read_for_plan(s, at, valid, cap)?;
    Ok((plan::plan_write(at.scope, &snapshot, valid, now, cap), read))
}

/// Reads exactly what the planner can need for `valid` (point lookups: one dedup key per
/// normalized text, never a scan): the snapshot, and the records it was built from.
fn read_for_plan(
    s: &Shared,
    at: Target<'_>,
    valid: &[ValidCandidate],
    cap: usize,
) -> Result<(plan::Snapshot, Read)> {
    let Target { scope, state, meta } = at;
    // Read exactly what the planner can need.
    let needs = plan::needs(scope, valid, meta.active as usize, cap);
    let mut loaded: HashMap<u64, Record> = HashMap::new();
    let mut snapshot = plan::Snapshot {
        next_seq: meta.next_seq,
        active_count: meta.active as usize,
        ..plan::Snapshot::default()
    };
    for &seq in &needs.seqs {
        if let Some(r) = s.records.load_active(scope, seq)? {
            snapshot.records.insert(seq, meta_of(&r, seq));
            loaded.insert(seq, r);
        }
    }
    let mut norms = std::collections::BTreeMap::new();
    for norm in &needs.norms {
        let mut hits = Vec::new();
        // One point read: a miss is usually answered by the tables' bloom filters. What it
        // read seeds the write's transaction, so an insert does not read the key again.
        let key = codec::norm_key(scope, norm);
        let seqs = s.records.dedup_key(&key)?;
        for &seq in &seqs {
            if let Some(r) = s.records.load_active(scope, seq)? {
                // The key is a hash: confirm the text really normalizes to `norm`.
                let m = meta_of(&r, seq);
                if m.norm == *norm {
                    hits.push(m);
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
        for key in s
            .scopes
            .eviction_head(&s.records, scope, state, needs.eviction_head)?
        {
            let seq = key.2;
            snapshot.eviction_head.push(match loaded.get(&seq) {
                Some(r) => eviction_meta_of(r, seq),
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
    s: &Shared,
    scope: &ScopeKey,
    plan: &mut plan::Plan,
    read: &mut Read,
) -> Result<bool> {
    for (&seq, touched) in plan.existing_changes_mut() {
        if touched.status != Status::Evicted || read.records.contains_key(&seq) {
            continue;
        }
        let Some(r) = s.records.load_active(scope, seq)? else {
            return Ok(false);
        };
        debug_assert_eq!(
            touched.meta.eviction_key(),
            eviction_meta_of(&r, seq).eviction_key()
        );
        touched.meta = eviction_meta_of(&r, seq);
        read.records.insert(seq, r);
    }
    Ok(true)
}

/// Builds a plan into the scope's transaction: records, the day's counters, the journal.
fn apply_plan(
    tx: &mut ScopeTx<'_>,
    valid: &[ValidCandidate],
    plan: &plan::Plan,
    read: Read,
    options: &WriteOptions,
) -> Result<()> {
    let loaded = &read.records;
    let scope = tx.scope().clone();
    let scope = &scope;
    let now = tx.now();
    tx.read_dedup_keys(read.dedup_keys);
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
            tx.update(old, &new, seq)?;
        } else {
            tx.retire(old, &new, seq)?;
        }
    }
    let mut summaries = 0;
    for insert in &plan.inserts {
        let (Some(c), Some(touched)) = (valid.get(insert.candidate), plan.touched.get(&insert.seq))
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
        if c.kind == Kind::Summary {
            summaries += 1;
        }
        // The bookkeeping was checked against the records, so the insert's refusal to replace
        // a record cannot fire unless the store changed under us.
        tx.insert(&r, insert.seq)?;
    }
    tx.reserve(plan.next_seq);
    tx.count(|d| d.add_write(&plan.counts, summaries, options.tally.as_ref()))?;
    tx.journal(&journal_entries::of_write(
        scope,
        now,
        valid,
        plan,
        loaded,
        &options.rejected,
    ))
}

/// What the planner needs of a record in the eviction head, from its key in the scope's order:
/// the eviction key's fields. The rest is filled from the record if the plan evicts it.
fn order_meta((used, created_at, seq): LruKey) -> plan::ActiveMeta {
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
    dedup_keys: DedupKeys,
}

/// The scope a write applies to: its key, its state in memory (whose write lock the writer
/// holds) and its checked bookkeeping.
#[derive(Clone, Copy)]
struct Target<'a> {
    scope: &'a ScopeKey,
    state: &'a Scope,
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

/// What the planner needs of an active record.
fn meta_of(r: &Record, seq: u64) -> plan::ActiveMeta {
    plan::ActiveMeta {
        seq,
        norm: normalize(&r.text),
        dedup_key: r.dedup_key,
        created_at: r.created_at,
        last_used_at: r.last_used_at,
        use_count: r.use_count,
        confidence: r.confidence,
    }
}

/// A record's place in the eviction order, for a plan that may evict it: its text is never
/// compared, so it is not normalized.
fn eviction_meta_of(r: &Record, seq: u64) -> plan::ActiveMeta {
    plan::ActiveMeta {
        seq,
        norm: String::new(),
        dedup_key: false,
        created_at: r.created_at,
        last_used_at: r.last_used_at,
        use_count: r.use_count,
        confidence: r.confidence,
    }
}

#[cfg(test)]
mod tests {
    use crate::model::{Candidate, ScopeKey, Status};
    use crate::store::embedded::EmbeddedStore;
    use crate::store::{MemoryStore, WriteOptions};

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
        let held = s.scopes.edit_order(&scope, &state, |order| {
            order.insert((i64::MIN, i64::MIN, 0));
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
