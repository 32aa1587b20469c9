//! The decision journal on disk: entries join the batch of the write they describe; reads are
//! prefix scans newest first; the indexer thread prunes by age and per-scope cap.
//!
//! Pruning never scans a scope's whole journal on the write path's account. The pruner keeps,
//! per scope written since open, how many entries it holds and the time of its oldest: counted
//! once by a full scan, then kept by every commit that adds entries and every prune. A scope is
//! pruned only once it holds a sixteenth more than the cap or its oldest entry is a sixteenth
//! of the age limit past it, and then from its oldest end. Until then reads hide what pruning
//! will remove: a scope's journal reads as at most `cap` entries, none older than `days`.
//!
//! This file owns the journal's storage and retention; the merge of its per-class scans is
//! `journal_merge`, and the entries a write or a retire makes are `journal_entries`.
//!
//! **Invariant:** a read shows what the journal will hold once pruned, whatever the pruner has
//! done yet; an entry is written only in the batch of the write it describes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use fjall::{Database, Keyspace, OwnedWriteBatch, Readable};
use parking_lot::Mutex;

use super::group::GroupCommit;
use super::journal_merge::{Classes, Merged, Order, Ranks};
use super::journal_texts::{self, Texts};
use super::records::Records;
use super::tx::{Growth, Tx};
use crate::decisions::{Decision, DecisionEvent, DecisionQuery};
use crate::error::Result;
use crate::model::ScopeKey;
use crate::store::codec;
use crate::store::engine::st;
use crate::time::{Clock, DAY_MS};

/// What the pruner knows of one scope's journal (see the module's notes).
#[derive(Clone, Copy, Debug)]
struct Tally {
    /// Entries on disk: once `counted`, exact; before, those added since open.
    entries: usize,
    /// The time of the oldest entry (`i64::MAX`: none), once `counted`.
    oldest: i64,
    /// A full scan has counted the scope since open.
    counted: bool,
}

impl Default for Tally {
    fn default() -> Tally {
        Tally {
            entries: 0,
            oldest: i64::MAX,
            counted: false,
        }
    }
}

/// The tallies the last clean close recorded, if no batch came after them (`last_batch`);
/// otherwise none, and each scope is counted again when next written. Never fails an open:
/// the tallies only spare a count.
fn load_tallies(meta: &Keyspace, last_batch: u64) -> HashMap<ScopeKey, Tally> {
    let saved = match meta.get(codec::JOURNAL_TALLIES) {
        Ok(Some(v)) => codec::decode::<codec::JournalTallies>(&v, "the journal tallies"),
        Ok(None) => return Default::default(),
        Err(e) => Err(crate::store::engine::storage(
            "reading the journal tallies",
            e,
        )),
    };
    match saved {
        Ok(t) if t.batch == last_batch => t
            .scopes
            .into_iter()
            .filter_map(|(scope, entries, oldest)| {
                let tally = Tally {
                    entries: usize::try_from(entries).ok()?,
                    oldest,
                    counted: true,
                };
                Some((ScopeKey::parse(&scope).ok()?, tally))
            })
            .collect(),
        Ok(_) => Default::default(),
        Err(e) => {
            log::warn!("[store] {e}; each scope's decision journal is counted again");
            Default::default()
        }
    }
}

/// How a scope is pruned this round.
enum Prune {
    /// Not counted since open: scan it all, newest first.
    Count,
    /// Counted: remove from the oldest end, `entries` being what it holds.
    Oldest { entries: usize },
}

/// The decision journal on disk, and what pruning keeps of it.
pub(super) struct DecisionJournal {
    db: Database,
    entries: Keyspace,
    /// Where the tallies are recorded at a clean close.
    meta: Keyspace,
    /// Makes journal keys unique within a millisecond: seeded from the open time in
    /// nanoseconds, so it also grows across reopens.
    counter: AtomicU64,
    days: u32,
    cap: usize,
    /// What the pruner knows of each scope's journal written since open. Grown only by
    /// `grew`, which a commit calls under the group commit's lock; a read that found a scope
    /// uncounted adds it empty and uncounted (what `grew` would start from), so the pruner
    /// counts it too.
    tallies: Mutex<HashMap<ScopeKey, Tally>>,
    /// Held by whatever removes or rewrites stored entries (the pruner, the repair of entries
    /// whose record is gone), so a rewrite never brings back an entry pruned meanwhile.
    rewriting: Mutex<()>,
    clock: Clock,
}

