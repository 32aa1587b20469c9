//! A status-heavy corpus for the gate: what an extractor writes when it reports instead of
//! teaching. 80–350 characters a line; about 71% of lines carry a marker, each of the nine
//! markers firing on more than a tenth of the lines; the separators and words the reference's
//! rules are sensitive to (dotted capital I, the Kelvin sign, no-break space, U+FEFF, the line
//! separator, em dashes) throughout; near misses in the lessons. Deterministic: the same seed
//! gives the same corpus.

/// Fragments that carry one marker each, by marker.
const MARKED: [&[&str]; 9] = [
    // reference
    &[
        "PR 1835",
        "pull request #204",
        "issues 88",
        "#412 was merged",
        "pull/77 is complete",
    ],
    // sha
    &[
        "at sha 3f9a2c1",
        "commit 9e1f00ab",
        "head d34db33f0c",
        "rebased onto 0a1b2c3d4e5f",
    ],
    // count
    &[
        "with 10,512 tests passing",
        "12 checks fail",
        "all 340 tests green",
        "3 rows failing",
    ],
    // delivery
    &[
        "was merged",
        "is now approved",
        "all green",
        "LGTM",
        "ready for review",
        "awaits CI",
    ],
    // identifier
    &[
        "run 9f3e2a1b",
        "branch feat/registry-drift",
        "run deadbeef",
        "branch fix/İndex-cache",
    ],
    // now
    &[
        "now documents the flag",
        "now really uses the cache",
        "now shows the counter",
        "now has a retry",
    ],
    // changed
    &[
        "was added",
        "have been renamed",
        "was fixed",
        "has been documented",
        "were removed",
    ],
    // unit
    &["unit 7", "unit u12", "Unit 3"],
    // spec-row
    &["spec row 4", "spec rows 12 to 14", "SPEC ROW"],
];

/// Words of lessons, near misses included (they must not fire).
const WORDS: &[&str] = &[
    "the",
    "license",
    "check",
    "fails",
    "when",
    "nested",
    "node_modules",
    "were",
    "dropped",
    "npm",
    "ci",
    "fixes",
    "it",
    "unit",
    "tests",
    "run",
    "serially",
    "the",
    "branch",
    "protection",
    "rule",
    "green",
    "builds",
    "hide",
    "flaky",
    "timing",
    "defaced",
    "accede",
    "1234567",
    "now",
    "run",
    "the",
    "migration",
    "first",
    "cache",
    "was",
    "stale",
    "İstanbul",
    "Kelvin",
    "5\u{212A}",
    "café",
    "naïve",
    "résumé",
    "日本語",
    "Ünïcode",
    "ﬁle",
    "straße",
    "ΣΊΣΥΦΟΣ",
];

/// Separators the rules treat specially (whitespace JavaScript's way, clause breaks).
const SEPARATORS: &[&str] = &[
    " ",
    " ",
    " ",
    " ",
    "\u{A0}",
    "\u{FEFF}",
    " \u{2014} ",
    "; ",
    ". ",
    "\u{2028}",
    " - ",
    ", ",
];

/// xorshift64*: small, seeded, stable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// `count` texts of the status-heavy corpus.
pub fn corpus(seed: u64, count: usize) -> Vec<String> {
    let mut rng = Rng(seed | 1);
    (0..count)
        .map(|_| {
            let target = 80 + rng.below(271);
            let status = rng.below(100) < 71;
            let mut out = String::new();
            let mut fragments: Vec<&str> = Vec::new();
            if status {
                for _ in 0..2 + rng.below(3) {
                    let kind = MARKED[rng.below(MARKED.len())];
                    fragments.push(kind[rng.below(kind.len())]);
                }
            }
            let mut next_fragment = 0;
            while out.chars().count() < target {
                if !out.is_empty() {
                    out.push_str(SEPARATORS[rng.below(SEPARATORS.len())]);
                }
                if next_fragment < fragments.len() && rng.below(3) == 0 {
                    out.push_str(fragments[next_fragment]);
                    next_fragment += 1;
                } else {
                    out.push_str(WORDS[rng.below(WORDS.len())]);
                }
            }
            for f in &fragments[next_fragment..] {
                out.push(' ');
                out.push_str(f);
            }
            let chars: Vec<char> = out.chars().collect();
            if chars.len() > 350 {
                // Trim from the middle, keeping the marked fragments at the end.
                let keep: String = chars[..120]
                    .iter()
                    .chain(&chars[chars.len() - 230..])
                    .collect();
                keep
            } else {
                out
            }
        })
        .collect()
}

/// The JSON line of `text`, half of them (by `escape`) with every non-ASCII character and
/// every space written as a `\u` escape, as some clients send them.
pub fn json_line(text: &str, escape: bool) -> String {
    if !escape {
        return serde_json::json!({ "text": text }).to_string();
    }
    let mut out = String::from("{\"text\":\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c == ' ' || !c.is_ascii() || (c as u32) < 0x20 => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push_str("\"}");
    out
}
