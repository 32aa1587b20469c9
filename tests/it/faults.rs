//! Faults an operator meets: a deleted lock file, a garbled or missing journal, stale
//! bookkeeping, a damaged table. Each is reproduced on a real store directory, and each must be
//! refused or repaired without losing or overwriting a record.

use std::path::Path;

use lessons::store::{EmbeddedStore, MemoryStore, WriteOptions};
use lessons::{Candidate, ErrorKind, Kind, Record, ScopeKey};

fn scope(s: &str) -> ScopeKey {
    ScopeKey::parse(s).expect("valid scope")
}

fn fact(text: &str) -> Candidate {
    Candidate {
        kind: Some(Kind::Fact),
        text: text.to_owned(),
        source_thread_key: "slack:C1:1".to_owned(),
        ..Candidate::default()
    }
}

/// Writes `n` facts to `s`, one write each (one journal batch each).
fn write_facts(store: &EmbeddedStore, s: &ScopeKey, from: usize, n: usize) {
    for i in from..from + n {
        let text = format!("lesson {i}: run the schema check before the migration {i}");
        let counts = store
            .write(s, &[fact(&text)], &WriteOptions::default())
            .expect("write");
        assert_eq!(counts.inserted, 1);
    }
}

fn all_records(store: &EmbeddedStore) -> Vec<Record> {
    let mut out = Vec::new();
    store
        .export(&mut |r| {
            out.push(r);
            Ok(())
        })
        .expect("export");
    out
}

fn journal_of(dir: &Path) -> std::path::PathBuf {
    let mut files: Vec<_> = std::fs::read_dir(dir.join("records"))
        .expect("records dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jnl"))
        .collect();
    files.sort();
    files.pop().expect("a journal file")
}

/// Opens the records directory with fjall itself, as a tool (or a bug) would.
fn raw(dir: &Path) -> fjall::Database {
    fjall::Database::builder(dir.join("records"))
        .journal_compression(fjall::CompressionType::None)
        .open()
        .expect("raw fjall open")
}

#[test]
fn a_deleted_and_recreated_lock_file_does_not_let_a_second_owner_in() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = EmbeddedStore::open(dir.path()).expect("open");
    let lock = dir.path().join("records/lock");
    std::fs::remove_file(&lock).expect("remove the lock file");
    std::fs::write(&lock, b"").expect("recreate it");
    let second = EmbeddedStore::open(dir.path());
    let err = second.err().expect("a second owner is refused");
    assert_eq!(err.kind(), ErrorKind::Locked, "{err}");
    assert!(err.message().contains("held by another process"), "{err}");
    drop(first);
}

#[test]
fn a_missing_lock_file_is_recreated_at_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("repo:acme/app");
    {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        write_facts(&store, &s, 0, 3);
        store.close().expect("close");
    }
    std::fs::remove_file(dir.path().join("records/lock")).expect("remove the lock file");
    let store = EmbeddedStore::open(dir.path()).expect("opens without its lock file");
    assert_eq!(all_records(&store).len(), 3);
}

#[test]
fn a_garbled_journal_is_refused_untouched_and_salvaged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("repo:acme/app");
    let before = {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        write_facts(&store, &s, 0, 200);
        let r = all_records(&store);
        store.close().expect("close");
        r
    };
    let journal = journal_of(dir.path());
    let mut bytes = std::fs::read(&journal).expect("read journal");
    // The file may be preallocated past its data: garble next to a record in the middle.
    let mid = bytes
        .windows(11)
        .position(|w| w == b"lesson 100:")
        .expect("the text is in the journal");
    for b in bytes.iter_mut().skip(mid).take(700) {
        *b = 0xab;
    }
    std::fs::write(&journal, &bytes).expect("garble");

    let err = EmbeddedStore::open(dir.path())
        .err()
        .expect("a damaged journal is refused");
    assert_eq!(err.kind(), ErrorKind::Damaged, "{err}");
    assert!(
        err.message().contains(&journal.display().to_string()),
        "{err}"
    );
    assert!(err.message().contains("doctor --salvage"), "{err}");
    assert_eq!(
        std::fs::read(&journal).expect("reread"),
        bytes,
        "the refused open changed nothing"
    );

    let to = dir.path().join("salvaged");
    let report = lessons::store::salvage(dir.path(), &to).expect("salvage");
    assert_eq!(report.damaged_journals.len(), 1);
    let store = EmbeddedStore::open(&to).expect("the salvaged store opens");
    let after = all_records(&store);
    // 700 garbled bytes cover a few one-record batches; every other record is back, unchanged.
    assert!(after.len() >= 190, "salvaged {} of 200", after.len());
    assert!(after.len() < 200, "the garbled batches cannot be read");
    for r in &after {
        let original = before.iter().find(|b| b.id == r.id).expect("a known id");
        assert_eq!(r, original);
    }
    assert!(store.check().expect("doctor").is_ok());
    // The bookkeeping is derived: the next write gets a fresh id above every salvaged one.
    let max_seq = after.iter().filter_map(Record::seq).max().expect("records");
    store
        .write(
            &s,
            &[fact("a new lesson after the salvage")],
            &WriteOptions::default(),
        )
        .expect("write");
    let newest = store
        .list(&s, &lessons::store::ListQuery::newest(1))
        .expect("list");
    assert_eq!(newest[0].seq(), Some(max_seq + 1));
}

