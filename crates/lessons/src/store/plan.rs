//! The write planner: given what a scope holds and a list of candidates, what must the store do?
//! (Over 600 lines: about 360 are the rules, the rest are their tests, one per rule, kept beside
//! the rules they pin.)
//!
//! Planning is two pure steps around one read:
//! 1. [`needs`] says which records the candidates can touch (the ids they point at, the
//!    normalized texts they can dedup on, how much of the eviction order can matter);
//! 2. the store reads exactly those into a [`Snapshot`] (point lookups only: one key per
//!    normalized text, never a scan of the scope);
//! 3. [`plan_write`] decides restates, dedups, inserts, supersedes and evictions, returning the
//!    final state of every touched record, which the store applies as one atomic batch.
//!
//! Rules, per candidate in order, against the scope's active records including those inserted
//! earlier in the same call:
//! 1. **restate**: `restates` names an active record of this scope → bump its use count, set
//!    `lastUsedAt` to now, confidence to the higher of the two; insert nothing.
//! 2. **supersede target**: `supersedes` names an active record of this scope, else none.
//! 3. **dedup**: normalized text equal to an active record (with `supersedes`: only the resolved
//!    target; with an unresolved id: nothing) → bump the use count only.
//! 4. **insert** with the next sequence number; a resolved target flips to `superseded`.
//!
//! Then **evict** the least recently used (`lastUsedAt ?? createdAt`, then older `createdAt`,
//! then lower sequence) until the scope holds at most `cap` active records.
//!
//! **Invariant:** pure: no IO, no clock, no randomness. The same snapshot and candidates give the
//! same plan.

use std::collections::{BTreeMap, HashMap};

use crate::model::{RecordId, ScopeKey, Status, ValidCandidate, WriteCounts};

/// What the planner needs to know about one active record.
#[derive(Clone, Debug, PartialEq)]
pub struct ActiveMeta {
    /// The record's sequence number in its scope.
    pub seq: u64,
    /// The record's normalized text (its dedup key).
    pub norm: String,
    /// Whether a dedup by normalized text can find it: false for a record whose text was sent
    /// with a lone surrogate, which the reference stores otherwise than it compares. (A
    /// candidate naming it as its supersede target still compares with its text.)
    pub dedup_key: bool,
    /// When it was written.
    pub created_at: i64,
    /// When it was last retrieved or restated.
    pub last_used_at: Option<i64>,
    /// Times used.
    pub use_count: u64,
    /// In [0, 1].
    pub confidence: Option<f64>,
}

impl ActiveMeta {
    /// The eviction order key: least recently used first.
    pub fn eviction_key(&self) -> (i64, i64, u64) {
        (
            self.last_used_at.unwrap_or(self.created_at),
            self.created_at,
            self.seq,
        )
    }
}

/// What the store must read before planning a write.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Needs {
    /// Sequence numbers of this scope that `restates` or `supersedes` point at.
    pub seqs: Vec<u64>,
    /// Normalized texts the candidates can dedup on.
    pub norms: Vec<String>,
    /// How many entries of the scope's eviction order the plan can need.
    pub eviction_head: usize,
}

/// What the scope holds, as far as the candidates can see it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// The sequence number the next insert gets.
    pub next_seq: u64,
    /// Active records in the scope.
    pub active_count: usize,
    /// Active records named by [`Needs::seqs`] (absent: not active, or no such record).
    pub records: HashMap<u64, ActiveMeta>,
    /// For each normalized text in [`Needs::norms`], every active record with it.
    pub by_norm: HashMap<String, Vec<ActiveMeta>>,
    /// The first [`Needs::eviction_head`] active records in eviction order.
    pub eviction_head: Vec<ActiveMeta>,
}

/// Which of [`Needs`] a write of `candidates` to `scope` (holding `active_count` records, capped
/// at `cap`) requires.
pub fn needs(
    scope: &ScopeKey,
    candidates: &[ValidCandidate],
    active_count: usize,
    cap: usize,
) -> Needs {
    let mut seqs = Vec::new();
    let mut norms = Vec::new();
    for c in candidates {
        for id in [&c.restates, &c.supersedes].into_iter().flatten() {
            if let Some(RecordId { scope: s, seq }) = RecordId::parse(id) {
                if &s == scope && !seqs.contains(&seq) {
                    seqs.push(seq);
                }
            }
        }
        if c.dedup && !norms.contains(&c.norm) {
            norms.push(c.norm.clone());
        }
    }
    let n = candidates.len();
    // At most one existing record is touched per candidate; those are skipped in the eviction
    // order, so the head must reach past them.
    let excess = (active_count + n).saturating_sub(cap);
    Needs {
        seqs,
        norms,
        eviction_head: if excess == 0 { 0 } else { excess + n },
    }
}

