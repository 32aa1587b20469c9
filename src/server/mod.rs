//! The HTTP server: the memory Worker's wire contract over one store.
//!
//! One catch-all handler decides every answer in the contract's order: unknown path 404 (before
//! auth), wrong method 405, missing or wrong bearer 401 (constant-time comparison; no token
//! configured refuses everything unless the server was started without auth), read-only token
//! on a mutating route 403, missing length 411, body over 512 KiB 413, bad JSON 400
//! `{"error":"body must be valid JSON"}`, failed validation 400 with the reason. Store calls run
//! on blocking threads, never on the async workers.
//!
//! **Invariant:** only this module knows HTTP.
//! **Invariant:** no log line carries record text, a query or a token.

mod conn;
pub mod wire;

pub use conn::Limits;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::Request;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::context::ContextConfig;
use crate::memory::{build_context, reflect, shown_set};
use crate::reflect::reflection_prompt;
use crate::store::{day_of, format_day, system_clock, MemoryStore, WriteOptions};
use wire::{Body, POST_ROUTES};

pub use crate::model::MAX_BODY_BYTES;

/// Who may do what.
#[derive(Clone, Debug, Default)]
pub struct Auth {
    /// The read-write bearer token (`MEMORY_TOKEN`).
    pub token: Option<String>,
    /// An optional read-only bearer token (`MEMORY_READ_TOKEN`).
    pub read_token: Option<String>,
    /// No token is required (only ever on a loopback address).
    pub open: bool,
}

/// What the server shares between requests.
pub struct AppState {
    store: Arc<dyn MemoryStore>,
    auth: Auth,
    context: ContextConfig,
    commit: String,
    metrics: Mutex<Metrics>,
    /// Set when the store failed at the disk: `/healthz` answers 503 from then on and the
    /// server shuts down, so its supervisor restarts it on a store that reopens cleanly.
    failure: Mutex<Option<String>>,
    failed: tokio::sync::Notify,
    /// Exports streaming now (each holds a thread and a snapshot).
    exports: std::sync::atomic::AtomicUsize,
}

/// Exports that may stream at once; each runs on its own thread, off the store threads.
pub const MAX_EXPORTS: usize = 2;
/// Time a request body may take to arrive.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why `serve` returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServeEnd {
    /// SIGTERM or SIGINT.
    Signal,
    /// The store failed at the disk (the reason); the caller should exit non-zero.
    StoreFailed(String),
}

impl AppState {
    /// A server over `store`.
    pub fn new(store: Arc<dyn MemoryStore>, auth: Auth, context: ContextConfig) -> Arc<AppState> {
        Arc::new(AppState {
            store,
            auth,
            context,
            commit: option_env!("LESSONS_BUILD_COMMIT")
                .unwrap_or("unknown")
                .to_owned(),
            metrics: Mutex::new(Metrics::default()),
            failure: Mutex::new(None),
            failed: tokio::sync::Notify::new(),
            exports: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// The store's disk failure, if one happened.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().clone()
    }

    /// Records a disk failure once: logs the cause and starts the shutdown.
    fn fail(&self, reason: &str) {
        let mut f = self.failure.lock();
        if f.is_none() {
            log::error!(
                "[store] failed at the disk: {reason}; /healthz now answers 503 and the server shuts down so its supervisor can restart it"
            );
            *f = Some(reason.to_owned());
            self.failed.notify_one();
        }
    }
}

/// Latency histogram bucket bounds, in seconds.
const BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

#[derive(Default)]
struct Metrics {
    requests: BTreeMap<(String, u16), u64>,
    latency: BTreeMap<String, Histogram>,
}

impl Metrics {
    fn observe(&mut self, route: &str, status: u16, seconds: f64) {
        *self.requests.entry((route.to_owned(), status)).or_default() += 1;
        let h = self.latency.entry(route.to_owned()).or_default();
        for (i, bound) in BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                h.counts[i] += 1;
            }
        }
        h.count += 1;
        h.sum += seconds;
    }
}

/// The router: one handler decides every answer (see the module docs).
pub fn router(state: Arc<AppState>) -> Router {
    Router::new().fallback(move |req: Request| {
        let state = Arc::clone(&state);
        async move { handle(state, req).await }
    })
}

