//! Reflection: the extractor's prompt, reading its reply, and routing what it found to scopes.
//! (Over 600 lines: the prompt, the reply parser and the router share the shown-set handles and
//! are tested together; about 260 lines are tests.)
//!
//! After a run, one model call reads the transcript tail and the records the run was shown, and
//! answers JSON: at most five facts (lessons: what fails or surprises, why, what to do), each
//! with an audience and optionally a pointer (`supersedes` a contradicted shown record,
//! `restates` a re-taught one), and a short summary. [`parse_reflection`] never fails: it
//! returns what it could read, what it dropped and why. Every fact passes the gate; a fact with
//! a marker is counted as rejected, by marker. Pointers only survive when they name the shown
//! set, so an invented id can never resolve.
//!
//! **Invariant:** pure: no IO.
//! **Invariant:** no fact text ever reaches a log line: outcome lines carry counts only.
//! **Invariant:** secrets are redacted from the transcript, every fact and every keyword.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::gate::rejection_markers;
use crate::model::Tally;
use crate::model::{Candidate, Record, RecordId, ScopeKey};
use crate::redact::redact_secrets;
use crate::text::{floor_char_boundary, tail_utf16, utf16_len};

/// Facts accepted from one reply at most.
pub(crate) const MAX_FACTS: usize = 5;
/// Keywords kept per fact at most.
pub(crate) const MAX_FACT_KEYWORDS: usize = 10;
/// Facts below this confidence are dropped (not rejected: the model was unsure, not wrong).
pub(crate) const MIN_CONFIDENCE: f64 = 0.6;
/// The transcript tail the extractor reads, in UTF-16 units.
pub(crate) const TRANSCRIPT_TAIL: usize = 24_000;
/// The query of the reflection-time retrieve (request + answer), in UTF-16 units at most.
pub(crate) const SHOWN_QUERY_UNITS: usize = 2_000;
/// Records per scope the reflection-time retrieve shows the extractor.
pub(crate) const SHOWN_PER_SCOPE: usize = 8;

/// Who a fact is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Audience {
    /// Every repository of the organization.
    Org,
    /// The run's repository.
    Repo,
    /// The run's channel.
    Channel,
    /// The run's user.
    User,
}

impl Audience {
    /// Parses an audience; anything unknown is `org`.
    pub fn parse(s: &str) -> Audience {
        match s.trim().to_ascii_lowercase().as_str() {
            "repo" | "repository" => Audience::Repo,
            "channel" => Audience::Channel,
            "user" => Audience::User,
            _ => Audience::Org,
        }
    }

    /// How narrow it is: user (3), repo (2), channel (1), org (0).
    fn narrowness(self) -> u8 {
        match self {
            Audience::User => 3,
            Audience::Repo => 2,
            Audience::Channel => 1,
            Audience::Org => 0,
        }
    }
}

/// A record as the extractor sees it: a short handle instead of its id.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shown {
    /// `1`, `2`, … in the order shown.
    pub handle: String,
    /// The record id the handle stands for.
    pub id: String,
}

/// The extractor's prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtractorPrompt {
    /// The system instructions.
    pub system: String,
    /// The input: the shown records by handle, then the transcript tail.
    pub input: String,
    /// Handle → id, to resolve the reply's pointers.
    pub shown: Vec<Shown>,
}

/// The extractor's system instructions.
pub const SYSTEM_PROMPT: &str = r#"You maintain the long-term memory of a coding bot. Read the transcript of one run and the records the run was shown, and write down what a future, unrelated run would need to know.

Write facts as lessons: what fails or surprises, why, and what to do about it. A failing check and its cause, a command that must run first, a convention of this codebase. A lesson is still true next week in a different task.

Never write status or change descriptions: no pull request or issue numbers as the subject, no commit shas, no test counts, no verdicts (merged, approved, green, ready for review), no run ids or branch names, nothing that says what a change now does or what was added, fixed or renamed. Those are rejected by a gate and wasted.

Write at most 5 facts. For each give an audience:
- "repo": true of this repository;
- "org": true of every repository of the organization;
- "channel": about how this channel works;
- "user": about this user's preferences.

