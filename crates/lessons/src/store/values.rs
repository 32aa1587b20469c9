//! What the store contract takes and answers: a write's options, `list`'s filters, the shared
//! window, a sweep's and an import's receipts.
//!
//! **Invariant:** plain values: nothing here reads or writes a store, so every store and every
//! layer above them speaks the same words.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::{Kind, Record, Tally};

/// Options of one write.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WriteOptions {
    /// The scope's cap for this write (1–10000); the store's default when absent.
    pub cap: Option<usize>,
    /// Reflection counts recorded atomically with the write.
    pub tally: Option<Tally>,
    /// Facts the gate refused in the reflection behind this write, journaled with it.
    pub rejected: Vec<crate::decisions::RejectedFact>,
}

/// Filters of `list`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListQuery {
    /// At most this many records (1–50).
    pub limit: usize,
    /// Only this kind.
    pub kind: Option<Kind>,
    /// Only records holding any of this query's tokens as a whole token of their text or
    /// keywords (a query without tokens, the empty string included, matches nothing).
    pub query: Option<String>,
}

impl ListQuery {
    /// The newest `limit` records of any kind.
    pub fn newest(limit: usize) -> ListQuery {
        ListQuery {
            limit,
            kind: None,
            query: None,
        }
    }

    /// The window read: the newest `limit` facts.
    pub fn window(limit: usize) -> ListQuery {
        ListQuery {
            limit,
            kind: Some(Kind::Fact),
            query: None,
        }
    }

    /// Whether this is a window read (facts, no query), which [`MemoryStore::window`](super::MemoryStore::window) answers.
    pub fn is_window(&self) -> bool {
        self.kind == Some(Kind::Fact) && self.query.is_none()
    }
}

/// A scope's newest facts, newest first, shared with the store that read them.
///
/// The embedded store keeps each scope's window decoded and up to date with every commit, and a
/// `Window` points into it: reading it copies no record (each is shared, `Arc<Record>`), and a
/// later write builds a new window rather than changing this one, so a `Window` never changes
/// while it is held.
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    records: Arc<Vec<Arc<Record>>>,
    len: usize,
}

impl Window {
    /// The first `limit` of `records` (all of them if fewer).
    pub fn new(records: Arc<Vec<Arc<Record>>>, limit: usize) -> Window {
        let len = limit.min(records.len());
        Window { records, len }
    }

    /// The records, copied out.
    pub fn to_records(&self) -> Vec<Record> {
        self.iter().map(|r| Record::clone(r)).collect()
    }
}

impl From<Vec<Record>> for Window {
    fn from(records: Vec<Record>) -> Window {
        let len = records.len();
        Window {
            records: Arc::new(records.into_iter().map(Arc::new).collect()),
            len,
        }
    }
}

impl std::ops::Deref for Window {
    type Target = [Arc<Record>];

    fn deref(&self) -> &[Arc<Record>] {
        // `len <= records.len()` by construction; `get` keeps that unprovable step panic-free.
        self.records.get(..self.len).unwrap_or(&[])
    }
}

/// The answer of a sweep.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepReceipt {
    /// Facts flipped to `swept` (or that would be, under a dry run).
    pub swept: u64,
    /// Their ids (always collected; the wire shows them under a dry run).
    pub ids: Vec<String>,
}

/// The answer of an import.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportReport {
    /// Records written.
    pub imported: u64,
    /// Records whose id the store already held (left untouched).
    pub skipped: u64,
}
