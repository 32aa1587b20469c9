//! The decision journal: what the store decided about each fact, kept as evidence.
//!
//! Counters say how often something happened; the journal says what: the texts the gate
//! rejected (after redaction) with their markers, each restatement beside the record it
//! strengthened (that record's text at that moment), each dedup, supersede, insert, eviction
//! (with the record's age and use count), sweep and forget. Entries are written in the same
//! atomic batch as the write they describe, so the journal never disagrees with the records.
//! They are bounded by age and by a per-scope cap, pruned off the write path.

use serde::{Deserialize, Serialize};

use crate::model::ScopeKey;

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DecisionEvent {
    /// The gate refused an offered fact (`texts[0]`, redacted; `markers`).
    Rejected,
    /// A fact restated a record: `ids[0]` the target; `texts` the restating text, then the
    /// target's text at that moment.
    Restated,
    /// A fact matched a record's normalized text: `ids[0]` the target; `texts[0]` the fact.
    Deduped,
    /// A record replaced another: `ids` old then new; `texts` old then new.
    Superseded,
    /// A new record: `ids[0]`, `texts[0]`.
    Inserted,
    /// The cap retired a record: `ids[0]`, `texts[0]`, `age_ms`, `use_count`.
    Evicted,
    /// A sweep retired a status row: `ids[0]`, `texts[0]`, `markers`.
    Swept,
    /// A person forgot a record: `ids[0]`, `texts[0]`.
    Forgotten,
}

impl DecisionEvent {
    /// Every event, in the order they are shown.
    pub const ALL: [DecisionEvent; 8] = [
        DecisionEvent::Rejected,
        DecisionEvent::Restated,
        DecisionEvent::Deduped,
        DecisionEvent::Superseded,
        DecisionEvent::Inserted,
        DecisionEvent::Evicted,
        DecisionEvent::Swept,
        DecisionEvent::Forgotten,
    ];

    /// The wire name (`rejected`, `restated`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionEvent::Rejected => "rejected",
            DecisionEvent::Restated => "restated",
            DecisionEvent::Deduped => "deduped",
            DecisionEvent::Superseded => "superseded",
            DecisionEvent::Inserted => "inserted",
            DecisionEvent::Evicted => "evicted",
            DecisionEvent::Swept => "swept",
            DecisionEvent::Forgotten => "forgotten",
        }
    }

    /// The event named `name`.
    pub fn parse(name: &str) -> Option<DecisionEvent> {
        DecisionEvent::ALL.into_iter().find(|e| e.as_str() == name)
    }
}

/// One journal entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// Milliseconds since the epoch.
    pub time: i64,
    /// The scope the decision was made in.
    pub scope_key: ScopeKey,
    /// What happened.
    pub event: DecisionEvent,
    /// The records involved (see [`DecisionEvent`] for the order).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<String>,
    /// The texts involved (see [`DecisionEvent`] for the order).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub texts: Vec<String>,
    /// Gate markers (rejections and sweeps).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub markers: Vec<String>,
    /// The thread the fact came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_thread_key: Option<String>,
    /// The run the fact came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_run_id: Option<String>,
    /// An evicted record's age, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_ms: Option<i64>,
    /// An evicted record's use count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_count: Option<u64>,
}

impl Decision {
    /// An entry with no ids, texts or details yet.
    pub fn new(time: i64, scope_key: &ScopeKey, event: DecisionEvent) -> Decision {
        Decision {
            time,
            scope_key: scope_key.clone(),
            event,
            ids: Vec::new(),
            texts: Vec::new(),
            markers: Vec::new(),
            source_thread_key: None,
            source_run_id: None,
            age_ms: None,
            use_count: None,
        }
    }

    /// Whether this is the eviction of a record that was never used.
    pub fn never_used(&self) -> bool {
        self.event == DecisionEvent::Evicted && self.use_count == Some(0)
    }

    /// Checks an entry read from an export.
    pub fn validate(&self) -> crate::error::Result<()> {
        let too_long = self.texts.iter().any(|t| t.len() > 64 * 1024)
            || self.ids.len() > 16
            || self.texts.len() > 16
            || self.markers.len() > 16;
        if too_long {
            return Err(crate::error::Error::invalid(
                "a journal entry holds more or longer fields than the store writes",
            ));
        }
        Ok(())
    }
}

