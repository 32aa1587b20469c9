//! Retrieve: the reference Worker's FTS5 prefilter, the pool ranked, and the answer's usage
//! recorded. The prefilter is answered by the scope's active records held in memory (`search`)
//! when they fit the scope's share of the memory bounds, and otherwise by the keyword index
//! (tantivy) and the writes staged since its last commit, hydrated from fjall. Both give the
//! same pool.
//!
//! **Invariant:** an acknowledged write is found: a commit applies its changes to the held
//! search before the writer returns; on the indexed path the indexer reloads the searcher
//! before it forgets a pending write, so every write is in the committed index or still
//! pending (and a pending one wins).
//! **Invariant:** on the indexed path every hit is hydrated from fjall and dropped unless
//! active, so a stale index entry never reaches the answer.
//! **Invariant:** a read answers even when its usage bump cannot be written; a damaged store
//! records no usage at all.

use std::sync::Arc;

use super::scopes::Scope;
use super::shared::Shared;
use crate::error::Result;
use crate::model::{Record, Retrieved, ScopeKey};
use crate::rank::{rank, rank_by};
use crate::store::{validate_limit, validate_query};
use crate::text::{lowercase, token_slices};

/// `MemoryStore::retrieve_marked`: the ranked records, bumped, each marked with whether this
/// was its first use.
pub(super) fn retrieve(
    s: &Shared,
    scope: &ScopeKey,
    query: &str,
    limit: usize,
) -> Result<Vec<Retrieved>> {
    validate_limit(limit)?;
    validate_query(query)?;
    let lowered = lowercase(query);
    let tokens = token_slices(&lowered);
    if tokens.is_empty() {
        return Ok(Vec::new());
    }
    let terms = crate::fts::match_terms_of(&tokens);
    let state = s.scopes.get(scope);
    let search = s.scopes.search(&s.records, scope, &state)?;
    // One time for the ranking's recency and the bump's `lastUsedAt`.
    let now = (s.clock)();
    let ranked: Vec<Arc<Record>> = match &search {
        Some(search) => {
            let search = search.read();
            let pool = search.pool(&terms, crate::fts::pool_size(limit));
            let words = search.query_words(&tokens);
            rank_by(pool, now, limit, |d| {
                (words.score(d), d.record.usage_time())
            })
            .into_iter()
            .map(|d| Arc::clone(&d.record))
            .collect()
        }
        None => {
            let scored = scored_hits(s, scope, &state, &terms)?;
            let candidates = fill_pool(s, scope, scored, limit)?;
            rank(&tokens, candidates, now, limit)
                .into_iter()
                .map(Arc::new)
                .collect()
        }
    };
    if ranked.is_empty() {
        return Ok(Vec::new());
    }
    if s.witness.damaged() {
        // A damaged store answers reads but records nothing, usage included.
        return Ok(ranked
            .into_iter()
            .map(|record| Retrieved {
                first_use: record.last_used_at.is_none(),
                record: Arc::unwrap_or_clone(record),
            })
            .collect());
    }
    bump_usage(s, scope, &state, ranked, now)
}

/// Every active record holding a term, scored as the reference Worker's FTS5 `bm25()`
/// scores it: the committed index answers for most, and writes staged since its last
/// commit answer for themselves (the indexer reloads the searcher before it forgets a
/// pending write, so every acknowledged write is in one of the two; a pending one wins).
fn scored_hits(
    s: &Shared,
    scope: &ScopeKey,
    state: &Scope,
    terms: &[String],
) -> Result<Vec<(f64, u64)>> {
    let stats = s.scopes.fts(&s.records, scope, state)?;
    let pending = s.queue.pending_hits(scope, terms);
    let mut hits: crate::text::FnvMap<u64, crate::store::index::Hit> = s
        .index
        .matches(scope.as_str(), terms)?
        .into_iter()
        .map(|h| (h.seq, h))
        .collect();
    for h in pending {
        hits.insert(h.seq, h);
    }
    let idfs: Vec<f64> = terms
        .iter()
        .map(|t| crate::fts::idf(stats.totals.rows, stats.hits(t)))
        .collect();
    Ok(hits
        .values()
        .map(|h| {
            (
                crate::fts::bm25(&idfs, &h.freqs, h.len, stats.totals),
                h.seq,
            )
        })
        .collect())
}

/// Every hit ordered, then the pool filled from the front with records still active: a
/// hit the index has not yet dropped is skipped, as the Worker never saw it.
fn fill_pool(
    s: &Shared,
    scope: &ScopeKey,
    mut scored: Vec<(f64, u64)>,
    limit: usize,
) -> Result<Vec<Record>> {
    let pool = crate::fts::pool_size(limit);
    crate::fts::order_pool(&mut scored, usize::MAX);
    let mut candidates = Vec::with_capacity(pool.min(scored.len()));
    // Unlocked: one snapshot, so each record is read with its own use.
    let snapshot = s.records.snapshot();
    for (_, seq) in scored {
        if candidates.len() == pool {
            break;
        }
        if let Some(r) = s.records.load_active_at(&snapshot, scope, seq)? {
            candidates.push(r);
        }
    }
    Ok(candidates)
}

/// The ranked records with their use recorded (`useCount` + 1, `lastUsedAt` now), each
/// re-read under the scope lock: a write may have changed it since it was ranked.
fn bump_usage(
    s: &Shared,
    scope: &ScopeKey,
    state: &Scope,
    ranked: Vec<Arc<Record>>,
    now: i64,
) -> Result<Vec<Retrieved>> {
    let _guard = state.write.lock();
    // Under the scope's write lock a held search is as committed (read it again: a commit
    // since the ranking may have let it go).
    let search = state.held_search();
    // Usage bumps are not worth an fsync each (nobody waits on this batch's ticket): they
    // survive a process crash, and a power loss costs at most the last bumps. Each is a
    // small usage entry, not the record rewritten: a retrieve writes ~200 bytes, not eight
    // records, so the records' memtable fills (and flushes, which stalls its writers)
    // at the pace of writes, not of reads.
    let mut tx = s.tx(state);
    let mut out = Vec::with_capacity(ranked.len());
    let mut unbumped = Vec::with_capacity(ranked.len());
    for r in ranked {
        let Some(seq) = r.seq() else { continue };
        let current = match &search {
            Some(held) => held.read().record(seq),
            None => s.records.load_active(scope, seq)?.map(Arc::new),
        };
        let Some(old) = current else {
            continue;
        };
        let mut new = Record::clone(&old);
        new.use_count += 1;
        new.last_used_at = Some(now);
        let new = Arc::new(new);
        s.records.bump_active(&mut tx, &old, Arc::clone(&new), seq);
        out.push(new);
        unbumped.push(old);
    }
    // A read must answer even when its bump cannot be written (a full disk): the bump is
    // bookkeeping, the records are the answer. The failure is logged, not returned.
    match s.commit(scope, state, tx, Vec::new()) {
        Ok(_unwaited) => {}
        Err(e) => {
            log::warn!("[store] {scope}: retrieve answered without recording its use: {e}");
            for (r, unused) in out.iter_mut().zip(&unbumped) {
                *r = Arc::clone(unused);
            }
        }
    }
    Ok(out
        .into_iter()
        .zip(unbumped)
        .map(|(record, old)| Retrieved {
            // The derived state shares the bumped record until the next change to it.
            record: Arc::unwrap_or_clone(record),
            first_use: old.last_used_at.is_none(),
        })
        .collect())
}
