//! `lessons gate`: the markers of each fact, from arguments or stdin.

use std::io::{self, BufRead, BufWriter, Read, Write};

use clap::Args;
use lessons::gate::rejection_marker_names;

use super::{emit, Cli, Failure, Outcome};

/// Arguments of `lessons gate`.
#[derive(Debug, Args)]
pub(crate) struct GateArgs {
    /// Facts to check; without any, one fact per stdin line.
    #[arg(value_name = "TEXT")]
    pub texts: Vec<String>,
    /// Read one JSON string or {"text": …} per stdin line; print one {"markers": […]} per line
    /// (or {"error": "<reason>"} for a malformed line, and go on).
    #[arg(long, conflicts_with = "texts")]
    pub json_lines: bool,
    /// Exit 1 when any fact carries a marker.
    #[arg(long)]
    pub check: bool,
}

pub(crate) fn run(cli: &Cli, args: &GateArgs) -> Result<Outcome, Failure> {
    let any_marker = if args.json_lines {
        let limits = Limits {
            chunk_bytes: CHUNK_BYTES,
            max_line_bytes: MAX_LINE_BYTES,
        };
        json_lines(&mut io::stdin().lock(), &mut io::stdout().lock(), limits)?
    } else {
        plain_lines(cli, args)?
    };
    Ok(if args.check && any_marker {
        Outcome::Found
    } else {
        Outcome::Ok
    })
}

/// Facts from the arguments, or one per stdin line: `lesson` or the markers, one line each.
fn plain_lines(cli: &Cli, args: &GateArgs) -> Result<bool, Failure> {
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut any_marker = false;
    let mut verdict = |out: &mut BufWriter<_>, text: &str| -> Result<(), Failure> {
        let markers = rejection_marker_names(text);
        any_marker |= !markers.is_empty();
        if cli.json {
            let mut line = Vec::new();
            write_markers(&mut line, &markers);
            out.write_all(&line)?;
            return Ok(());
        }
        let line = if markers.is_empty() {
            "lesson".to_owned()
        } else {
            markers.join(", ")
        };
        emit(out, &line)
    };

    if !args.texts.is_empty() {
        for text in &args.texts {
            verdict(&mut out, text)?;
        }
    } else {
        let stdin = io::stdin();
        let mut input = stdin.lock();
        let mut buf = Vec::new();
        let mut number = 0usize;
        loop {
            buf.clear();
            // Read at most one line's worth: a line longer than any fact can be is refused
            // without ever being held whole.
            if (&mut input)
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut buf)?
                == 0
            {
                break;
            }
            number += 1;
            if buf.len() > MAX_LINE_BYTES && !buf.ends_with(b"\n") {
                return Err(Failure::Usage(format!(
                    "stdin line {number}: line is longer than {MAX_LINE_BYTES} bytes"
                )));
            }
            let Ok(line) = std::str::from_utf8(strip_newline(&buf)) else {
                return Err(Failure::Usage(format!(
                    "stdin line {number} is not valid UTF-8"
                )));
            };
            verdict(&mut out, line)?;
        }
    }
    out.flush()?;
    Ok(any_marker)
}

/// `{"markers":[…]}` and a newline, as serde_json prints it (marker names need no escaping).
fn write_markers(out: &mut Vec<u8>, markers: &[&str]) {
    out.extend_from_slice(b"{\"markers\":[");
    for (i, name) in markers.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'"');
        out.extend_from_slice(name.as_bytes());
        out.push(b'"');
    }
    out.extend_from_slice(b"]}\n");
}

/// Bytes read per chunk of `--json-lines` work; a chunk ends at the last newline read.
const CHUNK_BYTES: usize = 256 << 10;

/// The sizes `--json-lines` works in (small ones in tests, to cross every boundary).
#[derive(Clone, Copy)]
struct Limits {
    chunk_bytes: usize,
    max_line_bytes: usize,
}

/// One chunk of `--json-lines` input.
enum Chunk {
    /// Whole lines, each ending in `\n` but perhaps the input's last.
    Lines(Vec<u8>),
    /// One line longer than the limit, skipped unread.
    TooLong,
}

