//! Key layouts and value encodings of the embedded store.
//!
//! Keys start with the scope key and a NUL (a scope key never holds NUL), so one scope's entries
//! are one contiguous prefix and no scope's prefix is another's. Integers are big-endian, and
//! signed ones have their sign bit flipped, so byte order is numeric order.
//!
//! | keyspace | key | value |
//! |---|---|---|
//! | `active` | scope, 0, kind, !seq | record |
//! | `usage` | scope, 0, kind, !seq (the record's `active` key) | its use since it was last written |
//! | `retired` | scope, 0, seq | record |
//! | `norms` | scope, 0, fnv1a64(normalized text) | the active records with that hash (seqs) |
//! | `scopes` | scope | next seq, active count |
//! | `counters` | day, scope | day counters |
//! | `outbox` | operation | ids whose index entry must be refreshed |
//! | `meta` | `format` | format version |
//! | `meta` | `last batch` | the number of the last batch committed (every batch sets it) |
//!
//! `!seq` (bitwise not) makes a forward prefix scan of (scope, kind) newest first: the window
//! read reads exactly the records it returns.
//!
//! Values are one format-version byte, then postcard. An unknown version is an error.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::decisions::{Decision, DecisionEvent};
use crate::error::{Error, Result};
use crate::model::{Kind, Record, ScopeKey, Status};
use crate::store::engine::damaged;

/// The store's layout version, in `meta` `format`. Version 1 kept one dedup key per record
/// (`scope, 0, hash, seq`, found by a prefix scan); version 2 keeps one per normalized text,
/// holding every active record with it, found by a point read; version 3 records a retrieve's
/// use of a record in `usage` instead of rewriting the record; version 4 keys each
/// decision-journal entry by its event after its scope, so the entries of one event are one
/// prefix; version 5 gives the eviction of a record never used a class byte of its own, so
/// those are one prefix too; version 6 stores a write's insertion and eviction entries without
/// their text, which is their record's (`text_in_record`); version 7 marks such an entry with a
/// version byte of its own (`DECISION_TEXT_IN_RECORD`), where 6 told it by its shape alone. An
/// older store is upgraded in place at open (see `embedded::upgrade`); a build that knows an
/// older version refuses a newer one.
pub const STORE_FORMAT: u8 = 7;

/// The `meta` key holding the number of the last batch committed (8 bytes, big-endian).
pub const LAST_BATCH: &str = "last batch";

/// The `meta` key holding each scope's decision-journal tally as the last clean close left it
/// (see `JournalTallies`).
pub const JOURNAL_TALLIES: &str = "journal tallies";

/// What a clean close knew of each scope's decision journal: its entries and the time of its
/// oldest, as (scope, entries, oldest). Valid only while `batch`, its own batch, is the last
/// one: any later batch may have changed a journal, and the next open counts again.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
pub struct JournalTallies {
    pub batch: u64,
    pub scopes: Vec<(String, u64, i64)>,
}

/// The version byte in front of every value but a record.
pub const FORMAT_VERSION: u8 = 1;
/// The version byte in front of a decision-journal entry that left its text to its record
/// (`encode_written_decision`); its body is a version 1 entry's. The mark is explicit because
/// an entry's shape cannot say where its text is: an insertion imported without a text names
/// an id that this store may hold as another record.
pub const DECISION_TEXT_IN_RECORD: u8 = 2;
/// The version byte in front of a record written by this build (version 1 records, without
/// `dedup_key`, still read).
pub const RECORD_VERSION: u8 = 2;

pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(64);
    out.push(FORMAT_VERSION);
    postcard::to_extend(value, out).map_err(|e| Error::format(format!("encoding a value: {e}")))
}

pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8], what: &str) -> Result<T> {
    match bytes.split_first() {
        Some((&FORMAT_VERSION, body)) => {
            postcard::from_bytes(body).map_err(|e| damaged(format!("{what} does not decode: {e}")))
        }
        Some((v, _)) => Err(Error::format(format!(
            "{what} has format version {v}; this build reads version {FORMAT_VERSION} (upgrade lessons)"
        ))),
        None => Err(damaged(format!("{what} is empty"))),
    }
}

fn scope_prefix(scope: &str, extra: usize) -> Vec<u8> {
    let mut k = Vec::with_capacity(scope.len() + 1 + extra);
    k.extend_from_slice(scope.as_bytes());
    k.push(0);
    k
}

/// Every key of one scope in a scope-prefixed keyspace.
pub fn scope_key_prefix(scope: &ScopeKey) -> Vec<u8> {
    scope_prefix(scope.as_str(), 0)
}

pub fn kind_byte(kind: Kind) -> u8 {
    match kind {
        Kind::Fact => 0,
        Kind::Summary => 1,
    }
}

