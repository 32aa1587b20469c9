//! A seeded differential run: the same mixed requests (valid, invalid, concurrent) sent to
//! `lessons serve` (in process, on the embedded store) and to a reference memory Worker, every
//! answer compared byte for byte, status included.
//!
//! ```text
//! cargo run --release --example differential -- http://127.0.0.1:8787 TOKEN [SEED] [COUNT]
//! ```
//!
//! The reference Worker runs locally in workerd (npm `miniflare`) from a transcription kept
//! outside this repository. Both sides must see the same clock: each request carries its time in
//! an `x-now` header (milliseconds), which the transcription reads in place of `Date.now()`;
//! this side reads it from a fake clock set before each request. The run prints every mismatch
//! with its request and exits 1 if there was one.

// A harness: a panic is its failure report (see Cargo.toml's lint policy).
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lessons::server::{AppState, Auth, Background};
use lessons::{ContextConfig, Durability, EmbeddedStore, MemoryStore};
use serde_json::Value;

mod cases;

use cases::{request, with_lone_surrogates, Model, Rng, SCOPES};

struct Request {
    method: &'static str,
    path: String,
    /// `None`: no Authorization header.
    token: bool,
    /// The raw body and whether to send a Content-Length for it.
    body: Vec<u8>,
    length: Option<String>,
}

impl Request {
    fn post(path: &str, body: Value) -> Request {
        Request::raw(path, with_lone_surrogates(&body.to_string()).into_bytes())
    }
    fn raw(path: &str, body: Vec<u8>) -> Request {
        let length = Some(body.len().to_string());
        Request {
            method: "POST",
            path: path.to_owned(),
            token: true,
            body,
            length,
        }
    }
    fn describe(&self) -> String {
        format!(
            "{} {} token={} length={:?} {}",
            self.method,
            self.path,
            self.token,
            self.length,
            String::from_utf8_lossy(&self.body)
                .chars()
                .take(600)
                .collect::<String>()
        )
    }
}

/// One HTTP/1.1 exchange on a fresh connection: (status, body).
fn send(addr: SocketAddr, token: &str, req: &Request, now: i64) -> std::io::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut head = format!(
        "{} {} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nx-now: {now}\r\ncontent-type: application/json\r\n",
        req.method, req.path
    );
    if req.token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    if let Some(l) = &req.length {
        head.push_str(&format!("Content-Length: {l}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    if req.length.is_some() {
        // A server may answer (411, 413) and close before reading the body.
        let _ = s.write_all(&req.body);
    }
    // Read the head, then exactly the body it announces: a server may keep the connection open
    // whatever the request asked.
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let split = loop {
        if let Some(p) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::Error::other(format!(
                "no header end in {:?}",
                String::from_utf8_lossy(&raw)
            )));
        }
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let mut body = raw[split + 4..].to_vec();
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok());
    let chunked = head.contains("transfer-encoding: chunked");
    loop {
        let done = match length {
            Some(l) => body.len() >= l,
            None if chunked => body.windows(5).any(|w| w == b"0\r\n\r\n"),
            None => false,
        };
        if done {
            break;
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&buf[..n]);
    }
    if chunked {
        body = dechunk(&body);
    }
    Ok((status, body))
}

/// The documented difference: a dry-run sweep lists its ids in ascending sequence here, in the
/// order SQLite's scan happens to take there.
/// Both engines' answers to one request, one line each, as the log and a mismatch show them.
fn both(a: &(u16, Vec<u8>), b: &(u16, Vec<u8>)) -> String {
    format!(
        "  lessons:   {} {}\n  reference: {} {}",
        a.0,
        String::from_utf8_lossy(&a.1),
        b.0,
        String::from_utf8_lossy(&b.1)
    )
}

fn same_but_for_sweep_order(req: &Request, a: &(u16, Vec<u8>), b: &(u16, Vec<u8>)) -> bool {
    if req.path != "/sweep" || a.0 != 200 || b.0 != 200 {
        return false;
    }
    let sorted = |body: &[u8]| -> Option<Value> {
        let mut v: Value = serde_json::from_slice(body).ok()?;
        let ids = v.get_mut("ids")?.as_array_mut()?;
        ids.sort_by_key(|id| {
            id.as_str()
                .and_then(|s| s.rsplit(':').next())
                .and_then(|n| n.parse::<u64>().ok())
        });
        Some(v)
    };
    match (sorted(&a.1), sorted(&b.1)) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = eol + 2;
        out.extend_from_slice(&b[start..(start + size).min(b.len())]);
        b = &b[(start + size + 2).min(b.len())..];
    }
    out
}

