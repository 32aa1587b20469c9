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

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, BackgroundSession, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

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

/// The attribute and entry timeout the kernel may cache for: every change comes through this
/// mount, whose kernel updates its own cache, so any timeout is exact; a short one keeps the
/// number of lookups low without letting a stale entry live long.
const TTL: Duration = Duration::from_secs(1);
const ROOT: u64 = 1;

/// Half-open byte ranges `[start, end)`, disjoint and not touching, by start.
#[derive(Default)]
struct Ranges(BTreeMap<u64, u64>);

impl Ranges {
    fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        // The ranges that overlap or touch [start, end), walked back from the last one that
        // starts at or before `end`: being disjoint, their ends fall as their starts do, so
        // the first one that ends before `start` ends the walk.
        let merged: Vec<(u64, u64)> = self
            .0
            .range(..=end)
            .rev()
            .take_while(|(_, &e)| e >= start)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in merged {
            self.0.remove(&s);
            start = start.min(s);
            end = end.max(e);
        }
        self.0.insert(start, end);
    }
}

struct FileNode {
    /// The live length; the live backing file is always exactly this long.
    size: u64,
    live: File,
    /// Created at the first sync.
    durable: Option<File>,
    durable_len: u64,
    /// What was written since the last sync.
    dirty: Ranges,
    /// The smallest length the file was cut to since the last sync: the durable bytes past it
    /// are stale even where nothing was written since.
    shrunk_to: Option<u64>,
    /// Every live name: (directory, name).
    links: Vec<(u64, OsString)>,
}

struct DirNode {
    entries: BTreeMap<OsString, u64>,
    durable: BTreeMap<OsString, u64>,
    /// The live parent and name (the root: itself and "").
    parent: u64,
    name: OsString,
}

enum Body {
    File(FileNode),
    Dir(DirNode),
}

struct Node {
    body: Body,
    perm: u16,
    uid: u32,
    gid: u32,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
}

impl Node {
    fn attr(&self, ino: u64) -> FileAttr {
        let (kind, size, nlink) = match &self.body {
            Body::File(f) => (FileType::RegularFile, f.size, f.links.len() as u32),
            Body::Dir(_) => (FileType::Directory, 4096, 2),
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            crtime: self.ctime,
            kind,
            perm: self.perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }
}

fn eio(_: io::Error) -> Errno {
    Errno::EIO
}

struct State {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    backing: PathBuf,
    names: Names,
    cut: bool,
    trigger: Trigger,
    counted: u64,
    /// Directory listings as of their `opendir`, by handle.
    listings: HashMap<u64, Vec<(u64, FileType, OsString)>>,
    next_fh: u64,
}

impl State {
    fn node(&self, ino: u64) -> Result<&Node, Errno> {
        self.nodes.get(&ino).ok_or(Errno::ENOENT)
    }

