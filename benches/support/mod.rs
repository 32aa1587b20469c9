//! Shared bench data and the SQLite + FTS5 baseline.
//!
//! The baseline mirrors the reference memory Worker: one SQLite database per scope (a Durable
//! Object each), a records table with `(status, seq)` and `(status, norm)` indexes, and an FTS5
//! table over the active rows' text and keywords, queried the way the Worker queries them.

#![allow(dead_code)]

pub mod floor;
pub mod phases;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lessons::internals::fts::{match_terms, pool_size};
use lessons::internals::rank::rank;
use lessons::internals::text::{normalize, tokenize};
use lessons::model::{Kind, Record, ScopeKey, Status};
use rusqlite::{params, params_from_iter, Connection, OptionalExtension};

/// The sample at quantile `p` of `sorted`.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// p50, p99 of `samples`.
pub fn p50_p99(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

/// A fixed-seed xorshift generator: the same data every run.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const VOCABULARY: &str = "license check fails resident tree nested node_modules dropped clean npm ci \
commit passes allowlist never fix registry drift lockfile pnpm install frozen workspace links stale \
vitest jsdom environment component tests playwright browsers path cache volume read only runner \
image docker compose healthcheck interval service migration seed audit table exists opaque error \
formatter linter trailing commas pre commit hook cargo clippy warnings deny feature flag sqlite \
bundled build script rustflags target directory incremental compile time two cores memory budget \
swap staged rebuild terraform state lock bucket region credentials profile shell environment envrc \
direnv deploy script rollout canary health probe timeout retry backoff flaky network sandbox proxy \
registry mirror offline vendored dependency upgrade major version breaking change changelog release \
tag semver publish token scope permission secret rotation webhook signature verify payload schema \
validation json yaml config loader default override precedence typescript strict null checks esm \
commonjs interop bundler vite rollup plugin alias import path monorepo turbo pipeline artifact \
upload download checksum mismatch corrupted archive gzip tar extraction permissions executable bit \
git submodule shallow clone fetch depth history bisect rebase conflict merge queue required status \
branch protection codeowners review approval bot comment slack channel thread user preference";

pub fn vocabulary() -> Vec<&'static str> {
    VOCABULARY.split_whitespace().collect()
}

/// A realistic fact of about `len` characters.
pub fn text(rng: &mut Rng, words: &[&str], len: usize) -> String {
    let mut out = String::with_capacity(len + 16);
    while out.len() < len {
        if !out.is_empty() {
            out.push(if rng.below(9) == 0 { ';' } else { ' ' });
            if out.ends_with(';') {
                out.push(' ');
            }
        }
        out.push_str(words[rng.below(words.len())]);
    }
    out
}

/// A brief of `n` tokens.
pub fn brief(rng: &mut Rng, words: &[&str], n: usize) -> String {
    (0..n)
        .map(|_| words[rng.below(words.len())])
        .collect::<Vec<_>>()
        .join(" ")
}

pub const NOW: i64 = 1_795_996_800_000;

/// `active` active records (80% facts) and `retired` retired ones for `scope`, seq order.
pub fn records(rng: &mut Rng, scope: &ScopeKey, active: usize, retired: usize) -> Vec<Record> {
    let words = vocabulary();
    let total = active + retired;
    (0..total)
        .map(|seq| {
            let len = 300 + rng.below(40);
            let t = text(rng, &words, len);
            let kind = if rng.below(5) == 0 {
                Kind::Summary
            } else {
                Kind::Fact
            };
            // Retired rows are the oldest: spread them among the first sequence numbers.
            let status = if seq < retired {
                [
                    Status::Superseded,
                    Status::Forgotten,
                    Status::Evicted,
                    Status::Swept,
                ][seq % 4]
            } else {
                Status::Active
            };
            let created = NOW - ((total - seq) as i64) * 60_000;
            Record {
                id: scope.record_id(seq as u64),
                scope_key: scope.clone(),
                kind,
                // As an extractor writes them: a handful of lowercased keywords.
                keywords: (0..6)
                    .map(|_| words[rng.below(words.len())].to_owned())
                    .collect(),
                text: t,
                source_thread_key: format!("slack:C1:{seq}"),
                source_run_id: None,
                provenance: None,
                created_at: created,
                last_used_at: None,
                use_count: 0,
                confidence: Some(0.8),
                supersedes: None,
                status,
                dedup_key: true,
            }
        })
        .collect()
}

