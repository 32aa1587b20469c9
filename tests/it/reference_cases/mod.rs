//! The reference Worker's own test cases (`worker.test.ts`), every one HTTP can observe,
//! re-expressed against `lessons serve` over the embedded store: same requests, same answers.
//! Cases the Worker checks from inside its Durable Object (SQL statements, FTS row counts) are
//! covered by their observable effect instead; where its tests seed rows with chosen times, a
//! fake clock writes them at those times.

mod retrieve;

use std::sync::Arc;

use lessons::server::Background;
use serde_json::{json, Value};

use crate::fixtures::server::{call, raw, serve_like_the_reference, TOKEN};
use crate::util::{FakeClock, T0};

const DAY: i64 = 24 * 60 * 60 * 1000;

struct Worker {
    server: Background,
    clock: FakeClock,
    _dir: tempfile::TempDir,
}

impl Worker {
    fn start() -> Worker {
        let dir = tempfile::tempdir().expect("dir");
        let clock = FakeClock::new(T0);
        let server = serve_like_the_reference(dir.path(), &clock, TOKEN);
        Worker {
            server,
            clock,
            _dir: dir,
        }
    }

    fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.raw(path, &body.to_string())
    }

    fn raw(&self, path: &str, body: &str) -> (u16, Value) {
        let (status, text) = call(&self.server.url(), "POST", path, Some(TOKEN), body);
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    fn ok(&self, path: &str, body: Value) -> Value {
        let (status, v) = self.post(path, body);
        assert_eq!(status, 200, "{path}: {v}");
        v
    }

    fn records(&self, path: &str, body: Value) -> Vec<Value> {
        self.ok(path, body)["records"]
            .as_array()
            .expect("records")
            .clone()
    }

    fn texts(&self, path: &str, body: Value) -> Vec<String> {
        self.records(path, body)
            .iter()
            .map(|r| r["text"].as_str().expect("text").to_owned())
            .collect()
    }
}

fn cand(text: &str) -> Value {
    json!({"kind": "fact", "text": text, "sourceThreadKey": "slack:C1:1.0", "sourceRunId": "run-1"})
}

fn cand_with(text: &str, extra: Value) -> Value {
    let mut c = cand(text);
    if let (Some(o), Value::Object(more)) = (c.as_object_mut(), extra) {
        o.extend(more);
    }
    c
}

/// Each subset field of `want` equals `got`'s.
fn has(got: &Value, want: Value) {
    for (k, v) in want.as_object().expect("object") {
        assert_eq!(&got[k], v, "{k} in {got}");
    }
}

const S: &str = "org:test";

#[test]
fn auth_routing_and_fences() {
    let w = Worker::start();
    let url = w.server.url();
    let body = json!({"scopeKey": S, "query": "x", "limit": 8}).to_string();
    assert_eq!(call(&url, "POST", "/retrieve", None, &body).0, 401);
    assert_eq!(call(&url, "POST", "/retrieve", Some("wrong"), &body).0, 401);
    assert_eq!(call(&url, "POST", "/nope", Some(TOKEN), "{}").0, 404);
    assert_eq!(call(&url, "GET", "/retrieve", Some(TOKEN), "").0, 405);
    // Fenced on the declared length, before a byte of the body is read.
    let big = format!("POST /write HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{{", 600 * 1024);
    assert_eq!(raw(w.server.addr, &big).0, 413);
    let (status, body) = call(&url, "GET", "/healthz", None, "");
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        (v["ok"].clone(), v["features"][0].clone()),
        (json!(true), json!("memory"))
    );
}

#[test]
fn malformed_bodies_are_400_with_a_reason() {
    let w = Worker::start();
    assert_eq!(w.raw("/retrieve", "not json").0, 400);
    for body in [
        json!({"scopeKey": "", "query": "x", "limit": 8}),
        json!({"scopeKey": "has space", "query": "x", "limit": 8}),
        json!({"scopeKey": "org:a", "query": "x", "limit": 0}),
        json!({"scopeKey": "org:a", "query": "x", "limit": 999}),
        json!({"scopeKey": "org:a", "query": 5, "limit": 8}),
    ] {
        assert_eq!(w.post("/retrieve", body.clone()).0, 400, "{body}");
    }
    let (status, bad) = w.post(
        "/write",
        json!({"scopeKey": "org:a", "records": [{"kind": "opinion", "text": "x", "sourceThreadKey": "t"}]}),
    );
    assert_eq!(status, 400);
    assert!(bad["error"].as_str().expect("error").contains("kind"));
    for records in [
        json!("nope"),
        json!([cand("   ")]),
        json!([cand_with("x", json!({"sourceThreadKey": 1}))]),
        json!([cand_with("x", json!({"keywords": "deploy"}))]),
        json!([cand(&"x".repeat(4001))]),
    ] {
        let (status, _) = w.post("/write", json!({"scopeKey": "org:a", "records": records}));
        assert_eq!(status, 400, "{records}");
    }
}

