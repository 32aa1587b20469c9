//! The dedup keys as the active records call for them: what they must be, read from the
//! records, and their rewrite (a repair, one scope) or rebuild (a format upgrade, every scope).
//!
//! **Invariant:** a dedup key lists, in ascending order, exactly the active records with a
//! dedup key whose text normalizes to its hash; these functions derive it from the records
//! alone, so a rewrite or a rebuild cut short is redone from the same source.

use std::collections::BTreeMap;

use fjall::{OwnedWriteBatch, Readable};

use super::Records;
use crate::error::Result;
use crate::model::ScopeKey;
use crate::store::codec;
use crate::store::engine::st;
use crate::text::normalize;

impl Records {
    /// The dedup keys `scope`'s active records call for: each normalized text's hash, listing
    /// the records (with a dedup key) whose text normalizes to it.
    pub(in crate::store::embedded) fn wanted_dedup_keys(
        &self,
        snapshot: &fjall::Snapshot,
        scope: Option<&ScopeKey>,
    ) -> Result<BTreeMap<Vec<u8>, Vec<u64>>> {
        let mut wanted: BTreeMap<Vec<u8>, Vec<u64>> = Default::default();
        let records: Box<dyn Iterator<Item = fjall::Guard>> = match scope {
            Some(s) => Box::new(snapshot.prefix(&self.ks.active, codec::scope_key_prefix(s))),
            None => Box::new(snapshot.iter(&self.ks.active)),
        };
        for g in records {
            let v = g.value().map_err(st("reading records"))?;
            let r = codec::decode_record(&v, None)?;
            let Some(seq) = r.seq() else { continue };
            if r.dedup_key {
                wanted
                    .entry(codec::norm_key(&r.scope_key, &normalize(&r.text)))
                    .or_default()
                    .push(seq);
            }
        }
        for seqs in wanted.values_mut() {
            seqs.sort_unstable();
        }
        Ok(wanted)
    }

    /// Rewrites `scope`'s dedup keys from its active records into `batch`; returns how many
    /// keys changed.
    pub(in crate::store::embedded) fn rewrite_dedup_keys(
        &self,
        batch: &mut fjall::OwnedWriteBatch,
        scope: &ScopeKey,
    ) -> Result<u64> {
        let ks = &self.ks;
        let snapshot = self.snapshot();
        let wanted = self.wanted_dedup_keys(&snapshot, Some(scope))?;
        let mut changed = 0;
        for g in snapshot.prefix(&ks.norms, codec::scope_key_prefix(scope)) {
            let (k, v) = g.into_inner().map_err(st("reading the dedup index"))?;
            let held = codec::decode_seqs(&v).unwrap_or_default();
            if wanted.get(k.as_ref()) != Some(&held) {
                batch.remove(&ks.norms, k.to_vec());
                changed += 1;
            }
        }
        for (k, seqs) in wanted {
            let current = snapshot
                .get(&ks.norms, &k)
                .map_err(st("reading the dedup index"))?
                .map(|v| codec::decode_seqs(&v).unwrap_or_default());
            if current.as_ref() != Some(&seqs) {
                batch.insert(&ks.norms, k, codec::encode(&seqs)?);
                changed += 1;
            }
        }
        Ok(changed)
    }

    /// Removes every dedup key (outside any batch: a format upgrade's first step, rebuilt by
    /// `put_dedup_key` batches that follow).
    pub(in crate::store::embedded) fn clear_dedup_keys(&self) -> Result<()> {
        self.ks
            .norms
            .clear()
            .map_err(st("clearing the version 1 dedup keys"))
    }

    /// Writes dedup key `key`, listing `seqs`, into `batch`.
    pub(in crate::store::embedded) fn put_dedup_key(
        &self,
        batch: &mut OwnedWriteBatch,
        key: Vec<u8>,
        seqs: &[u64],
    ) -> Result<()> {
        batch.insert(&self.ks.norms, key, codec::encode(&seqs)?);
        Ok(())
    }
}
