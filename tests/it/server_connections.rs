//! The server's connections under hostile or slow clients: idle, slow and excess connections
//! are closed and logged, silent sockets starve no client with requests, and a slow reader of
//! an export gets every record while the calls of runs keep the cores.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lessons::store::{EmbeddedStore, MemoryStore};
use lessons::Record;
use serde_json::json;

use crate::fixtures::server::{call, post, Serve, TOKEN};
use crate::server_faults::big_record;

/// Opens a TCP connection and writes `bytes` (maybe nothing).
fn connect_and_send(port: u16, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.write_all(bytes).expect("send");
    s
}

/// Whether the server closes `s` within `within` (EOF or reset when reading).
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).expect("timeout");
    let mut buf = [0u8; 1024];
    let started = Instant::now();
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {} // an error answer (408) before the close
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return false
            }
            Err(_) => return true,
        }
        if started.elapsed() > within {
            return false;
        }
    }
}

#[test]
fn idle_slow_and_excess_connections_are_closed_and_logged() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let log_path = tmp.path().join("serve.log");
    let mut served = Serve::command(&tmp.path().join("store"))
        .args(&["--max-connections", "8", "--idle-timeout", "2"])
        .stderr(std::fs::File::create(&log_path).expect("log"))
        .start();
    let (url, port) = (served.url.clone(), served.port);
    // Let the probe connections above be closed as idle before filling the slots.
    std::thread::sleep(Duration::from_millis(2500));

    // Opened a little apart, so the first is the one quiet longest.
    let mut idle: Vec<TcpStream> = (0..6)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(20));
            connect_and_send(port, b"")
        })
        .collect();
    let mut slow_header = connect_and_send(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n");
    let mut slow_body = connect_and_send(
        port,
        format!(
            "POST /list HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"scope"
        )
        .as_bytes(),
    );
    std::thread::sleep(Duration::from_millis(200));
    // Every slot is taken: a new connection displaces the one quiet longest (the first idle
    // socket) and is answered; nothing is left hanging.
    let mut next = connect_and_send(
        port,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    next.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    let mut answer = String::new();
    let _ = next.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        closed_within(&mut idle[0], Duration::from_secs(1)),
        "the connection quiet longest made room"
    );
    // The silent ones are closed after the idle timeout (2 s), freeing the slots.
    for s in idle
        .iter_mut()
        .skip(1)
        .chain([&mut slow_header, &mut slow_body])
    {
        assert!(
            closed_within(s, Duration::from_secs(5)),
            "a silent connection stays open"
        );
    }
    assert_eq!(call(&url, "GET", "/healthz", None, "").0, 200);
    assert_eq!(
        post(&url, "/list", json!({"scopeKey": "org:acme", "limit": 5}))["records"],
        json!([])
    );
    assert_eq!(served.terminate().code(), Some(0));
    let log = std::fs::read_to_string(&log_path).expect("log");
    assert!(log.contains("connection limit reached"), "{log}");
    assert!(log.contains("silent too long"), "{log}");
}

/// One request on a fresh connection; how long until its whole answer came back, if it did.
fn timed_request(port: u16, request: &[u8], within: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(within)).ok()?;
    s.write_all(request).ok()?;
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    answer
        .starts_with(b"HTTP/1.1 200")
        .then(|| started.elapsed())
}

#[test]
fn sockets_held_open_and_silent_do_not_starve_a_client_with_requests() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let served = Serve::command(&tmp.path().join("store"))
        .args(&["--max-connections", "32", "--idle-timeout", "30"])
        .start();
    let port = served.port;
    // More silent sockets than slots, each opened again as soon as it is closed.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let holders: Vec<_> = (0..40)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    };
                    let _ = closed_within(&mut s, Duration::from_millis(500));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let body = r#"{"scopeKey":"org:acme","limit":5}"#;
    let request = format!(
        "POST /list HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let tries = 60;
    let answered = (0..tries)
        .filter(|_| {
            std::thread::sleep(Duration::from_millis(50));
            timed_request(port, request.as_bytes(), Duration::from_secs(1)).is_some()
        })
        .count();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in holders {
        let _ = h.join();
    }
    drop(served);
    eprintln!("answered within 1 s beside 40 silent sockets at 32 slots: {answered} of {tries}");
    assert!(
        answered * 100 >= tries * 95,
        "answered within 1 s: {answered} of {tries}"
    );
}

#[test]
fn a_slow_export_reader_gets_every_record() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("store");
    {
        let store = EmbeddedStore::open(&dir).expect("open");
        let records: Vec<Record> = (0..2_000).map(|i| big_record("org:big", i)).collect();
        store.import(&records).expect("import");
        store.close().expect("close");
    }
    let served = Serve::command(&dir).args(&["--idle-timeout", "2"]).start();
    let port = served.port;
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.write_all(format!("POST /export HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}").as_bytes())
        .expect("send");
    // The reader stalls far longer than the idle timeout while 8 MB wait to be read.
    std::thread::sleep(Duration::from_secs(6));
    // Meanwhile the export's thread waits to send, at a lower CPU priority than the calls of
    // runs (Linux gives each thread a nice value of its own).
    #[cfg(target_os = "linux")]
    assert_eq!(
        thread_nice(served.child.id(), "lessons-export"),
        Some(10),
        "the export thread yields the cores"
    );
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    drop(served);
    assert!(
        raw.ends_with(b"0\r\n\r\n"),
        "the chunked answer ends with its terminator"
    );
    let text = String::from_utf8_lossy(&raw);
    assert_eq!(
        text.matches("\"id\":\"mem:org:big:").count(),
        2_000,
        "every record arrives"
    );
}

/// The nice value of `pid`'s thread named `name`, from `/proc/PID/task/TID/stat` (the 19th
/// field; the name, in parentheses, may hold spaces, so fields are counted after it).
#[cfg(target_os = "linux")]
fn thread_nice(pid: u32, name: &str) -> Option<i32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    tasks.flatten().find_map(|task| {
        let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
        let open = stat.find('(')?;
        let close = stat.rfind(')')?;
        if stat.get(open + 1..close)? != name {
            return None;
        }
        stat.get(close + 1..)?
            .split_whitespace()
            .nth(16)?
            .parse()
            .ok()
    })
}
