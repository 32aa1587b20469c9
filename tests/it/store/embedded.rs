//! What only the embedded store has: reopen, its lock, format versions, index repair, and the
//! accounting of its memory, background work and fsyncs.

use std::time::Duration;

use lessons::{Candidate, Durability, EmbeddedStore, InMemoryStore, MemoryStore, ScopeKey};

use super::{open, opts};
use crate::fixtures::store::StoreDir;
use crate::util::{scope, FakeClock, T0};

#[test]
fn embedded_records_and_index_survive_reopen() {
    let dir = StoreDir::new();
    let clock = FakeClock::new(T0);
    let org = scope("org:acme");
    {
        let store = open(&dir, &clock);
        store
            .write(
                &org,
                &[Candidate::fact(
                    "bazel remote cache needs the --noremote_upload_local_results flag",
                    "t",
                )],
                &opts(),
            )
            .expect("write");
        store.close().expect("close");
    }
    let store = open(&dir, &clock);
    assert_eq!(
        store
            .retrieve(&org, "bazel cache", 8)
            .expect("retrieve")
            .len(),
        1
    );
    assert!(store.check().expect("check").is_ok());
    let c = store
        .write(&org, &[Candidate::fact("second", "t")], &opts())
        .expect("write");
    assert_eq!(c.inserted, 1);
    assert!(
        store.get("mem:org:acme:1").expect("get").is_some(),
        "the sequence continues after reopen"
    );
}

#[test]
fn a_deleted_or_damaged_index_is_rebuilt_on_open() {
    let dir = StoreDir::new();
    let clock = FakeClock::new(T0);
    let org = scope("org:acme");
    {
        let store = open(&dir, &clock);
        let cs: Vec<Candidate> = (0..20)
            .map(|i| Candidate::fact(format!("lesson {i} about terraform state locks"), "t"))
            .collect();
        store.write(&org, &cs, &opts()).expect("write");
    }
    std::fs::remove_dir_all(dir.path().join("index")).expect("remove the index");
    {
        let store = open(&dir, &clock);
        assert_eq!(
            store
                .retrieve(&org, "terraform", 50)
                .expect("retrieve")
                .len(),
            20
        );
    }
    std::fs::write(dir.path().join("index/meta.json"), b"{not json").expect("damage the index");
    let store = open(&dir, &clock);
    assert_eq!(
        store
            .retrieve(&org, "terraform", 50)
            .expect("retrieve")
            .len(),
        20
    );
    let health = store.repair().expect("repair");
    assert!(health.is_ok(), "{health:?}");
    assert_eq!(health.active_records, 20);
}

#[test]
fn a_second_open_fails_at_once_naming_the_directory() {
    let dir = StoreDir::new();
    let _first = dir.open();
    let Err(e) = dir.try_open() else {
        panic!("a second open must fail");
    };
    assert!(e.is_locked(), "{e}");
    assert!(
        e.to_string().contains(&dir.path().display().to_string()),
        "{e}"
    );
    assert!(e.to_string().contains("--server URL"), "{e}");
}

#[test]
fn an_unknown_format_version_is_a_clear_error() {
    let dir = StoreDir::new();
    drop(dir.open());
    {
        let db = dir.raw();
        let meta = db
            .keyspace("meta", fjall::KeyspaceCreateOptions::default)
            .expect("meta");
        meta.insert("format", [9u8]).expect("write");
        db.persist(fjall::PersistMode::SyncAll).expect("persist");
    }
    let Err(e) = dir.try_open() else {
        panic!("version 9 must not open");
    };
    assert!(e.to_string().contains("format version"), "{e}");
}

/// Writes one fact to `key`, a lesson the gate lets through.
fn upkeep(store: &EmbeddedStore) -> lessons::store::Upkeep {
    store
        .upkeep()
        .expect("the embedded store reports its upkeep")
}

