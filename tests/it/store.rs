//! The store contract, run against every implementation, plus what only the embedded store has
//! (reopen, locking, format versions, index repair).

use std::sync::Arc;
use std::time::Duration;

use lessons::store::Tally;
use lessons::{
    Candidate, Durability, EmbeddedStore, InMemoryStore, Kind, ListQuery, MemoryStore, ScopeKey,
    Status, WriteCounts, WriteOptions,
};

use crate::fixtures::rng::Rng;
use crate::util::{fact_record, scope, FakeClock, T0};

fn opts() -> WriteOptions {
    WriteOptions::default()
}

/// A store under test, and whatever must live as long as it (a server).
type Made = (Box<dyn MemoryStore>, Option<lessons::server::Background>);
type Make = fn(&FakeClock, &tempfile::TempDir) -> Made;

fn embedded_at(clock: &FakeClock, dir: &std::path::Path) -> EmbeddedStore {
    EmbeddedStore::builder()
        .clock(clock.clock())
        .durability(Durability::Buffered)
        .open(dir)
        .expect("the store opens")
}

fn embedded(clock: &FakeClock, dir: &tempfile::TempDir) -> Made {
    (Box::new(embedded_at(clock, dir.path())), None)
}

fn in_memory(clock: &FakeClock, _: &tempfile::TempDir) -> Made {
    (Box::new(InMemoryStore::with_clock(clock.clock())), None)
}

/// A `RemoteStore` talking to a live server over an embedded store.
fn remote(clock: &FakeClock, dir: &tempfile::TempDir) -> Made {
    use crate::fixtures::server::{auth, serve, TOKEN};
    let store = Arc::new(embedded_at(clock, dir.path()));
    let server = serve(store, auth(TOKEN, None));
    let client = lessons::remote::RemoteStore::new(
        &server.url(),
        Some(TOKEN.into()),
        Duration::from_secs(10),
    )
    .expect("a client");
    (Box::new(client), Some(server))
}

const STORES: [(&str, Make); 3] = [
    ("embedded", embedded),
    ("in-memory", in_memory),
    ("remote", remote),
];

/// Runs `f` against a fresh store of every kind.
fn each(f: impl Fn(&dyn MemoryStore, &FakeClock)) {
    for (name, make) in STORES {
        let dir = tempfile::tempdir().expect("a scratch dir");
        let clock = FakeClock::new(T0);
        let (store, _server) = make(&clock, &dir);
        eprintln!("store: {name}");
        f(store.as_ref(), &clock);
    }
}

fn texts(records: &[lessons::Record]) -> Vec<&str> {
    records.iter().map(|r| r.text.as_str()).collect()
}

#[test]
fn window_is_the_newest_facts_and_list_never_bumps() {
    each(|store, clock| {
        let repo = scope("repo:acme/app");
        for i in 0..30 {
            let c = if i % 5 == 0 {
                Candidate::summary(format!("summary {i}"), "th")
            } else {
                Candidate::fact(format!("lesson {i}"), "th")
            };
            store.write(&repo, &[c], &opts()).expect("write");
            clock.advance(1);
        }
        let window = store.list(&repo, &ListQuery::window(24)).expect("list");
        assert_eq!(window.len(), 24);
        assert_eq!(window[0].text, "lesson 29");
        assert!(window.iter().all(|r| r.kind == Kind::Fact));
        assert!(window.windows(2).all(|w| w[0].seq() > w[1].seq()));
        let all = store.list(&repo, &ListQuery::newest(3)).expect("list");
        assert_eq!(texts(&all), ["lesson 29", "lesson 28", "lesson 27"]);
        let sums = store
            .list(
                &repo,
                &ListQuery {
                    limit: 50,
                    kind: Some(Kind::Summary),
                    query: None,
                },
            )
            .expect("list");
        assert_eq!(sums.len(), 6);
        // The reference's rule: any query token, as a whole token of text or keywords.
        let q = |query: &str| {
            store
                .list(
                    &repo,
                    &ListQuery {
                        limit: 50,
                        kind: None,
                        query: Some(query.into()),
                    },
                )
                .expect("list")
        };
        assert_eq!(texts(&q("19 Eleven 11")), ["lesson 19", "lesson 11"]);
        assert!(
            q("!!! ...").is_empty(),
            "a query without tokens matches nothing"
        );
        assert!(q("").is_empty(), "the empty query has no tokens either");
        assert!(
            q("1").iter().all(|r| r.text == "lesson 1"),
            "whole tokens, not substrings"
        );
        assert!(all
            .iter()
            .all(|r| r.use_count == 0 && r.last_used_at.is_none()));
        for bad in [0, 51] {
            let e = store
                .list(&repo, &ListQuery::newest(bad))
                .expect_err("limit");
            assert!(e.is_invalid() && e.to_string().contains("limit"), "{e}");
        }
    });
}

#[test]
fn restate_dedup_and_supersede_through_the_store() {
    each(|store, clock| {
        let repo = scope("repo:acme/app");
        let first = Candidate::fact(
            "the license check fails when nested node_modules are dropped",
            "t1",
        )
        .with_confidence(0.7);
        let c = store.write(&repo, &[first], &opts()).expect("write");
        assert_eq!(
            c,
            WriteCounts {
                inserted: 1,
                ..Default::default()
            }
        );
        let id = "mem:repo:acme/app:0";
        clock.advance(1000);
        let again = [
            Candidate::fact("npm ci fixes the license false positive", "t2")
                .restating(id)
                .with_confidence(0.9),
            Candidate::fact(
                "The license check fails when nested  node_modules are dropped",
                "t2",
            ),
            Candidate::fact("check:deps-drift names any tree or lockfile drift", "t2"),
        ];
        let c = store.write(&repo, &again, &opts()).expect("write");
        assert_eq!(
            c,
            WriteCounts {
                restated: 1,
                deduped: 1,
                inserted: 1,
                ..Default::default()
            }
        );
        let r = store.get(id).expect("get").expect("exists");
        assert_eq!(
            (r.use_count, r.last_used_at, r.confidence),
            (2, Some(T0 + 1000), Some(0.9))
        );
        assert_eq!(
            r.text,
            "the license check fails when nested node_modules are dropped"
        );
        let c = store
            .write(
                &repo,
                &[
                    Candidate::fact("drift check: run check:deps-drift before pushing", "t3")
                        .superseding("mem:repo:acme/app:1"),
                ],
                &opts(),
            )
            .expect("write");
        assert_eq!(
            c,
            WriteCounts {
                inserted: 1,
                superseded: 1,
                ..Default::default()
            }
        );
        let old = store
            .get("mem:repo:acme/app:1")
            .expect("get")
            .expect("kept for audit");
        assert_eq!(old.status, Status::Superseded);
        let new = store
            .get("mem:repo:acme/app:2")
            .expect("get")
            .expect("exists");
        assert_eq!(new.supersedes.as_deref(), Some("mem:repo:acme/app:1"));
        assert_eq!(
            store
                .list(&repo, &ListQuery::newest(50))
                .expect("list")
                .len(),
            2
        );
    });
}