/// The prefix of a scope's active records of one kind, newest first.
pub fn active_prefix(scope: &ScopeKey, kind: Kind) -> Vec<u8> {
    let mut k = scope_prefix(scope.as_str(), 9);
    k.push(kind_byte(kind));
    k
}

pub fn active_key(scope: &ScopeKey, kind: Kind, seq: u64) -> Vec<u8> {
    let mut k = active_prefix(scope, kind);
    k.extend_from_slice(&(!seq).to_be_bytes());
    k
}

/// The first byte of a `usage` value: neither a record's nor any other value's version byte,
/// so salvage tells a usage entry from the rest of a journal batch by its bytes alone.
pub const USAGE_TAG: u8 = b'u';

/// A record's use since it was last written: what a retrieve changes. The entry overrides the
/// record's stored `useCount` and `lastUsedAt`; every write of the record folds it in and
/// removes it in the same batch, so an entry only ever exists for an active record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub use_count: u64,
    pub last_used_at: i64,
}

impl Usage {
    /// The usage `r` carries, once used (`None` when it never was).
    pub fn of(r: &Record) -> Option<Usage> {
        r.last_used_at.map(|last_used_at| Usage {
            use_count: r.use_count,
            last_used_at,
        })
    }

    /// `r` as this entry says it was used.
    pub fn apply(self, r: &mut Record) {
        r.use_count = self.use_count;
        r.last_used_at = Some(self.last_used_at);
    }
}

/// A usage value: the tag, then the use count and the time of last use, big-endian (17 bytes;
/// a bump writes eight of them per retrieve, so they stay small and fixed).
pub fn encode_usage(u: Usage) -> [u8; 17] {
    let mut out = [0u8; 17];
    let (tag, rest) = out.split_at_mut(1);
    let (count, at) = rest.split_at_mut(8);
    tag.fill(USAGE_TAG);
    count.copy_from_slice(&u.use_count.to_be_bytes());
    at.copy_from_slice(&u.last_used_at.to_be_bytes());
    out
}

pub fn decode_usage(bytes: &[u8]) -> Result<Usage> {
    match bytes.split_first() {
        Some((&USAGE_TAG, body)) if body.len() == 16 => {
            let (count, at) = body.split_at(8);
            let word = |b: &[u8]| -> [u8; 8] { b.try_into().unwrap_or([0; 8]) };
            Ok(Usage {
                use_count: u64::from_be_bytes(word(count)),
                last_used_at: i64::from_be_bytes(word(at)),
            })
        }
        Some((&USAGE_TAG, _)) => Err(damaged(format!(
            "a usage entry is {} bytes, not 17",
            bytes.len()
        ))),
        Some((v, _)) => Err(Error::format(format!(
            "a usage entry starts with {v}, not the usage tag (upgrade lessons)"
        ))),
        None => Err(damaged("a usage entry is empty")),
    }
}

/// The scope and sequence number of an `active` (or `usage`) key.
pub fn active_key_parts(key: &[u8]) -> Option<(&[u8], u64)> {
    let scope = scope_bytes(key)?;
    // scope, NUL, kind, then 8 bytes of !seq.
    if key.len() != scope.len() + 10 || key.get(scope.len() + 1).is_none_or(|&k| k > 1) {
        return None;
    }
    Some((scope, !trailing_seq(key)?))
}

/// The id of the record stored under `key` (a `retired` key, or an `active` one), read from
/// the key alone: what names a record whose value does not decode.
pub fn record_id_of_key(key: &[u8], retired: bool) -> Option<String> {
    let (scope, seq) = if retired {
        // scope, NUL, then 8 bytes of seq.
        let scope = scope_bytes(key)?;
        if key.len() != scope.len() + 9 {
            return None;
        }
        (scope, trailing_seq(key)?)
    } else {
        active_key_parts(key)?
    };
    let scope = ScopeKey::parse(std::str::from_utf8(scope).ok()?).ok()?;
    Some(scope.record_id(seq))
}

pub fn retired_key(scope: &ScopeKey, seq: u64) -> Vec<u8> {
    let mut k = scope_prefix(scope.as_str(), 8);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// FNV-1a, 64 bits: stable across builds and platforms, unlike std's hasher. A collision only
/// costs a comparison: every hit is checked against the record's text.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The dedup key of a normalized text in a scope: its value lists the active records whose
/// text normalizes to a text with the same hash (confirmed against each record's text).
pub fn norm_key(scope: &ScopeKey, norm: &str) -> Vec<u8> {
    let mut k = scope_prefix(scope.as_str(), 8);
    k.extend_from_slice(&fnv1a64(norm.as_bytes()).to_be_bytes());
    k
}

/// A dedup key's value: the sequence numbers it lists, ascending.
pub fn decode_seqs(bytes: &[u8]) -> Result<Vec<u64>> {
    decode(bytes, "a dedup key")
}

fn ordered(v: i64) -> [u8; 8] {
    ((v as u64) ^ (1 << 63)).to_be_bytes()
}

/// The last 8 bytes of a key as a big-endian sequence number.
/// The scope part of a scope-prefixed key: the bytes before its first NUL (`None` without one).
pub fn scope_bytes(key: &[u8]) -> Option<&[u8]> {
    let nul = key.iter().position(|&b| b == 0)?;
    key.get(..nul)
}

pub fn trailing_seq(key: &[u8]) -> Option<u64> {
    let tail: [u8; 8] = key.get(key.len().checked_sub(8)?..)?.try_into().ok()?;
    Some(u64::from_be_bytes(tail))
}

pub fn counters_key(day: i64, scope: &ScopeKey) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + scope.as_str().len());
    k.extend_from_slice(&ordered(day));
    k.extend_from_slice(scope.as_str().as_bytes());
    k
}

