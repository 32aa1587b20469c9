//! One pass over a text's words decides every marker whose pattern opens with a word.
//!
//! Each such pattern ([`super::model`] holds them as the reference writes them) begins at a word
//! boundary with one of a few words — `was`, `is`, `now`, `unit`, `spec`, `branch`, … — followed
//! by whitespace, `/` or a boundary, so its first word is a whole maximal run of word characters.
//! The scan walks the runs, folds each short one into a `u64` key, and only where the key names
//! such a word reads on, a word or two, as the pattern would. None of the patterns backtrack
//! into anything but whitespace runs that must be taken whole, so reading on needs no search.
//!
//! Word characters are `[A-Za-z0-9_]` and letters fold ASCII-only, as JavaScript reads a pattern
//! without the Unicode flag; whitespace is JavaScript's `\s` ([`space_len`]).

use super::swar;

/// The whole-text patterns that matched somewhere in a text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Found {
    pub delivery: bool,
    pub identifier: bool,
    pub now: bool,
    pub changed: bool,
    pub unit: bool,
    pub spec_row: bool,
    /// `#` and a digit, or `pull/` / `issues/` and a digit.
    pub citation: bool,
    pub outcome: bool,
    /// A word that may hold a `count` noun token: `test`, `tests`, `checks`, `rows`, `chec`
    /// (before a Kelvin sign, which lowercases to `k`), or any `_` in the text (a token ends
    /// at `_`, a word does not). Loose on purpose: it only spares texts the `count` scan.
    pub noun: bool,
}

/// `[A-Za-z0-9_]`, the word characters of `\b` and `\w` without the Unicode flag.
// Built at compile time, where an index out of range is a compile error, not a panic.
#[allow(clippy::indexing_slicing)]
static WORD: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric() || c == b'_';
        b += 1;
    }
    t
};

fn is_word(b: u8) -> bool {
    WORD.get(usize::from(b)).copied().unwrap_or(false)
}

/// The length in bytes of the JavaScript whitespace character at `i`, or 0. The text is valid
/// UTF-8, so a lead byte and its continuation bytes name one character.
pub(super) fn space_len(bytes: &[u8], i: usize) -> usize {
    let tail = |n: usize| bytes.get(i + 1..i + n);
    match bytes.get(i) {
        Some(b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ') => 1,
        Some(0xC2) if tail(2) == Some(&[0xA0]) => 2,
        Some(0xE1) if tail(3) == Some(&[0x9A, 0x80]) => 3,
        Some(0xE2) => match tail(3) {
            // U+2000–U+200A, U+2028, U+2029, U+202F; U+205F.
            Some(&[0x80, 0x80..=0x8A | 0xA8 | 0xA9 | 0xAF]) | Some(&[0x81, 0x9F]) => 3,
            _ => 0,
        },
        Some(0xE3) if tail(3) == Some(&[0x80, 0x80]) => 3,
        Some(0xEF) if tail(3) == Some(&[0xBB, 0xBF]) => 3,
        _ => 0,
    }
}

fn skip_spaces(bytes: &[u8], mut i: usize) -> usize {
    loop {
        match space_len(bytes, i) {
            0 => return i,
            n => i += n,
        }
    }
}

fn word_end(bytes: &[u8], mut i: usize) -> usize {
    while bytes.get(i).is_some_and(|&b| is_word(b)) {
        i += 1;
    }
    i
}

/// A word: a maximal run of word characters.
#[derive(Clone, Copy)]
struct Word {
    start: usize,
    end: usize,
    /// [`key`] of the word, or 0 when it is longer than eight bytes.
    key: u64,
}

/// The word that starts at `start` (a word character). One read of eight bytes measures and
/// folds any word that fits in them; only longer ones are walked to their end.
fn word_at(bytes: &[u8], start: usize) -> Word {
    let head = swar::load(bytes, start);
    let len = swar::bits(swar::word(head)).trailing_ones() as usize;
    let end = if len < 8 {
        start + len
    } else {
        word_end(bytes, start + 8)
    };
    let key = if end - start <= 8 {
        (head | (swar::ONES * 0x20)) & (u64::MAX >> (64 - 8 * len))
    } else {
        0
    };
    Word { start, end, key }
}

/// After one or more whitespace characters at `i`, the word that follows.
fn next_word(bytes: &[u8], i: usize) -> Option<Word> {
    let start = skip_spaces(bytes, i);
    (start > i && bytes.get(start).is_some_and(|&b| is_word(b))).then(|| word_at(bytes, start))
}

/// A set of words: those of at most eight bytes by key, the longer ones spelled out.
struct Words {
    short: &'static [u64],
    long: &'static [&'static str],
}

