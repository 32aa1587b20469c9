//! A record's provenance as the bot seals it: which sources a lesson depends on, checked,
//! merged and emitted by the reference Worker's rules.
//!
//! The bot attaches `{version: 1, scopeKey, contentHash, dependencies}` to every candidate it
//! writes; `dependencies` is its cumulative record of what the run read (origins, Slack
//! receipts, MCP reads, repositories, memory scopes, unit statuses). On every read the bot drops
//! a record whose provenance is malformed, so the store refuses a malformed one on write
//! ([`is_memory_provenance`]), keeps one naming another scope out of the record
//! ([`stored_provenance`]), and unions the dependencies when a candidate lands on an existing
//! record ([`merge_provenance`]): a dedup, a restate, or a correction that supersedes. A target
//! without valid provenance stays without it, and an incoming candidate without it taints the
//! union as `unknown` — never an empty list of dependencies.
//!
//! The comparisons, sizes and orders are JavaScript's (UTF-16 string order, `JSON.stringify`
//! bytes), because the bot checks what the store answers with the same code.
//!
//! **Invariant:** pure; never panics on any JSON.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};

use serde_json::{json, Map, Value};

/// Leaves (origins, receipts, reads, and one each for the repository, scope and unit lists) a
/// dependency record may hold.
pub const DEPENDENCY_MAX: usize = 32;
/// Repositories a dependency record may name.
pub const GITHUB_REPO_MAX: usize = 256;
/// Memory scopes a dependency record may name.
pub const MEMORY_SCOPE_MAX: usize = 256;
/// Unit statuses a dependency record may name.
pub const UNIT_STATUS_MAX: usize = 256;
/// GitHub reads admitted through the execution owner a (version 2) dependency record may name.
pub const EXECUTION_GITHUB_MAX: usize = 256;
/// The most bytes of a dependency record as JSON.
pub const DEPENDENCY_MAX_BYTES: usize = 16 * 1024;
/// Messages one Slack receipt may name.
pub const SOURCE_READ_MESSAGE_MAX: usize = 50;

/// `JSON.stringify(value)`: compact, keys in their order, numbers as JavaScript prints them.
pub(crate) fn js_stringify(value: &Value) -> String {
    crate::json::stringify(value)
}

fn js_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    crate::json::write_string(s, &mut out);
    out
}

/// JavaScript's `a < b` on strings: UTF-16 code unit order.
fn compare_text(a: &str, b: &str) -> Ordering {
    let mark = crate::json::lone::MARK;
    if a.contains(mark) || b.contains(mark) {
        crate::json::lone::utf16_units(a).cmp(&crate::json::lone::utf16_units(b))
    } else {
        a.encode_utf16().cmp(b.encode_utf16())
    }
}

/// Keys sorted by UTF-16 order, recursively; the form two values are compared in.
fn canonical(value: &Value) -> String {
    match value {
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(canonical).collect();
            format!("[{}]", inner.join(","))
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| compare_text(a.0, b.0));
            let inner: Vec<String> = entries
                .into_iter()
                .map(|(k, v)| format!("{}:{}", js_string(k), canonical(v)))
                .collect();
            format!("{{{}}}", inner.join(","))
        }
        other => js_stringify(other),
    }
}

fn bytes(value: &Value) -> usize {
    js_stringify(value).len()
}

fn units(s: &str) -> usize {
    crate::text::utf16_len(s)
}

fn bounded(value: Option<&Value>, max: usize) -> bool {
    value
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty() && units(s) <= max)
}

