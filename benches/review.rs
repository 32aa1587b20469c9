//! The week's review on stores whose journals are full, and how its cost grows: with the number
//! of scopes (it reads each scope's evidence) and not with the journals' length (it reads each
//! event's newest entries, within its limits).
//!
//! Three stores, each scope holding 500 active records (80% facts) and a full decision journal
//! whose entries span the last 30 days (all eight events, most of them inserts):
//! - 45 scopes × 10,000 entries (the default `journalCap`);
//! - 450 scopes × 10,000 entries (ten times the scopes);
//! - 45 scopes × 100,000 entries (ten times the journal, `journalCap` 100,000).
//!
//! Then each scope takes 100 lessons the way runs write them, 25 writes of 4 at its cap, which
//! evict 100 records never used: the newest entries are a write's own, stored without their
//! texts, and the review reads the texts of the evictions it shows from their records.
//!
//! Each store is timed at rest: once built, the bench waits until nothing waits to flush, no
//! compaction runs and the index has committed (`EmbeddedStore::upkeep`), as a store is between
//! bursts of writes. A review during a compaction backlog costs more at every size (up to 2×
//! here), and which size the backlog lands on would decide the ratio.
//!
//! A review's sweep preview reads only the facts written since the scope's last sweep or
//! review (see `EmbeddedStore`'s sweep): the first review after open reads every active fact
//! and is shown apart; the repeats read only what is new, which here is nothing.
//!
//! Timed: `review` over every scope and the last 7 days, in process (what `lessons review`
//! runs after it opens the store) and as `POST /review` on a server over the same store, each
//! 11 times after one warm-up (`LESSONS_REVIEW_RUNS=N` for N); p50 and the slowest, and each
//! p50 over the first row's in the same column. The three stores are open together and
//! reviewed in turn, a round at a time, so the ratios compare reviews taken in the same
//! minutes. The repeats are warm: the block cache and each scope's gate mark are kept from the
//! review before, and no writes come between reviews. Building the stores takes a minute.
//!
//! `cargo bench --bench review`

// A harness: a panic is its failure report (see Cargo.toml's lint policy).
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use lessons::model::Tally;
use lessons::review::{review, Thresholds};
use lessons::server::{AppState, Auth, Background};
use lessons::{
    Candidate, ContextConfig, Decision, DecisionEvent, EmbeddedStore, MemoryStore, ScopeKey,
    WriteOptions,
};
use support::{records, text, vocabulary, Rng, NOW};

