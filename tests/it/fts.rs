//! The retrieve prefilter against its oracle: the bundled SQLite's FTS5, set up as the reference
//! Worker sets it up. Random texts and queries must give the same tokens, and the same candidate
//! pool in the same order, ties included.

use lessons::internals::fts::{for_each_fts_token, match_terms, pool, pool_size};
use proptest::prelude::*;
use rusqlite::Connection;

/// Characters worth mixing: ASCII, Latin letters with and without diacritics, combining marks,
/// other scripts, symbols, private use, the Kelvin sign and a dotted capital I.
fn alphabet() -> Vec<char> {
    let mut chars: Vec<char> = "abcdeABCDE0123 -_.,'\"()\t\n".chars().collect();
    chars.extend("éÉèçÇñÑøØåÅæßÿŁłœĞğİıǅǲ".chars());
    chars.extend(['\u{301}', '\u{308}', '\u{327}', '\u{350}', '\u{20DD}']);
    chars.extend("日本語한국어עבריתΑβγЖжж".chars());
    chars.extend([
        '🎉', '\u{E000}', '\u{F8FF}', '\u{212A}', '\u{FF21}', '\u{200B}', '\u{FEFF}', '\u{A0}',
        '²', '½', '٣',
    ]);
    chars
}

fn text_strategy(max: usize) -> impl Strategy<Value = String> {
    let chars = alphabet();
    prop::collection::vec(prop::sample::select(chars), 0..max).prop_map(|v| v.into_iter().collect())
}

/// SQLite's terms for `text`, as ours: `Some` for an all-ASCII-alphanumeric term.
fn sqlite_tokens(db: &Connection, text: &str) -> Vec<Option<String>> {
    db.execute("DELETE FROM t", []).expect("clear");
    db.execute("INSERT INTO t(rowid, body) VALUES (1, ?1)", [text])
        .expect("insert");
    let mut q = db
        .prepare_cached("SELECT term FROM v ORDER BY offset")
        .expect("prepare");
    let rows = q.query_map([], |r| r.get::<_, String>(0)).expect("query");
    rows.map(|t| {
        let t = t.expect("row");
        t.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            .then_some(t)
    })
    .collect()
}

fn ours(text: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for_each_fts_token(text, |t| out.push(t.map(str::to_owned)));
    out
}

