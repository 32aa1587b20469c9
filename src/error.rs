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
    /// A value on disk has an unknown format version or does not decode.
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

    /// A records-engine failure while `doing` something. Damage on disk (a checksum, a tag or
    /// a version that does not read) is `Damaged` and says what to do; a failed disk write is
    /// `Storage` and names the OS error (ENOSPC reads "No space left on device").
    pub(crate) fn storage(doing: impl fmt::Display, e: fjall::Error) -> Error {
        let kind = if is_damage(&e) {
            ErrorKind::Damaged
        } else {
            ErrorKind::Storage
        };
        let mut message = format!("{doing}: {}", describe_fjall(&e));
        if kind == ErrorKind::Damaged {
            message.push_str(
                "; the store's files are damaged: run `lessons doctor --salvage NEW_DIR` to copy every readable record into a new store",
            );
        }
        Error::new(kind, message).with_source(e)
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

/// Whether a records-engine error means a file on disk does not read as written.
fn is_damage(e: &fjall::Error) -> bool {
    match e {
        fjall::Error::Storage(inner) => !matches!(inner, fjall::LsmError::Io(_)),
        fjall::Error::Io(_) | fjall::Error::Poisoned | fjall::Error::Locked => false,
        _ => true,
    }
}

/// A records-engine error in words a person can act on, never its debug form.
pub(crate) fn describe_fjall(e: &fjall::Error) -> String {
    use fjall::LsmError as L;
    match e {
        fjall::Error::Io(io) => io.to_string(),
        fjall::Error::Poisoned => {
            "an earlier write failed at the disk (full or failing?), so fjall accepts no more writes until the store is reopened".to_owned()
        }
        fjall::Error::Locked => "another process holds the store".to_owned(),
        fjall::Error::JournalRecovery(r) => format!("the journal does not replay ({r:?})"),
        fjall::Error::InvalidVersion(v) => format!(
            "a file has an unknown format version ({})",
            v.map_or_else(|| "unreadable".to_owned(), |v| format!("{v:?}"))
        ),
        fjall::Error::Decompress(_) => "a block does not decompress".to_owned(),
        fjall::Error::InvalidTrailer => "a journal trailer is damaged".to_owned(),
        fjall::Error::InvalidTag((what, tag)) => format!("a {what} tag {tag} is invalid"),
        fjall::Error::KeyspaceDeleted => "a keyspace was deleted".to_owned(),
        fjall::Error::Unrecoverable => "some table files could not be recovered".to_owned(),
        fjall::Error::Storage(inner) => match inner {
            L::Io(io) => io.to_string(),
            L::ChecksumMismatch { .. } => "a table block's checksum does not match".to_owned(),
            L::Decompress(_) => "a table block does not decompress".to_owned(),
            L::InvalidVersion(v) => format!("a table file has an unknown format version {v}"),
            L::Unrecoverable => "some table files could not be recovered".to_owned(),
            L::InvalidTag((what, tag)) => format!("a table's {what} tag {tag} is invalid"),
            L::InvalidTrailer => "a table's trailer is damaged".to_owned(),
            L::InvalidHeader(what) => format!("a table's {what} header is damaged"),
            L::Utf8(_) => "a table holds a name that is not UTF-8".to_owned(),
            other => format!("{other:?}"),
        },
        other => format!("{other:?}"),
    }
}
