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
//! A loss found at open is recorded in `damaged` at once, so it outlives whatever later moves a
//! witness (an index rebuilt after it was damaged, a store whose housekeeping adds batches):
//! only `doctor --repair` (which accepts it) or a salvage into a new store ends it.
//!
//! **Invariant:** a witness is only ever a lower bound of what the journal held, so a store that
//! lost nothing is never refused.
//! **Invariant:** no witness moves backwards: `clean-close` and `next-ids` are rewritten only
//! to raise them, and the index's mark is left untouched while a loss stands.

use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::error::{Error, ErrorKind, Result};
use crate::model::ScopeKey;
use crate::store::durable;
use crate::store::index::Mark;

const CLEAN_CLOSE: &str = "clean-close";
const DAMAGED: &str = "damaged";
const CLEAN_CLOSE_HEADER: &str = "lessons clean close, format 1";
const NEXT_IDS: &str = "next-ids";
const NEXT_IDS_HEADER: &str = "lessons next ids, format 1";
const DAMAGED_HEADER: &str = "lessons damage, format 1";
const INDEX_WITNESS: &str = "the keyword index";
const CLOSE_WITNESS: &str = "the last clean close";

/// What the store knows of lost and damaged data: what refuses writes, and which ids were ever
/// acknowledged.
pub(super) struct Witnesses {
    dir: PathBuf,
    /// Set when the store can prove it lost acknowledged writes, or holds data that does not
    /// read: every write is refused with what happened and what to do.
    damage: Mutex<Option<Damage>>,
    /// The witness of acknowledged ids, as last written (see [`NextIds`]).
    next_ids: Mutex<NextIds>,
    /// The last batch the last clean close recorded, as last written.
    clean_close: Mutex<Option<u64>>,
}

impl Witnesses {
    /// The witnesses of the store in `dir`, whose records end at batch `recovered` and whose
    /// index's last commit carried `index`: what an earlier process recorded, and a loss the
    /// witnesses prove now, which is recorded before this returns.
    pub(super) fn open(dir: &Path, recovered: u64, index: Option<Mark>) -> Result<Witnesses> {
        let clean_close = read_clean_close(dir)?;
        let next_ids = read_next_ids(dir)?;
        let damage = match read_marker(dir)? {
            Some(d) => Some(d),
            None => {
                let lost = lost_writes(recovered, index, clean_close);
                if let Some(d) = &lost {
                    write_marker(dir, d)?;
                }
                lost
            }
        };
        if let Some(d) = &damage {
            log::error!("[store] {}", d.describe(dir));
        }
        Ok(Witnesses {
            dir: dir.to_owned(),
            damage: Mutex::new(damage),
            next_ids: Mutex::new(next_ids),
            clean_close: Mutex::new(clean_close),
        })
    }

    /// Records a clean close that left the records at `last_batch`, every batch persisted.
    /// The record only rises: a store that lost writes ends below what the record says, and
    /// lowering it would erase the evidence.
    pub(super) fn closed_cleanly(&self, last_batch: u64) -> Result<()> {
        let mut recorded = self.clean_close.lock();
        if recorded.is_some_and(|r| r >= last_batch) {
            return Ok(());
        }
        write_clean_close(&self.dir, last_batch)?;
        *recorded = Some(last_batch);
        Ok(())
    }

