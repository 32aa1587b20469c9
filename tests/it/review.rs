//! The decision journal and the review: `examples/week.rs` trips exactly the signals it was
//! built to trip, the journal holds the evidence, and both stores keep the same journal.

use lessons::decisions::{DecisionEvent, DecisionQuery};
use lessons::store::{EmbeddedStore, InMemoryStore, MemoryStore, WriteOptions};
use lessons::{Candidate, ScopeKey};

use crate::util::{run, stdout};

#[path = "../../examples/week.rs"]
#[allow(dead_code)]
mod week;

use crate::util::scope;

#[test]
fn the_week_fires_exactly_the_signals_it_was_built_to_trip() {
    let dir = tempfile::tempdir().expect("tempdir");
    let review = week::run(dir.path()).expect("the week runs");
    assert_eq!(
        review.fired,
        [
            "repo:acme/api: rejected",
            "repo:acme/cli: rejected",
            "repo:acme/web: rejected",
            "repo:acme/web: restated",
        ]
    );
    let web = review
        .scopes
        .iter()
        .find(|s| s.scope_key.as_str() == "repo:acme/web")
        .expect("web reviewed");
    assert_eq!(web.restatements.len(), 20, "20 sampled restatements");
    for r in &web.restatements {
        assert!(r.target_id.starts_with("mem:repo:acme/web:"));
        assert!(r.target_text.starts_with("in acme/web, lesson"), "{r:?}");
        assert!(r.text.contains("the same lesson again"));
    }
    let api = review
        .scopes
        .iter()
        .find(|s| s.scope_key.as_str() == "repo:acme/api")
        .expect("api reviewed");
    assert_eq!(api.counters.swept, 3, "the three legacy status rows");
    assert!(api.rejected_by_marker["sha"]
        .iter()
        .all(|t| t.contains("3f9a2c")));
    assert!(
        !api.evicted_unused.is_empty(),
        "the cap evicted unused lessons"
    );
    for s in &review.scopes {
        assert!(s.inserted_per_day < 40.0);
    }
}

#[test]
fn the_cli_review_exits_one_and_the_journal_shows_the_restatement_pairs() {
    let dir = tempfile::tempdir().expect("tempdir");
    week::run(dir.path()).expect("the week runs");
    let store = dir.path().to_str().expect("utf-8");
    // The week is the last seven days; a longer review covers it too.
    let out = run(&["--store", store, "review", "--since", "3650d"], "");
    assert_eq!(out.status.code(), Some(1), "a signal fired");
    let text = stdout(&out);
    assert!(text.contains("FIRED"), "{text}");
    assert!(text.contains("[FIRES] restated"), "{text}");
    let json = run(
        &[
            "--store",
            store,
            "--json",
            "review",
            "--scope",
            "repo:acme/cli",
        ],
        "",
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&json)).expect("json");
    assert_eq!(v["fired"], serde_json::json!(["repo:acme/cli: rejected"]));
    // The default period (the last seven days) is the week: the same verdict as the example's.
    let all = run(&["--store", store, "--json", "review"], "");
    assert_eq!(all.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_str(&stdout(&all)).expect("json");
    assert_eq!(
        v["fired"],
        serde_json::json!([
            "repo:acme/api: rejected",
            "repo:acme/cli: rejected",
            "repo:acme/web: rejected",
            "repo:acme/web: restated"
        ])
    );
    let journal = run(
        &[
            "--store",
            store,
            "journal",
            "--scope",
            "repo:acme/web",
            "--event",
            "restated",
            "--since",
            "3650d",
            "--limit",
            "3",
        ],
        "",
    );
    assert_eq!(journal.status.code(), Some(0));
    let text = stdout(&journal);
    assert_eq!(
        text.matches(" restated mem:repo:acme/web:").count(),
        3,
        "{text}"
    );
    assert_eq!(
        text.matches("  target: in acme/web, lesson").count(),
        3,
        "{text}"
    );
}

