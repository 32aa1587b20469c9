//! The Model Context Protocol beside HTTP, on the same store: `tools/call` of `lessons_context`
//! and `lessons_search` over `lessons mcp`'s stdio, and `POST /context` and `POST /retrieve` over
//! `lessons serve`'s HTTP (a keep-alive connection), with the same arguments.
//!
//! The loop an agent runs: one client sends a request and waits for its answer before the next,
//! timed from the write of the request to the read of its whole answer. The store holds four
//! scopes of a run (organization, repository, channel, user) × 500 active records, fsync per
//! write; each side is its own `lessons` process, one after the other on the same store
//! directory (a store has one owner). Retrieves record their use, so both sides write as they
//! read. 300 warm-up requests per operation, then 3,000 timed.
//!
//! `cargo bench --bench mcp`

// A harness: a panic is its failure report (see Cargo.toml's lint policy).
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]
mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lessons::{EmbeddedStore, MemoryStore, ScopeKey};
use serde_json::{json, Value};
use support::{brief, records, vocabulary, Rng};

const WARM: usize = 300;
const TIMED: usize = 3_000;
const TOKEN: &str = "bench-token-0123456789";

fn seed(dir: &Path) {
    let store = EmbeddedStore::open(dir).expect("open");
    let mut rng = Rng(0x5eed);
    for key in [
        "org:acme",
        "repo:acme/app",
        "channel:slack:C1",
        "user:slack:U7",
    ] {
        let scope = ScopeKey::parse(key).expect("scope");
        store
            .import(&records(&mut rng, &scope, 500, 0))
            .expect("import");
    }
    store.close().expect("close");
}

/// The arguments of one operation, as both sides send them: the tool, its route, the body.
fn ops(briefs: &[String]) -> Vec<(&'static str, &'static str, Vec<Value>)> {
    let run = |b: &String| json!({"org": "acme", "repo": "acme/app", "channel": "slack:C1", "user": "slack:U7", "brief": b});
    let search = |b: &String| json!({"scopeKey": "org:acme", "query": b, "limit": 8});
    vec![
        (
            "lessons_context",
            "/context",
            briefs.iter().map(run).collect(),
        ),
        (
            "lessons_search",
            "/retrieve",
            briefs.iter().map(search).collect(),
        ),
    ]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

fn summary(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (percentile(&samples, 0.50), percentile(&samples, 0.99))
}

/// `lessons mcp` over its stdio: each request written, its answer line read.
fn over_stdio(dir: &Path, tool: &str, args: &[Value]) -> Vec<Duration> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lessons"))
        .arg("--store")
        .arg(dir)
        .arg("mcp")
        .env_remove("LESSONS_STORE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("lessons mcp starts");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    // Times the write of a request and the read of its answer line; the answer is checked
    // after the clock stops, as the HTTP side's is.
    let mut ask = |id: usize, method: &str, params: Value| {
        let request =
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        let started = Instant::now();
        writeln!(stdin, "{request}").expect("write");
        stdin.flush().expect("flush");
        line.clear();
        stdout.read_line(&mut line).expect("read");
        let took = started.elapsed();
        let answer: Value = serde_json::from_str(&line).expect("a JSON-RPC line");
        assert!(
            answer.get("error").is_none() && answer["result"]["isError"] != json!(true),
            "{method}: {line}"
        );
        took
    };
    ask(
        0,
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}),
    );
    let mut samples = Vec::with_capacity(TIMED);
    for i in 0..WARM + TIMED {
        let params = json!({"name": tool, "arguments": args[i % args.len()]});
        let took = ask(i + 1, "tools/call", params);
        if i >= WARM {
            samples.push(took);
        }
    }
    drop(stdin);
    let status = child.wait().expect("exits");
    assert!(status.success());
    samples
}

/// `lessons serve` over HTTP on one keep-alive connection.
fn over_http(dir: &Path, path: &str, bodies: &[Value]) -> Vec<Duration> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_lessons"))
        .arg("--store")
        .arg(dir)
        .args(["serve", "--addr", &format!("127.0.0.1:{port}")])
        .env("MEMORY_TOKEN", TOKEN)
        .env_remove("LESSONS_STORE")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("lessons serve starts");
    let url = format!("http://127.0.0.1:{port}");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let deadline = Instant::now() + Duration::from_secs(30);
    while agent.get(format!("{url}/healthz")).call().is_err() {
        assert!(Instant::now() < deadline, "lessons serve did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut samples = Vec::with_capacity(TIMED);
    for i in 0..WARM + TIMED {
        let body = bodies[i % bodies.len()].to_string();
        let started = Instant::now();
        let mut resp = agent
            .post(format!("{url}{path}"))
            .header("content-type", "application/json")
            .header("authorization", &format!("Bearer {TOKEN}"))
            .send(body.as_bytes())
            .expect("answered");
        let text = resp.body_mut().read_to_string().expect("body");
        assert_eq!(resp.status().as_u16(), 200, "{path}: {text}");
        if i >= WARM {
            samples.push(started.elapsed());
        }
    }
    // SIGTERM: the server drains and closes the store cleanly.
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let _ = child.wait();
    samples
}

fn micros(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument selects nothing here.
    let dir = tempfile::tempdir().expect("dir");
    seed(dir.path());
    let words = vocabulary();
    let mut rng = Rng(0xb1e5);
    let briefs: Vec<String> = (0..64).map(|_| brief(&mut rng, &words, 60)).collect();
    println!(
        "\n`tools/call` over stdio beside the route over HTTP, same store, one request at a time\n"
    );
    println!("| operation | MCP over stdio p50 / p99 | HTTP p50 / p99 | HTTP ÷ stdio, p50 |");
    println!("|---|---|---|---|");
    for (tool, path, args) in ops(&briefs) {
        let (s50, s99) = summary(over_stdio(dir.path(), tool, &args));
        let (h50, h99) = summary(over_http(dir.path(), path, &args));
        println!(
            "| `{tool}` / `POST {path}` | {} / {} | {} / {} | {:.2}× |",
            micros(s50),
            micros(s99),
            micros(h50),
            micros(h99),
            h50.as_secs_f64() / s50.as_secs_f64()
        );
    }
}
