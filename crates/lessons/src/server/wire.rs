//! Request bodies of the wire routes: JSON in, domain values out, every failure a reason that
//! names the field. Pure, so it is fuzzed directly.

use serde_json::{Map, Value};

use crate::context::RunScopes;
use crate::contract::PostRoute;
use crate::limits::{
    MAX_BATCH, MAX_IMPORT, MAX_LIMIT, MAX_QUERY_UNITS, MAX_REF_UNITS, MAX_REVIEW_DAYS,
    MAX_RUN_TEXT_UNITS,
};
use crate::model::Tally;
use crate::model::{Candidate, Field, Kind, Record, ScopeKey};
use crate::reflect::{Origin, Shown};
use crate::store::ListQuery;
use crate::store::{Cap, CheckedWrite};
use crate::text::utf16_len;

/// A parsed request body. Each variant's fields are its route's JSON fields (see the route table
/// in `docs/server.md`), converted to domain types.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// `POST /retrieve`.
    Retrieve {
        scope: ScopeKey,
        query: String,
        limit: usize,
    },
    /// `POST /write`.
    Write {
        write: CheckedWrite<'static>,
        tally: Option<Tally>,
        rejected: Vec<crate::decisions::RejectedFact>,
    },
    /// `POST /list`.
    List { scope: ScopeKey, query: ListQuery },
    /// `POST /forget`.
    Forget { scope: ScopeKey, id: String },
    /// `POST /sweep`.
    Sweep { scope: ScopeKey, dry_run: bool },
    /// `POST /get`.
    Get { id: String },
    /// `POST /scopes`.
    Scopes,
    /// `POST /count`: a scope's active records.
    Count { scope: ScopeKey },
    /// `POST /export`.
    Export,
    /// `POST /import`.
    Import {
        records: Vec<Record>,
        decisions: Vec<crate::decisions::Decision>,
    },
    /// `POST /journal`: a scope's decision journal, newest first.
    Journal {
        scope: ScopeKey,
        query: crate::decisions::DecisionQuery,
    },
    /// `POST /review`: the week's verdict.
    Review {
        /// Days back from today (UTC), 1–90.
        days: u32,
        /// One scope, or every scope.
        scope: Option<ScopeKey>,
    },
    /// `POST /window`: a repository's window exactly as a run's block shows it.
    Window { scope: ScopeKey },
    /// `POST /stats`.
    Stats { since: i64 },
    /// `POST /context`.
    Context { run: RunScopes, brief: String },
    /// `POST /prompt`.
    Prompt {
        run: RunScopes,
        request: String,
        answer: String,
        transcript: Option<String>,
    },
    /// `POST /reflect`.
    Reflect {
        run: RunScopes,
        reply: String,
        shown: Vec<Shown>,
        origin: Origin,
        thread: String,
        run_id: Option<String>,
    },
}

fn field<'a>(o: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    o.get(name).filter(|v| !v.is_null())
}

fn string(o: &Map<String, Value>, name: &str) -> Result<String, String> {
    match field(o, name) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(format!("{name} must be a string")),
        None => Err(format!("{name} is required")),
    }
}

fn opt_string(o: &Map<String, Value>, name: &str) -> Result<Option<String>, String> {
    match field(o, name) {
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{name} must be a string")),
        None => Ok(None),
    }
}

fn scope(o: &Map<String, Value>) -> Result<ScopeKey, String> {
    ScopeKey::parse_reason(&string(o, "scopeKey")?)
}

fn integer(o: &Map<String, Value>, name: &str, lo: u64, hi: u64) -> Result<Option<u64>, String> {
    match field(o, name) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
            _ => Err(format!("{name} must be an integer between {lo} and {hi}")),
        },
    }
}

fn bounded_text(name: &str, s: String, max: usize) -> Result<String, String> {
    if utf16_len(&s) > max {
        Err(format!("{name} must be at most {max} UTF-16 units"))
    } else {
        Ok(s)
    }
}

