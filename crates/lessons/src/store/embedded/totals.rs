//! A scope's FTS totals: what FTS5's `bm25()` needs beyond one document, kept as the reference
//! Worker's FTS5 table keeps them over its active rows.

use crate::fts::{FtsDoc, Totals};

/// Active records, their tokens, and how many active records hold each term.
#[derive(Clone, Debug, Default)]
pub(super) struct ScopeFts {
    pub(super) totals: Totals,
    /// Active records holding each term.
    hits: crate::text::FnvMap<String, u64>,
    /// Bytes of the term keys held.
    term_bytes: usize,
}

impl ScopeFts {
    /// Counts a record entering (`true`) or leaving the active set.
    pub(super) fn apply(&mut self, doc: &FtsDoc, entering: bool) {
        let mut distinct: Vec<&str> = doc.terms().collect();
        distinct.sort_unstable();
        distinct.dedup();
        if entering {
            self.totals.rows += 1;
            self.totals.tokens += u64::from(doc.len);
            for t in distinct {
                match self.hits.get_mut(t) {
                    Some(n) => *n += 1,
                    None => {
                        self.hits.insert(t.to_owned(), 1);
                        self.term_bytes += t.len();
                    }
                }
            }
        } else {
            self.totals.rows = self.totals.rows.saturating_sub(1);
            self.totals.tokens = self.totals.tokens.saturating_sub(u64::from(doc.len));
            for t in distinct {
                if let Some(n) = self.hits.get_mut(t) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        self.hits.remove(t);
                        self.term_bytes = self.term_bytes.saturating_sub(t.len());
                    }
                }
            }
        }
    }

    /// Active records holding `term`.
    pub(super) fn hits(&self, term: &str) -> u64 {
        self.hits.get(term).copied().unwrap_or(0)
    }

    /// About how many bytes it holds.
    pub(super) fn bytes(&self) -> usize {
        self.term_bytes + self.hits.len() * 48
    }
}
