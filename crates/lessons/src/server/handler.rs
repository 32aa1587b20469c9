//! One request, start to finish: the route from the contract's table, the checks in the
//! contract's order, the body, the store call on a blocking thread (`routes`), and the answer;
//! `/export` as a stream; the page's files.
//!
//! **Invariant:** the checks run in this order: unknown path 404 (before auth); on a server
//! without a token, a `Host` or `Origin` that is not its own 403 (`auth::local_caller`: every
//! route and method, `/mcp` included); wrong method 405, missing or wrong bearer 401, a
//! read-only token on a write route 403, no length 411, too long 413, slow 408, not JSON 400,
//! failed validation 400 with the reason. No check before the 408 reads the body.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::answer::{json_response, Answer, JsonPieces, JsonText, Refusal};
use super::auth::{authorize, local_caller, Token};
use super::conn::Listening;
use super::metrics::metrics_response;
use super::wire::Body;
use super::{AppState, BODY_TIMEOUT, MAX_EXPORTS};
use crate::contract::{Access, GetRoute, PostRoute, Route};
use crate::limits::MAX_BODY_BYTES;

pub(super) async fn handle(state: Arc<AppState>, mcp: Mcp, req: Request) -> Response {
    let started = Instant::now();
    let route = Route::at(req.uri().path());
    let method = req.method().clone();
    let (response, log) = match dispatch(&state, &mcp, route, req).await {
        Ok(a) => (a.response, a.log),
        Err(refusal) => {
            let log = refusal.log().map(str::to_owned);
            (refusal.into_response(), log)
        }
    };
    let status = response.status().as_u16();
    let label = route.map_or("other", Route::path);
    state
        .metrics
        .lock()
        .observe(label, status, started.elapsed().as_secs_f64());
    log::info!(
        "[http] {method} {label} {status} {:.1}ms{}",
        started.elapsed().as_secs_f64() * 1000.0,
        log.map(|l| format!(" {l}")).unwrap_or_default()
    );
    response
}

/// The service answering `/mcp`, built once per router (feature `mcp`).
#[cfg(feature = "mcp")]
pub(super) type Mcp = Arc<
    rmcp::transport::StreamableHttpService<
        super::mcp::Lessons,
        rmcp::transport::streamable_http_server::session::never::NeverSessionManager,
    >,
>;
/// Without the feature, `/mcp` is not served: nothing to hold (a type of its own rather than
/// `()`, so the router clones it the same way under either build).
#[cfg(not(feature = "mcp"))]
#[derive(Clone)]
pub(super) struct Mcp;