#[test]
fn a_flipped_byte_in_the_journal_is_refused_not_replayed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("repo:acme/app");
    {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        write_facts(&store, &s, 0, 20);
        store.close().expect("close");
    }
    let journal = journal_of(dir.path());
    let mut bytes = std::fs::read(&journal).expect("read journal");
    let at = bytes
        .windows(9)
        .position(|w| w == b"lesson 7:")
        .expect("the text is in the journal");
    bytes[at] = b'L';
    std::fs::write(&journal, &bytes).expect("flip");
    let err = EmbeddedStore::open(dir.path()).err().expect("refused");
    assert_eq!(err.kind(), ErrorKind::Damaged, "{err}");
    assert!(err.message().contains("checksum"), "{err}");
}

#[test]
fn a_deleted_journal_is_refused_instead_of_reading_as_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("repo:acme/app");
    {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        write_facts(&store, &s, 0, 5);
        store.close().expect("close");
    }
    std::fs::remove_file(journal_of(dir.path())).expect("delete the journal");
    let err = EmbeddedStore::open(dir.path()).err().expect("refused");
    assert_eq!(err.kind(), ErrorKind::Damaged, "{err}");
    assert!(err.message().contains("no journal"), "{err}");
}

#[test]
fn records_flushed_to_tables_survive_a_deleted_journal_through_salvage() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("repo:acme/app");
    {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        write_facts(&store, &s, 0, 30);
        store.close().expect("close");
    }
    {
        let db = raw(dir.path());
        for name in [
            "active", "retired", "norms", "scopes", "counters", "outbox", "meta",
        ] {
            let ks = db
                .keyspace(name, fjall::KeyspaceCreateOptions::default)
                .expect("keyspace");
            ks.rotate_memtable_and_wait().expect("flush");
        }
    }
    std::fs::remove_file(journal_of(dir.path())).expect("delete the journal");
    assert!(EmbeddedStore::open(dir.path()).is_err());
    let to = dir.path().join("salvaged");
    let report = lessons::store::salvage(dir.path(), &to).expect("salvage");
    assert!(report.journal_missing);
    assert_eq!(report.copied, 30, "{report:?}");
}

#[test]
fn stale_bookkeeping_is_repaired_and_never_mints_an_existing_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("repo:acme/app");
    {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        write_facts(&store, &s, 0, 10);
        store.close().expect("close");
    }
    let stale = {
        let db = raw(dir.path());
        let scopes = db
            .keyspace("scopes", fjall::KeyspaceCreateOptions::default)
            .expect("scopes");
        scopes
            .get(s.as_str())
            .expect("read")
            .expect("bookkeeping")
            .to_vec()
    };
    {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        write_facts(&store, &s, 10, 10);
        store.close().expect("close");
    }
    {
        // Put the bookkeeping back ten writes: what a journal cut between keyspaces leaves.
        let db = raw(dir.path());
        let scopes = db
            .keyspace("scopes", fjall::KeyspaceCreateOptions::default)
            .expect("scopes");
        scopes.insert(s.as_str(), stale).expect("write stale");
        db.persist(fjall::PersistMode::SyncAll).expect("persist");
    }
    let store = EmbeddedStore::open(dir.path()).expect("open");
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
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("repo:acme/app");
    {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        write_facts(&store, &s, 0, 7);
        store.close().expect("close");
    }
    {
        let db = raw(dir.path());
        let scopes = db
            .keyspace("scopes", fjall::KeyspaceCreateOptions::default)
            .expect("scopes");
        scopes.remove(s.as_str()).expect("lose the bookkeeping");
        db.persist(fjall::PersistMode::SyncAll).expect("persist");
    }
    let store = EmbeddedStore::open(dir.path()).expect("open");
    assert_eq!(all_records(&store).len(), 7);
    assert_eq!(store.scopes().expect("scopes"), vec![s.clone()]);
    let health = store.check().expect("doctor");
    assert!(health.problems.iter().any(|p| p.contains("no bookkeeping")));
    let repaired = store.repair().expect("repair");
    assert!(repaired.is_ok(), "{repaired:?}");
}

