//! The records checked against themselves, for `doctor`: every value of every keyspace
//! decoded, every active record under its own key, every usage entry naming an active record,
//! every dedup key as the records call for it.
//!
//! **Invariant:** these only read, each from one snapshot; a repair's removals go into a batch
//! its caller commits (`remove_usage`).

use fjall::{OwnedWriteBatch, Readable};

use super::Records;
use crate::error::{Error, ErrorKind, Result};
use crate::model::{Kind, Record, ScopeKey, Status};
use crate::store::codec::{self, ScopeMeta};
use crate::store::counters::DayCounters;
use crate::store::engine::{cause, describe_fjall, st};

/// What is wrong with a record's dedup key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::store::embedded) enum NormProblem {
    /// An active record has no dedup key.
    Missing,
    /// A dedup key names no active record with that text.
    Dangling,
}

/// How one keyspace's values decode.
type Decode<'a> = dyn Fn(&[u8]) -> Result<()> + 'a;

impl Records {
    /// Every stored active record from `snapshot`, handed to `visit` with whether it is stored
    /// as an active record under its own key (`None` for a record without a sequence number).
    pub(in crate::store::embedded) fn visit_stored_active(
        &self,
        snapshot: &fjall::Snapshot,
        visit: &mut dyn FnMut(Record, Option<bool>) -> Result<()>,
    ) -> Result<()> {
        for g in snapshot.iter(&self.ks.active) {
            let (k, v) = g.into_inner().map_err(st("reading records"))?;
            let r = codec::decode_record(&v, None)?;
            let placed = r.seq().map(|seq| {
                r.status == Status::Active
                    && k.as_ref() == codec::active_key(&r.scope_key, r.kind, seq).as_slice()
            });
            visit(r, placed)?;
        }
        Ok(())
    }

    /// Usage entries (of `scope`, or of every scope) whose record is not active: every write
    /// that retires or removes a record removes its entry in the same batch, so one is
    /// bookkeeping left behind by damage, read by nothing, and removed by a repair.
    pub(in crate::store::embedded) fn orphan_usage(
        &self,
        snapshot: &fjall::Snapshot,
        scope: Option<&ScopeKey>,
    ) -> Result<Vec<(ScopeKey, u64)>> {
        let entries: Box<dyn Iterator<Item = fjall::Guard>> = match scope {
            Some(s) => Box::new(snapshot.prefix(&self.ks.usage, codec::scope_key_prefix(s))),
            None => Box::new(snapshot.iter(&self.ks.usage)),
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
            if fjall::Readable::get(snapshot, &self.ks.active, k.as_ref())
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
    pub(in crate::store::embedded) fn norm_problems(
        &self,
    ) -> Result<Vec<(ScopeKey, u64, NormProblem)>> {
        let snapshot = self.snapshot();
        let mut wanted = self.wanted_dedup_keys(&snapshot, None)?;
        let mut out = Vec::new();
        for g in snapshot.iter(&self.ks.norms) {
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

    /// Reads and decodes every value of every keyspace; names each keyspace where one fails.
    pub(in crate::store::embedded) fn unreadable_values(&self) -> Vec<String> {
        let mut out = Vec::new();
        let snapshot = self.snapshot();
        let record = |v: &[u8]| codec::decode_record(v, None).map(drop);
        let decision = |v: &[u8]| codec::decode_decision(v).map(drop);
        let meta = |v: &[u8]| codec::decode::<ScopeMeta>(v, "a scope's bookkeeping").map(drop);
        let day = |v: &[u8]| codec::decode::<DayCounters>(v, "a day's counters").map(drop);
        let outbox = |v: &[u8]| codec::decode::<Vec<String>>(v, "an outbox entry").map(drop);
        let usage = |v: &[u8]| codec::decode_usage(v).map(drop);
        let any = |_: &[u8]| Ok(());
        for (name, ks) in self.ks.named() {
            // How each keyspace's values decode (those of `norms` and `meta` are raw bytes), and
            // whether its keys are records' (retired or active): a record is named by its key,
            // so the damaged scope can be found.
            let (decode, record_keys): (&Decode<'_>, Option<bool>) = match name {
                "records (active)" => (&record, Some(false)),
                "records (retired)" => (&record, Some(true)),
                "the records' use" => (&usage, None),
                "the scopes' bookkeeping" => (&meta, None),
                "the day counters" => (&day, None),
                "the index outbox" => (&outbox, None),
                "the decision journal" => (&decision, None),
                _ => (&any, None),
            };
            let mut failures = 0u64;
            let mut first: Option<String> = None;
            for g in snapshot.iter(ks) {
                let failed = match g.into_inner() {
                    Ok((k, v)) => decode(&v).err().map(|e| {
                        match record_keys.and_then(|retired| codec::record_id_of_key(&k, retired)) {
                            Some(id) => format!("{id}: {}", cause(&e)),
                            None => cause(&e).to_owned(),
                        }
                    }),
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
                // One line per keyspace: fewer than doctor's 20 a list.
                out.push(format!("{name}: {failures} value(s), first: {reason}"));
            }
        }
        out
    }

    /// Removes the usage entry of `scope`'s record `seq`, whichever its kind, in `batch`.
    pub(in crate::store::embedded) fn remove_usage(
        &self,
        batch: &mut OwnedWriteBatch,
        scope: &ScopeKey,
        seq: u64,
    ) {
        for kind in [Kind::Fact, Kind::Summary] {
            batch.remove(&self.ks.usage, codec::active_key(scope, kind, seq));
        }
    }
}
