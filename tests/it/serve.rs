//! A real `lessons serve` process and its clients: a round trip and a clean stop on SIGTERM,
//! every acknowledged write kept through SIGKILL under load, the CLI and `RemoteStore` through
//! it, and a serve that refuses to start without a token.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use lessons::MemoryStore;
use serde_json::json;

use crate::fixtures::server::{call, free_port, post, Serve, TOKEN};

#[test]
fn a_real_serve_process_round_trips_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().expect("dir");
    let mut s = Serve::start(dir.path());
    let w = post(
        &s.url,
        "/write",
        json!({"scopeKey": "org:acme", "records": [
            {"kind": "fact", "text": "pin the registry mirror", "sourceThreadKey": "t"},
            {"kind": "fact", "text": "LGTM from the owner", "sourceThreadKey": "t"}
        ]}),
    );
    assert_eq!(w["inserted"], 2);
    assert_eq!(
        post(&s.url, "/list", json!({"scopeKey": "org:acme", "limit": 5}))["records"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    assert_eq!(
        post(
            &s.url,
            "/retrieve",
            json!({"scopeKey": "org:acme", "query": "registry mirror", "limit": 3})
        )["records"][0]["text"],
        "pin the registry mirror"
    );
    assert_eq!(
        post(
            &s.url,
            "/forget",
            json!({"scopeKey": "org:acme", "id": "mem:org:acme:0"})
        )["forgotten"],
        true
    );
    assert_eq!(
        post(&s.url, "/sweep", json!({"scopeKey": "org:acme"}))["swept"],
        1
    );
    // What the process holds: its resident memory, jemalloc's heap (the binary's allocator),
    // and the store's parts beside their bounds.
    let (status, metrics) = call(&s.url, "GET", "/metrics", Some(TOKEN), "");
    assert_eq!(status, 200);
    let gauge = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
    };
    let resident = gauge("lessons_resident_bytes");
    let allocated = gauge("lessons_allocated_bytes");
    assert!(allocated > 0 && allocated < resident, "{metrics}");
    // jemalloc's pages in use hold the live heap, and are resident; it keeps books.
    let active = gauge("lessons_allocator_active_bytes");
    assert!(allocated <= active, "{metrics}");
    assert!(
        active <= gauge("lessons_allocator_resident_bytes"),
        "{metrics}"
    );
    assert!(gauge("lessons_allocator_metadata_bytes") > 0, "{metrics}");
    assert!(
        gauge("lessons_held_bytes{part=\"memtables\"}") > 0,
        "the writes are in memtables"
    );
    assert!(
        gauge("lessons_held_bytes{part=\"scope_map\"}") > 0,
        "org:acme is held"
    );
    assert_eq!(
        gauge("lessons_held_budget_bytes{part=\"block_cache\"}"),
        lessons::store::DEFAULT_CACHE_BYTES
    );
    assert_eq!(
        gauge("lessons_held_budget_bytes{part=\"scope_map\"}"),
        192 << 20
    );
    assert!(
        gauge("lessons_held_bytes{part=\"block_cache\"}") <= lessons::store::DEFAULT_CACHE_BYTES
    );
    // The engine's background work: a handful of writes seals no memtable and compacts nothing.
    assert_eq!(gauge("lessons_flushes_waiting"), 0, "{metrics}");
    assert_eq!(gauge("lessons_compactions_running"), 0, "{metrics}");
    assert_eq!(gauge("lessons_compactions_total"), 0, "{metrics}");
    assert!(
        metrics.contains("# TYPE lessons_compaction_seconds_total counter"),
        "{metrics}"
    );
    // The disk: each write above was acknowledged after a journal fsync, timed.
    assert!(gauge("lessons_journal_fsyncs_total") >= 1, "{metrics}");
    let fsync_seconds: f64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("lessons_journal_fsync_seconds_total ")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no fsync seconds in {metrics}"));
    assert!(
        fsync_seconds.is_finite() && fsync_seconds >= 0.0,
        "{metrics}"
    );
    // SIGTERM: the process finishes and flushes.
    let status = s.terminate();
    assert_eq!(status.code(), Some(0), "a clean shutdown exits 0");
    let store = lessons::EmbeddedStore::open(dir.path()).expect("the store reopens");
    assert_eq!(
        store
            .get("mem:org:acme:1")
            .expect("get")
            .expect("kept")
            .status,
        lessons::Status::Swept
    );
    assert!(store.check().expect("check").is_ok());
}

