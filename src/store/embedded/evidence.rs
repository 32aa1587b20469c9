//! What the store can prove about writes it lost, and the state that refuses writes once it has.
//!
//! Every batch the store commits is numbered, and carries its number in the `meta` keyspace
//! (`last batch`), so the records say how far they reach: the number of the last batch that
//! survived. Two witnesses outlive the records' journal, and each says how far it reached:
//! - every index commit carries the number of the last batch that was durable before it
//!   ([`crate::store::index::Mark`]);
//! - a clean close leaves `clean-close` in the store directory: the number of the last batch,
//!   after every batch was persisted.
//!
//! (fjall's own sequence numbers cannot serve: at open it recovers the highest one an item still
//! holds, and a flush drops tombstones, so it reads lower than what was written.) If the records
//! reach less far than a witness saw, batches that were durable are gone: the journal was cut or
//! replaced. The store then opens for reading only, names what happened and
//! points at `doctor --salvage`; a write would otherwise mint ids already acknowledged for the
//! lost records. Damage that `doctor` finds in the tables (a block that does not read) is kept
//! in a `damaged` file, so later processes refuse writes too until a check finds the store whole.
//!
//! **Invariant:** a witness is only ever a lower bound of what the journal held, so a store that
//! lost nothing is never refused.

use std::io::Write;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::error::{Error, ErrorKind, Result};

const CLEAN_CLOSE: &str = "clean-close";
const DAMAGED: &str = "damaged";
const CLEAN_CLOSE_HEADER: &str = "lessons clean close, format 1";
const NEXT_IDS: &str = "next-ids";
const NEXT_IDS_HEADER: &str = "lessons next ids, format 1";

/// What the store knows of lost and damaged data: what refuses writes, and which ids were ever
/// acknowledged.
pub(super) struct Witnesses {
    dir: PathBuf,
    /// Set when the store can prove it lost acknowledged writes, or holds data that does not
    /// read: every write is refused with what happened and what to do.
    damage: Mutex<Option<Damage>>,
    /// The witness of acknowledged ids, as last written (see [`NextIds`]).
    next_ids: Mutex<NextIds>,
}

impl Witnesses {
    /// The witnesses of the store in `dir`: the damage found at open, the ids read there.
    pub(super) fn new(dir: PathBuf, damage: Option<Damage>, next_ids: NextIds) -> Witnesses {
        if let Some(d) = &damage {
            log::error!("[store] {}", d.describe(&dir));
        }
        Witnesses {
            dir,
            damage: Mutex::new(damage),
            next_ids: Mutex::new(next_ids),
        }
    }

    /// Refuses a write to a store that lost acknowledged writes or holds unreadable data.
    pub(super) fn refuse_if_damaged(&self) -> Result<()> {
        match &*self.damage.lock() {
            Some(d) => Err(d.refusal(&self.dir)),
            None => Ok(()),
        }
    }

    pub(super) fn damaged(&self) -> bool {
        self.damage.lock().is_some()
    }

    /// What the store knows of its damage, as `doctor` prints it.
    pub(super) fn described(&self) -> Option<String> {
        self.damage.lock().as_ref().map(|d| d.describe(&self.dir))
    }

    /// Records that the store's data does not read, here and for every later process.
    pub(super) fn found_unreadable(&self, what: String) -> Result<()> {
        write_marker(&self.dir, &what)?;
        *self.damage.lock() = Some(Damage::Unreadable(what));
        Ok(())
    }

    /// Forgets unreadable data an earlier check recorded (it reads now: a file was restored).
    pub(super) fn unreadable_cleared(&self) -> Result<()> {
        let mut damage = self.damage.lock();
        if matches!(&*damage, Some(Damage::Unreadable(_))) {
            clear_marker(&self.dir)?;
            *damage = None;
        }
        Ok(())
    }

