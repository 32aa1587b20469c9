//! The data model: scope keys, records, candidates, statuses and counts, with their validation.
//! (Over 600 lines: the wire types and their validators are one contract — every bound the wire
//! checks is here once — and about 100 lines of tests follow them.)
//!
//! JSON names are the memory Worker's (camelCase); optional fields are omitted, never `null`.
//! Lengths that the wire limits are counted in UTF-16 code units, as the reference counts them.
//!
//! **Invariant:** a value of [`ScopeKey`] or [`Candidate`] that passed validation obeys every bound
//! below; the store never re-checks them.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, LazyLock};

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::json::lone;
use crate::text::utf16_len;

/// The most characters a scope key may have.
pub const MAX_SCOPE_KEY_CHARS: usize = 200;
/// The most UTF-16 units a record's text may have.
pub const MAX_TEXT_UNITS: usize = 4000;
/// The most UTF-16 units of an id, a thread key or a run id.
pub const MAX_REF_UNITS: usize = 200;
/// The most keywords a candidate may carry (the reference Worker's bound).
pub const MAX_KEYWORDS: usize = 20;
/// The most UTF-16 units of one keyword.
pub const MAX_KEYWORD_UNITS: usize = 64;
/// The most bytes of a record's provenance as JSON.
pub const MAX_PROVENANCE_BYTES: usize = 16 * 1024;
/// The largest request body the wire carries (the server refuses more; clients split).
pub const MAX_BODY_BYTES: usize = 512 * 1024;
/// The most records one `/import` request carries.
pub const MAX_IMPORT: usize = 1000;

/// Characters a scope key may not hold: whitespace (both JavaScript's and Unicode's), control,
/// format, private-use and unassigned characters.
static FORBIDDEN_IN_SCOPE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"[\p{White_Space}\u{FEFF}\p{Cc}\p{Cf}\p{Co}\p{Cn}]")
        .expect("scope key pattern compiles")
});

/// Where a record lives: `org:<org>`, `repo:<owner>/<name>`, `channel:<id>`, `user:<id>`.
///
/// Non-empty, at most 200 characters, no whitespace, control, format, private-use or unassigned
/// characters. It never contains NUL, which the store uses as the key separator.
///
/// Cloning is a reference-count increment: every record read carries its scope.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopeKey(Arc<str>);

impl Serialize for ScopeKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl ScopeKey {
    /// Validates `key`; an invalid key is an [`ErrorKind::Invalid`](crate::ErrorKind) error
    /// whose message names the rule.
    pub fn parse(key: &str) -> crate::Result<ScopeKey> {
        ScopeKey::parse_reason(key).map_err(crate::Error::invalid)
    }

    /// [`ScopeKey::parse`] with the reason as text, for validators that compose reasons.
    pub(crate) fn parse_reason(key: &str) -> Result<ScopeKey, String> {
        if key.is_empty() {
            return Err("scopeKey must not be empty".into());
        }
        if utf16_len(key) > MAX_SCOPE_KEY_CHARS {
            return Err(format!(
                "scopeKey must be at most {MAX_SCOPE_KEY_CHARS} characters"
            ));
        }
        if let Some(m) = FORBIDDEN_IN_SCOPE.find(key) {
            let c = m.as_str().chars().next().unwrap_or(' ');
            return Err(format!(
                "scopeKey must not contain whitespace, control, format, private-use or unassigned characters (found U+{:04X})",
                c as u32
            ));
        }
        Ok(ScopeKey(Arc::from(key)))
    }

    /// The key of a scope `kind` (`org`, `repo`, `channel`, `user`) from an id without its
    /// prefix (`acme/app`; an id that repeats the prefix, `repo:acme/app`, means the same).
    /// A repository id must be `OWNER/NAME`.
    pub fn of(kind: &str, id: &str) -> crate::Result<ScopeKey> {
        let id = id.strip_prefix(&format!("{kind}:")).unwrap_or(id);
        if kind == "repo" && !id.contains('/') {
            return Err(crate::Error::invalid(format!(
                "repo must be OWNER/NAME, not {id:?}"
            )));
        }
        ScopeKey::parse_reason(&format!("{kind}:{id}"))
            .map_err(|e| crate::Error::invalid(format!("{kind}: {e}")))
    }

