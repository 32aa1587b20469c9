//! A scope's active records held for retrieve: each decoded once with its FTS terms and its
//! ranking tokens, and the scope's postings, so a retrieve reads no record from fjall, asks no
//! index, and tokenizes nothing but its query.
//!
//! **Invariant:** once loaded, `docs` holds exactly the scope's active records as committed
//! (every commit to the scope applies its changes here under the scope's write lock, before
//! the writer returns), and `postings`, `tokens` and `bytes` are what `docs` gives.
//! **Invariant:** the pool it answers is the one [`crate::fts::pool`] computes over the same
//! records: the same terms, counts, lengths and floating-point operations.

use std::sync::Arc;

use super::tx::Change;
use crate::fts::{idf, length_norm, term_score, FtsDoc, Totals};
use crate::model::{Record, Status};
use crate::text::FnvMap;

/// One active record with what retrieve computes from it.
#[derive(Debug)]
pub(super) struct SearchDoc {
    pub(super) record: Arc<Record>,
    /// Computed from the text and keywords, so shared by every version of the record that
    /// keeps them (a usage bump copies a pointer).
    body: Arc<Body>,
}

#[derive(Debug)]
struct Body {
    /// Tokens in the FTS body (`text + " " + keywords`), matchable or not.
    len: u32,
    /// The body's distinct matchable terms with how often each occurs.
    terms: Box<[(Box<str>, u32)]>,
    /// The record's distinct ranking tokens (text and keywords, see
    /// [`crate::rank::record_tokens`]) as the scope's word ids.
    rank: Box<[u32]>,
}

impl SearchDoc {
    /// Calibrated against jemalloc's count of what a scope's held search allocates (a term's
    /// string is rounded up to its size class, about 8 bytes on average; the `Arc`s, the slot and
    /// the boxed slices are the fixed part): within a few percent over 500-record scopes.
    fn bytes(&self) -> usize {
        const FIXED: usize = 340;
        const PER_TERM: usize = 32;
        FIXED
            + super::window::size_of(&self.record)
            + self
                .body
                .terms
                .iter()
                .map(|(t, _)| t.len() + PER_TERM)
                .sum::<usize>()
            + self.body.rank.len() * 4
    }
}

/// The scope's ranking tokens, each named by a small id so a record's tokens are a list of
/// integers and a query is a table indexed by them. Counted: an id whose last record left is
/// handed out again.
#[derive(Debug, Default)]
struct Words {
    ids: FnvMap<Box<str>, u32>,
    /// By id: the word and how many held records have it (0: free).
    names: Vec<Box<str>>,
    refs: Vec<u32>,
    free: Vec<u32>,
    bytes: usize,
}

impl Words {
    fn id(&self, word: &str) -> Option<u32> {
        self.ids.get(word).copied()
    }

    /// `word`'s id, handed out (uncounted) if it has none: [`Words::hold`] it, or it is
    /// never released.
    fn intern(&mut self, word: &str) -> u32 {
        if let Some(&id) = self.ids.get(word) {
            return id;
        }
        let name: Box<str> = word.into();
        let id = match self.free.pop() {
            Some(id) => {
                if let Some(n) = self.names.get_mut(id as usize) {
                    *n = name.clone();
                }
                id
            }
            None => {
                self.names.push(name.clone());
                self.refs.push(0);
                (self.names.len() - 1) as u32
            }
        };
        self.bytes += 2 * word.len() + WORD_BYTES;
        self.ids.insert(name, id);
        id
    }

    /// One more record has word `id`.
    fn hold(&mut self, id: u32) {
        if let Some(r) = self.refs.get_mut(id as usize) {
            *r += 1;
        }
    }

    /// One record fewer has word `id`.
    fn release(&mut self, id: u32) {
        let Some(r) = self.refs.get_mut(id as usize) else {
            return;
        };
        *r = r.saturating_sub(1);
        if *r > 0 {
            return;
        }
        if let Some(name) = self.names.get_mut(id as usize) {
            let name = std::mem::take(name);
            self.ids.remove(&name);
            self.bytes = self.bytes.saturating_sub(2 * name.len() + WORD_BYTES);
        }
        self.free.push(id);
    }

    /// How many ids are handed out, free ones included: a bound on every id.
    fn len(&self) -> usize {
        self.names.len()
    }
}

