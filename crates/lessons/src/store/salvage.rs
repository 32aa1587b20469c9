//! Salvage: every readable record of a damaged store, copied into a new store.
//!
//! The damaged store is never written: its `records/` directory is copied into a work
//! directory inside the destination, and only the copy is repaired enough for fjall to open it
//! (a damaged journal is cut at its first bad batch; a missing journal gets an empty one, so
//! fjall recovers its sequence numbers from the tables). Records come from the copy's tables and
//! journal prefix as fjall reads them, and from every whole batch of the journals, including
//! those after the damage that fjall would have discarded (`journal` reads them). When the
//! tables themselves do not open (a damaged footer), the journals are all that is read.
//! Where two versions of a record disagree, the later state wins: retired over active, then the
//! higher use count, then the later use. A retrieve's use recorded apart from its record (a
//! usage entry, in the tables or the journals) is folded into the record the same way. The destination gets them through `import`, which
//! derives every scope's bookkeeping, dedup keys and keyword index from the records. The
//! decision journal is read the same way and carried over.
//!
//! What cannot be read is reported, not guessed: the batches whose bytes are damaged, and the
//! ids the store had acknowledged (known to its keyword index or its decision journal) that no
//! readable copy holds. The new store never hands those ids out again.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use fjall::{Database, KeyspaceCreateOptions};

use super::api::MemoryStore;
use super::codec;
use super::embedded::EmbeddedStore;
use super::embedded::NextIds;
use super::fjall_files::{self as journal, VALUE_TYPE_VALUE};
use crate::decisions::Decision;
use crate::error::{Error, ErrorKind, Result};
use crate::model::{Kind, Record, RecordId, ScopeKey, Status};

/// What a salvage found and copied.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SalvageReport {
    /// Records read from the tables and the journal up to its damage.
    pub from_tables: u64,
    /// Record versions read from the journals' whole batches (before and after any damage).
    pub from_journal: u64,
    /// Why the tables could not be opened, when they could not (only the journals were read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tables_error: Option<String>,
    /// Journal files found damaged (and cut, in the work copy).
    pub damaged_journals: Vec<String>,
    /// Whether the store had no journal at all.
    pub journal_missing: bool,
    /// Values that could not be read or decoded, or records that failed validation.
    pub unreadable: u64,
    /// Journal batches whose bytes are damaged: every record version in them is lost.
    pub damaged_batches: u64,
    /// Ids the store had acknowledged (its keyword index or its decision journal knows them)
    /// that no readable copy holds: lost. The new store never hands them out again.
    pub lost: Vec<String>,
    /// Records written into the new store.
    pub copied: u64,
    /// Decision-journal entries written into the new store.
    pub decisions: u64,
}