#[test]
fn retrieve_ranks_bumps_and_sees_a_write_at_once() {
    each(|store, clock| {
        let org = scope("org:acme");
        store
            .write(
                &org,
                &[Candidate::fact(
                    "vitest needs the jsdom environment for component tests",
                    "t",
                )],
                &opts(),
            )
            .expect("write");
        clock.advance(3 * 24 * 3600 * 1000);
        store
            .write(
                &org,
                &[
                    Candidate::fact("pnpm install must run before vitest", "t"),
                    Candidate::fact("unrelated deploy note", "t"),
                ],
                &opts(),
            )
            .expect("write");
        // Visible immediately, before any index commit.
        let hits = store
            .retrieve(&org, "why does vitest fail? pnpm", 8)
            .expect("retrieve");
        assert_eq!(
            texts(&hits),
            [
                "pnpm install must run before vitest",
                "vitest needs the jsdom environment for component tests"
            ]
        );
        assert!(hits
            .iter()
            .all(|r| r.use_count == 1 && r.last_used_at == Some(T0 + 3 * 24 * 3600 * 1000)));
        let stored = store.get(&hits[0].id).expect("get").expect("exists");
        assert_eq!(stored.use_count, 1, "the bump is stored");
        assert!(
            store
                .retrieve(&org, "— … !!", 8)
                .expect("retrieve")
                .is_empty(),
            "no tokens, no hits"
        );
        assert!(store
            .retrieve(&scope("org:other"), "vitest", 8)
            .expect("retrieve")
            .is_empty());
        let one = store.retrieve(&org, "vitest", 1).expect("retrieve");
        assert_eq!(one.len(), 1);
        assert!(store
            .retrieve(&org, &"x".repeat(4001), 8)
            .expect_err("long")
            .is_invalid());
    });
}

#[test]
fn a_sweep_finds_status_that_enters_below_what_it_already_read() {
    // A sweep that found nothing remembers how far it read, and reads only newer facts next
    // time; a status fact imported with an older sequence number must still be found.
    each(|store, _| {
        let repo = scope("repo:acme/app");
        let fact = |seq: u64, text: &str| fact_record(&repo, seq, text, Status::Active);
        let clean = [
            fact(5, "run npm ci before the license check"),
            fact(10, "the lint step runs before the type check"),
        ];
        store.import(&clean).expect("import");
        assert_eq!(store.sweep(&repo, true).expect("sweep").swept, 0);
        assert_eq!(store.sweep(&repo, true).expect("sweep").swept, 0);
        let status = fact(7, "pull request 1835 pushed at sha 3f9a2c1");
        store.import(&[status]).expect("import");
        assert_eq!(
            store.sweep(&repo, true).expect("sweep").ids,
            [repo.record_id(7)]
        );
        // Newer than anything read: found as before.
        store
            .write(
                &repo,
                &[Candidate::fact("the README now documents the flag", "t")],
                &opts(),
            )
            .expect("write");
        assert_eq!(
            store.sweep(&repo, true).expect("sweep").ids,
            [repo.record_id(7), repo.record_id(11)]
        );
        assert_eq!(store.sweep(&repo, false).expect("sweep").swept, 2);
        assert_eq!(store.sweep(&repo, true).expect("sweep").swept, 0);
        assert_eq!(store.sweep(&repo, false).expect("sweep").swept, 0);
    });
}

#[test]
fn forget_and_sweep_retire_without_deleting() {
    each(|store, _| {
        let repo = scope("repo:acme/app");
        let batch = [
            Candidate::fact(
                "pull request 1835 pushed at sha 3f9a2c1 with 10,512 tests passing",
                "t",
            ),
            Candidate::fact("run npm ci before the license check", "t"),
            Candidate::summary("PR 12 was merged after the license fix", "t"),
            Candidate::fact("the README now documents the flag", "t"),
        ];
        store.write(&repo, &batch, &opts()).expect("write");
        let dry = store.sweep(&repo, true).expect("sweep");
        assert_eq!(dry.swept, 2);
        assert_eq!(
            dry.ids,
            ["mem:repo:acme/app:0", "mem:repo:acme/app:3"],
            "ascending sequence"
        );
        assert_eq!(
            store
                .list(&repo, &ListQuery::newest(50))
                .expect("list")
                .len(),
            4,
            "dry run changes nothing"
        );
        let real = store.sweep(&repo, false).expect("sweep");
        assert_eq!(real.swept, dry.swept);
        // The wire answers ids only under a dry run; local stores always list them.
        assert!(real.ids == dry.ids || real.ids.is_empty(), "{real:?}");
        assert_eq!(
            store.sweep(&repo, false).expect("sweep").swept,
            0,
            "idempotent"
        );
        assert_eq!(
            store
                .get("mem:repo:acme/app:0")
                .expect("get")
                .expect("kept")
                .status,
            Status::Swept
        );
        let left = store.list(&repo, &ListQuery::newest(50)).expect("list");
        assert_eq!(
            texts(&left),
            [
                "PR 12 was merged after the license fix",
                "run npm ci before the license check"
            ],
            "summaries are never swept"
        );
        assert!(store
            .retrieve(&repo, "sha tests passing pushed", 8)
            .expect("retrieve")
            .is_empty());
        assert!(store.forget(&repo, "mem:repo:acme/app:1").expect("forget"));
        assert!(
            !store.forget(&repo, "mem:repo:acme/app:1").expect("forget"),
            "already forgotten"
        );
        assert!(
            !store
                .forget(&scope("repo:acme/other"), "mem:repo:acme/app:2")
                .expect("forget"),
            "foreign scope"
        );
        assert!(!store.forget(&repo, "not-an-id").expect("forget"));
        // The reference Worker's id rule: no whitespace, 1 to 200 units.
        for bad in ["not an id", "", "a\tb"] {
            let e = store.forget(&repo, bad).expect_err("refused");
            assert!(e.is_invalid(), "{bad:?}: {e}");
            assert!(
                e.message().contains(
                    "id must be a non-empty string of at most 200 characters with no whitespace"
                ),
                "{e}"
            );
        }
        assert_eq!(
            store
                .get("mem:repo:acme/app:1")
                .expect("get")
                .expect("kept")
                .status,
            Status::Forgotten
        );
        // A swept or forgotten record cannot be restated or deduped onto.
        let c = store
            .write(
                &repo,
                &[Candidate::fact("run npm ci before the license check", "t")
                    .restating("mem:repo:acme/app:1")],
                &opts(),
            )
            .expect("write");
        assert_eq!(
            c,
            WriteCounts {
                inserted: 1,
                ..Default::default()
            }
        );
    });
}

