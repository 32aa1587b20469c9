//! The gate against its data-driven cases, the reference's fixture, and random input.

use lessons::gate::{rejection_marker_names, rejection_markers, Marker, MARKER_NAMES};
use proptest::prelude::*;

use crate::util::jsonl;

fn expected(case: &serde_json::Value) -> Vec<String> {
    case["markers"]
        .as_array()
        .expect("markers is an array")
        .iter()
        .map(|m| m.as_str().expect("marker is a string").to_owned())
        .collect()
}

/// Runs every case of a JSON Lines file and reports all mismatches at once.
fn check(file: &str) -> usize {
    let cases = jsonl(file);
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let text = case["text"].as_str().expect("text is a string");
        let got: Vec<String> = rejection_marker_names(text)
            .into_iter()
            .map(str::to_owned)
            .collect();
        let want = expected(case);
        if got != want {
            let name = case["name"].as_str().unwrap_or("");
            failures.push(format!(
                "{file}:{} {name}\n  text: {text:?}\n  want: {want:?}\n  got:  {got:?}",
                i + 1
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    cases.len()
}

#[test]
fn named_cases_trip_and_near_misses_pass() {
    let n = check("gate-cases.jsonl");
    assert!(n >= 40, "the case file lost cases: {n}");
}

#[test]
fn every_marker_has_a_tripping_case_and_a_near_miss() {
    let cases = jsonl("gate-cases.jsonl");
    for name in MARKER_NAMES {
        let trips = cases.iter().any(|c| expected(c).iter().any(|m| m == name));
        let near_miss = cases.iter().any(|c| {
            c["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(&format!("near miss {name}")))
                && !expected(c).iter().any(|m| m == name)
        });
        assert!(trips, "no case trips {name}");
        assert!(near_miss, "no near miss for {name}");
    }
}

#[test]
fn agrees_with_the_reference_on_every_fixture_line() {
    let n = check("gate-compat.jsonl");
    assert!(n > 1900, "the fixture lost lines: {n}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn total_deterministic_and_ordered(text in any::<String>()) {
        let first = rejection_markers(&text);
        prop_assert_eq!(&first, &rejection_markers(&text));
        // Strictly increasing in report order: a subsequence of the nine names, no repeats.
        prop_assert!(first.windows(2).all(|w| w[0] < w[1]));
        prop_assert!(first.iter().all(|m| Marker::ALL.contains(m)));
    }

    #[test]
    fn marker_shaped_text_never_panics(
        parts in proptest::collection::vec(
            prop_oneof![
                Just("PR "), Just("#"), Just("12"), Just("pull/"), Just("was "), Just("merged"),
                Just("run "), Just("deadbeef"), Just("3f9a2c1"), Just("tests "), Just("passing"),
                Just("branch "), Just("a/b"), Just("now "), Just("uses"), Just("\u{FEFF}"),
                Just("\u{212A}"), Just("\u{130}"), Just("—"), Just("\n"), Just(";"), Just("\u{301}"),
                Just("spec "), Just("rows"), Just("unit "), Just("u3"), Just(" "),
            ],
            0..40,
        )
    ) {
        let text: String = parts.concat();
        let markers = rejection_markers(&text);
        prop_assert!(markers.windows(2).all(|w| w[0] < w[1]));
    }
}

#[test]
fn long_inputs_answer_in_linear_time_without_panicking() {
    // A pathological shape for a backtracking engine: many words between "was" and the verb.
    let text = "was ".repeat(50_000) + "merged";
    assert_eq!(rejection_marker_names(&text), ["delivery"]);
    let hex = "a1".repeat(100_000);
    assert!(
        rejection_markers(&hex).is_empty(),
        "a 200k hex run is not a sha"
    );
}
