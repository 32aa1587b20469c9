//! A request body decoded as the reference Worker's `request.json()` decodes it in workerd:
//! invalid UTF-8 replaced by U+FFFD (maximal subparts, as the WHATWG decoder does), a leading
//! byte-order mark kept (so `JSON.parse` refuses it: measured against workerd), and any nesting
//! depth accepted.
//!
//! serde_json stops at 128 levels, and a deeper tree would overflow the stack when dropped. No
//! route reads a field more than a few levels down, so a body deeper than [`KEPT_DEPTH`] is
//! checked for syntax in full (iteratively) and every container below that depth is replaced by
//! an empty one of the same type: every answer the routes give is unchanged.

use serde_json::Value;

/// Containers deeper than this are checked and then emptied.
const KEPT_DEPTH: usize = 64;

/// The body as JSON, or `None` when `JSON.parse` would throw.
pub(crate) fn decode(bytes: &[u8]) -> Option<Value> {
    let text = String::from_utf8_lossy(bytes);
    match serde_json::from_str::<Value>(&text) {
        Ok(v) => Some(v),
        Err(e) if is_depth(&e) => parse_deep(text.as_bytes()),
        // What JSON.parse reads and serde_json does not: rewritten, then read again.
        Err(_) => {
            let js = js_normalize(text.as_bytes())?;
            match serde_json::from_str::<Value>(&js) {
                Ok(v) => Some(v),
                Err(e) if is_depth(&e) => parse_deep(js.as_bytes()),
                Err(_) => None,
            }
        }
    }
}

fn is_depth(e: &serde_json::Error) -> bool {
    e.to_string().starts_with("recursion limit exceeded")
}

fn parse_deep(text: &[u8]) -> Option<Value> {
    serde_json::from_str(&flatten_deep(text, KEPT_DEPTH)?).ok()
}

/// The two things `JSON.parse` accepts that serde_json refuses, rewritten so every route answers
/// as the Worker does: a lone surrogate escape (`"\ud800"`, which a JavaScript client produces by
/// cutting a string inside a pair) reads as U+FFFD, and a number beyond the double range
/// (`1e400`, Infinity there) reads as the largest double of its sign, which every field refuses
/// with the same words as Infinity (not an integer in range, not a number in [0, 1], not a
/// string). `None` when nothing needed rewriting.
fn js_normalize(b: &[u8]) -> Option<String> {
    let hex = |i: usize| -> Option<u32> {
        let digits = std::str::from_utf8(b.get(i..i + 4)?).ok()?;
        u32::from_str_radix(digits, 16).ok()
    };
    let mut out: Vec<u8> = Vec::with_capacity(b.len());
    let mut changed = false;
    let mut i = 0;
    let mut in_string = false;
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
                        out.extend_from_slice(b"\\ufffd");
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

    #[test]
    fn invalid_utf8_decodes_as_workerd_does_and_a_bom_is_refused() {
        let v = decode(b"{\"a\":\"x\xFFy\"}").expect("decodes");
        assert_eq!(v["a"], "x\u{FFFD}y");
        assert!(decode(b"").is_none());
        assert!(decode(b"\xEF\xBB\xBF{}").is_none());
    }

    #[test]
    fn what_json_parse_reads_and_serde_does_not_is_read() {
        let v = decode(br#"{"q":"cut \ud83d","r":"pair \ud83d\ude00","n":1e400,"m":-1e999}"#)
            .expect("decodes");
        assert_eq!(v["q"], "cut \u{FFFD}");
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
