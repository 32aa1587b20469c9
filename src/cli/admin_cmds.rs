//! The store's administrative commands: export, import, doctor (check, repair, salvage), stats.

use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};

use clap::Args;
use lessons::internals::time::{day_of, system_clock};
use lessons::model::Record;
use lessons::store::DayStats;
use serde_json::json;

use super::store_cmds::{fail, open_handle, open_store, out, store_dir};
use super::{emit, to_json, Cli, Failure, Outcome};

// ---- export / import ----

pub(crate) fn export(cli: &Cli) -> Result<Outcome, Failure> {
    let handle = open_handle(cli, false)?;
    let store = handle.store();
    let mut o = out();
    let mut failure = None;
    store
        .export(&mut |r| {
            let line = serde_json::to_string(&r)
                .map_err(|e| lessons::Error::format(format!("encoding {}: {e}", r.id)))?;
            if let Err(f) = emit(&mut o, &line) {
                failure = Some(f);
                return Err(lessons::Error::new(lessons::ErrorKind::Io, "stdout closed"));
            }
            Ok(())
        })
        .map_err(|e| failure.take().unwrap_or_else(|| fail(e)))?;
    // Then the decision journal, one `{"decision": …}` line per entry.
    store
        .export_decisions(&mut |d| {
            let line = json!({ "decision": d }).to_string();
            if let Err(f) = emit(&mut o, &line) {
                failure = Some(f);
                return Err(lessons::Error::new(lessons::ErrorKind::Io, "stdout closed"));
            }
            Ok(())
        })
        .map_err(|e| failure.take().unwrap_or_else(|| fail(e)))?;
    o.flush()?;
    Ok(Outcome::Ok)
}

/// Arguments of `lessons import`.
#[derive(Debug, Args)]
pub(crate) struct ImportArgs {
    /// A JSON Lines file of whole records and `{"decision": …}` journal entries (as `export`
    /// writes); stdin when absent.
    pub file: Option<PathBuf>,
}

/// One line of an export: a record or a journal entry.
enum ImportLine {
    Record(Box<Record>),
    Decision(Box<lessons::decisions::Decision>),
}

/// Reads one line of an export (`None` for a blank one), checked as the store will check it.
fn import_line(n: usize, line: &str) -> Result<Option<ImportLine>, Failure> {
    if line.trim().is_empty() {
        return Ok(None);
    }
    if line.trim_start().starts_with("{\"decision\"") {
        #[derive(serde::Deserialize)]
        struct Line {
            decision: lessons::decisions::Decision,
        }
        let l: Line = from_js_line(line)
            .map_err(|e| Failure::Usage(format!("line {n}: not a journal entry: {e}")))?;
        l.decision
            .validate()
            .map_err(|e| Failure::Usage(format!("line {n}: {e}")))?;
        return Ok(Some(ImportLine::Decision(Box::new(l.decision))));
    }
    let r: Record =
        from_js_line(line).map_err(|e| Failure::Usage(format!("line {n}: not a record: {e}")))?;
    r.validate()
        .map_err(|e| Failure::Usage(format!("line {n}: {e}")))?;
    Ok(Some(ImportLine::Record(Box::new(r))))
}

/// Records and journal entries written per store call: an import of any size holds this
/// many lines at a time, never its whole input.
const IMPORT_CHUNK: usize = 1_000;

