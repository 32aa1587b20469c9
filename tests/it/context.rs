//! The block against the reference's answers, and the read path over a real store.

use lessons::context::render_block;
use lessons::memory::build_context;
use lessons::{
    Candidate, ContextConfig, InMemoryStore, MemoryStore, RunScopes, ScopeKey, WriteOptions,
};

use crate::util::jsonl;
use crate::util::{FakeClock, T0};

#[test]
fn agrees_with_the_reference_block_on_every_fixture_line() {
    let cases = jsonl("block-compat.jsonl");
    assert_eq!(cases.len(), 300);
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let records: Vec<(String, String)> = case["records"]
            .as_array()
            .expect("records")
            .iter()
            .map(|r| {
                (
                    r["text"].as_str().expect("text").to_owned(),
                    r["sourceThreadKey"].as_str().expect("source").to_owned(),
                )
            })
            .collect();
        let pairs: Vec<(&str, &str)> = records
            .iter()
            .map(|(t, s)| (t.as_str(), s.as_str()))
            .collect();
        let max_records = case["maxRecords"].as_u64().expect("maxRecords") as usize;
        let max_tokens = case["maxTokens"].as_u64().expect("maxTokens") as usize;
        let resource = case["resource"].as_str().expect("resource");
        let got = render_block(resource, &pairs, max_records, max_tokens);
        let want_kept = case["kept"].as_u64().expect("kept") as usize;
        let want_block = case["block"].as_str().expect("block");
        match got {
            Some(b) if b.kept == want_kept && b.text == want_block => {}
            other => failures.push(format!(
                "line {}: kept {:?}, want {want_kept}",
                i + 1,
                other.map(|b| b.kept)
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn run() -> RunScopes {
    RunScopes::new("acme", Some("acme/app"), Some("slack:C1"), None).expect("valid")
}

fn seeded(clock: &FakeClock) -> InMemoryStore {
    let store = InMemoryStore::with_clock(clock.clock());
    let repo = ScopeKey::parse("repo:acme/app").expect("valid");
    let org = ScopeKey::parse("org:acme").expect("valid");
    store
        .write(&repo, &[Candidate::fact("the license check fails on a resident tree whose nested node_modules were dropped; a clean npm ci of the same commit passes; the allowlist is never the fix", "slack:C1:100")], &WriteOptions::default())
        .expect("write");
    store
        .write(
            &repo,
            &[Candidate::summary(
                "A run added caching to the build.",
                "slack:C1:101",
            )],
            &WriteOptions::default(),
        )
        .expect("write");
    store
        .write(&org, &[Candidate::fact("registry mirrors lag the public registry by up to an hour; pin versions that exist on both", "slack:C1:102")], &WriteOptions::default())
        .expect("write");
    store
        .write(
            &org,
            &[Candidate::fact(
                "unrelated advice about slack emoji",
                "slack:C1:103",
            )],
            &WriteOptions::default(),
        )
        .expect("write");
    store
}

#[test]
fn the_window_comes_first_and_needs_no_keyword_match() {
    let clock = FakeClock::new(T0);
    let store = seeded(&clock);
    let ctx = build_context(
        &store,
        &run(),
        "add a registry drift check",
        &ContextConfig::default(),
        T0,
    );
    let block = ctx.block.expect("a block");
    assert_eq!(
        block,
        "Background memory for org:acme + repo:acme/app + channel:slack:C1 (may be outdated \u{2014} verify before acting):\n\
         <background_memory>\n\
         - the license check fails on a resident tree whose nested node_modules were dropped; a clean npm ci of the same commit passes; the allowlist is never the fix (source: slack:C1:100)\n\
         - registry mirrors lag the public registry by up to an hour; pin versions that exist on both (source: slack:C1:102)\n\
         </background_memory>"
    );
    assert_eq!(ctx.from_window, 1, "summaries never enter the window");
    assert!(ctx.warnings.is_empty());
    // The window read bumps nothing; the keyword hit was bumped by its retrieve.
    let lesson = store
        .get("mem:repo:acme/app:0")
        .expect("get")
        .expect("exists");
    assert_eq!(lesson.use_count, 0);
    assert_eq!(
        store
            .get("mem:org:acme:0")
            .expect("get")
            .expect("exists")
            .use_count,
        1
    );
}

#[test]
fn memory_off_means_no_block_and_no_store_call() {
    struct Panics;
    impl MemoryStore for Panics {
        fn write_checked(
            &self,
            _: &lessons::store::CheckedWrite<'_>,
            _: &WriteOptions,
        ) -> lessons::Result<lessons::WriteCounts> {
            panic!("called")
        }
        fn list(
            &self,
            _: &ScopeKey,
            _: &lessons::ListQuery,
        ) -> lessons::Result<Vec<lessons::Record>> {
            panic!("called")
        }
        fn retrieve_marked(
            &self,
            _: &ScopeKey,
            _: &str,
            _: usize,
        ) -> lessons::Result<Vec<lessons::model::Retrieved>> {
            panic!("called")
        }
        fn forget(&self, _: &ScopeKey, _: &str) -> lessons::Result<bool> {
            panic!("called")
        }
        fn sweep(&self, _: &ScopeKey, _: bool) -> lessons::Result<lessons::SweepReceipt> {
            panic!("called")
        }
        fn get(&self, _: &str) -> lessons::Result<Option<lessons::Record>> {
            panic!("called")
        }
        fn scopes(&self) -> lessons::Result<Vec<ScopeKey>> {
            panic!("called")
        }
        fn export(
            &self,
            _: &mut dyn FnMut(lessons::Record) -> lessons::Result<()>,
        ) -> lessons::Result<()> {
            panic!("called")
        }
        fn import(&self, _: &[lessons::Record]) -> lessons::Result<lessons::store::ImportReport> {
            panic!("called")
        }
        fn stats(&self, _: i64) -> lessons::Result<Vec<lessons::store::DayStats>> {
            panic!("called")
        }
        fn decisions(
            &self,
            _: &ScopeKey,
            _: &lessons::DecisionQuery,
        ) -> lessons::Result<Vec<lessons::Decision>> {
            panic!("called")
        }
        fn export_decisions(
            &self,
            _: &mut dyn FnMut(lessons::Decision) -> lessons::Result<()>,
        ) -> lessons::Result<()> {
            panic!("called")
        }
        fn import_decisions(&self, _: &[lessons::Decision]) -> lessons::Result<u64> {
            panic!("called")
        }
        fn active_count(&self, _: &ScopeKey) -> lessons::Result<u64> {
            panic!("called")
        }
    }
    let off = ContextConfig {
        enabled: false,
        ..ContextConfig::default()
    };
    let ctx = build_context(&Panics, &run(), "anything", &off, T0);
    assert_eq!(ctx.block, None);
}

#[test]
fn a_failed_window_read_logs_one_warning_without_text_and_keeps_the_hits() {
    struct WindowFails(InMemoryStore);
    impl MemoryStore for WindowFails {
        fn list(
            &self,
            _: &ScopeKey,
            _: &lessons::ListQuery,
        ) -> lessons::Result<Vec<lessons::Record>> {
            Err(lessons::Error::new(
                lessons::ErrorKind::Remote,
                "worker answered 503",
            ))
        }
        crate::delegate_store!(all but list);
    }
    let clock = FakeClock::new(T0);
    let store = WindowFails(seeded(&clock));
    let ctx = build_context(
        &store,
        &run(),
        "registry mirrors",
        &ContextConfig::default(),
        T0,
    );
    assert_eq!(
        ctx.warnings,
        ["[memory] repo window read failed (worker answered 503); continuing without the window"]
    );
    let block = ctx.block.expect("the hits still make a block");
    assert!(block.contains("registry mirrors lag"));
    assert!(!block.contains("license check"));
}

#[test]
fn no_repo_no_window_and_window_zero_searches_the_repo() {
    let clock = FakeClock::new(T0);
    let store = seeded(&clock);
    let org_only = RunScopes::new("acme", None, None, None).expect("valid");
    let ctx = build_context(
        &store,
        &org_only,
        "add a registry drift check",
        &ContextConfig::default(),
        T0,
    );
    assert!(!ctx.block.expect("org hits").contains("license"));
    let zero = ContextConfig {
        repo_window: 0,
        ..ContextConfig::default()
    };
    let ctx = build_context(&store, &run(), "why does the license check fail", &zero, T0);
    assert_eq!(ctx.from_window, 0);
    assert!(ctx
        .block
        .expect("repo by keyword")
        .contains("license check fails"));
}

#[test]
fn twenty_four_320_character_facts_fit_in_3000_tokens_beside_the_hits() {
    let clock = FakeClock::new(T0);
    let store = InMemoryStore::with_clock(clock.clock());
    let repo = ScopeKey::parse("repo:acme/app").expect("valid");
    let org = ScopeKey::parse("org:acme").expect("valid");
    for i in 0..30 {
        let text = format!(
            "lesson {i:02} {}",
            "about the build cache and its keys; ".repeat(9)
        );
        let text: String = text.chars().take(320).collect();
        store
            .write(
                &repo,
                &[Candidate::fact(text, "slack:C1:1")],
                &WriteOptions::default(),
            )
            .expect("write");
    }
    for i in 0..10 {
        store
            .write(
                &org,
                &[Candidate::fact(
                    format!("org hint {i} about deploys"),
                    "slack:C1:2",
                )],
                &WriteOptions::default(),
            )
            .expect("write");
    }
    let ctx = build_context(&store, &run(), "deploys", &ContextConfig::default(), T0);
    assert_eq!(ctx.from_window, 24);
    assert!(
        ctx.records.len() > 24,
        "hits follow the window: {}",
        ctx.records.len()
    );
    assert!(ctx.records.len() <= 32);
    let block = ctx.block.expect("a block");
    let bullets: usize = block
        .lines()
        .filter(|l| l.starts_with("- "))
        .map(lessons::internals::text::estimate_tokens)
        .sum();
    assert!(bullets <= 3000, "{bullets}");
}
