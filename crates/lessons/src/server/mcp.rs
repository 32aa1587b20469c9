//! The Model Context Protocol over the same store: the tools a coding agent calls and the
//! reflection prompt, over stdio (`lessons mcp`) and over streamable HTTP at `/mcp` on
//! `lessons serve` (feature `mcp`).
//!
//! A thin adapter, as an HTTP route is: each tool is a route of the contract (`lessons_context`
//! is `/context`, `lessons_search` is `/retrieve`, `lessons_window` is `/list` of facts,
//! `lessons_reflect` is `/reflect`, the prompt `lessons_reflection` is `/prompt`). Its arguments
//! are the route's JSON fields, parsed by the route's own parser (`server::wire`, the same
//! checks and words), executed by the route's own code (`server::routes`), and answered with the
//! route's JSON as the tool's structured content, plus text a model reads.
//!
//! No tool writes a fact directly: the design record (its decisions: docs/design.md) keeps
//! reflection over the whole transcript as the one writer, so the only write is
//! `lessons_reflect`, which takes an extractor's reply.
//!
//! **Invariant:** a tool's structured content is byte for byte the JSON its route answers for the
//! same fields on the same store.
//! **Invariant:** wrong arguments are JSON-RPC errors naming the field; what the route refuses
//! once its body is valid (a store's bound, a damaged store, a missing write right) is a tool
//! error with the route's own message; nothing panics.

use std::borrow::Cow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, GetPromptRequestParams,
    GetPromptResponse, GetPromptResult, Implementation, JsonObject, ListPromptsResult,
    ListToolsResult, PaginatedRequestParams, Prompt, PromptArgument, PromptMessage, Role,
    ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Map, Value};
use tokio::io::AsyncWrite;

use super::auth::Token;
use super::wire::{self, Body};
use super::AppState;
use crate::contract::{Access, PostRoute};
use crate::gate::rejection_marker_names;
use crate::limits::{MAX_BATCH, MAX_BODY_BYTES, MAX_TEXT_UNITS};
use crate::store::ListQuery;

/// How the `lessons_search` tool's `limit` defaults: the reference bot's own.
const SEARCH_LIMIT: u64 = 8;

/// The MCP server over one store (the server's state).
#[derive(Clone)]
pub(crate) struct Lessons {
    state: Arc<AppState>,
    /// Where a store call runs: on a blocking thread (the HTTP server's runtime, shared with
    /// every connection), or right here (stdio's own single thread, which serves one client:
    /// no thread to hand the call to and back).
    calls: Calls,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Calls {
    Blocking,
    Inline,
}

/// One tool: its name, what answers it, its description and its arguments.
#[derive(Clone, Copy)]
struct ToolSpec {
    name: &'static str,
    answer: Answer,
    description: &'static str,
    input: fn() -> Value,
}

/// What answers a tool: a route of the contract, or the gate (no route: it reads no store).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Answer {
    Route(PostRoute),
    Gate,
}

impl Answer {
    /// Whether a read-only token may call it.
    fn access(self) -> Access {
        match self {
            Answer::Route(r) => r.access(),
            Answer::Gate => Access::Read,
        }
    }
}