#[test]
fn a_damaged_table_gives_a_plain_error_and_salvage_reads_around_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("repo:acme/app");
    {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        write_facts(&store, &s, 0, 40);
        store.close().expect("close");
    }
    {
        let db = raw(dir.path());
        let ks = db
            .keyspace("active", fjall::KeyspaceCreateOptions::default)
            .expect("active");
        ks.rotate_memtable_and_wait().expect("flush");
    }
    // Garble the end of every table of the records keyspace: its footer no longer reads.
    let mut garbled = 0;
    for ks in std::fs::read_dir(dir.path().join("records/keyspaces")).expect("keyspaces") {
        let tables = ks.expect("entry").path().join("tables");
        let Ok(entries) = std::fs::read_dir(&tables) else {
            continue;
        };
        for t in entries {
            let p = t.expect("entry").path();
            let mut bytes = std::fs::read(&p).expect("table");
            if !bytes.windows(9).any(|w| w == b"lesson 1:") {
                continue;
            }
            let n = bytes.len();
            for b in bytes.iter_mut().skip(n - 40) {
                *b = 0xab;
            }
            std::fs::write(&p, &bytes).expect("garble");
            garbled += 1;
        }
    }
    assert!(garbled > 0, "the records were flushed to a table");
    let err = EmbeddedStore::open(dir.path()).err().expect("refused");
    let msg = err.to_string();
    assert!(
        !msg.contains("Storage(") && !msg.contains('{'),
        "debug form: {msg}"
    );
    assert!(msg.contains("doctor --salvage"), "{msg}");
    let to = dir.path().join("salvaged");
    let report = lessons::store::salvage(dir.path(), &to).expect("salvage");
    assert!(report.tables_error.is_some());
    assert_eq!(
        report.copied, 40,
        "every record is still in the journal: {report:?}"
    );
}

#[test]
fn a_creation_cut_short_is_created_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    // What a kill between fjall's first files and its version marker leaves behind: the lock
    // file, the keyspaces folder and an empty (preallocated) journal.
    let records = dir.path().join("records");
    std::fs::create_dir_all(records.join("keyspaces")).expect("keyspaces");
    std::fs::write(records.join("lock"), b"").expect("lock");
    std::fs::write(records.join("0.jnl"), vec![0u8; 4096]).expect("journal");
    assert!(
        EmbeddedStore::open(dir.path()).is_ok(),
        "an empty half-created store is recreated"
    );
    let store = EmbeddedStore::open(dir.path()).expect("an empty half-created store is recreated");
    let s = scope("repo:acme/app");
    write_facts(&store, &s, 0, 2);
    assert_eq!(all_records(&store).len(), 2);
}

#[test]
fn a_missing_version_marker_on_a_store_with_records_is_refused_and_salvaged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("repo:acme/app");
    {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        write_facts(&store, &s, 0, 12);
        store.close().expect("close");
    }
    std::fs::remove_file(dir.path().join("records/version")).expect("remove the marker");
    let err = EmbeddedStore::open(dir.path()).err().expect("refused");
    assert_eq!(err.kind(), ErrorKind::Damaged, "{err}");
    assert!(err.message().contains("version marker"), "{err}");
    let to = dir.path().join("salvaged");
    let report = lessons::store::salvage(dir.path(), &to).expect("salvage");
    assert_eq!(report.copied, 12, "{report:?}");
}
