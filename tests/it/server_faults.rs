//! The server and the CLI under faults: a full disk, big exports and imports through
//! `RemoteStore`, a dead server, bad tokens, hostile input lines (slow and idle clients are in
//! `server_connections`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lessons::remote::RemoteStore;
use lessons::server::{AppState, Background};
use lessons::store::{EmbeddedStore, InMemoryStore, MemoryStore, WriteOptions};
use lessons::{ContextConfig, ErrorKind, Record, ScopeKey, Status};
use serde_json::json;

use crate::fixtures::server::{auth, call, free_port, serve, serve_state, Serve, TOKEN};
use crate::util::{exported, fact, run};

/// A size-limited tmpfs, unmounted when dropped (lazily, so a process still holding a file
/// cannot keep it).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).expect("mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .expect("mount runs");
        assert!(
            status.success(),
            "mounting a {size} tmpfs to simulate a full disk needs root (CI runs as root)"
        );
        Tmpfs(at.to_owned())
    }

    /// Fills the filesystem with a file until about `leave` bytes are free.
    fn fill(&self, leave: u64) -> PathBuf {
        let out = Command::new("df")
            .args(["--output=avail", "-B1"])
            .arg(&self.0)
            .output()
            .expect("df runs");
        let avail: u64 = String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .expect("df prints the free bytes");
        let path = self.0.join("filler");
        let mut f = std::fs::File::create(&path).expect("filler");
        let chunk = vec![0u8; 1 << 20];
        let mut left = avail.saturating_sub(leave);
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            if f.write_all(&chunk[..n]).is_err() {
                break;
            }
            left -= n as u64;
        }
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
#[ignore = "needs root to mount a tmpfs"]
fn a_full_disk_is_logged_and_the_server_exits_for_a_restart_that_keeps_every_ack() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let fs = Tmpfs::mount(&tmp.path().join("mnt"), "24m");
    let store = fs.0.join("store");
    let log_path = tmp.path().join("serve.log");
    let mut served = Serve::command(&store)
        .stderr(std::fs::File::create(&log_path).expect("log file"))
        .start();
    let url = served.url.clone();
    let filler = fs.fill(300 * 1024);

    let pad = "x".repeat(600);
    let mut acked = Vec::new();
    let mut failed = None;
    for i in 0..2000 {
        let text = format!("lesson {i}: keep the journal on a disk with room {pad}");
        let body = json!({"scopeKey": "repo:acme/app", "records": [
            {"kind": "fact", "text": text, "sourceThreadKey": "t"}]});
        let (status, answer) = call(&url, "POST", "/write", Some(TOKEN), &body.to_string());
        if status == 200 {
            acked.push(text);
        } else {
            failed = Some((status, answer));
            break;
        }
    }
    let (status, answer) = failed.expect("the disk filled up");
    assert_eq!(status, 500, "{answer}");
    assert!(!acked.is_empty());

    // The server exits non-zero on its own, so a supervisor restarts it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let code = loop {
        if let Some(s) = served.child.try_wait().expect("wait") {
            break s.code();
        }
        assert!(
            Instant::now() < deadline,
            "the server kept running on a failed store"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, Some(2));
    let log = std::fs::read_to_string(&log_path).expect("log");
    assert!(
        log.contains("No space left on device"),
        "the cause is logged:\n{log}"
    );
    assert!(log.contains("failed at the disk"), "{log}");

    // A restart while the disk is still full either opens or says what the disk said, never
    // only what an engine made of it ("an index writer was killed").
    match EmbeddedStore::open(&store) {
        Ok(opened) => drop(opened),
        Err(e) => assert!(
            e.to_string().contains("No space left on device"),
            "a restart on a full disk names the disk: {e}"
        ),
    }

    // Space comes back; the restarted store holds every acknowledged write and takes new ones.
    std::fs::remove_file(filler).expect("free space");
    let reopened = EmbeddedStore::open(&store).expect("the store reopens");
    let texts: Vec<String> = exported(&reopened).into_iter().map(|r| r.text).collect();
    for t in &acked {
        assert!(texts.contains(t), "an acknowledged write is gone");
    }
    let s = ScopeKey::parse("repo:acme/app").expect("scope");
    reopened
        .write(
            &s,
            &[fact("after the disk was freed")],
            &WriteOptions::default(),
        )
        .expect("writes work again");
    assert!(reopened.check().expect("doctor").is_ok());
}

