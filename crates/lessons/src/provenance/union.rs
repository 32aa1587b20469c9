//! What do dependency records make together? The reference's union: each input in its normal
//! form (list fields last, lists sorted), the lists grown one after another in
//! `Group::UNION_ORDER`, the revision rule, and the trim to the byte budget.
//!
//! Taint is never lost: an unknown or revoked input keeps the union unknown or revoked, and an
//! item that does not fit or contradicts what is there taints it (`overflow`, `equivocation`)
//! rather than vanishing. Each step is checked by the bounds `dependencies` checks a record by,
//! so the union is a record the bot accepts.
//!
//! **Invariant:** the union of valid records is valid, and version 2 exactly when an input is.
//! **Invariant:** the same input joining a second time changes no content.

use serde_json::{json, Map, Value};

use super::dependencies::{
    conflicting_evidence, execution_key, is_context_dependencies, mcp_key, mcp_sorted,
    safe_integer, unit_status_identity, Group,
};
use super::json_text::{bytes, canonical, compare_text};
use super::{DEPENDENCY_MAX, DEPENDENCY_MAX_BYTES};

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
    use proptest::prelude::*;

    const H: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

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
