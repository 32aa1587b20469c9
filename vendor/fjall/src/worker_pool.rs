// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

use crate::{
    compaction::worker::run as run_compaction, flush::worker::run as run_flush, poison::PoisonDart,
    stats::Stats, supervisor::Supervisor, Keyspace,
};
use lsm_tree::MemtableId;
use std::{
    borrow::Cow,
    sync::{
        atomic::{AtomicUsize, Ordering::Relaxed},
        Arc, Mutex,
    },
    thread::JoinHandle,
};

pub enum WorkerMessage {
    Flush,
    Compact(Keyspace),
    Close,
    RotateMemtable(Keyspace, MemtableId),
    /// Rotate the journal onto a spare if it is due (see `Writer::take_early_rotation`).
    RotateJournal,
}

impl std::fmt::Debug for WorkerMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}",
            match self {
                Self::Flush => Cow::Borrowed("WorkerMessage:Flush"),
                Self::Compact(k) => Cow::Owned(format!("WorkerMessage:Compact({:?})", k.name)),
                Self::Close => Cow::Borrowed("WorkerMessage:Close"),
                Self::RotateMemtable(k, memtable_id) =>
                    Cow::Owned(format!("WorkerMessage:Rotate({:?}, {memtable_id})", k.name)),
                Self::RotateJournal => Cow::Borrowed("WorkerMessage:RotateJournal"),
            }
        )
    }
}

type WorkerHandle = JoinHandle<Result<(), crate::Error>>;

pub struct WorkerPool {
    thread_handles: Mutex<Vec<WorkerHandle>>,
    pub(crate) rx: flume::Receiver<WorkerMessage>,
    pub(crate) sender: flume::Sender<WorkerMessage>,
}

impl WorkerPool {
    pub fn prepare() -> Self {
        let (sender, rx) = flume::bounded(1_000);

        Self {
            thread_handles: Mutex::default(),
            rx,
            sender,
        }
    }

    pub fn start(
        &self,
        pool_size: usize,
        supervisor: &Supervisor,
        stats: &Arc<Stats>,
        poison_dart: &PoisonDart,
        thread_counter: &Arc<AtomicUsize>,
    ) -> crate::Result<()> {
        log::debug!("Starting worker pool with {pool_size} threads");

        let thread_handles = claim_and_spawn(pool_size, thread_counter, |i| {
            std::thread::Builder::new()
                .name("fjall:worker".to_string())
                .spawn({
                    log::trace!("Starting fjall worker thread #{i}");

                    let worker_state = WorkerState {
                        pool_size,
                        worker_id: i,
                        rx: self.rx.clone(),
                        supervisor: supervisor.clone(),
                        stats: stats.clone(),
                        sender: self.sender.clone(),
                    };

                    let thread_counter = thread_counter.clone();
                    let poison_dart = poison_dart.clone();

                    move || {
                        // The counter must drop on *every* way out of this
                        // thread, not just the graceful one: `Database::drop`
                        // spins on it (`while counter > 0`), so a worker that
                        // returns an error or unwinds would keep the database
                        // closing forever.
                        let _counter_guard = ActiveThreadGuard(thread_counter);

                        loop {
                            match worker_tick(&worker_state) {
                                Ok(should_abort) => {
                                    if should_abort {
                                        log::debug!("Worker #{i} closes because DB is dropping");
                                        return Ok(());
                                    }
                                }
                                Err(e) => {
                                    log::error!("Worker #{i} crashed: {e:?}");
                                    poison_dart.poison();
                                    return Err(e);
                                }
                            }
                        }
                    }
                })
        })?;

        *self.thread_handles.lock().expect("lock is poisoned") = thread_handles;

        Ok(())
    }
}

