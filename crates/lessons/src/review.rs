//! The verdict a maintainer reads a week after a release: the three signals of the design record
//! (its decisions: docs/design.md), per scope, with the evidence behind each.
//!
//! 1. **Inserted facts per repository per day** against a ceiling (40): above it the 24-record
//!    window turns over too fast for a lesson to be seen; reported with the window's turnover
//!    in days at the current rate.
//! 2. **Rejected ÷ offered** against 1 in 10: a gate that refuses more means the extractor writes
//!    status; the rejected texts are shown grouped by marker.
//! 3. **Restated against inserted** per repository: more restatements than new lessons means the
//!    extractor merges what it should keep apart; up to 20 restatements are shown beside the
//!    records they strengthened.
//!
//! Plus the status rows a sweep would retire today and the lessons evicted without ever being
//! used. Counts come from the day counters; evidence from the decision journal.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::decisions::{Decision, DecisionEvent, DecisionQuery};
use crate::error::Result;
use crate::limits::MAX_JOURNAL_LIMIT;
use crate::model::{Kind, ScopeKey};
use crate::store::{DayCounters, MemoryStore};
use crate::time::{day_of, format_day};

/// The thresholds (configurable: `reviewMaxInsertedPerDay`, `reviewMaxRejectedRatio`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    /// Inserted facts per repository scope per day above which signal 1 fires (default 40).
    pub max_inserted_per_day: f64,
    /// Rejected ÷ offered above which signal 2 fires (default 0.1).
    pub max_rejected_ratio: f64,
    /// The window a run sees (default 24), for the turnover.
    pub window: usize,
}

impl Default for Thresholds {
    fn default() -> Thresholds {
        Thresholds {
            max_inserted_per_day: 40.0,
            max_rejected_ratio: 0.1,
            window: 24,
        }
    }
}

/// One signal: its value, its threshold, and whether it fired.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Signal {
    /// `inserted`, `rejected` or `restated`.
    pub name: &'static str,
    /// The measured value.
    pub value: f64,
    /// The threshold it is held against.
    pub threshold: f64,
    /// Whether it fired.
    pub fired: bool,
}

/// A restatement beside the record it strengthened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Restatement {
    /// When.
    pub time: i64,
    /// The restating fact.
    pub text: String,
    /// The record it strengthened.
    pub target_id: String,
    /// That record's text at that moment.
    pub target_text: String,
}

/// A record, briefly.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Item {
    /// Its id.
    pub id: String,
    /// Its text.
    pub text: String,
    /// Its age when evicted, in milliseconds (evictions only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub age_ms: Option<i64>,
}

/// One scope's review.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScopeReview {
    /// The scope.
    pub scope_key: ScopeKey,
    /// Active records now.
    pub active: u64,
    /// The scope's counters summed over the period.
    pub counters: DayCounters,
    /// Inserted facts per day over the period.
    pub inserted_per_day: f64,
    /// How many days a lesson stays in the window at that rate (absent when nothing was
    /// inserted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_turnover_days: Option<f64>,
    /// The signals that apply to this scope (1 and 3 to repository scopes, 2 to any scope that
    /// was offered facts).
    pub signals: Vec<Signal>,
    /// Rejected texts by marker (newest first, at most 20 per marker).
    pub rejected_by_marker: BTreeMap<String, Vec<String>>,
    /// Up to 20 restatements, newest first.
    pub restatements: Vec<Restatement>,
    /// Active facts a sweep would retire today.
    pub sweepable: Vec<Item>,
    /// Lessons evicted without ever being used, newest first.
    pub evicted_unused: Vec<Item>,
}

/// The whole review.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Review {
    /// The first day covered (`YYYY-MM-DD`, UTC).
    pub since: String,
    /// Days covered, today included.
    pub days: u32,
    /// Per scope.
    pub scopes: Vec<ScopeReview>,
    /// `scope: signal` for every signal that fired.
    pub fired: Vec<String>,
}

impl Review {
    /// The review of the last `days` days (clamped to 1..=3650, today included) as of `now`
    /// before any scope is reviewed: its period, no scopes, nothing fired. [`review_each`]
    /// starts from it, so a writer of the answer can send its opening first.
    pub fn opening(days: u32, now: i64) -> Review {
        let days = days.clamp(1, 3650);
        Review {
            since: format_day(first_day(days, now)),
            days,
            scopes: Vec::new(),
            fired: Vec::new(),
        }
    }

    /// Whether any signal fired (`lessons review` exits 1).
    pub fn fired(&self) -> bool {
        !self.fired.is_empty()
    }
}

/// The first day (days since the epoch) of the last `days` days as of `now`, today included.
fn first_day(days: u32, now: i64) -> i64 {
    day_of(now) - i64::from(days) + 1
}

const SAMPLES: usize = 20;

