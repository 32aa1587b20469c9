//! The newest reference Worker's answers, recorded: `tests/data/reference-transcript.jsonl`
//! holds requests sent to the Worker (rebuilt from the newest stored sources and run in workerd)
//! with the exact bytes it answered, case by case. The same requests, sent in the same order to
//! `lessons serve` at the same clock, must answer the same status and the same bytes.
//!
//! The cases cover what the newest bot and the newest runtime do that older ones did not:
//! version-2 dependency envelopes (validation, unions across dedup, restate and supersede,
//! equivocation, overflow), a body that starts with a byte-order mark, invalid UTF-8, and lone
//! surrogates in scope keys, texts, keywords, pointers, queries and provenance.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use lessons::server::Background;
use lessons::{EmbeddedStore, MemoryStore};
use serde_json::Value;

use crate::fixtures::server::{auth, serve, serve_like_the_reference};
use crate::util::FakeClock;

const REFERENCE_TOKEN: &str = "reference-token-0123456789";

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Sends `body` as it is, with its exact length, and reads the whole answer.
fn exchange(addr: std::net::SocketAddr, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {REFERENCE_TOKEN}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("send");
    s.write_all(body).expect("send");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP answer");
    let head = String::from_utf8_lossy(&out[..split]).to_string();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut answer = out[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        answer = dechunk(&answer);
    }
    (status, answer)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap_or("0"), 16).unwrap_or(0);
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
}

#[test]
fn every_recorded_answer_of_the_newest_reference_worker_is_answered_byte_for_byte() {
    let dir = tempfile::tempdir().expect("dir");
    let clock = FakeClock::new(0);
    let server = serve_like_the_reference(dir.path(), &clock, REFERENCE_TOKEN);
    let addr = server.addr();
    let transcript = include_str!("../data/reference-transcript.jsonl");
    let mut mismatches = Vec::new();
    let mut count = 0;
    for line in transcript.lines() {
        let step: Value = serde_json::from_str(line).expect("a transcript line");
        let body = match step.get("bodyHex").and_then(Value::as_str) {
            Some(h) => hex(h),
            None => step["body"].as_str().expect("body").as_bytes().to_vec(),
        };
        clock.set(step["now"].as_i64().expect("now"));
        let path = step["path"].as_str().expect("path");
        let (status, answer) = exchange(addr, path, &body);
        let want_answer = match step.get("answerHex").and_then(Value::as_str) {
            Some(h) => hex(h),
            None => step["answer"].as_str().expect("answer").as_bytes().to_vec(),
        };
        let want_status = step["status"].as_u64().expect("status") as u16;
        count += 1;
        if status != want_status || answer != want_answer {
            mismatches.push(format!(
                "{} step {} {path}\n  sent:      {}\n  reference: {want_status} {}\n  lessons:   {status} {}",
                step["case"],
                step["step"],
                String::from_utf8_lossy(&body),
                String::from_utf8_lossy(&want_answer),
                String::from_utf8_lossy(&answer)
            ));
        }
    }
    assert!(count > 200, "the transcript holds {count} requests");
    assert!(
        mismatches.is_empty(),
        "{} of {count} answers differ:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

#[test]
fn a_keyword_with_a_lone_surrogate_survives_export_and_import_through_the_server() {
    let serve = |dir: &std::path::Path| {
        let store: Arc<dyn MemoryStore> = Arc::new(EmbeddedStore::open(dir).expect("open"));
        serve(store, auth(REFERENCE_TOKEN, None))
    };
    let (a, b) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let (first, second) = (serve(a.path()), serve(b.path()));
    let body = br#"{"scopeKey":"org:kw","records":[{"kind":"fact","text":"kw \udc00 test","keywords":["x\udc00y"],"sourceThreadKey":"t"}]}"#;
    assert_eq!(exchange(first.addr(), "/write", body).0, 200);
    let remote = |s: &Background| {
        lessons::remote::RemoteStore::new(
            &s.url(),
            Some(REFERENCE_TOKEN.into()),
            Duration::from_secs(10),
        )
        .expect("client")
    };
    let records = crate::util::exported(&remote(&first));
    assert_eq!(records.len(), 1);
    remote(&second).import(&records).expect("import");
    let list = br#"{"scopeKey":"org:kw","limit":5}"#;
    let (status, answer) = exchange(second.addr(), "/list", list);
    assert_eq!(status, 200);
    let answer = String::from_utf8(answer).expect("UTF-8");
    let want = format!(
        "\"text\":\"kw {} test\",\"keywords\":[\"x\\udc00y\"]",
        "\u{FFFD}".repeat(3)
    );
    assert!(answer.contains(&want), "{answer}");
}