/// Every tool, in the order `tools/list` shows them. `lessons_gate` is answered here (no route).
const TOOLS: [ToolSpec; 5] = [
    ToolSpec {
        name: "lessons_context",
        answer: Answer::Route(PostRoute::Context),
        description: "The run's memory block: the repository's newest lessons, then keyword hits from the organization, channel and user scopes, within the token budget. Put it in the system prompt at the start of a run. The same bytes as `lessons context` and POST /context.",
        input: || {
            with_run(json!({
                "brief": {"type": "string", "description": "the run's brief: what the agent was asked to do"}
            }), &["brief"])
        },
    },
    ToolSpec {
        name: "lessons_search",
        answer: Answer::Route(PostRoute::Retrieve),
        description: "The best records of one scope for a query (keyword match, then recency), as POST /retrieve answers them. Counts as a use of each record returned.",
        input: || {
            json!({
                "type": "object",
                "properties": {
                    "scopeKey": {"type": "string", "description": "org:<org>, repo:<owner>/<name>, channel:<id> or user:<id>"},
                    "query": {"type": "string", "description": "words to match (at most 4000 UTF-16 units)"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 50, "description": "at most this many records (default 8)"}
                },
                "required": ["scopeKey", "query"]
            })
        },
    },
    ToolSpec {
        name: "lessons_window",
        answer: Answer::Route(PostRoute::List),
        description: "A repository's window: its newest lessons (facts), newest first, as every run in it sees them. Never counts as a use.",
        input: || {
            json!({
                "type": "object",
                "properties": {
                    "scopeKey": {"type": "string", "description": "the repository scope: repo:<owner>/<name>"}
                },
                "required": ["scopeKey"]
            })
        },
    },
    ToolSpec {
        name: "lessons_gate",
        answer: Answer::Gate,
        description: "The status and change-description markers each text carries (reference, sha, count, delivery, identifier, now, changed, unit, spec-row); a text with none may be a lesson. Writes nothing.",
        input: || {
            json!({
                "type": "object",
                "properties": {
                    "texts": {"type": "array", "items": {"type": "string"}, "maxItems": MAX_BATCH, "description": "the texts to check"}
                },
                "required": ["texts"]
            })
        },
    },
    ToolSpec {
        name: "lessons_reflect",
        answer: Answer::Route(PostRoute::Reflect),
        description: "Writes a run's lessons: the extractor model's reply to the lessons_reflection prompt, gated (status refused), routed to its scopes and written (restatements merge). Answers the [memory] outcome: offered, rejected, restated, inserted, deduped, summary. The one way a fact is written: there is no tool that writes a fact directly.",
        input: || {
            with_run(json!({
                "reply": {"type": "string", "description": "the model's reply to the lessons_reflection prompt, as it came"},
                "shown": {"type": "array", "description": "the prompt's shown handles (its _meta \"lessons/shown\"), to resolve the reply's pointers", "items": {"type": "object", "properties": {"handle": {"type": "string"}, "id": {"type": "string"}}, "required": ["handle", "id"]}},
                "runId": {"type": "string", "description": "the run's id, kept as each fact's sourceRunId"},
                "thread": {"type": "string", "description": "where the facts came from, kept as their sourceThreadKey (default \"server\")"},
                "origin": {"type": "string", "enum": ["public", "private", "dm", "machine"], "description": "where the run's content came from (default public); private and dm never write to the organization"}
            }), &["reply", "shown"])
        },
    },
];

/// The run's scopes and `more` properties, as an object schema requiring `required`.
fn with_run(more: Value, required: &[&str]) -> Value {
    let mut properties = json!({
        "org": {"type": "string", "description": "the organization, e.g. acme"},
        "repo": {"type": "string", "description": "the repository, e.g. acme/app"},
        "channel": {"type": "string", "description": "the channel, e.g. slack:C0123"},
        "user": {"type": "string", "description": "the user, e.g. slack:U0123"}
    });
    if let (Some(p), Value::Object(m)) = (properties.as_object_mut(), more) {
        p.extend(m);
    }
    let mut req = vec!["org"];
    req.extend_from_slice(required);
    json!({"type": "object", "properties": properties, "required": req})
}

/// The prompt's arguments: the run's scopes, what it was asked and answered, its transcript.
fn reflection_arguments() -> Vec<PromptArgument> {
    let arg = |name: &str, description: &str, required: bool| {
        PromptArgument::new(name)
            .with_description(description)
            .with_required(required)
    };
    vec![
        arg("org", "the organization, e.g. acme", true),
        arg("repo", "the repository, e.g. acme/app", false),
        arg("channel", "the channel, e.g. slack:C0123", false),
        arg("user", "the user, e.g. slack:U0123", false),
        arg("request", "what the run was asked", true),
        arg("answer", "what it answered", true),
        arg(
            "transcript",
            "the run's transcript (its tail is shown); request and answer when absent",
            false,
        ),
    ]
}

const PROMPT: &str = "lessons_reflection";

impl Lessons {
    fn new(state: Arc<AppState>, calls: Calls) -> Lessons {
        Lessons { state, calls }
    }

