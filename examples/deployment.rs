//! A bot deployment compressed in time, against `lessons serve` in its own process: its memory,
//! its slowest requests, and what they were, minute by minute.
//!
//! 45 scopes (5 organizations, 8 repositories each). 8 workers run unthrottled runs, each the
//! bot's three requests: its repository's window (`/window`), a retrieve on its organization
//! (`/retrieve`, a 40-word brief), and its reflection's write of 3–6 candidates to the
//! repository (one run in five to the organization): new lessons, a repeat of a recent text
//! (a dedup) and, one run in three, a restatement of a record its window showed. Every minute
//! an operator's `/review` (7 days, every scope), `/export` (read to the end) and `/sweep` of
//! one scope. No restart. At the end the workers stop and the server is killed with `kill -9`
//! (no clean close: memtables unflushed), then `lessons doctor` checks the store and `lessons
//! export` must hold every new text of every acknowledged write.
//!
//! Printed each minute: runs/s, inserted records/s, the server's resident memory at the
//! minute's end (and its anonymous part) and its peak over the minute's one-second samples, what
//! the server says it holds (`/metrics`: jemalloc's live heap, pages in use and resident pages;
//! memtables, block cache, scope map, index backlog), the slowest request of each route, and how
//! many took over 1 s, and the disk's slowest `fdatasync` of the minute. At the end: the resident memory at 10 minutes and at the end, its peak
//! over the last 15 minutes and over the whole run (`VmHWM`), its growth per minute over the
//! last 15 minutes (least squares over one-second samples), every request over 1 s, every
//! `fdatasync` of the disk's probe over 1 s, and the check after the kill.
//!
//! The disk's probe: a thread of this process writes 4 KiB over a 64 KiB file it filled and
//! synced first, beside the store's directory, then `fdatasync`s it, every 20 ms. It commits no
//! file-system metadata and shares nothing with the store but the disk, so when its fsync is
//! slow, the disk is: a request that is slow at the same moment waited on the disk.
//!
//! With `LESSONS_DEPLOYMENT_RATE=N` the runs come in an open loop instead: N runs a second on a
//! Poisson schedule, whether or not the earlier ones are done, taken by 16 workers; a run's
//! write counts its latency from when it was due (the run's due time plus the time its reads
//! took), so a queue shows. Either way the end reports the writes' rate, p50 / p99 / p99.9 and
//! p99 ÷ p50, and the CPU time the hypervisor stole.
//!
//! `cargo build --release && cargo run --release --example deployment -- [MINUTES] [DIR]`
//! (default 35 minutes, a temporary directory). The server is the `lessons` binary beside this
//! example's (`target/release/lessons`), or `$LESSONS_BIN`; `MALLOC_ARENA_MAX` and the like in
//! the environment reach it.

// A harness: a panic is its failure report (see Cargo.toml's lint policy).
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]
#[path = "../benches/support/mod.rs"]
mod support;

