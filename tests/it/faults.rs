//! Faults an operator meets: a deleted lock file, a garbled or missing journal, stale
//! bookkeeping, a damaged table. Each is reproduced on a real store directory, and each must be
//! refused or repaired without losing or overwriting a record.

use std::path::Path;

use lessons::store::{EmbeddedStore, MemoryStore, WriteOptions};
use lessons::{Candidate, ErrorKind, Record, ScopeKey};

use crate::util::{exported, fact, scope};

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
    exported(store)
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
        // A crash, so the journal is the records' only copy (a clean close would have moved
        // them into tables).
        store.close_as_crash();
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
        // A crash: a clean close would have emptied the journal into tables.
        store.close_as_crash();
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
fn salvage_keeps_each_records_use_from_the_journal_and_from_the_tables() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("repo:acme/app");
    let before = {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        write_facts(&store, &s, 0, 12);
        for q in [
            "schema check",
            "migration 3",
            "schema migration 7",
            "check 3",
        ] {
            assert!(!store.retrieve(&s, q, 4).expect("retrieve").is_empty());
        }
        let records = all_records(&store);
        assert!(
            records.iter().any(|r| r.use_count >= 2),
            "some lesson used twice"
        );
        store.close().expect("close");
        records
    };
    let same_use = |salvaged: &Path| {
        let store = EmbeddedStore::open(salvaged).expect("the salvaged store opens");
        let after = all_records(&store);
        assert_eq!(after.len(), before.len());
        for r in &before {
            assert_eq!(
                use_of(&after, &r.id),
                (r.use_count, r.last_used_at),
                "{}",
                r.id
            );
        }
    };
    // Read from the copy's tables and its journal.
    let to = dir.path().join("salvaged");
    let report = lessons::store::salvage(dir.path(), &to).expect("salvage");
    assert_eq!(report.copied, 12, "{report:?}");
    same_use(&to);
    // Read from the tables alone: everything flushed, the journal gone.
    {
        let db = raw(dir.path());
        for name in ["active", "retired", "norms", "scopes", "usage", "meta"] {
            let ks = db
                .keyspace(name, fjall::KeyspaceCreateOptions::default)
                .expect("keyspace");
            ks.rotate_memtable_and_wait().expect("flush");
        }
    }
    std::fs::remove_file(journal_of(dir.path())).expect("delete the journal");
    let to = dir.path().join("salvaged-from-tables");
    let report = lessons::store::salvage(dir.path(), &to).expect("salvage");
    assert!(report.journal_missing);
    same_use(&to);
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
        // A crash leaves the records in the journal (a clean close would have emptied it into
        // tables); fjall then flushes them into tables too, as a running store does.
        store.close_as_crash();
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
fn one_bad_block_in_a_table_costs_salvage_only_that_block() {
    let dir = tempfile::tempdir().expect("tempdir");
    let scopes: Vec<ScopeKey> = (0..30)
        .map(|i| scope(&format!("repo:acme/app{i}")))
        .collect();
    {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        for s in &scopes {
            write_batches(&store, s, 1, 20);
        }
        // A clean close leaves every record in tables.
        store.close().expect("close");
    }
    // Only the tables hold the records now, as in a store whose journal has long rotated.
    for e in std::fs::read_dir(dir.path().join("records")).expect("records") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "jnl") {
            std::fs::remove_file(&p).expect("remove the journal");
        }
    }
    // One byte flipped in the middle of the records' largest table: one data block is bad.
    let mut largest: Option<(usize, std::path::PathBuf)> = None;
    for ks in std::fs::read_dir(dir.path().join("records/keyspaces")).expect("keyspaces") {
        let Ok(tables) = std::fs::read_dir(ks.expect("entry").path().join("tables")) else {
            continue;
        };
        for t in tables {
            let p = t.expect("entry").path();
            let bytes = std::fs::read(&p).expect("table");
            if bytes.windows(8).any(|w| w == b"lesson 0")
                && largest.as_ref().is_none_or(|(n, _)| bytes.len() > *n)
            {
                largest = Some((bytes.len(), p));
            }
        }
    }
    let (len, table) = largest.expect("the records were flushed to a table");
    let mut bytes = std::fs::read(&table).expect("table");
    bytes[len / 3] ^= 0x5a;
    std::fs::write(&table, &bytes).expect("flip");

    let to = dir.path().join("salvaged");
    let report = lessons::store::salvage(dir.path(), &to).expect("salvage");
    assert!(report.copied < 600, "the flip hit records: {report:?}");
    assert!(
        report.copied >= 540,
        "only the records of the bad block are lost, not every later key: {report:?}"
    );
    assert_eq!(
        report.copied + report.unreadable,
        600,
        "every record is copied or counted: {report:?}"
    );
    let salvaged = EmbeddedStore::open(&to).expect("open the salvaged store");
    assert_eq!(all_records(&salvaged).len() as u64, report.copied);
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