fn write_lint_fact(store: &EmbeddedStore, key: &ScopeKey) {
    store
        .write(
            key,
            &[Candidate::fact(
                "the lint step runs before the type check",
                "t",
            )],
            &opts(),
        )
        .expect("write");
}

#[test]
fn an_embedded_store_accounts_for_what_it_holds_within_its_bounds() {
    let dir = StoreDir::new();
    let store = dir.open_with(
        EmbeddedStore::builder()
            .durability(Durability::Buffered)
            .cache_bytes(8 << 20)
            .scope_cache(16, 4 << 20),
    );
    let before = store.memory().expect("the embedded store reports it");
    assert_eq!(before.block_cache_capacity, 8 << 20);
    assert_eq!(before.scope_map_budget, 4 << 20);
    assert_eq!(before.scope_map, 0, "nothing read yet");
    let key = scope("repo:acme/app");
    write_lint_fact(&store, &key);
    store.window(&key, 10).expect("window");
    let after = store.memory().expect("the embedded store reports it");
    assert!(after.memtables > before.memtables, "{after:?}");
    assert!(
        after.scope_map > 0 && after.scope_map <= after.scope_map_budget,
        "{after:?}"
    );
    assert!(after.block_cache <= after.block_cache_capacity, "{after:?}");
    assert!(after.index_writer_heap > 0);
    // The trait's view of the same store, as `/metrics` reads it.
    assert_eq!(
        MemoryStore::memory(&store).map(|m| m.scope_map_budget),
        Some(4 << 20)
    );
}

#[test]
fn an_embedded_store_reports_its_background_work_and_comes_to_rest() {
    let dir = StoreDir::new();
    // The indexer's rounds come every 50 ms here; the pruner runs after each.
    let store = dir.open_with(
        EmbeddedStore::builder()
            .durability(Durability::Buffered)
            .index_commit(1_000_000, Duration::from_millis(50)),
    );
    assert!(upkeep(&store).at_rest(), "{:?}", upkeep(&store));
    let key = scope("repo:acme/app");
    write_lint_fact(&store, &key);
    store.flush().expect("flush");
    assert_eq!(upkeep(&store).index_pending_changes, 0);
    // The write's journal entry has the pruner count the scope's journal, within a round.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !upkeep(&store).at_rest() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let rested = upkeep(&store);
    assert!(rested.at_rest(), "{rested:?}");
    assert_eq!(rested.journals_to_count, 0);
    assert_eq!(
        MemoryStore::upkeep(&store).map(|u| u.index_pending_changes),
        Some(0)
    );
    assert_eq!(MemoryStore::upkeep(&InMemoryStore::new()), None);
    // Buffered writes wait on no fsync; the index's commit made the journal durable first.
    assert!(rested.journal_syncs.count() >= 1, "{rested:?}");
}

#[test]
fn a_synced_store_counts_and_times_the_fsyncs_its_writes_waited_on() {
    let dir = StoreDir::new();
    let store = dir.open();
    let key = scope("repo:acme/app");
    let before = upkeep(&store).journal_syncs;
    for i in 0..3 {
        store
            .write(
                &key,
                &[Candidate::fact(
                    format!("the lint step {i} runs before the type check"),
                    "t",
                )],
                &opts(),
            )
            .expect("write");
    }
    let syncs = upkeep(&store).journal_syncs.since(&before);
    // One writer: each write waits on an fsync of its own (an index commit may add one).
    assert!(syncs.count() >= 3, "{syncs:?}");
    assert!(syncs.quantile(0.5) <= syncs.quantile(1.0));
    assert!(
        syncs.quantile(1.0) > Duration::ZERO,
        "the slowest bucket ends above zero"
    );
    let n = u32::try_from(syncs.count()).expect("a few");
    assert!(
        syncs.total() <= syncs.quantile(1.0) * n,
        "n fsyncs take at most n times the slowest's bound: {syncs:?}"
    );
    assert_eq!(
        syncs.since(&syncs).count(),
        0,
        "a reading less itself is empty"
    );
}
