//! The design record's "One trace", end to end on a fresh store.
//!
//! A coding run in `acme/app` is briefed to add a registry drift check; its brief never mentions
//! licenses. Two days earlier another run learned why the license check fails on a resident tree.
//! The run still gets that lesson (the repository window needs no keyword match); afterwards the
//! extractor offers four facts and a summary, the gate rejects the status line, the
//! restatement bumps the old lesson instead of inserting, and the outcome line says so.
//!
//! `cargo run --example trace`

// A harness: a panic is its failure report (see Cargo.toml's lint policy).
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]
use std::error::Error;
use std::path::Path;

use lessons::memory::{build_context, reflect, shown_set};
use lessons::reflect::reflection_prompt;
use lessons::store::system_clock;
use lessons::{
    Candidate, ContextConfig, EmbeddedStore, MemoryStore, Origin, RunScopes, ScopeKey, WriteOptions,
};

const LICENSE_LESSON: &str = "the license check fails on a resident tree whose nested node_modules were dropped; a clean npm ci of the same commit passes; the allowlist is never the fix";

/// Replays the trace in a store at `dir` and returns what it prints.
pub fn run(dir: &Path) -> Result<String, Box<dyn Error>> {
    let store = EmbeddedStore::open(dir)?;
    let run = RunScopes::new("acme", Some("acme/app"), Some("slack:C1"), Some("slack:U7"))?;
    let repo = ScopeKey::parse("repo:acme/app")?;
    let mut out = String::new();

    // Two days earlier: lessons this repository already holds.
    let seed = [
        Candidate::fact(LICENSE_LESSON, "slack:C1:1698"),
        Candidate::fact("pnpm install must run before vitest, or the workspace links point at stale builds", "slack:C1:1702"),
        Candidate::fact("the e2e suite needs PLAYWRIGHT_BROWSERS_PATH=0 because the runner's cache volume is read-only", "slack:C1:1711"),
    ];
    store.write(&repo, &seed, &WriteOptions::default())?;

    // 1–2. The dispatch reads memory and renders the block.
    let brief = "add a registry drift check to the CI pipeline";
    let config = ContextConfig::default();
    let ctx = build_context(&store, &run, brief, &config, system_clock()());
    let block = ctx.block.ok_or("the run got no block")?;
    out.push_str(&block);
    out.push('\n');

    // 4. After the reply: the extractor sees the window and the transcript's hits by handle.
    let request = brief;
    let answer = "Added check:deps-drift. Verify failed on the license check; reinstalled with npm ci and it passed.";
    let shown = shown_set(&store, &run, request, answer, &config)?;
    let prompt = reflection_prompt(&shown, &format!("{request}\n\n{answer}"));
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
    let outcome = reflect(
        &store,
        &run,
        &reply,
        &prompt.shown,
        Origin::Public,
        "slack:C1:1835",
        Some("run-7"),
    )?;
    out.push_str(&outcome.line());
    out.push('\n');
    let lesson = store
        .get(&license_id)?
        .ok_or("the license lesson is gone")?;
    out.push_str(&format!(
        "restated {}: use count {}, confidence {:?}, text unchanged: {}\n",
        lesson.id,
        lesson.use_count,
        lesson.confidence,
        lesson.text == LICENSE_LESSON
    ));
    store.close()?;
    Ok(out)
}

fn main() -> Result<(), Box<dyn Error>> {
    let dir = std::env::temp_dir().join(format!("lessons-trace-{}", std::process::id()));
    let printed = run(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    print!("{}", printed?);
    Ok(())
}
