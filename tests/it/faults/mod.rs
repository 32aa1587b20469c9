//! Faults an operator meets: a deleted lock file, a garbled or missing journal, stale
//! bookkeeping, a damaged table. Each is reproduced on a real store directory, and each must be
//! refused or repaired without losing or overwriting a record.

mod cut;
mod formats;
mod journal;
mod journal_texts;
mod open;
mod salvage;

use lessons::store::{EmbeddedStore, MemoryStore, WriteOptions};
use lessons::{Candidate, Decision, DecisionEvent, DecisionQuery, Record, ScopeKey};

use crate::fixtures::store::StoreDir;
use crate::util::{exported, fact};

/// Three lessons written one by one into `s` at a cap of two, in the closed store at `dir`:
/// three insertions and the eviction of the first. Returns the journal, every event.
pub(super) fn three_writes_at_cap_two(dir: &StoreDir, s: &ScopeKey) -> Vec<Decision> {
    let options = WriteOptions {
        cap: Some(2),
        ..WriteOptions::default()
    };
    dir.closed(|store| {
        for t in [
            "run npm ci first",
            "the schema check reads migrations in order",
            "use pnpm",
        ] {
            store.write(s, &[fact(t)], &options).expect("write");
        }
        store
            .decisions(s, &DecisionQuery::default())
            .expect("journal")
    })
}

/// An insertion and an eviction of record 0 of `s`, a minute before the call, without texts:
/// as another store, whose record 0 of `s` was another lesson and whose text it had lost,
/// would export them. Neither may ever be read with this store's record 0's text (which,
/// written after the call, was created at another time).
pub(super) fn foreign_textless_entries(s: &ScopeKey) -> Vec<Decision> {
    let time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64
        - 60_000;
    let mut inserted = Decision::new(time, s, DecisionEvent::Inserted);
    inserted.ids.push(s.record_id(0));
    inserted.source_run_id = Some("another store's run".to_owned());
    let mut evicted = Decision::new(time + 1, s, DecisionEvent::Evicted);
    evicted.ids.push(s.record_id(0));
    evicted.source_run_id = Some("another store's run".to_owned());
    evicted.age_ms = Some(5);
    evicted.use_count = Some(0);
    vec![inserted, evicted]
}

/// Rewrites every journal entry of the closed store `raw` marked as leaving its text to its
/// record as format 6 stored it: under version byte 1, which that format wrote whether or not
/// an entry left its text. Returns how many it rewrote.
pub(super) fn unmark_journal(raw: &fjall::Database) -> usize {
    let journal = raw
        .keyspace("decisions", fjall::KeyspaceCreateOptions::default)
        .expect("decisions");
    let stored: Vec<_> = journal
        .iter()
        .map(|g| g.into_inner().expect("read"))
        .collect();
    let mut unmarked = 0;
    for (k, v) in stored {
        if v[0] != 2 {
            continue;
        }
        let mut value = v.to_vec();
        value[0] = 1;
        journal.insert(k, value).expect("unmark");
        unmarked += 1;
    }
    raw.persist(fjall::PersistMode::SyncAll).expect("persist");
    unmarked
}

/// Writes `n` facts to `s`, one write each (one journal batch each).
pub(super) fn write_facts(store: &EmbeddedStore, s: &ScopeKey, from: usize, n: usize) {
    for i in from..from + n {
        let text = format!("lesson {i}: run the schema check before the migration {i}");
        let counts = store
            .write(s, &[fact(&text)], &WriteOptions::default())
            .expect("write");
        assert_eq!(counts.inserted, 1);
    }
}

pub(super) fn all_records(store: &EmbeddedStore) -> Vec<Record> {
    exported(store)
}

/// Writes `writes` batches of `per` facts each (one journal batch per write).
pub(super) fn write_batches(store: &EmbeddedStore, s: &ScopeKey, writes: usize, per: usize) {
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

/// The id the next insert gets (each call writes a new text, so it never dedups).
pub(super) fn next_id(store: &EmbeddedStore, s: &ScopeKey) -> String {
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

/// The id the next insert gets in the store at `path` (a salvaged copy), opened for it.
pub(super) fn next_id_in(path: &std::path::Path, s: &ScopeKey) -> String {
    next_id(&EmbeddedStore::open(path).expect("the copy opens"), s)
}

/// `(useCount, lastUsedAt)` of `id` in `records`.
pub(super) fn use_of(records: &[Record], id: &str) -> (u64, Option<i64>) {
    let r = records
        .iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("{id} is kept"));
    (r.use_count, r.last_used_at)
}
