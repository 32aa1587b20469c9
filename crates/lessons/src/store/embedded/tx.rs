//! The vocabulary of a write, shared by every file that builds, commits or follows one: the
//! transaction ([`Tx`]: one scope's batch and what it changes), a record's change in its scope's
//! active set ([`Change`], [`Old`]), the dedup keys it read or edits, and the decision-journal
//! entries it adds ([`Growth`]). It imports nothing of the store above it.

use std::collections::BTreeMap;
use std::sync::Arc;

use fjall::OwnedWriteBatch;

use crate::fts::FtsDoc;
use crate::model::{Kind, Record, Status};
use crate::store::codec::ScopeMeta;
use crate::store::counters::DayCounters;

/// `(lastUsedAt ?? createdAt, createdAt, seq)`: least recently used, then older, then lower seq.
pub(super) type LruKey = (i64, i64, u64);

/// A record's place in its scope's eviction order (`order::EvictionOrder`), as a change
/// carries it.
pub(super) fn lru_key(r: &Record, seq: u64) -> LruKey {
    (r.usage_time(), r.created_at, seq)
}

/// One scope's batch being built, with what it changes in the scope's active set. Built
/// under the scope's write lock (by `ScopeTx`, or a retrieve's use bump), filled by the edits
/// of the keyspaces' owners (`Records`, `DecisionJournal`), committed whole by
/// `Shared::commit`.
pub(super) struct Tx {
    batch: OwnedWriteBatch,
    /// Records entering, changing or leaving the active set, in order: the commit applies them
    /// to the scope's derived state (window, eviction order, FTS totals, held search).
    changes: Vec<Change>,
    /// The scope's bookkeeping after this batch, when the batch changes it.
    meta: Option<ScopeMeta>,
    /// Whether the scope's FTS totals are loaded, so a leaving record's document is needed.
    fts: bool,
    /// Dedup keys this transaction read or edits (written at commit).
    norms: DedupKeys,
    /// The scope's counters of one day after this transaction (written at commit).
    day: Option<(i64, DayCounters)>,
    /// The scope's counters of the day as the derived state last knew them.
    cached_day: Option<(i64, DayCounters)>,
    /// Decision-journal entries this transaction adds.
    journaled: Growth,
}

/// A transaction taken apart for its commit: the batch, and what follows it into memory.
pub(super) struct Sealed {
    pub(super) batch: OwnedWriteBatch,
    pub(super) changes: Vec<Change>,
    pub(super) meta: Option<ScopeMeta>,
    pub(super) day: Option<(i64, DayCounters)>,
    pub(super) journaled: Growth,
}

impl Tx {
    /// An empty transaction over `batch`; `fts` and `cached_day` come from the scope's derived
    /// state.
    pub(super) fn new(
        batch: OwnedWriteBatch,
        fts: bool,
        cached_day: Option<(i64, DayCounters)>,
    ) -> Tx {
        Tx {
            batch,
            changes: Vec::new(),
            meta: None,
            fts,
            norms: BTreeMap::new(),
            day: None,
            cached_day,
            journaled: Growth::default(),
        }
    }

    /// The batch, for the owner of a keyspace to write its keys into.
    pub(super) fn batch(&mut self) -> &mut OwnedWriteBatch {
        &mut self.batch
    }

    /// The dedup keys read or edited so far (`Records` keeps them).
    pub(super) fn dedup_keys(&mut self) -> &mut DedupKeys {
        &mut self.norms
    }

    /// Starts from the dedup keys a plan already read, so they are not read again: before any
    /// edit of a dedup key (one edited already is kept).
    pub(super) fn read_dedup_keys(&mut self, keys: DedupKeys) {
        for (key, value) in keys {
            self.norms.entry(key).or_insert(value);
        }
    }

    /// The scope's counters of `day` as this transaction left them, else as the derived state
    /// knew them; `None` when neither holds that day (the caller reads them).
    pub(super) fn take_day(&mut self, day: i64) -> Option<DayCounters> {
        match self.day.take() {
            Some((d, c)) if d == day => Some(c),
            _ => self
                .cached_day
                .take()
                .filter(|(d, _)| *d == day)
                .map(|(_, c)| c),
        }
    }

    /// The scope's counters of `day` after this transaction.
    pub(super) fn set_day(&mut self, day: i64, counters: DayCounters) {
        self.day = Some((day, counters));
    }

