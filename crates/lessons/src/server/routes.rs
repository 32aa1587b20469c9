//! What each POST route does with its parsed body: the store call (on a blocking thread), and
//! the answer as its [`crate::contract`] body's JSON text, with the log suffix of the request
//! (a scope and counts, never text). `/export` streams from `handler`; `/review` is written here
//! into a sink, which `handler` sends whole or streams by its size.

use std::sync::Arc;

use axum::body::Bytes;

use super::answer::{json_text, JsonPieces, JsonText, Refusal};
use super::wire::Body;
use super::AppState;
use crate::contract::{
    ContextAnswer, CountAnswer, ForgetAnswer, GetAnswer, ImportAnswer, JournalAnswer, PromptAnswer,
    RecordsAnswer, ScopesAnswer, StatsAnswer, SweepAnswer, WindowAnswer, WriteAnswer,
};
use crate::memory::{build_context, reflect, shown_set};
use crate::model::{Record, ScopeKey};
use crate::reflect::reflection_prompt;
use crate::store::CheckedWrite;
use crate::store::{MemoryStore, WriteOptions};

/// `{records}` over shared records: [`RecordsAnswer`]'s bytes without copying them.
#[derive(serde::Serialize)]
struct SharedRecords<'a> {
    records: &'a [Arc<Record>],
}

/// Runs one request against the store (on a blocking thread): the answer's JSON text and the
/// log suffix, or the refusal.
pub(super) fn execute(
    state: &AppState,
    path: &str,
    body: Body,
) -> Result<(JsonText, String), Refusal> {
    let answered = match body {
        Body::Review { days, scope } => review_pieces(state, days, scope.as_ref()).map(Some),
        body => answer(state, body).map(|a| a.map(|(text, log)| (JsonText::Whole(text), log))),
    };
    match answered {
        Ok(Some(answered)) => Ok(answered),
        Ok(None) => Err(Refusal::bug(&format!(
            "{path} reached the routes that answer whole"
        ))),
        Err(e) => Err(Refusal::of_store(state, path, e)),
    }
}

/// `/review` answered whole, in its pieces (the MCP tool; HTTP streams a large one, see
/// [`review`]).
fn review_pieces(
    state: &AppState,
    days: u32,
    scope: Option<&crate::model::ScopeKey>,
) -> crate::error::Result<(JsonText, String)> {
    let mut pieces = Vec::new();
    let log = review(state, days, scope, &mut |piece| {
        pieces.push(piece);
        Ok(())
    })?;
    Ok((JsonText::Pieces(pieces), log))
}

/// `/review`: the answer's opening, then each scope's review written out as it is made and
/// dropped, then the fields after the scopes, handed to `sink` in pieces of about 64 KiB, so a
/// review of hundreds of scopes costs per scope what one of tens does and is sent while it is
/// made. The fields around the scopes are the serialized review's own (with no scopes): one
/// declaration of the answer's shape. The log suffix when done; an error from `sink` ends the
/// review with it.
pub(super) fn review(
    state: &AppState,
    days: u32,
    scope: Option<&crate::model::ScopeKey>,
    sink: &mut dyn FnMut(Bytes) -> crate::error::Result<()>,
) -> crate::error::Result<String> {
    let store = state.store.as_ref();
    let now = store.now();
    let mut out = JsonPieces::new(sink);
    let (head, _) = around_scopes(&crate::review::Review::opening(days, now))?;
    out.raw(&format!("{head}{SCOPES_OPEN}"));
    let r = crate::review::review_each(store, days, scope, now, &state.review, &mut |s| {
        out.push(&s)
    })?;
    // With no scopes, what follows the field's opening is `]` and the fields after it.
    let (_, tail) = around_scopes(&r)?;
    out.raw(&tail);
    out.finish()?;
    Ok(format!("days={days} fired={}", r.fired.len()))
}

/// A review's JSON text (its `scopes` empty) before and after the scopes field's opening.
fn around_scopes(r: &crate::review::Review) -> crate::error::Result<(String, String)> {
    let text = json_text(r)?;
    let (head, tail) = text
        .split_once(SCOPES_OPEN)
        .ok_or_else(|| crate::error::Error::format("the review's answer has no scopes field"))?;
    Ok((head.to_owned(), tail.to_owned()))
}

/// The opening of a review's scopes field, where the scopes written apart go.
const SCOPES_OPEN: &str = "\"scopes\":[";

