//! Crash safety: a child process writes reflections and prints an ack after each write returns;
//! the parent kills it with SIGKILL at a random point, reopens the store, and checks that every
//! acknowledged write is there, that no write is half there, and that the keyword index agrees
//! with the records. Many rounds on one store; one round in five kills the child while it
//! opens the store, so recovery itself is crashed into too, and the child closes and reopens
//! the store every 13 writes, so kills land inside a clean close (which empties the journal).
//!
//! `cargo test` runs 100 rounds (100 kill points); `LESSONS_CRASH_ROUNDS=N` runs N, and
//! `LESSONS_CRASH_SEED=S` replays the run that printed seed S.

// A harness: a panic is its failure report (see Cargo.toml's lint policy).
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lessons::{Candidate, EmbeddedStore, Kind, MemoryStore, ScopeKey, Status, WriteOptions};

/// The tests' one seeded generator, seeded here from the clock: each run kills at different
/// points.
#[path = "it/fixtures/rng.rs"]
mod rng;
use rng::Rng;

const CHILD: &str = "LESSONS_CRASH_CHILD";
const START: &str = "LESSONS_CRASH_START";
/// Rounds (kill points) unless `LESSONS_CRASH_ROUNDS` says otherwise.
const ROUNDS: usize = 100;

fn repo() -> ScopeKey {
    ScopeKey::parse("repo:acme/app").expect("valid scope")
}

/// The three records write `i` inserts, plus a restate of record 0 (from write 1 on).
fn reflection(i: u64) -> Vec<Candidate> {
    let mut cs = vec![
        Candidate::fact(
            format!("lesson {i} uniqa{i} the cache must be warmed before the e2e suite"),
            "crash",
        ),
        Candidate::fact(
            format!("lesson {i} uniqb{i} run the migrations before seeding"),
            "crash",
        ),
        Candidate::summary(format!("run {i} summary uniqc{i}"), "crash"),
    ];
    if i > 0 {
        cs.push(
            Candidate::fact("a paraphrase of the first lesson", "crash")
                .restating("mem:repo:acme/app:0"),
        );
    }
    cs
}

fn child(dir: &str, start: u64) {
    let mut store = EmbeddedStore::open(dir).expect("child opens the store");
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for i in start.. {
        let options = WriteOptions {
            cap: Some(10_000),
            tally: None,
            rejected: Vec::new(),
        };
        store
            .write(&repo(), &reflection(i), &options)
            .expect("child write");
        writeln!(out, "ack {i}").expect("ack");
        out.flush().expect("flush");
        if i % 7 == 0 {
            let _ = store.retrieve(&repo(), &format!("uniqb{i}"), 3);
        }
        // As a CLI does: a clean close (memtables into tables, the spent journal emptied) and
        // a new open, so kills land inside both too.
        if i % 13 == 12 {
            store.close().expect("child close");
            store = EmbeddedStore::open(dir).expect("child reopens the store");
        }
    }
}