/// Claims one slot in the active thread counter per worker, immediately before
/// that worker is spawned, and hands the slot straight back if the spawn fails.
///
/// Claiming the whole pool up front would leak the slots of the workers that failed
/// spawn never reaches: nothing ever decrements them, because those threads do
/// not exist, and `DatabaseInner::drop` waits for the counter to reach zero.
///
/// The spawn is a parameter so the failure path can be tested without having to
/// exhaust the operating system's thread limit.
fn claim_and_spawn<H, S: FnMut(usize) -> std::io::Result<H>>(
    pool_size: usize,
    thread_counter: &Arc<AtomicUsize>,
    mut spawn: S,
) -> std::io::Result<Vec<H>> {
    (0..pool_size)
        .map(|i| {
            thread_counter.fetch_add(1, Relaxed);

            spawn(i).inspect_err(|_| {
                thread_counter.fetch_sub(1, Relaxed);
            })
        })
        .collect()
}

/// Decrements the pool's active thread counter when a worker thread leaves,
/// whatever the reason: graceful close, error return or unwinding panic.
///
/// `DatabaseInner::drop` waits for this counter to reach zero, so a leaked
/// increment makes closing the database hang forever.
struct ActiveThreadGuard(Arc<AtomicUsize>);

impl Drop for ActiveThreadGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

struct WorkerState {
    pool_size: usize,
    worker_id: usize,
    supervisor: Supervisor,
    rx: flume::Receiver<WorkerMessage>,
    sender: flume::Sender<WorkerMessage>,
    stats: Arc<Stats>,
}

/// Asks a worker to rotate the journal early, once, when `writer` says it is due (see
/// `Writer::take_early_rotation`); called by a commit under the journal's lock, after its
/// append. A request the queue refuses is asked again by the next commit. Never fails the
/// commit, whose batch is already in the journal: a position that cannot be read asks nothing,
/// and the rotation a flush runs past the usual mark still comes.
pub(crate) fn request_early_rotation(
    writer: &mut crate::journal::writer::Writer,
    sender: &flume::Sender<WorkerMessage>,
) {
    match writer.take_early_rotation() {
        Ok(true) => {
            if sender.try_send(WorkerMessage::RotateJournal).is_err() {
                writer.early_rotation_unasked();
            }
        }
        Ok(false) => {}
        Err(e) => log::warn!("journal position unknown, no early rotation asked: {e:?}"),
    }
}

