//! Load on `lessons serve` over loopback: 32 concurrent clients, requests/s and p50/p99 for
//! `/list` (the window read), `/retrieve` and `/write`.
//!
//! The server runs in this process on 127.0.0.1 over an embedded store (fsync per write) holding
//! 5 scopes × 500 active records; the clients are threads with keep-alive connections, so they
//! share the machine's two cores with the server. Each phase is bounded: 5 seconds or 200,000
//! requests, whichever comes first.
//!
//! Then the same routes **open loop**: requests arrive at a fixed rate (500, 1,000, 2,000 and
//! 4,000 per second) whether or not earlier ones were answered, and each latency is measured
//! from the request's intended send time, so a server that falls behind shows the queue it
//! builds (a closed loop would hide it: its clients simply send less). 64 sender threads, each
//! with a keep-alive connection, take the schedule in order. Each sender connects (a `GET
//! /healthz`) before its phase's clock starts, as a bot's client is connected before it
//! calls: 64 threads starting and 64 connections opened in the phase's first milliseconds
//! would otherwise be the slowest requests of a phase (up to 48 of the slowest 80 at 2,000/s
//! fall in its first half second). A rate is sustained when at least
//! 95% of it completes and its p99 stays under 100 ms (past the saturation point the queue, and
//! with it every latency, grows for as long as the phase lasts); the saturation point is then
//! narrowed between the highest rate sustained and the next by halving, twice.
//! Each open-loop row also says how the slow requests (over 10 ms) fall: how many, and in how
//! many 50 ms windows of the schedule (a stall puts many in a few; a server that falls behind,
//! or a machine whose cores are taken, spreads them); the CPU time the hypervisor stole
//! during the phase; and what the engine did (`Upkeep`): compactions finished, their time, and
//! the journal's fsyncs.
//! `LESSONS_LOAD=closed` or `=open` runs one mode.
//!
//! `cargo bench --bench server_load`

// A harness: a panic is its failure report (see Cargo.toml's lint policy).
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use lessons::server::{AppState, Auth, Background};
use lessons::{ContextConfig, EmbeddedStore, MemoryStore, ScopeKey};
use serde_json::json;
use support::{brief, records, text, vocabulary, Rng, Steal};

/// The allocator the `lessons` binary serves on (see `lessons::allocator`), so the server here
/// allocates as `lessons serve` does; the clients share it.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const CLIENTS: usize = 32;
const PHASE: Duration = Duration::from_secs(5);
const MAX_REQUESTS: u64 = 200_000;
const TOKEN: &str = "load-test-token";

fn scope(i: usize) -> String {
    format!("repo:acme/app{}", i % 5)
}

struct Phase {
    name: &'static str,
    body: fn(&mut Rng, usize, &[String]) -> (String, String),
}

fn list_body(_: &mut Rng, i: usize, _: &[String]) -> (String, String) {
    (
        "/list".into(),
        json!({"scopeKey": scope(i), "limit": 24, "kind": "fact"}).to_string(),
    )
}

fn retrieve_body(rng: &mut Rng, i: usize, briefs: &[String]) -> (String, String) {
    let b = &briefs[rng.below(briefs.len())];
    (
        "/retrieve".into(),
        json!({"scopeKey": scope(i), "query": b, "limit": 8}).to_string(),
    )
}

fn write_body(rng: &mut Rng, i: usize, _: &[String]) -> (String, String) {
    let words = vocabulary();
    let records: Vec<serde_json::Value> = (0..4)
        .map(|_| json!({"kind": "fact", "text": text(rng, &words, 320), "sourceThreadKey": "load"}))
        .collect();
    (
        "/write".into(),
        json!({"scopeKey": scope(i), "records": records}).to_string(),
    )
}

/// One request on a keep-alive connection; `true` on a 200 (the body read whole).
fn post(agent: &ureq::Agent, url: &str, path: &str, payload: &str) -> bool {
    agent
        .post(&format!("{url}{path}"))
        .header("authorization", &format!("Bearer {TOKEN}"))
        .send(payload.as_bytes())
        .map(|mut r| {
            let status = r.status().as_u16();
            let _ = r.body_mut().read_to_vec();
            status == 200
        })
        .unwrap_or(false)
}