/// A journal entry's key: scope, NUL, its class byte (`class_byte`), then the time and a
/// store-wide counter, both inverted, so a forward scan of a scope's (or one class's) prefix
/// reads the newest first. The last 16 bytes (`decision_order`) order entries across classes.
pub fn decision_key(d: &Decision, counter: u64) -> Vec<u8> {
    let mut k = scope_prefix(d.scope_key.as_str(), 17);
    k.push(class_byte(d));
    let t = ordered(d.time);
    k.extend(t.iter().map(|b| !b));
    k.extend_from_slice(&(!counter).to_be_bytes());
    k
}

/// The prefixes holding `scope`'s entries of `event`, one per class (an eviction has two); only
/// the never-used evictions' when `never_used` (none for another event).
pub fn decision_prefixes(scope: &ScopeKey, event: DecisionEvent, never_used: bool) -> Vec<Vec<u8>> {
    let classes: &[u8] = match (event, never_used) {
        (DecisionEvent::Evicted, true) => &[NEVER_USED],
        (DecisionEvent::Evicted, false) => &[event_byte(event), NEVER_USED],
        (_, true) => &[],
        (_, false) => &[event_byte(event)],
    };
    classes
        .iter()
        .map(|&class| {
            let mut k = scope_prefix(scope.as_str(), 1);
            k.push(class);
            k
        })
        .collect()
}

/// An event's byte in a journal key: its place in `DecisionEvent::ALL`.
fn event_byte(event: DecisionEvent) -> u8 {
    DecisionEvent::ALL
        .iter()
        .position(|&e| e == event)
        .map_or(u8::MAX, |i| i as u8)
}

/// The class byte of the eviction of a record never used: one past the events' bytes.
const NEVER_USED: u8 = DecisionEvent::ALL.len() as u8;

/// The byte after a journal key's scope: the entry's event's byte, except that the eviction of
/// a record never used has a byte of its own, so a review's evidence of lessons written for
/// nothing is one prefix rather than a filter over every eviction.
fn class_byte(d: &Decision) -> u8 {
    if d.never_used() {
        NEVER_USED
    } else {
        event_byte(d.event)
    }
}

/// The part of a journal key that orders entries, newest first, across classes: the inverted
/// time and counter (its last 16 bytes).
pub fn decision_order(key: &[u8]) -> &[u8] {
    key.get(key.len().saturating_sub(16)..).unwrap_or(key)
}

/// Whether `key` is a journal key of store format 3 or older (scope, NUL, time, counter: no
/// class byte).
fn is_unclassed_decision_key(key: &[u8]) -> bool {
    scope_bytes(key).is_some_and(|scope| key.len() == scope.len() + 1 + 16)
}

/// Whether `key` is a journal key of store format 4 or later (scope, NUL, a byte, time,
/// counter) whose byte is `d`'s event's (format 4) or its class's (format 5).
fn is_classed_key_of(key: &[u8], d: &Decision) -> bool {
    scope_bytes(key).is_some_and(|scope| {
        key.len() == scope.len() + 1 + 17
            && key
                .get(scope.len() + 1)
                .is_some_and(|&b| b == event_byte(d.event) || b == class_byte(d))
    })
}

/// Whether `key` is laid out as a key of `d` by this or an older format (what salvage accepts).
pub fn is_decision_key_of(key: &[u8], d: &Decision) -> bool {
    is_unclassed_decision_key(key) || is_classed_key_of(key, d)
}

/// The key an entry stored as `d` under `old` (a key of this or an older format) has in this
/// format, when that is not `old`; `None` for a current key or one of no known layout.
pub fn current_decision_key(old: &[u8], d: &Decision) -> Option<Vec<u8>> {
    if !is_decision_key_of(old, d) {
        return None;
    }
    let scope = scope_bytes(old)?;
    let mut k = Vec::with_capacity(scope.len() + 1 + 17);
    k.extend_from_slice(scope);
    k.push(0);
    k.push(class_byte(d));
    k.extend_from_slice(decision_order(old));
    (k != old).then_some(k)
}

