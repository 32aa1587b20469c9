//! Stores written by earlier builds (`tests/data/store-format-*`) open, and are upgraded in
//! place to the current format without losing a record, a use or a journal entry.

use std::path::Path;

use lessons::store::{EmbeddedStore, MemoryStore, WriteOptions};
use lessons::Record;

use super::{
    all_records, foreign_textless_entries, three_writes_at_cap_two, unmark_journal, use_of,
};
use crate::fixtures::store::StoreDir;
use crate::util::{exported_decisions, fact, scope};

#[test]
fn a_format_1_store_opens_and_is_upgraded_in_place() {
    // Written by the build before dedup keys became one per normalized text (format 1): two
    // scopes, a dedup, two supersedes, a sweep, a retrieve, and two active records with the
    // same text in org:acme.
    let dir = StoreDir::from_data("store-format-1");
    let before: Vec<Record> = dir.closed(|store| {
        let health = store.check().expect("doctor");
        assert!(health.is_ok(), "{health:?}");
        let records = all_records(store);
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
        records
    });
    let store = dir.try_open().expect("reopens as the current format");
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
        stored_format(&dir),
        Some(vec![7]),
        "the store says the current format"
    );
}

#[test]
fn a_format_3_store_opens_and_its_journal_is_keyed_by_class() {
    // Written by the build before journal keys held their event (format 3): three facts, a
    // restatement's dedup and an eviction at cap 3, a sweep, and a forget in another scope.
    let dir = StoreDir::from_data("store-format-3");
    let (app, org) = (scope("repo:acme/app"), scope("org:acme"));
    let all = every_decision();
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
        stored_format(&dir),
        Some(vec![7]),
        "the store says the current format"
    );
    // Reopened as the current format, the journal reads the same.
    let store = open_fixture(dir.path()).expect("reopens");
    assert_eq!(store.decisions(&app, &all).expect("journal").len(), 7);
    assert!(store.check().expect("doctor").is_ok());
}

#[test]
fn a_format_3_store_with_a_damaged_entry_opens_for_doctor_and_stays_pending() {
    let dir = StoreDir::from_data("store-format-3");
    let app = scope("repo:acme/app");
    {
        // Keyed as format 3 keyed every entry.
        let raw = dir.raw();
        damage_first_key(&raw, "decisions");
        raw.persist(fjall::PersistMode::SyncAll).expect("persist");
    }
    {
        let store = open_fixture(dir.path()).expect("the store opens for doctor");
        let health = store.check().expect("doctor");
        assert!(!health.is_ok(), "the damaged entry is reported: {health:?}");
        // Every entry that reads is re-keyed and read as the undamaged fixture's are.
        let events = store
            .decisions(&app, &every_decision())
            .expect("journal")
            .len();
        assert_eq!(events, 7);
        store.close().expect("close");
    }
    // Pending, so the next open tries again, and a format 3 build refuses the store.
    assert_eq!(stored_format(&dir), Some(vec![7, 3]));
}

/// A query for every decision of a fixture's scope.
fn every_decision() -> lessons::DecisionQuery {
    lessons::DecisionQuery {
        limit: 100,
        ..lessons::DecisionQuery::default()
    }
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
    let dir = StoreDir::from_data("store-format-4");
    let (app, org) = (scope("repo:acme/app"), scope("org:acme"));
    let all = every_decision();
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
        stored_format(&dir),
        Some(vec![7]),
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

#[test]
fn a_format_2_store_opens_and_its_use_is_recorded_apart_from_its_records() {
    // Written by the build that rewrote a record on every use (format 2): two scopes, four
    // retrieves, a dedup (repo:acme/app:0 used 3 times), a forget (org:acme:1).
    let dir = StoreDir::from_data("store-format-2");
    let app = scope("repo:acme/app");
    let (used_first, used_since) = dir.closed(|store| {
        assert!(store.check().expect("doctor").is_ok());
        let records = all_records(store);
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
        (at, hit.last_used_at)
    });
    assert!(used_since >= used_first);
    assert_eq!(
        stored_format(&dir),
        Some(vec![7]),
        "the store says the current format"
    );
    assert_eq!(
        usage_entries(&dir),
        2,
        "the retrieve wrote a usage entry for each record it answered, not the records"
    );
    let store = dir.try_open().expect("reopens");
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
        usage_entries(&dir),
        0,
        "a record written or retired carries its use; no entry is left behind"
    );
}

