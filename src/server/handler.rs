//! One request, start to finish: the contract's check order, the body, the store call on a
//! blocking thread, the JSON answer; the Worker's five routes (the others are in `extension`);
//! and `/export` as a stream.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::auth::{authorize, Access};
use super::metrics::metrics_response;
use super::wire::{Body, POST_ROUTES};
use super::{AppState, BODY_TIMEOUT, MAX_EXPORTS};
use crate::limits::MAX_BODY_BYTES;
use crate::store::WriteOptions;

pub(super) fn error(status: StatusCode, message: &str) -> Response {
    let answer = crate::contract::ErrorAnswer {
        error: message.to_owned(),
    };
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        crate::json::restore_lone(serde_json::to_string(&answer).unwrap_or_default()),
    )
        .into_response()
}

pub(super) fn ok_json(value: &impl serde::Serialize) -> Response {
    match serde_json::to_string(value) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            crate::json::restore_lone(body),
        )
            .into_response(),
        Err(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "could not encode the answer",
        ),
    }
}

pub(super) async fn handle(state: Arc<AppState>, req: Request) -> Response {
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

pub(super) fn known_path(path: &str) -> bool {
    path == "/healthz"
        || path == "/metrics"
        || page_asset(path).is_some()
        || POST_ROUTES.iter().any(|(p, _)| *p == path)
}

/// The page's files, embedded in the binary: (content type, body). They hold no data (the
/// page fetches everything with the token the person types), so they need no token.
fn page_asset(path: &str) -> Option<(&'static str, &'static str)> {
    match path {
        "/" => Some(("text/html; charset=utf-8", include_str!("page/index.html"))),
        "/app.js" => Some((
            "text/javascript; charset=utf-8",
            include_str!("page/app.js"),
        )),
        "/app.css" => Some(("text/css; charset=utf-8", include_str!("page/app.css"))),
        _ => None,
    }
}

/// Only the page's own files may load or be fetched; nothing inline, nothing from elsewhere,
/// and the page cannot be framed.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn page_response(content_type: &'static str, body: &'static str) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

fn too_large() -> Response {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("body must be at most {MAX_BODY_BYTES} bytes"),
    )
}

/// Decides the answer, and a log suffix (scope and counts, never text).
pub(super) async fn dispatch(state: &Arc<AppState>, req: Request) -> (Response, Option<String>) {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    // 404 before anything else, even without a token.
    // GET /healthz is answered before routing, as the reference Worker does: any other method
    // on it is an unknown route (404), not a wrong method.
    if path == "/healthz" && method != Method::GET {
        return (error(StatusCode::NOT_FOUND, "not found"), None);
    }
    let (get_route, post_route) = match path.as_str() {
        "/healthz" | "/metrics" => (true, None),
        p if page_asset(p).is_some() => (true, None),
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
    if let Some((content_type, body)) = page_asset(&path) {
        return (page_response(content_type, body), None);
    }
    if path == "/healthz" {
        return (healthz(state), None);
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
    let value = match read_body(req).await {
        Ok(value) => value,
        Err(refusal) => return refusal,
    };
    let body = match super::wire::parse(&path, &value) {
        Ok(b) => b,
        Err(reason) => return (error(StatusCode::BAD_REQUEST, &reason), None),
    };
    if matches!(body, Body::Export) {
        return export_response(state);
    }
    run(state, &path, body).await
}

/// `GET /healthz`: 200 while the store works, 503 with the reason once it failed.
fn healthz(state: &AppState) -> Response {
    if let Some(reason) = state.failure() {
        let body = json!({"ok": false, "error": format!("the store failed: {reason}")});
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response();
    }
    ok_json(&json!({"ok": true, "build": {"commit": state.commit}, "features": ["memory"]}))
}

/// The request's JSON body, or the refusal to answer: 411 without a plain numeric length, 413
/// over the fence, 408 when it is slow to arrive, 400 when it is not JSON.
async fn read_body(req: Request) -> Result<Value, (Response, Option<String>)> {
    // A plain digit string (RFC 9110), as the reference checks it: an absent header, a blank
    // one, or "+5" / "0x10" / "5e2" is 411; a well-formed length over the fence is 413, however
    // many digits it has.
    let length = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()));
    let Some(length) = length else {
        return Err((
            error(
                StatusCode::LENGTH_REQUIRED,
                "body must declare a numeric Content-Length",
            ),
            None,
        ));
    };
    if length.parse::<usize>().map_or(true, |n| n > MAX_BODY_BYTES) {
        return Err((too_large(), None));
    }
    let read = axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES);
    let bytes: Bytes = match tokio::time::timeout(BODY_TIMEOUT, read).await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => return Err((too_large(), None)),
        Err(_) => {
            return Err((
                error(
                    StatusCode::REQUEST_TIMEOUT,
                    "the body did not arrive within 10 seconds",
                ),
                Some("slow body".to_owned()),
            ))
        }
    };
    crate::json::decode(&bytes).ok_or_else(|| {
        (
            error(StatusCode::BAD_REQUEST, "body must be valid JSON"),
            None,
        )
    })
}