fn is_hash(value: Option<&Value>) -> bool {
    value.and_then(Value::as_str).is_some_and(|s| {
        s.len() == 64
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn safe_integer(value: Option<&Value>) -> Option<i64> {
    let n = value?.as_f64()?;
    (n.is_finite() && n.fract() == 0.0 && n.abs() <= 9_007_199_254_740_991.0).then_some(n as i64)
}

fn is_repo_name(s: &str) -> bool {
    let ok = |part: &str| {
        !part.is_empty()
            && part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    };
    matches!(s.split_once('/'), Some((a, b)) if ok(a) && ok(b))
}

fn is_github_repo(value: &Value) -> bool {
    value
        .as_str()
        .is_some_and(|s| units(s) <= 256 && is_repo_name(s))
}

fn is_memory_scope_key(value: &Value) -> bool {
    let Some(s) = value.as_str() else {
        return false;
    };
    if units(s) > 256 {
        return false;
    }
    let Some((kind, rest)) = s.split_once(':') else {
        return false;
    };
    if !matches!(kind, "org" | "user" | "channel" | "repo")
        || rest.is_empty()
        || rest.chars().any(crate::text::is_js_whitespace)
    {
        return false;
    }
    kind != "repo" || (units(rest) <= 256 && is_repo_name(rest))
}

fn is_address(value: Option<&Value>) -> bool {
    let Some(a) = value.and_then(Value::as_object) else {
        return false;
    };
    let field = |k: &str| {
        a.get(k)
            .and_then(Value::as_str)
            .is_some_and(|s| units(s) <= 256)
    };
    field("channelId") && field("threadKey")
}

fn one_of(value: Option<&Value>, allowed: &[&str]) -> bool {
    value
        .and_then(Value::as_str)
        .is_some_and(|s| allowed.contains(&s))
}

/// A Slack source receipt: who read which messages of which conversation, with their hashes.
fn is_slack_source_receipt(value: &Value) -> bool {
    let Some(r) = value.as_object() else {
        return false;
    };
    let messages = r.get("messages").and_then(Value::as_array);
    let read_kind = r.get("readKind").and_then(Value::as_str);
    let coverage = r.get("coverage").and_then(Value::as_object);
    r.get("kind").and_then(Value::as_str) == Some("slack-source")
        && r.get("requester")
            .and_then(Value::as_str)
            .is_some_and(|s| units(s) <= 256)
        && is_address(r.get("origin"))
        && is_address(r.get("destination"))
        && is_address(r.get("source"))
        && r.get("source")
            .and_then(|s| s.get("url"))
            .and_then(Value::as_str)
            .is_some_and(|u| units(u) <= 2048)
        && one_of(r.get("visibility"), &["public", "private", "dm"])
        && one_of(
            r.get("readKind"),
            &["reference", "thread", "nearby", "link", "file"],
        )
        && coverage.is_some_and(|c| {
            one_of(c.get("kind"), &["complete", "bounded"])
                && c.get("truncated").is_some_and(Value::is_boolean)
        })
        && messages.is_some_and(|list| {
            list.len() <= SOURCE_READ_MESSAGE_MAX
                && list.iter().all(|m| {
                    m.as_object().is_some_and(|m| {
                        m.get("id")
                            .and_then(Value::as_str)
                            .is_some_and(|id| !id.is_empty() && units(id) <= 64)
                            && is_hash(m.get("hash"))
                    })
                })
                && list
                    .iter()
                    .filter_map(|m| m.get("id").and_then(Value::as_str))
                    .collect::<HashSet<_>>()
                    .len()
                    == list.len()
        })
        && match r.get("file") {
            None => read_kind != Some("file"),
            Some(Value::Object(f)) => {
                read_kind == Some("file")
                    && f.get("id")
                        .and_then(Value::as_str)
                        .is_some_and(|id| units(id) <= 256)
                    && is_hash(f.get("hash"))
            }
            Some(_) => false,
        }
}

/// A reference to a persisted MCP read: the run, the action, its calls, the response's hash.
fn is_source_read_reference(value: &Value) -> bool {
    let Some(r) = value.as_object() else {
        return false;
    };
    let calls = r.get("callIds").and_then(Value::as_array);
    bounded(r.get("runId"), 256)
        && bounded(r.get("actionId"), 256)
        && calls.is_some_and(|c| {
            !c.is_empty()
                && c.len() <= 32
                && c.iter().all(|id| bounded(Some(id), 256))
                && c.iter()
                    .filter_map(Value::as_str)
                    .collect::<HashSet<_>>()
                    .len()
                    == c.len()
        })
        && is_hash(r.get("responseHash"))
}

const UNIT_STATUS_KEYS: [&str; 10] = [
    "instanceId",
    "unit",
    "attempt",
    "requester",
    "channelId",
    "threadKey",
    "deliveryId",
    "destinationThreadKey",
    "repo",
    "snapshotHash",
];

/// An immutable typed work status in the bot's session stores.
fn is_unit_status_reference(value: &Value) -> bool {
    let Some(r) = value.as_object() else {
        return false;
    };
    r.keys().all(|k| UNIT_STATUS_KEYS.contains(&k.as_str()))
        && [
            "instanceId",
            "unit",
            "requester",
            "channelId",
            "threadKey",
            "deliveryId",
            "destinationThreadKey",
        ]
        .iter()
        .all(|k| bounded(r.get(*k), 512))
        && safe_integer(r.get("attempt")).is_some_and(|a| a >= 0)
        && r.get("repo")
            .and_then(Value::as_str)
            .is_some_and(|s| is_repo_name(s) && units(s) <= 256)
        && is_hash(r.get("snapshotHash"))
}

fn unit_status_identity(r: &Value) -> String {
    let pick = |k: &str| r.get(k).cloned().unwrap_or(Value::Null);
    js_stringify(&Value::Array(
        UNIT_STATUS_KEYS[..8].iter().map(|k| pick(k)).collect(),
    ))
}

fn is_context_origin(value: &Value) -> bool {
    let Some(o) = value.as_object() else {
        return false;
    };
    ["runId", "requester", "channelId", "threadKey"]
        .iter()
        .all(|k| bounded(o.get(*k), 256))
        && match o.get("checkpoint") {
            None => true,
            some => is_hash(some),
        }
}

fn mcp_key(r: &Value) -> String {
    let pick = |k: &str| r.get(k).cloned().unwrap_or(Value::Null);
    js_stringify(&json!([pick("runId"), pick("actionId")]))
}

/// An MCP reference with its call ids sorted: the form two references are compared in.
fn mcp_sorted(r: &Value) -> Value {
    let mut r = r.clone();
    if let Some(Value::Array(calls)) = r.get_mut("callIds") {
        calls.sort_by(|a, b| compare_text(a.as_str().unwrap_or(""), b.as_str().unwrap_or("")));
    }
    r
}

/// Whether two receipts or reads say different things about the same message, file or action.
fn conflicting_evidence(slack: &[Value], mcp: &[Value]) -> bool {
    let mut facts: HashMap<String, String> = HashMap::new();
    let mut record = |key: String, evidence: String| -> bool {
        match facts.insert(key, evidence.clone()) {
            Some(previous) => previous != evidence,
            None => false,
        }
    };
    for receipt in slack {
        let source = receipt.get("source");
        let channel = source
            .and_then(|s| s.get("channelId"))
            .cloned()
            .unwrap_or(Value::Null);
        let thread = source
            .and_then(|s| s.get("threadKey"))
            .cloned()
            .unwrap_or(Value::Null);
        for m in receipt
            .get("messages")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let key = js_stringify(&json!([
                "message",
                channel,
                thread,
                m.get("id").cloned().unwrap_or(Value::Null)
            ]));
            let hash = m
                .get("hash")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            if record(key, hash) {
                return true;
            }
        }
        if let Some(file) = receipt.get("file").and_then(Value::as_object) {
            let key = js_stringify(&json!([
                "file",
                channel,
                file.get("id").cloned().unwrap_or(Value::Null)
            ]));
            let hash = file
                .get("hash")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            if record(key, hash) {
                return true;
            }
        }
    }
    for r in mcp {
        if record(mcp_key(r), canonical(&mcp_sorted(r))) {
            return true;
        }
    }
    false
}

fn array<'a>(c: &'a Map<String, Value>, key: &str) -> &'a [Value] {
    c.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn distinct_by(items: &[Value], key: impl Fn(&Value) -> String) -> bool {
    items.iter().map(key).collect::<HashSet<_>>().len() == items.len()
}

/// A record's leaves: every origin, receipt and read, and one for each non-empty list of
/// repositories, scopes, unit statuses and GitHub reads.
fn leaves(c: &Map<String, Value>) -> usize {
    Group::UNION_ORDER
        .iter()
        .map(|g| {
            let n = array(c, g.key()).len();
            if g.is_flag() {
                usize::from(n > 0)
            } else {
                n
            }
        })
        .sum()
}

/// A GitHub read admitted through the execution owner: the run, the call, and the hashes of
/// its result and of its admission. Exactly these fields.
fn is_execution_github_reference(value: &Value) -> bool {
    let Some(r) = value.as_object() else {
        return false;
    };
    r.keys().all(|k| {
        matches!(
            k.as_str(),
            "runId" | "callId" | "resultHash" | "admissionHash"
        )
    }) && bounded(r.get("runId"), 256)
        && bounded(r.get("callId"), 256)
        && is_hash(r.get("resultHash"))
        && is_hash(r.get("admissionHash"))
}

fn execution_key(r: &Value) -> String {
    let pick = |k: &str| r.get(k).cloned().unwrap_or(Value::Null);
    js_stringify(&json!([pick("runId"), pick("callId")]))
}

/// Whether `value` is a well-formed, bounded dependency record.
pub fn is_context_dependencies(value: &Value) -> bool {
    let Some(c) = value.as_object() else {
        return false;
    };
    let status = c.get("status").and_then(Value::as_str);
    let optional_list = |key: &str,
                         max: usize,
                         each: &dyn Fn(&Value) -> bool,
                         distinct: &dyn Fn(&Value) -> String| {
        match c.get(key) {
            None => true,
            Some(Value::Array(list)) => {
                list.len() <= max && list.iter().all(each) && distinct_by(list, distinct)
            }
            Some(_) => false,
        }
    };
    let (Some(origins), Some(slack), Some(mcp)) = (
        c.get("origins").and_then(Value::as_array),
        c.get("slack").and_then(Value::as_array),
        c.get("mcp").and_then(Value::as_array),
    ) else {
        return false;
    };
    // Version 1 has no GitHub reads; version 2 may (`null` is not absent).
    let version = c.get("version").and_then(Value::as_f64);
    (if version == Some(1.0) {
        !c.contains_key("executionGithub")
    } else {
        version == Some(2.0)
    }) && optional_list(
        "executionGithub",
        EXECUTION_GITHUB_MAX,
        &is_execution_github_reference,
        &execution_key,
    ) && matches!(status, Some("known" | "unknown" | "revoked"))
        && safe_integer(c.get("revision")).is_some_and(|r| r >= 0)
        && origins.iter().all(is_context_origin)
        && optional_list("githubRepos", GITHUB_REPO_MAX, &is_github_repo, &|v| {
            v.as_str().unwrap_or("").to_lowercase()
        })
        && optional_list(
            "memoryScopes",
            MEMORY_SCOPE_MAX,
            &is_memory_scope_key,
            &|v| v.as_str().unwrap_or("").to_owned(),
        )
        && optional_list(
            "unitStatuses",
            UNIT_STATUS_MAX,
            &is_unit_status_reference,
            &unit_status_identity,
        )
        && leaves(c) <= DEPENDENCY_MAX
        && slack.iter().all(is_slack_source_receipt)
        && mcp.iter().all(is_source_read_reference)
        && match c.get("reason") {
            None => true,
            Some(r) => one_of(Some(r), &["legacy", "overflow", "equivocation", "invalid"]),
        }
        && (status != Some("known") || c.get("reason").is_none())
        && distinct_by(origins, |o| {
            o.get("runId")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        })
        && distinct_by(mcp, mcp_key)
        && distinct_by(slack, canonical)
        && !conflicting_evidence(slack, mcp)
        && bytes(value) <= DEPENDENCY_MAX_BYTES
}

/// Whether `value` is a well-formed provenance: version 1, a scope, a content hash, and a
/// dependency record.
pub fn is_memory_provenance(value: &Value) -> bool {
    let Some(v) = value.as_object() else {
        return false;
    };
    v.get("version").and_then(Value::as_f64) == Some(1.0)
        && bounded(v.get("scopeKey"), 512)
        && is_hash(v.get("contentHash"))
        && v.get("dependencies").is_some_and(is_context_dependencies)
}

/// Whether `provenance` is valid and names `scope`.
pub fn valid_for(scope: &str, provenance: &Value) -> bool {
    is_memory_provenance(provenance)
        && provenance.get("scopeKey").and_then(Value::as_str) == Some(scope)
}

/// The provenance a record of `scope` keeps: a valid one naming that scope, or none.
pub fn stored_provenance(scope: &str, provenance: Option<&Value>) -> Option<Value> {
    let p = provenance?;
    valid_for(scope, p).then(|| p.clone())
}

/// The provenance of a record of `scope` (`original`) after `incoming`'s dependencies join it:
/// none when the original has none valid (it stays unknown); otherwise the union, tainted
/// `unknown` when the incoming side has none.
pub fn merge_provenance(
    scope: &str,
    original: Option<&Value>,
    incoming: Option<&Value>,
) -> Option<Value> {
    let mut target = stored_provenance(scope, original)?;
    let incoming = stored_provenance(scope, incoming);
    let merged = merge_context_dependencies(&[
        target.get("dependencies"),
        incoming.as_ref().and_then(|p| p.get("dependencies")),
    ]);
    if let Some(obj) = target.as_object_mut() {
        obj.insert("dependencies".into(), merged);
    }
    Some(target)
}

fn unknown_dependencies(reason: &str) -> Value {
    json!({"version": 1, "status": "unknown", "revision": 0, "origins": [], "slack": [], "mcp": [], "reason": reason})
}

/// The list fields moved to the end (when non-empty), lists sorted: the reference's normal
/// form, in its key order.
fn normalize(value: &Value) -> Value {
    let Some(obj) = value.as_object() else {
        return value.clone();
    };
    let mut out = Map::new();
    for (k, v) in obj {
        if matches!(
            k.as_str(),
            "executionGithub" | "githubRepos" | "memoryScopes" | "unitStatuses"
        ) {
            continue;
        }
        out.insert(k.clone(), v.clone());
    }
    let sorted = |key: &str,
                  by: &dyn Fn(&Value) -> String,
                  map: &dyn Fn(&Value) -> Value|
     -> Option<Value> {
        let list = obj.get(key)?.as_array()?;
        if list.is_empty() {
            return None;
        }
        let mut list: Vec<Value> = list.iter().map(map).collect();
        list.sort_by(|a, b| compare_text(&by(a), &by(b)));
        Some(Value::Array(list))
    };
    let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
    let same = |v: &Value| v.clone();
    if let Some(reads) = sorted("executionGithub", &execution_key, &same) {
        out.insert("executionGithub".into(), reads);
    }
    if let Some(repos) = sorted("githubRepos", &text, &|v| {
        Value::String(v.as_str().unwrap_or("").to_lowercase())
    }) {
        out.insert("githubRepos".into(), repos);
    }
    if let Some(scopes) = sorted("memoryScopes", &text, &same) {
        out.insert("memoryScopes".into(), scopes);
    }
    if let Some(units) = sorted("unitStatuses", &unit_status_identity, &same) {
        out.insert("unitStatuses".into(), units);
    }
    let by_run = |v: &Value| {
        v.get("runId")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    for (key, list) in [
        ("origins", sorted_all(obj.get("origins"), &by_run, &same)),
        ("slack", sorted_all(obj.get("slack"), &canonical, &same)),
        ("mcp", sorted_all(obj.get("mcp"), &mcp_key, &mcp_sorted)),
    ] {
        out.insert(key.into(), list);
    }
    Value::Object(out)
}

fn sorted_all(
    list: Option<&Value>,
    by: &dyn Fn(&Value) -> String,
    map: &dyn Fn(&Value) -> Value,
) -> Value {
    let mut list: Vec<Value> = list
        .and_then(Value::as_array)
        .map(|l| l.iter().map(map).collect())
        .unwrap_or_default();
    list.sort_by(|a, b| compare_text(&by(a), &by(b)));
    Value::Array(list)
}

fn same_content(a: &Value, b: &Value) -> bool {
    let zero = |v: &Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.insert("revision".into(), json!(0));
        }
        canonical(&v)
    };
    zero(a) == zero(b)
}

