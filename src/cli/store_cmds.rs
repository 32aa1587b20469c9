//! The store commands: write, list, retrieve, forget, sweep (export, import, doctor and stats
//! are in `admin_cmds`).

use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use clap::Args;
use lessons::internals::time::{day_of, system_clock};
use lessons::model::RecordId;
use lessons::remote::RemoteStore;
use lessons::store::EmbeddedStoreBuilder;
use lessons::{
    Candidate, Durability, EmbeddedStore, Kind, ListQuery, MemoryStore, Record, ScopeKey,
    WriteOptions,
};
use serde::Deserialize;
use serde_json::json;

use super::{emit, Cli, Failure, Outcome};

/// Which scope a command works on: a full key, or a kind completed by its flag.
/// The four scope ids, without their prefixes: the one definition of these flags, shared by
/// the store commands ([`ScopeFlags`]) and the per-run commands (`RunFlags`).
#[derive(Debug, Args, Clone, Default)]
pub(crate) struct ScopeIds {
    /// The organization, without its prefix (acme).
    #[arg(long, value_name = "ORG")]
    pub org: Option<String>,
    /// The repository, without its prefix (acme/app).
    #[arg(long, value_name = "OWNER/NAME")]
    pub repo: Option<String>,
    /// The channel, without its prefix (slack:C0123).
    #[arg(long, value_name = "ID")]
    pub channel: Option<String>,
    /// The user, without its prefix (slack:U0123).
    #[arg(long, value_name = "ID")]
    pub user: Option<String>,
}

impl ScopeIds {
    /// The id given for `kind`, if any.
    pub fn id(&self, kind: &str) -> Option<&str> {
        match kind {
            "org" => self.org.as_deref(),
            "repo" => self.repo.as_deref(),
            "channel" => self.channel.as_deref(),
            "user" => self.user.as_deref(),
            _ => None,
        }
    }
}

#[derive(Debug, Args, Clone, Default)]
pub(crate) struct ScopeFlags {
    /// A full scope key (repo:acme/app), or a kind (org, repo, channel, user) completed by its flag.
    #[arg(long, value_name = "SCOPE")]
    pub scope: Option<String>,
    #[command(flatten)]
    pub ids: ScopeIds,
}

impl ScopeFlags {
    /// The key for `kind` from its flag, if the flag is given.
    pub fn key_for(&self, kind: &str) -> Result<Option<ScopeKey>, Failure> {
        let Some(id) = self.ids.id(kind) else {
            return Ok(None);
        };
        ScopeKey::of(kind, id)
            .map(Some)
            .map_err(|e| Failure::Usage(format!("--{e}")))
    }

    /// The one scope a command works on.
    pub fn one(&self) -> Result<ScopeKey, Failure> {
        let Some(scope) = self.scope.as_deref() else {
            return Err(Failure::Usage(
                "--scope is required: a key (repo:acme/app) or a kind with its flag (--scope repo --repo acme/app)".into(),
            ));
        };
        match scope {
            "org" | "repo" | "channel" | "user" => self
                .key_for(scope)?
                .ok_or_else(|| Failure::Usage(format!("--scope {scope} needs --{scope}"))),
            "all" => Err(Failure::Usage("--scope all is only for sweep".into())),
            key if key.contains(':') => {
                ScopeKey::parse(key).map_err(|e| Failure::Usage(format!("--scope: {e}")))
            }
            other => Err(Failure::Usage(format!(
                "--scope {other:?} is neither a scope key (kind:id) nor one of org, repo, channel, user"
            ))),
        }
    }

    /// The scopes `sweep --scope all` covers: those the flags name, else every scope in `store`.
    fn all(&self, store: &dyn MemoryStore) -> Result<Vec<ScopeKey>, Failure> {
        let mut named = Vec::new();
        for kind in ["org", "repo", "channel", "user"] {
            if let Some(k) = self.key_for(kind)? {
                named.push(k);
            }
        }
        if !named.is_empty() {
            return Ok(named);
        }
        store.scopes().map_err(fail)
    }
}

