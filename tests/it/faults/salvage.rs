//! Damaged tables and batches: a plain error, and a salvage that reads around the damage,
//! counts what it lost and keeps each record's use.

use std::path::Path;

use lessons::store::{EmbeddedStore, ListQuery, MemoryStore, WriteOptions};
use lessons::{ErrorKind, ScopeKey};

use super::{
    all_records, foreign_textless_entries, next_id_in, unmark_journal, use_of, write_batches,
    write_facts,
};
use crate::fixtures::store::StoreDir;
use crate::util::{fact, scope};

#[test]
fn salvage_keeps_each_records_use_from_the_journal_and_from_the_tables() {
    let dir = StoreDir::new();
    let s = scope("repo:acme/app");
    let before = dir.closed(|store| {
        write_facts(store, &s, 0, 12);
        for q in [
            "schema check",
            "migration 3",
            "schema migration 7",
            "check 3",
        ] {
            assert!(!store.retrieve(&s, q, 4).expect("retrieve").is_empty());
        }
        let records = all_records(store);
        assert!(
            records.iter().any(|r| r.use_count >= 2),
            "some lesson used twice"
        );
        records
    });
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
    let (to, report) = dir.salvage("salvaged");
    assert_eq!(report.copied, 12, "{report:?}");
    same_use(&to);
    // Read from the tables alone: everything flushed, the journal gone.
    dir.flush_tables(&["active", "retired", "norms", "scopes", "usage", "meta"]);
    std::fs::remove_file(dir.journal()).expect("delete the journal");
    let (to, report) = dir.salvage("salvaged-from-tables");
    assert!(report.journal_missing);
    same_use(&to);
}

#[test]
fn a_damaged_table_gives_a_plain_error_and_salvage_reads_around_it() {
    let dir = StoreDir::new();
    let s = scope("repo:acme/app");
    // A crash leaves the records in the journal (a clean close would have emptied it into
    // tables); fjall then flushes them into tables too, as a running store does.
    dir.crashed(|store| write_facts(store, &s, 0, 40));
    dir.flush_tables(&["active"]);
    // Garble the end of every table of the records keyspace: its footer no longer reads.
    let mut garbled = 0;
    for p in dir.tables() {
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
    assert!(garbled > 0, "the records were flushed to a table");
    let err = dir.refused();
    let msg = err.to_string();
    assert!(
        !msg.contains("Storage(") && !msg.contains('{'),
        "debug form: {msg}"
    );
    assert!(msg.contains("doctor --salvage"), "{msg}");
    let (_, report) = dir.salvage("salvaged");
    assert!(report.tables_error.is_some());
    assert_eq!(
        report.copied, 40,
        "every record is still in the journal: {report:?}"
    );
}

#[test]
fn one_bad_block_in_a_table_costs_salvage_only_that_block() {
    let dir = StoreDir::new();
    let scopes: Vec<ScopeKey> = (0..30)
        .map(|i| scope(&format!("repo:acme/app{i}")))
        .collect();
    // A clean close leaves every record in tables.
    dir.closed(|store| {
        for s in &scopes {
            write_batches(store, s, 1, 20);
        }
    });
    // Only the tables hold the records now, as in a store whose journal has long rotated.
    for e in std::fs::read_dir(dir.path().join("records")).expect("records") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "jnl") {
            std::fs::remove_file(&p).expect("remove the journal");
        }
    }
    // One byte flipped in the middle of the records' largest table: one data block is bad.
    let mut largest: Option<(usize, std::path::PathBuf)> = None;
    for p in dir.tables() {
        let bytes = std::fs::read(&p).expect("table");
        if bytes.windows(8).any(|w| w == b"lesson 0")
            && largest.as_ref().is_none_or(|(n, _)| bytes.len() > *n)
        {
            largest = Some((bytes.len(), p));
        }
    }
    let (len, table) = largest.expect("the records were flushed to a table");
    let mut bytes = std::fs::read(&table).expect("table");
    bytes[len / 3] ^= 0x5a;
    std::fs::write(&table, &bytes).expect("flip");

    let (to, report) = dir.salvage("salvaged");
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
fn salvage_counts_a_damaged_batch_and_reserves_the_ids_it_held() {
    let dir = StoreDir::new();
    let s = scope("repo:a/b");
    dir.crashed(|store| {
        write_batches(store, &s, 20, 20);
        store.flush().expect("flush");
    });
    let journal = dir.journal();
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

    let (to, report) = dir.salvage("salvaged");
    assert_eq!(report.damaged_batches, 1, "{report:?}");
    assert_eq!(report.copied + report.lost.len() as u64, 400, "{report:?}");
    assert_eq!(report.lost.len(), 20, "one batch of 20 records: {report:?}");
    assert!(report.unreadable >= 20, "{report:?}");
    assert!(report.decisions > 0, "{report:?}");
    assert_eq!(next_id_in(&to, &s), "mem:repo:a/b:400");
}