/// The answer of every route but `/export` and `/review` (`None`: a body this does not
/// answer). Each answers with its typed contract body, serialized straight to text so every
/// number keeps the form JavaScript prints.
fn answer(state: &AppState, body: Body) -> crate::error::Result<Option<(String, String)>> {
    let store = state.store.as_ref();
    Ok(Some(match body {
        Body::Retrieve {
            scope,
            query,
            limit,
        } => {
            let records = store.retrieve_marked(&scope, &query, limit)?;
            let log = format!("{scope} records={}", records.len());
            (json_text(&RecordsAnswer { records })?, log)
        }
        Body::Write {
            write: checked,
            tally,
            rejected,
        } => {
            let options = WriteOptions {
                cap: checked.cap(),
                tally,
                rejected,
            };
            write(store, &checked, &options)?
        }
        Body::List { scope, query } => list(store, &scope, &query)?,
        Body::Forget { scope, id } => {
            let forgotten = store.forget(&scope, &id)?;
            let answer = ForgetAnswer {
                ok: true,
                forgotten,
            };
            (
                json_text(&answer)?,
                format!("{scope} forgotten={forgotten}"),
            )
        }
        Body::Sweep { scope, dry_run } => sweep(store, &scope, dry_run)?,
        Body::Get { id } => {
            let record = store.get(&id)?;
            let log = format!("found={}", record.is_some());
            (json_text(&GetAnswer { record })?, log)
        }
        Body::Scopes => {
            let scopes = store.scopes()?;
            let log = format!("scopes={}", scopes.len());
            (json_text(&ScopesAnswer { scopes })?, log)
        }
        Body::Count { scope } => {
            let active = store.active_count(&scope)?;
            let log = format!("{scope} active={active}");
            (json_text(&CountAnswer { active })?, log)
        }
        Body::Journal { scope, query } => {
            let decisions = store.decisions(&scope, &query)?;
            let log = format!("{scope} decisions={}", decisions.len());
            (json_text(&JournalAnswer { decisions })?, log)
        }
        Body::Window { scope } => window(state, &scope)?,
        Body::Import { records, decisions } => import(store, &records, &decisions)?,
        Body::Stats { since } => {
            let days = store.stats(since)?;
            let log = format!("days={}", days.len());
            (json_text(&StatsAnswer { days })?, log)
        }
        Body::Context { run, brief } => context(state, &run, &brief)?,
        Body::Prompt {
            run,
            request,
            answer,
            transcript,
        } => prompt(state, &run, &request, &answer, transcript)?,
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
            log::info!("{}", outcome.line());
            (json_text(&outcome)?, run.resource())
        }
        // Streamed by the handler, and written in pieces by `review`: never answered whole.
        Body::Export | Body::Review { .. } => return Ok(None),
    }))
}

/// An answer's JSON text and its log suffix.
type Answered = crate::error::Result<(String, String)>;

fn write(store: &dyn MemoryStore, checked: &CheckedWrite<'_>, options: &WriteOptions) -> Answered {
    let counts = store.write_checked(checked, options)?;
    let (c, scope) = (&counts, checked.scope());
    let log = format!(
        "{scope} inserted={} deduped={} restated={} superseded={} evicted={}",
        c.inserted, c.deduped, c.restated, c.superseded, c.evicted
    );
    Ok((json_text(&WriteAnswer { ok: true, counts })?, log))
}

fn list(store: &dyn MemoryStore, scope: &ScopeKey, query: &crate::store::ListQuery) -> Answered {
    if query.is_window() {
        // The hot read: serialized from the store's shared window, nothing copied.
        let window = store.window(scope, query.limit)?;
        let log = format!("{scope} records={}", window.len());
        return Ok((json_text(&SharedRecords { records: &window })?, log));
    }
    let records = store.list(scope, query)?;
    let log = format!("{scope} records={}", records.len());
    Ok((json_text(&RecordsAnswer { records })?, log))
}

fn sweep(store: &dyn MemoryStore, scope: &ScopeKey, dry_run: bool) -> Answered {
    let r = store.sweep(scope, dry_run)?;
    let log = format!("{scope} swept={} dry_run={dry_run}", r.swept);
    let answer = SweepAnswer {
        ok: true,
        swept: r.swept,
        ids: dry_run.then_some(r.ids),
    };
    Ok((json_text(&answer)?, log))
}

/// `/window`: the repository's window and the block a run gets from it.
fn window(state: &AppState, scope: &ScopeKey) -> Answered {
    let records = state
        .store
        .window(scope, state.context.repo_window.max(1))?;
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
        records: records.iter().map(|r| &**r).collect::<Vec<&Record>>(),
        kept: block.as_ref().map_or(0, |b| b.kept),
        block: block.map(|b| b.text),
    };
    Ok((json_text(&answer)?, format!("{scope} window")))
}

