//! `lessons mcp` over stdio and `/mcp` on `lessons serve`, driven through the protocol's
//! handshake, every tool and the prompt, and held to the matching routes' answers on the same
//! store; a bad call of each kind; the read and the write token; and the protocol's own
//! TypeScript client as an independent one (opt-in: it needs node).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use lessons::{Candidate, EmbeddedStore, MemoryStore, WriteOptions};
use serde_json::{json, Value};

use crate::fixtures::server::{call, Serve, TOKEN};
use crate::util::{lessons, scope, stderr};

const READ_TOKEN: &str = "ro-secret-0123456789";

/// A store holding lessons in a repository and its organization, closed cleanly.
fn seeded(dir: &Path) {
    let store = EmbeddedStore::open(dir).expect("open");
    let repo = scope("repo:acme/app");
    let org = scope("org:acme");
    let facts = [
        "the license check fails on a resident tree whose nested node_modules were dropped; npm ci fixes it",
        "pnpm install must run before vitest, or the workspace links point at stale builds",
        "the e2e suite needs PLAYWRIGHT_BROWSERS_PATH=0 because the runner's cache volume is read-only",
    ];
    let batch: Vec<Candidate> = facts
        .iter()
        .map(|t| Candidate::fact(*t, "slack:C1:1"))
        .collect();
    store
        .write(&repo, &batch, &WriteOptions::default())
        .expect("write");
    store
        .write(
            &org,
            &[Candidate::fact(
                "vitest workers leak memory on node 18; pin node 20 in CI",
                "slack:C1:2",
            )],
            &WriteOptions::default(),
        )
        .expect("write");
    store.close().expect("close");
}

/// A `lessons mcp` child and a JSON-RPC session with it over its stdin and stdout.
struct Session {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Option<BufReader<ChildStdout>>,
    next: u64,
}

impl Session {
    fn spawn(dir: &Path) -> Session {
        let mut child = lessons()
            .arg("--store")
            .arg(dir)
            .arg("mcp")
            .env_remove("LESSONS_STORE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("lessons mcp starts");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().map(BufReader::new);
        Session {
            child,
            stdin,
            stdout,
            next: 1,
        }
    }

    fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{message}").expect("write");
        stdin.flush().expect("flush");
    }

    /// Sends a request and reads lines until its answer (skipping notifications).
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let stdout = self.stdout.as_mut().expect("stdout open");
        loop {
            let mut line = String::new();
            let n = stdout.read_line(&mut line).expect("read");
            assert!(n > 0, "the server closed stdout before answering {method}");
            let v: Value = serde_json::from_str(&line).expect("a JSON-RPC line");
            if v["id"] == json!(id) {
                return v;
            }
        }
    }

    fn handshake(&mut self) -> Value {
        let init = self.request(
            "initialize",
            json!({
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "lessons-test", "version": "1"}
            }),
        );
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        init
    }

    fn tool(&mut self, name: &str, arguments: Value) -> Value {
        self.request("tools/call", json!({"name": name, "arguments": arguments}))
    }

    /// Closes stdin and waits for the process to end: its exit status and stderr.
    fn close(mut self) -> (std::process::ExitStatus, String) {
        drop(self.stdin.take());
        drop(self.stdout.take());
        wait(&mut self.child)
    }
}

