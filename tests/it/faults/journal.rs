//! A journal garbled, flipped, deleted, or left empty by a clean close: refused untouched, or
//! salvaged, and never read as if it held nothing.

use lessons::store::{EmbeddedStore, MemoryStore, WriteOptions};
use lessons::{ErrorKind, Record};

use super::{all_records, next_id, next_id_in, write_batches, write_facts};
use crate::fixtures::store::StoreDir;
use crate::util::{fact, scope};

#[test]
fn a_garbled_journal_is_refused_untouched_and_salvaged() {
    let dir = StoreDir::new();
    let s = scope("repo:acme/app");
    // A crash, so the journal is the records' only copy (a clean close would have moved them
    // into tables).
    let before = dir.crashed(|store| {
        write_facts(store, &s, 0, 200);
        all_records(store)
    });
    let journal = dir.journal();
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

    let err = dir.try_open().err().expect("a damaged journal is refused");
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

    let (to, report) = dir.salvage("salvaged");
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
    let dir = StoreDir::new();
    let s = scope("repo:acme/app");
    // A crash: a clean close would have emptied the journal into tables.
    dir.crashed(|store| write_facts(store, &s, 0, 20));
    let journal = dir.journal();
    let mut bytes = std::fs::read(&journal).expect("read journal");
    let at = bytes
        .windows(9)
        .position(|w| w == b"lesson 7:")
        .expect("the text is in the journal");
    bytes[at] = b'L';
    std::fs::write(&journal, &bytes).expect("flip");
    let err = dir.refused();
    assert_eq!(err.kind(), ErrorKind::Damaged, "{err}");
    assert!(err.message().contains("checksum"), "{err}");
}

#[test]
fn a_deleted_journal_is_refused_instead_of_reading_as_empty() {
    let dir = StoreDir::new();
    let s = scope("repo:acme/app");
    dir.closed(|store| write_facts(store, &s, 0, 5));
    std::fs::remove_file(dir.journal()).expect("delete the journal");
    let err = dir.refused();
    assert_eq!(err.kind(), ErrorKind::Damaged, "{err}");
    assert!(err.message().contains("no journal"), "{err}");
}

#[test]
fn records_flushed_to_tables_survive_a_deleted_journal_through_salvage() {
    let dir = StoreDir::new();
    let s = scope("repo:acme/app");
    dir.closed(|store| write_facts(store, &s, 0, 30));
    dir.flush_tables(&[
        "active", "retired", "norms", "scopes", "counters", "outbox", "meta",
    ]);
    std::fs::remove_file(dir.journal()).expect("delete the journal");
    assert!(dir.try_open().is_err());
    let (_, report) = dir.salvage("salvaged");
    assert!(report.journal_missing);
    assert_eq!(report.copied, 30, "{report:?}");
}

#[test]
fn a_clean_close_empties_the_journal_and_later_writes_still_sort_over_the_tables() {
    let dir = StoreDir::new();
    let s = scope("repo:a/b");
    dir.closed(|store| write_facts(store, &s, 0, 30));
    assert_eq!(
        dir.journal_len(),
        0,
        "a clean close leaves nothing to replay"
    );
    // Later writes must take sequence numbers above every item in the tables: one below would
    // hide new records from reads, and let a forget or a restatement sort under what it
    // replaces. A crash leaves them only in the journal, so the next open replays them.
    let forgotten = "mem:repo:a/b:3";
    dir.crashed(|store| {
        assert_eq!(all_records(store).len(), 30);
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
        write_facts(store, &s, 30, 5);
    });
    assert!(
        dir.journal_len() > 0,
        "a crash leaves the journal to replay"
    );
    for generation in 0..2 {
        let store = dir.try_open().expect("open after the crash");
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
        assert_eq!(dir.journal_len(), 0);
    }
}

#[test]
fn a_clean_close_leaves_the_records_in_tables_so_a_deleted_journal_loses_nothing() {
    let dir = StoreDir::new();
    let s = scope("repo:a/b");
    dir.closed(|store| write_batches(store, &s, 20, 20));
    std::fs::remove_file(dir.journal()).expect("delete the journal");
    assert!(dir.try_open().is_err(), "still refused in place");
    let (to, report) = dir.salvage("salvaged");
    assert_eq!(report.copied, 400, "{report:?}");
    assert!(report.lost.is_empty(), "{report:?}");
    assert!(
        report.decisions >= 400,
        "the decision journal comes along: {report:?}"
    );
    assert_eq!(next_id_in(&to, &s), "mem:repo:a/b:400");
}

/// A fjall database opened as the store opens it (uncompressed journal, so values take their
/// size in it), written through one keyspace of 64 KiB values.
struct RawDb {
    path: std::path::PathBuf,
    /// The scratch directory holding the database, removed when the test ends.
    _dir: tempfile::TempDir,
}

impl RawDb {
    /// A database path in a fresh scratch directory (nothing created yet).
    fn scratch() -> RawDb {
        let dir = tempfile::tempdir().expect("a scratch dir");
        RawDb {
            path: dir.path().join("db"),
            _dir: dir,
        }
    }

    fn open(&self) -> (fjall::Database, fjall::Keyspace) {
        let db = fjall::Database::builder(&self.path)
            .journal_compression(fjall::CompressionType::None)
            .open()
            .expect("fjall opens");
        let ks = db
            .keyspace("bulk", fjall::KeyspaceCreateOptions::default)
            .expect("keyspace");
        (db, ks)
    }