impl Words {
    fn holds(&self, bytes: &[u8], word: Word) -> bool {
        if word.key != 0 {
            return self.short.contains(&word.key);
        }
        let text = bytes.get(word.start..word.end).unwrap_or_default();
        self.long
            .iter()
            .any(|w| text.eq_ignore_ascii_case(w.as_bytes()))
    }

    const fn one(key: &'static [u64]) -> Words {
        Words {
            short: key,
            long: &[],
        }
    }
}

/// After `i`: whitespace, up to `between` words each followed by whitespace, then a word of
/// `targets` — `{S}+(?:{W}+{S}+){0,between}(?:targets)\b`.
fn reaches(bytes: &[u8], mut i: usize, between: usize, targets: &Words) -> bool {
    for _ in 0..=between {
        let Some(word) = next_word(bytes, i) else {
            return false;
        };
        if targets.holds(bytes, word) {
            return true;
        }
        i = word.end;
    }
    false
}

/// A word of at most eight bytes folded to lowercase and packed little-endian; 0 for longer
/// words. Word bytes are never 0, so words of different lengths never share a key, and `| 0x20`
/// lowercases a capital without making any other word byte a letter (`_` becomes DEL).
// `j` stays below `word.len()`; a `const fn` has no `get` to say so.
#[allow(clippy::indexing_slicing)]
const fn key(word: &[u8]) -> u64 {
    if word.len() > 8 {
        return 0;
    }
    let mut k = 0u64;
    let mut j = 0;
    while j < word.len() {
        k |= ((word[j] | 0x20) as u64) << (8 * j);
        j += 1;
    }
    k
}

/// What a word opens: the patterns [`after_word`] reads on for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Opens {
    Nothing,
    /// `was`, `were`: a delivery predicate or a change.
    WasWere,
    /// `is`: a delivery predicate or `is complete`.
    Is,
    /// `are`: a delivery predicate.
    Are,
    /// `has`, `have`: `been` and a change.
    HasHave,
    All,
    Lgtm,
    Ready,
    Await,
    Now,
    Run,
    Branch,
    Unit,
    Spec,
    /// `pull`, `issues`: a citation when `/` and a digit follow.
    Cites,
    Outcome,
    Noun,
}

/// Every word [`after_word`] reads on after.
const OPENERS: [(&[u8], Opens); 32] = [
    (b"was", Opens::WasWere),
    (b"were", Opens::WasWere),
    (b"is", Opens::Is),
    (b"are", Opens::Are),
    (b"has", Opens::HasHave),
    (b"have", Opens::HasHave),
    (b"all", Opens::All),
    (b"lgtm", Opens::Lgtm),
    (b"ready", Opens::Ready),
    (b"await", Opens::Await),
    (b"awaits", Opens::Await),
    (b"now", Opens::Now),
    (b"run", Opens::Run),
    (b"branch", Opens::Branch),
    (b"unit", Opens::Unit),
    (b"spec", Opens::Spec),
    (b"pull", Opens::Cites),
    (b"issues", Opens::Cites),
    (b"pass", Opens::Outcome),
    (b"passes", Opens::Outcome),
    (b"passing", Opens::Outcome),
    (b"passed", Opens::Outcome),
    (b"green", Opens::Outcome),
    (b"fail", Opens::Outcome),
    (b"fails", Opens::Outcome),
    (b"failing", Opens::Outcome),
    (b"failed", Opens::Outcome),
    (b"test", Opens::Noun),
    (b"tests", Opens::Noun),
    (b"checks", Opens::Noun),
    (b"chec", Opens::Noun),
    (b"rows", Opens::Noun),
];

