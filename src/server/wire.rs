//! Request bodies of the wire routes: JSON in, domain values out, every failure a reason that
//! names the field. Pure, so it is fuzzed directly.

use serde_json::{Map, Value};

use crate::context::RunScopes;
use crate::model::{Candidate, Kind, Record, ScopeKey};
use crate::reflect::{Origin, Shown};
use crate::store::{ListQuery, Tally, MAX_BATCH, MAX_LIMIT, MAX_QUERY_UNITS};
use crate::text::utf16_len;

/// A parsed request body. Each variant's fields are its route's JSON fields (see the README's
/// route table), converted to domain types.
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
        scope: ScopeKey,
        records: Vec<Candidate>,
        cap: Option<usize>,
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

/// The routes that take a JSON body, and whether they change the store.
pub const POST_ROUTES: [(&str, bool); 16] = [
    ("/retrieve", false),
    ("/write", true),
    ("/list", false),
    ("/forget", true),
    ("/sweep", true),
    ("/get", false),
    ("/scopes", false),
    ("/export", false),
    ("/import", true),
    ("/stats", false),
    ("/context", false),
    ("/prompt", false),
    ("/reflect", true),
    ("/journal", false),
    ("/review", false),
    ("/window", false),
];

pub use crate::model::MAX_IMPORT;

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

