//! Durable writes beside SQLite + FTS5 (the reference Worker's layout: one database per scope
//! with its schema, `synchronous=FULL`), and beside the disk's floor, in one run.
//!
//! 1. The floor: a raw 4 KiB append and `fdatasync` in the store's directory, the least a
//!    durable write costs on this disk; then the same beside as many threads as there are
//!    writers, threads that only use the CPU: the tail the run queue alone makes here.
//! 2. One durable write at a time (a reflection of 4 candidates: two new lessons, a
//!    restatement, a repeat; one scope of 500 records at its cap): p50 / p99 of each engine, and
//!    lessons' p50 in floors; and lessons' on a store just closed and opened again, the first
//!    writes of a restarted deployment.
//! 3. Sustained writes: 8 writer threads (`THREADS`) on random scopes of a store of `RECORDS`
//!    records (500 per scope, every scope at its cap), `SECONDS` per engine, twice: the rate,
//!    p50, p99 and p99 ÷ p50 of each engine. The first round follows the load (lessons compacting what was
//!    imported; SQLite's write-ahead logs holding the load, checkpointed by the first commits
//!    that pass 1,000 pages, and growing file by file); the second is the steady state a
//!    long-running deployment sees (SQLite's logs checkpointed and written over in place). Both
//!    are shown: SQLite gains far more from the first to the second. Beside the steady round,
//!    lessons' journal fsyncs in it (`Upkeep::journal_syncs`): how many, how many writes each
//!    made durable, and how long they took, the disk's own part of a write's wait.
//! 4. Where lessons' slowest writes went, in the steady round: the phases of the writes above
//!    its p95 (their share of those writes' time, off-CPU waits included), beside the median
//!    write's; and for both engines, how the writing thread spent those writes (the kernel's
//!    per-thread `schedstat`): on a CPU, runnable but waiting for one, or asleep (the disk, a
//!    lock, a condition variable).
//! 5. Reads beside the writes, the loop a bot's runs make: the same 8 writers with 2 threads
//!    retrieving (a 400-token brief, limit 8, each retrieve recording its use) on random scopes,
//!    `SECONDS / 2` per engine: the retrieves' p50, p99 and p99 ÷ p50, and the writers' rate.
//!
//! 6. The tail at a deployment's load, in an open loop: writes arrive on a Poisson schedule
//!    whether or not the earlier ones are done, `OPEN_WORKERS` threads take them in order, and
//!    each latency counts from when the write was due, so a queue shows. At 300/s and 600/s
//!    offered, and at half of lessons' own closed-loop rate (the steady round), `SECONDS` per
//!    engine and load after a warm-up of a quarter of that at the same load: the achieved rate,
//!    p50 / p99 / p99.9, p99 ÷ p50, and lessons' p99 ÷ SQLite's; beside them the disk's floor at
//!    the same arrivals (a raw 4 KiB append and `fdatasync` each, by the same workers), the part
//!    of the tail the disk itself adds, and lessons' p99 ÷ the floor's; and a wake-up alone at
//!    the same arrivals (the workers do nothing), the part the machine's timer and scheduler
//!    add before any write starts. Then what each kind of lessons' threads wrote to the disk
//!    during each load, the phases of the slowest writes, and how their workers spent them
//!    (`schedstat`).
//!
//! Each row says how much CPU time the machine's hypervisor stole while it ran (`/proc/stat`):
//! on a shared host the tail moves with it.
//!
//! `cargo bench --bench writes` (`LESSONS_WRITES_RECORDS=1000000` for the large store,
//! `LESSONS_WRITES_SECONDS=N` per sustained phase, default 20; `LESSONS_WRITES_THREADS=N`
//! writers instead of 8; `LESSONS_WRITES_OPEN_ONLY=1` for the open loop alone, without its
//! half-rate load; `LESSONS_WRITES_OFFERED=300,600` the open loop's loads; the stores go in `TMPDIR`, which must be on the disk being measured).

