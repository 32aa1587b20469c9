//! JSON as JavaScript reads and writes it: what the reference Worker's `request.json()` and
//! `JSON.stringify` do in workerd, measured, for the server's bodies, the CLI's JSON Lines and
//! the bot's content hash.
//!
//! Reading ([`decode`], [`parse`]): invalid UTF-8 replaced by U+FFFD (maximal subparts, as the
//! WHATWG decoder does); one leading byte-order mark dropped from a body, any other refused (JSON
//! whitespace has no U+FEFF); duplicate keys keep the last value; numbers past the double range
//! read as the largest double (Infinity there, refused by every field alike); any nesting depth.
//!
//! A JavaScript string may hold a lone surrogate (a client that cut a string inside a pair), and
//! the Worker keeps one where it stores JSON (keywords, provenance) and turns it into three
//! U+FFFD where it stores text. A Rust `String` cannot hold one, so it is carried in a private
//! encoding (the `lone` module) from the body to the field that decides what becomes of it, and written
//! back as `\udXXX` by [`stringify()`].
//!
//! serde_json stops at 128 levels, and a deeper tree would overflow the stack when dropped. No
//! route reads a field more than a few levels down, so a body deeper than `KEPT_DEPTH` (64) is
//! checked for syntax in full (iteratively) and every container below that depth is replaced by
//! an empty one of the same type: every answer the routes give is unchanged.
//!
//! **Invariant:** pure and total: never panics, whatever the bytes.

#[cfg(any(test, feature = "__wire"))]
mod deep;
pub(crate) mod lone;

use serde_json::Value;

#[cfg(any(test, feature = "__wire"))]
use deep::{is_depth, parse_deep};

/// A request body as JSON, or `None` when `request.json()` would throw: the bytes decoded as
/// UTF-8 the way workerd decodes them (one leading byte-order mark dropped), then `JSON.parse`.
#[cfg(any(test, feature = "server", feature = "__internals"))]
pub fn decode(bytes: &[u8]) -> Option<Value> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    parse(&String::from_utf8_lossy(bytes))
}

/// `JSON.parse(text)`, or `None` when it would throw.
#[cfg(any(test, feature = "__wire"))]
pub fn parse(text: &str) -> Option<Value> {
    if !lone::holds_mark(text) {
        match serde_json::from_str::<Value>(text) {
            Ok(v) => return Some(v),
            Err(e) if is_depth(&e) => return parse_deep(text.as_bytes()),
            Err(_) => {}
        }
    }
    // What JSON.parse reads and serde_json does not: rewritten, then read again. Nothing to
    // rewrite means serde_json's refusal stands.
    let js = js_normalize(text.as_bytes())?;
    match serde_json::from_str::<Value>(&js) {
        Ok(v) => Some(v),
        Err(e) if is_depth(&e) => parse_deep(js.as_bytes()),
        Err(_) => None,
    }
}

/// `JSON.stringify(value)`: compact, keys in their order, numbers as JavaScript prints them,
/// lone surrogates as `\udXXX`.
pub fn stringify(value: &Value) -> String {
    let mut out = String::new();
    write_value(value, &mut out);
    out
}

fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&js_number_of(n)),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(v, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out);
                out.push(':');
                write_value(v, out);
            }
            out.push('}');
        }
    }
}

/// A JSON number as JavaScript holds and prints it (a double).
fn js_number_of(n: &serde_json::Number) -> String {
    const SAFE: u64 = (1 << 53) - 1;
    if let Some(u) = n.as_u64().filter(|u| *u <= SAFE) {
        return u.to_string();
    }
    if let Some(i) = n.as_i64().filter(|i| i.unsigned_abs() <= SAFE) {
        return i.to_string();
    }
    js_number(n.as_f64().unwrap_or(f64::NAN))
}

