//! Scale and footprint beside SQLite + FTS5 on the same records: bytes on disk per active
//! record, sustained durable writes per second over a large store while compaction runs, and
//! the process's resident memory as the store is written and then read across every scope.
//!
//! `cargo run --release --example scale -- [RECORDS] [SCOPES] [SECONDS] [THREADS] [DIR]`
//! (defaults: 1,000,000 records in 2,000 scopes, 60-second phases, 8 writer threads, a temporary
//! directory). The SQLite side is the reference Worker's layout: one database per scope with its
//! schema, `synchronous=FULL`, the same records and the same reflections; it keeps every scope's
//! database open (three descriptors each), so `ulimit -n` must allow that.

// A harness: a panic is its failure report (see Cargo.toml's lint policy).
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]
#[path = "../benches/support/mod.rs"]
mod support;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lessons::{Candidate, Durability, EmbeddedStore, MemoryStore, ScopeKey, WriteOptions};
use support::{brief, records, text, vocabulary, Rng, SqliteScope, NOW};

/// What one phase of writes did: per-interval rates, the overall rate, latency percentiles.
struct Report {
    intervals: Vec<f64>,
    total: f64,
    p50: Duration,
    p99: Duration,
}

/// The run's shape, passed from the parent to each child on the command line.
#[derive(Clone, Copy)]
struct Shape {
    total: usize,
    scopes: usize,
    seconds: usize,
    threads: usize,
}

impl Shape {
    fn per_scope(self) -> usize {
        self.total / self.scopes
    }

    fn phase(self) -> Duration {
        Duration::from_secs(self.seconds as u64)
    }

    fn keys(self) -> Vec<ScopeKey> {
        (0..self.scopes)
            .map(|i| ScopeKey::parse(&format!("repo:org{}/app{i}", i % 37)).expect("valid"))
            .collect()
    }
}

