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
use crate::store::validate::{validate_limit, validate_query};
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
            // Ranked from fjall: with every use the scope's derived state holds.
            state.settle();
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
    if s.witness.damaged() || s.group.failed() {
        // A damaged store answers reads but records nothing, usage included; nor does one
        // whose disk failed a write (it commits nothing more).
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
///
/// Usage bumps are not worth an fsync each (nobody waits on them), nor a wait for fjall's
/// journal: the bump is applied to the scope's derived state at once and its batch committed
/// by the use committer (`uses`, `commit_uses`), so a retrieve does not queue behind a commit,
/// or behind fjall's flush worker fsyncing its journal under the lock every commit takes. (One
/// whose scope's records are not held reads them from fjall, and so first waits for the
/// scope's earlier bumps, if any are still on their way.) A crash costs the bumps not yet committed (a few milliseconds' worth) and, as
/// for every unacknowledged batch, those fjall had not yet handed to the OS. Each is a small
/// usage entry, not the record rewritten: a retrieve writes ~200 bytes, not eight records, so
/// the records' memtable fills (and flushes) at the pace of writes, not of reads.
fn bump_usage(
    s: &Shared,
    scope: &ScopeKey,
    state: &Arc<Scope>,
    ranked: Vec<Arc<Record>>,
    now: i64,
) -> Result<Vec<Retrieved>> {
    let _guard = state.write.lock();
    // Under the scope's write lock a held search is as committed, and ahead of the records by
    // the bumps not yet settled (read it again: a commit since the ranking may have let it go).
    let search = state.held_search();
    if search.is_none() {
        // Read from fjall: first every bump the derived state holds.
        state.settle();
    }
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
    // A read answers even when its bump cannot be written (a full disk): the bump is
    // bookkeeping, the records are the answer. The committer logs a failure.
    s.defer_uses(scope, state, tx);
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

/// The use committer thread: commits the retrieves' use batches in the order they were handed
/// over, each numbered like any batch and none fsynced (nobody waits on them; the next fsync
/// of the journal covers them), until the queue stops. A batch that fails (a full disk)
/// leaves its scope's derived state ahead of the records; after it the store commits nothing
/// more (`GroupCommit`'s latch) and retrieves record no use, so that state is dropped where
/// its lock is free, to be read again from the records (never waited for: a writer holding it
/// may be waiting for this thread).
pub(super) fn commit_uses(s: &Shared) {
    /// Stops the queue however the thread ends, so no caller waits for it forever.
    struct Stop<'a>(&'a Shared);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.uses.stop();
        }
    }
    let _stop = Stop(s);
    while let Some(round) = s.uses.take() {
        let n = round.len();
        for mut pending in round {
            let Some(batch) = pending.take_batch() else {
                continue;
            };
            if let Err(e) = s
                .group
                .commit(batch, "recording retrieved records' use", || {})
            {
                log::warn!(
                    "[store] {}: a retrieve's use was not recorded: {e}",
                    pending.scope
                );
                let (scope, state) = (pending.scope.clone(), Arc::clone(&pending.state));
                drop(pending);
                let guard = state.write.try_lock();
                if guard.is_some() {
                    s.scopes.reset(&scope, &state);
                }
                drop(guard);
            }
        }
        s.uses.done(n);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use crate::model::{Candidate, ScopeKey};
    use crate::store::embedded::EmbeddedStore;
    use crate::store::{ListQuery, MemoryStore, WriteOptions};

    fn scope() -> ScopeKey {
        ScopeKey::parse("repo:acme/app").expect("scope")
    }

    fn lessons(store: &EmbeddedStore, n: usize) {
        let facts: Vec<Candidate> = (0..n)
            .map(|i| {
                Candidate::fact(
                    format!("lesson {i}: warm the cache of module {i} before the tests"),
                    "slack:C1:1",
                )
            })
            .collect();
        store
            .write(&scope(), &facts, &WriteOptions::default())
            .expect("write");
    }

    fn upkeep(store: &EmbeddedStore) -> crate::store::Upkeep {
        store
            .upkeep()
            .expect("the embedded store reports its upkeep")
    }

    fn uses_of(store: &EmbeddedStore, id: &str) -> u64 {
        store.get(id).expect("get").expect("stored").use_count
    }

    #[test]
    fn a_retrieve_answers_while_every_commit_waits_and_its_use_lands_after() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = std::sync::Arc::new(EmbeddedStore::open(dir.path()).expect("open"));
        lessons(&store, 3);
        let first = store
            .retrieve(&scope(), "cache module", 8)
            .expect("retrieve");
        assert_eq!(first.len(), 3);
        let id = first[0].id.clone();
        let s = &*store.shared;
        // No batch can commit while this runs: a retrieve that committed its own bump would
        // wait here until the test gave up.
        // (A thread of its own, not a scoped one: should the retrieve block, the test fails,
        // which releases the commits, instead of waiting for it forever.)
        let waiting = s.group.between_commits(|| {
            let (tx, rx) = mpsc::channel();
            let reader = std::sync::Arc::clone(&store);
            std::thread::spawn(move || {
                let _ = tx.send(reader.retrieve(&scope(), "cache module", 8));
            });
            let answer = rx
                .recv_timeout(Duration::from_secs(20))
                .expect("the retrieve answered while commits were held")
                .expect("retrieve");
            let mine = answer.iter().find(|r| r.id == id).expect("the same record");
            assert_eq!(mine.use_count, 2, "answered with its own use");
            upkeep(&store).uses_waiting
        });
        assert!(waiting >= 1, "its use waited for the committer: {waiting}");
        // A reader of the records waits for the use to land.
        assert_eq!(uses_of(&store, &id), 2);
        store.flush().expect("flush");
        assert_eq!(upkeep(&store).uses_waiting, 0);
    }

    #[test]
    fn uses_reach_every_reader_and_survive_a_close() {
        let dir = tempfile::tempdir().expect("tempdir");
        let id = {
            let store = EmbeddedStore::open(dir.path()).expect("open");
            lessons(&store, 4);
            let mut id = String::new();
            for _ in 0..200 {
                let answer = store
                    .retrieve(&scope(), "cache module", 1)
                    .expect("retrieve");
                id.clone_from(&answer[0].id);
            }
            // Each reader sees every use at once: the window, a filtered list, a get, the export.
            let window = store.window(&scope(), 10).expect("window").to_records();
            let listed = store
                .list(
                    &scope(),
                    &ListQuery {
                        query: Some("cache".into()),
                        ..ListQuery::window(10)
                    },
                )
                .expect("list");
            let mut exported = Vec::new();
            store
                .export(&mut |r| {
                    exported.push(r);
                    Ok(())
                })
                .expect("export");
            for (name, records) in [("window", window), ("list", listed), ("export", exported)] {
                let r = records.iter().find(|r| r.id == id).expect("found");
                assert_eq!(r.use_count, 200, "{name}");
            }
            assert_eq!(uses_of(&store, &id), 200);
            // A write plans on them too: restating a record keeps its uses and adds one.
            let again = Candidate::fact(
                "lesson 0: warm the cache of module 0 before the tests",
                "slack:C1:2",
            );
            store
                .write(&scope(), &[again], &WriteOptions::default())
                .expect("write");
            for _ in 0..50 {
                store
                    .retrieve(&scope(), "cache module", 1)
                    .expect("retrieve");
            }
            store.close().expect("close");
            id
        };
        let store = EmbeddedStore::open(dir.path()).expect("reopen");
        // 250 retrieves of one record each, and the restatement, which counts as a use too.
        let before: u64 = 251;
        let total: u64 = store
            .list(&scope(), &ListQuery::window(10))
            .expect("list")
            .iter()
            .map(|r| r.use_count)
            .sum();
        assert_eq!(total, before, "every use was committed by the close");
        assert!(uses_of(&store, &id) >= 200);
    }
}