/// Decides the answer, in the contract's order.
async fn dispatch(
    state: &Arc<AppState>,
    mcp: &Mcp,
    route: Option<Route>,
    mut req: Request,
) -> Result<Answer, Refusal> {
    let not_found = || Refusal::new(StatusCode::NOT_FOUND, "not found");
    // 404 before anything else, even without a token.
    let route = route.ok_or_else(not_found)?;
    // Then, without a token, who may call at all: whatever the route and method, before
    // anything else is looked at, and before the body is read.
    let port = req.extensions().get::<Listening>().map(|l| l.0);
    let target = req.uri().authority().map(|a| a.as_str());
    local_caller(&state.auth, port, req.headers(), target)
        .map_err(|f| Refusal::new(StatusCode::FORBIDDEN, f.reason).logged(f.log))?;
    if route == Route::Mcp {
        // Its own protocol answers methods and bodies; the token is checked here, and left in
        // the request for the tools a read-only token may see.
        let token = authorize(&state.auth, req.headers())
            .ok_or_else(|| Refusal::new(StatusCode::UNAUTHORIZED, "unauthorized"))?;
        req.extensions_mut().insert(token);
        return mcp_answer(mcp, req).await;
    }
    let expected = match route {
        Route::Get(_) => Method::GET,
        Route::Post(_) | Route::Mcp => Method::POST,
    };
    if req.method() != expected {
        // GET /healthz is answered before routing, as the reference Worker does: any other
        // method on it is an unknown route, not a wrong method.
        if route == Route::Get(GetRoute::Healthz) {
            return Err(not_found());
        }
        return Err(Refusal::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed",
        ));
    }
    if route.access() != Access::Open {
        let unauthorized = || Refusal::new(StatusCode::UNAUTHORIZED, "unauthorized");
        let token = authorize(&state.auth, req.headers()).ok_or_else(unauthorized)?;
        if route.access() == Access::Write && token == Token::ReadOnly {
            return Err(Refusal::new(StatusCode::FORBIDDEN, "forbidden"));
        }
    }
    let route = match route {
        Route::Get(GetRoute::Healthz) => return Ok(Answer::other(healthz(state), None)),
        Route::Get(GetRoute::Metrics) => {
            return Ok(Answer::other(metrics_response(state).await, None))
        }
        Route::Get(page) => return Ok(Answer::other(page_response(page), None)),
        Route::Post(route) => route,
        Route::Mcp => return Err(Refusal::bug("/mcp reached the contract's routes")),
    };
    let value = read_body(req).await?;
    let body = super::wire::parse(route, &value).map_err(Refusal::bad_request)?;
    match body {
        Body::Export => export(state),
        Body::Review { days, scope } => review(state, days, scope).await,
        body => run(state, route, body).await,
    }
}

/// `/mcp`, answered by the protocol's own service.
#[cfg(feature = "mcp")]
async fn mcp_answer(mcp: &Mcp, req: Request) -> Result<Answer, Refusal> {
    use tower_service::Service;
    let mut service = (**mcp).clone();
    match service.call(req).await {
        Ok(response) => Ok(Answer::other(
            response.map(axum::body::Body::new),
            Some("mcp".to_owned()),
        )),
        Err(never) => match never {},
    }
}

/// Without the feature, `/mcp` is not served.
#[cfg(not(feature = "mcp"))]
async fn mcp_answer(_: &Mcp, _: Request) -> Result<Answer, Refusal> {
    Err(Refusal::new(StatusCode::NOT_FOUND, "not found"))
}

/// The page's files, embedded in the binary: (content type, body). They hold no data (the
/// page fetches everything with the token the person types), so they need no token.
fn page_asset(page: GetRoute) -> Option<(&'static str, &'static str)> {
    match page {
        GetRoute::Page => Some(("text/html; charset=utf-8", include_str!("page/index.html"))),
        GetRoute::PageScript => Some((
            "text/javascript; charset=utf-8",
            include_str!("page/app.js"),
        )),
        GetRoute::PageStyle => Some(("text/css; charset=utf-8", include_str!("page/app.css"))),
        GetRoute::Healthz | GetRoute::Metrics => None,
    }
}

/// Only the page's own files may load or be fetched; nothing inline, nothing from elsewhere,
/// and the page cannot be framed.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn page_response(page: GetRoute) -> Response {
    let Some((content_type, body)) = page_asset(page) else {
        return Refusal::bug(&format!("{} is not a page file", page.path())).into_response();
    };
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

/// `GET /healthz`: 200 while the store works, 503 with the reason once it failed.
fn healthz(state: &AppState) -> Response {
    if let Some(reason) = state.failure() {
        let body = json!({"ok": false, "error": format!("the store failed: {reason}")});
        return json_response(StatusCode::SERVICE_UNAVAILABLE, body.to_string());
    }
    let body = json!({"ok": true, "build": {"commit": state.commit}, "features": ["memory"]});
    json_response(StatusCode::OK, body.to_string())
}

fn too_large() -> Refusal {
    Refusal::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("body must be at most {MAX_BODY_BYTES} bytes"),
    )
}

