//! The derived keyword index kept up with the records: the indexer thread that commits the
//! queued changes in groups, and recovery (outbox replay, rebuild) at open.
//!
//! **Invariant:** a commit's payload (`Mark`) claims only operations whose batches are durable:
//! the journal is fsynced first, so the index never holds a record whose batch could be lost,
//! and the payload records how far the durable journal reached (the witness `evidence` checks
//! at open).
//! **Invariant:** an outbox entry is removed only once a committed index covers it.

use super::queue::{Staged, Work};
use super::shared::Shared;
use crate::error::Result;
use crate::model::RecordId;
use crate::store::index::{IndexOp, Mark};

/// The indexer thread: hands changes to the index writer as they gather, commits whenever
/// enough are pending or the interval passed, and prunes the decision journal after each
/// commit, until the queue is stopped.
pub(super) fn run(s: &Shared) {
    let mut commit_by = s.queue.next_commit();
    let mut failed = false;
    loop {
        match s.queue.wait_for_work(commit_by, failed) {
            Work::Stage => {
                let mut staged = s.queue.committing();
                // A failure degrades the queue; the outbox keeps the changes for the next open.
                let _ = stage(s, &mut staged, &s.queue.unstaged());
            }
            Work::Commit => {
                failed = commit(s).is_err();
                if failed {
                    s.queue.degrade();
                }
                if let Err(e) = s.journal.prune(&s.group) {
                    log::warn!("[store] pruning the decision journal failed: {e}");
                }
                commit_by = s.queue.next_commit();
            }
        }
        if s.queue.stopped() {
            return;
        }
    }
}

/// Hands `changes` to the index writer; the next commit makes them searchable.
fn stage(s: &Shared, staged: &mut Staged, changes: &[crate::store::index::IndexOp]) -> Result<()> {
    if changes.is_empty() {
        return Ok(());
    }
    staged.note(changes);
    if let Err(e) = s.index.stage(changes) {
        // Nothing is lost: the outbox keeps these operations for the next open.
        s.queue.degrade();
        return Err(e);
    }
    Ok(())
}

/// Commits everything staged and queued, then trims the outbox up to the watermark.
pub(super) fn commit(s: &Shared) -> Result<()> {
    let mut staged = s.queue.committing();
    commit_holding(s, &mut staged)
}

/// [`commit`], for a caller that holds `committing`.
fn commit_holding(s: &Shared, staged: &mut Staged) -> Result<()> {
    let Some(round) = s.queue.round() else {
        return Ok(());
    };
    stage(s, staged, &round.changes)?;
    let mark = durable_mark(s, round.watermark)?;
    s.witness.witness(staged.highest())?;
    s.index.commit(mark)?;
    staged.committed();
    let trim = s.records.trim_outbox(round.covered.iter().copied());
    s.group.commit(trim, "trimming the index outbox", || {})?;
    s.queue.covered(&round.covered);
    Ok(())
}

/// The payload of an index commit covering `op`, once the journal is durable.
fn durable_mark(s: &Shared, op: u64) -> Result<Mark> {
    // Read before the sync: a batch takes its number while it is appended, so every batch
    // up to this one is in the journal when the sync starts.
    let batch = s.group.last_batch();
    s.group.sync()?;
    Ok(Mark {
        op,
        batch: Some(batch),
    })
}

/// Brings the index up to date with the records at open. A store that lost writes keeps its
/// index untouched: the index is the evidence of which ids were lost.
pub(super) fn recover(s: &Shared, watermark: Option<Mark>) -> Result<()> {
    let watermark = watermark.map(|m| m.op);
    let entries = s.records.outbox()?;
    let last = entries.last().map(|(op, _)| *op);
    let top = last.unwrap_or(0).max(watermark.unwrap_or(0));
    s.queue.start_at(top + 1);
    if s.witness.damaged() {
        return Ok(());
    }
    let Some(w) = watermark else {
        return rebuild_at(s, top);
    };
    let mut replay = Vec::new();
    for (op, ids) in &entries {
        if *op > w {
            for id in ids {
                replay.push(current_op(s, id)?);
            }
        }
    }
    if !replay.is_empty() {
        s.index.stage(&replay)?;
    }
    if !replay.is_empty() || last.is_some() {
        let mark = durable_mark(s, top)?;
        let mut replayed = Staged::default();
        replayed.note(&replay);
        s.witness.witness(replayed.highest())?;
        s.index.commit(mark)?;
    }
    let trim = s.records.trim_outbox(entries.iter().map(|(op, _)| *op));
    s.group.commit(trim, "trimming the index outbox", || {})?;
    if s.index.num_docs() != s.records.active_total()? {
        rebuild_at(s, top)?;
    }
    Ok(())
}

/// The index operation that brings `id`'s document up to date with the records.
fn current_op(s: &Shared, id: &str) -> Result<IndexOp> {
    let active = match RecordId::parse(id) {
        Some(RecordId { scope, seq }) => s.records.load_active(&scope, seq)?,
        None => None,
    };
    Ok(match active {
        Some(r) => IndexOp::upsert(&r),
        None => IndexOp::Delete { id: id.to_owned() },
    })
}

/// Rebuilds the index from the records as they are now, once every queued change is
/// committed. Holds `committing` throughout: a change staged between that commit and the
/// rebuild's clearing of the index would be cleared with it and never staged again.
pub(super) fn rebuild(s: &Shared) -> Result<()> {
    let mut staged = s.queue.committing();
    commit_holding(s, &mut staged)?;
    rebuild_at(s, s.queue.watermark())
}