impl DecisionJournal {
    /// The journal in `entries`, keeping `days` days and `cap` entries per scope; the tallies
    /// a clean close recorded are used while `last_batch` is still the last batch.
    pub(super) fn new(
        db: Database,
        entries: Keyspace,
        meta: Keyspace,
        (days, cap): (u32, usize),
        last_batch: u64,
        clock: Clock,
    ) -> DecisionJournal {
        let tallies = load_tallies(&meta, last_batch);
        DecisionJournal {
            db,
            entries,
            meta,
            counter: AtomicU64::new(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64),
            ),
            days,
            cap,
            tallies: Mutex::new(tallies),
            rewriting: Mutex::new(()),
            clock,
        }
    }

    /// Adds `entries` to `batch` whole, texts and all (an import's: their records may not be
    /// in this store); the commit of the batch must report the returned growth
    /// ([`grew`](Self::grew)).
    pub(super) fn add_to(
        &self,
        batch: &mut OwnedWriteBatch,
        entries: &[Decision],
    ) -> Result<Growth> {
        self.put(batch, entries, codec::encode_decision)
    }

    /// Adds `entries` to `batch`, each stored as `encode` has it.
    fn put(
        &self,
        batch: &mut OwnedWriteBatch,
        entries: &[Decision],
        encode: fn(&Decision) -> Result<Vec<u8>>,
    ) -> Result<Growth> {
        let mut growth = Growth::default();
        for d in entries {
            let counter = self.counter.fetch_add(1, Ordering::Relaxed);
            batch.insert(&self.entries, codec::decision_key(d, counter), encode(d)?);
            growth.add(Growth {
                entries: 1,
                oldest: d.time,
            });
        }
        Ok(growth)
    }

    /// Adds a write's own `entries` to its transaction's batch, which its commit reports: an
    /// entry whose text is its record's, written in the same batch or held retired, is stored
    /// without it (`codec::encode_written_decision`), and a read finds it in the record.
    pub(super) fn add(&self, tx: &mut Tx, entries: &[Decision]) -> Result<()> {
        let growth = self.put(tx.batch(), entries, codec::encode_written_decision)?;
        tx.journaled(growth);
        Ok(())
    }

    /// Counts entries a commit added (called under the group commit's lock, after the commit).
    pub(super) fn grew(&self, grew: &[(&ScopeKey, Growth)]) {
        let mut tallies = self.tallies.lock();
        for (scope, growth) in grew {
            let tally = tallies.entry((*scope).clone()).or_default();
            tally.entries += growth.entries;
            tally.oldest = tally.oldest.min(growth.oldest);
        }
    }

    /// Scopes the pruner has yet to count (see the module's notes).
    pub(super) fn uncounted(&self) -> usize {
        self.tallies.lock().values().filter(|t| !t.counted).count()
    }

    /// Records every counted scope's tally in its own batch, so the next open need not count
    /// (see `load_tallies`). Called at a clean close, once nothing else commits.
    pub(super) fn save_tallies(&self, group: &GroupCommit) -> Result<()> {
        let scopes = self
            .tallies
            .lock()
            .iter()
            .filter(|(_, t)| t.counted)
            .map(|(s, t)| (s.as_str().to_owned(), t.entries as u64, t.oldest))
            .collect();
        let value = codec::encode(&codec::JournalTallies {
            batch: group.last_batch() + 1,
            scopes,
        })?;
        let mut batch = self.db.batch();
        batch.insert(&self.meta, codec::JOURNAL_TALLIES, value);
        group.commit(batch, "recording the decision journal's tallies", || {})
    }

    /// Entries older than this are pruned, and no read shows them.
    fn cutoff(&self) -> i64 {
        (self.clock)().saturating_sub(i64::from(self.days) * DAY_MS)
    }

    /// `scope`'s entries, newest first, as `query` filters them. Entries of chosen events are
    /// read from those events' prefixes only, so the cost follows what is asked for and found,
    /// not the journal's length.
    pub(super) fn read(
        &self,
        group: &GroupCommit,
        records: &Records,
        scope: &ScopeKey,
        query: &DecisionQuery,
    ) -> Result<Vec<Decision>> {
        let mut out = Vec::new();
        self.visit(group, records, scope, query, &mut |d| {
            out.push(d);
            true
        })?;
        Ok(out)
    }

    /// [`read`](Self::read)'s entries handed to `visit` one at a time, as they are read, until
    /// it answers `false` or `query.limit` were handed: nothing past that is read or decoded.
    /// An entry stored without its text is handed with its record's (`records`).
    pub(super) fn visit(
        &self,
        group: &GroupCommit,
        records: &Records,
        scope: &ScopeKey,
        query: &DecisionQuery,
        visit: &mut dyn FnMut(Decision) -> bool,
    ) -> Result<()> {
        let mut handed = 0;
        // What pruning will remove reads as removed: entries past the cap or the age limit.
        let since = query.since.max(self.cutoff());
        let every = !query.never_used
            && (query.events.is_empty() || query.events.len() == DecisionEvent::ALL.len());
        let events = if every || query.events.is_empty() {
            &DecisionEvent::ALL[..]
        } else {
            &query.events[..]
        };
        // A read of every entry stops at the cap. A read of some, when the scope may hold more
        // than the cap, shows an entry only if it is among the cap newest of all classes: its
        // rank is counted by walking every class newest first beside it, in a snapshot taken
        // with the scope's tally and read from it too, so a prune or a write committed
        // meanwhile cannot move the cap. The walk reads only keys, and only as deep as the
        // entries handed (a few hundred for a review's evidence); finding the cap's floor from
        // the oldest end would read through the prunes' tombstones, 5-10 ms a read under load.
        let (snapshot, mut ranks) = if every {
            (None, None)
        } else {
            let (tally, snapshot) = group
                .between_commits(|| (self.tallies.lock().get(scope).copied(), self.db.snapshot()));
            let over = match tally {
                Some(t) => !t.counted || t.entries > self.cap,
                None => {
                    // A scope nobody wrote since open: the pruner counts it at its next round.
                    self.tallies.lock().entry(scope.clone()).or_default();
                    true
                }
            };
            let ranks = over.then(|| Ranks {
                all: self.merged(
                    Some(&snapshot),
                    scope,
                    Classes::ALL,
                    Order::NewestFirst,
                    false,
                ),
                counted: 0,
            });
            (Some(snapshot), ranks)
        };
        let classes = Classes {
            events,
            never_used: query.never_used,
        };
        let entries = self
            .merged(snapshot.as_ref(), scope, classes, Order::NewestFirst, true)
            .take(if every { self.cap } else { usize::MAX });
        let mut texts = Texts::new(&self.db, records);
        for entry in entries {
            let (k, v) = entry?;
            // Newest first: once past `since`, every later entry is older still.
            if codec::decision_time(&k).is_some_and(|t| t < since) {
                break;
            }
            // Past the oldest entry the cap keeps: older still, and hidden too.
            if let Some(ranks) = ranks.as_mut() {
                if !ranks.within(codec::decision_order(&k), self.cap)? {
                    break;
                }
            }
            let v = v.unwrap_or_default();
            let mut d = codec::decode_decision_of(&v, scope)?;
            if query.keeps(&d) {
                texts.restore(&v, &mut d)?;
                handed += 1;
                if !visit(d) || handed == query.limit {
                    break;
                }
            }
        }
        Ok(())
    }

    /// `scope`'s entries of `classes` in `order`, live or from `snapshot`, with their values
    /// when `values`.
    fn merged(
        &self,
        snapshot: Option<&fjall::Snapshot>,
        scope: &ScopeKey,
        classes: Classes<'_>,
        order: Order,
        values: bool,
    ) -> Merged {
        Merged::new(self.scan(snapshot, scope, classes), order, values)
    }

    /// One prefix scan per class of `scope`'s journal, live or from `snapshot` (read from
    /// either end by `Merged`).
    fn scan(
        &self,
        snapshot: Option<&fjall::Snapshot>,
        scope: &ScopeKey,
        classes: Classes<'_>,
    ) -> Vec<fjall::Iter> {
        classes
            .events
            .iter()
            .flat_map(|&e| codec::decision_prefixes(scope, e, classes.never_used))
            .map(|prefix| match snapshot {
                Some(snap) => snap.prefix(&self.entries, prefix),
                None => self.entries.prefix(prefix),
            })
            .collect()
    }

    /// Every entry, scope by scope, oldest first within a scope, so an import (which numbers
    /// entries in the order it reads them) keeps their order. Each scope is read from a
    /// snapshot of its own: a snapshot keeps every memtable written after it in memory until it
    /// is dropped, and one scope's journal is bounded by the cap while the whole store's is not.
    pub(super) fn export(
        &self,
        records: &Records,
        sink: &mut dyn FnMut(Decision) -> Result<()>,
    ) -> Result<()> {
        let scopes = self.scopes(&self.db.snapshot())?;
        for scope in scopes {
            let snap = self.db.snapshot();
            let all = Classes::ALL;
            // Whole: an export is imported into stores that may not hold the records.
            let mut texts = Texts::new(&self.db, records);
            for entry in self.merged(Some(&snap), &scope, all, Order::OldestFirst, true) {
                let (_, v) = entry?;
                let v = v.unwrap_or_default();
                let mut d = codec::decode_decision_of(&v, &scope)?;
                texts.restore(&v, &mut d)?;
                sink(d)?;
            }
        }
        Ok(())
    }

    /// Every scope with a journal entry in `snap`, found by seeking from one scope's prefix to
    /// the next.
    fn scopes(&self, snap: &fjall::Snapshot) -> Result<Vec<ScopeKey>> {
        let mut out = Vec::new();
        let mut from: Vec<u8> = Vec::new();
        while let Some(g) = snap.range(&self.entries, from.clone()..).next() {
            let k = g.key().map_err(st("reading the decision journal"))?;
            let Some(scope) = codec::scope_bytes(&k) else {
                return Err(crate::error::Error::format(
                    "a decision-journal key holds no scope separator",
                ));
            };
            let name = std::str::from_utf8(scope)
                .ok()
                .and_then(|n| ScopeKey::parse(n).ok())
                .ok_or_else(|| crate::error::Error::format("a decision-journal key's scope"))?;
            out.push(name);
            from = scope.to_vec();
            from.push(1);
        }
        Ok(out)
    }

    /// Adds entries read from an export, a durable batch per thousand.
    pub(super) fn import(&self, group: &GroupCommit, entries: &[Decision]) -> Result<u64> {
        for d in entries {
            d.validate()?;
        }
        for chunk in entries.chunks(1000) {
            let mut batch = self.db.batch();
            let mut by_scope: HashMap<&ScopeKey, Vec<Decision>> = HashMap::new();
            for d in chunk {
                by_scope.entry(&d.scope_key).or_default().push(d.clone());
            }
            let mut grew = Vec::with_capacity(by_scope.len());
            for (scope, list) in &by_scope {
                grew.push((*scope, self.add_to(&mut batch, list)?));
            }
            let ticket = group.append(batch, "importing decisions", || self.grew(&grew))?;
            group.wait_durable(ticket)?;
        }
        Ok(entries.len() as u64)
    }

    /// Re-keys every entry an older format keyed otherwise: format 3 and older (no class
    /// byte) and format 4's never-used evictions (keyed as every eviction), in durable
    /// batches; an entry already re-keyed is left, so an upgrade cut short is finished by the
    /// next. An entry whose value does not decode stays under its key (`Pass::whole`).
    pub(super) fn rekey(&self, group: &GroupCommit) -> Result<journal_texts::Pass> {
        let mut pass = journal_texts::Pass::new();
        let mut batch = self.db.batch();
        let mut in_batch = 0;
        for g in self.db.snapshot().iter(&self.entries) {
            // A block that does not read: the entries past it are not reached either.
            let Some((k, v)) = pass.read(g.into_inner()) else {
                break;
            };
            if !codec::may_need_rekey(&k) {
                continue;
            }
            let Some(d) = pass.read(codec::decode_decision(&v)) else {
                continue;
            };
            let Some(key) = codec::current_decision_key(&k, &d) else {
                continue;
            };
            batch.remove(&self.entries, k.to_vec());
            batch.insert(&self.entries, key, v.to_vec());
            pass.changed += 1;
            in_batch += 1;
            if in_batch == 10_000 {
                let full = std::mem::replace(&mut batch, self.db.batch());
                group.append_durably(full, "re-keying the decision journal")?;
                in_batch = 0;
            }
        }
        group.append_durably(batch, "re-keying the decision journal")?;
        Ok(pass)
    }

    /// Marks the entries a format 6 store wrote without their text (`journal_texts`).
    pub(super) fn mark_format6(
        &self,
        records: &Records,
        group: &GroupCommit,
    ) -> Result<journal_texts::Pass> {
        journal_texts::mark_format6(&self.db, &self.entries, records, group)
    }

    /// The entries that left their text to a record the store does not hold.
    pub(super) fn orphaned(&self, records: &Records) -> Result<Vec<Decision>> {
        let found = journal_texts::orphaned(&self.db, &self.entries, records)?;
        Ok(found.into_iter().map(|(_, d)| d).collect())
    }

    /// Stores the entries `orphaned` finds whole, without a text; returns how many.
    pub(super) fn repair_orphaned(&self, records: &Records, group: &GroupCommit) -> Result<u64> {
        let _rewriting = self.rewriting.lock();
        journal_texts::repair_orphaned(&self.db, &self.entries, records, group)
    }

    /// Drops entries older than `days` and beyond `cap` per scope, for the scopes due (see
    /// the module's notes). Runs on the indexer thread, never in a write.
    pub(super) fn prune(&self, group: &GroupCommit) -> Result<()> {
        let _rewriting = self.rewriting.lock();
        let cutoff = self.cutoff();
        let over = self.cap + self.cap / 16;
        let late = cutoff.saturating_sub(i64::from(self.days) * DAY_MS / 16);
        let due: Vec<(ScopeKey, Prune)> = self
            .tallies
            .lock()
            .iter()
            .filter_map(|(scope, t)| {
                let how = if !t.counted {
                    Prune::Count
                } else if t.entries > over || t.oldest < late {
                    Prune::Oldest { entries: t.entries }
                } else {
                    return None;
                };
                Some((scope.clone(), how))
            })
            .collect();
        for (scope, how) in due {
            match how {
                Prune::Count => self.count_and_prune(group, &scope, cutoff)?,
                Prune::Oldest { entries } => self.prune_oldest(group, &scope, entries, cutoff)?,
            }
        }
        Ok(())
    }

    /// Scans all of `scope`'s journal, newest first, removing what is past the cap or older
    /// than `cutoff`, and counts what it keeps.
    fn count_and_prune(&self, group: &GroupCommit, scope: &ScopeKey, cutoff: i64) -> Result<()> {
        // Taken between commits: entries committed after the snapshot are counted by `grew`
        // on top of the reset, those before it by the scan, none twice.
        let snapshot = group.between_commits(|| {
            self.tallies.lock().insert(scope.clone(), Tally::default());
            self.db.snapshot()
        });
        let mut batch = self.db.batch();
        let (mut kept, mut removed, mut oldest) = (0usize, 0usize, i64::MAX);
        let all = Classes::ALL;
        for entry in self.merged(Some(&snapshot), scope, all, Order::NewestFirst, false) {
            let (k, _) = entry?;
            let time = codec::decision_time(&k);
            if time.is_some_and(|t| t < cutoff) || kept >= self.cap {
                batch.remove(&self.entries, k.to_vec());
                removed += 1;
            } else {
                kept += 1;
                oldest = time.unwrap_or(oldest);
            }
        }
        commit_prune(group, batch, removed, || {
            let mut tallies = self.tallies.lock();
            let tally = tallies.entry(scope.clone()).or_default();
            tally.entries += kept;
            tally.oldest = tally.oldest.min(oldest);
            tally.counted = true;
        })
    }

    /// Removes `scope`'s oldest entries until it holds at most the cap (of the `entries` it
    /// held when the round began) and none older than `cutoff`.
    fn prune_oldest(
        &self,
        group: &GroupCommit,
        scope: &ScopeKey,
        entries: usize,
        cutoff: i64,
    ) -> Result<()> {
        let mut excess = entries.saturating_sub(self.cap);
        let mut batch = self.db.batch();
        let mut removed = 0usize;
        // Entries committed since the round began are newer than any this scan removes.
        let mut oldest = (self.clock)();
        let all = Classes::ALL;
        for entry in self.merged(None, scope, all, Order::OldestFirst, false) {
            let (k, _) = entry?;
            let time = codec::decision_time(&k);
            if excess == 0 && time.is_none_or(|t| t >= cutoff) {
                oldest = time.unwrap_or(oldest);
                break;
            }
            batch.remove(&self.entries, k.to_vec());
            removed += 1;
            excess = excess.saturating_sub(1);
        }
        commit_prune(group, batch, removed, || {
            let mut tallies = self.tallies.lock();
            let tally = tallies.entry(scope.clone()).or_default();
            tally.entries = tally.entries.saturating_sub(removed);
            tally.oldest = oldest;
        })
    }
}