/// Writes `writes` batches of `per` facts each (one journal batch per write).
fn write_batches(store: &EmbeddedStore, s: &ScopeKey, writes: usize, per: usize) {
    for w in 0..writes {
        let batch: Vec<Candidate> = (0..per)
            .map(|i| {
                fact(&format!(
                    "lesson {w}-{i}: warm the cache of module {w}{i} first"
                ))
            })
            .collect();
        let counts = store
            .write(s, &batch, &WriteOptions::default())
            .expect("write");
        assert_eq!(counts.inserted as usize, per);
    }
}

/// Cuts the journal to `keep(length of its data)` bytes (a journal may be preallocated past
/// its data with zeros).
fn cut_journal(dir: &Path, keep: impl Fn(usize) -> usize) {
    let journal = journal_of(dir);
    let bytes = std::fs::read(&journal).expect("journal");
    let len = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&journal)
        .expect("open the journal");
    f.set_len(keep(len) as u64).expect("cut");
}

/// The id the next insert gets (each call writes a new text, so it never dedups).
fn next_id(store: &EmbeddedStore, s: &ScopeKey) -> String {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let counts = store
        .write(
            s,
            &[fact(&format!("lesson {n} written after the damage"))],
            &WriteOptions::default(),
        )
        .expect("write");
    assert_eq!(counts.inserted, 1);
    store.list(s, &lessons::ListQuery::newest(1)).expect("list")[0]
        .id
        .clone()
}

#[test]
fn a_journal_cut_after_a_clean_close_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("repo:a/b");
    // Four processes, each writing ten records and closing cleanly, as four CLI writes do.
    for w in 0..4 {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        let batch: Vec<Candidate> = (0..10)
            .map(|i| {
                fact(&format!(
                    "lesson {w}-{i}: pin the toolchain of crate {w}{i}"
                ))
            })
            .collect();
        store
            .write(&s, &batch, &WriteOptions::default())
            .expect("write");
        store.close().expect("close");
    }
    cut_journal(dir.path(), |len| len / 2);
    let store = EmbeddedStore::open(dir.path()).expect("a clean close left the records in tables");
    assert_eq!(all_records(&store).len(), 40);
    assert!(store.check().expect("doctor").is_ok());
    assert_eq!(next_id(&store, &s), "mem:repo:a/b:40");
}

#[test]
fn a_journal_cut_after_a_crash_refuses_writes_and_never_hands_out_a_lost_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("repo:a/b");
    {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        write_batches(&store, &s, 4, 10);
        // The index commits (as the indexer does every second), then the process dies.
        store.flush().expect("flush");
        store.close_as_crash();
    }
    cut_journal(dir.path(), |len| len / 2);

    let store = EmbeddedStore::open(dir.path()).expect("a damaged store still opens for reading");
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
    let to = dir.path().join("salvaged");
    let report = lessons::store::salvage(dir.path(), &to).expect("salvage");
    assert_eq!(report.copied as usize, kept, "{report:?}");
    assert_eq!(report.lost.len(), 40 - kept, "{report:?}");
    assert!(report.unreadable >= report.lost.len() as u64);
    let salvaged = EmbeddedStore::open(&to).expect("open the salvaged store");
    assert_eq!(next_id(&salvaged, &s), "mem:repo:a/b:40");
    assert!(salvaged.check().expect("doctor").is_ok());
    drop(salvaged);

    // Or the loss is accepted in place.
    let store = EmbeddedStore::open(dir.path()).expect("reopen");
    let health = store.repair().expect("repair accepts the loss");
    assert!(health.is_ok(), "{health:?}");
    assert_eq!(next_id(&store, &s), "mem:repo:a/b:40");
    store.close().expect("close");
    let store = EmbeddedStore::open(dir.path()).expect("reopen after the repair");
    assert!(store.check().expect("doctor").is_ok());
    assert_eq!(next_id(&store, &s), "mem:repo:a/b:41");
}