If a fact contradicts a shown record, set "supersedes" to that record's handle. If a fact teaches again what a shown record already says, even in other words, set "restates" to its handle and keep your wording short. Use handles exactly as shown, like "[3]"; never invent one.

Then write one or two impersonal sentences summarizing the run.

Answer with raw JSON only, no prose and no code fence:
{"facts":[{"text":"...","keywords":["..."],"confidence":0.8,"audience":"repo","supersedes":"[n]","restates":"[n]"}],"summary":"..."}
Omit "supersedes" and "restates" when they do not apply. Use confidence between 0 and 1; below 0.6 the fact is dropped. Use at most 10 lowercase keywords. If nothing is worth keeping, answer {"facts":[]}."#;

/// The extractor's prompt for a run that was shown `shown` and produced `transcript`.
pub fn reflection_prompt(shown: &[Record], transcript: &str) -> ExtractorPrompt {
    let handles: Vec<Shown> = shown
        .iter()
        .enumerate()
        .map(|(i, r)| Shown {
            handle: (i + 1).to_string(),
            id: r.id.clone(),
        })
        .collect();
    let mut input = String::new();
    if shown.is_empty() {
        input.push_str("Records the run was shown: none.\n");
    } else {
        input.push_str("Records the run was shown (refer to them by handle):\n");
        for (h, r) in handles.iter().zip(shown) {
            // One line, whatever the record holds: a control or a line separator in a text
            // from chat cannot start a line that looks like another handle.
            let text = crate::text::one_line(&redact_secrets(&r.text));
            input.push_str(&format!("[{}] ({}) {}\n", h.handle, r.kind.as_str(), text));
        }
    }
    let redacted = redact_secrets(transcript);
    input.push_str("\nTranscript (its most recent part):\n<transcript>\n");
    input.push_str(tail_utf16(&redacted, TRANSCRIPT_TAIL));
    input.push_str("\n</transcript>");
    ExtractorPrompt {
        system: SYSTEM_PROMPT.to_owned(),
        input,
        shown: handles,
    }
}

/// One accepted fact.
#[derive(Clone, Debug, PartialEq)]
pub struct ExtractedFact {
    /// Redacted, trimmed text.
    pub text: String,
    /// Lowercased, deduplicated, redacted, at most 10.
    pub keywords: Vec<String>,
    /// In [0.6, 1] when given.
    pub confidence: Option<f64>,
    /// Who it is for.
    pub audience: Audience,
    /// A shown record it contradicts (its id).
    pub supersedes: Option<String>,
    /// A shown record it teaches again (its id).
    pub restates: Option<String>,
}

/// The summary of the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtractedSummary {
    /// Redacted, trimmed text.
    pub text: String,
    /// The narrowest audience among the accepted facts (org when there are none).
    pub audience: Audience,
}

/// What a reply held. Never an error: a malformed reply is `error` with a reason.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reflection {
    /// Accepted facts, in reply order (at most 5).
    pub facts: Vec<ExtractedFact>,
    /// The summary, if the reply had a non-empty one.
    pub summary: Option<ExtractedSummary>,
    /// Facts in the reply (`offered`) and what the gate rejected of them.
    pub tally: Tally,
    /// The rejected facts themselves (secrets redacted), for the decision journal.
    pub rejected: Vec<crate::decisions::RejectedFact>,
    /// Facts dropped for being empty, unsure (confidence below 0.6) or malformed.
    pub dropped: u64,
    /// Why nothing was read from the reply, when nothing was.
    pub error: Option<String>,
}

/// Finds the reply's JSON envelope: tolerates a code fence (closed or not), a lead-in line and
/// a trailing remark. Tries each `{` in turn, a bounded number of times.
fn find_envelope(reply: &str) -> Result<serde_json::Map<String, Value>, String> {
    let reply = &reply[..floor_char_boundary(reply, crate::limits::MAX_REPLY_BYTES)];
    let mut attempts = 0;
    let mut last_object = false;
    for (i, _) in reply.match_indices('{') {
        attempts += 1;
        if attempts > 64 {
            break;
        }
        let mut stream = serde_json::Deserializer::from_str(&reply[i..]).into_iter::<Value>();
        if let Some(Ok(Value::Object(map))) = stream.next() {
            if map.contains_key("facts") {
                return Ok(map);
            }
            last_object = true;
        }
    }
    Err(if last_object {
        "the reply's JSON object has no \"facts\" array".to_owned()
    } else {
        "the reply holds no JSON object".to_owned()
    })
}