/// The `p` quantile of sorted samples.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted
        .get(((sorted.len() as f64 * p) as usize).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

fn run_phase(url: &str, phase: &Phase, briefs: &Arc<Vec<String>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let threads: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (url, stop, total, errors, briefs) = (
                url.to_owned(),
                Arc::clone(&stop),
                Arc::clone(&total),
                Arc::clone(&errors),
                Arc::clone(briefs),
            );
            let body = phase.body;
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(10)))
                    .build()
                    .into();
                let mut rng = Rng(0x10ad + c as u64);
                let mut samples = Vec::new();
                let mut i = c;
                while !stop.load(Ordering::Relaxed) && started.elapsed() < PHASE {
                    if total.fetch_add(1, Ordering::Relaxed) >= MAX_REQUESTS {
                        break;
                    }
                    let (path, payload) = body(&mut rng, i, &briefs);
                    i += CLIENTS;
                    let t = Instant::now();
                    let ok = post(&agent, &url, &path, &payload);
                    samples.push(t.elapsed());
                    if !ok {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                samples
            })
        })
        .collect();
    let mut all: Vec<Duration> = Vec::new();
    for t in threads {
        all.extend(t.join().unwrap_or_default());
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    all.sort();
    let pick = |p: f64| percentile(&all, p);
    println!(
        "| {} | {:.0}/s | {:.2} ms | {:.2} ms | {} requests, {} errors |",
        phase.name,
        all.len() as f64 / elapsed,
        pick(0.50).as_secs_f64() * 1e3,
        pick(0.99).as_secs_f64() * 1e3,
        all.len(),
        errors.load(Ordering::Relaxed)
    );
}

/// Senders in the open-loop mode: enough that a rate's schedule is never short of a free one
/// until the server itself falls behind.
const SENDERS: usize = 64;
const OPEN_PHASE: Duration = Duration::from_secs(4);
const RATES: [u64; 4] = [500, 1_000, 2_000, 4_000];

/// One open-loop phase: `rate` requests per second for `OPEN_PHASE`. Returns whether the rate
/// was sustained.
fn run_open(
    url: &str,
    store: &dyn MemoryStore,
    phase: &Phase,
    briefs: &Arc<Vec<String>>,
    rate: u64,
) -> bool {
    let n = rate * OPEN_PHASE.as_secs();
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    // Every sender connected, then the clock: set once, read by all after the second wait.
    let ready = Arc::new(Barrier::new(SENDERS + 1));
    let clock = Arc::new(OnceLock::<Instant>::new());
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let threads: Vec<_> = (0..SENDERS)
        .map(|c| {
            let (url, next, errors, briefs, ready, clock) = (
                url.to_owned(),
                Arc::clone(&next),
                Arc::clone(&errors),
                Arc::clone(briefs),
                Arc::clone(&ready),
                Arc::clone(&clock),
            );
            let body = phase.body;
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(10)))
                    .build()
                    .into();
                if agent.get(format!("{url}/healthz")).call().is_err() {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
                ready.wait();
                ready.wait();
                let start = *clock.get().expect("set between the two waits");
                let mut rng = Rng(0x0be1 + c as u64);
                let mut samples = Vec::new();
                let deadline = start + OPEN_PHASE + Duration::from_secs(2);
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= n {
                        break;
                    }
                    let intended = start + interval.mul_f64(k as f64);
                    // A request whose turn comes after the phase (plus a grace) is not sent:
                    // the rate was not sustained, and the count says so.
                    if Instant::now() > deadline {
                        break;
                    }
                    if let Some(wait) = intended.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    let (path, payload) = body(&mut rng, k as usize, &briefs);
                    let ok = post(&agent, &url, &path, &payload);
                    // From the intended send time: the time a caller on this schedule waits.
                    samples.push((intended.duration_since(start), intended.elapsed()));
                    if !ok {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                samples
            })
        })
        .collect();
    ready.wait();
    let _ = clock.set(Instant::now() + Duration::from_millis(10));
    ready.wait();
    let before = store.upkeep().unwrap_or_default();
    let steal = Steal::now();
    let mut timed: Vec<(Duration, Duration)> = Vec::new();
    for t in threads {
        timed.extend(t.join().unwrap_or_default());
    }
    let mut all: Vec<Duration> = timed.iter().map(|t| t.1).collect();
    let after = store.upkeep().unwrap_or_default();
    let steal = steal.since();
    // A stall shows as many slow requests in a few windows; a server that falls behind, or
    // cores taken from it, as slow requests spread over the phase.
    let slow: Vec<u128> = timed
        .iter()
        .filter(|(_, latency)| *latency > Duration::from_millis(10))
        .map(|(at, _)| at.as_millis() / 50)
        .collect();
    let moments = slow.iter().collect::<std::collections::BTreeSet<_>>().len();
    all.sort();
    let pick = |p: f64| percentile(&all, p);
    let achieved = all.len() as f64 / OPEN_PHASE.as_secs_f64();
    let sustained = all.len() as f64 >= 0.95 * n as f64 && pick(0.99) < Duration::from_millis(100);
    println!(
        "| {} | {rate}/s | {:.0}/s | {:.2} ms | {:.2} ms | {:.2} ms | {} in {moments} | {steal} | {} / {:.0} ms / {} | {} errors{} |",
        phase.name,
        achieved.min(rate as f64),
        pick(0.50).as_secs_f64() * 1e3,
        pick(0.99).as_secs_f64() * 1e3,
        pick(0.999).as_secs_f64() * 1e3,
        slow.len(),
        after.compactions_done.saturating_sub(before.compactions_done),
        after.compacting_micros.saturating_sub(before.compacting_micros) as f64 / 1e3,
        after.journal_syncs.since(&before.journal_syncs).count(),
        errors.load(Ordering::Relaxed),
        if sustained {
            ""
        } else {
            ", **not sustained** (the queue grows)"
        }
    );
    sustained
}

