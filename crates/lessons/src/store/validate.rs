//! The checks every store runs on its input before it touches anything, with the reference
//! Worker's words, and `list`'s query filter: one definition, so the stores cannot drift.
//!
//! **Invariant:** pure functions of their arguments: a check that refuses has changed nothing.

use std::collections::BTreeMap;

use super::values::WriteOptions;
use crate::decisions::DecisionQuery;
use crate::error::{Error, Result};
use crate::limits::{MAX_BATCH, MAX_CAP, MAX_JOURNAL_LIMIT, MAX_LIMIT, MAX_QUERY_UNITS};
use crate::model::{Candidate, Record, ScopeKey, ValidCandidate};
use crate::text::utf16_len;

/// Validates a write's candidates and cap.
pub(crate) fn validate_write(
    scope: &ScopeKey,
    candidates: &[Candidate],
    options: &WriteOptions,
    default_cap: usize,
) -> Result<(Vec<ValidCandidate>, usize)> {
    if candidates.len() > MAX_BATCH {
        return Err(Error::invalid(format!(
            "records must hold at most {MAX_BATCH} candidates"
        )));
    }
    let cap = options.cap.unwrap_or(default_cap);
    if !(1..=MAX_CAP).contains(&cap) {
        return Err(Error::invalid(format!(
            "cap must be between 1 and {MAX_CAP}"
        )));
    }
    let valid = candidates
        .iter()
        .enumerate()
        .map(|(i, c)| c.validate(scope, i))
        .collect::<Result<Vec<_>>>()?;
    Ok((valid, cap))
}

/// An import's records by scope, then by sequence number.
pub(crate) type ImportGroups<'a> = BTreeMap<&'a ScopeKey, BTreeMap<u64, &'a Record>>;

/// An import's records checked and grouped: every record valid (or the whole import refused,
/// naming the first bad one), grouped by scope in id order, a repeated id kept once (the
/// first). Returns the groups and how many repeats were dropped.
pub(crate) fn group_import(records: &[Record]) -> Result<(ImportGroups<'_>, u64)> {
    let mut groups: ImportGroups<'_> = BTreeMap::new();
    let mut repeats = 0;
    for (i, r) in records.iter().enumerate() {
        r.validate()
            .map_err(|e| Error::invalid(format!("records[{i}]: {e}")))?;
        let Some(seq) = r.seq() else { continue };
        match groups.entry(&r.scope_key).or_default().entry(seq) {
            std::collections::btree_map::Entry::Occupied(_) => repeats += 1,
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(r);
            }
        }
    }
    Ok((groups, repeats))
}

pub(crate) fn validate_decision_query(q: &DecisionQuery) -> Result<()> {
    if !(1..=MAX_JOURNAL_LIMIT).contains(&q.limit) {
        return Err(Error::invalid(format!(
            "limit must be an integer between 1 and {MAX_JOURNAL_LIMIT}"
        )));
    }
    Ok(())
}

pub(crate) fn validate_limit(limit: usize) -> Result<()> {
    if (1..=MAX_LIMIT).contains(&limit) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "limit must be between 1 and {MAX_LIMIT}"
        )))
    }
}

/// An id `forget` accepts, by the reference Worker's rule: 1–200 UTF-16 units, no whitespace
/// or control character. Any other id names no record, and saying so beats answering `false`.
pub(crate) fn validate_forget_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && utf16_len(id) <= crate::limits::MAX_REF_UNITS
        && !id
            .chars()
            .any(|c| c.is_whitespace() || crate::text::is_js_whitespace(c) || c.is_control());
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "id must be a non-empty string of at most {} characters with no whitespace",
            crate::limits::MAX_REF_UNITS
        )))
    }
}

pub(crate) fn validate_query(query: &str) -> Result<()> {
    if utf16_len(query) > MAX_QUERY_UNITS {
        Err(Error::invalid(format!(
            "query must be at most {MAX_QUERY_UNITS} UTF-16 units"
        )))
    } else {
        Ok(())
    }
}

/// `list`'s query filter, as the reference Worker applies it: a record passes when one of the
/// query's match terms ([`crate::fts::match_terms`]) equals one of its FTS tokens (case folded,
/// Latin diacritics removed: the Worker's FTS5 MATCH). Without a query nothing is filtered; a
/// query with no token at all (the empty string included) matches nothing, as the Worker's
/// `query === undefined` test has it.
pub(crate) enum ListFilter {
    All,
    Nothing,
    Tokens(std::collections::HashSet<String>),
}

impl ListFilter {
    pub(crate) fn new(query: Option<&str>) -> ListFilter {
        match query {
            None => ListFilter::All,
            Some(q) => {
                let tokens: std::collections::HashSet<String> =
                    crate::fts::match_terms(q).into_iter().collect();
                if tokens.is_empty() {
                    ListFilter::Nothing
                } else {
                    ListFilter::Tokens(tokens)
                }
            }
        }
    }

    pub(crate) fn keeps(&self, record: &Record) -> bool {
        match self {
            ListFilter::All => true,
            ListFilter::Nothing => false,
            ListFilter::Tokens(wanted) => crate::fts::FtsDoc::of(&record.text, &record.keywords)
                .terms()
                .any(|t| wanted.contains(t)),
        }
    }
}
