//! Argument parsing and dispatch. Every command answers with an `Outcome` or a `Failure`;
//! only [`run`] turns them into exit codes and stderr lines.

// The commands' doc comments are clap's help text, printed on a terminal, not HTML.
#![allow(rustdoc::invalid_html_tags)]

mod admin_cmds;
mod gate;
mod mcp;
mod review_cmds;
mod run_cmds;
mod serve;
mod store_cmds;

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
    after_help = "Examples:\n  lessons gate \"PR 12 was merged\"                      # -> reference, delivery\n  echo '[{\"kind\":\"fact\",\"text\":\"run npm ci first\",\"sourceThreadKey\":\"t1\"}]' \\\n    | lessons write --scope repo --repo acme/app\n  lessons list --scope repo:acme/app --kind fact --limit 24\n  lessons retrieve --scope org --org acme --query \"flaky vitest\"\n  lessons sweep --scope all --dry-run\n\nThe store is --store DIR, else $LESSONS_STORE, else ./lessons-store.\nExit codes: 0 ok, 1 the command found what it reports (gate --check: a marker;\nforget: no such record; doctor: inconsistent), 2 usage or operational error."
)]
pub(crate) struct Cli {
    /// The store directory [default: $LESSONS_STORE, else ./lessons-store].
    #[arg(long, global = true, value_name = "DIR", env = "LESSONS_STORE")]
    pub store: Option<PathBuf>,
    /// A configuration file for the store commands.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print JSON (the same JSON the matching server route answers) instead of human lines.
    #[arg(long, global = true)]
    pub json: bool,
    /// Talk to a running `lessons serve` (or a memory Worker) at this URL instead of opening the
    /// store; the token comes from $MEMORY_TOKEN.
    #[arg(long, global = true, value_name = "URL", env = "LESSONS_SERVER")]
    pub server: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Print the status markers each fact carries, or `lesson` when it carries none.
    ///
    /// With TEXT arguments, one line per TEXT; without, one fact per stdin line.
    Gate(gate::GateArgs),
    /// Write candidates (a JSON array on stdin) to a scope; prints the counts.
    Write(store_cmds::WriteArgs),
    /// Active records of a scope, newest first (never counts as a use).
    List(store_cmds::ListArgs),
    /// The best records of a scope for a query (counts as a use of each).
    Retrieve(store_cmds::RetrieveArgs),
    /// Retire one record (kept for audit); the scope comes from the id.
    Forget(store_cmds::ForgetArgs),
    /// Retire every active fact that carries a status marker (--scope all for every scope).
    Sweep(store_cmds::SweepArgs),
    /// Every record, as JSON Lines, for backup or moving.
    Export,
    /// Whole records as JSON Lines (from export, or a Worker's rows); ids already held are skipped.
    Import(admin_cmds::ImportArgs),
    /// Check that the keyword index agrees with the records; --repair rebuilds it.
    Doctor(admin_cmds::DoctorArgs),
    /// The decision journal of a scope, newest first: what was rejected, restated, merged, evicted.
    Journal(review_cmds::JournalArgs),
    /// The week's verdict: inserted per day, rejected share, restated vs inserted (exit 1 if any fires).
    Review(review_cmds::ReviewArgs),
    /// What happened per scope per day: offered, rejected, restated, inserted, deduped, ...
    Stats(admin_cmds::StatsArgs),
    /// The system-prompt block a run gets: the repository's newest lessons, then keyword hits.
    Context(run_cmds::ContextArgs),
    /// The extractor prompt for a finished run, and the records it shows (--json for `reflect`).
    Prompt(run_cmds::PromptArgs),
    /// Write an extractor's reply (stdin): gate, route, write; prints the [memory] outcome line.
    Reflect(run_cmds::ReflectArgs),
    /// Serve the memory Worker's HTTP contract over this store (token from $MEMORY_TOKEN).
    Serve(serve::ServeArgs),
    /// Serve the Model Context Protocol on stdin and stdout, for any coding agent: the run's
    /// context, search, the window, the gate, the reflection prompt and its write.
    Mcp(mcp::McpArgs),
}

/// What a command that ran reports: success, or a finding that maps to exit code 1.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Exit 0.
    Ok,
    /// Exit 1: the command ran and found what it reports as a failure.
    Found,
}

/// A usage or operational error: exit 2 with a one-line reason on stderr. The error keeps its
/// kind, so [`run`] can tell a reader that closed the pipe (exit 0) from a real failure.
#[derive(Debug)]
pub(crate) enum Failure {
    /// A usage error or a reason the command composed.
    Usage(String),
    /// Reading stdin or writing stdout failed.
    Io(io::Error),
    /// The library failed.
    Store(lessons::Error),
}

impl Failure {
    /// A reader that closed its end of stdout (`lessons export | head -1`): not an error.
    fn is_closed_pipe(&self) -> bool {
        match self {
            Failure::Io(e) => e.kind() == io::ErrorKind::BrokenPipe,
            Failure::Store(e) => e.io_kind() == Some(io::ErrorKind::BrokenPipe),
            Failure::Usage(_) => false,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Usage(reason) => f.write_str(reason),
            Failure::Io(e) => write!(f, "{e}"),
            Failure::Store(e) => write!(f, "{e}"),
        }
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Io(e)
    }
}

