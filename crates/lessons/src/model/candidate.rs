//! What a writer offers, and what the store takes from it: a [`Candidate`] as sent, checked once
//! into a [`ValidCandidate`] by the reference Worker's rules, in its order and with its words, so
//! the library, the server and a client of either read the same reason.
//!
//! **Invariant:** a `ValidCandidate` obeys every bound of the wire; the planner and the store
//! never check again.
//! **Invariant:** the fields the bot's content hash covers are kept as sent (a lone surrogate in
//! a text field as the reference stores it: three U+FFFD).

use serde::{Deserialize, Serialize};

use super::{check_confidence, check_keywords, default_keywords, Kind, ScopeKey};
use crate::json::lone;
use crate::limits::{MAX_KEYWORDS, MAX_REF_UNITS, MAX_TEXT_UNITS};
use crate::text::utf16_len;

/// What a writer offers; the store decides whether it becomes a record.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    /// Fact or summary.
    pub kind: Option<Kind>,
    /// Non-empty after trim, at most 4000 UTF-16 units.
    pub text: String,
    /// 1–200 UTF-16 units.
    pub source_thread_key: String,
    /// Stored as sent (the bot's content hash covers them); the text's tokens when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keywords: Option<Vec<String>>,
    /// At most 200 UTF-16 units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_run_id: Option<String>,
    /// Finite, in [0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    /// An active record of this scope to replace; empty means absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supersedes: Option<String>,
    /// An active record of this scope that says the same thing; empty means absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restates: Option<String>,
    /// Opaque provenance (≤ 16 KiB of JSON; its `scopeKey`, if any, must be the write's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<serde_json::Value>,
}

impl Candidate {
    /// A fact candidate with `text` from `thread`.
    pub fn fact(text: impl Into<String>, thread: impl Into<String>) -> Candidate {
        Candidate {
            kind: Some(Kind::Fact),
            text: text.into(),
            source_thread_key: thread.into(),
            ..Candidate::default()
        }
    }

    /// A summary candidate.
    pub fn summary(text: impl Into<String>, thread: impl Into<String>) -> Candidate {
        Candidate {
            kind: Some(Kind::Summary),
            ..Candidate::fact(text, thread)
        }
    }

    /// Sets `restates`.
    pub fn restating(mut self, id: impl Into<String>) -> Candidate {
        self.restates = Some(id.into());
        self
    }

    /// Sets `supersedes`.
    pub fn superseding(mut self, id: impl Into<String>) -> Candidate {
        self.supersedes = Some(id.into());
        self
    }

    /// Sets `confidence`.
    pub fn with_confidence(mut self, c: f64) -> Candidate {
        self.confidence = Some(c);
        self
    }

    /// The reference Worker's checks of one candidate, field by field in its order and with its
    /// words, then ours (the provenance's bound). `wrong` is the first field a decoder found of
    /// the wrong JSON type, which fails in its place with that field's words (the wire's
    /// decoder; the library sends `None`).
    pub(crate) fn check_reference(&self, index: usize, wrong: Option<Field>) -> Result<(), String> {
        let at = format!("records[{index}]");
        let fail = |field: Field| Err(field.reason(index));
        if wrong == Some(Field::Object) {
            return fail(Field::Object);
        }
        if wrong == Some(Field::Kind) || self.kind.is_none() {
            return fail(Field::Kind);
        }
        if wrong == Some(Field::Text) || self.text.chars().all(crate::text::is_js_whitespace) {
            return fail(Field::Text);
        }
        if utf16_len(&self.text) > MAX_TEXT_UNITS {
            return Err(format!(
                "{at}.text must be at most {MAX_TEXT_UNITS} characters"
            ));
        }
        if wrong == Some(Field::SourceThreadKey)
            || self.source_thread_key.is_empty()
            || utf16_len(&self.source_thread_key) > MAX_REF_UNITS
        {
            return fail(Field::SourceThreadKey);
        }
        if wrong == Some(Field::Keywords)
            || self
                .keywords
                .as_ref()
                .is_some_and(|k| check_keywords(k).is_err())
        {
            return fail(Field::Keywords);
        }
        let too_long =
            |v: &Option<String>| v.as_ref().is_some_and(|v| utf16_len(v) > MAX_REF_UNITS);
        if wrong == Some(Field::SourceRunId) || too_long(&self.source_run_id) {
            return fail(Field::SourceRunId);
        }
        if wrong == Some(Field::Confidence)
            || self
                .confidence
                .is_some_and(|c| check_confidence(c).is_err())
        {
            return fail(Field::Confidence);
        }
        if wrong == Some(Field::Supersedes) || too_long(&self.supersedes) {
            return fail(Field::Supersedes);
        }
        if wrong == Some(Field::Restates) || too_long(&self.restates) {
            return fail(Field::Restates);
        }
        // The bot drops a record with a malformed provenance on every read, so one is refused
        // here; a well-formed one naming another scope is not this record's, and is dropped.
        let bad_provenance = self
            .provenance
            .as_ref()
            .is_some_and(|p| !crate::provenance::is_memory_provenance(p));
        if bad_provenance {
            return fail(Field::Provenance);
        }
        Ok(())
    }