/// Parses the body of `route` (already valid JSON). `Err` is the 400 reason.
pub fn parse(route: &str, body: &Value) -> Result<Body, String> {
    let Value::Object(o) = body else {
        return Err("body must be a JSON object".into());
    };
    Ok(match route {
        "/retrieve" => Body::Retrieve {
            scope: scope(o)?,
            query: bounded_text("query", string(o, "query")?, MAX_QUERY_UNITS)?,
            limit: integer(o, "limit", 1, MAX_LIMIT as u64)?.ok_or("limit is required")? as usize,
        },
        "/write" => {
            let scope = scope(o)?;
            let list = array(o, "records")?;
            if list.len() > MAX_BATCH {
                return Err(format!("records must hold at most {MAX_BATCH} candidates"));
            }
            let records = list
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    serde_json::from_value::<Candidate>(v.clone())
                        .map_err(|e| format!("records[{i}]: {e}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            // Bounds now, so the answer names the field before anything is written.
            for (i, c) in records.iter().enumerate() {
                c.validate_reason(&scope, i)?;
            }
            let cap = integer(o, "cap", 1, crate::plan::MAX_CAP as u64)?.map(|c| c as usize);
            // Our extension: a reflection's offered/rejected counts, recorded with the write.
            // The Worker ignores unknown fields, so a client may always send it.
            let tally = match field(o, "tally") {
                None => None,
                Some(v) => Some(serde_json::from_value::<Tally>(v.clone()).map_err(|e| {
                    format!("tally must be {{offered, rejected, rejectedBy}}: {e}")
                })?),
            };
            // Our extension too: the texts the reflection's gate refused, for the journal.
            let rejected = match field(o, "rejected") {
                None => Vec::new(),
                Some(v) => serde_json::from_value::<Vec<crate::decisions::RejectedFact>>(v.clone())
                    .map_err(|e| format!("rejected must be [{{text, markers}}]: {e}"))?,
            };
            if rejected.len() > 50 {
                return Err("rejected must hold at most 50 facts".into());
            }
            Body::Write {
                scope,
                records,
                cap,
                tally,
                rejected,
            }
        }
        "/list" => {
            let kind = match opt_string(o, "kind")? {
                None => None,
                Some(k) => Some(Kind::parse(&k).ok_or("kind must be \"fact\" or \"summary\"")?),
            };
            let query = match opt_string(o, "query")? {
                Some(q) => Some(bounded_text("query", q, MAX_QUERY_UNITS)?),
                None => None,
            };
            Body::List {
                scope: scope(o)?,
                query: ListQuery {
                    limit: integer(o, "limit", 1, MAX_LIMIT as u64)?.ok_or("limit is required")?
                        as usize,
                    kind,
                    query,
                },
            }
        }
        "/forget" => Body::Forget {
            scope: scope(o)?,
            id: string(o, "id")?,
        },
        "/sweep" => Body::Sweep {
            scope: scope(o)?,
            dry_run: match field(o, "dryRun") {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err("dryRun must be a boolean".into()),
            },
        },
        "/get" => Body::Get {
            id: string(o, "id")?,
        },
        "/scopes" => Body::Scopes,
        "/export" => Body::Export,
        "/import" => {
            let list = array(o, "records")?;
            if list.len() > MAX_IMPORT {
                return Err(format!("records must hold at most {MAX_IMPORT} records"));
            }
            let records = list
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let r: Record = serde_json::from_value(v.clone())
                        .map_err(|e| format!("records[{i}]: {e}"))?;
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
            Body::Import { records, decisions }
        }
        "/journal" => {
            let scope = scope(o)?;
            let limit = integer(o, "limit", 1, crate::decisions::MAX_JOURNAL_LIMIT as u64)?
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
            Body::Journal {
                scope,
                query: crate::decisions::DecisionQuery {
                    since,
                    events,
                    limit,
                },
            }
        }
        "/review" => Body::Review {
            days: integer(o, "days", 1, 90)?.map_or(7, |d| d as u32),
            scope: match opt_string(o, "scopeKey")? {
                None => None,
                Some(s) if s == "all" => None,
                Some(s) => Some(ScopeKey::parse_reason(&s)?),
            },
        },
        "/window" => Body::Window { scope: scope(o)? },
        "/stats" => Body::Stats {
            since: match field(o, "since") {
                None => 0,
                Some(v) => v
                    .as_i64()
                    .ok_or("since must be an integer (days since 1970-01-01)")?,
            },
        },
        "/context" => Body::Context {
            run: run(o)?,
            brief: bounded_text("brief", string(o, "brief")?, 100_000)?,
        },
        "/prompt" => Body::Prompt {
            run: run(o)?,
            request: bounded_text("request", string(o, "request")?, 100_000)?,
            answer: bounded_text("answer", string(o, "answer")?, 100_000)?,
            transcript: opt_string(o, "transcript")?,
        },
        "/reflect" => Body::Reflect {
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
                if t.is_empty() || utf16_len(&t) > 200 {
                    return Err("thread must be 1 to 200 UTF-16 units".into());
                }
                t
            },
            run_id: opt_string(o, "runId")?,
        },
        other => return Err(format!("no route {other}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(route: &str, body: Value) -> String {
        parse(route, &body).expect_err("must fail")
    }

    #[test]
    fn reasons_name_the_field() {
        assert_eq!(
            err("/retrieve", json!({"query": "x", "limit": 3})),
            "scopeKey is required"
        );
        assert_eq!(
            err(
                "/retrieve",
                json!({"scopeKey": 5, "query": "x", "limit": 3})
            ),
            "scopeKey must be a string"
        );
        assert_eq!(
            err(
                "/retrieve",
                json!({"scopeKey": "org:a", "query": "x", "limit": 0})
            ),
            "limit must be an integer between 1 and 50"
        );
        assert_eq!(
            err(
                "/retrieve",
                json!({"scopeKey": "org:a", "query": "x", "limit": 2.5})
            ),
            "limit must be an integer between 1 and 50"
        );
        assert_eq!(
            err(
                "/retrieve",
                json!({"scopeKey": "org:a", "query": "x".repeat(4001), "limit": 2})
            ),
            "query must be at most 4000 UTF-16 units"
        );
        assert_eq!(
            err("/write", json!({"scopeKey": "org:a", "records": {}})),
            "records must be an array"
        );
        assert!(err("/write", json!({"scopeKey": "org:a", "records": [{"kind": "note", "text": "x", "sourceThreadKey": "t"}]})).starts_with("records[0]: unknown variant"));
        assert_eq!(
            err(
                "/write",
                json!({"scopeKey": "org:a", "records": [{"kind": "fact", "text": "", "sourceThreadKey": "t"}]})
            ),
            "records[0]: text must not be empty"
        );
        assert_eq!(
            err(
                "/write",
                json!({"scopeKey": "org:a", "records": [], "cap": 0})
            ),
            "cap must be an integer between 1 and 10000"
        );
        assert_eq!(
            err(
                "/list",
                json!({"scopeKey": "org:a", "limit": 5, "kind": "x"})
            ),
            "kind must be \"fact\" or \"summary\""
        );
        assert_eq!(
            err("/sweep", json!({"scopeKey": "org:a", "dryRun": "yes"})),
            "dryRun must be a boolean"
        );
        assert_eq!(err("/forget", json!([])), "body must be a JSON object");
    }

    #[test]
    fn unknown_fields_are_ignored_and_nulls_are_absent() {
        let b = parse(
            "/list",
            &json!({"scopeKey": "org:a", "limit": 5, "query": null, "extra": 1}),
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
        let w = parse("/write", &json!({"scopeKey": "org:a", "records": [{"kind": "fact", "text": "x", "sourceThreadKey": "t", "restates": "", "extra": true}]})).expect("valid");
        assert!(matches!(w, Body::Write { ref records, .. } if records.len() == 1));
    }

    #[test]
    fn keywords_up_to_256_of_64_units_are_accepted() {
        let many: Vec<String> = (0..256).map(|i| format!("k{i}")).collect();
        let ok = parse(
            "/write",
            &json!({"scopeKey": "org:a", "records": [{"kind": "fact", "text": "x", "sourceThreadKey": "t", "keywords": many}]}),
        );
        assert!(ok.is_ok());
        let too_many: Vec<String> = (0..257).map(|i| format!("k{i}")).collect();
        assert!(err("/write", json!({"scopeKey": "org:a", "records": [{"kind": "fact", "text": "x", "sourceThreadKey": "t", "keywords": too_many}]})).contains("keywords"));
    }
}
