//! The embedded store against the in-memory model under random operation sequences.
//!
//! Both stores get the same operations on the same fake clock; every answer must agree, and at
//! the end so must every record (exported). `tests/it/fts.rs` drives retrieve past the candidate
//! pool with many ties. Failures proptest shrinks
//! are kept under `proptest-regressions/` and replayed first on every run.

use std::time::Duration;

use lessons::model::Tally;
use lessons::{
    Candidate, Durability, EmbeddedStore, InMemoryStore, Kind, ListQuery, MemoryStore, Record,
    WriteOptions,
};
use proptest::prelude::*;

use crate::util::{exported, scope, FakeClock, T0};

const SCOPES: [&str; 3] = ["repo:acme/app", "org:acme", "user:slack:U7"];
const WORDS: [&str; 10] = [
    "npm ci",
    "license check",
    "PR 12 was merged",
    "vitest",
    "lockfile",
    "sha 3f9a2c1",
    "cache key",
    "Cache  Key",
    "the registry",
    "all green",
];

#[derive(Clone, Debug)]
struct Cand {
    summary: bool,
    words: Vec<usize>,
    /// Appended to the text: distinct texts let a scope grow past its window's 50 facts.
    tag: Option<u16>,
    restates: Option<(usize, u64)>,
    supersedes: Option<(usize, u64)>,
    confidence: Option<f64>,
}

#[derive(Clone, Debug)]
enum Op {
    Write {
        scope: usize,
        cands: Vec<Cand>,
        cap: usize,
    },
    Forget {
        scope: usize,
        target: (usize, u64),
    },
    Sweep {
        scope: usize,
        dry_run: bool,
    },
    Retrieve {
        scope: usize,
        words: Vec<usize>,
    },
    List {
        scope: usize,
        kind: Option<bool>,
        limit: usize,
    },
    Advance(i64),
    Reopen,
}

fn pointer() -> impl Strategy<Value = Option<(usize, u64)>> {
    prop::option::weighted(0.4, (0..3usize, 0..80u64))
}

fn cand() -> impl Strategy<Value = Cand> {
    (
        prop::bool::weighted(0.15),
        prop::collection::vec(0..WORDS.len(), 1..3),
        prop::option::weighted(0.5, 0..400u16),
        pointer(),
        pointer(),
        prop::option::of(0.0..=1.0f64),
    )
        .prop_map(
            |(summary, words, tag, restates, supersedes, confidence)| Cand {
                summary,
                words,
                tag,
                restates,
                supersedes,
                confidence,
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3usize, prop::collection::vec(cand(), 0..5), 2..10usize)
            .prop_map(|(scope, cands, cap)| Op::Write { scope, cands, cap }),
        // Scopes past the window's 50 facts: forgets, sweeps, supersedes and evictions then
        // take facts out of a full window, which must be filled from the records.
        4 => (prop::collection::vec(cand(), 10..25), 55..70usize)
            .prop_map(|(cands, cap)| Op::Write { scope: 0, cands, cap }),
        2 => (0..3usize, (0..3usize, 0..80u64)).prop_map(|(scope, target)| Op::Forget { scope, target }),
        1 => (0..3usize, any::<bool>()).prop_map(|(scope, dry_run)| Op::Sweep { scope, dry_run }),
        2 => (0..3usize, prop::collection::vec(0..WORDS.len(), 1..4))
            .prop_map(|(scope, words)| Op::Retrieve { scope, words }),
        2 => (0..3usize, prop::option::of(any::<bool>()), 1..50usize)
            .prop_map(|(scope, kind, limit)| Op::List { scope, kind, limit }),
        2 => (prop::option::of(any::<bool>()), 45..=50usize)
            .prop_map(|(kind, limit)| Op::List { scope: 0, kind, limit }),
        2 => (1..200_000_000i64).prop_map(Op::Advance),
        1 => Just(Op::Reopen),
    ]
}

