//! The store's operations beside a SQLite + FTS5 baseline on the same data, in the same run.
//!
//! Data: 5 scopes × 500 active records (80% facts, ~320-character texts) plus 400 retired rows
//! each; and, for the window read, 1,000 scopes × 500 records (500,000; skip with
//! `LESSONS_BENCH_LARGE=0`). Retrieve is measured twice: from a scope whose records the store
//! holds for retrieve, and from the same records in a store whose scope cache is too small to
//! hold them (the keyword index and candidates read from fjall, as for the scopes past the
//! searches a cache holds). Criterion measures each operation; afterwards a latency table
//! (p50 / p99 over many samples, same method for both engines) prints the ratios (skip it with
//! `LESSONS_BENCH_TABLE=0`).
//!
//! The table starts with the bot's loop: a run's reflection writes to its scope, and the next
//! run reads that scope's window; only the read is timed, right after the write. A read with no
//! write between (the shared window's best case) is labelled as such. Then the cold open and
//! first window. Sustained durable writes at 200,000 and 1,000,000 records, with their tails and
//! the disk's floor, are `cargo bench --bench writes`.
//!
//! `cargo bench --bench store`

// A harness: a panic is its failure report (see Cargo.toml's lint policy).
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]
mod support;

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, BenchmarkId, Criterion};
use lessons::Clock;
use lessons::{
    Candidate, Durability, EmbeddedStore, ListQuery, MemoryStore, ScopeKey, WriteOptions,
};
use support::{brief, records, text, vocabulary, Rng, SqliteScope, NOW};

const SCOPES: usize = 5;
const ACTIVE: usize = 500;
const RETIRED: usize = 400;

fn scope(i: usize) -> ScopeKey {
    ScopeKey::parse(&format!("repo:acme/app{i}")).expect("valid")
}

fn clock() -> Clock {
    // A clock that moves, so recency and usage keys behave as in production.
    let start = Instant::now();
    Arc::new(move || NOW + start.elapsed().as_millis() as i64)
}

struct Fixture {
    _dir: tempfile::TempDir,
    lessons: EmbeddedStore,
    sqlite: Vec<SqliteScope>,
    briefs: Vec<String>,
}

fn fixture(durability: Durability) -> Fixture {
    let dir = tempfile::tempdir().expect("dir");
    let mut rng = Rng(0x5eed);
    let lessons = EmbeddedStore::builder()
        .durability(durability)
        .clock(clock())
        .open(dir.path().join("lessons"))
        .expect("open");
    let mut sqlite = Vec::new();
    for i in 0..SCOPES {
        let rs = records(&mut rng, &scope(i), ACTIVE, RETIRED);
        lessons.import(&rs).expect("import");
        let mut s = SqliteScope::open(&dir.path().join(format!("scope{i}.sqlite")), scope(i), true);
        s.load(&rs);
        sqlite.push(s);
    }
    lessons.flush().expect("flush");
    let words = vocabulary();
    let briefs = (0..64).map(|_| brief(&mut rng, &words, 400)).collect();
    Fixture {
        _dir: dir,
        lessons,
        sqlite,
        briefs,
    }
}

fn large_store(dir: &Path) -> EmbeddedStore {
    let store = EmbeddedStore::builder()
        .durability(Durability::Buffered)
        .open(dir)
        .expect("open");
    let mut rng = Rng(0xb16);
    for i in 0..1000 {
        let s = ScopeKey::parse(&format!("repo:org{}/app{i}", i % 37)).expect("valid");
        store
            .import(&records(&mut rng, &s, ACTIVE, 0))
            .expect("import");
    }
    store.flush().expect("flush");
    // Let background compaction absorb the bulk load, as it would in a store that has been
    // running: the measurement is the steady state, not the import's compaction debt.
    std::thread::sleep(Duration::from_secs(10));
    store
}

fn large_enabled() -> bool {
    std::env::var("LESSONS_BENCH_LARGE").map_or(true, |v| v != "0")
}

/// Four candidates as one reflection writes them: two new lessons, one restatement, one
/// duplicate of an existing text.
fn reflection(rng: &mut Rng, words: &[&str], s: &ScopeKey, existing_text: &str) -> Vec<Candidate> {
    vec![
        Candidate::fact(text(rng, words, 320), "bench"),
        Candidate::fact(text(rng, words, 320), "bench"),
        Candidate::fact("a paraphrase", "bench")
            .restating(s.record_id((RETIRED + rng.below(ACTIVE)) as u64)),
        Candidate::fact(existing_text, "bench"),
    ]
}