    /// The token the caller presented: over HTTP the handler puts it in the request's
    /// extensions; over stdio there is none, and the caller owns the store.
    fn token(cx: &RequestContext<RoleServer>) -> Token {
        cx.extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.extensions.get::<Token>().copied())
            .unwrap_or(Token::ReadWrite)
    }

    /// Runs `route` with `body` as the HTTP route does: its JSON text, or the reason it refused.
    async fn run(&self, route: PostRoute, body: Body) -> Result<Result<String, String>, ErrorData> {
        let state = Arc::clone(&self.state);
        let path = route.path();
        let done = match self.calls {
            Calls::Blocking => {
                let lanes = &self.state.lanes;
                let work = move || super::routes::execute(&state, path, body);
                lanes.call(super::lanes::Lane::of(route), work).await
            }
            Calls::Inline => Some(super::routes::execute(&state, path, body)),
        };
        match done {
            Some(Ok((text, log))) => {
                log::debug!("[mcp] {path} {log}");
                Ok(Ok(text.into_string()))
            }
            Some(Err(refusal)) => Ok(Err(refusal.reason().to_owned())),
            None => Err(ErrorData::internal_error("the request was cancelled", None)),
        }
    }
}

/// A route's JSON answer as a tool result: the JSON as structured content, and what a model
/// reads as text (the block, the `[memory]` line, or the JSON itself).
fn answered(route: PostRoute, text: &str) -> CallToolResult {
    let value: Value = crate::json::parse(text).unwrap_or(Value::Null);
    let read = match route {
        PostRoute::Context => value
            .get("block")
            .and_then(Value::as_str)
            .map_or_else(|| "(no memory for this run)".to_owned(), str::to_owned),
        PostRoute::Reflect => outcome_line(&value),
        PostRoute::Retrieve | PostRoute::List => records_text(&value),
        _ => text.to_owned(),
    };
    let mut result = CallToolResult::success(vec![ContentBlock::text(read)]);
    result.structured_content = Some(value);
    result
}

/// A records answer as a model reads it: one line per record, its text, id and source.
fn records_text(v: &Value) -> String {
    let records = v.get("records").and_then(Value::as_array);
    let lines: Vec<String> = records
        .into_iter()
        .flatten()
        .map(|r| {
            let field = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or_default();
            format!(
                "- {} ({}, source: {})",
                field("text"),
                field("id"),
                field("sourceThreadKey")
            )
        })
        .collect();
    if lines.is_empty() {
        "(no records)".to_owned()
    } else {
        lines.join("\n")
    }
}

/// The `[memory]` line of a reflection's JSON outcome (`ReflectionOutcome::line`, read back).
fn outcome_line(v: &Value) -> String {
    if let Some(why) = v.get("error").and_then(Value::as_str) {
        return format!("[memory] reflection output rejected ({why}); nothing written");
    }
    let n = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    format!(
        "[memory] offered {}, rejected {}, restated {}, inserted {}, deduped {}, summary {}",
        n("offered"),
        n("rejected"),
        n("restated"),
        n("inserted"),
        n("deduped"),
        n("summary")
    )
}

/// `lessons_gate`: each text's markers (`{"verdicts": [{"markers": [...]}]}`, the CLI's
/// `--json-lines` answer per text), or the reason the arguments are wrong.
fn gate(args: &Map<String, Value>) -> Result<CallToolResult, ErrorData> {
    let texts = match args.get("texts") {
        Some(Value::Array(list)) => list,
        Some(_) => return Err(invalid("texts must be an array of strings")),
        None => return Err(invalid("texts is required")),
    };
    if texts.len() > MAX_BATCH {
        return Err(invalid(format!(
            "texts must hold at most {MAX_BATCH} texts"
        )));
    }
    let mut verdicts = Vec::with_capacity(texts.len());
    let mut lines = Vec::with_capacity(texts.len());
    for (i, t) in texts.iter().enumerate() {
        let Some(t) = t.as_str() else {
            return Err(invalid(format!("texts[{i}] must be a string")));
        };
        if crate::text::utf16_len(t) > MAX_TEXT_UNITS {
            return Err(invalid(format!(
                "texts[{i}] must be at most {MAX_TEXT_UNITS} UTF-16 units"
            )));
        }
        let markers = rejection_marker_names(t);
        lines.push(if markers.is_empty() {
            "lesson".to_owned()
        } else {
            markers.join(", ")
        });
        verdicts.push(json!({ "markers": markers }));
    }
    let mut result = CallToolResult::success(vec![ContentBlock::text(lines.join("\n"))]);
    result.structured_content = Some(json!({ "verdicts": verdicts }));
    Ok(result)
}

