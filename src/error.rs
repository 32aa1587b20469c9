//! The library's one error type: a kind to branch on and a message a person can act on.

use std::fmt;

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
    /// A value on disk has an unknown format version or does not decode.
    Format,
    /// A file could not be read or written.
    Io,
    /// A remote store answered with an error or could not be reached.
    Remote,
}

/// An error from the `lessons` library.
#[derive(Clone, Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
        }
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
        Error::new(ErrorKind::Io, format!("{doing}: {e}"))
    }

    /// A records-engine failure while `doing` something.
    pub fn storage(doing: impl fmt::Display, e: fjall::Error) -> Error {
        let detail = match e {
            fjall::Error::Io(io) => io.to_string(),
            fjall::Error::Poisoned => {
                "a previous write failed at the disk; reopen the store".to_owned()
            }
            other => format!("{other:?}"),
        };
        Error::new(ErrorKind::Storage, format!("{doing}: {detail}"))
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

impl std::error::Error for Error {}
