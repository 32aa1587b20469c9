//! A write's insertion and eviction entries leave their text to the record they name, and are
//! marked so. An entry stored whole without a text (an import's) is never given the text of a
//! record that happens to bear its id, and an entry whose record was lost is found by `doctor`
//! and stored whole by `--repair`.

use lessons::store::{MemoryStore, WriteOptions};
use lessons::{Decision, DecisionQuery};

use super::{foreign_textless_entries, three_writes_at_cap_two};
use crate::fixtures::store::StoreDir;
use crate::util::{exported_decisions, fact, scope};

/// Every entry of a scope: the default query reads up to 100.
fn every_decision() -> DecisionQuery {
    DecisionQuery::default()
}

#[test]
fn an_entry_imported_without_a_text_is_never_given_another_records_text() {
    let dir = StoreDir::new();
    let app = scope("repo:acme/app");
    let store = dir.open();
    store
        .write(
            &app,
            &[fact("run npm ci before the license check")],
            &WriteOptions::default(),
        )
        .expect("write");
    // Exported by another store whose record 0 of this scope was another lesson, and whose
    // text that store had lost.
    let imported = foreign_textless_entries(&app);
    assert_eq!(store.import_decisions(&imported).expect("import"), 2);
    let read = store.decisions(&app, &every_decision()).expect("journal");
    let (theirs, ours): (Vec<_>, Vec<_>) =
        read.into_iter().partition(|d| d.source_run_id.is_some());
    assert_eq!(ours.len(), 1, "{ours:?}");
    assert_eq!(ours[0].texts, ["run npm ci before the license check"]);
    let mut theirs = theirs;
    theirs.reverse();
    assert_eq!(theirs, imported, "read as imported: without a text");
    let exported: Vec<_> = exported_decisions(&store)
        .into_iter()
        .filter(|d| d.source_run_id.is_some())
        .collect();
    assert_eq!(exported, imported, "exported as imported");
    assert!(store.check().expect("doctor").is_ok());
}

#[test]
fn doctor_finds_an_entry_whose_record_is_lost_and_repair_stores_it_whole() {
    let dir = StoreDir::new();
    let app = scope("repo:acme/app");
    let before = three_writes_at_cap_two(&dir, &app);
    // Record 0, evicted by the third write, is lost: only damage removes a retired record.
    {
        let raw = dir.raw();
        let retired = raw
            .keyspace("retired", fjall::KeyspaceCreateOptions::default)
            .expect("retired");
        let keys: Vec<_> = retired
            .iter()
            .map(|g| g.key().expect("read").to_vec())
            .collect();
        assert_eq!(keys.len(), 1, "one retired record");
        retired.remove(keys[0].clone()).expect("remove");
        raw.persist(fjall::PersistMode::SyncAll).expect("persist");
    }
    let lost = app.record_id(0);
    dir.closed(|store| {
        let health = store.check().expect("doctor");
        assert!(!health.is_ok());
        assert_eq!(
            health.problems,
            [
                format!("the journal's inserted entry of {lost} names a record the store does not hold: its text is lost"),
                format!("the journal's evicted entry of {lost} names a record the store does not hold: its text is lost"),
            ]
        );
        let repaired = store.repair().expect("repair");
        assert!(repaired.is_ok(), "{repaired:?}");
    });
    let after = dir.closed(|store| {
        assert!(
            store.check().expect("doctor").is_ok(),
            "still whole after a reopen"
        );
        store.decisions(&app, &every_decision()).expect("journal")
    });
    // Every entry is kept: those of the lost record without its text, the rest as before.
    let expected: Vec<Decision> = before
        .into_iter()
        .map(|mut d| {
            if d.ids == [lost.clone()] {
                d.texts.clear();
            }
            d
        })
        .collect();
    assert_eq!(after, expected);
    assert_eq!(after.iter().filter(|d| d.texts.is_empty()).count(), 2);
}