/// The request's JSON body, or the refusal to answer: 411 without a plain numeric length, 413
/// over the fence, 408 when it is slow to arrive, 400 when it is not JSON.
async fn read_body(req: Request) -> Result<Value, Refusal> {
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
        return Err(Refusal::new(
            StatusCode::LENGTH_REQUIRED,
            "body must declare a numeric Content-Length",
        ));
    };
    if length.parse::<usize>().map_or(true, |n| n > MAX_BODY_BYTES) {
        return Err(too_large());
    }
    let read = axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES);
    let bytes: Bytes = match tokio::time::timeout(BODY_TIMEOUT, read).await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => return Err(too_large()),
        Err(_) => {
            return Err(Refusal::new(
                StatusCode::REQUEST_TIMEOUT,
                "the body did not arrive within 10 seconds",
            )
            .logged("slow body"))
        }
    };
    crate::json::decode(&bytes).ok_or_else(|| Refusal::bad_request("body must be valid JSON"))
}

/// Runs a parsed request on a blocking thread of its route's lane (store calls never run on the
/// async workers).
async fn run(state: &Arc<AppState>, route: PostRoute, body: Body) -> Result<Answer, Refusal> {
    let worker = Arc::clone(state);
    let path = route.path();
    let work = move || super::routes::execute(&worker, path, body);
    match state.lanes.call(super::lanes::Lane::of(route), work).await {
        Some(Ok((text, log))) => Ok(Answer::json(text, Some(log))),
        Some(Err(refusal)) => Err(refusal),
        None => Err(Refusal::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the request was cancelled",
        )),
    }
}

/// How a review's answer begins: whole (it fit in one piece, so its length is known and an
/// error is still a clean refusal), or as a stream whose later pieces come through the channel.
enum ReviewStart {
    Whole(JsonText, String),
    Streaming,
}

/// `/review` on its lane's thread. An answer of one piece is sent whole, with its length; a
/// larger one is sent as its pieces are made (the reader reads the first scopes while the
/// last are reviewed, and the server holds a few pieces, not the whole answer). The status is
/// decided at the second piece: an error before it is a refusal like any route's, one after
/// it cuts the body (as `/export` does) so the reader sees it incomplete.
async fn review(
    state: &Arc<AppState>,
    days: u32,
    scope: Option<crate::model::ScopeKey>,
) -> Result<Answer, Refusal> {
    let (start, started) = tokio::sync::oneshot::channel::<Result<ReviewStart, Refusal>>();
    let (stream, body) = Stream::open();
    let worker = Arc::clone(state);
    let work = move || {
        let path = PostRoute::Review.path();
        let mut start = Some(start);
        // The piece made last, held until the next shows the answer has more than one.
        let mut held: Option<Bytes> = None;
        let answered = super::routes::review(&worker, days, scope.as_ref(), &mut |piece| {
            let Some(before) = held.replace(piece) else {
                return Ok(());
            };
            if let Some(start) = start.take() {
                start
                    .send(Ok(ReviewStart::Streaming))
                    .map_err(|_| Stream::gone())?;
            }
            stream.send(before)
        });
        match (answered, start) {
            (Ok(log), Some(start)) => {
                let text = JsonText::Pieces(held.into_iter().collect());
                let _ = start.send(Ok(ReviewStart::Whole(text, log)));
            }
            (Ok(_), None) => {
                if let Some(last) = held {
                    // Nobody to tell if the reader has gone.
                    let _ = stream.send(last);
                }
            }
            (Err(e), Some(start)) => {
                let _ = start.send(Err(Refusal::of_store(&worker, path, e)));
            }
            (Err(e), None) => stream.cut(path, &e),
        }
    };
    let lanes = Arc::clone(state);
    tokio::spawn(async move {
        lanes
            .lanes
            .call(super::lanes::Lane::of(PostRoute::Review), work)
            .await
    });
    match started.await {
        Ok(Ok(ReviewStart::Whole(text, log))) => Ok(Answer::json(text, Some(log))),
        Ok(Ok(ReviewStart::Streaming)) => Ok(Answer::other(
            body.response(),
            Some(format!("days={days} streaming")),
        )),
        Ok(Err(refusal)) => Err(refusal),
        Err(_) => Err(Refusal::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the request was cancelled",
        )),
    }
}