fn main() {
    let _tuned = lessons::allocator::tune();
    let dir = tempfile::tempdir().expect("dir");
    let store = EmbeddedStore::open(dir.path()).expect("open");
    let mut rng = Rng(0x5eed);
    for i in 0..5 {
        let s = ScopeKey::parse(&scope(i)).expect("valid");
        store
            .import(&records(&mut rng, &s, 500, 400))
            .expect("import");
    }
    store.flush().expect("flush");
    let words = vocabulary();
    let briefs = Arc::new(
        (0..64)
            .map(|_| brief(&mut rng, &words, 400))
            .collect::<Vec<_>>(),
    );
    let short = Arc::new(
        (0..64)
            .map(|_| brief(&mut rng, &words, 40))
            .collect::<Vec<_>>(),
    );
    let store: Arc<dyn MemoryStore> = Arc::new(store);
    let auth = Auth {
        token: Some(TOKEN.into()),
        read_token: None,
        open: false,
    };
    let server = Background::start(AppState::new(
        Arc::clone(&store),
        auth,
        ContextConfig::default(),
    ))
    .expect("server");
    let url = server.url();
    let mode = std::env::var("LESSONS_LOAD").unwrap_or_default();
    if mode != "closed" {
        println!("\nOpen loop: fixed arrival rate, latency from the intended send time, {}-second phases, {SENDERS} senders (server and senders share 2 cores)\n", OPEN_PHASE.as_secs());
        println!("| route | offered | completed | p50 | p99 | p99.9 | over 10 ms: requests / in how many 50 ms windows | steal | during it: compactions / their time / journal fsyncs | |");
        println!("|---|---|---|---|---|---|---|---|---|---|");
        let phases = [
            Phase {
                name: "/list (window read, 24 facts)",
                body: list_body,
            },
            Phase {
                name: "/retrieve (400-token brief, limit 8)",
                body: retrieve_body,
            },
            Phase {
                name: "/write (4 candidates, fsync)",
                body: write_body,
            },
        ];
        let mut saturation = Vec::new();
        for phase in &phases {
            let mut best = 0;
            let mut first_failed = None;
            for rate in RATES {
                if run_open(&url, store.as_ref(), phase, &briefs, rate) {
                    best = rate;
                } else if first_failed.is_none() {
                    first_failed = Some(rate);
                }
            }
            if let Some(mut high) = first_failed.filter(|&h| h > best) {
                for _ in 0..2 {
                    let mid = (best + high) / 2;
                    if run_open(&url, store.as_ref(), phase, &briefs, mid) {
                        best = mid;
                    } else {
                        high = mid;
                    }
                }
            }
            saturation.push((phase.name, best));
        }
        println!();
        for (name, best) in saturation {
            println!("{name}: saturates above {best}/s (the highest rate sustained)");
        }
        if mode == "open" {
            return;
        }
    }
    println!("\n{CLIENTS} concurrent clients over loopback, {}-second phases (server and clients share 2 cores)\n", PHASE.as_secs());
    println!("| route | requests/s | p50 | p99 | |");
    println!("|---|---|---|---|---|");
    run_phase(
        &url,
        &Phase {
            name: "/list (window read, 24 facts)",
            body: list_body,
        },
        &briefs,
    );
    run_phase(
        &url,
        &Phase {
            name: "/retrieve (400-token brief, limit 8)",
            body: retrieve_body,
        },
        &briefs,
    );
    run_phase(
        &url,
        &Phase {
            name: "/retrieve (40-token brief, limit 8)",
            body: retrieve_body,
        },
        &short,
    );
    run_phase(
        &url,
        &Phase {
            name: "/write (4 candidates, fsync)",
            body: write_body,
        },
        &briefs,
    );
}