/// The lists a dependency record holds, in the order a union grows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Group {
    Repos,
    Scopes,
    Units,
    Origins,
    Slack,
    Mcp,
    Execution,
}

impl Group {
    /// The order of the union's steps: the reference grows each list in turn, and a later list
    /// can overflow where an earlier one took the room.
    const UNION_ORDER: [Group; 7] = [
        Group::Repos,
        Group::Scopes,
        Group::Units,
        Group::Origins,
        Group::Slack,
        Group::Mcp,
        Group::Execution,
    ];

    fn key(self) -> &'static str {
        match self {
            Group::Repos => "githubRepos",
            Group::Scopes => "memoryScopes",
            Group::Units => "unitStatuses",
            Group::Origins => "origins",
            Group::Slack => "slack",
            Group::Mcp => "mcp",
            Group::Execution => "executionGithub",
        }
    }

    /// Lists counted one leaf each when non-empty (the others count every item).
    fn is_flag(self) -> bool {
        matches!(
            self,
            Group::Repos | Group::Scopes | Group::Units | Group::Execution
        )
    }

    /// The most items the list may hold on its own, beside the shared leaf cap.
    fn max(self) -> usize {
        match self {
            Group::Repos => GITHUB_REPO_MAX,
            Group::Scopes => MEMORY_SCOPE_MAX,
            Group::Units => UNIT_STATUS_MAX,
            Group::Execution => EXECUTION_GITHUB_MAX,
            Group::Origins | Group::Slack | Group::Mcp => usize::MAX,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What a union step finds for an item of the incoming side.
enum Seen {
    /// Not in the list yet.
    New,
    /// Already there, saying the same thing.
    Same,
    /// Already there under the same identity, saying something else.
    Differs,
    /// Already there; the incoming copy says the same and more (an origin gaining its
    /// checkpoint), so it takes the place of the one there.
    Replaces(usize),
}

/// The state of one union in progress.
struct Union {
    version: u8,
    status: &'static str,
    reason: Option<String>,
    /// One list per [`Group`], indexed by `Group::index`.
    lists: [Vec<Value>; 7],
}

impl Union {
    fn list(&self, g: Group) -> &[Value] {
        self.lists.get(g.index()).map_or(&[], Vec::as_slice)
    }

    fn taint(&mut self, reason: &str) {
        if self.status != "revoked" {
            self.status = "unknown";
        }
        self.reason = Some(reason.to_owned());
    }

    /// The leaves of the record with `g`'s list replaced by `grown`.
    fn leaves_with(&self, g: Group, grown: &[Value]) -> usize {
        Group::UNION_ORDER
            .iter()
            .map(|&h| {
                let n = if h == g {
                    grown.len()
                } else {
                    self.list(h).len()
                };
                if h.is_flag() {
                    usize::from(n > 0)
                } else {
                    n
                }
            })
            .sum()
    }

    /// The size of the candidate record a step is checked against: every list present, even an
    /// empty one, revision 0, `g`'s list replaced by `grown`.
    fn bytes_with(&self, g: Group, grown: &[Value]) -> usize {
        let mut candidate = Map::new();
        candidate.insert("version".into(), json!(self.version));
        candidate.insert("status".into(), json!(self.status));
        candidate.insert("revision".into(), json!(0));
        for h in Group::UNION_ORDER {
            let list = if h == g { grown } else { self.list(h) };
            candidate.insert(h.key().into(), Value::Array(list.to_vec()));
        }
        bytes(&Value::Object(candidate))
    }

    /// Whether `item` of `g` is already in the union, and how it compares.
    fn seen(&self, g: Group, item: &Value) -> Seen {
        let same_or_differs = |identity: &dyn Fn(&Value) -> String| {
            let id = identity(item);
            match self.list(g).iter().find(|r| identity(r) == id) {
                None => Seen::New,
                Some(existing) if canonical(existing) == canonical(item) => Seen::Same,
                Some(_) => Seen::Differs,
            }
        };
        match g {
            Group::Repos | Group::Scopes => {
                if self.list(g).contains(item) {
                    Seen::Same
                } else {
                    Seen::New
                }
            }
            Group::Slack => {
                let c = canonical(item);
                if self.list(g).iter().any(|r| canonical(r) == c) {
                    Seen::Same
                } else {
                    Seen::New
                }
            }
            Group::Units => same_or_differs(&unit_status_identity),
            Group::Mcp => same_or_differs(&mcp_key),
            Group::Execution => same_or_differs(&execution_key),
            Group::Origins => self.seen_origin(item),
        }
    }

    /// Two origins of one run agree when they differ at most by one side lacking the
    /// checkpoint; the one with the checkpoint is kept.
    fn seen_origin(&self, origin: &Value) -> Seen {
        let run = origin.get("runId");
        let Some(pos) = self
            .list(Group::Origins)
            .iter()
            .position(|o| o.get("runId") == run)
        else {
            return Seen::New;
        };
        let existing = self.list(Group::Origins).get(pos).unwrap_or(&Value::Null);
        let without = |v: &Value| {
            let mut v = v.clone();
            if let Some(o) = v.as_object_mut() {
                o.remove("checkpoint");
            }
            canonical(&v)
        };
        let checkpoint = |v: &Value| {
            v.get("checkpoint")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        let (old, new) = (checkpoint(existing), checkpoint(origin));
        if without(existing) == without(origin) && (old.is_none() || new.is_none() || old == new) {
            if new.is_some() && old.is_none() {
                return Seen::Replaces(pos);
            }
            return Seen::Same;
        }
        if canonical(existing) == canonical(origin) {
            Seen::Same
        } else {
            Seen::Differs
        }
    }

    /// One step of the union: `item` joins `g` unless it is there already; a conflict is an
    /// equivocation, and an item that does not fit (the list's own bound, the leaf cap, the
    /// byte budget) is an overflow. Either way the union goes on with the next item.
    fn add(&mut self, g: Group, item: Value) {
        match self.seen(g, &item) {
            Seen::Same => {}
            Seen::Differs => self.taint("equivocation"),
            Seen::Replaces(pos) => {
                if let Some(slot) = self.lists.get_mut(g.index()).and_then(|l| l.get_mut(pos)) {
                    *slot = item;
                }
            }
            Seen::New => {
                let mut grown = self.list(g).to_vec();
                grown.push(item.clone());
                if g == Group::Slack && conflicting_evidence(&grown, self.list(Group::Mcp)) {
                    self.taint("equivocation");
                    return;
                }
                if grown.len() > g.max()
                    || self.leaves_with(g, &grown) > DEPENDENCY_MAX
                    || self.bytes_with(g, &grown) > DEPENDENCY_MAX_BYTES - 128
                {
                    self.taint("overflow");
                    return;
                }
                if let Some(list) = self.lists.get_mut(g.index()) {
                    list.push(item);
                }
            }
        }
    }

    /// The union as a record in the reference's normal form (revision still to be decided).
    fn into_record(self, revision: i64) -> Value {
        let mut merged = Map::new();
        merged.insert("version".into(), json!(self.version));
        merged.insert("status".into(), json!(self.status));
        merged.insert("revision".into(), json!(revision));
        let [repos, scopes, units, origins, slack, mcp, execution] = self.lists;
        merged.insert("origins".into(), Value::Array(origins));
        merged.insert("slack".into(), Value::Array(slack));
        merged.insert("mcp".into(), Value::Array(mcp));
        for (g, list) in [
            (Group::Execution, execution),
            (Group::Repos, repos),
            (Group::Scopes, scopes),
            (Group::Units, units),
        ] {
            if !list.is_empty() {
                merged.insert(g.key().into(), Value::Array(list));
            }
        }
        if self.status != "known" {
            if let Some(r) = self.reason {
                merged.insert("reason".into(), json!(r));
            }
        }
        normalize(&Value::Object(merged))
    }
}

fn status_of(v: &Value) -> &'static str {
    match v.get("status").and_then(Value::as_str) {
        Some("revoked") => "revoked",
        Some("unknown") => "unknown",
        _ => "known",
    }
}

fn list_of(v: &Value, key: &str) -> Vec<Value> {
    v.get(key)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn version_of(v: &Value) -> u8 {
    if v.get("version").and_then(Value::as_f64) == Some(2.0) {
        2
    } else {
        1
    }
}

/// The union of dependency records, in order: unknown and revoked inputs stay tainted, an
/// overflow keeps the leaves already present and names the gap, and a conflict between two
/// inputs is an `equivocation`. No input (or an absent one) counts as unknown (`legacy`), an
/// invalid one as unknown (`invalid`). The union is version 2 when any input is.
pub fn merge_context_dependencies(values: &[Option<&Value>]) -> Value {
    if values.is_empty() {
        return unknown_dependencies("legacy");
    }
    let mut result: Option<Value> = None;
    for value in values {
        let next = normalize(&match value {
            None => unknown_dependencies("legacy"),
            Some(v) if is_context_dependencies(v) => (*v).clone(),
            Some(_) => unknown_dependencies("invalid"),
        });
        let Some(previous) = result.take() else {
            result = Some(normalize(&next));
            continue;
        };
        result = Some(union_of(&previous, &next));
    }
    trim_to_budget(result.unwrap_or_else(|| unknown_dependencies("legacy")))
}

/// One union of two normalized records.
fn union_of(previous: &Value, next: &Value) -> Value {
    let (ps, ns) = (status_of(previous), status_of(next));
    let status = if ps == "revoked" || ns == "revoked" {
        "revoked"
    } else if ps == "unknown" || ns == "unknown" {
        "unknown"
    } else {
        "known"
    };
    let mut u = Union {
        version: version_of(previous).max(version_of(next)),
        status,
        reason: previous
            .get("reason")
            .or_else(|| next.get("reason"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        lists: Group::UNION_ORDER.map(|g| list_of(previous, g.key())),
    };
    for g in Group::UNION_ORDER {
        for item in list_of(next, g.key()) {
            u.add(g, item);
        }
    }
    let previous_revision = safe_integer(previous.get("revision")).unwrap_or(0);
    let next_revision = safe_integer(next.get("revision")).unwrap_or(0);
    let revision = previous_revision.max(next_revision);
    let merged = u.into_record(revision);
    let with_revision = |mut v: Value, r: i64| {
        if let Some(o) = v.as_object_mut() {
            o.insert("revision".into(), json!(r));
        }
        v
    };
    if same_content(previous, &merged) {
        with_revision(merged, revision)
    } else if same_content(next, &merged) && next_revision > previous_revision {
        merged
    } else if revision < 9_007_199_254_740_991 {
        with_revision(merged, revision + 1)
    } else {
        let mut v = merged;
        let revoked = status_of(&v) == "revoked";
        if let Some(o) = v.as_object_mut() {
            if !revoked {
                o.insert("status".into(), json!("unknown"));
            }
            o.insert("reason".into(), json!("overflow"));
        }
        v
    }
}

/// A union over the byte budget is tainted `overflow` and loses its last items, from the
/// least to the most fundamental list, until it fits.
fn trim_to_budget(mut result: Value) -> Value {
    if bytes(&result) <= DEPENDENCY_MAX_BYTES {
        return result;
    }
    let revoked = status_of(&result) == "revoked";
    if let Some(o) = result.as_object_mut() {
        o.insert(
            "status".into(),
            json!(if revoked { "revoked" } else { "unknown" }),
        );
        o.insert("reason".into(), json!("overflow"));
    }
    for g in [
        Group::Execution,
        Group::Units,
        Group::Scopes,
        Group::Repos,
        Group::Mcp,
        Group::Slack,
        Group::Origins,
    ] {
        while bytes(&result) > DEPENDENCY_MAX_BYTES {
            let popped = result
                .get_mut(g.key())
                .and_then(Value::as_array_mut)
                .and_then(Vec::pop);
            if popped.is_none() {
                break;
            }
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    fn deps(origins: Value) -> Value {
        json!({"version": 1, "status": "known", "revision": 0, "origins": origins, "slack": [], "mcp": []})
    }

    fn origin(run: &str) -> Value {
        json!({"runId": run, "requester": "U1", "channelId": "C1", "threadKey": "t"})
    }

    fn prov(scope: &str, d: Value) -> Value {
        json!({"version": 1, "scopeKey": scope, "contentHash": H, "dependencies": d})
    }

    #[test]
    fn provenance_is_checked_by_shape_and_bounds() {
        assert!(is_memory_provenance(&prov(
            "org:a",
            deps(json!([origin("r1")]))
        )));
        assert!(!is_memory_provenance(&json!({"version": 2})));
        assert!(!is_memory_provenance(&json!(null)));
        let mut bad = prov("org:a", deps(json!([origin("r1"), origin("r1")])));
        assert!(!is_memory_provenance(&bad), "duplicate origins");
        bad = prov(
            "org:a",
            json!({"version": 1, "status": "known", "revision": 0, "origins": [], "slack": [], "mcp": [], "reason": "legacy"}),
        );
        assert!(!is_memory_provenance(&bad), "a known record has no reason");
        let many: Vec<Value> = (0..33).map(|i| origin(&format!("r{i}"))).collect();
        assert!(!is_memory_provenance(&prov(
            "org:a",
            deps(Value::Array(many))
        )));
        assert!(is_context_dependencies(
            &json!({"version": 1, "status": "known", "revision": 2, "origins": [], "slack": [], "mcp": [], "githubRepos": ["Acme/Web"], "memoryScopes": ["repo:acme/web"]})
        ));
        assert!(!is_context_dependencies(
            &json!({"version": 1, "status": "known", "revision": 0, "origins": [], "slack": [], "mcp": [], "githubRepos": ["acme/web", "ACME/web"]})
        ));
    }

    #[test]
    fn a_target_without_provenance_stays_without_and_a_missing_incoming_taints() {
        assert_eq!(
            merge_provenance("org:a", None, Some(&prov("org:a", deps(json!([]))))),
            None
        );
        let target = prov("org:a", deps(json!([origin("r1")])));
        let merged = merge_provenance("org:a", Some(&target), None).expect("kept");
        assert_eq!(merged["dependencies"]["status"], "unknown");
        assert_eq!(merged["dependencies"]["reason"], "legacy");
        assert_eq!(merged["dependencies"]["revision"], 1);
        // Another scope's provenance is not this record's.
        assert_eq!(stored_provenance("org:b", Some(&target)), None);
    }

    #[test]
    fn known_dependencies_union_and_keep_their_order() {
        let a = prov("org:a", deps(json!([origin("r2")])));
        let b = prov("org:a", deps(json!([origin("r1"), origin("r2")])));
        let merged = merge_provenance("org:a", Some(&a), Some(&b)).expect("kept");
        let d = &merged["dependencies"];
        assert_eq!(d["status"], "known");
        assert_eq!(d["origins"][0]["runId"], "r1");
        assert_eq!(d["revision"], 1);
        assert_eq!(
            js_stringify(d),
            r#"{"version":1,"status":"known","revision":1,"origins":[{"runId":"r1","requester":"U1","channelId":"C1","threadKey":"t"},{"runId":"r2","requester":"U1","channelId":"C1","threadKey":"t"}],"slack":[],"mcp":[]}"#
        );
        // The same union again changes nothing, revision included.
        let again = merge_provenance("org:a", Some(&merged), Some(&b)).expect("kept");
        assert_eq!(again["dependencies"]["revision"], 1);
        // A conflicting origin for the same run is an equivocation.
        let mut other = origin("r1");
        other["requester"] = json!("U2");
        let c = prov("org:a", deps(json!([other])));
        let eq = merge_provenance("org:a", Some(&merged), Some(&c)).expect("kept");
        assert_eq!(
            (
                eq["dependencies"]["status"].clone(),
                eq["dependencies"]["reason"].clone()
            ),
            (json!("unknown"), json!("equivocation"))
        );
    }

    #[test]
    fn js_stringify_prints_numbers_as_javascript() {
        assert_eq!(
            js_stringify(&json!({"a": 1.0, "b": [0.5, 1e21], "c": "x\u{1}"})),
            r#"{"a":1,"b":[0.5,1e+21],"c":"x\u0001"}"#
        );
    }

    mod union {
        use super::*;
        use proptest::prelude::*;

        fn dependencies() -> impl Strategy<Value = Value> {
            let origin = (0usize..6, 0usize..2).prop_map(|(r, q)| {
                json!({"runId": format!("r{r}"), "requester": format!("U{q}"), "channelId": "C1", "threadKey": "t"})
            });
            let mcp = (0usize..4, 0usize..3).prop_map(|(a, c)| {
                json!({"runId": "r1", "actionId": format!("a{a}"), "callIds": [format!("c{c}")], "responseHash": H})
            });
            let read = (0usize..4, any::<bool>()).prop_map(|(c, other)| {
                let hash = if other { "b".repeat(64) } else { H.to_owned() };
                json!({"runId": "r7", "callId": format!("c{c}"), "resultHash": hash, "admissionHash": H})
            });
            (
                prop::collection::vec(origin, 0..8),
                prop::collection::vec(mcp, 0..4),
                prop::collection::vec(prop::sample::select(vec!["acme/web", "acme/api", "Acme/Web", "x/y"]), 0..4),
                prop::collection::vec(prop::sample::select(vec!["org:acme", "repo:acme/web", "user:U1"]), 0..3),
                prop::sample::select(vec!["known", "unknown", "revoked"]),
                0u64..5,
                (prop::option::of(prop::collection::vec(read, 0..4)), any::<bool>()),
            )
                .prop_map(|(origins, mcp, repos, scopes, status, revision, (reads, v2))| {
                    let version = if v2 || reads.is_some() { 2 } else { 1 };
                    let mut d = json!({"version": version, "status": status, "revision": revision, "origins": origins, "slack": [], "mcp": mcp});
                    if let Some(reads) = reads {
                        d["executionGithub"] = json!(reads);
                    }
                    if !repos.is_empty() {
                        d["githubRepos"] = json!(repos);
                    }
                    if !scopes.is_empty() {
                        d["memoryScopes"] = json!(scopes);
                    }
                    if status != "known" {
                        d["reason"] = json!("legacy");
                    }
                    d
                })
        }

        proptest! {
            #[test]
            fn the_union_of_valid_records_is_valid_and_keeps_taint(a in dependencies(), b in dependencies()) {
                let merged = merge_context_dependencies(&[Some(&a), Some(&b)]);
                if is_context_dependencies(&a) && is_context_dependencies(&b) {
                    prop_assert!(is_context_dependencies(&merged), "{a} + {b} = {merged}");
                    let worst = [&a, &b].iter().map(|v| status_of(v)).fold("known", |w, s| {
                        if w == "revoked" || s == "revoked" { "revoked" } else if w == "unknown" || s == "unknown" { "unknown" } else { "known" }
                    });
                    if worst != "known" {
                        prop_assert_ne!(status_of(&merged), "known", "taint is never lost");
                    }
                    let again = merge_context_dependencies(&[Some(&merged), Some(&b)]);
                    prop_assert!(same_content(&again, &merged), "a second union of the same input changes nothing");
                    prop_assert_eq!(
                        version_of(&merged),
                        version_of(&a).max(version_of(&b)),
                        "version 2 when an input is"
                    );
                }
            }
        }
    }
}
