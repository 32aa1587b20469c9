//! The window: the newest facts of a scope, kept as every change to the scope happens and
//! filled again from the records when facts leave it; a list never bumps a use.

use lessons::{Candidate, Kind, ListQuery, MemoryStore, Status, WriteOptions};

use super::{each, opts, texts};
use crate::util::scope;

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