// A harness: a panic is its failure report (see Cargo.toml's lint policy).
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]
mod support;

/// The allocator the `lessons` binary runs on (see `lessons::allocator`), so lessons' writes
/// allocate here as they do under `lessons serve`. SQLite allocates through the C library's
/// malloc either way: this changes only lessons' side.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lessons::internals::{last_write, WritePhases};
use lessons::store::SyncTimes;
use lessons::Clock;
use lessons::{Candidate, EmbeddedStore, MemoryStore, ScopeKey, WriteOptions};
use support::floor::{floor_beside, floor_open, wake_open};
use support::phases::{
    drive_open, phase_table, sched_table, shares, Arrival, Call, Op, Sched, ThreadClock, SCHED_ROWS,
};
use support::{
    brief, p50_p99, percentile, records, text, vocabulary, Arrivals, DiskWrites, ProcessCpu, Rng,
    SqliteScope, Steal, Tail, NOW,
};

const ACTIVE: usize = 500;
const SINGLE_WRITES: usize = 2_000;
/// Threads retrieving beside the writers.
const READERS: usize = 2;
/// Threads taking an open loop's arrivals: more than a deployment's concurrent writes, so the
/// workers are not the queue at the loads measured.
const OPEN_WORKERS: usize = 16;
/// Offered loads of the open loop, writes a second, besides half the closed-loop rate.
const OFFERED: [f64; 2] = [300.0, 600.0];

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn clock() -> Clock {
    // A clock that moves, so recency and usage keys behave as in production.
    let start = Instant::now();
    Arc::new(move || NOW + start.elapsed().as_millis() as i64)
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// A reflection to `s`: two new lessons, a restatement of an active record, a repeat.
fn candidates(rng: &mut Rng, words: &[&str], s: &ScopeKey, next: u64) -> Vec<Candidate> {
    // The restated record: one of the newest 250 (older ones may have been evicted).
    let target = next.saturating_sub(1 + rng.below(250) as u64);
    vec![
        Candidate::fact(text(rng, words, 320), "bench"),
        Candidate::fact(text(rng, words, 320), "bench"),
        Candidate::fact("a paraphrase", "bench").restating(s.record_id(target)),
        Candidate::fact("the same lesson again", "bench"),
    ]
}

fn sqlite_reflection(c: &[Candidate]) -> Vec<(String, Option<String>)> {
    c.iter()
        .map(|c| (c.text.clone(), c.restates.clone()))
        .collect()
}

/// A store of `scopes` scopes of 500 records each, in both engines.
struct Stores {
    lessons: Arc<EmbeddedStore>,
    sqlite: Arc<Vec<parking_lot::Mutex<SqliteScope>>>,
    keys: Arc<Vec<ScopeKey>>,
    /// Each scope's next sequence number, as the writes advance it (for restatements).
    next: Arc<Vec<std::sync::atomic::AtomicU64>>,
}

fn stores(dir: &Path, scopes: usize) -> Stores {
    let keys: Vec<ScopeKey> = (0..scopes)
        .map(|i| ScopeKey::parse(&format!("repo:org{}/svc{i}", i % 23)).expect("valid"))
        .collect();
    let lessons = EmbeddedStore::builder()
        .clock(clock())
        .open(dir.join("lessons"))
        .expect("open");
    let mut sqlite = Vec::new();
    let mut rng = Rng(0x5ca1e);
    let started = Instant::now();
    for (i, s) in keys.iter().enumerate() {
        let rs = records(&mut rng, s, ACTIVE, 0);
        lessons.import(&rs).expect("import");
        let mut db = SqliteScope::open(&dir.join(format!("s{i}.sqlite")), s.clone(), true);
        db.load(&rs);
        sqlite.push(parking_lot::Mutex::new(db));
    }
    lessons.flush().expect("flush");
    eprintln!(
        "loaded {} records in {scopes} scopes into both engines in {:.0} s",
        scopes * ACTIVE,
        started.elapsed().as_secs_f64()
    );
    Stores {
        lessons: Arc::new(lessons),
        sqlite: Arc::new(sqlite),
        keys: Arc::new(keys),
        next: Arc::new(
            (0..scopes)
                .map(|_| std::sync::atomic::AtomicU64::new(ACTIVE as u64))
                .collect(),
        ),
    }
}

/// One timed call: its latency, how its thread spent it, and what the call answered.
type Timed<T> = (Duration, Option<Sched>, T);

/// One timed write: for lessons, with its phases.
type Sample = Timed<Option<WritePhases>>;

/// Starts `threads` threads calling `f` on random scopes of `scopes` until `phase` has passed
/// since `start`, each timing every call; `seed` seeds the first thread's choices.
fn timed_loops<T: Send + 'static>(
    threads: usize,
    seed: u64,
    scopes: usize,
    start: Instant,
    phase: Duration,
    f: Call<T>,
) -> Vec<std::thread::JoinHandle<Vec<Timed<T>>>> {
    (0..threads)
        .map(|k| {
            let f = Arc::clone(&f);
            std::thread::spawn(move || {
                let mut rng = Rng(seed + k as u64);
                let clock = ThreadClock::open();
                let mut samples = Vec::new();
                while start.elapsed() < phase {
                    let s = rng.below(scopes);
                    let before = clock.read();
                    let t = Instant::now();
                    let out = f(&mut rng, s);
                    let latency = t.elapsed();
                    samples.push((latency, clock.since(before), out));
                }
                samples
            })
        })
        .collect()
}

