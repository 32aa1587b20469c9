//! JavaScript's reading of JSON text: `JSON.stringify`'s bytes, string order by UTF-16 code
//! units, and the canonical form in which two values are compared.
//!
//! The bot checks what the store answers with its own JavaScript, so every size, order and
//! equality the provenance rules decide is measured as JavaScript measures it, and only here.
//!
//! **Invariant:** pure; a lone surrogate (the `json::lone` encoding) is measured and ordered as
//! the one UTF-16 unit it stands for.

use std::cmp::Ordering;

use serde_json::Value;
/// `JSON.stringify(value)`: compact, keys in their order, numbers as JavaScript prints them.
pub(super) fn js_stringify(value: &Value) -> String {
    crate::json::stringify(value)
}

fn js_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    crate::json::write_string(s, &mut out);
    out
}

/// JavaScript's `a < b` on strings: UTF-16 code unit order.
pub(super) fn compare_text(a: &str, b: &str) -> Ordering {
    let mark = crate::json::lone::MARK;
    if a.contains(mark) || b.contains(mark) {
        crate::json::lone::utf16_units(a).cmp(&crate::json::lone::utf16_units(b))
    } else {
        a.encode_utf16().cmp(b.encode_utf16())
    }
}

/// Keys sorted by UTF-16 order, recursively; the form two values are compared in.
pub(super) fn canonical(value: &Value) -> String {
    match value {
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(canonical).collect();
            format!("[{}]", inner.join(","))
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| compare_text(a.0, b.0));
            let inner: Vec<String> = entries
                .into_iter()
                .map(|(k, v)| format!("{}:{}", js_string(k), canonical(v)))
                .collect();
            format!("{{{}}}", inner.join(","))
        }
        other => js_stringify(other),
    }
}

pub(super) fn bytes(value: &Value) -> usize {
    js_stringify(value).len()
}

pub(super) fn units(s: &str) -> usize {
    crate::text::utf16_len(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn js_stringify_prints_numbers_as_javascript() {
        assert_eq!(
            js_stringify(&json!({"a": 1.0, "b": [0.5, 1e21], "c": "x\u{1}"})),
            r#"{"a":1,"b":[0.5,1e+21],"c":"x\u0001"}"#
        );
    }
}
