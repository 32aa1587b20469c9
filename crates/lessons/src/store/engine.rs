//! The records engine's errors in words: what fjall said, whether it means damage on disk, and
//! what to do. Only the store knows fjall; everything above it sees [`Error`]s.

use std::fmt;
use std::path::Path;

use crate::error::{Error, ErrorKind};

/// A records-engine failure while `doing` something. Damage on disk (a checksum, a tag or
/// a version that does not read) is `Damaged` and says what to do; a failed disk write is
/// `Storage` and names the OS error (ENOSPC reads "No space left on device").
pub(crate) fn storage(doing: impl fmt::Display, e: fjall::Error) -> Error {
    let kind = if is_damage(&e) {
        ErrorKind::Damaged
    } else {
        ErrorKind::Storage
    };
    let message = format!("{doing}: {}", describe_fjall(&e));
    let error = match kind {
        ErrorKind::Damaged => damaged(message),
        _ => Error::new(kind, message),
    };
    error.with_source(e)
}

/// What a [`damaged`] error adds to its cause.
const SALVAGE: &str = "; the store's files are damaged: run `lessons doctor --salvage NEW_DIR` to copy every readable record into a new store";

/// A value or a file of the store that does not read as written (`what` says which), with
/// what to do about it: a store never repairs damage in place, a salvage reads around it.
pub(crate) fn damaged(what: impl fmt::Display) -> Error {
    Error::new(ErrorKind::Damaged, format!("{what}{SALVAGE}"))
}

/// The cause alone of an error, without the advice [`damaged`] adds: for a report that lists
/// causes and gives the advice once.
pub(crate) fn cause(e: &Error) -> &str {
    e.message().strip_suffix(SALVAGE).unwrap_or(e.message())
}

/// `storage` while `doing` something, as a closure for `map_err`.
pub(crate) fn st(doing: &str) -> impl FnOnce(fjall::Error) -> Error + '_ {
    move |e| storage(doing, e)
}

/// The store in `dir` is held by another process.
pub(crate) fn locked(dir: &Path) -> Error {
    Error::new(
        ErrorKind::Locked,
        format!(
            "the store {} is held by another process (a running `lessons serve`?); pass --server URL to use that server instead",
            dir.display()
        ),
    )
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