/// Runs `op` on `threads` threads, each on random scopes of `scopes`, for `phase`: the rate
/// and every sample.
fn drive(threads: usize, scopes: usize, phase: Duration, op: Op) -> (f64, Vec<Sample>) {
    let start = Instant::now();
    let samples: Vec<Sample> = timed_loops(threads, 1_000, scopes, start, phase, op)
        .into_iter()
        .flat_map(|h| h.join().expect("writer"))
        .collect();
    (
        samples.len() as f64 / start.elapsed().as_secs_f64(),
        samples,
    )
}

/// A read of scope `s`.
type Read = Call<()>;

/// Runs `write` on `threads` threads and `read` on `readers` more, each on random scopes of
/// `scopes`, for `phase`: the writers' rate and each read's latency.
fn drive_beside(
    threads: usize,
    readers: usize,
    scopes: usize,
    phase: Duration,
    write: Op,
    read: Read,
) -> (f64, Vec<Duration>) {
    let reading = timed_loops(readers, 9_000, scopes, Instant::now(), phase, read);
    let (rate, _) = drive(threads, scopes, phase, write);
    let samples = reading
        .into_iter()
        .flat_map(|h| h.join().expect("reader"))
        .map(|(latency, _, ())| latency)
        .collect();
    (rate, samples)
}

/// 64 briefs of 400 tokens, as a run's retrieve sends.
fn briefs() -> Arc<Vec<String>> {
    let words = vocabulary();
    let mut rng = Rng(0xb1ef);
    Arc::new((0..64).map(|_| brief(&mut rng, &words, 400)).collect())
}

/// lessons' retrieve of scope `s`.
fn lessons_read(st: &Stores) -> Read {
    let (store, keys, briefs) = (Arc::clone(&st.lessons), Arc::clone(&st.keys), briefs());
    Arc::new(move |rng: &mut Rng, s: usize| {
        store
            .retrieve(&keys[s], &briefs[rng.below(briefs.len())], 8)
            .expect("retrieve");
    })
}

/// SQLite's retrieve of scope `s` (the same pool, ranking and use recorded).
fn sqlite_read(st: &Stores) -> Read {
    let (dbs, briefs) = (Arc::clone(&st.sqlite), briefs());
    Arc::new(move |rng: &mut Rng, s: usize| {
        let now = NOW + rng.below(1_000_000) as i64;
        dbs[s]
            .lock()
            .retrieve(&briefs[rng.below(briefs.len())], 8, now);
    })
}