/// The configuration file (`--config FILE`, JSON). Unknown fields are errors, so a typo is caught.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Config {
    /// Default cap of active records per scope.
    pub cap: Option<usize>,
    /// `"sync"` (fsync before acknowledging; the default) or `"buffered"`.
    pub durability: Option<String>,
    /// The records' block cache in MiB (default 32).
    pub cache_mib: Option<u64>,
    /// Memory on (default) or off: off, `context` prints no block and opens no store.
    pub enabled: Option<bool>,
    /// Records in a run's block at most (default 32).
    pub limit: Option<usize>,
    /// Tokens of a run's block at most (default 3000).
    pub max_tokens: Option<usize>,
    /// Newest repository facts in every run's block (default 24; 0: search the repository).
    pub repo_window: Option<usize>,
    /// Days decision-journal entries are kept (default 90).
    pub journal_days: Option<u32>,
    /// Decision-journal entries kept per scope (default 10,000).
    pub journal_cap: Option<usize>,
    /// `lessons review`: inserted facts per repository per day above which it fires (40).
    pub review_max_inserted_per_day: Option<f64>,
    /// `lessons review`: rejected ÷ offered above which it fires (0.1).
    pub review_max_rejected_ratio: Option<f64>,
}

impl Config {
    /// The review's thresholds, with this file's overrides.
    pub fn review(&self) -> lessons::review::Thresholds {
        let d = lessons::review::Thresholds::default();
        lessons::review::Thresholds {
            max_inserted_per_day: self
                .review_max_inserted_per_day
                .unwrap_or(d.max_inserted_per_day),
            max_rejected_ratio: self
                .review_max_rejected_ratio
                .unwrap_or(d.max_rejected_ratio),
            window: self.repo_window.unwrap_or(d.window),
        }
    }
}

impl Config {
    pub fn load(path: Option<&Path>) -> Result<Config, Failure> {
        let Some(path) = path else {
            return Ok(Config::default());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| Failure::Usage(format!("reading config {}: {e}", path.display())))?;
        serde_json::from_str(&text)
            .map_err(|e| Failure::Usage(format!("config {}: {e}", path.display())))
    }
}

pub(crate) fn store_dir(cli: &Cli) -> PathBuf {
    cli.store
        .clone()
        .unwrap_or_else(|| PathBuf::from("lessons-store"))
}

pub(crate) fn fail(e: lessons::Error) -> Failure {
    Failure::Store(e)
}

/// Opens the store. `create`: a missing directory becomes a new store; otherwise it is an error,
/// so a read in the wrong directory does not leave an empty store behind.
pub(crate) fn open_store(cli: &Cli, create: bool) -> Result<EmbeddedStore, Failure> {
    let dir = store_dir(cli);
    if !create && !dir.join("records").exists() {
        return Err(Failure::Usage(format!(
            "no store at {} (pass --store DIR or set LESSONS_STORE)",
            dir.display()
        )));
    }
    let config = Config::load(cli.config.as_deref())?;
    let mut b: EmbeddedStoreBuilder = EmbeddedStore::builder().clock(system_clock());
    if config.journal_days.is_some() || config.journal_cap.is_some() {
        b = b.journal(
            config
                .journal_days
                .unwrap_or(lessons::decisions::DEFAULT_JOURNAL_DAYS),
            config
                .journal_cap
                .unwrap_or(lessons::decisions::DEFAULT_JOURNAL_CAP),
        );
    }
    if let Some(cap) = config.cap {
        b = b.cap(cap);
    }
    if let Some(mib) = config.cache_mib {
        if !(1..=1 << 20).contains(&mib) {
            return Err(Failure::Usage(format!(
                "config cacheMib must be between 1 and 1048576, not {mib}"
            )));
        }
        b = b.cache_bytes(mib << 20);
    }
    b = match config.durability.as_deref() {
        None | Some("sync") => b.durability(Durability::Sync),
        Some("buffered") => b.durability(Durability::Buffered),
        Some(other) => {
            return Err(Failure::Usage(format!(
                "config durability must be \"sync\" or \"buffered\", not {other:?}"
            )))
        }
    };
    b.open(&dir).map_err(fail)
}

/// The store a command works on: the directory, or a server (`--server URL`).
pub(crate) enum Handle {
    /// `--store DIR`.
    Embedded(EmbeddedStore),
    /// `--server URL`.
    Remote(RemoteStore),
}

impl Handle {
    pub fn store(&self) -> &dyn MemoryStore {
        match self {
            Handle::Embedded(s) => s,
            Handle::Remote(s) => s,
        }
    }