fn run(o: &Map<String, Value>) -> Result<RunScopes, String> {
    let org = string(o, "org")?;
    let repo = opt_string(o, "repo")?;
    let channel = opt_string(o, "channel")?;
    let user = opt_string(o, "user")?;
    RunScopes::new(&org, repo.as_deref(), channel.as_deref(), user.as_deref())
        .map_err(|e| e.message().to_owned())
}

fn array<'a>(o: &'a Map<String, Value>, name: &str) -> Result<&'a Vec<Value>, String> {
    match field(o, name) {
        Some(Value::Array(a)) => Ok(a),
        Some(_) => Err(format!("{name} must be an array")),
        None => Err(format!("{name} is required")),
    }
}

/// The reference Worker's view of a body: `typeof body === "object" && body !== null`, so an
/// array passes and reads as an object without the fields.
fn js_object(body: &Value) -> Option<&Map<String, Value>> {
    static EMPTY: std::sync::LazyLock<Map<String, Value>> = std::sync::LazyLock::new(Map::new);
    match body {
        Value::Object(o) => Some(o),
        Value::Array(_) => Some(&EMPTY),
        _ => None,
    }
}

/// `Number.isInteger(v)` in `lo..=hi`.
fn js_integer_in(v: Option<&Value>, lo: f64, hi: f64) -> Option<u64> {
    let n = v?.as_f64()?;
    (n.is_finite() && n.fract() == 0.0 && (lo..=hi).contains(&n)).then_some(n as u64)
}

/// A string field, `None` when absent, `null` or another type.
fn js_str<'a>(o: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    o.get(name).and_then(Value::as_str)
}

fn wire_scope(o: &Map<String, Value>) -> Result<ScopeKey, String> {
    let key = match js_str(o, "scopeKey") {
        Some(k) if !k.is_empty() => k,
        _ => return Err("scopeKey must be a non-empty string".into()),
    };
    if utf16_len(key) > crate::limits::MAX_SCOPE_KEY_CHARS {
        return Err(format!(
            "scopeKey must be at most {} characters",
            crate::limits::MAX_SCOPE_KEY_CHARS
        ));
    }
    // `[\s\p{C}]`, the reference's pattern, is what `parse_reason` refuses beyond the length.
    ScopeKey::parse_reason(key)
        .map_err(|_| "scopeKey must not contain whitespace or control characters".to_owned())
}

fn wire_limit(o: &Map<String, Value>) -> Result<usize, String> {
    js_integer_in(o.get("limit"), 1.0, MAX_LIMIT as f64)
        .map(|n| n as usize)
        .ok_or_else(|| format!("limit must be an integer between 1 and {MAX_LIMIT}"))
}

/// A query field that must be a string when present (`null` is present).
fn wire_query(o: &Map<String, Value>, required: bool) -> Result<Option<String>, String> {
    match o.get("query") {
        None if !required => Ok(None),
        Some(Value::String(q)) => {
            if utf16_len(q) > MAX_QUERY_UNITS {
                Err(format!(
                    "query must be at most {MAX_QUERY_UNITS} characters"
                ))
            } else {
                Ok(Some(q.clone()))
            }
        }
        _ => Err("query must be a string".into()),
    }
}