#[test]
fn concurrent_writers_never_collide_on_seq() {
    let w = Arc::new(Worker::start());
    let handles: Vec<_> = (0..5)
        .map(|b| {
            let w = Arc::clone(&w);
            std::thread::spawn(move || {
                w.ok("/write", json!({"scopeKey": S, "records": [cand(&format!("deploy note {b}a")), cand(&format!("deploy note {b}b"))]}))
            })
        })
        .collect();
    for h in handles {
        has(
            &h.join().expect("writer"),
            json!({"ok": true, "inserted": 2}),
        );
    }
    let all = w.records(
        "/retrieve",
        json!({"scopeKey": S, "query": "deploy note", "limit": 50}),
    );
    let ids: std::collections::HashSet<String> = all
        .iter()
        .map(|r| r["id"].as_str().expect("id").to_owned())
        .collect();
    assert_eq!((all.len(), ids.len()), (10, 10));
    assert!(ids.iter().all(|id| id.starts_with(&format!("mem:{S}:"))));
    has(
        &w.ok("/write", json!({"scopeKey": "org:empty", "records": []})),
        json!({"ok": true, "inserted": 0}),
    );
}

#[test]
fn list_is_newest_first_filtered_by_whole_tokens_without_bumping() {
    let w = Worker::start();
    w.ok("/write", json!({"scopeKey": S, "records": [cand("first fact"), cand("second fact"), cand("third fact")]}));
    let all = w.records("/list", json!({"scopeKey": S, "limit": 10}));
    let texts: Vec<&str> = all
        .iter()
        .map(|r| r["text"].as_str().expect("text"))
        .collect();
    assert_eq!(texts, ["third fact", "second fact", "first fact"]);
    assert!(all
        .iter()
        .all(|r| r["useCount"] == 0 && r.get("lastUsedAt").is_none()));
    assert_eq!(
        w.texts("/list", json!({"scopeKey": S, "limit": 2})),
        ["third fact", "second fact"]
    );
    assert_eq!(
        w.ok("/list", json!({"scopeKey": "org:nobody", "limit": 10})),
        json!({"records": []})
    );

    let s = "org:query";
    w.ok(
        "/write",
        json!({"scopeKey": s, "records": [
            cand_with("deploy uses npm run deploy", json!({"keywords": ["deploy", "npm"]})),
            cand("vacation policy is 20 days"),
            cand_with("redeploy after a merge", json!({"keywords": ["release"]})),
        ]}),
    );
    let q = |query: Value, limit: i64| {
        w.post(
            "/list",
            json!({"scopeKey": s, "limit": limit, "query": query}),
        )
    };
    assert_eq!(
        w.texts(
            "/list",
            json!({"scopeKey": s, "limit": 10, "query": "deploy release"})
        ),
        ["redeploy after a merge", "deploy uses npm run deploy"]
    );
    assert_eq!(
        q(json!("deploy release"), 1).1["records"]
            .as_array()
            .expect("records")
            .len(),
        1
    );
    assert_eq!(q(json!("deplo"), 10).1, json!({"records": []}));
    assert_eq!(q(json!("!!!"), 10).1, json!({"records": []}));
    assert_eq!(q(json!("deploy\" OR 1=1 --"), 10).0, 200);
    w.ok(
        "/forget",
        json!({"scopeKey": s, "id": format!("mem:{s}:2")}),
    );
    assert_eq!(
        w.texts(
            "/list",
            json!({"scopeKey": s, "limit": 10, "query": "deploy release"})
        ),
        ["deploy uses npm run deploy"]
    );
    assert_eq!(q(json!(5), 10).0, 400);
    assert_eq!(q(json!("x".repeat(4001)), 10).0, 400);
}