/// Commits a prune's `batch` of `removed` entries (if any) and updates the scope's tally with
/// `tally` under the commit's lock, so no reader sees the prune without the tally that counts
/// it (see `visit`). Not fsynced: a prune lost to a crash is redone after the next open.
fn commit_prune(
    group: &GroupCommit,
    batch: OwnedWriteBatch,
    removed: usize,
    tally: impl FnOnce(),
) -> Result<()> {
    if removed > 0 {
        group.commit(batch, "pruning the decision journal", tally)
    } else {
        tally();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    fn journal(records: &Records) -> DecisionJournal {
        let ks = records.keyspaces();
        DecisionJournal::new(
            records.db().clone(),
            ks.decisions.clone(),
            ks.meta.clone(),
            (90, 100),
            0,
            Arc::new(|| NOW),
        )
    }

    #[test]
    fn a_read_of_a_scope_nobody_wrote_since_open_has_the_pruner_count_it() {
        let dir = tempfile::tempdir().expect("dir");
        let records = Records::open(dir.path(), dir.path(), 1 << 20).expect("records");
        let group = GroupCommit::new(
            records.db().clone(),
            records.keyspaces().meta.clone(),
            Vec::new(),
            dir.path().to_owned(),
            false,
            0,
        );
        let scope = ScopeKey::parse("repo:acme/app").expect("scope");
        let entries: Vec<Decision> = (0..150)
            .map(|i| {
                let event = if i % 3 == 0 {
                    DecisionEvent::Restated
                } else {
                    DecisionEvent::Inserted
                };
                Decision::new(NOW - 1_000 + i, &scope, event)
            })
            .collect();
        assert_eq!(
            journal(&records).import(&group, &entries).expect("import"),
            150
        );
        // As after an open whose tallies were not recorded: nobody has counted the scope.
        let reopened = journal(&records);
        assert_eq!(reopened.uncounted(), 0);
        let query = DecisionQuery {
            since: 0,
            events: vec![DecisionEvent::Restated],
            limit: 1_000,
            never_used: false,
        };
        let before = reopened
            .read(&group, &records, &scope, &query)
            .expect("read");
        // The newest 100 of the 150 are kept, a third of them restatements.
        assert_eq!(before.len(), 33, "{before:?}");
        assert_eq!(reopened.uncounted(), 1, "the read left the scope to count");
        reopened.prune(&group).expect("prune");
        assert_eq!(reopened.uncounted(), 0);
        assert_eq!(
            reopened
                .read(&group, &records, &scope, &query)
                .expect("read"),
            before
        );
    }
}