/// A multiplier that sends the 32 opening words' keys to 32 different slots of 64 (found by
/// search; the table below refuses to compile if a word is added that collides).
const SLOT_MUL: u64 = 0x0a9a_6838_63eb_dddb;

const fn slot(key: u64) -> usize {
    (key.wrapping_mul(SLOT_MUL) >> 58) as usize
}

/// The opening words by slot: one load and one comparison tell any other word apart, and the
/// slot says what the word opens, so no chain of comparisons stands between a word and its
/// patterns.
// Built at compile time, where an index out of range is a compile error, not a panic.
#[allow(clippy::indexing_slicing)]
static SLOTS: [(u64, Opens); 64] = {
    let mut t = [(0u64, Opens::Nothing); 64];
    let mut j = 0;
    while j < OPENERS.len() {
        let k = key(OPENERS[j].0);
        let s = slot(k);
        assert!(
            t[s].0 == 0,
            "two opening words share a slot: choose another multiplier"
        );
        t[s] = (k, OPENERS[j].1);
        j += 1;
    }
    t
};

const DELIVERED: Words = Words::one(&[key(b"pushed"), key(b"merged"), key(b"approved")]);
const CHANGED: Words = Words {
    short: &[
        key(b"added"),
        key(b"updated"),
        key(b"fixed"),
        key(b"removed"),
        key(b"renamed"),
        key(b"extended"),
    ],
    long: &["implemented", "documented", "introduced"],
};
const NOW_DOES: Words = Words {
    short: &[
        key(b"displays"),
        key(b"includes"),
        key(b"carries"),
        key(b"has"),
        key(b"is"),
        key(b"supports"),
        key(b"shows"),
        key(b"maps"),
        key(b"controls"),
        key(b"applies"),
        key(b"uses"),
    ],
    long: &["documents", "preserves"],
};
const COMPLETE: Words = Words::one(&[key(b"complete")]);
const GREEN_AFTER_ALL: Words = Words::one(&[key(b"green")]);
const FOR: Words = Words::one(&[key(b"for")]);
const REVIEW: Words = Words::one(&[key(b"review")]);
const CI: Words = Words::one(&[key(b"ci")]);
const BEEN: Words = Words::one(&[key(b"been")]);
const ROW: Words = Words::one(&[key(b"row"), key(b"rows")]);

/// `branch{S}+{N}*/{N}` after `branch`: the run of non-whitespace that follows the whitespace
/// holds a `/` that is not its last character.
fn names_branch(bytes: &[u8], i: usize) -> bool {
    let mut at = skip_spaces(bytes, i);
    if at == i {
        return false;
    }
    let mut slash = false;
    while let Some(&b) = bytes.get(at) {
        if space_len(bytes, at) > 0 {
            return false;
        }
        if slash {
            return true;
        }
        slash = b == b'/';
        at += 1;
    }
    false
}