#[test]
fn the_cap_evicts_least_recently_used() {
    each(|store, clock| {
        let ch = scope("channel:slack:C1");
        for i in 0..5 {
            store
                .write(
                    &ch,
                    &[Candidate::fact(format!("note {i} about caching"), "t")],
                    &opts(),
                )
                .expect("write");
            clock.advance(10);
        }
        // Use note 0, so note 1 becomes the least recently used.
        store.retrieve(&ch, "note 0", 1).expect("retrieve");
        clock.advance(10);
        let c = store
            .write(
                &ch,
                &[Candidate::fact("note 5 about caching", "t")],
                &WriteOptions {
                    cap: Some(4),
                    tally: None,
                    rejected: Vec::new(),
                },
            )
            .expect("write");
        assert_eq!(c.evicted, 2);
        let left: Vec<String> = store
            .list(&ch, &ListQuery::newest(50))
            .expect("list")
            .into_iter()
            .map(|r| r.text)
            .collect();
        assert_eq!(
            left,
            [
                "note 5 about caching",
                "note 4 about caching",
                "note 3 about caching",
                "note 0 about caching"
            ]
        );
        assert_eq!(
            store
                .get("mem:channel:slack:C1:1")
                .expect("get")
                .expect("kept")
                .status,
            Status::Evicted
        );
        for bad in [0, 10_001] {
            let e = store
                .write(
                    &ch,
                    &[Candidate::fact("x", "t")],
                    &WriteOptions {
                        cap: Some(bad),
                        tally: None,
                        rejected: Vec::new(),
                    },
                )
                .expect_err("cap");
            assert!(e.to_string().contains("cap"), "{e}");
        }
    });
}

#[test]
fn scopes_are_isolated() {
    each(|store, _| {
        let a = scope("repo:acme/a");
        let b = scope("repo:acme/b");
        store
            .write(
                &a,
                &[Candidate::fact("shared words about flaky tests", "t")],
                &opts(),
            )
            .expect("write");
        store
            .write(
                &b,
                &[Candidate::fact("shared words about flaky tests", "t")],
                &opts(),
            )
            .expect("write");
        // Same text in another scope is not a duplicate; a pointer into another scope resolves nothing.
        let c = store
            .write(
                &b,
                &[Candidate::fact("other", "t").restating("mem:repo:acme/a:0")],
                &opts(),
            )
            .expect("write");
        assert_eq!(c.inserted, 1);
        assert_eq!(
            store
                .get("mem:repo:acme/a:0")
                .expect("get")
                .expect("exists")
                .use_count,
            0
        );
        store.retrieve(&b, "flaky", 8).expect("retrieve");
        assert_eq!(
            store
                .get("mem:repo:acme/a:0")
                .expect("get")
                .expect("exists")
                .use_count,
            0
        );
        assert!(!store.forget(&b, "mem:repo:acme/a:0").expect("forget"));
        store
            .write(&a, &[Candidate::fact("PR 9 is complete", "t")], &opts())
            .expect("write");
        assert_eq!(store.sweep(&b, false).expect("sweep").swept, 0);
        assert_eq!(
            store.list(&a, &ListQuery::newest(50)).expect("list").len(),
            2
        );
        let mut scopes = store.scopes().expect("scopes");
        scopes.sort();
        assert_eq!(scopes, [a, b]);
    });
}

#[test]
fn counters_are_per_scope_per_day() {
    each(|store, clock| {
        let repo = scope("repo:acme/app");
        let mut tally = Tally {
            offered: 4,
            ..Tally::default()
        };
        tally.rejected = 1;
        tally.rejected_by.insert("sha".into(), 1);
        let cs = [
            Candidate::fact("lesson a", "t"),
            Candidate::summary("a run", "t"),
        ];
        store
            .write(
                &repo,
                &cs,
                &WriteOptions {
                    cap: None,
                    tally: Some(tally),
                    rejected: Vec::new(),
                },
            )
            .expect("write");
        clock.advance(24 * 3600 * 1000);
        store
            .write(&repo, &[Candidate::fact("lesson a", "t")], &opts())
            .expect("write");
        store
            .write(&repo, &[Candidate::fact("PR 1 was merged", "t")], &opts())
            .expect("write");
        store.sweep(&repo, false).expect("sweep");
        let days = store.stats(0).expect("stats");
        assert_eq!(days.len(), 2);
        assert_eq!(days[0].day, "2026-11-30");
        let d0 = &days[0].counters;
        assert_eq!(
            (d0.offered, d0.rejected, d0.inserted, d0.summaries),
            (4, 1, 1, 1)
        );
        let d1 = &days[1].counters;
        assert_eq!((d1.inserted, d1.deduped, d1.swept), (1, 1, 1));
        assert_eq!(
            store
                .stats(lessons::internals::day_of(T0) + 1)
                .expect("stats")
                .len(),
            1
        );
    });
}