#[test]
fn ids_of_retired_records_lost_with_a_cut_journal_are_never_handed_out_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("repo:a/b");
    {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        write_batches(&store, &s, 4, 10);
        // The newest records are retired: the keyword index no longer names them.
        for seq in 35..40 {
            assert!(store
                .forget(&s, &format!("mem:repo:a/b:{seq}"))
                .expect("forget"));
        }
        store.flush().expect("flush");
        store.close_as_crash();
    }
    cut_journal(dir.path(), |len| len / 2);

    let store = EmbeddedStore::open(dir.path()).expect("opens for reading");
    let kept = all_records(&store).len();
    assert!(kept <= 30, "the cut took the forgotten records too: {kept}");
    let health = store.check().expect("doctor");
    assert!(health.damage.is_some(), "{health:?}");
    assert!(
        health.lost.contains(&"mem:repo:a/b:39".to_owned()),
        "a forgotten record's id is among the lost: {health:?}"
    );
    drop(store);

    let to = dir.path().join("salvaged");
    let report = lessons::store::salvage(dir.path(), &to).expect("salvage");
    assert_eq!(report.lost.len(), 40 - kept, "{report:?}");
    let salvaged = EmbeddedStore::open(&to).expect("open the salvaged store");
    assert_eq!(next_id(&salvaged, &s), "mem:repo:a/b:40");
    drop(salvaged);

    let store = EmbeddedStore::open(dir.path()).expect("reopen");
    assert!(store.repair().expect("repair accepts the loss").is_ok());
    assert_eq!(next_id(&store, &s), "mem:repo:a/b:40");
}

#[test]
fn cutting_the_last_batch_after_a_crash_is_caught_by_the_index() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("repo:a/b");
    {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        write_batches(&store, &s, 4, 10);
        store.flush().expect("flush");
        store.close_as_crash();
    }
    cut_journal(dir.path(), |len| len - 2_000);
    let store = EmbeddedStore::open(dir.path()).expect("opens for reading");
    let health = store.check().expect("doctor");
    assert!(health.damage.is_some(), "{health:?}");
    assert!(!health.lost.is_empty(), "{health:?}");
    assert!(store
        .write(&s, &[fact("after the cut")], &WriteOptions::default())
        .is_err());
}

/// The journal's length on disk, zeros fjall preallocates included.
fn journal_len(dir: &Path) -> u64 {
    std::fs::metadata(journal_of(dir)).expect("journal").len()
}

#[test]
fn a_clean_close_empties_the_journal_and_later_writes_still_sort_over_the_tables() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("repo:a/b");
    {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        write_facts(&store, &s, 0, 30);
        store.close().expect("close");
    }
    assert_eq!(
        journal_len(dir.path()),
        0,
        "a clean close leaves nothing to replay"
    );
    // Later writes must take sequence numbers above every item in the tables: one below would
    // hide new records from reads, and let a forget or a restatement sort under what it
    // replaces. A crash leaves them only in the journal, so the next open replays them.
    let forgotten = "mem:repo:a/b:3";
    {
        let store = EmbeddedStore::open(dir.path()).expect("reopen");
        assert_eq!(all_records(&store).len(), 30);
        assert!(store.forget(&s, forgotten).expect("forget"));
        let again = store
            .write(
                &s,
                &[fact(
                    "lesson 7: run the schema check before the migration 7",
                )],
                &WriteOptions::default(),
            )
            .expect("restate");
        assert_eq!((again.inserted, again.deduped), (0, 1), "{again:?}");
        assert_eq!(
            store
                .retrieve(&s, "schema check migration 9", 3)
                .expect("retrieve")
                .len(),
            3
        );
        write_facts(&store, &s, 30, 5);
        store.close_as_crash();
    }
    assert!(
        journal_len(dir.path()) > 0,
        "a crash leaves the journal to replay"
    );
    for generation in 0..2 {
        let store = EmbeddedStore::open(dir.path()).expect("open after the crash");
        let records = all_records(&store);
        let active: Vec<&Record> = records
            .iter()
            .filter(|r| r.status == lessons::Status::Active)
            .collect();
        assert_eq!(active.len(), 34 + generation, "generation {generation}");
        assert!(
            active.iter().all(|r| r.id != forgotten),
            "generation {generation}"
        );
        let restated = store.get("mem:repo:a/b:7").expect("get").expect("kept");
        assert!(restated.use_count >= 1, "{restated:?}");
        assert!(active.iter().filter(|r| r.use_count > 0).count() >= 3);
        assert!(
            store.check().expect("doctor").is_ok(),
            "generation {generation}"
        );
        assert_eq!(
            next_id(&store, &s),
            format!("mem:repo:a/b:{}", 35 + generation)
        );
        store.close().expect("close");
        assert_eq!(journal_len(dir.path()), 0);
    }
}

