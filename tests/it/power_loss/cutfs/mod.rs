//! `CutFs`: a FUSE file system that serves a live tree and keeps beside it exactly the tree a
//! power cut would leave, then cuts the power at a chosen point.
//!
//! The live namespace is held in memory (directories as maps of names to inodes); file contents
//! live in backing files `<backing>/live/<ino>`. The durable state is kept per inode, as a disk
//! with a volatile cache behaves under POSIX (the model of LazyFS and of ALICE):
//! - a file's durable content is its content as of its last `fsync`/`fdatasync` (a file never
//!   synced is empty), kept in `<backing>/durable/<ino>`; a sync copies only the byte ranges
//!   written since the one before it and sets the durable length to the live length;
//! - a directory's durable entries are its entries as of its last `fsync` (`FSYNCDIR`); one never
//!   synced is empty. So under [`Names::Strict`] a new name, a rename and an unlink survive only
//!   once the parent directory is synced; the root is the disk itself and is there from the
//!   start, its entries following the same rule.
//!
//! A cut freezes the durable state and answers `EIO` to every later request: the power is off,
//! so no later fsync succeeds, and whatever a process acknowledges after the cut rests on syncs
//! made before it. [`CutFs::materialize`] then writes the durable tree into an ordinary directory.
//!
//! Requests are served by one thread (fuser's session loop) under one lock, so each request is
//! atomic, a check-then-act included (`RENAME_NOREPLACE`), and a cut ordered by the test thread
//! falls between two requests. Locks (`flock`, `fcntl`) are left to the kernel, which keeps them
//! locally when the file system does not claim them; the writeback cache is never asked for, so
//! every `write(2)` reaches this file system as it happens, and the page cache stays on (tantivy
//! reads through mmap).

mod fuse;
mod state;

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{BackgroundSession, MountOption};
use parking_lot::Mutex;

use fuse::Fs;
use state::{Body, DirNode, Node, State, ROOT};

/// How names become durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Names {
    /// POSIX as written: a name is durable once its directory is fsynced, and only then.
    Strict,
    /// What ext4 (with its journal) and XFS do in practice as well: a sync of a file or a
    /// directory also commits that inode's names, as their metadata journal would: each live
    /// name of it becomes durable, names it no longer has are dropped, and the same for every
    /// directory above it up to the root.
    Lenient,
}

/// When the power goes out on its own.
#[derive(Clone, Debug)]
pub enum Trigger {
    /// Only when [`CutFs::cut`] is called; mutations are still counted (all of them).
    Manual,
    /// Once `n` counted mutations have been applied (the n-th is the last that succeeds). A
    /// mutation counts when it touches a path starting with `prefix` (a directory's path ends
    /// with `/`, so `store/index/` counts the directory `store/index` itself), every mutation
    /// when `prefix` is `None`. Mutations: create, mknod, mkdir, unlink, rmdir, rename, link,
    /// write, a size change, fallocate, fsync, fsyncdir.
    AfterOps { n: u64, prefix: Option<String> },
}

/// A mounted [`CutFs`] session; unmounted when dropped (also while a failing test unwinds).
pub struct CutFs {
    state: Arc<Mutex<State>>,
    session: Option<BackgroundSession>,
    mountpoint: PathBuf,
}

impl CutFs {
    /// Mounts an empty file system at `mountpoint`, keeping its contents under `backing`
    /// (created; both must be on an ordinary file system). Needs root and `/dev/fuse`.
    pub fn mount(mountpoint: &Path, backing: &Path, names: Names) -> io::Result<CutFs> {
        std::fs::create_dir_all(mountpoint)?;
        std::fs::create_dir_all(backing.join("live"))?;
        std::fs::create_dir_all(backing.join("durable"))?;
        let now = SystemTime::now();
        let root = Node {
            body: Body::Dir(DirNode {
                entries: BTreeMap::new(),
                durable: BTreeMap::new(),
                parent: ROOT,
                name: OsString::new(),
            }),
            perm: 0o755,
            uid: 0,
            gid: 0,
            atime: now,
            mtime: now,
            ctime: now,
        };
        let state = Arc::new(Mutex::new(State {
            nodes: HashMap::from([(ROOT, root)]),
            next_ino: ROOT + 1,
            backing: backing.to_owned(),
            names,
            cut: false,
            trigger: Trigger::Manual,
            counted: 0,
            listings: HashMap::new(),
            next_fh: 1,
        }));
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            MountOption::FSName("lessons-cutfs".into()),
            MountOption::Subtype("cutfs".into()),
            MountOption::RW,
            MountOption::NoDev,
            MountOption::NoSuid,
        ];
        let session = fuser::spawn_mount(Fs(Arc::clone(&state)), mountpoint, &config)?;
        Ok(CutFs {
            state,
            session: Some(session),
            mountpoint: mountpoint.to_owned(),
        })
    }

    /// Restarts the count of mutations and sets what cuts the power.
    pub fn arm(&self, trigger: Trigger) {
        let mut st = self.state.lock();
        st.counted = 0;
        st.trigger = trigger;
    }

    /// Mutations counted since the last [`CutFs::arm`].
    pub fn counted(&self) -> u64 {
        self.state.lock().counted
    }

    /// Cuts the power now (between two requests); false if it was already off.
    pub fn cut(&self) -> bool {
        let mut st = self.state.lock();
        !std::mem::replace(&mut st.cut, true)
    }

    pub fn is_cut(&self) -> bool {
        self.state.lock().cut
    }

    /// Writes the durable tree into `to` (created; must not exist).
    pub fn materialize(&self, to: &Path) -> io::Result<()> {
        std::fs::create_dir(to)?;
        self.state.lock().materialize(ROOT, to, 0)
    }

    /// Every live path (directories with a trailing `/`), as the mount shows it now.
    pub fn live_paths(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.state.lock().live_paths(ROOT, "", &mut out);
        out
    }
}

impl Drop for CutFs {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            if session.umount_and_join().is_err() {
                // Busy (a process still inside it): detach it lazily, so a failing test never
                // leaves a mount behind; the kernel ends the session once the last user leaves.
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(&self.mountpoint)
                    .status();
            }
        }
    }
}