/// Whether `key` may hold an entry a format 5 upgrade re-keys: one of format 3 or older, or
/// an eviction keyed by its event (format 4 kept never-used evictions there too).
pub fn may_need_rekey(key: &[u8]) -> bool {
    is_unclassed_decision_key(key)
        || scope_bytes(key).is_some_and(|scope| {
            key.len() == scope.len() + 1 + 17
                && key.get(scope.len() + 1) == Some(&event_byte(DecisionEvent::Evicted))
        })
}

/// The time of a journal entry's key.
pub fn decision_time(key: &[u8]) -> Option<i64> {
    let t: [u8; 8] = key
        .get(key.len().checked_sub(16)?..key.len() - 8)?
        .try_into()
        .ok()?;
    let inverted = u64::from_be_bytes(t.map(|b| !b));
    Some((inverted ^ (1 << 63)) as i64)
}

pub fn encode_decision(d: &crate::decisions::Decision) -> Result<Vec<u8>> {
    encode(&crate::decisions::DecisionDisk::from(d))
}

/// Whether a write's entry `d` leaves its text to its record: an insertion or an eviction
/// names one record of its own scope and holds that record's text. The write that makes the
/// entry writes the record in the same batch (inserted active, or retired), a record's text
/// never changes, and a retired record is never removed; so the record holds the text for as
/// long as the entry lives. At a scope's cap a write journals four insertions and four
/// evictions, whose texts were a quarter of its batch's bytes.
fn text_in_record(d: &Decision) -> bool {
    matches!(d.event, DecisionEvent::Inserted | DecisionEvent::Evicted)
        && d.texts.len() == 1
        && named_record(d).is_some()
}

/// The record `d` names, if it names one of its own scope: its sequence number.
fn named_record(d: &Decision) -> Option<u64> {
    let [id] = d.ids.as_slice() else {
        return None;
    };
    d.scope_key.record_seq(id)
}

/// A write's journal entry as stored: without its text, marked `DECISION_TEXT_IN_RECORD`,
/// when its record holds it (`text_in_record`). Only a write's own entries may be stored so:
/// an imported entry's record may not be in this store.
pub fn encode_written_decision(d: &Decision) -> Result<Vec<u8>> {
    if !text_in_record(d) {
        return encode_decision(d);
    }
    let out = encode(&crate::decisions::DecisionDisk::of(d, false))?;
    Ok(mark_text_in_record(out))
}

/// The record whose text the stored entry `d` (decoded from `stored`) left out: its sequence
/// number in the entry's scope. `None` for an entry stored whole, with a text or without.
pub fn text_record(stored: &[u8], d: &Decision) -> Option<u64> {
    left_out(stored, DECISION_TEXT_IN_RECORD, d)
}

/// The record whose text an entry written by a format 6 store left out, told by its shape (that
/// format had no mark): an insertion or an eviction naming one record of its scope, without a
/// text. An entry imported into such a store without a text has the same shape: the format 7
/// mark tells them apart, and for format 6's entries `format6_written_with` does.
pub fn format6_text_record(stored: &[u8], d: &Decision) -> Option<u64> {
    left_out(stored, FORMAT_VERSION, d)
}

/// The record named by `d`, stored under `version`, if it is an insertion or an eviction
/// without texts: the only entries a write stores without their text.
fn left_out(stored: &[u8], version: u8, d: &Decision) -> Option<u64> {
    let shape = matches!(d.event, DecisionEvent::Inserted | DecisionEvent::Evicted);
    if stored.first() != Some(&version) || !shape || !d.texts.is_empty() {
        return None;
    }
    named_record(d)
}

/// Whether `d`, an entry of the shape `format6_text_record` accepts, was written in the batch
/// of `r`, the record it names, as a write wrote it: an insertion at its record's creation, an
/// eviction whose age counts from that creation. An entry imported without a text passes only
/// when it is about that very record (created in the same millisecond), whose text is then its
/// own: any other is not given a record's text.
pub fn format6_written_with(d: &Decision, r: &crate::model::Record) -> bool {
    match d.event {
        DecisionEvent::Inserted => d.time == r.created_at,
        DecisionEvent::Evicted => d.age_ms == Some(d.time.saturating_sub(r.created_at)),
        _ => false,
    }
}

/// `stored`, a version 1 entry, marked as one whose text is its record's.
pub fn mark_text_in_record(mut stored: Vec<u8>) -> Vec<u8> {
    if let Some(v) = stored.first_mut() {
        *v = DECISION_TEXT_IN_RECORD;
    }
    stored
}