#[test]
fn a_clean_close_leaves_the_records_in_tables_so_a_deleted_journal_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("repo:a/b");
    {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        write_batches(&store, &s, 20, 20);
        store.close().expect("close");
    }
    std::fs::remove_file(journal_of(dir.path())).expect("delete the journal");
    assert!(
        EmbeddedStore::open(dir.path()).is_err(),
        "still refused in place"
    );
    let to = dir.path().join("salvaged");
    let report = lessons::store::salvage(dir.path(), &to).expect("salvage");
    assert_eq!(report.copied, 400, "{report:?}");
    assert!(report.lost.is_empty(), "{report:?}");
    assert!(
        report.decisions >= 400,
        "the decision journal comes along: {report:?}"
    );
    let salvaged = EmbeddedStore::open(&to).expect("open");
    assert_eq!(next_id(&salvaged, &s), "mem:repo:a/b:400");
}

#[test]
fn salvage_counts_a_damaged_batch_and_reserves_the_ids_it_held() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("repo:a/b");
    {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        write_batches(&store, &s, 20, 20);
        store.flush().expect("flush");
        store.close_as_crash();
    }
    let journal = journal_of(dir.path());
    let mut bytes = std::fs::read(&journal).expect("journal");
    // Inside the text of a record of the last batches, about 2,000 bytes before the end.
    let end = bytes
        .windows(11)
        .rposition(|w| w == b"lesson 19-0")
        .expect("the last batch is in the journal");
    let at = bytes[..end]
        .windows(7)
        .rposition(|w| w == b"lesson ")
        .expect("an earlier record");
    bytes[at + 3] ^= 0x20;
    std::fs::write(&journal, &bytes).expect("flip");

    let to = dir.path().join("salvaged");
    let report = lessons::store::salvage(dir.path(), &to).expect("salvage");
    assert_eq!(report.damaged_batches, 1, "{report:?}");
    assert_eq!(report.copied + report.lost.len() as u64, 400, "{report:?}");
    assert_eq!(report.lost.len(), 20, "one batch of 20 records: {report:?}");
    assert!(report.unreadable >= 20, "{report:?}");
    assert!(report.decisions > 0, "{report:?}");
    let salvaged = EmbeddedStore::open(&to).expect("open");
    assert_eq!(next_id(&salvaged, &s), "mem:repo:a/b:400");
}

#[test]
fn damage_to_the_decision_journal_is_found_by_doctor_and_refuses_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("repo:a/b");
    {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        let options = WriteOptions {
            rejected: vec![lessons::decisions::RejectedFact {
                text: "journal-only marker: PR 12 was merged".into(),
                markers: vec!["reference".into()],
            }],
            ..WriteOptions::default()
        };
        store
            .write(&s, &[fact("a lesson beside the rejected fact")], &options)
            .expect("write");
        store.close().expect("close");
    }
    let mut flipped = 0;
    for ks in std::fs::read_dir(dir.path().join("records/keyspaces")).expect("keyspaces") {
        let Ok(tables) = std::fs::read_dir(ks.expect("entry").path().join("tables")) else {
            continue;
        };
        for t in tables {
            let p = t.expect("entry").path();
            let mut bytes = std::fs::read(&p).expect("table");
            if let Some(at) = bytes.windows(20).position(|w| w == b"journal-only marker:") {
                bytes[at] ^= 0x01;
                std::fs::write(&p, &bytes).expect("flip");
                flipped += 1;
            }
        }
    }
    assert_eq!(flipped, 1, "the decision journal was flushed to one table");
    let store = EmbeddedStore::open(dir.path()).expect("the records still open");
    let health = store.check().expect("doctor runs");
    assert!(!health.is_ok(), "{health:?}");
    assert!(
        health
            .unreadable
            .iter()
            .any(|u| u.contains("decision journal")),
        "{health:?}"
    );
    let err = store
        .write(&s, &[fact("another lesson")], &WriteOptions::default())
        .expect_err("a damaged store refuses writes");
    assert_eq!(err.kind(), ErrorKind::Damaged);
    drop(store);
    let store = EmbeddedStore::open(dir.path()).expect("reopen");
    assert!(
        store
            .write(&s, &[fact("another lesson")], &WriteOptions::default())
            .is_err(),
        "a later process refuses writes too"
    );
    drop(store);
    let to = dir.path().join("salvaged");
    let report = lessons::store::salvage(dir.path(), &to).expect("salvage");
    assert_eq!(report.copied, 1, "{report:?}");
}