fn sqlite_reflection(c: &[Candidate]) -> Vec<(String, Option<String>)> {
    c.iter()
        .map(|c| (c.text.clone(), c.restates.clone()))
        .collect()
}

/// The 1,000 scope keys of [`large_store`], parsed once so a read's timing is the read's.
fn large_scopes() -> Vec<ScopeKey> {
    (0..1000)
        .map(|i| ScopeKey::parse(&format!("repo:org{}/app{i}", i % 37)).expect("valid"))
        .collect()
}

fn window_read(c: &mut Criterion) {
    let f = fixture(Durability::Sync);
    let scopes: Vec<ScopeKey> = (0..SCOPES).map(scope).collect();
    let mut g = c.benchmark_group("window_read");
    let mut i = 0;
    // The window as a run reads it: shared with the store, no record copied.
    g.bench_function(BenchmarkId::new("lessons", "2.5k"), |b| {
        b.iter(|| {
            i += 1;
            black_box(f.lessons.window(&scopes[i % SCOPES], 24).expect("window"))
        })
    });
    // The same records copied out as owned values (`list`).
    g.bench_function(BenchmarkId::new("lessons_list", "2.5k"), |b| {
        b.iter(|| {
            i += 1;
            black_box(
                f.lessons
                    .list(&scopes[i % SCOPES], &ListQuery::window(24))
                    .expect("list"),
            )
        })
    });
    g.bench_function(BenchmarkId::new("sqlite", "2.5k"), |b| {
        b.iter(|| {
            i += 1;
            black_box(f.sqlite[i % SCOPES].window(24))
        })
    });
    if large_enabled() {
        let dir = tempfile::tempdir().expect("dir");
        let big = large_store(dir.path());
        let keys = large_scopes();
        g.bench_function(BenchmarkId::new("lessons", "500k"), |b| {
            b.iter(|| {
                i += 1;
                black_box(big.window(&keys[i % 1000], 24).expect("window"))
            })
        });
    }
    g.finish();
}

/// The fixture's records in a store whose scope cache is too small to hold a scope's records
/// for retrieve (at most a sixteenth of 4 MiB each) but holds the rest of each scope's state:
/// a retrieve asks the keyword index and reads its candidates from fjall, as in a store with
/// more scopes than its cache holds searches for.
fn indexed_store(dir: &Path) -> EmbeddedStore {
    let mut rng = Rng(0x5eed);
    let store = EmbeddedStore::builder()
        .clock(clock())
        .scope_cache(SCOPES, 4 << 20)
        .open(dir)
        .expect("open");
    for i in 0..SCOPES {
        store
            .import(&records(&mut rng, &scope(i), ACTIVE, RETIRED))
            .expect("import");
    }
    store.flush().expect("flush");
    store
}

fn retrieve(c: &mut Criterion) {
    let mut f = fixture(Durability::Sync);
    let mut g = c.benchmark_group("retrieve_400_token_brief_limit_8");
    let mut i = 0;
    g.bench_function("lessons", |b| {
        b.iter(|| {
            i += 1;
            black_box(
                f.lessons
                    .retrieve(&scope(i % SCOPES), &f.briefs[i % 64], 8)
                    .expect("retrieve"),
            )
        })
    });
    let dir = tempfile::tempdir().expect("dir");
    let indexed = indexed_store(dir.path());
    g.bench_function("lessons_indexed", |b| {
        b.iter(|| {
            i += 1;
            black_box(
                indexed
                    .retrieve(&scope(i % SCOPES), &f.briefs[i % 64], 8)
                    .expect("retrieve"),
            )
        })
    });
    drop(indexed);
    g.bench_function("sqlite", |b| {
        b.iter(|| {
            i += 1;
            let brief = f.briefs[i % 64].clone();
            black_box(f.sqlite[i % SCOPES].retrieve(&brief, 8, NOW + i as i64))
        })
    });
    g.finish();
}

