//! What a bot calls per run, in order: the block before the run, the shown set and the
//! extractor prompt after it, then the reflection write.
//!
//! 1. [`build_context`] / [`context_block`]: the system-prompt block (window + keyword hits).
//! 2. [`shown_set`] + [`crate::reflect::reflection_prompt`]: what the extractor sees.
//! 3. the model call (the bot's own).
//! 4. [`reflect`]: parse the reply, gate, route, write; the `[memory]` outcome line.
//!
//! This module makes the store calls; the decisions are in [`crate::context`] and
//! [`crate::reflect`], which do no IO.

use std::collections::BTreeMap;

use crate::context::{assemble, pool, ContextConfig, RunScopes};
use crate::error::Result;
use crate::limits::{MAX_LIMIT, MAX_QUERY_UNITS};
use crate::model::{Kind, Record, ScopeKey};
use crate::reflect::{
    parse_reflection, route, Origin, ReflectionOutcome, Shown, SHOWN_PER_SCOPE, SHOWN_QUERY_UNITS,
};
use crate::store::{MemoryStore, WriteOptions};
use crate::text::head_utf16;

/// A run's block and how it was made.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Context {
    /// The block, exactly as the run's system prompt gets it; `None`: no block at all.
    pub block: Option<String>,
    /// The records in the block, in order.
    pub records: Vec<Record>,
    /// How many of them came from the repository window.
    pub from_window: usize,
    /// Warnings to log (never record text): a failed window read, a failed scope search.
    pub warnings: Vec<String>,
}

/// Builds a run's block: the repository window (`list`, facts, no bump) first, then the keyword
/// hits of the other scopes (`retrieve` with the brief), merged and re-scored together, within
/// `config`'s budget. A failed read costs that part of the block, never the run. With memory
/// off, no store call is made.
pub fn build_context(
    store: &dyn MemoryStore,
    run: &RunScopes,
    brief: &str,
    config: &ContextConfig,
    now: i64,
) -> Context {
    let mut ctx = Context::default();
    if !config.enabled {
        return ctx;
    }
    if let Err(e) = config.validate() {
        ctx.warnings
            .push(format!("[memory] context config invalid ({e}); no block"));
        return ctx;
    }
    let mut window = Vec::new();
    let mut searched: Vec<&ScopeKey> = vec![&run.org];
    if let Some(repo) = &run.repo {
        if config.repo_window > 0 {
            match store.window(repo, config.repo_window) {
                Ok(records) => window = records.to_records(),
                Err(e) => ctx.warnings.push(format!(
                    "[memory] repo window read failed ({}); continuing without the window",
                    e
                )),
            }
        } else {
            searched.push(repo);
        }
    }
    searched.extend(run.channel.as_ref());
    searched.extend(run.user.as_ref());
    let query = head_utf16(brief, MAX_QUERY_UNITS);
    let per_scope = config.limit.min(MAX_LIMIT);
    let mut hits = Vec::new();
    for scope in searched {
        match store.retrieve(scope, query, per_scope) {
            Ok(records) => hits.push(records),
            Err(e) => ctx.warnings.push(format!(
                "[memory] retrieve failed for {scope} ({}); continuing without it",
                e
            )),
        }
    }
    let from_window = window.len();
    let pool = pool(window, hits, brief, now);
    if let Some((block, records)) = assemble(run, &pool, config) {
        ctx.from_window = from_window.min(records.len());
        ctx.block = Some(block.text);
        ctx.records = records;
    }
    ctx
}

/// The block for a run, or `None`; warnings go to the `log` facade as `[memory] …` lines.
pub fn context_block(
    store: &dyn MemoryStore,
    run: &RunScopes,
    brief: &str,
    config: &ContextConfig,
) -> Option<String> {
    let ctx = build_context(store, run, brief, config, store.now());
    for w in &ctx.warnings {
        log::warn!("{w}");
    }
    ctx.block
}

/// The records the extractor is shown after a run: the repository window (no bump), then
/// `retrieve(request + " " + answer, 8)` in every scope of the run (these bump: the run's own
/// words matched them), without duplicates, window first.
pub fn shown_set(
    store: &dyn MemoryStore,
    run: &RunScopes,
    request: &str,
    answer: &str,
    config: &ContextConfig,
) -> Result<Vec<Record>> {
    let mut shown: Vec<Record> = Vec::new();
    if let (Some(repo), true) = (&run.repo, config.repo_window > 0) {
        shown.extend(store.window(repo, config.repo_window)?.to_records());
    }
    let query = format!("{request} {answer}");
    let query = head_utf16(&query, SHOWN_QUERY_UNITS);
    for scope in run.all() {
        for r in store.retrieve(scope, query, SHOWN_PER_SCOPE)? {
            if !shown.iter().any(|s| s.id == r.id) {
                shown.push(r);
            }
        }
    }
    Ok(shown)
}

/// Writes an extractor's `reply` for a run: parse (fences and chatter tolerated), gate, route
/// (narrowing by `origin`), then one write per target scope for the facts and one for the
/// summary. Offered and rejected counts are recorded in the run's repository scope (else its
/// organization) with the write. Returns the counts; [`ReflectionOutcome::line`] is the log line.
pub fn reflect(
    store: &dyn MemoryStore,
    run: &RunScopes,
    reply: &str,
    shown: &[Shown],
    origin: Origin,
    thread: &str,
    run_id: Option<&str>,
) -> Result<ReflectionOutcome> {
    let reflection = parse_reflection(reply, shown);
    let mut outcome = ReflectionOutcome {
        tally: reflection.tally.clone(),
        error: reflection.error.clone(),
        ..ReflectionOutcome::default()
    };
    if reflection.error.is_some() {
        return Ok(outcome);
    }
    let routed = route(&reflection, run, origin, thread, run_id);
    let home = run.repo.clone().unwrap_or_else(|| run.org.clone());
    let mut tally = Some(reflection.tally.clone());
    let mut writes: BTreeMap<ScopeKey, Vec<crate::model::Candidate>> = routed.facts;
    if tally.as_ref().is_some_and(|t| t.offered > 0) {
        writes.entry(home.clone()).or_default();
    }
    let mut rejected = Some(reflection.rejected.clone());
    for (scope, candidates) in writes {
        let home_write = scope == home;
        let options = WriteOptions {
            cap: None,
            tally: if home_write { tally.take() } else { None },
            rejected: if home_write {
                rejected.take().unwrap_or_default()
            } else {
                Vec::new()
            },
        };
        let c = store.write(&scope, &candidates, &options)?;
        outcome.inserted += c.inserted;
        outcome.restated += c.restated;
        outcome.deduped += c.deduped;
    }
    if let Some((scope, summary)) = routed.summary {
        debug_assert_eq!(summary.kind, Some(Kind::Summary));
        store.write(&scope, &[summary], &WriteOptions::default())?;
        outcome.summary = 1;
    }
    Ok(outcome)
}
