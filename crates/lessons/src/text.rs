//! Text: the tokenizer, the dedup normalizer, the field sanitizer and the token estimate.
//!
//! Each function reproduces the reference bot byte for byte (the prompt block and the dedup key
//! depend on it): lowercasing is full Unicode lowercasing (JavaScript's `toLowerCase`, which
//! `str::to_lowercase` matches), and whitespace is JavaScript's `\s` set
//! ([`crate::text::is_js_whitespace`]), not Rust's.
//!
//! **Invariant:** every function here is pure and total.

/// The keyword tokens of `text`: runs of `[a-z0-9]` after lowercasing, in order, duplicates kept.
///
/// ```
/// assert_eq!(lessons::internals::text::tokenize("Run `npm ci`, then 2x!"), ["run", "npm", "ci", "then", "2x"]);
/// ```
pub fn tokenize(text: &str) -> Vec<String> {
    // A record's default keywords are its text's ~50 tokens: sized once, the list is one
    // allocation instead of six growing ones, each of which (past 1 KiB) made glibc consolidate
    // the small chunks other records' keywords freed.
    let mut out = Vec::with_capacity(ascii_runs(text));
    for_each_token(text, |t| out.push(t.to_owned()));
    out
}

/// The number of runs of ASCII letters and digits in `text`: exactly its token count when it is
/// ASCII (lowercasing an ASCII text moves no character in or out of `[a-z0-9]`), a hint
/// otherwise.
pub(crate) fn ascii_runs(text: &str) -> usize {
    let mut runs = 0;
    let mut inside = false;
    for b in text.bytes() {
        let alnum = b.is_ascii_alphanumeric();
        runs += usize::from(alnum && !inside);
        inside = alnum;
    }
    runs
}

/// `text` lowercased as [`tokenize`] lowercases it, so that its tokens are the runs of
/// `[a-z0-9]` in it ([`token_slices`]) and a caller can hold them without a copy each.
pub(crate) fn lowercase(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.is_ascii() {
        // Full Unicode lowercasing never yields an ASCII capital.
        std::borrow::Cow::Owned(text.to_lowercase())
    } else if text.bytes().any(|b| b.is_ascii_uppercase()) {
        std::borrow::Cow::Owned(text.to_ascii_lowercase())
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// The tokens of a text already passed through [`lowercase`]: [`tokenize`] of the original,
/// borrowed.
pub(crate) fn token_slices(lowered: &str) -> Vec<&str> {
    lowered
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|t| !t.is_empty())
        .collect()
}

/// Calls `f` with every token of `text` (see [`tokenize`]) without collecting them.
pub(crate) fn for_each_token(text: &str, mut f: impl FnMut(&str)) {
    let lower;
    // Only a non-ASCII character can lowercase into ASCII (the Kelvin sign, dotted capital I),
    // so an ASCII text needs no allocation beyond the buffer for a token with capitals.
    let source: &str = if text.is_ascii() {
        text
    } else {
        lower = text.to_lowercase();
        &lower
    };
    let bytes = source.as_bytes();
    let mut buf = String::new();
    let mut start = None;
    let mut upper = false;
    let mut emit = |from: usize, to: usize, upper: bool, f: &mut dyn FnMut(&str)| {
        let run = source.get(from..to).unwrap_or_default();
        if upper {
            buf.clear();
            buf.push_str(run);
            buf.make_ascii_lowercase();
            f(&buf);
        } else {
            f(run);
        }
    };
    for (i, b) in bytes.iter().enumerate() {
        if b.is_ascii_alphanumeric() {
            if start.is_none() {
                start = Some(i);
                upper = false;
            }
            upper |= b.is_ascii_uppercase();
        } else if let Some(from) = start.take() {
            emit(from, i, upper, &mut f);
        }
    }
    if let Some(from) = start {
        emit(from, bytes.len(), upper, &mut f);
    }
}

/// The dedup key: trimmed, lowercased, every whitespace run collapsed to one space.
///
/// ```
/// assert_eq!(lessons::internals::text::normalize("  Run  NPM\tci \u{FEFF}"), "run npm ci");
/// ```
pub fn normalize(text: &str) -> String {
    if text.is_ascii() {
        // Nearly every lesson: lowercased as it is collapsed, one pass and one allocation.
        collapse_chars(text.chars().map(|c| c.to_ascii_lowercase()), text.len())
    } else {
        collapse_whitespace(&text.to_lowercase())
    }
}

/// A field made safe for the prompt block: control characters (U+0000–U+001F, U+007F–U+009F,
/// U+2028, U+2029) become spaces, whitespace runs collapse to one space, the ends are trimmed,
/// then `&`, `<` and `>` are escaped (`&` first), so no record can forge a fence line.
///
/// ```
/// assert_eq!(lessons::internals::text::sanitize("a\u{0}<b>\n&c"), "a &lt;b&gt; &amp;c");
/// ```
pub fn sanitize(text: &str) -> String {
    let collapsed = one_line(text);
    let mut out = String::with_capacity(collapsed.len());
    for c in collapsed.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

/// The reference's token estimate: `ceil(UTF-16 length / 4)`.
pub fn estimate_tokens(text: &str) -> usize {
    utf16_len(text).div_ceil(4)
}

/// The length of `text` in UTF-16 code units, the unit every wire limit is counted in.
pub fn utf16_len(text: &str) -> usize {
    if text.contains(crate::json::lone::MARK) {
        // A lone surrogate carried from a JavaScript client is one unit there.
        crate::json::lone::utf16_len(text)
    } else {
        text.chars().map(char::len_utf16).sum()
    }
}

/// `text` on one line: control characters (U+0000–U+001F, U+007F–U+009F, U+2028, U+2029)
/// become spaces and whitespace collapses, as [`sanitize`] does, without escaping `&<>`.
pub(crate) fn one_line(text: &str) -> String {
    let spaced: String = text
        .chars()
        .map(|c| if is_control(c) { ' ' } else { c })
        .collect();
    collapse_whitespace(&spaced)
}

fn is_control(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{1F}' | '\u{7F}'..='\u{9F}' | '\u{2028}' | '\u{2029}')
}

/// Trims JavaScript whitespace from both ends and collapses every inner run to one space.
fn collapse_whitespace(text: &str) -> String {
    collapse_chars(text.chars(), text.len())
}

/// [`collapse_whitespace`] over characters as they come, `capacity` bytes reserved.
fn collapse_chars(chars: impl Iterator<Item = char>, capacity: usize) -> String {
    let mut out = String::with_capacity(capacity);
    let mut pending_space = false;
    for c in chars {
        if is_js_whitespace(c) {
            pending_space = !out.is_empty();
        } else {
            if pending_space {
                out.push(' ');
                pending_space = false;
            }
            out.push(c);
        }
    }
    out
}

/// Is `c` whitespace in the reference's sense (JavaScript `\s`)?
///
/// U+FEFF is whitespace and U+0085 is not — the opposite of Rust's `char::is_whitespace`.
pub fn is_js_whitespace(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n' | '\u{0B}' | '\u{0C}' | '\r' | ' ' | '\u{A0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200A}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202F}'
                | '\u{205F}'
                | '\u{3000}'
                | '\u{FEFF}'
    )
}

