//! The k-way merge of a scope's decision journal: one prefix scan per class of entry (an event,
//! or an eviction never used), merged into one stream newest or oldest first by each key's
//! `decision_order`, and the ranks of entries among all of a scope's entries.
//!
//! **Invariant:** the merge reads each scan in its own order and hands an error out before any
//! entry; it holds at most one entry per scan, so a read costs what it hands, not the journal's
//! length.

use crate::decisions::DecisionEvent;
use crate::error::Result;
use crate::store::codec;
use crate::store::engine::st;

/// Which of a scope's entries a scan reads: those of `events`, or only their never-used
/// evictions (see `codec::decision_prefixes`).
#[derive(Clone, Copy)]
pub(super) struct Classes<'a> {
    pub(super) events: &'a [DecisionEvent],
    pub(super) never_used: bool,
}

impl Classes<'static> {
    /// Every entry.
    pub(super) const ALL: Classes<'static> = Classes {
        events: &DecisionEvent::ALL,
        never_used: false,
    };
}

/// Which end of a journal a scan starts at.
#[derive(Clone, Copy)]
pub(super) enum Order {
    NewestFirst,
    OldestFirst,
}

/// Several prefix scans of one scope's journal, each in the same order (newest or oldest
/// first), merged into that order across them by each key's `decision_order`.
pub(super) struct Merged {
    scans: Vec<fjall::Iter>,
    /// Each scan's next entry; `None` before the first pull and once a scan is done.
    heads: Vec<Option<Entry>>,
    started: bool,
    order: Order,
    /// Whether entries' values are read (a count or a prune needs keys only).
    values: bool,
}

/// A journal entry as a scan reads it: its key, and its value when asked for.
pub(super) type Entry = Result<(fjall::UserKey, Option<fjall::UserValue>)>;

impl Merged {
    pub(super) fn new(scans: Vec<fjall::Iter>, order: Order, values: bool) -> Merged {
        let heads = scans.iter().map(|_| None).collect();
        Merged {
            scans,
            heads,
            started: false,
            order,
            values,
        }
    }

    fn pull(&mut self, i: usize) {
        let values = self.values;
        let order = self.order;
        let scan = self.scans.get_mut(i);
        let next = scan
            .and_then(|s| match order {
                Order::NewestFirst => s.next(),
                Order::OldestFirst => s.next_back(),
            })
            .map(|g| {
                if values {
                    g.into_inner()
                        .map(|(k, v)| (k, Some(v)))
                        .map_err(st("reading the decision journal"))
                } else {
                    g.key()
                        .map(|k| (k, None))
                        .map_err(st("reading the decision journal"))
                }
            });
        if let Some(slot) = self.heads.get_mut(i) {
            *slot = next;
        }
    }
}

/// The ranks of a scope's entries among all its entries, newest first: a walk of every class
/// beside a read of some, counting what it passes.
pub(super) struct Ranks {
    pub(super) all: Merged,
    /// Entries the walk has passed, the last one met included.
    pub(super) counted: usize,
}

impl Ranks {
    /// Whether the entry of `order`, read after every entry asked about before it (newest
    /// first), is among the `cap` newest. The walk stops once past the cap: every entry after
    /// it is older and hidden too.
    pub(super) fn within(&mut self, order: &[u8], cap: usize) -> Result<bool> {
        while self.counted < cap {
            let Some(entry) = self.all.next() else {
                return Ok(false);
            };
            self.counted += 1;
            if codec::decision_order(&entry?.0) == order {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

impl Iterator for Merged {
    type Item = Entry;

    fn next(&mut self) -> Option<Entry> {
        if !self.started {
            self.started = true;
            for i in 0..self.scans.len() {
                self.pull(i);
            }
        }
        // An error is handed out first; otherwise the newest (or oldest) head.
        let mut best: Option<usize> = None;
        for (i, head) in self.heads.iter().enumerate() {
            let Some(head) = head else { continue };
            let Ok((key, _)) = head else {
                best = Some(i);
                break;
            };
            let better = match best.and_then(|b| self.heads.get(b)) {
                Some(Some(Ok((held, _)))) => {
                    let (k, h) = (codec::decision_order(key), codec::decision_order(held));
                    match self.order {
                        Order::NewestFirst => k < h,
                        Order::OldestFirst => k > h,
                    }
                }
                _ => true,
            };
            if better {
                best = Some(i);
            }
        }
        let i = best?;
        let taken = self.heads.get_mut(i).and_then(Option::take);
        self.pull(i);
        taken
    }
}