/// Copies every readable record of the store at `from` into a new store at `to`, which must
/// not exist or be empty. `from` is only read (and locked while it is read).
pub fn salvage(from: &Path, to: &Path) -> Result<SalvageReport> {
    let records = from.join("records");
    check_dirs(from, &records, to)?;
    let _lock = super::embedded::lock_store_dir(from)?;
    let work = to.join(".salvage-work");
    let work_records = work.join("records");
    copy_dir(&records, &work_records)?;

    let mut report = SalvageReport::default();
    // An unreadable witness names nothing: salvage reads around damage, it does not stop at it.
    let witness = super::embedded::read_next_ids(from).unwrap_or_default();
    let from_journal = read_journals(&records, &work_records, &mut report)?;

    let mut found: BTreeMap<String, Record> = BTreeMap::new();
    let mut decisions: BTreeMap<Vec<u8>, Entry> = BTreeMap::new();
    let mut uses: BTreeMap<String, codec::Usage> = BTreeMap::new();
    // The ids of the record values that read but did not decode (already counted unreadable).
    let mut undecoded: BTreeSet<String> = BTreeSet::new();
    let format = match read_copy(
        &work_records,
        &mut found,
        &mut decisions,
        &mut uses,
        &mut undecoded,
        &mut report,
        &witness,
    ) {
        Ok(format) => format,
        Err(e) => {
            // The tables do not open: the journals are all that can be read.
            report.tables_error = Some(e.to_string());
            None
        }
    };
    // Every journal batch is read too: records in the journal prefix are also in the copy, and
    // merging keeps the later state; when the tables do not open, these are all there is.
    for batch in from_journal {
        for item in batch.items {
            if item.value_type != VALUE_TYPE_VALUE || codec::trailing_seq(&item.key).is_none() {
                continue;
            }
            if let Some(d) = as_decision(&item.key, &item.value) {
                decisions.insert(item.key, d);
                continue;
            }
            if let Some((id, u)) = as_usage(&item.key, &item.value) {
                keep_later_use(&mut uses, id, u);
                continue;
            }
            // Only record values decode as records; other keyspaces' values fail the check.
            let Ok(r) = codec::decode_record(&item.value, None) else {
                continue;
            };
            if r.validate().is_err() {
                continue;
            }
            report.from_journal += 1;
            keep_later_state(&mut found, r);
        }
    }

    for (id, u) in uses {
        if let Some(r) = found.get_mut(&id) {
            if (u.use_count, Some(u.last_used_at)) > (r.use_count, r.last_used_at) {
                u.apply(r);
            }
        }
    }

    // The ids the store acknowledged: what its index and its decision journal name.
    let mut known: BTreeSet<String> = indexed_ids(&from.join("index"), &work.join("index"));
    for (d, _) in decisions.values() {
        known.extend(d.ids.iter().cloned());
    }
    known.extend(witnessed_tail(&witness, &found));
    report.lost = known
        .into_iter()
        .filter(|id| !found.contains_key(id) && RecordId::parse(id).is_some())
        .collect();
    // In each scope's order, not the text's (`:10` after `:9`).
    report
        .lost
        .sort_by_cached_key(|id| RecordId::parse(id).map(|r| (r.scope, r.seq)));

    // A write's insertion and eviction entries leave their text to their record
    // (`codec::text_record`); they go to the new store whole, with the text of the record
    // found, since the import that carries them stores what it is given. In a store of the
    // current format every such entry is marked: an unmarked one is an import's or a repair's.
    let unmarked_may_be_format6 = format.as_deref() != Some(&[codec::STORE_FORMAT]);
    for (d, text_in) in decisions.values_mut() {
        let Some(r) = d.ids.first().and_then(|id| found.get(id)) else {
            continue;
        };
        let theirs = match text_in {
            TextIn::Entry => false,
            TextIn::Record => true,
            TextIn::Format6Record => unmarked_may_be_format6 && codec::format6_written_with(d, r),
        };
        if theirs {
            d.texts.push(r.text.clone());
        }
    }
    let dest = EmbeddedStore::open(to)?;
    let mut valid = Vec::with_capacity(found.len());
    for r in found.into_values() {
        if r.validate().is_ok() {
            valid.push(r);
        } else {
            report.unreadable += 1;
        }
    }
    for chunk in valid.chunks(1000) {
        report.copied += dest.import(chunk)?.imported;
    }
    let mut reserve: BTreeMap<crate::model::ScopeKey, u64> = BTreeMap::new();
    for id in &report.lost {
        if let Some(RecordId { scope, seq }) = RecordId::parse(id) {
            let next = reserve.entry(scope).or_default();
            *next = (*next).max(seq + 1);
        }
    }
    for (scope, next) in &reserve {
        dest.reserve_ids(scope, *next)?;
    }
    let entries: Vec<Decision> = decisions.into_values().map(|(d, _)| d).collect();
    for chunk in entries.chunks(1000) {
        report.decisions += dest.import_decisions(chunk)?;
    }
    // A lost id is unreadable once: its value may have been counted as one that did not decode.
    report.unreadable += report
        .lost
        .iter()
        .filter(|id| !undecoded.contains(*id))
        .count() as u64;
    dest.close()?;
    std::fs::remove_dir_all(&work)
        .map_err(|e| Error::io(format!("removing {}", work.display()), e))?;
    Ok(report)
}