#[test]
fn tokens_are_sqlites_for_every_plane_sample() {
    let db = Connection::open_in_memory().expect("sqlite");
    db.execute_batch(
        "CREATE VIRTUAL TABLE t USING fts5(body);
         CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance');",
    )
    .expect("schema");
    // Every 97th code point (the generator saw them all), three ways: alone, inside a token, after one.
    for cp in (1..=0x10_FFFFu32).step_by(97) {
        let Some(c) = char::from_u32(cp) else {
            continue;
        };
        for text in [format!("{c}"), format!("a{c}b"), format!("a {c}")] {
            assert_eq!(
                ours(&text),
                sqlite_tokens(&db, &text),
                "U+{cp:04X} in {text:?}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn tokens_match_sqlite_on_mixed_text(text in text_strategy(40)) {
        let db = Connection::open_in_memory().expect("sqlite");
        db.execute_batch(
            "CREATE VIRTUAL TABLE t USING fts5(body);
             CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance');",
        ).expect("schema");
        prop_assert_eq!(ours(&text), sqlite_tokens(&db, &text));
    }
}

/// One step of a scope's history: insert a record, or retire the `n`-th active one.
#[derive(Clone, Debug)]
enum Step {
    Insert { text: String, keywords: Vec<String> },
    Retire(usize),
}

fn words() -> impl Strategy<Value = String> {
    // A small vocabulary, so terms repeat and scores tie; diacritics and case on purpose.
    prop::sample::select(vec![
        "cache",
        "Cache",
        "café",
        "cafe",
        "build",
        "npm",
        "ci",
        "test",
        "tests",
        "naïve",
        "x",
        "bazel",
        "the",
        "a",
        "日本",
        "🎉",
        "build-cache",
        "NPM_ci",
        "e\u{301}t\u{e9}",
    ])
    .prop_map(str::to_owned)
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (prop::collection::vec(words(), 1..8), prop::collection::vec(words(), 0..3))
            .prop_map(|(w, k)| Step::Insert { text: w.join(" "), keywords: k }),
        1 => (0usize..100).prop_map(Step::Retire),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn the_pool_is_sqlites_bm25_order(
        steps in prop::collection::vec(step(), 1..90),
        query in prop::collection::vec(words(), 1..6),
        limit in 1usize..12,
    ) {
        let query = query.join(" ");
        let db = Connection::open_in_memory().expect("sqlite");
        // The reference Worker's tables, as far as the prefilter reads them.
        db.execute_batch(
            "CREATE TABLE records (id TEXT PRIMARY KEY, seq INTEGER NOT NULL, status TEXT NOT NULL);
             CREATE VIRTUAL TABLE records_fts USING fts5(id UNINDEXED, body);",
        ).expect("schema");
        let mut active: Vec<(u64, String, Vec<String>)> = Vec::new();
        for (seq, s) in steps.iter().enumerate() {
            match s {
                Step::Insert { text, keywords } => {
                    let id = format!("mem:org:a:{seq}");
                    db.execute("INSERT INTO records (id, seq, status) VALUES (?1, ?2, 'active')",
                        rusqlite::params![id, seq as i64]).expect("insert");
                    db.execute("INSERT INTO records_fts (id, body) VALUES (?1, ?2)",
                        rusqlite::params![id, format!("{text} {}", keywords.join(" "))]).expect("insert fts");
                    active.push((seq as u64, text.clone(), keywords.clone()));
                }
                Step::Retire(n) if !active.is_empty() => {
                    let (seq, _, _) = active.remove(n % active.len());
                    let id = format!("mem:org:a:{seq}");
                    db.execute("UPDATE records SET status = 'superseded' WHERE id = ?1", [&id]).expect("retire");
                    db.execute("DELETE FROM records_fts WHERE id = ?1", [&id]).expect("delete fts");
                }
                Step::Retire(_) => {}
            }
        }
        let terms = match_terms(&query);
        let want: Vec<u64> = if terms.is_empty() {
            Vec::new()
        } else {
            let expr = terms.iter().map(|t| format!("\"{t}\"")).collect::<Vec<_>>().join(" OR ");
            let mut q = db.prepare(
                "SELECT r.seq FROM records r
                   JOIN records_fts f ON f.id = r.id
                  WHERE r.status = 'active' AND records_fts MATCH ?1
                  ORDER BY bm25(records_fts)
                  LIMIT ?2",
            ).expect("prepare");
            let rows = q
                .query_map(rusqlite::params![expr, pool_size(limit) as i64], |r| r.get::<_, i64>(0))
                .expect("query");
            rows.map(|r| r.expect("row") as u64).collect()
        };
        let got = pool(
            active.iter().map(|(seq, t, k)| (*seq, t.as_str(), k.as_slice())),
            &terms,
            pool_size(limit),
        );
        prop_assert_eq!(got, want, "query {:?}", query);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// The embedded store's indexed path (committed index, staged writes, per-scope totals kept
    /// by every commit) answers exactly as the in-memory store's scan of every record, with
    /// scopes past the 50-candidate pool and many equal scores.
    #[test]
    fn the_embedded_retrieve_is_the_scans(
        texts in prop::collection::vec(prop::collection::vec(words(), 1..6), 60..140),
        forget in prop::collection::vec(0usize..140, 0..20),
        queries in prop::collection::vec(prop::collection::vec(words(), 1..4), 1..6),
        limit in 1usize..14,
    ) {
        use lessons::{Candidate, EmbeddedStore, InMemoryStore, MemoryStore, WriteOptions};
        let clock = crate::util::FakeClock::new(crate::util::T0);
        let dir = tempfile::tempdir().expect("dir");
        let embedded = EmbeddedStore::builder()
            .clock(clock.clock())
            .durability(lessons::Durability::Buffered)
            .index_commit(7, std::time::Duration::from_secs(3600))
            .open(dir.path())
            .expect("open");
        let memory = InMemoryStore::with_clock(clock.clock());
        let scope = crate::util::scope("repo:acme/app");
        let stores: [&dyn MemoryStore; 2] = [&embedded, &memory];
        for (i, words) in texts.iter().enumerate() {
            // Distinct texts (a number each), so nothing deduplicates; equal lengths tie.
            let c = Candidate::fact(format!("{} n{}", words.join(" "), i % 3), "t");
            let c = Candidate { text: format!("{} {i}", c.text), ..c };
            for s in stores {
                s.write(&scope, std::slice::from_ref(&c), &WriteOptions::default()).expect("write");
            }
            clock.advance(1_000);
        }
        for f in forget {
            let id = scope.record_id(f as u64);
            for s in stores {
                s.forget(&scope, &id).expect("forget");
            }
        }
        for q in queries {
            let q = q.join(" ");
            let a = embedded.retrieve(&scope, &q, limit).expect("retrieve");
            let b = memory.retrieve(&scope, &q, limit).expect("retrieve");
            let ids = |v: &[lessons::Record]| v.iter().map(|r| r.id.clone()).collect::<Vec<_>>();
            prop_assert_eq!(ids(&a), ids(&b), "query {:?}", q);
            prop_assert_eq!(a, b);
            clock.advance(10);
        }
    }
}
