//! Format upgrades: what a store written by an older format needs at open, and the steps
//! that bring it to the current one (`codec::STORE_FORMAT`). The steps that rewrite a part's
//! contents belong to its owner (the records' dedup keys, the decision journal's keys); the
//! order they run in, and when the format is marked, live here and nowhere else.
//!
//! **Invariant:** each step can be redone, and the format is marked only after all of them: an
//! upgrade cut short is finished at the next open. Before the first step writes, the format
//! reads `[current, from]`: a build that knows only `from` refuses the store rather than misread
//! what the steps have rewritten so far.

use std::path::Path;

use super::journal_texts;
use super::records::Records;
use super::shared::Shared;
use crate::error::{Error, Result};
use crate::store::codec;

/// What an older store needs at open to become the current format. Each step can be redone, so
/// the format is marked only after all of them.
#[derive(Clone, Copy, Default)]
pub(super) struct Upgrade {
    /// The format the store was written in.
    from: u8,
    /// Format 1: one dedup key per normalized text, rebuilt from the records.
    dedup_keys: bool,
    /// Formats 1 to 4: decision-journal entries re-keyed with their class (the event, or the
    /// never-used eviction's own byte).
    decision_keys: bool,
    /// Format 6: its write's entries that left their text to their record, marked as such
    /// (that format told them by their shape; formats 1 to 5 stored every entry whole).
    decision_texts: bool,
    /// Any older format: marked with the current one once the steps above are done. (Format 5
    /// needs no step: its journal entries hold their texts, which every later build reads.)
    mark: bool,
}

impl Upgrade {
    /// What the store at `records` needs to become the current format; a new store is marked
    /// with it, a newer one refused.
    pub(super) fn needed(records: &Records, dir: &Path) -> Result<Upgrade> {
        let upgrade = match records.format()?.as_deref() {
            Some([codec::STORE_FORMAT]) => Upgrade::default(),
            // An upgrade from `from` cut short: its steps are redone.
            Some(&[codec::STORE_FORMAT, from]) if (1..codec::STORE_FORMAT).contains(&from) => {
                Upgrade::of(from)
            }
            Some(&[from]) if (1..codec::STORE_FORMAT).contains(&from) => Upgrade::of(from),
            Some(v) => {
                return Err(Error::format(format!(
                    "the store {} has format version {:?}; this build reads versions 1 to {}",
                    dir.display(),
                    v,
                    codec::STORE_FORMAT
                )))
            }
            None => {
                records.mark_format()?;
                Upgrade::default()
            }
        };
        if upgrade.mark {
            log::info!(
                "[store] upgrading {} from format {} to format {}",
                dir.display(),
                upgrade.from,
                codec::STORE_FORMAT
            );
        }
        Ok(upgrade)
    }

    /// The steps a store of the older format `from` needs.
    fn of(from: u8) -> Upgrade {
        let steps = match from {
            1 => Upgrade {
                dedup_keys: true,
                decision_keys: true,
                ..Upgrade::default()
            },
            // Format 2 holds no usage entry: only its journal's keys change; format 4 keyed
            // never-used evictions as every eviction.
            2..=4 => Upgrade {
                decision_keys: true,
                ..Upgrade::default()
            },
            6 => Upgrade {
                decision_texts: true,
                ..Upgrade::default()
            },
            _ => Upgrade::default(),
        };
        Upgrade {
            from,
            mark: true,
            ..steps
        }
    }

    /// Runs the steps this store needs, then marks it with the current format.
    pub(super) fn apply(self, shared: &Shared) -> Result<()> {
        if self.dedup_keys || self.decision_keys || self.decision_texts {
            shared.records.mark_format_upgrading(self.from)?;
        }
        if self.dedup_keys {
            upgrade_dedup_keys(shared)?;
        }
        if self.decision_keys {
            let pass = shared.journal.rekey(&shared.group)?;
            if !self.finished(shared, &pass, "re-keyed by their class") {
                return Ok(());
            }
        }
        if self.decision_texts {
            let pass = shared
                .journal
                .mark_format6(&shared.records, &shared.group)?;
            if !self.finished(
                shared,
                &pass,
                "marked as leaving their text to their record",
            ) {
                return Ok(());
            }
        }
        if self.mark {
            // Last: an upgrade cut short is redone at the next open (each step is).
            shared.records.mark_format()?;
        }
        Ok(())
    }

    /// Logs what a pass over the journal `did` and answers whether it read all it needed. If
    /// not, the store still opens, so that `doctor` and `--salvage` can run, and the format
    /// stays pending: the next open tries the steps again, and a build of the older format
    /// refuses the half-upgraded store.
    fn finished(&self, shared: &Shared, pass: &journal_texts::Pass, did: &str) -> bool {
        log::info!("[store] {} decision-journal entries {did}", pass.changed);
        if !pass.whole {
            log::warn!(
                "[store] part of the decision journal of {} did not read; it stays as format {} \
                 wrote it until the next open: run lessons doctor",
                shared.dir.display(),
                self.from
            );
        }
        pass.whole
    }
}

/// Upgrades a version 1 store in place: its dedup keys (one per record, found by prefix
/// scans) are replaced by version 2's (one per normalized text, found by a point read),
/// then the format says 2. Interrupted, it starts over at the next open: the keys are
/// derived from the records.
fn upgrade_dedup_keys(s: &Shared) -> Result<()> {
    log::info!(
        "[store] upgrading {} to format {}: rebuilding its dedup keys",
        s.dir.display(),
        codec::STORE_FORMAT
    );
    s.records.clear_dedup_keys()?;
    let snapshot = s.records.snapshot();
    let wanted = s.records.wanted_dedup_keys(&snapshot, None)?;
    let mut batch = s.records.batch();
    let mut n = 0;
    for (k, seqs) in wanted {
        s.records.put_dedup_key(&mut batch, k, &seqs)?;
        n += 1;
        if n % 10_000 == 0 {
            let full = std::mem::replace(&mut batch, s.records.batch());
            s.group.append_durably(full, "upgrading the dedup keys")?;
        }
    }
    s.group.append_durably(batch, "upgrading the dedup keys")
}
