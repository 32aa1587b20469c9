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

#[test]
fn gate_corpus_replays() {
    let files = corpus("gate");
    assert!(
        files.len() >= 50,
        "the gate corpus is too small: {}",
        files.len()
    );
    for (_, data) in files {
        lessons::fuzzing::gate(&data);
    }
}

#[test]
fn reflection_corpus_replays() {
    let files = corpus("reflection");
    assert!(
        files.len() >= 10,
        "the reflection corpus is too small: {}",
        files.len()
    );
    for (_, data) in files {
        lessons::fuzzing::reflection(&data);
    }
}

#[test]
fn wire_corpus_replays() {
    let files = corpus("wire");
    assert!(
        files.len() >= 10,
        "the wire corpus is too small: {}",
        files.len()
    );
    for (_, data) in files {
        lessons::fuzzing::wire(&data);
    }
}

#[test]
fn provenance_corpus_replays() {
    let files = corpus("provenance");
    assert!(
        files.len() >= 10,
        "the provenance corpus is too small: {}",
        files.len()
    );
    for (_, data) in files {
        lessons::fuzzing::provenance(&data);
    }
}

#[test]
fn record_corpus_replays() {
    let files = corpus("record");
    assert!(
        files.len() >= 10,
        "the record corpus is too small: {}",
        files.len()
    );
    for (_, data) in files {
        lessons::fuzzing::record(&data);
    }
}