/// Buffers handed back for reuse: fresh ones would be fresh pages, zeroed by the kernel, for
/// every chunk.
#[derive(Default)]
struct Pool(parking_lot::Mutex<Vec<Vec<u8>>>);

impl Pool {
    fn take(&self) -> Vec<u8> {
        self.0.lock().pop().unwrap_or_default()
    }

    fn give(&self, mut buf: Vec<u8>) {
        buf.clear();
        self.0.lock().push(buf);
    }
}

/// The answer to one line of `--json-lines` input, appended to `out`; whether it carried a
/// marker.
fn answer_line(out: &mut Vec<u8>, raw: &[u8], limits: Limits, scratch: &mut String) -> bool {
    match std::str::from_utf8(raw) {
        Ok(line) => answer_text_line(out, line, limits, scratch),
        Err(_) => {
            out.extend_from_slice(error_line("line is not valid UTF-8").as_bytes());
            out.push(b'\n');
            false
        }
    }
}

/// [`answer_line`] for a line already known to be UTF-8.
fn answer_text_line(out: &mut Vec<u8>, line: &str, limits: Limits, scratch: &mut String) -> bool {
    let line = line.strip_suffix('\r').unwrap_or(line);
    if line.len() > limits.max_line_bytes {
        out.extend_from_slice(error_line(&too_long(limits)).as_bytes());
        out.push(b'\n');
        return false;
    }
    let text = match fast_json_text(line, scratch) {
        Some(text) => Ok(std::borrow::Cow::Borrowed(text)),
        None => parse_json_line(line),
    };
    match text {
        Ok(text) => {
            let markers = rejection_marker_names(&text);
            write_markers(out, &markers);
            !markers.is_empty()
        }
        Err(reason) => {
            out.extend_from_slice(error_line(&reason).as_bytes());
            out.push(b'\n');
            false
        }
    }
}

fn too_long(limits: Limits) -> String {
    format!("line is longer than {} bytes", limits.max_line_bytes)
}

/// The answers to every line of `chunk`, and whether any carried a marker.
fn answer_chunk(chunk: &Chunk, limits: Limits, out: &mut Vec<u8>) -> bool {
    let bytes = match chunk {
        Chunk::TooLong => {
            out.extend_from_slice(error_line(&too_long(limits)).as_bytes());
            out.push(b'\n');
            return false;
        }
        Chunk::Lines(bytes) => bytes,
    };
    // A final newline ends the last line; it does not begin another.
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let mut any = false;
    let mut scratch = String::new();
    // Valid as a whole is valid line by line (lines are cut at an ASCII byte), and one
    // validation of the chunk is cheaper than one per line.
    if let Ok(text) = std::str::from_utf8(bytes) {
        for line in text.split('\n') {
            any |= answer_text_line(out, line, limits, &mut scratch);
        }
    } else {
        for line in bytes.split(|&b| b == b'\n') {
            any |= answer_line(out, line, limits, &mut scratch);
        }
    }
    any
}

/// Reads into `buf` past its end, at most `want` bytes more; 0 at the end of the input.
fn read_more(input: &mut impl Read, buf: &mut Vec<u8>, want: usize) -> io::Result<usize> {
    let len = buf.len();
    buf.resize(len + want, 0);
    let n = loop {
        match input.read(buf.get_mut(len..).unwrap_or_default()) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => break other,
        }
    };
    buf.truncate(len + *n.as_ref().unwrap_or(&0));
    n
}

