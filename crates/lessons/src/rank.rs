//! Ranking: which query tokens go to the keyword index, and how candidates are scored.
//!
//! `retrieve` takes the reference Worker's candidate pool ([`crate::fts`]), then ranks
//! it with the whole query: `0.7 × keyword + 0.3 × recency`, where keyword is the fraction of
//! query tokens (duplicates kept) found among the record's tokens and recency decays with a
//! one-week time constant. A record with no query token is dropped. Ties keep the index order.
//!
//! **Invariant:** pure; scores are finite for finite inputs.

#[cfg(any(test, feature = "__internals"))]
use std::collections::HashSet;

use crate::model::Record;
use crate::text::for_each_token;

/// The recency time constant: one week in milliseconds.
pub const RECENCY_TAU_MS: f64 = 7.0 * 24.0 * 3600.0 * 1000.0;
/// Weight of the keyword term.
pub const KEYWORD_WEIGHT: f64 = 0.7;
/// Weight of the recency term.
pub const RECENCY_WEIGHT: f64 = 0.3;

/// The set of tokens a record can match: its text's and its keywords'.
#[cfg(any(test, feature = "__internals"))]
pub fn record_tokens(
    text: &str,
    keywords: impl IntoIterator<Item = impl AsRef<str>>,
) -> HashSet<String> {
    let mut set = HashSet::new();
    let mut add = |t: &str| {
        if !set.contains(t) {
            set.insert(t.to_owned());
        }
    };
    for_each_token(text, &mut add);
    for k in keywords {
        for_each_token(k.as_ref(), &mut add);
    }
    set
}

/// The fraction of `query_tokens` (duplicates kept) found in `tokens`.
#[cfg(any(test, feature = "__internals"))]
pub fn keyword_score(query_tokens: &[String], tokens: &HashSet<String>) -> f64 {
    if query_tokens.is_empty() {
        return 0.0;
    }
    let hits = query_tokens.iter().filter(|t| tokens.contains(*t)).count();
    hits as f64 / query_tokens.len() as f64
}

/// `exp(-(now - used) / τ)`.
pub fn recency(now: i64, used: i64) -> f64 {
    // Saturating: an imported record may carry any i64 time, and overflow must not wrap.
    (-(now.saturating_sub(used) as f64) / RECENCY_TAU_MS).exp()
}

/// `0.7 × keyword + 0.3 × recency`.
pub fn blend(keyword: f64, recency: f64) -> f64 {
    KEYWORD_WEIGHT * keyword + RECENCY_WEIGHT * recency
}

/// The query's distinct tokens with how often each occurs, for scoring many records without
/// building a token set per record.
pub struct QueryMatcher {
    total: usize,
    distinct: crate::text::FnvMap<String, (usize, usize)>,
}

impl QueryMatcher {
    /// A matcher for `query_tokens` (duplicates kept).
    pub fn new<S: AsRef<str>>(query_tokens: &[S]) -> QueryMatcher {
        let mut distinct: crate::text::FnvMap<String, (usize, usize)> =
            crate::text::FnvMap::default();
        for t in query_tokens {
            let t = t.as_ref();
            let next = distinct.len();
            match distinct.get_mut(t) {
                Some(e) => e.1 += 1,
                None => {
                    distinct.insert(t.to_owned(), (next, 1));
                }
            }
        }
        QueryMatcher {
            total: query_tokens.len(),
            distinct,
        }
    }

    /// [`keyword_score`] of a record with this text and these keywords.
    pub fn score(&self, text: &str, keywords: impl IntoIterator<Item = impl AsRef<str>>) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let mut found = vec![false; self.distinct.len()];
        let mut hits = 0;
        let mut visit = |t: &str| {
            if let Some(&(index, count)) = self.distinct.get(t) {
                if let Some(seen @ false) = found.get_mut(index) {
                    *seen = true;
                    hits += count;
                }
            }
        };
        for_each_token(text, &mut visit);
        for k in keywords {
            for_each_token(k.as_ref(), &mut visit);
        }
        hits as f64 / self.total as f64
    }
}

/// Ranks `candidates` (in index order) against the whole query and keeps the best `limit`.
/// Records with no query token are dropped; ties keep index order.
pub fn rank<S: AsRef<str>>(
    query_tokens: &[S],
    candidates: Vec<Record>,
    now: i64,
    limit: usize,
) -> Vec<Record> {
    let matcher = QueryMatcher::new(query_tokens);
    rank_by(candidates, now, limit, |r| {
        (matcher.score(&r.text, &r.keywords), r.usage_time())
    })
}

/// [`rank`] over any candidates: `score` gives a candidate's keyword score (see
/// [`keyword_score`]) and its usage time.
pub fn rank_by<T>(
    candidates: Vec<T>,
    now: i64,
    limit: usize,
    score: impl Fn(&T) -> (f64, i64),
) -> Vec<T> {
    let mut scored: Vec<(f64, T)> = candidates
        .into_iter()
        .filter_map(|c| {
            let (kw, used) = score(&c);
            (kw > 0.0).then(|| (blend(kw, recency(now, used)), c))
        })
        .collect();
    // Stable: equal scores keep the index order.
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored.into_iter().take(limit).map(|(_, c)| c).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tokenize;

    #[test]
    fn keyword_counts_duplicate_query_tokens() {
        let q = tokenize("npm npm ci yarn");
        let set = record_tokens("run npm ci", [""; 0]);
        assert!((keyword_score(&q, &set) - 0.75).abs() < 1e-12);
        let kw = record_tokens("x", &["Yarn".to_owned()]);
        assert!((keyword_score(&q, &kw) - 0.25).abs() < 1e-12);
    }

    #[test]
    fn the_matcher_scores_like_the_set() {
        let q = tokenize("npm npm ci yarn zeta");
        let m = QueryMatcher::new(&q);
        let cases = [
            ("run npm ci", vec![]),
            ("x", vec!["Yarn".to_owned()]),
            ("npm NPM zeta", vec!["ci".to_owned()]),
            ("nothing", vec![]),
        ];
        for (text, kw) in cases {
            let want = keyword_score(&q, &record_tokens(text, &kw));
            assert!((m.score(text, &kw) - want).abs() < 1e-12, "{text}");
        }
    }

    #[test]
    fn recency_halves_roughly_every_five_days() {
        assert!((recency(0, 0) - 1.0).abs() < 1e-12);
        let week = RECENCY_TAU_MS as i64;
        assert!((recency(week, 0) - (-1.0f64).exp()).abs() < 1e-12);
        assert!((blend(1.0, 1.0) - 1.0).abs() < 1e-12);
    }
}