/// One scope's SQLite database, as the Worker's Durable Object holds it.
pub struct SqliteScope {
    pub conn: Connection,
    pub scope: ScopeKey,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS records (
  rowid INTEGER PRIMARY KEY,
  id TEXT NOT NULL UNIQUE,
  seq INTEGER NOT NULL,
  kind TEXT NOT NULL,
  text TEXT NOT NULL,
  norm TEXT NOT NULL,
  keywords TEXT NOT NULL,
  source_thread_key TEXT NOT NULL,
  source_run_id TEXT,
  provenance TEXT,
  created_at INTEGER NOT NULL,
  last_used_at INTEGER,
  use_count INTEGER NOT NULL DEFAULT 0,
  confidence REAL,
  supersedes TEXT,
  status TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_status_seq ON records(status, seq);
CREATE INDEX IF NOT EXISTS records_status_norm ON records(status, norm);
CREATE VIRTUAL TABLE IF NOT EXISTS records_fts USING fts5(text, keywords, tokenize = 'unicode61');
";

const COLUMNS: &str = "id, seq, kind, text, keywords, source_thread_key, source_run_id, created_at, last_used_at, use_count, confidence, supersedes, status";

fn status_name(s: Status) -> &'static str {
    s.as_str()
}

fn row_to_record(scope: &ScopeKey, row: &rusqlite::Row<'_>) -> rusqlite::Result<Record> {
    let kind: String = row.get(2)?;
    let keywords: String = row.get(4)?;
    let status: String = row.get(12)?;
    Ok(Record {
        id: row.get(0)?,
        scope_key: scope.clone(),
        kind: Kind::parse(&kind).unwrap_or(Kind::Fact),
        text: row.get(3)?,
        keywords: keywords
            .split(' ')
            .filter(|k| !k.is_empty())
            .map(str::to_owned)
            .collect(),
        source_thread_key: row.get(5)?,
        source_run_id: row.get(6)?,
        provenance: None,
        created_at: row.get(7)?,
        last_used_at: row.get(8)?,
        use_count: row.get::<_, i64>(9)? as u64,
        confidence: row.get(10)?,
        supersedes: row.get(11)?,
        status: match status.as_str() {
            "active" => Status::Active,
            "superseded" => Status::Superseded,
            "forgotten" => Status::Forgotten,
            "evicted" => Status::Evicted,
            _ => Status::Swept,
        },
        dedup_key: true,
    })
}

impl SqliteScope {
    /// Opens (or creates) the scope's database; `full_sync` is `synchronous=FULL` (fsync per
    /// commit), else `NORMAL`.
    pub fn open(path: &Path, scope: ScopeKey, full_sync: bool) -> SqliteScope {
        let conn = Connection::open(path).expect("sqlite opens");
        conn.pragma_update(None, "journal_mode", "WAL")
            .expect("wal");
        conn.pragma_update(
            None,
            "synchronous",
            if full_sync { "FULL" } else { "NORMAL" },
        )
        .expect("sync");
        conn.execute_batch(SCHEMA).expect("schema");
        SqliteScope { conn, scope }
    }

    pub fn load(&mut self, records: &[Record]) {
        let tx = self.conn.transaction().expect("tx");
        for r in records {
            insert_row(&tx, r);
        }
        tx.commit().expect("commit");
    }

    /// Folds the write-ahead log into the database file, so its size on disk is the data's.
    pub fn checkpoint(&self) {
        self.conn
            .pragma_update(None, "wal_checkpoint", "TRUNCATE")
            .expect("checkpoint");
    }