#[test]
fn damage_to_the_decision_journal_is_found_by_doctor_and_refuses_writes() {
    let dir = StoreDir::new();
    let s = scope("repo:a/b");
    dir.closed(|store| {
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
    });
    let mut flipped = 0;
    for p in dir.tables() {
        let mut bytes = std::fs::read(&p).expect("table");
        if let Some(at) = bytes.windows(20).position(|w| w == b"journal-only marker:") {
            bytes[at] ^= 0x01;
            std::fs::write(&p, &bytes).expect("flip");
            flipped += 1;
        }
    }
    assert_eq!(flipped, 1, "the decision journal was flushed to one table");
    let store = dir.try_open().expect("the records still open");
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
    let store = dir.try_open().expect("reopen");
    assert!(
        store
            .write(&s, &[fact("another lesson")], &WriteOptions::default())
            .is_err(),
        "a later process refuses writes too"
    );
    drop(store);
    let (_, report) = dir.salvage("salvaged");
    assert_eq!(report.copied, 1, "{report:?}");
}

#[test]
fn a_record_that_does_not_decode_fails_its_scopes_reads_with_what_to_do_and_no_other() {
    let dir = StoreDir::new();
    let (app, web) = (scope("repo:acme/app"), scope("repo:acme/web"));
    dir.closed(|store| {
        write_facts(store, &app, 0, 3);
        write_facts(store, &web, 0, 3);
    });
    {
        // The newest record of app rewritten with bytes that do not decode.
        let raw = dir.raw();
        let active = raw
            .keyspace("active", fjall::KeyspaceCreateOptions::default)
            .expect("active");
        let key = active
            .prefix(b"repo:acme/app\0")
            .next_back()
            .expect("a record of app")
            .key()
            .expect("read");
        active.insert(key, [2u8, 0xff, 0xff]).expect("damage");
        raw.persist(fjall::PersistMode::SyncAll).expect("persist");
    }
    let store = dir
        .try_open()
        .expect("the store opens: its bookkeeping and index agree");
    let err = store
        .list(&app, &ListQuery::window(10))
        .expect_err("app's window holds the damaged record");
    assert_eq!(err.kind(), ErrorKind::Damaged, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("a record does not decode") && msg.contains("doctor --salvage NEW_DIR"),
        "{msg}"
    );
    assert_eq!(
        store
            .list(&web, &ListQuery::window(10))
            .expect("web reads")
            .len(),
        3
    );
    // doctor lists the cause and gives the advice once.
    let health = store.check().expect("doctor runs");
    let found = health.unreadable.join("; ");
    assert!(
        found.contains(
            "records (active): 1 value(s), first: mem:repo:acme/app:0: a record does not decode"
        ),
        "the damaged record is named: {health:?}"
    );
    assert!(!found.contains("salvage"), "{found}");
    let damage = health.damage.expect("recorded");
    assert_eq!(damage.matches("doctor --salvage").count(), 1, "{damage}");
    drop(store);
    let (_, report) = dir.salvage("salvaged");
    assert_eq!((report.copied, report.unreadable), (5, 1), "{report:?}");
}