    /// The first sequence number of `scope` no acknowledged write has used, as far as the
    /// witness of acknowledged ids knows (0 when it names nothing of it).
    pub(super) fn next_id(&self, scope: &ScopeKey) -> u64 {
        self.next_ids
            .lock()
            .get(scope.as_str())
            .copied()
            .unwrap_or(0)
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

    /// Records that the store's data does not read, here and for every later process. A loss
    /// already recorded stays the damage on record: a repair must accept it before anything.
    pub(super) fn found_unreadable(&self, what: String) -> Result<()> {
        let mut damage = self.damage.lock();
        if matches!(&*damage, Some(Damage::Lost { .. })) {
            return Ok(());
        }
        let found = Damage::Unreadable(what);
        write_marker(&self.dir, &found)?;
        *damage = Some(found);
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

    /// The loss was accepted (every lost id is reserved, durably): writes are taken again.
    pub(super) fn loss_accepted(&self) -> Result<()> {
        let mut damage = self.damage.lock();
        clear_marker(&self.dir)?;
        *damage = None;
        Ok(())
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
    durable::replace_file(
        dir,
        CLEAN_CLOSE,
        format!("{CLEAN_CLOSE_HEADER}\nlast batch {last_batch}\n").as_bytes(),
    )
}

/// The damage an earlier process recorded, if it is still recorded. A file without the header
/// is an earlier build's record of unreadable data: its text says what.
pub(crate) fn read_marker(dir: &Path) -> Result<Option<Damage>> {
    let path = dir.join(DAMAGED);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
    };
    let Some(body) = text.strip_prefix(DAMAGED_HEADER).map(str::trim) else {
        return Ok(Some(Damage::Unreadable(text.trim().to_owned())));
    };
    if let Some(what) = body.strip_prefix("unreadable ") {
        return Ok(Some(Damage::Unreadable(what.to_owned())));
    }
    let lost = body.strip_prefix("lost ").and_then(|rest| {
        let mut parts = rest.splitn(3, ' ');
        let recovered = parts.next()?.parse().ok()?;
        let witnessed = parts.next()?.parse().ok()?;
        let witness = match parts.next()? {
            INDEX_WITNESS => INDEX_WITNESS,
            CLOSE_WITNESS => CLOSE_WITNESS,
            _ => return None,
        };
        Some(Damage::Lost {
            recovered,
            witnessed,
            witness,
        })
    });
    lost.map(Some).ok_or_else(|| {
        Error::format(format!(
            "{} is not a record of damage this build reads; it says the store lost data or holds data that does not read: keep it, and run `lessons --store {} doctor`",
            path.display(),
            dir.display()
        ))
    })
}

/// Records damage for every later process.
pub(crate) fn write_marker(dir: &Path, damage: &Damage) -> Result<()> {
    let body = match damage {
        Damage::Lost {
            recovered,
            witnessed,
            witness,
        } => format!("lost {recovered} {witnessed} {witness}"),
        // One line: the reader takes the rest of the file as the description.
        Damage::Unreadable(what) => format!("unreadable {}", what.replace('\n', " ")),
    };
    durable::replace_file(
        dir,
        DAMAGED,
        format!("{DAMAGED_HEADER}\n{body}\n").as_bytes(),
    )
}

/// Forgets a recorded damage (a check found every value readable, or a loss was accepted).
pub(crate) fn clear_marker(dir: &Path) -> Result<()> {
    durable::remove_file(dir, DAMAGED)
}

/// The damage a reopened store can prove: its records end at a batch before the last one a
/// witness saw.
fn lost_writes(recovered: u64, index: Option<Mark>, clean_close: Option<u64>) -> Option<Damage> {
    let from_index = index.and_then(|m| m.batch).map(|s| (s, INDEX_WITNESS));
    let from_close = clean_close.map(|s| (s, CLOSE_WITNESS));
    let (witnessed, witness) = [from_index, from_close]
        .into_iter()
        .flatten()
        .max_by_key(|(s, _)| *s)?;
    (recovered < witnessed).then_some(Damage::Lost {
        recovered,
        witnessed,
        witness,
    })
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
    durable::replace_file(dir, NEXT_IDS, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loss_found_at_open_is_recorded_and_the_clean_close_never_falls() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_clean_close(dir.path(), 15).expect("write");
        let w = Witnesses::open(dir.path(), 4, None).expect("open");
        assert!(w.damaged());
        w.closed_cleanly(5).expect("close");
        assert_eq!(read_clean_close(dir.path()).expect("read"), Some(15));
        // The record outlives the witness that proved it.
        std::fs::remove_file(dir.path().join(CLEAN_CLOSE)).expect("remove");
        let again = Witnesses::open(dir.path(), 5, None).expect("reopen");
        assert!(matches!(
            again.refuse_if_damaged().map_err(|e| e.kind()),
            Err(ErrorKind::Damaged)
        ));
        assert_eq!(again.acceptable_loss().expect("a loss"), Some(15));
        again.loss_accepted().expect("accept");
        assert!(!again.damaged());
        assert_eq!(read_marker(dir.path()).expect("read"), None);
        again.closed_cleanly(16).expect("close");
        assert_eq!(read_clean_close(dir.path()).expect("read"), Some(16));
    }

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
        let unreadable =
            Damage::Unreadable("a block of the decision journal\ndoes not read".into());
        write_marker(dir.path(), &unreadable).expect("write");
        assert!(matches!(
            read_marker(dir.path()).expect("read"),
            Some(Damage::Unreadable(w)) if w == "a block of the decision journal does not read"
        ));
        for witness in [INDEX_WITNESS, CLOSE_WITNESS] {
            let lost = Damage::Lost {
                recovered: 4,
                witnessed: 15,
                witness,
            };
            write_marker(dir.path(), &lost).expect("write");
            assert_eq!(read_marker(dir.path()).expect("read"), Some(lost));
        }
        // An earlier build's marker is free text, read as what does not read.
        std::fs::write(dir.path().join(DAMAGED), "a table's footer is torn\n").expect("write");
        assert!(matches!(
            read_marker(dir.path()).expect("read"),
            Some(Damage::Unreadable(w)) if w == "a table's footer is torn"
        ));
        std::fs::write(
            dir.path().join(DAMAGED),
            format!("{DAMAGED_HEADER}\nlost x\n"),
        )
        .expect("write");
        let e = read_marker(dir.path()).expect_err("a garbled record is not dropped");
        assert!(e.to_string().contains("keep it"), "{e}");
        clear_marker(dir.path()).expect("clear");
        clear_marker(dir.path()).expect("clear twice");
        assert_eq!(read_marker(dir.path()).expect("absent"), None);
    }
}