fn invalid(reason: impl Into<Cow<'static, str>>) -> ErrorData {
    ErrorData::invalid_params(reason, None)
}

/// The arguments as the route's body, bounded as the route bounds its body.
fn body_of(args: Map<String, Value>) -> Result<Value, ErrorData> {
    let value = Value::Object(args);
    let size = serde_json::to_vec(&value).map_or(usize::MAX, |b| b.len());
    if size > MAX_BODY_BYTES {
        return Err(invalid(format!(
            "arguments must be at most {MAX_BODY_BYTES} bytes of JSON"
        )));
    }
    Ok(value)
}

/// The tools the caller may call: a read-only token sees only the tools that write nothing.
fn tools_for(token: Token) -> Vec<Tool> {
    TOOLS
        .iter()
        .filter(|t| token == Token::ReadWrite || t.answer.access() == Access::Read)
        .map(|t| {
            let schema = match (t.input)() {
                Value::Object(m) => m,
                _ => JsonObject::new(),
            };
            let read_only = t.answer.access() == Access::Read;
            Tool::new(t.name, t.description, Arc::new(schema)).with_annotations(
                ToolAnnotations::new()
                    .read_only(read_only)
                    .destructive(false)
                    .idempotent(read_only)
                    .open_world(false),
            )
        })
        .collect()
}

impl ServerHandler for Lessons {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_prompts()
                .build(),
        )
        .with_server_info(Implementation::new("lessons", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Memory of lessons, not status, per repository. At the start of a run call lessons_context with the run's org, repo and brief, and put its block in the system prompt. At the end, get the lessons_reflection prompt with the run's request, answer and transcript, run it on your model, and pass the model's reply and the prompt's shown handles to lessons_reflect: it gates, routes and writes what the run learned. No tool writes a fact directly.",
        )
    }

    async fn list_tools(
        &self,
        _page: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools_for(Self::token(&cx))))
    }

    async fn call_tool(
        &self,
        req: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(spec) = TOOLS.iter().find(|t| t.name == req.name) else {
            return Err(invalid(format!(
                "unknown tool {:?}; the tools are {}",
                req.name,
                TOOLS.map(|t| t.name).join(", ")
            )));
        };
        let args = req.arguments.unwrap_or_default();
        let route = match spec.answer {
            Answer::Gate => return gate(&args).map(Into::into),
            Answer::Route(route) => route,
        };
        if route.access() == Access::Write && Self::token(&cx) != Token::ReadWrite {
            // The route's own answer to a read-only token.
            return Ok(CallToolResult::error(vec![ContentBlock::text("forbidden")]).into());
        }
        let body = match route {
            PostRoute::Retrieve => {
                let mut args = args;
                args.entry("limit").or_insert(json!(SEARCH_LIMIT));
                wire::parse(route, &body_of(args)?)
            }
            PostRoute::List => {
                // The window read: a repository's newest facts, as many as a run is shown.
                let scope = wire::parse(PostRoute::Count, &body_of(args)?).map(|b| match b {
                    Body::Count { scope } => Some(scope),
                    _ => None,
                });
                match scope {
                    Ok(Some(scope)) => Ok(Body::List {
                        scope,
                        query: ListQuery::window(self.state.context.repo_window.max(1)),
                    }),
                    Ok(None) => return Err(invalid("scopeKey is required")),
                    Err(e) => Err(e),
                }
            }
            route => wire::parse(route, &body_of(args)?),
        };
        let body = body.map_err(invalid)?;
        let result = match self.run(route, body).await? {
            Ok(text) => answered(route, &text),
            Err(reason) => CallToolResult::error(vec![ContentBlock::text(reason)]),
        };
        Ok(result.into())
    }

    async fn list_prompts(
        &self,
        _page: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Ok(ListPromptsResult::with_all_items(vec![Prompt::new(
            PROMPT,
            Some("The extractor prompt for one finished run: the instructions, the records the run was shown by handle, and its transcript's tail. Run it on your model, then pass the reply and this prompt's shown handles (its _meta \"lessons/shown\") to lessons_reflect. The same as POST /prompt."),
            Some(reflection_arguments()),
        )]))
    }

    async fn get_prompt(
        &self,
        req: GetPromptRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        if req.name != PROMPT {
            return Err(invalid(format!(
                "unknown prompt {:?}; the prompt is {PROMPT}",
                req.name
            )));
        }
        let args = req.arguments.unwrap_or_default();
        let body = wire::parse(PostRoute::Prompt, &body_of(args)?).map_err(invalid)?;
        // A refusal past the body's checks is the store's: the prompt cannot be built.
        let text = self
            .run(PostRoute::Prompt, body)
            .await?
            .map_err(|why| ErrorData::internal_error(why, None))?;
        let answer: Value = crate::json::parse(&text).unwrap_or(Value::Null);
        let field = |k: &str| {
            answer
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let mut result = GetPromptResult::new(vec![
            PromptMessage::new_text(Role::User, field("system")),
            PromptMessage::new_text(Role::User, field("input")),
        ])
        .with_description(
            "Run these messages on your model (the first is the system instructions); pass its reply and _meta \"lessons/shown\" to lessons_reflect.",
        );
        let mut meta = rmcp::model::MetaObject::new();
        meta.0.insert(
            "lessons/shown".to_owned(),
            answer.get("shown").cloned().unwrap_or(json!([])),
        );
        result.meta = Some(meta);
        Ok(result.into())
    }
}

