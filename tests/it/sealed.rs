//! The newest bot seals every candidate with a content hash and drops, on every read, a record
//! whose hash no longer matches. A record sealed the bot's way must read back valid after every
//! operation: insert, dedup, restate, supersede, retrieve, export/import and reopen, on the
//! embedded store and through the server.

use std::sync::Arc;
use std::time::Duration;

use lessons::model::content_hash;
use lessons::remote::RemoteStore;
use lessons::store::{EmbeddedStore, ListQuery, MemoryStore, WriteOptions};
use lessons::{Candidate, Record, ScopeKey};
use serde_json::json;

use crate::fixtures::server::{auth, serve, TOKEN};

/// What the bot does before it writes (`sealMemoryCandidate`): keywords default to the text's
/// tokens, then the provenance names the scope and the hash of the content.
fn seal(scope: &ScopeKey, mut c: Candidate) -> Candidate {
    if c.keywords.is_none() {
        c.keywords = Some(lessons::internals::text::tokenize(&c.text));
    }
    let kind = c.kind.expect("a kind");
    let hash = content_hash(
        scope,
        kind,
        &c.text,
        c.keywords.as_deref().unwrap_or_default(),
        &c.source_thread_key,
        c.source_run_id.as_deref(),
    );
    c.provenance = Some(json!({
        "version": 1,
        "scopeKey": scope.as_str(),
        "contentHash": hash,
        "dependencies": {"version": 1, "status": "unknown", "revision": 0,
                         "origins": [], "slack": [], "mcp": [], "reason": "legacy"}
    }));
    c
}

/// The bot's read-side check (`validMemoryProvenance`): a well-formed provenance naming the
/// record's scope, whose content hash is the record's.
fn valid(r: &Record) -> bool {
    let Some(p) = &r.provenance else {
        return false;
    };
    lessons::internals::provenance::is_memory_provenance(p)
        && p["scopeKey"] == r.scope_key.as_str()
        && p["contentHash"].as_str() == Some(r.content_hash().as_str())
}

/// The bot client's structural check on every record it reads (`isMemoryRecord`).
fn is_memory_record(v: &serde_json::Value) -> bool {
    v["id"].is_string()
        && v["scopeKey"].is_string()
        && matches!(v["kind"].as_str(), Some("fact" | "summary"))
        && v["text"].is_string()
        && v["keywords"].is_array()
        && v["sourceThreadKey"].is_string()
        && v["createdAt"].is_number()
        && v["useCount"].is_number()
        && matches!(
            v["status"].as_str(),
            Some("active" | "superseded" | "forgotten" | "evicted" | "swept")
        )
}

/// Known dependencies naming one origin run.
fn known(run: &str) -> serde_json::Value {
    json!({"version": 1, "status": "known", "revision": 0,
           "origins": [{"runId": run, "requester": "U1", "channelId": "C1", "threadKey": "slack:C1:1"}],
           "slack": [], "mcp": []})
}

fn sealed_candidates(scope: &ScopeKey) -> Vec<Candidate> {
    let mut with_run = Candidate::fact(
        "Run NPM ci before the license check, run it twice",
        "slack:C1:1",
    );
    with_run.source_run_id = Some(String::new());
    let mut with_keywords = Candidate::fact("pnpm install must run before vitest", "slack:C1:2");
    with_keywords.keywords = Some(vec!["PNPM".into(), "vitest".into(), "PNPM".into()]);
    let mut no_keywords = Candidate::fact(
        "the e2e suite needs PLAYWRIGHT_BROWSERS_PATH=0",
        "slack:C1:3",
    );
    no_keywords.keywords = Some(Vec::new());
    [with_run, with_keywords, no_keywords]
        .into_iter()
        .map(|c| seal(scope, c))
        .collect()
}

fn all(store: &dyn MemoryStore, scope: &ScopeKey) -> Vec<Record> {
    let mut out = crate::util::exported(store);
    out.retain(|r| &r.scope_key == scope);
    out
}

