//! Where a record lives and what it is called: [`ScopeKey`] (`org:…`, `repo:…`, `channel:…`,
//! `user:…`) and [`RecordId`] (`mem:<scope>:<seq>`), read from text once and carried typed.
//!
//! The store joins a scope and its keys with NUL, and a record id splits at its last `:`, so both
//! rules are checked where the text comes in and nowhere after.
//!
//! **Invariant:** a `ScopeKey` is non-empty, ≤ 200 characters, and holds no whitespace, control,
//! format, private-use or unassigned character (so never NUL).
//! **Invariant:** `RecordId::parse` reads exactly what `ScopeKey::record_id` writes: the sequence
//! number in decimal, without leading zeros.

use std::fmt;
use std::sync::{Arc, LazyLock};

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::limits::MAX_SCOPE_KEY_CHARS;
use crate::text::utf16_len;

/// Characters a scope key may not hold: whitespace (both JavaScript's and Unicode's), control,
/// format, private-use and unassigned characters.
// A constant pattern, compiled by every test that parses a scope key.
#[allow(clippy::expect_used)]
static FORBIDDEN_IN_SCOPE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"[\p{White_Space}\u{FEFF}\p{Cc}\p{Cf}\p{Co}\p{Cn}]")
        .expect("scope key pattern compiles")
});

/// Where a record lives: `org:<org>`, `repo:<owner>/<name>`, `channel:<id>`, `user:<id>`.
///
/// Non-empty, at most 200 characters, no whitespace, control, format, private-use or unassigned
/// characters. It never contains NUL, which the store uses as the key separator.
///
/// Cloning is a reference-count increment: every record read carries its scope.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopeKey(Arc<str>);

impl Serialize for ScopeKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl ScopeKey {
    /// Validates `key`; an invalid key is an [`ErrorKind::Invalid`](crate::error::ErrorKind) error
    /// whose message names the rule.
    pub fn parse(key: &str) -> crate::error::Result<ScopeKey> {
        ScopeKey::parse_reason(key).map_err(crate::error::Error::invalid)
    }

    /// [`ScopeKey::parse`] with the reason as text, for validators that compose reasons.
    pub(crate) fn parse_reason(key: &str) -> Result<ScopeKey, String> {
        if key.is_empty() {
            return Err("scopeKey must not be empty".into());
        }
        if utf16_len(key) > MAX_SCOPE_KEY_CHARS {
            return Err(format!(
                "scopeKey must be at most {MAX_SCOPE_KEY_CHARS} characters"
            ));
        }
        if let Some(m) = FORBIDDEN_IN_SCOPE.find(key) {
            let c = m.as_str().chars().next().unwrap_or(' ');
            return Err(format!(
                "scopeKey must not contain whitespace, control, format, private-use or unassigned characters (found U+{:04X})",
                c as u32
            ));
        }
        Ok(ScopeKey(Arc::from(key)))
    }

    /// The key of a scope `kind` (`org`, `repo`, `channel`, `user`) from an id without its
    /// prefix (`acme/app`; an id that repeats the prefix, `repo:acme/app`, means the same).
    /// A repository id must be `OWNER/NAME`.
    pub fn of(kind: &str, id: &str) -> crate::error::Result<ScopeKey> {
        let id = id.strip_prefix(&format!("{kind}:")).unwrap_or(id);
        if kind == "repo" && !id.contains('/') {
            return Err(crate::error::Error::invalid(format!(
                "repo must be OWNER/NAME, not {id:?}"
            )));
        }
        ScopeKey::parse_reason(&format!("{kind}:{id}"))
            .map_err(|e| crate::error::Error::invalid(format!("{kind}: {e}")))
    }