impl From<lessons::Error> for Failure {
    fn from(e: lessons::Error) -> Self {
        Failure::Store(e)
    }
}

/// Parses `args`, runs the command and maps the result to an exit code.
pub fn run(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    install_logger();
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
        Command::Write(args) => store_cmds::write(&cli, args),
        Command::List(args) => store_cmds::list(&cli, args),
        Command::Retrieve(args) => store_cmds::retrieve(&cli, args),
        Command::Forget(args) => store_cmds::forget(&cli, args),
        Command::Sweep(args) => store_cmds::sweep(&cli, args),
        Command::Export => admin_cmds::export(&cli),
        Command::Import(args) => admin_cmds::import(&cli, args),
        Command::Doctor(args) => admin_cmds::doctor(&cli, args),
        Command::Stats(args) => admin_cmds::stats(&cli, args),
        Command::Journal(args) => review_cmds::journal(&cli, args),
        Command::Review(args) => review_cmds::review(&cli, args),
        Command::Context(args) => run_cmds::context(&cli, args),
        Command::Prompt(args) => run_cmds::prompt(&cli, args),
        Command::Reflect(args) => run_cmds::reflect_cmd(&cli, args),
        Command::Serve(args) => serve::run(&cli, args),
        Command::Mcp(args) => mcp::run(&cli, args),
    };
    match result {
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::Found) => ExitCode::from(1),
        // A reader that closed the pipe (`lessons export | head -1`) is not an error.
        Err(f) if f.is_closed_pipe() => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("lessons: {f}");
            ExitCode::from(2)
        }
    }
}

/// Writes `line` and a newline; a closed pipe becomes a [`Failure`] that [`run`] treats as done.
/// Text read from the store (record texts and sources come from chat), made safe for a
/// terminal: control characters (C0 but tab, DEL, C1) and the bidirectional controls are
/// written as `\u{…}` escapes, so a record cannot move the cursor, ring the bell, rewrite a
/// line or reorder what a person reads. For human output only: `--json` is the server's bytes.
pub(crate) fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| {
        (c.is_control() && c != '\t')
            || matches!(c, '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
    };
    if !s.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A `--json` answer: one of the wire contract's bodies, as the server would write it.
pub(crate) fn to_json(answer: &impl serde::Serialize) -> Result<String, Failure> {
    serde_json::to_string(answer).map_err(|e| Failure::Usage(format!("encoding the answer: {e}")))
}

pub(crate) fn emit(out: &mut impl Write, line: &str) -> Result<(), Failure> {
    // A keyword may carry a lone surrogate (in its private form, U+FDD0 first); it is written
    // as JavaScript writes it.
    if line.contains('\u{FDD0}') {
        out.write_all(lessons::internals::json::restore_lone(line.to_owned()).as_bytes())?;
    } else {
        out.write_all(line.as_bytes())?;
    }
    out.write_all(b"\n")?;
    Ok(())
}

/// Prints the `log` facade's records on stderr: the library's own lines (`[http] …` request
/// lines, `[memory] …` and `[store] …` warnings) and fjall's, which otherwise go nowhere (an
/// ENOSPC that fjall logs must reach the operator). `LESSONS_LOG` sets the level for every
/// crate: `error`, `warn`, `info`, `debug`, `trace` or `off`; unset, `lessons`' own lines are
/// shown from `info` and other crates' from `warn`.
struct StderrLog {
    /// `None`: the default split between our lines and other crates'.
    level: Option<log::LevelFilter>,
}

impl log::Log for StderrLog {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        let limit = self
            .level
            .unwrap_or(if metadata.target().starts_with("lessons") {
                log::LevelFilter::Info
            } else {
                log::LevelFilter::Warn
            });
        metadata.level() <= limit
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let message = record.args().to_string();
        if message.starts_with('[') {
            eprintln!("{message}");
        } else {
            // fjall's and other crates' lines: say whose they are.
            let crate_name = record.target().split("::").next().unwrap_or("lessons");
            eprintln!("[{crate_name}] {}: {message}", record.level());
        }
    }

    fn flush(&self) {}
}

fn install_logger() {
    let level = match std::env::var("LESSONS_LOG").as_deref() {
        Ok("error") => Some(log::LevelFilter::Error),
        Ok("warn") => Some(log::LevelFilter::Warn),
        Ok("info") => Some(log::LevelFilter::Info),
        Ok("debug") => Some(log::LevelFilter::Debug),
        Ok("trace") => Some(log::LevelFilter::Trace),
        Ok("off") => Some(log::LevelFilter::Off),
        _ => None,
    };
    let max = level.unwrap_or(log::LevelFilter::Info);
    if log::set_boxed_logger(Box::new(StderrLog { level })).is_ok() {
        log::set_max_level(max);
    }
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) of a time in milliseconds.
pub(crate) fn format_ms(ms: lessons::internals::time::Millis) -> String {
    let secs = ms.div_euclid(1000).rem_euclid(86_400);
    format!(
        "{} {:02}:{:02}:{:02}",
        lessons::internals::time::format_day(lessons::internals::time::day_of(ms)),
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}