    /// Commits the index and persists the records of an embedded store.
    pub fn close(self) -> Result<(), Failure> {
        match self {
            Handle::Embedded(s) => s.close().map_err(fail),
            Handle::Remote(_) => Ok(()),
        }
    }
}

/// The server's token comes from `MEMORY_TOKEN`, the name the bot already uses.
pub(crate) fn open_handle(cli: &Cli, create: bool) -> Result<Handle, Failure> {
    match &cli.server {
        Some(url) => {
            let token = std::env::var("MEMORY_TOKEN").ok().filter(|t| !t.is_empty());
            RemoteStore::new(url, token, std::time::Duration::from_secs(30))
                .map(RemoteStore::strict)
                .map(Handle::Remote)
                .map_err(fail)
        }
        None => open_store(cli, create).map(Handle::Embedded),
    }
}

pub(super) fn out() -> BufWriter<io::StdoutLock<'static>> {
    BufWriter::new(io::stdout().lock())
}

pub(super) fn read_stdin() -> Result<String, Failure> {
    let mut s = String::new();
    io::stdin()
        .read_to_string(&mut s)
        .map_err(|e| Failure::Usage(format!("reading stdin: {e}")))?;
    Ok(s)
}

/// One record as a person reads it: id, kind, date, text, source.
pub(crate) fn human_record(r: &Record) -> String {
    let line = format!(
        "{}  {}  {}  {}  (source: {})",
        r.id,
        r.kind.as_str(),
        lessons::internals::time::format_day(day_of(r.created_at)),
        lessons::internals::text::sanitize(&r.text),
        r.source_thread_key
    );
    super::printable(&line).into_owned()
}

fn print_records(cli: &Cli, records: &[Record]) -> Result<(), Failure> {
    let mut o = out();
    if cli.json {
        // The server's answer, byte for byte.
        let line = serde_json::to_string(&lessons::internals::contract::RecordsAnswer {
            records: records.to_vec(),
        })
        .map_err(|e| Failure::Usage(format!("encoding records: {e}")))?;
        emit(&mut o, &line)?;
    } else {
        for r in records {
            emit(&mut o, &human_record(r))?;
        }
    }
    o.flush()?;
    Ok(())
}

// ---- write ----

/// Arguments of `lessons write`.
#[derive(Debug, Args)]
pub(crate) struct WriteArgs {
    #[command(flatten)]
    pub scope: ScopeFlags,
    /// Active records the scope may hold after this write (1–10000).
    #[arg(long)]
    pub cap: Option<usize>,
}

/// Candidates on stdin: a JSON array, or the wire's `{"records": [...]}`.
fn parse_candidates(text: &str) -> Result<Vec<Candidate>, Failure> {
    const SHAPE: &str = "stdin must be a JSON array of candidates (or {\"records\": [...]})";
    let value = lessons::internals::json::parse(text).ok_or_else(|| {
        let why = serde_json::from_str::<serde_json::Value>(text)
            .err()
            .map_or_else(String::new, |e| format!(": {e}"));
        Failure::Usage(format!("{SHAPE}{why}"))
    })?;
    let list = match value {
        serde_json::Value::Array(list) => list,
        serde_json::Value::Object(mut o) => match o.remove("records") {
            Some(serde_json::Value::Array(list)) => list,
            _ => return Err(Failure::Usage(format!("{SHAPE}: no \"records\" array"))),
        },
        _ => return Err(Failure::Usage(SHAPE.to_owned())),
    };
    list.into_iter()
        .enumerate()
        .map(|(i, v)| candidate_at(i, v).map_err(Failure::Usage))
        .collect()
}

/// Candidate `i` of a write's input, or a reason that names it and the field at fault.
fn candidate_at(i: usize, v: serde_json::Value) -> Result<Candidate, String> {
    let fields: Vec<(String, serde_json::Value)> = match &v {
        serde_json::Value::Object(o) => o.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        _ => return Err(format!("records[{i}] must be an object")),
    };
    serde_json::from_value(v).map_err(|whole| {
        // serde names a missing field but not a mistyped one: find the field that fails alone,
        // beside stand-ins for the two required ones.
        let culprit = fields.iter().find_map(|(key, value)| {
            let mut probe = serde_json::json!({"text": "x", "sourceThreadKey": "t"});
            probe
                .as_object_mut()
                .map(|o| o.insert(key.clone(), value.clone()));
            serde_json::from_value::<Candidate>(probe)
                .err()
                .map(|e| format!("records[{i}].{key}: {e}"))
        });
        culprit.unwrap_or_else(|| format!("records[{i}]: {whole}"))
    })
}

