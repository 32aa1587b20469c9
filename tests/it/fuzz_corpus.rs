//! Replays every committed fuzz corpus on stable, so CI covers what the fuzzers found.

use std::path::PathBuf;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("corpus entry is readable").path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let data = std::fs::read(&p).expect("corpus file is readable");
            (p, data)
        })
        .collect()
}

/// Replays `target`'s corpus through its body, which panics on a broken property; a corpus
/// smaller than `at_least` files is itself a failure (a lost directory would pass silently).
fn replay(target: &str, at_least: usize, body: fn(&[u8])) {
    let files = corpus(target);
    assert!(
        files.len() >= at_least,
        "the {target} corpus is too small: {}",
        files.len()
    );
    for (_, data) in files {
        body(&data);
    }
}

#[test]
fn gate_corpus_replays() {
    replay("gate", 50, lessons::fuzzing::gate);
}

#[test]
fn reflection_corpus_replays() {
    replay("reflection", 10, lessons::fuzzing::reflection);
}

#[test]
fn wire_corpus_replays() {
    replay("wire", 10, lessons::fuzzing::wire);
}

#[test]
fn provenance_corpus_replays() {
    replay("provenance", 10, lessons::fuzzing::provenance);
}

#[test]
fn record_corpus_replays() {
    replay("record", 10, lessons::fuzzing::record);
}

#[test]
fn journal_entry_corpus_replays() {
    replay("journal_entry", 10, lessons::fuzzing::journal_entry);
}
