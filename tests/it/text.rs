//! The text functions against the reference's answers.

use lessons::internals::text::{estimate_tokens, normalize, sanitize, tokenize};

use crate::util::jsonl;

#[test]
fn agrees_with_the_reference_on_every_fixture_line() {
    let cases = jsonl("text-compat.jsonl");
    assert!(
        cases.len() > 1900,
        "the fixture lost lines: {}",
        cases.len()
    );
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let text = case["text"].as_str().expect("text is a string");
        let tokens: Vec<String> = case["tokens"]
            .as_array()
            .expect("tokens is an array")
            .iter()
            .map(|t| t.as_str().expect("token is a string").to_owned())
            .collect();
        let checks = [
            ("tokens", tokenize(text) == tokens),
            ("normalized", normalize(text) == case["normalized"]),
            ("sanitized", sanitize(text) == case["sanitized"]),
            (
                "estimateTokens",
                Some(estimate_tokens(text) as u64) == case["estimateTokens"].as_u64(),
            ),
        ];
        for (field, ok) in checks {
            if !ok {
                failures.push(format!("line {}: {field} differs for {text:?}", i + 1));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