/// Reviews the last `days` days (today included) of `scope`, or of every scope.
pub fn review(
    store: &dyn MemoryStore,
    days: u32,
    scope: Option<&ScopeKey>,
    now: i64,
    thresholds: &Thresholds,
) -> Result<Review> {
    let mut scopes = Vec::new();
    let mut out = review_each(store, days, scope, now, thresholds, &mut |s| {
        scopes.push(s);
        Ok(())
    })?;
    out.scopes = scopes;
    Ok(out)
}

/// [`review`], each scope's review handed to `each` as soon as it is made and not kept: the
/// returned review's `scopes` is empty, its other fields whole. A review of hundreds of scopes
/// is written out this way without holding them all (`POST /review`). An error from `each`
/// ends the review with it.
pub fn review_each(
    store: &dyn MemoryStore,
    days: u32,
    scope: Option<&ScopeKey>,
    now: i64,
    thresholds: &Thresholds,
    each: &mut dyn FnMut(ScopeReview) -> Result<()>,
) -> Result<Review> {
    let mut out = Review::opening(days, now);
    let days = out.days;
    let first = first_day(days, now);
    let since_ms = first.saturating_mul(crate::time::DAY_MS);
    let mut totals: BTreeMap<ScopeKey, DayCounters> = BTreeMap::new();
    for d in store.stats(first)? {
        totals.entry(d.scope_key).or_default().merge(&d.counters);
    }
    let scopes: Vec<ScopeKey> = match scope {
        Some(s) => vec![s.clone()],
        None => {
            // Scopes with records, and those with only counters (every record forgotten).
            let mut all: std::collections::BTreeSet<ScopeKey> =
                store.scopes()?.into_iter().collect();
            all.extend(totals.keys().cloned());
            all.into_iter().collect()
        }
    };
    for s in scopes {
        let counters = totals.get(&s).cloned().unwrap_or_default();
        let r = scope_review(store, &s, counters, days, since_ms, thresholds)?;
        for sig in r.signals.iter().filter(|sig| sig.fired) {
            out.fired.push(format!("{}: {}", s, sig.name));
        }
        each(r)?;
    }
    Ok(out)
}

fn scope_review(
    store: &dyn MemoryStore,
    scope: &ScopeKey,
    counters: DayCounters,
    days: u32,
    since_ms: i64,
    t: &Thresholds,
) -> Result<ScopeReview> {
    let inserted_per_day = counters.inserted as f64 / f64::from(days);
    let signals = signals(scope, &counters, inserted_per_day, t);
    // The evidence, read newest first by event, each entry as it comes, and no further than
    // the evidence goes: the cost follows the evidence, not the journal's length. `page` is
    // the first read's size for a store that answers in pages (see `visit_decisions`).
    let read = |query: DecisionQuery, page: usize, visit: &mut dyn FnMut(Decision) -> bool| {
        store.visit_decisions(scope, &query, page, visit)
    };
    let of = |event: DecisionEvent| DecisionQuery {
        since: since_ms,
        events: vec![event],
        limit: MAX_JOURNAL_LIMIT,
        never_used: false,
    };
    // The rejected texts, 20 per marker. The day counters say which markers the window holds
    // and how often, so the read stops once each has its samples; without counters (a journal
    // imported alone) it reads as far as a journal read may.
    let expected = &counters.rejected_by;
    let mut rejected_by_marker: BTreeMap<String, Vec<String>> = BTreeMap::new();
    read(
        of(DecisionEvent::Rejected),
        SAMPLES * expected.len().max(1),
        &mut |d| {
            for m in &d.markers {
                let list = rejected_by_marker.entry(m.clone()).or_default();
                if list.len() < SAMPLES {
                    list.extend(d.texts.first().cloned());
                }
            }
            let complete = !expected.is_empty()
                && expected.iter().all(|(m, n)| {
                    rejected_by_marker.get(m).map_or(0, Vec::len) >= SAMPLES.min(*n as usize)
                });
            !complete
        },
    )?;
    let mut restatements = Vec::new();
    read(of(DecisionEvent::Restated), SAMPLES, &mut |d| {
        restatements.push(Restatement {
            time: d.time,
            text: d.texts.first().cloned().unwrap_or_default(),
            target_id: d.ids.first().cloned().unwrap_or_default(),
            target_text: d.texts.get(1).cloned().unwrap_or_default(),
        });
        restatements.len() < SAMPLES
    })?;
    // Evictions of records never retrieved, 100 of them: the store keeps them under a key of
    // their own, so only they are read. The check stays for a server that predates
    // `neverUsed` and answers every eviction.
    let mut evicted_unused = Vec::new();
    let never_used = DecisionQuery {
        never_used: true,
        ..of(DecisionEvent::Evicted)
    };
    read(never_used, SAMPLES * 5, &mut |d| {
        if d.never_used() {
            evicted_unused.push(Item {
                id: d.ids.first().cloned().unwrap_or_default(),
                text: d.texts.first().cloned().unwrap_or_default(),
                age_ms: d.age_ms,
            });
        }
        evicted_unused.len() < SAMPLES * 5
    })?;
    Ok(ScopeReview {
        scope_key: scope.clone(),
        active: store.active_count(scope)?,
        window_turnover_days: (inserted_per_day > 0.0).then(|| t.window as f64 / inserted_per_day),
        inserted_per_day,
        counters,
        signals,
        rejected_by_marker,
        restatements,
        sweepable: sweepable(store, scope)?,
        evicted_unused,
    })
}

