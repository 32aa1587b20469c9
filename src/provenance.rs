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
/// The most bytes of a dependency record as JSON.
pub const DEPENDENCY_MAX_BYTES: usize = 16 * 1024;
/// Messages one Slack receipt may name.
pub const SOURCE_READ_MESSAGE_MAX: usize = 50;

/// `JSON.stringify(value)`: compact, keys in their order, numbers as JavaScript prints them.
pub fn js_stringify(value: &Value) -> String {
    let mut out = String::new();
    write_js(value, &mut out);
    out
}

fn write_js(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&js_number_of(n)),
        Value::String(s) => out.push_str(&js_string(s)),
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_js(v, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&js_string(k));
                out.push(':');
                write_js(v, out);
            }
            out.push('}');
        }
    }
}

/// A JSON number as JavaScript holds and prints it (a double).
fn js_number_of(n: &serde_json::Number) -> String {
    const SAFE: u64 = (1 << 53) - 1;
    if let Some(u) = n.as_u64().filter(|u| *u <= SAFE) {
        return u.to_string();
    }
    if let Some(i) = n.as_i64().filter(|i| i.unsigned_abs() <= SAFE) {
        return i.to_string();
    }
    crate::text::js_number(n.as_f64().unwrap_or(f64::NAN))
}

fn js_string(s: &str) -> String {
    // serde_json escapes exactly what JSON.stringify escapes in a well-formed string.
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned())
}

/// JavaScript's `a < b` on strings: UTF-16 code unit order.
fn compare_text(a: &str, b: &str) -> Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
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

