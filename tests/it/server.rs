//! The HTTP server in this process: every route, every error code and their order, arbitrary
//! bodies.

use std::sync::Arc;

use lessons::server::{Auth, Background};
use lessons::{InMemoryStore, MemoryStore};
use proptest::prelude::*;
use serde_json::{json, Value};

use crate::fixtures::server::{auth, call, post, raw, serve, READ, TOKEN};

fn server_with(auth: Auth) -> Background {
    serve(Arc::new(InMemoryStore::new()), auth)
}

fn server() -> Background {
    server_with(auth(TOKEN, Some(READ)))
}

#[test]
fn errors_come_in_the_contracts_order() {
    let s = server();
    let url = s.url();
    // 404 before auth.
    assert_eq!(
        call(&url, "POST", "/nope", None, "{}"),
        (404, r#"{"error":"not found"}"#.into())
    );
    assert_eq!(call(&url, "GET", "/nope", None, "").0, 404);
    // 405 before auth.
    assert_eq!(call(&url, "GET", "/write", None, "").0, 405);
    // GET /healthz is answered before routing; another method on it is an unknown route.
    assert_eq!(call(&url, "POST", "/healthz", None, "{}").0, 404);
    // 401: none, wrong, wrong scheme.
    assert_eq!(
        call(&url, "POST", "/list", None, "{}"),
        (401, r#"{"error":"unauthorized"}"#.into())
    );
    assert_eq!(call(&url, "POST", "/list", Some("rw-secreX"), "{}").0, 401);
    let (status, _) = raw(s.addr, &format!("POST /list HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {TOKEN}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"));
    assert_eq!(status, 401);
    // 403: a read-only token on a mutating route, before the body is looked at.
    for route in ["/write", "/forget", "/sweep", "/reflect", "/import"] {
        assert_eq!(
            call(&url, "POST", route, Some(READ), "not json"),
            (403, r#"{"error":"forbidden"}"#.into()),
            "{route}"
        );
    }
    assert_eq!(
        call(
            &url,
            "POST",
            "/list",
            Some(READ),
            r#"{"scopeKey":"org:a","limit":5}"#
        )
        .0,
        200
    );
    // 411 and 413 before parsing.
    let (status, body) = raw(s.addr, &format!("POST /write HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\n{{}}\r\n0\r\n\r\n"));
    assert_eq!((status, body.contains("Content-Length")), (411, true));
    let (status, _) = raw(s.addr, &format!("POST /write HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 600000\r\nConnection: close\r\n\r\n{{}}"));
    assert_eq!(status, 413);
    assert!(
        body.ends_with(r#"{"error":"body must declare a numeric Content-Length"}"#),
        "{body}"
    );
    let (_, body) = raw(s.addr, &format!("POST /write HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 600000\r\nConnection: close\r\n\r\n{{}}"));
    assert!(
        body.ends_with(r#"{"error":"body must be at most 524288 bytes"}"#),
        "{body}"
    );
    // Deep nesting is accepted, one leading byte-order mark dropped and a second refused, as
    // the Worker's `request.json()` does in workerd 1.20260730 (measured).
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let body = format!("{{\"scopeKey\":\"org:a\",\"limit\":5,\"x\":{deep}}}");
    assert_eq!(
        call(&url, "POST", "/list", Some(TOKEN), &body),
        (200, r#"{"records":[]}"#.into())
    );
    let bom = "\u{feff}{\"scopeKey\":\"org:a\",\"limit\":5}";
    assert_eq!(
        call(&url, "POST", "/list", Some(TOKEN), bom),
        (200, r#"{"records":[]}"#.into())
    );
    let two = "\u{feff}\u{feff}{\"scopeKey\":\"org:a\",\"limit\":5}";
    assert_eq!(
        call(&url, "POST", "/list", Some(TOKEN), two),
        (400, r#"{"error":"body must be valid JSON"}"#.into())
    );
    // 400: bad JSON, then a reason naming the field.
    assert_eq!(
        call(&url, "POST", "/write", Some(TOKEN), "{nope"),
        (400, r#"{"error":"body must be valid JSON"}"#.into())
    );
    assert_eq!(
        call(
            &url,
            "POST",
            "/retrieve",
            Some(TOKEN),
            r#"{"scopeKey":"org:a","query":"x","limit":51}"#
        ),
        (
            400,
            r#"{"error":"limit must be an integer between 1 and 50"}"#.into()
        )
    );
    assert_eq!(
        call(
            &url,
            "POST",
            "/write",
            Some(TOKEN),
            r#"{"scopeKey":"org:a","records":[{"kind":"fact","text":"","sourceThreadKey":"t"}]}"#
        )
        .1,
        r#"{"error":"records[0].text must be a non-empty string"}"#
    );
    // /healthz needs no token.
    let (status, body) = call(&url, "GET", "/healthz", None, "");
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["ok"], true);
    assert_eq!(v["features"], json!(["memory"]));
    assert!(v["build"]["commit"].is_string());
}

#[test]
fn no_token_configured_refuses_everything() {
    let s = server_with(Auth {
        token: None,
        read_token: None,
        open: false,
    });
    assert_eq!(
        call(
            &s.url(),
            "POST",
            "/list",
            None,
            r#"{"scopeKey":"org:a","limit":5}"#
        )
        .0,
        401
    );
    assert_eq!(
        call(
            &s.url(),
            "POST",
            "/list",
            Some(""),
            r#"{"scopeKey":"org:a","limit":5}"#
        )
        .0,
        401
    );
    assert_eq!(call(&s.url(), "GET", "/healthz", None, "").0, 200);
}

#[test]
fn every_route_answers_the_workers_json() {
    let s = server();
    let url = s.url();
    let w = post(
        &url,
        "/write",
        json!({"scopeKey": "repo:acme/app", "records": [
        {"kind": "fact", "text": "run npm ci before the license check", "sourceThreadKey": "slack:C1:1"},
        {"kind": "fact", "text": "PR 12 was merged", "sourceThreadKey": "slack:C1:1"},
        {"kind": "summary", "text": "a run fixed the license check", "sourceThreadKey": "slack:C1:1"}
    ], "cap": 500}),
    );
    assert_eq!(
        w,
        json!({"ok": true, "inserted": 3, "deduped": 0, "restated": 0, "superseded": 0, "evicted": 0})
    );
    let keys: Vec<&String> = w.as_object().expect("object").keys().collect();
    assert_eq!(
        keys,
        [
            "ok",
            "inserted",
            "deduped",
            "restated",
            "superseded",
            "evicted"
        ],
        "the Worker's field order"
    );
    let l = post(
        &url,
        "/list",
        json!({"scopeKey": "repo:acme/app", "limit": 10, "kind": "fact"}),
    );
    assert_eq!(l["records"].as_array().map(Vec::len), Some(2));
    assert_eq!(l["records"][0]["id"], "mem:repo:acme/app:1");
    let q = post(
        &url,
        "/list",
        json!({"scopeKey": "repo:acme/app", "limit": 10, "query": "LICENSE"}),
    );
    assert_eq!(q["records"].as_array().map(Vec::len), Some(2));
    let r = post(
        &url,
        "/retrieve",
        json!({"scopeKey": "repo:acme/app", "query": "license npm", "limit": 8}),
    );
    assert_eq!(r["records"][0]["useCount"], 1);
    let dry = post(
        &url,
        "/sweep",
        json!({"scopeKey": "repo:acme/app", "dryRun": true}),
    );
    assert_eq!(
        dry,
        json!({"ok": true, "swept": 1, "ids": ["mem:repo:acme/app:1"]})
    );
    let real = post(&url, "/sweep", json!({"scopeKey": "repo:acme/app"}));
    assert_eq!(real, json!({"ok": true, "swept": 1}));
    assert_eq!(
        post(
            &url,
            "/forget",
            json!({"scopeKey": "repo:acme/app", "id": "mem:repo:acme/app:0"})
        ),
        json!({"ok": true, "forgotten": true})
    );
    assert_eq!(
        post(
            &url,
            "/forget",
            json!({"scopeKey": "repo:acme/app", "id": "mem:repo:acme/app:0"})
        ),
        json!({"ok": true, "forgotten": false})
    );
    let g = post(&url, "/get", json!({"id": "mem:repo:acme/app:0"}));
    assert_eq!(g["record"]["status"], "forgotten");
    assert_eq!(
        post(&url, "/scopes", json!({})),
        json!({"scopes": ["repo:acme/app"]})
    );
    let e = post(&url, "/export", json!({}));
    assert_eq!(e["records"].as_array().map(Vec::len), Some(3));
    assert_eq!(
        post(&url, "/import", json!({"records": e["records"]})),
        json!({"ok": true, "imported": 0, "skipped": 3, "decisions": 0}),
        "the same answer as `lessons import --json`: every count, zero included"
    );
    assert_eq!(
        post(&url, "/count", json!({"scopeKey": "repo:acme/app"})),
        json!({"active": 1})
    );
    let st = post(&url, "/stats", json!({}));
    assert_eq!(st["days"][0]["counters"]["swept"], 1);
    let c = post(
        &url,
        "/context",
        json!({"org": "acme", "repo": "acme/app", "brief": "add a drift check"}),
    );
    assert_eq!(c["kept"], 0, "everything in the window was retired");
    assert!(c.get("block").is_none());
    post(
        &url,
        "/write",
        json!({"scopeKey": "repo:acme/app", "records": [{"kind": "fact", "text": "the drift check reads the lockfile", "sourceThreadKey": "t"}]}),
    );
    let c = post(
        &url,
        "/context",
        json!({"org": "acme", "repo": "acme/app", "brief": "anything"}),
    );
    assert!(c["block"]
        .as_str()
        .is_some_and(|b| b.contains("- the drift check reads the lockfile (source: t)")));
    let p = post(
        &url,
        "/prompt",
        json!({"org": "acme", "repo": "acme/app", "request": "drift", "answer": "done"}),
    );
    assert_eq!(
        p["shown"],
        json!([{"handle": "1", "id": "mem:repo:acme/app:3"}])
    );
    let reply = r#"{"facts":[{"text":"sha 3f9a2c1 is live"},{"text":"the lockfile must be committed","restates":"[1]"}]}"#;
    let o = post(
        &url,
        "/reflect",
        json!({"org": "acme", "repo": "acme/app", "reply": reply, "shown": p["shown"], "thread": "slack:C1:2"}),
    );
    assert_eq!(
        o,
        json!({"offered": 2, "rejected": 1, "rejectedBy": {"sha": 1}, "restated": 1, "inserted": 0, "deduped": 0, "summary": 0})
    );
    let (status, metrics) = call(&url, "GET", "/metrics", Some(READ), "");
    assert_eq!(status, 200);
    assert!(
        metrics.contains("lessons_requests_total{route=\"/write\",status=\"200\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("lessons_request_seconds_count{route=\"/list\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("lessons_memory_total{scope=\"repo:acme/app\",event=\"restated\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("lessons_memory_rejected_total{scope=\"repo:acme/app\",marker=\"sha\"} 1"),
        "{metrics}"
    );
    // A store that does not account for its memory (this one is in memory) shows none, and
    // neither does a heap whose allocator is not jemalloc (this test binary's).
    assert!(!metrics.contains("lessons_held_bytes"), "{metrics}");
    assert!(
        !metrics.contains("lessons_compactions_running"),
        "{metrics}"
    );
    assert!(!metrics.contains("lessons_allocated_bytes"), "{metrics}");
    assert_eq!(call(&url, "GET", "/metrics", None, "").0, 401);
}

/// `/review` and `/context` read the store's days by the store's clock, not the host's: a store
/// opened on another clock (an import's, a test's, a bench's) is reviewed on the days it wrote.
#[test]
fn the_review_route_dates_its_days_by_the_stores_clock() {
    // 2025-01-15, long before the host's today.
    let then = 1_736_899_200_000_i64;
    let model = InMemoryStore::with_clock(Arc::new(move || then));
    let s = lessons::ScopeKey::parse("repo:acme/app").expect("scope");
    for text in [
        "run the migrations before the tests",
        "the linter needs the lockfile",
    ] {
        let c = lessons::Candidate::fact(text, "t");
        model
            .write(&s, &[c], &lessons::WriteOptions::default())
            .expect("write");
    }
    let store: Arc<dyn MemoryStore> = Arc::new(model);
    let local = lessons::review::review(
        store.as_ref(),
        7,
        None,
        then,
        &lessons::review::Thresholds::default(),
    )
    .expect("review");
    assert_eq!(local.scopes.len(), 1);
    assert_eq!(local.scopes[0].counters.inserted, 2);
    let server = serve(store, auth(TOKEN, None));
    let (status, body) = call(
        &server.url(),
        "POST",
        "/review",
        Some(TOKEN),
        r#"{"days":7}"#,
    );
    assert_eq!(status, 200, "{body}");
    let answered: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(answered, serde_json::to_value(&local).expect("json"));
}

#[test]
fn the_rollup_line_has_counts_only() {
    let store = InMemoryStore::new();
    let scope = lessons::ScopeKey::parse("repo:acme/app").expect("valid");
    store
        .write(
            &scope,
            &[lessons::Candidate::fact("secret lesson text", "t")],
            &lessons::WriteOptions::default(),
        )
        .expect("write");
    let today = lessons::internals::day_of(lessons::system_clock()());
    let lines = lessons::internals::rollup_lines(&store, today).expect("rollup");
    assert_eq!(lines.len(), 1);
    assert!(lines[0].starts_with("[memory] day "));
    assert!(
        lines[0].contains(" repo:acme/app: offered 0, rejected 0, restated 0, inserted 1,"),
        "{}",
        lines[0]
    );
    assert!(!lines[0].contains("secret"));
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-2.0e3..2.0e3f64).prop_map(|f| json!(f)),
        "[a-z:/ ]{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("org:acme"),
            Just("repo:acme/app"),
            Just("fact"),
            Just("summary"),
            Just("[1]"),
            Just("")
        ]
        .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("scopeKey"),
                    Just("query"),
                    Just("limit"),
                    Just("records"),
                    Just("kind"),
                    Just("text"),
                    Just("sourceThreadKey"),
                    Just("id"),
                    Just("dryRun"),
                    Just("cap"),
                    Just("org"),
                    Just("repo"),
                    Just("brief"),
                    Just("reply"),
                    Just("shown"),
                    Just("since"),
                    Just("restates"),
                    Just("keywords"),
                    Just("tally"),
                    Just("x")
                ]
                .prop_map(str::to_owned),
                inner,
                0..6,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bodies_never_cause_a_500(body in json_value(), route in 0..lessons::internals::contract::PostRoute::ALL.len()) {
        // One server for the whole property: started lazily, shared across cases.
        static SERVER: std::sync::OnceLock<Background> = std::sync::OnceLock::new();
        let s = SERVER.get_or_init(server);
        let path = lessons::internals::contract::PostRoute::ALL[route].path();
        let (status, text) = call(&s.url(), "POST", path, Some(TOKEN), &body.to_string());
        prop_assert!(status == 200 || status == 400, "{} {}: {} {}", path, body, status, text);
        let v: Value = serde_json::from_str(&text).expect("every answer is JSON");
        if status == 400 {
            prop_assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()));
        }
    }
}