#[test]
fn export_and_import_carry_the_journal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("repo:acme/app");
    {
        let store = EmbeddedStore::open(dir.path().join("a")).expect("open");
        let opts = WriteOptions {
            rejected: vec![lessons::decisions::RejectedFact {
                text: "PR 12 was merged".into(),
                markers: vec!["reference".into(), "delivery".into()],
            }],
            ..WriteOptions::default()
        };
        store
            .write(&s, &[Candidate::fact("run npm ci first", "t")], &opts)
            .expect("write");
        store.close().expect("close");
    }
    let a = dir.path().join("a");
    let exported = run(&["--store", a.to_str().expect("utf-8"), "export"], "");
    assert_eq!(exported.status.code(), Some(0));
    let lines = stdout(&exported);
    assert_eq!(lines.matches("{\"decision\"").count(), 2, "{lines}");
    let b = dir.path().join("b");
    let imported = run(&["--store", b.to_str().expect("utf-8"), "import"], &lines);
    assert_eq!(imported.status.code(), Some(0));
    assert!(stdout(&imported).contains("2 journal entries"));
    let store = EmbeddedStore::open(&b).expect("open b");
    let d = store
        .decisions(&s, &DecisionQuery::default())
        .expect("journal");
    assert_eq!(d.len(), 2);
    assert_eq!(d[1].event, DecisionEvent::Rejected);
    assert_eq!(d[1].texts, ["PR 12 was merged"]);
    assert_eq!(d[0].event, DecisionEvent::Inserted);
}

/// The embedded store and the model, each at `cap` on the same fixed clock (the directory
/// holds the embedded one).
fn both_stores(cap: usize) -> (tempfile::TempDir, EmbeddedStore, InMemoryStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock: lessons::Clock = std::sync::Arc::new(|| 1_795_424_400_000);
    let embedded = EmbeddedStore::builder()
        .cap(cap)
        .clock(clock.clone())
        .open(dir.path())
        .expect("open");
    let model = InMemoryStore::with_clock(clock).with_cap(cap);
    (dir, embedded, model)
}

/// Both stores journal the same decisions for the same writes.
#[test]
fn both_stores_keep_the_same_journal() {
    let (_dir, embedded, model) = both_stores(3);
    let s = scope("repo:acme/app");
    let stores: [&dyn MemoryStore; 2] = [&embedded, &model];
    for store in stores {
        let w = |c: &[Candidate]| {
            store.write(&s, c, &WriteOptions::default()).expect("write");
        };
        w(&[
            Candidate::fact("lesson one", "t"),
            Candidate::fact("lesson two", "t"),
        ]);
        w(&[Candidate::fact("Lesson  ONE", "t")]); // dedup
        w(&[Candidate::fact("lesson one, restated", "t").restating("mem:repo:acme/app:0")]);
        w(&[Candidate::fact("lesson two, replaced", "t").superseding("mem:repo:acme/app:1")]);
        w(&[
            Candidate::fact("lesson three", "t"),
            Candidate::fact("lesson four", "t"),
        ]); // evicts
        w(&[Candidate::fact("PR 9 merged", "t")]);
        store.sweep(&s, false).expect("sweep");
        store.forget(&s, "mem:repo:acme/app:4").expect("forget");
    }
    let q = DecisionQuery {
        limit: 1000,
        ..DecisionQuery::default()
    };
    let a = embedded.decisions(&s, &q).expect("embedded journal");
    let b = model.decisions(&s, &q).expect("model journal");
    let events = |v: &[lessons::Decision]| v.iter().map(|d| d.event).collect::<Vec<_>>();
    assert_eq!(events(&a), events(&b));
    assert_eq!(a, b);
    for e in [
        DecisionEvent::Inserted,
        DecisionEvent::Deduped,
        DecisionEvent::Restated,
        DecisionEvent::Superseded,
        DecisionEvent::Evicted,
        DecisionEvent::Swept,
        DecisionEvent::Forgotten,
    ] {
        assert!(events(&a).contains(&e), "{e:?} missing: {:?}", events(&a));
    }
    let filtered = embedded
        .decisions(
            &s,
            &DecisionQuery {
                events: vec![DecisionEvent::Evicted],
                ..q
            },
        )
        .expect("filter");
    assert!(filtered.iter().all(|d| d.event == DecisionEvent::Evicted));
    assert!(filtered
        .iter()
        .all(|d| d.use_count.is_some() && d.age_ms.is_some()));
}