    /// A key read back from the store, which validated it on the way in.
    pub(crate) fn trusted(key: &str) -> ScopeKey {
        ScopeKey(Arc::from(key))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The scope kind (`org`, `repo`, `channel`, `user`) if the key has one of those prefixes.
    pub fn kind(&self) -> Option<&str> {
        let (kind, rest) = self.0.split_once(':')?;
        (matches!(kind, "org" | "repo" | "channel" | "user") && !rest.is_empty()).then_some(kind)
    }

    /// The id of the `seq`-th record of this scope: `mem:<scope>:<seq>`.
    pub fn record_id(&self, seq: u64) -> String {
        // Built by hand: every record read makes one, and `format!` costs more than the copy.
        let mut digits = [0u8; 20];
        let mut n = seq;
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let mut id = String::with_capacity(5 + self.0.len() + (digits.len() - i));
        id.push_str("mem:");
        id.push_str(&self.0);
        id.push(':');
        id.extend(digits[i..].iter().map(|&d| char::from(d)));
        id
    }
}

impl fmt::Display for ScopeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ScopeKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ScopeKey::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A record's id, `mem:<scope>:<seq>`, read: the scope the record belongs to and its sequence
/// number there. Ids are strings on the wire and in records; this is what code reads them into.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordId {
    /// The record's scope.
    pub scope: ScopeKey,
    /// Its sequence number in the scope (0, 1, … in write order, never reused).
    pub seq: u64,
}

impl RecordId {
    /// Reads `mem:<scope>:<seq>`; `None` unless the scope is a valid key and `seq` a decimal
    /// `u64` without leading zeros.
    pub fn parse(id: &str) -> Option<RecordId> {
        let (scope, seq) = split_record_id(id)?;
        Some(RecordId {
            scope: ScopeKey::parse(scope).ok()?,
            seq,
        })
    }
}

impl fmt::Display for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mem:{}:{}", self.scope, self.seq)
    }
}

/// `(scope text, seq)` of `mem:<scope>:<seq>`, the scope not checked: no allocation.
fn split_record_id(id: &str) -> Option<(&str, u64)> {
    let rest = id.strip_prefix("mem:")?;
    let (scope, seq) = rest.rsplit_once(':')?;
    if seq.is_empty()
        || !seq.bytes().all(|b| b.is_ascii_digit())
        || (seq.len() > 1 && seq.starts_with('0'))
    {
        return None;
    }
    Some((scope, seq.parse().ok()?))
}

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
    /// hash covers them. Matching always uses the text's tokens and these.
    #[serde(default)]
    pub keywords: Vec<String>,
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
    keywords: Cow<'a, [String]>,
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
                serde_json::value::RawValue::from_string(crate::text::js_number(c))
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
pub fn default_keywords(text: &str) -> Vec<String> {
    crate::text::tokenize(text)
}

