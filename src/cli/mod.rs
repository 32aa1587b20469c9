//! Argument parsing and dispatch. Every command answers with an [`Outcome`] or a [`Failure`];
//! only [`run`] turns them into exit codes and stderr lines.

mod gate;

use std::ffi::OsString;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// `lessons`: a memory store for coding bots that keeps lessons, not status.
#[derive(Debug, Parser)]
#[command(
    name = "lessons",
    version,
    about = "A memory store for coding bots that keeps lessons, not status.",
    after_help = "Examples:\n  lessons gate \"PR 12 was merged\"            # -> reference, delivery\n  lessons gate \"run npm ci before the license check\"   # -> lesson\n  printf 'a fact per line\\n' | lessons gate --check\n\nExit codes: 0 ok, 1 the command found what it reports (gate --check: a marker), 2 usage or operational error."
)]
pub struct Cli {
    /// The store directory [default: $LESSONS_STORE, else ./lessons-store].
    #[arg(long, global = true, value_name = "DIR", env = "LESSONS_STORE")]
    pub store: Option<PathBuf>,
    /// A configuration file for the store commands.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print JSON (the same JSON the matching server route answers) instead of human lines.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the status markers each fact carries, or `lesson` when it carries none.
    ///
    /// With TEXT arguments, one line per TEXT; without, one fact per stdin line.
    Gate(gate::GateArgs),
}

/// What a command that ran reports: success, or a finding that maps to exit code 1.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Exit 0.
    Ok,
    /// Exit 1: the command ran and found what it reports as a failure.
    Found,
}

/// A usage or operational error: exit 2 with this one-line reason on stderr.
#[derive(Debug)]
pub struct Failure(pub String);

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure(e.to_string())
    }
}

/// Parses `args`, runs the command and maps the result to an exit code.
pub fn run(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            let rendered = e.render().to_string();
            let first = rendered.lines().next().unwrap_or("invalid arguments");
            let reason = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("lessons: {reason} (see 'lessons --help')");
            return ExitCode::from(2);
        }
    };
    let result = match &cli.command {
        Command::Gate(args) => gate::run(&cli, args),
    };
    match result {
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::Found) => ExitCode::from(1),
        Err(Failure(reason)) => {
            // A reader that closed the pipe (`lessons gate < big | head`) is not an error.
            if reason == io::Error::from(io::ErrorKind::BrokenPipe).to_string() {
                return ExitCode::SUCCESS;
            }
            eprintln!("lessons: {reason}");
            ExitCode::from(2)
        }
    }
}

/// Writes `line` and a newline; a closed pipe becomes a [`Failure`] that [`run`] treats as done.
pub(crate) fn emit(out: &mut impl Write, line: &str) -> Result<(), Failure> {
    out.write_all(line.as_bytes())?;
    out.write_all(b"\n")?;
    Ok(())
}
