//! The file system's state: the live namespace and, per inode, what a power cut would keep
//! (see the parent module for the model). Every request is one call on [`State`] under its lock.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use fuser::{Errno, FileAttr, FileType, INodeNo, RenameFlags, Request};

use super::{Names, Trigger};

/// The attribute and entry timeout the kernel may cache for: every change comes through this
/// mount, whose kernel updates its own cache, so any timeout is exact; a short one keeps the
/// number of lookups low without letting a stale entry live long.
pub(super) const TTL: Duration = Duration::from_secs(1);
pub(super) const ROOT: u64 = 1;

/// Half-open byte ranges `[start, end)`, disjoint and not touching, by start.
#[derive(Default)]
pub(super) struct Ranges(pub(super) BTreeMap<u64, u64>);

impl Ranges {
    pub(super) fn insert(&mut self, mut start: u64, mut end: u64) {
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

pub(super) struct FileNode {
    /// The live length; the live backing file is always exactly this long.
    pub(super) size: u64,
    pub(super) live: File,
    /// Created at the first sync.
    pub(super) durable: Option<File>,
    pub(super) durable_len: u64,
    /// What was written since the last sync.
    pub(super) dirty: Ranges,
    /// The smallest length the file was cut to since the last sync: the durable bytes past it
    /// are stale even where nothing was written since.
    pub(super) shrunk_to: Option<u64>,
    /// Every live name: (directory, name).
    pub(super) links: Vec<(u64, OsString)>,
}

pub(super) struct DirNode {
    pub(super) entries: BTreeMap<OsString, u64>,
    pub(super) durable: BTreeMap<OsString, u64>,
    /// The live parent and name (the root: itself and "").
    pub(super) parent: u64,
    pub(super) name: OsString,
}

pub(super) enum Body {
    File(FileNode),
    Dir(DirNode),
}

pub(super) struct Node {
    pub(super) body: Body,
    pub(super) perm: u16,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) atime: SystemTime,
    pub(super) mtime: SystemTime,
    pub(super) ctime: SystemTime,
}

impl Node {
    pub(super) fn attr(&self, ino: u64) -> FileAttr {
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

pub(super) fn eio(_: io::Error) -> Errno {
    Errno::EIO
}

pub(super) struct State {
    pub(super) nodes: HashMap<u64, Node>,
    pub(super) next_ino: u64,
    pub(super) backing: PathBuf,
    pub(super) names: Names,
    pub(super) cut: bool,
    pub(super) trigger: Trigger,
    pub(super) counted: u64,
    /// Directory listings as of their `opendir`, by handle.
    pub(super) listings: HashMap<u64, Vec<(u64, FileType, OsString)>>,
    pub(super) next_fh: u64,
}

impl State {
    pub(super) fn node(&self, ino: u64) -> Result<&Node, Errno> {
        self.nodes.get(&ino).ok_or(Errno::ENOENT)
    }

    pub(super) fn node_mut(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        self.nodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    pub(super) fn dir(&self, ino: u64) -> Result<&DirNode, Errno> {
        match &self.node(ino)?.body {
            Body::Dir(d) => Ok(d),
            Body::File(_) => Err(Errno::ENOTDIR),
        }
    }

    pub(super) fn dir_mut(&mut self, ino: u64) -> Result<&mut DirNode, Errno> {
        match &mut self.node_mut(ino)?.body {
            Body::Dir(d) => Ok(d),
            Body::File(_) => Err(Errno::ENOTDIR),
        }
    }

    pub(super) fn file_mut(&mut self, ino: u64) -> Result<&mut FileNode, Errno> {
        match &mut self.node_mut(ino)?.body {
            Body::File(f) => Ok(f),
            Body::Dir(_) => Err(Errno::EISDIR),
        }
    }

    /// Refuses every request once the power is off.
    pub(super) fn powered(&self) -> Result<(), Errno> {
        if self.cut {
            Err(Errno::EIO)
        } else {
            Ok(())
        }
    }

    pub(super) fn is_dir(&self, ino: u64) -> bool {
        matches!(self.nodes.get(&ino).map(|n| &n.body), Some(Body::Dir(_)))
    }

    /// The live path of a directory, from the mount's root, without a leading or trailing `/`.
    pub(super) fn dir_path(&self, mut ino: u64) -> String {
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
    pub(super) fn entry_path(&self, dir: u64, name: &OsStr) -> String {
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
    pub(super) fn inode_path(&self, ino: u64) -> String {
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
    pub(super) fn applied(&mut self, at: &[(u64, Option<&OsStr>)]) {
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

    pub(super) fn new_node(&mut self, (uid, gid): (u32, u32), perm: u16, body: Body) -> u64 {
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

    pub(super) fn touch(&mut self, ino: u64) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            let now = SystemTime::now();
            n.mtime = now;
            n.ctime = now;
        }
    }

    pub(super) fn new_file(
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
    pub(super) fn drop_entry(&mut self, parent: u64, name: &OsStr) -> Result<u64, Errno> {
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
    pub(super) fn add_entry(&mut self, parent: u64, name: &OsStr, ino: u64) -> Result<(), Errno> {
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

    pub(super) fn rename(
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

    pub(super) fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let f = self.file_mut(ino)?;
        f.live.write_all_at(data, offset).map_err(eio)?;
        let end = offset + data.len() as u64;
        f.dirty.insert(offset, end);
        f.size = f.size.max(end);
        self.touch(ino);
        Ok(data.len() as u32)
    }

    pub(super) fn set_size(&mut self, ino: u64, size: u64) -> Result<(), Errno> {
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
    pub(super) fn sync_file(&mut self, ino: u64) -> Result<(), Errno> {
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
    pub(super) fn sync_dir(&mut self, ino: u64) -> Result<(), Errno> {
        let d = self.dir_mut(ino)?;
        d.durable = d.entries.clone();
        Ok(())
    }

    /// [`Names::Lenient`]: commits the names of `ino` and of every directory above it.
    pub(super) fn commit_names(&mut self, mut ino: u64) -> Result<(), Errno> {
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

    pub(super) fn fsync(&mut self, ino: u64) -> Result<(), Errno> {
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

    pub(super) fn entry_attr(&self, ino: u64) -> Result<FileAttr, Errno> {
        Ok(self.node(ino)?.attr(ino))
    }

    /// Writes the durable tree under `dir` into `to` (which must exist).
    pub(super) fn materialize(&self, dir: u64, to: &Path, depth: usize) -> io::Result<()> {
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

    pub(super) fn live_paths(&self, dir: u64, prefix: &str, out: &mut Vec<String>) {
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
