//! What fuser drives: each request served on [`State`] under its one lock, answered `EIO`
//! once the power is cut.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    AccessFlags, Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use parking_lot::Mutex;

use super::state::{eio, Body, DirNode, State, TTL};

/// What fuser drives: the shared state, locked for each request.
pub(super) struct Fs(pub(super) Arc<Mutex<State>>);

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
