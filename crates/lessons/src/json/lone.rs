//! Lone surrogates carried in a Rust `String`: how a JavaScript string that holds one travels
//! from the body to the field that decides what becomes of it.
//!
//! A lone surrogate U+D800 + v (v < 0x800) is written as [`MARK`] (U+FDD0) followed by the
//! three hexadecimal digits of v, each as a character U+FDE0 + digit; a literal U+FDD0 is
//! written as two of them. All five characters are noncharacters (Unicode category Cn), so
//! every tokenizer here splits on them as the reference's split on a surrogate, and a scope key
//! holding one is refused as holding an unassigned character, which the Worker refuses as `Cs`.
//!
//! **Invariant:** the encoding is one to one: [`utf16_units`] gives back exactly the code units
//! JavaScript held, and a literal U+FDD0 is never read as a surrogate.
//! **Invariant:** the encoding never leaves the process: `stringify` and `restore_lone` write
//! each encoded surrogate back as `\udXXX`.

use std::borrow::Cow;

/// The first character of an encoded lone surrogate.
pub(crate) const MARK: char = '\u{FDD0}';
const DIGIT0: u32 = 0xFDE0;

/// One piece of a string in the carried form.
pub(crate) enum Piece<'a> {
    /// Plain text, no mark in it.
    Text(&'a str),
    /// A lone surrogate code unit.
    Surrogate(u16),
    /// A literal U+FDD0.
    Mark,
}

/// The pieces of `s`, in order.
pub(crate) fn pieces(s: &str) -> impl Iterator<Item = Piece<'_>> {
    let mut rest = s;
    let mut pending: Option<Piece<'_>> = None;
    std::iter::from_fn(move || {
        if let Some(p) = pending.take() {
            return Some(p);
        }
        if rest.is_empty() {
            return None;
        }
        let Some(i) = rest.find(MARK) else {
            let text = rest;
            rest = "";
            return Some(Piece::Text(text));
        };
        let before = rest.get(..i).unwrap_or_default();
        let after = rest.get(i + MARK.len_utf8()..).unwrap_or_default();
        let (piece, used) = decode_after_mark(after).unwrap_or((Piece::Mark, 0));
        rest = after.get(used..).unwrap_or_default();
        if before.is_empty() {
            Some(piece)
        } else {
            pending = Some(piece);
            Some(Piece::Text(before))
        }
    })
}

/// What `after` (the text right after a [`MARK`]) completes the mark to, and how many
/// bytes of `after` that takes; `None` for a mark that starts neither form (it stands for
/// itself).
fn decode_after_mark(after: &str) -> Option<(Piece<'static>, usize)> {
    let mut chars = after.chars();
    let first = chars.next()?;
    if first == MARK {
        return Some((Piece::Mark, first.len_utf8()));
    }
    let digit = |c: char| {
        let v = u32::from(c);
        (DIGIT0..DIGIT0 + 16).contains(&v).then(|| v - DIGIT0)
    };
    let (a, b, c) = (digit(first)?, digit(chars.next()?)?, digit(chars.next()?)?);
    let v = (a << 8) | (b << 4) | c;
    // Each digit is three bytes of UTF-8.
    (v < 0x800).then(|| (Piece::Surrogate(0xD800 + v as u16), 9))
}

#[cfg(any(test, feature = "__wire"))]
pub(crate) fn holds_mark(s: &str) -> bool {
    // U+FDD0 in UTF-8 is EF B7 90; as an escape, `\ufdd0` in either case.
    let b = s.as_bytes();
    b.windows(3).any(|w| w == [0xEF, 0xB7, 0x90])
        || b.windows(6).any(|w| {
            w.first() == Some(&b'\\')
                && w.get(1) == Some(&b'u')
                && w.get(2..6).is_some_and(|h| h.eq_ignore_ascii_case(b"fdd0"))
        })
}

#[cfg(any(test, feature = "__wire"))]
pub(crate) fn push_encoded(unit: u16, out: &mut Vec<u8>) {
    let v = u32::from(unit.wrapping_sub(0xD800) & 0x7FF);
    let mut buf = [0u8; 4];
    out.extend_from_slice(MARK.encode_utf8(&mut buf).as_bytes());
    for shift in [8, 4, 0] {
        let digit = char::from_u32(DIGIT0 + ((v >> shift) & 0xF)).unwrap_or(MARK);
        out.extend_from_slice(digit.encode_utf8(&mut buf).as_bytes());
    }
}

#[cfg(any(test, feature = "__wire"))]
pub(crate) fn push_escaped_mark(out: &mut Vec<u8>) {
    let mut buf = [0u8; 4];
    let mark = MARK.encode_utf8(&mut buf).as_bytes().to_vec();
    out.extend_from_slice(&mark);
    out.extend_from_slice(&mark);
}

/// Whether `s` holds a lone surrogate.
pub(crate) fn has_lone(s: &str) -> bool {
    s.contains(MARK) && pieces(s).any(|p| matches!(p, Piece::Surrogate(_)))
}

/// `s` as the Worker's SQLite storage reads a text column back: each lone surrogate as
/// three U+FFFD (stored as its three-byte generalized UTF-8 form, decoded strictly), a
/// literal U+FDD0 as itself.
pub(crate) fn as_stored_text(s: &str) -> Cow<'_, str> {
    replace_lone(s, "\u{FFFD}\u{FFFD}\u{FFFD}")
}

/// `s` for a tokenizer: each lone surrogate as a space (SQLite's `unicode61` and the
/// reference's `[a-z0-9]+` both split on one), a literal mark as itself.
pub(crate) fn as_token_text(s: &str) -> Cow<'_, str> {
    replace_lone(s, " ")
}

fn replace_lone<'a>(s: &'a str, replacement: &str) -> Cow<'a, str> {
    if !s.contains(MARK) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    for p in pieces(s) {
        match p {
            Piece::Text(t) => out.push_str(t),
            Piece::Surrogate(_) => out.push_str(replacement),
            Piece::Mark => out.push(MARK),
        }
    }
    Cow::Owned(out)
}

/// How many UTF-16 units `s` stands for in JavaScript: a lone surrogate is one unit
/// carried as four characters, a literal mark one carried as two.
pub(crate) fn utf16_len(s: &str) -> usize {
    pieces(s)
        .map(|p| match p {
            Piece::Text(t) => t.chars().map(char::len_utf16).sum(),
            Piece::Surrogate(_) | Piece::Mark => 1,
        })
        .sum()
}

/// `s` as JavaScript's UTF-16 code units, lone surrogates included.
pub(crate) fn utf16_units(s: &str) -> Vec<u16> {
    let mut out = Vec::with_capacity(s.len());
    for p in pieces(s) {
        match p {
            Piece::Text(t) => out.extend(t.encode_utf16()),
            Piece::Surrogate(u) => out.push(u),
            Piece::Mark => out.extend(MARK.encode_utf16(&mut [0; 2]).iter()),
        }
    }
    out
}