/// A stored journal entry's body: a version 1 entry's, whether it left its text to its record
/// (`DECISION_TEXT_IN_RECORD`) or not.
fn decode_entry<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T> {
    match bytes.split_first() {
        Some((&(FORMAT_VERSION | DECISION_TEXT_IN_RECORD), body)) => postcard::from_bytes(body)
            .map_err(|e| damaged(format!("a journal entry does not decode: {e}"))),
        Some((v, _)) => Err(Error::format(format!(
            "a journal entry has format version {v}; this build reads versions \
             {FORMAT_VERSION} and {DECISION_TEXT_IN_RECORD} (upgrade lessons)"
        ))),
        None => Err(damaged("a journal entry is empty")),
    }
}

pub fn decode_decision(bytes: &[u8]) -> Result<crate::decisions::Decision> {
    decode_entry::<crate::decisions::DecisionDisk>(bytes)?.into_decision()
}

/// A journal entry read under `scope`'s prefix, which must be its scope.
pub fn decode_decision_of(bytes: &[u8], scope: &ScopeKey) -> Result<crate::decisions::Decision> {
    decode_entry::<crate::decisions::DecisionDisk<&str>>(bytes)?.into_decision_of(scope)
}

pub fn counters_from(day: i64) -> [u8; 8] {
    ordered(day)
}

/// Splits a counters key into its day and scope.
pub fn parse_counters_key(key: &[u8]) -> Option<(i64, ScopeKey)> {
    let (day, scope) = key.split_at_checked(8)?;
    let day = (u64::from_be_bytes(day.try_into().ok()?) ^ (1 << 63)) as i64;
    let scope = ScopeKey::parse(std::str::from_utf8(scope).ok()?).ok()?;
    Some((day, scope))
}

/// A scope's bookkeeping.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopeMeta {
    /// The sequence number of the next insert.
    pub next_seq: u64,
    /// Active records.
    pub active: u64,
}

fn status_byte(s: Status) -> u8 {
    match s {
        Status::Active => 0,
        Status::Superseded => 1,
        Status::Forgotten => 2,
        Status::Evicted => 3,
        Status::Swept => 4,
    }
}

fn status_from(b: u8) -> Result<Status> {
    Ok(match b {
        0 => Status::Active,
        1 => Status::Superseded,
        2 => Status::Forgotten,
        3 => Status::Evicted,
        4 => Status::Swept,
        other => return Err(damaged(format!("unknown record status {other}"))),
    })
}

/// A record as stored (version 2): explicit byte tags, provenance as JSON text (postcard cannot
/// carry a self-describing JSON value), then whether it has a dedup key. Encoding borrows the
/// record's fields; decoding borrows only the scope, which a read usually already holds.
#[derive(Serialize, Deserialize)]
struct StoredRecord<'a> {
    #[serde(borrow)]
    base: StoredRecordV1<'a>,
    dedup_key: bool,
}

/// A record as version 1 stored it: every record had a dedup key.
#[derive(Serialize, Deserialize)]
struct StoredRecordV1<'a> {
    #[serde(borrow)]
    scope: &'a str,
    seq: u64,
    kind: u8,
    status: u8,
    text: Cow<'a, str>,
    keywords: Cow<'a, crate::model::Keywords>,
    source_thread_key: Cow<'a, str>,
    source_run_id: Option<Cow<'a, str>>,
    provenance: Option<String>,
    created_at: i64,
    last_used_at: Option<i64>,
    use_count: u64,
    confidence: Option<f64>,
    supersedes: Option<Cow<'a, str>>,
}

/// `r` as it is stored, borrowing its strings.
fn stored_record(r: &Record, seq: u64) -> Result<StoredRecord<'_>> {
    let provenance = match &r.provenance {
        Some(p) => Some(
            serde_json::to_string(p)
                .map_err(|e| Error::format(format!("encoding provenance: {e}")))?,
        ),
        None => None,
    };
    Ok(StoredRecord {
        base: StoredRecordV1 {
            scope: r.scope_key.as_str(),
            seq,
            kind: kind_byte(r.kind),
            status: status_byte(r.status),
            text: Cow::Borrowed(&r.text),
            keywords: Cow::Borrowed(&r.keywords),
            source_thread_key: Cow::Borrowed(&r.source_thread_key),
            source_run_id: r.source_run_id.as_deref().map(Cow::Borrowed),
            provenance,
            created_at: r.created_at,
            last_used_at: r.last_used_at,
            use_count: r.use_count,
            confidence: r.confidence,
            supersedes: r.supersedes.as_deref().map(Cow::Borrowed),
        },
        dedup_key: r.dedup_key,
    })
}