/// A candidate as JSON decoded, checking nothing but JSON types: the candidate, and its first
/// field (in the reference's order) of the wrong type, for the one check
/// ([`CheckedWrite`]) to fail there with that field's words.
fn wire_candidate(v: &Value) -> (Candidate, Option<Field>) {
    let mut out = Candidate::default();
    let Some(c) = js_object(v) else {
        return (out, Some(Field::Object));
    };
    out.kind = match js_str(c, "kind") {
        Some("fact") => Some(Kind::Fact),
        Some("summary") => Some(Kind::Summary),
        _ => None,
    };
    let string = |name: &str| js_str(c, name).map(str::to_owned);
    // The first field of the wrong type, in the order they are read.
    let mut wrong = None;
    match string("text") {
        Some(t) => out.text = t,
        None => _ = wrong.get_or_insert(Field::Text),
    }
    match string("sourceThreadKey") {
        Some(t) => out.source_thread_key = t,
        None => _ = wrong.get_or_insert(Field::SourceThreadKey),
    }
    if let Some(k) = c.get("keywords") {
        let list = k.as_array().and_then(|list| {
            list.iter()
                .map(|k| k.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
        });
        match list {
            Some(list) => out.keywords = Some(list),
            None => _ = wrong.get_or_insert(Field::Keywords),
        }
    }
    // An optional string: absent, or a string, or the wrong type.
    let pointer = |name: &str| match c.get(name) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(()),
    };
    match pointer("sourceRunId") {
        Ok(v) => out.source_run_id = v,
        Err(()) => _ = wrong.get_or_insert(Field::SourceRunId),
    }
    if let Some(v) = c.get("confidence") {
        match v.as_f64() {
            Some(x) => out.confidence = Some(x),
            None => _ = wrong.get_or_insert(Field::Confidence),
        }
    }
    match pointer("supersedes") {
        Ok(v) => out.supersedes = v,
        Err(()) => _ = wrong.get_or_insert(Field::Supersedes),
    }
    match pointer("restates") {
        Ok(v) => out.restates = v,
        Err(()) => _ = wrong.get_or_insert(Field::Restates),
    }
    out.provenance = c.get("provenance").cloned();
    (out, wrong)
}

/// The reference Worker's five memory routes, field by field in its order, with its words.
fn parse_memory(route: Memory, body: &Value) -> Result<Body, String> {
    use Memory as R;
    {
        // `/sweep` alone refuses an array body; the others read it as an object without fields.
        let o = match (route, body) {
            (R::Sweep, Value::Array(_)) => None,
            _ => js_object(body),
        }
        .ok_or("body must be a JSON object")?;
        let scope = wire_scope(o)?;
        Ok(match route {
            R::Retrieve => {
                let query = wire_query(o, true)?.unwrap_or_default();
                Body::Retrieve {
                    scope,
                    query,
                    limit: wire_limit(o)?,
                }
            }
            R::List => {
                let limit = wire_limit(o)?;
                let query = wire_query(o, false)?;
                let kind = match o.get("kind") {
                    None => None,
                    Some(Value::String(k)) if k == "fact" => Some(Kind::Fact),
                    Some(Value::String(k)) if k == "summary" => Some(Kind::Summary),
                    Some(_) => return Err("kind must be \"fact\" or \"summary\"".into()),
                };
                Body::List {
                    scope,
                    query: ListQuery { limit, kind, query },
                }
            }
            R::Forget => {
                let id = js_str(o, "id").unwrap_or_default();
                crate::store::validate_forget_id(id).map_err(|e| e.message().to_owned())?;
                Body::Forget {
                    scope,
                    id: id.to_owned(),
                }
            }
            R::Sweep => Body::Sweep {
                scope,
                dry_run: match o.get("dryRun") {
                    None => false,
                    Some(Value::Bool(b)) => *b,
                    Some(_) => return Err("dryRun must be a boolean".into()),
                },
            },
            R::Write => {
                let cap = match o.get("cap") {
                    None => Cap::Default,
                    Some(v) => js_integer_in(Some(v), 0.0, u32::MAX as f64)
                        .and_then(|c| usize::try_from(c).ok())
                        .map_or(Cap::WrongType, Cap::Sent),
                }
                .check()?;
                let list = match o.get("records") {
                    Some(Value::Array(a)) => a,
                    _ => return Err("records must be an array".into()),
                };
                // The batch's size, like every bound of a candidate, is the one check's.
                let (records, wrong): (Vec<_>, Vec<_>) = list.iter().map(wire_candidate).unzip();
                let write = CheckedWrite::checking(scope, records.into(), cap, &wrong)?;
                write_extensions(o, write)?
            }
        })
    }
}

/// The reference Worker's own routes, which it checks in its own way.
#[derive(Clone, Copy)]
enum Memory {
    Retrieve,
    Write,
    List,
    Forget,
    Sweep,
}