/// lessons' write to scope `s`, and its phases.
fn lessons_op(st: &Stores) -> Op {
    let (store, keys, next) = (
        Arc::clone(&st.lessons),
        Arc::clone(&st.keys),
        Arc::clone(&st.next),
    );
    let words = vocabulary();
    Arc::new(move |rng: &mut Rng, s: usize| {
        let n = next[s].load(std::sync::atomic::Ordering::Relaxed);
        let cs = candidates(rng, &words, &keys[s], n);
        let counts = store
            .write(&keys[s], &cs, &WriteOptions::default())
            .expect("write");
        next[s].fetch_add(counts.inserted, std::sync::atomic::Ordering::Relaxed);
        Some(last_write())
    })
}

/// One durable write at a time to a store just restarted, as a deployment's first writes after
/// a restart: a scope filled to its cap, the store closed and opened again, then
/// `SINGLE_WRITES` writes: p50 / p99. Its journal is the one the open found, appended to,
/// until the engine rotates it onto a spare (see vendor/README.md).
fn restarted_single(dir: &Path) -> (Duration, Duration) {
    let path = dir.join("restarted");
    let s = ScopeKey::parse("repo:org0/restarted").expect("valid");
    let open = || {
        EmbeddedStore::builder()
            .clock(clock())
            .open(&path)
            .expect("open")
    };
    let words = vocabulary();
    let mut rng = Rng(11);
    let mut next = 0;
    let mut write = |store: &EmbeddedStore| {
        let cs = candidates(&mut rng, &words, &s, next);
        let counts = store
            .write(&s, &cs, &WriteOptions::default())
            .expect("write");
        next += counts.inserted;
    };
    let store = open();
    for _ in 0..ACTIVE {
        write(&store);
    }
    store.close().expect("close");
    let store = open();
    p50_p99(
        (0..SINGLE_WRITES)
            .map(|_| {
                let t = Instant::now();
                write(&store);
                t.elapsed()
            })
            .collect(),
    )
}

/// SQLite's write of the same reflection to scope `s`.
fn sqlite_op(st: &Stores) -> Op {
    let (dbs, keys) = (Arc::clone(&st.sqlite), Arc::clone(&st.keys));
    let words = vocabulary();
    Arc::new(move |rng: &mut Rng, s: usize| {
        let cs = candidates(rng, &words, &keys[s], ACTIVE as u64);
        let now = NOW + rng.below(1_000_000) as i64;
        dbs[s].lock().write(&sqlite_reflection(&cs), now, ACTIVE);
        None
    })
}

/// Of the summed latency of the writes above p95 (`slow`) or of the 100 around p50: the shares
/// on a CPU, runnable waiting for one, and asleep. `None` without the kernel's counts.
fn sched_shares(samples: &[Sample], slow: bool) -> Option<[f64; 3]> {
    let mut by_latency: Vec<(Duration, Sched)> = samples
        .iter()
        .map(|s| s.1.map(|c| (s.0, c)))
        .collect::<Option<_>>()?;
    if by_latency.is_empty() {
        return None;
    }
    by_latency.sort_by_key(|s| s.0);
    let picked: &[(Duration, Sched)] = if slow {
        let p95 = by_latency[((by_latency.len() - 1) as f64 * 0.95).round() as usize].0;
        let first = by_latency.partition_point(|s| s.0 <= p95);
        &by_latency[first..]
    } else {
        let mid = by_latency.len() / 2;
        &by_latency[mid.saturating_sub(50)..(mid + 50).min(by_latency.len())]
    };
    let total: f64 = picked.iter().map(|s| s.0.as_secs_f64()).sum();
    if total == 0.0 {
        return None;
    }
    let on: f64 = picked.iter().map(|s| s.1.on_cpu.as_secs_f64()).sum();
    let waiting: f64 = picked.iter().map(|s| s.1.waiting.as_secs_f64()).sum();
    Some([
        on / total,
        waiting / total,
        (1.0 - (on + waiting) / total).max(0.0),
    ])
}