    /// The journal files' ids, ascending.
    fn journals(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = std::fs::read_dir(&self.path)
            .expect("the database's directory")
            .filter_map(|e| {
                e.ok()?
                    .file_name()
                    .to_str()?
                    .strip_suffix(".jnl")?
                    .parse()
                    .ok()
            })
            .collect();
        ids.sort_unstable();
        ids
    }

    /// The bytes the file system allocated to the newest journal.
    fn newest_allocated(&self) -> u64 {
        let newest = self.journals().last().copied().expect("a journal");
        let meta = std::fs::metadata(self.path.join(format!("{newest}.jnl"))).expect("journal");
        std::os::unix::fs::MetadataExt::blocks(&meta) * 512
    }

    /// Asserts that the newest journal's blocks were written out before any batch: a batch
    /// appended to it allocates nothing and its fdatasync commits no file system metadata.
    fn assert_newest_written_out(&self, what: &str) {
        let allocated = self.newest_allocated();
        assert!(
            allocated >= WRITTEN_OUT,
            "{what}: {allocated} bytes allocated, journals {:?}",
            self.journals()
        );
    }

    /// Makes the journal durable, closes the database, opens it again and checks that it
    /// holds the values of `0..written`: what recovery replays.
    fn reopened_holds(&self, db: fjall::Database, ks: fjall::Keyspace, written: u32) {
        db.persist(fjall::PersistMode::SyncAll).expect("persist");
        drop(ks);
        drop(db);
        let (_db, ks) = self.open();
        for i in 0..written {
            let got = ks.get(i.to_be_bytes()).expect("get");
            assert_eq!(got.as_deref(), Some(&value(i)[..]), "key {i}");
        }
    }

    fn spare_left(&self) -> bool {
        self.path.join("next-journal.spare").exists()
    }

    /// Waits (at most 30 s) until a journal newer than `than` exists and no spare is being
    /// prepared: a rotation that a worker runs in the background.
    fn await_rotation_past(&self, than: u64) -> Vec<u64> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let now = self.journals();
            if now.last().is_some_and(|&id| id > than) && !self.spare_left() {
                return now;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no rotation past journal {than}: {now:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// Inserts the values of `keys`.
fn insert(ks: &fjall::Keyspace, keys: std::ops::Range<u32>) {
    for i in keys {
        ks.insert(i.to_be_bytes(), value(i)).expect("insert");
    }
}

fn value(i: u32) -> Vec<u8> {
    let mut v = vec![b'v'; 64 * 1024];
    v[..4].copy_from_slice(&i.to_be_bytes());
    v
}

const WRITTEN_OUT: u64 = 64 * 1024 * 1024;

/// fjall rotates its journal past 64 MB at a flush, onto a spare it prepared before taking the
/// journal's lock (the patched engine, see vendor/README.md). The batches written to the new
/// journal are replayed from it at the next open, every name is one recovery knows, and the
/// new journal's blocks were written before any batch went into them.
#[test]
fn a_journal_rotated_onto_its_spare_is_replayed() {
    let raw = RawDb::scratch();
    let (db, ks) = raw.open();
    let first = raw.journals();
    // 64 KiB values: some 70 MB of journal, then a flush, which rotates it.
    insert(&ks, 0..1_100u32);
    ks.rotate_memtable_and_wait().expect("flush");
    let rotated = raw.journals();
    assert!(
        rotated.last() > first.last(),
        "the journal rotated: {first:?} then {rotated:?}"
    );
    assert!(!raw.spare_left(), "the spare became the journal");
    // The spare's zeros were written out, not left as a hole, so a batch appended to it
    // allocates nothing and its fdatasync commits no file system metadata.
    raw.assert_newest_written_out("the new journal's 64 MiB are allocated before any batch");
    // Only in the new journal: a flush would put them in a table.
    insert(&ks, 1_100..1_200u32);
    raw.reopened_holds(db, ks, 1_200);
    assert_eq!(
        raw.journals().last(),
        rotated.last(),
        "no journal lost or added"
    );
}

/// The first journal of a database is sized as a hole, and a journal reopened after a restart
/// is appended to: either way each batch allocates blocks, and its fdatasync must make them
/// durable too. Past its first MiB such a journal is rotated onto a spare written out as zeros,
/// without waiting for a flush; a database that holds less never writes a spare. Every batch,
/// in every journal, is replayed.
#[test]
fn a_journal_not_written_out_is_rotated_onto_a_spare_after_its_first_mebibyte() {
    let raw = RawDb::scratch();
    let (db, ks) = raw.open();
    let first = raw.journals();
    assert_eq!(first.len(), 1, "a new database has one journal: {first:?}");
    // Half a MiB: below the mark, nothing rotates and no spare is written.
    insert(&ks, 0..8u32);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(raw.journals(), first, "no rotation below the mark");
    assert!(!raw.spare_left(), "no spare below the mark");
    // Past the first MiB: rotated onto a spare by a worker, with no memtable flushed.
    insert(&ks, 8..40u32);
    let rotated = raw.await_rotation_past(first[0]);
    raw.assert_newest_written_out("the journal rotated onto is written out");
    assert_eq!(ks.table_count(), 0, "no flush was needed");
    // Written out, the new journal is not rotated early again.
    insert(&ks, 40..80u32);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(raw.journals().last(), rotated.last(), "one early rotation");
    drop(ks);
    drop(db);

    // Reopened, the last journal is appended to, and past a MiB it is rotated again.
    let (db, ks) = raw.open();
    let reopened = raw.journals();
    insert(&ks, 80..120u32);
    raw.await_rotation_past(*reopened.last().expect("a journal"));
    raw.assert_newest_written_out("after a restart too");
    insert(&ks, 120..130u32);
    raw.reopened_holds(db, ks, 130);
}