#[test]
fn every_acknowledged_write_survives_sigkill_under_load() {
    let dir = tempfile::tempdir().expect("dir");
    let mut s = Serve::start(dir.path());
    let acked = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..8)
        .map(|t| {
            let (url, acked, stop) = (s.url.clone(), Arc::clone(&acked), Arc::clone(&stop));
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(5)))
                    .build()
                    .into();
                for i in 0..10_000 {
                    if stop.load(std::sync::atomic::Ordering::SeqCst) {
                        break;
                    }
                    let text = format!("writer {t} lesson {i} uniq{t}x{i}");
                    let body = json!({"scopeKey": format!("repo:acme/w{t}"), "records": [{"kind": "fact", "text": text, "sourceThreadKey": "load"}], "cap": 10000});
                    let ok = agent
                        .post(&format!("{url}/write"))
                        .header("authorization", &format!("Bearer {TOKEN}"))
                        .send(body.to_string().as_bytes())
                        .is_ok_and(|r| r.status().as_u16() == 200);
                    if ok {
                        acked.lock().push(text);
                    } else {
                        break;
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    s.child.kill().expect("SIGKILL");
    let _ = s.child.wait();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for w in writers {
        w.join().expect("writer");
    }
    let acked = acked.lock().clone();
    assert!(
        acked.len() > 50,
        "the load ran: {} writes acknowledged",
        acked.len()
    );
    let s2 = Serve::start(dir.path());
    let client =
        lessons::remote::RemoteStore::new(&s2.url, Some(TOKEN.into()), Duration::from_secs(10))
            .expect("client");
    let mut present = std::collections::HashSet::new();
    client
        .export(&mut |r| {
            present.insert(r.text);
            Ok(())
        })
        .expect("export");
    let lost: Vec<&String> = acked.iter().filter(|t| !present.contains(*t)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged writes lost, e.g. {:?}",
        lost.len(),
        acked.len(),
        lost.first()
    );
    for text in acked.iter().step_by(acked.len() / 20 + 1) {
        let uniq = text.split(' ').next_back().expect("a token");
        let t: usize = uniq
            .trim_start_matches("uniq")
            .split('x')
            .next()
            .and_then(|n| n.parse().ok())
            .expect("writer");
        let scope = lessons::ScopeKey::parse(&format!("repo:acme/w{t}")).expect("valid");
        let hits = client.retrieve(&scope, uniq, 1).expect("retrieve");
        assert_eq!(hits.len(), 1, "the index lost {text}");
    }
    drop(s2);
}

#[test]
fn the_cli_talks_to_a_server_with_dash_dash_server() {
    let dir = tempfile::tempdir().expect("dir");
    let mut s = Serve::start(dir.path());
    let cli = |args: &[&str], stdin: &str| {
        let mut command = crate::util::lessons();
        command
            .args(["--server", &s.url])
            .args(args)
            .env("MEMORY_TOKEN", TOKEN);
        crate::util::run_with(command, stdin.as_bytes())
    };
    let w = cli(
        &["write", "--scope", "repo", "--repo", "acme/app", "--json"],
        r#"[{"kind":"fact","text":"npm ci before vitest","sourceThreadKey":"t"}]"#,
    );
    assert_eq!(
        String::from_utf8_lossy(&w.stdout).trim(),
        r#"{"ok":true,"inserted":1,"deduped":0,"restated":0,"superseded":0,"evicted":0}"#,
        "{}",
        String::from_utf8_lossy(&w.stderr)
    );
    let l = cli(&["list", "--scope", "repo:acme/app"], "");
    assert!(String::from_utf8_lossy(&l.stdout).starts_with("mem:repo:acme/app:0  fact  "));
    let c = cli(
        &[
            "context", "--org", "acme", "--repo", "acme/app", "--brief", "x",
        ],
        "",
    );
    assert!(String::from_utf8_lossy(&c.stdout).contains("- npm ci before vitest (source: t)"));
    let bad = cli(&["list", "--scope", "repo:acme/app", "--limit", "99"], "");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr)
        .contains("answered 400: limit must be an integer between 1 and 50"));
    // A cap of 1 evicts the first lesson, never used: the journal's filter crosses the wire.
    let capped = cli(
        &["write", "--scope", "repo:acme/app", "--cap", "1"],
        r#"[{"kind":"fact","text":"the docs build needs mdbook","sourceThreadKey":"t"}]"#,
    );
    assert_eq!(capped.status.code(), Some(0));
    let unused = cli(
        &[
            "journal",
            "--scope",
            "repo:acme/app",
            "--never-used",
            "--json",
        ],
        "",
    );
    let answer: serde_json::Value =
        serde_json::from_slice(&unused.stdout).expect("the journal answers JSON");
    let decisions = answer["decisions"].as_array().expect("decisions");
    assert_eq!(decisions.len(), 1, "{answer}");
    assert_eq!(decisions[0]["event"], "evicted");
    assert_eq!(decisions[0]["useCount"], 0);
    assert_eq!(decisions[0]["texts"][0], "npm ci before vitest");
    let doc = cli(&["doctor"], "");
    assert_eq!(doc.status.code(), Some(2));
    let _ = s.child.kill();
    let _ = s.child.wait();
}

