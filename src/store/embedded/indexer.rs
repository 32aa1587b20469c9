//! The derived keyword index kept up with the records: the indexer thread that commits the
//! queued changes in groups, and recovery (outbox replay, rebuild) at open.
//!
//! **Invariant:** a commit's payload (`Mark`) claims only operations whose batches are durable:
//! the journal is fsynced first, so the index never holds a record whose batch could be lost,
//! and the payload records how far the durable journal reached (the witness `evidence` checks
//! at open).
//! **Invariant:** an outbox entry is removed only once a committed index covers it.

use super::shared::Shared;
use crate::error::Result;
use crate::model::RecordId;
use crate::store::index::{IndexOp, Mark};

/// The indexer thread: commits whenever enough changes gathered or the interval passed, and
/// prunes the decision journal, until the queue is stopped.
pub(super) fn run(s: &Shared) {
    loop {
        s.queue.wait_for_work();
        if commit(s).is_err() {
            s.queue.degrade();
        }
        if let Err(e) = s.journal.prune(&s.group) {
            log::warn!("[store] pruning the decision journal failed: {e}");
        }
        if s.queue.stopped() {
            return;
        }
    }
}

/// Commits everything queued, then trims the outbox up to the watermark.
pub(super) fn commit(s: &Shared) -> Result<()> {
    let _committing = s.queue.committing();
    let Some(round) = s.queue.round() else {
        return Ok(());
    };
    if let Err(e) = s.index.stage(&round.changes) {
        // Nothing is lost: the outbox keeps these operations for the next open.
        s.queue.degrade();
        return Err(e);
    }
    let mark = durable_mark(s, round.watermark)?;
    s.witness.witness(&round.changes)?;
    s.index.commit(mark)?;
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
        s.witness.witness(&replay)?;
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
/// committed.
pub(super) fn rebuild(s: &Shared) -> Result<()> {
    commit(s)?;
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