fn rebuild_at(s: &Shared, watermark: u64) -> Result<()> {
    let mark = durable_mark(s, watermark)?;
    let snapshot = s.records.snapshot();
    let docs = s
        .records
        .every_active(&snapshot)
        .map(|r| r.map(|r| IndexOp::upsert(&r)));
    s.index.rebuild(docs, mark)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::model::{Candidate, ScopeKey};
    use crate::store::embedded::EmbeddedStore;
    use crate::store::{MemoryStore, WriteOptions};

    /// A store whose index commits after `every` changes and otherwise only when asked (the
    /// interval is an hour), and the directory it lives in.
    fn committing_every(every: usize) -> (tempfile::TempDir, EmbeddedStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = EmbeddedStore::builder()
            .index_commit(every, Duration::from_secs(3_600))
            .open(dir.path())
            .expect("open");
        (dir, store)
    }

    /// Writes `n` facts, one a write, to `scopes` in turn: one index change each.
    fn write_facts(store: &EmbeddedStore, scopes: &[ScopeKey], n: usize) {
        for i in 0..n {
            let fact = Candidate::fact(
                format!("lesson {i}: the migration {i} must run before the seed"),
                "slack:C1:1",
            );
            store
                .write(&scopes[i % scopes.len()], &[fact], &WriteOptions::default())
                .expect("the write is durable; its index change waits for the indexer");
        }
    }

    #[test]
    fn changes_reach_the_writer_before_their_commit_and_the_commit_witnesses_every_one() {
        // Staged every 1,600 / 16 = 100 changes; committed only by the flush below.
        let (_dir, store) = committing_every(1_600);
        let scopes = [
            ScopeKey::parse("repo:acme/api").expect("scope"),
            ScopeKey::parse("repo:acme/web").expect("scope"),
        ];
        write_facts(&store, &scopes, 100);
        let s = &*store.shared;
        let deadline = Instant::now() + Duration::from_secs(30);
        while s.queue.unstaged_len() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(s.queue.unstaged_len(), 0, "staged with no commit due");
        // The writer holds them, no commit does: retrieve still answers from the queue.
        assert_eq!(s.queue.pending_changes(), 100);
        assert_eq!(s.index.num_docs(), 0);
        let found = store
            .retrieve(&scopes[0], "migration seed", 50)
            .expect("retrieve");
        assert_eq!(found.len(), 50, "pending records are retrievable");

        store.flush().expect("flush");
        assert_eq!(s.queue.pending_changes(), 0);
        assert_eq!(s.index.num_docs(), 100);
        // The witness covers the ids staged before the commit round, not only its own.
        let witnessed = s.witness.next_ids();
        for scope in &scopes {
            let newest = store
                .list(scope, &crate::store::ListQuery::window(1))
                .expect("window");
            let seq = crate::model::RecordId::parse(&newest[0].id)
                .expect("record id")
                .seq;
            assert_eq!(witnessed.get(scope.as_str()), Some(&(seq + 1)), "{scope:?}");
        }
    }

    #[test]
    fn a_rebuild_that_meets_a_record_that_does_not_decode_leaves_the_committed_index() {
        let (_dir, store) = committing_every(1_600);
        let s = &*store.shared;
        let (a, c) = (
            ScopeKey::parse("repo:acme/a").expect("scope"),
            ScopeKey::parse("repo:acme/c").expect("scope"),
        );
        write_facts(&store, &[a.clone(), c.clone()], 10);
        store.flush().expect("flush");
        assert_eq!(s.index.num_docs(), 10);
        // Damage between the two scopes' records: the rebuild has staged a's when it fails.
        let b = ScopeKey::parse("repo:acme/b").expect("scope");
        s.records
            .keyspaces()
            .active
            .insert(
                crate::store::codec::active_key(&b, crate::model::Kind::Fact, 0),
                [2u8, 0xff, 0xff],
            )
            .expect("damage");
        let err = super::rebuild(s).expect_err("a record does not decode");
        assert_eq!(err.kind(), crate::error::ErrorKind::Damaged, "{err}");
        // The next commit holds the next write, and nothing of the failed rebuild.
        let fact = Candidate::fact("the seed runs after every migration", "slack:C1:2");
        store
            .write(&a, &[fact], &WriteOptions::default())
            .expect("write");
        store.flush().expect("flush");
        assert_eq!(
            s.index.num_docs(),
            11,
            "the committed index, and the write after it"
        );
        let found = store.retrieve(&c, "migration seed", 50).expect("retrieve");
        assert_eq!(found.len(), 5, "c's records are still found");
    }

    #[test]
    fn a_failed_commit_is_retried_by_the_interval_not_at_once() {
        let (_dir, store) = committing_every(16);
        let s = &*store.shared;
        // Every stage and commit from here on fails, as on a full disk.
        s.index.finish().expect("finish");
        write_facts(
            &store,
            &[ScopeKey::parse("repo:acme/api").expect("scope")],
            20,
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while !s.queue.degraded() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(s.queue.degraded(), "the failed commit degraded the queue");
        std::thread::sleep(Duration::from_millis(50));
        // Each commit attempt syncs the journal before it commits the index.
        let before = s.group.sync_times().count();
        std::thread::sleep(Duration::from_millis(500));
        let attempts = s.group.sync_times().count() - before;
        assert!(attempts <= 1, "{attempts} commit attempts in 500 ms");
        assert_eq!(s.queue.pending_changes(), 20, "nothing covered");
    }
}
