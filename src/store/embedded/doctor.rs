//! `doctor`: does the index hold exactly the active records, do the bookkeeping and the dedup
//! keys agree with the records; and `--repair`, which rewrites them from the records.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use fjall::Readable;

use super::super::codec::{self, ScopeMeta};
use super::{st, Shared};
use crate::error::Result;
use crate::model::{ScopeKey, Status};
use crate::text::normalize;

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
}

impl Health {
    /// Nothing to repair.
    pub fn is_ok(&self) -> bool {
        self.active_records == self.indexed_documents
            && self.missing_from_index.is_empty()
            && self.problems.is_empty()
            && !self.index_degraded
    }
}

impl Shared {
    /// Dedup keys that disagree with the active records.
    pub(super) fn norm_problems(&self) -> Result<Vec<(ScopeKey, u64, NormProblem)>> {
        let mut out = Vec::new();
        let snapshot = self.db.snapshot();
        for g in snapshot.iter(&self.ks.active) {
            let v = g.value().map_err(st("reading records"))?;
            let r = codec::decode_record(&v, None)?;
            let Some(seq) = r.seq() else { continue };
            let key = codec::norm_key(&r.scope_key, &normalize(&r.text), seq);
            if snapshot
                .get(&self.ks.norms, &key)
                .map_err(st("reading the dedup index"))?
                .is_none()
            {
                out.push((r.scope_key.clone(), seq, NormProblem::Missing));
            }
        }
        for g in snapshot.iter(&self.ks.norms) {
            let k = g.key().map_err(st("reading the dedup index"))?;
            let (Some(seq), Some(scope)) = (codec::trailing_seq(&k), codec::scope_bytes(&k)) else {
                continue;
            };
            let Some(scope) = std::str::from_utf8(scope)
                .ok()
                .and_then(|n| ScopeKey::parse(n).ok())
            else {
                continue;
            };
            let holds = match self.load_active(&scope, seq)? {
                Some(r) => codec::norm_key(&scope, &normalize(&r.text), seq) == k.as_ref(),
                None => false,
            };
            if !holds {
                out.push((scope, seq, NormProblem::Dangling));
            }
        }
        Ok(out)
    }

    /// Rewrites every scope's bookkeeping and dedup keys from its records, one scope at a time
    /// under its lock. Returns how many entries it changed.
    pub(super) fn repair_bookkeeping(&self) -> Result<u64> {
        let mut changed = 0;
        let problems = self.norm_problems()?;
        for scope in self.all_scopes()? {
            let lock = self.scope_lock(&scope);
            let _guard = lock.lock();
            let derived = self.derive_meta(&scope)?;
            let stored = self.stored_meta(&scope)?;
            let mut batch = self.db.batch();
            let meta = ScopeMeta {
                next_seq: stored.map_or(0, |m| m.next_seq).max(derived.next_seq),
                active: derived.active,
            };
            if stored != Some(meta) {
                batch.insert(&self.ks.scopes, scope.as_str(), codec::encode(&meta)?);
                changed += 1;
            }
            for (_, seq, problem) in problems.iter().filter(|(sc, _, _)| *sc == scope) {
                match problem {
                    NormProblem::Missing => {
                        if let Some(r) = self.load_active(&scope, *seq)? {
                            batch.insert(
                                &self.ks.norms,
                                codec::norm_key(&scope, &normalize(&r.text), *seq),
                                [],
                            );
                            changed += 1;
                        }
                    }
                    NormProblem::Dangling => {
                        // The key's hash is unknown here: remove every key of this seq that
                        // does not match the record's text.
                        let wanted = match self.load_active(&scope, *seq)? {
                            Some(r) => Some(codec::norm_key(&scope, &normalize(&r.text), *seq)),
                            None => None,
                        };
                        for g in self.ks.norms.prefix(codec::scope_key_prefix(&scope)) {
                            let k = g.key().map_err(st("reading the dedup index"))?;
                            if codec::trailing_seq(&k) == Some(*seq)
                                && wanted.as_deref() != Some(k.as_ref())
                            {
                                batch.remove(&self.ks.norms, k.to_vec());
                                changed += 1;
                            }
                        }
                    }
                }
            }
            let ticket = self.append(batch)?;
            self.wait_durable(ticket)?;
            self.verified.lock().insert(scope.clone());
            // The eviction order is rebuilt from the records on next need.
            self.lru.lock().remove(&scope);
            self.windows.lock().remove(&scope);
        }
        Ok(changed)
    }

    pub(super) fn check(&self) -> Result<Health> {
        let mut health = Health {
            index_degraded: self.index_degraded.load(Ordering::SeqCst),
            indexed_documents: self.index.num_docs(),
            ..Health::default()
        };
        let mut per_scope: HashMap<ScopeKey, u64> = HashMap::new();
        let snapshot = self.db.snapshot();
        for g in snapshot.iter(&self.ks.active) {
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
            if !self.index.contains(&r.id)? {
                push_first(&mut health.missing_from_index, r.id.clone());
            }
        }
        for scope in self.all_scopes()? {
            let derived = self.derive_meta(&scope)?;
            match self.stored_meta(&scope)? {
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
        for (scope, seq, norm_key) in self.norm_problems()? {
            push_first(
                &mut health.problems,
                match norm_key {
                    NormProblem::Missing => {
                        format!("{} has no dedup key", scope.record_id(seq))
                    }
                    NormProblem::Dangling => format!(
                        "a dedup key points at {}, which is not an active record with that text",
                        scope.record_id(seq)
                    ),
                },
            );
        }
        Ok(health)
    }
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