/// Resolves a pointer from the reply to a shown record's id: a handle (`[3]`, `3`) or a full id
/// that is in the shown set. Anything else resolves to nothing.
fn resolve_pointer(value: Option<&Value>, shown: &[Shown]) -> Option<String> {
    let raw = value?.as_str()?.trim();
    if raw.is_empty() {
        return None;
    }
    let handle = raw.trim_start_matches('[').trim_end_matches(']').trim();
    shown
        .iter()
        .find(|s| s.handle == handle || s.id == raw)
        .map(|s| s.id.clone())
}

/// Redacted and trimmed; `None` when nothing but secrets, punctuation and spaces is left.
fn clean_text(value: Option<&Value>) -> Option<String> {
    let text = redact_secrets(value?.as_str()?);
    let text = text.trim_matches(crate::text::is_js_whitespace);
    let substance = text
        .replace(crate::redact::REDACTED, "")
        .chars()
        .any(char::is_alphanumeric);
    substance.then(|| text.to_owned())
}

/// Reads the extractor's `reply` against the `shown` handles. Never fails.
pub fn parse_reflection(reply: &str, shown: &[Shown]) -> Reflection {
    let mut out = Reflection::default();
    let envelope = match find_envelope(reply) {
        Ok(map) => map,
        Err(why) => {
            out.error = Some(why);
            return out;
        }
    };
    let Some(facts) = envelope.get("facts").and_then(Value::as_array) else {
        out.error = Some("\"facts\" must be an array".to_owned());
        return out;
    };
    out.tally.offered = facts.len() as u64;
    for fact in facts {
        if out.facts.len() >= MAX_FACTS {
            break;
        }
        let Some(obj) = fact.as_object() else {
            out.dropped += 1;
            continue;
        };
        let Some(text) = clean_text(obj.get("text")) else {
            out.dropped += 1;
            continue;
        };
        if utf16_len(&text) > crate::limits::MAX_TEXT_UNITS {
            out.dropped += 1;
            continue;
        }
        let confidence = match obj.get("confidence") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_f64() {
                Some(c) if c.is_finite() && (MIN_CONFIDENCE..=1.0).contains(&c) => Some(c),
                _ => {
                    out.dropped += 1;
                    continue;
                }
            },
        };
        let mut keywords: Vec<String> = Vec::new();
        if let Some(list) = obj.get("keywords").and_then(Value::as_array) {
            for k in list.iter().filter_map(Value::as_str) {
                let k = redact_secrets(k).trim().to_lowercase();
                if !k.is_empty()
                    && utf16_len(&k) <= crate::limits::MAX_KEYWORD_UNITS
                    && !keywords.contains(&k)
                    && keywords.len() < MAX_FACT_KEYWORDS
                {
                    keywords.push(k);
                }
            }
        }
        let supersedes = resolve_pointer(obj.get("supersedes"), shown);
        let restates = resolve_pointer(obj.get("restates"), shown);
        let audience = obj
            .get("audience")
            .and_then(Value::as_str)
            .map_or(Audience::Org, Audience::parse);
        let markers = rejection_markers(&text);
        if !markers.is_empty() {
            out.tally.rejected += 1;
            for m in &markers {
                *out.tally
                    .rejected_by
                    .entry(m.name().to_owned())
                    .or_default() += 1;
            }
            out.rejected.push(crate::decisions::RejectedFact {
                text: crate::redact::redact_secrets(&text),
                markers: markers.iter().map(|m| m.name().to_owned()).collect(),
            });
            continue;
        }
        out.facts.push(ExtractedFact {
            text,
            keywords,
            confidence,
            audience,
            supersedes,
            restates,
        });
    }
    let summary_text = match envelope.get("summary") {
        Some(Value::Object(o)) => clean_text(o.get("text")),
        other => clean_text(other),
    };
    if let Some(text) = summary_text {
        if utf16_len(&text) <= crate::limits::MAX_TEXT_UNITS {
            let audience = out
                .facts
                .iter()
                .map(|f| f.audience)
                .max_by_key(|a| a.narrowness())
                .unwrap_or(Audience::Org);
            out.summary = Some(ExtractedSummary { text, audience });
        }
    }
    out
}

