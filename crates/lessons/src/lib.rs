//! `lessons`: an embedded memory store for coding bots that keeps lessons, not status.
//!
//! A bot runs coding agents in many repositories, and each run learns something: a failing check
//! and its cause, a command that must run first, a convention. `lessons` keeps those lessons and
//! refuses status — the state of one pull request at one moment — with a deterministic gate.
//!
//! ```
//! use lessons::gate::{rejection_markers, Marker};
//!
//! // Status: a pull request's state at one moment. The gate rejects it.
//! let status = "pull request 1835 pushed at sha 3f9a2c1 with 10,512 tests passing";
//! assert_eq!(rejection_markers(status), [Marker::Reference, Marker::Sha, Marker::Count]);
//!
//! // A lesson: true in a future unrelated run. The gate lets it through.
//! let lesson = "the license check fails on a tree whose nested node_modules were dropped; \
//!               a clean npm ci passes; the allowlist is never the fix";
//! assert!(rejection_markers(lesson).is_empty());
//! ```
//!
//! The store, in ten lines:
//!
//! ```
//! use lessons::{Candidate, EmbeddedStore, MemoryStore, ScopeKey, WriteOptions};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = std::env::temp_dir().join(format!("lessons-doc-{}", std::process::id()));
//! let store = EmbeddedStore::open(&dir)?; // fsync per write by default
//! let repo = ScopeKey::parse("repo:acme/app")?;
//! let lesson = Candidate::fact("the license check fails when nested node_modules were dropped; npm ci fixes it", "slack:C1:1700");
//! let counts = store.write(&repo, &[lesson], &WriteOptions::default())?;
//! assert_eq!(counts.inserted, 1);
//! let window = store.window(&repo, 24)?; // the newest facts, shared, no usage bump
//! let hits = store.retrieve(&repo, "why does the license check fail?", 8)?; // BM25 + recency
//! assert_eq!(hits[0].id, window[0].id);
//! let again = Candidate::fact("nested node_modules loss breaks the license check", "slack:C1:1800")
//!     .restating(&window[0].id); // the same lesson in new words
//! assert_eq!(store.write(&repo, &[again], &WriteOptions::default())?.restated, 1);
//! # drop(store);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```
//!
//! The modules, one question each (the whole map is `ARCHITECTURE.md`):
//! - [`store`]: the [`MemoryStore`] contract; [`EmbeddedStore`] (fjall + tantivy, one atomic
//!   batch per write) and [`InMemoryStore`].
//! - [`model`]: records, candidates, scope keys, statuses, counts.
//! - [`gate`]: which status and change-description markers does this text carry?
//! - [`context`] and [`memory`]: which records does a run see, and exactly what bytes; what a
//!   bot calls per run, in order, against a store.
//! - [`reflect`]: the extractor's prompt, reading its reply, routing facts to scopes.
//! - [`review`]: the week's verdict: the three signals and their evidence.
//! - [`decisions`]: the decision journal: what the store decided about each fact.
//! - `server` (feature `server`): the memory Worker's HTTP wire contract over one store
//!   (`lessons serve`).
//! - `remote` (feature `remote`): the store contract over that wire (`remote::RemoteStore`).
//!
//! - `mcp` (feature `mcp`): the Model Context Protocol over the same store.
//!
//! Features: none by default, so `cargo add lessons` builds the store alone (fjall, tantivy,
//! regex, serde, serde_json, postcard, parking_lot, log, sha2, xxhash-rust); `server`, `remote`,
//! `mcp` and `jemalloc` (the allocator's counts on `/metrics`) add what they name. The `lessons`
//! binary is the workspace's other crate, `lessons-cli`.

#![forbid(unsafe_code)]

#[cfg(feature = "jemalloc")]
pub mod allocator;
pub mod context;
#[cfg(feature = "__wire")]
mod contract;
pub mod decisions;
mod error;
mod fts;
mod fts_tables;
#[cfg(feature = "__fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod gate;
#[cfg(feature = "__internals")]
#[doc(hidden)]
pub mod internals;
mod json;
mod limits;
pub mod memory;
pub mod model;
mod provenance;
mod rank;
mod redact;
pub mod reflect;
#[cfg(feature = "remote")]
pub mod remote;
pub mod review;
#[cfg(feature = "server")]
pub mod server;
pub mod store;
mod text;
mod time;

pub use context::{ContextConfig, RunScopes};
pub use decisions::{Decision, DecisionEvent, DecisionQuery};
pub use error::{Error, ErrorKind, Result};
pub use gate::{rejection_markers, Marker};
pub use model::{Candidate, Kind, Record, ScopeKey, Status, WriteCounts};
pub use redact::redact_secrets;
pub use reflect::{Origin, ReflectionOutcome};
pub use store::{
    Durability, EmbeddedStore, InMemoryStore, ListQuery, MemoryStore, SweepReceipt, Window,
    WriteOptions,
};
pub use time::{system_clock, Clock, Millis};

/// The README's code blocks, compiled by `cargo test` so they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
