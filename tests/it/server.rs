//! The HTTP server: every route, every error code and their order, arbitrary bodies, a real
//! `lessons serve` process, and durability when that process is killed under load.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use lessons::server::{Auth, Background};
use lessons::{InMemoryStore, MemoryStore};
use proptest::prelude::*;
use serde_json::{json, Value};

use crate::fixtures::server::{auth, call, free_port, post, raw, serve, Serve, READ, TOKEN};

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
    let today = lessons::internals::day_of(lessons::store::system_clock()());
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

#[test]
fn a_real_serve_process_round_trips_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().expect("dir");
    let mut s = Serve::start(dir.path());
    let w = post(
        &s.url,
        "/write",
        json!({"scopeKey": "org:acme", "records": [
            {"kind": "fact", "text": "pin the registry mirror", "sourceThreadKey": "t"},
            {"kind": "fact", "text": "LGTM from the owner", "sourceThreadKey": "t"}
        ]}),
    );
    assert_eq!(w["inserted"], 2);
    assert_eq!(
        post(&s.url, "/list", json!({"scopeKey": "org:acme", "limit": 5}))["records"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    assert_eq!(
        post(
            &s.url,
            "/retrieve",
            json!({"scopeKey": "org:acme", "query": "registry mirror", "limit": 3})
        )["records"][0]["text"],
        "pin the registry mirror"
    );
    assert_eq!(
        post(
            &s.url,
            "/forget",
            json!({"scopeKey": "org:acme", "id": "mem:org:acme:0"})
        )["forgotten"],
        true
    );
    assert_eq!(
        post(&s.url, "/sweep", json!({"scopeKey": "org:acme"}))["swept"],
        1
    );
    // What the process holds: its resident memory, jemalloc's heap (the binary's allocator),
    // and the store's parts beside their bounds.
    let (status, metrics) = call(&s.url, "GET", "/metrics", Some(TOKEN), "");
    assert_eq!(status, 200);
    let gauge = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
    };
    let resident = gauge("lessons_resident_bytes");
    let allocated = gauge("lessons_allocated_bytes");
    assert!(allocated > 0 && allocated < resident, "{metrics}");
    // jemalloc's pages in use hold the live heap, and are resident; it keeps books.
    let active = gauge("lessons_allocator_active_bytes");
    assert!(allocated <= active, "{metrics}");
    assert!(
        active <= gauge("lessons_allocator_resident_bytes"),
        "{metrics}"
    );
    assert!(gauge("lessons_allocator_metadata_bytes") > 0, "{metrics}");
    assert!(
        gauge("lessons_held_bytes{part=\"memtables\"}") > 0,
        "the writes are in memtables"
    );
    assert!(
        gauge("lessons_held_bytes{part=\"scope_map\"}") > 0,
        "org:acme is held"
    );
    assert_eq!(
        gauge("lessons_held_budget_bytes{part=\"block_cache\"}"),
        lessons::store::DEFAULT_CACHE_BYTES
    );
    assert_eq!(
        gauge("lessons_held_budget_bytes{part=\"scope_map\"}"),
        192 << 20
    );
    assert!(
        gauge("lessons_held_bytes{part=\"block_cache\"}") <= lessons::store::DEFAULT_CACHE_BYTES
    );
    // The engine's background work: a handful of writes seals no memtable and compacts nothing.
    assert_eq!(gauge("lessons_flushes_waiting"), 0, "{metrics}");
    assert_eq!(gauge("lessons_compactions_running"), 0, "{metrics}");
    assert_eq!(gauge("lessons_compactions_total"), 0, "{metrics}");
    assert!(
        metrics.contains("# TYPE lessons_compaction_seconds_total counter"),
        "{metrics}"
    );
    // The disk: each write above was acknowledged after a journal fsync, timed.
    assert!(gauge("lessons_journal_fsyncs_total") >= 1, "{metrics}");
    let fsync_seconds: f64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("lessons_journal_fsync_seconds_total ")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no fsync seconds in {metrics}"));
    assert!(
        fsync_seconds.is_finite() && fsync_seconds >= 0.0,
        "{metrics}"
    );
    // SIGTERM: the process finishes and flushes.
    let status = s.terminate();
    assert_eq!(status.code(), Some(0), "a clean shutdown exits 0");
    let store = lessons::EmbeddedStore::open(dir.path()).expect("the store reopens");
    assert_eq!(
        store
            .get("mem:org:acme:1")
            .expect("get")
            .expect("kept")
            .status,
        lessons::Status::Swept
    );
    assert!(store.check().expect("check").is_ok());
}

