//! A loss of acknowledged writes, once found, stays found: through every command that only
//! reads, through restarts, until `doctor --repair` accepts it; and no lost id is handed out
//! again, after the repair included.

use std::path::Path;

use crate::fixtures::store::StoreDir;
use crate::util::{in_store, stderr, stdout};

const SCOPE: &str = "repo:acme/app";

/// Writes `n` distinct facts through the CLI (one process, one batch, a clean close).
fn write_batch(store: &Path, batch: usize, n: usize) -> std::process::Output {
    let facts: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({
                "kind": "fact",
                "text": format!("batch {batch} lesson {i}: the e2e suite needs its cache volume writable"),
                "sourceThreadKey": "slack:C1:1",
            })
        })
        .collect();
    in_store(
        store,
        &["write", "--scope", "repo", "--repo", "acme/app", "--json"],
        &serde_json::Value::Array(facts).to_string(),
    )
}

fn ids(store: &Path) -> Vec<String> {
    let out = in_store(store, &["list", "--scope", SCOPE, "--json"], "");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).expect("json");
    v["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| r["id"].as_str().expect("id").to_owned())
        .collect()
}

fn refused(out: &std::process::Output) -> bool {
    out.status.code() == Some(2) && stderr(out).contains("acknowledged writes are missing")
}

#[test]
fn a_found_loss_survives_reads_and_restarts_until_a_repair_and_no_lost_id_returns() {
    let dir = StoreDir::new();
    let store = dir.path();
    let mut after_first = None;
    for batch in 0..4 {
        let w = write_batch(store, batch, 4);
        assert_eq!(w.status.code(), Some(0), "{}", stderr(&w));
        if batch == 0 {
            after_first = Some(dir.snapshot(&["records", "index"]));
        }
    }
    assert_eq!(ids(store).len(), 16);
    // The records and the index go back to the first batch; the witnesses beside them stay.
    dir.roll_back(&after_first.expect("taken after the first batch"));
    assert!(
        refused(&write_batch(store, 9, 1)),
        "the first write after the loss"
    );

    let reads: [&[&str]; 8] = [
        &["export"],
        &["list", "--scope", SCOPE],
        &["retrieve", "--scope", SCOPE, "--query", "cache volume"],
        &["review"],
        &["stats"],
        &["journal", "--scope", SCOPE],
        &["doctor"],
        &["sweep", "--scope", "all", "--dry-run"],
    ];
    for round in 0..2 {
        for args in reads {
            let out = in_store(store, args, "");
            let code = out.status.code();
            if args[0] == "doctor" {
                assert_eq!(code, Some(1), "doctor finds the loss: {}", stdout(&out));
                assert!(
                    stdout(&out).contains("ACKNOWLEDGED RECORDS LOST"),
                    "{}",
                    stdout(&out)
                );
                for seq in 4..16 {
                    let id = format!("mem:{SCOPE}:{seq}");
                    assert!(stdout(&out).contains(&id), "doctor names {id}");
                }
            }
            let w = write_batch(store, 10 + round, 1);
            assert!(
                refused(&w),
                "a write after `{}` (round {round}) is still refused: {} {}",
                args.join(" "),
                stdout(&w),
                stderr(&w)
            );
        }
    }

    let repair = in_store(store, &["doctor", "--repair"], "");
    assert_eq!(repair.status.code(), Some(0), "{}", stderr(&repair));
    let w = write_batch(store, 20, 3);
    assert_eq!(w.status.code(), Some(0), "after the repair: {}", stderr(&w));
    let mut now = ids(store);
    now.sort();
    let mut expected: Vec<String> = (0..4)
        .chain(16..19)
        .map(|seq| format!("mem:{SCOPE}:{seq}"))
        .collect();
    expected.sort();
    assert_eq!(
        now, expected,
        "the new records take ids past every lost one"
    );
    let check = in_store(store, &["doctor"], "");
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));
}

#[test]
fn ids_a_witness_saw_are_not_handed_out_again_even_when_the_loss_went_unseen() {
    let dir = StoreDir::new();
    let store = dir.path();
    let mut after_first = None;
    for batch in 0..3 {
        let w = write_batch(store, batch, 2);
        assert_eq!(w.status.code(), Some(0), "{}", stderr(&w));
        if batch == 0 {
            after_first = Some(dir.snapshot(&[]));
        }
    }
    // Everything goes back to the first batch but the witness of acknowledged ids: no
    // witness of batches proves a loss, yet the ids it names were acknowledged.
    let witness = std::fs::read(store.join("next-ids")).expect("next-ids");
    dir.roll_back(&after_first.expect("taken after the first batch"));
    std::fs::write(store.join("next-ids"), witness).expect("restore the witness");
    let w = write_batch(store, 7, 1);
    assert_eq!(w.status.code(), Some(0), "{}", stderr(&w));
    let mut now = ids(store);
    now.sort();
    assert_eq!(
        now,
        vec![
            format!("mem:{SCOPE}:0"),
            format!("mem:{SCOPE}:1"),
            format!("mem:{SCOPE}:6")
        ]
    );
}