    /// The candidate, once it passed [`Self::check_reference`], in the form the planner takes:
    /// keywords as sent (or the text's tokens when none were sent), empty pointers removed, a
    /// provenance naming another scope dropped.
    pub(crate) fn finish(&self, scope: &ScopeKey, index: usize) -> Result<ValidCandidate, String> {
        let Some(kind) = self.kind else {
            return Err(Field::Kind.reason(index));
        };
        let keywords = match &self.keywords {
            // Stored as sent (the bot's content hash covers them); none sent: the text's tokens.
            Some(k) => super::Keywords::from(k.as_slice()),
            None => default_keywords(&self.text),
        };
        let pointer =
            |v: &Option<String>| v.as_deref().filter(|s| !s.is_empty()).map(str::to_owned);
        // The reference stores these as SQLite text, which reads a lone surrogate back as three
        // U+FFFD; keywords and provenance it stores as JSON, which keeps one (see `json`).
        let stored = |v: &str| lone::as_stored_text(v).into_owned();
        let text = stored(&self.text);
        Ok(ValidCandidate {
            kind,
            norm: crate::text::normalize(&text),
            text,
            keywords,
            source_thread_key: stored(&self.source_thread_key),
            // Kept as sent, "" included: the content hash covers it.
            source_run_id: self.source_run_id.as_deref().map(stored),
            confidence: self.confidence,
            supersedes: pointer(&self.supersedes),
            supersedes_sent: self.supersedes.as_deref().map(stored),
            restates: pointer(&self.restates),
            // A text sent with a lone surrogate is stored otherwise than sent, so the reference
            // never finds it equal to any record: it never dedups, and nothing dedups onto it
            // through its dedup key.
            dedup: !lone::has_lone(&self.text),
            provenance: crate::provenance::stored_provenance(
                scope.as_str(),
                self.provenance.as_ref(),
            ),
        })
    }
}

/// A candidate's fields, in the order the reference Worker checks them, each with the words it
/// fails with. A decoder that finds a field of the wrong JSON type names it, and the one check
/// fails there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Field {
    /// The candidate itself: not a JSON object.
    Object,
    Kind,
    Text,
    SourceThreadKey,
    Keywords,
    SourceRunId,
    Confidence,
    Supersedes,
    Restates,
    Provenance,
}

impl Field {
    /// Why candidate `index` fails at this field, in the reference's words.
    fn reason(self, index: usize) -> String {
        let rule = match self {
            Field::Object => return format!("records[{index}] must be an object"),
            Field::Kind => "kind must be \"fact\" or \"summary\"".into(),
            Field::Text => "text must be a non-empty string".into(),
            Field::SourceThreadKey => "sourceThreadKey must be a non-empty string".into(),
            Field::Keywords => {
                format!("keywords must be an array of at most {MAX_KEYWORDS} short strings")
            }
            Field::SourceRunId => "sourceRunId must be a string".into(),
            Field::Confidence => "confidence must be a number in [0, 1]".into(),
            Field::Supersedes => "supersedes must be a string".into(),
            Field::Restates => "restates must be a string".into(),
            Field::Provenance => "provenance must be a bounded memory revision".into(),
        };
        format!("records[{index}].{rule}")
    }
}