/// JSON text made by serde from carried strings, as JavaScript writes it: each carried lone
/// surrogate as the escape `\udXXX`, a literal U+FDD0 as itself. Carried forms only occur
/// inside strings, so the text stays valid JSON. Every JSON text that leaves the process
/// (an answer, a request, a CLI line) passes here.
#[cfg(feature = "__wire")]
pub fn restore_lone(text: String) -> String {
    if !text.contains(lone::MARK) {
        return text;
    }
    let mut out = String::with_capacity(text.len());
    for piece in lone::pieces(&text) {
        match piece {
            lone::Piece::Text(t) => out.push_str(t),
            lone::Piece::Surrogate(u) => out.push_str(&format!("\\u{u:04x}")),
            lone::Piece::Mark => out.push(lone::MARK),
        }
    }
    out
}

/// `JSON.stringify(s)` of one string: `"` and `\` escaped, `\b \f \n \r \t`, other C0 controls
/// as `\u00xx`, lone surrogates as `\udxxx`, everything else as is.
pub(crate) fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for piece in lone::pieces(s) {
        match piece {
            lone::Piece::Text(t) => escape_into(t, out),
            lone::Piece::Surrogate(u) => out.push_str(&format!("\\u{u:04x}")),
            lone::Piece::Mark => out.push(lone::MARK),
        }
    }
    out.push('"');
}

fn escape_into(t: &str, out: &mut String) {
    let mut rest = t;
    while let Some((i, c)) = rest
        .char_indices()
        .find(|&(_, c)| c < ' ' || c == '"' || c == '\\')
    {
        out.push_str(rest.get(..i).unwrap_or_default());
        rest = rest.get(i + 1..).unwrap_or_default();
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push_str(&format!("\\u{:04x}", c as u32)),
        }
    }
    out.push_str(rest);
}

/// A JSON text read as it streams in, with each lone surrogate escape rewritten to its
/// [`lone`] encoding (and a literal U+FDD0 escaped), so serde reads it as `JSON.parse` would:
/// for an answer too large to hold whole, such as an export.
#[cfg(any(test, feature = "remote"))]
pub(crate) struct JsReader<R> {
    inner: R,
    /// Read but not yet rewritten: at most an escape pair or a character.
    pending: Vec<u8>,
    /// Rewritten, not yet handed out.
    out: Vec<u8>,
    at: usize,
    in_string: bool,
    eof: bool,
}

#[cfg(any(test, feature = "remote"))]
impl<R: std::io::Read> JsReader<R> {
    pub(crate) fn new(inner: R) -> JsReader<R> {
        JsReader {
            inner,
            pending: Vec::new(),
            out: Vec::new(),
            at: 0,
            in_string: false,
            eof: false,
        }
    }

    /// Rewrites as much of `pending` as can be decided without more input.
    fn rewrite(&mut self) {
        let b = std::mem::take(&mut self.pending);
        let mut i = 0;
        let hex = |i: usize| -> Option<u32> {
            let digits = std::str::from_utf8(b.get(i..i + 4)?).ok()?;
            u32::from_str_radix(digits, 16).ok()
        };
        let mut buf = [0u8; 4];
        let mark = lone::MARK.encode_utf8(&mut buf).as_bytes().to_vec();
        while let Some(&c) = b.get(i) {
            if !self.in_string {
                self.in_string = c == b'"';
                self.out.push(c);
                i += 1;
                continue;
            }
            match c {
                b'"' => {
                    self.in_string = false;
                    self.out.push(c);
                    i += 1;
                }
                b'\\' => {
                    // An escape needs up to twelve bytes to be judged (a pair).
                    if b.len() < i + 12 && !self.eof {
                        break;
                    }
                    if b.get(i + 1) != Some(&b'u') {
                        self.out
                            .extend_from_slice(b.get(i..(i + 2).min(b.len())).unwrap_or_default());
                        i += 2;
                        continue;
                    }
                    let Some(cp) = hex(i + 2) else {
                        self.out.push(c);
                        i += 1;
                        continue;
                    };
                    let paired = (0xD800..0xDC00).contains(&cp)
                        && b.get(i + 6) == Some(&b'\\')
                        && b.get(i + 7) == Some(&b'u')
                        && hex(i + 8).is_some_and(|lo| (0xDC00..0xE000).contains(&lo));
                    if paired {
                        self.out
                            .extend_from_slice(b.get(i..i + 12).unwrap_or_default());
                        i += 12;
                    } else if (0xD800..0xE000).contains(&cp) {
                        lone::push_encoded(cp as u16, &mut self.out);
                        i += 6;
                    } else if cp == u32::from(lone::MARK) {
                        lone::push_escaped_mark(&mut self.out);
                        i += 6;
                    } else {
                        self.out
                            .extend_from_slice(b.get(i..i + 6).unwrap_or_default());
                        i += 6;
                    }
                }
                0xEF if b.len() < i + 3 && !self.eof => break,
                _ if b.get(i..i + 3) == Some(mark.as_slice()) => {
                    lone::push_escaped_mark(&mut self.out);
                    i += 3;
                }
                _ => {
                    self.out.push(c);
                    i += 1;
                }
            }
        }
        self.pending = b.get(i..).unwrap_or_default().to_vec();
    }
}