/// The allocator the `lessons` binary runs on (see `lessons::allocator`): the review's cost is
/// mostly small allocations, and glibc's arena for this thread, fragmented by building the
/// stores, makes the in-process rows up to 2× slower than the same review over HTTP.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const DAY: i64 = 86_400_000;
/// Timed reviews of each store, in process and over HTTP (`LESSONS_REVIEW_RUNS`, default 11):
/// more of them give a profiler a long enough sample of the reviews alone.
fn runs() -> usize {
    std::env::var("LESSONS_REVIEW_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(11)
}

/// A journal entry of `scope` at `time`, of an event drawn as a busy repository's are.
fn entry(rng: &mut Rng, words: &[&str], scope: &ScopeKey, time: i64, seq: u64) -> Decision {
    let event = match rng.below(100) {
        0..=39 => DecisionEvent::Inserted,
        40..=54 => DecisionEvent::Deduped,
        55..=64 => DecisionEvent::Restated,
        65..=79 => DecisionEvent::Rejected,
        80..=94 => DecisionEvent::Evicted,
        95..=97 => DecisionEvent::Superseded,
        98 => DecisionEvent::Swept,
        _ => DecisionEvent::Forgotten,
    };
    let mut d = Decision::new(time, scope, event);
    d.texts.push(text(rng, words, 40));
    match event {
        DecisionEvent::Rejected => d.markers.push("sha".into()),
        DecisionEvent::Restated => {
            d.ids.push(scope.record_id(seq % 500));
            d.texts.push(text(rng, words, 40));
        }
        DecisionEvent::Evicted => {
            d.ids.push(scope.record_id(seq));
            d.age_ms = Some(rng.below(30) as i64 * DAY);
            d.use_count = Some(rng.below(3) as u64);
        }
        _ => d.ids.push(scope.record_id(seq)),
    }
    d
}

/// A store of `scopes` scopes, each with 500 active records and `journal` entries.
fn build(dir: &std::path::Path, scopes: usize, journal: usize) -> EmbeddedStore {
    let store = EmbeddedStore::builder()
        .journal(90, journal)
        .clock(Arc::new(|| NOW))
        .open(dir)
        .expect("open");
    let words = vocabulary();
    let mut rng = Rng(0x7e71e3);
    for s in 0..scopes {
        let scope = ScopeKey::parse(&format!("repo:acme/app{s}")).expect("scope");
        store
            .import(&records(&mut rng, &scope, 500, 0))
            .expect("records");
        let mut chunk = Vec::with_capacity(1000);
        let mut rejected = 0;
        for i in 0..journal {
            // Spread over 30 days, oldest first, as a journal grows.
            let time = NOW - 30 * DAY + (i as i64 * 30 * DAY) / journal as i64;
            let d = entry(&mut rng, &words, &scope, time, i as u64);
            rejected += u64::from(d.event == DecisionEvent::Rejected);
            chunk.push(d);
            if chunk.len() == 1000 {
                store.import_decisions(&chunk).expect("journal");
                chunk.clear();
            }
        }
        store.import_decisions(&chunk).expect("journal");
        // The day's counters, as the reflections behind those entries would have left them.
        let tally = Tally {
            offered: rejected * 4,
            rejected,
            rejected_by: [("sha".to_owned(), rejected)].into(),
        };
        let options = WriteOptions {
            tally: Some(tally),
            ..WriteOptions::default()
        };
        store.write(&scope, &[], &options).expect("counters");
        for _ in 0..25 {
            let facts: Vec<Candidate> = (0..4)
                .map(|_| Candidate::fact(text(&mut rng, &words, 300), "slack:C1:1"))
                .collect();
            store
                .write(&scope, &facts, &WriteOptions::default())
                .expect("lessons");
        }
        let shown = lessons::DecisionQuery {
            never_used: true,
            events: vec![DecisionEvent::Evicted],
            limit: 100,
            ..lessons::DecisionQuery::default()
        };
        let evicted = store.decisions(&scope, &shown).expect("journal");
        assert!(
            evicted.len() == 100 && evicted.iter().all(|d| d.time == NOW && d.texts.len() == 1),
            "the review's evictions are the writes' own, each read with its text"
        );
    }
    store
}

/// Waits until the store's background work has stopped for a second (at most 10 minutes):
/// how long that took.
fn settle(store: &EmbeddedStore) -> Duration {
    let started = Instant::now();
    store.flush().expect("flush");
    let mut quiet = 0;
    while quiet < 5 && started.elapsed() < Duration::from_secs(600) {
        std::thread::sleep(Duration::from_millis(200));
        quiet = if store.upkeep().is_some_and(|u| u.at_rest()) {
            quiet + 1
        } else {
            0
        };
    }
    started.elapsed()
}

fn p50_max(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (samples[samples.len() / 2], samples[samples.len() - 1])
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// One review of every scope in process: how long it took.
fn review_once(store: &dyn MemoryStore) -> Duration {
    let started = Instant::now();
    let r = review(store, 7, None, NOW, &Thresholds::default()).expect("review");
    assert!(!r.scopes.is_empty());
    started.elapsed()
}

/// One `POST /review` of the last 7 days: how long it took, the body read whole.
fn post_once(agent: &ureq::Agent, server: &Background, token: &str) -> Duration {
    let started = Instant::now();
    let mut resp = agent
        .post(format!("{}/review", server.url()))
        .header("content-type", "application/json")
        .header("authorization", &format!("Bearer {token}"))
        .send(br#"{"days":7}"#.as_slice())
        .expect("answered");
    // The evictions shown carry their records' texts (some 300 characters each): at 450 scopes
    // the body passes ureq's default limit of 10 MiB.
    let body = resp
        .body_mut()
        .with_config()
        .limit(64 << 20)
        .read_to_string()
        .expect("body");
    assert_eq!(resp.status().as_u16(), 200, "{body}");
    started.elapsed()
}

fn main() {
    let _tuned = lessons::allocator::tune();
    let shapes = [(45, 10_000), (450, 10_000), (45, 100_000)];
    println!("\nThe week's review (7 days, every scope) on full journals\n");
    let mut dirs = Vec::new();
    let mut stores: Vec<Arc<EmbeddedStore>> = Vec::new();
    for (scopes, journal) in shapes {
        let dir = tempfile::tempdir().expect("dir");
        let built = Instant::now();
        let store = build(dir.path(), scopes, journal);
        eprintln!(
            "built {scopes} scopes × {journal} entries in {:.0} s",
            built.elapsed().as_secs_f64()
        );
        dirs.push(dir);
        stores.push(Arc::new(store));
    }
    // Settled after all are built: a store built first would otherwise compact while the
    // others are timed.
    for (store, (scopes, journal)) in stores.iter().zip(shapes) {
        let settled = settle(store);
        eprintln!(
            "{scopes} scopes × {journal} entries at rest after {:.1} s ({:?})",
            settled.as_secs_f64(),
            store.upkeep()
        );
    }
    let stores: Vec<Arc<dyn MemoryStore>> = stores
        .into_iter()
        .map(|s| s as Arc<dyn MemoryStore>)
        .collect();
    // Each store's first review, then the repeats taken in turn, one review of each store a
    // round, so the machine's drift over the minutes they take falls on every store alike.
    let first: Vec<Duration> = stores.iter().map(|s| review_once(s.as_ref())).collect();
    let mut local = vec![Vec::new(); stores.len()];
    for round in 0..=runs() {
        for (store, samples) in stores.iter().zip(&mut local) {
            let took = review_once(store.as_ref());
            if round > 0 {
                samples.push(took);
            }
        }
    }
    let token = "bench-token-0123456789";
    let servers: Vec<Background> = stores
        .iter()
        .map(|store| {
            let auth = Auth {
                token: Some(token.into()),
                read_token: None,
                open: false,
            };
            Background::start(AppState::new(
                Arc::clone(store),
                auth,
                ContextConfig::default(),
            ))
            .expect("server")
        })
        .collect();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut http = vec![Vec::new(); stores.len()];
    for round in 0..=runs() {
        for (server, samples) in servers.iter().zip(&mut http) {
            let took = post_once(&agent, server, token);
            if round > 0 {
                samples.push(took);
            }
        }
    }
    println!("| store | first review (reads every fact) | review in process p50 (slowest) | `POST /review` p50 (slowest) | p50 ÷ the first row's: in process / HTTP |");
    println!("|---|---|---|---|---|");
    let mut base = None;
    for (i, (scopes, journal)) in shapes.into_iter().enumerate() {
        let (l50, lmax) = p50_max(local[i].clone());
        let (h50, hmax) = p50_max(http[i].clone());
        let (lbase, hbase) = *base.get_or_insert((l50, h50));
        println!(
            "| {scopes} scopes × {journal} entries | {} | {} ({}) | {} ({}) | {:.2}× / {:.2}× |",
            ms(first[i]),
            ms(l50),
            ms(lmax),
            ms(h50),
            ms(hmax),
            l50.as_secs_f64() / lbase.as_secs_f64(),
            h50.as_secs_f64() / hbase.as_secs_f64()
        );
    }
}