fn error(status: StatusCode, message: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        json!({ "error": message }).to_string(),
    )
        .into_response()
}

fn ok_json(value: &impl serde::Serialize) -> Response {
    match serde_json::to_string(value) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "could not encode the answer",
        ),
    }
}

/// Compares without an early exit, so the time taken does not say how much of a guess matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0xff);
    }
    diff == 0
}

enum Access {
    ReadWrite,
    ReadOnly,
}

fn authorize(auth: &Auth, headers: &HeaderMap) -> Option<Access> {
    if auth.open {
        return Some(Access::ReadWrite);
    }
    let presented = headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")?
        .as_bytes();
    if auth
        .token
        .as_deref()
        .is_some_and(|t| constant_time_eq(presented, t.as_bytes()))
    {
        return Some(Access::ReadWrite);
    }
    if auth
        .read_token
        .as_deref()
        .is_some_and(|t| constant_time_eq(presented, t.as_bytes()))
    {
        return Some(Access::ReadOnly);
    }
    None
}

async fn handle(state: Arc<AppState>, req: Request) -> Response {
    let started = Instant::now();
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let (response, log) = dispatch(&state, req).await;
    let status = response.status().as_u16();
    let route = if known_path(&path) {
        path.as_str()
    } else {
        "other"
    };
    state
        .metrics
        .lock()
        .observe(route, status, started.elapsed().as_secs_f64());
    log::info!(
        "[http] {method} {route} {status} {:.1}ms{}",
        started.elapsed().as_secs_f64() * 1000.0,
        log.map(|l| format!(" {l}")).unwrap_or_default()
    );
    response
}

fn known_path(path: &str) -> bool {
    path == "/healthz" || path == "/metrics" || POST_ROUTES.iter().any(|(p, _)| *p == path)
}

/// Decides the answer, and a log suffix (scope and counts, never text).
async fn dispatch(state: &Arc<AppState>, req: Request) -> (Response, Option<String>) {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    // 404 before anything else, even without a token.
    let (get_route, post_route) = match path.as_str() {
        "/healthz" | "/metrics" => (true, None),
        p => match POST_ROUTES.iter().find(|(r, _)| *r == p) {
            Some(&(_, mutating)) => (false, Some(mutating)),
            None => return (error(StatusCode::NOT_FOUND, "not found"), None),
        },
    };
    let expected = if get_route { Method::GET } else { Method::POST };
    if method != expected {
        return (
            error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"),
            None,
        );
    }
    if path == "/healthz" {
        if let Some(reason) = state.failure() {
            let body = json!({"ok": false, "error": format!("the store failed: {reason}")});
            return (
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(header::CONTENT_TYPE, "application/json")],
                    body.to_string(),
                )
                    .into_response(),
                None,
            );
        }
        return (
            ok_json(
                &json!({"ok": true, "build": {"commit": state.commit}, "features": ["memory"]}),
            ),
            None,
        );
    }
    let access = match authorize(&state.auth, req.headers()) {
        Some(a) => a,
        None => return (error(StatusCode::UNAUTHORIZED, "unauthorized"), None),
    };
    if path == "/metrics" {
        return (metrics_response(state).await, None);
    }
    if post_route == Some(true) && matches!(access, Access::ReadOnly) {
        return (error(StatusCode::FORBIDDEN, "forbidden"), None);
    }
    let length = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let Some(length) = length else {
        return (
            error(StatusCode::LENGTH_REQUIRED, "a Content-Length is required"),
            None,
        );
    };
    if length > MAX_BODY_BYTES {
        return (
            error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body must be at most 512 KiB",
            ),
            None,
        );
    }
    let read = axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES);
    let bytes: Bytes = match tokio::time::timeout(BODY_TIMEOUT, read).await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => {
            return (
                error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body must be at most 512 KiB",
                ),
                None,
            )
        }
        Err(_) => {
            return (
                error(
                    StatusCode::REQUEST_TIMEOUT,
                    "the body did not arrive within 10 seconds",
                ),
                Some("slow body".to_owned()),
            )
        }
    };
    let Ok(value) = serde_json::from_slice::<Value>(&bytes) else {
        return (
            error(StatusCode::BAD_REQUEST, "body must be valid JSON"),
            None,
        );
    };
    let body = match wire::parse(&path, &value) {
        Ok(b) => b,
        Err(reason) => return (error(StatusCode::BAD_REQUEST, &reason), None),
    };
    if matches!(body, Body::Export) {
        return export_response(state);
    }
    let worker = Arc::clone(state);
    match tokio::task::spawn_blocking(move || execute(&worker, body)).await {
        Ok(Ok((value, log))) => (ok_json(&value), Some(log)),
        Ok(Err(e)) if e.is_invalid() => (error(StatusCode::BAD_REQUEST, e.message()), None),
        Ok(Err(e)) => {
            log::error!("[http] {path} failed: {e}");
            if e.kind() == crate::ErrorKind::Storage {
                state.fail(e.message());
            }
            (
                error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the store failed; see the server log",
                ),
                None,
            )
        }
        Err(_) => (
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the request was cancelled",
            ),
            None,
        ),
    }
}

