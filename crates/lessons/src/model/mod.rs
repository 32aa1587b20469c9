//! The data model: scope keys, records, candidates, statuses and counts, with their validation.
//! The bounds it checks are declared in `limits`; where a record lives and what it is called
//! ([`ScopeKey`], [`RecordId`]) and what a writer offers ([`Candidate`]) have their own files,
//! and every type is reached at `model::`.
//!
//! JSON names are the memory Worker's (camelCase); optional fields are omitted, never `null`.
//! Lengths that the wire limits are counted in UTF-16 code units, as the reference counts them.
//!
//! **Invariant:** a value of [`ScopeKey`] or [`Candidate`] that passed validation obeys every bound
//! below; the store never re-checks them.

mod candidate;
mod keywords;
mod scope;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::limits::{
    MAX_KEYWORDS, MAX_KEYWORD_UNITS, MAX_PROVENANCE_BYTES, MAX_REF_UNITS, MAX_TEXT_UNITS,
};
use crate::text::utf16_len;
use scope::split_record_id;

pub use candidate::Candidate;
pub(crate) use candidate::{Field, ValidCandidate};
pub use keywords::{Keywords, KeywordsBuilder};
pub use scope::{RecordId, ScopeKey};

/// A fact (a lesson) or a summary (an episode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A lesson: a fact that will still be true in a future unrelated run.
    Fact,
    /// One or two impersonal sentences about a run; never gated, never in the window.
    Summary,
}

impl Kind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Fact => "fact",
            Kind::Summary => "summary",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "fact" => Some(Kind::Fact),
            "summary" => Some(Kind::Summary),
            _ => None,
        }
    }
}

/// A record's status. Only `active` records are visible to list, retrieve, dedup, restate, the
/// window and the cap count; the others stay for audit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Visible.
    Active,
    /// Replaced by a newer record that named it in `supersedes`.
    Superseded,
    /// Forgotten by a person or a bot.
    Forgotten,
    /// Pushed out by the scope's cap (least recently used first).
    Evicted,
    /// Retired by the sweep because its text carries a gate marker; treated exactly as forgotten.
    Swept,
}

impl Status {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Active => "active",
            Status::Superseded => "superseded",
            Status::Forgotten => "forgotten",
            Status::Evicted => "evicted",
            Status::Swept => "swept",
        }
    }
}

/// A stored record, as on the wire.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// `mem:<scopeKey>:<seq>`.
    pub id: String,
    /// The scope the record lives in; never changes.
    pub scope_key: ScopeKey,
    /// Fact or summary.
    pub kind: Kind,
    /// The text; never changes.
    pub text: String,
    /// The keywords as the writer sent them (case, order and repeats kept), or the text's tokens
    /// (repeats kept) when it sent none, as the reference Worker stores them: the bot's content
    /// hash covers them. Matching always uses the text's tokens and these. Shared: a text's
    /// tokens are dozens of strings, and a copy of the record (a `list`, a retrieve's answer)
    /// copies a pointer instead.
    #[serde(default)]
    pub keywords: Keywords,
    /// Provenance: the thread.
    pub source_thread_key: String,
    /// Provenance: the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_run_id: Option<String>,
    /// Opaque provenance, returned as stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<serde_json::Value>,
    /// Milliseconds since the epoch; all records of one write share it.
    pub created_at: i64,
    /// Absent until the first retrieve or restate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<i64>,
    /// Times retrieved, restated or deduplicated onto.
    pub use_count: u64,
    /// In [0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    /// The id this record replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supersedes: Option<String>,
    /// Active or one of the retired statuses.
    pub status: Status,
    /// Whether a dedup by normalized text can find this record. False only for a record whose
    /// text was sent with a lone surrogate: the reference stores that text otherwise than it
    /// compares it, so no later candidate ever equals it (one naming it as its supersede target
    /// still compares with its stored text). Not on the wire; `true` for a record read from JSON.
    #[serde(skip, default = "dedup_key_default")]
    pub dedup_key: bool,
}

fn dedup_key_default() -> bool {
    true
}