#[test]
fn open_and_close_leave_no_temporary_files_in_the_index() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = scope("repo:a/b");
    for i in 0..60 {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        store
            .write(
                &s,
                &[fact(&format!("lesson {i}: keep the cache warm"))],
                &WriteOptions::default(),
            )
            .expect("write");
        store.close().expect("close");
    }
    let orphans: Vec<String> = std::fs::read_dir(dir.path().join("index"))
        .expect("index")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp"))
        .collect();
    assert!(orphans.is_empty(), "{orphans:?}");
}

/// Copies `from` into `to`, recursively.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create");
    for e in std::fs::read_dir(from).expect("read") {
        let e = e.expect("entry");
        let dest = to.join(e.file_name());
        if e.path().is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).expect("copy");
        }
    }
}

/// A store written by an earlier build (`tests/data/<name>`), copied where it may be changed.
fn fixture_store(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    copy_tree(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(name),
        dir.path(),
    );
    dir
}

/// The format version a closed store's records say, read with fjall itself.
fn stored_format(dir: &Path) -> Option<Vec<u8>> {
    let meta = raw(dir)
        .keyspace("meta", fjall::KeyspaceCreateOptions::default)
        .expect("meta");
    meta.get("format").expect("read").map(|v| v.to_vec())
}

/// How many usage entries a closed store holds, read with fjall itself.
fn usage_entries(dir: &Path) -> usize {
    raw(dir)
        .keyspace("usage", fjall::KeyspaceCreateOptions::default)
        .expect("usage")
        .len()
        .expect("count")
}

#[test]
fn a_format_1_store_opens_and_is_upgraded_in_place() {
    // Written by the build before dedup keys became one per normalized text (format 1): two
    // scopes, a dedup, two supersedes, a sweep, a retrieve, and two active records with the
    // same text in org:acme.
    let dir = fixture_store("store-format-1");
    let before: Vec<Record> = {
        let store = EmbeddedStore::open(dir.path()).expect("a format 1 store opens");
        let health = store.check().expect("doctor");
        assert!(health.is_ok(), "{health:?}");
        let records = all_records(&store);
        assert_eq!(records.len(), 8);
        // Dedup goes through the new keys: the same lesson in other case and spacing.
        let app = scope("repo:acme/app");
        let counts = store
            .write(
                &app,
                &[fact("RUN npm ci   before the license check")],
                &WriteOptions::default(),
            )
            .expect("write");
        assert_eq!(counts.deduped, 1, "{counts:?}");
        let org = scope("org:acme");
        let counts = store
            .write(
                &org,
                &[fact("the cache key includes the lockfile hash")],
                &WriteOptions::default(),
            )
            .expect("write");
        assert_eq!(
            counts.deduped, 1,
            "two records share the text: the lower one is bumped"
        );
        store.close().expect("close");
        records
    };
    let store = EmbeddedStore::open(dir.path()).expect("reopens as the current format");
    assert!(store.check().expect("doctor").is_ok());
    let after = all_records(&store);
    for r in &before {
        let now = after
            .iter()
            .find(|a| a.id == r.id)
            .expect("every record is kept");
        assert_eq!((&now.text, &now.status), (&r.text, &r.status));
    }
    let org = scope("org:acme");
    let bumped = after
        .iter()
        .find(|r| r.id == org.record_id(1))
        .expect("mem:org:acme:1");
    assert_eq!(bumped.use_count, 2);
    drop(store);
    assert_eq!(
        stored_format(dir.path()),
        Some(vec![5]),
        "the store says the current format"
    );
}

