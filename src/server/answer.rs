//! What a request is answered with: a 200 and its JSON text, or a [`Refusal`] with its status
//! and its reason as `{"error": reason}`, each with what the request's log line adds (a scope
//! and counts, never text).

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
    pub(super) fn json(body: String, log: Option<String>) -> Answer {
        Answer {
            response: json_response(StatusCode::OK, body),
            log,
        }
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

    /// What the client reads.
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