/// `r` as stored: the record version byte, then postcard.
pub fn encode_record(r: &Record, seq: u64) -> Result<Vec<u8>> {
    let stored = stored_record(r, seq)?;
    // Sized once: the strings are nearly all of it (a usage bump encodes eight records).
    let strings = stored.base.scope.len()
        + r.text.len()
        + r.keywords.iter().map(|k| k.len() + 2).sum::<usize>()
        + r.source_thread_key.len()
        + r.source_run_id.as_ref().map_or(0, String::len)
        + stored.base.provenance.as_ref().map_or(0, String::len)
        + r.supersedes.as_ref().map_or(0, String::len);
    let mut out = Vec::with_capacity(strings + 64);
    out.push(RECORD_VERSION);
    postcard::to_extend(&stored, out).map_err(|e| Error::format(format!("encoding a record: {e}")))
}

/// The text of a stored record, borrowed, without decoding the rest: a filter over many
/// records (the sweep's gate) decodes in full only the records it keeps. Both record versions
/// begin with the same fields, so one head reads either.
pub fn record_text(bytes: &[u8]) -> Result<&str> {
    #[derive(Deserialize)]
    struct Head<'a> {
        _scope: &'a str,
        _seq: u64,
        _kind: u8,
        _status: u8,
        text: &'a str,
    }
    match bytes.split_first() {
        Some((&RECORD_VERSION | &1, body)) => postcard::take_from_bytes::<Head<'_>>(body)
            .map(|(head, _)| head.text)
            .map_err(|e| damaged(format!("a record does not decode: {e}"))),
        Some((v, _)) => Err(Error::format(format!(
            "a record has format version {v}; this build reads versions 1 and {RECORD_VERSION} (upgrade lessons)"
        ))),
        None => Err(damaged("a record is empty")),
    }
}

/// Decodes a stored record. `known`: the scope the caller read it from, whose key is then shared
/// instead of copied (checked, not trusted).
/// The leading fields every record version stores, the text last of them: what a read of a
/// record's text alone decodes (postcard reads fields in order and leaves the rest unread).
#[derive(Deserialize)]
struct StoredText<'a> {
    #[serde(borrow)]
    _scope: &'a str,
    _seq: u64,
    _kind: u8,
    _status: u8,
    text: Cow<'a, str>,
}

/// A stored record's text alone, without its keywords and provenance (a journal entry's text
/// read from its record: see `text_record`).
pub fn decode_record_text(bytes: &[u8]) -> Result<String> {
    match bytes.split_first() {
        Some((&(1 | RECORD_VERSION), body)) => postcard::from_bytes::<StoredText<'_>>(body)
            .map(|s| s.text.into_owned())
            .map_err(|e| damaged(format!("a record does not decode: {e}"))),
        Some((v, _)) => Err(Error::format(format!(
            "a record has format version {v}; this build reads versions 1 and {RECORD_VERSION} (upgrade lessons)"
        ))),
        None => Err(damaged("a record is empty")),
    }
}