/// The final state of a record the plan touches.
#[derive(Clone, Debug, PartialEq)]
pub struct Touched {
    /// Its metadata after the write.
    pub meta: ActiveMeta,
    /// Its status after the write.
    pub status: Status,
}

/// A record the plan inserts.
#[derive(Clone, Debug, PartialEq)]
pub struct Insert {
    /// Its sequence number.
    pub seq: u64,
    /// Which candidate it comes from.
    pub candidate: usize,
    /// The id of the record it supersedes, if a target resolved.
    pub supersedes: Option<String>,
}

/// What happened to one candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Bumped the record with this sequence number.
    Restated(u64),
    /// Matched the normalized text of this record.
    Deduped(u64),
    /// Became this new record.
    Inserted(u64),
}

/// What the store must apply, atomically.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// New records, in sequence order.
    pub inserts: Vec<Insert>,
    /// Final state of every touched record, existing and new, by sequence number.
    pub touched: BTreeMap<u64, Touched>,
    /// The counts to answer.
    pub counts: WriteCounts,
    /// One outcome per candidate.
    pub outcomes: Vec<Outcome>,
    /// The scope's next sequence number after the write.
    pub next_seq: u64,
}

impl Plan {
    /// Sequence numbers of records that existed before the write and that the plan changes.
    pub fn existing_changes(&self) -> impl Iterator<Item = (&u64, &Touched)> {
        self.touched.range(..self.first_new())
    }

    /// [`Plan::existing_changes`], to fill in what the planner did not need to know.
    pub fn existing_changes_mut(&mut self) -> impl Iterator<Item = (&u64, &mut Touched)> {
        let first_new = self.first_new();
        self.touched.range_mut(..first_new)
    }

    fn first_new(&self) -> u64 {
        self.inserts.first().map_or(u64::MAX, |i| i.seq)
    }
}

/// Plans a write of `candidates` to `scope` at time `now` under `cap`.
pub fn plan_write(
    scope: &ScopeKey,
    snapshot: &Snapshot,
    candidates: &[ValidCandidate],
    now: i64,
    cap: usize,
) -> Plan {
    let mut plan = Plan {
        next_seq: snapshot.next_seq,
        ..Plan::default()
    };
    let mut overlay = Overlay::default();
    let mut active_count = snapshot.active_count;
    let resolve = |overlay: &Overlay, id: &Option<String>| -> Option<ActiveMeta> {
        let RecordId { scope: s, seq } = RecordId::parse(id.as_deref()?)?;
        if &s != scope {
            return None;
        }
        overlay.active(snapshot, seq)
    };

    for (index, c) in candidates.iter().enumerate() {
        if let Some(mut target) = resolve(&overlay, &c.restates) {
            target.use_count += 1;
            target.last_used_at = Some(now);
            target.confidence = match (target.confidence, c.confidence) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            plan.counts.restated += 1;
            plan.outcomes.push(Outcome::Restated(target.seq));
            overlay.set(target, Status::Active);
            continue;
        }
        let target = resolve(&overlay, &c.supersedes);
        let norm = &c.norm;
        let hit = match (&c.supersedes, &target) {
            _ if !c.dedup => None,
            (None, _) => lowest_active_with_norm(snapshot, &overlay.state, norm),
            (Some(_), Some(t)) => (t.norm == *norm).then(|| t.clone()),
            (Some(_), None) => None,
        };
        if let Some(mut hit) = hit {
            hit.use_count += 1;
            plan.counts.deduped += 1;
            plan.outcomes.push(Outcome::Deduped(hit.seq));
            overlay.set(hit, Status::Active);
            continue;
        }
        let seq = plan.next_seq;
        plan.next_seq += 1;
        let meta = ActiveMeta {
            seq,
            norm: norm.clone(),
            dedup_key: c.dedup,
            created_at: now,
            last_used_at: None,
            use_count: 0,
            confidence: c.confidence,
        };
        overlay.set(meta, Status::Active);
        active_count += 1;
        plan.counts.inserted += 1;
        plan.outcomes.push(Outcome::Inserted(seq));
        plan.inserts.push(Insert {
            seq,
            candidate: index,
            supersedes: target.as_ref().map(|t| scope.record_id(t.seq)),
        });
        if let Some(t) = target {
            overlay.set(t, Status::Superseded);
            active_count -= 1;
            plan.counts.superseded += 1;
        }
    }

    let excess = active_count.saturating_sub(cap);
    if excess > 0 {
        plan.counts.evicted += overlay.evict(snapshot, excess);
    }
    for seq in overlay.changed {
        if let Some(t) = overlay.state.get(&seq) {
            plan.touched.insert(seq, t.clone());
        }
    }
    plan
}

