//! A journal cut short, as a power cut leaves writes the disk never made durable: the loss is
//! found, writes are refused, and no lost id is handed out again.

use lessons::store::{EmbeddedStore, MemoryStore, WriteOptions};
use lessons::{Candidate, ErrorKind, ScopeKey};

use super::{all_records, next_id, next_id_in, write_batches};
use crate::fixtures::store::StoreDir;
use crate::util::{fact, scope};

/// Four writes of ten records to `s`, then `more`; the index commits (as the indexer does every
/// second), then the process dies, leaving the journal the records' only copy.
fn forty_then_a_crash(dir: &StoreDir, s: &ScopeKey, more: impl FnOnce(&EmbeddedStore)) {
    dir.crashed(|store| {
        write_batches(store, s, 4, 10);
        more(store);
        store.flush().expect("flush");
    });
}

#[test]
fn a_journal_cut_after_a_clean_close_loses_nothing() {
    let dir = StoreDir::new();
    let s = scope("repo:a/b");
    // Four processes, each writing ten records and closing cleanly, as four CLI writes do.
    for w in 0..4 {
        let batch: Vec<Candidate> = (0..10)
            .map(|i| {
                fact(&format!(
                    "lesson {w}-{i}: pin the toolchain of crate {w}{i}"
                ))
            })
            .collect();
        dir.closed(|store| {
            store
                .write(&s, &batch, &WriteOptions::default())
                .expect("write")
        });
    }
    dir.cut_journal(|len| len / 2);
    let store = dir
        .try_open()
        .expect("a clean close left the records in tables");
    assert_eq!(all_records(&store).len(), 40);
    assert!(store.check().expect("doctor").is_ok());
    assert_eq!(next_id(&store, &s), "mem:repo:a/b:40");
}

#[test]
fn a_journal_cut_after_a_crash_refuses_writes_and_never_hands_out_a_lost_id() {
    let dir = StoreDir::new();
    let s = scope("repo:a/b");
    forty_then_a_crash(&dir, &s, |_| {});
    dir.cut_journal(|len| len / 2);

    let store = dir
        .try_open()
        .expect("a damaged store still opens for reading");
    let kept = all_records(&store).len();
    assert!(
        kept < 40,
        "the cut journal held the only copy of some records"
    );
    let err = store
        .write(&s, &[fact("one more lesson")], &WriteOptions::default())
        .expect_err("a write to a store that lost acknowledged records is refused");
    assert_eq!(err.kind(), ErrorKind::Damaged, "{err}");
    assert!(err.message().contains("doctor --salvage"), "{err}");
    assert!(
        store.forget(&s, "mem:repo:a/b:0").is_err(),
        "every write is refused"
    );
    let health = store.check().expect("doctor");
    assert!(!health.is_ok());
    assert!(health.damage.is_some());
    assert_eq!(
        health.lost.len(),
        (40 - kept).min(20),
        "doctor names the lost ids: {health:?}"
    );
    assert!(health.lost.contains(&"mem:repo:a/b:39".to_owned()));
    drop(store);

    // Salvage copies what is left and reserves the lost ids.
    let (to, report) = dir.salvage("salvaged");
    assert_eq!(report.copied as usize, kept, "{report:?}");
    assert_eq!(report.lost.len(), 40 - kept, "{report:?}");
    assert!(report.unreadable >= report.lost.len() as u64);
    let salvaged = EmbeddedStore::open(&to).expect("open the salvaged store");
    assert_eq!(next_id(&salvaged, &s), "mem:repo:a/b:40");
    assert!(salvaged.check().expect("doctor").is_ok());
    drop(salvaged);

    // Or the loss is accepted in place.
    let store = dir.try_open().expect("reopen");
    let health = store.repair().expect("repair accepts the loss");
    assert!(health.is_ok(), "{health:?}");
    assert_eq!(next_id(&store, &s), "mem:repo:a/b:40");
    store.close().expect("close");
    let store = dir.try_open().expect("reopen after the repair");
    assert!(store.check().expect("doctor").is_ok());
    assert_eq!(next_id(&store, &s), "mem:repo:a/b:41");
}

#[test]
fn ids_of_retired_records_lost_with_a_cut_journal_are_never_handed_out_again() {
    let dir = StoreDir::new();
    let s = scope("repo:a/b");
    forty_then_a_crash(&dir, &s, |store| {
        // The newest records are retired: the keyword index no longer names them.
        for seq in 35..40 {
            assert!(store
                .forget(&s, &format!("mem:repo:a/b:{seq}"))
                .expect("forget"));
        }
    });
    dir.cut_journal(|len| len / 2);

    let store = dir.try_open().expect("opens for reading");
    let kept = all_records(&store).len();
    assert!(kept <= 30, "the cut took the forgotten records too: {kept}");
    let health = store.check().expect("doctor");
    assert!(health.damage.is_some(), "{health:?}");
    assert!(
        health.lost.contains(&"mem:repo:a/b:39".to_owned()),
        "a forgotten record's id is among the lost: {health:?}"
    );
    drop(store);

    let (to, report) = dir.salvage("salvaged");
    assert_eq!(report.lost.len(), 40 - kept, "{report:?}");
    assert_eq!(next_id_in(&to, &s), "mem:repo:a/b:40");

    let store = dir.try_open().expect("reopen");
    assert!(store.repair().expect("repair accepts the loss").is_ok());
    assert_eq!(next_id(&store, &s), "mem:repo:a/b:40");
}

#[test]
fn cutting_the_last_batch_after_a_crash_is_caught_by_the_index() {
    let dir = StoreDir::new();
    let s = scope("repo:a/b");
    forty_then_a_crash(&dir, &s, |_| {});
    dir.cut_journal(|len| len - 2_000);
    let store = dir.try_open().expect("opens for reading");
    let health = store.check().expect("doctor");
    assert!(health.damage.is_some(), "{health:?}");
    assert!(!health.lost.is_empty(), "{health:?}");
    assert!(store
        .write(&s, &[fact("after the cut")], &WriteOptions::default())
        .is_err());
}