#[test]
#[ignore = "needs root to mount a tmpfs"]
fn retrieve_answers_when_its_usage_bump_cannot_be_written() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let fs = Tmpfs::mount(&tmp.path().join("mnt"), "16m");
    let s = ScopeKey::parse("repo:acme/app").expect("scope");
    let store = EmbeddedStore::open(fs.0.join("store")).expect("open");
    store
        .write(
            &s,
            &[fact("pin the registry mirror in CI")],
            &WriteOptions::default(),
        )
        .expect("write");
    let _filler = fs.fill(0);
    let pad = "y".repeat(3000);
    let mut i = 0;
    while store
        .write(
            &s,
            &[fact(&format!("filler {i} {pad}"))],
            &WriteOptions::default(),
        )
        .is_ok()
    {
        i += 1;
        assert!(i < 10_000, "the disk never filled");
    }
    let found = store
        .retrieve(&s, "registry mirror", 3)
        .expect("a read answers on a full disk");
    assert!(found
        .iter()
        .any(|r| r.text == "pin the registry mirror in CI"));
}

#[test]
fn healthz_answers_503_once_the_store_failed_at_the_disk() {
    /// Fails every write as a full disk does; reads work.
    struct FullDisk(InMemoryStore);
    impl MemoryStore for FullDisk {
        fn write_checked(
            &self,
            _: &lessons::store::CheckedWrite<'_>,
            _: &WriteOptions,
        ) -> lessons::Result<lessons::WriteCounts> {
            Err(lessons::Error::new(
                ErrorKind::Storage,
                "committing a write: No space left on device (os error 28)",
            ))
        }
        crate::delegate_store!(all but write_checked);
    }
    let state = AppState::new(
        Arc::new(FullDisk(InMemoryStore::new())),
        auth(TOKEN, None),
        ContextConfig::default(),
    );
    let server = serve_state(Arc::clone(&state));
    let url = server.url();
    assert_eq!(call(&url, "GET", "/healthz", None, "").0, 200);
    let body = json!({"scopeKey": "org:acme", "records": [
        {"kind": "fact", "text": "a lesson", "sourceThreadKey": "t"}]});
    let (status, _) = call(&url, "POST", "/write", Some(TOKEN), &body.to_string());
    assert_eq!(status, 500);
    assert!(state.failure().is_some_and(|f| f.contains("No space left")));
    let (status, answer) = call(&url, "GET", "/healthz", None, "");
    assert_eq!(status, 503, "{answer}");
    assert!(answer.contains("No space left on device"), "{answer}");
}

/// A fact of about 4 KB in `scope` with sequence number `seq`.
pub(crate) fn big_record(scope: &str, seq: u64) -> Record {
    let scope = ScopeKey::parse(scope).expect("scope");
    let text = format!("lesson {seq}: {}", "z".repeat(3900));
    crate::util::fact_record(&scope, seq, &text, Status::Active)
}

