//! All integration tests, one binary (one link, shared helpers).

// A harness: a panic is its failure report (see Cargo.toml's lint policy).
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]
mod cli;
mod context;
mod faults;
mod fixtures;
mod fts;
mod fuzz_corpus;
mod gate;
mod lost_writes;
mod mcp;
mod model_check;
mod page;
#[cfg(target_os = "linux")]
mod power_loss;
mod reference_cases;
mod reflection;
mod review;
mod sealed;
mod serve;
mod server;
mod server_connections;
mod server_faults;
mod server_origin;
mod store;
mod text;
mod transcript;
mod util;
mod webdriver;
