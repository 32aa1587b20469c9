//! What leaves a scope: a forget, a sweep, an eviction at the cap; each retires a record
//! without deleting it.

use lessons::{Candidate, ListQuery, MemoryStore, Status, WriteCounts, WriteOptions};

use super::{each, embedded_at, opts, texts};
use crate::util::{fact_record, scope, FakeClock, T0};

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