/// The format version a closed store's records say, read with fjall itself.
fn stored_format(dir: &StoreDir) -> Option<Vec<u8>> {
    let meta = dir
        .raw()
        .keyspace("meta", fjall::KeyspaceCreateOptions::default)
        .expect("meta");
    meta.get("format").expect("read").map(|v| v.to_vec())
}

/// How many usage entries a closed store holds, read with fjall itself.
fn usage_entries(dir: &StoreDir) -> usize {
    dir.raw()
        .keyspace("usage", fjall::KeyspaceCreateOptions::default)
        .expect("usage")
        .len()
        .expect("count")
}

#[test]
fn a_writes_insertions_and_evictions_are_stored_without_their_text_and_read_with_it() {
    let dir = StoreDir::new();
    let app = scope("repo:acme/app");
    let texts = [
        "the e2e suite needs PLAYWRIGHT_BROWSERS_PATH=0",
        "run npm ci before the license check",
        "the schema check reads migrations in order",
    ];
    let options = WriteOptions {
        cap: Some(2),
        ..WriteOptions::default()
    };
    let (read, mut exported) = dir.closed(|store| {
        for t in texts {
            store.write(&app, &[fact(t)], &options).expect("write");
        }
        let read = store.decisions(&app, &every_decision()).expect("journal");
        (read, exported_decisions(store))
    });
    use lessons::DecisionEvent as E;
    let told: Vec<(E, &str, &str)> = read
        .iter()
        .map(|d| (d.event, d.ids[0].as_str(), d.texts[0].as_str()))
        .collect();
    assert_eq!(
        told,
        [
            (E::Evicted, "mem:repo:acme/app:0", texts[0]),
            (E::Inserted, "mem:repo:acme/app:2", texts[2]),
            (E::Inserted, "mem:repo:acme/app:1", texts[1]),
            (E::Inserted, "mem:repo:acme/app:0", texts[0]),
        ],
        "each entry read with its record's text, newest first"
    );
    assert!(read.iter().all(|d| d.texts.len() == 1), "{read:?}");
    exported.reverse();
    assert_eq!(exported, read, "an export carries the texts too");
    // On disk, none of the four entries holds a text: each is its record's, and says so.
    let stored = {
        let mut stored = 0;
        for (_, value) in journal_values(&dir) {
            assert_eq!(value[0], 2, "marked as leaving its text to its record");
            for t in texts {
                assert!(
                    !value.windows(t.len()).any(|w| w == t.as_bytes()),
                    "an entry holds {t:?}"
                );
            }
            stored += 1;
        }
        stored
    };
    assert_eq!(stored, 4);
    assert_eq!(stored_format(&dir), Some(vec![7]));
}

/// Every stored decision-journal entry of a closed store, as (key, value), read with fjall.
fn journal_values(dir: &StoreDir) -> Vec<(Vec<u8>, Vec<u8>)> {
    let raw = dir.raw();
    let journal = raw
        .keyspace("decisions", fjall::KeyspaceCreateOptions::default)
        .expect("decisions");
    journal
        .iter()
        .map(|g| {
            let (k, v) = g.into_inner().expect("read");
            (k.to_vec(), v.to_vec())
        })
        .collect()
}

/// How a format 6 store is opened by this build.
#[derive(Clone, Copy, PartialEq)]
enum Format6 {
    /// As format 6's build left it.
    AsWritten,
    /// An upgrade cut short: one entry marked, the format pending (`[7, 6]`).
    CutShort,
    /// One journal value that does not decode (damage), in another scope's journal.
    Damaged,
}