#[test]
fn export_import_round_trips_every_record() {
    each(|store, _| {
        let repo = scope("repo:acme/app");
        let mut c = Candidate::fact("keep provenance", "t");
        c.provenance = Some(
            serde_json::json!({"version": 1, "scopeKey": "repo:acme/app", "contentHash": "0".repeat(64), "dependencies": {"version": 1, "status": "known", "revision": 3, "origins": [], "slack": [], "mcp": []}}),
        );
        c.source_run_id = Some("run-1".into());
        store
            .write(
                &repo,
                &[c, Candidate::fact("PR 2 was merged", "t")],
                &opts(),
            )
            .expect("write");
        store.sweep(&repo, false).expect("sweep");
        let all = crate::util::exported(store);
        assert_eq!(all.len(), 2);
        let target = InMemoryStore::new();
        let report = target.import(&all).expect("import");
        assert_eq!((report.imported, report.skipped), (2, 0));
        assert_eq!(target.import(&all).expect("import").skipped, 2);
        let back = target
            .get("mem:repo:acme/app:0")
            .expect("get")
            .expect("exists");
        assert_eq!(back, all[0]);
        // An imported scope continues its sequence.
        let again = store.import(&all).expect("import");
        assert_eq!(again.skipped, 2);
    });
}

#[test]
fn bad_input_gets_a_reason_and_writes_nothing() {
    each(|store, _| {
        let repo = scope("repo:acme/app");
        let too_many: Vec<Candidate> = (0..51)
            .map(|i| Candidate::fact(format!("x{i}"), "t"))
            .collect();
        assert!(store
            .write(&repo, &too_many, &opts())
            .expect_err("batch")
            .to_string()
            .contains("50"));
        let mixed = [Candidate::fact("fine", "t"), Candidate::fact("", "t")];
        let e = store.write(&repo, &mixed, &opts()).expect_err("empty text");
        assert!(
            e.to_string()
                .ends_with("records[1].text must be a non-empty string"),
            "{e}"
        );
        assert!(e.is_invalid());
        assert!(
            store
                .list(&repo, &ListQuery::newest(50))
                .expect("list")
                .is_empty(),
            "nothing from a rejected write"
        );
        let no_kind = Candidate {
            kind: None,
            ..Candidate::fact("x", "t")
        };
        assert!(store.write(&repo, &[no_kind], &opts()).is_err());
    });
}

fn open(dir: &std::path::Path, clock: &FakeClock) -> EmbeddedStore {
    EmbeddedStore::builder()
        .clock(clock.clock())
        .index_commit(32, Duration::from_millis(20))
        .open(dir)
        .expect("the store opens")
}

#[test]
fn embedded_records_and_index_survive_reopen() {
    let dir = tempfile::tempdir().expect("dir");
    let clock = FakeClock::new(T0);
    let org = scope("org:acme");
    {
        let store = open(dir.path(), &clock);
        store
            .write(
                &org,
                &[Candidate::fact(
                    "bazel remote cache needs the --noremote_upload_local_results flag",
                    "t",
                )],
                &opts(),
            )
            .expect("write");
        store.close().expect("close");
    }
    let store = open(dir.path(), &clock);
    assert_eq!(
        store
            .retrieve(&org, "bazel cache", 8)
            .expect("retrieve")
            .len(),
        1
    );
    assert!(store.check().expect("check").is_ok());
    let c = store
        .write(&org, &[Candidate::fact("second", "t")], &opts())
        .expect("write");
    assert_eq!(c.inserted, 1);
    assert!(
        store.get("mem:org:acme:1").expect("get").is_some(),
        "the sequence continues after reopen"
    );
}

#[test]
fn a_deleted_or_damaged_index_is_rebuilt_on_open() {
    let dir = tempfile::tempdir().expect("dir");
    let clock = FakeClock::new(T0);
    let org = scope("org:acme");
    {
        let store = open(dir.path(), &clock);
        let cs: Vec<Candidate> = (0..20)
            .map(|i| Candidate::fact(format!("lesson {i} about terraform state locks"), "t"))
            .collect();
        store.write(&org, &cs, &opts()).expect("write");
    }
    std::fs::remove_dir_all(dir.path().join("index")).expect("remove the index");
    {
        let store = open(dir.path(), &clock);
        assert_eq!(
            store
                .retrieve(&org, "terraform", 50)
                .expect("retrieve")
                .len(),
            20
        );
    }
    std::fs::write(dir.path().join("index/meta.json"), b"{not json").expect("damage the index");
    let store = open(dir.path(), &clock);
    assert_eq!(
        store
            .retrieve(&org, "terraform", 50)
            .expect("retrieve")
            .len(),
        20
    );
    let health = store.repair().expect("repair");
    assert!(health.is_ok(), "{health:?}");
    assert_eq!(health.active_records, 20);
}

#[test]
fn a_second_open_fails_at_once_naming_the_directory() {
    let dir = tempfile::tempdir().expect("dir");
    let _first = EmbeddedStore::open(dir.path()).expect("first open");
    let Err(e) = EmbeddedStore::open(dir.path()) else {
        panic!("a second open must fail");
    };
    assert!(e.is_locked(), "{e}");
    assert!(
        e.to_string().contains(&dir.path().display().to_string()),
        "{e}"
    );
    assert!(e.to_string().contains("--server URL"), "{e}");
}

#[test]
fn an_unknown_format_version_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("dir");
    drop(EmbeddedStore::open(dir.path()).expect("create"));
    {
        let db = fjall::Database::builder(dir.path().join("records"))
            .open()
            .expect("fjall opens");
        let meta = db
            .keyspace("meta", fjall::KeyspaceCreateOptions::default)
            .expect("meta");
        meta.insert("format", [9u8]).expect("write");
        db.persist(fjall::PersistMode::SyncAll).expect("persist");
    }
    let Err(e) = EmbeddedStore::open(dir.path()) else {
        panic!("version 9 must not open");
    };
    assert!(e.to_string().contains("format version"), "{e}");
}

