//! The library's one error type: a kind to branch on and a message a person can act on.

use std::fmt;
use std::sync::Arc;

/// What went wrong, coarsely: enough for the CLI to pick an exit code and the server a status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The caller's input broke a rule; the message names the field and the rule.
    Invalid,
    /// Another process holds the store.
    Locked,
    /// The records engine (fjall) failed.
    Storage,
    /// The keyword index (tantivy) failed.
    Index,
    /// A value on disk has a format version this build does not know (a newer build wrote
    /// it), or a value could not be encoded.
    Format,
    /// A file could not be read or written.
    Io,
    /// A remote store answered with an error or could not be reached.
    Remote,
    /// A file of the store is damaged or missing; the message names it and what to do.
    Damaged,
}

/// An error from the `lessons` library: a kind, a message that says what was being done and
/// what to do, and the underlying error (an IO error, fjall's, tantivy's) as its `source()`.
#[derive(Clone, Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// The same error, with `source` as its cause.
    pub(crate) fn with_source(
        mut self,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        self.source = Some(Arc::new(source));
        self
    }

    /// Invalid input: `message` names the field and the rule.
    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Invalid, message)
    }

    /// A keyword-index failure.
    pub fn index(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Index, message)
    }

    /// A format failure.
    pub fn format(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Format, message)
    }

    /// An IO failure while `doing` something.
    pub fn io(doing: impl fmt::Display, e: std::io::Error) -> Error {
        Error::new(ErrorKind::Io, format!("{doing}: {e}")).with_source(e)
    }

    /// The IO error kind underneath, if an IO error caused this one (a closed pipe, a full
    /// disk): for callers that branch on it, as the CLI does on `BrokenPipe`.
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(self);
        while let Some(e) = cause {
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                return Some(io.kind());
            }
            cause = e.source();
        }
        None
    }

    /// The kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Was the caller's input invalid?
    pub fn is_invalid(&self) -> bool {
        self.kind == ErrorKind::Invalid
    }

    /// Does another process hold the store?
    pub fn is_locked(&self) -> bool {
        self.kind == ErrorKind::Locked
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
