//! The memory Worker's wire contract, defined once: the request and answer bodies of
//! `/retrieve`, `/write`, `/list`, `/forget` and `/sweep` as typed values whose JSON is the
//! reference Worker's, key order included.
//!
//! The server answers with these types, `RemoteStore` sends the requests and reads the answers
//! with them, and the CLI's `--json` prints them. The server does not parse requests with serde:
//! its validator (`server::wire`) reproduces the reference's JavaScript checks and words field by
//! field, which a derive cannot.

use serde::{Deserialize, Serialize};

use crate::decisions::RejectedFact;
use crate::model::{Candidate, Kind, Record, Retrieved, ScopeKey, Tally, WriteCounts};

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