pub(crate) fn import(cli: &Cli, args: &ImportArgs) -> Result<Outcome, Failure> {
    let open = |p: &Path| -> Result<Box<dyn BufRead>, Failure> {
        Ok(Box::new(io::BufReader::new(
            std::fs::File::open(p).map_err(|e| Failure::Usage(format!("{}: {e}", p.display())))?,
        )))
    };
    // A file is read twice: every line is checked before anything is written, so bad input
    // writes nothing. Standard input is read once; a bad line stops the import there and the
    // message says what was written (import again after fixing it: present ids are skipped).
    if let Some(p) = &args.file {
        for (n, line) in open(p)?.lines().enumerate() {
            let line = line.map_err(|e| Failure::Usage(format!("line {}: {e}", n + 1)))?;
            import_line(n + 1, &line)?;
        }
    }
    let reader: Box<dyn BufRead> = match &args.file {
        Some(p) => open(p)?,
        None => Box::new(io::BufReader::new(io::stdin())),
    };
    let handle = open_handle(cli, true)?;
    let store = handle.store();
    let mut report = lessons::store::ImportReport::default();
    let mut journaled = 0u64;
    let mut records: Vec<Record> = Vec::with_capacity(IMPORT_CHUNK);
    let mut decisions: Vec<lessons::decisions::Decision> = Vec::new();
    let flush = |records: &mut Vec<Record>,
                 decisions: &mut Vec<lessons::decisions::Decision>,
                 report: &mut lessons::store::ImportReport,
                 journaled: &mut u64|
     -> Result<(), Failure> {
        let r = store.import(records).map_err(fail)?;
        report.imported += r.imported;
        report.skipped += r.skipped;
        *journaled += store.import_decisions(decisions).map_err(fail)?;
        records.clear();
        decisions.clear();
        Ok(())
    };
    for (n, line) in reader.lines().enumerate() {
        let read = line
            .map_err(|e| Failure::Usage(format!("line {}: {e}", n + 1)))
            .and_then(|l| import_line(n + 1, &l));
        match read {
            Ok(Some(ImportLine::Record(r))) => records.push(*r),
            Ok(Some(ImportLine::Decision(d))) => decisions.push(*d),
            Ok(None) => {}
            Err(Failure::Usage(why)) if report.imported + report.skipped + journaled > 0 => {
                return Err(Failure::Usage(format!(
                    "{why} (imported {} records and {journaled} journal entries before it; fix the line and import again: records already present are skipped)",
                    report.imported
                )));
            }
            Err(f) => return Err(f),
        }
        if records.len() + decisions.len() >= IMPORT_CHUNK {
            flush(&mut records, &mut decisions, &mut report, &mut journaled)?;
        }
    }
    flush(&mut records, &mut decisions, &mut report, &mut journaled)?;
    handle.close()?;
    let mut o = out();
    if cli.json {
        let answer = lessons::internals::contract::ImportAnswer {
            ok: true,
            imported: report.imported,
            skipped: report.skipped,
            decisions: journaled,
        };
        emit(&mut o, &to_json(&answer)?)?;
    } else {
        emit(
            &mut o,
            &format!(
                "imported {}, skipped {} already present; {journaled} journal entries",
                report.imported, report.skipped
            ),
        )?;
    }
    o.flush()?;
    Ok(Outcome::Ok)
}

/// A JSON line read as JavaScript reads it (an export carries keywords with lone surrogates as
/// `\udXXX`, which serde alone refuses), then typed.
fn from_js_line<T: serde::de::DeserializeOwned>(line: &str) -> Result<T, String> {
    match lessons::internals::json::parse(line) {
        Some(v) => serde_json::from_value(v).map_err(|e| e.to_string()),
        None => Err(serde_json::from_str::<serde_json::Value>(line)
            .err()
            .map_or_else(|| "not valid JSON".to_owned(), |e| e.to_string())),
    }
}

// ---- doctor / stats ----

/// Arguments of `lessons doctor`.
#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// Rewrite the scopes' bookkeeping and dedup keys from the records and rebuild the
    /// keyword index from them.
    #[arg(long, conflicts_with = "salvage")]
    pub repair: bool,
    /// Copy every readable record of a damaged store into a new store at DIR (which must not
    /// exist or be empty). The damaged store is only read.
    #[arg(long, value_name = "DIR")]
    pub salvage: Option<PathBuf>,
}

pub(crate) fn doctor(cli: &Cli, args: &DoctorArgs) -> Result<Outcome, Failure> {
    if cli.server.is_some() {
        return Err(Failure::Usage(
            "doctor checks a store directory; run it on the server's host with --store DIR".into(),
        ));
    }
    if let Some(to) = &args.salvage {
        return salvage(cli, to);
    }
    let store = open_store(cli, false)?;
    let health = if args.repair {
        store.repair()
    } else {
        store.check()
    }
    .map_err(fail)?;
    store.close().map_err(fail)?;
    let mut o = out();
    if cli.json {
        let mut v = serde_json::to_value(&health).map_err(|e| Failure::Usage(e.to_string()))?;
        if let Some(fields) = v.as_object_mut() {
            fields.insert("ok".to_owned(), json!(health.is_ok()));
        }
        emit(&mut o, &v.to_string())?;
    } else {
        let verdict = if health.is_ok() {
            "consistent"
        } else if !health.unreadable.is_empty() {
            "DAMAGED (run lessons doctor --salvage NEW_DIR)"
        } else if health.damage.is_some() || !health.lost.is_empty() {
            "ACKNOWLEDGED RECORDS LOST (run lessons doctor --salvage NEW_DIR, or --repair to continue in place)"
        } else {
            "INCONSISTENT (run lessons doctor --repair)"
        };
        // Unreadable data stops the check before the records are counted.
        let summary = if health.unreadable.is_empty() {
            format!(
                "{} active records, {} indexed documents: {verdict}",
                health.active_records, health.indexed_documents
            )
        } else {
            format!("{} indexed documents: {verdict}", health.indexed_documents)
        };
        emit(&mut o, &summary)?;
        if let Some(d) = &health.damage {
            emit(&mut o, &format!("damage: {d}"))?;
        }
        for what in &health.unreadable {
            emit(&mut o, &format!("unreadable: {what}"))?;
        }
        for id in &health.lost {
            emit(&mut o, &format!("lost: {id}"))?;
        }
        for id in &health.missing_from_index {
            emit(&mut o, &format!("missing from the index: {id}"))?;
        }
        for p in &health.problems {
            emit(&mut o, &format!("problem: {p}"))?;
        }
    }
    o.flush()?;
    Ok(if health.is_ok() {
        Outcome::Ok
    } else {
        Outcome::Found
    })
}

