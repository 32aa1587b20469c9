//! What an open finds besides the journal: a lock file deleted or missing, a creation cut
//! short, a missing version marker, stale bookkeeping, temporary files left in the index.

use lessons::store::{MemoryStore, WriteOptions};
use lessons::ErrorKind;

use super::{all_records, write_facts};
use crate::fixtures::store::StoreDir;
use crate::util::{fact, scope};

#[test]
fn a_deleted_and_recreated_lock_file_does_not_let_a_second_owner_in() {
    let dir = StoreDir::new();
    let first = dir.open();
    let lock = dir.path().join("records/lock");
    std::fs::remove_file(&lock).expect("remove the lock file");
    std::fs::write(&lock, b"").expect("recreate it");
    let second = dir.try_open();
    let err = second.err().expect("a second owner is refused");
    assert_eq!(err.kind(), ErrorKind::Locked, "{err}");
    assert!(err.message().contains("held by another process"), "{err}");
    drop(first);
}

#[test]
fn a_missing_lock_file_is_recreated_at_open() {
    let dir = StoreDir::new();
    let s = scope("repo:acme/app");
    dir.closed(|store| write_facts(store, &s, 0, 3));
    std::fs::remove_file(dir.path().join("records/lock")).expect("remove the lock file");
    let store = dir.try_open().expect("opens without its lock file");
    assert_eq!(all_records(&store).len(), 3);
}

#[test]
fn a_creation_cut_short_is_created_again() {
    let dir = StoreDir::new();
    // What a kill between fjall's first files and its version marker leaves behind: the lock
    // file, the keyspaces folder and an empty (preallocated) journal.
    let records = dir.path().join("records");
    std::fs::create_dir_all(records.join("keyspaces")).expect("keyspaces");
    std::fs::write(records.join("lock"), b"").expect("lock");
    std::fs::write(records.join("0.jnl"), vec![0u8; 4096]).expect("journal");
    assert!(
        dir.try_open().is_ok(),
        "an empty half-created store is recreated"
    );
    let store = dir
        .try_open()
        .expect("an empty half-created store is recreated");
    let s = scope("repo:acme/app");
    write_facts(&store, &s, 0, 2);
    assert_eq!(all_records(&store).len(), 2);
}

#[test]
fn a_missing_version_marker_on_a_store_with_records_is_refused_and_salvaged() {
    let dir = StoreDir::new();
    let s = scope("repo:acme/app");
    dir.closed(|store| write_facts(store, &s, 0, 12));
    std::fs::remove_file(dir.path().join("records/version")).expect("remove the marker");
    let err = dir.refused();
    assert_eq!(err.kind(), ErrorKind::Damaged, "{err}");
    assert!(err.message().contains("version marker"), "{err}");
    let (_, report) = dir.salvage("salvaged");
    assert_eq!(report.copied, 12, "{report:?}");
}

#[test]
fn stale_bookkeeping_is_repaired_and_never_mints_an_existing_id() {
    let dir = StoreDir::new();
    let s = scope("repo:acme/app");
    dir.closed(|store| write_facts(store, &s, 0, 10));
    let stale = {
        let db = dir.raw();
        let scopes = db
            .keyspace("scopes", fjall::KeyspaceCreateOptions::default)
            .expect("scopes");
        scopes
            .get(s.as_str())
            .expect("read")
            .expect("bookkeeping")
            .to_vec()
    };
    dir.closed(|store| write_facts(store, &s, 10, 10));
    {
        // Put the bookkeeping back ten writes: what a journal cut between keyspaces leaves.
        let db = dir.raw();
        let scopes = db
            .keyspace("scopes", fjall::KeyspaceCreateOptions::default)
            .expect("scopes");
        scopes.insert(s.as_str(), stale).expect("write stale");
        db.persist(fjall::PersistMode::SyncAll).expect("persist");
    }
    let store = dir.open();
    let health = store.check().expect("doctor");
    assert!(!health.is_ok());
    assert!(
        health
            .problems
            .iter()
            .any(|p| p.contains("would mint its next id at 10")),
        "{:?}",
        health.problems
    );
    let before = all_records(&store);
    store
        .write(
            &s,
            &[fact("the eleventh lesson is new")],
            &WriteOptions::default(),
        )
        .expect("write");
    let after = all_records(&store);
    assert_eq!(after.len(), 21);
    for r in &before {
        assert!(after.contains(r), "{} was overwritten", r.id);
    }
    assert!(after
        .iter()
        .any(|r| r.seq() == Some(20) && r.text == "the eleventh lesson is new"));
    assert!(
        store.check().expect("doctor").is_ok(),
        "the write repaired it"
    );
}

#[test]
fn export_and_scopes_read_the_records_not_the_bookkeeping() {
    let dir = StoreDir::new();
    let s = scope("repo:acme/app");
    dir.closed(|store| write_facts(store, &s, 0, 7));
    {
        let db = dir.raw();
        let scopes = db
            .keyspace("scopes", fjall::KeyspaceCreateOptions::default)
            .expect("scopes");
        scopes.remove(s.as_str()).expect("lose the bookkeeping");
        db.persist(fjall::PersistMode::SyncAll).expect("persist");
    }
    let store = dir.open();
    assert_eq!(all_records(&store).len(), 7);
    assert_eq!(store.scopes().expect("scopes"), vec![s.clone()]);
    let health = store.check().expect("doctor");
    assert!(health.problems.iter().any(|p| p.contains("no bookkeeping")));
    let repaired = store.repair().expect("repair");
    assert!(repaired.is_ok(), "{repaired:?}");
}

#[test]
fn open_and_close_leave_no_temporary_files_in_the_index() {
    let dir = StoreDir::new();
    let s = scope("repo:a/b");
    for i in 0..60 {
        dir.closed(|store| {
            store
                .write(
                    &s,
                    &[fact(&format!("lesson {i}: keep the cache warm"))],
                    &WriteOptions::default(),
                )
                .expect("write")
        });
    }
    let orphans: Vec<String> = std::fs::read_dir(dir.path().join("index"))
        .expect("index")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp"))
        .collect();
    assert!(orphans.is_empty(), "{orphans:?}");
}