fn id((s, seq): (usize, u64)) -> String {
    scope(SCOPES[s]).record_id(seq)
}

fn candidate(c: &Cand) -> Candidate {
    let mut text: Vec<String> = c.words.iter().map(|&w| WORDS[w].to_owned()).collect();
    if let Some(tag) = c.tag {
        text.push(format!("step {tag}"));
    }
    let mut out = if c.summary {
        Candidate::summary(text.join(" "), "thread")
    } else {
        Candidate::fact(text.join(" "), "thread")
    };
    out.restates = c.restates.map(id);
    out.supersedes = c.supersedes.map(id);
    out.confidence = c.confidence;
    out
}

fn by_id(mut records: Vec<Record>) -> Vec<Record> {
    records.sort_by(|a, b| a.id.cmp(&b.id));
    records
}

fn export(store: &dyn MemoryStore) -> Vec<Record> {
    by_id(exported(store))
}

/// A store with the default memory bounds: a scope's records are held for retrieve.
fn open(dir: &std::path::Path, clock: &FakeClock) -> EmbeddedStore {
    open_with(dir, clock, None)
}

/// `bytes`: a scope cache so small that nothing is held, so retrieve asks the keyword index and
/// every window is read from the records.
fn open_with(dir: &std::path::Path, clock: &FakeClock, bytes: Option<usize>) -> EmbeddedStore {
    let b = EmbeddedStore::builder();
    let b = match bytes {
        Some(bytes) => b.scope_cache(1, bytes),
        None => b,
    };
    b.clock(clock.clock())
        .durability(Durability::Buffered)
        .index_commit(4, Duration::from_millis(5))
        .open(dir)
        .expect("the store opens")
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().expect("dir");
    let clock = FakeClock::new(T0);
    let mut embedded = Some(open(dir.path(), &clock));
    let small_dir = tempfile::tempdir().expect("dir");
    let mut small = Some(open_with(small_dir.path(), &clock, Some(1)));
    let model = InMemoryStore::with_clock(clock.clock());
    for (step, op) in ops.iter().enumerate() {
        let e = embedded.as_ref().expect("open");
        let sm = small.as_ref().expect("open");
        match op {
            Op::Write {
                scope: s,
                cands,
                cap,
            } => {
                let cs: Vec<Candidate> = cands.iter().map(candidate).collect();
                let mut tally = Tally {
                    offered: cs.len() as u64 + 1,
                    ..Tally::default()
                };
                tally.rejected = 1;
                tally.rejected_by.insert("sha".into(), 1);
                let o = WriteOptions {
                    cap: Some(*cap),
                    tally: Some(tally),
                    rejected: Vec::new(),
                };
                let a = e
                    .write(&scope(SCOPES[*s]), &cs, &o)
                    .map_err(|e| e.to_string());
                let b = model
                    .write(&scope(SCOPES[*s]), &cs, &o)
                    .map_err(|e| e.to_string());
                let c = sm
                    .write(&scope(SCOPES[*s]), &cs, &o)
                    .map_err(|e| e.to_string());
                prop_assert_eq!(&a, &b, "step {}: {:?}", step, op);
                prop_assert_eq!(&c, &b, "step {} (small cache): {:?}", step, op);
            }
            Op::Forget { scope: s, target } => {
                let a = e.forget(&scope(SCOPES[*s]), &id(*target)).expect("forget");
                let b = model
                    .forget(&scope(SCOPES[*s]), &id(*target))
                    .expect("forget");
                let c = sm.forget(&scope(SCOPES[*s]), &id(*target)).expect("forget");
                prop_assert_eq!(a, b, "step {}: {:?}", step, op);
                prop_assert_eq!(c, b, "step {} (small cache): {:?}", step, op);
            }
            Op::Sweep { scope: s, dry_run } => {
                let a = e.sweep(&scope(SCOPES[*s]), *dry_run).expect("sweep");
                let b = model.sweep(&scope(SCOPES[*s]), *dry_run).expect("sweep");
                let c = sm.sweep(&scope(SCOPES[*s]), *dry_run).expect("sweep");
                prop_assert_eq!(&a, &b, "step {}: {:?}", step, op);
                prop_assert_eq!(&c, &b, "step {} (small cache): {:?}", step, op);
            }
            Op::Retrieve { scope: s, words } => {
                let q: Vec<&str> = words.iter().map(|&w| WORDS[w]).collect();
                let a = e
                    .retrieve(&scope(SCOPES[*s]), &q.join(" "), 50)
                    .expect("retrieve");
                let b = model
                    .retrieve(&scope(SCOPES[*s]), &q.join(" "), 50)
                    .expect("retrieve");
                let c = sm
                    .retrieve(&scope(SCOPES[*s]), &q.join(" "), 50)
                    .expect("retrieve");
                // Both embedded paths rank alike, order and ties included.
                prop_assert_eq!(&a, &c, "step {} (small cache): {:?}", step, op);
                prop_assert_eq!(by_id(a), by_id(b), "step {}: {:?}", step, op);
            }
            Op::List {
                scope: s,
                kind,
                limit,
            } => {
                let q = ListQuery {
                    limit: *limit,
                    kind: kind.map(|f| if f { Kind::Fact } else { Kind::Summary }),
                    query: None,
                };
                let a = e.list(&scope(SCOPES[*s]), &q).expect("list");
                let b = model.list(&scope(SCOPES[*s]), &q).expect("list");
                let c = sm.list(&scope(SCOPES[*s]), &q).expect("list");
                prop_assert_eq!(&a, &b, "step {}: {:?}", step, op);
                prop_assert_eq!(&c, &b, "step {} (small cache): {:?}", step, op);
            }
            Op::Advance(ms) => clock.advance(*ms),
            Op::Reopen => {
                embedded.take().expect("open").close().expect("close");
                embedded = Some(open(dir.path(), &clock));
                small.take().expect("open").close().expect("close");
                small = Some(open_with(small_dir.path(), &clock, Some(1)));
            }
        }
    }
    let e = embedded.take().expect("open");
    let sm = small.take().expect("open");
    prop_assert_eq!(export(&sm), export(&model));
    prop_assert!(sm.check().expect("check").is_ok());
    prop_assert_eq!(export(&e), export(&model));
    prop_assert_eq!(e.stats(0).expect("stats"), model.stats(0).expect("stats"));
    let health = e.check().expect("check");
    prop_assert!(health.is_ok(), "{:?}", health);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn embedded_store_agrees_with_the_model(ops in prop::collection::vec(op(), 1..40)) {
        run(&ops)?;
    }
}

#[test]
fn regression_restate_then_supersede_in_one_write() {
    let ops = [
        Op::Write {
            scope: 0,
            cands: vec![Cand {
                summary: false,
                words: vec![0],
                tag: None,
                restates: None,
                supersedes: None,
                confidence: Some(0.5),
            }],
            cap: 5,
        },
        Op::Write {
            scope: 0,
            cands: vec![
                Cand {
                    summary: false,
                    words: vec![1],
                    tag: None,
                    restates: Some((0, 0)),
                    supersedes: None,
                    confidence: Some(0.9),
                },
                Cand {
                    summary: false,
                    words: vec![0],
                    tag: None,
                    restates: None,
                    supersedes: Some((0, 0)),
                    confidence: None,
                },
                Cand {
                    summary: false,
                    words: vec![2],
                    tag: None,
                    restates: None,
                    supersedes: Some((0, 0)),
                    confidence: None,
                },
            ],
            cap: 2,
        },
        Op::Reopen,
        Op::Retrieve {
            scope: 0,
            words: vec![0, 2],
        },
    ];
    run(&ops).expect("agrees");
}