/// `--json-lines`: the input is read in chunks of whole lines, the chunks are answered on
/// every core (the gate is pure), and the answers are written in input order. At most two
/// chunks per worker are in flight and a line is never held past the limit, so memory stays
/// bounded whatever the input.
fn json_lines(
    input: &mut impl Read,
    output: &mut impl Write,
    limits: Limits,
) -> Result<bool, Failure> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let (work_tx, work_rx) = std::sync::mpsc::sync_channel::<(usize, Chunk)>(workers * 2);
    let work_rx = parking_lot::Mutex::new(work_rx);
    let (done_tx, done_rx) = std::sync::mpsc::channel::<(usize, Vec<u8>, bool)>();
    let (inputs, outputs) = (Pool::default(), Pool::default());
    std::thread::scope(|scope| -> Result<bool, Failure> {
        for _ in 0..workers {
            let done_tx = done_tx.clone();
            let (work_rx, inputs, outputs) = (&work_rx, &inputs, &outputs);
            scope.spawn(move || loop {
                let next = work_rx.lock().recv();
                let Ok((n, chunk)) = next else { return };
                let mut out = outputs.take();
                let any = answer_chunk(&chunk, limits, &mut out);
                if let Chunk::Lines(bytes) = chunk {
                    inputs.give(bytes);
                }
                if done_tx.send((n, out, any)).is_err() {
                    return;
                }
            });
        }
        drop(done_tx);
        let mut writer = Ordered {
            out: output,
            pending: std::collections::BTreeMap::new(),
            written: 0,
            any_marker: false,
            outputs: &outputs,
        };
        let mut sent = 0usize;
        let mut send = |chunk: Chunk, writer: &mut Ordered<'_, _>| -> Result<bool, Failure> {
            // Keep at most two chunks per worker in flight.
            while sent - writer.written >= workers * 2 {
                let Ok(done) = done_rx.recv() else {
                    return Ok(false);
                };
                writer.accept(done)?;
            }
            let sent_ok = work_tx.send((sent, chunk)).is_ok();
            sent += 1;
            Ok(sent_ok)
        };
        let mut pending = inputs.take();
        loop {
            if read_more(input, &mut pending, limits.chunk_bytes)? == 0 {
                if !pending.is_empty() {
                    send(Chunk::Lines(pending), &mut writer)?;
                }
                break;
            }
            if let Some(end) = pending.iter().rposition(|&b| b == b'\n') {
                if pending.len() >= limits.chunk_bytes {
                    let mut rest = inputs.take();
                    rest.extend_from_slice(pending.get(end + 1..).unwrap_or_default());
                    pending.truncate(end + 1);
                    let chunk = std::mem::replace(&mut pending, rest);
                    if !send(Chunk::Lines(chunk), &mut writer)? {
                        break;
                    }
                }
            } else if pending.len() > limits.max_line_bytes + 1 {
                // One line longer than any fact (a `\r` before its newline not counted):
                // answered with an error, the rest of it read and dropped without being held.
                if !send(Chunk::TooLong, &mut writer)? {
                    break;
                }
                pending.clear();
                loop {
                    if read_more(input, &mut pending, limits.chunk_bytes)? == 0 {
                        pending.clear();
                        break;
                    }
                    if let Some(end) = pending.iter().position(|&b| b == b'\n') {
                        pending.drain(..=end);
                        break;
                    }
                    pending.clear();
                }
            }
        }
        drop(work_tx);
        while writer.written < sent {
            let Ok(done) = done_rx.recv() else { break };
            writer.accept(done)?;
        }
        writer.out.flush()?;
        Ok(writer.any_marker)
    })
}

/// Writes the workers' answers in input order, whatever order they finish in.
struct Ordered<'a, W: Write> {
    out: &'a mut W,
    pending: std::collections::BTreeMap<usize, (Vec<u8>, bool)>,
    written: usize,
    any_marker: bool,
    outputs: &'a Pool,
}

impl<W: Write> Ordered<'_, W> {
    fn accept(&mut self, (n, bytes, any): (usize, Vec<u8>, bool)) -> io::Result<()> {
        self.pending.insert(n, (bytes, any));
        while let Some((bytes, any)) = self.pending.remove(&self.written) {
            self.out.write_all(&bytes)?;
            self.outputs.give(bytes);
            self.any_marker |= any;
            self.written += 1;
        }
        Ok(())
    }
}