/// Reads on after a word that ends at `i`, for every pattern it `opens` that `found` has not
/// matched yet.
fn after_word(found: &mut Found, opens: Opens, bytes: &[u8], i: usize) {
    // `{S}+` then a word of `first`, then `{S}+` then a word of `second`.
    let two = |first: &Words, second: &Words| {
        next_word(bytes, i)
            .is_some_and(|w| first.holds(bytes, w) && reaches(bytes, w.end, 0, second))
    };
    match opens {
        Opens::WasWere | Opens::Is | Opens::Are => {
            if !found.delivery {
                found.delivery = reaches(bytes, i, 2, &DELIVERED)
                    || (opens == Opens::Is && reaches(bytes, i, 0, &COMPLETE));
            }
            if !found.changed && opens == Opens::WasWere {
                found.changed = reaches(bytes, i, 0, &CHANGED);
            }
        }
        Opens::HasHave if !found.changed => found.changed = two(&BEEN, &CHANGED),
        Opens::All if !found.delivery => found.delivery = reaches(bytes, i, 0, &GREEN_AFTER_ALL),
        Opens::Lgtm => found.delivery = true,
        Opens::Ready if !found.delivery => found.delivery = two(&FOR, &REVIEW),
        Opens::Await if !found.delivery => found.delivery = reaches(bytes, i, 0, &CI),
        Opens::Now if !found.now => found.now = reaches(bytes, i, 1, &NOW_DOES),
        Opens::Run if !found.identifier => {
            found.identifier = next_word(bytes, i).is_some_and(|w| {
                let word = bytes.get(w.start..w.end).unwrap_or_default();
                word.len() == 8 && word.iter().all(u8::is_ascii_hexdigit)
            });
        }
        Opens::Branch if !found.identifier => found.identifier = names_branch(bytes, i),
        Opens::Unit if !found.unit => {
            found.unit = next_word(bytes, i).is_some_and(|w| {
                let word = bytes.get(w.start..w.end).unwrap_or_default();
                let digits = word
                    .strip_prefix(b"u")
                    .or_else(|| word.strip_prefix(b"U"))
                    .unwrap_or(word);
                !digits.is_empty() && digits.iter().all(u8::is_ascii_digit)
            });
        }
        Opens::Spec if !found.spec_row => found.spec_row = reaches(bytes, i, 0, &ROW),
        Opens::Cites if !found.citation => {
            found.citation =
                bytes.get(i) == Some(&b'/') && bytes.get(i + 1).is_some_and(u8::is_ascii_digit);
        }
        Opens::Outcome => found.outcome = true,
        Opens::Noun => found.noun = true,
        _ => {}
    }
}

/// Every whole-text pattern that matches somewhere in `text`, in one pass over its words.
///
/// Eight bytes a step find where words start; each word is then read as one `u64` (its first
/// nine bytes say whether it fits in eight), so the bytes inside words are never visited one
/// by one.
pub(super) fn scan(text: &str) -> Found {
    let bytes = text.as_bytes();
    let mut found = Found::default();
    // Whether the byte before the current eight is a word character.
    let mut after_word_byte = 0u64;
    let mut i = 0;
    while i < bytes.len() {
        let x = swar::load(bytes, i);
        let word = swar::bits(swar::word(x));
        let mut starts = word & !((word << 1) | after_word_byte);
        after_word_byte = (word >> 7) & 1;
        found.noun |= swar::equal(x, b'_') != 0;
        let mut hashes = swar::bits(swar::equal(x, b'#'));
        while hashes != 0 {
            let at = i + hashes.trailing_zeros() as usize;
            hashes &= hashes - 1;
            found.citation |= bytes.get(at + 1).is_some_and(u8::is_ascii_digit);
        }
        while starts != 0 {
            let start = i + starts.trailing_zeros() as usize;
            starts &= starts - 1;
            let word = word_at(bytes, start);
            if let Some(&(key, opens)) = SLOTS.get(slot(word.key)) {
                if key == word.key && key != 0 {
                    after_word(&mut found, opens, bytes, word.end);
                }
            }
        }
        i += 8;
    }
    found
}

/// `^{S}*(?:pr|pull{S}+request|issue|unit)s?{S}*#?[0-9]+\b`: the text opens with a pull request,
/// issue or unit as its subject. Every step is forced (no alternative shares a prefix with
/// another, and `s`, whitespace, `#` and digits exclude one another), so one reading decides it.
pub(super) fn opens_with_reference(text: &str) -> bool {
    let bytes = text.as_bytes();
    let at = |i: usize, lit: &[u8]| {
        bytes
            .get(i..i + lit.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(lit))
    };
    let mut i = skip_spaces(bytes, 0);
    if at(i, b"pull") {
        let gap = skip_spaces(bytes, i + 4);
        if gap == i + 4 || !at(gap, b"request") {
            return false;
        }
        i = gap + 7;
    } else if at(i, b"pr") {
        i += 2;
    } else if at(i, b"issue") {
        i += 5;
    } else if at(i, b"unit") {
        i += 4;
    } else {
        return false;
    }
    if at(i, b"s") {
        i += 1;
    }
    i = skip_spaces(bytes, i);
    if bytes.get(i) == Some(&b'#') {
        i += 1;
    }
    let digits = i;
    while bytes.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    i > digits && !bytes.get(i).is_some_and(|&b| is_word(b))
}