/// `/write`'s fields beyond the reference's: a reflection's tally and the texts its gate
/// refused. The Worker ignores unknown fields, so a client may always send them.
fn write_extensions(o: &Map<String, Value>, write: CheckedWrite<'static>) -> Result<Body, String> {
    let tally = match field(o, "tally") {
        None => None,
        Some(v) => Some(
            serde_json::from_value::<Tally>(v.clone())
                .map_err(|e| format!("tally must be {{offered, rejected, rejectedBy}}: {e}"))?,
        ),
    };
    let rejected = match field(o, "rejected") {
        None => Vec::new(),
        Some(v) => serde_json::from_value::<Vec<crate::decisions::RejectedFact>>(v.clone())
            .map_err(|e| format!("rejected must be [{{text, markers}}]: {e}"))?,
    };
    if rejected.len() > MAX_BATCH {
        return Err(format!("rejected must hold at most {MAX_BATCH} facts"));
    }
    Ok(Body::Write {
        write,
        tally,
        rejected,
    })
}

/// `/import`: whole records as exported, and decision-journal entries, each checked.
fn import(o: &Map<String, Value>) -> Result<Body, String> {
    let list = array(o, "records")?;
    if list.len() > MAX_IMPORT {
        return Err(format!("records must hold at most {MAX_IMPORT} records"));
    }
    let records = list
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let r: Record =
                serde_json::from_value(v.clone()).map_err(|e| format!("records[{i}]: {e}"))?;
            r.validate().map_err(|e| format!("records[{i}]: {e}"))?;
            Ok(r)
        })
        .collect::<Result<Vec<_>, String>>()?;
    let decisions = match field(o, "decisions") {
        None => Vec::new(),
        Some(v) => {
            let list: Vec<crate::decisions::Decision> =
                serde_json::from_value(v.clone()).map_err(|e| format!("decisions: {e}"))?;
            if list.len() > MAX_IMPORT {
                return Err(format!("decisions must hold at most {MAX_IMPORT} entries"));
            }
            for (i, d) in list.iter().enumerate() {
                d.validate().map_err(|e| format!("decisions[{i}]: {e}"))?;
            }
            list
        }
    };
    Ok(Body::Import { records, decisions })
}

/// `/journal`: a scope, and which of its decisions.
fn journal(o: &Map<String, Value>) -> Result<Body, String> {
    let scope = scope(o)?;
    let limit = integer(o, "limit", 1, crate::limits::MAX_JOURNAL_LIMIT as u64)?
        .map_or(100, |l| l as usize);
    let since = match field(o, "since") {
        None => i64::MIN,
        Some(v) => v
            .as_i64()
            .ok_or("since must be an integer (milliseconds)")?,
    };
    let events = match field(o, "events") {
        None => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .map(|v| {
                v.as_str()
                    .and_then(crate::decisions::DecisionEvent::parse)
                    .ok_or_else(|| {
                        "events must name rejected, restated, deduped, superseded, inserted, evicted, swept or forgotten".to_owned()
                    })
            })
            .collect::<Result<Vec<_>, String>>()?,
        Some(_) => return Err("events must be an array".into()),
    };
    let never_used = match field(o, "neverUsed") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("neverUsed must be a boolean".into()),
    };
    Ok(Body::Journal {
        scope,
        query: crate::decisions::DecisionQuery {
            since,
            events,
            limit,
            never_used,
        },
    })
}