/// Runs one request against the store (on a blocking thread). Returns the answer and a log
/// suffix with the scope and counts.
fn execute(state: &AppState, body: Body) -> crate::Result<(Value, String)> {
    let store = state.store.as_ref();
    Ok(match body {
        Body::Retrieve {
            scope,
            query,
            limit,
        } => {
            let records = store.retrieve(&scope, &query, limit)?;
            let log = format!("{scope} records={}", records.len());
            (json!({ "records": records }), log)
        }
        Body::Write {
            scope,
            records,
            cap,
            tally,
        } => {
            let c = store.write(&scope, &records, &WriteOptions { cap, tally })?;
            let log = format!(
                "{scope} inserted={} deduped={} restated={} superseded={} evicted={}",
                c.inserted, c.deduped, c.restated, c.superseded, c.evicted
            );
            (
                json!({"ok": true, "inserted": c.inserted, "deduped": c.deduped, "restated": c.restated, "superseded": c.superseded, "evicted": c.evicted}),
                log,
            )
        }
        Body::List { scope, query } => {
            let records = store.list(&scope, &query)?;
            let log = format!("{scope} records={}", records.len());
            (json!({ "records": records }), log)
        }
        Body::Forget { scope, id } => {
            let forgotten = store.forget(&scope, &id)?;
            (
                json!({"ok": true, "forgotten": forgotten}),
                format!("{scope} forgotten={forgotten}"),
            )
        }
        Body::Sweep { scope, dry_run } => {
            let r = store.sweep(&scope, dry_run)?;
            let log = format!("{scope} swept={} dry_run={dry_run}", r.swept);
            if dry_run {
                (json!({"ok": true, "swept": r.swept, "ids": r.ids}), log)
            } else {
                (json!({"ok": true, "swept": r.swept}), log)
            }
        }
        Body::Get { id } => {
            let record = store.get(&id)?;
            let found = record.is_some();
            (json!({ "record": record }), format!("found={found}"))
        }
        Body::Scopes => {
            let scopes = store.scopes()?;
            let n = scopes.len();
            (json!({ "scopes": scopes }), format!("scopes={n}"))
        }
        Body::Export => {
            // Answered by `export_response`, streaming; kept for completeness.
            let mut records = Vec::new();
            store.export(&mut |r| {
                records.push(r);
                Ok(())
            })?;
            let n = records.len();
            (json!({ "records": records }), format!("records={n}"))
        }
        Body::Import { records } => {
            let r = store.import(&records)?;
            (
                json!({"ok": true, "imported": r.imported, "skipped": r.skipped}),
                format!("imported={} skipped={}", r.imported, r.skipped),
            )
        }
        Body::Stats { since } => {
            let days = store.stats(since)?;
            let n = days.len();
            (json!({ "days": days }), format!("days={n}"))
        }
        Body::Context { run, brief } => {
            let ctx = build_context(store, &run, &brief, &state.context, system_clock()());
            for w in &ctx.warnings {
                log::warn!("{w}");
            }
            let mut answer = json!({"kept": ctx.records.len(), "fromWindow": ctx.from_window});
            if let Some(block) = ctx.block {
                answer["block"] = Value::String(block);
            }
            (
                answer,
                format!(
                    "{} kept={} window={}",
                    run.resource(),
                    ctx.records.len(),
                    ctx.from_window
                ),
            )
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
            let n = p.shown.len();
            (
                json!({"system": p.system, "input": p.input, "shown": p.shown}),
                format!("{} shown={n}", run.resource()),
            )
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
            (
                serde_json::to_value(&outcome).map_err(|e| crate::Error::format(e.to_string()))?,
                run.resource(),
            )
        }
    })
}