/// Where a run's content came from, which decides where it may be written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// A public channel: every scope may be written.
    #[default]
    Public,
    /// A private channel: nothing goes to the organization.
    Private,
    /// A direct message: nothing goes to the organization; narrowing prefers the user.
    Dm,
    /// A machine trigger (CI, a schedule): every scope may be written.
    Machine,
}

impl Origin {
    /// Parses `public`, `private`, `dm` or `machine`.
    pub fn parse(s: &str) -> Option<Origin> {
        match s {
            "public" => Some(Origin::Public),
            "private" => Some(Origin::Private),
            "dm" => Some(Origin::Dm),
            "machine" => Some(Origin::Machine),
            _ => None,
        }
    }

    fn allows(self, audience: Audience) -> bool {
        !(audience == Audience::Org && matches!(self, Origin::Private | Origin::Dm))
    }
}

/// The candidates of one reflection, grouped by the scope they go to.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Routed {
    /// Fact candidates per scope, in reply order.
    pub facts: BTreeMap<ScopeKey, Vec<Candidate>>,
    /// The summary candidate and its scope.
    pub summary: Option<(ScopeKey, Candidate)>,
    /// Accepted facts that had no scope they were allowed in.
    pub dropped: u64,
    /// Facts whose scope was narrowed (their pointers removed).
    pub narrowed: u64,
}

fn scope_of(run: &crate::context::RunScopes, a: Audience) -> Option<&ScopeKey> {
    match a {
        Audience::Org => Some(&run.org),
        Audience::Repo => run.repo.as_ref(),
        Audience::Channel => run.channel.as_ref(),
        Audience::User => run.user.as_ref(),
    }
}

fn audience_of(scope: &ScopeKey) -> Audience {
    match scope.kind() {
        Some("repo") => Audience::Repo,
        Some("channel") => Audience::Channel,
        Some("user") => Audience::User,
        _ => Audience::Org,
    }
}

/// The scope an audience lands in for this run, narrowed if `origin` forbids it.
/// Returns the scope and whether it was narrowed.
fn place(
    run: &crate::context::RunScopes,
    wanted: &ScopeKey,
    origin: Origin,
) -> Option<(ScopeKey, bool)> {
    let audience = audience_of(wanted);
    if origin.allows(audience) {
        return Some((wanted.clone(), false));
    }
    let order = if origin == Origin::Dm {
        [Audience::User, Audience::Channel]
    } else {
        [Audience::Channel, Audience::User]
    };
    order
        .into_iter()
        .filter(|a| origin.allows(*a))
        .find_map(|a| scope_of(run, a).cloned())
        .map(|s| (s, true))
}

/// Routes a reflection's accepted facts and summary to the run's scopes. A fact with a resolved
/// pointer follows its target's scope; otherwise its audience's scope if the run has it, else
/// the organization. A scope the origin forbids is narrowed (dm: user, then channel; otherwise
/// channel, then user; never repo) and loses its pointers, or the fact is dropped.
pub(crate) fn route(
    reflection: &Reflection,
    run: &crate::context::RunScopes,
    origin: Origin,
    thread: &str,
    run_id: Option<&str>,
) -> Routed {
    let mut routed = Routed::default();
    for f in &reflection.facts {
        let pointer_scope = f
            .restates
            .as_deref()
            .or(f.supersedes.as_deref())
            .and_then(RecordId::parse)
            .map(|r| r.scope);
        let wanted = pointer_scope
            .or_else(|| scope_of(run, f.audience).cloned())
            .unwrap_or_else(|| run.org.clone());
        let Some((scope, narrowed)) = place(run, &wanted, origin) else {
            routed.dropped += 1;
            continue;
        };
        let mut c = Candidate::fact(f.text.clone(), thread);
        c.keywords = (!f.keywords.is_empty()).then(|| f.keywords.clone());
        c.confidence = f.confidence;
        c.source_run_id = run_id.map(str::to_owned);
        if narrowed {
            routed.narrowed += 1;
        } else {
            c.restates = f.restates.clone();
            c.supersedes = f.supersedes.clone();
        }
        routed.facts.entry(scope).or_default().push(c);
    }
    if let Some(s) = &reflection.summary {
        let wanted = scope_of(run, s.audience)
            .cloned()
            .unwrap_or_else(|| run.org.clone());
        if let Some((scope, _)) = place(run, &wanted, origin) {
            let mut c = Candidate::summary(s.text.clone(), thread);
            c.source_run_id = run_id.map(str::to_owned);
            routed.summary = Some((scope, c));
        }
    }
    routed
}

