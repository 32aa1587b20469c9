//! The wire contract, declared once: every route the server answers (its path, its method,
//! who may call it, its request and its answer) in one table, [`routes!`] below; the request
//! and answer bodies of the memory Worker's routes (`/retrieve`, `/write`, `/list`, `/forget`,
//! `/sweep`) as typed values whose JSON is the reference Worker's, key order included; and the
//! bodies of our own routes the same way.
//!
//! The server routes by this table and answers with these types, `RemoteStore` sends the
//! requests and reads the answers with them ([`Endpoint`]), and the CLI's `--json` prints them:
//! one definition, so the three cannot drift. The server does not parse requests with serde: its
//! validator (`server::wire`) reproduces the reference's JavaScript checks and words field by
//! field, which a derive cannot.
//!
//! **Invariant:** a route's path string appears in this file and nowhere else in the crate.

// Declared whole, as the reference's wire is: a build with the server alone or the client alone
// uses a part of it (the binary, through `internals`, uses all of it).
#![cfg_attr(not(feature = "__internals"), allow(dead_code))]

use serde::{Deserialize, Serialize};

use crate::decisions::{Decision, DecisionEvent, RejectedFact};
use crate::model::{Candidate, Kind, Record, Retrieved, ScopeKey, Tally, WriteCounts};
use crate::reflect::{Origin, ReflectionOutcome, Shown};
use crate::review::Review;
use crate::store::DayStats;

/// Who may call a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Anyone: the health check and the page's files, which hold no data.
    Open,
    /// The read-only token or the read-write token.
    Read,
    /// The read-write token only.
    Write,
}

/// A request body a client sends to its route, and the answer it reads back.
pub trait Endpoint: Serialize {
    /// The route.
    const ROUTE: PostRoute;
    /// The answer's body on a 200.
    type Answer;
}

/// Declares every route once: the POST routes with their path, access, request and answer
/// (which become an [`Endpoint`]), and the GET routes with their path and access.
macro_rules! routes {
    (
        post { $($p:ident $ppath:literal $pacc:ident $req:ty => $ans:ty,)* }
        get { $($g:ident $gpath:literal $gacc:ident,)* }
    ) => {
        /// A route that takes a JSON body by POST.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum PostRoute { $(#[doc = $ppath] $p,)* }

        /// A route read by GET, without a body.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum GetRoute { $(#[doc = $gpath] $g,)* }

        impl PostRoute {
            /// Every POST route, in the table's order.
            pub const ALL: &'static [PostRoute] = &[$(PostRoute::$p,)*];

            /// Its path.
            pub const fn path(self) -> &'static str {
                match self { $(PostRoute::$p => $ppath,)* }
            }

            /// Who may call it.
            pub const fn access(self) -> Access {
                match self { $(PostRoute::$p => Access::$pacc,)* }
            }
        }

        impl GetRoute {
            /// Every GET route, in the table's order.
            pub const ALL: &'static [GetRoute] = &[$(GetRoute::$g,)*];

            /// Its path.
            pub const fn path(self) -> &'static str {
                match self { $(GetRoute::$g => $gpath,)* }
            }

            /// Who may call it.
            pub const fn access(self) -> Access {
                match self { $(GetRoute::$g => Access::$gacc,)* }
            }
        }

        $(impl Endpoint for $req {
            const ROUTE: PostRoute = PostRoute::$p;
            type Answer = $ans;
        })*
    };
}

routes! {
    post {
        // The reference Worker's five, then ours. The order is the fuzz corpus's: a `wire`
        // input's first byte picks a route by its place here.
        Retrieve "/retrieve" Read RetrieveRequest => RetrieveAnswer,
        Write "/write" Write WriteRequest => WriteAnswer,
        List "/list" Read ListRequest => RecordsAnswer<Record>,
        Forget "/forget" Write ForgetRequest => ForgetAnswer,
        Sweep "/sweep" Write SweepRequest => SweepAnswer,
        Get "/get" Read GetRequest => GetAnswer,
        Scopes "/scopes" Read ScopesRequest => ScopesAnswer,
        Export "/export" Read ExportRequest => ExportAnswer,
        Import "/import" Write ImportRequest => ImportAnswer,
        Stats "/stats" Read StatsRequest => StatsAnswer,
        Context "/context" Read ContextRequest => ContextAnswer,
        Prompt "/prompt" Read PromptRequest => PromptAnswer,
        Reflect "/reflect" Write ReflectRequest => ReflectionOutcome,
        Journal "/journal" Read JournalRequest => JournalAnswer,
        Review "/review" Read ReviewRequest => Review,
        Window "/window" Read WindowRequest => WindowAnswer,
        Count "/count" Read CountRequest => CountAnswer,
    }
    get {
        Healthz "/healthz" Open,
        Metrics "/metrics" Read,
        Page "/" Open,
        PageScript "/app.js" Open,
        PageStyle "/app.css" Open,
    }
}

