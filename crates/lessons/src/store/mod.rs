//! The store: the [`MemoryStore`] contract and its implementations. This file is the facade:
//! it declares the modules and hands on the names the crate exports, and defines nothing.
//!
//! - [`EmbeddedStore`]: records in fjall, keyword search in tantivy, one atomic batch per write.
//! - [`InMemoryStore`]: the same contract over plain vectors, written straight from the rules
//!   (scans, no planner, no index): the model the embedded store is tested against, and a fast
//!   store for tests of later layers.
//!
//! **Invariant:** only this module knows key encodings and fjall.
//! **Invariant:** no file under `store/` imports this facade: each imports the file that defines
//! the name it uses, so the facade stands above them all.

mod api;
pub(crate) mod background;
pub(crate) mod codec;
mod counters;
mod durable;
pub(crate) mod embedded;
pub(crate) mod engine;
mod fjall_files;
pub(crate) mod index;
mod memory;
pub(crate) mod plan;
mod salvage;
mod upkeep;
mod validate;
mod values;

pub use api::MemoryStore;
pub use counters::{DayCounters, DayStats};
pub use embedded::{Durability, EmbeddedStore, EmbeddedStoreBuilder, Health, DEFAULT_CACHE_BYTES};
pub use memory::InMemoryStore;
pub use salvage::{salvage, SalvageReport};
pub use upkeep::{MemoryUse, SyncTimes, Upkeep};
#[cfg(any(feature = "remote", feature = "server"))]
pub(crate) use validate::validate_forget_id;
#[cfg(feature = "server")]
pub(crate) use validate::Cap;
pub use validate::CheckedWrite;
pub use values::{ImportReport, ListQuery, SweepReceipt, Window, WriteOptions};