    fn node_mut(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    fn dir(&self, ino: u64) -> Result<&DirNode, Errno> {
        match &self.node(ino)?.body {
            Body::Dir(d) => Ok(d),
            Body::File(_) => Err(Errno::ENOTDIR),
        }
    }

    fn dir_mut(&mut self, ino: u64) -> Result<&mut DirNode, Errno> {
        match &mut self.node_mut(ino)?.body {
            Body::Dir(d) => Ok(d),
            Body::File(_) => Err(Errno::ENOTDIR),
        }
    }

    fn file_mut(&mut self, ino: u64) -> Result<&mut FileNode, Errno> {
        match &mut self.node_mut(ino)?.body {
            Body::File(f) => Ok(f),
            Body::Dir(_) => Err(Errno::EISDIR),
        }
    }

    /// Refuses every request once the power is off.
    fn powered(&self) -> Result<(), Errno> {
        if self.cut {
            Err(Errno::EIO)
        } else {
            Ok(())
        }
    }

    fn is_dir(&self, ino: u64) -> bool {
        matches!(self.nodes.get(&ino).map(|n| &n.body), Some(Body::Dir(_)))
    }

    /// The live path of a directory, from the mount's root, without a leading or trailing `/`.
    fn dir_path(&self, mut ino: u64) -> String {
        let mut parts = Vec::new();
        while ino != ROOT {
            match self.dir(ino) {
                Ok(d) => {
                    parts.push(d.name.to_string_lossy().into_owned());
                    ino = d.parent;
                }
                Err(_) => break,
            }
        }
        parts.reverse();
        parts.join("/")
    }

    /// The path of `name` in directory `dir` (with a trailing `/` when it names a directory).
    fn entry_path(&self, dir: u64, name: &OsStr) -> String {
        let base = self.dir_path(dir);
        let mut p = if base.is_empty() {
            name.to_string_lossy().into_owned()
        } else {
            format!("{base}/{}", name.to_string_lossy())
        };
        let is_dir = self
            .dir(dir)
            .ok()
            .and_then(|d| d.entries.get(name))
            .is_some_and(|&i| self.is_dir(i));
        if is_dir {
            p.push('/');
        }
        p
    }

    /// A live path of an inode (a file's first name; "" for a file with none left).
    fn inode_path(&self, ino: u64) -> String {
        match self.nodes.get(&ino).map(|n| &n.body) {
            Some(Body::Dir(_)) => {
                let p = self.dir_path(ino);
                if p.is_empty() {
                    p
                } else {
                    format!("{p}/")
                }
            }
            Some(Body::File(f)) => f
                .links
                .first()
                .map(|(d, n)| self.entry_path(*d, n))
                .unwrap_or_default(),
            None => String::new(),
        }
    }

    /// Counts an applied mutation that touched `at` (inodes, or entries of a directory) and
    /// cuts the power once the trigger's count is reached.
    fn applied(&mut self, at: &[(u64, Option<&OsStr>)]) {
        let (n, prefix) = match &self.trigger {
            Trigger::Manual => (u64::MAX, None),
            Trigger::AfterOps { n, prefix } => (*n, prefix.clone()),
        };
        let counts = match &prefix {
            None => true,
            Some(p) => at.iter().any(|(ino, name)| {
                let path = match name {
                    Some(name) => self.entry_path(*ino, name),
                    None => self.inode_path(*ino),
                };
                path.starts_with(p.as_str())
            }),
        };
        if counts {
            self.counted += 1;
            if self.counted >= n {
                self.cut = true;
            }
        }
    }

    fn new_node(&mut self, (uid, gid): (u32, u32), perm: u16, body: Body) -> u64 {
        let ino = self.next_ino;
        self.next_ino += 1;
        let now = SystemTime::now();
        self.nodes.insert(
            ino,
            Node {
                body,
                perm,
                uid,
                gid,
                atime: now,
                mtime: now,
                ctime: now,
            },
        );
        ino
    }

    fn touch(&mut self, ino: u64) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            let now = SystemTime::now();
            n.mtime = now;
            n.ctime = now;
        }
    }

    fn new_file(
        &mut self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        mode: u32,
    ) -> Result<u64, Errno> {
        if self.dir(parent)?.entries.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        let live = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(self.backing.join("live").join(ino.to_string()))
            .map_err(eio)?;
        let file = FileNode {
            size: 0,
            live,
            durable: None,
            durable_len: 0,
            dirty: Ranges::default(),
            shrunk_to: None,
            links: vec![(parent, name.to_owned())],
        };
        let ino = self.new_node(
            (req.uid(), req.gid()),
            (mode & 0o7777) as u16,
            Body::File(file),
        );
        self.dir_mut(parent)?.entries.insert(name.to_owned(), ino);
        self.touch(parent);
        self.applied(&[(parent, Some(name))]);
        Ok(ino)
    }

    /// Removes `name` from `parent`'s live entries, and the link from its inode.
    fn drop_entry(&mut self, parent: u64, name: &OsStr) -> Result<u64, Errno> {
        let ino = self
            .dir_mut(parent)?
            .entries
            .remove(name)
            .ok_or(Errno::ENOENT)?;
        if let Ok(f) = self.file_mut(ino) {
            if let Some(i) = f.links.iter().position(|(d, n)| *d == parent && n == name) {
                f.links.remove(i);
            }
        }
        self.touch(parent);
        Ok(ino)
    }

