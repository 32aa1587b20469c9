//! A realistic mixed corpus for the gate: facts of 80–350 characters as extractors write them,
//! lessons and status lines mixed, half of them carrying non-ASCII words (accents, CJK, Hangul,
//! Greek, Cyrillic, emoji, typographic quotes and dashes), so the gate's non-ASCII path is timed
//! as well as its ASCII one. Deterministic: the same seed gives the same corpus.

/// Words a lesson is made of.
const WORDS: &[&str] = &[
    "the",
    "license",
    "check",
    "fails",
    "on",
    "a",
    "resident",
    "tree",
    "whose",
    "nested",
    "node_modules",
    "were",
    "dropped",
    "npm",
    "ci",
    "fixes",
    "it",
    "run",
    "before",
    "vitest",
    "workspace",
    "links",
    "cache",
    "volume",
    "read-only",
    "cargo",
    "test",
    "feature",
    "sqlite",
    "deploy",
    "script",
    "reads",
    "region",
    "stale",
    "shell",
    "profile",
    "lockfile",
    "regenerate",
    "instead",
    "of",
    "editing",
    "migrations",
    "seed",
    "step",
    "audit",
    "table",
    "formatter",
    "linter",
    "trailing",
    "commas",
    "hook",
    "docker",
    "compose",
    "healthcheck",
    "interval",
    "service",
    "retry",
    "flaky",
    "timeout",
    "suite",
    "job",
    "artifacts",
    "sigstore",
    "key",
    "once",
    "when",
    "staging",
    "websocket",
    "bundled",
    "import",
    "tests",
    "rows",
    "checks",
];

/// Non-ASCII words as they occur in real facts.
const FOREIGN: &[&str] = &[
    "résumé",
    "ça",
    "ü",
    "ö",
    "«quotes»",
    "—",
    "ドキュメント",
    "테스트",
    "Ελληνικά",
    "текст",
    "🎉",
    "✅",
    "naïve",
    "Straße",
    "数据库",
    "façade",
    "…",
];

/// Status and change-description fragments, each carrying a marker.
const STATUS: &[&str] = &[
    "pull request 1835 pushed at sha 3f9a2c1 with 10,512 tests passing",
    "the fix was merged after the retry; all green on main",
    "run 9f3e2a1b failed on the cache restore step",
    "the README now documents the frozen lockfile flag",
    "branch feat/registry-drift is ready for review",
    "spec rows 12 to 14 were added for the timeout table",
    "the fix was implemented in unit 4",
    "3 checks fail on arm64",
];

/// A small deterministic generator (xorshift64*), so the corpus needs no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

/// One fact: 80–350 characters; one in four carries a status fragment, one in two (decided
/// independently) mixes in non-ASCII words.
pub fn fact(rng: &mut Rng) -> String {
    let target = 80 + rng.below(271);
    let foreign = rng.below(2) == 0;
    let status = rng.below(4) == 0;
    let mut out = String::new();
    let mut placed = !status;
    while out.chars().count() < target {
        if !out.is_empty() {
            out.push(' ');
        }
        if !placed && rng.below(6) == 0 {
            out.push_str(STATUS[rng.below(STATUS.len())]);
            placed = true;
        } else if foreign && rng.below(3) == 0 {
            out.push_str(FOREIGN[rng.below(FOREIGN.len())]);
        } else {
            out.push_str(WORDS[rng.below(WORDS.len())]);
        }
    }
    let cut = out.char_indices().nth(target).map_or(out.len(), |(i, _)| i);
    out.truncate(cut);
    out
}

/// `count` facts from `seed`.
pub fn corpus(seed: u64, count: usize) -> Vec<String> {
    let mut rng = Rng(seed | 1);
    (0..count).map(|_| fact(&mut rng)).collect()
}