/// One of the `MAX_EXPORTS` exports that may stream at once, given back when dropped (so a
/// panicking export cannot keep it).
struct ExportSlot(Arc<AppState>);

impl ExportSlot {
    fn take(state: &Arc<AppState>) -> Option<ExportSlot> {
        let running: &AtomicUsize = &state.exports;
        running
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < MAX_EXPORTS).then_some(n + 1)
            })
            .ok()
            .map(|_| ExportSlot(Arc::clone(state)))
    }
}

impl Drop for ExportSlot {
    fn drop(&mut self) {
        self.0.exports.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `/export` as a stream: `{"records":[` then each record as it is read, then `]}`. The records
/// are read on a thread of their own from one snapshot and handed over through a bounded
/// channel, so a slow reader holds a few pieces of memory and no store thread, and writes go
/// on. A reader that goes away stops the export.
fn export(state: &Arc<AppState>) -> Result<Answer, Refusal> {
    let slot = ExportSlot::take(state).ok_or_else(|| {
        Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many exports are running; try again when one has finished",
        )
    })?;
    let (stream, body) = Stream::open();
    std::thread::Builder::new()
        .name("lessons-export".into())
        .spawn(move || {
            // Minutes of CPU on a large store: the cores go to runs' calls first.
            crate::store::background::lower_this_thread();
            let store = Arc::clone(&slot.0.store);
            let mut out = JsonPieces::new(|piece| stream.send(piece));
            out.raw("{\"records\":[");
            let result = store
                .export(&mut |r| out.push(&r))
                .and_then(|()| {
                    // Then the decision journal, in the same answer.
                    out.raw("],\"decisions\":[");
                    store.export_decisions(&mut |d| out.push(&d))
                })
                .and_then(|()| {
                    out.raw("]}");
                    out.finish()
                });
            if let Err(e) = result {
                stream.cut(PostRoute::Export.path(), &e);
            }
            drop(slot);
        })
        .map_err(|_| {
            Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "could not start the export thread",
            )
        })?;
    Ok(Answer::other(body.response(), Some("streaming".to_owned())))
}

/// The writing end of a streamed answer (`/export`, a large `/review`), on the thread that
/// makes it: a few pieces are buffered, and a writer whose reader has gone away is told so.
struct Stream(tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>);

impl Stream {
    /// A stream and the body that sends what it is handed.
    fn open() -> (Stream, ChannelBody) {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        (Stream(tx), ChannelBody(rx))
    }

    /// The error a writer stops with when its reader has gone away.
    fn gone() -> crate::error::Error {
        crate::error::Error::invalid("the reader went away")
    }

    /// Hands `piece` on, waiting while the buffer is full.
    fn send(&self, piece: Bytes) -> crate::error::Result<()> {
        self.0.blocking_send(Ok(piece)).map_err(|_| Stream::gone())
    }

    /// Ends an answer that failed after its status was sent: the error cuts the body (no last
    /// chunk), so the reader sees it incomplete, and is logged, unless the reader went away.
    fn cut(&self, path: &str, e: &crate::error::Error) {
        if self.0.is_closed() {
            return;
        }
        log::error!("[http] {path} failed: {e}");
        let _ = self
            .0
            .blocking_send(Err(std::io::Error::other(e.to_string())));
    }
}

/// A response body fed by a [`Stream`].
struct ChannelBody(tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl ChannelBody {
    /// A 200 whose JSON body is what the stream is handed.
    fn response(self) -> Response {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            axum::body::Body::new(self),
        )
            .into_response()
    }
}

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