/// Every record a write has looked at or made, in its current state, and the order in which
/// they changed.
#[derive(Default)]
struct Overlay {
    state: BTreeMap<u64, Touched>,
    changed: Vec<u64>,
}

impl Overlay {
    fn set(&mut self, meta: ActiveMeta, status: Status) {
        let seq = meta.seq;
        self.state.insert(seq, Touched { meta, status });
        self.changed.push(seq);
    }

    /// Record `seq` if it is active: as this write left it, else as the snapshot read it.
    fn active(&self, snapshot: &Snapshot, seq: u64) -> Option<ActiveMeta> {
        match self.state.get(&seq) {
            Some(t) => (t.status == Status::Active).then(|| t.meta.clone()),
            None => snapshot.records.get(&seq).cloned().or_else(|| {
                snapshot
                    .by_norm
                    .values()
                    .flatten()
                    .find(|m| m.seq == seq)
                    .cloned()
            }),
        }
    }

    /// Evicts the `excess` least recently used active records; how many it evicted.
    fn evict(&mut self, snapshot: &Snapshot, excess: usize) -> u64 {
        // Untouched records keep their stored order; touched active ones join with their new
        // keys. The head was read long enough to cover every skipped entry.
        let mut order: Vec<ActiveMeta> = snapshot
            .eviction_head
            .iter()
            .filter(|m| !self.state.contains_key(&m.seq))
            .cloned()
            .collect();
        order.extend(
            self.state
                .values()
                .filter(|t| t.status == Status::Active)
                .map(|t| t.meta.clone()),
        );
        order.sort_by_key(ActiveMeta::eviction_key);
        let mut evicted = 0;
        for victim in order.into_iter().take(excess) {
            self.set(victim, Status::Evicted);
            evicted += 1;
        }
        evicted
    }
}