#[test]
fn every_acknowledged_write_survives_sigkill_under_load() {
    let dir = tempfile::tempdir().expect("dir");
    let mut s = Serve::start(dir.path());
    let acked = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..8)
        .map(|t| {
            let (url, acked, stop) = (s.url.clone(), Arc::clone(&acked), Arc::clone(&stop));
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(5)))
                    .build()
                    .into();
                for i in 0..10_000 {
                    if stop.load(std::sync::atomic::Ordering::SeqCst) {
                        break;
                    }
                    let text = format!("writer {t} lesson {i} uniq{t}x{i}");
                    let body = json!({"scopeKey": format!("repo:acme/w{t}"), "records": [{"kind": "fact", "text": text, "sourceThreadKey": "load"}], "cap": 10000});
                    let ok = agent
                        .post(&format!("{url}/write"))
                        .header("authorization", &format!("Bearer {TOKEN}"))
                        .send(body.to_string().as_bytes())
                        .is_ok_and(|r| r.status().as_u16() == 200);
                    if ok {
                        acked.lock().push(text);
                    } else {
                        break;
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    s.child.kill().expect("SIGKILL");
    let _ = s.child.wait();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for w in writers {
        w.join().expect("writer");
    }
    let acked = acked.lock().clone();
    assert!(
        acked.len() > 50,
        "the load ran: {} writes acknowledged",
        acked.len()
    );
    let s2 = Serve::start(dir.path());
    let client =
        lessons::remote::RemoteStore::new(&s2.url, Some(TOKEN.into()), Duration::from_secs(10))
            .expect("client");
    let mut present = std::collections::HashSet::new();
    client
        .export(&mut |r| {
            present.insert(r.text);
            Ok(())
        })
        .expect("export");
    let lost: Vec<&String> = acked.iter().filter(|t| !present.contains(*t)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged writes lost, e.g. {:?}",
        lost.len(),
        acked.len(),
        lost.first()
    );
    for text in acked.iter().step_by(acked.len() / 20 + 1) {
        let uniq = text.split(' ').next_back().expect("a token");
        let t: usize = uniq
            .trim_start_matches("uniq")
            .split('x')
            .next()
            .and_then(|n| n.parse().ok())
            .expect("writer");
        let scope = lessons::ScopeKey::parse(&format!("repo:acme/w{t}")).expect("valid");
        let hits = client.retrieve(&scope, uniq, 1).expect("retrieve");
        assert_eq!(hits.len(), 1, "the index lost {text}");
    }
    drop(s2);
}

#[test]
fn the_cli_talks_to_a_server_with_dash_dash_server() {
    let dir = tempfile::tempdir().expect("dir");
    let mut s = Serve::start(dir.path());
    let cli = |args: &[&str], stdin: &str| {
        let mut command = crate::util::lessons();
        command
            .args(["--server", &s.url])
            .args(args)
            .env("MEMORY_TOKEN", TOKEN);
        crate::util::run_with(command, stdin.as_bytes())
    };
    let w = cli(
        &["write", "--scope", "repo", "--repo", "acme/app", "--json"],
        r#"[{"kind":"fact","text":"npm ci before vitest","sourceThreadKey":"t"}]"#,
    );
    assert_eq!(
        String::from_utf8_lossy(&w.stdout).trim(),
        r#"{"ok":true,"inserted":1,"deduped":0,"restated":0,"superseded":0,"evicted":0}"#,
        "{}",
        String::from_utf8_lossy(&w.stderr)
    );
    let l = cli(&["list", "--scope", "repo:acme/app"], "");
    assert!(String::from_utf8_lossy(&l.stdout).starts_with("mem:repo:acme/app:0  fact  "));
    let c = cli(
        &[
            "context", "--org", "acme", "--repo", "acme/app", "--brief", "x",
        ],
        "",
    );
    assert!(String::from_utf8_lossy(&c.stdout).contains("- npm ci before vitest (source: t)"));
    let bad = cli(&["list", "--scope", "repo:acme/app", "--limit", "99"], "");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr)
        .contains("answered 400: limit must be an integer between 1 and 50"));
    // A cap of 1 evicts the first lesson, never used: the journal's filter crosses the wire.
    let capped = cli(
        &["write", "--scope", "repo:acme/app", "--cap", "1"],
        r#"[{"kind":"fact","text":"the docs build needs mdbook","sourceThreadKey":"t"}]"#,
    );
    assert_eq!(capped.status.code(), Some(0));
    let unused = cli(
        &[
            "journal",
            "--scope",
            "repo:acme/app",
            "--never-used",
            "--json",
        ],
        "",
    );
    let answer: serde_json::Value =
        serde_json::from_slice(&unused.stdout).expect("the journal answers JSON");
    let decisions = answer["decisions"].as_array().expect("decisions");
    assert_eq!(decisions.len(), 1, "{answer}");
    assert_eq!(decisions[0]["event"], "evicted");
    assert_eq!(decisions[0]["useCount"], 0);
    assert_eq!(decisions[0]["texts"][0], "npm ci before vitest");
    let doc = cli(&["doctor"], "");
    assert_eq!(doc.status.code(), Some(2));
    let _ = s.child.kill();
    let _ = s.child.wait();
}