/// The Model Context Protocol's endpoint (streamable HTTP: JSON-RPC by POST), for any token;
/// the tools a read-only token sees are the read tools.
const MCP_PATH: &str = "/mcp";

/// A route of any kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// Takes a JSON body.
    Post(PostRoute),
    /// Takes none.
    Get(GetRoute),
    /// The MCP endpoint, which speaks its own protocol.
    Mcp,
}

impl Route {
    /// Every route the server answers: the POST routes, the GET routes, then `/mcp`.
    pub fn all() -> impl Iterator<Item = Route> {
        let post = PostRoute::ALL.iter().map(|&r| Route::Post(r));
        let get = GetRoute::ALL.iter().map(|&r| Route::Get(r));
        post.chain(get).chain(std::iter::once(Route::Mcp))
    }

    /// The route at `path`, if the server has one.
    pub fn at(path: &str) -> Option<Route> {
        Route::all().find(|r| r.path() == path)
    }

    /// Its path.
    pub fn path(self) -> &'static str {
        match self {
            Route::Post(r) => r.path(),
            Route::Get(r) => r.path(),
            Route::Mcp => MCP_PATH,
        }
    }

    /// Who may call it.
    pub fn access(self) -> Access {
        match self {
            Route::Post(r) => r.access(),
            Route::Get(r) => r.access(),
            Route::Mcp => Access::Read,
        }
    }
}

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

/// `POST /scopes`: no field.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ScopesRequest {}

/// `POST /export`: no field.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExportRequest {}

/// The answer of `/export`, streamed record by record: `{records, decisions}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExportAnswer {
    /// Every record, scope by scope, in sequence order.
    pub records: Vec<Record>,
    /// Every decision-journal entry, oldest first within a scope.
    pub decisions: Vec<Decision>,
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
    /// Only evictions of records never used (see `DecisionQuery::never_used`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub never_used: bool,
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

/// `POST /review`: the week's verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewRequest {
    /// Days back from today (UTC), 1–90; 7 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub days: Option<u32>,
    /// One scope, or `all` (the default) for every scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope_key: Option<String>,
}

/// The scopes of a run, as the run routes take them: its organization, and the ids (without
/// their prefixes) of the repository, channel and user it has.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunFields {
    /// The organization (`acme`).
    pub org: String,
    /// The repository (`acme/app`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    /// The channel (`slack:C1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// The user (`slack:U7`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// `POST /context`: the block for a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContextRequest {
    /// The run's scopes.
    #[serde(flatten)]
    pub run: RunFields,
    /// The run's brief: the query of the keyword hits.
    pub brief: String,
}

/// `POST /prompt`: the extractor's prompt after a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PromptRequest {
    /// The run's scopes.
    #[serde(flatten)]
    pub run: RunFields,
    /// What the run was asked.
    pub request: String,
    /// What it answered.
    pub answer: String,
    /// The run's transcript (its tail is shown); `request` and `answer` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transcript: Option<String>,
}

/// `POST /reflect`: the extractor's reply, gated, routed and written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReflectRequest {
    /// The run's scopes.
    #[serde(flatten)]
    pub run: RunFields,
    /// The extractor model's reply, as it came.
    pub reply: String,
    /// The handles `/prompt` answered, to resolve the reply's pointers.
    #[serde(default)]
    pub shown: Vec<Shown>,
    /// Where the run came from (`public`, `private`, `dm`, `machine`); `public` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
    /// The thread the facts came from (their `sourceThreadKey`); `server` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    /// The run's id (the facts' `sourceRunId`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
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