fn import(
    store: &dyn MemoryStore,
    records: &[Record],
    decisions: &[crate::decisions::Decision],
) -> Answered {
    let r = store.import(records)?;
    let journaled = store.import_decisions(decisions)?;
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
    Ok((json_text(&answer)?, log))
}

fn context(state: &AppState, run: &crate::context::RunScopes, brief: &str) -> Answered {
    let store = state.store.as_ref();
    let ctx = build_context(store, run, brief, &state.context, store.now());
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
    Ok((json_text(&answer)?, log))
}

fn prompt(
    state: &AppState,
    run: &crate::context::RunScopes,
    request: &str,
    answer: &str,
    transcript: Option<String>,
) -> Answered {
    let shown = shown_set(state.store.as_ref(), run, request, answer, &state.context)?;
    let transcript = transcript.unwrap_or_else(|| format!("{request}\n\n{answer}"));
    let p = reflection_prompt(&shown, &transcript);
    let log = format!("{} shown={}", run.resource(), p.shown.len());
    let answer = PromptAnswer {
        system: p.system,
        input: p.input,
        shown: p.shown,
    };
    Ok((json_text(&answer)?, log))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used, clippy::unwrap_used, clippy::indexing_slicing)]
    use std::sync::Arc;

    use super::{execute, json_text, JsonText};
    use crate::contract::PostRoute;
    use crate::decisions::RejectedFact;
    use crate::model::{Candidate, ScopeKey};
    use crate::review::{review, Thresholds};
    use crate::server::wire::Body;
    use crate::server::{AppState, Auth};
    use crate::store::{InMemoryStore, MemoryStore, WriteOptions};

    const NOW: i64 = 1_764_374_400_000; // 2025-11-29

    /// `POST /review` of `scope` (every scope when `None`) over `store`: the text and the log.
    fn answer_review(store: &Arc<dyn MemoryStore>, scope: Option<ScopeKey>) -> (JsonText, String) {
        let auth = Auth {
            token: Some("t".into()),
            read_token: None,
            open: false,
        };
        let state = AppState::new(Arc::clone(store), auth, Default::default());
        execute(
            &state,
            PostRoute::Review.path(),
            Body::Review { days: 7, scope },
        )
        .map_err(|r| r.reason().to_owned())
        .expect("answered")
    }

    /// The review written scope by scope, in pieces, is byte for byte the whole review's JSON
    /// text: the fields around the scopes in their place, commas between them, a lone
    /// surrogate written back as `\udXXX`, and no scope at all as `"scopes":[]`.
    #[test]
    fn the_review_in_pieces_is_the_whole_reviews_text() {
        let model = InMemoryStore::with_clock(Arc::new(|| NOW));
        // Enough scopes for several pieces; a rejected text holding a lone surrogate (U+D800,
        // in the form a parsed body carries it).
        let lone = "\u{FDD0}\u{FDE0}\u{FDE0}\u{FDE0}";
        for i in 0..400 {
            let scope = ScopeKey::parse(&format!("repo:acme/app{i}")).expect("scope");
            let options = WriteOptions {
                rejected: vec![RejectedFact {
                    text: format!("pushed {i} at sha 3f9a2c1 {lone} with the tests green"),
                    markers: vec!["sha".to_owned()],
                }],
                ..WriteOptions::default()
            };
            let lesson = Candidate::fact(format!("run the migrations first, app {i}"), "t");
            model.write(&scope, &[lesson], &options).expect("write");
        }
        let store: Arc<dyn MemoryStore> = Arc::new(model);
        let empty: Arc<dyn MemoryStore> = Arc::new(InMemoryStore::with_clock(Arc::new(|| NOW)));
        let one = ScopeKey::parse("repo:acme/app7").expect("scope");
        for (store, scope) in [(&store, None), (&store, Some(one)), (&empty, None)] {
            let whole = review(
                store.as_ref(),
                7,
                scope.as_ref(),
                NOW,
                &Thresholds::default(),
            )
            .expect("review");
            let expected = json_text(&whole).expect("json");
            let (text, log) = answer_review(store, scope);
            let JsonText::Pieces(pieces) = &text else {
                panic!("the review was answered whole");
            };
            if whole.scopes.len() > 1 {
                assert!(pieces.len() > 2, "{} pieces", pieces.len());
            }
            assert_eq!(text.into_string(), expected);
            assert_eq!(log, format!("days=7 fired={}", whole.fired.len()));
            if whole.scopes.is_empty() {
                assert!(expected.contains("\"scopes\":[]"), "{expected}");
            } else {
                assert!(expected.contains("\\ud800"), "{expected}");
            }
        }
    }
}
