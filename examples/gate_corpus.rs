//! Writes the gate's realistic mixed corpus as `--json-lines` input: one `{"text": …}` per line,
//! 80–350 characters, lessons and status mixed, half with non-ASCII words. The whole-process
//! measurement in the README runs `lessons gate --json-lines` over it.
//!
//! `cargo run --release --example gate_corpus -- [COUNT] [SEED] > facts.jsonl`

use std::io::{BufWriter, Write};

#[path = "../benches/support/gate_corpus.rs"]
mod gate_corpus;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let count = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let seed = args.next().and_then(|a| a.parse().ok()).unwrap_or(0x9a7e);
    let out = std::io::stdout();
    let mut out = BufWriter::new(out.lock());
    for text in gate_corpus::corpus(seed, count) {
        let line = serde_json::json!({ "text": text });
        writeln!(out, "{line}")?;
    }
    out.flush()
}