/// What one reflection did, in counts (never text).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReflectionOutcome {
    /// Facts the extractor offered and what the gate rejected (flat in JSON: `offered`,
    /// `rejected`, `rejectedBy`).
    #[serde(flatten)]
    pub tally: Tally,
    /// Facts that restated a record.
    pub restated: u64,
    /// Facts inserted.
    pub inserted: u64,
    /// Facts deduplicated onto a record.
    pub deduped: u64,
    /// Summaries written.
    pub summary: u64,
    /// Why the reply was not read, if it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ReflectionOutcome {
    /// The log line: counts only, never text.
    pub fn line(&self) -> String {
        if let Some(why) = &self.error {
            return format!("[memory] reflection output rejected ({why}); nothing written");
        }
        if self.tally.offered == 0 && self.summary == 0 {
            return "[memory] reflection: nothing to write".to_owned();
        }
        format!(
            "[memory] offered {}, rejected {}, restated {}, inserted {}, deduped {}, summary {}",
            self.tally.offered,
            self.tally.rejected,
            self.restated,
            self.inserted,
            self.deduped,
            self.summary
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::RunScopes;

    fn shown() -> Vec<Shown> {
        vec![
            Shown {
                handle: "1".into(),
                id: "mem:repo:acme/app:4".into(),
            },
            Shown {
                handle: "2".into(),
                id: "mem:org:acme:9".into(),
            },
        ]
    }

    #[test]
    fn tolerates_fences_lead_ins_and_trailing_remarks() {
        let body = r#"{"facts":[{"text":"run npm ci first","confidence":0.9,"audience":"repo"}],"summary":"The run fixed a build."}"#;
        for reply in [
            body.to_owned(),
            format!("```json\n{body}\n```"),
            format!("```json\n{body}"),
            format!("Here is the JSON:\n{body}\nHope this helps {{not json}}"),
        ] {
            let r = parse_reflection(&reply, &shown());
            assert_eq!(r.error, None, "{reply}");
            assert_eq!(r.facts.len(), 1, "{reply}");
            assert_eq!(r.summary.as_ref().map(|s| s.audience), Some(Audience::Repo));
        }
    }

    #[test]
    fn a_bad_envelope_writes_nothing_and_says_why() {
        for (reply, why) in [
            ("no json here", "no JSON object"),
            (r#"{"lessons": []}"#, "no \"facts\" array"),
            (r#"{"facts": "none"}"#, "must be an array"),
            (r#"[{"text":"x"}]"#, "no \"facts\" array"),
        ] {
            let r = parse_reflection(reply, &shown());
            assert!(
                r.error.as_deref().is_some_and(|e| e.contains(why)),
                "{reply}: {:?}",
                r.error
            );
            assert!(r.facts.is_empty());
        }
    }

    #[test]
    fn confidence_below_the_floor_is_dropped_not_rejected() {
        let reply = r#"{"facts":[{"text":"a","confidence":0.59},{"text":"b","confidence":"high"},{"text":"c","confidence":1.5},{"text":"d","confidence":0.6},{"text":"e"}]}"#;
        let r = parse_reflection(reply, &[]);
        assert_eq!(
            r.facts.iter().map(|f| f.text.as_str()).collect::<Vec<_>>(),
            ["d", "e"]
        );
        assert_eq!((r.tally.offered, r.dropped, r.tally.rejected), (5, 3, 0));
    }

    #[test]
    fn markers_reject_and_are_counted_by_name() {
        let reply = r#"{"facts":[{"text":"pull request 1835 pushed at sha 3f9a2c1 with 10,512 tests passing"},{"text":"the cache was added"},{"text":"npm ci fixes it"}]}"#;
        let r = parse_reflection(reply, &[]);
        assert_eq!((r.tally.offered, r.tally.rejected), (3, 2));
        let by: Vec<(&str, u64)> = r
            .tally
            .rejected_by
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        assert_eq!(
            by,
            [("changed", 1), ("count", 1), ("reference", 1), ("sha", 1)]
        );
        assert_eq!(r.facts.len(), 1);
    }

    #[test]
    fn at_most_five_facts_are_accepted() {
        let facts: Vec<String> = (0..8)
            .map(|i| format!(r#"{{"text":"lesson {i}"}}"#))
            .collect();
        let r = parse_reflection(&format!(r#"{{"facts":[{}]}}"#, facts.join(",")), &[]);
        assert_eq!((r.tally.offered, r.facts.len()), (8, 5));
    }

    #[test]
    fn keywords_are_lowercased_deduplicated_and_capped() {
        let kws: Vec<String> = (0..14).map(|i| format!("\"K{i}\"")).collect();
        let reply = format!(
            r#"{{"facts":[{{"text":"x","keywords":["NPM","npm",{}]}}]}}"#,
            kws.join(",")
        );
        let r = parse_reflection(&reply, &[]);
        assert_eq!(r.facts[0].keywords.len(), 10);
        assert_eq!(r.facts[0].keywords[0], "npm");
        assert_eq!(r.facts[0].keywords[1], "k0");
    }

    #[test]
    fn pointers_resolve_only_into_the_shown_set() {
        let reply = r#"{"facts":[
            {"text":"a","restates":"[1]"},
            {"text":"b","supersedes":"2"},
            {"text":"c","restates":"mem:org:acme:9"},
            {"text":"d","restates":"[7]","supersedes":"mem:org:acme:1"}
        ]}"#;
        let r = parse_reflection(reply, &shown());
        let got: Vec<(Option<&str>, Option<&str>)> = r
            .facts
            .iter()
            .map(|f| (f.restates.as_deref(), f.supersedes.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                (Some("mem:repo:acme/app:4"), None),
                (None, Some("mem:org:acme:9")),
                (Some("mem:org:acme:9"), None),
                (None, None),
            ]
        );
    }

    #[test]
    fn unknown_audience_is_org_and_summary_takes_the_narrowest() {
        let reply = r#"{"facts":[{"text":"a","audience":"team"},{"text":"b","audience":"channel"},{"text":"c","audience":"user"}],"summary":{"text":"  s  "}}"#;
        let r = parse_reflection(reply, &[]);
        assert_eq!(r.facts[0].audience, Audience::Org);
        assert_eq!(
            r.summary,
            Some(ExtractedSummary {
                text: "s".into(),
                audience: Audience::User
            })
        );
    }

    #[test]
    fn secrets_are_redacted_and_a_fact_that_was_only_a_secret_is_dropped() {
        let reply = r#"{"facts":[{"text":"use token ghp_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa for the registry","keywords":["xoxb-1234567890-abcdefghij"]},{"text":"ghp_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"}]}"#;
        let r = parse_reflection(reply, &[]);
        assert_eq!(r.facts.len(), 1);
        assert_eq!(r.facts[0].text, "use token [redacted] for the registry");
        assert_eq!(r.facts[0].keywords, ["[redacted]"]);
        assert_eq!(
            r.dropped, 1,
            "a fact that was only a secret is empty after redaction"
        );
    }

    fn run() -> RunScopes {
        RunScopes::new("acme", Some("acme/app"), Some("slack:C1"), Some("slack:U7")).expect("valid")
    }

    #[test]
    fn routing_follows_pointers_then_audiences() {
        let reply = r#"{"facts":[
            {"text":"a","audience":"user","restates":"[1]"},
            {"text":"b","audience":"repo"},
            {"text":"c","audience":"channel"}
        ],"summary":"s"}"#;
        let r = parse_reflection(reply, &shown());
        let routed = route(&r, &run(), Origin::Public, "slack:C1:1", Some("run-1"));
        let repo = &routed.facts[&ScopeKey::parse("repo:acme/app").expect("valid")];
        assert_eq!(repo.len(), 2, "the restatement follows its target's scope");
        assert_eq!(repo[0].restates.as_deref(), Some("mem:repo:acme/app:4"));
        // The summary takes the narrowest audience among the accepted facts: user.
        assert_eq!(
            routed.summary.as_ref().map(|(s, _)| s.as_str()),
            Some("user:slack:U7")
        );
        assert_eq!(repo[0].source_run_id.as_deref(), Some("run-1"));
    }

    #[test]
    fn a_run_without_the_audience_writes_to_org() {
        let r = parse_reflection(r#"{"facts":[{"text":"a","audience":"user"}]}"#, &[]);
        let org_only = RunScopes::new("acme", None, None, None).expect("valid");
        let routed = route(&r, &org_only, Origin::Public, "t", None);
        assert!(routed
            .facts
            .contains_key(&ScopeKey::parse("org:acme").expect("valid")));
    }

    #[test]
    fn a_forbidden_scope_is_narrowed_and_loses_its_pointer() {
        let r = parse_reflection(
            r#"{"facts":[{"text":"a","audience":"org","restates":"[2]"},{"text":"b","audience":"org"}]}"#,
            &shown(),
        );
        let private = route(&r, &run(), Origin::Private, "t", None);
        let channel = &private.facts[&ScopeKey::parse("channel:slack:C1").expect("valid")];
        assert_eq!(channel.len(), 2);
        assert_eq!(
            channel[0].restates, None,
            "a narrowed restatement loses its pointer"
        );
        assert_eq!(private.narrowed, 2);
        let dm = route(&r, &run(), Origin::Dm, "t", None);
        assert!(dm
            .facts
            .contains_key(&ScopeKey::parse("user:slack:U7").expect("valid")));
        let bare = RunScopes::new("acme", Some("acme/app"), None, None).expect("valid");
        let dropped = route(&r, &bare, Origin::Private, "t", None);
        assert!(dropped.facts.is_empty(), "never narrowed into the repo");
        assert_eq!(dropped.dropped, 2);
    }

    #[test]
    fn another_users_scope_is_never_written() {
        // A pointer to a record shown from another user's scope resolves only if it was shown;
        // the run's own user scope is the only user scope an audience can name.
        let r = parse_reflection(r#"{"facts":[{"text":"a","audience":"user"}]}"#, &[]);
        let routed = route(&r, &run(), Origin::Public, "t", None);
        let scopes: Vec<&str> = routed.facts.keys().map(|s| s.as_str()).collect();
        assert_eq!(scopes, ["user:slack:U7"]);
    }

    #[test]
    fn outcome_lines_carry_counts_only() {
        let o = ReflectionOutcome {
            tally: Tally {
                offered: 4,
                rejected: 1,
                ..Tally::default()
            },
            restated: 1,
            inserted: 2,
            deduped: 0,
            summary: 1,
            ..Default::default()
        };
        assert_eq!(
            o.line(),
            "[memory] offered 4, rejected 1, restated 1, inserted 2, deduped 0, summary 1"
        );
        assert_eq!(
            ReflectionOutcome::default().line(),
            "[memory] reflection: nothing to write"
        );
        let bad = ReflectionOutcome {
            error: Some("the reply holds no JSON object".into()),
            ..Default::default()
        };
        assert_eq!(
            bad.line(),
            "[memory] reflection output rejected (the reply holds no JSON object); nothing written"
        );
    }

    #[test]
    fn utf16_heads_and_tails_never_split_a_character() {
        assert_eq!(tail_utf16("ab\u{1F600}", 2), "\u{1F600}");
        assert_eq!(tail_utf16("ab\u{1F600}", 1), "");
        assert_eq!(crate::text::head_utf16("\u{1F600}ab", 1), "");
        assert_eq!(crate::text::head_utf16("\u{1F600}ab", 3), "\u{1F600}a");
        assert_eq!(tail_utf16("abc", 10), "abc");
    }
}