/// What a visit of `query` in pages of `page` hands before the visitor stops at `stop` entries.
fn visited(
    store: &dyn MemoryStore,
    s: &ScopeKey,
    query: &DecisionQuery,
    page: usize,
    stop: usize,
) -> Vec<lessons::Decision> {
    let mut seen = Vec::new();
    store
        .visit_decisions(s, query, page, &mut |d| {
            seen.push(d);
            seen.len() < stop
        })
        .expect("visit");
    seen
}

/// The evictions of records never used read as a filter of every eviction would, in both
/// stores: the embedded store keeps them under a class byte of their own, the model filters.
#[test]
fn never_used_evictions_read_as_the_filter_of_every_eviction() {
    let (_dir, embedded, model) = both_stores(3);
    let s = scope("repo:acme/app");
    let stores: [&dyn MemoryStore; 2] = [&embedded, &model];
    for store in stores {
        for round in 0..6 {
            let facts: Vec<Candidate> = (0..2)
                .map(|i| Candidate::fact(format!("lesson {round}.{i} about the linker"), "t"))
                .collect();
            store
                .write(&s, &facts, &WriteOptions::default())
                .expect("write");
            // Every other round, the newest lesson is used before the cap evicts it.
            if round % 2 == 0 {
                store
                    .retrieve(&s, &format!("lesson {round}.1 linker"), 1)
                    .expect("retrieve");
            }
        }
    }
    let of = |events: Vec<DecisionEvent>, never_used: bool| DecisionQuery {
        events,
        limit: 1000,
        never_used,
        ..DecisionQuery::default()
    };
    let evictions = embedded
        .decisions(&s, &of(vec![DecisionEvent::Evicted], false))
        .expect("evictions");
    let unused: Vec<_> = evictions
        .iter()
        .filter(|d| d.use_count == Some(0))
        .cloned()
        .collect();
    assert!(
        !unused.is_empty() && unused.len() < evictions.len(),
        "the writes evict used and unused lessons: {evictions:?}"
    );
    for events in [
        vec![],
        vec![DecisionEvent::Evicted],
        vec![DecisionEvent::Evicted, DecisionEvent::Inserted],
    ] {
        let q = of(events, true);
        let a = embedded.decisions(&s, &q).expect("embedded");
        assert_eq!(a, unused, "{q:?}");
        assert_eq!(model.decisions(&s, &q).expect("model"), unused, "{q:?}");
        for page in [1, 2, 64] {
            assert_eq!(
                visited(&embedded, &s, &q, page, usize::MAX),
                unused,
                "page {page}"
            );
        }
    }
    let none = of(vec![DecisionEvent::Inserted], true);
    assert!(embedded.decisions(&s, &none).expect("read").is_empty());
    assert!(model.decisions(&s, &none).expect("read").is_empty());
    // Every entry still reads, in one order, whatever its key.
    let all = of(vec![], false);
    assert_eq!(
        embedded.decisions(&s, &all).expect("embedded"),
        model.decisions(&s, &all).expect("model")
    );
}

