//! The design record's "One trace", end to end, as two runs of a bot in `acme/app` on an
//! embedded store. (The design record is the founding design note of the bot's memory redesign,
//! kept outside this repository; docs/design.md summarizes its decisions.)
//!
//! Run 1: a coding run learns why the license check fails; its extractor's reply is gated and
//! written. Run 2, days later, is briefed to add a registry drift check (the brief never
//! mentions licenses) and still gets that lesson in its block: the repository window needs no
//! keyword match. Its extractor then offers a status line (refused by the gate), the license
//! lesson again in new words (a restatement: one stronger record, not two), a new lesson and a
//! user preference, and the `[memory]` line says so.
//!
//! `cargo run --release --example trace [DIR]` (default `./lessons-trace`, kept afterwards so
//! the CLI can read it: `lessons --store lessons-trace list --scope repo:acme/app`).

// A harness: a panic is its failure report (see Cargo.toml's lint policy).
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]

use std::error::Error;
use std::path::{Path, PathBuf};

use lessons::memory::{build_context, reflect, shown_set};
use lessons::reflect::reflection_prompt;
use lessons::{ContextConfig, EmbeddedStore, MemoryStore, Origin, RunScopes};

const LICENSE_LESSON: &str = "the license check fails on a resident tree whose nested node_modules were dropped; a clean npm ci of the same commit passes; the allowlist is never the fix";

/// What a trace leaves in a store directory it made, so a second trace may replace it.
const MADE_BY_TRACE: &str = "made-by-the-trace-example";

/// Replays the trace in a store at `dir` and returns what it prints.
pub fn run(dir: &Path) -> Result<String, Box<dyn Error>> {
    let store = EmbeddedStore::open(dir)?;
    let run = RunScopes::new("acme", Some("acme/app"), Some("slack:C1"), Some("slack:U7"))?;
    let config = ContextConfig::default();
    let mut out = String::new();

    // Run 1: the extractor reads the transcript of a run that fixed the license check.
    let request = "the license check fails on main; find out why";
    let answer = "The resident tree had dropped nested node_modules, so npm ls put an LGPL subtree under production. A clean npm ci of the same commit passes.";
    let shown = shown_set(&store, &run, request, answer, &config)?;
    let prompt = reflection_prompt(&shown, &format!("{request}\n\n{answer}"));
    let reply = format!(
        r#"{{"facts":[
  {{"text":"{LICENSE_LESSON}","confidence":0.9,"audience":"repo"}},
  {{"text":"pnpm install must run before vitest, or the workspace links point at stale builds","confidence":0.8,"audience":"repo"}},
  {{"text":"the e2e suite needs PLAYWRIGHT_BROWSERS_PATH=0 because the runner's cache volume is read-only","confidence":0.8,"audience":"repo"}}
]}}"#
    );
    let first = reflect(
        &store,
        &run,
        &reply,
        &prompt.shown,
        Origin::Public,
        "slack:C1:1698",
        Some("run-6"),
    )?;
    out.push_str("# run 1: a coding run in acme/app learns why the license check fails\n");
    out.push_str(&first.line());
    out.push('\n');

    // Run 2: the dispatch reads memory and renders the block (steps 1–2 of the trace).
    let brief = "add a registry drift check to the CI pipeline";
    out.push_str(&format!("# run 2, briefed to {brief:?}: its block\n"));
    let ctx = build_context(&store, &run, brief, &config, lessons::system_clock()());
    let block = ctx.block.ok_or("the run got no block")?;
    out.push_str(&block);
    out.push('\n');

    // 4. After the reply: the extractor sees the window and the transcript's hits by handle.
    let answer = "Added check:deps-drift. Verify failed on the license check; reinstalled with npm ci and it passed.";
    let shown = shown_set(&store, &run, brief, answer, &config)?;
    let prompt = reflection_prompt(&shown, &format!("{brief}\n\n{answer}"));
    let license_id = shown
        .iter()
        .find(|r| r.text == LICENSE_LESSON)
        .map(|r| r.id.clone())
        .ok_or("the license lesson was not shown")?;
    let handle = prompt
        .shown
        .iter()
        .find(|s| s.id == license_id)
        .map(|s| s.handle.clone())
        .ok_or("no handle for the license lesson")?;
    let reply = format!(
        r#"```json
{{"facts":[
  {{"text":"pull request 1835 pushed at sha 3f9a2c1 with 10,512 tests passing","confidence":0.9,"audience":"repo"}},
  {{"text":"the license check false positive comes from nested node_modules loss; npm ci fixes it","confidence":0.95,"audience":"repo","restates":"[{handle}]"}},
  {{"text":"check:deps-drift names any tree or lockfile drift","keywords":["drift","lockfile"],"confidence":0.8,"audience":"repo"}},
  {{"text":"this user prefers the fix over the allowlist","confidence":0.7,"audience":"user"}}
],"summary":"A run added a registry drift check; the license check failed on a stale tree and passed after a clean install."}}
```"#
    );

    // 5–7. Gate, route, write; the outcome line.
    let second = reflect(
        &store,
        &run,
        &reply,
        &prompt.shown,
        Origin::Public,
        "slack:C1:1835",
        Some("run-7"),
    )?;
    out.push_str("# run 2's reflection: the status line refused, the lesson restated\n");
    out.push_str(&second.line());
    out.push('\n');
    let lesson = store
        .get(&license_id)?
        .ok_or("the license lesson is gone")?;
    let confidence = lesson
        .confidence
        .map_or_else(|| "none".to_owned(), |c| c.to_string());
    out.push_str(&format!(
        "restated {}: used {} times, confidence {confidence}, its text {}\n",
        lesson.id,
        lesson.use_count,
        if lesson.text == LICENSE_LESSON {
            "unchanged"
        } else {
            "changed"
        }
    ));
    store.close()?;
    Ok(out)
}

/// The store directory: the first argument, else `./lessons-trace`. One a previous trace made
/// is replaced; any other that exists is refused, so the trace never writes into a real store.
fn store_dir() -> Result<PathBuf, Box<dyn Error>> {
    let dir = std::env::args_os()
        .nth(1)
        .map_or_else(|| PathBuf::from("lessons-trace"), PathBuf::from);
    if dir.exists() {
        if !dir.join(MADE_BY_TRACE).exists() {
            return Err(format!(
                "{} exists and was not made by this example; pass another directory",
                dir.display()
            )
            .into());
        }
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(MADE_BY_TRACE), "")?;
    Ok(dir)
}

fn main() -> std::process::ExitCode {
    let traced = store_dir().and_then(|dir| Ok((run(&dir)?, dir)));
    match traced {
        Ok((printed, dir)) => {
            print!("{printed}");
            println!(
                "# the store is {}: `lessons --store {} list --scope repo:acme/app` reads it",
                dir.display(),
                dir.display()
            );
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("trace: {e}");
            std::process::ExitCode::from(2)
        }
    }
}