/// The wire form of a [`Record`]: the reference Worker's `toRecord` order, the fields every
/// record has first and then the optional ones present, numbers as JavaScript prints them.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WireRecord<'a> {
    id: &'a str,
    scope_key: &'a ScopeKey,
    kind: Kind,
    text: &'a str,
    keywords: &'a Keywords,
    source_thread_key: &'a str,
    created_at: i64,
    use_count: u64,
    status: Status,
    #[serde(skip_serializing_if = "Option::is_none")]
    source_run_id: &'a Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    provenance: Option<&'a serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_used_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    confidence: Option<Box<serde_json::value::RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    supersedes: &'a Option<String>,
    /// `lastUsedAt` set by the retrieve that answers: the reference adds the key to the record
    /// it read, so it comes last.
    #[serde(rename = "lastUsedAt", skip_serializing_if = "Option::is_none")]
    last_used_at_late: Option<i64>,
}

impl Serialize for Record {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.serialize_wire(s, false)
    }
}

/// A record a retrieve answers with, and whether that retrieve was its first use (it had no
/// `lastUsedAt` before): the wire form then puts `lastUsedAt` last, as the reference Worker
/// does when it sets the field on the row it read.
#[derive(Clone, Debug, PartialEq)]
pub struct Retrieved {
    /// The record, bumped.
    pub record: Record,
    /// Whether it had never been used before this retrieve.
    pub first_use: bool,
}

impl Retrieved {
    /// The records alone, in answer order.
    pub fn records(list: Vec<Retrieved>) -> Vec<Record> {
        list.into_iter().map(|r| r.record).collect()
    }
}

impl Serialize for Retrieved {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.record.serialize_wire(s, self.first_use)
    }
}

impl Record {
    fn serialize_wire<S: serde::Serializer>(&self, s: S, late: bool) -> Result<S::Ok, S::Error> {
        let confidence = match self.confidence {
            Some(c) => Some(
                serde_json::value::RawValue::from_string(crate::json::js_number(c))
                    .map_err(serde::ser::Error::custom)?,
            ),
            None => None,
        };
        // Emitted only when valid for the record's scope: a client drops a record whose
        // provenance is malformed. (Strings carrying a lone surrogate become `\udXXX` where the
        // JSON text leaves the process: `json::restore_lone`.)
        let provenance = match &self.provenance {
            Some(p) if crate::provenance::valid_for(self.scope_key.as_str(), p) => Some(p),
            _ => None,
        };
        WireRecord {
            id: &self.id,
            scope_key: &self.scope_key,
            kind: self.kind,
            text: &self.text,
            keywords: self.wire_keywords(),
            source_thread_key: &self.source_thread_key,
            created_at: self.created_at,
            use_count: self.use_count,
            status: self.status,
            source_run_id: &self.source_run_id,
            last_used_at: if late { None } else { self.last_used_at },
            confidence,
            supersedes: &self.supersedes,
            provenance,
            last_used_at_late: if late { self.last_used_at } else { None },
        }
        .serialize(s)
    }
}

/// The keywords a record gets when the writer sent none: every token of its text, repeats kept.
pub(crate) fn default_keywords(text: &str) -> Keywords {
    // Sized once: an ASCII text's token count is its runs of letters and digits.
    let mut b = KeywordsBuilder::with_capacity(crate::text::ascii_runs(text), text.len());
    crate::text::for_each_token(text, |t| b.push(t));
    b.finish()
}