fn exercise(store: &dyn MemoryStore, scope: &ScopeKey) {
    let sealed = sealed_candidates(scope);
    store
        .write(scope, &sealed, &WriteOptions::default())
        .expect("insert");
    let records = store.list(scope, &ListQuery::newest(10)).expect("list");
    assert_eq!(records.len(), 3);
    for r in &records {
        assert!(valid(r), "after insert: {r:?}");
    }
    // Dedup: the same text again (sealed on its own) strengthens the first record.
    let again = seal(
        scope,
        Candidate::fact(
            "run npm ci before the license check, run it twice",
            "slack:C1:9",
        ),
    );
    assert_eq!(
        store
            .write(scope, &[again], &WriteOptions::default())
            .expect("dedup")
            .deduped,
        1
    );
    // Restate: new words pointing at a shown record.
    let target = records
        .iter()
        .find(|r| r.text.starts_with("pnpm"))
        .expect("target")
        .id
        .clone();
    let restate = seal(
        scope,
        Candidate::fact("vitest needs pnpm install first", "slack:C1:10").restating(&target),
    );
    assert_eq!(
        store
            .write(scope, &[restate], &WriteOptions::default())
            .expect("restate")
            .restated,
        1
    );
    // Supersede: a replacement retires the old record, which keeps its seal.
    let old = records
        .iter()
        .find(|r| r.text.starts_with("the e2e"))
        .expect("old")
        .id
        .clone();
    let replacement = seal(
        scope,
        Candidate::fact(
            "the e2e suite reads PLAYWRIGHT_BROWSERS_PATH from .env now",
            "slack:C1:11",
        )
        .superseding(&old),
    );
    assert_eq!(
        store
            .write(scope, &[replacement], &WriteOptions::default())
            .expect("supersede")
            .superseded,
        1
    );
    // Retrieve bumps use counts, never content.
    let hits = store
        .retrieve(scope, "pnpm vitest license check", 8)
        .expect("retrieve");
    assert!(!hits.is_empty());
    for r in &hits {
        assert!(valid(r), "after retrieve: {r:?}");
    }
    for r in all(store, scope) {
        assert!(valid(&r), "after every operation ({:?}): {r:?}", r.status);
    }
    let replaced = all(store, scope)
        .into_iter()
        .find(|r| r.text.contains(".env now"))
        .expect("the replacement");
    assert_eq!(
        replaced.supersedes.as_deref(),
        Some(old.as_str()),
        "the pointer is kept"
    );
}

#[test]
fn a_bot_sealed_record_stays_valid_in_the_embedded_store_across_export_import_and_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let scope = ScopeKey::parse("repo:acme/app").expect("scope");
    {
        let store = EmbeddedStore::open(dir.path().join("a")).expect("open");
        exercise(&store, &scope);
        store.close().expect("close");
    }
    let store = EmbeddedStore::open(dir.path().join("a")).expect("reopen");
    let records = all(&store, &scope);
    assert_eq!(records.len(), 4, "three inserted, one replacement");
    for r in &records {
        assert!(valid(r), "after reopen: {r:?}");
    }
    // A record's wire form round-trips: the keywords as sent, "" kept.
    let first = records
        .iter()
        .find(|r| r.text.starts_with("Run NPM"))
        .expect("first");
    assert_eq!(first.source_run_id.as_deref(), Some(""));
    let wire = serde_json::to_value(first).expect("json");
    assert_eq!(
        wire["keywords"],
        json!(["run", "npm", "ci", "before", "the", "license", "check", "run", "it", "twice"])
    );
    let copy = EmbeddedStore::open(dir.path().join("b")).expect("open b");
    let back: Vec<Record> = records
        .iter()
        .map(|r| serde_json::from_value(serde_json::to_value(r).expect("json")).expect("parse"))
        .collect();
    copy.import(&back).expect("import");
    for r in all(&copy, &scope) {
        assert!(valid(&r), "after export/import: {r:?}");
    }
}

#[test]
fn a_bot_sealed_record_stays_valid_through_the_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(EmbeddedStore::open(dir.path()).expect("open"));
    let server = serve(store, auth(TOKEN, None));
    let remote = RemoteStore::new(
        &server.url(),
        Some(TOKEN.to_owned()),
        Duration::from_secs(30),
    )
    .expect("client");
    let scope = ScopeKey::parse("repo:acme/web").expect("scope");
    exercise(&remote, &scope);
}