fn main() {
    #[cfg(feature = "jemalloc")]
    let _tuned = lessons::allocator::tune();
    let records_total = env("LESSONS_WRITES_RECORDS", 200_000);
    let seconds = env("LESSONS_WRITES_SECONDS", 20);
    // The load is 8 writers; as many as the machine has cores shows the store without
    // a run queue.
    let threads = env("LESSONS_WRITES_THREADS", 8).max(1);
    let scopes = (records_total / ACTIVE).max(1);
    // The system's temporary directory (`TMPDIR`): it must be on the disk measured, not tmpfs.
    let dir = tempfile::tempdir().expect("dir");
    let st = stores(dir.path(), scopes);
    let phase = Duration::from_secs(seconds as u64);
    if env("LESSONS_WRITES_OPEN_ONLY", 0) == 1 {
        open_loop(&st, dir.path(), scopes, phase, records_total, 0.0);
        return;
    }

    println!("\nDurable writes: lessons beside SQLite + FTS5 (`synchronous=FULL`) and the disk's floor\n");
    println!("| row | lessons | SQLite | lessons ÷ SQLite | steal |");
    println!("|---|---|---|---|---|");

    let steal = Steal::now();
    let (floor50, floor99) = floor_beside(dir.path(), SINGLE_WRITES, 0);
    println!(
        "| the floor: 4 KiB append + fdatasync, p50 / p99 (p99 ÷ p50) | {} / {} ({:.1}×) | | | {} |",
        ms(floor50),
        ms(floor99),
        floor99.as_secs_f64() / floor50.as_secs_f64(),
        steal.since()
    );
    let steal = Steal::now();
    let (busy50, busy99) = floor_beside(dir.path(), SINGLE_WRITES, threads);
    println!(
        "| the floor beside {threads} threads busy on the CPU, p50 / p99 (p99 ÷ p50) | {} / {} ({:.1}×) | | | {} |",
        ms(busy50),
        ms(busy99),
        busy99.as_secs_f64() / busy50.as_secs_f64(),
        steal.since()
    );

    // One writer, one scope at its cap.
    let steal = Steal::now();
    let single = |op: Op| {
        let mut rng = Rng(7);
        let samples: Vec<Duration> = (0..SINGLE_WRITES)
            .map(|_| {
                let t = Instant::now();
                op(&mut rng, 0);
                t.elapsed()
            })
            .collect();
        p50_p99(samples)
    };
    let ours = single(lessons_op(&st));
    let base = single(sqlite_op(&st));
    println!(
        "| one durable write (4 candidates, a scope at its cap), p50 / p99 | {} / {} ({:.1} floors at p50) | {} / {} ({:.1} floors) | {:.2}× / {:.2}× | {} |",
        ms(ours.0),
        ms(ours.1),
        ours.0.as_secs_f64() / floor50.as_secs_f64(),
        ms(base.0),
        ms(base.1),
        base.0.as_secs_f64() / floor50.as_secs_f64(),
        ours.0.as_secs_f64() / base.0.as_secs_f64(),
        ours.1.as_secs_f64() / base.1.as_secs_f64(),
        steal.since()
    );
    let steal = Steal::now();
    let (r50, r99) = restarted_single(dir.path());
    println!(
        "| … the same on a store just restarted (its journal reopened), p50 / p99 | {} / {} ({:.1} floors at p50) | | | {} |",
        ms(r50),
        ms(r99),
        r50.as_secs_f64() / floor50.as_secs_f64(),
        steal.since()
    );

    let mut ours_samples = Vec::new();
    let mut base_samples = Vec::new();
    let mut syncs = SyncTimes::default();
    let mut steady_rate = 0.0;
    for round in ["the first after the load", "the next (steady)"] {
        let steal = Steal::now();
        let before = st.lessons.upkeep().expect("reported").journal_syncs;
        let cpu = ProcessCpu::now();
        let (ours_rate, ours) = drive(threads, scopes, phase, lessons_op(&st));
        let ours_cpu = cpu.since().as_secs_f64() / ours.len().max(1) as f64;
        syncs = st
            .lessons
            .upkeep()
            .expect("reported")
            .journal_syncs
            .since(&before);
        let ours_steal = steal.since();
        let steal = Steal::now();
        let cpu = ProcessCpu::now();
        let (base_rate, base) = drive(threads, scopes, phase, sqlite_op(&st));
        let base_cpu = cpu.since().as_secs_f64() / base.len().max(1) as f64;
        let base_steal = steal.since();
        let (o50, o99) = p50_p99(ours.iter().map(|s| s.0).collect());
        let (b50, b99) = p50_p99(base.iter().map(|s| s.0).collect());
        println!(
            "| {threads} writers at {records_total} records ({scopes} scopes), {seconds} s, {round}: rate | {ours_rate:.0}/s | {base_rate:.0}/s | {:.2}× | {ours_steal} / {base_steal} |",
            ours_rate / base_rate
        );
        println!(
            "| … p50 / p99 (p99 ÷ p50) | {} / {} ({:.1}×) | {} / {} ({:.1}×) | {:.2}× / {:.2}× | |",
            ms(o50),
            ms(o99),
            o99.as_secs_f64() / o50.as_secs_f64(),
            ms(b50),
            ms(b99),
            b99.as_secs_f64() / b50.as_secs_f64(),
            o50.as_secs_f64() / b50.as_secs_f64(),
            o99.as_secs_f64() / b99.as_secs_f64()
        );
        println!(
            "| … CPU time per write (the whole process's user + system time ÷ writes) | {:.0} µs | {:.0} µs | {:.2}× | |",
            ours_cpu * 1e6,
            base_cpu * 1e6,
            ours_cpu / base_cpu
        );
        ours_samples = ours;
        base_samples = base;
        steady_rate = ours_rate;
    }
    // The disk's part of the steady round's wait: the group fsyncs themselves.
    let writes = ours_samples.len() as f64;
    println!(
        "| … the journal's fsyncs (the steady round): {} ({:.1} writes each), p50 / p99 / slowest (each within 25%) | {} / {} / {} | | | |",
        syncs.count(),
        writes / syncs.count().max(1) as f64,
        ms(syncs.quantile(0.5)),
        ms(syncs.quantile(0.99)),
        ms(syncs.quantile(1.0)),
    );

    // Where the slowest writes went.
    let mut phases: Vec<&WritePhases> = ours_samples.iter().filter_map(|s| s.2.as_ref()).collect();
    phases.sort_by_key(|p| p.total);
    let p95 = percentile(&phases.iter().map(|p| p.total).collect::<Vec<_>>(), 0.95);
    let slow: Vec<&WritePhases> = phases.iter().copied().filter(|p| p.total > p95).collect();
    let mid = phases.len() / 2;
    let median: Vec<&WritePhases> =
        phases[mid.saturating_sub(50)..(mid + 50).min(phases.len())].to_vec();
    println!(
        "\nWhere lessons' writes spent their time, {threads} writers at {records_total} records, the steady round: the {} writes above p95 ({}) beside the 100 around p50\n",
        slow.len(),
        ms(p95)
    );
    println!("| phase | above p95 | around p50 |");
    println!("|---|---|---|");
    for ((name, s), (_, m)) in shares(&slow).into_iter().zip(shares(&median)) {
        println!("| {name} | {:.1}% | {:.1}% |", 100.0 * s, 100.0 * m);
    }

    // How the writing threads spent the same rounds' writes, by the kernel's count.
    let (ours_slow, ours_mid) = (
        sched_shares(&ours_samples, true),
        sched_shares(&ours_samples, false),
    );
    let (base_slow, base_mid) = (
        sched_shares(&base_samples, true),
        sched_shares(&base_samples, false),
    );
    if let (Some(os), Some(om), Some(bs), Some(bm)) = (ours_slow, ours_mid, base_slow, base_mid) {
        println!(
            "\nHow the writing thread spent each engine's writes (the kernel's `schedstat`), the steady round: the writes above each engine's p95 beside the 100 around its p50\n"
        );
        println!("| the thread was | lessons above p95 | lessons around p50 | SQLite above p95 | SQLite around p50 |");
        println!("|---|---|---|---|---|");
        for (i, name) in SCHED_ROWS.iter().enumerate() {
            println!(
                "| {name} | {:.1}% | {:.1}% | {:.1}% | {:.1}% |",
                100.0 * os[i],
                100.0 * om[i],
                100.0 * bs[i],
                100.0 * bm[i]
            );
        }
    }

    // Reads beside the writes.
    let half = phase / 2;
    let steal = Steal::now();
    let (ours_rate, ours_reads) = drive_beside(
        threads,
        READERS,
        scopes,
        half,
        lessons_op(&st),
        lessons_read(&st),
    );
    let ours_steal = steal.since();
    let steal = Steal::now();
    let (base_rate, base_reads) = drive_beside(
        threads,
        READERS,
        scopes,
        half,
        sqlite_op(&st),
        sqlite_read(&st),
    );
    let base_steal = steal.since();
    let (o50, o99) = p50_p99(ours_reads);
    let (b50, b99) = p50_p99(base_reads);
    println!(
        "\nRetrieves beside the writes: {READERS} threads retrieving (400-token brief, limit 8, use recorded) beside {threads} writers, {records_total} records, {} s\n",
        half.as_secs()
    );
    println!("| row | lessons | SQLite | lessons ÷ SQLite | steal |");
    println!("|---|---|---|---|---|");
    println!(
        "| retrieve p50 / p99 (p99 ÷ p50) | {} / {} ({:.1}×) | {} / {} ({:.1}×) | {:.2}× / {:.2}× | {ours_steal} / {base_steal} |",
        ms(o50),
        ms(o99),
        o99.as_secs_f64() / o50.as_secs_f64(),
        ms(b50),
        ms(b99),
        b99.as_secs_f64() / b50.as_secs_f64(),
        o50.as_secs_f64() / b50.as_secs_f64(),
        o99.as_secs_f64() / b99.as_secs_f64()
    );
    println!(
        "| the writers' rate beside them | {ours_rate:.0}/s | {base_rate:.0}/s | {:.2}× | |",
        ours_rate / base_rate
    );

    open_loop(&st, dir.path(), scopes, phase, records_total, steady_rate);
}