#[test]
fn a_remote_read_failure_degrades_and_an_older_server_is_reported_as_unsupported() {
    use lessons::remote::RemoteStore;
    let dead = format!("http://127.0.0.1:{}", free_port());
    let r = RemoteStore::new(&dead, Some(TOKEN.into()), Duration::from_secs(2)).expect("client");
    let scope = lessons::ScopeKey::parse("org:acme").expect("valid");
    assert!(r
        .retrieve(&scope, "anything", 8)
        .expect("a read degrades")
        .is_empty());
    let e = r
        .list(&scope, &lessons::ListQuery::newest(5))
        .expect_err("list is an error");
    assert!(e.to_string().contains("POST /list"), "{e}");
    // An older Worker: every route it lacks answers 404.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten().take(1) {
            let mut stream = stream;
            // Read the whole request first: closing a socket with unread bytes sends a reset,
            // which the client may see instead of the answer (it did, under a loaded machine).
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got);
                if let Some(end) = text.find("\r\n\r\n") {
                    let length = text[..end]
                        .lines()
                        .find_map(|l| {
                            let (name, value) = l.split_once(':')?;
                            name.eq_ignore_ascii_case("content-length")
                                .then(|| value.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    if got.len() >= end + 4 + length {
                        break;
                    }
                }
            }
            let body = r#"{"error":"not found"}"#;
            let _ = write!(stream, "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        }
    });
    let old = RemoteStore::new(
        &format!("http://{addr}"),
        Some(TOKEN.into()),
        Duration::from_secs(5),
    )
    .expect("client");
    let e = old.sweep(&scope, true).expect_err("no /sweep");
    assert!(
        e.to_string().contains("not supported by this server"),
        "{e}"
    );
    assert!(RemoteStore::new("ftp://x", None, Duration::from_secs(1)).is_err());
}

#[test]
fn serve_refuses_to_start_without_a_token_unless_told_to_on_loopback() {
    let dir = tempfile::tempdir().expect("dir");
    let serve = |extra: &[&str]| Serve::command(dir.path()).no_token().args(extra).refused();
    let no_token = serve(&["--addr", "127.0.0.1:0"]);
    assert_eq!(no_token.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&no_token.stderr).contains("MEMORY_TOKEN"));
    let exposed = serve(&["--insecure-no-auth", "--addr", "0.0.0.0:0"]);
    assert_eq!(exposed.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&exposed.stderr).contains("loopback"));
}