#[test]
fn forget_soft_deletes_one_active_record() {
    let w = Worker::start();
    w.ok(
        "/write",
        json!({"scopeKey": S, "records": [cand("keep this fact"), cand("drop this fact")]}),
    );
    let id = format!("mem:{S}:1");
    assert_eq!(
        w.ok("/forget", json!({"scopeKey": S, "id": id})),
        json!({"ok": true, "forgotten": true})
    );
    assert_eq!(
        w.texts("/list", json!({"scopeKey": S, "limit": 10})),
        ["keep this fact"]
    );
    assert_eq!(
        w.records(
            "/retrieve",
            json!({"scopeKey": S, "query": "drop", "limit": 8})
        )
        .len(),
        0
    );
    has(
        &w.ok(
            "/write",
            json!({"scopeKey": S, "records": [cand("drop this fact")]}),
        ),
        json!({"inserted": 1, "deduped": 0}),
    );
    assert_eq!(
        w.ok("/forget", json!({"scopeKey": S, "id": id})),
        json!({"ok": true, "forgotten": false})
    );
    // Another scope's id, or an unknown one, matches nothing.
    assert_eq!(
        w.ok(
            "/forget",
            json!({"scopeKey": "org:b", "id": format!("mem:{S}:0")})
        ),
        json!({"ok": true, "forgotten": false})
    );
    assert_eq!(
        w.ok(
            "/forget",
            json!({"scopeKey": S, "id": format!("mem:{S}:99")})
        ),
        json!({"ok": true, "forgotten": false})
    );
    for (path, body) in [
        ("/list", json!({"scopeKey": S, "limit": 0})),
        ("/list", json!({"scopeKey": S, "limit": 51})),
        ("/list", json!({"scopeKey": "bad key", "limit": 5})),
        ("/forget", json!({"scopeKey": S})),
        ("/forget", json!({"scopeKey": S, "id": "has space"})),
        ("/forget", json!({"scopeKey": S, "id": "x".repeat(201)})),
    ] {
        assert_eq!(w.post(path, body.clone()).0, 400, "{path} {body}");
    }
}