/// The text of a `--json-lines` line in its two plain shapes, `"…"` and `{"text":"…"}` (no
/// spaces, no other field), decoded without building a JSON value: `None` for any other shape,
/// which the general path reads (and a lone surrogate, which it reads as `JSON.parse` does).
fn fast_json_text<'a>(line: &'a str, scratch: &'a mut String) -> Option<&'a str> {
    let body = line
        .strip_prefix("{\"text\":\"")
        .and_then(|r| r.strip_suffix("\"}"))
        .or_else(|| line.strip_prefix('"').and_then(|r| r.strip_suffix('"')))?;
    let bytes = body.as_bytes();
    if next_special(bytes, 0).is_none() {
        return Some(body);
    }
    scratch.clear();
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'"' => return None,
            b if b < 0x20 => return None,
            b'\\' => {
                let unit = |at: usize| -> Option<u16> {
                    let digit = |b: u8| -> Option<u16> {
                        match b {
                            b'0'..=b'9' => Some(u16::from(b - b'0')),
                            b'a'..=b'f' => Some(u16::from(b - b'a' + 10)),
                            b'A'..=b'F' => Some(u16::from(b - b'A' + 10)),
                            _ => None,
                        }
                    };
                    bytes
                        .get(at..at + 4)?
                        .iter()
                        .try_fold(0u16, |acc, &b| Some(acc << 4 | digit(b)?))
                };
                match *bytes.get(i + 1)? {
                    b'"' => scratch.push('"'),
                    b'\\' => scratch.push('\\'),
                    b'/' => scratch.push('/'),
                    b'b' => scratch.push('\u{8}'),
                    b'f' => scratch.push('\u{c}'),
                    b'n' => scratch.push('\n'),
                    b'r' => scratch.push('\r'),
                    b't' => scratch.push('\t'),
                    b'u' => {
                        let u = unit(i + 2)?;
                        if (0xD800..0xDC00).contains(&u) {
                            if bytes.get(i + 6..i + 8) != Some(b"\\u") {
                                return None;
                            }
                            let lo = unit(i + 8)?;
                            let c = char::decode_utf16([u, lo]).next()?.ok()?;
                            scratch.push(c);
                            i += 12;
                            continue;
                        }
                        scratch.push(char::from_u32(u32::from(u))?);
                        i += 6;
                        continue;
                    }
                    _ => return None,
                }
                i += 2;
            }
            _ => {
                // Copy the run up to the next escape or quote at once.
                let run = next_special(bytes, i).unwrap_or(bytes.len());
                scratch.push_str(body.get(i..run)?);
                i = run;
            }
        }
    }
    Some(scratch.as_str())
}