    /// The window read: the newest `limit` active facts, decoded.
    pub fn window(&self, limit: usize) -> Vec<Record> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!("SELECT {COLUMNS} FROM records WHERE status = 'active' AND kind = 'fact' ORDER BY seq DESC LIMIT ?1"))
            .expect("prepare");
        stmt.query_map([limit as i64], |row| row_to_record(&self.scope, row))
            .expect("query")
            .map(|r| r.expect("row"))
            .collect()
    }

    /// The Worker's retrieve: FTS5 over the longest tokens, re-rank, bump the returned rows.
    pub fn retrieve(&mut self, query: &str, limit: usize, now: i64) -> Vec<Record> {
        let tokens = tokenize(query);
        if tokens.is_empty() {
            return Vec::new();
        }
        let wanted = match_terms(query);
        let expr = wanted
            .iter()
            .map(|t| format!("\"{t}\""))
            .collect::<Vec<_>>()
            .join(" OR ");
        let candidates: Vec<Record> = {
            let mut stmt = self
                .conn
                .prepare_cached(&format!(
                    "SELECT {} FROM records_fts JOIN records r ON r.rowid = records_fts.rowid \
                     WHERE records_fts MATCH ?1 AND r.status = 'active' ORDER BY bm25(records_fts) LIMIT ?2",
                    COLUMNS.split(", ").map(|c| format!("r.{c}")).collect::<Vec<_>>().join(", ")
                ))
                .expect("prepare");
            stmt.query_map(params![expr, pool_size(limit) as i64], |row| {
                row_to_record(&self.scope, row)
            })
            .expect("query")
            .map(|r| r.expect("row"))
            .collect()
        };
        let mut ranked = rank(&tokens, candidates, now, limit);
        let tx = self.conn.transaction().expect("tx");
        {
            let mut bump = tx
                .prepare_cached(
                    "UPDATE records SET use_count = use_count + 1, last_used_at = ?1 WHERE id = ?2",
                )
                .expect("prepare");
            for r in &mut ranked {
                bump.execute(params![now, r.id]).expect("bump");
                r.use_count += 1;
                r.last_used_at = Some(now);
            }
        }
        tx.commit().expect("commit");
        ranked
    }

    /// The Worker's write of one reflection: per candidate restate / dedup / insert, then evict
    /// over the cap, in one transaction.
    pub fn write(&mut self, candidates: &[(String, Option<String>)], now: i64, cap: usize) {
        let scope = self.scope.clone();
        let tx = self.conn.transaction().expect("tx");
        for (text, restates) in candidates {
            if let Some(target) = restates {
                let n = tx
                    .execute(
                        "UPDATE records SET use_count = use_count + 1, last_used_at = ?1 WHERE id = ?2 AND status = 'active'",
                        params![now, target],
                    )
                    .expect("restate");
                if n > 0 {
                    continue;
                }
            }
            let norm = normalize(text);
            let hit: Option<i64> = tx
                .query_row(
                    "SELECT rowid FROM records WHERE status = 'active' AND norm = ?1 LIMIT 1",
                    [&norm],
                    |r| r.get(0),
                )
                .optional()
                .expect("dedup");
            if let Some(rowid) = hit {
                tx.execute(
                    "UPDATE records SET use_count = use_count + 1 WHERE rowid = ?1",
                    [rowid],
                )
                .expect("bump");
                continue;
            }
            let seq: i64 = tx
                .query_row("SELECT COALESCE(MAX(seq) + 1, 0) FROM records", [], |r| {
                    r.get(0)
                })
                .expect("seq");
            let r = Record {
                id: scope.record_id(seq as u64),
                scope_key: scope.clone(),
                kind: Kind::Fact,
                keywords: tokenize(text).into(),
                text: text.clone(),
                source_thread_key: "bench".into(),
                source_run_id: None,
                provenance: None,
                created_at: now,
                last_used_at: None,
                use_count: 0,
                confidence: Some(0.8),
                supersedes: None,
                status: Status::Active,
                dedup_key: true,
            };
            insert_row(&tx, &r);
        }
        let active: i64 = tx
            .query_row(
                "SELECT COUNT(*) FROM records WHERE status = 'active'",
                [],
                |r| r.get(0),
            )
            .expect("count");
        if active as usize > cap {
            let victims: Vec<i64> = {
                let mut stmt = tx
                    .prepare_cached(
                        "SELECT rowid FROM records WHERE status = 'active' \
                         ORDER BY COALESCE(last_used_at, created_at), created_at, seq LIMIT ?1",
                    )
                    .expect("prepare");
                stmt.query_map([active - cap as i64], |r| r.get(0))
                    .expect("query")
                    .map(|r| r.expect("row"))
                    .collect()
            };
            for rowid in victims {
                tx.execute(
                    "UPDATE records SET status = 'evicted' WHERE rowid = ?1",
                    [rowid],
                )
                .expect("evict");
                tx.execute("DELETE FROM records_fts WHERE rowid = ?1", [rowid])
                    .expect("unindex");
            }
        }
        tx.commit().expect("commit");
    }
}

