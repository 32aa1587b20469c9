//! Scopes apart: isolated records, counters per scope per day, active counts, and exports
//! that give every scope's records once.

use lessons::model::Tally;
use lessons::{
    Candidate, Durability, EmbeddedStore, InMemoryStore, ListQuery, MemoryStore, Status,
    WriteOptions,
};

use super::{each, opts};
use crate::util::{fact_record, scope, T0};

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