fn leaves(
    origins: usize,
    slack: usize,
    mcp: usize,
    repos: usize,
    scopes: usize,
    units: usize,
) -> usize {
    origins
        + slack
        + mcp
        + usize::from(repos > 0)
        + usize::from(scopes > 0)
        + usize::from(units > 0)
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
    c.get("version").and_then(Value::as_f64) == Some(1.0)
        && matches!(status, Some("known" | "unknown" | "revoked"))
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
        && leaves(
            origins.len(),
            slack.len(),
            mcp.len(),
            array(c, "githubRepos").len(),
            array(c, "memoryScopes").len(),
            array(c, "unitStatuses").len(),
        ) <= DEPENDENCY_MAX
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
        if matches!(k.as_str(), "githubRepos" | "memoryScopes" | "unitStatuses") {
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

/// The state of one union in progress.
struct Union {
    status: &'static str,
    reason: Option<String>,
    origins: Vec<Value>,
    slack: Vec<Value>,
    mcp: Vec<Value>,
    repos: Vec<Value>,
    scopes: Vec<Value>,
    units: Vec<Value>,
}

impl Union {
    fn taint(&mut self, reason: &str) {
        if self.status != "revoked" {
            self.status = "unknown";
        }
        self.reason = Some(reason.to_owned());
    }

    /// The candidate record a leaf is sized in: every list present, revision 0.
    fn candidate_bytes(&self, replace: &str, list: &[Value]) -> usize {
        let pick = |name: &str, own: &[Value]| -> Value {
            Value::Array(if name == replace {
                list.to_vec()
            } else {
                own.to_vec()
            })
        };
        bytes(&json!({
            "version": 1,
            "status": self.status,
            "revision": 0,
            "origins": pick("origins", &self.origins),
            "slack": pick("slack", &self.slack),
            "mcp": pick("mcp", &self.mcp),
            "githubRepos": pick("githubRepos", &self.repos),
            "memoryScopes": pick("memoryScopes", &self.scopes),
            "unitStatuses": pick("unitStatuses", &self.units),
        }))
    }

    fn too_big(&self, replace: &str, list: &[Value], counts: [usize; 6]) -> bool {
        leaves(
            counts[0], counts[1], counts[2], counts[3], counts[4], counts[5],
        ) > DEPENDENCY_MAX
            || self.candidate_bytes(replace, list) > DEPENDENCY_MAX_BYTES - 128
    }

    fn counts(&self) -> [usize; 6] {
        [
            self.origins.len(),
            self.slack.len(),
            self.mcp.len(),
            self.repos.len(),
            self.scopes.len(),
            self.units.len(),
        ]
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

/// The union of dependency records, in order: unknown and revoked inputs stay tainted, an
/// overflow keeps the leaves already present and names the gap, and a conflict between two
/// inputs is an `equivocation`. No input (or an absent one) counts as unknown (`legacy`), an
/// invalid one as unknown (`invalid`).
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
        let (ps, ns) = (status_of(&previous), status_of(&next));
        let status = if ps == "revoked" || ns == "revoked" {
            "revoked"
        } else if ps == "unknown" || ns == "unknown" {
            "unknown"
        } else {
            "known"
        };
        let reason = previous
            .get("reason")
            .or_else(|| next.get("reason"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let mut u = Union {
            status,
            reason,
            origins: list_of(&previous, "origins"),
            slack: list_of(&previous, "slack"),
            mcp: list_of(&previous, "mcp"),
            repos: list_of(&previous, "githubRepos"),
            scopes: list_of(&previous, "memoryScopes"),
            units: list_of(&previous, "unitStatuses"),
        };
        for (field, max) in [
            ("githubRepos", GITHUB_REPO_MAX),
            ("memoryScopes", MEMORY_SCOPE_MAX),
        ] {
            for key in list_of(&next, field) {
                let current = if field == "githubRepos" {
                    &u.repos
                } else {
                    &u.scopes
                };
                if current.contains(&key) {
                    continue;
                }
                let mut grown = current.clone();
                grown.push(key.clone());
                let mut counts = u.counts();
                counts[if field == "githubRepos" { 3 } else { 4 }] = grown.len();
                if grown.len() > max || u.too_big(field, &grown, counts) {
                    u.taint("overflow");
                    continue;
                }
                if field == "githubRepos" {
                    u.repos.push(key);
                } else {
                    u.scopes.push(key);
                }
            }
        }
        for reference in list_of(&next, "unitStatuses") {
            let id = unit_status_identity(&reference);
            if let Some(existing) = u.units.iter().find(|r| unit_status_identity(r) == id) {
                if canonical(existing) != canonical(&reference) {
                    u.taint("equivocation");
                }
                continue;
            }
            let mut grown = u.units.clone();
            grown.push(reference.clone());
            let mut counts = u.counts();
            counts[5] = 1;
            if grown.len() > UNIT_STATUS_MAX || u.too_big("unitStatuses", &grown, counts) {
                u.taint("overflow");
                continue;
            }
            u.units.push(reference);
        }
        for origin in list_of(&next, "origins") {
            let run = origin.get("runId").cloned();
            if let Some(pos) = u
                .origins
                .iter()
                .position(|o| o.get("runId").cloned() == run)
            {
                let existing = u.origins.get(pos).cloned().unwrap_or(Value::Null);
                let without = |v: &Value| {
                    let mut v = v.clone();
                    if let Some(o) = v.as_object_mut() {
                        o.remove("checkpoint");
                    }
                    canonical(&v)
                };
                let old_cp = existing
                    .get("checkpoint")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty());
                let new_cp = origin
                    .get("checkpoint")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty());
                if without(&existing) == without(&origin)
                    && (old_cp.is_none() || new_cp.is_none() || old_cp == new_cp)
                {
                    if new_cp.is_some() && old_cp.is_none() {
                        if let Some(slot) = u.origins.get_mut(pos) {
                            *slot = origin;
                        }
                    }
                    continue;
                }
                if canonical(&existing) != canonical(&origin) {
                    u.taint("equivocation");
                }
                continue;
            }
            let mut grown = u.origins.clone();
            grown.push(origin.clone());
            let mut counts = u.counts();
            counts[0] = grown.len();
            if u.too_big("origins", &grown, counts) {
                u.taint("overflow");
                continue;
            }
            u.origins.push(origin);
        }
        for receipt in list_of(&next, "slack") {
            let c = canonical(&receipt);
            if u.slack.iter().any(|r| canonical(r) == c) {
                continue;
            }
            let mut grown = u.slack.clone();
            grown.push(receipt.clone());
            if conflicting_evidence(&grown, &u.mcp) {
                u.taint("equivocation");
                continue;
            }
            let mut counts = u.counts();
            counts[1] = grown.len();
            if u.too_big("slack", &grown, counts) {
                u.taint("overflow");
                continue;
            }
            u.slack.push(receipt);
        }
        for reference in list_of(&next, "mcp") {
            let key = mcp_key(&reference);
            if let Some(existing) = u.mcp.iter().find(|r| mcp_key(r) == key) {
                if canonical(existing) != canonical(&reference) {
                    u.taint("equivocation");
                }
                continue;
            }
            let mut grown = u.mcp.clone();
            grown.push(reference.clone());
            let mut counts = u.counts();
            counts[2] = grown.len();
            if u.too_big("mcp", &grown, counts) {
                u.taint("overflow");
                continue;
            }
            u.mcp.push(reference);
        }
        let revision = safe_integer(previous.get("revision"))
            .unwrap_or(0)
            .max(safe_integer(next.get("revision")).unwrap_or(0));
        let mut merged = Map::new();
        merged.insert("version".into(), json!(1));
        merged.insert("status".into(), json!(u.status));
        merged.insert("revision".into(), json!(revision));
        merged.insert("origins".into(), Value::Array(u.origins));
        merged.insert("slack".into(), Value::Array(u.slack));
        merged.insert("mcp".into(), Value::Array(u.mcp));
        for (key, list) in [
            ("githubRepos", u.repos),
            ("memoryScopes", u.scopes),
            ("unitStatuses", u.units),
        ] {
            if !list.is_empty() {
                merged.insert(key.into(), Value::Array(list));
            }
        }
        if u.status != "known" {
            if let Some(r) = u.reason {
                merged.insert("reason".into(), json!(r));
            }
        }
        let merged = normalize(&Value::Object(merged));
        let with_revision = |mut v: Value, r: i64| {
            if let Some(o) = v.as_object_mut() {
                o.insert("revision".into(), json!(r));
            }
            v
        };
        let next_revision = safe_integer(next.get("revision")).unwrap_or(0);
        let previous_revision = safe_integer(previous.get("revision")).unwrap_or(0);
        result = Some(if same_content(&previous, &merged) {
            with_revision(merged, revision)
        } else if same_content(&next, &merged) && next_revision > previous_revision {
            merged
        } else if revision < 9_007_199_254_740_991 {
            with_revision(merged, revision + 1)
        } else {
            let mut v = merged;
            if let Some(o) = v.as_object_mut() {
                if status_of(&Value::Object(o.clone())) != "revoked" {
                    o.insert("status".into(), json!("unknown"));
                }
                o.insert("reason".into(), json!("overflow"));
            }
            v
        });
    }
    let mut result = result.unwrap_or_else(|| unknown_dependencies("legacy"));
    if bytes(&result) > DEPENDENCY_MAX_BYTES {
        if let Some(o) = result.as_object_mut() {
            let revoked = o.get("status").and_then(Value::as_str) == Some("revoked");
            o.insert(
                "status".into(),
                json!(if revoked { "revoked" } else { "unknown" }),
            );
            o.insert("reason".into(), json!("overflow"));
        }
        for key in [
            "unitStatuses",
            "memoryScopes",
            "githubRepos",
            "mcp",
            "slack",
            "origins",
        ] {
            while bytes(&result) > DEPENDENCY_MAX_BYTES {
                let popped = result
                    .get_mut(key)
                    .and_then(Value::as_array_mut)
                    .and_then(Vec::pop);
                if popped.is_none() {
                    break;
                }
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
            (
                prop::collection::vec(origin, 0..8),
                prop::collection::vec(mcp, 0..4),
                prop::collection::vec(prop::sample::select(vec!["acme/web", "acme/api", "Acme/Web", "x/y"]), 0..4),
                prop::collection::vec(prop::sample::select(vec!["org:acme", "repo:acme/web", "user:U1"]), 0..3),
                prop::sample::select(vec!["known", "unknown", "revoked"]),
                0u64..5,
            )
                .prop_map(|(origins, mcp, repos, scopes, status, revision)| {
                    let mut d = json!({"version": 1, "status": status, "revision": revision, "origins": origins, "slack": [], "mcp": mcp});
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
                }
            }
        }
    }
}