fn main() {
    if let Ok(dir) = std::env::var(CHILD) {
        let start = std::env::var(START)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        child(&dir, start);
        return;
    }
    // `LESSONS_CRASH_SEED` replays a run (the seed is printed first).
    let seed = rng::seed_from("LESSONS_CRASH_SEED") | 1;
    println!("crash test seed {seed}");
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().expect("scratch dir");
    let path = dir.path().to_str().expect("utf-8 path").to_owned();
    let exe = std::env::current_exe().expect("own path");
    let mut acked: BTreeSet<u64> = BTreeSet::new();
    let mut next = 0u64;
    let rounds = std::env::var("LESSONS_CRASH_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(ROUNDS);
    for round in 0..rounds {
        let mut proc = Command::new(&exe)
            .env(CHILD, &path)
            .env(START, next.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("child starts");
        let stdout = proc.stdout.take().expect("piped");
        // One round in five kills during open (recovery, index replay); the others after
        // 1–40 acks.
        let kill_after = if rng.below(5) == 0 {
            0
        } else {
            1 + rng.below(40)
        };
        let mut lines = BufReader::new(stdout).lines();
        let started = Instant::now();
        let mut seen = 0;
        if kill_after == 0 {
            std::thread::sleep(Duration::from_micros(rng.below(30_000)));
        }
        while seen < kill_after && started.elapsed() < Duration::from_secs(60) {
            match lines.next() {
                Some(Ok(line)) => {
                    let i: u64 = line
                        .strip_prefix("ack ")
                        .and_then(|n| n.parse().ok())
                        .expect("ack line");
                    acked.insert(i);
                    seen += 1;
                }
                _ => panic!("the child died before it was killed"),
            }
        }
        // Land the kill between acks, inside the next write, at a random depth.
        std::thread::sleep(Duration::from_micros(rng.below(3000)));
        proc.kill().expect("SIGKILL");
        let status = proc.wait().expect("reaped");
        assert!(!status.success(), "the child must die by the signal");
        // Acks the child printed before dying but the parent had not read yet.
        for line in lines.map_while(Result::ok) {
            if let Some(i) = line.strip_prefix("ack ").and_then(|n| n.parse().ok()) {
                acked.insert(i);
            }
        }

        let store = EmbeddedStore::open(&path).expect("reopen after SIGKILL");
        let mut present: BTreeSet<u64> = BTreeSet::new();
        let mut texts = BTreeSet::new();
        // Past the scope's cap (10,000 records, about 230 rounds) the least recently used are
        // evicted: the only way a record of this test leaves the active set.
        let mut evicted = BTreeSet::new();
        store
            .export(&mut |r| {
                assert!(
                    matches!(r.status, Status::Active | Status::Evicted),
                    "{} is {:?}",
                    r.id,
                    r.status
                );
                if r.status == Status::Evicted {
                    evicted.insert(r.text.clone());
                }
                texts.insert((r.kind, r.text.clone()));
                Ok(())
            })
            .expect("export");
        if !evicted.is_empty() {
            assert_eq!(
                store.active_count(&repo()).expect("count"),
                10_000,
                "round {round}: records are evicted only at the cap"
            );
        }
        let written = next + acked.len() as u64 + 64;
        for i in 0..written {
            let parts = reflection(i);
            let have: Vec<bool> = parts[..3]
                .iter()
                .map(|c| texts.contains(&(c.kind.unwrap_or(Kind::Fact), c.text.clone())))
                .collect();
            assert!(
                have.iter().all(|&h| h) || have.iter().all(|&h| !h),
                "round {round}: write {i} is half there: {have:?}"
            );
            if have[0] {
                present.insert(i);
            }
        }
        for i in &acked {
            assert!(
                present.contains(i),
                "round {round}: acknowledged write {i} was lost"
            );
        }
        // A round killed while the store was being created leaves it empty.
        if !present.is_empty() {
            let first = store
                .get("mem:repo:acme/app:0")
                .expect("get")
                .expect("record 0 exists");
            assert_eq!(
                first.use_count,
                present.len() as u64 - 1,
                "round {round}: every restate of a present write counted once"
            );
        }
        // The index must hold every present write; checking this round's and a sample of
        // earlier ones keeps a round's cost flat as the store grows (`check` below compares
        // the whole index with the records).
        let sample: Vec<u64> = present
            .iter()
            .copied()
            .filter(|i| *i >= next || rng.below(present.len() as u64 / 20 + 1) == 0)
            .filter(|i| !evicted.contains(&reflection(*i)[1].text))
            .collect();
        for i in &sample {
            let hits = store
                .retrieve(&repo(), &format!("uniqb{i}"), 1)
                .expect("retrieve");
            assert_eq!(hits.len(), 1, "round {round}: the index lost write {i}");
        }
        let health = store.check().expect("check");
        assert!(health.is_ok(), "round {round}: {health:?}");
        next = present.last().map_or(0, |i| i + 1);
        store.close().expect("close");
        println!(
            "round {round}: killed after {seen} acks; {} writes present, all {} acks kept",
            present.len(),
            acked.len()
        );
    }
    println!("test result: ok. 1 passed; 0 failed");
}