/// Runs a parsed request on a blocking thread: 200 with its answer, 400 when the store refuses
/// it, 500 (and a failed store, for a storage error) otherwise.
async fn run(state: &Arc<AppState>, path: &str, body: Body) -> (Response, Option<String>) {
    let worker = Arc::clone(state);
    match tokio::task::spawn_blocking(move || execute(&worker, body)).await {
        Ok(Ok((text, log))) => (
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                text,
            )
                .into_response(),
            Some(log),
        ),
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

/// `{records}` over shared records: [`RecordsAnswer`]'s bytes without copying them.
#[derive(serde::Serialize)]
struct SharedRecords<'a> {
    records: &'a [std::sync::Arc<crate::Record>],
}

pub(super) fn text(answer: &impl serde::Serialize) -> crate::Result<String> {
    serde_json::to_string(answer)
        .map(crate::json::restore_lone)
        .map_err(|e| crate::Error::format(format!("encoding the answer: {e}")))
}

/// Runs one request against the store (on a blocking thread). Returns the answer's JSON text
/// and a log suffix with the scope and counts. The Worker's routes answer with the typed
/// [`crate::contract`] bodies, serialized straight to text so every number keeps the form
/// JavaScript prints.
pub(super) fn execute(state: &AppState, body: Body) -> crate::Result<(String, String)> {
    use crate::contract::{ForgetAnswer, RecordsAnswer, SweepAnswer, WriteAnswer};
    let store = state.store.as_ref();
    Ok(match body {
        Body::Retrieve {
            scope,
            query,
            limit,
        } => {
            let records = store.retrieve_marked(&scope, &query, limit)?;
            let log = format!("{scope} records={}", records.len());
            (text(&RecordsAnswer { records })?, log)
        }
        Body::Write {
            scope,
            records,
            cap,
            tally,
            rejected,
        } => {
            let counts = store.write(
                &scope,
                &records,
                &WriteOptions {
                    cap,
                    tally,
                    rejected,
                },
            )?;
            let c = &counts;
            let log = format!(
                "{scope} inserted={} deduped={} restated={} superseded={} evicted={}",
                c.inserted, c.deduped, c.restated, c.superseded, c.evicted
            );
            (text(&WriteAnswer { ok: true, counts })?, log)
        }
        Body::List { scope, query } => {
            if query.is_window() {
                // The hot read: serialized from the store's shared window, nothing copied.
                let window = store.window(&scope, query.limit)?;
                let log = format!("{scope} records={}", window.len());
                return Ok((text(&SharedRecords { records: &window })?, log));
            }
            let records = store.list(&scope, &query)?;
            let log = format!("{scope} records={}", records.len());
            (text(&RecordsAnswer { records })?, log)
        }
        Body::Forget { scope, id } => {
            let forgotten = store.forget(&scope, &id)?;
            (
                text(&ForgetAnswer {
                    ok: true,
                    forgotten,
                })?,
                format!("{scope} forgotten={forgotten}"),
            )
        }
        Body::Sweep { scope, dry_run } => {
            let r = store.sweep(&scope, dry_run)?;
            let log = format!("{scope} swept={} dry_run={dry_run}", r.swept);
            let answer = SweepAnswer {
                ok: true,
                swept: r.swept,
                ids: dry_run.then_some(r.ids),
            };
            (text(&answer)?, log)
        }
        other => super::extension::execute(state, other)?,
    })
}

/// `/export` as a stream: `{"records":[` then each record as it is read, then `]}`. The records
/// are read on a thread of their own from one snapshot and handed over through a bounded
/// channel, so a slow reader holds a few chunks of memory and no store thread, and writes go
/// on. A reader that goes away stops the export.
pub(super) fn export_response(state: &Arc<AppState>) -> (Response, Option<String>) {
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
            let mut out = JsonArrays {
                chunk: Vec::with_capacity(CHUNK),
                first: true,
                tx: &tx,
            };
            out.chunk.extend_from_slice(b"{\"records\":[");
            let result = worker.store.export(&mut |r| out.push(&r)).and_then(|()| {
                // Then the decision journal, in the same answer.
                out.chunk.extend_from_slice(b"],\"decisions\":[");
                out.first = true;
                worker.store.export_decisions(&mut |d| out.push(&d))
            });
            let mut chunk = out.chunk;
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

const CHUNK: usize = 64 * 1024;

/// Comma-separated JSON values written into chunks, each full chunk handed to the channel
/// (blocking while the reader is slow: that is the bound on memory).
struct JsonArrays<'a> {
    chunk: Vec<u8>,
    first: bool,
    tx: &'a tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
}

impl JsonArrays<'_> {
    fn push(&mut self, value: &impl serde::Serialize) -> crate::Result<()> {
        if !self.first {
            self.chunk.push(b',');
        }
        self.first = false;
        let json = serde_json::to_string(value).map_err(|e| crate::Error::format(e.to_string()))?;
        self.chunk
            .extend_from_slice(crate::json::restore_lone(json).as_bytes());
        if self.chunk.len() >= CHUNK {
            let full = std::mem::replace(&mut self.chunk, Vec::with_capacity(CHUNK));
            self.tx
                .blocking_send(Ok(Bytes::from(full)))
                .map_err(|_| crate::Error::invalid("the reader went away"))?;
        }
        Ok(())
    }
}

/// A response body fed by a channel.
pub(super) struct ChannelBody(tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>);

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