/// The hash the bot seals a record with: SHA-256, as lowercase hex, of the JSON of
/// `{scopeKey, kind, text, keywords, sourceThreadKey, sourceRunId}` in that order (`sourceRunId`
/// `null` when absent), serialized as JavaScript's `JSON.stringify` does. A record read back
/// must hash to its provenance's `contentHash`, or the bot drops it.
pub fn content_hash(
    scope: &ScopeKey,
    kind: Kind,
    text: &str,
    keywords: impl IntoIterator<Item = impl AsRef<str>>,
    source_thread_key: &str,
    source_run_id: Option<&str>,
) -> String {
    // Written by hand as JSON.stringify writes it: a keyword may hold a lone surrogate.
    let mut json = String::with_capacity(96 + text.len());
    let field = |json: &mut String, name: &str, value: &str| {
        json.push_str(name);
        crate::json::write_string(value, json);
    };
    field(&mut json, "{\"scopeKey\":", scope.as_str());
    field(&mut json, ",\"kind\":", kind.as_str());
    field(&mut json, ",\"text\":", text);
    json.push_str(",\"keywords\":[");
    for (i, k) in keywords.into_iter().enumerate() {
        if i > 0 {
            json.push(',');
        }
        crate::json::write_string(k.as_ref(), &mut json);
    }
    json.push(']');
    field(&mut json, ",\"sourceThreadKey\":", source_thread_key);
    match source_run_id {
        Some(run) => field(&mut json, ",\"sourceRunId\":", run),
        None => json.push_str(",\"sourceRunId\":null"),
    }
    json.push('}');
    use sha2::Digest;
    let digest = sha2::Sha256::digest(json.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

impl Record {
    /// The keywords as the wire shows them: exactly as stored.
    pub fn wire_keywords(&self) -> &Keywords {
        &self.keywords
    }

    /// This record's content hash (see [`content_hash`]).
    pub fn content_hash(&self) -> String {
        content_hash(
            &self.scope_key,
            self.kind,
            &self.text,
            &self.keywords,
            &self.source_thread_key,
            self.source_run_id.as_deref(),
        )
    }

    /// The sequence number encoded in the id. A stored record's id is valid, so only its digits
    /// are read: no scope key is parsed or allocated (the `list` merge calls this per record).
    pub fn seq(&self) -> Option<u64> {
        split_record_id(&self.id).map(|(_, seq)| seq)
    }

    /// `lastUsedAt ?? createdAt`: the key of recency and eviction.
    pub fn usage_time(&self) -> i64 {
        self.last_used_at.unwrap_or(self.created_at)
    }

    /// Checks a record read from an export: id, scope, bounds.
    pub fn validate(&self) -> crate::error::Result<()> {
        self.validate_reason().map_err(crate::error::Error::invalid)
    }

    fn validate_reason(&self) -> Result<(), String> {
        let RecordId { scope, .. } = RecordId::parse(&self.id)
            .ok_or_else(|| format!("id {:?} is not mem:<scopeKey>:<seq>", self.id))?;
        if scope != self.scope_key {
            return Err(format!(
                "id {:?} does not belong to scope {}",
                self.id, self.scope_key
            ));
        }
        check_text(&self.text)?;
        check_ref("sourceThreadKey", &self.source_thread_key, true)?;
        if let Some(run) = &self.source_run_id {
            check_ref("sourceRunId", run, false)?;
        }
        if let Some(c) = self.confidence {
            check_confidence(c)?;
        }
        // An export shows a record without keywords with its text's tokens, which may be longer
        // than a writer's keyword may be: those must import again, or a backup cannot be restored.
        if self.keywords != default_keywords(&self.text) {
            check_keywords(&self.keywords)?;
        }
        if let Some(p) = &self.provenance {
            check_provenance(p, &self.scope_key)?;
        }
        Ok(())
    }
}

/// What one write did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteCounts {
    /// New records.
    pub inserted: u64,
    /// Candidates whose normalized text matched an active record (that record's use count rose).
    pub deduped: u64,
    /// Candidates that restated an active record (bumped it; inserted nothing).
    pub restated: u64,
    /// Records flipped to `superseded` by a new record.
    pub superseded: u64,
    /// Records flipped to `evicted` by the cap.
    pub evicted: u64,
}

impl std::ops::AddAssign for WriteCounts {
    fn add_assign(&mut self, o: WriteCounts) {
        self.inserted += o.inserted;
        self.deduped += o.deduped;
        self.restated += o.restated;
        self.superseded += o.superseded;
        self.evicted += o.evicted;
    }
}

fn check_text(text: &str) -> Result<(), String> {
    if text.chars().all(crate::text::is_js_whitespace) {
        return Err("text must not be empty".into());
    }
    if utf16_len(text) > MAX_TEXT_UNITS {
        return Err(format!(
            "text must be at most {MAX_TEXT_UNITS} UTF-16 units"
        ));
    }
    Ok(())
}

fn check_ref(name: &str, value: &str, required: bool) -> Result<(), String> {
    if required && value.is_empty() {
        return Err(format!("{name} must not be empty"));
    }
    if utf16_len(value) > MAX_REF_UNITS {
        return Err(format!(
            "{name} must be at most {MAX_REF_UNITS} UTF-16 units"
        ));
    }
    Ok(())
}

fn check_confidence(c: f64) -> Result<(), String> {
    if c.is_finite() && (0.0..=1.0).contains(&c) {
        Ok(())
    } else {
        Err("confidence must be a finite number in [0, 1]".into())
    }
}

fn check_keywords(keywords: impl IntoIterator<Item = impl AsRef<str>>) -> Result<(), String> {
    let mut count = 0;
    let mut bad = false;
    for k in keywords {
        let k = k.as_ref();
        count += 1;
        bad |= k.is_empty() || utf16_len(k) > MAX_KEYWORD_UNITS;
    }
    if count > MAX_KEYWORDS {
        return Err(format!("keywords must hold at most {MAX_KEYWORDS} entries"));
    }
    if bad {
        return Err(format!(
            "each keyword must be 1 to {MAX_KEYWORD_UNITS} UTF-16 units"
        ));
    }
    Ok(())
}

fn check_provenance(p: &serde_json::Value, scope: &ScopeKey) -> Result<(), String> {
    let obj = p
        .as_object()
        .ok_or_else(|| "provenance must be an object".to_owned())?;
    if serde_json::to_string(p).map_or(usize::MAX, |s| s.len()) > MAX_PROVENANCE_BYTES {
        return Err(format!(
            "provenance must be at most {MAX_PROVENANCE_BYTES} bytes of JSON"
        ));
    }
    match obj.get("scopeKey") {
        None => Ok(()),
        Some(serde_json::Value::String(s)) if s == scope.as_str() => Ok(()),
        Some(_) => Err("provenance.scopeKey must equal the record's scopeKey".into()),
    }
}

/// What the gate did with an extractor's facts: the one definition of these three counts, in a
/// reflection, its outcome, a write's options and a day's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Tally {
    /// Facts the extractor offered.
    pub offered: u64,
    /// Facts the gate rejected.
    pub rejected: u64,
    /// Rejections by marker name (a fact with two markers counts under both).
    pub rejected_by: BTreeMap<String, u64>,
}

