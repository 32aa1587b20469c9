//! Every bound the contract puts on its input, in one place: the wire's (the reference Worker's
//! numbers, lengths in UTF-16 code units as JavaScript counts them), the store's, and the
//! body and import sizes the server and its clients share.
//!
//! **Invariant:** each bound is declared here once; validation, messages and docs read it here.

/// The most characters a scope key may have.
pub const MAX_SCOPE_KEY_CHARS: usize = 200;
/// The most UTF-16 units a record's text may have.
pub const MAX_TEXT_UNITS: usize = 4000;
/// The most UTF-16 units of an id, a thread key or a run id.
pub const MAX_REF_UNITS: usize = 200;
/// The most keywords a candidate may carry (the reference Worker's bound).
pub const MAX_KEYWORDS: usize = 20;
/// The most UTF-16 units of one keyword.
pub const MAX_KEYWORD_UNITS: usize = 64;
/// The most bytes of a record's provenance as JSON.
pub const MAX_PROVENANCE_BYTES: usize = 16 * 1024;

/// The most records `list`, `window` and `retrieve` answer.
pub const MAX_LIMIT: usize = 50;
/// The most candidates one write takes.
pub const MAX_BATCH: usize = 50;
/// The most UTF-16 units of a query.
pub const MAX_QUERY_UNITS: usize = 4000;
/// A scope's cap on active records, unless a write or the store says otherwise.
pub const DEFAULT_CAP: usize = 500;
/// The largest cap a scope may have.
pub const MAX_CAP: usize = 10_000;
/// The most decision-journal entries one read answers.
pub const MAX_JOURNAL_LIMIT: usize = 1000;

/// The largest request body the wire carries (the server refuses more; clients split).
#[cfg(feature = "__wire")]
pub const MAX_BODY_BYTES: usize = 512 * 1024;
/// The most records one `/import` request carries, and one chunk of `lessons import` holds.
#[cfg(feature = "__wire")]
pub const MAX_IMPORT: usize = 1000;
/// The most UTF-16 units of a run's brief, request or answer sent to the run routes.
#[cfg(any(feature = "server", feature = "__internals"))]
pub const MAX_RUN_TEXT_UNITS: usize = 100_000;
/// The most days a review looks back.
#[cfg(any(feature = "server", feature = "__internals"))]
pub const MAX_REVIEW_DAYS: u32 = 90;
/// The most bytes of an extractor reply that reflection reads.
pub const MAX_REPLY_BYTES: usize = 256 * 1024;