/// Refuses a source without records or a destination that is not empty.
fn check_dirs(from: &Path, records: &Path, to: &Path) -> Result<()> {
    if !records.is_dir() {
        return Err(Error::invalid(format!(
            "{} holds no store to salvage (no records/ directory)",
            from.display()
        )));
    }
    if to.exists()
        && std::fs::read_dir(to)
            .map_err(|e| Error::io(format!("reading {}", to.display()), e))?
            .next()
            .is_some()
    {
        return Err(Error::invalid(format!(
            "{} is not empty: salvage writes into a new directory",
            to.display()
        )));
    }
    Ok(())
}

/// Every whole batch of every journal of the work copy, the batches after a damage included;
/// each damaged journal is cut at its damage so that fjall opens the copy.
fn read_journals(
    records: &Path,
    work_records: &Path,
    report: &mut SalvageReport,
) -> Result<Vec<journal::Batch>> {
    let mut from_journal: Vec<journal::Batch> = Vec::new();
    let journals = journal::journal_files(work_records)?;
    report.journal_missing = journal::make_openable(work_records)?;
    for (_, path) in &journals {
        let scan = journal::scan_file(path, true)?;
        from_journal.extend(scan.batches);
        report.damaged_batches += scan.unreadable_batches;
        if let Some(d) = scan.damage {
            report.damaged_journals.push(
                records
                    .join(path.file_name().unwrap_or_default())
                    .display()
                    .to_string(),
            );
            journal::cut_journal(path, d.at)?;
            from_journal.extend(d.later);
        }
    }
    Ok(from_journal)
}

/// The ids the witness of acknowledged ids names past the highest record found in each scope
/// (an unreadable witness names none).
fn witnessed_tail(witnessed: &NextIds, found: &BTreeMap<String, Record>) -> Vec<String> {
    let mut highest: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for r in found.values() {
        if let Some(seq) = r.seq() {
            let h = highest.entry(r.scope_key.as_str()).or_default();
            *h = (*h).max(seq + 1);
        }
    }
    let mut tail = Vec::new();
    for (scope, next) in witnessed {
        let Ok(key) = crate::model::ScopeKey::parse(scope) else {
            continue;
        };
        let from = highest.get(scope.as_str()).copied().unwrap_or(0);
        tail.extend((from..*next).map(|seq| key.record_id(seq)));
    }
    tail
}

/// A decision-journal entry found, and where its text is.
type Entry = (Decision, TextIn);

/// Where a salvaged entry's text is. Salvage reads a store of any format, which it may not be
/// able to tell, so it takes the format 7 mark and format 6's unmarked shape alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TextIn {
    /// The entry holds its texts (or has none).
    Entry,
    /// Marked as leaving its text to its record.
    Record,
    /// Format 6's shape: its record's text only if the store may be of format 6 (its format
    /// does not read as the current one) and the entry was written with that record
    /// (`codec::format6_written_with`), as the upgrade decides.
    Format6Record,
}

/// A stored journal entry as salvage reads it, and where its text is.
fn salvaged_entry(value: &[u8]) -> Option<Entry> {
    let d = codec::decode_decision(value).ok()?;
    let text_in = if codec::text_record(value, &d).is_some() {
        TextIn::Record
    } else if codec::format6_text_record(value, &d).is_some() {
        TextIn::Format6Record
    } else {
        TextIn::Entry
    };
    Some((d, text_in))
}

/// A journal item that is a decision-journal entry: its key is scope, NUL, the event or its
/// class (format 4 on; none before), the inverted time and counter, and its value decodes as an
/// entry of that scope, event and time.
fn as_decision(key: &[u8], value: &[u8]) -> Option<Entry> {
    let scope = codec::scope_bytes(key)?;
    let (d, text_in) = salvaged_entry(value)?;
    (codec::is_decision_key_of(key, &d)
        && d.scope_key.as_str().as_bytes() == scope
        && codec::decision_time(key) == Some(d.time))
    .then_some((d, text_in))
}