pub(crate) fn write(cli: &Cli, args: &WriteArgs) -> Result<Outcome, Failure> {
    let scope = args.scope.one()?;
    let candidates = parse_candidates(&read_stdin()?)?;
    let handle = open_handle(cli, true)?;
    let store = handle.store();
    let options = WriteOptions {
        cap: args.cap,
        ..WriteOptions::default()
    };
    let c = store.write(&scope, &candidates, &options).map_err(fail)?;
    handle.close()?;
    let mut o = out();
    if cli.json {
        let line = serde_json::to_string(&lessons::internals::contract::WriteAnswer {
            ok: true,
            counts: c,
        })
        .map_err(|e| Failure::Usage(format!("encoding the answer: {e}")))?;
        emit(&mut o, &line)?;
    } else {
        emit(
            &mut o,
            &format!(
                "[memory] {scope}: inserted {}, deduped {}, restated {}, superseded {}, evicted {}",
                c.inserted, c.deduped, c.restated, c.superseded, c.evicted
            ),
        )?;
    }
    o.flush()?;
    Ok(Outcome::Ok)
}

// ---- list / retrieve ----

/// Arguments of `lessons list`.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    pub scope: ScopeFlags,
    /// Only facts or only summaries.
    #[arg(long, value_parser = ["fact", "summary"])]
    pub kind: Option<String>,
    /// At most this many records (1–50).
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Only records holding any token of this as a whole token of their text or keywords.
    #[arg(long)]
    pub query: Option<String>,
}

pub(crate) fn list(cli: &Cli, args: &ListArgs) -> Result<Outcome, Failure> {
    let scope = args.scope.one()?;
    let handle = open_handle(cli, false)?;
    let store = handle.store();
    let q = ListQuery {
        limit: args.limit,
        kind: args.kind.as_deref().and_then(Kind::parse),
        query: args.query.clone(),
    };
    let records = store.list(&scope, &q).map_err(fail)?;
    print_records(cli, &records)?;
    Ok(Outcome::Ok)
}

/// Arguments of `lessons retrieve`.
#[derive(Debug, Args)]
pub(crate) struct RetrieveArgs {
    #[command(flatten)]
    pub scope: ScopeFlags,
    /// The query (a brief, a question, keywords).
    #[arg(long)]
    pub query: String,
    /// At most this many records (1–50).
    #[arg(long, default_value_t = 8)]
    pub limit: usize,
}

pub(crate) fn retrieve(cli: &Cli, args: &RetrieveArgs) -> Result<Outcome, Failure> {
    let scope = args.scope.one()?;
    let handle = open_handle(cli, false)?;
    let store = handle.store();
    let retrieved = store
        .retrieve_marked(&scope, &args.query, args.limit)
        .map_err(fail)?;
    handle.close()?;
    if cli.json {
        // The server's answer, byte for byte: a first use prints `lastUsedAt` last.
        let line = serde_json::to_string(&lessons::internals::contract::RetrieveAnswer {
            records: retrieved,
        })
        .map_err(|e| Failure::Usage(format!("encoding records: {e}")))?;
        let mut o = out();
        emit(&mut o, &line)?;
        o.flush()?;
        return Ok(Outcome::Ok);
    }
    let records = lessons::model::Retrieved::records(retrieved);
    print_records(cli, &records)?;
    Ok(Outcome::Ok)
}

// ---- forget / sweep ----

/// Arguments of `lessons forget`.
#[derive(Debug, Args)]
pub(crate) struct ForgetArgs {
    /// The record id (mem:<scope>:<seq>); the scope is taken from it.
    pub id: String,
}

