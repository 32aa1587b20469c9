//! The memory Worker's wire contract, defined once: the request and answer bodies of
//! `/retrieve`, `/write`, `/list`, `/forget` and `/sweep` as typed values whose JSON is the
//! reference Worker's, key order included; and the bodies of our own routes (`/get`, `/scopes`,
//! `/count`, `/import`, `/stats`, `/journal`, `/window`, `/context`, `/prompt`) the same way.
//!
//! The server answers with these types, `RemoteStore` sends the requests and reads the answers
//! with them, and the CLI's `--json` prints them: one definition, so the three cannot drift. The server does not parse requests with serde:
//! its validator (`server::wire`) reproduces the reference's JavaScript checks and words field by
//! field, which a derive cannot.

use serde::{Deserialize, Serialize};

use crate::decisions::{Decision, DecisionEvent, RejectedFact};
use crate::model::{Candidate, Kind, Record, Retrieved, ScopeKey, Tally, WriteCounts};
use crate::reflect::Shown;
use crate::store::DayStats;

/// `POST /retrieve`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetrieveRequest {
    /// The scope to search.
    pub scope_key: ScopeKey,
    /// The query; its tokens are matched.
    pub query: String,
    /// 1–50.
    pub limit: usize,
}

/// `POST /write`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteRequest {
    /// The scope written to.
    pub scope_key: ScopeKey,
    /// Up to 50 candidates.
    pub records: Vec<Candidate>,
    /// The scope's cap on active records (1–10000); the server's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap: Option<usize>,
    /// Our extension: a reflection's gate counts, recorded with the write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tally: Option<Tally>,
    /// Our extension: the facts the gate refused, journaled with the write.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<RejectedFact>,
}

/// `POST /list`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListRequest {
    /// The scope listed.
    pub scope_key: ScopeKey,
    /// 1–50.
    pub limit: usize,
    /// Only records holding one of its tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// Only records of this kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Kind>,
}

/// `POST /forget`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ForgetRequest {
    /// The record's scope.
    pub scope_key: ScopeKey,
    /// The record's id.
    pub id: String,
}

/// `POST /sweep`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepRequest {
    /// The scope swept.
    pub scope_key: ScopeKey,
    /// Report, change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// The answer of `/retrieve` and `/list`: `{records}`. `T` is [`Record`], or [`Retrieved`] when
/// a retrieve answers (its first uses print `lastUsedAt` last, as the reference does).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordsAnswer<T> {
    /// The records, in answer order.
    pub records: Vec<T>,
}

/// What a retrieve answers with.
pub type RetrieveAnswer = RecordsAnswer<Retrieved>;

/// The answer of `/write`: `{ok, inserted, deduped, restated, superseded, evicted}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WriteAnswer {
    /// Always `true` on a 200.
    pub ok: bool,
    /// What the write did.
    #[serde(flatten)]
    pub counts: WriteCounts,
}

/// The answer of `/forget`: `{ok, forgotten}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ForgetAnswer {
    /// Always `true` on a 200.
    pub ok: bool,
    /// Whether an active record was flipped.
    pub forgotten: bool,
}

/// The answer of `/sweep`: `{ok, swept}`, plus `ids` on a dry run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepAnswer {
    /// Always `true` on a 200.
    pub ok: bool,
    /// Facts swept (or that a real sweep would sweep).
    pub swept: u64,
    /// On a dry run, their ids in ascending sequence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<Vec<String>>,
}

/// `POST /get`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GetRequest {
    /// The record's id.
    pub id: String,
}

/// The answer of `/get`: `{record}`, `null` when no record has the id.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GetAnswer {
    /// The record, whatever its status.
    pub record: Option<Record>,
}

/// The answer of `/scopes`: every scope holding a record, in key order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScopesAnswer {
    /// The scopes.
    pub scopes: Vec<ScopeKey>,
}

/// `POST /count`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CountRequest {
    /// The scope counted.
    pub scope_key: ScopeKey,
}

/// The answer of `/count`: `{active}`, the scope's active records (facts and summaries).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CountAnswer {
    /// Active records.
    pub active: u64,
}