/// A candidate that passed its checks ([`crate::store::CheckedWrite`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ValidCandidate {
    /// Fact or summary.
    pub kind: Kind,
    /// The text, as the reference stores it (a lone surrogate as three U+FFFD).
    pub text: String,
    /// `text` normalized ([`crate::text::normalize`]): its dedup key, computed once for the
    /// planner's reads and its plan.
    pub norm: String,
    /// The keywords as sent (the bot's content hash covers them); the text's tokens when the
    /// writer sent none, empty when it sent `[]`. Shared with the record it becomes, so a write
    /// allocates a record's ~50 default keywords once, not twice.
    pub keywords: super::Keywords,
    /// Provenance: the thread.
    pub source_thread_key: String,
    /// Provenance: the run.
    pub source_run_id: Option<String>,
    /// In [0, 1].
    pub confidence: Option<f64>,
    /// A non-empty id, not yet resolved.
    pub supersedes: Option<String>,
    /// `supersedes` as sent, `""` included: the new record keeps it whether or not it resolves,
    /// as the reference's `mintRecord` does.
    pub supersedes_sent: Option<String>,
    /// A non-empty id, not yet resolved.
    pub restates: Option<String>,
    /// Whether the candidate may dedup, and the record it becomes may be found by its dedup
    /// key: false when its text was sent with a lone surrogate (see `Candidate::finish`).
    pub dedup: bool,
    /// A valid provenance naming this scope, or none ([`crate::provenance`]).
    pub provenance: Option<serde_json::Value>,
}

impl ValidCandidate {
    /// The active record a write inserts for this candidate at `seq`, never used yet.
    pub fn to_record(
        &self,
        scope: &ScopeKey,
        seq: u64,
        provenance: Option<serde_json::Value>,
        now: i64,
    ) -> super::Record {
        super::Record {
            id: scope.record_id(seq),
            scope_key: scope.clone(),
            kind: self.kind,
            text: self.text.clone(),
            keywords: self.keywords.clone(),
            source_thread_key: self.source_thread_key.clone(),
            source_run_id: self.source_run_id.clone(),
            provenance,
            created_at: now,
            last_used_at: None,
            use_count: 0,
            confidence: self.confidence,
            // As sent, whether or not it resolved: the reference keeps the pointer.
            supersedes: self.supersedes_sent.clone(),
            status: super::Status::Active,
            dedup_key: self.dedup,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one check of a candidate at `index`, as a write runs it.
    fn check(
        c: &Candidate,
        scope: &ScopeKey,
        index: usize,
    ) -> crate::error::Result<ValidCandidate> {
        c.check_reference(index, None)
            .and_then(|()| c.finish(scope, index))
            .map_err(crate::error::Error::invalid)
    }

    #[test]
    fn candidates_validate_with_reasons() {
        let scope = ScopeKey::parse("org:acme").expect("valid");
        let ok = check(&Candidate::fact("Run NPM ci, run it", "t"), &scope, 0).expect("valid");
        assert_eq!(
            ok.keywords,
            ["run", "npm", "ci", "run", "it"],
            "none sent: the text's tokens, repeats kept"
        );
        let blank = check(&Candidate::fact(" \u{FEFF} ", "t"), &scope, 3);
        let blank = blank.expect_err("blank");
        assert!(blank.is_invalid());
        assert_eq!(
            blank.message(),
            "records[3].text must be a non-empty string"
        );
        let long = check(&Candidate::fact("x".repeat(4001), "t"), &scope, 0);
        assert!(long.expect_err("long").message().contains("4000"));
        let conf = check(
            &Candidate::fact("x", "t").with_confidence(f64::NAN),
            &scope,
            0,
        );
        assert!(conf.expect_err("nan").message().contains("confidence"));
        let empty_ptr = check(&Candidate::fact("x", "t").restating(""), &scope, 0).expect("ok");
        assert_eq!(empty_ptr.restates, None);
        let mut foreign = Candidate::fact("x", "t");
        foreign.provenance = Some(serde_json::json!({"scopeKey": "org:other"}));
        assert!(check(&foreign, &scope, 0).is_err());
        let mut kw = Candidate::fact("x", "t");
        kw.keywords = Some(vec!["NPM".into(), "npm".into(), "Ci".into()]);
        assert_eq!(
            check(&kw, &scope, 0).expect("ok").keywords,
            ["NPM", "npm", "Ci"],
            "stored as sent: the bot's content hash covers them"
        );
        kw.keywords = Some(Vec::new());
        assert!(
            check(&kw, &scope, 0).expect("ok").keywords.is_empty(),
            "[] stays []"
        );
        let mut run = Candidate::fact("x", "t");
        run.source_run_id = Some(String::new());
        assert_eq!(
            check(&run, &scope, 0).expect("ok").source_run_id.as_deref(),
            Some("")
        );
    }
}