#[cfg(any(test, feature = "remote"))]
impl<R: std::io::Read> std::io::Read for JsReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.out.len() {
            self.out.clear();
            self.at = 0;
            if self.eof {
                if self.pending.is_empty() {
                    return Ok(0);
                }
                self.rewrite();
                // What is left at the end cannot be completed: handed out as it is.
                let rest = std::mem::take(&mut self.pending);
                self.out.extend_from_slice(&rest);
                continue;
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = self.inner.read(&mut chunk)?;
            if n == 0 {
                self.eof = true;
            }
            self.pending
                .extend_from_slice(chunk.get(..n).unwrap_or_default());
            self.rewrite();
        }
        let n = buf.len().min(self.out.len() - self.at);
        if let (Some(dst), Some(src)) = (buf.get_mut(..n), self.out.get(self.at..self.at + n)) {
            dst.copy_from_slice(src);
        }
        self.at += n;
        Ok(n)
    }
}

/// What `JSON.parse` reads and serde_json does not, rewritten so every route answers as the
/// Worker does: a lone surrogate escape (`"\ud800"`, which a JavaScript client produces by
/// cutting a string inside a pair) becomes its [`lone`] encoding, a literal [`lone::MARK`]
/// is escaped so it cannot be taken for one, and a number beyond the double range (`1e400`,
/// Infinity there) reads as the largest double of its sign, which every field refuses with the
/// same words as Infinity (not an integer in range, not a number in [0, 1], not a string).
/// `None` when nothing needed rewriting.
#[cfg(any(test, feature = "__wire"))]
fn js_normalize(b: &[u8]) -> Option<String> {
    let hex = |i: usize| -> Option<u32> {
        let digits = std::str::from_utf8(b.get(i..i + 4)?).ok()?;
        u32::from_str_radix(digits, 16).ok()
    };
    let mut out: Vec<u8> = Vec::with_capacity(b.len());
    let mut changed = false;
    let mut i = 0;
    let mut in_string = false;
    let mut buf = [0u8; 4];
    while let Some(&c) = b.get(i) {
        if in_string {
            match c {
                b'"' => {
                    in_string = false;
                    out.push(c);
                    i += 1;
                }
                b'\\' if b.get(i + 1) == Some(&b'u') => {
                    let Some(cp) = hex(i + 2) else {
                        out.push(c);
                        i += 1;
                        continue;
                    };
                    let paired = (0xD800..0xDC00).contains(&cp)
                        && b.get(i + 6) == Some(&b'\\')
                        && b.get(i + 7) == Some(&b'u')
                        && hex(i + 8).is_some_and(|lo| (0xDC00..0xE000).contains(&lo));
                    if paired {
                        out.extend_from_slice(b.get(i..i + 12)?);
                        i += 12;
                    } else if (0xD800..0xE000).contains(&cp) {
                        lone::push_encoded(cp as u16, &mut out);
                        changed = true;
                        i += 6;
                    } else if cp == u32::from(lone::MARK) {
                        lone::push_escaped_mark(&mut out);
                        changed = true;
                        i += 6;
                    } else {
                        out.extend_from_slice(b.get(i..i + 6)?);
                        i += 6;
                    }
                }
                b'\\' => {
                    out.extend_from_slice(b.get(i..(i + 2).min(b.len()))?);
                    i += 2;
                }
                _ if b.get(i..i + 3) == Some(lone::MARK.encode_utf8(&mut buf).as_bytes()) => {
                    lone::push_escaped_mark(&mut out);
                    changed = true;
                    i += 3;
                }
                _ => {
                    out.push(c);
                    i += 1;
                }
            }
        } else if c == b'"' {
            in_string = true;
            out.push(c);
            i += 1;
        } else if c == b'-' || c.is_ascii_digit() {
            let start = i;
            while b.get(i).is_some_and(|d| {
                d.is_ascii_digit() || matches!(d, b'-' | b'+' | b'.' | b'e' | b'E')
            }) {
                i += 1;
            }
            let literal = b.get(start..i)?;
            match std::str::from_utf8(literal)
                .ok()
                .and_then(|l| l.parse::<f64>().ok())
            {
                Some(x) if x.is_infinite() => {
                    let max = if x < 0.0 {
                        "-1.7976931348623157e308"
                    } else {
                        "1.7976931348623157e308"
                    };
                    out.extend_from_slice(max.as_bytes());
                    changed = true;
                }
                _ => out.extend_from_slice(literal),
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    if !changed {
        return None;
    }
    String::from_utf8(out).ok()
}

/// A finite number as JavaScript's `JSON.stringify` prints it: the shortest digits that read
/// back to the same double, integers without a fraction, decimals from 1e-6 to 1e21, exponent
/// form (`1e-7`, `1e+21`) outside. Not finite: `null`, as JavaScript prints it.
pub(crate) fn js_number(x: f64) -> String {
    if !x.is_finite() {
        return "null".into();
    }
    if x == 0.0 {
        return "0".into();
    }
    // Rust's `{:e}` prints the shortest round-trip digits: `-1.2345e-7`.
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let k = digits.len() as i32;
    let n = exp + 1;
    let body = if k <= n && n <= 21 {
        format!("{digits}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        let (int, frac) = digits.split_at(n as usize);
        format!("{int}.{frac}")
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let (first, rest) = digits.split_at(1);
        let sign = if n - 1 < 0 { '-' } else { '+' };
        let dot = if rest.is_empty() { "" } else { "." };
        format!("{first}{dot}{rest}e{sign}{}", (n - 1).abs())
    };
    if x < 0.0 {
        format!("-{body}")
    } else {
        body
    }
}

#[cfg(test)]
mod js_number_tests {
    use super::js_number;

    #[test]
    fn numbers_print_as_javascript_prints_them() {
        // Each pair checked against node's JSON.stringify.
        let cases = [
            (1.0, "1"),
            (0.5, "0.5"),
            (0.1, "0.1"),
            (1e-6, "0.000001"),
            (1.5e-6, "0.0000015"),
            (1e-7, "1e-7"),
            (0.000012345, "0.000012345"),
            (0.3333333333333333, "0.3333333333333333"),
            (1e-5, "0.00001"),
            (123456789012345680000.0, "123456789012345680000"),
            (1e21, "1e+21"),
            (1.5e300, "1.5e+300"),
            (5e-324, "5e-324"),
            (-0.25, "-0.25"),
            (-0.0, "0"),
            (42.0, "42"),
        ];
        for (x, want) in cases {
            assert_eq!(js_number(x), want, "{x}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_utf8_decodes_as_workerd_does_and_one_leading_bom_is_dropped() {
        let v = decode(b"{\"a\":\"x\xFFy\"}").expect("decodes");
        assert_eq!(v["a"], "x\u{FFFD}y");
        assert!(decode(b"").is_none());
        // workerd's UTF-8 decoder drops one leading byte-order mark; JSON.parse refuses any other.
        assert_eq!(decode(b"\xEF\xBB\xBF{}"), Some(serde_json::json!({})));
        assert!(decode(b"\xEF\xBB\xBF\xEF\xBB\xBF{}").is_none());
        assert!(decode(b" \xEF\xBB\xBF{}").is_none());
        assert!(decode(b"{}\xEF\xBB\xBF").is_none());
    }

    #[test]
    fn what_json_parse_reads_and_serde_does_not_is_read() {
        let v = decode(br#"{"q":"cut \ud83d","r":"pair \ud83d\ude00","n":1e400,"m":-1e999}"#)
            .expect("decodes");
        assert_eq!(v["q"].as_str().map(lone::has_lone), Some(true));
        assert_eq!(stringify(&v["q"]), r#""cut \ud83d""#);
        assert_eq!(v["r"], "pair \u{1F600}");
        assert_eq!(v["n"].as_f64(), Some(f64::MAX));
        assert_eq!(v["m"].as_f64(), Some(-f64::MAX));
        assert!(decode(br#"{"q":"\udc00 alone"}"#).is_some());
        assert!(decode(b"{nope").is_none());
        assert!(
            decode(br#"{"a":1e400,}"#).is_none(),
            "a syntax error stays one"
        );
    }

    #[test]
    fn lone_surrogates_are_carried_and_written_back_as_javascript_writes_them() {
        let v = decode(br#"{"k":["x\udc00y","plain"],"t":"a \ud800 b","m":"\ufdd0 lit \uFDD0"}"#)
            .expect("decodes");
        let k = v["k"][0].as_str().expect("string");
        assert!(lone::has_lone(k));
        assert_eq!(lone::utf16_len(k), 3);
        assert_eq!(lone::utf16_units(k), vec![0x78, 0xDC00, 0x79]);
        assert_eq!(stringify(&v["k"]), r#"["x\udc00y","plain"]"#);
        assert_eq!(
            lone::as_stored_text(v["t"].as_str().expect("string")),
            "a \u{FFFD}\u{FFFD}\u{FFFD} b"
        );
        // A literal U+FDD0 is itself, never taken for a surrogate.
        let m = v["m"].as_str().expect("string");
        assert!(!lone::has_lone(m));
        assert_eq!(stringify(&v["m"]), "\"\u{FDD0} lit \u{FDD0}\"");
        assert_eq!(lone::utf16_len(m), 7);
        let raw =
            decode("{\"m\":\"\u{FDD0}\u{FDE1}\u{FDE2}\u{FDE3}\"}".as_bytes()).expect("decodes");
        assert!(!lone::has_lone(raw["m"].as_str().expect("string")));
        assert_eq!(stringify(&raw["m"]), "\"\u{FDD0}\u{FDE1}\u{FDE2}\u{FDE3}\"");
    }

    #[test]
    fn stringify_escapes_as_javascript_does() {
        assert_eq!(
            stringify(
                &serde_json::json!({"a": 1.0, "b": [0.5, 1e21], "c": "x\u{1}\"\\\n\u{7f}\u{2028}"})
            ),
            "{\"a\":1,\"b\":[0.5,1e+21],\"c\":\"x\\u0001\\\"\\\\\\n\u{7f}\u{2028}\"}"
        );
    }

    #[test]
    fn the_streaming_reader_reads_what_parse_reads_whatever_the_chunking() {
        use std::io::Read;
        let text =
            "{\"k\":[\"x\\udc00y\",\"\\ud83d\\ude00\",\"a\\\\u\",\"\u{FDD0}\\ufdd0\"],\"n\":[1,2]}";
        let want = parse(text).expect("parses");
        /// Hands out one byte at a time, so every escape is split across reads.
        struct Drip<'a>(&'a [u8]);
        impl std::io::Read for Drip<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                match (self.0.split_first(), buf.first_mut()) {
                    (Some((b, rest)), Some(slot)) => {
                        *slot = *b;
                        self.0 = rest;
                        Ok(1)
                    }
                    _ => Ok(0),
                }
            }
        }
        let mut out = String::new();
        JsReader::new(Drip(text.as_bytes()))
            .read_to_string(&mut out)
            .expect("reads");
        let got: Value = serde_json::from_str(&out).expect("serde reads the rewrite");
        assert_eq!(got, want);
        assert_eq!(stringify(&got), stringify(&want));
    }
}
