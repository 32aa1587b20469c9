//! The gate: which status and change-description markers does a text carry?
//!
//! A fact that carries any marker is status (the state of one pull request at one moment) or a
//! description of one change, not a lesson, and is never stored. The rules reproduce the reference
//! bot's JavaScript regular expressions, which run without the Unicode flag:
//!
//! - letters match case-insensitively for ASCII only (the Kelvin sign is not `k`);
//! - a word character is `[A-Za-z0-9_]`, and `\b` sits between a word character and anything else;
//! - digits are ASCII `0-9`;
//! - whitespace is JavaScript's set (`text::is_js_whitespace`): U+FEFF is whitespace, U+0085 is not.
//!
//! The rules are decided by scanners that read the text once each: the words and what follows
//! them (`words`), the hexadecimal runs (`sha`) and the tokens near numbers (`count`). Each is
//! held to `model` — the reference's regular expressions compiled with `(?i-u)` and its plain
//! `split`s — by property tests, by the fuzz target and by the fixtures the reference answered.
//!
//! **Invariant:** [`rejection_markers`] is pure and total: no panics, no IO, time linear in the
//! text, memory bounded by the text.

#[cfg(any(test, feature = "__fuzzing"))]
pub mod model;
mod swar;
mod words;

/// The nine marker names, in the order [`rejection_markers`] reports them.
pub const MARKER_NAMES: [&str; 9] = [
    "reference",
    "sha",
    "count",
    "delivery",
    "identifier",
    "now",
    "changed",
    "unit",
    "spec-row",
];

/// A marker: one named reason a text is status or a change description rather than a lesson.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Marker {
    /// A pull request or issue as the fact's subject, or cited beside a delivery predicate.
    Reference,
    /// A commit hash: 7–40 hex characters with at least one digit and one letter.
    Sha,
    /// A test or check count beside an outcome word ("10,512 tests passing").
    Count,
    /// A delivery predicate ("was merged", "all green", "LGTM", "ready for review").
    Delivery,
    /// A run id (`run` + 8 hex) or a branch name with a `/`.
    Identifier,
    /// "now documents", "now really uses": what one change made the code do.
    Now,
    /// "was added", "have been renamed": what one change did.
    Changed,
    /// A plan-unit reference ("unit 3", "unit u12").
    Unit,
    /// "spec row" or "spec rows".
    SpecRow,
}

impl Marker {
    /// All markers in report order.
    pub const ALL: [Marker; 9] = [
        Marker::Reference,
        Marker::Sha,
        Marker::Count,
        Marker::Delivery,
        Marker::Identifier,
        Marker::Now,
        Marker::Changed,
        Marker::Unit,
        Marker::SpecRow,
    ];

    /// The marker's wire name (`"spec-row"`, `"sha"`, …).
    pub fn name(self) -> &'static str {
        MARKER_NAMES.get(self as usize).copied().unwrap_or("")
    }

    /// The marker with this wire name, if any.
    pub fn from_name(name: &str) -> Option<Marker> {
        Marker::ALL.into_iter().find(|m| m.name() == name)
    }
}

impl std::fmt::Display for Marker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The markers `text` carries, in [`Marker::ALL`] order. Empty means the text may be a lesson.
///
/// Pure and total: any string, any length, never panics.
///
/// ```
/// use lessons::gate::{rejection_markers, Marker};
/// assert_eq!(rejection_markers("PR 12 was merged"), vec![Marker::Reference, Marker::Delivery]);
/// assert!(rejection_markers("run npm ci before the license check").is_empty());
/// ```
pub fn rejection_markers(text: &str) -> Vec<Marker> {
    let found = words::scan(text);
    let mut out = Vec::new();
    let reference = words::opens_with_reference(text)
        || (found.citation
            && found.delivery
            && clauses(text).any(|c| {
                let here = words::scan(c);
                here.citation && here.delivery
            }));
    if reference {
        out.push(Marker::Reference);
    }
    let (sha, digit) = scan_sha(text);
    if sha {
        out.push(Marker::Sha);
    }
    if digit && found.outcome && found.noun && has_count(text) {
        out.push(Marker::Count);
    }
    let rest = [
        (found.delivery, Marker::Delivery),
        (found.identifier, Marker::Identifier),
        (found.now, Marker::Now),
        (found.changed, Marker::Changed),
        (found.unit, Marker::Unit),
        (found.spec_row, Marker::SpecRow),
    ];
    out.extend(rest.into_iter().filter(|(hit, _)| *hit).map(|(_, m)| m));
    out
}