#[test]
fn provenance_is_refused_dropped_merged_and_emitted_as_the_reference_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(EmbeddedStore::open(dir.path()).expect("open"));
    let server = serve(store, auth(TOKEN, None));
    let url = server.url();
    let scope = ScopeKey::parse("repo:acme/web").expect("scope");
    let post = |path: &str, body: serde_json::Value| {
        let (status, text) =
            crate::fixtures::server::call(&url, "POST", path, Some(TOKEN), &body.to_string());
        (
            status,
            serde_json::from_str::<serde_json::Value>(&text).expect("json"),
        )
    };
    let with_deps = |text: &str, deps: serde_json::Value| {
        let mut c = seal(&scope, Candidate::fact(text, "slack:C1:1"));
        if let Some(p) = c.provenance.as_mut() {
            p["dependencies"] = deps;
        }
        serde_json::to_value(&c).expect("json")
    };
    // Malformed: refused, nothing written.
    let mut bad = with_deps("pnpm install must run before vitest", known("r1"));
    bad["provenance"] = json!({"version": 2});
    let (status, body) = post(
        "/write",
        json!({"scopeKey": scope.as_str(), "records": [bad]}),
    );
    assert_eq!(
        (status, body["error"].clone()),
        (
            400,
            json!("records[0].provenance must be a bounded memory revision")
        )
    );
    // Another scope's: the record lands without it.
    let mut foreign = with_deps("the cache key includes the lockfile hash", known("r1"));
    foreign["provenance"]["scopeKey"] = json!("repo:acme/other");
    assert_eq!(
        post(
            "/write",
            json!({"scopeKey": scope.as_str(), "records": [foreign]})
        )
        .0,
        200
    );
    // A dedup unions the dependencies into the record it lands on; the seal stays valid.
    let first = with_deps("pnpm install must run before vitest", known("r1"));
    let again = with_deps("PNPM install must run before vitest", known("r2"));
    assert_eq!(
        post(
            "/write",
            json!({"scopeKey": scope.as_str(), "records": [first]})
        )
        .1["inserted"],
        1
    );
    assert_eq!(
        post(
            "/write",
            json!({"scopeKey": scope.as_str(), "records": [again]})
        )
        .1["deduped"],
        1
    );
    let (_, listed) = post("/list", json!({"scopeKey": scope.as_str(), "limit": 10}));
    let records = listed["records"].as_array().expect("records").clone();
    assert_eq!(records.len(), 2);
    for r in &records {
        assert!(is_memory_record(r), "{r}");
    }
    let foreign = records
        .iter()
        .find(|r| r["text"].as_str().is_some_and(|t| t.contains("cache key")))
        .expect("landed");
    assert!(
        foreign.get("provenance").is_none(),
        "another scope's provenance is not emitted"
    );
    let merged = records
        .iter()
        .find(|r| r["text"].as_str().is_some_and(|t| t.starts_with("pnpm")))
        .expect("merged");
    let deps = &merged["provenance"]["dependencies"];
    assert_eq!(
        (deps["status"].clone(), deps["revision"].clone()),
        (json!("known"), json!(1))
    );
    let runs: Vec<&str> = deps["origins"]
        .as_array()
        .expect("origins")
        .iter()
        .filter_map(|o| o["runId"].as_str())
        .collect();
    assert_eq!(runs, ["r1", "r2"]);
    let record: Record = serde_json::from_value(merged.clone()).expect("record");
    assert!(
        valid(&record),
        "the seal covers content, not dependencies: {merged}"
    );
    // A candidate without provenance taints the union: unknown, never an empty list.
    let plain = json!({"kind": "fact", "text": "pnpm install must run before vitest", "sourceThreadKey": "t"});
    assert_eq!(
        post(
            "/write",
            json!({"scopeKey": scope.as_str(), "records": [plain]})
        )
        .1["deduped"],
        1
    );
    let (_, hits) = post(
        "/retrieve",
        json!({"scopeKey": scope.as_str(), "query": "pnpm vitest", "limit": 8}),
    );
    let hit = &hits["records"][0];
    assert!(is_memory_record(hit));
    assert_eq!(hit["provenance"]["dependencies"]["status"], "unknown");
    assert_eq!(hit["provenance"]["dependencies"]["reason"], "legacy");
}