/// The tail at a deployment's load: 300/s, 600/s and half of `steady_rate` (none without it).
fn open_loop(
    st: &Stores,
    dir: &Path,
    scopes: usize,
    phase: Duration,
    records_total: usize,
    steady_rate: f64,
) {
    let seconds = phase.as_secs();
    println!(
        "\nAn open loop: Poisson arrivals, {OPEN_WORKERS} workers, latency from the due time, {records_total} records, {seconds} s per engine and load\n"
    );
    println!("| offered | lessons: achieved, p50 / p99 / p99.9 (p99 ÷ p50) | SQLite: the same | lessons' p99 ÷ SQLite's | the floor (4 KiB append + fdatasync) at this load | lessons' p99 ÷ the floor's | a wake-up alone (no work) at this load | steal |");
    println!("|---|---|---|---|---|---|---|---|");
    let half = (steady_rate / 2.0).round();
    let mut slowest = Vec::new();
    let mut written: Vec<String> = Vec::new();
    let offered: Vec<f64> = match std::env::var("LESSONS_WRITES_OFFERED") {
        Ok(list) => list
            .split(',')
            .filter_map(|r| r.trim().parse().ok())
            .collect(),
        Err(_) => OFFERED.to_vec(),
    };
    let loads = offered.into_iter().chain([half]).filter(|r| *r > 0.0);
    for (i, offered) in loads.enumerate() {
        let seed = 0x0be7 + i as u64;
        // A warm-up at the same load, not recorded: the engines settle from the load before
        // (the closed loop's compactions) to this one's steady state.
        drive_open(
            OPEN_WORKERS,
            Arrivals::poisson(offered, phase / 4, seed ^ 1),
            scopes,
            lessons_op(st),
        );
        drive_open(
            OPEN_WORKERS,
            Arrivals::poisson(offered, phase / 4, seed ^ 1),
            scopes,
            sqlite_op(st),
        );
        let steal = Steal::now();
        let disk = DiskWrites::now();
        let (ours_rate, ours) = drive_open(
            OPEN_WORKERS,
            Arrivals::poisson(offered, phase, seed),
            scopes,
            lessons_op(st),
        );
        let ours_steal = steal.since();
        written.push(format!("- {offered:.0}/s: {}", disk.since()));
        let steal = Steal::now();
        let (base_rate, base) = drive_open(
            OPEN_WORKERS,
            Arrivals::poisson(offered, phase, seed),
            scopes,
            sqlite_op(st),
        );
        let base_steal = steal.since();
        let floor = floor_open(dir, Arrivals::poisson(offered, phase, seed), OPEN_WORKERS);
        let woken = wake_open(Arrivals::poisson(offered, phase, seed), OPEN_WORKERS);
        let (ours_tail, base) = (
            Tail::of(ours.iter().map(|w| w.0).collect()),
            Tail::of(base.iter().map(|w| w.0).collect()),
        );
        // The slowest from their due time, and the slowest by their own time (a worker held
        // up is what makes the others' arrivals late).
        let own = |w: &Arrival| w.0.saturating_sub(w.1);
        let own_p99 = Tail::of(ours.iter().map(own).collect()).p99;
        let above: Vec<Arrival> = ours
            .iter()
            .filter(|w| w.0 > ours_tail.p99)
            .cloned()
            .collect();
        let held: Vec<Arrival> = ours.into_iter().filter(|w| own(w) > own_p99).collect();
        slowest.push((offered, above, held));
        let ours = ours_tail;
        let label = if offered == half {
            format!("{offered:.0}/s (half the closed loop's)")
        } else {
            format!("{offered:.0}/s")
        };
        println!(
            "| {label} | {ours_rate:.0}/s, {} | {base_rate:.0}/s, {} | {:.2}× | {} | {:.2}× | {} | {ours_steal} / {base_steal} |",
            ours.row(),
            base.row(),
            ours.p99.as_secs_f64() / base.p99.as_secs_f64(),
            floor.row(),
            ours.p99.as_secs_f64() / floor.p99.as_secs_f64(),
            woken.row()
        );
    }

    println!("\nWhat lessons' threads wrote to the disk while each load ran (`/proc/self/task/*/io`, by thread name):\n");
    println!("{}", written.join("\n"));

    // Where the open loop's slowest writes went: the wait for a worker, then the phases.
    let from_due: Vec<(f64, Vec<Arrival>)> = slowest
        .iter()
        .map(|(o, above, _)| (*o, above.clone()))
        .collect();
    phase_table(
        "Where lessons' writes above p99 went in the open loop: their share of those writes' time from the due time",
        &from_due,
    );
    let own: Vec<(f64, Vec<Arrival>)> = slowest.into_iter().map(|(o, _, held)| (o, held)).collect();
    phase_table(
        "The same for the writes above p99 by their own time (from when a worker started them): what held a worker up",
        &own,
    );
    sched_table(
        "How the workers spent those writes (the kernel's `schedstat`), from when they started them",
        &own,
    );
}