#[test]
fn remote_import_splits_by_bytes_and_export_streams_everything_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(EmbeddedStore::open(dir.path()).expect("open"));
    let server = serve(store.clone(), auth(TOKEN, None));
    let remote = RemoteStore::new(
        &server.url(),
        Some(TOKEN.to_owned()),
        Duration::from_secs(30),
    )
    .expect("client");
    // 300 records of ~4 KB: 1.2 MB, more than two bodies of 512 KiB although fewer than the
    // count limit per request.
    let records: Vec<Record> = (0..300).map(|i| big_record("repo:acme/app", i)).collect();
    let report = remote.import(&records).expect("import through the server");
    assert_eq!(report.imported, 300);
    let back = exported(&remote);
    // The wire form round-trips exactly (a record without keywords shows its text's tokens).
    assert_eq!(
        serde_json::to_value(&back).expect("json"),
        serde_json::to_value(&records).expect("json")
    );
    // A consumer that stops early stops the stream without an error of its own kind lost.
    let mut seen = 0;
    let err = remote
        .export(&mut |_| {
            seen += 1;
            if seen == 10 {
                Err(lessons::Error::invalid("enough"))
            } else {
                Ok(())
            }
        })
        .expect_err("the sink's error comes back");
    assert!(err.is_invalid(), "{err}");
    assert_eq!(seen, 10);
}

