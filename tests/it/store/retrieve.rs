//! Retrieval: ranked, bumping each use, alike whatever the memory holds, and losing no use
//! to a concurrent write.

use std::sync::Arc;

use lessons::{
    Candidate, Durability, EmbeddedStore, ListQuery, MemoryStore, ScopeKey, WriteOptions,
};

use super::{each, opts, texts};
use crate::fixtures::rng::Rng;
use crate::util::{scope, FakeClock, T0};

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