/// The ids in the store's keyword index, read from a copy (opening an index writes to it).
fn indexed_ids(index: &Path, work: &Path) -> BTreeSet<String> {
    if !index.is_dir() || copy_dir(index, work).is_err() {
        return BTreeSet::new();
    }
    match crate::store::index::KeywordIndex::open(work) {
        Ok(opened) => opened.index.ids().unwrap_or_default().into_iter().collect(),
        Err(_) => BTreeSet::new(),
    }
}

/// Reads every record and decision fjall can read from the work copy, counting what it cannot.
/// Returns the store's format, as its `meta` keyspace names it, if it reads.
fn read_copy(
    records: &Path,
    found: &mut BTreeMap<String, Record>,
    decisions: &mut BTreeMap<Vec<u8>, Entry>,
    uses: &mut BTreeMap<String, codec::Usage>,
    undecoded: &mut BTreeSet<String>,
    report: &mut SalvageReport,
    witness: &NextIds,
) -> Result<Option<Vec<u8>>> {
    let db = Database::builder(records)
        .journal_compression(fjall::CompressionType::None)
        .open()
        .map_err(|e| {
            Error::new(
                ErrorKind::Damaged,
                format!(
                    "the tables do not open: {}",
                    crate::store::engine::describe_fjall(&e)
                ),
            )
        })?;
    let mut damaged = false;
    for name in ["active", "retired"] {
        let ks = db
            .keyspace(name, KeyspaceCreateOptions::default)
            .map_err(|e| crate::store::engine::storage(format!("opening keyspace {name}"), e))?;
        let mut failures = 0;
        for g in ks.iter() {
            match g.into_inner() {
                Ok((k, v)) => match codec::decode_record(&v, None) {
                    Ok(r) => {
                        report.from_tables += 1;
                        keep_later_state(found, r);
                    }
                    Err(_) => {
                        report.unreadable += 1;
                        undecoded.extend(codec::record_id_of_key(&k, name == "retired"));
                    }
                },
                Err(_) => {
                    failures += 1;
                    // An iterator that keeps failing is stuck on one bad block.
                    if failures > 1000 {
                        break;
                    }
                }
            }
        }
        damaged |= failures > 0;
    }
    // A usage entry lost to a bad block costs a count, not a record: read what reads.
    let usage = db
        .keyspace("usage", KeyspaceCreateOptions::default)
        .map_err(|e| crate::store::engine::storage("opening keyspace usage", e))?;
    for g in usage.iter() {
        match g.into_inner() {
            Ok((k, v)) => match as_usage(&k, &v) {
                Some((id, u)) => keep_later_use(uses, id, u),
                None => report.unreadable += 1,
            },
            Err(_) => {
                report.unreadable += 1;
                break;
            }
        }
    }
    if damaged {
        // A scan stops at a bad block, and every later key of the keyspace with it: read the
        // rest key by key instead, so only the records inside the bad block are lost.
        read_key_by_key(&db, found, report, witness)?;
    }
    let ks = db
        .keyspace("decisions", KeyspaceCreateOptions::default)
        .map_err(|e| crate::store::engine::storage("opening keyspace decisions", e))?;
    let mut failures = 0;
    for g in ks.iter() {
        match g.into_inner() {
            Ok((k, v)) => match salvaged_entry(&v) {
                Some(entry) => {
                    decisions.insert(k.to_vec(), entry);
                }
                None => report.unreadable += 1,
            },
            Err(_) => {
                report.unreadable += 1;
                failures += 1;
                if failures > 1000 {
                    break;
                }
            }
        }
    }
    let format = db
        .keyspace("meta", KeyspaceCreateOptions::default)
        .ok()
        .and_then(|meta| meta.get("format").ok().flatten())
        .map(|v| v.to_vec());
    Ok(format)
}