    /// Adds `name` → `ino` to `parent`'s live entries (the slot must be free).
    fn add_entry(&mut self, parent: u64, name: &OsStr, ino: u64) -> Result<(), Errno> {
        self.dir_mut(parent)?.entries.insert(name.to_owned(), ino);
        match &mut self.node_mut(ino)?.body {
            Body::File(f) => f.links.push((parent, name.to_owned())),
            Body::Dir(d) => {
                d.parent = parent;
                d.name = name.to_owned();
            }
        }
        self.touch(parent);
        Ok(())
    }

    fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let src = *self.dir(parent)?.entries.get(name).ok_or(Errno::ENOENT)?;
        let dst = self.dir(newparent)?.entries.get(newname).copied();
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return Err(Errno::EINVAL);
        }
        // A directory may not move below itself.
        if self.is_dir(src) {
            let mut up = newparent;
            loop {
                if up == src {
                    return Err(Errno::EINVAL);
                }
                if up == ROOT {
                    break;
                }
                up = self.dir(up)?.parent;
            }
        }
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            let dst = dst.ok_or(Errno::ENOENT)?;
            if self.is_dir(dst) {
                let mut up = parent;
                loop {
                    if up == dst {
                        return Err(Errno::EINVAL);
                    }
                    if up == ROOT {
                        break;
                    }
                    up = self.dir(up)?.parent;
                }
            }
            self.drop_entry(parent, name)?;
            self.drop_entry(newparent, newname)?;
            self.add_entry(parent, name, dst)?;
            self.add_entry(newparent, newname, src)?;
            return Ok(());
        }
        if let Some(dst) = dst {
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            if dst == src {
                // Two names of one file: POSIX says do nothing.
                return Ok(());
            }
            match (self.is_dir(src), self.is_dir(dst)) {
                (true, false) => return Err(Errno::ENOTDIR),
                (false, true) => return Err(Errno::EISDIR),
                (true, true) if !self.dir(dst)?.entries.is_empty() => return Err(Errno::ENOTEMPTY),
                _ => {}
            }
            self.drop_entry(newparent, newname)?;
        }
        self.drop_entry(parent, name)?;
        self.add_entry(newparent, newname, src)
    }

    fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let f = self.file_mut(ino)?;
        f.live.write_all_at(data, offset).map_err(eio)?;
        let end = offset + data.len() as u64;
        f.dirty.insert(offset, end);
        f.size = f.size.max(end);
        self.touch(ino);
        Ok(data.len() as u32)
    }

    fn set_size(&mut self, ino: u64, size: u64) -> Result<(), Errno> {
        let f = self.file_mut(ino)?;
        f.live.set_len(size).map_err(eio)?;
        if size < f.size {
            f.shrunk_to = Some(f.shrunk_to.map_or(size, |s| s.min(size)));
        }
        // Growing fills with zeros past the old length: past every durable byte that is still
        // current (see `sync_file`), so nothing is marked.
        f.size = size;
        self.touch(ino);
        Ok(())
    }

    /// Makes a file's live content its durable content.
    fn sync_file(&mut self, ino: u64) -> Result<(), Errno> {
        let durable_path = self.backing.join("durable").join(ino.to_string());
        let f = self.file_mut(ino)?;
        if f.durable.is_none() {
            f.durable = Some(
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&durable_path)
                    .map_err(eio)?,
            );
        }
        let Some(durable) = &f.durable else {
            return Err(Errno::EIO);
        };
        // Invariant: live bytes below `keep` that are not dirty equal the durable bytes (only
        // writes change bytes in place, and they are dirty; a shrink lowers `keep`); live bytes
        // at or past `keep` that are not dirty are zeros (the file grew into them by a size
        // change or a write past the end, after every shrink).
        let keep = f.durable_len.min(f.shrunk_to.unwrap_or(u64::MAX));
        durable.set_len(keep).map_err(eio)?;
        durable.set_len(f.size).map_err(eio)?;
        let mut buf = Vec::new();
        for (&start, &end) in &f.dirty.0 {
            let end = end.min(f.size);
            let mut at = start;
            while at < end {
                let n = (end - at).min(1 << 20) as usize;
                buf.resize(n, 0);
                f.live.read_exact_at(&mut buf, at).map_err(eio)?;
                durable.write_all_at(&buf, at).map_err(eio)?;
                at += n as u64;
            }
        }
        f.durable_len = f.size;
        f.dirty = Ranges::default();
        f.shrunk_to = None;
        Ok(())
    }

    /// A directory's live entries become its durable entries.
    fn sync_dir(&mut self, ino: u64) -> Result<(), Errno> {
        let d = self.dir_mut(ino)?;
        d.durable = d.entries.clone();
        Ok(())
    }

    /// [`Names::Lenient`]: commits the names of `ino` and of every directory above it.
    fn commit_names(&mut self, mut ino: u64) -> Result<(), Errno> {
        loop {
            if ino == ROOT {
                return Ok(());
            }
            let live: Vec<(u64, OsString)> = match &self.node(ino)?.body {
                Body::File(f) => f.links.clone(),
                Body::Dir(d) => vec![(d.parent, d.name.clone())],
            };
            for node in self.nodes.values_mut() {
                if let Body::Dir(d) = &mut node.body {
                    d.durable.retain(|_, i| *i != ino);
                }
            }
            for (dir, name) in &live {
                self.dir_mut(*dir)?.durable.insert(name.clone(), ino);
            }
            match live.first() {
                // A file's directories: the first one's chain (a file with two names in two
                // directories is not something the store makes).
                Some((dir, _)) => ino = *dir,
                None => return Ok(()),
            }
        }
    }

    fn fsync(&mut self, ino: u64) -> Result<(), Errno> {
        if self.is_dir(ino) {
            self.sync_dir(ino)?;
        } else {
            self.sync_file(ino)?;
        }
        if self.names == Names::Lenient {
            self.commit_names(ino)?;
        }
        self.applied(&[(ino, None)]);
        Ok(())
    }

    fn entry_attr(&self, ino: u64) -> Result<FileAttr, Errno> {
        Ok(self.node(ino)?.attr(ino))
    }

    /// Writes the durable tree under `dir` into `to` (which must exist).
    fn materialize(&self, dir: u64, to: &Path, depth: usize) -> io::Result<()> {
        // A directory moved into a synced directory while its old name was synced too can be
        // reached twice, never in a cycle deeper than the tree; the bound is a guard.
        if depth > 64 {
            return Ok(());
        }
        let Ok(d) = self.dir(dir) else {
            return Ok(());
        };
        for (name, &ino) in &d.durable {
            let path = to.join(name);
            match self.nodes.get(&ino).map(|n| &n.body) {
                Some(Body::Dir(_)) => {
                    std::fs::create_dir(&path)?;
                    self.materialize(ino, &path, depth + 1)?;
                }
                Some(Body::File(f)) => {
                    let mut out = File::create(&path)?;
                    if let Some(durable) = &f.durable {
                        let mut src = durable.try_clone()?;
                        src.seek(io::SeekFrom::Start(0))?;
                        let copied = io::copy(&mut src.take(f.durable_len), &mut out)?;
                        assert_eq!(
                            copied, f.durable_len,
                            "a durable file is as long as it says"
                        );
                    }
                }
                None => {}
            }
        }
        Ok(())
    }

    fn live_paths(&self, dir: u64, prefix: &str, out: &mut Vec<String>) {
        let Ok(d) = self.dir(dir) else {
            return;
        };
        for (name, &ino) in &d.entries {
            let path = format!("{prefix}{}", name.to_string_lossy());
            if self.is_dir(ino) {
                out.push(format!("{path}/"));
                self.live_paths(ino, &format!("{path}/"), out);
            } else {
                out.push(path);
            }
        }
    }
}