/// The three signals of a scope's counters: inserted per day and restated against inserted
/// for a repository, the rejected share for any scope that was offered facts.
fn signals(
    scope: &ScopeKey,
    counters: &DayCounters,
    inserted_per_day: f64,
    t: &Thresholds,
) -> Vec<Signal> {
    let repo = scope.as_str().starts_with("repo:");
    let mut signals = Vec::new();
    if repo {
        signals.push(Signal {
            name: "inserted",
            value: inserted_per_day,
            threshold: t.max_inserted_per_day,
            fired: inserted_per_day > t.max_inserted_per_day,
        });
    }
    if counters.offered > 0 {
        let ratio = counters.rejected as f64 / counters.offered as f64;
        signals.push(Signal {
            name: "rejected",
            value: ratio,
            threshold: t.max_rejected_ratio,
            fired: ratio > t.max_rejected_ratio,
        });
    }
    if repo {
        signals.push(Signal {
            name: "restated",
            value: counters.restated as f64,
            threshold: counters.inserted as f64,
            fired: counters.restated > counters.inserted,
        });
    }
    signals
}

/// The facts a sweep would retire now (a dry run), with their texts.
fn sweepable(store: &dyn MemoryStore, scope: &ScopeKey) -> Result<Vec<Item>> {
    let receipt = store.sweep(scope, true)?;
    let mut sweepable = Vec::new();
    for id in receipt.ids {
        if let Some(r) = store.get(&id)? {
            if r.kind == Kind::Fact {
                sweepable.push(Item {
                    id,
                    text: r.text,
                    age_ms: None,
                });
            }
        }
    }
    Ok(sweepable)
}

/// The review as a person reads it: one block per scope, the fired signals first.
pub fn render(review: &Review) -> String {
    let mut out = format!(
        "lessons review: {} day(s) since {}; {}\n",
        review.days,
        review.since,
        if review.fired() {
            format!("FIRED: {}", review.fired.join(", "))
        } else {
            "no signal fired".to_owned()
        }
    );
    for s in &review.scopes {
        out.push_str(&format!("\n{}: {}\n", s.scope_key, s.counters.line(true)));
        for sig in &s.signals {
            let verdict = if sig.fired { "FIRES" } else { "ok" };
            let line = match sig.name {
                "inserted" => format!(
                    "  [{verdict}] inserted {:.1}/day (threshold {}){}",
                    sig.value,
                    sig.threshold,
                    s.window_turnover_days
                        .map(|d| format!("; a lesson stays in the window {d:.1} days"))
                        .unwrap_or_default()
                ),
                "rejected" => format!(
                    "  [{verdict}] rejected {:.0}% of offered (threshold {:.0}%)",
                    sig.value * 100.0,
                    sig.threshold * 100.0
                ),
                _ => format!(
                    "  [{verdict}] restated {} vs inserted {}",
                    sig.value, sig.threshold
                ),
            };
            out.push_str(&line);
            out.push('\n');
        }
        for (marker, texts) in &s.rejected_by_marker {
            out.push_str(&format!("  rejected for {marker}: {} shown\n", texts.len()));
            for t in texts {
                out.push_str(&format!("    - {}\n", one_line(t)));
            }
        }
        if !s.restatements.is_empty() {
            out.push_str(&format!(
                "  restatements ({} shown):\n",
                s.restatements.len()
            ));
            for r in &s.restatements {
                out.push_str(&format!(
                    "    - {}\n      restated {}: {}\n",
                    one_line(&r.text),
                    r.target_id,
                    one_line(&r.target_text)
                ));
            }
        }
        if !s.sweepable.is_empty() {
            out.push_str(&format!("  a sweep would retire {}:\n", s.sweepable.len()));
            for i in &s.sweepable {
                out.push_str(&format!("    - {} {}\n", i.id, one_line(&i.text)));
            }
        }
        if !s.evicted_unused.is_empty() {
            out.push_str(&format!(
                "  evicted without ever being used: {}\n",
                s.evicted_unused.len()
            ));
        }
    }
    out
}

/// A text on one line, at most 160 characters.
fn one_line(text: &str) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() > 160 {
        let cut: String = flat.chars().take(157).collect();
        format!("{cut}...")
    } else {
        flat
    }
}