/// The hash the bot seals a record with: SHA-256, as lowercase hex, of the JSON of
/// `{scopeKey, kind, text, keywords, sourceThreadKey, sourceRunId}` in that order (`sourceRunId`
/// `null` when absent), serialized as JavaScript's `JSON.stringify` does. A record read back
/// must hash to its provenance's `contentHash`, or the bot drops it.
pub fn content_hash(
    scope: &ScopeKey,
    kind: Kind,
    text: &str,
    keywords: &[String],
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
    for (i, k) in keywords.iter().enumerate() {
        if i > 0 {
            json.push(',');
        }
        crate::json::write_string(k, &mut json);
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
    pub fn wire_keywords(&self) -> Cow<'_, [String]> {
        Cow::Borrowed(&self.keywords)
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
    pub fn validate(&self) -> crate::Result<()> {
        self.validate_reason().map_err(crate::Error::invalid)
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
    /// Lowercased on write; the text's tokens when absent or empty.
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

    /// Checks every bound and returns the candidate in the form the planner takes: keywords
    /// lowercased (or the text's tokens), empty pointers removed. `index` names the candidate in
    /// the reason.
    pub fn validate(&self, scope: &ScopeKey, index: usize) -> crate::Result<ValidCandidate> {
        self.validate_reason(scope, index)
            .map_err(crate::Error::invalid)
    }

    /// [`Candidate::validate`] with the reason as text.
    pub(crate) fn validate_reason(
        &self,
        scope: &ScopeKey,
        index: usize,
    ) -> Result<ValidCandidate, String> {
        // The reference Worker's checks, in its order and with its words, so the library, the
        // server and a client of either read the same reason.
        let at = format!("records[{index}]");
        let kind = self
            .kind
            .ok_or_else(|| format!("{at}.kind must be \"fact\" or \"summary\""))?;
        if self.text.chars().all(crate::text::is_js_whitespace) {
            return Err(format!("{at}.text must be a non-empty string"));
        }
        if utf16_len(&self.text) > MAX_TEXT_UNITS {
            return Err(format!(
                "{at}.text must be at most {MAX_TEXT_UNITS} characters"
            ));
        }
        if self.source_thread_key.is_empty() || utf16_len(&self.source_thread_key) > MAX_REF_UNITS {
            return Err(format!("{at}.sourceThreadKey must be a non-empty string"));
        }
        // Stored as sent (the bot's content hash covers them); none sent: the text's tokens.
        let keywords = match &self.keywords {
            Some(k) => {
                check_keywords(k).map_err(|_| {
                    format!(
                        "{at}.keywords must be an array of at most {MAX_KEYWORDS} short strings"
                    )
                })?;
                k.clone()
            }
            None => default_keywords(&self.text),
        };
        let bounded = |name: &str, v: &Option<String>| -> Result<(), String> {
            match v {
                Some(v) if utf16_len(v) > MAX_REF_UNITS => {
                    Err(format!("{at}.{name} must be a string"))
                }
                _ => Ok(()),
            }
        };
        bounded("sourceRunId", &self.source_run_id)?;
        if let Some(c) = self.confidence {
            check_confidence(c)
                .map_err(|_| format!("{at}.confidence must be a number in [0, 1]"))?;
        }
        bounded("supersedes", &self.supersedes)?;
        bounded("restates", &self.restates)?;
        let pointer =
            |v: &Option<String>| v.as_deref().filter(|s| !s.is_empty()).map(str::to_owned);
        let supersedes = pointer(&self.supersedes);
        let restates = pointer(&self.restates);
        // The bot drops a record with a malformed provenance on every read, so one is refused
        // here; a well-formed one naming another scope is not this record's, and is dropped.
        if let Some(p) = &self.provenance {
            if !crate::provenance::is_memory_provenance(p) {
                return Err(format!("{at}.provenance must be a bounded memory revision"));
            }
        }
        // The reference stores these as SQLite text, which reads a lone surrogate back as three
        // U+FFFD; keywords and provenance it stores as JSON, which keeps one (see `json`).
        let stored = |v: &str| lone::as_stored_text(v).into_owned();
        Ok(ValidCandidate {
            kind,
            text: stored(&self.text),
            keywords,
            source_thread_key: stored(&self.source_thread_key),
            // Kept as sent, "" included: the content hash covers it.
            source_run_id: self.source_run_id.as_deref().map(stored),
            confidence: self.confidence,
            supersedes,
            supersedes_sent: self.supersedes.as_deref().map(stored),
            restates,
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

/// A candidate that passed [`Candidate::validate`].
#[derive(Clone, Debug, PartialEq)]
pub struct ValidCandidate {
    /// Fact or summary.
    pub kind: Kind,
    /// The text, as the reference stores it (a lone surrogate as three U+FFFD).
    pub text: String,
    /// Lowercased, deduplicated keywords; empty when the writer gave none.
    pub keywords: Vec<String>,
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
    /// key: false when its text was sent with a lone surrogate (see `Candidate::validate`).
    pub dedup: bool,
    /// A valid provenance naming this scope, or none ([`crate::provenance`]).
    pub provenance: Option<serde_json::Value>,
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

fn check_keywords(keywords: &[String]) -> Result<(), String> {
    if keywords.len() > MAX_KEYWORDS {
        return Err(format!("keywords must hold at most {MAX_KEYWORDS} entries"));
    }
    if keywords
        .iter()
        .any(|k| k.is_empty() || utf16_len(k) > MAX_KEYWORD_UNITS)
    {
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
    fn scope_keys_validate() {
        assert!(ScopeKey::parse("repo:acme/app").is_ok());
        assert!(ScopeKey::parse("channel:slack:C0123").is_ok());
        assert!(ScopeKey::parse("").is_err());
        assert!(ScopeKey::parse("repo:acme app").is_err());
        assert!(ScopeKey::parse("repo:a\u{0}b").is_err());
        assert!(
            ScopeKey::parse("repo:a\u{200B}b").is_err(),
            "format character"
        );
        assert!(ScopeKey::parse("repo:a\u{E000}b").is_err(), "private use");
        assert!(ScopeKey::parse("repo:a\u{FEFF}").is_err());
        assert!(ScopeKey::parse(&"x".repeat(201)).is_err());
        assert!(ScopeKey::parse(&"é".repeat(200)).is_ok());
    }

    #[test]
    fn record_ids_round_trip() {
        let scope = ScopeKey::parse("channel:slack:C1").expect("valid");
        let id = scope.record_id(42);
        assert_eq!(id, "mem:channel:slack:C1:42");
        assert_eq!(scope.record_id(0), "mem:channel:slack:C1:0");
        assert_eq!(
            scope.record_id(u64::MAX),
            format!("mem:channel:slack:C1:{}", u64::MAX)
        );
        let read = RecordId::parse(&id).expect("a valid id");
        assert_eq!(read.to_string(), id);
        assert_eq!(read, RecordId { scope, seq: 42 });
        assert_eq!(RecordId::parse("mem:org:a:01"), None);
        assert_eq!(RecordId::parse("mem:org:a:"), None);
        assert_eq!(RecordId::parse("org:a:1"), None);
        assert_eq!(RecordId::parse("mem:org:a:99999999999999999999999"), None);
        assert_eq!(RecordId::parse("mem:not a scope:1"), None);
    }

    #[test]
    fn candidates_validate_with_reasons() {
        let scope = ScopeKey::parse("org:acme").expect("valid");
        let ok = Candidate::fact("Run NPM ci, run it", "t")
            .validate(&scope, 0)
            .expect("valid");
        assert_eq!(
            ok.keywords,
            ["run", "npm", "ci", "run", "it"],
            "none sent: the text's tokens, repeats kept"
        );
        let blank = Candidate::fact(" \u{FEFF} ", "t").validate(&scope, 3);
        let blank = blank.expect_err("blank");
        assert!(blank.is_invalid());
        assert_eq!(
            blank.message(),
            "records[3].text must be a non-empty string"
        );
        let long = Candidate::fact("x".repeat(4001), "t").validate(&scope, 0);
        assert!(long.expect_err("long").message().contains("4000"));
        let conf = Candidate::fact("x", "t")
            .with_confidence(f64::NAN)
            .validate(&scope, 0);
        assert!(conf.expect_err("nan").message().contains("confidence"));
        let empty_ptr = Candidate::fact("x", "t")
            .restating("")
            .validate(&scope, 0)
            .expect("ok");
        assert_eq!(empty_ptr.restates, None);
        let mut foreign = Candidate::fact("x", "t");
        foreign.provenance = Some(serde_json::json!({"scopeKey": "org:other"}));
        assert!(foreign.validate(&scope, 0).is_err());
        let mut kw = Candidate::fact("x", "t");
        kw.keywords = Some(vec!["NPM".into(), "npm".into(), "Ci".into()]);
        assert_eq!(
            kw.validate(&scope, 0).expect("ok").keywords,
            ["NPM", "npm", "Ci"],
            "stored as sent: the bot's content hash covers them"
        );
        kw.keywords = Some(Vec::new());
        assert!(
            kw.validate(&scope, 0).expect("ok").keywords.is_empty(),
            "[] stays []"
        );
        let mut run = Candidate::fact("x", "t");
        run.source_run_id = Some(String::new());
        assert_eq!(
            run.validate(&scope, 0)
                .expect("ok")
                .source_run_id
                .as_deref(),
            Some("")
        );
    }

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
        let with_run = content_hash(&scope, Kind::Fact, "x", &[], "t", Some(""));
        assert_ne!(
            with_run,
            content_hash(&scope, Kind::Fact, "x", &[], "t", None)
        );
    }

    #[test]
    fn records_serialize_without_nulls() {
        let r = Record {
            id: "mem:org:a:0".into(),
            scope_key: ScopeKey::parse("org:a").expect("valid"),
            kind: Kind::Fact,
            text: "t".into(),
            keywords: vec![],
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
        r.keywords = vec!["license".into()];
        let json = serde_json::to_string(&r).expect("serializes");
        assert!(json.contains("\"keywords\":[\"license\"]"), "{json}");
    }
}