/// A format 6 store: the three writes' entries unmarked (`three_writes_at_cap_two`), two
/// foreign entries imported without texts, and `how` applied; returns the write's journal and
/// the foreign entries.
fn format_6_store(
    dir: &StoreDir,
    how: Format6,
) -> (Vec<lessons::Decision>, Vec<lessons::Decision>) {
    let app = scope("repo:acme/app");
    // Imported into that store without texts, about another store's record 0: the same shape.
    let foreign = foreign_textless_entries(&app);
    let before = three_writes_at_cap_two(dir, &app);
    assert_eq!(before.len(), 4, "three insertions and one eviction");
    // As format 6 stored them: the same bytes under version byte 1.
    {
        let raw = dir.raw();
        assert_eq!(unmark_journal(&raw), 4, "the write's entries were marked");
        if how == Format6::CutShort {
            let journal = raw
                .keyspace("decisions", fjall::KeyspaceCreateOptions::default)
                .expect("decisions");
            let (k, v) = journal
                .first_key_value()
                .expect("an entry")
                .into_inner()
                .expect("read");
            let mut v = v.to_vec();
            v[0] = 2;
            journal.insert(k, v).expect("mark one");
            raw.persist(fjall::PersistMode::SyncAll).expect("persist");
        }
    }
    dir.closed(|store| {
        assert_eq!(store.import_decisions(&foreign).expect("import"), 2);
    });
    let raw = dir.raw();
    let meta = raw
        .keyspace("meta", fjall::KeyspaceCreateOptions::default)
        .expect("meta");
    let format: &[u8] = if how == Format6::CutShort {
        &[7, 6]
    } else {
        &[6]
    };
    meta.insert("format", format).expect("mark format 6");
    if how == Format6::Damaged {
        damage_first_key(&raw, "decisions");
    }
    raw.persist(fjall::PersistMode::SyncAll).expect("persist");
    (before, foreign)
}

/// Adds to a closed store's `keyspace` one value that does not decode (damage that fjall's
/// checksums cannot see: the bytes were written so), in another scope, keyed as the
/// keyspace's first key is (scope, NUL, then the rest as its format keyed it).
fn damage_first_key(raw: &fjall::Database, keyspace: &str) {
    let ks = raw
        .keyspace(keyspace, fjall::KeyspaceCreateOptions::default)
        .expect("keyspace");
    let key = ks.first_key_value().expect("a key").key().expect("read");
    let nul = key.iter().position(|&b| b == 0).expect("scope, NUL");
    let mut damaged = b"repo:acme/other".to_vec();
    damaged.extend_from_slice(&key[nul..]);
    ks.insert(damaged, [1u8, 0xff, 0xff, 0xff]).expect("damage");
}

#[test]
fn a_format_6_stores_unmarked_entries_are_marked_and_read_with_their_records_texts() {
    // Format 6 told an entry that left its text to its record by its shape alone.
    for how in [Format6::AsWritten, Format6::CutShort] {
        let dir = StoreDir::new();
        let app = scope("repo:acme/app");
        let (before, foreign) = format_6_store(&dir, how);
        let after = dir.closed(|store| {
            assert!(store.check().expect("doctor").is_ok());
            store.decisions(&app, &every_decision()).expect("journal")
        });
        let (mut theirs, ours): (Vec<_>, Vec<_>) =
            after.into_iter().partition(|d| d.source_run_id.is_some());
        assert_eq!(ours, before, "each entry reads with its record's text");
        theirs.reverse();
        assert_eq!(theirs, foreign, "an imported entry stays without a text");
        let mut marks: Vec<u8> = journal_values(&dir).iter().map(|(_, v)| v[0]).collect();
        marks.sort_unstable();
        assert_eq!(
            marks,
            [1, 1, 2, 2, 2, 2],
            "the write's entries marked again, no other"
        );
        assert_eq!(stored_format(&dir), Some(vec![7]));
    }
}

#[test]
fn a_format_6_store_with_a_damaged_entry_opens_for_doctor_and_stays_pending() {
    let dir = StoreDir::new();
    let app = scope("repo:acme/app");
    let (before, _) = format_6_store(&dir, Format6::Damaged);
    dir.closed(|store| {
        let health = store.check().expect("doctor");
        assert!(!health.is_ok(), "the damaged entry is reported: {health:?}");
        // What reads is marked and read with its text.
        let read = store.decisions(&app, &every_decision()).expect("journal");
        let ours: Vec<_> = read
            .into_iter()
            .filter(|d| d.source_run_id.is_none())
            .collect();
        assert_eq!(ours, before);
    });
    // Pending, so the next open tries again, and a format 6 build refuses the store.
    assert_eq!(stored_format(&dir), Some(vec![7, 6]));
    let marks = journal_values(&dir)
        .iter()
        .filter(|(_, v)| v[0] == 2)
        .count();
    assert_eq!(marks, 4, "the write's entries are marked");
}