/// Reads every record id a scope can hold (below the larger of its bookkeeping's next id, the
/// witness of acknowledged ids and the records already found) with point reads, which fail
/// only inside a damaged block. An id none of them reads is counted where the lost ids are.
fn read_key_by_key(
    db: &Database,
    found: &mut BTreeMap<String, Record>,
    report: &mut SalvageReport,
    witness: &NextIds,
) -> Result<()> {
    let open = |name: &str| {
        db.keyspace(name, KeyspaceCreateOptions::default)
            .map_err(|e| crate::store::engine::storage(format!("opening keyspace {name}"), e))
    };
    let (active, retired, scopes) = (open("active")?, open("retired")?, open("scopes")?);
    let mut upper: BTreeMap<ScopeKey, u64> = BTreeMap::new();
    let mut raise = |scope: ScopeKey, next: u64| {
        let u = upper.entry(scope).or_default();
        *u = (*u).max(next);
    };
    for g in scopes.iter() {
        let Ok((k, v)) = g.into_inner() else {
            continue;
        };
        let scope = std::str::from_utf8(&k)
            .ok()
            .and_then(|s| ScopeKey::parse(s).ok());
        let meta = codec::decode::<codec::ScopeMeta>(&v, "a scope's bookkeeping");
        if let (Some(scope), Ok(meta)) = (scope, meta) {
            raise(scope, meta.next_seq);
        }
    }
    for (scope, next) in witness {
        if let Ok(scope) = ScopeKey::parse(scope) {
            raise(scope, *next);
        }
    }
    for r in found.values() {
        if let Some(seq) = r.seq() {
            raise(r.scope_key.clone(), seq + 1);
        }
    }
    for (scope, next) in &upper {
        for seq in 0..*next {
            let keys = [
                (&active, codec::active_key(scope, Kind::Fact, seq)),
                (&active, codec::active_key(scope, Kind::Summary, seq)),
                (&retired, codec::retired_key(scope, seq)),
            ];
            for (ks, key) in keys {
                // A key inside the damaged block fails to read: it is left to the lost ids.
                if let Ok(Some(v)) = ks.get(&key) {
                    if let Ok(r) = codec::decode_record(&v, Some(scope)) {
                        if !found.contains_key(&r.id) {
                            report.from_tables += 1;
                        }
                        keep_later_state(found, r);
                    }
                }
            }
        }
    }
    Ok(())
}

/// The record id and use a usage entry holds: its key is its record's `active` key, and its
/// value starts with a tag no other value starts with.
fn as_usage(key: &[u8], value: &[u8]) -> Option<(String, codec::Usage)> {
    let u = codec::decode_usage(value).ok()?;
    let (scope, seq) = codec::active_key_parts(key)?;
    let scope = ScopeKey::parse(std::str::from_utf8(scope).ok()?).ok()?;
    Some((scope.record_id(seq), u))
}

/// Keeps the later of two uses of a record (its use count only grows).
fn keep_later_use(uses: &mut BTreeMap<String, codec::Usage>, id: String, u: codec::Usage) {
    let e = uses.entry(id).or_insert(u);
    if (u.use_count, u.last_used_at) > (e.use_count, e.last_used_at) {
        *e = u;
    }
}

/// Keeps the later of two versions of a record: a record only ever leaves `active`, its use
/// count only grows, and its last use only moves forward.
fn keep_later_state(found: &mut BTreeMap<String, Record>, r: Record) {
    let rank = |r: &Record| {
        (
            r.status != Status::Active,
            r.use_count,
            r.last_used_at.unwrap_or(i64::MIN),
        )
    };
    match found.get(&r.id) {
        Some(old) if rank(old) >= rank(&r) => {}
        _ => {
            found.insert(r.id.clone(), r);
        }
    }
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).map_err(|e| Error::io(format!("creating {}", to.display()), e))?;
    let entries =
        std::fs::read_dir(from).map_err(|e| Error::io(format!("reading {}", from.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("reading {}", from.display()), e))?;
        let name = entry.file_name();
        if name == "lock" {
            continue;
        }
        let src = entry.path();
        let dst: PathBuf = to.join(&name);
        let kind = entry
            .file_type()
            .map_err(|e| Error::io(format!("reading {}", src.display()), e))?;
        if kind.is_dir() {
            copy_dir(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst)
                .map_err(|e| Error::io(format!("copying {}", src.display()), e))?;
        }
    }
    Ok(())
}
