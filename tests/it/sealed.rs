//! The newest bot seals every candidate with a content hash and drops, on every read, a record
//! whose hash no longer matches. A record sealed the bot's way must read back valid after every
//! operation: insert, dedup, restate, supersede, retrieve, export/import and reopen, on the
//! embedded store and through the server.

use std::sync::Arc;
use std::time::Duration;

use lessons::model::content_hash;
use lessons::remote::RemoteStore;
use lessons::server::{AppState, Auth, Background};
use lessons::store::{EmbeddedStore, ListQuery, MemoryStore, WriteOptions};
use lessons::{Candidate, ContextConfig, Record, ScopeKey};
use serde_json::json;

use crate::server::TOKEN;

/// What the bot does before it writes (`sealMemoryCandidate`): keywords default to the text's
/// tokens, then the provenance names the scope and the hash of the content.
fn seal(scope: &ScopeKey, mut c: Candidate) -> Candidate {
    if c.keywords.is_none() {
        c.keywords = Some(lessons::text::tokenize(&c.text));
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

/// The bot's read-side check (`validMemoryProvenance`), re-expressed.
fn valid(r: &Record) -> bool {
    let Some(p) = &r.provenance else {
        return false;
    };
    p["version"] == 1
        && p["scopeKey"] == r.scope_key.as_str()
        && p["contentHash"].as_str() == Some(r.content_hash().as_str())
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
    let mut out = Vec::new();
    store
        .export(&mut |r| {
            if &r.scope_key == scope {
                out.push(r);
            }
            Ok(())
        })
        .expect("export");
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
    let auth = Auth {
        token: Some(TOKEN.to_owned()),
        read_token: None,
        open: false,
    };
    let server =
        Background::start(AppState::new(store, auth, ContextConfig::default())).expect("server");
    let remote = RemoteStore::new(
        &server.url(),
        Some(TOKEN.to_owned()),
        Duration::from_secs(30),
    )
    .expect("client");
    let scope = ScopeKey::parse("repo:acme/web").expect("scope");
    exercise(&remote, &scope);
}