/// Rotates the journal onto a spare if a rotation is due. With `for_flush`, a journal that is
/// not rotated has its bytes so far fsynced instead: a flush may read only what is durable.
fn rotate_journal_if_due(ctx: &WorkerState, for_flush: bool) -> crate::Result<()> {
    let journal = &ctx.supervisor.journal;

    // A rotation creates the next journal: a file, its size and two fsyncs, which
    // under the journal's lock every commit would wait for. So the next journal is
    // prepared first, as a spare, and the rotation under the lock only renames it.
    //
    // Only the holder of the spare lock rotates, so once it is held the journal's
    // position can only grow until it is released: a rotation found due here is still
    // due under the journal's lock, and every spare prepared is renamed. Looking before
    // taking the lock would not do: two workers could both see the same journal due, and
    // the second would prepare a spare after the first had rotated, then leave it.
    let folder = journal.get_writer()?.folder();
    let spare_guard = journal.lock_spare()?;
    let rotation_due = journal.get_writer()?.rotation_due()?;
    let spare = if rotation_due {
        let spare = crate::journal::writer::Writer::prepare_spare(&folder)?;
        // The rotation fsyncs the old journal under the lock, so that nothing in
        // the new one can outlive it; sync its bytes so far first, so that fsync
        // has only the last few to write.
        let old = {
            let mut journal_writer = journal.get_writer()?;
            journal_writer.persist(crate::PersistMode::Buffer)?;
            journal_writer.try_clone_file()?
        };
        old.sync_all()?;
        Some(spare)
    } else {
        None
    };

    // The journal's bytes so far, to fsync once the journal lock is released: every
    // commit takes that lock, so an fsync under it is a wait for every writer. And a
    // rotation's rename, made durable by an fsync of the folder, also after the lock.
    let mut journal_to_sync = None;
    let mut names_to_sync = None;

    {
        log::trace!("acquiring journal lock to maybe rotate journal");
        let mut journal_writer = journal.get_writer()?;

        // Without a spare (the journal passed the mark after it was looked at), the
        // rotation waits for the next flush rather than create a file under the lock.
        if let Some(spare) = spare.as_deref() {
            #[expect(clippy::expect_used)]
            let mut journal_manager = ctx
                .supervisor
                .journal_manager
                .write()
                .expect("lock is poisoned");

            let seqno_map = {
                #[expect(clippy::expect_used)]
                let keyspaces = ctx.supervisor.keyspaces.write().expect("lock is poisoned");

                ctx.supervisor.build_seqno_map(&keyspaces)
            };

            journal_manager.rotate_journal(&mut journal_writer, seqno_map, Some(spare))?;

            if journal_manager.disk_space_used()
                >= ctx.supervisor.db_config.max_journaling_size_in_bytes
            {
                let stragglers =
                    journal_manager.get_keyspaces_to_flush_for_oldest_journal_eviction();

                for keyspace in stragglers {
                    log::info!(
                        "Rotating {:?} to try to reduce journal size",
                        keyspace.name,
                    );
                    keyspace.request_rotation();
                }
            }
        } else if for_flush {
            // https://github.com/fjall-rs/fjall/issues/329
            //
            // Everything the sealed memtables hold was appended before the rotation
            // sealed them, so it is in this file: hand its bytes to the OS under the
            // lock, then fsync a second handle of the same file outside it. (Had the
            // journal rotated meanwhile, `rotate` fsynced the old file itself.)
            journal_writer.persist(crate::PersistMode::Buffer)?;
            journal_to_sync = Some(journal_writer.try_clone_file()?);
        }

        if journal_writer.unsynced_names() > 0 {
            names_to_sync = Some(journal_writer.renames());
        }
    }

    if let Some(file) = journal_to_sync {
        file.sync_all()?;
    }

    if let Some(renames) = names_to_sync {
        crate::file::fsync_directory(&folder)?;
        journal.get_writer()?.names_synced(renames);
    }
    drop(spare_guard);
    Ok(())
}