#[cfg(test)]
mod tests {
    use super::super::model;
    use super::*;
    use proptest::prelude::*;
    use regex::Regex;
    use std::sync::LazyLock;

    #[test]
    fn space_is_javascripts_whitespace_for_every_character() {
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
            let mut buf = [0u8; 4];
            let s = c.encode_utf8(&mut buf);
            let len = space_len(s.as_bytes(), 0);
            assert_eq!(len > 0, crate::text::is_js_whitespace(c), "{c:?}");
            assert!(len == 0 || len == s.len(), "{c:?}");
        }
    }

    #[test]
    fn keys_tell_words_apart() {
        let was = key(b"was");
        assert_eq!(key(b"WAS"), was);
        assert_ne!(key(b"was_"), was);
        assert_ne!(key(b"wa"), was);
        assert_eq!(key(b"passing1"), key(b"PASSING1"));
        assert_eq!(key(b"ninechars"), 0);
    }

    /// Every opening word and what may follow it, in both cases, and words that are close.
    const WORDS: &[&str] = &[
        "was",
        "WERE",
        "is",
        "are",
        "has",
        "Have",
        "been",
        "all",
        "green",
        "lgtm",
        "ready",
        "for",
        "review",
        "await",
        "awaits",
        "ci",
        "complete",
        "now",
        "uses",
        "documents",
        "run",
        "deadbeef",
        "DEADBEE",
        "0123abcd9",
        "branch",
        "feat/x",
        "/",
        "a/",
        "unit",
        "u12",
        "U",
        "7",
        "spec",
        "rows",
        "row",
        "pull",
        "issues",
        "issue",
        "pr",
        "request",
        "#",
        "#1",
        "pushed",
        "merged",
        "approved",
        "added",
        "renamed",
        "pass",
        "FAILED",
        "passes",
        "the",
        "_",
        "x",
        "9",
        "\u{212a}",
        "\u{e9}",
    ];

    /// What stands between words: mostly one space, and every other edge — other whitespace,
    /// characters that look like it but are not, nothing at all, punctuation.
    const GAPS: &[&str] = &[
        " ", " ", " ", " ", " ", "  ", "\t", "\n", "\u{a0}", "\u{2028}", "\u{205f}", "\u{3000}",
        "\u{feff}", "\u{1680}", "\u{85}", "\u{200b}", "", "", "/", "-", ".", ";", "\u{2014}",
    ];

    fn text() -> impl Strategy<Value = String> {
        let piece = (prop::sample::select(WORDS), prop::sample::select(GAPS));
        (
            prop::sample::select(GAPS),
            prop::collection::vec(piece, 0..9),
        )
            .prop_map(|(lead, p)| {
                let mut t = lead.to_string();
                for (word, gap) in p {
                    t.push_str(word);
                    t.push_str(gap);
                }
                t
            })
    }

    /// The reference's patterns, compiled once: delivery, identifier, now, changed, unit,
    /// spec row, citation, outcome, subject.
    static PATTERNS: LazyLock<Vec<Regex>> = LazyLock::new(|| {
        [
            model::DELIVERY,
            model::IDENTIFIER,
            model::NOW,
            model::CHANGED,
            model::UNIT,
            model::SPEC_ROW,
            model::REFERENCE_CITATION,
            model::OUTCOME,
            model::REFERENCE_SUBJECT,
        ]
        .into_iter()
        .map(model::pattern)
        .collect()
    });

    fn by_model(t: &str) -> (Found, bool) {
        let is = |i: usize| PATTERNS[i].is_match(t);
        let found = Found {
            delivery: is(0),
            identifier: is(1),
            now: is(2),
            changed: is(3),
            unit: is(4),
            spec_row: is(5),
            citation: is(6),
            outcome: is(7),
            noun: false,
        };
        (found, is(8))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(6000))]
        #[test]
        fn the_word_scan_is_the_patterns(t in text()) {
            let found = Found { noun: false, ..scan(&t) };
            prop_assert_eq!((found, opens_with_reference(&t)), by_model(&t), "{:?}", t);
        }
    }
}
