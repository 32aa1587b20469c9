//! The write path of a run: the shown set, the prompt, reflect through a store, the counters,
//! and the design record's trace.

use lessons::memory::{reflect, shown_set};
use lessons::reflect::{reflection_prompt, Shown, SYSTEM_PROMPT};
use lessons::{
    Candidate, ContextConfig, InMemoryStore, ListQuery, MemoryStore, Origin, RunScopes, ScopeKey,
    WriteOptions,
};

use crate::util::{FakeClock, T0};

#[path = "../../examples/trace.rs"]
#[allow(dead_code)]
mod trace;

fn run() -> RunScopes {
    RunScopes::new("acme", Some("acme/app"), Some("slack:C1"), Some("slack:U7")).expect("valid")
}

fn key(s: &str) -> ScopeKey {
    ScopeKey::parse(s).expect("valid")
}

#[test]
fn the_trace_prints_the_window_and_the_outcome_line() {
    let dir = tempfile::tempdir().expect("dir");
    let printed = trace::run(dir.path()).expect("the trace runs");
    let lines: Vec<&str> = printed.lines().collect();
    assert!(
        lines.contains(
            &"[memory] offered 3, rejected 0, restated 0, inserted 3, deduped 0, summary 0"
        ),
        "run 1 learns its three lessons:\n{printed}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with(
            "Background memory for org:acme + repo:acme/app + channel:slack:C1 + user:slack:U7"
        )),
        "{printed}"
    );
    assert!(
        printed.contains("- the license check fails on a resident tree whose nested node_modules were dropped; a clean npm ci of the same commit passes; the allowlist is never the fix (source: slack:C1:1698)"),
        "the license lesson reaches a run whose brief never names it:\n{printed}"
    );
    assert!(
        lines.contains(
            &"[memory] offered 4, rejected 1, restated 1, inserted 2, deduped 0, summary 1"
        ),
        "{printed}"
    );
    assert!(
        lines
            .last()
            .is_some_and(|l| l.ends_with("confidence 0.95, its text unchanged")),
        "{printed}"
    );
}

#[test]
fn the_shown_set_is_the_window_then_each_scopes_hits_without_duplicates() {
    let clock = FakeClock::new(T0);
    let store = InMemoryStore::with_clock(clock.clock());
    store
        .write(
            &key("repo:acme/app"),
            &[
                Candidate::fact("vitest needs jsdom", "t"),
                Candidate::summary("vitest run summary", "t"),
            ],
            &WriteOptions::default(),
        )
        .expect("write");
    store
        .write(
            &key("org:acme"),
            &[
                Candidate::fact("vitest workers leak memory on node 18", "t"),
                Candidate::fact("unrelated", "t"),
            ],
            &WriteOptions::default(),
        )
        .expect("write");
    store
        .write(
            &key("user:slack:U9"),
            &[Candidate::fact("another user likes vitest", "t")],
            &WriteOptions::default(),
        )
        .expect("write");
    let shown = shown_set(
        &store,
        &run(),
        "why does vitest fail",
        "it needed jsdom",
        &ContextConfig::default(),
    )
    .expect("shown");
    let ids: Vec<&str> = shown.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "mem:repo:acme/app:0",
            "mem:org:acme:0",
            "mem:repo:acme/app:1"
        ]
    );
    // The window read bumped nothing; the hits were bumped by their retrieve.
    assert_eq!(shown[0].use_count, 0);
    assert_eq!(
        store
            .get("mem:user:slack:U9:0")
            .expect("get")
            .expect("exists")
            .use_count,
        0,
        "another user's scope is not read"
    );
}