/// `/export` as a stream: `{"records":[` then each record as it is read, then `]}`. The records
/// are read on a thread of their own from one snapshot and handed over through a bounded
/// channel, so a slow reader holds a few chunks of memory and no store thread, and writes go
/// on. A reader that goes away stops the export.
fn export_response(state: &Arc<AppState>) -> (Response, Option<String>) {
    use std::sync::atomic::Ordering;
    if state.exports.fetch_add(1, Ordering::SeqCst) >= MAX_EXPORTS {
        state.exports.fetch_sub(1, Ordering::SeqCst);
        return (
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many exports are running; try again when one has finished",
            ),
            None,
        );
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    let worker = Arc::clone(state);
    let spawned = std::thread::Builder::new()
        .name("lessons-export".into())
        .spawn(move || {
            let mut chunk = Vec::with_capacity(64 * 1024);
            chunk.extend_from_slice(b"{\"records\":[");
            let mut first = true;
            let result = worker.store.export(&mut |r| {
                if !first {
                    chunk.push(b',');
                }
                first = false;
                serde_json::to_writer(&mut chunk, &r)
                    .map_err(|e| crate::Error::format(e.to_string()))?;
                if chunk.len() >= 64 * 1024 {
                    let full = std::mem::replace(&mut chunk, Vec::with_capacity(64 * 1024));
                    tx.blocking_send(Ok(Bytes::from(full)))
                        .map_err(|_| crate::Error::invalid("the reader went away"))?;
                }
                Ok(())
            });
            match result {
                Ok(()) => {
                    chunk.extend_from_slice(b"]}");
                    let _ = tx.blocking_send(Ok(Bytes::from(chunk)));
                }
                Err(e) if e.is_invalid() => {}
                Err(e) => {
                    // The status is sent already: cut the body so the reader sees it incomplete.
                    log::error!("[http] /export failed: {e}");
                    let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
                }
            }
            worker.exports.fetch_sub(1, Ordering::SeqCst);
        });
    if spawned.is_err() {
        state.exports.fetch_sub(1, Ordering::SeqCst);
        return (
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "could not start the export thread",
            ),
            None,
        );
    }
    let body = axum::body::Body::new(ChannelBody(rx));
    (
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Some("streaming".to_owned()),
    )
}

/// A response body fed by a channel.
struct ChannelBody(tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        self.get_mut()
            .0
            .poll_recv(cx)
            .map(|o| o.map(|r| r.map(http_body::Frame::data)))
    }
}

async fn metrics_response(state: &Arc<AppState>) -> Response {
    let worker = Arc::clone(state);
    let days = tokio::task::spawn_blocking(move || worker.store.stats(i64::MIN)).await;
    let mut out = String::new();
    out.push_str("# HELP lessons_requests_total Requests by route and status.\n# TYPE lessons_requests_total counter\n");
    let (requests, latency) = {
        let m = state.metrics.lock();
        let requests: Vec<((String, u16), u64)> =
            m.requests.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let latency: Vec<(String, [u64; BUCKETS.len()], u64, f64)> = m
            .latency
            .iter()
            .map(|(k, h)| (k.clone(), h.counts, h.count, h.sum))
            .collect();
        (requests, latency)
    };
    for ((route, status), n) in requests {
        out.push_str(&format!(
            "lessons_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}\n"
        ));
    }
    out.push_str("# HELP lessons_request_seconds Request latency by route.\n# TYPE lessons_request_seconds histogram\n");
    for (route, counts, count, sum) in latency {
        for (bound, c) in BUCKETS.iter().zip(counts) {
            out.push_str(&format!(
                "lessons_request_seconds_bucket{{route=\"{route}\",le=\"{bound}\"}} {c}\n"
            ));
        }
        out.push_str(&format!(
            "lessons_request_seconds_bucket{{route=\"{route}\",le=\"+Inf\"}} {count}\n"
        ));
        out.push_str(&format!(
            "lessons_request_seconds_sum{{route=\"{route}\"}} {sum}\n"
        ));
        out.push_str(&format!(
            "lessons_request_seconds_count{{route=\"{route}\"}} {count}\n"
        ));
    }
    if let Ok(Ok(days)) = days {
        let mut totals: BTreeMap<String, crate::store::DayCounters> = BTreeMap::new();
        for d in days {
            totals
                .entry(d.scope_key.as_str().to_owned())
                .or_default()
                .merge(&d.counters);
        }
        out.push_str("# HELP lessons_memory_total What the store did, per scope, since it was created.\n# TYPE lessons_memory_total counter\n");
        for (scope, c) in totals {
            let scope = scope.replace('\\', "\\\\").replace('"', "\\\"");
            for (name, n) in c.events() {
                out.push_str(&format!(
                    "lessons_memory_total{{scope=\"{scope}\",event=\"{name}\"}} {n}\n"
                ));
            }
            for (marker, n) in &c.rejected_by {
                out.push_str(&format!(
                    "lessons_memory_rejected_total{{scope=\"{scope}\",marker=\"{marker}\"}} {n}\n"
                ));
            }
        }
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        out,
    )
        .into_response()
}