/// The first byte at or after `from` that a JSON string cannot hold as itself: `\\`, `"` or
/// a control character. Eight bytes a step: in a word `w`, `(w - 0x01…01·n) & !w & 0x80…80`
/// marks the bytes below `n` exactly up to the first one (a borrow only runs upward, into
/// higher bytes), and the little-endian lowest mark is the first such byte.
fn next_special(bytes: &[u8], from: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below = |w: u64, n: u64| w.wrapping_sub(ONES * n) & !w & HIGH;
    let special = |b: u8| b == b'\\' || b == b'"' || b < 0x20;
    let mut i = from;
    while let Some(word) = bytes.get(i..i + 8) {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        let w = u64::from_le_bytes(w);
        let hit = below(w, 0x20) | below(w ^ (ONES * 0x22), 1) | below(w ^ (ONES * 0x5C), 1);
        if hit != 0 {
            return Some(i + (hit.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    bytes
        .get(i..)?
        .iter()
        .position(|&b| special(b))
        .map(|n| i + n)
}

/// The longest input line read: a fact is at most 4,000 UTF-16 units, so even JSON-escaped
/// with every character as `\uXXXX` it stays far below this.
const MAX_LINE_BYTES: usize = 1 << 20;

fn strip_newline(buf: &[u8]) -> &[u8] {
    let buf = buf.strip_suffix(b"\n").unwrap_or(buf);
    buf.strip_suffix(b"\r").unwrap_or(buf)
}

fn error_line(reason: &str) -> String {
    serde_json::json!({ "error": reason }).to_string()
}

/// An object line as the fast path reads it: `text` borrowed when it has no escapes, every
/// other field skipped without being built.
#[derive(serde::Deserialize)]
struct TextObject<'a> {
    #[serde(borrow)]
    text: std::borrow::Cow<'a, str>,
}

/// One `--json-lines` input: a JSON string, or an object with a string `text`.
fn parse_json_line(line: &str) -> Result<std::borrow::Cow<'_, str>, String> {
    let fast = match line.trim_start().as_bytes().first() {
        Some(b'"') => serde_json::from_str::<std::borrow::Cow<'_, str>>(line).ok(),
        Some(b'{') => serde_json::from_str::<TextObject<'_>>(line)
            .ok()
            .map(|o| o.text),
        _ => None,
    };
    match fast {
        Some(text) => Ok(text),
        None => parse_json_value(line).map(std::borrow::Cow::Owned),
    }
}

/// The slow path, for a line the fast path refused: the reason, or the text after all (the
/// two agree on every line both read).
fn parse_json_value(line: &str) -> Result<String, String> {
    // JSON.parse's reading: a lone surrogate escape (a string cut inside a pair) is read, as
    // the reference gate reads it.
    let value = lessons::internals::json::parse(line).ok_or_else(|| {
        serde_json::from_str::<serde_json::Value>(line)
            .err()
            .map_or_else(
                || "line is not valid JSON".to_owned(),
                |e| format!("line is not valid JSON: {e}"),
            )
    })?;
    match value {
        serde_json::Value::String(text) => Ok(text),
        serde_json::Value::Object(mut map) => match map.remove("text") {
            Some(serde_json::Value::String(text)) => Ok(text),
            Some(_) => Err("\"text\" must be a string".to_owned()),
            None => Err("object has no \"text\" field".to_owned()),
        },
        _ => Err("line must be a JSON string or an object with a \"text\" string".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::{json_lines, parse_json_line, Limits};

    #[test]
    fn the_word_at_a_time_scan_finds_the_first_special_byte() {
        let naive = |bytes: &[u8], from: usize| {
            (from..bytes.len()).find(|&i| matches!(bytes[i], b'\\' | b'"' | 0..=0x1F))
        };
        let alphabet = [
            b'a', b'"', b'\\', 0x00, 0x1F, 0x20, 0x21, 0x5B, 0x5D, 0x7F, 0x80, 0xA2, 0xDC, 0xFF,
        ];
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = (state % 40) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|i| {
                    let pick = ((state >> (i % 60)) as usize) ^ (i * 31);
                    // Mostly plain bytes, so runs without a hit cross whole words.
                    if pick.is_multiple_of(5) {
                        alphabet[pick / 5 % alphabet.len()]
                    } else {
                        b'a'
                    }
                })
                .collect();
            let from = (state >> 32) as usize % (len + 1);
            assert_eq!(
                super::next_special(&bytes, from),
                naive(&bytes, from),
                "{bytes:?} from {from}"
            );
        }
    }

    /// Hands out its bytes a few at a time, as a pipe may.
    struct Trickle<'a>(&'a [u8], usize);

    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.1 = self.1 % 7 + 1;
            let n = self.1.min(buf.len()).min(self.0.len());
            let (head, rest) = self.0.split_at(n);
            buf[..n].copy_from_slice(head);
            self.0 = rest;
            Ok(n)
        }
    }

    /// The chunked, parallel reading answers every line as reading the lines one by one
    /// would, across every chunk boundary, overlong and broken lines included.
    #[test]
    fn json_lines_answers_line_by_line_across_chunk_boundaries() {
        let limits = Limits {
            chunk_bytes: 16,
            max_line_bytes: 40,
        };
        let pieces: [&[u8]; 9] = [
            b"\"PR 1 is merged\"",
            b"{\"text\":\"run npm ci first\"}",
            b"",
            b"\"cr ends here\"\r",
            b"\"a line that is longer than forty bytes, by far\"",
            b"\"\xff not utf-8\"",
            b"\"3f9a2c1\"",
            b"[]",
            b"\"exactly forty bytes of json, all green\"",
        ];
        for seed in 0..200usize {
            let lines: Vec<&[u8]> = (0..seed % 23)
                .map(|i| pieces[(seed * 7 + i * 5) % pieces.len()])
                .collect();
            let mut input = lines.join(&b'\n');
            if seed % 3 != 0 {
                input.push(b'\n');
            }
            let mut expected = Vec::new();
            let mut scratch = String::new();
            let mut expected_any = false;
            if !input.is_empty() {
                let body = input.strip_suffix(b"\n").unwrap_or(&input);
                for line in body.split(|&b| b == b'\n') {
                    expected_any |= super::answer_line(&mut expected, line, limits, &mut scratch);
                }
            }
            let mut out = Vec::new();
            let any = json_lines(&mut Trickle(&input, seed), &mut out, limits).expect("answers");
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&expected),
                "seed {seed}"
            );
            assert_eq!(any, expected_any);
        }
        let mut out = Vec::new();
        let long = [b"\"".to_vec(), b"x".repeat(100), b"\"\n\"LGTM\"".to_vec()].concat();
        json_lines(&mut Trickle(&long, 0), &mut out, limits).expect("answers");
        assert_eq!(
            String::from_utf8_lossy(&out),
            "{\"error\":\"line is longer than 40 bytes\"}\n{\"markers\":[\"delivery\"]}\n"
        );
    }

    #[test]
    fn json_lines_accepts_strings_and_text_objects() {
        assert_eq!(parse_json_line(r#""PR 1""#).as_deref(), Ok("PR 1"));
        assert_eq!(
            parse_json_line(r#"{"text":"x","other":1}"#).as_deref(),
            Ok("x")
        );
        assert!(parse_json_line(r#"{"text":1}"#)
            .unwrap_err()
            .contains("must be a string"));
        assert!(parse_json_line("[1]").unwrap_err().contains("JSON string"));
        assert!(parse_json_line("nope")
            .unwrap_err()
            .contains("not valid JSON"));
        // Where the typed fast path refuses a line the value path decides: a repeated `text`
        // keeps the last (as `JSON.parse` does), a missing or null one is named.
        assert_eq!(
            parse_json_line(r#"{"text":"a","text":"b"}"#).as_deref(),
            Ok("b")
        );
        assert!(parse_json_line(r#"{"txt":"a"}"#)
            .unwrap_err()
            .contains("no \"text\""));
        assert!(parse_json_line(r#"{"text":null}"#)
            .unwrap_err()
            .contains("must be a string"));
        assert_eq!(
            parse_json_line(r#" "a\u00e9\n" "#).as_deref(),
            Ok("a\u{e9}\n")
        );
    }

    #[test]
    fn the_fast_reading_agrees_with_the_general_one_or_declines() {
        let lines = [
            r#""plain text""#,
            r#"{"text":"plain text"}"#,
            r#"{"text":"esc \" \\ \/ \b\f\n\r\t \u00e9 \ud83d\ude00 \u2028"}"#,
            r#""\u0020spaced\u0020""#,
            r#"{"text":"a","text":"b"}"#,
            r#"{"text":"cut \ud83d"}"#,
            r#"{"text":"raw"tab"}"#,
            "\"ctl\u{1}\"",
            r#"{"text": "spaced"}"#,
            r#""bad \x escape""#,
            r#""\u12""#,
        ];
        for line in lines {
            let mut scratch = String::new();
            if let Some(fast) = super::fast_json_text(line, &mut scratch) {
                assert_eq!(parse_json_line(line).as_deref(), Ok(fast), "{line}");
            }
        }
        let mut scratch = String::new();
        assert!(super::fast_json_text(r#"{"text":"a","text":"b"}"#, &mut scratch).is_none());
        assert!(super::fast_json_text(r#"{"text":"cut \ud83d"}"#, &mut scratch).is_none());
    }
}
