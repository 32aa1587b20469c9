//! What a request is answered with: a 200 and its JSON text, or a [`Refusal`] with its status
//! and its reason as `{"error": reason}`, each with what the request's log line adds (a scope
//! and counts, never text).

use axum::body::Bytes;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::contract::ErrorAnswer;
use crate::error::{Error, ErrorKind};

/// A 200 with a JSON body, and the log suffix of its request.
pub(super) struct Answer {
    pub(super) response: Response,
    pub(super) log: Option<String>,
}

impl Answer {
    /// A 200 with the JSON text `body`.
    pub(super) fn json(body: JsonText, log: Option<String>) -> Answer {
        let response = match body {
            JsonText::Whole(text) => json_response(StatusCode::OK, text),
            JsonText::Pieces(pieces) => (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                axum::body::Body::new(PiecesBody(pieces.into())),
            )
                .into_response(),
        };
        Answer { response, log }
    }

    /// Any other response (the page's files, a stream).
    pub(super) fn other(response: Response, log: Option<String>) -> Answer {
        Answer { response, log }
    }
}

/// A request the server does not answer with a 200: the status, the reason the client reads,
/// and what the log line adds.
#[derive(Debug)]
pub(super) struct Refusal {
    status: StatusCode,
    reason: String,
    log: Option<String>,
}

impl Refusal {
    pub(super) fn new(status: StatusCode, reason: impl Into<String>) -> Refusal {
        Refusal {
            status,
            reason: reason.into(),
            log: None,
        }
    }

    /// A 400 naming what is wrong with the request.
    pub(super) fn bad_request(reason: impl Into<String>) -> Refusal {
        Refusal::new(StatusCode::BAD_REQUEST, reason)
    }

    /// With a log suffix.
    pub(super) fn logged(mut self, log: impl Into<String>) -> Refusal {
        self.log = Some(log.into());
        self
    }

    /// The server itself is wrong (a body reached a handler that does not take it): logged as
    /// a bug, answered as the server's failure, never as the client's.
    pub(super) fn bug(what: &str) -> Refusal {
        log::error!("[http] bug: {what}");
        Refusal::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the server failed; see its log",
        )
    }

    /// A store error on `path`: the store's reason as a 400 when the request was invalid;
    /// otherwise a 500, logged, and a disk failure marks the store failed (`/healthz` 503, the
    /// server shuts down).
    pub(super) fn of_store(state: &AppState, path: &str, e: Error) -> Refusal {
        if e.is_invalid() {
            return Refusal::bad_request(e.message());
        }
        log::error!("[http] {path} failed: {e}");
        if e.kind() == ErrorKind::Storage {
            state.fail(e.message());
        }
        Refusal::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the store failed; see the server log",
        )
    }

    /// What the client reads (the MCP tools answer it as text).
    #[cfg(any(feature = "mcp", test))]
    pub(super) fn reason(&self) -> &str {
        &self.reason
    }

    pub(super) fn log(&self) -> Option<&str> {
        self.log.as_deref()
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let answer = ErrorAnswer { error: self.reason };
        json_response(
            self.status,
            crate::json::restore_lone(serde_json::to_string(&answer).unwrap_or_default()),
        )
    }
}

/// `answer` as JSON text as JavaScript writes it (lone surrogates as `\udXXX`).
pub(super) fn json_text(answer: &impl serde::Serialize) -> crate::error::Result<String> {
    serde_json::to_string(answer)
        .map(crate::json::restore_lone)
        .map_err(|e| Error::format(format!("encoding the answer: {e}")))
}

/// A response with a JSON body.
pub(super) fn json_response(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// An answer's JSON text: whole, or in the pieces it was written in, sent one after another
/// without being joined (a review of hundreds of scopes: joining megabytes costs more than
/// writing them, from the copies of a growing buffer and its fresh pages).
pub(super) enum JsonText {
    Whole(String),
    Pieces(Vec<Bytes>),
}

impl JsonText {
    /// The text in one string (a tool's answer over MCP is one). Pieces are cut only between
    /// whole values, so their bytes join into the UTF-8 they were written from.
    #[cfg(any(feature = "mcp", test))]
    pub(super) fn into_string(self) -> String {
        match self {
            JsonText::Whole(text) => text,
            JsonText::Pieces(pieces) => {
                let mut joined = Vec::with_capacity(pieces.iter().map(Bytes::len).sum());
                for piece in &pieces {
                    joined.extend_from_slice(piece);
                }
                String::from_utf8(joined)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
            }
        }
    }
}

/// The bytes a piece holds before it is handed on.
const PIECE: usize = 64 * 1024;

/// JSON text written in pieces of about [`PIECE`] bytes, each full piece handed to `full` (an
/// export's channel, blocking while its reader is slow; a review's list). Values pushed are
/// comma-separated within an array the caller opens and closes with [`raw`](Self::raw).
pub(super) struct JsonPieces<F: FnMut(Bytes) -> crate::error::Result<()>> {
    piece: Vec<u8>,
    first: bool,
    full: F,
}

impl<F: FnMut(Bytes) -> crate::error::Result<()>> JsonPieces<F> {
    pub(super) fn new(full: F) -> JsonPieces<F> {
        JsonPieces {
            piece: Vec::with_capacity(PIECE),
            first: true,
            full,
        }
    }

    /// Text as it is: an array's opening or closing, the fields around it. The next value
    /// pushed is the first of its array.
    pub(super) fn raw(&mut self, text: &str) {
        self.piece.extend_from_slice(text.as_bytes());
        self.first = true;
    }

    /// `value` as JavaScript writes it, after a comma unless it is its array's first.
    pub(super) fn push(&mut self, value: &impl serde::Serialize) -> crate::error::Result<()> {
        if !self.first {
            self.piece.push(b',');
        }
        self.first = false;
        self.piece.extend_from_slice(json_text(value)?.as_bytes());
        if self.piece.len() >= PIECE {
            let full = std::mem::replace(&mut self.piece, Vec::with_capacity(PIECE));
            (self.full)(Bytes::from(full))?;
        }
        Ok(())
    }

    /// Hands on what is left.
    pub(super) fn finish(mut self) -> crate::error::Result<()> {
        let last = std::mem::take(&mut self.piece);
        (self.full)(Bytes::from(last))
    }
}

/// A response body of pieces written before the response: its length is known, so it is sent
/// with a `content-length` like a whole one.
struct PiecesBody(std::collections::VecDeque<Bytes>);

impl http_body::Body for PiecesBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(
            self.get_mut()
                .0
                .pop_front()
                .map(|b| Ok(http_body::Frame::data(b))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let bytes: usize = self.0.iter().map(Bytes::len).sum();
        http_body::SizeHint::with_exact(u64::try_from(bytes).unwrap_or(u64::MAX))
    }
}