pub fn decode_record(bytes: &[u8], known: Option<&ScopeKey>) -> Result<Record> {
    let (s, dedup_key) = match bytes.split_first() {
        Some((&RECORD_VERSION, body)) => {
            let s: StoredRecord<'_> = postcard::from_bytes(body)
                .map_err(|e| damaged(format!("a record does not decode: {e}")))?;
            (s.base, s.dedup_key)
        }
        Some((&1, _)) => (decode::<StoredRecordV1<'_>>(bytes, "a record")?, true),
        Some((v, _)) => {
            return Err(Error::format(format!(
                "a record has format version {v}; this build reads versions 1 and {RECORD_VERSION} (upgrade lessons)"
            )))
        }
        None => return Err(damaged("a record is empty")),
    };
    let scope = match known {
        Some(k) if k.as_str() == s.scope => k.clone(),
        // Validated when it was written; parsing it again would cost a scan per record read.
        _ => ScopeKey::trusted(s.scope),
    };
    let kind = match s.kind {
        0 => Kind::Fact,
        1 => Kind::Summary,
        other => return Err(damaged(format!("unknown record kind {other}"))),
    };
    let provenance = match s.provenance {
        Some(p) => {
            Some(serde_json::from_str(&p).map_err(|e| damaged(format!("stored provenance: {e}")))?)
        }
        None => None,
    };
    Ok(Record {
        id: scope.record_id(s.seq),
        scope_key: scope,
        kind,
        text: s.text.into_owned(),
        keywords: s.keywords.into_owned(),
        source_thread_key: s.source_thread_key.into_owned(),
        source_run_id: s.source_run_id.map(Cow::into_owned),
        provenance,
        created_at: s.created_at,
        last_used_at: s.last_used_at,
        use_count: s.use_count,
        confidence: s.confidence,
        supersedes: s.supersedes.map(Cow::into_owned),
        status: status_from(s.status)?,
        dedup_key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usage_entry_round_trips_and_is_told_from_every_other_value() {
        let u = Usage {
            use_count: 7,
            last_used_at: -5,
        };
        let bytes = encode_usage(u);
        assert_eq!(decode_usage(&bytes).expect("decodes"), u);
        assert!(
            decode_usage(&bytes[..16]).is_err(),
            "a short entry is refused"
        );
        assert!(decode_usage(&[]).is_err());
        // Records and every other value start with a version byte, never the usage tag.
        assert!(![FORMAT_VERSION, RECORD_VERSION].contains(&USAGE_TAG));
        assert!(decode_usage(&encode(&(7u64, 5i64)).expect("encodes")).is_err());
        assert!(decode_record(&bytes, None).is_err());
        let scope = ScopeKey::parse("repo:acme/app").expect("scope");
        let key = active_key(&scope, Kind::Summary, 42);
        assert_eq!(
            active_key_parts(&key),
            Some((scope.as_str().as_bytes(), 42))
        );
        assert_eq!(active_key_parts(&retired_key(&scope, 42)), None);
        assert_eq!(active_key_parts(&norm_key(&scope, "npm ci")), None);
    }

    /// Record 7 of `scope`, every optional field set.
    fn full_record(scope: &ScopeKey) -> Record {
        Record {
            id: scope.record_id(7),
            scope_key: scope.clone(),
            kind: Kind::Fact,
            text: "npm ci must run before the license check ".repeat(20),
            keywords: vec!["npm".into(), "License".into(), "npm".into()].into(),
            source_thread_key: "slack:C1:1.0".into(),
            source_run_id: Some("run-1".into()),
            provenance: Some(serde_json::json!({"revision": 3, "origins": ["a", "b"]})),
            created_at: 1_795_996_800_000,
            last_used_at: Some(1_795_996_900_000),
            use_count: 4,
            confidence: Some(0.8),
            supersedes: Some(scope.record_id(2)),
            status: Status::Active,
            dedup_key: true,
        }
    }

    #[test]
    fn a_record_encodes_to_postcards_bytes_and_back() {
        let scope = ScopeKey::parse("repo:acme/app").expect("scope");
        let r = full_record(&scope);
        let bytes = encode_record(&r, 7).expect("encode");
        let stored = stored_record(&r, 7).expect("stored");
        let mut want = vec![RECORD_VERSION];
        want.extend(postcard::to_stdvec(&stored).expect("postcard"));
        assert_eq!(
            bytes, want,
            "the stored format is postcard's, whatever the buffer"
        );
        assert_eq!(decode_record(&bytes, Some(&scope)).expect("decode"), r);
        assert_eq!(decode_record_text(&bytes).expect("the text alone"), r.text);
        // Version 1 (no dedup flag after the fields) leads with the same fields.
        let mut v1 = vec![FORMAT_VERSION];
        v1.extend(postcard::to_stdvec(&stored.base).expect("postcard"));
        assert_eq!(decode_record_text(&v1).expect("a version 1 text"), r.text);
        // A record cut short anywhere, or with its keywords' count raised, is an error, never
        // a panic or a shorter record.
        for cut in 0..bytes.len() {
            assert!(
                decode_record(&bytes[..cut], Some(&scope)).is_err(),
                "cut at {cut}"
            );
        }
        // Its text alone: an error while the cut reaches into the text, never a panic.
        let text_ends = bytes
            .windows(r.text.len())
            .position(|w| w == r.text.as_bytes())
            .expect("the text's bytes")
            + r.text.len();
        for cut in 0..text_ends {
            assert!(decode_record_text(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        assert!(decode_record_text(&[9, 0]).is_err(), "an unknown version");
        let count = bytes
            .windows(2)
            .position(|w| w == [3, 3])
            .expect("the keywords' count, then the first keyword's length");
        let mut more = bytes.clone();
        more[count] = 0x7f;
        assert!(decode_record(&more, Some(&scope)).is_err());
        let meta = ScopeMeta::default();
        let mut want = vec![FORMAT_VERSION];
        want.extend(postcard::to_stdvec(&meta).expect("postcard"));
        assert_eq!(encode(&meta).expect("encode"), want);
    }

    #[test]
    fn active_keys_sort_newest_first_within_a_scope_and_kind() {
        let s = ScopeKey::parse("repo:a/b").expect("valid");
        assert!(active_key(&s, Kind::Fact, 9) < active_key(&s, Kind::Fact, 3));
        assert!(active_key(&s, Kind::Fact, 0) < active_key(&s, Kind::Summary, 99));
        let longer = ScopeKey::parse("repo:a/bc").expect("valid");
        assert!(!active_key(&longer, Kind::Fact, 1).starts_with(&active_prefix(&s, Kind::Fact)));
    }

    #[test]
    fn unknown_versions_are_errors_not_panics() {
        let bytes = encode(&ScopeMeta {
            next_seq: 3,
            active: 2,
        })
        .expect("encodes");
        assert_eq!(
            decode::<ScopeMeta>(&bytes, "meta")
                .expect("decodes")
                .next_seq,
            3
        );
        let mut future = bytes.clone();
        future[0] = 9;
        let e = decode::<ScopeMeta>(&future, "meta").expect_err("version 9");
        assert!(e.to_string().contains("format version 9"), "{e}");
        assert!(decode::<ScopeMeta>(&[], "meta").is_err());
        assert!(decode_record(&[FORMAT_VERSION, 0xff, 0xff], None).is_err());
    }

    #[test]
    fn a_written_entry_is_marked_as_leaving_its_text_and_an_imported_one_is_not() {
        let scope = ScopeKey::parse("repo:acme/app").expect("scope");
        let mut d = Decision::new(1_000, &scope, DecisionEvent::Inserted);
        d.ids.push(scope.record_id(4));
        d.texts.push("run npm ci first".to_owned());
        let written = encode_written_decision(&d).expect("encodes");
        assert_eq!(written[0], DECISION_TEXT_IN_RECORD);
        let read = decode_decision(&written).expect("decodes");
        assert!(read.texts.is_empty());
        assert_eq!(text_record(&written, &read), Some(4));
        let of_scope = decode_decision_of(&written, &scope).expect("decodes");
        assert_eq!(of_scope, read);
        // Stored whole without a text (an import's): its own, whatever record bears its id.
        d.texts.clear();
        let whole = encode_decision(&d).expect("encodes");
        assert_eq!(whole[0], FORMAT_VERSION);
        let read = decode_decision(&whole).expect("decodes");
        assert_eq!(text_record(&whole, &read), None);
        // ...which format 6 wrote for a write's own entry, unmarked.
        assert_eq!(format6_text_record(&whole, &read), Some(4));
        assert_eq!(mark_text_in_record(whole.clone()), written);
        // A write's entry naming another scope's record, or none, or a rejection, holds its text.
        let other = ScopeKey::parse("repo:acme/web").expect("scope");
        for (event, id) in [
            (DecisionEvent::Inserted, other.record_id(4)),
            (DecisionEvent::Rejected, scope.record_id(4)),
        ] {
            let mut d = Decision::new(1_000, &scope, event);
            d.ids.push(id);
            d.texts.push("a text".to_owned());
            let stored = encode_written_decision(&d).expect("encodes");
            assert_eq!(stored[0], FORMAT_VERSION, "{event:?}");
            assert_eq!(decode_decision(&stored).expect("decodes"), d);
        }
        // A marked value of another event (only damage writes one) names no record's text.
        let mut rejected = Decision::new(1_000, &scope, DecisionEvent::Rejected);
        rejected.ids.push(scope.record_id(4));
        let marked = mark_text_in_record(encode_decision(&rejected).expect("encodes"));
        let read = decode_decision(&marked).expect("decodes");
        assert_eq!(text_record(&marked, &read), None);
        let mut future = written;
        future[0] = 3;
        let e = decode_decision(&future).expect_err("version 3");
        assert!(e.to_string().contains("format version 3"), "{e}");
    }

    #[test]
    fn a_format_6_entry_is_its_records_only_when_written_with_it() {
        let scope = ScopeKey::parse("repo:acme/app").expect("scope");
        let r = Record {
            created_at: 5_000,
            status: Status::Evicted,
            ..full_record(&scope)
        };
        let entry = |event, time, age_ms| {
            let mut d = Decision::new(time, &scope, event);
            d.ids.push(scope.record_id(7));
            d.age_ms = age_ms;
            d
        };
        // As a write journals them: an insertion at the creation, an eviction aged from it
        // (an age of 0 for a record inserted and evicted by the same write).
        assert!(format6_written_with(
            &entry(DecisionEvent::Inserted, 5_000, None),
            &r
        ));
        assert!(format6_written_with(
            &entry(DecisionEvent::Evicted, 9_000, Some(4_000)),
            &r
        ));
        assert!(format6_written_with(
            &entry(DecisionEvent::Evicted, 5_000, Some(0)),
            &r
        ));
        // About another record 4: another time, another age, or none.
        assert!(!format6_written_with(
            &entry(DecisionEvent::Inserted, 4_999, None),
            &r
        ));
        assert!(!format6_written_with(
            &entry(DecisionEvent::Evicted, 9_000, Some(3_999)),
            &r
        ));
        assert!(!format6_written_with(
            &entry(DecisionEvent::Evicted, 9_000, None),
            &r
        ));
        assert!(!format6_written_with(
            &entry(DecisionEvent::Forgotten, 5_000, None),
            &r
        ));
    }

    #[test]
    fn counters_keys_round_trip() {
        let s = ScopeKey::parse("user:slack:U1").expect("valid");
        let k = counters_key(20_000, &s);
        assert_eq!(parse_counters_key(&k), Some((20_000, s)));
        assert!(
            counters_key(1, &ScopeKey::parse("z:z").expect("valid"))
                < counters_key(2, &ScopeKey::parse("a:a").expect("valid"))
        );
    }
}