fn write_reflection(c: &mut Criterion) {
    let mut f = fixture(Durability::Sync);
    let words = vocabulary();
    let mut rng = Rng(7);
    let existing = "the license check fails on a resident tree; npm ci fixes it".to_owned();
    let mut g = c.benchmark_group("write_reflection_4_candidates_fsync");
    g.sample_size(30);
    let mut i = 0;
    g.bench_function("lessons", |b| {
        b.iter(|| {
            i += 1;
            let s = scope(i % SCOPES);
            let cs = reflection(&mut rng, &words, &s, &existing);
            black_box(
                f.lessons
                    .write(&s, &cs, &WriteOptions::default())
                    .expect("write"),
            )
        })
    });
    g.bench_function("sqlite_synchronous_full", |b| {
        b.iter(|| {
            i += 1;
            let s = scope(i % SCOPES);
            let cs = reflection(&mut rng, &words, &s, &existing);
            f.sqlite[i % SCOPES].write(&sqlite_reflection(&cs), NOW + i as i64, 500);
        })
    });
    g.finish();
}

fn open(c: &mut Criterion) {
    let f = fixture(Durability::Sync);
    let dir = f._dir.path().to_owned();
    drop(f.lessons);
    drop(f.sqlite);
    let mut g = c.benchmark_group("open_2.5k_records");
    g.sample_size(20);
    g.bench_function("lessons", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t = Instant::now();
                let s = EmbeddedStore::open(dir.join("lessons")).expect("open");
                total += t.elapsed();
                drop(s);
            }
            total
        })
    });
    g.bench_function("sqlite_5_scopes", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t = Instant::now();
                let dbs: Vec<SqliteScope> = (0..SCOPES)
                    .map(|i| {
                        SqliteScope::open(&dir.join(format!("scope{i}.sqlite")), scope(i), true)
                    })
                    .collect();
                total += t.elapsed();
                drop(dbs);
            }
            total
        })
    });
    g.finish();
}

// ---- the latency table ----

fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)];
    (at(0.50), at(0.99))
}

fn time(n: usize, mut f: impl FnMut(usize)) -> (Duration, Duration) {
    for i in 0..n / 10 {
        f(i);
    }
    let samples = (0..n)
        .map(|i| {
            let t = Instant::now();
            f(i);
            t.elapsed()
        })
        .collect();
    percentiles(samples)
}

/// Like [`time`], with `before(i)` run untimed ahead of each timed `f(i)`.
fn time_after(
    n: usize,
    mut before: impl FnMut(usize),
    mut f: impl FnMut(usize),
) -> (Duration, Duration) {
    let samples = (0..n)
        .map(|i| {
            before(i);
            let t = Instant::now();
            f(i);
            t.elapsed()
        })
        .collect();
    percentiles(samples)
}

fn us(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1.0 {
        format!("{us:.3} µs")
    } else {
        format!("{us:.1} µs")
    }
}

fn row(name: &str, ours: (Duration, Duration), base: (Duration, Duration)) {
    println!(
        "| {name} | {} / {} | {} / {} | {:.1}× / {:.1}× |",
        us(ours.0),
        us(ours.1),
        us(base.0),
        us(base.1),
        base.0.as_secs_f64() / ours.0.as_secs_f64(),
        base.1.as_secs_f64() / ours.1.as_secs_f64()
    );
}

/// The bot's loop, in the table's first rows: a reflection writes to a scope (durably, untimed)
/// and the window of that scope is read right after (timed).
fn bots_loop(f: &mut Fixture, words: &[&str], scopes: &[ScopeKey]) {
    let existing = "the license check fails on a resident tree; npm ci fixes it".to_owned();
    let mut rng = Rng(7);
    let lessons = &f.lessons;
    let ours = time_after(
        1_000,
        |i| {
            let cs = reflection(&mut rng, words, &scopes[i % SCOPES], &existing);
            lessons
                .write(&scopes[i % SCOPES], &cs, &WriteOptions::default())
                .expect("write");
        },
        |i| {
            black_box(lessons.window(&scopes[i % SCOPES], 24).expect("window"));
        },
    );
    let mut rng = Rng(8);
    let ours_list = time_after(
        1_000,
        |i| {
            let cs = reflection(&mut rng, words, &scopes[i % SCOPES], &existing);
            lessons
                .write(&scopes[i % SCOPES], &cs, &WriteOptions::default())
                .expect("write");
        },
        |i| {
            black_box(
                lessons
                    .list(&scopes[i % SCOPES], &ListQuery::window(24))
                    .expect("list"),
            );
        },
    );
    let mut rng = Rng(7);
    let sqlite = std::cell::RefCell::new(&mut f.sqlite);
    let base = time_after(
        1_000,
        |i| {
            let cs = reflection(&mut rng, words, &scopes[i % SCOPES], &existing);
            sqlite.borrow_mut()[i % SCOPES].write(&sqlite_reflection(&cs), NOW + i as i64, 500);
        },
        |i| {
            black_box(sqlite.borrow()[i % SCOPES].window(24));
        },
    );
    row(
        "**the bot's loop**: window read right after a write to its scope",
        ours,
        base,
    );
    row(
        "the bot's loop, the window copied out (`list`)",
        ours_list,
        base,
    );
}