#[test]
fn a_format_3_store_opens_and_its_journal_is_keyed_by_class() {
    // Written by the build before journal keys held their event (format 3): three facts, a
    // restatement's dedup and an eviction at cap 3, a sweep, and a forget in another scope.
    let dir = fixture_store("store-format-3");
    let (app, org) = (scope("repo:acme/app"), scope("org:acme"));
    let all = lessons::DecisionQuery {
        limit: 100,
        ..lessons::DecisionQuery::default()
    };
    let of = |event| lessons::DecisionQuery {
        events: vec![event],
        ..all.clone()
    };
    {
        let store = open_fixture(dir.path()).expect("a format 3 store opens");
        assert!(store.check().expect("doctor").is_ok());
        let events: Vec<lessons::DecisionEvent> = store
            .decisions(&app, &all)
            .expect("journal")
            .iter()
            .map(|d| d.event)
            .collect();
        use lessons::DecisionEvent as E;
        assert_eq!(
            events,
            [
                E::Swept,
                E::Evicted,
                E::Inserted,
                E::Deduped,
                E::Inserted,
                E::Inserted,
                E::Inserted
            ],
            "every entry kept, newest first"
        );
        let swept = store.decisions(&app, &of(E::Swept)).expect("journal");
        assert_eq!(swept.len(), 1);
        assert_eq!(swept[0].texts, ["PR 12 was merged"]);
        assert_eq!(swept[0].markers, ["reference", "delivery"]);
        let inserted = store.decisions(&app, &of(E::Inserted)).expect("journal");
        assert_eq!(inserted.len(), 4);
        assert_eq!(
            inserted[0].texts,
            ["the e2e suite needs PLAYWRIGHT_BROWSERS_PATH=0"]
        );
        let forgotten = store.decisions(&org, &of(E::Forgotten)).expect("journal");
        assert_eq!(forgotten.len(), 1);
        assert!(store
            .decisions(&org, &of(E::Swept))
            .expect("journal")
            .is_empty());
        store.close().expect("close");
    }
    assert_eq!(
        stored_format(dir.path()),
        Some(vec![5]),
        "the store says the current format"
    );
    // Reopened as the current format, the journal reads the same.
    let store = open_fixture(dir.path()).expect("reopens");
    assert_eq!(store.decisions(&app, &all).expect("journal").len(), 7);
    assert!(store.check().expect("doctor").is_ok());
}

/// A fixture store opened with a journal that keeps ten years: its entries are dated when the
/// fixture was written, and a 90-day journal would hide them once the fixture is that old.
fn open_fixture(dir: &Path) -> lessons::Result<EmbeddedStore> {
    EmbeddedStore::builder().journal(3650, 10_000).open(dir)
}

#[test]
fn a_format_4_store_opens_and_its_never_used_evictions_get_a_key_of_their_own() {
    // Written by the build whose journal kept every eviction under the event's byte (format
    // 4): five facts at cap 3, one of them retrieved, then a sixth at cap 2, so four
    // evictions (three never used, one used once), and a fact in org:acme.
    let dir = fixture_store("store-format-4");
    let (app, org) = (scope("repo:acme/app"), scope("org:acme"));
    let all = lessons::DecisionQuery {
        limit: 100,
        ..lessons::DecisionQuery::default()
    };
    let never_used = lessons::DecisionQuery {
        never_used: true,
        ..all.clone()
    };
    let ids = |v: &[lessons::Decision]| v.iter().map(|d| d.ids[0].clone()).collect::<Vec<_>>();
    let before = {
        let store = open_fixture(dir.path()).expect("a format 4 store opens");
        assert!(store.check().expect("doctor").is_ok());
        let every = store.decisions(&app, &all).expect("journal");
        assert_eq!(every.len(), 10, "six inserts and four evictions: {every:?}");
        let unused = store.decisions(&app, &never_used).expect("journal");
        assert_eq!(
            ids(&unused),
            [
                "mem:repo:acme/app:3",
                "mem:repo:acme/app:2",
                "mem:repo:acme/app:1"
            ],
            "the never-used evictions, newest first"
        );
        let evicted = lessons::DecisionQuery {
            events: vec![lessons::DecisionEvent::Evicted],
            ..all.clone()
        };
        let evictions = store.decisions(&app, &evicted).expect("journal");
        assert_eq!(
            ids(&evictions),
            [
                "mem:repo:acme/app:3",
                "mem:repo:acme/app:0",
                "mem:repo:acme/app:2",
                "mem:repo:acme/app:1"
            ],
            "every eviction, both classes merged newest first"
        );
        assert_eq!(evictions[1].use_count, Some(1));
        assert_eq!(store.decisions(&org, &all).expect("journal").len(), 1);
        store.close().expect("close");
        every
    };
    assert_eq!(
        stored_format(dir.path()),
        Some(vec![5]),
        "the store says the current format"
    );
    let store = open_fixture(dir.path()).expect("reopens");
    assert_eq!(store.decisions(&app, &all).expect("journal"), before);
    assert_eq!(
        store.decisions(&app, &never_used).expect("journal").len(),
        3
    );
    assert!(store.check().expect("doctor").is_ok());
}

