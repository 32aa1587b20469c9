//! Writes: restatement, dedup and supersede, refused input, concurrent writers, and the
//! phases a write tallies; a write is readable the moment it returns.

use std::sync::Arc;
use std::time::Duration;

use lessons::{
    Candidate, Durability, EmbeddedStore, ListQuery, MemoryStore, Status, WriteCounts, WriteOptions,
};

use super::{each, opts};
use crate::util::{scope, FakeClock, T0};

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
