//! The checks every store runs on its input before it touches anything, with the reference
//! Worker's words, and `list`'s query filter: one definition, so the stores cannot drift.
//!
//! **Invariant:** pure functions of their arguments: a check that refuses has changed nothing.

use std::borrow::Cow;
use std::collections::BTreeMap;

use super::values::WriteOptions;
use crate::decisions::DecisionQuery;
use crate::error::{Error, Result};
use crate::limits::{MAX_BATCH, MAX_CAP, MAX_JOURNAL_LIMIT, MAX_LIMIT, MAX_QUERY_UNITS};
use crate::model::{Candidate, Field, Record, ScopeKey, ValidCandidate};
use crate::text::utf16_len;

/// A write checked once, where it entered (the library's `write`, the wire, and through them the
/// CLI and MCP): its scope, its candidates in the form every store takes, and its cap. A store
/// takes this form and checks no candidate again.
///
/// The order of the checks, and so which reason a write with several faults gets, is the
/// reference Worker's: the cap, the batch's size, then each candidate field by field (its
/// provenance, our own bound, last).
#[derive(Clone, Debug, PartialEq)]
pub struct CheckedWrite<'a> {
    scope: ScopeKey,
    sent: Cow<'a, [Candidate]>,
    valid: Vec<ValidCandidate>,
    cap: Option<usize>,
}

impl<'a> CheckedWrite<'a> {
    /// Checks a write's candidates and its cap (`options.cap`; `None` is the store's default).
    pub fn check(
        scope: &ScopeKey,
        candidates: &'a [Candidate],
        options: &WriteOptions,
    ) -> Result<CheckedWrite<'a>> {
        let check = || {
            let cap = Cap::from(options.cap).check()?;
            CheckedWrite::checking(scope.clone(), Cow::Borrowed(candidates), cap, &[])
        };
        check().map_err(Error::invalid)
    }

    /// The one check of the candidates, after the cap's ([`Cap::check`]), for the library and
    /// for a decoder that also found fields of the wrong JSON type: `wrong[i]` is candidate
    /// `i`'s first such field, if any.
    pub(crate) fn checking(
        scope: ScopeKey,
        sent: Cow<'a, [Candidate]>,
        cap: Option<usize>,
        wrong: &[Option<Field>],
    ) -> std::result::Result<CheckedWrite<'a>, String> {
        if sent.len() > MAX_BATCH {
            return Err(format!("records must hold at most {MAX_BATCH} candidates"));
        }
        let valid = sent
            .iter()
            .enumerate()
            .map(|(i, c)| {
                c.check_reference(i, wrong.get(i).copied().flatten())?;
                c.finish(&scope, i)
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(CheckedWrite {
            scope,
            sent,
            valid,
            cap,
        })
    }

    /// The scope the candidates were checked for.
    pub fn scope(&self) -> &ScopeKey {
        &self.scope
    }

    /// The candidates as sent: what a store that forwards the write (`RemoteStore`) sends on.
    pub fn candidates(&self) -> &[Candidate] {
        &self.sent
    }

    /// The cap sent, checked; `None`: the store's default.
    pub fn cap(&self) -> Option<usize> {
        self.cap
    }

    /// How many candidates the write offers.
    pub fn len(&self) -> usize {
        self.valid.len()
    }

    /// Whether the write offers no candidate.
    pub fn is_empty(&self) -> bool {
        self.valid.is_empty()
    }

    /// The candidates in the form the planner takes.
    pub(crate) fn valid(&self) -> &[ValidCandidate] {
        &self.valid
    }
}

/// A write's cap as a decoder found it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Cap {
    /// None sent: the store's default.
    Default,
    /// A whole number, not yet checked against the bound.
    Sent(usize),
    /// Sent, but not a whole number a cap could be (only a decoder of JSON finds one).
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    WrongType,
}

impl From<Option<usize>> for Cap {
    fn from(cap: Option<usize>) -> Cap {
        cap.map_or(Cap::Default, Cap::Sent)
    }
}

impl Cap {
    /// The cap checked: `None` for the store's default.
    pub(crate) fn check(self) -> std::result::Result<Option<usize>, String> {
        match self {
            Cap::Default => Ok(None),
            Cap::Sent(c) => check_cap(c).map(Some),
            Cap::WrongType => Err(cap_reason()),
        }
    }
}

/// A cap, a write's or a store's default: 1 to [`MAX_CAP`], the one place that bound is checked.
pub(crate) fn check_cap(cap: usize) -> std::result::Result<usize, String> {
    if (1..=MAX_CAP).contains(&cap) {
        Ok(cap)
    } else {
        Err(cap_reason())
    }
}

fn cap_reason() -> String {
    format!("cap must be an integer between 1 and {MAX_CAP}")
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