    /// A key read back from the store, which validated it on the way in.
    pub(crate) fn trusted(key: &str) -> ScopeKey {
        ScopeKey(Arc::from(key))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The scope kind (`org`, `repo`, `channel`, `user`) if the key has one of those prefixes.
    pub fn kind(&self) -> Option<&str> {
        let (kind, rest) = self.0.split_once(':')?;
        (matches!(kind, "org" | "repo" | "channel" | "user") && !rest.is_empty()).then_some(kind)
    }

    /// The sequence number of `id` if it names a record of this scope (the inverse of
    /// `record_id`), without parsing the scope again or allocating: a write asks it of every
    /// journal entry it stores.
    pub fn record_seq(&self, id: &str) -> Option<u64> {
        let (scope, seq) = split_record_id(id)?;
        (scope == self.as_str()).then_some(seq)
    }

    /// The id of the `seq`-th record of this scope: `mem:<scope>:<seq>`.
    pub fn record_id(&self, seq: u64) -> String {
        // Built by hand: every record read makes one, and `format!` costs more than the copy.
        let mut digits = [0u8; 20];
        let mut n = seq;
        let mut i = digits.len();
        loop {
            i -= 1;
            if let Some(d) = digits.get_mut(i) {
                *d = b'0' + (n % 10) as u8;
            }
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let mut id = String::with_capacity(5 + self.0.len() + (digits.len() - i));
        id.push_str("mem:");
        id.push_str(&self.0);
        id.push(':');
        id.extend(
            digits
                .get(i..)
                .unwrap_or_default()
                .iter()
                .map(|&d| char::from(d)),
        );
        id
    }
}

impl fmt::Display for ScopeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ScopeKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ScopeKey::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A record's id, `mem:<scope>:<seq>`, read: the scope the record belongs to and its sequence
/// number there. Ids are strings on the wire and in records; this is what code reads them into.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordId {
    /// The record's scope.
    pub scope: ScopeKey,
    /// Its sequence number in the scope (0, 1, … in write order, never reused).
    pub seq: u64,
}

impl RecordId {
    /// Reads `mem:<scope>:<seq>`; `None` unless the scope is a valid key and `seq` a decimal
    /// `u64` without leading zeros.
    pub fn parse(id: &str) -> Option<RecordId> {
        let (scope, seq) = split_record_id(id)?;
        Some(RecordId {
            scope: ScopeKey::parse(scope).ok()?,
            seq,
        })
    }
}

impl fmt::Display for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mem:{}:{}", self.scope, self.seq)
    }
}

/// `(scope text, seq)` of `mem:<scope>:<seq>`, the scope not checked: no allocation.
pub(super) fn split_record_id(id: &str) -> Option<(&str, u64)> {
    let rest = id.strip_prefix("mem:")?;
    let (scope, seq) = rest.rsplit_once(':')?;
    if seq.is_empty()
        || !seq.bytes().all(|b| b.is_ascii_digit())
        || (seq.len() > 1 && seq.starts_with('0'))
    {
        return None;
    }
    Some((scope, seq.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_keys_validate() {
        assert!(ScopeKey::parse("repo:acme/app").is_ok());
        assert!(ScopeKey::parse("channel:slack:C0123").is_ok());
        assert!(ScopeKey::parse("").is_err());
        assert!(ScopeKey::parse("repo:acme app").is_err());
        assert!(ScopeKey::parse("repo:a\u{0}b").is_err());
        assert!(
            ScopeKey::parse("repo:a\u{200B}b").is_err(),
            "format character"
        );
        assert!(ScopeKey::parse("repo:a\u{E000}b").is_err(), "private use");
        assert!(ScopeKey::parse("repo:a\u{FEFF}").is_err());
        assert!(ScopeKey::parse(&"x".repeat(201)).is_err());
        assert!(ScopeKey::parse(&"é".repeat(200)).is_ok());
    }

    #[test]
    fn record_ids_round_trip() {
        let scope = ScopeKey::parse("channel:slack:C1").expect("valid");
        let id = scope.record_id(42);
        assert_eq!(id, "mem:channel:slack:C1:42");
        assert_eq!(scope.record_id(0), "mem:channel:slack:C1:0");
        assert_eq!(
            scope.record_id(u64::MAX),
            format!("mem:channel:slack:C1:{}", u64::MAX)
        );
        let read = RecordId::parse(&id).expect("a valid id");
        assert_eq!(read.to_string(), id);
        assert_eq!(read, RecordId { scope, seq: 42 });
        assert_eq!(RecordId::parse("mem:org:a:01"), None);
        assert_eq!(RecordId::parse("mem:org:a:"), None);
        assert_eq!(RecordId::parse("org:a:1"), None);
        assert_eq!(RecordId::parse("mem:org:a:99999999999999999999999"), None);
        assert_eq!(RecordId::parse("mem:not a scope:1"), None);
        // Its own scope's ids only, as `RecordId::parse` reads them.
        let channel = ScopeKey::parse("channel:slack:C1").expect("valid");
        assert_eq!(channel.record_seq(&id), Some(42));
        assert_eq!(
            channel.record_seq(&channel.record_id(u64::MAX)),
            Some(u64::MAX)
        );
        assert_eq!(channel.record_seq("mem:channel:slack:C1:sub:3"), None);
        assert_eq!(channel.record_seq("mem:channel:slack:C:42"), None);
        assert_eq!(channel.record_seq("mem:channel:slack:C1:01"), None);
        assert_eq!(channel.record_seq("channel:slack:C1:42"), None);
    }
}