impl Tally {
    /// Adds `other`.
    pub fn add(&mut self, other: &Tally) {
        self.offered += other.offered;
        self.rejected += other.rejected;
        for (marker, n) in &other.rejected_by {
            *self.rejected_by.entry(marker.clone()).or_default() += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_content_hash_is_the_bots() {
        // sha256 of {"scopeKey":"repo:acme/app","kind":"fact","text":"run npm ci \u00e9 \"q\"","keywords":["npm","ci"],"sourceThreadKey":"slack:C1:1","sourceRunId":null}
        // as JSON.stringify writes it (computed independently with Python's json.dumps(...,
        // separators=(",", ":"), ensure_ascii=False) and hashlib).
        let scope = ScopeKey::parse("repo:acme/app").expect("valid");
        let h = content_hash(
            &scope,
            Kind::Fact,
            "run npm ci \u{e9} \"q\"",
            &["npm".to_owned(), "ci".to_owned()],
            "slack:C1:1",
            None,
        );
        assert_eq!(
            h,
            "5fbb98d56bbc246d7304a4390e6aac5dd24170d1d644a9be111d2b9ef17fdb59"
        );
        let with_run = content_hash(
            &scope,
            Kind::Fact,
            "x",
            Keywords::new().iter(),
            "t",
            Some(""),
        );
        assert_ne!(
            with_run,
            content_hash(&scope, Kind::Fact, "x", Keywords::new().iter(), "t", None)
        );
    }

    #[test]
    fn records_serialize_without_nulls() {
        let r = Record {
            id: "mem:org:a:0".into(),
            scope_key: ScopeKey::parse("org:a").expect("valid"),
            kind: Kind::Fact,
            text: "t".into(),
            keywords: Default::default(),
            source_thread_key: "th".into(),
            source_run_id: None,
            provenance: None,
            created_at: 5,
            last_used_at: None,
            use_count: 0,
            confidence: None,
            supersedes: None,
            status: Status::Active,
            dedup_key: true,
        };
        let json = serde_json::to_string(&r).expect("serializes");
        assert!(!json.contains("null"), "{json}");
        assert!(json.contains("\"scopeKey\":\"org:a\""));
        assert!(json.contains("\"sourceThreadKey\""));
        assert!(
            json.contains("\"keywords\":[]"),
            "stored keywords, shown as stored: {json}"
        );
        let mut r = r;
        r.keywords = vec!["license".into()].into();
        let json = serde_json::to_string(&r).expect("serializes");
        assert!(json.contains("\"keywords\":[\"license\"]"), "{json}");
    }
}
