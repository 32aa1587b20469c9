//! Is this a well-formed dependency record? The bot's `isContextDependencies`, field by field:
//! shapes, bounds, the leaf cap and the byte budget, and the identities by which two entries
//! are one (an origin's run, an MCP read's action, a GitHub read's call, a unit status).
//!
//! Two receipts or reads that say different things about one message, file or action make a
//! record invalid, so the union asks the same question before it adds one.
//!
//! **Invariant:** pure and total: any JSON gets an answer, never a panic.
//! **Invariant:** the union counts leaves and bytes with these functions and [`Group`], so what
//! it grows is what this module accepts.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Map, Value};

use super::json_text::{bytes, canonical, compare_text, js_stringify, units};
use super::{
    DEPENDENCY_MAX, DEPENDENCY_MAX_BYTES, EXECUTION_GITHUB_MAX, GITHUB_REPO_MAX, MEMORY_SCOPE_MAX,
    SOURCE_READ_MESSAGE_MAX, UNIT_STATUS_MAX,
};

pub(super) fn bounded(value: Option<&Value>, max: usize) -> bool {
    value
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty() && units(s) <= max)
}

pub(super) fn is_hash(value: Option<&Value>) -> bool {
    value.and_then(Value::as_str).is_some_and(|s| {
        s.len() == 64
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

pub(super) fn safe_integer(value: Option<&Value>) -> Option<i64> {
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

pub(super) fn unit_status_identity(r: &Value) -> String {
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

pub(super) fn mcp_key(r: &Value) -> String {
    let pick = |k: &str| r.get(k).cloned().unwrap_or(Value::Null);
    js_stringify(&json!([pick("runId"), pick("actionId")]))
}

/// An MCP reference with its call ids sorted: the form two references are compared in.
pub(super) fn mcp_sorted(r: &Value) -> Value {
    let mut r = r.clone();
    if let Some(Value::Array(calls)) = r.get_mut("callIds") {
        calls.sort_by(|a, b| compare_text(a.as_str().unwrap_or(""), b.as_str().unwrap_or("")));
    }
    r
}

/// A string field's text, or empty when it is absent or not a string.
fn text_of(v: Option<&Value>) -> String {
    v.and_then(Value::as_str).unwrap_or("").to_owned()
}

/// Whether two receipts or reads say different things about the same message, file or action.
pub(super) fn conflicting_evidence(slack: &[Value], mcp: &[Value]) -> bool {
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
            if record(key, text_of(m.get("hash"))) {
                return true;
            }
        }
        if let Some(file) = receipt.get("file").and_then(Value::as_object) {
            let key = js_stringify(&json!([
                "file",
                channel,
                file.get("id").cloned().unwrap_or(Value::Null)
            ]));
            if record(key, text_of(file.get("hash"))) {
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

pub(super) fn execution_key(r: &Value) -> String {
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
        && distinct_by(origins, |o| text_of(o.get("runId")))
        && distinct_by(mcp, mcp_key)
        && distinct_by(slack, canonical)
        && !conflicting_evidence(slack, mcp)
        && bytes(value) <= DEPENDENCY_MAX_BYTES
}

/// The lists a dependency record holds, in the order a union grows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Group {
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
    pub(super) const UNION_ORDER: [Group; 7] = [
        Group::Repos,
        Group::Scopes,
        Group::Units,
        Group::Origins,
        Group::Slack,
        Group::Mcp,
        Group::Execution,
    ];

    pub(super) fn key(self) -> &'static str {
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
    pub(super) fn is_flag(self) -> bool {
        matches!(
            self,
            Group::Repos | Group::Scopes | Group::Units | Group::Execution
        )
    }

    /// The most items the list may hold on its own, beside the shared leaf cap.
    pub(super) fn max(self) -> usize {
        match self {
            Group::Repos => GITHUB_REPO_MAX,
            Group::Scopes => MEMORY_SCOPE_MAX,
            Group::Units => UNIT_STATUS_MAX,
            Group::Execution => EXECUTION_GITHUB_MAX,
            Group::Origins | Group::Slack | Group::Mcp => usize::MAX,
        }
    }

    pub(super) fn index(self) -> usize {
        self as usize
    }
}