/// The allocator the `lessons` binary runs on (see `lessons::allocator`), so the resident sizes
/// are a server's; `--no-default-features` measures the system allocator.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Each engine runs in its own child process, so a resident size is that engine's alone and
/// the writes start from a store opened fresh, as a restarted server's would.
fn main() {
    #[cfg(feature = "jemalloc")]
    for refused in lessons::allocator::tune() {
        eprintln!("jemalloc refused {refused}");
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [mode, dir, nums @ ..] = args.as_slice() {
        if let Some(mode) = mode.strip_prefix("--child=") {
            let n: Vec<usize> = nums.iter().map(|a| a.parse().expect("number")).collect();
            let shape = Shape {
                total: n[0],
                scopes: n[1],
                seconds: n[2],
                threads: n[3],
            };
            return child(mode, Path::new(dir), shape);
        }
    }
    let num =
        |i: usize, default: usize| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let shape = Shape {
        total: num(0, 1_000_000),
        scopes: num(1, 2_000),
        seconds: num(2, 60),
        threads: num(3, 8),
    };
    let tmp = tempfile::tempdir().expect("temporary directory");
    let dir = args
        .get(4)
        .map_or_else(|| tmp.path().to_path_buf(), std::path::PathBuf::from);
    println!(
        "{} records: {} scopes × {} active; {} writer threads; {}-second phases",
        shape.total,
        shape.scopes,
        shape.per_scope(),
        shape.threads,
        shape.seconds
    );
    let mut results = Vec::new();
    for mode in ["load", "lessons", "sqlite"] {
        let out = std::process::Command::new(std::env::current_exe().expect("own path"))
            .arg(format!("--child={mode}"))
            .arg(&dir)
            .args([shape.total, shape.scopes, shape.seconds, shape.threads].map(|n| n.to_string()))
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("child runs");
        let text = String::from_utf8_lossy(&out.stdout);
        for line in text.lines() {
            match line.strip_prefix("RESULT ") {
                Some(r) => results.push(r.to_owned()),
                None => println!("{line}"),
            }
        }
        assert!(out.status.success(), "the {mode} child failed");
    }
    let get = |name: &str| -> serde_json::Value {
        results
            .iter()
            .filter_map(|r| serde_json::from_str::<serde_json::Value>(r).ok())
            .find(|v| v["name"] == name)
            .unwrap_or_default()
    };
    let (load, ours, base) = (get("load"), get("lessons"), get("sqlite"));
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let total = shape.total as f64;
    println!("\n| measure | lessons | SQLite + FTS5 | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| on disk after the load, per active record | {} ({:.0} B) | {} ({:.0} B) | {:.1}× |",
        mb(f(&load, "lessons_bytes") as u64),
        f(&load, "lessons_bytes") / total,
        mb(f(&load, "sqlite_bytes") as u64),
        f(&load, "sqlite_bytes") / total,
        f(&load, "sqlite_bytes") / f(&load, "lessons_bytes")
    );
    println!(
        "| sustained durable reflections/s, {} threads, {} s | {:.0}/s | {:.0}/s | {:.1}× |",
        shape.threads,
        shape.seconds,
        f(&ours, "rate"),
        f(&base, "rate"),
        f(&ours, "rate") / f(&base, "rate")
    );
    println!(
        "| per 10-second interval | {} | {} | |",
        ours["intervals"].as_str().unwrap_or(""),
        base["intervals"].as_str().unwrap_or("")
    );
    println!(
        "| write latency p50 / p99 | {:.2} / {:.2} ms | {:.2} / {:.2} ms | |",
        f(&ours, "p50_ms"),
        f(&ours, "p99_ms"),
        f(&base, "p50_ms"),
        f(&base, "p99_ms")
    );
    println!(
        "| on disk after the writes | {} | {} | {:.1}× |",
        mb(f(&ours, "bytes_after") as u64),
        mb(f(&base, "bytes_after") as u64),
        f(&base, "bytes_after") / f(&ours, "bytes_after")
    );
    println!(
        "| resident: after open; after the writes; during reads over every scope | {} | {} | |",
        ours["resident"].as_str().unwrap_or(""),
        base["resident"].as_str().unwrap_or("")
    );
}

fn child(mode: &str, dir: &Path, shape: Shape) {
    let keys = shape.keys();
    let words = vocabulary();
    let sqlite_path = |i: usize| dir.join("sqlite").join(format!("s{i}.sqlite"));
    match mode {
        // Both engines get the same records, scope by scope.
        "load" => {
            let t = Instant::now();
            let store = EmbeddedStore::builder()
                .durability(Durability::Buffered)
                .open(dir.join("lessons"))
                .expect("open");
            std::fs::create_dir_all(dir.join("sqlite")).expect("dir");
            let mut rng = Rng(0x5ca1e);
            for (i, key) in keys.iter().enumerate() {
                let rs = records(&mut rng, key, shape.per_scope(), 0);
                store.import(&rs).expect("import");
                let mut db = SqliteScope::open(&sqlite_path(i), key.clone(), true);
                db.load(&rs);
                db.checkpoint();
            }
            store.flush().expect("flush");
            drop(store);
            println!("loaded both in {:.0} s", t.elapsed().as_secs_f64());
            let result = serde_json::json!({
                "name": "load",
                "lessons_bytes": bytes(&dir.join("lessons")),
                "sqlite_bytes": bytes(&dir.join("sqlite")),
            });
            println!("RESULT {result}");
        }
        "lessons" => {
            let t = Instant::now();
            let store = Arc::new(
                EmbeddedStore::builder()
                    .durability(Durability::Sync)
                    .open(dir.join("lessons"))
                    .expect("open"),
            );
            let opened = rss();
            println!(
                "lessons: opened in {:.0} ms, resident {}",
                t.elapsed().as_secs_f64() * 1e3,
                mb(opened)
            );
            let report = {
                let (store, keys, words) = (Arc::clone(&store), keys.clone(), words.clone());
                drive("lessons", shape, move |k, i| {
                    let mut rng = Rng(((k as u64) << 32) | i as u64 | 1);
                    let key = &keys[rng.below(keys.len())];
                    let cs = reflection(&mut rng, &words, key, shape.per_scope());
                    store
                        .write(key, &cs, &WriteOptions::default())
                        .expect("write");
                })
            };
            let written = rss();
            let reads = read_everywhere(&store, &keys, &words, shape.phase());
            let resident = format!("{}; {}; {}", mb(opened), mb(written), reads);
            report.print("lessons", bytes(&dir.join("lessons")), &resident);
        }
        "sqlite" => {
            let dbs: Arc<Vec<Mutex<SqliteScope>>> = Arc::new(
                keys.iter()
                    .enumerate()
                    .map(|(i, k)| Mutex::new(SqliteScope::open(&sqlite_path(i), k.clone(), true)))
                    .collect(),
            );
            let opened = rss();
            let report = {
                let (dbs, keys, words) = (Arc::clone(&dbs), keys.clone(), words.clone());
                drive("sqlite", shape, move |k, i| {
                    let mut rng = Rng(((k as u64) << 32) | i as u64 | 1);
                    let s = rng.below(keys.len());
                    let cs: Vec<(String, Option<String>)> =
                        reflection(&mut rng, &words, &keys[s], shape.per_scope())
                            .into_iter()
                            .map(|c| (c.text, c.restates))
                            .collect();
                    let mut db = dbs[s].lock().expect("scope database");
                    db.write(&cs, NOW + i as i64, 500);
                })
            };
            let resident = format!("{}; {}", mb(opened), mb(rss()));
            report.print("sqlite", bytes(&dir.join("sqlite")), &resident);
        }
        other => panic!("unknown child mode {other}"),
    }
}

/// Window reads and retrieves over every scope on two threads for `phase`: the resident size
/// sampled six times, to show whether it levels off or follows the reads.
fn read_everywhere(
    store: &Arc<EmbeddedStore>,
    keys: &[ScopeKey],
    words: &[&'static str],
    phase: Duration,
) -> String {
    let briefs: Vec<String> = {
        let mut rng = Rng(0xb1ef);
        (0..64).map(|_| brief(&mut rng, words, 400)).collect()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..2)
        .map(|k| {
            let (store, keys, briefs) = (Arc::clone(store), keys.to_vec(), briefs.clone());
            let (stop, reads) = (Arc::clone(&stop), Arc::clone(&reads));
            std::thread::spawn(move || {
                let mut i = k;
                while !stop.load(Ordering::Relaxed) {
                    let key = &keys[i % keys.len()];
                    std::hint::black_box(store.window(key, 24).expect("window"));
                    std::hint::black_box(
                        store
                            .retrieve(key, &briefs[i % briefs.len()], 8)
                            .expect("retrieve"),
                    );
                    reads.fetch_add(1, Ordering::Relaxed);
                    i += 2;
                }
            })
        })
        .collect();
    let mut samples = Vec::new();
    let t = Instant::now();
    while t.elapsed() < phase {
        std::thread::sleep(phase / 6);
        let m = store.memory().expect("the embedded store reports it");
        let line = format!(
            "{} after {} reads ({} anonymous, {} file-backed: the index's mapped pages; heap {}; held: scope map {} of {}, block cache {}, memtables {})",
            mb(rss()),
            reads.load(Ordering::Relaxed),
            mb(status_kb("RssAnon:") * 1024),
            mb(status_kb("RssFile:") * 1024),
            heap(),
            mb(m.scope_map),
            mb(m.scope_map_budget),
            mb(m.block_cache),
            mb(m.memtables)
        );
        println!("lessons reads: {line}");
        samples.push(line);
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("reader");
    }
    samples.join(", ")
}

impl Report {
    /// The `RESULT` line the parent reads for an engine's write phase.
    fn print(&self, name: &str, bytes_after: u64, resident: &str) {
        let result = serde_json::json!({
            "name": name,
            "rate": self.total,
            "intervals": rates(&self.intervals),
            "p50_ms": ms(self.p50),
            "p99_ms": ms(self.p99),
            "bytes_after": bytes_after,
            "resident": resident,
        });
        println!("RESULT {result}");
    }
}

/// One reflection as extractors write them: two new lessons, a restatement of an existing
/// record, a near-duplicate.
fn reflection(rng: &mut Rng, words: &[&str], s: &ScopeKey, per_scope: usize) -> Vec<Candidate> {
    vec![
        Candidate::fact(text(rng, words, 320), "scale"),
        Candidate::fact(text(rng, words, 320), "scale"),
        Candidate::fact("a paraphrase", "scale")
            .restating(s.record_id(rng.below(per_scope) as u64)),
        Candidate::fact(
            "the license check fails on a resident tree; npm ci fixes it",
            "scale",
        ),
    ]
}

/// Runs `op` on `threads` threads for `phase`, printing the rate every 10 seconds.
fn drive(name: &str, shape: Shape, op: impl Fn(usize, usize) + Send + Sync + 'static) -> Report {
    let (threads, phase) = (shape.threads, shape.phase());
    let op = Arc::new(op);
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..threads)
        .map(|k| {
            let (op, done, stop) = (Arc::clone(&op), Arc::clone(&done), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut lat = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    op(k, i);
                    lat.push(t.elapsed());
                    done.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
                lat
            })
        })
        .collect();
    let t = Instant::now();
    let mut intervals = Vec::new();
    let mut last = 0;
    while t.elapsed() < phase {
        std::thread::sleep(Duration::from_secs(10).min(phase));
        let now = done.load(Ordering::Relaxed);
        intervals.push((now - last) as f64 / 10.0);
        println!(
            "{name}: {:.0}/s, resident {}",
            (now - last) as f64 / 10.0,
            mb(rss())
        );
        last = now;
    }
    stop.store(true, Ordering::Relaxed);
    let mut lat: Vec<Duration> = handles
        .into_iter()
        .flat_map(|h| h.join().expect("writer"))
        .collect();
    lat.sort();
    let at = |q: f64| lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)));
    Report {
        intervals,
        total: done.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64(),
        p50: at(0.5).copied().unwrap_or_default(),
        p99: at(0.99).copied().unwrap_or_default(),
    }
}

fn rates(r: &[f64]) -> String {
    r.iter()
        .map(|x| format!("{x:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn mb(b: u64) -> String {
    format!("{:.1} MB", b as f64 / 1e6)
}

/// Bytes of every file under `p`.
fn bytes(p: &Path) -> u64 {
    std::fs::read_dir(p).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| match e.file_type() {
                Ok(t) if t.is_dir() => bytes(&e.path()),
                _ => e.metadata().map_or(0, |m| m.len()),
            })
            .sum()
    })
}

/// This process's resident set, from `/proc/self/status` (0 where there is none).
fn rss() -> u64 {
    status_kb("VmRSS:") * 1024
}

/// A line of `/proc/self/status`, in KiB (0 where there is none).
fn status_kb(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0)
}

/// jemalloc's live heap, its pages in use and its resident pages, when it is the allocator.
fn heap() -> String {
    #[cfg(feature = "jemalloc")]
    if let Some(h) = lessons::allocator::heap() {
        return format!(
            "{} live in {} active of {} resident",
            mb(h.allocated),
            mb(h.active),
            mb(h.resident)
        );
    }
    "not counted".to_owned()
}