/// What fuser drives: the shared state, locked for each request.
struct Fs(Arc<Mutex<State>>);

/// Runs `f` on the state if the power is on, and replies with its error otherwise.
macro_rules! serve {
    ($self:ident, $reply:ident, |$st:ident| $body:expr) => {{
        let mut guard = $self.0.lock();
        let $st: &mut State = &mut guard;
        match $st.powered().and_then(|()| $body) {
            Ok(v) => v,
            Err(e) => {
                drop(guard);
                $reply.error(e);
                return;
            }
        }
    }};
}

impl Filesystem for Fs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let attr = serve!(self, reply, |st| {
            let ino = *st.dir(parent.0)?.entries.get(name).ok_or(Errno::ENOENT)?;
            st.entry_attr(ino)
        });
        reply.entry(&TTL, &attr, Generation(0));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let attr = serve!(self, reply, |st| st.entry_attr(ino.0));
        reply.attr(&TTL, &attr);
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let attr = serve!(self, reply, |st| {
            if let Some(size) = size {
                st.set_size(ino.0, size)?;
                st.applied(&[(ino.0, None)]);
            }
            let when = |t: TimeOrNow| match t {
                TimeOrNow::SpecificTime(t) => t,
                TimeOrNow::Now => SystemTime::now(),
            };
            let n = st.node_mut(ino.0)?;
            if let Some(mode) = mode {
                n.perm = (mode & 0o7777) as u16;
            }
            if let Some(uid) = uid {
                n.uid = uid;
            }
            if let Some(gid) = gid {
                n.gid = gid;
            }
            if let Some(t) = atime {
                n.atime = when(t);
            }
            if let Some(t) = mtime {
                n.mtime = when(t);
            }
            n.ctime = SystemTime::now();
            st.entry_attr(ino.0)
        });
        reply.attr(&TTL, &attr);
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        let attr = serve!(self, reply, |st| {
            // Regular files only: the store makes no device, fifo or socket.
            if mode & S_IFMT != S_IFREG {
                return Err(Errno::EPERM);
            }
            let ino = st.new_file(req, parent.0, name, mode)?;
            st.entry_attr(ino)
        });
        reply.entry(&TTL, &attr, Generation(0));
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let attr = serve!(self, reply, |st| {
            if st.dir(parent.0)?.entries.contains_key(name) {
                return Err(Errno::EEXIST);
            }
            let dir = DirNode {
                entries: BTreeMap::new(),
                durable: BTreeMap::new(),
                parent: parent.0,
                name: name.to_owned(),
            };
            let ino = st.new_node(
                (req.uid(), req.gid()),
                (mode & 0o7777) as u16,
                Body::Dir(dir),
            );
            st.dir_mut(parent.0)?.entries.insert(name.to_owned(), ino);
            st.touch(parent.0);
            st.applied(&[(parent.0, Some(name))]);
            st.entry_attr(ino)
        });
        reply.entry(&TTL, &attr, Generation(0));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        serve!(self, reply, |st| {
            let ino = *st.dir(parent.0)?.entries.get(name).ok_or(Errno::ENOENT)?;
            if st.is_dir(ino) {
                return Err(Errno::EISDIR);
            }
            st.drop_entry(parent.0, name)?;
            st.applied(&[(parent.0, Some(name))]);
            Ok(())
        });
        reply.ok();
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        serve!(self, reply, |st| {
            let ino = *st.dir(parent.0)?.entries.get(name).ok_or(Errno::ENOENT)?;
            if !st.dir(ino)?.entries.is_empty() {
                return Err(Errno::ENOTEMPTY);
            }
            st.drop_entry(parent.0, name)?;
            st.applied(&[(parent.0, Some(name))]);
            Ok(())
        });
        reply.ok();
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        serve!(self, reply, |st| {
            st.rename(parent.0, name, newparent.0, newname, flags)?;
            st.applied(&[(parent.0, Some(name)), (newparent.0, Some(newname))]);
            Ok(())
        });
        reply.ok();
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let attr = serve!(self, reply, |st| {
            if st.is_dir(ino.0) {
                return Err(Errno::EPERM);
            }
            if st.dir(newparent.0)?.entries.contains_key(newname) {
                return Err(Errno::EEXIST);
            }
            st.add_entry(newparent.0, newname, ino.0)?;
            st.applied(&[(newparent.0, Some(newname))]);
            st.entry_attr(ino.0)
        });
        reply.entry(&TTL, &attr, Generation(0));
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        serve!(self, reply, |st| st.node(ino.0).map(|_| ()));
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let data = serve!(self, reply, |st| {
            let f = st.file_mut(ino.0)?;
            let end = f.size.min(offset.saturating_add(u64::from(size)));
            let mut buf = vec![0u8; end.saturating_sub(offset) as usize];
            f.live.read_exact_at(&mut buf, offset).map_err(eio)?;
            Ok(buf)
        });
        reply.data(&data);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let n = serve!(self, reply, |st| {
            let n = st.write(ino.0, offset, data)?;
            st.applied(&[(ino.0, None)]);
            Ok(n)
        });
        reply.written(n);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        serve!(self, reply, |st| Ok(()));
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        serve!(self, reply, |st| st.fsync(ino.0));
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let fh = serve!(self, reply, |st| {
            let d = st.dir(ino.0)?;
            let mut list = vec![
                (ino.0, FileType::Directory, OsString::from(".")),
                (d.parent, FileType::Directory, OsString::from("..")),
            ];
            for (name, &i) in &d.entries {
                let kind = if st.is_dir(i) {
                    FileType::Directory
                } else {
                    FileType::RegularFile
                };
                list.push((i, kind, name.clone()));
            }
            let fh = st.next_fh;
            st.next_fh += 1;
            st.listings.insert(fh, list);
            Ok(fh)
        });
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let guard = self.0.lock();
        if guard.cut {
            drop(guard);
            return reply.error(Errno::EIO);
        }
        let Some(list) = guard.listings.get(&fh.0) else {
            drop(guard);
            return reply.error(Errno::EBADF);
        };
        for (i, (ino, kind, name)) in list.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        drop(guard);
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.0.lock().listings.remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        serve!(self, reply, |st| st.fsync(ino.0));
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        serve!(self, reply, |st| Ok(()));
        // A roomy disk: 64 GiB in 4 KiB blocks, a million inodes.
        reply.statfs(1 << 24, 1 << 24, 1 << 24, 1 << 20, 1 << 20, 4096, 255, 4096);
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        serve!(self, reply, |st| Ok(()));
        reply.error(Errno::NO_XATTR);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        serve!(self, reply, |st| Ok(()));
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        serve!(self, reply, |st| st.node(ino.0).map(|_| ()));
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let attr = serve!(self, reply, |st| {
            let ino = st.new_file(req, parent.0, name, mode)?;
            st.entry_attr(ino)
        });
        reply.created(
            &TTL,
            &attr,
            Generation(0),
            FileHandle(0),
            FopenFlags::empty(),
        );
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        const KEEP_SIZE: i32 = 1;
        serve!(self, reply, |st| {
            match mode {
                // Space is not modelled: only the length a plain fallocate may grow.
                0 => {
                    let end = offset.saturating_add(length);
                    if end > st.file_mut(ino.0)?.size {
                        st.set_size(ino.0, end)?;
                    }
                }
                KEEP_SIZE => {}
                _ => return Err(Errno::EOPNOTSUPP),
            }
            st.applied(&[(ino.0, None)]);
            Ok(())
        });
        reply.ok();
    }
}

/// `S_IFMT` and `S_IFREG` of `stat(2)`'s mode.
const S_IFMT: u32 = 0o170_000;
const S_IFREG: u32 = 0o100_000;

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

#[cfg(test)]
mod tests {
    use super::Ranges;

    #[test]
    fn ranges_merge_what_overlaps_or_touches() {
        let mut r = Ranges::default();
        r.insert(10, 20);
        r.insert(30, 40);
        r.insert(20, 25);
        r.insert(0, 5);
        assert_eq!(
            r.0.iter().map(|(&s, &e)| (s, e)).collect::<Vec<_>>(),
            [(0, 5), (10, 25), (30, 40)]
        );
        r.insert(4, 31);
        assert_eq!(
            r.0.iter().map(|(&s, &e)| (s, e)).collect::<Vec<_>>(),
            [(0, 40)]
        );
        r.insert(50, 50);
        assert_eq!(r.0.len(), 1);
    }
}