fn insert_row(tx: &rusqlite::Transaction<'_>, r: &Record) {
    let seq = r.seq().unwrap_or(0) as i64;
    tx.execute(
        "INSERT INTO records (rowid, id, seq, kind, text, norm, keywords, source_thread_key, source_run_id, created_at, last_used_at, use_count, confidence, supersedes, status) \
         VALUES (NULL, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
        params_from_iter([
            rusqlite::types::Value::from(r.id.clone()),
            seq.into(),
            r.kind.as_str().to_owned().into(),
            r.text.clone().into(),
            normalize(&r.text).into(),
            r.keywords.join(" ").into(),
            r.source_thread_key.clone().into(),
            r.source_run_id.clone().map_or(rusqlite::types::Value::Null, Into::into),
            r.created_at.into(),
            r.last_used_at.map_or(rusqlite::types::Value::Null, Into::into),
            (r.use_count as i64).into(),
            r.confidence.map_or(rusqlite::types::Value::Null, Into::into),
            r.supersedes.clone().map_or(rusqlite::types::Value::Null, Into::into),
            status_name(r.status).to_owned().into(),
        ]),
    )
    .expect("insert");
    if r.status == Status::Active {
        let rowid = tx.last_insert_rowid();
        tx.execute(
            "INSERT INTO records_fts (rowid, text, keywords) VALUES (?1, ?2, ?3)",
            params![rowid, r.text, r.keywords.join(" ")],
        )
        .expect("index");
    }
}

/// The CPU time the hypervisor stole, as a share of all CPU time, between two readings.
pub struct Steal(u64, u64);

impl Steal {
    pub fn now() -> Steal {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let cpu: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        Steal(cpu.get(7).copied().unwrap_or(0), cpu.iter().sum())
    }

    pub fn since(&self) -> String {
        let now = Steal::now();
        let total = now.1.saturating_sub(self.1);
        if total == 0 {
            return "n/a".into();
        }
        format!(
            "{:.1}%",
            100.0 * now.0.saturating_sub(self.0) as f64 / total as f64
        )
    }
}

/// The CPU time this process spent (user and system, every thread: the writers and the
/// engine's own), from `/proc/self/stat`, between two readings. Beside a closed loop's rate it
/// says what each operation costs on the CPU, whatever the disk did meanwhile. Background work
/// an earlier phase left running (a compaction) counts in the phase it runs in.
pub struct ProcessCpu(Duration);

impl ProcessCpu {
    pub fn now() -> ProcessCpu {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // The fields after the command's name, which is in parentheses and may hold spaces:
        // utime and stime are the 14th and 15th fields, the 12th and 13th after the name.
        let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let ticks: u64 = rest
            .split_whitespace()
            .skip(11)
            .take(2)
            .filter_map(|v| v.parse::<u64>().ok())
            .sum();
        // Linux reports these in USER_HZ, 100 a second on every architecture it runs on.
        ProcessCpu(Duration::from_millis(ticks * 10))
    }

    pub fn since(&self) -> Duration {
        ProcessCpu::now().0.saturating_sub(self.0)
    }
}

/// An open loop's arrivals: due times on a Poisson schedule, claimed in order by its workers.
/// A request's latency counts from when it was due, not from when a worker got to it, so a
/// queue (every worker busy, or a worker slow to wake) shows in the figures (what wrk2 and
/// YCSB's target mode do; a closed loop hides it by waiting before it sends).
pub struct Arrivals {
    start: Instant,
    due: Vec<Duration>,
    next: AtomicUsize,
}