/// A version-2 envelope: the newest bot records the GitHub reads it admitted through the
/// execution owner.
fn with_reads(run: &str, calls: &[&str]) -> serde_json::Value {
    let reads: Vec<serde_json::Value> = calls
        .iter()
        .map(|c| json!({"runId": run, "callId": c, "resultHash": "a".repeat(64), "admissionHash": "b".repeat(64)}))
        .collect();
    json!({"version": 2, "status": "known", "revision": 0,
           "origins": [{"runId": run, "requester": "U1", "channelId": "C1", "threadKey": "slack:C1:1"}],
           "slack": [], "mcp": [], "executionGithub": reads})
}

fn sealed_with(scope: &ScopeKey, c: Candidate, dependencies: serde_json::Value) -> Candidate {
    let mut c = seal(scope, c);
    if let Some(p) = c.provenance.as_mut() {
        p["dependencies"] = dependencies;
    }
    c
}

#[test]
fn version_two_envelopes_round_trip_and_union_into_version_two() {
    let dir = tempfile::tempdir().expect("tempdir");
    let scope = ScopeKey::parse("repo:acme/app").expect("scope");
    let store = EmbeddedStore::open(dir.path()).expect("open");
    let text = "the registry mirror needs a token before npm ci";
    // A version-2 record round-trips exactly, GitHub reads included.
    let first = sealed_with(
        &scope,
        Candidate::fact(text, "slack:C1:1"),
        with_reads("run1", &["call2", "call1"]),
    );
    store
        .write(
            &scope,
            std::slice::from_ref(&first),
            &WriteOptions::default(),
        )
        .expect("insert");
    let r = &store.list(&scope, &ListQuery::newest(1)).expect("list")[0];
    assert!(valid(r), "{r:?}");
    assert_eq!(r.provenance, first.provenance, "stored as sent");

    // A version-1 dedup onto it keeps version 2 and both sides' leaves.
    let v1 = sealed_with(&scope, Candidate::fact(text, "slack:C1:2"), known("run2"));
    store
        .write(&scope, &[v1], &WriteOptions::default())
        .expect("dedup");
    let r = &store.list(&scope, &ListQuery::newest(1)).expect("list")[0];
    assert!(valid(r), "{r:?}");
    let d = &r.provenance.as_ref().expect("provenance")["dependencies"];
    assert_eq!(d["version"], 2);
    assert_eq!(d["status"], "known");
    assert_eq!(d["origins"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        d["executionGithub"][0]["callId"], "call1",
        "reads are kept in [runId, callId] order: {d}"
    );

    // A version-2 restate with a conflicting read for the same call is an equivocation.
    let id = r.id.clone();
    let mut conflicting = with_reads("run1", &["call1"]);
    conflicting["executionGithub"][0]["resultHash"] = json!("c".repeat(64));
    let restate = sealed_with(
        &scope,
        Candidate::fact("npm ci needs the mirror token first", "slack:C1:3").restating(&id),
        conflicting,
    );
    store
        .write(&scope, &[restate], &WriteOptions::default())
        .expect("restate");
    let r = &store.list(&scope, &ListQuery::newest(1)).expect("list")[0];
    assert!(valid(r), "{r:?}");
    let d = &r.provenance.as_ref().expect("provenance")["dependencies"];
    assert_eq!(
        (d["status"].clone(), d["reason"].clone()),
        (json!("unknown"), json!("equivocation"))
    );
    assert_eq!(d["version"], 2);

    // A version-1 envelope carrying GitHub reads, even none, is refused with the Worker's words.
    let mut bad = known("run3");
    bad["executionGithub"] = json!([]);
    let refused = sealed_with(&scope, Candidate::fact("another lesson", "slack:C1:4"), bad);
    let err = store
        .write(&scope, &[refused], &WriteOptions::default())
        .expect_err("refused");
    assert_eq!(
        err.message(),
        "records[0].provenance must be a bounded memory revision"
    );
    // And the store survives a reopen with its version-2 provenance intact.
    store.close().expect("close");
    let store = EmbeddedStore::open(dir.path()).expect("reopen");
    for r in all(&store, &scope) {
        assert!(valid(&r), "after reopen: {r:?}");
    }
}