#[test]
fn a_format_5_stores_journal_keeps_its_texts_and_the_store_is_marked_current() {
    // Format 5 stored every entry whole: an import stores entries so.
    let dir = StoreDir::new();
    let app = scope("repo:acme/app");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64;
    let mut inserted = lessons::Decision::new(now, &app, lessons::DecisionEvent::Inserted);
    inserted.ids.push(app.record_id(7));
    inserted
        .texts
        .push("a record this store never held".to_owned());
    dir.closed(|store| {
        assert_eq!(
            store.import_decisions(&[inserted.clone()]).expect("import"),
            1
        );
    });
    {
        let raw = dir.raw();
        let meta = raw
            .keyspace("meta", fjall::KeyspaceCreateOptions::default)
            .expect("meta");
        meta.insert("format", [5]).expect("mark format 5");
        raw.persist(fjall::PersistMode::SyncAll).expect("persist");
    }
    assert_eq!(stored_format(&dir), Some(vec![5]));
    let read = dir.closed(|store| {
        assert!(store.check().expect("doctor").is_ok());
        store.decisions(&app, &every_decision()).expect("journal")
    });
    assert_eq!(read, [inserted], "the entry reads as it was stored");
    assert_eq!(
        stored_format(&dir),
        Some(vec![7]),
        "marked with the current format"
    );
}

#[test]
fn an_export_of_a_long_journal_carries_each_entrys_text_from_its_record() {
    // Over 2,000 entries, most of them naming records retired since.
    let dir = StoreDir::new();
    let app = scope("repo:acme/app");
    let options = WriteOptions {
        cap: Some(50),
        ..WriteOptions::default()
    };
    let store = dir.open();
    for w in 0..300 {
        let facts: Vec<_> = (0..4)
            .map(|c| {
                fact(&format!(
                    "lesson {w}-{c}: the schema check reads migration {c} first"
                ))
            })
            .collect();
        store.write(&app, &facts, &options).expect("write");
    }
    let exported = exported_decisions(&store);
    assert_eq!(
        exported.len(),
        1_200 + 1_150,
        "every insertion and eviction"
    );
    assert!(
        exported.windows(2).all(|w| w[0].time <= w[1].time),
        "oldest first"
    );
    for d in &exported {
        let record = store
            .get(&d.ids[0])
            .expect("get")
            .expect("the record is kept");
        assert_eq!(d.texts, [record.text], "{d:?}");
    }
    let evicted = exported
        .iter()
        .filter(|d| d.event == lessons::DecisionEvent::Evicted)
        .count();
    assert_eq!(evicted, 1_150);
}

#[test]
fn a_format_1_store_with_a_record_that_does_not_decode_is_refused_with_what_to_do() {
    // Format 1 rebuilds its dedup keys, and (having no keyword index) the index, from every
    // active record: one that does not decode stops the open. It must say what to do.
    let dir = StoreDir::from_data("store-format-1");
    // fjall's own open wants the lock file, which the fixture was stored without.
    std::fs::write(dir.path().join("records/lock"), b"").expect("lock");
    {
        let raw = dir.raw();
        damage_first_key(&raw, "active");
        raw.persist(fjall::PersistMode::SyncAll).expect("persist");
    }
    let err = dir.refused();
    assert_eq!(err.kind(), lessons::ErrorKind::Damaged, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("a record does not decode"), "{msg}");
    assert!(msg.contains("doctor --salvage NEW_DIR"), "{msg}");
    let (to, report) = dir.salvage("salvaged");
    assert_eq!((report.copied, report.unreadable), (8, 1), "{report:?}");
    let salvaged = EmbeddedStore::open(&to).expect("the salvaged store opens");
    assert!(salvaged.check().expect("doctor").is_ok());
    assert_eq!(all_records(&salvaged).len(), 8);
}