pub(crate) fn forget(cli: &Cli, args: &ForgetArgs) -> Result<Outcome, Failure> {
    let Some(RecordId { scope, .. }) = RecordId::parse(&args.id) else {
        return Err(Failure::Usage(format!(
            "{:?} is not a record id (mem:<scopeKey>:<seq>)",
            args.id
        )));
    };
    let handle = open_handle(cli, false)?;
    let store = handle.store();
    let forgotten = store.forget(&scope, &args.id).map_err(fail)?;
    handle.close()?;
    let mut o = out();
    if cli.json {
        let line = serde_json::to_string(&lessons::internals::contract::ForgetAnswer {
            ok: true,
            forgotten,
        })
        .map_err(|e| Failure::Usage(format!("encoding the answer: {e}")))?;
        emit(&mut o, &line)?;
    } else if forgotten {
        emit(&mut o, &format!("forgotten {}", args.id))?;
    } else {
        emit(&mut o, &format!("no active record {}", args.id))?;
    }
    o.flush()?;
    Ok(if forgotten {
        Outcome::Ok
    } else {
        Outcome::Found
    })
}

/// Arguments of `lessons sweep`.
#[derive(Debug, Args)]
pub(crate) struct SweepArgs {
    #[command(flatten)]
    pub scope: ScopeFlags,
    /// Report what would be swept; change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

pub(crate) fn sweep(cli: &Cli, args: &SweepArgs) -> Result<Outcome, Failure> {
    let handle = open_handle(cli, false)?;
    let store = handle.store();
    let scopes = if args.scope.scope.as_deref() == Some("all") {
        args.scope.all(store)?
    } else {
        vec![args.scope.one()?]
    };
    let mut receipts = Vec::new();
    for scope in scopes {
        let r = store.sweep(&scope, args.dry_run).map_err(fail)?;
        receipts.push((scope, r));
    }
    handle.close()?;
    let mut o = out();
    if cli.json {
        let scopes: Vec<_> = receipts
            .iter()
            .map(|(s, r)| {
                if args.dry_run {
                    json!({"scopeKey": s, "swept": r.swept, "ids": r.ids})
                } else {
                    json!({"scopeKey": s, "swept": r.swept})
                }
            })
            .collect();
        emit(&mut o, &json!({ "scopes": scopes }).to_string())?;
    } else {
        for (s, r) in &receipts {
            if args.dry_run {
                let ids = if r.ids.is_empty() {
                    String::new()
                } else {
                    format!(": {}", r.ids.join(" "))
                };
                emit(&mut o, &format!("{s}: would sweep {}{ids}", r.swept))?;
            } else {
                emit(&mut o, &format!("{s}: swept {}", r.swept))?;
            }
        }
    }
    o.flush()?;
    Ok(Outcome::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_flags_resolve_keys_and_kinds() {
        let f = ScopeFlags {
            scope: Some("repo".into()),
            ids: ScopeIds {
                repo: Some("acme/app".into()),
                ..ScopeIds::default()
            },
        };
        assert_eq!(
            f.one().map(|s| s.to_string()).ok().as_deref(),
            Some("repo:acme/app")
        );
        let key = ScopeFlags {
            scope: Some("channel:slack:C1".into()),
            ..ScopeFlags::default()
        };
        assert_eq!(
            key.one().map(|s| s.to_string()).ok().as_deref(),
            Some("channel:slack:C1")
        );
        let missing = ScopeFlags {
            scope: Some("user".into()),
            ..ScopeFlags::default()
        };
        assert!(missing
            .one()
            .is_err_and(|f| f.to_string().contains("--user")));
        let bad_repo = ScopeFlags {
            scope: Some("repo".into()),
            ids: ScopeIds {
                repo: Some("app".into()),
                ..ScopeIds::default()
            },
        };
        assert!(bad_repo
            .one()
            .is_err_and(|f| f.to_string().contains("OWNER/NAME")));
        let prefixed = ScopeFlags {
            scope: Some("org".into()),
            ids: ScopeIds {
                org: Some("org:acme".into()),
                ..ScopeIds::default()
            },
        };
        assert_eq!(
            prefixed.one().map(|s| s.to_string()).ok().as_deref(),
            Some("org:acme")
        );
        assert!(ScopeFlags::default().one().is_err());
    }

    #[test]
    fn candidates_parse_as_an_array_or_the_wire_envelope() {
        let a = parse_candidates(r#"[{"kind":"fact","text":"x","sourceThreadKey":"t"}]"#);
        assert_eq!(a.map(|v| v.len()).ok(), Some(1));
        let w = parse_candidates(
            r#"{"records":[{"kind":"fact","text":"x","sourceThreadKey":"t","extra":1}]}"#,
        );
        assert_eq!(w.map(|v| v.len()).ok(), Some(1));
        assert!(parse_candidates("{}").is_err());
    }
}