#[test]
fn the_prompt_shows_records_by_handle_and_redacts_the_transcript() {
    let clock = FakeClock::new(T0);
    let store = InMemoryStore::with_clock(clock.clock());
    store
        .write(
            &key("repo:acme/app"),
            &[
                Candidate::fact("vitest needs jsdom", "t"),
                Candidate::summary("a run", "t"),
            ],
            &WriteOptions::default(),
        )
        .expect("write");
    let shown = store
        .list(&key("repo:acme/app"), &ListQuery::newest(10))
        .expect("list");
    let transcript = format!(
        "{}export GITHUB_TOKEN=ghp_{}\nfinal words",
        "x".repeat(30_000),
        "a".repeat(36)
    );
    let p = reflection_prompt(&shown, &transcript);
    assert_eq!(p.system, SYSTEM_PROMPT);
    assert_eq!(
        p.shown,
        [
            Shown {
                handle: "1".into(),
                id: "mem:repo:acme/app:1".into()
            },
            Shown {
                handle: "2".into(),
                id: "mem:repo:acme/app:0".into()
            }
        ]
    );
    assert!(p.input.starts_with("Records the run was shown (refer to them by handle):\n[1] (summary) a run\n[2] (fact) vitest needs jsdom\n\nTranscript (its most recent part):\n<transcript>\n"), "{}", &p.input[..200]);
    assert!(p
        .input
        .ends_with("export GITHUB_TOKEN=[redacted]\nfinal words\n</transcript>"));
    assert!(!p.input.contains("ghp_"));
    let tail = p
        .input
        .split("<transcript>\n")
        .nth(1)
        .expect("a transcript");
    assert_eq!(
        lessons::internals::text::utf16_len(tail.trim_end_matches("\n</transcript>")),
        24_000
    );
    for rule in [
        "what fails or surprises, why, and what to do",
        "at most 5 facts",
        "\"restates\"",
        "\"supersedes\"",
        "raw JSON only",
    ] {
        assert!(p.system.contains(rule), "the instructions say {rule}");
    }
}

#[test]
fn a_day_of_reflections_is_readable_in_the_counters() {
    let clock = FakeClock::new(T0);
    let store = InMemoryStore::with_clock(clock.clock());
    let replies = [
        r#"{"facts":[{"text":"PR 7 was merged","audience":"repo"},{"text":"npm ci must run before the license check","audience":"repo"}],"summary":"s1"}"#,
        r#"{"facts":[{"text":"npm ci must run before the license check","audience":"repo"},{"text":"sha 3f9a2c1 is deployed","audience":"repo"}]}"#,
        r#"{"facts":[{"text":"the cache key must include the lockfile hash","audience":"repo","restates":"[1]"}],"summary":"s3"}"#,
        "the model rambled and forgot the JSON",
    ];
    let mut lines = Vec::new();
    for reply in replies {
        let shown = [Shown {
            handle: "1".into(),
            id: "mem:repo:acme/app:0".into(),
        }];
        let o = reflect(
            &store,
            &run(),
            reply,
            &shown,
            Origin::Public,
            "slack:C1:9",
            None,
        )
        .expect("reflect");
        lines.push(o.line());
        clock.advance(3_600_000);
    }
    assert_eq!(
        lines,
        [
            "[memory] offered 2, rejected 1, restated 0, inserted 1, deduped 0, summary 1",
            "[memory] offered 2, rejected 1, restated 0, inserted 0, deduped 1, summary 0",
            "[memory] offered 1, rejected 0, restated 1, inserted 0, deduped 0, summary 1",
            "[memory] reflection output rejected (the reply holds no JSON object); nothing written",
        ]
    );
    let days = store.stats(0).expect("stats");
    let repo = days
        .iter()
        .find(|d| d.scope_key.as_str() == "repo:acme/app")
        .expect("repo counters");
    let c = &repo.counters;
    assert_eq!(
        (
            c.offered,
            c.rejected,
            c.inserted,
            c.deduped,
            c.restated,
            c.summaries
        ),
        (5, 2, 1, 1, 1, 2)
    );
    assert_eq!(c.rejected_by.get("reference"), Some(&1));
    assert_eq!(c.rejected_by.get("delivery"), Some(&1));
    assert_eq!(c.rejected_by.get("sha"), Some(&1));
    let user = days
        .iter()
        .find(|d| d.scope_key.as_str() == "user:slack:U7");
    assert!(
        user.is_none(),
        "summaries of repo facts go to the repo scope"
    );
    assert!(
        lines
            .iter()
            .all(|l| !l.contains("npm") && !l.contains("cache")),
        "no record text in log lines"
    );
}
