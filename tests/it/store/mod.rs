//! The store contract, run against every implementation, plus what only the embedded store has
//! (reopen, locking, format versions, index repair).

mod embedded;
mod retire;
mod retrieve;
mod scopes;
mod window;
mod write;

use std::sync::Arc;
use std::time::Duration;

use lessons::{Durability, EmbeddedStore, InMemoryStore, MemoryStore, WriteOptions};

use crate::fixtures::store::StoreDir;
use crate::util::{FakeClock, T0};

pub(super) fn opts() -> WriteOptions {
    WriteOptions::default()
}

/// A store under test, and whatever must live as long as it (a server).
pub(super) type Made = (Box<dyn MemoryStore>, Option<lessons::server::Background>);

pub(super) type Make = fn(&FakeClock, &tempfile::TempDir) -> Made;

pub(super) fn embedded_at(clock: &FakeClock, dir: &std::path::Path) -> EmbeddedStore {
    EmbeddedStore::builder()
        .clock(clock.clock())
        .durability(Durability::Buffered)
        .open(dir)
        .expect("the store opens")
}

pub(super) fn embedded(clock: &FakeClock, dir: &tempfile::TempDir) -> Made {
    (Box::new(embedded_at(clock, dir.path())), None)
}

pub(super) fn in_memory(clock: &FakeClock, _: &tempfile::TempDir) -> Made {
    (Box::new(InMemoryStore::with_clock(clock.clock())), None)
}

/// A `RemoteStore` talking to a live server over an embedded store.
pub(super) fn remote(clock: &FakeClock, dir: &tempfile::TempDir) -> Made {
    use crate::fixtures::server::{auth, serve, TOKEN};
    let store = Arc::new(embedded_at(clock, dir.path()));
    let server = serve(store, auth(TOKEN, None));
    let client = lessons::remote::RemoteStore::new(
        &server.url(),
        Some(TOKEN.into()),
        Duration::from_secs(10),
    )
    .expect("a client");
    (Box::new(client), Some(server))
}

pub(super) const STORES: [(&str, Make); 3] = [
    ("embedded", embedded),
    ("in-memory", in_memory),
    ("remote", remote),
];

/// Runs `f` against a fresh store of every kind.
pub(super) fn each(f: impl Fn(&dyn MemoryStore, &FakeClock)) {
    for (name, make) in STORES {
        let dir = tempfile::tempdir().expect("a scratch dir");
        let clock = FakeClock::new(T0);
        let (store, _server) = make(&clock, &dir);
        eprintln!("store: {name}");
        f(store.as_ref(), &clock);
    }
}

pub(super) fn texts(records: &[lessons::Record]) -> Vec<&str> {
    records.iter().map(|r| r.text.as_str()).collect()
}

/// Opens the store at `dir` on `clock`, its index committed often enough for a test to see.
pub(super) fn open(dir: &StoreDir, clock: &FakeClock) -> EmbeddedStore {
    dir.open_with(
        EmbeddedStore::builder()
            .clock(clock.clock())
            .index_commit(32, Duration::from_millis(20)),
    )
}
