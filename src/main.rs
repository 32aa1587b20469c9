//! The `lessons` command line: argument parsing, exit codes and human output over the library.
//!
//! Exit codes: 0 ok; 1 the command ran and found what it reports as a failure (`gate --check`
//! found markers); 2 a usage or operational error, with a one-line reason on stderr.

#![forbid(unsafe_code)]

mod cli;

use std::process::ExitCode;

/// jemalloc, not the system allocator: see `lessons::allocator` for why.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    #[cfg(feature = "jemalloc")]
    for refused in lessons::allocator::tune() {
        eprintln!("lessons: jemalloc refused {refused}; keeping its default");
    }
    cli::run(std::env::args_os())
}