/// A fact the gate refused, carried from the reflection to the write that journals it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RejectedFact {
    /// The fact, after secret redaction.
    pub text: String,
    /// The markers it carried.
    pub markers: Vec<String>,
}

/// Filters of a journal read: newest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecisionQuery {
    /// Only entries at or after this time (milliseconds).
    pub since: i64,
    /// Only these events (all when empty).
    pub events: Vec<DecisionEvent>,
    /// At most this many entries.
    pub limit: usize,
    /// Only evictions of records that were never used (`use_count` 0): the lessons a review
    /// shows as written for nothing. Every other event is left out.
    pub never_used: bool,
}

impl Default for DecisionQuery {
    fn default() -> DecisionQuery {
        DecisionQuery {
            since: i64::MIN,
            events: Vec::new(),
            limit: 100,
            never_used: false,
        }
    }
}

impl DecisionQuery {
    /// Whether `d` passes the filters (the limit aside).
    pub fn keeps(&self, d: &Decision) -> bool {
        d.time >= self.since
            && (self.events.is_empty() || self.events.contains(&d.event))
            && (!self.never_used || d.never_used())
    }
}

/// Entries older than this many days are pruned (configurable: `journalDays`).
pub const DEFAULT_JOURNAL_DAYS: u32 = 90;
/// Entries per scope beyond this are pruned, oldest first (configurable: `journalCap`).
pub const DEFAULT_JOURNAL_CAP: usize = 10_000;

/// The on-disk form: positional (postcard), so every field is always written. `S` is how the
/// scope key is held: owned where the entry's scope is not known beforehand, borrowed from the
/// stored bytes where a read of one scope only compares it.
#[derive(Serialize, Deserialize)]
pub(crate) struct DecisionDisk<S = String> {
    time: i64,
    scope_key: S,
    event: DecisionEvent,
    ids: Vec<String>,
    texts: Vec<String>,
    markers: Vec<String>,
    source_thread_key: Option<String>,
    source_run_id: Option<String>,
    age_ms: Option<i64>,
    use_count: Option<u64>,
}

impl From<&Decision> for DecisionDisk {
    fn from(d: &Decision) -> DecisionDisk {
        DecisionDisk::of(d, true)
    }
}

impl DecisionDisk {
    /// `d` on disk, with its texts or without them (a text its record holds).
    pub(crate) fn of(d: &Decision, texts: bool) -> DecisionDisk {
        DecisionDisk {
            time: d.time,
            scope_key: d.scope_key.as_str().to_owned(),
            event: d.event,
            ids: d.ids.clone(),
            texts: if texts { d.texts.clone() } else { Vec::new() },
            markers: d.markers.clone(),
            source_thread_key: d.source_thread_key.clone(),
            source_run_id: d.source_run_id.clone(),
            age_ms: d.age_ms,
            use_count: d.use_count,
        }
    }

    pub(crate) fn into_decision(self) -> crate::error::Result<Decision> {
        let scope = ScopeKey::parse(&self.scope_key)
            .map_err(|e| crate::error::Error::format(format!("a journal entry's scope: {e}")))?;
        Ok(self.with_scope(scope))
    }
}

impl<S: AsRef<str>> DecisionDisk<S> {
    /// The entry, read under `scope`'s prefix: its scope must be that one (it is not parsed
    /// again; the key was validated when the entry was written).
    pub(crate) fn into_decision_of(self, scope: &ScopeKey) -> crate::error::Result<Decision> {
        if self.scope_key.as_ref() != scope.as_str() {
            return Err(crate::error::Error::format(format!(
                "a journal entry of {:?} is stored under {scope}",
                self.scope_key.as_ref()
            )));
        }
        Ok(self.with_scope(scope.clone()))
    }

    fn with_scope(self, scope_key: ScopeKey) -> Decision {
        Decision {
            time: self.time,
            scope_key,
            event: self.event,
            ids: self.ids,
            texts: self.texts,
            markers: self.markers,
            source_thread_key: self.source_thread_key,
            source_run_id: self.source_run_id,
            age_ms: self.age_ms,
            use_count: self.use_count,
        }
    }
}
