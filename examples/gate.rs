//! Sorts facts into lessons and status, as the write path does.
//!
//! `cargo run --example gate`

// A harness: a panic is its failure report (see Cargo.toml's lint policy).
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]
use lessons::gate::rejection_marker_names;

fn main() {
    let facts = [
        "pull request 1835 pushed at sha 3f9a2c1 with 10,512 tests passing",
        "the license check false positive comes from nested node_modules loss; npm ci fixes it",
        "check:deps-drift names any tree or lockfile drift",
        "the README now documents the --frozen-lockfile flag",
    ];
    for fact in facts {
        let markers = rejection_marker_names(fact);
        if markers.is_empty() {
            println!("keep    {fact}");
        } else {
            println!("reject  {fact}  [{}]", markers.join(", "));
        }
    }
}