/// The marker names `text` carries, in report order (the wire form of [`rejection_markers`]).
pub fn rejection_marker_names(text: &str) -> Vec<&'static str> {
    rejection_markers(text)
        .into_iter()
        .map(Marker::name)
        .collect()
}

/// Does `text` carry any marker?
pub fn is_status(text: &str) -> bool {
    !rejection_markers(text).is_empty()
}

/// The clauses of `text`: the pieces between runs of `;` `.` `!` `?` `\n` and `—`.
///
/// Split on bytes: the ASCII separators are single bytes, `—` is the only sequence `E2 80 94`,
/// and every cut falls on a character boundary of valid UTF-8.
fn clauses(text: &str) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let (mut start, mut i) = (0, 0);
    std::iter::from_fn(move || {
        while i < bytes.len() {
            let cut = match bytes
                .get(i)
                .and_then(|&b| BYTE_CLASS.get(usize::from(b)).copied())
            {
                Some(CLAUSE_END) => 1,
                Some(MAYBE_DASH) if bytes.get(i + 1..i + 3) == Some(&[0x80, 0x94]) => 3,
                _ => 0,
            };
            if cut == 0 {
                i += 1;
                continue;
            }
            let piece = text.get(start..i);
            i += cut;
            start = i;
            if let Some(piece) = piece.filter(|p| !p.is_empty()) {
                return Some(piece);
            }
        }
        let rest = text.get(start..).filter(|p| !p.is_empty());
        start = bytes.len();
        rest
    })
}

/// `table`'s entry for byte `b`.
// A byte always indexes a 256-entry table (the check compiles away).
#[allow(clippy::indexing_slicing)]
#[inline(always)]
fn class(table: &[u8; 256], b: u8) -> u8 {
    table[usize::from(b)]
}

/// Byte classes for [`has_sha`]: 0 ends a run; otherwise the bits say what the byte adds.
const SHA_DIGIT: u8 = 1;
const SHA_HEX_LETTER: u8 = 2;
const SHA_OTHER_LETTER: u8 = 4;
// Built at compile time, where an index out of range is a compile error, not a panic.
#[allow(clippy::indexing_slicing)]
static SHA_CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = if c.is_ascii_digit() {
            SHA_DIGIT
        } else if matches!(c, b'a'..=b'f' | b'A'..=b'F') {
            SHA_HEX_LETTER
        } else if c.is_ascii_alphabetic() {
            SHA_OTHER_LETTER
        } else {
            0
        };
        b += 1;
    }
    t
};

/// `sha`: a maximal run of ASCII letters and digits, 7 to 40 long, all hexadecimal, with at least
/// one digit and at least one letter a–f (either case).
#[cfg(test)]
fn has_sha(text: &str) -> bool {
    scan_sha(text).0
}

/// `(sha, any ASCII digit)`. Eight bytes a step: whether any byte is a digit, and where 7
/// hexadecimal characters stand in a row, which every `sha` needs; only the maximal run of
/// letters and digits around such a place is judged byte by byte, once.
fn scan_sha(text: &str) -> (bool, bool) {
    use swar::{between, ONES};
    let bytes = text.as_bytes();
    let (mut any_digit, mut window) = (0u64, 0u64);
    // Bytes before this index belong to runs already judged.
    let mut judged = 0usize;
    let mut sha = false;
    let mut i = 0;
    while i < bytes.len() {
        let w = swar::load(bytes, i);
        let digit = between(w, 0x2F, 0x3A);
        let hex = digit | between(w | (ONES * 0x20), 0x60, 0x67);
        any_digit |= digit;
        // Byte j's mark to bit j, then into the top byte of a window of the last 64 bytes:
        // window bit b stands for byte i + b - 56.
        let bits = swar::bits(hex);
        window = (window >> 8) | (bits << 56);
        let mut seven = window;
        for shift in 1..7 {
            seven &= window >> shift;
        }
        // Bit b of `seven`: bytes from i + b - 56 on are seven hexadecimal characters. Those
        // that end in this word start at bit 50 or later, so each place is seen once.
        let mut starts = seven & (u64::MAX << 50);
        while !sha && starts != 0 {
            let b = starts.trailing_zeros() as usize;
            starts &= starts - 1;
            let at = (i + b).saturating_sub(56);
            if at >= judged {
                let (found, end) = judge_run(bytes, at);
                sha = found;
                judged = end;
            }
        }
        i += 8;
    }
    (sha, any_digit != 0)
}