#[test]
fn a_salvaged_journal_keeps_the_texts_its_entries_left_to_their_records() {
    salvaged_journal_keeps_its_texts(false);
}

#[test]
fn a_salvaged_format_6_journal_keeps_the_texts_its_unmarked_entries_left_to_their_records() {
    // Format 6 did not mark such an entry: salvage, which reads any format, tells it by shape.
    salvaged_journal_keeps_its_texts(true);
}

fn salvaged_journal_keeps_its_texts(as_format_6: bool) {
    let dir = StoreDir::new();
    let s = scope("repo:acme/app");
    let options = WriteOptions {
        cap: Some(3),
        ..WriteOptions::default()
    };
    let all = lessons::DecisionQuery {
        limit: 100,
        ..lessons::DecisionQuery::default()
    };
    // Two entries imported without texts, about another store's record 0: never given this
    // store's record 0's text, marked or not.
    let foreign = foreign_textless_entries(&s);
    let before = dir.closed(|store| {
        for i in 0..5 {
            let text = format!("lesson {i}: the schema check reads migration {i} first");
            store.write(&s, &[fact(&text)], &options).expect("write");
        }
        assert_eq!(store.import_decisions(&foreign).expect("import"), 2);
        store.decisions(&s, &all).expect("journal")
    });
    assert_eq!(
        before.len(),
        9,
        "five insertions, two evictions, two imported: {before:?}"
    );
    assert!(
        before
            .iter()
            .all(|d| d.texts.len() == usize::from(d.source_run_id.is_none())),
        "{before:?}"
    );
    if as_format_6 {
        let raw = dir.raw();
        assert_eq!(unmark_journal(&raw), 7, "the write's entries were marked");
        let meta = raw
            .keyspace("meta", fjall::KeyspaceCreateOptions::default)
            .expect("meta");
        meta.insert("format", [6]).expect("mark format 6");
        raw.persist(fjall::PersistMode::SyncAll).expect("persist");
    }
    let (to, report) = dir.salvage("salvaged");
    assert_eq!(report.decisions, 9, "{report:?}");
    let store = EmbeddedStore::open(&to).expect("the salvaged store opens");
    let after = store.decisions(&s, &all).expect("journal");
    // Sorted: entries of the same millisecond are numbered again by the import that carries
    // them into the new store.
    let texts = |v: &[lessons::Decision]| {
        let mut told: Vec<_> = v
            .iter()
            .map(|d| (d.event, d.ids.clone(), d.texts.clone()))
            .collect();
        told.sort();
        told
    };
    assert_eq!(texts(&after), texts(&before));
}

#[test]
fn a_salvaged_current_store_never_gives_an_imported_entry_its_records_text() {
    let dir = StoreDir::new();
    let s = scope("repo:acme/app");
    let imported = dir.closed(|store| {
        store
            .write(
                &s,
                &[fact("run npm ci before the license check")],
                &WriteOptions::default(),
            )
            .expect("write");
        let r = store
            .list(&s, &lessons::ListQuery::newest(1))
            .expect("list")
            .remove(0);
        // About another store's record of the same id, created in the same millisecond: it
        // matches this record as a format 6 entry would, and only the store's format tells.
        let mut d = lessons::Decision::new(r.created_at, &s, lessons::DecisionEvent::Inserted);
        d.ids.push(r.id);
        d.source_run_id = Some("another store's run".to_owned());
        assert_eq!(store.import_decisions(&[d.clone()]).expect("import"), 1);
        d
    });
    let (to, report) = dir.salvage("salvaged");
    assert_eq!(report.decisions, 2, "{report:?}");
    let store = EmbeddedStore::open(&to).expect("the salvaged store opens");
    let read = store
        .decisions(&s, &lessons::DecisionQuery::default())
        .expect("journal");
    let theirs: Vec<_> = read
        .into_iter()
        .filter(|d| d.source_run_id.is_some())
        .collect();
    assert_eq!(theirs, [imported], "stays without a text");
}