/// A query's tokens as the scope's word ids: [`crate::rank::keyword_score`] of a held record
/// without hashing a string.
pub(super) struct QueryWords {
    /// By word id: how many of the query's tokens are that word.
    counts: Vec<u32>,
    /// The query's tokens, duplicates kept.
    total: usize,
}

impl QueryWords {
    /// The fraction of the query's tokens found among `doc`'s tokens.
    pub(super) fn score(&self, doc: &SearchDoc) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let hits: u64 = doc
            .body
            .rank
            .iter()
            .map(|&id| u64::from(self.counts.get(id as usize).copied().unwrap_or(0)))
            .sum();
        hits as f64 / self.total as f64
    }
}

/// A scope's active records and their postings.
///
/// Documents live in slots (a freed slot is reused), so a posting names a slot, a query's
/// counts are kept in a dense table instead of a map, and what scoring reads of a document
/// (its length, its sequence number) sits in arrays by slot rather than behind pointers.
#[derive(Debug, Default)]
pub(super) struct ScopeSearch {
    slots: Vec<Option<Arc<SearchDoc>>>,
    /// By slot: the document's FTS length and sequence number (stale for a free slot).
    lens: Vec<u32>,
    seqs: Vec<u64>,
    free: Vec<u32>,
    by_seq: FnvMap<u64, u32>,
    /// Each term's documents: `(slot, occurrences)`, in no order.
    postings: FnvMap<Box<str>, Vec<(u32, u32)>>,
    /// FTS tokens over every document.
    tokens: u64,
    words: Words,
    bytes: usize,
}

/// Bytes a posting list's key and entry cost, roughly.
const TERM_BYTES: usize = 48;
const POSTING_BYTES: usize = 8;
/// Bytes a word's map entry, id slots and count cost, roughly, beyond its text.
const WORD_BYTES: usize = 40;

impl ScopeSearch {
    /// The search over these active records.
    pub(super) fn of(records: impl IntoIterator<Item = Arc<Record>>) -> ScopeSearch {
        let mut s = ScopeSearch::default();
        for r in records {
            s.insert(r);
        }
        s
    }

    /// About how many bytes it holds (records counted whole, though the window may share them).
    pub(super) fn bytes(&self) -> usize {
        self.bytes + self.words.bytes + self.slots.len() * 20 + self.by_seq.len() * 24 + 64
    }

    fn doc(&self, seq: u64) -> Option<&Arc<SearchDoc>> {
        let slot = *self.by_seq.get(&seq)?;
        self.slots.get(slot as usize)?.as_ref()
    }

    /// The active record with sequence number `seq`.
    pub(super) fn record(&self, seq: u64) -> Option<Arc<Record>> {
        self.doc(seq).map(|d| Arc::clone(&d.record))
    }

    /// `record` with its FTS terms and its ranking tokens, the tokens held in `words`.
    fn doc_of(&mut self, record: Arc<Record>) -> SearchDoc {
        let fts = FtsDoc::of(&record.text, &record.keywords);
        let mut sorted: Vec<&str> = fts.terms().collect();
        sorted.sort_unstable();
        let mut terms: Vec<(Box<str>, u32)> = Vec::new();
        for t in sorted {
            match terms.last_mut() {
                Some((last, n)) if **last == *t => *n += 1,
                _ => terms.push((t.into(), 1)),
            }
        }
        // The distinct tokens of the text and the keywords, as `rank::record_tokens` gives
        // them, each held once.
        let mut rank: Vec<u32> = Vec::new();
        let words = &mut self.words;
        let mut add = |t: &str| rank.push(words.intern(t));
        crate::text::for_each_token(&record.text, &mut add);
        for k in record.keywords.iter() {
            crate::text::for_each_token(k, &mut add);
        }
        rank.sort_unstable();
        rank.dedup();
        for &id in &rank {
            self.words.hold(id);
        }
        let rank = rank.into_boxed_slice();
        SearchDoc {
            record,
            body: Arc::new(Body {
                len: fts.len,
                terms: terms.into_boxed_slice(),
                rank,
            }),
        }
    }