fn latency_table() {
    println!(
        "\nLatency, p50 / p99 (same data, same run); ratio = SQLite ÷ lessons, higher is better\n"
    );
    println!("| operation | lessons | SQLite + FTS5 | ratio |");
    println!("|---|---|---|---|");
    let mut f = fixture(Durability::Sync);
    let words = vocabulary();
    let scopes: Vec<ScopeKey> = (0..SCOPES).map(scope).collect();
    bots_loop(&mut f, &words, &scopes);
    let win = time(20_000, |i| {
        black_box(f.lessons.window(&scopes[i % SCOPES], 24).expect("window"));
    });
    let win_list = time(20_000, |i| {
        black_box(
            f.lessons
                .list(&scopes[i % SCOPES], &ListQuery::window(24))
                .expect("list"),
        );
    });
    let win_sql = time(20_000, |i| {
        black_box(f.sqlite[i % SCOPES].window(24));
    });
    row(
        "window read with no write between (shared; the cache's best case)",
        win,
        win_sql,
    );
    row(
        "window copied out (`list`), no write between",
        win_list,
        win_sql,
    );
    let briefs = f.briefs.clone();
    let ret = time(3_000, |i| {
        black_box(
            f.lessons
                .retrieve(&scope(i % SCOPES), &briefs[i % 64], 8)
                .expect("retrieve"),
        );
    });
    let ret_sql = time(3_000, |i| {
        black_box(f.sqlite[i % SCOPES].retrieve(&briefs[i % 64], 8, NOW + i as i64));
    });
    row("retrieve (400-token brief, limit 8)", ret, ret_sql);
    let dir = tempfile::tempdir().expect("dir");
    let indexed = indexed_store(dir.path());
    let ret_indexed = time(3_000, |i| {
        black_box(
            indexed
                .retrieve(&scope(i % SCOPES), &briefs[i % 64], 8)
                .expect("retrieve"),
        );
    });
    drop(indexed);
    row(
        "retrieve, the scope's records not held (the keyword index, candidates from fjall)",
        ret_indexed,
        ret_sql,
    );
    let mut rng = Rng(11);
    let existing = "the license check fails on a resident tree; npm ci fixes it".to_owned();
    let wr = time(2_000, |i| {
        let s = scope(i % SCOPES);
        let cs = reflection(&mut rng, &words, &s, &existing);
        f.lessons
            .write(&s, &cs, &WriteOptions::default())
            .expect("write");
    });
    let wr_sql = time(2_000, |i| {
        let s = scope(i % SCOPES);
        let cs = reflection(&mut rng, &words, &s, &existing);
        f.sqlite[i % SCOPES].write(&sqlite_reflection(&cs), NOW + i as i64, 500);
    });
    row(
        "durable write of one reflection (4 candidates, fsync)",
        wr,
        wr_sql,
    );
    drop(f);
    // A fresh 2,500-record store: the writes above grew the journal that open replays.
    let f = fixture(Durability::Sync);
    let dir = f._dir.path().to_owned();
    drop(f.lessons);
    drop(f.sqlite);
    // Open only: each store is closed outside the timed part.
    let mut samples = Vec::new();
    for _ in 0..30 {
        let t = Instant::now();
        let s = EmbeddedStore::open(dir.join("lessons")).expect("open");
        samples.push(t.elapsed());
        drop(s);
    }
    let op = percentiles(samples);
    let op_sql = time(30, |_| {
        let dbs: Vec<SqliteScope> = (0..SCOPES)
            .map(|i| SqliteScope::open(&dir.join(format!("scope{i}.sqlite")), scope(i), true))
            .collect();
        drop(dbs);
    });
    row("open (2,500 active records)", op, op_sql);
    // A run's first read of a store just opened: open and the first window, timed together.
    let mut samples = Vec::new();
    for i in 0..30 {
        let t = Instant::now();
        let s = EmbeddedStore::open(dir.join("lessons")).expect("open");
        black_box(s.window(&scope(i % SCOPES), 24).expect("window"));
        samples.push(t.elapsed());
        drop(s);
    }
    let cold = percentiles(samples);
    let cold_sql = time(30, |i| {
        let path = dir.join(format!("scope{}.sqlite", i % SCOPES));
        let db = SqliteScope::open(&path, scope(i % SCOPES), true);
        black_box(db.window(24));
        drop(db);
    });
    row(
        "cold open + first window read (2,500 records)",
        cold,
        cold_sql,
    );

    // Throughput: 8 writer threads, each on its own scope, durable writes.
    let threads = 8;
    let per_thread = 250;
    let tdir = tempfile::tempdir().expect("dir");
    let store = Arc::new(
        EmbeddedStore::builder()
            .clock(clock())
            .open(tdir.path().join("lessons"))
            .expect("open"),
    );
    let t = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|k| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let words = vocabulary();
                let mut rng = Rng(100 + k as u64);
                let s = ScopeKey::parse(&format!("repo:acme/writer{k}")).expect("valid");
                for _ in 0..per_thread {
                    let cs = reflection(&mut rng, &words, &s, "the same lesson again");
                    store
                        .write(&s, &cs, &WriteOptions::default())
                        .expect("write");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("writer");
    }
    let ours = (threads * per_thread) as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|k| {
            let path = tdir.path().join(format!("w{k}.sqlite"));
            std::thread::spawn(move || {
                let words = vocabulary();
                let mut rng = Rng(100 + k as u64);
                let s = ScopeKey::parse(&format!("repo:acme/writer{k}")).expect("valid");
                let mut db = SqliteScope::open(&path, s.clone(), true);
                for i in 0..per_thread {
                    let cs = reflection(&mut rng, &words, &s, "the same lesson again");
                    db.write(&sqlite_reflection(&cs), NOW + i as i64, 500);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("writer");
    }
    let base = (threads * per_thread) as f64 / t.elapsed().as_secs_f64();
    println!(
        "| durable reflections/s, 8 writer threads | {ours:.0}/s | {base:.0}/s | {:.1}× |",
        ours / base
    );

    if large_enabled() {
        let ldir = tempfile::tempdir().expect("dir");
        let big = large_store(ldir.path());
        let keys = large_scopes();
        let w = time(20_000, |i| {
            black_box(big.window(&keys[i % 1000], 24).expect("window"));
        });
        println!(
            "| window read at 500,000 records (1,000 scopes) | {} / {} | — | {:.2}× the 2,500-record p50 |",
            us(w.0),
            us(w.1),
            w.0.as_secs_f64() / win.0.as_secs_f64()
        );
        // The same five-scope cycle as the 2,500-record row: what the store's size costs, apart
        // from how many distinct scopes' windows the reads touch.
        let w5 = time(20_000, |i| {
            black_box(big.window(&keys[i % SCOPES], 24).expect("window"));
        });
        println!(
            "| window read at 500,000 records, 5 scopes cycled as above | {} / {} | — | {:.2}× the 2,500-record p50 |",
            us(w5.0),
            us(w5.1),
            w5.0.as_secs_f64() / win.0.as_secs_f64()
        );
        let wl = time(20_000, |i| {
            black_box(
                big.list(&keys[i % 1000], &ListQuery::window(24))
                    .expect("list"),
            );
        });
        println!(
            "| window copied out at 500,000 records | {} / {} | — | {:.2}× the 2,500-record p50 |",
            us(wl.0),
            us(wl.1),
            wl.0.as_secs_f64() / win_list.0.as_secs_f64()
        );
    }
}

criterion_group!(benches, window_read, retrieve, write_reflection, open);

fn main() {
    benches();
    // LESSONS_BENCH_TABLE=0 skips the latency table (when running one criterion benchmark).
    if std::env::var("LESSONS_BENCH_TABLE").map_or(true, |v| v != "0") {
        latency_table();
    }
    Criterion::default().configure_from_args().final_summary();
}