    /// The last batch a witness saw of a loss a repair may accept (`None`: no loss); data that
    /// does not read is refused, since only a salvage reads around it.
    pub(super) fn acceptable_loss(&self) -> Result<Option<u64>> {
        match &*self.damage.lock() {
            None => Ok(None),
            Some(Damage::Lost { witnessed, .. }) => Ok(Some(*witnessed)),
            Some(d @ Damage::Unreadable(_)) => Err(d.refusal(&self.dir)),
        }
    }

    /// The loss was accepted: writes are taken again.
    pub(super) fn loss_accepted(&self) {
        *self.damage.lock() = None;
    }

    /// The witness of acknowledged ids, as last written.
    pub(super) fn next_ids(&self) -> NextIds {
        self.next_ids.lock().clone()
    }

    /// Raises the witness of acknowledged ids to cover each scope's `highest` sequence number
    /// (written, once the journal is durable, ahead of the index commit that holds them).
    pub(super) fn witness<'a>(
        &self,
        highest: impl IntoIterator<Item = (&'a str, u64)>,
    ) -> Result<()> {
        let mut ids = self.next_ids.lock();
        let mut raised = false;
        for (scope, seq) in highest {
            let next = ids.entry(scope.to_owned()).or_default();
            if *next <= seq {
                *next = seq + 1;
                raised = true;
            }
        }
        if raised {
            write_next_ids(&self.dir, &ids)?;
        }
        Ok(())
    }
}

/// Why a store refuses writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Damage {
    /// The journal ends before a point a witness saw: acknowledged batches are gone.
    Lost {
        /// The last batch the records hold.
        recovered: u64,
        /// The last batch the witness saw.
        witnessed: u64,
        /// Which witness: "the keyword index" or "the last clean close".
        witness: &'static str,
    },
    /// Data that does not read (found by `doctor`, or recorded by an earlier process).
    Unreadable(String),
}

impl Damage {
    /// The refusal a write answers with: what happened and what to do.
    pub(crate) fn describe(&self, store: &Path) -> String {
        let store = store.display();
        match self {
            Damage::Lost {
                recovered,
                witnessed,
                witness,
            } => format!(
                "acknowledged writes are missing from the store {store}: its records end at batch {recovered}, but {witness} saw batches up to {witnessed}, so the journal was cut or replaced. Writes are refused so that no lost record's id is handed out again. Run `lessons --store {store} doctor` to list the lost ids, then `lessons --store {store} doctor --salvage NEW_DIR` to copy every readable record into a new store, or `lessons --store {store} doctor --repair` to accept the loss and continue in place (the lost ids are never reused)"
            ),
            Damage::Unreadable(what) => format!(
                "the store {store} is damaged ({what}). Writes are refused. Run `lessons --store {store} doctor --salvage NEW_DIR` to copy every readable record into a new store"
            ),
        }
    }

    /// The error a refused write returns.
    pub(crate) fn refusal(&self, store: &Path) -> Error {
        Error::new(ErrorKind::Damaged, self.describe(store))
    }
}

/// The last batch at the last clean close, if the store was ever closed cleanly by a build that
/// keeps this witness.
pub(crate) fn read_clean_close(dir: &Path) -> Result<Option<u64>> {
    let path = dir.join(CLEAN_CLOSE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
    };
    let mut lines = text.lines();
    let seqno = match (lines.next(), lines.next()) {
        (Some(CLEAN_CLOSE_HEADER), Some(line)) => line
            .strip_prefix("last batch ")
            .and_then(|n| n.parse::<u64>().ok()),
        _ => None,
    };
    match seqno {
        Some(s) => Ok(Some(s)),
        None => Err(Error::format(format!(
            "{} is not a clean-close record this build reads; delete it to open the store without it",
            path.display()
        ))),
    }
}

/// Records a clean close: the last batch, once every batch is on disk. Written to a temporary
/// file, synced, then renamed, so it is whole or absent.
pub(crate) fn write_clean_close(dir: &Path, last_batch: u64) -> Result<()> {
    write_atomically(
        dir,
        CLEAN_CLOSE,
        format!("{CLEAN_CLOSE_HEADER}\nlast batch {last_batch}\n").as_bytes(),
    )
}

