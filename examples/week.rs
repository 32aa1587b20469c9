//! Seven simulated days of reflections across three repositories, built to trip exactly these
//! review signals and no others:
//!
//! - **rejected** in every repository: on day 1 the extractor is status-heavy (half of what it
//!   offers is status: pull requests, shas, test counts), so each repository's week ends above
//!   one rejection in ten;
//! - **restated** in `acme/web` only: its extractor over-merges, restating three shown lessons
//!   for every new one it offers.
//!
//! Inserted facts stay far below 40 a day. Day 1 also stores three legacy status rows in
//! `acme/api` through a plain write (as an older bot did), and day 2 sweeps them. The store's
//! cap is 30, so `acme/api` evicts lessons it never used.
//!
//! `cargo run --example week -- [DIR]` fills DIR (default `./week-store`) and prints the review;
//! then `lessons --store DIR review` (exit 1: signals fired), `lessons --store DIR journal
//! --scope repo:acme/web --event restated`, or `lessons --store DIR serve` and open the page.

// A harness: a panic is its failure report (see Cargo.toml's lint policy).
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]
use std::error::Error;
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use lessons::memory::{reflect, shown_set};
use lessons::reflect::reflection_prompt;
use lessons::review::{review, Review, Thresholds};
use lessons::{
    Candidate, ContextConfig, EmbeddedStore, MemoryStore, Origin, RunScopes, ScopeKey, WriteOptions,
};

const DAY: i64 = 86_400_000;

fn wall_clock() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Day 1 of the week: midnight UTC six days before today, so the week is the last seven
/// calendar days, today included (what `lessons review` and the page cover by default).
pub fn start() -> i64 {
    (wall_clock().div_euclid(DAY) - 6) * DAY
}
/// The three repositories.
pub const REPOS: [&str; 3] = ["acme/api", "acme/web", "acme/cli"];

/// A lesson text that no marker trips: repository, day and run number make it unique.
fn lesson(repo: &str, day: i64, run: usize, n: usize) -> String {
    let topics = [
        "the lint step must run before the type check or its cache goes stale",
        "integration tests need the local registry mirror started first",
        "the release script reads the changelog heading, so keep its format",
        "schema migrations must be generated, never edited by hand",
        "the flaky upload test depends on the temp directory being empty",
    ];
    let topic = topics[(run + n) % topics.len()];
    format!("in {repo}, lesson d{day}r{run}n{n}: {topic}")
}

/// The extractor's reply for one run: `fresh` new lessons, `restate` restatements of shown
/// handles, `status` status lines.
fn reply(
    repo: &str,
    day: i64,
    run: usize,
    fresh: usize,
    restate: &[String],
    status: usize,
) -> String {
    let mut facts = Vec::new();
    for n in 0..fresh {
        facts.push(serde_json::json!({
            "text": lesson(repo, day, run, n), "confidence": 0.9, "audience": "repo"
        }));
    }
    for (i, handle) in restate.iter().enumerate() {
        facts.push(serde_json::json!({
            "text": format!("in {repo}, the same lesson again in other words (d{day}r{run}#{i})"),
            "confidence": 0.9, "audience": "repo", "restates": handle
        }));
    }
    for n in 0..status {
        let line = match n % 3 {
            0 => format!("pull request {} was merged after review", 1800 + run),
            1 => format!("pushed commit 3f9a2c{run} to the release branch"),
            _ => format!("{} tests passing on the main branch", 10_000 + run),
        };
        facts.push(serde_json::json!({"text": line, "confidence": 0.9, "audience": "repo"}));
    }
    serde_json::json!({"facts": facts, "summary": format!("run {run} of day {day} in {repo}")})
        .to_string()
}

/// Fills a store at `dir` with the week and returns the review as of the end of day 7.
pub fn run(dir: &Path) -> Result<Review, Box<dyn Error>> {
    let start = start();
    let clock = Arc::new(AtomicI64::new(start));
    let now = {
        let clock = Arc::clone(&clock);
        Arc::new(move || clock.load(Ordering::SeqCst))
    };
    let store = EmbeddedStore::builder().cap(30).clock(now).open(dir)?;
    let config = ContextConfig::default();
    for day in 1..=7i64 {
        for (r, repo) in REPOS.iter().enumerate() {
            let scopes = RunScopes::new("acme", Some(repo), Some("slack:C1"), None)?;
            let repo_key = ScopeKey::parse(&format!("repo:{repo}"))?;
            if day == 1 && r == 0 {
                // Legacy status rows from an older bot, written without the gate.
                let legacy = [
                    "PR 1700 merged into main",
                    "pushed 3f9a2c1 to the release branch",
                    "10,512 tests passing on main",
                ];
                let rows: Vec<Candidate> = legacy
                    .iter()
                    .map(|t| Candidate::fact(*t, "slack:C1:legacy"))
                    .collect();
                store.write(&repo_key, &rows, &WriteOptions::default())?;
            }
            if day == 2 && r == 0 {
                store.sweep(&repo_key, false)?;
            }
            let runs = if day == 1 { 4 } else { 3 };
            for run in 0..runs {
                // Early in each day; never later than now (today's runs, just after midnight).
                let at = start + (day - 1) * DAY + (r as i64) * 1_200_000 + (run as i64) * 300_000;
                clock.store(at.min(wall_clock()), Ordering::SeqCst);
                let brief = format!("run {run} in {repo}");
                let shown = shown_set(&store, &scopes, &brief, "done", &config)?;
                let prompt = reflection_prompt(&shown, &brief);
                let handles: Vec<String> = prompt
                    .shown
                    .iter()
                    .filter(|s| s.id.starts_with(&format!("mem:repo:{repo}:")))
                    .map(|s| s.handle.clone())
                    .collect();
                let over_merging = *repo == "acme/web" && day > 1;
                let (fresh, restate, status) = if day == 1 {
                    (2, Vec::new(), 3)
                } else if over_merging {
                    (1, handles.iter().take(3).cloned().collect(), 0)
                } else {
                    (2, Vec::new(), 0)
                };
                let text = reply(repo, day, run, fresh, &restate, status);
                reflect(
                    &store,
                    &scopes,
                    &text,
                    &prompt.shown,
                    Origin::Public,
                    &format!("slack:C1:{day}{run}"),
                    Some(&format!("run-{day}-{r}-{run}")),
                )?;
            }
        }
    }
    let end = (start + 6 * DAY + 2 * 3_600_000).min(wall_clock());
    clock.store(end, Ordering::SeqCst);
    let verdict = review(&store, 7, None, end, &Thresholds::default())?;
    store.close()?;
    Ok(verdict)
}

fn main() -> Result<(), Box<dyn Error>> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "week-store".to_owned());
    if Path::new(&dir).exists() {
        return Err(format!("{dir} exists; pass a new directory").into());
    }
    let verdict = run(Path::new(&dir))?;
    print!("{}", lessons::review::render(&verdict));
    println!("\nthe store is in {dir}: try `lessons --store {dir} review` or `lessons --store {dir} serve`");
    Ok(())
}