/// Serves MCP over this process's stdin and stdout until the client closes either; `Ok` then,
/// whatever the client did. Runs on a current-thread runtime: store calls run inline.
pub async fn serve_mcp_stdio(state: Arc<AppState>) -> std::io::Result<()> {
    let closed = Arc::new(tokio::sync::Notify::new());
    // Pipes (how MCP clients start a server) are read and written on the IO reactor, not the
    // blocking pool: no thread hand-off per message, and a read that can be cancelled.
    let (stdin, stdout) = rmcp::transport::stdio_pipes();
    let stdout = Watched {
        inner: stdout,
        closed: Arc::clone(&closed),
    };
    let running = match Lessons::new(state, Calls::Inline)
        .serve((stdin, stdout))
        .await
    {
        Ok(running) => running,
        // The client went away before the handshake: nothing to serve.
        Err(e) => {
            log::info!("[mcp] no session: {e}");
            return Ok(());
        }
    };
    let session = running.cancellation_token();
    tokio::select! {
        ended = running.waiting() => match ended {
            Ok(reason) => log::info!("[mcp] session ended: {reason:?}"),
            Err(e) => log::warn!("[mcp] session ended: {e}"),
        },
        // An answer that cannot be written means the client stopped reading: the session is
        // over, as it is when stdin closes.
        () = closed.notified() => {
            log::info!("[mcp] session ended: stdout closed");
            session.cancel();
        }
    }
    Ok(())
}

/// A writer that says when a write fails (the reader closed its end).
struct Watched<W> {
    inner: W,
    closed: Arc<tokio::sync::Notify>,
}

impl<W> Watched<W> {
    fn watch<T>(&self, r: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        if let Poll::Ready(Err(_)) = &r {
            self.closed.notify_one();
        }
        r
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Watched<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.watch(r)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        this.watch(r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.watch(r)
    }
}

/// The streamable HTTP service answering `/mcp`: stateless, each POST answered with JSON. The
/// handler authorizes the request first and leaves its token in the request's extensions.
pub(crate) fn http_service(
    state: &Arc<AppState>,
) -> rmcp::transport::StreamableHttpService<
    Lessons,
    rmcp::transport::streamable_http_server::session::never::NeverSessionManager,
> {
    use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
    // The handler has already decided who may call, as for every route: the token, or without
    // one the request's `Host` and `Origin` (`auth::local_caller`, against a web page and DNS
    // rebinding). The service's own checks of them would be a second rule to keep in step.
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_max_request_body_bytes(MAX_BODY_BYTES)
        .disable_allowed_hosts()
        .disable_allowed_origins();
    let lessons = Lessons::new(Arc::clone(state), Calls::Blocking);
    StreamableHttpService::new(
        move || Ok(lessons.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    )
}