/// A visit hands the entries a read answers, in its order, stops where the visitor stops, and
/// never hands one twice: read once (the embedded store) or in doubling pages (the default the
/// in-memory and remote stores use), at every page size.
#[test]
fn a_journal_visit_hands_what_a_read_answers_and_stops_where_asked() {
    let (_dir, embedded, model) = both_stores(5);
    let s = scope("repo:acme/app");
    let stores: [&dyn MemoryStore; 2] = [&embedded, &model];
    for store in stores {
        for i in 0..40 {
            let c = Candidate::fact(format!("lesson number {i} about the build"), "t");
            store
                .write(&s, &[c], &WriteOptions::default())
                .expect("write");
        }
        for events in [vec![], vec![DecisionEvent::Evicted]] {
            let q = DecisionQuery {
                events,
                limit: 1000,
                ..DecisionQuery::default()
            };
            let all = store.decisions(&s, &q).expect("read");
            assert!(all.len() >= 35, "{} entries", all.len());
            for page in [1, 3, 7, 64] {
                assert_eq!(visited(store, &s, &q, page, usize::MAX), all, "page {page}");
                for stop in [1, 4, 9, all.len()] {
                    let seen = visited(store, &s, &q, page, stop);
                    assert_eq!(seen[..], all[..stop], "page {page}, stop {stop}");
                }
            }
            let capped = DecisionQuery { limit: 6, ..q };
            assert_eq!(visited(store, &s, &capped, 2, usize::MAX)[..], all[..6]);
        }
        let bad = DecisionQuery {
            limit: 0,
            ..DecisionQuery::default()
        };
        let err = store
            .visit_decisions(&s, &bad, 10, &mut |_| true)
            .expect_err("a limit of 0 is refused");
        assert!(err.to_string().contains("limit"), "{err}");
    }
}

/// A clock the test moves: the time it reads, and the store's clock reading it.
fn settable_clock() -> (std::sync::Arc<std::sync::atomic::AtomicI64>, lessons::Clock) {
    let now = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(1_795_424_400_000));
    let read = std::sync::Arc::clone(&now);
    let clock: lessons::Clock =
        std::sync::Arc::new(move || read.load(std::sync::atomic::Ordering::SeqCst));
    (now, clock)
}

#[test]
fn the_journal_is_pruned_by_age_and_cap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (now, clock) = settable_clock();
    let store = EmbeddedStore::builder()
        .clock(clock)
        .journal(2, 5)
        .index_commit(1, std::time::Duration::from_millis(20))
        .open(dir.path())
        .expect("open");
    let s = scope("repo:acme/app");
    for i in 0..8 {
        store
            .write(
                &s,
                &[Candidate::fact(format!("lesson {i}"), "t")],
                &WriteOptions::default(),
            )
            .expect("write");
    }
    let all = DecisionQuery {
        limit: 1000,
        ..DecisionQuery::default()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while store.decisions(&s, &all).expect("read").len() > 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "the cap was never applied"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let kept = store.decisions(&s, &all).expect("read");
    assert_eq!(kept.len(), 5);
    assert_eq!(kept[0].texts, ["lesson 7"], "the newest are kept");
    // Three days later every entry is older than the two days kept.
    now.fetch_add(3 * 86_400_000, std::sync::atomic::Ordering::SeqCst);
    store
        .write(
            &s,
            &[Candidate::fact("a new lesson", "t")],
            &WriteOptions::default(),
        )
        .expect("write");
    while store.decisions(&s, &all).expect("read").len() > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "old entries were never pruned"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        store.decisions(&s, &all).expect("read")[0].texts,
        ["a new lesson"]
    );
}

/// The decision-journal entries of `s` on disk, newest first, read with fjall itself.
fn stored_decisions(dir: &std::path::Path, s: &ScopeKey) -> usize {
    let db = fjall::Database::builder(dir.join("records"))
        .journal_compression(fjall::CompressionType::None)
        .open()
        .expect("raw fjall open");
    let ks = db
        .keyspace("decisions", fjall::KeyspaceCreateOptions::default)
        .expect("keyspace");
    let mut prefix = s.as_str().as_bytes().to_vec();
    prefix.push(0);
    ks.prefix(prefix).count()
}

