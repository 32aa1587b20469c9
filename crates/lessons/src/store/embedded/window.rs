//! A scope's window: its newest active facts, decoded, newest first, shared with readers and
//! kept up to date by every commit to the scope.
//!
//! **Invariant:** a `WindowData` never changes once built: a commit builds the next one from it
//! and its own changes (copying pointers, not records), so a `Window` a reader holds stays as
//! it was read.
//! **Invariant:** after every commit to a scope, its window (if loaded) holds exactly the
//! scope's newest `WINDOW_LEN` active facts, or all of them when it has fewer.

use std::sync::Arc;

use super::tx::Change;
use crate::limits::MAX_LIMIT;
use crate::model::{Kind, Record, Status};

/// The newest facts a scope's window holds: any fact list without a query up to the largest
/// limit is answered from it.
pub(super) const WINDOW_LEN: usize = MAX_LIMIT;

/// The newest facts of a scope.
#[derive(Debug, Default)]
pub(super) struct WindowData {
    /// Newest first (descending sequence number); shared with the `Window`s handed out.
    facts: Arc<Vec<Arc<Record>>>,
    /// Whether `facts` are all of the scope's active facts (fewer than the window's length).
    complete: bool,
    bytes: usize,
}

/// What building the next window found.
pub(super) enum Next {
    /// The window after the commit.
    Ready(WindowData),
    /// Facts left the window and the scope holds more: the window must be read again from
    /// the records after this sequence number (`None`: from the newest) to fill it.
    Refill {
        kept: Vec<Arc<Record>>,
        after: Option<u64>,
    },
}

pub(super) fn size_of(r: &Record) -> usize {
    const FIXED: usize = 220;
    FIXED
        + r.id.len()
        + r.text.len()
        // One string, one end per keyword, and the shared header.
        + r.keywords.total_len()
        + r.keywords.len() * 4
        + 64
        + r.source_thread_key.len()
        + r.source_run_id.as_ref().map_or(0, String::len)
        + r.supersedes.as_ref().map_or(0, String::len)
        + r.provenance.as_ref().map_or(0, |_| 512)
}

fn seq_of(r: &Record) -> u64 {
    r.seq().unwrap_or(0)
}

impl WindowData {
    /// A window read from the records: the first `len` facts of the newest-first scan (it
    /// asked for one more than `len`, to know whether there are more).
    pub(super) fn loaded(mut facts: Vec<Arc<Record>>, len: usize) -> WindowData {
        let complete = facts.len() <= len;
        facts.truncate(len);
        WindowData::of(facts, complete)
    }

    fn of(facts: Vec<Arc<Record>>, complete: bool) -> WindowData {
        let bytes = facts.iter().map(|r| size_of(r)).sum::<usize>() + 64;
        WindowData {
            facts: Arc::new(facts),
            complete,
            bytes,
        }
    }

    /// The facts, newest first, shared.
    pub(super) fn shared(&self) -> Arc<Vec<Arc<Record>>> {
        Arc::clone(&self.facts)
    }

    /// About how many bytes it holds (shared records counted whole).
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The window after a commit's `changes` (records entering, changing and leaving the
    /// active set), at most `len` facts.
    pub(super) fn next(&self, changes: &[Change], len: usize) -> Next {
        let mut facts: Vec<Arc<Record>> = self.facts.iter().cloned().collect();
        for c in changes {
            let was_fact = c.old.as_ref().is_some_and(|o| o.kind == Kind::Fact);
            let active_fact = c
                .new
                .as_ref()
                .filter(|r| r.kind == Kind::Fact && r.status == Status::Active);
            if !was_fact && active_fact.is_none() {
                continue;
            }
            let at = facts.iter().position(|r| seq_of(r) == c.seq);
            match (at, active_fact) {
                (Some(i), Some(r)) => {
                    if let Some(slot) = facts.get_mut(i) {
                        *slot = Arc::clone(r);
                    }
                }
                (Some(i), None) => {
                    facts.remove(i);
                }
                (None, Some(r)) => {
                    // A fact entering belongs in the window if it is newer than the oldest one
                    // there (a write's inserts are the newest of all; an import's may not be),
                    // or the window holds every fact of the scope.
                    let pos = facts.partition_point(|f| seq_of(f) > c.seq);
                    if pos < facts.len() || self.complete {
                        facts.insert(pos, Arc::clone(r));
                    }
                }
                (None, None) => {}
            }
        }
        let full = facts.len() >= len;
        if full {
            let complete = self.complete && facts.len() <= len;
            facts.truncate(len);
            return Next::Ready(WindowData::of(facts, complete));
        }
        if self.complete {
            return Next::Ready(WindowData::of(facts, true));
        }
        let after = facts.last().map(|r| seq_of(r));
        Next::Refill { kept: facts, after }
    }

    /// A refilled window: `kept` and then `more` (read after it, newest first; one more than
    /// needed was asked for, to know whether the scope holds others).
    pub(super) fn refilled(
        mut kept: Vec<Arc<Record>>,
        more: Vec<Arc<Record>>,
        len: usize,
    ) -> WindowData {
        let room = len.saturating_sub(kept.len());
        let complete = more.len() <= room;
        kept.extend(more.into_iter().take(room));
        WindowData::of(kept, complete)
    }
}