#[test]
fn concurrent_writers_to_one_scope_lose_no_bump_and_mint_no_id_twice() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Arc::new(
        EmbeddedStore::builder()
            .durability(Durability::Buffered)
            .open(dir.path())
            .expect("open"),
    );
    let repo = scope("repo:acme/app");
    store
        .write(&repo, &[Candidate::fact("the shared lesson", "t")], &opts())
        .expect("seed");
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let store = Arc::clone(&store);
            let repo = repo.clone();
            std::thread::spawn(move || {
                for i in 0..25 {
                    let cs = [
                        Candidate::fact(format!("thread {t} lesson {i}"), "t"),
                        Candidate::fact("the shared lesson", "t"),
                        Candidate::fact("x", "t").restating("mem:repo:acme/app:0"),
                    ];
                    store
                        .write(&repo, &cs, &WriteOptions::default())
                        .expect("write");
                    store
                        .retrieve(&repo, &format!("thread {t}"), 3)
                        .expect("retrieve");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("writer thread");
    }
    let shared = store
        .get("mem:repo:acme/app:0")
        .expect("get")
        .expect("exists");
    assert_eq!(
        shared.use_count,
        8 * 25 * 2,
        "every dedup and restate bump counted (retrieves excluded by text)"
    );
    let mut ids = std::collections::HashSet::new();
    store
        .export(&mut |r| {
            assert!(ids.insert(r.id.clone()), "id minted twice: {}", r.id);
            Ok(())
        })
        .expect("export");
    assert_eq!(ids.len(), 1 + 8 * 25);
    assert!(store.check().expect("check").is_ok());
}

#[test]
fn concurrent_retrieves_and_writes_of_one_record_lose_no_use() {
    // A retrieve records its use apart from the record; a dedup or restate rewrites the record
    // and folds that use in. Racing both on one record, every use must be counted once, and
    // forgets racing them must leave no use behind their records.
    let dir = tempfile::tempdir().expect("dir");
    let repo = scope("repo:acme/app");
    let expected = {
        let store = Arc::new(
            EmbeddedStore::builder()
                .durability(Durability::Buffered)
                .open(dir.path())
                .expect("open"),
        );
        store
            .write(
                &repo,
                &[Candidate::fact("the shared lesson about flaky builds", "t")],
                &opts(),
            )
            .expect("seed");
        let threads: Vec<_> = (0..6)
            .map(|t| {
                let store = Arc::clone(&store);
                let repo = repo.clone();
                std::thread::spawn(move || {
                    let mut hits = 0u64;
                    let mut bumps = 0u64;
                    for i in 0..30 {
                        if t % 2 == 0 {
                            let answer = store
                                .retrieve(&repo, "shared flaky builds lesson", 3)
                                .expect("retrieve");
                            hits += answer
                                .iter()
                                .filter(|r| r.id == "mem:repo:acme/app:0")
                                .count() as u64;
                        } else {
                            let own = format!("thread {t} note {i} about flaky builds");
                            let cs = [
                                Candidate::fact(own.clone(), "t"),
                                Candidate::fact("x", "t").restating("mem:repo:acme/app:0"),
                            ];
                            store
                                .write(&repo, &cs, &WriteOptions::default())
                                .expect("write");
                            bumps += 1;
                            // Forget a record that retrieves may be bumping right now.
                            let list = store.list(&repo, &ListQuery::window(24)).expect("list");
                            if let Some(r) = list.iter().find(|r| r.text == own) {
                                assert!(store.forget(&repo, &r.id).expect("forget"));
                            }
                        }
                    }
                    hits + bumps
                })
            })
            .collect();
        let uses: u64 = threads.into_iter().map(|t| t.join().expect("thread")).sum();
        let shared = store
            .get("mem:repo:acme/app:0")
            .expect("get")
            .expect("exists");
        assert_eq!(
            shared.use_count, uses,
            "every retrieve and restate counted once"
        );
        assert!(store.check().expect("check").is_ok(), "no use left behind");
        uses
    };
    let store = EmbeddedStore::open(dir.path()).expect("reopen");
    let shared = store
        .get("mem:repo:acme/app:0")
        .expect("get")
        .expect("exists");
    assert_eq!(shared.use_count, expected, "the uses survive a reopen");
    let mut forgotten = 0;
    store
        .export(&mut |r| {
            if r.status == lessons::Status::Forgotten {
                forgotten += 1;
                // Only retrieves use a note: three threads, thirty each.
                assert!(r.use_count <= 3 * 30, "{r:?}");
            }
            Ok(())
        })
        .expect("export");
    assert_eq!(forgotten, 3 * 30);
    assert!(store.check().expect("check").is_ok());
}

#[test]
fn a_write_is_retrievable_the_moment_it_returns_while_the_indexer_commits() {
    // The indexer commits after every operation, so retrieves race its reloads constantly.
    let dir = tempfile::tempdir().expect("dir");
    let store = EmbeddedStore::builder()
        .durability(Durability::Buffered)
        .index_commit(1, Duration::from_millis(1))
        .open(dir.path())
        .expect("open");
    let org = scope("org:acme");
    for i in 0..300 {
        let token = format!("uniq{i}");
        store
            .write(
                &org,
                &[Candidate::fact(format!("lesson {token} about builds"), "t")],
                &opts(),
            )
            .expect("write");
        let hits = store.retrieve(&org, &token, 1).expect("retrieve");
        assert_eq!(hits.len(), 1, "write {i} was not visible to retrieve");
    }
}

#[test]
fn the_window_follows_every_change_to_its_scope() {
    each(|store, clock| {
        let repo = scope("repo:acme/window");
        // The shared window read and the owned list answer the same records every time.
        let window = |store: &dyn MemoryStore| -> Vec<(String, u64)> {
            let listed = store.list(&repo, &ListQuery::window(24)).expect("list");
            let shared = store.window(&repo, 24).expect("window");
            assert_eq!(listed, shared.to_records());
            listed.into_iter().map(|r| (r.text, r.use_count)).collect()
        };
        let w = |t: &str| Candidate::fact(t, "t");
        store
            .write(&repo, &[w("alpha lesson"), w("beta lesson")], &opts())
            .expect("write");
        assert_eq!(
            window(store),
            [("beta lesson".into(), 0), ("alpha lesson".into(), 0)]
        );
        // A window already read never changes under its holder.
        let held = store.window(&repo, 24).expect("window");
        // A retrieve's bump shows in the next window read.
        clock.advance(1_000);
        assert_eq!(
            store.retrieve(&repo, "alpha", 8).expect("retrieve").len(),
            1
        );
        assert_eq!(
            window(store),
            [("beta lesson".into(), 0), ("alpha lesson".into(), 1)]
        );
        // So do an insert, a dedup, a forget, a supersede and a sweep.
        store
            .write(&repo, &[w("gamma lesson"), w("BETA lesson")], &opts())
            .expect("write");
        assert_eq!(
            window(store),
            [
                ("gamma lesson".into(), 0),
                ("beta lesson".into(), 1),
                ("alpha lesson".into(), 1)
            ]
        );
        assert!(store.forget(&repo, &repo.record_id(0)).expect("forget"));
        let fix = w("delta lesson").superseding(repo.record_id(2));
        store
            .write(&repo, &[fix, w("PR 12 was merged")], &opts())
            .expect("write");
        assert_eq!(
            window(store),
            [
                ("PR 12 was merged".into(), 0),
                ("delta lesson".into(), 0),
                ("beta lesson".into(), 1)
            ]
        );
        assert_eq!(store.sweep(&repo, false).expect("sweep").swept, 1);
        assert_eq!(
            window(store),
            [("delta lesson".into(), 0), ("beta lesson".into(), 1)]
        );
        assert_eq!(
            store
                .list(&repo, &ListQuery::window(1))
                .expect("window")
                .len(),
            1
        );
        assert_eq!(store.window(&repo, 1).expect("window").len(), 1);
        let held: Vec<(&str, u64)> = held
            .iter()
            .map(|r| (r.text.as_str(), r.use_count))
            .collect();
        assert_eq!(held, [("beta lesson", 0), ("alpha lesson", 0)]);
        for bad in [0, 51] {
            let e = store.window(&repo, bad).expect_err("limit out of range");
            assert_eq!(e.kind(), lessons::ErrorKind::Invalid, "{e}");
        }
    });
}

/// The newest `n` active facts of `scope`, read through `export` (which never uses the window).
fn newest_facts(store: &dyn MemoryStore, scope: &lessons::ScopeKey, n: usize) -> Vec<String> {
    let mut facts = crate::util::exported(store);
    facts.retain(|r| &r.scope_key == scope && r.kind == Kind::Fact && r.status == Status::Active);
    facts.sort_by_key(|r| std::cmp::Reverse(r.seq()));
    facts.into_iter().take(n).map(|r| r.id).collect()
}

#[test]
fn a_full_window_is_filled_again_from_the_records_when_facts_leave_it() {
    each(|store, clock| {
        let repo = scope("repo:acme/full");
        let cap = WriteOptions {
            cap: Some(1_000),
            ..WriteOptions::default()
        };
        for batch in 0..4 {
            let cands: Vec<Candidate> = (0..20)
                .map(|i| {
                    let n = batch * 20 + i;
                    if n % 7 == 3 {
                        Candidate::fact(format!("PR {n} was merged"), "t")
                    } else {
                        Candidate::fact(format!("lesson {n}: warm cache {n}"), "t")
                    }
                })
                .collect();
            store.write(&repo, &cands, &cap).expect("write");
            clock.advance(1_000);
        }
        let check = |store: &dyn MemoryStore, what: &str| {
            let window: Vec<String> = store
                .window(&repo, 50)
                .expect("window")
                .iter()
                .map(|r| r.id.clone())
                .collect();
            assert_eq!(window, newest_facts(store, &repo, 50), "after {what}");
        };
        check(store, "the writes");
        // Forgets inside the window: it reaches further back.
        for seq in [79, 60, 45] {
            assert!(store.forget(&repo, &repo.record_id(seq)).expect("forget"));
            check(store, "a forget");
        }
        // A supersede of a window member, and a new fact.
        let fix = Candidate::fact("lesson 50 corrected", "t").superseding(repo.record_id(50));
        store.write(&repo, &[fix], &cap).expect("write");
        check(store, "a supersede");
        // A sweep takes every status line out at once.
        assert!(store.sweep(&repo, false).expect("sweep").swept > 5);
        check(store, "a sweep");
        // Evictions at a small cap take the least recently used (the oldest) out.
        let small = WriteOptions {
            cap: Some(40),
            ..WriteOptions::default()
        };
        store
            .write(&repo, &[Candidate::fact("the newest lesson", "t")], &small)
            .expect("write");
        check(store, "evictions");
        // Retrieve bumps records inside the window; the window shows the new counts.
        store.retrieve(&repo, "warm cache", 10).expect("retrieve");
        let counts: Vec<u64> = store
            .window(&repo, 50)
            .expect("window")
            .iter()
            .map(|r| r.use_count)
            .collect();
        let listed: Vec<u64> = store
            .list(&repo, &ListQuery::newest(50))
            .expect("list")
            .iter()
            .filter(|r| r.kind == Kind::Fact)
            .map(|r| r.use_count)
            .collect();
        assert_eq!(counts, listed);
        assert!(counts.iter().any(|&c| c > 0));
    });
}

#[test]
fn eviction_stays_least_recently_used_after_the_order_leaves_memory() {
    let dir = tempfile::tempdir().expect("a scratch dir");
    let clock = FakeClock::new(T0);
    let store = embedded_at(&clock, dir.path());
    let ch = scope("channel:slack:C1");
    let cap = |n| WriteOptions {
        cap: Some(n),
        tally: None,
        rejected: Vec::new(),
    };
    for i in 0..5 {
        let c = Candidate::fact(format!("note {i} about caching"), "t");
        store.write(&ch, &[c], &cap(5)).expect("write");
        clock.advance(10);
    }
    store.retrieve(&ch, "note 1", 1).expect("retrieve");
    clock.advance(10);
    // More scopes than the store keeps eviction orders for (4,096), each loading its own: the first
    // scope's order leaves memory, and the bump below lands while it is out.
    for i in 0..4200 {
        let other = scope(&format!("repo:acme/r{i}"));
        let two = [Candidate::fact("one", "t"), Candidate::fact("two", "t")];
        assert_eq!(
            store.write(&other, &two, &cap(1)).expect("write").evicted,
            1
        );
    }
    store.retrieve(&ch, "note 2", 1).expect("retrieve");
    clock.advance(10);
    let c = Candidate::fact("note 5 about caching", "t");
    assert_eq!(store.write(&ch, &[c], &cap(2)).expect("write").evicted, 4);
    let left = store.list(&ch, &ListQuery::newest(50)).expect("list");
    assert_eq!(
        texts(&left),
        ["note 5 about caching", "note 2 about caching"]
    );
}

#[test]
fn active_count_counts_facts_and_summaries_of_one_scope_in_every_store() {
    each(|store, _| {
        let repo = scope("repo:acme/app");
        let other = scope("repo:acme/other");
        let facts: Vec<Candidate> = (0..4)
            .map(|i| Candidate::fact(format!("lesson {i} about the build"), "th"))
            .collect();
        store.write(&repo, &facts, &opts()).expect("write");
        store
            .write(
                &repo,
                &[Candidate::summary("the week in brief", "th")],
                &opts(),
            )
            .expect("write");
        store
            .write(
                &other,
                &[Candidate::fact("another scope's lesson", "th")],
                &opts(),
            )
            .expect("write");
        assert_eq!(store.active_count(&repo).expect("count"), 5);
        let first = store.window(&repo, 50).expect("window")[0].id.clone();
        assert!(store.forget(&repo, &first).expect("forget"));
        assert_eq!(
            store.active_count(&repo).expect("count"),
            4,
            "forgotten is not active"
        );
        assert_eq!(store.active_count(&other).expect("count"), 1);
        assert_eq!(store.active_count(&scope("org:none")).expect("count"), 0);
    });
}

/// Retrieve answers the same whether a scope's records are held in memory or asked of the
/// keyword index: the default budget; one of 800 KB, whose 50 KB share per scope holds the two
/// small scopes throughout and lets the two large ones go to the index as they grow (about
/// 1 KB a record here); and one that holds nothing — over the same writes, forgets, sweeps
/// and clock.
#[test]
fn retrieve_answers_alike_whatever_the_memory_holds() {
    const WORDS: [&str; 16] = [
        "npm",
        "ci",
        "license",
        "check",
        "vitest",
        "lockfile",
        "cache",
        "key",
        "registry",
        "deploy",
        "wrangler",
        "pnpm",
        "jsdom",
        "schema",
        "migration",
        "flaky",
    ];
    let clock = FakeClock::new(T0);
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().expect("dir")).collect();
    let stores: Vec<EmbeddedStore> = [None, Some(800_000), Some(1)]
        .into_iter()
        .zip(&dirs)
        .map(|(bytes, dir)| {
            let b = EmbeddedStore::builder();
            let b = match bytes {
                Some(bytes) => b.scope_cache(64, bytes),
                None => b,
            };
            b.clock(clock.clock())
                .durability(Durability::Buffered)
                .open(dir.path())
                .expect("the store opens")
        })
        .collect();
    let scopes: Vec<ScopeKey> = (0..4)
        .map(|i| scope(&format!("repo:acme/app{i}")))
        .collect();
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let sentence = |rng: &mut Rng| -> String {
        (0..8)
            .map(|_| WORDS[rng.below(WORDS.len() as u64) as usize])
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut answered = 0;
    for round in 0..60 {
        let s = &scopes[round % scopes.len()];
        let cands: Vec<Candidate> = (0..[1, 2, 8, 12][round % 4])
            .map(|i| Candidate::fact(format!("{} {round} {i}", sentence(&mut rng)), "t"))
            .collect();
        for store in &stores {
            store.write(s, &cands, &opts()).expect("write");
        }
        if round % 7 == 3 {
            let id = s.record_id(rng.below(round as u64 * 6 + 6));
            let answers: Vec<bool> = stores
                .iter()
                .map(|st| st.forget(s, &id).expect("forget"))
                .collect();
            assert!(answers.windows(2).all(|w| w[0] == w[1]), "{answers:?}");
        }
        if round % 11 == 5 {
            for store in &stores {
                store.sweep(s, false).expect("sweep");
            }
        }
        clock.advance(3_600_000);
        for q in 0..3 {
            let query = sentence(&mut rng);
            let s = &scopes[(round + q) % scopes.len()];
            let answers: Vec<Vec<lessons::Record>> = stores
                .iter()
                .map(|st| st.retrieve(s, &query, 8).expect("retrieve"))
                .collect();
            answered += usize::from(!answers[0].is_empty());
            assert_eq!(answers[0], answers[1], "round {round}, some held: {query}");
            assert_eq!(answers[0], answers[2], "round {round}, none held: {query}");
        }
    }
    assert!(answered > 120, "{answered} of 180 retrieves found records");
}

#[test]
fn a_write_tallies_its_phases_and_they_fit_in_its_time() {
    let clock = FakeClock::new(T0);
    let dir = tempfile::tempdir().expect("dir");
    let store = EmbeddedStore::builder()
        .clock(clock.clock())
        .durability(Durability::Sync)
        .open(dir.path())
        .expect("the store opens");
    let s = scope("repo:acme/phases");
    store
        .write(
            &s,
            &[Candidate::fact("run the migrations before the tests", "t")],
            &opts(),
        )
        .expect("write");
    let first = lessons::internals::last_write();
    assert!(first.total > Duration::ZERO);
    let named: Duration = first.named().iter().map(|(_, d)| *d).sum();
    assert!(named <= first.total, "{first:?}");
    // A durable write waited for an fsync that covers it; its first write loaded the scope.
    assert!(first.durable > Duration::ZERO, "{first:?}");
    assert!(first.scope_load > Duration::ZERO, "{first:?}");
    // Each write starts its own tally: a write that writes nothing leaves its phases empty.
    store.write(&s, &[], &opts()).expect("empty write");
    let empty = lessons::internals::last_write();
    assert_eq!(empty.durable, Duration::ZERO, "{empty:?}");
    assert_eq!(empty.scope_load, Duration::ZERO, "{empty:?}");
}

#[test]
fn an_export_gives_each_scope_oldest_first_its_retired_and_active_records_interleaved() {
    each(|store, _| {
        let capped = WriteOptions {
            cap: Some(3),
            ..WriteOptions::default()
        };
        for s in ["repo:acme/app", "repo:acme/web"] {
            let key = scope(s);
            // Eight records through a cap of three: the older ones retire as the newer arrive,
            // and one in the middle is forgotten, so retired and active alternate in sequence.
            for i in 0..8 {
                let text = format!("lesson {i} of {s}: the lint step runs before the type check");
                store
                    .write(&key, &[Candidate::fact(text, "t")], &capped)
                    .expect("write");
            }
            assert!(store.forget(&key, &key.record_id(6)).expect("forget"));
        }
        let all = crate::util::exported(store);
        let seqs = |s: &str| -> Vec<u64> {
            all.iter()
                .filter(|r| r.scope_key.as_str() == s)
                .filter_map(|r| r.seq())
                .collect()
        };
        assert_eq!(seqs("repo:acme/app"), (0..8).collect::<Vec<u64>>());
        assert_eq!(seqs("repo:acme/web"), (0..8).collect::<Vec<u64>>());
        // Scope by scope: every record of one scope before the next scope's.
        let first_web = all
            .iter()
            .position(|r| r.scope_key.as_str() == "repo:acme/web")
            .expect("web exported");
        assert!(all[first_web..]
            .iter()
            .all(|r| r.scope_key.as_str() == "repo:acme/web"));
    });
}

#[test]
fn an_embedded_store_accounts_for_what_it_holds_within_its_bounds() {
    let dir = tempfile::tempdir().expect("dir");
    let store = EmbeddedStore::builder()
        .durability(Durability::Buffered)
        .cache_bytes(8 << 20)
        .scope_cache(16, 4 << 20)
        .open(dir.path())
        .expect("open");
    let before = store.memory();
    assert_eq!(before.block_cache_capacity, 8 << 20);
    assert_eq!(before.scope_map_budget, 4 << 20);
    assert_eq!(before.scope_map, 0, "nothing read yet");
    let key = scope("repo:acme/app");
    store
        .write(
            &key,
            &[Candidate::fact(
                "the lint step runs before the type check",
                "t",
            )],
            &opts(),
        )
        .expect("write");
    store.window(&key, 10).expect("window");
    let after = store.memory();
    assert!(after.memtables > before.memtables, "{after:?}");
    assert!(
        after.scope_map > 0 && after.scope_map <= after.scope_map_budget,
        "{after:?}"
    );
    assert!(after.block_cache <= after.block_cache_capacity, "{after:?}");
    assert!(after.index_writer_heap > 0);
    // The trait's view of the same store, as `/metrics` reads it.
    assert_eq!(
        MemoryStore::memory(&store).map(|m| m.scope_map_budget),
        Some(4 << 20)
    );
}

#[test]
fn an_embedded_store_reports_its_background_work_and_comes_to_rest() {
    let dir = tempfile::tempdir().expect("dir");
    // The indexer's rounds come every 50 ms here; the pruner runs after each.
    let store = EmbeddedStore::builder()
        .durability(Durability::Buffered)
        .index_commit(1_000_000, Duration::from_millis(50))
        .open(dir.path())
        .expect("open");
    assert!(store.upkeep().at_rest(), "{:?}", store.upkeep());
    let key = scope("repo:acme/app");
    store
        .write(
            &key,
            &[Candidate::fact(
                "the lint step runs before the type check",
                "t",
            )],
            &opts(),
        )
        .expect("write");
    store.flush().expect("flush");
    assert_eq!(store.upkeep().index_pending_changes, 0);
    // The write's journal entry has the pruner count the scope's journal, within a round.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !store.upkeep().at_rest() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let rested = store.upkeep();
    assert!(rested.at_rest(), "{rested:?}");
    assert_eq!(rested.journals_to_count, 0);
    assert_eq!(
        MemoryStore::upkeep(&store).map(|u| u.index_pending_changes),
        Some(0)
    );
    assert_eq!(MemoryStore::upkeep(&InMemoryStore::new()), None);
    // Buffered writes wait on no fsync; the index's commit made the journal durable first.
    assert!(rested.journal_syncs.count() >= 1, "{rested:?}");
}

#[test]
fn a_synced_store_counts_and_times_the_fsyncs_its_writes_waited_on() {
    let dir = tempfile::tempdir().expect("dir");
    let store = EmbeddedStore::open(dir.path()).expect("open");
    let key = scope("repo:acme/app");
    let before = store.upkeep().journal_syncs;
    for i in 0..3 {
        store
            .write(
                &key,
                &[Candidate::fact(
                    format!("the lint step {i} runs before the type check"),
                    "t",
                )],
                &opts(),
            )
            .expect("write");
    }
    let syncs = store.upkeep().journal_syncs.since(&before);
    // One writer: each write waits on an fsync of its own (an index commit may add one).
    assert!(syncs.count() >= 3, "{syncs:?}");
    assert!(syncs.quantile(0.5) <= syncs.quantile(1.0));
    assert!(
        syncs.quantile(1.0) > Duration::ZERO,
        "the slowest bucket ends above zero"
    );
    let n = u32::try_from(syncs.count()).expect("a few");
    assert!(
        syncs.total() <= syncs.quantile(1.0) * n,
        "n fsyncs take at most n times the slowest's bound: {syncs:?}"
    );
    assert_eq!(
        syncs.since(&syncs).count(),
        0,
        "a reading less itself is empty"
    );
}

#[test]
fn a_long_export_exports_each_record_once_while_records_are_retired_under_it() {
    // Past the retired records one snapshot reads, the export goes on from a fresh snapshot;
    // records forgotten meanwhile, one already exported as active and one not yet reached,
    // each come out once.
    let dir = tempfile::tempdir().expect("dir");
    let store = EmbeddedStore::builder()
        .durability(Durability::Buffered)
        .open(dir.path())
        .expect("open");
    let key = scope("repo:acme/app");
    const N: u64 = 50_000;
    let active = |seq: u64| seq % 1_000 == 999;
    let records: Vec<lessons::Record> = (0..N)
        .map(|seq| {
            let text = format!("lesson {seq}: the lint step runs before the type check");
            let status = if active(seq) {
                Status::Active
            } else {
                Status::Evicted
            };
            fact_record(&key, seq, &text, status)
        })
        .collect();
    for chunk in records.chunks(5_000) {
        store.import(chunk).expect("import");
    }
    let (behind, ahead) = (key.record_id(10_999), key.record_id(45_999));
    let mut out: Vec<lessons::Record> = Vec::new();
    store
        .export(&mut |r| {
            out.push(r);
            if out.len() == 30_000 {
                assert!(store.forget(&key, &behind).expect("forget behind"));
                assert!(store.forget(&key, &ahead).expect("forget ahead"));
            }
            Ok(())
        })
        .expect("export");
    let seqs: Vec<u64> = out.iter().filter_map(|r| r.seq()).collect();
    assert_eq!(
        seqs,
        (0..N).collect::<Vec<u64>>(),
        "each record once, in order"
    );
    let status = |id: &str| out.iter().find(|r| r.id == id).map(|r| r.status);
    assert_eq!(
        status(&behind),
        Some(Status::Active),
        "exported before it was forgotten"
    );
    assert_eq!(
        status(&ahead),
        Some(Status::Forgotten),
        "reached after it was forgotten"
    );
    let actives = out.iter().filter(|r| r.status == Status::Active).count();
    assert_eq!(actives as u64, N / 1_000 - 1);
}