#[test]
fn dedup_and_supersede_follow_the_engine() {
    let w = Worker::start();
    let s = "org:dedup";
    w.ok(
        "/write",
        json!({"scopeKey": s, "records": [cand("the deploy command is npm run deploy")]}),
    );
    has(
        &w.ok(
            "/write",
            json!({"scopeKey": s, "records": [cand("  The DEPLOY   command is npm run deploy ")]}),
        ),
        json!({"inserted": 0, "deduped": 1}),
    );
    let r = w.records(
        "/retrieve",
        json!({"scopeKey": s, "query": "deploy", "limit": 8}),
    );
    assert_eq!((r.len(), r[0]["useCount"].clone()), (1, json!(2)));

    let s = "org:supersede";
    w.ok(
        "/write",
        json!({"scopeKey": s, "records": [cand("the deploy command is npm run deploy")]}),
    );
    let v = w.ok("/write", json!({"scopeKey": s, "records": [cand_with("the deploy command is now npm run ship", json!({"supersedes": format!("mem:{s}:0")}))]}));
    has(&v, json!({"inserted": 1, "superseded": 1}));
    let r = w.records(
        "/retrieve",
        json!({"scopeKey": s, "query": "deploy command", "limit": 8}),
    );
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0]["text"].clone(), r[0]["supersedes"].clone()),
        (
            json!("the deploy command is now npm run ship"),
            json!(format!("mem:{s}:0"))
        )
    );

    let s = "org:unknown";
    has(&w.ok("/write", json!({"scopeKey": s, "records": [cand_with("deploy fact", json!({"supersedes": format!("mem:{s}:999")}))]})), json!({"inserted": 1, "superseded": 0}));

    let s = "org:collision";
    w.ok("/write", json!({"scopeKey": s, "records": [cand("stale deploy fact"), cand("the deploy command is npm run ship")]}));
    let v = w.ok("/write", json!({"scopeKey": s, "records": [cand_with("the deploy command is npm run ship", json!({"supersedes": format!("mem:{s}:0")}))]}));
    has(&v, json!({"inserted": 1, "deduped": 0, "superseded": 1}));
    let mut texts = w.texts(
        "/retrieve",
        json!({"scopeKey": s, "query": "deploy", "limit": 8}),
    );
    texts.sort();
    assert_eq!(
        texts,
        [
            "the deploy command is npm run ship",
            "the deploy command is npm run ship"
        ]
    );
    // The earliest of two active duplicates takes the dedup bump.
    has(
        &w.ok(
            "/write",
            json!({"scopeKey": s, "records": [cand("the deploy command is npm run ship")]}),
        ),
        json!({"inserted": 0, "deduped": 1}),
    );
    let listed = w.records("/list", json!({"scopeKey": s, "limit": 10}));
    let count = |id: String| {
        listed
            .iter()
            .find(|r| r["id"] == json!(id))
            .map(|r| r["useCount"].clone())
    };
    assert_eq!(count(format!("mem:{s}:1")), Some(json!(2)));
    assert_eq!(count(format!("mem:{s}:2")), Some(json!(1)));

    let s = "org:restate";
    w.ok(
        "/write",
        json!({"scopeKey": s, "records": [cand("deploy v1")]}),
    );
    w.ok("/write", json!({"scopeKey": s, "records": [cand_with("deploy v2", json!({"supersedes": format!("mem:{s}:0")}))]}));
    has(
        &w.ok(
            "/write",
            json!({"scopeKey": s, "records": [cand("deploy v1")]}),
        ),
        json!({"inserted": 1, "deduped": 0}),
    );
    let mut texts = w.texts(
        "/retrieve",
        json!({"scopeKey": s, "query": "deploy", "limit": 8}),
    );
    texts.sort();
    assert_eq!(texts, ["deploy v1", "deploy v2"]);

    // A batch dedups against its own earlier insert; an empty `supersedes` still dedups.
    let s = "org:batch";
    has(&w.ok("/write", json!({"scopeKey": s, "records": [cand("same fact twice"), cand("  Same   FACT twice ")]})), json!({"ok": true, "inserted": 1, "deduped": 1}));
    has(&w.ok("/write", json!({"scopeKey": s, "records": [cand_with("same fact twice", json!({"supersedes": ""}))]})), json!({"ok": true, "inserted": 0, "deduped": 1, "superseded": 0}));
    let listed = w.records("/list", json!({"scopeKey": s, "limit": 10}));
    assert_eq!((listed.len(), listed[0]["useCount"].clone()), (1, json!(2)));
}

#[test]
fn the_scope_cap_evicts_the_least_recently_used() {
    let w = Worker::start();
    for t in ["alpha note", "beta note", "gamma note"] {
        has(
            &w.ok(
                "/write",
                json!({"scopeKey": S, "records": [cand(t)], "cap": 3}),
            ),
            json!({"evicted": 0}),
        );
        w.clock.advance(1_000);
    }
    w.ok(
        "/retrieve",
        json!({"scopeKey": S, "query": "alpha", "limit": 8}),
    );
    w.clock.advance(1_000);
    has(
        &w.ok(
            "/write",
            json!({"scopeKey": S, "records": [cand("delta note"), cand("epsilon note")], "cap": 3}),
        ),
        json!({"inserted": 2, "evicted": 2}),
    );
    let mut listed = w.texts("/list", json!({"scopeKey": S, "limit": 10}));
    listed.sort();
    assert_eq!(listed, ["alpha note", "delta note", "epsilon note"]);
    assert_eq!(
        w.records(
            "/retrieve",
            json!({"scopeKey": S, "query": "beta gamma", "limit": 8})
        )
        .len(),
        0
    );
    has(
        &w.ok(
            "/write",
            json!({"scopeKey": S, "records": [cand("beta note")], "cap": 3}),
        ),
        json!({"inserted": 1, "deduped": 0, "evicted": 1}),
    );

    let s = "org:default-cap";
    for i in 0..5 {
        w.ok(
            "/write",
            json!({"scopeKey": s, "records": [cand(&format!("note {i}"))]}),
        );
    }
    assert_eq!(
        w.records("/list", json!({"scopeKey": s, "limit": 50}))
            .len(),
        5
    );
    for cap in [json!(0), json!(10001), json!("5")] {
        assert_eq!(
            w.post(
                "/write",
                json!({"scopeKey": s, "records": [cand("x")], "cap": cap})
            )
            .0,
            400
        );
    }
}
