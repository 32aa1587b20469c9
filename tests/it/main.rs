//! All integration tests, one binary (one link, shared helpers).

mod cli;
mod fuzz_corpus;
mod gate;
mod text;
mod util;