/// One `[memory] day …` line per scope for `day`: counts only.
pub fn rollup_lines(store: &dyn MemoryStore, day: i64) -> crate::Result<Vec<String>> {
    Ok(store
        .stats(day)?
        .into_iter()
        .filter(|d| d.day == format_day(day))
        .map(|d| {
            format!(
                "[memory] day {} {}: {}",
                d.day,
                d.scope_key,
                d.counters.line(false)
            )
        })
        .collect())
}

/// Serves `state` on `addr` until SIGTERM or SIGINT, or until the store fails at the disk;
/// in-flight requests finish first. Logs the day's rollup per scope at each UTC day change.
/// Calls `ready` with the bound address.
pub async fn serve(
    state: Arc<AppState>,
    addr: SocketAddr,
    limits: Limits,
    ready: impl FnOnce(SocketAddr),
) -> std::io::Result<ServeEnd> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    ready(listener.local_addr()?);
    let rollup_state = Arc::clone(&state);
    let rollup = tokio::spawn(async move {
        let mut today = day_of(system_clock()());
        loop {
            tokio::time::sleep(Duration::from_secs(30)).await;
            let now = day_of(system_clock()());
            if now != today {
                let store = Arc::clone(&rollup_state.store);
                let finished = today;
                if let Ok(Ok(lines)) =
                    tokio::task::spawn_blocking(move || rollup_lines(store.as_ref(), finished))
                        .await
                {
                    for line in lines {
                        log::info!("{line}");
                    }
                }
                today = now;
            }
        }
    });
    let watcher = Arc::clone(&state);
    let stop = async move {
        tokio::select! {
            () = shutdown_signal() => {}
            () = watcher.failed.notified() => {
                log::warn!("[http] shutting down: the store failed; finishing in-flight requests");
            }
        }
    };
    conn::serve_on(listener, router(Arc::clone(&state)), limits, stop).await;
    rollup.abort();
    Ok(match state.failure() {
        Some(reason) => ServeEnd::StoreFailed(reason),
        None => ServeEnd::Signal,
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    log::warn!("[http] shutting down: finishing in-flight requests");
}

/// Store calls at once: a few per core. More blocking threads only oversubscribe the cores (the
/// store's work is CPU and fsync, not waiting), which measured as a longer latency tail.
pub const STORE_THREADS: usize = 3;

/// The server's runtime: async workers per core, and a small pool for store calls.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(STORE_THREADS)
        .build()
}

/// A server on a background thread, for tests and embedding: the address it listens on, and a
/// handle that stops it when dropped.
pub struct Background {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Background {
    /// Starts serving `state` on 127.0.0.1 at a free port.
    pub fn start(state: Arc<AppState>) -> std::io::Result<Background> {
        let runtime = runtime()?;
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("lessons-server".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(std_listener) else {
                        return;
                    };
                    conn::serve_on(listener, router(state), Limits::default(), async {
                        let _ = rx.await;
                    })
                    .await;
                });
            })?;
        Ok(Background {
            addr,
            stop: Some(tx),
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