/// Judges the maximal run of ASCII letters and digits around `bytes[at]`: `(is it a sha, the
/// index just past it)`.
fn judge_run(bytes: &[u8], at: usize) -> (bool, usize) {
    let alnum = |b: &u8| class(&SHA_CLASS, *b) != 0;
    let before = bytes.get(..at).unwrap_or_default();
    let start = at - before.iter().rev().take_while(|b| alnum(b)).count();
    let after = bytes.get(at..).unwrap_or_default();
    let end = at + after.iter().take_while(|b| alnum(b)).count();
    let run = bytes.get(start..end).unwrap_or_default();
    let seen = run.iter().fold(0, |seen, b| seen | class(&SHA_CLASS, *b));
    (
        seen == SHA_DIGIT | SHA_HEX_LETTER && (7..=40).contains(&run.len()),
        end,
    )
}

/// `count`: some clause holds an outcome word and a number within three tokens of
/// `test`/`tests`/`checks`/`rows`, tokens being the clause lowercased (full Unicode lowercasing,
/// as JavaScript's `toLowerCase`) and split on every character outside `a-z0-9`.
fn has_count(text: &str) -> bool {
    near_pair_clauses(text, |clause| words::scan(clause).outcome)
}

/// Byte classes for [`clauses`] and [`near_pair_clauses`]: the one place that says which bytes
/// cut a clause and which make a token.
const TOKEN_BYTE: u8 = 1;
const CLAUSE_END: u8 = 2;
const MAYBE_DASH: u8 = 3;
const MAYBE_DOTTED_I: u8 = 4;
// Built at compile time, where an index out of range is a compile error, not a panic.
#[allow(clippy::indexing_slicing)]
static BYTE_CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = if c.is_ascii_alphanumeric() {
            TOKEN_BYTE
        } else if matches!(c, b';' | b'.' | b'!' | b'?' | b'\n') {
            CLAUSE_END
        } else if c == 0xE2 {
            MAYBE_DASH
        } else if c == 0xC4 {
            MAYBE_DOTTED_I
        } else {
            0
        };
        b += 1;
    }
    t
};

/// What a token is to `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    /// All ASCII digits.
    Number,
    /// `test`, `tests`, `checks` or `rows`.
    Noun,
    Other,
}

