//! `lessons gate`: the markers of each fact, from arguments or stdin.

use std::io::{self, BufRead, BufWriter, Read, Write};

use clap::Args;
use lessons::gate::rejection_marker_names;

use super::{emit, Cli, Failure, Outcome};

/// Arguments of `lessons gate`.
#[derive(Debug, Args)]
pub struct GateArgs {
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

pub fn run(cli: &Cli, args: &GateArgs) -> Result<Outcome, Failure> {
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut any_marker = false;
    let mut verdict = |out: &mut BufWriter<_>, text: &str, json: bool| -> Result<(), Failure> {
        let markers = rejection_marker_names(text);
        any_marker |= !markers.is_empty();
        if json {
            // `{"markers":[…]}` as serde_json prints it; marker names need no escaping.
            out.write_all(b"{\"markers\":[")?;
            for (i, name) in markers.iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                out.write_all(b"\"")?;
                out.write_all(name.as_bytes())?;
                out.write_all(b"\"")?;
            }
            out.write_all(b"]}\n")?;
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
            verdict(&mut out, text, cli.json)?;
        }
    } else {
        let stdin = io::stdin();
        let mut input = stdin.lock();
        let mut buf = Vec::new();
        let mut number = 0usize;
        loop {
            buf.clear();
            // Read at most one line's worth: a line longer than any fact can be is answered
            // with an error and skipped without ever being held whole.
            if (&mut input)
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut buf)?
                == 0
            {
                break;
            }
            number += 1;
            if buf.len() > MAX_LINE_BYTES && !buf.ends_with(b"\n") {
                skip_line(&mut input)?;
                let reason = format!("line is longer than {MAX_LINE_BYTES} bytes");
                if args.json_lines {
                    emit(&mut out, &error_line(&reason))?;
                    continue;
                }
                return Err(Failure::Usage(format!("stdin line {number}: {reason}")));
            }
            let raw = strip_newline(&buf);
            let line = match std::str::from_utf8(raw) {
                Ok(line) => line,
                Err(_) if args.json_lines => {
                    emit(&mut out, &error_line("line is not valid UTF-8"))?;
                    continue;
                }
                Err(_) => {
                    return Err(Failure::Usage(format!(
                        "stdin line {number} is not valid UTF-8"
                    )));
                }
            };
            if args.json_lines {
                match parse_json_line(line) {
                    Ok(text) => verdict(&mut out, &text, true)?,
                    Err(reason) => emit(&mut out, &error_line(&reason))?,
                }
            } else {
                verdict(&mut out, line, cli.json)?;
            }
        }
    }
    out.flush()?;
    Ok(if args.check && any_marker {
        Outcome::Found
    } else {
        Outcome::Ok
    })
}

/// The longest input line read: a fact is at most 4,000 UTF-16 units, so even JSON-escaped
/// with every character as `\uXXXX` it stays far below this.
const MAX_LINE_BYTES: usize = 1 << 20;

/// Discards input up to and including the next newline, a buffer at a time.
fn skip_line(input: &mut impl BufRead) -> io::Result<()> {
    loop {
        let chunk = input.fill_buf()?;
        if chunk.is_empty() {
            return Ok(());
        }
        if let Some(i) = chunk.iter().position(|&b| b == b'\n') {
            input.consume(i + 1);
            return Ok(());
        }
        let n = chunk.len();
        input.consume(n);
    }
}

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
    let value = lessons::json::parse(line).ok_or_else(|| {
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
    use super::parse_json_line;

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
}