/// `POST /import`: records and decision-journal entries, each kept as exported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ImportRequest<R = Record, D = Decision> {
    /// At most 1,000 records.
    pub records: Vec<R>,
    /// Decision-journal entries; none when absent.
    #[serde(default = "Vec::new", skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<D>,
}

/// The answer of `/import` and of `lessons import --json`: `{ok, imported, skipped, decisions}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ImportAnswer {
    /// Always `true` on a 200.
    pub ok: bool,
    /// Records written.
    pub imported: u64,
    /// Records whose id the store already held (left untouched).
    pub skipped: u64,
    /// Decision-journal entries added (an entry already held is not added again).
    pub decisions: u64,
}

/// `POST /stats`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatsRequest {
    /// The first day reported, in days since 1970-01-01.
    pub since: i64,
}

/// The answer of `/stats` and of `lessons stats --json`: `{days}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatsAnswer {
    /// One entry per scope per day with anything counted.
    pub days: Vec<DayStats>,
}

/// `POST /journal`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JournalRequest {
    /// The scope whose decisions are read.
    pub scope_key: ScopeKey,
    /// At most this many entries, newest first.
    pub limit: usize,
    /// Only entries at or after this time (milliseconds); all when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<i64>,
    /// Only these events; all when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<DecisionEvent>,
}

/// The answer of `/journal` and of `lessons journal --json`: `{decisions}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JournalAnswer {
    /// The entries, newest first.
    pub decisions: Vec<Decision>,
}

/// `POST /window`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WindowRequest {
    /// The scope whose window is read.
    pub scope_key: ScopeKey,
}

/// The answer of `/window`: the scope's newest facts, how many the rendered block kept, and
/// the block (absent when it kept none).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WindowAnswer<R = Record> {
    /// The window, newest first.
    pub records: Vec<R>,
    /// Records the block kept.
    pub kept: usize,
    /// The system-prompt block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<String>,
}

/// The answer of `/context` and of `lessons context --json`: `{kept, fromWindow, block}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContextAnswer {
    /// Records in the block.
    pub kept: usize,
    /// Of those, how many came from the repository's window.
    pub from_window: usize,
    /// The system-prompt block; absent when no record was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<String>,
}

/// The answer of `/prompt` and of `lessons prompt --json`: the extractor's prompt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PromptAnswer {
    /// The system prompt.
    pub system: String,
    /// The user input: the shown records by handle, then the transcript tail.
    pub input: String,
    /// Handle → id, to resolve the reply's pointers (send them back with `/reflect`).
    pub shown: Vec<Shown>,
}

/// Any refusal: `{error}` with the reason.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorAnswer {
    /// Why, naming the field.
    pub error: String,
}

impl From<Record> for Retrieved {
    fn from(record: Record) -> Retrieved {
        Retrieved {
            record,
            first_use: false,
        }
    }
}

impl<'de> Deserialize<'de> for Retrieved {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Retrieved, D::Error> {
        Record::deserialize(d).map(Retrieved::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_print_the_reference_keys_in_its_order() {
        let w = WriteAnswer {
            ok: true,
            counts: WriteCounts {
                inserted: 2,
                deduped: 1,
                restated: 0,
                superseded: 1,
                evicted: 0,
            },
        };
        assert_eq!(
            serde_json::to_string(&w).expect("json"),
            r#"{"ok":true,"inserted":2,"deduped":1,"restated":0,"superseded":1,"evicted":0}"#
        );
        let back: WriteAnswer =
            serde_json::from_str(&serde_json::to_string(&w).expect("json")).expect("parse");
        assert_eq!(back, w);
        let s = SweepAnswer {
            ok: true,
            swept: 0,
            ids: None,
        };
        assert_eq!(
            serde_json::to_string(&s).expect("json"),
            r#"{"ok":true,"swept":0}"#
        );
        let req = ListRequest {
            scope_key: ScopeKey::parse("org:a").expect("scope"),
            limit: 5,
            query: None,
            kind: Some(Kind::Fact),
        };
        assert_eq!(
            serde_json::to_string(&req).expect("json"),
            r#"{"scopeKey":"org:a","limit":5,"kind":"fact"}"#
        );
    }
}