fn worker_tick(ctx: &WorkerState) -> crate::Result<bool> {
    let Ok(item) = ctx.rx.recv() else {
        return Ok(true);
    };

    log::trace!("Worker #{} got message: {item:?}", ctx.worker_id);

    match item {
        WorkerMessage::Close => {
            return Ok(true);
        }
        WorkerMessage::RotateMemtable(keyspace, memtable_id) => {
            log::trace!("acquiring journal lock");
            let journal_writer = keyspace.supervisor.journal.get_writer()?;
            keyspace.inner_rotate_memtable(journal_writer, memtable_id)?;
        }
        WorkerMessage::RotateJournal => rotate_journal_if_due(ctx, false)?,
        WorkerMessage::Flush => {
            let Some(task) = ctx.supervisor.flush_manager.dequeue() else {
                return Ok(false);
            };

            rotate_journal_if_due(ctx, true)?;

            run_flush(
                &task,
                &ctx.supervisor.write_buffer_size,
                &ctx.supervisor.snapshot_tracker,
                &ctx.stats,
            )?;

            for _ in 0..ctx.pool_size {
                ctx.sender
                    .try_send(WorkerMessage::Compact(task.keyspace.clone()))
                    .ok();
            }

            // The journals are deleted after the manager's lock is released (see
            // `JournalManager::take_flushed`).
            let flushed = ctx
                .supervisor
                .journal_manager
                .write()
                .expect("lock is poisoned")
                .take_flushed();
            crate::journal::manager::JournalManager::delete_journals(flushed)?;
        }
        WorkerMessage::Compact(keyspace) => {
            // NOTE: Let one worker prioritize flushing if there are pending flushes
            if ctx.pool_size > 1 && ctx.worker_id == 0 {
                ctx.sender.try_send(WorkerMessage::Compact(keyspace)).ok();
                return Ok(false);
            }

            run_compaction(&keyspace, &ctx.supervisor.snapshot_tracker, &ctx.stats)?;
        }
    }

    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AbstractTree, Database, KeyspaceCreateOptions};
    use test_log::test;

    // https://github.com/fjall-rs/fjall/pull/303
    #[test]
    fn keyspace_compact_after_startup() -> crate::Result<()> {
        let folder = tempfile::tempdir()?;

        {
            let db = Database::builder(&folder).open()?;

            let ks = db.keyspace("default", KeyspaceCreateOptions::default)?;

            ks.insert("a", "a")?;
            ks.rotate_memtable_and_wait()?;

            ks.insert("a", "a")?;
            ks.rotate_memtable_and_wait()?;

            ks.insert("a", "a")?;
            ks.rotate_memtable_and_wait()?;

            assert!(ks.tree.l0_run_count() > 0);
        }

        {
            let db = Database::builder(&folder)
                .worker_threads_unchecked(0)
                .open()?;

            assert_eq!(
                1,
                db.worker_pool.rx.len(),
                "worker message should be enqueued on startup",
            );
            let item = db.worker_pool.rx.try_recv().expect("should get message");
            assert!(
                matches!(item, WorkerMessage::Compact(_)),
                "worker message should be compaction request",
            );
        }

        Ok(())
    }

    /// Every worker that is actually spawned holds exactly one slot.
    #[test]
    fn claim_and_spawn_claims_one_slot_per_worker() {
        let counter = Arc::new(AtomicUsize::new(0));

        let handles = claim_and_spawn(3, &counter, |i| Ok::<_, std::io::Error>(i))
            .expect("all spawns succeed");

        assert_eq!(handles, vec![0, 1, 2]);
        assert_eq!(counter.load(Relaxed), 3);
    }

    /// A failed spawn releases its own slot and never claims one for the workers
    /// it did not get to. `DatabaseInner::drop` spins until the counter reaches
    /// zero, so a slot held by a thread that does not exist hangs the close
    /// forever.
    #[test]
    fn claim_and_spawn_counts_live_workers_only() {
        let counter = Arc::new(AtomicUsize::new(0));

        let result = claim_and_spawn(4, &counter, |i| {
            if i == 2 {
                Err(std::io::Error::other("cannot spawn thread"))
            } else {
                Ok(i)
            }
        });

        assert!(result.is_err());
        assert_eq!(
            counter.load(Relaxed),
            2,
            "only the two workers that started should hold a slot",
        );
    }

    /// A worker leaving normally releases its slot in the counter.
    #[test]
    fn active_thread_guard_decrements_on_scope_exit() {
        let counter = Arc::new(AtomicUsize::new(1));
        {
            let _guard = ActiveThreadGuard(counter.clone());
            assert_eq!(counter.load(Relaxed), 1);
        }
        assert_eq!(counter.load(Relaxed), 0);
    }

    /// A worker that returns an error releases its slot too: `Database::drop`
    /// spins until the counter reaches zero, so a leaked slot would hang the
    /// close forever.
    #[test]
    fn active_thread_guard_decrements_on_early_return() {
        let counter = Arc::new(AtomicUsize::new(1));

        fn failing_worker(counter: Arc<AtomicUsize>) -> Result<(), ()> {
            let _guard = ActiveThreadGuard(counter);
            Err(())
        }

        assert!(failing_worker(counter.clone()).is_err());
        assert_eq!(counter.load(Relaxed), 0);
    }

    /// A panicking worker releases its slot as well.
    #[test]
    fn active_thread_guard_decrements_on_panic() {
        let counter = Arc::new(AtomicUsize::new(1));
        let counter_in_thread = counter.clone();

        let outcome = std::thread::spawn(move || {
            let _guard = ActiveThreadGuard(counter_in_thread);
            panic!("worker crashed");
        })
        .join();

        assert!(outcome.is_err());
        assert_eq!(counter.load(Relaxed), 0);
    }
}
