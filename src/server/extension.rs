//! The routes beyond the Worker's: what `RemoteStore` needs for the whole store contract, the
//! run routes (`/context`, `/prompt`, `/reflect`) and the review routes, each answered with its
//! [`crate::contract`] body. The Worker's own five routes are in `handler`.

use super::handler::text;
use super::wire::Body;
use super::AppState;
use crate::contract::{
    ContextAnswer, CountAnswer, GetAnswer, ImportAnswer, JournalAnswer, PromptAnswer, ScopesAnswer,
    StatsAnswer, WindowAnswer,
};
use crate::memory::{build_context, reflect, shown_set};
use crate::reflect::reflection_prompt;
use crate::time::system_clock;

/// The routes beyond the Worker's, answered with their [`crate::contract`] bodies.
pub(super) fn execute(state: &AppState, body: Body) -> crate::Result<(String, String)> {
    let store = state.store.as_ref();
    Ok(match body {
        Body::Retrieve { .. }
        | Body::Write { .. }
        | Body::List { .. }
        | Body::Forget { .. }
        | Body::Sweep { .. }
        | Body::Export => return Err(crate::Error::invalid("a route reached the wrong handler")),
        Body::Get { id } => {
            let record = store.get(&id)?;
            let log = format!("found={}", record.is_some());
            (text(&GetAnswer { record })?, log)
        }
        Body::Scopes => {
            let scopes = store.scopes()?;
            let log = format!("scopes={}", scopes.len());
            (text(&ScopesAnswer { scopes })?, log)
        }
        Body::Count { scope } => {
            let active = store.active_count(&scope)?;
            (
                text(&CountAnswer { active })?,
                format!("{scope} active={active}"),
            )
        }
        Body::Journal { scope, query } => {
            let decisions = store.decisions(&scope, &query)?;
            let log = format!("{scope} decisions={}", decisions.len());
            (text(&JournalAnswer { decisions })?, log)
        }
        Body::Review { days, scope } => {
            let now = system_clock()();
            let r = crate::review::review(store, days, scope.as_ref(), now, &state.review)?;
            let log = format!("days={days} fired={}", r.fired.len());
            (text(&r)?, log)
        }
        Body::Window { scope } => {
            let records = store.window(&scope, state.context.repo_window.max(1))?;
            let pairs: Vec<(&str, &str)> = records
                .iter()
                .map(|r| (r.text.as_str(), r.source_thread_key.as_str()))
                .collect();
            let block = crate::context::render_block(
                scope.as_str(),
                &pairs,
                state.context.limit,
                state.context.max_tokens,
            );
            let answer = WindowAnswer {
                records: records
                    .iter()
                    .map(|r| &**r)
                    .collect::<Vec<&crate::Record>>(),
                kept: block.as_ref().map_or(0, |b| b.kept),
                block: block.map(|b| b.text),
            };
            (text(&answer)?, format!("{scope} window"))
        }
        Body::Import { records, decisions } => {
            let r = store.import(&records)?;
            let journaled = store.import_decisions(&decisions)?;
            let answer = ImportAnswer {
                ok: true,
                imported: r.imported,
                skipped: r.skipped,
                decisions: journaled,
            };
            let log = format!(
                "imported={} skipped={} decisions={journaled}",
                r.imported, r.skipped
            );
            (text(&answer)?, log)
        }
        Body::Stats { since } => {
            let days = store.stats(since)?;
            let log = format!("days={}", days.len());
            (text(&StatsAnswer { days })?, log)
        }
        run_body @ (Body::Context { .. } | Body::Prompt { .. } | Body::Reflect { .. }) => {
            return run_route(state, run_body)
        }
    })
}

/// The routes a run calls: its context block, its extractor prompt, its reflection.
fn run_route(state: &AppState, body: Body) -> crate::Result<(String, String)> {
    let store = state.store.as_ref();
    Ok(match body {
        Body::Context { run, brief } => {
            let ctx = build_context(store, &run, &brief, &state.context, system_clock()());
            for w in &ctx.warnings {
                log::warn!("{w}");
            }
            let log = format!(
                "{} kept={} window={}",
                run.resource(),
                ctx.records.len(),
                ctx.from_window
            );
            let answer = ContextAnswer {
                kept: ctx.records.len(),
                from_window: ctx.from_window,
                block: ctx.block,
            };
            (text(&answer)?, log)
        }
        Body::Prompt {
            run,
            request,
            answer,
            transcript,
        } => {
            let shown = shown_set(store, &run, &request, &answer, &state.context)?;
            let transcript = transcript.unwrap_or_else(|| format!("{request}\n\n{answer}"));
            let p = reflection_prompt(&shown, &transcript);
            let log = format!("{} shown={}", run.resource(), p.shown.len());
            let answer = PromptAnswer {
                system: p.system,
                input: p.input,
                shown: p.shown,
            };
            (text(&answer)?, log)
        }
        Body::Reflect {
            run,
            reply,
            shown,
            origin,
            thread,
            run_id,
        } => {
            let outcome = reflect(
                store,
                &run,
                &reply,
                &shown,
                origin,
                &thread,
                run_id.as_deref(),
            )?;
            let line = outcome.line();
            log::info!("{line}");
            (text(&outcome)?, run.resource())
        }
        _ => return Err(crate::Error::invalid("a route reached the wrong handler")),
    })
}
