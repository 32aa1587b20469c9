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
//! The module is cut by question: `dependencies` answers whether a dependency record is well
//! formed, `union` what two of them make together, and `json_text` how JavaScript measures and
//! orders the text both decide on. What stays here is the seal around the dependencies (version,
//! scope, content hash) and which provenance a record keeps.
//!
//! **Invariant:** pure; never panics on any JSON.

mod dependencies;
mod json_text;
mod union;

use serde_json::Value;

use dependencies::{bounded, is_hash};

pub use dependencies::is_context_dependencies;
pub use union::merge_context_dependencies;

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

#[cfg(test)]
mod tests {
    use super::json_text::js_stringify;
    use super::*;
    use serde_json::json;

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
}