fn lowest_active_with_norm(
    snapshot: &Snapshot,
    state: &BTreeMap<u64, Touched>,
    norm: &str,
) -> Option<ActiveMeta> {
    let stored = snapshot
        .by_norm
        .get(norm)
        .into_iter()
        .flatten()
        .filter_map(|m| match state.get(&m.seq) {
            Some(t) => (t.status == Status::Active).then(|| t.meta.clone()),
            None => Some(m.clone()),
        })
        .filter(|m| m.dedup_key);
    let made = state
        .values()
        .filter(|t| t.status == Status::Active && t.meta.dedup_key && t.meta.norm == norm)
        .map(|t| t.meta.clone());
    stored.chain(made).min_by_key(|m| m.seq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Candidate;
    use crate::text::normalize;

    fn scope() -> ScopeKey {
        ScopeKey::parse("repo:acme/app").expect("valid")
    }

    fn meta(seq: u64, text: &str, created: i64, used: Option<i64>) -> ActiveMeta {
        ActiveMeta {
            seq,
            norm: normalize(text),
            dedup_key: true,
            created_at: created,
            last_used_at: used,
            use_count: 0,
            confidence: None,
        }
    }

    /// A snapshot holding `records` (all active), with every lookup answered.
    fn snapshot(records: &[ActiveMeta]) -> Snapshot {
        let mut by_norm: HashMap<String, Vec<ActiveMeta>> = HashMap::new();
        for r in records {
            by_norm.entry(r.norm.clone()).or_default().push(r.clone());
        }
        let mut head = records.to_vec();
        head.sort_by_key(ActiveMeta::eviction_key);
        Snapshot {
            next_seq: records.iter().map(|r| r.seq + 1).max().unwrap_or(0),
            active_count: records.len(),
            records: records.iter().map(|r| (r.seq, r.clone())).collect(),
            by_norm,
            eviction_head: head,
        }
    }

    fn valid(cs: &[Candidate]) -> Vec<ValidCandidate> {
        let checked = crate::store::CheckedWrite::check(&scope(), cs, &Default::default());
        checked.expect("valid").valid().to_vec()
    }

    fn id(seq: u64) -> String {
        scope().record_id(seq)
    }

    #[test]
    fn restate_bumps_and_inserts_nothing() {
        let mut a = meta(0, "npm ci fixes the license check", 1, None);
        a.confidence = Some(0.7);
        let snap = snapshot(&[a]);
        let cs = valid(&[Candidate::fact("a paraphrase", "t")
            .restating(id(0))
            .with_confidence(0.9)]);
        let plan = plan_write(&scope(), &snap, &cs, 100, 500);
        assert_eq!(
            plan.counts,
            WriteCounts {
                restated: 1,
                ..Default::default()
            }
        );
        assert!(plan.inserts.is_empty());
        let t = &plan.touched[&0];
        assert_eq!(
            (t.meta.use_count, t.meta.last_used_at, t.meta.confidence),
            (1, Some(100), Some(0.9))
        );
        assert_eq!(t.status, Status::Active);
    }

    #[test]
    fn restate_keeps_the_higher_or_the_existing_confidence() {
        let mut a = meta(0, "x", 1, None);
        a.confidence = Some(0.95);
        let plan = plan_write(
            &scope(),
            &snapshot(&[a]),
            &valid(&[Candidate::fact("y", "t")
                .restating(id(0))
                .with_confidence(0.6)]),
            5,
            500,
        );
        assert_eq!(plan.touched[&0].meta.confidence, Some(0.95));
        let b = meta(0, "x", 1, None);
        let plan = plan_write(
            &scope(),
            &snapshot(&[b]),
            &valid(&[Candidate::fact("y", "t").restating(id(0))]),
            5,
            500,
        );
        assert_eq!(plan.touched[&0].meta.confidence, None);
    }

    #[test]
    fn restate_outranks_a_text_collision() {
        let snap = snapshot(&[meta(0, "alpha", 1, None), meta(1, "beta", 1, None)]);
        // The text equals record 1, but restates names record 0: record 0 is bumped.
        let plan = plan_write(
            &scope(),
            &snap,
            &valid(&[Candidate::fact("beta", "t").restating(id(0))]),
            9,
            500,
        );
        assert_eq!(plan.outcomes, [Outcome::Restated(0)]);
        assert!(!plan.touched.contains_key(&1));
    }

    #[test]
    fn unknown_foreign_or_inactive_pointers_fall_through() {
        let snap = snapshot(&[meta(0, "alpha", 1, None)]);
        let foreign = "mem:repo:other/app:0".to_owned();
        for ptr in [id(7), foreign, "garbage".to_owned()] {
            let plan = plan_write(
                &scope(),
                &snap,
                &valid(&[Candidate::fact("new lesson", "t").restating(ptr.clone())]),
                2,
                500,
            );
            assert_eq!(plan.outcomes, [Outcome::Inserted(1)], "restates {ptr}");
            // An unresolved supersedes inserts without flipping, and does not dedup even on
            // an equal text.
            let plan = plan_write(
                &scope(),
                &snap,
                &valid(&[Candidate::fact("alpha", "t").superseding(ptr.clone())]),
                2,
                500,
            );
            assert_eq!(plan.outcomes, [Outcome::Inserted(1)], "supersedes {ptr}");
            assert_eq!(plan.counts.superseded, 0);
            assert_eq!(plan.inserts[0].supersedes, None);
        }
    }

    #[test]
    fn a_record_superseded_earlier_in_the_call_is_not_active() {
        let snap = snapshot(&[meta(0, "alpha", 1, None)]);
        let cs = valid(&[
            Candidate::fact("alpha v2", "t").superseding(id(0)),
            Candidate::fact("alpha again", "t").restating(id(0)),
        ]);
        let plan = plan_write(&scope(), &snap, &cs, 2, 500);
        assert_eq!(plan.outcomes, [Outcome::Inserted(1), Outcome::Inserted(2)]);
        assert_eq!(plan.touched[&0].status, Status::Superseded);
        assert_eq!(plan.counts.superseded, 1);
    }

    #[test]
    fn with_supersedes_dedup_looks_only_at_the_target() {
        let snap = snapshot(&[meta(0, "alpha", 1, None), meta(1, "beta", 1, None)]);
        // Text equals record 1, target is record 0: no dedup, insert and supersede 0.
        let plan = plan_write(
            &scope(),
            &snap,
            &valid(&[Candidate::fact("BETA", "t").superseding(id(0))]),
            2,
            500,
        );
        assert_eq!(plan.outcomes, [Outcome::Inserted(2)]);
        assert_eq!(plan.touched[&0].status, Status::Superseded);
        assert_eq!(plan.inserts[0].supersedes, Some(id(0)));
    }

    #[test]
    fn restating_a_superseded_targets_own_text_dedups_on_it() {
        let snap = snapshot(&[meta(0, "alpha  lesson", 1, None)]);
        let plan = plan_write(
            &scope(),
            &snap,
            &valid(&[Candidate::fact("Alpha lesson", "t").superseding(id(0))]),
            2,
            500,
        );
        assert_eq!(plan.outcomes, [Outcome::Deduped(0)]);
        assert_eq!(plan.touched[&0].status, Status::Active);
        assert_eq!(plan.touched[&0].meta.use_count, 1);
        assert_eq!(
            plan.touched[&0].meta.last_used_at, None,
            "dedup bumps the count only"
        );
    }

    #[test]
    fn later_candidates_see_earlier_inserts() {
        let snap = snapshot(&[]);
        let cs = valid(&[
            Candidate::fact("run npm ci first", "t"),
            Candidate::fact("Run  npm ci FIRST", "t"),
            Candidate::fact("another", "t").restating(id(0)),
        ]);
        let plan = plan_write(&scope(), &snap, &cs, 2, 500);
        assert_eq!(
            plan.outcomes,
            [
                Outcome::Inserted(0),
                Outcome::Deduped(0),
                Outcome::Restated(0)
            ]
        );
        assert_eq!(plan.touched[&0].meta.use_count, 2);
        assert_eq!(
            plan.counts,
            WriteCounts {
                inserted: 1,
                deduped: 1,
                restated: 1,
                ..Default::default()
            }
        );
    }

    #[test]
    fn dedup_without_supersedes_takes_the_lowest_active_seq() {
        let snap = snapshot(&[meta(3, "same", 1, None), meta(5, "same", 1, None)]);
        let plan = plan_write(
            &scope(),
            &snap,
            &valid(&[Candidate::fact("same", "t")]),
            2,
            500,
        );
        assert_eq!(plan.outcomes, [Outcome::Deduped(3)]);
    }

    #[test]
    fn eviction_takes_least_recently_used_then_older_created_then_lower_seq() {
        let snap = snapshot(&[
            meta(0, "a", 10, Some(50)),
            meta(1, "b", 20, None),    // usage 20
            meta(2, "c", 5, Some(20)), // usage 20, created earlier than 1
            meta(3, "d", 30, None),
        ]);
        let plan = plan_write(
            &scope(),
            &snap,
            &valid(&[Candidate::fact("e", "t"), Candidate::fact("f", "t")]),
            100,
            4,
        );
        assert_eq!(plan.counts.evicted, 2);
        assert_eq!(plan.touched[&2].status, Status::Evicted);
        assert_eq!(plan.touched[&1].status, Status::Evicted);
        assert!(!plan.touched.contains_key(&3));
    }

    #[test]
    fn records_touched_in_the_write_move_to_the_back_of_the_eviction_order() {
        let snap = snapshot(&[meta(0, "a", 1, None), meta(1, "b", 2, None)]);
        let plan = plan_write(
            &scope(),
            &snap,
            &valid(&[
                Candidate::fact("x", "t").restating(id(0)),
                Candidate::fact("new", "t"),
            ]),
            100,
            2,
        );
        // Record 0 was restated at 100, so record 1 is the least recently used.
        assert_eq!(plan.touched[&1].status, Status::Evicted);
        assert_eq!(plan.touched[&0].status, Status::Active);
    }

    #[test]
    fn a_tiny_cap_can_evict_a_record_inserted_in_the_same_write() {
        let snap = snapshot(&[]);
        let plan = plan_write(
            &scope(),
            &snap,
            &valid(&[Candidate::fact("one", "t"), Candidate::fact("two", "t")]),
            7,
            1,
        );
        assert_eq!(
            plan.counts,
            WriteCounts {
                inserted: 2,
                evicted: 1,
                ..Default::default()
            }
        );
        assert_eq!(plan.touched[&0].status, Status::Evicted);
        assert_eq!(plan.touched[&1].status, Status::Active);
    }

    #[test]
    fn needs_name_only_this_scopes_pointers_and_a_bounded_eviction_head() {
        let cs = valid(&[
            Candidate::fact("A b", "t").restating(id(4)),
            Candidate::fact("a  B", "t").superseding("mem:org:x:1"),
        ]);
        let n = needs(&scope(), &cs, 10, 500);
        assert_eq!(n.seqs, [4]);
        assert_eq!(n.norms, ["a b"]);
        assert_eq!(n.eviction_head, 0);
        assert_eq!(needs(&scope(), &cs, 500, 500).eviction_head, 4);
    }
}