    /// `query_tokens` (duplicates kept) as this scope's words, to score what [`Self::pool`]
    /// answers while the same lock is held (an id is handed out again once its last record
    /// leaves).
    pub(super) fn query_words(&self, query_tokens: &[&str]) -> QueryWords {
        let mut counts = vec![0u32; self.words.len()];
        for t in query_tokens {
            if let Some(c) = self.words.id(t).and_then(|id| counts.get_mut(id as usize)) {
                *c += 1;
            }
        }
        QueryWords {
            counts,
            total: query_tokens.len(),
        }
    }

    fn insert(&mut self, record: Arc<Record>) {
        let Some(seq) = record.seq() else { return };
        self.remove(seq);
        let doc = self.doc_of(record);
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(None);
                self.lens.push(0);
                self.seqs.push(0);
                (self.slots.len() - 1) as u32
            }
        };
        if let Some(l) = self.lens.get_mut(slot as usize) {
            *l = doc.body.len;
        }
        if let Some(q) = self.seqs.get_mut(slot as usize) {
            *q = seq;
        }
        self.tokens += u64::from(doc.body.len);
        self.bytes += doc.bytes();
        let mut added = 0;
        for (t, n) in doc.body.terms.iter() {
            let list = self.postings.entry(t.clone()).or_insert_with(|| {
                added += TERM_BYTES + t.len();
                Vec::new()
            });
            list.push((slot, *n));
            added += POSTING_BYTES;
        }
        self.bytes += added;
        if let Some(s) = self.slots.get_mut(slot as usize) {
            *s = Some(Arc::new(doc));
        }
        self.by_seq.insert(seq, slot);
    }

    fn remove(&mut self, seq: u64) {
        let Some(slot) = self.by_seq.remove(&seq) else {
            return;
        };
        let Some(doc) = self.slots.get_mut(slot as usize).and_then(Option::take) else {
            return;
        };
        self.free.push(slot);
        for &id in doc.body.rank.iter() {
            self.words.release(id);
        }
        self.tokens = self.tokens.saturating_sub(u64::from(doc.body.len));
        self.bytes = self.bytes.saturating_sub(doc.bytes());
        for (t, _) in doc.body.terms.iter() {
            let Some(list) = self.postings.get_mut(t) else {
                continue;
            };
            if let Some(i) = list.iter().position(|&(s, _)| s == slot) {
                list.swap_remove(i);
                self.bytes = self.bytes.saturating_sub(POSTING_BYTES);
            }
            if list.is_empty() {
                self.postings.remove(t);
                self.bytes = self.bytes.saturating_sub(TERM_BYTES + t.len());
            }
        }
    }

    /// Applies a committed batch's changes to the scope's active set.
    pub(super) fn apply(&mut self, changes: &[Change]) {
        for c in changes {
            let active = c.new.as_ref().filter(|r| r.status == Status::Active);
            let held = self.by_seq.get(&c.seq).copied();
            match (held, active) {
                (Some(slot), Some(r)) => {
                    let Some(Some(doc)) = self.slots.get_mut(slot as usize) else {
                        continue;
                    };
                    // Counts and times change in place; a changed body is indexed again.
                    if doc.record.text == r.text && doc.record.keywords == r.keywords {
                        *doc = Arc::new(SearchDoc {
                            record: Arc::clone(r),
                            body: Arc::clone(&doc.body),
                        });
                    } else {
                        self.insert(Arc::clone(r));
                    }
                }
                (Some(_), None) => self.remove(c.seq),
                (None, Some(r)) => self.insert(Arc::clone(r)),
                (None, None) => {}
            }
        }
    }

    /// The reference Worker's FTS5 pool for `terms`: every active record holding one, scored
    /// by `bm25()` over the scope's active records, best first, at most `pool`.
    pub(super) fn pool(&self, terms: &[String], pool: usize) -> Vec<Arc<SearchDoc>> {
        if pool == 0 || terms.is_empty() || self.by_seq.is_empty() {
            return Vec::new();
        }
        let totals = Totals {
            rows: self.by_seq.len() as u64,
            tokens: self.tokens,
        };
        let lists: Vec<&[(u32, u32)]> = terms
            .iter()
            .map(|t| self.postings.get(t.as_str()).map_or(&[][..], Vec::as_slice))
            .collect();
        let idfs: Vec<f64> = lists
            .iter()
            .map(|l| idf(totals.rows, l.len() as u64))
            .collect();
        // Each matched document's score, summed term by term in query order as `bm25` sums
        // (bit-equal to it): one row per document, found by slot, so the work is the
        // postings read, not the documents times the terms.
        struct Row {
            score: f64,
            /// The document's `length_norm`, computed once.
            norm: f64,
            seq: u64,
            slot: u32,
        }
        let mut row_of = vec![u32::MAX; self.slots.len()];
        let mut rows: Vec<Row> = Vec::new();
        for (list, &idf) in lists.iter().zip(&idfs) {
            for &(slot, n) in list.iter() {
                let Some(row) = row_of.get_mut(slot as usize) else {
                    continue;
                };
                if *row == u32::MAX {
                    let (Some(&len), Some(&seq)) =
                        (self.lens.get(slot as usize), self.seqs.get(slot as usize))
                    else {
                        continue;
                    };
                    *row = rows.len() as u32;
                    rows.push(Row {
                        score: 0.0,
                        norm: length_norm(len, totals),
                        seq,
                        slot,
                    });
                }
                if let Some(r) = rows.get_mut(*row as usize) {
                    r.score += term_score(idf, n, r.norm);
                }
            }
        }
        // The Worker's `ORDER BY bm25(...)`: best first, equal scores in sequence order. The
        // order is total (sequence numbers differ), so the best `pool` chosen first and then
        // sorted are the first `pool` of the whole list sorted.
        let order = |a: &Row, b: &Row| b.score.total_cmp(&a.score).then(a.seq.cmp(&b.seq));
        if rows.len() > pool {
            rows.select_nth_unstable_by(pool - 1, order);
            rows.truncate(pool);
        }
        rows.sort_unstable_by(order);
        rows.into_iter()
            .filter_map(|r| self.slots.get(r.slot as usize)?.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Kind, ScopeKey};

    fn record(seq: u64, text: &str, keywords: &[&str]) -> Arc<Record> {
        let scope = ScopeKey::parse("repo:acme/app").expect("scope");
        Arc::new(Record {
            id: scope.record_id(seq),
            scope_key: scope,
            kind: Kind::Fact,
            text: text.to_owned(),
            keywords: keywords.iter().map(|k| (*k).to_owned()).collect(),
            source_thread_key: "t".to_owned(),
            source_run_id: None,
            provenance: None,
            created_at: 1,
            last_used_at: None,
            use_count: 0,
            confidence: None,
            supersedes: None,
            status: Status::Active,
            dedup_key: true,
        })
    }

    fn change(seq: u64, new: Option<Arc<Record>>) -> Change {
        Change {
            seq,
            old: None,
            new,
        }
    }

    fn scores(s: &ScopeSearch, query: &str) -> Vec<(u64, f64)> {
        let lowered = crate::text::lowercase(query);
        let tokens = crate::text::token_slices(&lowered);
        let words = s.query_words(&tokens);
        let mut out: Vec<(u64, f64)> = s
            .slots
            .iter()
            .flatten()
            .filter_map(|d| Some((d.record.seq()?, words.score(d))))
            .collect();
        out.sort_by_key(|&(seq, _)| seq);
        out
    }

    #[test]
    fn word_ids_are_counted_and_handed_out_again_without_mixing_words() {
        let mut s = ScopeSearch::of([
            record(1, "alpha beta", &[]),
            record(2, "beta gamma", &["Alpha"]),
        ]);
        assert_eq!(
            scores(&s, "alpha alpha zeta"),
            [(1, 2.0 / 3.0), (2, 2.0 / 3.0)]
        );
        // Record 2 leaves: "gamma" has no record left, "alpha" and "beta" still have one.
        s.apply(&[change(2, None)]);
        assert!(
            s.words.id("gamma").is_none(),
            "a word whose last record left is released"
        );
        assert!(s.words.id("alpha").is_some());
        // A new word takes the released id; the query's words keep their own meaning.
        s.apply(&[change(3, Some(record(3, "delta", &[])))]);
        assert_eq!(s.words.len(), 3, "the freed id was reused");
        assert_eq!(scores(&s, "gamma"), [(1, 0.0), (3, 0.0)]);
        assert_eq!(scores(&s, "delta beta"), [(1, 0.5), (3, 0.5)]);
        // A usage bump keeps the body and its counts; a retired record leaves.
        let mut bumped = Record::clone(&record(1, "alpha beta", &[]));
        bumped.use_count = 5;
        s.apply(&[change(1, Some(Arc::new(bumped)))]);
        assert_eq!(s.record(1).map(|r| r.use_count), Some(5));
        assert_eq!(scores(&s, "beta"), [(1, 1.0), (3, 0.0)]);
        let mut retired = Record::clone(&record(3, "delta", &[]));
        retired.status = Status::Forgotten;
        s.apply(&[change(3, Some(Arc::new(retired)))]);
        assert!(s.record(3).is_none());
        assert!(s.words.id("delta").is_none());
    }

    /// The sequence numbers of `s`'s pool for `terms`, and of the reference prefilter's over
    /// `active` (the records `s` should hold).
    fn held_and_reference_pools<'a>(
        s: &ScopeSearch,
        active: impl IntoIterator<Item = &'a Arc<Record>>,
        terms: &[String],
        size: usize,
    ) -> (Vec<u64>, Vec<u64>) {
        let want = crate::fts::pool(
            active
                .into_iter()
                .map(|r| (r.seq().unwrap_or(0), r.text.as_str(), &r.keywords)),
            terms,
            size,
        );
        let got = s
            .pool(terms, size)
            .iter()
            .filter_map(|d| d.record.seq())
            .collect();
        (got, want)
    }

    #[test]
    fn the_pool_is_the_prefilters() {
        let texts = [
            ("npm ci before the license check", vec!["npm"]),
            ("the cache key includes the lockfile", vec![]),
            ("npm ci npm ci", vec!["ci", "CI"]),
            ("vitest needs the registry", vec!["registry"]),
            ("unrelated words only", vec![]),
            ("the license check reads the lockfile", vec!["license"]),
        ];
        let records: Vec<Arc<Record>> = texts
            .iter()
            .enumerate()
            .map(|(i, (t, k))| record(i as u64 + 1, t, k))
            .collect();
        let s = ScopeSearch::of(records.iter().cloned());
        for query in [
            "npm ci",
            "the lockfile",
            "license check npm",
            "registry zeta",
            "zeta",
        ] {
            let terms = crate::fts::match_terms(query);
            for size in [1, 3, 50] {
                let (got, want) = held_and_reference_pools(&s, &records, &terms, size);
                assert_eq!(got, want, "{query} / {size}");
            }
        }
    }

    proptest::proptest! {
        /// On records and queries drawn from a few words (so many scores tie and many
        /// documents share lengths), the held pool is the reference prefilter's, order and
        /// ties included, after records left and came back.
        #[test]
        fn the_pool_is_the_prefilters_on_any_records(
            texts in proptest::collection::vec(
                proptest::collection::vec(0usize..8, 1..9), 1..40),
            gone in proptest::collection::vec(proptest::bool::ANY, 40),
            query in proptest::collection::vec(0usize..10, 1..12),
            size in 1usize..60,
        ) {
            const WORDS: [&str; 10] =
                ["npm", "ci", "lint", "cache", "key", "lockfile", "vitest", "the", "zeta", "eta"];
            let text = |ids: &[usize]| -> String {
                ids.iter().filter_map(|&i| WORDS.get(i).copied()).collect::<Vec<_>>().join(" ")
            };
            let records: Vec<Arc<Record>> = texts
                .iter()
                .enumerate()
                .map(|(i, ids)| record(i as u64 + 1, &text(ids), &[]))
                .collect();
            let mut s = ScopeSearch::of(records.iter().cloned());
            // Some leave and the first of them comes back: slots are freed and reused.
            let left: Vec<&Arc<Record>> = records
                .iter()
                .zip(&gone)
                .filter(|(_, g)| **g)
                .map(|(r, _)| r)
                .collect();
            for r in &left {
                s.apply(&[change(r.seq().unwrap_or(0), None)]);
            }
            let back = left.first().map(|r| Arc::clone(r));
            if let Some(r) = &back {
                s.apply(&[change(r.seq().unwrap_or(0), Some(Arc::clone(r)))]);
            }
            let active: Vec<&Arc<Record>> = records
                .iter()
                .filter(|r| {
                    !left.iter().any(|l| l.seq() == r.seq())
                        || back.as_ref().is_some_and(|b| b.seq() == r.seq())
                })
                .collect();
            let terms = crate::fts::match_terms(&text(&query));
            let (got, want) = held_and_reference_pools(&s, active, &terms, size);
            proptest::prop_assert_eq!(got, want);
        }
    }
}
