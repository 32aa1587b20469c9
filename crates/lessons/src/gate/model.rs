//! The gate's rules written the way the reference writes them: one regular expression per
//! pattern, clauses split with `split`, tokens made by lowercasing a whole clause. Slow and
//! plain on purpose: it is what the one-pass scanners in [`super`] are held to, by a property
//! test and by the fuzz target, on every text either produces.

use std::sync::LazyLock;

use regex::Regex;

use super::Marker;

/// The reference's whitespace set (JavaScript `\s`), as a regex class body.
const WS: &str = r"\t\n\x0B\x0C\r \u{A0}\u{1680}\u{2000}-\u{200A}\u{2028}\u{2029}\u{202F}\u{205F}\u{3000}\u{FEFF}";

/// Compiles a pattern written with `{S}` (one whitespace character), `{N}` (one non-whitespace
/// character) and `{W}` (one word character) under ASCII-only case folding and ASCII `\b`, as
/// JavaScript reads a pattern without the Unicode flag.
// Constant patterns, each compiled by the tests that hold the scanners to this model.
#[allow(clippy::expect_used)]
fn compile(pattern: &str) -> Regex {
    let s = format!("(?u:[{WS}])");
    let n = format!("(?u:[^{WS}])");
    let body = pattern
        .replace("{S}", &s)
        .replace("{N}", &n)
        .replace("{W}", "[A-Za-z0-9_]");
    Regex::new(&format!("(?i-u){body}")).expect("gate pattern compiles")
}

/// A delivery predicate: `was|were|is|are` then at most two words then `pushed|merged|approved`;
/// `all green`; `lgtm`; `ready for review`; `await(s) ci`; `is complete`.
pub(crate) const DELIVERY: &str = r"\b(?:(?:was|were|is|are){S}+(?:{W}+{S}+){0,2}(?:pushed|merged|approved)|all{S}+green|lgtm|ready{S}+for{S}+review|awaits?{S}+ci|is{S}+complete)\b";

/// The opening-subject form of `reference`: "PR 12", "pull request #3", "issues 4".
pub(crate) const REFERENCE_SUBJECT: &str =
    r"^{S}*(?:pr|pull{S}+request|issue|unit)s?{S}*#?[0-9]+\b";

/// A reference inside a clause: `#` and a digit, or `pull/` / `issues/` and a digit.
pub(crate) const REFERENCE_CITATION: &str = r"#[0-9]|\b(?:pull|issues)/[0-9]";

pub(crate) const IDENTIFIER: &str = r"\brun{S}+[0-9a-f]{8}\b|\bbranch{S}+{N}*/{N}";

pub(crate) const NOW: &str = r"\bnow{S}+(?:{W}+{S}+)?(?:documents|preserves|displays|includes|carries|has|is|supports|shows|maps|controls|applies|uses)\b";

pub(crate) const CHANGED: &str = r"\b(?:was|were|has{S}+been|have{S}+been){S}+(?:implemented|added|updated|fixed|documented|removed|renamed|introduced|extended)\b";

pub(crate) const UNIT: &str = r"\bunit{S}+u?[0-9]+\b";

pub(crate) const SPEC_ROW: &str = r"\bspec{S}+rows?\b";

pub(crate) const OUTCOME: &str =
    r"\b(?:pass|passes|passing|passed|green|fail|fails|failing|failed)\b";

struct Patterns {
    subject: Regex,
    citation: Regex,
    delivery: Regex,
    outcome: Regex,
    /// The markers decided by one pattern anywhere in the text, in report order.
    rest: [(Marker, Regex); 6],
}

static PATTERNS: LazyLock<Patterns> = LazyLock::new(|| Patterns {
    subject: compile(REFERENCE_SUBJECT),
    citation: compile(REFERENCE_CITATION),
    delivery: compile(DELIVERY),
    outcome: compile(OUTCOME),
    rest: [
        (Marker::Delivery, compile(DELIVERY)),
        (Marker::Identifier, compile(IDENTIFIER)),
        (Marker::Now, compile(NOW)),
        (Marker::Changed, compile(CHANGED)),
        (Marker::Unit, compile(UNIT)),
        (Marker::SpecRow, compile(SPEC_ROW)),
    ],
});

/// The clauses: the pieces between `;` `.` `!` `?` `\n` and `—`, empty ones dropped.
pub(crate) fn clauses(text: &str) -> impl Iterator<Item = &str> {
    text.split([';', '.', '!', '?', '\n', '\u{2014}'])
        .filter(|c| !c.is_empty())
}

/// `sha`: some maximal run of ASCII letters and digits is 7–40 hexadecimal characters with a
/// digit and a letter.
pub(crate) fn has_sha(text: &str) -> bool {
    text.split(|c: char| !c.is_ascii_alphanumeric()).any(|run| {
        (7..=40).contains(&run.len())
            && run.chars().all(|c| c.is_ascii_hexdigit())
            && run.chars().any(|c| c.is_ascii_digit())
            && run.chars().any(|c| c.is_ascii_alphabetic())
    })
}

/// `count`: a clause with an outcome word holds an all-digit token within three tokens of
/// `test`, `tests`, `checks` or `rows`, tokens being the lowercased clause split on every
/// character outside `a-z0-9`.
pub(crate) fn has_count(text: &str) -> bool {
    clauses(text).any(|clause| {
        if !PATTERNS.outcome.is_match(clause) {
            return false;
        }
        let lower = clause.to_lowercase();
        let tokens: Vec<&str> = lower
            .split(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit()))
            .filter(|t| !t.is_empty())
            .collect();
        tokens.iter().enumerate().any(|(i, t)| {
            t.bytes().all(|b| b.is_ascii_digit())
                && tokens.iter().enumerate().any(|(j, w)| {
                    j != i
                        && i.abs_diff(j) <= 3
                        && matches!(*w, "test" | "tests" | "checks" | "rows")
                })
        })
    })
}

/// The markers `text` carries, by the rules as the reference writes them.
pub fn markers(text: &str) -> Vec<Marker> {
    let p = &*PATTERNS;
    let mut out = Vec::new();
    if p.subject.is_match(text)
        || clauses(text).any(|c| p.citation.is_match(c) && p.delivery.is_match(c))
    {
        out.push(Marker::Reference);
    }
    if has_sha(text) {
        out.push(Marker::Sha);
    }
    if has_count(text) {
        out.push(Marker::Count);
    }
    for (marker, pattern) in &p.rest {
        if pattern.is_match(text) {
            out.push(*marker);
        }
    }
    out
}

/// Each pattern on its own, for the tests that hold one scanner to one pattern.
#[cfg(test)]
pub(crate) fn pattern(source: &str) -> Regex {
    compile(source)
}