    /// The scope's bookkeeping after this transaction.
    pub(super) fn set_meta(&mut self, meta: ScopeMeta) {
        self.meta = Some(meta);
    }

    /// Decision-journal entries added to the batch.
    pub(super) fn journaled(&mut self, growth: Growth) {
        self.journaled.add(growth);
    }

    /// Whether the transaction changes nothing but records' use (a retrieve's bump).
    pub(super) fn only_uses(&self) -> bool {
        self.meta.is_none() && self.day.is_none() && self.norms.is_empty()
    }

    /// What is kept in memory until the commit, taken out for `Records::seal` to write: the
    /// bookkeeping, the dedup keys, the day's counters.
    pub(super) fn unsealed(
        &mut self,
    ) -> (
        Option<&ScopeMeta>,
        DedupKeys,
        Option<&(i64, DayCounters)>,
        &mut OwnedWriteBatch,
    ) {
        (
            self.meta.as_ref(),
            std::mem::take(&mut self.norms),
            self.day.as_ref(),
            &mut self.batch,
        )
    }

    /// The transaction taken apart for its commit.
    pub(super) fn into_sealed(self) -> Sealed {
        Sealed {
            batch: self.batch,
            changes: self.changes,
            meta: self.meta,
            day: self.day,
            journaled: self.journaled,
        }
    }

    /// Notes `r` entering the active set as record `seq`.
    pub(super) fn entered(&mut self, r: &Record, seq: u64) {
        self.changes.push(Change {
            seq,
            old: None,
            new: Some(Arc::new(r.clone())),
        });
    }

    /// Notes `r` (active until now) leaving the active set.
    pub(super) fn left(&mut self, r: &Record, seq: u64) {
        let old = Old {
            kind: r.kind,
            lru: lru_key(r, seq),
            fts: self.fts.then(|| FtsDoc::of(&r.text, &r.keywords)),
        };
        self.changes.push(Change {
            seq,
            old: Some(old),
            new: None,
        });
    }

    /// Notes an active record that stays active with the same text (its counts, times or
    /// provenance changed): the FTS totals are untouched, the eviction order moves it.
    pub(super) fn changed(&mut self, old: &Record, new: Arc<Record>, seq: u64) {
        self.changes.push(Change {
            seq,
            old: Some(Old {
                kind: old.kind,
                lru: lru_key(old, seq),
                fts: None,
            }),
            new: Some(new),
        });
    }
}

/// Dedup keys read or edited by a transaction: their values, and whether edited.
pub(super) type DedupKeys = BTreeMap<Vec<u8>, (Vec<u64>, bool)>;

/// One record's change in a scope's active set.
pub(super) struct Change {
    pub(super) seq: u64,
    /// What it was, if it was active.
    pub(super) old: Option<Old>,
    /// What it is now (its status says whether it is still active); `None`: it left.
    pub(super) new: Option<Arc<Record>>,
}

impl Change {
    /// Whether a fact entered, changed or left: only then can the window move.
    pub(super) fn touches_facts(&self) -> bool {
        self.old.as_ref().is_some_and(|o| o.kind == Kind::Fact)
            || self.new.as_ref().is_some_and(|r| r.kind == Kind::Fact)
    }

    /// The record as it is now, if it is active.
    pub(super) fn active(&self) -> Option<&Arc<Record>> {
        self.new.as_ref().filter(|r| r.status == Status::Active)
    }
}

/// What a record that was active leaves behind in the derived state.
pub(super) struct Old {
    pub(super) kind: Kind,
    pub(super) lru: LruKey,
    /// Its FTS document, when the scope's FTS totals are loaded and it leaves the active set.
    pub(super) fts: Option<FtsDoc>,
}

/// Decision-journal entries a batch adds to one scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Growth {
    pub(super) entries: usize,
    /// The time of the oldest of them (`i64::MAX`: none).
    pub(super) oldest: i64,
}

impl Default for Growth {
    fn default() -> Growth {
        Growth {
            entries: 0,
            oldest: i64::MAX,
        }
    }
}

impl Growth {
    pub(super) fn add(&mut self, other: Growth) {
        self.entries += other.entries;
        self.oldest = self.oldest.min(other.oldest);
    }
}

/// `r` with `status`.
pub(super) fn with_status(r: &Record, status: Status) -> Record {
    let mut out = r.clone();
    out.status = status;
    out
}