/// Waits at most 20 s for `child` to end.
fn wait(child: &mut Child) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return (status, err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the process did not end");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A value with every `lastUsedAt` and `createdAt` removed: two stores written and read at
/// different times differ only there.
fn timeless(mut v: Value) -> Value {
    match &mut v {
        Value::Object(o) => {
            o.remove("lastUsedAt");
            o.remove("createdAt");
            for x in o.values_mut() {
                *x = timeless(x.take());
            }
        }
        Value::Array(a) => {
            for x in a.iter_mut() {
                *x = timeless(x.take());
            }
        }
        _ => {}
    }
    v
}

/// The calls a run makes, as (tool, its arguments, the route, the route's body).
fn run_calls() -> Vec<(&'static str, Value, &'static str, Value)> {
    let run = json!({"org": "acme", "repo": "acme/app", "channel": "slack:C1"});
    let with = |extra: Value| {
        let mut o = run.clone();
        if let (Some(o), Value::Object(e)) = (o.as_object_mut(), extra) {
            o.extend(e);
        }
        o
    };
    let reply = r#"{"facts":[{"text":"PR 12 was merged","confidence":0.9,"audience":"repo"},{"text":"check:deps-drift names any lockfile drift","confidence":0.8,"audience":"repo"}]}"#;
    vec![
        (
            "lessons_context",
            with(json!({"brief": "add a registry drift check to CI"})),
            "/context",
            with(json!({"brief": "add a registry drift check to CI"})),
        ),
        (
            "lessons_search",
            json!({"scopeKey": "org:acme", "query": "vitest memory node"}),
            "/retrieve",
            json!({"scopeKey": "org:acme", "query": "vitest memory node", "limit": 8}),
        ),
        (
            "lessons_window",
            json!({"scopeKey": "repo:acme/app"}),
            "/list",
            json!({"scopeKey": "repo:acme/app", "limit": 24, "kind": "fact"}),
        ),
        (
            "lessons_reflect",
            with(json!({"reply": reply, "shown": [], "runId": "run-1"})),
            "/reflect",
            with(json!({"reply": reply, "shown": [], "runId": "run-1"})),
        ),
        (
            "lessons_window",
            json!({"scopeKey": "repo:acme/app"}),
            "/list",
            json!({"scopeKey": "repo:acme/app", "limit": 24, "kind": "fact"}),
        ),
    ]
}

#[test]
fn stdio_answers_every_tool_and_the_prompt_as_the_routes_do() {
    let dir = tempfile::tempdir().expect("dir");
    let seed = dir.path().join("seed");
    seeded(&seed);
    let (over_mcp, over_http) = (dir.path().join("mcp"), dir.path().join("http"));
    crate::util::copy_tree(&seed, &over_mcp);
    crate::util::copy_tree(&seed, &over_http);

    let mut s = Session::spawn(&over_mcp);
    let init = s.handshake();
    assert_eq!(init["result"]["serverInfo"]["name"], "lessons", "{init}");
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
    let tools = s.request("tools/list", json!({}));
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "lessons_context",
            "lessons_search",
            "lessons_window",
            "lessons_gate",
            "lessons_reflect"
        ]
    );
    for t in tools["result"]["tools"].as_array().expect("tools") {
        assert_eq!(t["inputSchema"]["type"], "object", "{t}");
    }
    let mut answers = Vec::new();
    for (tool, args, _, _) in run_calls() {
        let r = s.tool(tool, args);
        assert_eq!(r["result"]["isError"], false, "{tool}: {r}");
        answers.push(r["result"].clone());
    }
    // The model reads the block, and the [memory] line.
    let context_text = answers[0]["content"][0]["text"].as_str().expect("text");
    assert!(context_text.starts_with("Background memory for org:acme + repo:acme/app"));
    assert_eq!(
        answers[3]["content"][0]["text"],
        "[memory] offered 2, rejected 1, restated 0, inserted 1, deduped 0, summary 0"
    );

    // The gate: each text's markers, or none for a lesson.
    let gate = s.tool(
        "lessons_gate",
        json!({"texts": ["PR 12 was merged", "run npm ci before the license check"]}),
    );
    assert_eq!(
        gate["result"]["structuredContent"],
        json!({"verdicts": [{"markers": ["reference", "delivery"]}, {"markers": []}]})
    );
    assert_eq!(
        gate["result"]["content"][0]["text"],
        "reference, delivery\nlesson"
    );

    // The reflection prompt: the extractor's instructions and input, the shown handles in _meta.
    let prompts = s.request("prompts/list", json!({}));
    assert_eq!(
        prompts["result"]["prompts"][0]["name"],
        "lessons_reflection"
    );
    let prompt_args = json!({"org": "acme", "repo": "acme/app", "request": "fix the license check", "answer": "npm ci fixed it"});
    let prompt = s.request(
        "prompts/get",
        json!({"name": "lessons_reflection", "arguments": prompt_args}),
    );
    let messages = prompt["result"]["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 2, "{prompt}");
    let shown = prompt["result"]["_meta"]["lessons/shown"].clone();
    assert!(shown.as_array().is_some_and(|s| !s.is_empty()), "{prompt}");

    // Bad calls: an unknown tool, wrong arguments (naming the field), an unknown method.
    let unknown = s.tool("lessons_remember", json!({"text": "x"}));
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    assert!(unknown["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("lessons_remember")));
    let missing = s.tool("lessons_search", json!({"query": "x"}));
    assert_eq!(missing["error"]["code"], -32602, "{missing}");
    assert!(missing["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("scopeKey")));
    let wrong = s.tool(
        "lessons_search",
        json!({"scopeKey": "org:acme", "query": "x", "limit": 0}),
    );
    assert_eq!(
        wrong["error"]["message"],
        "limit must be an integer between 1 and 50"
    );
    let gate_wrong = s.tool("lessons_gate", json!({"texts": "PR 12"}));
    assert_eq!(
        gate_wrong["error"]["message"],
        "texts must be an array of strings"
    );
    let method = s.request("resources/list", json!({}));
    assert_eq!(method["error"]["code"], -32601, "{method}");
    let (status, err) = s.close();
    assert!(status.success(), "a closed stdin ends it with 0: {err}");

    // The same calls, as routes, on a copy of the same store.
    let served = Serve::start(&over_http);
    for ((tool, _, path, body), mcp) in run_calls().into_iter().zip(&answers) {
        let (status, text) = call(&served.url, "POST", path, Some(TOKEN), &body.to_string());
        assert_eq!(status, 200, "{path}: {text}");
        let route: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(
            timeless(mcp["structuredContent"].clone()),
            timeless(route),
            "{tool} answers as {path}"
        );
    }
    let (status, text) = call(
        &served.url,
        "POST",
        "/prompt",
        Some(TOKEN),
        &prompt_args.to_string(),
    );
    assert_eq!(status, 200);
    let route: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(messages[0]["content"]["text"], route["system"]);
    assert_eq!(messages[1]["content"]["text"], route["input"]);
    assert_eq!(shown, route["shown"]);
    drop(served);
}

#[test]
fn stdio_ends_with_0_when_stdout_closes_and_names_a_store_held_elsewhere() {
    let dir = tempfile::tempdir().expect("dir");
    seeded(dir.path());
    let mut s = Session::spawn(dir.path());
    s.handshake();
    // The client stops reading: the next answer cannot be written, and the server ends.
    drop(s.stdout.take());
    s.send(&json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": {}}));
    let (status, err) = wait(&mut s.child);
    assert!(status.success(), "a closed stdout ends it with 0: {err}");

    // A store another process holds is named, as every command names it.
    let _held = EmbeddedStore::open(dir.path()).expect("held by this process");
    let out = crate::util::run(&["--store", dir.path().to_str().expect("utf-8"), "mcp"], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("is held by another process"),
        "{}",
        stderr(&out)
    );
}

/// One JSON-RPC request to `/mcp` with `token`: the HTTP status and the answer's JSON.
fn mcp_post(url: &str, token: Option<&str>, id: u64, method: &str, params: Value) -> (u16, Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut r = agent
        .post(format!("{url}/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25");
    if let Some(t) = token {
        r = r.header("authorization", &format!("Bearer {t}"));
    }
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let mut resp = r
        .send(body.to_string().as_bytes())
        .expect("the server answers");
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().expect("a body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[test]
fn http_serves_the_tools_a_token_may_call() {
    let dir = tempfile::tempdir().expect("dir");
    seeded(dir.path());
    let served = Serve::command(dir.path()).read_token(READ_TOKEN).start();
    let url = served.url.clone();
    let init = json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}});

    // No token: refused before the protocol.
    assert_eq!(mcp_post(&url, None, 1, "initialize", init.clone()).0, 401);

    // The read token sees the read tools; the reflection's write is refused with the route's word.
    let (status, answer) = mcp_post(&url, Some(READ_TOKEN), 1, "initialize", init.clone());
    assert_eq!(status, 200, "{answer}");
    let (_, tools) = mcp_post(&url, Some(READ_TOKEN), 2, "tools/list", json!({}));
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "lessons_context",
            "lessons_search",
            "lessons_window",
            "lessons_gate"
        ]
    );
    let reply = r#"{"facts":[{"text":"check:deps-drift names any lockfile drift","confidence":0.8,"audience":"repo"}]}"#;
    let reflect = json!({"name": "lessons_reflect", "arguments": {"org": "acme", "repo": "acme/app", "reply": reply, "shown": []}});
    let (_, refused) = mcp_post(&url, Some(READ_TOKEN), 3, "tools/call", reflect.clone());
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert_eq!(refused["result"]["content"][0]["text"], "forbidden");

    // The write token writes; the window the read token then reads is the route's.
    let (_, written) = mcp_post(&url, Some(TOKEN), 4, "tools/call", reflect);
    assert_eq!(written["result"]["isError"], false, "{written}");
    assert_eq!(written["result"]["structuredContent"]["inserted"], 1);
    let window = json!({"name": "lessons_window", "arguments": {"scopeKey": "repo:acme/app"}});
    let (_, over_mcp) = mcp_post(&url, Some(READ_TOKEN), 5, "tools/call", window);
    let (status, text) = call(
        &url,
        "POST",
        "/list",
        Some(READ_TOKEN),
        &json!({"scopeKey": "repo:acme/app", "limit": 24, "kind": "fact"}).to_string(),
    );
    assert_eq!(status, 200);
    let route: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(over_mcp["result"]["structuredContent"], route);
    assert_eq!(route["records"].as_array().map(Vec::len), Some(4));

    // Wrong arguments over HTTP are JSON-RPC errors too.
    let (_, wrong) = mcp_post(
        &url,
        Some(TOKEN),
        6,
        "tools/call",
        json!({"name": "lessons_context", "arguments": {"brief": "x"}}),
    );
    assert_eq!(wrong["error"]["code"], -32602, "{wrong}");
    assert!(wrong["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("org")));
    drop(served);
}

/// The protocol's own TypeScript client (npm `@modelcontextprotocol/sdk`, installed in
/// `tests/mcp` by `npm ci`) drives `lessons mcp` over stdio and `/mcp` over HTTP.
#[test]
#[ignore = "needs node and `npm ci --prefix tests/mcp` (CI installs both)"]
fn the_typescript_client_drives_stdio_and_http() {
    let dir = tempfile::tempdir().expect("dir");
    let (stdio_store, http_store) = (dir.path().join("stdio"), dir.path().join("http"));
    seeded(&stdio_store);
    seeded(&http_store);
    let mut server = Serve::command(&http_store).read_token(READ_TOKEN).start();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/client.mjs");
    let out = Command::new("node")
        .arg(&script)
        .arg(env!("CARGO_BIN_EXE_lessons"))
        .arg(&stdio_store)
        .arg(format!("{}/mcp", server.url))
        .arg(TOKEN)
        .arg(READ_TOKEN)
        .env_remove("LESSONS_STORE")
        .output()
        .expect("node runs");
    server.kill();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the client failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(text.trim()).expect("the client's JSON report");
    assert_eq!(
        report["stdio"]["tools"],
        json!([
            "lessons_context",
            "lessons_search",
            "lessons_window",
            "lessons_gate",
            "lessons_reflect"
        ])
    );
    assert!(report["stdio"]["context"]
        .as_str()
        .is_some_and(|b| b.contains("the license check fails")));
    assert_eq!(
        report["stdio"]["gate"],
        json!({"verdicts": [{"markers": ["reference", "delivery"]}, {"markers": []}]})
    );
    assert_eq!(
        report["stdio"]["reflect"],
        "[memory] offered 2, rejected 1, restated 0, inserted 1, deduped 0, summary 0"
    );
    assert_eq!(report["stdio"]["promptMessages"], 2);
    assert_eq!(report["stdio"]["unknownTool"], -32602);
    assert_eq!(
        report["http"]["readTools"],
        json!([
            "lessons_context",
            "lessons_search",
            "lessons_window",
            "lessons_gate"
        ])
    );
    assert_eq!(report["http"]["readReflect"], "forbidden");
    assert_eq!(report["http"]["writeReflectInserted"], 1);
    assert_eq!(report["http"]["noToken"], 401);
}