#[test]
fn a_remote_read_failure_degrades_and_an_older_server_is_reported_as_unsupported() {
    use lessons::remote::RemoteStore;
    let dead = format!("http://127.0.0.1:{}", free_port());
    let r = RemoteStore::new(&dead, Some(TOKEN.into()), Duration::from_secs(2)).expect("client");
    let scope = lessons::ScopeKey::parse("org:acme").expect("valid");
    assert!(r
        .retrieve(&scope, "anything", 8)
        .expect("a read degrades")
        .is_empty());
    let e = r
        .list(&scope, &lessons::ListQuery::newest(5))
        .expect_err("list is an error");
    assert!(e.to_string().contains("POST /list"), "{e}");
    // An older Worker: every route it lacks answers 404.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten().take(1) {
            let mut stream = stream;
            // Read the whole request first: closing a socket with unread bytes sends a reset,
            // which the client may see instead of the answer (it did, under a loaded machine).
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got);
                if let Some(end) = text.find("\r\n\r\n") {
                    let length = text[..end]
                        .lines()
                        .find_map(|l| {
                            let (name, value) = l.split_once(':')?;
                            name.eq_ignore_ascii_case("content-length")
                                .then(|| value.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    if got.len() >= end + 4 + length {
                        break;
                    }
                }
            }
            let body = r#"{"error":"not found"}"#;
            let _ = write!(stream, "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        }
    });
    let old = RemoteStore::new(
        &format!("http://{addr}"),
        Some(TOKEN.into()),
        Duration::from_secs(5),
    )
    .expect("client");
    let e = old.sweep(&scope, true).expect_err("no /sweep");
    assert!(
        e.to_string().contains("not supported by this server"),
        "{e}"
    );
    assert!(RemoteStore::new("ftp://x", None, Duration::from_secs(1)).is_err());
}

#[test]
fn serve_refuses_to_start_without_a_token_unless_told_to_on_loopback() {
    let dir = tempfile::tempdir().expect("dir");
    let serve = |extra: &[&str]| Serve::command(dir.path()).no_token().args(extra).refused();
    let no_token = serve(&["--addr", "127.0.0.1:0"]);
    assert_eq!(no_token.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&no_token.stderr).contains("MEMORY_TOKEN"));
    let exposed = serve(&["--insecure-no-auth", "--addr", "0.0.0.0:0"]);
    assert_eq!(exposed.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&exposed.stderr).contains("loopback"));
}