/// The token that starts at `i` (where [`near_pair_clauses`] saw one start): the index past it
/// and its sort. A token of plain ASCII letters and digits that fits in eight bytes and is not
/// followed by a byte that may continue it (the Kelvin sign) is read and judged in one `u64`;
/// any other is walked byte by byte.
fn read_token(bytes: &[u8], mut i: usize) -> (usize, Token) {
    let head = swar::load(bytes, i);
    let len = swar::bits(swar::alnum(head)).trailing_ones() as usize;
    let next = bytes.get(i + len).map(|&b| class(&BYTE_CLASS, b));
    if (1..8).contains(&len) && !matches!(next, Some(MAYBE_DASH | MAYBE_DOTTED_I)) {
        let key = (head | (swar::ONES * 0x20)) & (u64::MAX >> (64 - 8 * len));
        let sort = if swar::bits(swar::digit(head)).trailing_ones() as usize >= len {
            Token::Number
        } else if COUNT_NOUNS.contains(&key) {
            Token::Noun
        } else {
            Token::Other
        };
        return (i + len, sort);
    }
    let kelvin = |i: usize| bytes.get(i..i + 3) == Some(&[0xE2, 0x84, 0xAA]);
    let dotted_i = |i: usize| bytes.get(i..i + 2) == Some(&[0xC4, 0xB0]);
    // The token, lowercased; only its first six letters matter (the longest noun).
    let (mut word, mut len, mut digits) = ([0u8; 6], 0usize, true);
    let mut push = |c: u8, len: &mut usize| {
        if let Some(slot) = word.get_mut(*len) {
            *slot = c;
        }
        *len += 1;
    };
    loop {
        match bytes.get(i).map(|&b| (b, class(&BYTE_CLASS, b))) {
            Some((c, TOKEN_BYTE)) => {
                digits &= c.is_ascii_digit();
                push(c.to_ascii_lowercase(), &mut len);
                i += 1;
            }
            Some((_, MAYBE_DASH)) if kelvin(i) => {
                digits = false;
                push(b'k', &mut len);
                i += 3;
            }
            Some((_, MAYBE_DOTTED_I)) if dotted_i(i) => {
                // `i` then U+0307, which is no token character: the token ends.
                digits = false;
                push(b'i', &mut len);
                i += 2;
                break;
            }
            _ => break,
        }
    }
    let token = word.get(..len).unwrap_or_default();
    let sort = if digits {
        Token::Number
    } else if [&b"test"[..], b"tests", b"checks", b"rows"].contains(&token) {
        Token::Noun
    } else {
        Token::Other
    };
    (i, sort)
}

/// The nouns of `count`, folded as [`read_token`] folds a token.
const COUNT_NOUNS: [u64; 4] = [
    u64::from_le_bytes(*b"test\0\0\0\0"),
    u64::from_le_bytes(*b"tests\0\0\0"),
    u64::from_le_bytes(*b"checks\0\0"),
    u64::from_le_bytes(*b"rows\0\0\0\0"),
];