#[test]
fn pruning_counts_each_scope_once_and_trims_it_from_its_oldest_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (now, clock) = settable_clock();
    let open = || {
        EmbeddedStore::builder()
            .clock(std::sync::Arc::clone(&clock))
            .journal(2, 48)
            .index_commit(1, std::time::Duration::from_millis(5))
            .open(dir.path())
            .expect("open")
    };
    let (s, quiet) = (scope("repo:acme/app"), scope("repo:acme/quiet"));
    let store = std::sync::Arc::new(open());
    let write = |store: &EmbeddedStore, s: &ScopeKey, text: String| {
        store
            .write(s, &[Candidate::fact(text, "t")], &WriteOptions::default())
            .expect("write");
    };
    write(&store, &quiet, "the only lesson here".into());
    for i in 0..10 {
        write(&store, &s, format!("early {i}"));
    }
    // Rounds of the pruner run between writes (an index commit after each): the first one
    // counts the scope, later ones trim it as four writers add to it at once.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (store, s) = (std::sync::Arc::clone(&store), s.clone());
            std::thread::spawn(move || {
                for i in 0..50 {
                    write(&store, &s, format!("writer {w} lesson {i}"));
                }
            })
        })
        .collect();
    // A read of one event, beside them, finds the cap's floor while the pruner trims: it
    // shows at most the cap, and the cap once the scope holds it.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (store, s, done) = (
            std::sync::Arc::clone(&store),
            s.clone(),
            std::sync::Arc::clone(&done),
        );
        std::thread::spawn(move || {
            let inserts = DecisionQuery {
                events: vec![lessons::DecisionEvent::Inserted],
                limit: 1000,
                ..DecisionQuery::default()
            };
            let mut full = false;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let shown = store.decisions(&s, &inserts).expect("read").len();
                assert!(
                    shown <= 48,
                    "a read of one event showed {shown} for a cap of 48"
                );
                assert!(
                    !full || shown == 48,
                    "{shown} shown after the cap was reached"
                );
                full |= shown == 48;
            }
        })
    };
    for w in writers {
        w.join().expect("writer");
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    reader.join().expect("reader");
    write(&store, &s, "the newest lesson".into());
    let all = DecisionQuery {
        limit: 1000,
        ..DecisionQuery::default()
    };
    let shown = store.decisions(&s, &all).expect("read");
    assert_eq!(shown.len(), 48, "a read shows the cap, whatever is on disk");
    assert_eq!(shown[0].texts, ["the newest lesson"]);
    // A read of one event hides the same entries: those past the cap-th newest of the scope.
    let inserts = DecisionQuery {
        events: vec![lessons::DecisionEvent::Inserted],
        ..all.clone()
    };
    assert_eq!(store.decisions(&s, &inserts).expect("read"), shown);
    let store = std::sync::Arc::into_inner(store).expect("one owner");
    store.close().expect("close");
    // Trimmed past a sixteenth over the cap, never under it: a count gone wrong would remove
    // entries the cap keeps, or leave the scope growing.
    let on_disk = stored_decisions(dir.path(), &s);
    assert!(
        (48..=51).contains(&on_disk),
        "{on_disk} entries on disk for a cap of 48"
    );
    assert_eq!(stored_decisions(dir.path(), &quiet), 1);

    // Three days on, every entry is past the two days kept. The clean close recorded each
    // scope's tally, so the first round after the open prunes both scopes by age without
    // counting them, the one not written since included.
    now.fetch_add(3 * 86_400_000, std::sync::atomic::Ordering::SeqCst);
    let store = open();
    assert!(
        store.decisions(&s, &all).expect("read").is_empty(),
        "a read hides what pruning will remove"
    );
    write(&store, &s, "a new lesson".into());
    store.close().expect("close");
    assert_eq!(stored_decisions(dir.path(), &s), 1);
    assert_eq!(stored_decisions(dir.path(), &quiet), 0);

    // A crash leaves the recorded tallies behind the journal: a store with a larger cap adds
    // 100 entries and crashes, and the next open must count the scope, not trust the tally
    // of 1 entry, so its first round trims it to exactly the cap.
    let big = EmbeddedStore::builder()
        .clock(std::sync::Arc::clone(&clock))
        .journal(2, 1000)
        .open(dir.path())
        .expect("open");
    for i in 0..100 {
        write(&big, &s, format!("before the crash {i}"));
    }
    big.close_as_crash();
    let store = open();
    write(&store, &s, "after the crash".into());
    store.close().expect("close");
    assert_eq!(stored_decisions(dir.path(), &s), 48);
}