impl Arrivals {
    /// `rate` arrivals a second for `span`, from now: exponential gaps, seeded by `seed`.
    pub fn poisson(rate: f64, span: Duration, seed: u64) -> Arrivals {
        let mut rng = Rng(seed | 1);
        let mut due = Vec::with_capacity((rate * span.as_secs_f64() * 1.1) as usize + 16);
        let mut at = 0.0;
        loop {
            // Uniform in (0, 1]: 53 random bits, never 0, so the logarithm is finite.
            let u = ((rng.next() >> 11) + 1) as f64 / (1u64 << 53) as f64;
            at += -u.ln() / rate;
            if at >= span.as_secs_f64() {
                break;
            }
            due.push(Duration::from_secs_f64(at));
        }
        Arrivals {
            start: Instant::now(),
            due,
            next: AtomicUsize::new(0),
        }
    }

    /// Claims the next arrival and sleeps until it is due (not at all if it is late): its due
    /// instant, or `None` once every arrival is claimed.
    pub fn next(&self) -> Option<Instant> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let due = self.start + *self.due.get(i)?;
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        Some(due)
    }

    /// How many arrivals there are.
    pub fn len(&self) -> usize {
        self.due.len()
    }

    /// When the schedule started.
    pub fn start(&self) -> Instant {
        self.start
    }
}

/// Latencies' p50, p99 and p99.9.
#[derive(Clone, Copy, Debug)]
pub struct Tail {
    pub p50: Duration,
    pub p99: Duration,
    pub p999: Duration,
}

impl Tail {
    pub fn of(mut samples: Vec<Duration>) -> Tail {
        samples.sort();
        let at = |p: f64| {
            samples
                .get(((samples.len().max(1) - 1) as f64 * p).round() as usize)
                .copied()
                .unwrap_or_default()
        };
        Tail {
            p50: at(0.5),
            p99: at(0.99),
            p999: at(0.999),
        }
    }

    /// p99 ÷ p50.
    pub fn spread(&self) -> f64 {
        self.p99.as_secs_f64() / self.p50.as_secs_f64().max(1e-9)
    }

    /// "p50 / p99 / p99.9 ms (p99 ÷ p50)".
    pub fn row(&self) -> String {
        format!(
            "{:.2} / {:.2} / {:.2} ms ({:.1}×)",
            self.p50.as_secs_f64() * 1e3,
            self.p99.as_secs_f64() * 1e3,
            self.p999.as_secs_f64() * 1e3,
            self.spread()
        )
    }
}

/// The bytes this process's threads handed to the disk (`/proc/self/task/*/io`'s
/// `write_bytes`: counted when a page is dirtied, or written for a direct write), by thread
/// name. What has exited is in the process's own count (`/proc/self/io`), kept as "(exited)".
pub struct DiskWrites(std::collections::BTreeMap<String, u64>);

impl DiskWrites {
    fn write_bytes(io: &str) -> u64 {
        io.lines()
            .find_map(|l| l.strip_prefix("write_bytes:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    pub fn now() -> DiskWrites {
        let mut by = std::collections::BTreeMap::new();
        let mut live = 0;
        for task in std::fs::read_dir("/proc/self/task")
            .into_iter()
            .flatten()
            .flatten()
        {
            let p = task.path();
            let name = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
            // Numbered threads of one kind ("merge_thread_2") count as one.
            let name = name.trim().trim_end_matches(|c: char| c.is_ascii_digit());
            let bytes =
                Self::write_bytes(&std::fs::read_to_string(p.join("io")).unwrap_or_default());
            live += bytes;
            *by.entry(name.to_owned()).or_insert(0) += bytes;
        }
        let all = Self::write_bytes(&std::fs::read_to_string("/proc/self/io").unwrap_or_default());
        by.insert("(exited)".into(), all.saturating_sub(live));
        DiskWrites(by)
    }

    /// What each kind of thread wrote since `self`, largest first, in MB.
    pub fn since(&self) -> String {
        let now = DiskWrites::now();
        let mut rows: Vec<(u64, &String)> = now
            .0
            .iter()
            .map(|(k, v)| (v.saturating_sub(self.0.get(k).copied().unwrap_or(0)), k))
            .filter(|(v, _)| *v >= 1 << 20)
            .collect();
        rows.sort_by_key(|r| std::cmp::Reverse(r.0));
        rows.iter()
            .map(|(v, k)| format!("{k} {:.0} MB", *v as f64 / 1e6))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
