//! fjall's files on disk: the one module that knows them.
//!
//! A fjall 3 database (`records/` in a store) is, as the store reads and syncs it:
//! - `version`: the format marker, `FJL` and the format version 3, written last at creation;
//! - `lock`: the file fjall locks (the store locks its own directory first, see `embedded`);
//! - `<n>.jnl`: the journals, numbered from 0; the highest is the active one, a rotation
//!   creates exactly the next number (the patched engine renames `next-journal.spare`,
//!   prepared ahead, to it), and a sealed journal is deleted once every keyspace it touched
//!   has flushed;
//! - `keyspaces/<id>/`: one LSM tree per keyspace (`0` is fjall's own meta keyspace), each
//!   with `tables/`, its versions `v<n>` and the `current` pointer (lsm-tree's).
//!
//! The journal's format is fjall 3's (`journal/entry.rs`): a batch is a `Start` entry (tag 1,
//! u32 item count, u64 seqno), that many `Item` (tag 2) or `Clear` (tag 4) entries, and an `End`
//! entry (tag 3, u64 xxh3 of the encoded items, the trailer `FJL\x03`). Integers are
//! little-endian. The store writes its journal uncompressed, so an item's bytes on disk are
//! exactly the bytes the checksum covers.
//!
//! Checked against fjall 3.1.13 and lsm-tree 3.1.10; `Cargo.toml` pins both to those minor
//! versions, and `tests::a_new_database_has_the_layout_this_module_reads` fails when the
//! layout moves.
//!
//! **Why the store reads the journals itself.** fjall replays its journals on open and, at the
//! first entry it cannot decode, truncates the file there and carries on: a few garbled bytes in
//! the middle of a journal silently discard every acknowledged write after them, and the
//! evidence is gone once the open returns. A missing journal makes fjall start its sequence
//! numbers at zero, which hides every record it has flushed to tables. Neither may happen to a
//! store of ours without a word, so the store reads the journals itself first and refuses to
//! open one that fjall would damage.
//!
//! What counts as damage: a batch that fails to decode or to match its checksum, followed by at
//! least one batch that is whole. A crash leaves only an incomplete last batch (never
//! acknowledged: a write is acknowledged after its batch is on disk), which fjall drops as it
//! should. A whole batch whose checksum is wrong is damage wherever it is: fjall refuses it.
//!
//! **The names fjall leaves to us.** Every name a write depends on must be durable before the
//! write is acknowledged (see `store::durable`). fjall and lsm-tree fsync most of theirs; the
//! gaps, which [`sync_names`] closes after every open:
//! - fjall 3.1.13 `Database::create_new` (`src/db.rs`) fsyncs `keyspaces/` *before* the meta
//!   keyspace's tree `keyspaces/0` is created in it, and `Keyspace::create_new`
//!   (`src/keyspace/mod.rs`) creates `keyspaces/<id>` with `create_dir_all`; lsm-tree 3.1.10
//!   `Tree::create_new` (`src/tree/mod.rs`) then fsyncs `<id>/tables` and `<id>`, never
//!   `keyspaces/`. After a power cut under strict POSIX rules `keyspaces/` is empty while the
//!   journal that registered the keyspaces survives: every record is gone.
//! - fjall creates the database directory itself (`create_dir_all` of its path) without an
//!   fsync of its parent: that is the store's directory, which the store syncs.
//!
//! fjall's rotation fsyncs the new journal and then the folder (`journal/writer.rs`, `rotate`;
//! the patched engine syncs the folder after its lock, and the store before its own fsync of a
//! journal it had not opened, see `embedded::group`),
//! lsm-tree fsyncs a new table's file and folder before it is registered, and a version's file,
//! folder and `current` pointer before the journal behind it is deleted; a deleted journal whose
//! removal is not yet durable comes back as a journal of batches already in tables, which
//! replay skips. None of those needs the store.

use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::Xxh3;

use crate::error::{Error, ErrorKind, Result};