/// `(useCount, lastUsedAt)` of `id` in `records`.
fn use_of(records: &[Record], id: &str) -> (u64, Option<i64>) {
    let r = records
        .iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("{id} is kept"));
    (r.use_count, r.last_used_at)
}

#[test]
fn a_format_2_store_opens_and_its_use_is_recorded_apart_from_its_records() {
    // Written by the build that rewrote a record on every use (format 2): two scopes, four
    // retrieves, a dedup (repo:acme/app:0 used 3 times), a forget (org:acme:1).
    let dir = fixture_store("store-format-2");
    let app = scope("repo:acme/app");
    let (used_first, used_since) = {
        let store = EmbeddedStore::open(dir.path()).expect("a format 2 store opens");
        assert!(store.check().expect("doctor").is_ok());
        let records = all_records(&store);
        assert_eq!(records.len(), 6);
        let (count, at) = use_of(&records, "mem:repo:acme/app:0");
        assert_eq!(count, 3);
        assert_eq!(use_of(&records, "mem:repo:acme/app:3").0, 2);
        assert_eq!(use_of(&records, "mem:org:acme:0").0, 1);
        assert_eq!(use_of(&records, "mem:org:acme:1").0, 0);
        // A use now is a usage entry; every read path sees it.
        let hits = store
            .retrieve(&app, "license check npm ci", 8)
            .expect("retrieve");
        let hit = hits
            .iter()
            .find(|r| r.id == "mem:repo:acme/app:0")
            .expect("the lesson is found");
        assert_eq!(hit.use_count, 4);
        let got = store
            .get("mem:repo:acme/app:0")
            .expect("get")
            .expect("held");
        assert_eq!((got.use_count, got.last_used_at), (4, hit.last_used_at));
        let listed = store
            .list(&app, &lessons::ListQuery::window(24))
            .expect("list");
        assert_eq!(use_of(&listed, "mem:repo:acme/app:0").0, 4);
        assert!(store.check().expect("doctor").is_ok());
        store.close().expect("close");
        (at, hit.last_used_at)
    };
    assert!(used_since >= used_first);
    assert_eq!(
        stored_format(dir.path()),
        Some(vec![5]),
        "the store says the current format"
    );
    assert_eq!(
        usage_entries(dir.path()),
        2,
        "the retrieve wrote a usage entry for each record it answered, not the records"
    );
    let store = EmbeddedStore::open(dir.path()).expect("reopens");
    let records = all_records(&store);
    assert_eq!(
        use_of(&records, "mem:repo:acme/app:0"),
        (4, used_since),
        "the use survives a reopen"
    );
    assert_eq!(use_of(&records, "mem:repo:acme/app:3").0, 3);
    // A write of the record folds its use in (one more, for the dedup) and drops the entry;
    // a forget keeps the use in the retired copy.
    let counts = store
        .write(
            &app,
            &[fact("RUN npm ci before the LICENSE check")],
            &WriteOptions::default(),
        )
        .expect("write");
    assert_eq!(counts.deduped, 1, "{counts:?}");
    assert!(store.forget(&app, "mem:repo:acme/app:3").expect("forget"));
    let records = all_records(&store);
    assert_eq!(use_of(&records, "mem:repo:acme/app:0").0, 5);
    assert_eq!(use_of(&records, "mem:repo:acme/app:3").0, 3);
    assert!(store.check().expect("doctor").is_ok());
    store.close().expect("close");
    assert_eq!(
        usage_entries(dir.path()),
        0,
        "a record written or retired carries its use; no entry is left behind"
    );
}