/// The last `units` UTF-16 units of `text`, never splitting a character.
pub(crate) fn tail_utf16(text: &str, units: usize) -> &str {
    let mut count = 0;
    for (i, c) in text.char_indices().rev() {
        count += c.len_utf16();
        if count > units {
            return &text[i + c.len_utf8()..];
        }
    }
    text
}

/// The first `units` UTF-16 units of `text`, never splitting a character.
pub(crate) fn head_utf16(text: &str, units: usize) -> &str {
    let mut count = 0;
    for (i, c) in text.char_indices() {
        count += c.len_utf16();
        if count > units {
            return &text[..i];
        }
    }
    text
}

/// The largest char boundary of `s` at or below byte `max`.
pub(crate) fn floor_char_boundary(s: &str, max: usize) -> usize {
    if s.len() <= max {
        return s.len();
    }
    let mut i = max;
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn borrowed_tokens_are_the_tokenizers(text in "(?s).{0,40}", ascii in "[ -~]{0,40}") {
            for t in [&text, &ascii] {
                let lowered = lowercase(t);
                proptest::prop_assert_eq!(token_slices(&lowered), tokenize(t));
            }
            proptest::prop_assert_eq!(ascii_runs(&ascii), tokenize(&ascii).len());
        }

        #[test]
        fn the_ascii_normalizer_is_the_general_one(ascii in "[\t-\r -~]{0,40}") {
            proptest::prop_assert_eq!(normalize(&ascii), collapse_whitespace(&ascii.to_lowercase()));
        }
    }

    #[test]
    fn borrowed_tokens_lowercase_what_lowercases_into_ascii() {
        for t in [
            "\u{212A}elvin İstanbul",
            "NPM ci",
            "npm ci",
            "",
            "--",
            "Ab\u{301}C9",
        ] {
            let lowered = lowercase(t);
            assert_eq!(token_slices(&lowered), tokenize(t), "{t}");
        }
    }

    #[test]
    fn tokenizer_keeps_duplicates_and_drops_non_ascii_digits() {
        assert_eq!(tokenize("a A \u{FF11}b b"), ["a", "a", "b", "b"]);
        assert!(tokenize("— … ").is_empty());
    }

    #[test]
    fn kelvin_sign_lowercases_into_a_token() {
        assert_eq!(tokenize("\u{212A}ey"), ["key"]);
    }

    #[test]
    fn u0085_is_not_whitespace_but_is_a_control() {
        assert_eq!(normalize("a\u{85}b"), "a\u{85}b");
        assert_eq!(sanitize("a\u{85}b"), "a b");
    }

    #[test]
    fn estimate_counts_utf16_units() {
        assert_eq!(estimate_tokens(""), 0);
        assert_eq!(estimate_tokens("abcd"), 1);
        assert_eq!(estimate_tokens("abcde"), 2);
        // One astral character is two UTF-16 units.
        assert_eq!(utf16_len("\u{1F600}"), 2);
    }
}

/// FNV-1a: a fast hasher for the short keys of in-process maps (tokens, document ids). Not
/// resistant to chosen collisions; only for maps whose keys come from the store's own records and
/// a bounded query, where SipHash's cost is visible in retrieve's profile.
#[derive(Clone, Copy)]
pub(crate) struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// A `HashMap` keyed through [`Fnv`].
pub(crate) type FnvMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<Fnv>>;