#[test]
fn the_cli_reports_a_dead_server_instead_of_an_empty_answer() {
    let port = free_port(); // nothing listens there
    let out = run(
        &[
            "--server",
            &format!("http://127.0.0.1:{port}"),
            "retrieve",
            "--scope",
            "org:acme",
            "--query",
            "registry mirror",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/retrieve"));
}

#[test]
fn serve_refuses_blank_or_short_tokens() {
    for bad in [" ", "short", " rw-secret-0123456789"] {
        let out = Serve::command(Path::new("/nonexistent/never-created"))
            .token(bad)
            .args(&["--addr", "127.0.0.1:0"])
            .refused();
        assert_eq!(out.status.code(), Some(2), "{bad:?} was accepted");
        assert!(String::from_utf8_lossy(&out.stderr).contains("at least 16 characters"));
    }
}

#[test]
fn gate_json_lines_skips_an_overlong_line_without_holding_it() {
    let long = format!("\"{}\"", "a".repeat(3 << 20));
    let input = format!("\"PR 1 is merged\"\n{long}\n\"run npm ci first\"\n");
    let out = run(&["gate", "--json-lines"], &input);
    assert_eq!(out.status.code(), Some(0));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(lines.len(), 3);
    assert!(lines[1]["error"]
        .as_str()
        .is_some_and(|e| e.contains("longer than")));
    assert_eq!(lines[2], json!({"markers": []}));
}

#[test]
fn extreme_imported_times_never_overflow() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = EmbeddedStore::open(dir.path()).expect("open");
    let mut a = big_record("org:acme", 0);
    a.text = "pin the registry mirror".to_owned();
    a.created_at = i64::MIN;
    let mut b = big_record("org:acme", 1);
    b.text = "pin the registry mirror twice".to_owned();
    b.created_at = i64::MAX;
    b.last_used_at = Some(i64::MIN);
    store.import(&[a, b]).expect("import");
    let s = ScopeKey::parse("org:acme").expect("scope");
    let found = store.retrieve(&s, "registry mirror", 5).expect("retrieve");
    assert_eq!(found.len(), 2);
    store
        .write(
            &s,
            &[fact("a third lesson")],
            &WriteOptions {
                cap: Some(2),
                tally: None,
                rejected: Vec::new(),
            },
        )
        .expect("a write that evicts by these times");
    store.close().expect("close");
    let out = run(
        &[
            "--store",
            dir.path().to_str().expect("utf-8"),
            "list",
            "--scope",
            "org:acme",
        ],
        "",
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn close_succeeds_when_only_the_index_commit_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = ScopeKey::parse("org:acme").expect("scope");
    {
        let store = EmbeddedStore::open(dir.path()).expect("open");
        store
            .write(
                &s,
                &[fact("pin the registry mirror")],
                &WriteOptions::default(),
            )
            .expect("write");
        // The index cannot be committed (as on a full disk): the write was durable anyway.
        std::fs::remove_dir_all(dir.path().join("index")).expect("remove the index");
        store.close().expect("close reports only record failures");
    }
    let store = EmbeddedStore::open(dir.path()).expect("reopen rebuilds the index");
    assert_eq!(
        store
            .retrieve(&s, "registry mirror", 3)
            .expect("retrieve")
            .len(),
        1
    );
    assert!(store.check().expect("doctor").is_ok());
}

/// A review larger than a piece is sent as it is made (no length, the pieces chunked), a small
/// one whole with its length; a store error before the second piece is a 500 with its reason,
/// and one after it cuts the body so the reader cannot take it for a whole answer.
#[test]
fn a_large_review_streams_a_small_one_is_whole_and_a_late_failure_cuts_the_body() {
    /// Fails the decision journal's reads of one scope; everything else answers.
    struct JournalFails(InMemoryStore, Option<ScopeKey>);
    impl MemoryStore for JournalFails {
        fn visit_decisions(
            &self,
            scope: &ScopeKey,
            query: &lessons::DecisionQuery,
            page: usize,
            visit: &mut dyn FnMut(lessons::Decision) -> bool,
        ) -> lessons::Result<()> {
            if self.1.as_ref() == Some(scope) {
                return Err(lessons::Error::new(
                    ErrorKind::Storage,
                    "reading the journal: Input/output error (os error 5)",
                ));
            }
            self.0.visit_decisions(scope, query, page, visit)
        }
        crate::delegate_store!(all but visit_decisions);
    }
    let scope = |i: usize| ScopeKey::parse(&format!("repo:acme/app{i:03}")).expect("scope");
    let filled = || {
        let store = InMemoryStore::new();
        for i in 0..600 {
            let lesson = fact(&format!("run the migrations before the tests of app {i}"));
            store
                .write(&scope(i), &[lesson], &WriteOptions::default())
                .expect("write");
        }
        store
    };
    let serve = |store: JournalFails| serve(Arc::new(store), auth(TOKEN, None));
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let review = |server: &Background, body: &str| {
        let mut resp = agent
            .post(format!("{}/review", server.url()))
            .header("content-type", "application/json")
            .header("authorization", &format!("Bearer {TOKEN}"))
            .send(body.as_bytes())
            .expect("answered");
        let length = resp
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        let status = resp.status().as_u16();
        (status, length, resp.body_mut().read_to_string())
    };

    // Whole and streamed, the answer is the review's.
    let store = filled();
    let local = lessons::review::review(
        &store,
        7,
        None,
        store.now(),
        &lessons::review::Thresholds::default(),
    )
    .expect("review");
    let server = serve(JournalFails(store, None));
    let (status, length, body) = review(&server, r#"{"days":7}"#);
    let body = body.expect("the whole body");
    assert_eq!(status, 200, "{body}");
    assert!(body.len() > 3 * 64 * 1024, "{} bytes", body.len());
    assert_eq!(length, None, "a large review is streamed");
    let answered: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(answered, serde_json::to_value(&local).expect("json"));
    let one = r#"{"days":7,"scopeKey":"repo:acme/app007"}"#;
    let (status, length, body) = review(&server, one);
    let body = body.expect("the whole body");
    assert_eq!((status, length), (200, Some(body.len())), "{body}");
    let answered: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(answered["scopes"][0]["scopeKey"], "repo:acme/app007");
    drop(server);

    // A failure at the first scope: nothing was sent, so it is the refusal any route gives a
    // store error (its details go to the log).
    let server = serve(JournalFails(filled(), Some(scope(0))));
    let (status, _, body) = review(&server, r#"{"days":7}"#);
    let body = body.expect("the refusal's body");
    assert_eq!(status, 500, "{body}");
    assert_eq!(body, r#"{"error":"the store failed; see the server log"}"#);
    drop(server);

    // A failure at the last scope, after pieces were sent: the body is cut.
    let server = serve(JournalFails(filled(), Some(scope(599))));
    let (status, length, body) = review(&server, r#"{"days":7}"#);
    assert_eq!((status, length), (200, None));
    // Without the chunked body's last chunk the reader's transfer fails, not just its parse.
    assert!(body.is_err(), "a cut review read as a whole one");
}
