//! Bodies deeper than serde_json reads: serde_json stops at 128 levels, and a deeper tree would
//! overflow the stack when dropped. No route reads a field more than a few levels down, so such
//! a body is checked for syntax in full, iteratively, and every container below `KEPT_DEPTH`
//! is replaced by an empty one of its type before serde_json reads it.
//!
//! **Invariant:** no recursion: the check's stack is a `Vec`, whatever the depth.
//! **Invariant:** a body is refused here exactly when `JSON.parse` would refuse it; what is
//! emptied is below what any route reads, so no answer changes.

use serde_json::Value;

use super::js_normalize;

/// Containers deeper than this are checked and then emptied.
const KEPT_DEPTH: usize = 64;

pub(super) fn is_depth(e: &serde_json::Error) -> bool {
    e.to_string().starts_with("recursion limit exceeded")
}

pub(super) fn parse_deep(text: &[u8]) -> Option<Value> {
    let flat = flatten_deep(text, KEPT_DEPTH)?;
    serde_json::from_str(&flat)
        .ok()
        .or_else(|| serde_json::from_str(&js_normalize(flat.as_bytes())?).ok())
}

/// `text` with every container below `max` levels replaced by an empty one; `None` when a
/// replaced container is not valid JSON. The rest is left for serde_json to judge.
fn flatten_deep(b: &[u8], max: usize) -> Option<String> {
    let mut out = Vec::with_capacity(b.len());
    let mut depth = 0usize;
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        match c {
            b'"' => {
                let end = skip_string(b, i)?;
                out.extend_from_slice(b.get(i..end)?);
                i = end;
            }
            b'{' | b'[' if depth >= max => {
                i = skip_value(b, i)?;
                out.extend_from_slice(if c == b'{' { b"{}" } else { b"[]" });
            }
            b'{' | b'[' => {
                depth += 1;
                out.push(c);
                i += 1;
            }
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                out.push(c);
                i += 1;
            }
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// The index after the string starting at `i` (a `"`).
fn skip_string(b: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    loop {
        match *b.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => match *b.get(i + 1)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i += 2,
                b'u' => {
                    let hex = b.get(i + 2..i + 6)?;
                    if !hex.iter().all(u8::is_ascii_hexdigit) {
                        return None;
                    }
                    i += 6;
                }
                _ => return None,
            },
            c if c < 0x20 => return None,
            _ => i += 1,
        }
    }
}

fn skip_digits(b: &[u8], mut i: usize) -> Option<usize> {
    let start = i;
    while b.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    (i > start).then_some(i)
}

/// The index after the number starting at `i`, by JSON's grammar.
fn skip_number(b: &[u8], mut i: usize) -> Option<usize> {
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    i = match b.get(i)? {
        b'0' => i + 1,
        b'1'..=b'9' => skip_digits(b, i)?,
        _ => return None,
    };
    if b.get(i) == Some(&b'.') {
        i = skip_digits(b, i + 1)?;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        i = skip_digits(b, i)?;
    }
    Some(i)
}

/// The index after the JSON value starting at `i`, checked without recursion.
fn skip_value(b: &[u8], mut i: usize) -> Option<usize> {
    #[derive(Clone, Copy, PartialEq)]
    enum Want {
        Value,
        ValueOrClose,
        Key,
        KeyOrClose,
        Colon,
        After,
    }
    let mut open: Vec<u8> = Vec::new();
    let mut want = Want::Value;
    loop {
        if want == Want::After && open.is_empty() {
            return Some(i);
        }
        i = skip_ws(b, i);
        let c = *b.get(i)?;
        want = match want {
            Want::ValueOrClose if c == b']' => {
                open.pop();
                i += 1;
                Want::After
            }
            Want::Value | Want::ValueOrClose => match c {
                b'{' => {
                    open.push(b'{');
                    i += 1;
                    Want::KeyOrClose
                }
                b'[' => {
                    open.push(b'[');
                    i += 1;
                    Want::ValueOrClose
                }
                b'"' => {
                    i = skip_string(b, i)?;
                    Want::After
                }
                b't' | b'f' | b'n' => {
                    let word: &[u8] = match c {
                        b't' => b"true",
                        b'f' => b"false",
                        _ => b"null",
                    };
                    if b.get(i..i + word.len())? != word {
                        return None;
                    }
                    i += word.len();
                    Want::After
                }
                _ => {
                    i = skip_number(b, i)?;
                    Want::After
                }
            },
            Want::KeyOrClose if c == b'}' => {
                open.pop();
                i += 1;
                Want::After
            }
            Want::Key | Want::KeyOrClose if c == b'"' => {
                i = skip_string(b, i)?;
                Want::Colon
            }
            Want::Colon if c == b':' => {
                i += 1;
                Want::Value
            }
            Want::After => match (open.last()?, c) {
                (b'[', b',') => {
                    i += 1;
                    Want::Value
                }
                (b'{', b',') => {
                    i += 1;
                    Want::Key
                }
                (b'[', b']') | (b'{', b'}') => {
                    open.pop();
                    i += 1;
                    Want::After
                }
                _ => return None,
            },
            _ => return None,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::decode;

    #[test]
    fn deep_nesting_is_accepted_and_emptied_below_the_kept_depth() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let body = format!(r#"{{"scopeKey":"org:a","x":{deep},"y":{{"z":[1,{{"k":"v"}}]}}}}"#);
        let v = decode(body.as_bytes()).expect("decodes");
        assert_eq!(v["scopeKey"], "org:a");
        assert_eq!(v["y"]["z"][1]["k"], "v");
        let mut depth = 0;
        let mut at = &v["x"];
        while let Some(inner) = at.get(0) {
            depth += 1;
            at = inner;
        }
        assert_eq!(depth, KEPT_DEPTH - 1);
        // A syntax error below the kept depth is still an error.
        let broken = format!("{}1,]{}", "[".repeat(200), "]".repeat(199));
        assert!(decode(broken.as_bytes()).is_none());
        let unclosed = "[".repeat(300);
        assert!(decode(unclosed.as_bytes()).is_none());
        let objects = format!("{}{}", r#"{"a":"#.repeat(300), "}".repeat(300));
        assert!(
            decode(format!("{}1{}", r#"{"a":"#.repeat(300), "}".repeat(300)).as_bytes()).is_some()
        );
        assert!(decode(objects.as_bytes()).is_none());
    }
}
