//! What happened in one scope on one UTC day: the counters every write adds to, and their
//! renderings (the day line, `lessons stats`, `/metrics`).
//!
//! **Invariant:** `DayCounters::events` is the one order every rendering shows the counters in;
//! `rejected_by` is the detail of `rejected` and never a counter of its own.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{ScopeKey, Tally, WriteCounts};

/// What happened in one scope on one UTC day.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DayCounters {
    /// Facts an extractor offered.
    pub offered: u64,
    /// Facts the gate rejected.
    pub rejected: u64,
    /// Rejections by marker name (a fact with two markers counts under both).
    pub rejected_by: BTreeMap<String, u64>,
    /// Candidates that restated a record.
    pub restated: u64,
    /// Facts inserted.
    pub inserted: u64,
    /// Candidates deduplicated onto a record.
    pub deduped: u64,
    /// Records superseded.
    pub superseded: u64,
    /// Records evicted by the cap.
    pub evicted: u64,
    /// Facts swept for carrying a marker.
    pub swept: u64,
    /// Records forgotten.
    pub forgotten: u64,
    /// Summaries inserted.
    pub summaries: u64,
}

impl DayCounters {
    /// The counters as (name, value), in the order every rendering shows them (the day line,
    /// `lessons stats`, `/metrics`); `rejected_by` is the detail of `rejected`.
    pub fn events(&self) -> [(&'static str, u64); 10] {
        [
            ("offered", self.offered),
            ("rejected", self.rejected),
            ("restated", self.restated),
            ("inserted", self.inserted),
            ("deduped", self.deduped),
            ("superseded", self.superseded),
            ("evicted", self.evicted),
            ("swept", self.swept),
            ("forgotten", self.forgotten),
            ("summaries", self.summaries),
        ]
    }

    fn events_mut(&mut self) -> [&mut u64; 10] {
        [
            &mut self.offered,
            &mut self.rejected,
            &mut self.restated,
            &mut self.inserted,
            &mut self.deduped,
            &mut self.superseded,
            &mut self.evicted,
            &mut self.swept,
            &mut self.forgotten,
            &mut self.summaries,
        ]
    }

    /// Adds a reflection's gate counts.
    pub fn add_tally(&mut self, t: &Tally) {
        self.offered += t.offered;
        self.rejected += t.rejected;
        for (marker, n) in &t.rejected_by {
            *self.rejected_by.entry(marker.clone()).or_default() += n;
        }
    }

    /// `name n, name n, …` for every event; `rejected_detail` adds the markers after
    /// `rejected` (`rejected 2 (sha 1, count 1)`).
    pub fn line(&self, rejected_detail: bool) -> String {
        let mut parts = Vec::with_capacity(10);
        for (name, n) in self.events() {
            if name == "rejected" && rejected_detail && !self.rejected_by.is_empty() {
                let by: Vec<String> = self
                    .rejected_by
                    .iter()
                    .map(|(m, n)| format!("{m} {n}"))
                    .collect();
                parts.push(format!("{name} {n} ({})", by.join(", ")));
            } else {
                parts.push(format!("{name} {n}"));
            }
        }
        parts.join(", ")
    }

    /// Adds what one write did.
    pub fn add_write(&mut self, counts: &WriteCounts, summaries: u64, tally: Option<&Tally>) {
        self.restated += counts.restated;
        // Facts only: summaries have their own counter.
        self.inserted += counts.inserted.saturating_sub(summaries);
        self.deduped += counts.deduped;
        self.superseded += counts.superseded;
        self.evicted += counts.evicted;
        self.summaries += summaries;
        if let Some(t) = tally {
            self.add_tally(t);
        }
    }

    /// Adds another day's counters.
    pub fn merge(&mut self, o: &DayCounters) {
        for (mine, (_, theirs)) in self.events_mut().into_iter().zip(o.events()) {
            *mine += theirs;
        }
        for (marker, n) in &o.rejected_by {
            *self.rejected_by.entry(marker.clone()).or_default() += n;
        }
    }
}

/// One scope's counters on one day.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DayStats {
    /// `YYYY-MM-DD`, UTC.
    pub day: String,
    /// The scope.
    pub scope_key: ScopeKey,
    /// The counters.
    pub counters: DayCounters,
}
