//! A transaction's edits of the records: each writes its keys into the scope's [`Tx`] batch
//! and notes the change in the `Tx`, and `seal` writes what the `Tx` kept in memory (the
//! scope's bookkeeping, the dedup keys it edited, the day's counters) before the commit.
//!
//! **Invariant:** an edit only adds to the batch of the `Tx` it is given; nothing here commits.

use std::sync::Arc;

use super::Records;
use crate::error::Result;
use crate::model::{Record, ScopeKey};
use crate::store::codec;
use crate::store::counters::DayCounters;
use crate::store::embedded::tx::Tx;
use crate::store::engine::st;
use crate::text::normalize;
use crate::time::day_of;

impl Records {
    /// Writes an active record's keys (the record and its dedup key) and notes it entering.
    pub(in crate::store::embedded) fn put_active(
        &self,
        tx: &mut Tx,
        r: &Record,
        seq: u64,
    ) -> Result<()> {
        let scope = &r.scope_key;
        tx.batch().insert(
            &self.ks.active,
            codec::active_key(scope, r.kind, seq),
            codec::encode_record(r, seq)?,
        );
        if r.dedup_key {
            self.edit_dedup_key(tx, codec::norm_key(scope, &normalize(&r.text)), seq, true)?;
        }
        tx.entered(r, seq);
        Ok(())
    }

    /// Writes a record that never was active (an import's, or one a write inserted and evicted
    /// at once) straight to the retired keyspace.
    pub(in crate::store::embedded) fn put_retired(
        &self,
        tx: &mut Tx,
        r: &Record,
        seq: u64,
    ) -> Result<()> {
        tx.batch().insert(
            &self.ks.retired,
            codec::retired_key(&r.scope_key, seq),
            codec::encode_record(r, seq)?,
        );
        Ok(())
    }

    /// Moves an active record to the retired keyspace: `old` (as stored) names the keys to
    /// remove; `kept` (its retired status, plus any bump of the same write) is what stays.
    pub(in crate::store::embedded) fn retire(
        &self,
        tx: &mut Tx,
        old: &Record,
        kept: &Record,
        seq: u64,
    ) -> Result<()> {
        let scope = &old.scope_key;
        let key = codec::active_key(scope, old.kind, seq);
        if old.last_used_at.is_some() {
            // `kept` carries the use: the entry goes with the record.
            tx.batch().remove(&self.ks.usage, key.clone());
        }
        tx.batch().remove(&self.ks.active, key);
        if old.dedup_key {
            self.edit_dedup_key(
                tx,
                codec::norm_key(scope, &normalize(&old.text)),
                seq,
                false,
            )?;
        }
        self.put_retired(tx, kept, seq)?;
        tx.left(old, seq);
        Ok(())
    }

    /// Rewrites an active record whose counts or times changed: `new` was built from the
    /// record as read (its use included), so its usage entry is folded in and removed.
    pub(in crate::store::embedded) fn update_active(
        &self,
        tx: &mut Tx,
        old: &Record,
        new: &Record,
        seq: u64,
    ) -> Result<()> {
        let key = codec::active_key(&new.scope_key, new.kind, seq);
        if old.last_used_at.is_some() {
            // Only a record used before can have a usage entry.
            tx.batch().remove(&self.ks.usage, key.clone());
        }
        tx.batch()
            .insert(&self.ks.active, key, codec::encode_record(new, seq)?);
        tx.changed(old, Arc::new(new.clone()), seq);
        Ok(())
    }

    /// Records a retrieve's use of an active record (`new` is `old`, used once more): a small
    /// usage entry, not the record rewritten. The text and everything derived from it stay.
    pub(in crate::store::embedded) fn bump_active(
        &self,
        tx: &mut Tx,
        old: &Record,
        new: Arc<Record>,
        seq: u64,
    ) {
        if let Some(u) = codec::Usage::of(&new) {
            tx.batch().insert(
                &self.ks.usage,
                codec::active_key(&new.scope_key, new.kind, seq),
                codec::encode_usage(u),
            );
        }
        tx.changed(old, new, seq);
    }

    /// Adds `seq` to (or takes it from) a dedup key within `tx`: the key's value is read once
    /// per transaction, edited in memory, and written with the transaction.
    fn edit_dedup_key(&self, tx: &mut Tx, key: Vec<u8>, seq: u64, add: bool) -> Result<()> {
        let norms = tx.dedup_keys();
        if !norms.contains_key(&key) {
            let seqs = self.dedup_key(&key)?;
            norms.insert(key.clone(), (seqs, false));
        }
        if let Some((seqs, dirty)) = norms.get_mut(&key) {
            match (seqs.binary_search(&seq), add) {
                (Err(at), true) => seqs.insert(at, seq),
                (Ok(at), false) => {
                    seqs.remove(at);
                }
                _ => return Ok(()),
            }
            *dirty = true;
        }
        Ok(())
    }

    /// Changes the scope's counters of the day of `now` within `tx` (written at commit). The
    /// day's counters are read once: after that, from the scope's derived state.
    pub(in crate::store::embedded) fn add_day(
        &self,
        tx: &mut Tx,
        scope: &ScopeKey,
        now: i64,
        f: impl FnOnce(&mut DayCounters),
    ) -> Result<()> {
        let day = day_of(now);
        let mut counters = match tx.take_day(day) {
            Some(c) => c,
            None => {
                let key = codec::counters_key(day, scope);
                match self.ks.counters.get(&key).map_err(st("reading counters"))? {
                    Some(v) => codec::decode(&v, "a day's counters")?,
                    None => DayCounters::default(),
                }
            }
        };
        f(&mut counters);
        tx.set_day(day, counters);
        Ok(())
    }

    /// Writes what `tx` keeps in memory until its commit (the scope's bookkeeping, the dedup
    /// keys it edited, the day's counters) into its batch.
    pub(in crate::store::embedded) fn seal(&self, tx: &mut Tx, scope: &ScopeKey) -> Result<()> {
        let (meta, norms, day, batch) = tx.unsealed();
        if let Some(m) = meta {
            batch.insert(&self.ks.scopes, scope.as_str(), codec::encode(m)?);
        }
        for (key, (seqs, dirty)) in norms {
            if !dirty {
                continue;
            }
            if seqs.is_empty() {
                batch.remove(&self.ks.norms, key);
            } else {
                batch.insert(&self.ks.norms, key, codec::encode(&seqs)?);
            }
        }
        if let Some((d, counters)) = day {
            batch.insert(
                &self.ks.counters,
                codec::counters_key(*d, scope),
                codec::encode(counters)?,
            );
        }
        Ok(())
    }
}