use std::collections::{HashSet, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{brief, text, vocabulary, Arrivals, Rng, Steal, Tail};

const TOKEN: &str = "deployment-token-0123456789";
const WORKERS: usize = 8;
/// Workers taking an open loop's arrivals.
const OPEN_WORKERS: usize = 16;
const ORGS: usize = 5;
const REPOS_PER_ORG: usize = 8;
const SLOW: Duration = Duration::from_secs(1);
const ROUTES: [&str; 6] = [
    "/window",
    "/retrieve",
    "/write",
    "/review",
    "/export",
    "/sweep",
];

fn org(o: usize) -> String {
    format!("org:acme{o}")
}

fn repo(r: usize) -> String {
    format!("repo:acme{}/svc{}", r / REPOS_PER_ORG, r % REPOS_PER_ORG)
}

/// What the minute saw, per route: the slowest request and those over 1 s.
#[derive(Default)]
struct Minute {
    runs: u64,
    inserted: u64,
    slowest: [Duration; ROUTES.len()],
    over: [u64; ROUTES.len()],
    /// The disk probe's slowest `fdatasync`.
    disk: Duration,
}

struct Shared {
    url: String,
    stop: AtomicBool,
    minute: Mutex<Minute>,
    /// Every request over 1 s: (seconds into the run, route, its time).
    slow: Mutex<Vec<(f64, &'static str, Duration)>>,
    /// Every `fdatasync` of the disk's probe over 1 s: (seconds into the run, its time).
    disk_slow: Mutex<Vec<(f64, Duration)>>,
    started: Instant,
    requests: AtomicU64,
    /// A hash of every new text of every acknowledged write: each must be found after the kill.
    acked: Mutex<HashSet<u64>>,
    /// In an open loop, the runs' arrivals.
    arrivals: Option<Arrivals>,
    /// Each write's latency: from when it was due in an open loop, its own otherwise.
    writes: Mutex<Vec<Duration>>,
}

impl Shared {
    /// POSTs `body` to `route`, times it, and answers its JSON.
    fn post(&self, agent: &ureq::Agent, route: usize, body: &Value) -> Value {
        let t = Instant::now();
        let mut resp = agent
            .post(format!("{}{}", self.url, ROUTES[route]))
            .header("content-type", "application/json")
            .header("authorization", &format!("Bearer {TOKEN}"))
            .send(serde_json::to_vec(body).unwrap().as_slice())
            .expect("the server answers");
        // An export is read to its end and dropped (it holds every record).
        let answer = if ROUTES[route] == "/export" {
            let mut sink = std::io::sink();
            let bytes =
                std::io::copy(&mut resp.body_mut().as_reader(), &mut sink).expect("the export");
            format!("{{\"bytes\":{bytes}}}")
        } else {
            resp.body_mut()
                .with_config()
                .limit(64 << 20)
                .read_to_string()
                .expect("a body")
        };
        let took = t.elapsed();
        assert_eq!(resp.status().as_u16(), 200, "{}: {answer}", ROUTES[route]);
        self.requests.fetch_add(1, Ordering::Relaxed);
        {
            let mut m = self.minute.lock().unwrap();
            m.slowest[route] = m.slowest[route].max(took);
            if took > SLOW {
                m.over[route] += 1;
            }
        }
        if took > SLOW {
            self.slow.lock().unwrap().push((
                self.started.elapsed().as_secs_f64(),
                ROUTES[route],
                took,
            ));
        }
        serde_json::from_str(&answer).expect("JSON")
    }
}

/// The disk's probe (see the module's doc): 4 KiB written over `path` and synced every 20 ms
/// until the run stops.
fn disk_probe(shared: &Shared, path: &std::path::Path) {
    use std::io::{Seek, SeekFrom, Write};
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)
        .expect("the disk probe's file");
    file.write_all(&[0; 16 * 4096]).expect("filled");
    file.sync_all().expect("synced");
    let mut rng = Rng(0xd15c);
    let mut block = [0u8; 4096];
    let mut i = 0u64;
    while !shared.stop.load(Ordering::SeqCst) {
        for word in block.chunks_exact_mut(8) {
            word.copy_from_slice(&rng.next().to_le_bytes());
        }
        let t = Instant::now();
        file.seek(SeekFrom::Start((i % 16) * 4096)).expect("seek");
        file.write_all(&block).expect("written");
        file.sync_data().expect("synced");
        let took = t.elapsed();
        {
            let mut m = shared.minute.lock().unwrap();
            m.disk = m.disk.max(took);
        }
        if took > SLOW {
            shared
                .disk_slow
                .lock()
                .unwrap()
                .push((shared.started.elapsed().as_secs_f64(), took));
        }
        i += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(path);
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_response_header_size(64 * 1024)
        .build()
        .into()
}

/// One worker: runs until told to stop.
fn worker(shared: &Shared, seed: u64) {
    let agent = agent();
    let words = vocabulary();
    let mut rng = Rng(seed);
    // Recent texts per scope, for repeats.
    let mut recent: Vec<VecDeque<String>> = vec![VecDeque::new(); ORGS * REPOS_PER_ORG + ORGS];
    while !shared.stop.load(Ordering::Relaxed) {
        let due = match &shared.arrivals {
            Some(arrivals) => match arrivals.next() {
                Some(due) => Some(due),
                None => break,
            },
            None => None,
        };
        let reading = Instant::now();
        let r = rng.below(ORGS * REPOS_PER_ORG);
        let o = r / REPOS_PER_ORG;
        let window = shared.post(&agent, 0, &json!({"scopeKey": repo(r)}));
        shared.post(
            &agent,
            1,
            &json!({"scopeKey": org(o), "query": brief(&mut rng, &words, 40), "limit": 8}),
        );
        let (scope, slot) = if rng.below(5) == 0 {
            (org(o), ORGS * REPOS_PER_ORG + o)
        } else {
            (repo(r), r)
        };
        let mut records = Vec::new();
        let mut new = Vec::new();
        for _ in 0..(3 + rng.below(4)) {
            let len = 120 + rng.below(200);
            let t = text(&mut rng, &words, len);
            records.push(
                json!({"kind": "fact", "text": t, "sourceThreadKey": format!("slack:C{r}:{seed}")}),
            );
            new.push(hash(&t));
            recent[slot].push_back(t);
            if recent[slot].len() > 64 {
                recent[slot].pop_front();
            }
        }
        if let Some(t) = recent[slot].get(rng.below(recent[slot].len().max(1))) {
            records.push(json!({"kind": "fact", "text": t, "sourceThreadKey": "slack:C0:repeat"}));
        }
        let shown = window["records"].as_array().cloned().unwrap_or_default();
        if slot == r && !shown.is_empty() && rng.below(3) == 0 {
            let id = shown[rng.below(shown.len())]["id"].clone();
            records.push(json!({
                "kind": "fact",
                "text": text(&mut rng, &words, 80),
                "sourceThreadKey": "slack:C0:restate",
                "restates": id,
            }));
        }
        let reads = reading.elapsed();
        let writing = Instant::now();
        let counts = shared.post(&agent, 2, &json!({"scopeKey": scope, "records": records}));
        let latency = match due {
            Some(due) => due.elapsed().saturating_sub(reads),
            None => writing.elapsed(),
        };
        shared.writes.lock().unwrap().push(latency);
        let inserted = counts["inserted"].as_u64().unwrap_or(0);
        shared.acked.lock().unwrap().extend(new);
        let mut m = shared.minute.lock().unwrap();
        m.runs += 1;
        m.inserted += inserted;
    }
}

/// The operator's minute: the review, an export read to its end, a sweep of one scope.
fn operator(shared: &Shared) {
    let agent = agent();
    let mut rng = Rng(0x0b5);
    let mut next = Instant::now() + Duration::from_secs(60);
    while !shared.stop.load(Ordering::Relaxed) {
        if Instant::now() < next {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        next += Duration::from_secs(60);
        shared.post(&agent, 3, &json!({"days": 7}));
        shared.post(&agent, 4, &json!({}));
        let r = rng.below(ORGS * REPOS_PER_ORG);
        shared.post(&agent, 5, &json!({"scopeKey": repo(r)}));
    }
}

/// The server's resident and anonymous memory, in MB.
fn memory(pid: u32) -> (f64, f64) {
    let (rss, anon, _) = memory_and_peak(pid);
    (rss, anon)
}

/// The server's resident and anonymous memory and its resident peak so far (the kernel's high
/// water mark, `VmHWM`), in MB.
fn memory_and_peak(pid: u32) -> (f64, f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| -> f64 {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (kb("VmRSS:"), kb("RssAnon:"), kb("VmHWM:"))
}

/// What the server says it holds, from `/metrics`: memtables / block cache / scope map, in MB,
/// and the index changes waiting for a commit.
fn held(agent: &ureq::Agent, url: &str) -> String {
    let text = agent
        .get(format!("{url}/metrics"))
        .header("authorization", &format!("Bearer {TOKEN}"))
        .call()
        .ok()
        .and_then(|mut r| r.body_mut().read_to_string().ok())
        .unwrap_or_default();
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    let mb = |part: &str| value(&format!("lessons_held_bytes{{part=\"{part}\"}}")) / 1e6;
    format!(
        "{:.0} in {:.0} of {:.0} / {:.0} / {:.0} / {:.0} / {:.0}",
        value("lessons_allocated_bytes") / 1e6,
        value("lessons_allocator_active_bytes") / 1e6,
        value("lessons_allocator_resident_bytes") / 1e6,
        mb("memtables"),
        mb("block_cache"),
        mb("scope_map"),
        value("lessons_index_pending_changes")
    )
}

/// The highest one-second sample of the last 15 minutes, in MB.
fn last_peak(samples: &[(f64, f64)], minutes: u64) -> f64 {
    samples
        .iter()
        .filter(|(t, _)| *t >= minutes as f64 - 15.0)
        .map(|(_, rss)| *rss)
        .fold(0.0, f64::max)
}

fn hash(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// After the kill: `lessons doctor` on the store, then every record of `lessons export`,
/// checked against the texts acknowledged.
fn verify(bin: &std::path::Path, dir: &std::path::Path, acked: &HashSet<u64>) {
    let doctor = Command::new(bin)
        .arg("--store")
        .arg(dir)
        .arg("doctor")
        .output()
        .expect("lessons doctor runs");
    println!(
        "doctor after kill -9 (status {}): {}",
        doctor.status,
        String::from_utf8_lossy(&doctor.stdout).trim()
    );
    let mut export = Command::new(bin)
        .arg("--store")
        .arg(dir)
        .arg("export")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("lessons export runs");
    let mut found = HashSet::new();
    let mut records = 0u64;
    let lines = std::io::BufReader::new(export.stdout.take().expect("its stdout"));
    for line in lines.lines() {
        let line = line.expect("a line");
        if line.starts_with("{\"decision\"") {
            continue;
        }
        let r: Value = serde_json::from_str(&line).expect("a record");
        records += 1;
        let h = hash(r["text"].as_str().unwrap_or_default());
        if acked.contains(&h) {
            found.insert(h);
        }
    }
    assert!(export.wait().expect("export ends").success());
    println!(
        "acknowledged texts found after kill -9: {} of {} ({records} records exported)",
        found.len(),
        acked.len()
    );
}

/// The slope of `ys` over `xs` by least squares.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (mx, my) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x / n, b + y / n));
    let (num, den) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| {
        (a + (x - mx) * (y - my), b + (x - mx) * (x - mx))
    });
    if den == 0.0 {
        0.0
    } else {
        num / den
    }
}

fn binary() -> PathBuf {
    let bin = std::env::var_os("LESSONS_BIN").map_or_else(
        || {
            let exe = std::env::current_exe().expect("this example's path");
            exe.parent()
                .and_then(|p| p.parent())
                .expect("target/release")
                .join("lessons")
        },
        PathBuf::from,
    );
    assert!(
        bin.exists(),
        "{} is missing: `cargo build --release` first",
        bin.display()
    );
    bin
}

fn server(dir: &std::path::Path, port: u16) -> Child {
    Command::new(binary())
        .args(["--store"])
        .arg(dir)
        .args(["serve", "--addr", &format!("127.0.0.1:{port}")])
        .env("MEMORY_TOKEN", TOKEN)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.with_extension("log")).expect("log file"))
        .spawn()
        .expect("lessons serve starts")
}

fn main() {
    let mut args = std::env::args().skip(1);
    let minutes: u64 = args.next().map_or(35, |m| m.parse().expect("MINUTES"));
    let temp = tempfile::tempdir().expect("dir");
    let dir = args
        .next()
        .map_or_else(|| temp.path().join("store"), PathBuf::from);
    let port = 20_000 + (std::process::id() % 20_000) as u16;
    let mut child = server(&dir, port);
    let pid = child.id();
    let url = format!("http://127.0.0.1:{port}");
    let probe = agent();
    let up = Instant::now();
    while probe.get(format!("{url}/healthz")).call().is_err() {
        assert!(
            up.elapsed() < Duration::from_secs(30),
            "the server did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let rate: Option<f64> = std::env::var("LESSONS_DEPLOYMENT_RATE")
        .ok()
        .map(|r| r.parse().expect("LESSONS_DEPLOYMENT_RATE: runs a second"));
    let workers = if rate.is_some() {
        OPEN_WORKERS
    } else {
        WORKERS
    };
    let steal = Steal::now();
    let shared = Arc::new(Shared {
        url,
        stop: AtomicBool::new(false),
        minute: Mutex::new(Minute::default()),
        slow: Mutex::new(Vec::new()),
        disk_slow: Mutex::new(Vec::new()),
        started: Instant::now(),
        requests: AtomicU64::new(0),
        acked: Mutex::new(HashSet::new()),
        arrivals: rate
            .map(|rate| Arrivals::poisson(rate, Duration::from_secs(minutes * 60), 0xa441)),
        writes: Mutex::new(Vec::new()),
    });
    let mut threads = Vec::new();
    for k in 0..workers {
        let s = Arc::clone(&shared);
        threads.push(std::thread::spawn(move || worker(&s, 1 + k as u64)));
    }
    {
        let s = Arc::clone(&shared);
        threads.push(std::thread::spawn(move || operator(&s)));
    }
    {
        let s = Arc::clone(&shared);
        let path = dir.with_extension("disk-probe");
        threads.push(std::thread::spawn(move || disk_probe(&s, &path)));
    }
    let load = match rate {
        Some(rate) => format!("{rate:.0} runs/s offered (Poisson) to {OPEN_WORKERS} workers"),
        None => format!("{WORKERS} workers in a closed loop"),
    };
    println!("\nA compressed deployment: {load}, 45 scopes, {minutes} minutes, `lessons serve` as pid {pid}\n");
    println!("| minute | runs/s | inserted/s | records inserted | RSS MB at the minute's end (anon), the minute's peak | heap MB: allocated in active of resident / memtables / cache / scopes, index backlog | slowest window / retrieve / write / review / export / sweep, ms | over 1 s | the disk's slowest fsync, ms |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut samples: Vec<(f64, f64)> = Vec::new();
    let mut total_inserted = 0u64;
    let mut at_10 = None;
    for m in 1..=minutes {
        // Sampled each second: a minute's peak, not only its last value.
        let mut peak: f64 = 0.0;
        for _ in 0..60 {
            std::thread::sleep(Duration::from_secs(1));
            let (rss, _) = memory(pid);
            peak = peak.max(rss);
            samples.push((shared.started.elapsed().as_secs_f64() / 60.0, rss));
        }
        let minute = std::mem::take(&mut *shared.minute.lock().unwrap());
        total_inserted += minute.inserted;
        let (rss, anon) = memory(pid);
        if m == 10 {
            at_10 = Some(rss);
        }
        let slowest: Vec<String> = minute
            .slowest
            .iter()
            .map(|d| format!("{:.0}", d.as_secs_f64() * 1e3))
            .collect();
        println!(
            "| {m} | {:.0} | {:.0} | {total_inserted} | {rss:.0} ({anon:.0}), peak {peak:.0} | {} | {} | {} | {:.0} |",
            minute.runs as f64 / 60.0,
            minute.inserted as f64 / 60.0,
            held(&probe, &shared.url),
            slowest.join(" / "),
            minute.over.iter().sum::<u64>(),
            minute.disk.as_secs_f64() * 1e3
        );
    }
    shared.stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().expect("a worker");
    }
    let (end, _, high) = memory_and_peak(pid);
    let last_peak = last_peak(&samples, minutes);
    let last: Vec<(f64, f64)> = samples
        .iter()
        .copied()
        .filter(|(t, _)| *t >= minutes as f64 - 15.0)
        .collect();
    println!(
        "\nresident memory: {} MB at 10 minutes, {end:.0} MB at the end, peak {last_peak:.0} MB over the last 15 minutes and {high:.0} MB over the run (VmHWM), {:+.2} MB/min over the last 15 minutes; {} requests",
        at_10.map_or("—".into(), |v| format!("{v:.0}")),
        slope(&last),
        shared.requests.load(Ordering::Relaxed)
    );
    let writes = std::mem::take(&mut *shared.writes.lock().unwrap());
    let achieved = writes.len() as f64 / shared.started.elapsed().as_secs_f64();
    println!(
        "the writes ({load}, latency from {}): {achieved:.0}/s, p50 / p99 / p99.9 {}; steal {}",
        if rate.is_some() {
            "when each was due"
        } else {
            "each request's send"
        },
        Tail::of(writes).row(),
        steal.since()
    );
    let slow = shared.slow.lock().unwrap();
    println!("requests over 1 s: {}", slow.len());
    for (at, route, took) in slow.iter() {
        println!("  at {at:.0} s: {route} took {:.2} s", took.as_secs_f64());
    }
    let disk = shared.disk_slow.lock().unwrap();
    println!("the disk probe's fsyncs over 1 s: {}", disk.len());
    for (at, took) in disk.iter() {
        println!("  at {at:.0} s: fdatasync took {:.2} s", took.as_secs_f64());
    }
    child.kill().expect("kill -9");
    child.wait().expect("reaped");
    let acked = std::mem::take(&mut *shared.acked.lock().unwrap());
    verify(&binary(), &dir, &acked);
}