fn salvage(cli: &Cli, to: &Path) -> Result<Outcome, Failure> {
    let from = store_dir(cli);
    let report = lessons::store::salvage(&from, to).map_err(fail)?;
    let mut o = out();
    if cli.json {
        let v = serde_json::to_value(&report).map_err(|e| Failure::Usage(e.to_string()))?;
        emit(&mut o, &v.to_string())?;
    } else {
        emit(
            &mut o,
            &format!(
                "salvaged {} records and {} decision-journal entries into {} ({} read through the tables, {} record versions from whole journal batches, {} unreadable, {} damaged journal batches)",
                report.copied,
                report.decisions,
                to.display(),
                report.from_tables,
                report.from_journal,
                report.unreadable,
                report.damaged_batches
            ),
        )?;
        if !report.lost.is_empty() {
            emit(
                &mut o,
                &format!(
                    "{} acknowledged record(s) could not be read and are lost; their ids are never handed out again: {}",
                    report.lost.len(),
                    report.lost.join(", ")
                ),
            )?;
        }
        for j in &report.damaged_journals {
            emit(&mut o, &format!("damaged journal: {j}"))?;
        }
        if let Some(e) = &report.tables_error {
            emit(&mut o, &format!("tables not read: {e}"))?;
        }
        if report.journal_missing {
            emit(
                &mut o,
                "the journal was missing: writes after the last flush could not be read",
            )?;
        }
        emit(
            &mut o,
            &format!(
                "check it with `lessons --store {} doctor`, then move it into place of {}",
                to.display(),
                from.display()
            ),
        )?;
    }
    o.flush()?;
    Ok(Outcome::Ok)
}

/// Arguments of `lessons stats`.
#[derive(Debug, Args)]
pub(crate) struct StatsArgs {
    /// How far back: `1d` is today (UTC), `7d` the last seven days.
    #[arg(long, default_value = "1d")]
    pub since: String,
}

/// `Nd` → the first day counted.
pub(super) fn parse_since(since: &str, today: i64) -> Result<i64, Failure> {
    let n: i64 = since
        .strip_suffix('d')
        .and_then(|n| n.parse().ok())
        .filter(|n| (1..=36_500).contains(n))
        .ok_or_else(|| {
            Failure::Usage(format!(
                "--since takes a number of days like 1d or 7d, not {since:?}"
            ))
        })?;
    Ok(today - (n - 1))
}

/// One day of one scope as a person reads it.
pub(crate) fn human_day(d: &DayStats) -> String {
    format!("{} {}: {}", d.day, d.scope_key, d.counters.line(true))
}

pub(crate) fn stats(cli: &Cli, args: &StatsArgs) -> Result<Outcome, Failure> {
    let today = day_of((system_clock())());
    let since = parse_since(&args.since, today)?;
    let handle = open_handle(cli, false)?;
    let store = handle.store();
    let days = store.stats(since).map_err(fail)?;
    let mut o = out();
    if cli.json {
        emit(
            &mut o,
            &to_json(&lessons::internals::contract::StatsAnswer { days })?,
        )?;
    } else if days.is_empty() {
        emit(&mut o, "no activity in that period")?;
    } else {
        for d in &days {
            emit(&mut o, &human_day(d))?;
        }
    }
    o.flush()?;
    Ok(Outcome::Ok)
}

#[cfg(test)]
mod tests {
    use super::parse_since;

    #[test]
    fn since_counts_whole_days_back_from_today() {
        assert_eq!(parse_since("1d", 100).ok(), Some(100));
        assert_eq!(parse_since("7d", 100).ok(), Some(94));
        assert!(parse_since("0d", 100).is_err());
        assert!(parse_since("week", 100).is_err());
    }
}