/// What an earlier check found unreadable, if it is still recorded.
pub(crate) fn read_marker(dir: &Path) -> Result<Option<Damage>> {
    let path = dir.join(DAMAGED);
    match std::fs::read_to_string(&path) {
        Ok(t) => Ok(Some(Damage::Unreadable(t.trim().to_owned()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
    }
}

/// Records that the store's data does not read, for every later process.
pub(crate) fn write_marker(dir: &Path, what: &str) -> Result<()> {
    write_atomically(dir, DAMAGED, format!("{what}\n").as_bytes())
}

/// Forgets a recorded damage (a check found every value readable).
pub(crate) fn clear_marker(dir: &Path) -> Result<()> {
    match std::fs::remove_file(dir.join(DAMAGED)) {
        Ok(()) => sync_dir(dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(
            format!("removing {}", dir.join(DAMAGED).display()),
            e,
        )),
    }
}

/// Per scope, one past the highest sequence number any index commit has seen an operation on:
/// every id below it was acknowledged, whatever became of its record since (forgotten, swept,
/// superseded). The index holds only active records, so without this a forgotten record lost
/// with a cut journal would leave no trace, and its id could be handed out again.
pub(crate) type NextIds = std::collections::BTreeMap<String, u64>;

/// The witness of acknowledged ids (empty for a store written before it was kept).
pub(crate) fn read_next_ids(dir: &Path) -> Result<NextIds> {
    let path = dir.join(NEXT_IDS);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(NextIds::new()),
        Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
    };
    let mut lines = text.lines();
    let parsed = match lines.next() {
        Some(NEXT_IDS_HEADER) => lines
            .map(|line| {
                let (scope, next) = line.split_once('\t')?;
                Some((scope.to_owned(), next.parse::<u64>().ok()?))
            })
            .collect::<Option<NextIds>>(),
        _ => None,
    };
    parsed.ok_or_else(|| {
        Error::format(format!(
            "{} is not a record of acknowledged ids this build reads; delete it to open the store without it",
            path.display()
        ))
    })
}

/// Replaces the witness of acknowledged ids (whole or absent, as the clean close).
pub(crate) fn write_next_ids(dir: &Path, ids: &NextIds) -> Result<()> {
    let mut text = String::with_capacity(32 + ids.len() * 40);
    text.push_str(NEXT_IDS_HEADER);
    text.push('\n');
    for (scope, next) in ids {
        text.push_str(scope);
        text.push('\t');
        text.push_str(&next.to_string());
        text.push('\n');
    }
    write_atomically(dir, NEXT_IDS, text.as_bytes())
}

fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!("{name}.new"));
    let path = dir.join(name);
    let mut f = std::fs::File::create(&tmp)
        .map_err(|e| Error::io(format!("creating {}", tmp.display()), e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
    std::fs::rename(&tmp, &path)
        .map_err(|e| Error::io(format!("renaming {}", tmp.display()), e))?;
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format!("syncing {}", dir.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_close_round_trips_and_a_foreign_file_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(read_clean_close(dir.path()).expect("absent"), None);
        write_clean_close(dir.path(), 42).expect("write");
        assert_eq!(read_clean_close(dir.path()).expect("read"), Some(42));
        std::fs::write(dir.path().join(CLEAN_CLOSE), "something else").expect("write");
        let e = read_clean_close(dir.path()).expect_err("foreign");
        assert!(e.to_string().contains("clean-close"), "{e}");
    }

    #[test]
    fn the_damage_marker_is_kept_until_cleared() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(read_marker(dir.path()).expect("absent"), None);
        write_marker(dir.path(), "a block of the decision journal does not read").expect("write");
        assert!(matches!(
            read_marker(dir.path()).expect("read"),
            Some(Damage::Unreadable(w)) if w.contains("decision journal")
        ));
        clear_marker(dir.path()).expect("clear");
        clear_marker(dir.path()).expect("clear twice");
        assert_eq!(read_marker(dir.path()).expect("absent"), None);
    }
}