#[test]
fn a_read_of_one_event_hides_what_lies_past_the_cap_before_any_prune() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, clock) = settable_clock();
    // An index commit (and with it a pruning round) only every hour: the journal stays over
    // its cap of 10 on disk for the whole test, and its count is never taken.
    let store = EmbeddedStore::builder()
        .clock(clock)
        .journal(2, 10)
        .index_commit(1_000_000, std::time::Duration::from_secs(3600))
        .open(dir.path())
        .expect("open");
    let s = scope("repo:acme/app");
    for i in 0..16 {
        let text = if i % 2 == 0 {
            format!("lesson {i}")
        } else {
            format!("PR {i} was merged")
        };
        store
            .write(&s, &[Candidate::fact(text, "t")], &WriteOptions::default())
            .expect("write");
    }
    let all = DecisionQuery {
        limit: 1000,
        ..DecisionQuery::default()
    };
    let shown = store.decisions(&s, &all).expect("read");
    assert_eq!(shown.len(), 10, "a read shows the cap");
    let inserts = DecisionQuery {
        events: vec![lessons::DecisionEvent::Inserted],
        ..all.clone()
    };
    let of_one = store.decisions(&s, &inserts).expect("read");
    assert_eq!(
        of_one, shown,
        "every entry is an insert: the same ten, newest first"
    );
    assert_eq!(of_one[0].texts, ["PR 15 was merged"]);
    assert_eq!(of_one[9].texts, ["lesson 6"]);
}

/// Between the pruner's rounds a counted scope holds up to a sixteenth more entries than its
/// cap. A read of some events shows only what the read of every event shows (the cap's newest),
/// of those events: after every write, with the pruner running between them.
#[test]
fn a_read_of_some_events_shows_the_caps_newest_between_prunes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, clock) = settable_clock();
    let store = EmbeddedStore::builder()
        .clock(clock)
        .journal(2, 32)
        .index_commit(1, std::time::Duration::from_millis(5))
        .open(dir.path())
        .expect("open");
    let s = scope("repo:acme/app");
    let all = DecisionQuery {
        limit: 1000,
        ..DecisionQuery::default()
    };
    for i in 0..120 {
        // An insert each write, and a rejection every third.
        let rejected = (i % 3 == 0)
            .then(|| lessons::decisions::RejectedFact {
                text: format!("pushed {i} at sha 3f9a2c1"),
                markers: vec!["sha".to_owned()],
            })
            .into_iter()
            .collect();
        let options = WriteOptions {
            rejected,
            ..WriteOptions::default()
        };
        store
            .write(&s, &[Candidate::fact(format!("lesson {i}"), "t")], &options)
            .expect("write");
        if i % 7 == 0 {
            // Let a pruning round or two pass.
            std::thread::sleep(std::time::Duration::from_millis(15));
        }
        let shown = store.decisions(&s, &all).expect("read");
        assert!(shown.len() <= 32, "{} shown", shown.len());
        for event in [DecisionEvent::Inserted, DecisionEvent::Rejected] {
            let of_one = DecisionQuery {
                events: vec![event],
                ..all.clone()
            };
            let expected: Vec<_> = shown.iter().filter(|d| d.event == event).cloned().collect();
            let read = store.decisions(&s, &of_one).expect("read");
            assert_eq!(read, expected, "write {i}, {event:?}");
        }
    }
    store.close().expect("close");
}