/// Parses the body of `route` (already valid JSON). `Err` is the 400 reason.
pub fn parse(route: PostRoute, body: &Value) -> Result<Body, String> {
    use PostRoute as R;
    // Our routes want an object; the reference's check their own way (`parse_memory`).
    let object = || match body {
        Value::Object(o) => Ok(o),
        _ => Err("body must be a JSON object".to_owned()),
    };
    Ok(match route {
        R::Retrieve => return parse_memory(Memory::Retrieve, body),
        R::Write => return parse_memory(Memory::Write, body),
        R::List => return parse_memory(Memory::List, body),
        R::Forget => return parse_memory(Memory::Forget, body),
        R::Sweep => return parse_memory(Memory::Sweep, body),
        R::Get => Body::Get {
            id: string(object()?, "id")?,
        },
        R::Scopes => object().map(|_| Body::Scopes)?,
        R::Export => object().map(|_| Body::Export)?,
        R::Import => import(object()?)?,
        R::Journal => journal(object()?)?,
        R::Review => {
            let o = object()?;
            Body::Review {
                days: integer(o, "days", 1, u64::from(MAX_REVIEW_DAYS))?.map_or(7, |d| d as u32),
                scope: match opt_string(o, "scopeKey")? {
                    None => None,
                    Some(s) if s == "all" => None,
                    Some(s) => Some(ScopeKey::parse_reason(&s)?),
                },
            }
        }
        R::Window => Body::Window {
            scope: scope(object()?)?,
        },
        R::Count => Body::Count {
            scope: scope(object()?)?,
        },
        R::Stats => Body::Stats {
            since: match field(object()?, "since") {
                None => 0,
                Some(v) => v
                    .as_i64()
                    .ok_or("since must be an integer (days since 1970-01-01)")?,
            },
        },
        R::Context => {
            let o = object()?;
            Body::Context {
                run: run(o)?,
                brief: bounded_text("brief", string(o, "brief")?, MAX_RUN_TEXT_UNITS)?,
            }
        }
        R::Prompt => {
            let o = object()?;
            Body::Prompt {
                run: run(o)?,
                request: bounded_text("request", string(o, "request")?, MAX_RUN_TEXT_UNITS)?,
                answer: bounded_text("answer", string(o, "answer")?, MAX_RUN_TEXT_UNITS)?,
                transcript: opt_string(o, "transcript")?,
            }
        }
        R::Reflect => {
            let o = object()?;
            Body::Reflect {
                run: run(o)?,
                reply: string(o, "reply")?,
                shown: match field(o, "shown") {
                    None => Vec::new(),
                    Some(v) => serde_json::from_value(v.clone())
                        .map_err(|e| format!("shown must be [{{\"handle\", \"id\"}}]: {e}"))?,
                },
                origin: match opt_string(o, "origin")? {
                    None => Origin::Public,
                    Some(s) => {
                        Origin::parse(&s).ok_or("origin must be public, private, dm or machine")?
                    }
                },
                thread: {
                    let t = opt_string(o, "thread")?.unwrap_or_else(|| "server".to_owned());
                    if t.is_empty() || utf16_len(&t) > MAX_REF_UNITS {
                        return Err(format!("thread must be 1 to {MAX_REF_UNITS} UTF-16 units"));
                    }
                    t
                },
                run_id: opt_string(o, "runId")?,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(route: PostRoute, body: Value) -> String {
        parse(route, &body).expect_err("must fail")
    }

    #[test]
    fn memory_routes_answer_in_the_reference_words_and_order() {
        let cases: &[(PostRoute, Value, &str)] = &[
            (
                PostRoute::Retrieve,
                json!({"query": "x", "limit": 3}),
                "scopeKey must be a non-empty string",
            ),
            (
                PostRoute::Retrieve,
                json!({"scopeKey": 5}),
                "scopeKey must be a non-empty string",
            ),
            (
                PostRoute::Retrieve,
                json!({"scopeKey": "org a"}),
                "scopeKey must not contain whitespace or control characters",
            ),
            (
                PostRoute::Retrieve,
                json!({"scopeKey": "o".repeat(201)}),
                "scopeKey must be at most 200 characters",
            ),
            (
                PostRoute::Retrieve,
                json!({"scopeKey": "org:a", "limit": 0}),
                "query must be a string",
            ),
            (
                PostRoute::Retrieve,
                json!({"scopeKey": "org:a", "query": "x", "limit": 0}),
                "limit must be an integer between 1 and 50",
            ),
            (
                PostRoute::Retrieve,
                json!({"scopeKey": "org:a", "query": "x", "limit": 2.5}),
                "limit must be an integer between 1 and 50",
            ),
            (
                PostRoute::Retrieve,
                json!({"scopeKey": "org:a", "query": "x".repeat(4001), "limit": 2}),
                "query must be at most 4000 characters",
            ),
            (
                PostRoute::Retrieve,
                json!([]),
                "scopeKey must be a non-empty string",
            ),
            (
                PostRoute::Retrieve,
                json!("x"),
                "body must be a JSON object",
            ),
            (PostRoute::Sweep, json!([]), "body must be a JSON object"),
            (
                PostRoute::Journal,
                json!({"scopeKey": "org:a", "neverUsed": "yes"}),
                "neverUsed must be a boolean",
            ),
            (
                PostRoute::Sweep,
                json!({"scopeKey": "org:a", "dryRun": "yes"}),
                "dryRun must be a boolean",
            ),
            (
                PostRoute::Sweep,
                json!({"scopeKey": "org:a", "dryRun": null}),
                "dryRun must be a boolean",
            ),
            (
                PostRoute::List,
                json!({"scopeKey": "org:a", "query": 1}),
                "limit must be an integer between 1 and 50",
            ),
            (
                PostRoute::List,
                json!({"scopeKey": "org:a", "limit": 5, "query": null}),
                "query must be a string",
            ),
            (
                PostRoute::List,
                json!({"scopeKey": "org:a", "limit": 5, "kind": "x"}),
                "kind must be \"fact\" or \"summary\"",
            ),
            (
                PostRoute::Forget,
                json!({"scopeKey": "org:a", "id": "a b"}),
                "id must be a non-empty string of at most 200 characters with no whitespace",
            ),
            (
                PostRoute::Forget,
                json!({"scopeKey": "org:a", "id": ""}),
                "id must be a non-empty string of at most 200 characters with no whitespace",
            ),
            (
                PostRoute::Write,
                json!({"scopeKey": "org:a", "records": [], "cap": 0}),
                "cap must be an integer between 1 and 10000",
            ),
            (
                PostRoute::Write,
                json!({"scopeKey": "org:a", "records": {}}),
                "records must be an array",
            ),
            (
                PostRoute::Write,
                json!({"scopeKey": "org:a", "records": [1]}),
                "records[0] must be an object",
            ),
            (
                PostRoute::Write,
                json!({"scopeKey": "org:a", "records": [[]]}),
                "records[0].kind must be \"fact\" or \"summary\"",
            ),
            (
                PostRoute::Write,
                json!({"scopeKey": "org:a", "records": [{"kind": "fact", "text": " \u{feff}"}]}),
                "records[0].text must be a non-empty string",
            ),
            (
                PostRoute::Write,
                json!({"scopeKey": "org:a", "records": [{"kind": "fact", "text": "x"}]}),
                "records[0].sourceThreadKey must be a non-empty string",
            ),
            (
                PostRoute::Write,
                json!({"scopeKey": "org:a", "records": [{"kind": "fact", "text": "x", "sourceThreadKey": "t", "keywords": [""]}]}),
                "records[0].keywords must be an array of at most 20 short strings",
            ),
            (
                PostRoute::Write,
                json!({"scopeKey": "org:a", "records": [{"kind": "fact", "text": "x", "sourceThreadKey": "t", "keywords": null}]}),
                "records[0].keywords must be an array of at most 20 short strings",
            ),
            (
                PostRoute::Write,
                json!({"scopeKey": "org:a", "records": [{"kind": "fact", "text": "x", "sourceThreadKey": "t", "sourceRunId": null}]}),
                "records[0].sourceRunId must be a string",
            ),
            (
                PostRoute::Write,
                json!({"scopeKey": "org:a", "records": [{"kind": "fact", "text": "x", "sourceThreadKey": "t", "confidence": 1.5}]}),
                "records[0].confidence must be a number in [0, 1]",
            ),
            (
                PostRoute::Write,
                json!({"scopeKey": "org:a", "records": [{"kind": "fact", "text": "x", "sourceThreadKey": "t", "restates": 3}]}),
                "records[0].restates must be a string",
            ),
        ];
        for (route, body, want) in cases {
            assert_eq!(&err(*route, body.clone()), want, "{} {body}", route.path());
        }
        let ok = parse(
            PostRoute::Retrieve,
            &json!({"scopeKey": "org:a", "query": "x", "limit": 2.0}),
        );
        assert!(matches!(ok, Ok(Body::Retrieve { limit: 2, .. })));
    }

    /// The wire and the library reach the one check: a write with several faults gets the same
    /// reason from both, the first in the reference's order.
    #[test]
    fn the_wire_and_the_library_give_a_write_the_same_reason() {
        let long = "x".repeat(MAX_REF_UNITS + 1);
        let cases = [
            // The cap before the batch's faults.
            (
                json!([{"kind": "fact", "text": " ", "sourceThreadKey": "t"}]),
                Some(0),
                "cap must be",
            ),
            // An earlier field's bound before a later field's.
            (
                json!([{"kind": "fact", "text": "x", "sourceThreadKey": long, "restates": ""}]),
                None,
                "records[0].sourceThreadKey",
            ),
            // The first candidate's provenance before the second candidate's text.
            (
                json!([
                    {"kind": "fact", "text": "x", "sourceThreadKey": "t", "provenance": 1},
                    {"kind": "fact", "text": "", "sourceThreadKey": "t"}
                ]),
                None,
                "records[0].provenance",
            ),
            (
                json!([{"kind": "fact", "text": "x", "sourceThreadKey": "t", "keywords": [""]}]),
                Some(3),
                "records[0].keywords",
            ),
        ];
        let scope = ScopeKey::parse("org:a").expect("valid");
        for (records, cap, first) in cases {
            let mut body = json!({"scopeKey": "org:a", "records": records});
            if let Some(cap) = cap {
                body["cap"] = json!(cap);
            }
            let wire = err(PostRoute::Write, body.clone());
            let candidates: Vec<Candidate> =
                serde_json::from_value(records.clone()).expect("candidates");
            let options = crate::store::WriteOptions {
                cap,
                ..Default::default()
            };
            let library = CheckedWrite::check(&scope, &candidates, &options).expect_err("refused");
            assert_eq!(library.message(), wire, "{body}");
            assert!(wire.starts_with(first), "{body}: {wire}");
        }
    }

    #[test]
    fn unknown_fields_are_ignored_and_nulls_are_absent() {
        let b = parse(
            PostRoute::List,
            &json!({"scopeKey": "org:a", "limit": 5, "extra": 1}),
        )
        .expect("valid");
        assert_eq!(
            b,
            Body::List {
                scope: ScopeKey::parse("org:a").expect("valid"),
                query: ListQuery {
                    limit: 5,
                    kind: None,
                    query: None
                }
            }
        );
        let w = parse(PostRoute::Write, &json!({"scopeKey": "org:a", "records": [{"kind": "fact", "text": "x", "sourceThreadKey": "t", "restates": "", "extra": true}]})).expect("valid");
        assert!(matches!(w, Body::Write { ref write, .. } if write.len() == 1));
    }

    #[test]
    fn keywords_up_to_20_of_64_units_are_accepted() {
        let many: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
        let ok = parse(
            PostRoute::Write,
            &json!({"scopeKey": "org:a", "records": [{"kind": "fact", "text": "x", "sourceThreadKey": "t", "keywords": many}]}),
        );
        assert!(ok.is_ok());
        let too_many: Vec<String> = (0..21).map(|i| format!("k{i}")).collect();
        assert!(err(PostRoute::Write, json!({"scopeKey": "org:a", "records": [{"kind": "fact", "text": "x", "sourceThreadKey": "t", "keywords": too_many}]})).contains("keywords"));
    }
}
