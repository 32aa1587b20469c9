//! Where a decision-journal entry's text lives. A write's insertion or eviction entry leaves
//! its text to the record it names (`codec::encode_written_decision`, marked by its version
//! byte); every other entry holds its texts. This file hands such an entry its record's text on
//! every read, and owns what keeps the mark true: the format 6 upgrade that marks the entries
//! that format wrote unmarked, and `doctor`'s check (and `--repair`) of an entry whose record
//! is gone.
//!
//! **Invariant:** an entry is marked only when it was written in the batch of the record it
//! names, in this store; an entry imported or repaired is stored whole, with a text or without.

use fjall::{Database, Keyspace, Readable};

use super::group::GroupCommit;
use super::records::Records;
use crate::decisions::{Decision, DecisionEvent};
use crate::error::Result;
use crate::store::codec;
use crate::store::engine::st;

/// Where an entry stored without its text finds it: its record, read from a snapshot taken
/// after the entry was read. A record is written in the batch of the entries that name it and
/// never removed, so any such snapshot holds it.
pub(super) struct Texts<'a> {
    db: &'a Database,
    records: &'a Records,
    snapshot: Option<fjall::Snapshot>,
}

impl<'a> Texts<'a> {
    pub(super) fn new(db: &'a Database, records: &'a Records) -> Texts<'a> {
        Texts {
            db,
            records,
            snapshot: None,
        }
    }

    /// Gives `d`, decoded from `stored`, its record's text if it was stored without it. A
    /// record that is gone (lost to damage) leaves the entry without a text, and says so in the
    /// log; `doctor` reports it and `--repair` stores the entry whole.
    pub(super) fn restore(&mut self, stored: &[u8], d: &mut Decision) -> Result<()> {
        let Some(seq) = codec::text_record(stored, d) else {
            return Ok(());
        };
        match self.text(d, seq)? {
            Some(text) => d.texts.push(text),
            None => log::warn!(
                "[store] the journal entry of {} names a record the store does not hold; its text is lost",
                d.ids.join(", ")
            ),
        }
        Ok(())
    }

    fn text(&mut self, d: &Decision, seq: u64) -> Result<Option<String>> {
        let snapshot = self.snapshot.get_or_insert_with(|| self.db.snapshot());
        let retired = d.event == DecisionEvent::Evicted;
        self.records.text_at(snapshot, &d.scope_key, seq, retired)
    }
}

/// What an upgrade's pass over the decision journal did: the format 6 marking here, the re-keying
/// of formats 1 to 4 (`DecisionJournal::rekey`).
pub(super) struct Pass {
    /// Entries rewritten: marked as leaving their text to their record, or re-keyed.
    pub(super) changed: u64,
    /// Whether every entry the pass needed, and every record one named, read. An entry or a
    /// record that does not read (damage) is left as the older format wrote it, for `doctor` to
    /// report and `--salvage` to read around: a pass never makes an open fail that the older
    /// format's build would let through.
    pub(super) whole: bool,
}

impl Pass {
    pub(super) fn new() -> Pass {
        Pass {
            changed: 0,
            whole: true,
        }
    }

    /// What `read` read, or `None` with the pass no longer whole (the part that did not read
    /// is left as it is).
    pub(super) fn read<T, E>(&mut self, read: std::result::Result<T, E>) -> Option<T> {
        read.map_err(|_| self.whole = false).ok()
    }
}

/// Marks every entry a format 6 store wrote without its text, in durable batches: that format
/// had no mark, so an entry is told by its shape and by its record, whose creation it must
/// match (`codec::format6_written_with`; an entry imported without a text stays as it is). An
/// entry already marked is left, so a pass cut short is finished by the next open.
pub(super) fn mark_format6(
    db: &Database,
    entries: &Keyspace,
    records: &Records,
    group: &GroupCommit,
) -> Result<Pass> {
    let mut pass = Pass::new();
    let mut batch = db.batch();
    let mut in_batch = 0;
    for g in db.snapshot().iter(entries) {
        // A block that does not read: the entries past it are not reached either.
        let Some((k, v)) = pass.read(g.into_inner()) else {
            break;
        };
        let Some(d) = pass.read(codec::decode_decision(&v)) else {
            continue;
        };
        let Some(seq) = codec::format6_text_record(&v, &d) else {
            continue;
        };
        let written = pass
            .read(records.load_any(&d.scope_key, seq))
            .flatten()
            .is_some_and(|r| codec::format6_written_with(&d, &r));
        if !written {
            continue;
        }
        batch.insert(entries, k.to_vec(), codec::mark_text_in_record(v.to_vec()));
        pass.changed += 1;
        in_batch += 1;
        if in_batch == 10_000 {
            let full = std::mem::replace(&mut batch, db.batch());
            group.append_durably(full, "marking the decision journal's texts")?;
            in_batch = 0;
        }
    }
    group.append_durably(batch, "marking the decision journal's texts")?;
    Ok(pass)
}

/// Every entry marked as leaving its text to a record that the store does not hold, as
/// (key, entry), from one snapshot: the record was lost (only damage loses one), and with it
/// the entry's text.
pub(super) fn orphaned(
    db: &Database,
    entries: &Keyspace,
    records: &Records,
) -> Result<Vec<(Vec<u8>, Decision)>> {
    let snapshot = db.snapshot();
    let mut texts = Texts {
        db,
        records,
        snapshot: Some(snapshot.clone()),
    };
    let mut out = Vec::new();
    for g in snapshot.iter(entries) {
        let (k, v) = g.into_inner().map_err(st("reading the decision journal"))?;
        let d = codec::decode_decision(&v)?;
        let Some(seq) = codec::text_record(&v, &d) else {
            continue;
        };
        if texts.text(&d, seq)?.is_none() {
            out.push((k.to_vec(), d));
        }
    }
    Ok(out)
}

/// Stores every entry `orphaned` finds whole, without a text, so it no longer claims one:
/// its event, time, id and details stay. Returns how many it rewrote.
pub(super) fn repair_orphaned(
    db: &Database,
    entries: &Keyspace,
    records: &Records,
    group: &GroupCommit,
) -> Result<u64> {
    let orphans = orphaned(db, entries, records)?;
    let mut batch = db.batch();
    for (k, d) in &orphans {
        batch.insert(entries, k.clone(), codec::encode_decision(d)?);
    }
    group.append_durably(batch, "storing the journal entries of lost records whole")?;
    Ok(orphans.len() as u64)
}