/// A lone surrogate, as a placeholder a `Value` can hold: the body's JSON text gets the escape
/// `\udXXX` in its place (what a JavaScript client sends when it cuts a string inside a pair).
/// The `scopeKey` a body names (the text between its quotes, escapes left as they are).
fn scope_key_of(body: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(body);
    let at = text.find("\"scopeKey\":\"")? + "\"scopeKey\":\"".len();
    let rest = &text[at..];
    Some(rest[..rest.find('"')?].to_owned())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: differential REFERENCE_URL TOKEN [SEED] [COUNT]");
        std::process::exit(2);
    }
    let reference: SocketAddr = args[1]
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .expect("REFERENCE_URL is http://HOST:PORT");
    let token = args[2].clone();
    let seed: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(7);
    let count: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(2000);

    let now = Arc::new(AtomicI64::new(1_795_996_800_000));
    let clock_now = Arc::clone(&now);
    let dir = std::env::temp_dir().join(format!(
        "lessons-differential-{}-{seed}",
        std::process::id()
    ));
    let store: Arc<dyn MemoryStore> = Arc::new(
        EmbeddedStore::builder()
            .clock(Arc::new(move || clock_now.load(Ordering::SeqCst)))
            .durability(Durability::Buffered)
            .open(&dir)
            .expect("the store opens"),
    );
    let auth = Auth {
        token: Some(token.clone()),
        read_token: None,
        open: false,
    };
    let server = Background::start(AppState::new(store, auth, ContextConfig::default()))
        .expect("the server starts");
    let ours = server.addr;

    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut model = Model {
        seqs: vec![0; SCOPES.len()],
    };
    let mut mismatches = 0usize;
    let mut documented = 0usize;
    let mut sent = 0usize;
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    // LESSONS_DIFF_LOG=FILE: every exchange, for tracing a mismatch back to what caused it.
    let mut log = std::env::var_os("LESSONS_DIFF_LOG")
        .map(|p| std::fs::File::create(p).expect("the log file"));
    while sent < count {
        // Time moves on by up to three hours, sometimes not at all (ties in recency).
        if !rng.chance(20) {
            now.fetch_add(rng.below(3 * 3600 * 1000) as i64, Ordering::SeqCst);
        }
        let t = now.load(Ordering::SeqCst);
        // Now and then a burst of concurrent requests, one per scope, so answers stay
        // deterministic while both servers handle them at once.
        let burst = if rng.chance(5) { 2 + rng.below(4) } else { 1 }.min(count - sent);
        let mut batch: Vec<(Request, Option<usize>)> = Vec::new();
        let mut used = std::collections::HashSet::new();
        for _ in 0..burst {
            let (req, wrote) = request(&mut rng, &model);
            // Concurrent requests must be to different scopes, or their order (and so the
            // answers) would depend on timing. A body may name other scopes in pointers, so
            // the scope is read from its `scopeKey` field.
            if burst > 1 && !used.insert(scope_key_of(&req.body)) {
                continue;
            }
            batch.push((req, wrote));
        }
        let answers: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = batch
                .iter()
                .map(|(req, _)| {
                    let token = token.as_str();
                    s.spawn(move || {
                        let started = std::time::Instant::now();
                        let a = send(ours, token, req, t);
                        let ours_took = started.elapsed();
                        let b = send(reference, token, req, t);
                        let total = started.elapsed();
                        if total > Duration::from_secs(2) {
                            eprintln!(
                                "slow: lessons {ours_took:?}, reference {:?}: {}",
                                total - ours_took,
                                req.describe().chars().take(200).collect::<String>()
                            );
                        }
                        (a, b)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a sender"))
                .collect()
        });
        for ((req, wrote), (a, b)) in batch.iter().zip(answers) {
            sent += 1;
            let (a, b) = (
                a.expect("lessons answers"),
                b.expect("the reference answers"),
            );
            *statuses.entry(b.0).or_default() += 1;
            if let Some(f) = log.as_mut() {
                let _ = writeln!(f, "#{sent} at {t}: {}\n{}", req.describe(), both(&a, &b));
            }
            if a != b && same_but_for_sweep_order(req, &a, &b) {
                documented += 1;
            } else if a != b {
                mismatches += 1;
                println!(
                    "MISMATCH #{sent} at {t}\n  request:   {}\n{}",
                    req.describe(),
                    both(&a, &b)
                );
            }
            if let (Some(scope), 200) = (wrote, b.0) {
                if let Ok(v) = serde_json::from_slice::<Value>(&b.1) {
                    model.seqs[*scope] += v["inserted"].as_u64().unwrap_or(0);
                }
            }
        }
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "{sent} requests (seed {seed}), statuses {statuses:?}: {mismatches} mismatches, {documented} sweep dry runs listing the same ids in another order (documented)"
    );
    if mismatches > 0 {
        std::process::exit(1);
    }
}
