//! Gate throughput on realistic fact texts: facts per second on one core.
//!
//! Four corpora: ~110-character facts (goal: ≥ 1,000,000 facts/s), a 100–350 character ASCII
//! mix of lessons and status lines as an extractor writes them, the realistic mixed corpus
//! (80–350 characters, half with non-ASCII words; `support/gate_corpus.rs`) and the
//! status-heavy one (71% marked, the separators the rules are sensitive to throughout;
//! `support/status_corpus.rs`). `examples/gate_corpus.rs` writes the last two out for the
//! whole-process measurement against node.

// A harness: a panic is its failure report (see Cargo.toml's lint policy).
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use lessons::gate::rejection_markers;
use std::hint::black_box;

#[path = "support/gate_corpus.rs"]
mod gate_corpus;
// The example also writes the corpus as JSON lines; the bench only needs the texts.
#[allow(dead_code)]
#[path = "support/status_corpus.rs"]
mod status_corpus;

const LESSONS: [&str; 10] = [
    "the license check fails on a resident tree whose nested node_modules were dropped; npm ci fixes it",
    "run pnpm install --frozen-lockfile before vitest, or the workspace links point at stale builds",
    "the e2e suite needs PLAYWRIGHT_BROWSERS_PATH=0 in CI because the cache volume is read-only there",
    "cargo test in this repository needs the sqlite feature; without it the store tests are skipped silently",
    "the deploy script reads AWS_REGION before AWS_DEFAULT_REGION, so a stale shell profile wins over .envrc",
    "the registry drift check names any tree or lockfile drift; regenerate the lockfile instead of editing it",
    "the staged rebuild (issue 170) must budget the swap, or the 2-core runner is killed by the OOM reaper",
    "migrations must run before the seed step; the seed assumes the audit table exists and fails opaquely",
    "the formatter and the linter disagree on trailing commas; run the formatter last in the pre-commit hook",
    "docker compose v2 ignores the version key; the healthcheck interval must be set per service instead",
];

const STATUS: [&str; 6] = [
    "pull request 1835 pushed at sha 3f9a2c1 with 10,512 tests passing on the second attempt",
    "the fix for the flaky login test in #2201 was merged after the retry; all green on main",
    "run 9f3e2a1b failed on the cache restore step, then passed after the runner image was bumped",
    "the README now documents the --frozen-lockfile flag and the troubleshooting section was updated",
    "branch feat/registry-drift is ready for review; 3 checks fail on arm64 and await CI re-run",
    "spec rows 12 to 14 were added for the timeout table and unit u7 owns the rest of the sweep",
];

/// Facts of about `target` characters: each seed text padded or cut at a word boundary.
fn corpus(target: usize, count: usize) -> Vec<String> {
    let seeds: Vec<&str> = LESSONS.iter().chain(STATUS.iter()).copied().collect();
    (0..count)
        .map(|i| {
            let mut fact = String::from(seeds[i % seeds.len()]);
            let mut j = i;
            while fact.len() < target {
                j += 7;
                fact.push_str("; ");
                fact.push_str(seeds[j % seeds.len()]);
            }
            let cut = fact[..target.min(fact.len())]
                .rfind(' ')
                .unwrap_or(target.min(fact.len()));
            fact.truncate(cut);
            fact
        })
        .collect()
}

fn gate(c: &mut Criterion) {
    let mut group = c.benchmark_group("gate");
    let short = corpus(110, 1000);
    let mixed: Vec<String> = (0..1000)
        .map(|i| {
            corpus(100 + (i * 37) % 251, i + 1)
                .pop()
                .unwrap_or_default()
        })
        .collect();
    let unicode = gate_corpus::corpus(0x9a7e, 1000);
    let status = status_corpus::corpus(0x9a7e, 1000);
    for (name, facts) in [
        ("facts_110_chars", &short),
        ("facts_100_to_350_chars", &mixed),
        ("mixed_80_to_350_chars_half_non_ascii", &unicode),
        ("status_heavy_80_to_350_chars", &status),
    ] {
        group.throughput(Throughput::Elements(facts.len() as u64));
        group.bench_with_input(BenchmarkId::from_parameter(name), facts, |b, facts| {
            b.iter(|| {
                let mut rejected = 0usize;
                for fact in facts {
                    rejected += usize::from(!rejection_markers(black_box(fact)).is_empty());
                }
                rejected
            })
        });
    }
    group.finish();
}

criterion_group!(benches, gate);
criterion_main!(benches);