/// Whether some clause of `text` (as [`clauses`] cuts them) holds an all-digit token within
/// three tokens of `test`/`tests`/`checks`/`rows` and `accept`s; tokens are the runs of `a-z0-9`
/// of the clause lowercased as JavaScript lowercases it.
///
/// Lowercasing yields an ASCII letter or digit for exactly two characters besides ASCII
/// capitals (checked over every character): the Kelvin sign (`k`, inside a token) and the
/// dotted capital I (`i` and a combining dot, which ends the token). So the raw bytes are read
/// with those two read as their letters, and nothing is lowercased or copied.
///
/// One pass over the bytes: whichever of a near pair comes second sees the nearest earlier token
/// of the other sort, so each clause needs only the last index of each.
fn near_pair_clauses(text: &str, mut accept: impl FnMut(&str) -> bool) -> bool {
    let bytes = text.as_bytes();
    let (mut last_number, mut last_word) = (None::<usize>, None::<usize>);
    let (mut k, mut i, mut start, mut near) = (0usize, 0usize, 0usize, false);
    let mut end_clause =
        |from: usize, to: usize, near: bool| near && text.get(from..to).is_some_and(&mut accept);
    let kelvin = |i: usize| bytes.get(i..i + 3) == Some(&[0xE2, 0x84, 0xAA]);
    let dotted_i = |i: usize| bytes.get(i..i + 2) == Some(&[0xC4, 0xB0]);
    let class_at = |i: usize| {
        bytes
            .get(i)
            .and_then(|&b| BYTE_CLASS.get(usize::from(b)).copied())
    };
    let starts_token = |i: usize| match class_at(i) {
        Some(TOKEN_BYTE) => true,
        Some(MAYBE_DASH) => kelvin(i),
        Some(MAYBE_DOTTED_I) => dotted_i(i),
        _ => false,
    };
    while let Some(&b) = bytes.get(i) {
        let class = class(&BYTE_CLASS, b);
        if starts_token(i) {
            let (end, sort) = read_token(bytes, i);
            i = end;
            match sort {
                Token::Number => {
                    near |= last_word.is_some_and(|w| k - w <= 3);
                    last_number = Some(k);
                }
                Token::Noun => {
                    near |= last_number.is_some_and(|n| k - n <= 3);
                    last_word = Some(k);
                }
                Token::Other => {}
            }
            k += 1;
            continue;
        }
        match class {
            CLAUSE_END => {}
            MAYBE_DASH if bytes.get(i + 1..i + 3) == Some(&[0x80, 0x94]) => {}
            _ => {
                i += 1;
                continue;
            }
        }
        if end_clause(start, i, near) {
            return true;
        }
        i += if b == 0xE2 { 3 } else { 1 };
        (start, k, near, last_number, last_word) = (i, 0, false, None, None);
    }
    end_clause(start, bytes.len(), near)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(text: &str) -> Vec<&'static str> {
        rejection_marker_names(text)
    }

    #[test]
    fn marker_names_round_trip() {
        for m in Marker::ALL {
            assert_eq!(Marker::from_name(m.name()), Some(m));
        }
        assert_eq!(Marker::from_name("lesson"), None);
    }

    #[test]
    fn js_whitespace_differs_from_rust_where_the_reference_does() {
        assert!(crate::text::is_js_whitespace('\u{FEFF}'));
        assert!(!crate::text::is_js_whitespace('\u{85}'));
        assert!(!crate::text::is_js_whitespace('\u{200B}'));
    }

    #[test]
    fn ascii_only_case_folding() {
        assert_eq!(names("spec row"), ["spec-row"]);
        assert_eq!(names("SPEC ROWS"), ["spec-row"]);
        // U+017F LATIN SMALL LETTER LONG S is not `s` for the reference.
        assert!(names("\u{17F}pec row").is_empty());
    }

    #[test]
    fn count_uses_unicode_lowercasing_for_tokens() {
        // The Kelvin sign lowercases to `k`, so "chec\u{212A}s" is the token "checks".
        assert_eq!(names("12 chec\u{212A}s failed"), ["count"]);
        assert!(names("12 checks exist").is_empty());
    }

    mod scanners_agree_with_the_model {
        use super::super::{clauses, has_count, has_sha, model, rejection_markers, Marker};
        use proptest::prelude::*;

        /// Pieces that sit on every edge the scanners decide: separators (the em dash and its
        /// look-alikes), the two characters whose lowercase is ASCII, hex runs of every length
        /// around 7 and 40, count words beside numbers, outcome words.
        const PIECES: &[&str] = &[
            "test",
            "tests",
            "TESTS",
            "checks",
            "chec\u{212A}s",
            "rows",
            "12",
            "10,512",
            " ",
            "\t",
            "\u{a0}",
            ";",
            ".",
            "!",
            "?",
            "\n",
            "\u{2014}",
            "\u{2013}",
            "\u{e2}",
            "-",
            "pass",
            "FAILED",
            "green",
            "\u{130}",
            "\u{212A}",
            "deadbee",
            "f00d",
            "abc",
            "1234567",
            "C0FFEE",
            "Dead",
            "9",
            "g1",
            "a",
            "0",
            "\u{e9}",
            "\u{1F389}",
            "\u{30c9}",
            "_",
            "\u{3a3}",
            "x_tests",
            "rows_",
        ];

        fn text() -> impl Strategy<Value = String> {
            prop::collection::vec(prop::sample::select(PIECES), 0..30).prop_map(|p| p.concat())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(4000))]
            #[test]
            fn sha_count_and_clauses(t in text()) {
                prop_assert_eq!(has_sha(&t), model::has_sha(&t));
                prop_assert_eq!(has_count(&t), model::has_count(&t));
                // The whole gate, with the cheap preconditions it checks before the scanners.
                let markers = rejection_markers(&t);
                prop_assert_eq!(markers.contains(&Marker::Sha), model::has_sha(&t));
                prop_assert_eq!(markers.contains(&Marker::Count), model::has_count(&t));
                prop_assert!(!model::has_count(&t) || super::super::words::scan(&t).noun);
                prop_assert_eq!(&markers, &model::markers(&t));
                prop_assert_eq!(
                    clauses(&t).collect::<Vec<_>>(),
                    model::clauses(&t).collect::<Vec<_>>()
                );
            }
        }
    }
}
