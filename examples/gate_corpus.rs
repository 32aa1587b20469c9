//! Writes one of the gate's corpora as `--json-lines` input, one `{"text": …}` per line:
//! - `mixed` (the default): 80–350 characters, lessons and status mixed (24% carry a marker),
//!   half with non-ASCII words;
//! - `status`: 80–350 characters, status-heavy (71% carry a marker, each of the nine on more
//!   than a tenth of the lines), dotted I, Kelvin sign, NBSP, U+FEFF, U+2028 and em dashes
//!   throughout, half the lines written with `\u` escapes.
//!
//! The whole-process measurement in `docs/performance.md` runs `lessons gate --json-lines` over each.
//!
//! `cargo run --release --example gate_corpus -- [mixed|status] [COUNT] [SEED] > facts.jsonl`

// A harness: a panic is its failure report (see Cargo.toml's lint policy).
#![allow(clippy::expect_used, clippy::indexing_slicing, clippy::unwrap_used)]
use std::io::{BufWriter, Write};

#[path = "../benches/support/gate_corpus.rs"]
mod gate_corpus;
#[path = "../benches/support/status_corpus.rs"]
mod status_corpus;

fn main() -> std::io::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let kind = match args.first().map(String::as_str) {
        Some("mixed" | "status") => args.remove(0),
        _ => "mixed".to_owned(),
    };
    let count = args.first().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let seed = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(0x9a7e);
    let out = std::io::stdout();
    let mut out = BufWriter::new(out.lock());
    if kind == "status" {
        for (i, text) in status_corpus::corpus(seed, count).iter().enumerate() {
            writeln!(out, "{}", status_corpus::json_line(text, i % 2 == 1))?;
        }
    } else {
        for text in gate_corpus::corpus(seed, count) {
            let line = serde_json::json!({ "text": text });
            writeln!(out, "{line}")?;
        }
    }
    out.flush()
}
