//! The `lessons` command line: argument parsing, exit codes and human output over the library.
//!
//! Exit codes: 0 ok; 1 the command ran and found what it reports as a failure (`gate --check`
//! found markers); 2 a usage or operational error, with a one-line reason on stderr.

#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    lessons::cli::run(std::env::args_os())
}