const MAGIC: [u8; 4] = [b'F', b'J', b'L', 3];
/// The format marker's name; its content is [`MAGIC`].
const VERSION: &str = "version";
const LOCK: &str = "lock";
const KEYSPACES: &str = "keyspaces";
const JOURNAL_SUFFIX: &str = ".jnl";
const TAG_START: u8 = 1;
const TAG_ITEM: u8 = 2;
const TAG_END: u8 = 3;
const TAG_CLEAR: u8 = 4;
/// `lsm_tree::ValueType::Value`: an insert. 1 and 2 are tombstones.
pub const VALUE_TYPE_VALUE: u8 = 0;

/// One item of a whole batch.
#[derive(Clone, Debug)]
pub struct Item {
    pub value_type: u8,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// A whole batch: decoded and checksum-verified.
#[derive(Clone, Debug)]
pub struct Batch {
    pub items: Vec<Item>,
}

/// Where a journal stops being readable, and what lies beyond.
#[derive(Clone, Debug)]
pub struct Damage {
    /// Byte offset of the first batch that is not whole.
    pub at: u64,
    pub reason: &'static str,
    /// Whole batches after `at` that opening the journal as is would discard.
    pub later: Vec<Batch>,
}

/// The result of reading one journal file.
#[derive(Clone, Debug)]
pub struct Scan {
    pub path: PathBuf,
    /// The whole batches before the first failure (kept only when asked for).
    pub batches: Vec<Batch>,
    /// Set when fjall would discard whole batches or refuse the file.
    pub damage: Option<Damage>,
    /// Stretches of damaged bytes between whole batches (each lost at least one batch); a
    /// torn last batch, a crash mid-append, is not one.
    pub unreadable_batches: u64,
}

/// The journals of a fjall database directory, oldest first: (id, path).
pub fn journal_files(records: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(records)
        .map_err(|e| Error::io(format!("listing {}", records.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("listing {}", records.display()), e))?;
        let name = entry.file_name();
        let Some(id) = name
            .to_str()
            .and_then(|n| n.strip_suffix(JOURNAL_SUFFIX))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        out.push((id, entry.path()));
    }
    out.sort();
    Ok(out)
}

/// Reads one journal; `keep_later` keeps the items of every whole batch (salvage needs them,
/// the open check only the count of those after a failure).
pub fn scan_file(path: &Path, keep_later: bool) -> Result<Scan> {
    let bytes =
        std::fs::read(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    let mut scan = scan_bytes(&bytes, keep_later);
    scan.path = path.to_owned();
    Ok(scan)
}

fn scan_bytes(bytes: &[u8], keep_later: bool) -> Scan {
    let mut pos = 0usize;
    let mut batches = Vec::new();
    loop {
        match parse_batch(bytes, pos) {
            Ok((batch, next)) => {
                if keep_later {
                    batches.push(batch);
                }
                pos = next;
            }
            Err(failure) => {
                let mut later = Vec::new();
                let mut checksum_only = failure.reason == CHECKSUM;
                // Look for whole batches beyond the failure. Only a `Start` tag can begin one.
                let mut at = pos + 1;
                // Damaged stretches: each one ends where a whole batch starts again.
                let mut gaps = 0u64;
                let mut in_gap = true;
                while at < bytes.len() {
                    let Some(off) = bytes
                        .get(at..)
                        .and_then(|b| b.iter().position(|&x| x == TAG_START))
                    else {
                        break;
                    };
                    let candidate = at + off;
                    in_gap |= off > 0;
                    match parse_batch(bytes, candidate) {
                        Ok((batch, next)) => {
                            later.push(batch);
                            at = next;
                            if in_gap {
                                gaps += 1;
                                in_gap = false;
                            }
                        }
                        Err(e) => {
                            checksum_only |= e.reason == CHECKSUM && e.whole;
                            at = candidate + 1;
                            in_gap = true;
                        }
                    }
                }
                let damaged = !later.is_empty() || (failure.whole && checksum_only);
                let count = later.len();
                return Scan {
                    path: PathBuf::new(),
                    batches,
                    unreadable_batches: if damaged { gaps.max(1) } else { 0 },
                    damage: damaged.then(|| Damage {
                        at: pos as u64,
                        reason: failure.reason,
                        later: if keep_later {
                            later
                        } else {
                            empty_batches(count)
                        },
                    }),
                };
            }
        }
    }
}

/// `count` placeholder batches, so a caller that did not keep the items still knows how many.
fn empty_batches(count: usize) -> Vec<Batch> {
    (0..count).map(|_| Batch { items: Vec::new() }).collect()
}

const CHECKSUM: &str = "a batch's checksum does not match its items";

struct Failure {
    reason: &'static str,
    /// The batch was complete (it had its `End` trailer) and still failed.
    whole: bool,
}

fn fail(reason: &'static str) -> Failure {
    Failure {
        reason,
        whole: false,
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Failure> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| fail("the file ends inside an entry"))?;
        let out = self
            .bytes
            .get(self.pos..end)
            .ok_or_else(|| fail("the file ends inside an entry"))?;
        self.pos = end;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, Failure> {
        Ok(self.take(1)?.first().copied().unwrap_or(0))
    }

    fn u16(&mut self) -> Result<u16, Failure> {
        let mut a = [0u8; 2];
        a.copy_from_slice(self.take(2)?);
        Ok(u16::from_le_bytes(a))
    }

    fn u32(&mut self) -> Result<u32, Failure> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }

    fn u64(&mut self) -> Result<u64, Failure> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
}

/// Parses the batch starting at `pos`: the batch and the offset after it.
fn parse_batch(bytes: &[u8], pos: usize) -> Result<(Batch, usize), Failure> {
    let mut r = Reader { bytes, pos };
    if r.u8()? != TAG_START {
        return Err(fail("an entry has an unknown tag"));
    }
    let count = r.u32()?;
    r.u64()?; // the seqno
    let mut hasher = Xxh3::new();
    let mut items = Vec::new();
    for _ in 0..count {
        let entry_start = r.pos;
        match r.u8()? {
            TAG_ITEM => {
                let value_type = r.u8()?;
                if value_type > 2 {
                    return Err(fail("an item has an unknown value type"));
                }
                if r.u8()? != 0 {
                    return Err(fail("an item is compressed (this store writes none)"));
                }
                r.u64()?; // the keyspace id
                let key_len = r.u16()?;
                let value_len = r.u32()?;
                let on_disk = r.u32()?;
                if value_len != on_disk {
                    return Err(fail("an item's lengths disagree"));
                }
                let key = r.take(usize::from(key_len))?.to_vec();
                let value = r.take(on_disk as usize)?.to_vec();
                items.push(Item {
                    value_type,
                    key,
                    value,
                });
            }
            TAG_CLEAR => {
                r.u64()?;
            }
            _ => return Err(fail("a batch holds an entry that is not an item")),
        }
        hasher.update(bytes.get(entry_start..r.pos).unwrap_or_default());
    }
    if r.u8()? != TAG_END {
        return Err(fail("a batch has more items than it announced"));
    }
    let checksum = r.u64()?;
    if r.take(4)? != MAGIC {
        return Err(fail("a batch's end marker is damaged"));
    }
    if hasher.digest() != checksum {
        return Err(Failure {
            reason: CHECKSUM,
            whole: true,
        });
    }
    Ok((Batch { items }, r.pos))
}

/// Refuses a records directory whose journals fjall would silently cut, or whose journal is
/// missing (even after a clean close, which leaves every record in tables: without a journal
/// fjall opens with a sequence number below its tables' items, so snapshots miss them and new
/// writes sort under old ones). `store` names the store in the message.
pub fn check_before_open(store: &Path, records: &Path) -> Result<()> {
    finish_interrupted_creation(store, records)?;
    if !records.join(VERSION).exists() {
        return Ok(()); // a new store
    }
    let files = journal_files(records)?;
    if files.is_empty() {
        return Err(Error::new(
            ErrorKind::Damaged,
            format!(
                "the store {} has no journal (no {}/*.jnl file): writes since the last flush are gone, and fjall would open the rest with its sequence numbers reset, hiding every record. Nothing was changed. Run `lessons --store {} doctor --salvage NEW_DIR` to copy every readable record into a new store",
                store.display(),
                records.display(),
                store.display()
            ),
        ));
    }
    for (_, path) in files {
        let scan = scan_file(&path, false)?;
        if let Some(d) = scan.damage {
            return Err(Error::new(
                ErrorKind::Damaged,
                format!(
                    "the journal {} is damaged at byte {} ({}); opening it would discard {} later batches of acknowledged writes. Nothing was changed. Run `lessons --store {} doctor --salvage NEW_DIR` to copy every readable record into a new store",
                    path.display(),
                    d.at,
                    d.reason,
                    d.later.len(),
                    store.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Empties every journal of a records directory, keeping the files. fjall replays its whole
/// active journal at every open and starts a new one only once it passes 64,000,000 bytes, so
/// without this an open reads back everything written since: up to 64 MB.
///
/// The caller guarantees that every batch in the journals is also in tables (every memtable
/// flushed) and that no write can start before fjall is dropped. The directory is then in the
/// state fjall's own rotation leaves once the old journal is flushed and deleted: one empty
/// active journal, everything in tables. On such a journal fjall takes its next sequence number
/// from the tables (a *missing* journal would make it start again at zero). A crash at any point
/// leaves either a full journal whose batches are all in tables, replayed as skips, or an empty
/// one. Returns the bytes the next open no longer reads.
pub fn empty_flushed(records: &Path) -> Result<u64> {
    let mut emptied = 0;
    for (_, path) in journal_files(records)? {
        let file = match std::fs::OpenOptions::new().write(true).open(&path) {
            Ok(f) => f,
            // fjall deletes a sealed journal once its batches are flushed, possibly just now.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(format!("opening {}", path.display()), e)),
        };
        let len = file
            .metadata()
            .map_err(|e| Error::io(format!("reading the size of {}", path.display()), e))?
            .len();
        if len == 0 {
            continue;
        }
        file.set_len(0)
            .and_then(|()| file.sync_all())
            .map_err(|e| Error::io(format!("emptying {}", path.display()), e))?;
        emptied += len;
    }
    Ok(emptied)
}

/// The path of journal `id` in `records`.
pub fn journal_path(records: &Path, id: u64) -> PathBuf {
    records.join(format!("{id}{JOURNAL_SUFFIX}"))
}

/// The active journal: the highest-numbered one.
pub fn active_journal(records: &Path) -> Result<(u64, PathBuf)> {
    journal_files(records)?.pop().ok_or_else(|| {
        Error::io(
            format!("finding the journal in {}", records.display()),
            std::io::Error::from(std::io::ErrorKind::NotFound),
        )
    })
}

/// Makes fjall's lock file exist again when a database holds its marker but lost the lock
/// (deleted, or left out by a copy): fjall would fail with "No such file or directory", or a
/// second process lock a fresh file. The caller holds the store directory's own lock, which is
/// what excludes other processes, so recreating fjall's file is safe.
pub fn restore_lock(records: &Path) -> Result<()> {
    let lock = records.join(LOCK);
    if records.join(VERSION).exists() && !lock.exists() {
        std::fs::File::create(&lock)
            .map_err(|e| Error::io(format!("recreating {}", lock.display()), e))?;
    }
    Ok(())
}

/// Makes a copy of a database's files openable by fjall: a lock file (a copy leaves it out),
/// a whole version marker, and an empty journal when the copy has none (fjall opens an existing
/// database only through its lock, and recovers rather than creates only with a whole marker).
/// Returns whether the copy had no journal. For salvage's work copy, never a live store.
pub fn make_openable(records: &Path) -> Result<bool> {
    std::fs::write(records.join(LOCK), [])
        .map_err(|e| Error::io("creating the work copy's lock file", e))?;
    let marker = records.join(VERSION);
    if !std::fs::metadata(&marker).is_ok_and(|m| m.len() >= 4) {
        std::fs::write(&marker, MAGIC)
            .map_err(|e| Error::io("writing the work copy's version marker", e))?;
    }
    let no_journal = journal_files(records)?.is_empty();
    if no_journal {
        std::fs::write(journal_path(records, 0), [])
            .map_err(|e| Error::io("creating an empty journal in the work copy", e))?;
    }
    Ok(no_journal)
}

/// Cuts a journal of a work copy at `at`, the start of its damage, so that fjall opens it.
pub fn cut_journal(path: &Path, at: u64) -> Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_len(at))
        .map_err(|e| Error::io(format!("cutting {}", path.display()), e))
}

/// Makes durable the names fjall and lsm-tree create without syncing their parent (see the
/// module docs): `records/keyspaces/`'s entries, `records/` in the store's directory. Run after
/// every open, before any write is acknowledged: the keyspaces are all created at open, and a
/// sync of a directory whose entries are already durable costs one fsync.
pub fn sync_names(store: &Path, records: &Path) -> Result<()> {
    crate::store::durable::sync_dir(&records.join(KEYSPACES))?;
    crate::store::durable::sync_dir(records)?;
    crate::store::durable::sync_dir(store)
}

/// fjall writes its version marker last when it creates a database, so a `records/` directory
/// without a whole marker is a creation that was cut short (a crash during the first open). No
/// write can have been acknowledged in it, so it is removed and created again, but only when it
/// holds no data at all: a marker deleted from a store that holds records is damage, refused.
fn finish_interrupted_creation(store: &Path, records: &Path) -> Result<()> {
    let marker = records.join(VERSION);
    let whole = std::fs::metadata(&marker).is_ok_and(|m| m.len() >= 4);
    if whole || !records.exists() {
        return Ok(());
    }
    let mut has_data = false;
    for (_, path) in journal_files(records)? {
        let scan = scan_file(&path, true)?;
        has_data |= !scan.batches.is_empty() || scan.damage.is_some();
    }
    if let Ok(entries) = std::fs::read_dir(records.join(KEYSPACES)) {
        for ks in entries.flatten() {
            if std::fs::read_dir(ks.path().join("tables")).is_ok_and(|mut t| t.next().is_some()) {
                has_data = true;
            }
        }
    }
    if has_data {
        return Err(Error::new(
            ErrorKind::Damaged,
            format!(
                "the store {} has records but its version marker {} is missing or cut short. Nothing was changed. Run `lessons --store {} doctor --salvage NEW_DIR` to copy every readable record into a new store",
                store.display(),
                marker.display(),
                store.display()
            ),
        ));
    }
    log::warn!(
        "[store] {}: its creation was interrupted before it held anything; creating it again",
        store.display()
    );
    std::fs::remove_dir_all(records)
        .map_err(|e| Error::io(format!("removing the unfinished {}", records.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Candidate, ScopeKey};
    use crate::store::{EmbeddedStore, MemoryStore, WriteOptions};

    /// The layout and format this module reads, as the pinned fjall and lsm-tree write them:
    /// when an upgrade moves a name or changes the journal's format, this fails first.
    #[test]
    fn a_new_database_has_the_layout_this_module_reads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = EmbeddedStore::open(dir.path()).expect("open");
        let scope = ScopeKey::parse("repo:acme/app").expect("scope");
        for i in 0..5 {
            let fact = Candidate::fact(format!("lesson {i}: run npm ci first"), "t");
            store
                .write(&scope, &[fact], &WriteOptions::default())
                .expect("write");
        }
        // A crash leaves every batch in the journal, where this module reads them.
        store.close_as_crash();
        let records = dir.path().join("records");
        assert_eq!(std::fs::read(records.join(VERSION)).expect("marker"), MAGIC);
        assert!(records.join(LOCK).is_file());
        let journals = journal_files(&records).expect("journals");
        assert_eq!(journals.first().map(|(id, _)| *id), Some(0));
        let (id, active) = active_journal(&records).expect("active");
        assert_eq!(active, journal_path(&records, id));
        let mut batches = 0;
        for (_, path) in &journals {
            let scan = scan_file(path, true).expect("scan");
            assert!(scan.damage.is_none(), "{path:?}: {:?}", scan.damage);
            batches += scan.batches.len();
        }
        assert!(batches >= 5, "every write's batch reads back: {batches}");
        let mut trees = Vec::new();
        for entry in std::fs::read_dir(records.join(KEYSPACES)).expect("keyspaces") {
            let path = entry.expect("entry").path();
            let id: u64 = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse().ok())
                .expect("a keyspace folder is its numeric id");
            assert!(path.join("tables").is_dir(), "{path:?}");
            assert!(path.join("current").is_file(), "{path:?}");
            trees.push(id);
        }
        trees.sort_unstable();
        assert_eq!(trees.first(), Some(&0), "fjall's meta keyspace");
        assert_eq!(trees.len(), 10, "the meta keyspace and the store's nine");
        assert!(
            finish_interrupted_creation(dir.path(), &records).is_ok(),
            "a whole marker is a finished creation"
        );
        check_before_open(dir.path(), &records).expect("whole journals pass the check");
        assert!(empty_flushed(&records).expect("empty") > 0);
    }

    fn item(ks: u64, key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut b = vec![TAG_ITEM, VALUE_TYPE_VALUE, 0];
        b.extend_from_slice(&ks.to_le_bytes());
        b.extend_from_slice(&(key.len() as u16).to_le_bytes());
        b.extend_from_slice(&(value.len() as u32).to_le_bytes());
        b.extend_from_slice(&(value.len() as u32).to_le_bytes());
        b.extend_from_slice(key);
        b.extend_from_slice(value);
        b
    }

    fn batch(seqno: u64, items: &[Vec<u8>]) -> Vec<u8> {
        let mut b = vec![TAG_START];
        b.extend_from_slice(&(items.len() as u32).to_le_bytes());
        b.extend_from_slice(&seqno.to_le_bytes());
        let mut h = Xxh3::new();
        for i in items {
            h.update(i);
            b.extend_from_slice(i);
        }
        b.push(TAG_END);
        b.extend_from_slice(&h.digest().to_le_bytes());
        b.extend_from_slice(&MAGIC);
        b
    }

    fn journal(n: u64) -> Vec<u8> {
        (0..n)
            .flat_map(|i| batch(i, &[item(3, format!("k{i}").as_bytes(), b"value")]))
            .collect()
    }

    #[test]
    fn emptying_keeps_every_journal_file_and_touches_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sealed, active) = (journal(3), journal(5));
        std::fs::write(dir.path().join("7.jnl"), &sealed).expect("write");
        std::fs::write(dir.path().join("8.jnl"), &active).expect("write");
        std::fs::write(dir.path().join("version"), b"FJL\x03").expect("write");
        let emptied = empty_flushed(dir.path()).expect("empty");
        assert_eq!(emptied, (sealed.len() + active.len()) as u64);
        for (_, path) in journal_files(dir.path()).expect("list") {
            let scan = scan_file(&path, true).expect("scan");
            assert!(scan.batches.is_empty() && scan.damage.is_none(), "{path:?}");
            assert_eq!(std::fs::metadata(&path).expect("kept").len(), 0);
        }
        assert_eq!(journal_files(dir.path()).expect("list").len(), 2);
        assert_eq!(
            std::fs::read(dir.path().join("version"))
                .expect("kept")
                .len(),
            4
        );
        assert_eq!(empty_flushed(dir.path()).expect("again"), 0);
    }

    #[test]
    fn a_clean_journal_and_its_zero_tail_are_whole() {
        let mut j = journal(5);
        j.extend_from_slice(&[0u8; 4096]);
        let s = scan_bytes(&j, false);
        assert!(s.damage.is_none());
    }

    #[test]
    fn a_torn_last_batch_is_not_damage() {
        let mut j = journal(5);
        let last = batch(9, &[item(3, b"key", b"a longer value")]);
        j.extend_from_slice(&last[..last.len() - 6]);
        let s = scan_bytes(&j, false);
        assert!(
            s.damage.is_none(),
            "a crash mid-append is an unacknowledged write"
        );
    }

    #[test]
    fn garbage_in_the_middle_is_damage_with_the_later_batches_counted() {
        let mut j = journal(10);
        let one = batch(0, &[item(3, b"k0", b"value")]).len();
        for b in j.iter_mut().skip(3 * one + 2).take(one) {
            *b = 0xab;
        }
        let s = scan_bytes(&j, true);
        let d = s.damage.expect("damage");
        assert_eq!(d.at, (3 * one) as u64);
        assert_eq!(d.later.len(), 5, "batches 5..10 are whole");
        assert_eq!(d.later[0].items[0].key, b"k5");
    }

    #[test]
    fn a_flipped_value_byte_is_a_checksum_failure_even_at_the_end() {
        let mut j = journal(3);
        let n = j.len();
        j[n - 15] ^= 1; // inside the last batch's value
        let s = scan_bytes(&j, false);
        let d = s.damage.expect("damage");
        assert_eq!(d.reason, CHECKSUM);
        assert_eq!(
            d.at,
            (batch(0, &[item(3, b"k0", b"value")]).len() * 2) as u64
        );
    }

    /// A deterministic stream of bytes over the whole range (a linear congruential generator's
    /// high byte).
    struct Bytes(u64);

    impl Bytes {
        fn next(&mut self) -> u8 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 56) as u8
        }

        fn below(&mut self, n: usize) -> usize {
            (u32::from_le_bytes([self.next(), self.next(), self.next(), 0]) as usize) % n.max(1)
        }

        fn vec(&mut self, len: usize) -> Vec<u8> {
            (0..len).map(|_| self.next()).collect()
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut rng = Bytes(7);
        for len in 0..600 {
            let bytes = rng.vec(len);
            let _ = scan_bytes(&bytes, true);
        }
    }

    /// Journals of whole batches (random keys and values over every byte), then damaged the ways
    /// a disk damages them: bytes replaced, the tail cut, garbage spliced in. None panics; an
    /// undamaged one reads whole; and the damaged ones reach every path of the reader: a whole
    /// batch whose trailer reads but whose checksum fails, whole batches found past damage, and
    /// a cut tail read as an unacknowledged write.
    #[test]
    fn damaged_journals_never_panic_and_reach_the_trailer_checks() {
        let mut rng = Bytes(11);
        let (mut whole, mut checksum, mut later, mut torn) = (0, 0, 0, 0);
        for case in 0..3000 {
            let batches = 1 + rng.below(6);
            let mut j = Vec::new();
            let mut items_in = Vec::new();
            for b in 0..batches {
                let count = rng.below(4);
                let items: Vec<Vec<u8>> = (0..count)
                    .map(|_| {
                        let key_len = 1 + rng.below(12);
                        let key = rng.vec(key_len);
                        let value_len = rng.below(40);
                        let value = rng.vec(value_len);
                        let keyspace = rng.below(9) as u64;
                        item(keyspace, &key, &value)
                    })
                    .collect();
                items_in.push(items.len());
                j.extend(batch(b as u64, &items));
            }
            let mutation = case % 4;
            match mutation {
                0 => {}
                1 => {
                    for _ in 0..1 + rng.below(3) {
                        let at = rng.below(j.len());
                        j[at] = rng.next();
                    }
                }
                2 => {
                    let keep = rng.below(j.len());
                    j.truncate(keep);
                }
                _ => {
                    let at = rng.below(j.len());
                    let len = 1 + rng.below(30);
                    let garbage = rng.vec(len);
                    j.splice(at..at, garbage);
                }
            }
            let s = scan_bytes(&j, true);
            if mutation == 0 {
                assert!(s.damage.is_none(), "case {case}: a whole journal is whole");
                let read: Vec<usize> = s.batches.iter().map(|b| b.items.len()).collect();
                assert_eq!(read, items_in, "case {case}: every item is read");
                whole += 1;
            }
            match &s.damage {
                Some(d) if d.reason == CHECKSUM => checksum += 1,
                Some(d) if !d.later.is_empty() => later += 1,
                None if mutation == 2 && s.batches.len() < batches => torn += 1,
                _ => {}
            }
            if let Some(d) = &s.damage {
                assert!(
                    d.at as usize <= j.len(),
                    "case {case}: damage inside the file"
                );
            }
        }
        assert!(
            whole > 0 && checksum > 0 && later > 0 && torn > 0,
            "paths reached: whole {whole}, checksum {checksum}, later {later}, torn {torn}"
        );
    }
}
