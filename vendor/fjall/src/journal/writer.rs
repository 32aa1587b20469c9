// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

use super::entry::{serialize_marker_item, Entry};
use crate::{
    batch::item::Item as BatchItem, file::fsync_directory, journal::recovery::JournalId,
    keyspace::InternalKeyspaceId,
};
use lsm_tree::{CompressionType, SeqNo, ValueType};
use std::{
    fs::{File, OpenOptions},
    hash::Hasher,
    io::{BufWriter, Seek, Write},
    path::{Path, PathBuf},
};

// TODO: this should be a database configuration
pub const PRE_ALLOCATED_BYTES: u64 = 64 * 1_024 * 1_024;

pub const JOURNAL_BUFFER_BYTES: usize = 8 * 1_024;

/// How many zeros of a spare journal are written before they are synced, and in each write
/// (a page; see [`Writer::prepare_spare`]). Each divides the next, and [`PRE_ALLOCATED_BYTES`].
///
/// A batch's `fdatasync` that arrives while zeros are on their way to the disk waits for them
/// too: the fewer in flight, the shorter that wait, and the more syncs the spare takes. With
/// 1 MiB, 64 KiB and 256 KiB, one durable write at a time to a store just restarted (its early
/// rotation's spare prepared meanwhile; `cargo bench --bench writes`, 3 runs each) had a p99 of
/// 1.73–1.97, 0.75–0.99 and 0.90–1.06 ms, and a p50 of 0.23–0.27, 0.39–0.42 and 0.25–0.31 ms.
const SPARE_ZEROS_PER_SYNC: u64 = 256 * 1_024;
const SPARE_ZEROS_PER_WRITE: usize = 4_096;

/// The next journal, created, sized and made durable ahead of a rotation (see
/// [`Writer::prepare_spare`]). Not a `.jnl` name, so recovery never takes it for a journal.
pub const SPARE_FILE_NAME: &str = "next-journal.spare";

/// The journal's size past which a flush rotates it.
const JOURNAL_ROTATION_BYTES: u64 = 64_000_000;

/// The size past which a journal whose blocks were not written out ahead (the first of a
/// database, sized as a hole, or one reopened after a restart and appended to) is rotated onto
/// a spare without waiting for a flush: until then each batch's `fdatasync` also makes the
/// blocks it allocated durable. Small, so a restarted store soon writes over blocks that exist;
/// not zero, so a database that only ever holds a little (a test's) never writes a spare.
const EARLY_ROTATION_BYTES: u64 = 1_024 * 1_024;

pub struct Writer {
    pub(crate) path: PathBuf,
    file: BufWriter<File>,
    buf: Vec<u8>,
    is_buffer_dirty: bool,

    /// Rotations so far that renamed a spare into place (see [`Writer::rotate_onto_spare`]),
    /// and how many of them a directory fsync is known to cover: the journal's name is durable
    /// only when the second has caught up with the first.
    renames: u64,
    renames_synced: u64,

    /// This file's blocks were written out before any batch went in (a spare); see
    /// [`EARLY_ROTATION_BYTES`] for the files that were not.
    preallocated: bool,
    /// A rotation of this file onto a spare was asked for before it reached the usual mark.
    early_rotation_asked: bool,

    compression: CompressionType,
    compression_threshold: usize,
}

/// The persist mode allows setting the durability guarantee of previous writes
#[derive(Copy, Clone, Debug, Eq, PartialEq)]
pub enum PersistMode {
    /// Flushes data to OS buffers. This allows the OS to write out data in case of an
    /// application crash.
    ///
    /// When this function returns, data is **not** guaranteed to be persisted in case
    /// of a power loss event or OS crash.
    Buffer,

    /// Flushes data using `fdatasync`.
    ///
    /// Use if you know that `fdatasync` is sufficient for your file system and/or operating system.
    SyncData,

    /// Flushes data + metadata using `fsync`.
    SyncAll,
}

impl Writer {
    pub fn set_compression(&mut self, comp: CompressionType, threshold: usize) {
        self.compression = comp;
        self.compression_threshold = threshold;
    }

    pub fn pos(&mut self) -> crate::Result<u64> {
        self.file.stream_position().map_err(Into::into)
    }

    pub fn len(&self) -> crate::Result<u64> {
        Ok(self.file.get_ref().metadata()?.len())
    }

    pub fn rotate(&mut self) -> crate::Result<(PathBuf, PathBuf)> {
        self.rotate_onto(None)
    }

    /// Whether a rotation is due: past the usual mark, or past [`EARLY_ROTATION_BYTES`] when
    /// this file's blocks were not written out ahead.
    pub(crate) fn rotation_due(&mut self) -> crate::Result<bool> {
        let pos = self.pos()?;
        Ok(pos > JOURNAL_ROTATION_BYTES || (!self.preallocated && pos > EARLY_ROTATION_BYTES))
    }

    /// True once per file, when a file whose blocks were not written out ahead has passed
    /// [`EARLY_ROTATION_BYTES`]: the caller asks a worker for the rotation, and calls
    /// [`Self::early_rotation_unasked`] if the request could not be sent.
    pub(crate) fn take_early_rotation(&mut self) -> crate::Result<bool> {
        if self.preallocated || self.early_rotation_asked {
            return Ok(false);
        }
        let due = self.pos()? > EARLY_ROTATION_BYTES;
        self.early_rotation_asked = due;
        Ok(due)
    }

    /// The request [`Self::take_early_rotation`] answered for was not sent: the next batch
    /// asks again.
    pub(crate) fn early_rotation_unasked(&mut self) {
        self.early_rotation_asked = false;
    }

    /// Creates the spare journal in `folder`, fsyncs it and the folder: what creating the next
    /// journal costs, paid before the writer's lock is taken. The caller keeps concurrent
    /// rotations out while it runs (`Journal::lock_spare`).
    ///
    /// A spare left from before is replaced, never reused: a power cut after a rotation renamed
    /// it, before the folder's fsync made the rename durable, can leave under the spare's name
    /// a file holding batches the OS wrote back, which a reused spare would carry into a later
    /// journal behind its new batches.
    pub fn prepare_spare(folder: &Path) -> crate::Result<PathBuf> {
        let path = folder.join(SPARE_FILE_NAME);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        let mut file = File::create_new(&path).inspect_err(|e| {
            log::error!("Failed to create spare journal at {}: {e:?}", path.display());
        })?;
        // Zeros, which the journal's reader takes as its end, written out rather than left as
        // a hole: a batch appended into a hole allocates its blocks, and the `fdatasync` that
        // makes it durable must then make the allocation durable too (a journaling file system
        // commits its journal, on ext4 in ordered mode after the data of every other file
        // allocated in the same transaction, such as a table being written; ext4 without a
        // journal writes the extent and bitmap blocks itself). Appended over blocks already
        // written, a batch's `fdatasync` writes its own bytes and flushes the disk's cache,
        // nothing more. The zeros are synced as they are written, a quarter MiB at a time, so
        // they never reach the disk as a burst that a journal's fsync would queue behind.
        //
        // The zeros go in a page at a time: a kernel that caches files in large folios (Linux
        // 6.x on ext4, for one) sizes a folio after the write that creates it, and a batch that
        // later changes a byte of it dirties the whole folio, which its `fdatasync` then writes
        // out. Measured on Linux 6.18: zeros written a MiB at a time made each 5 KB batch's
        // `fdatasync` write 1 MiB; a page at a time, 9 KiB.
        let zeros = [0u8; SPARE_ZEROS_PER_WRITE];
        let mut written = 0u64;
        while written < PRE_ALLOCATED_BYTES {
            file.write_all(&zeros)?;
            written += SPARE_ZEROS_PER_WRITE as u64;
            if written % SPARE_ZEROS_PER_SYNC == 0 {
                file.sync_data()?;
            }
        }
        file.sync_all()?;
        fsync_directory(folder)?;
        Ok(path)
    }

    /// [`Self::rotate`], taking the next journal from a spare that [`Self::prepare_spare`] made
    /// durable: under the writer's lock only the old journal's fsync and a rename remain. The
    /// rename is durable once the folder is fsynced, which [`Self::sync_names`] does after the
    /// lock is released, and every `persist` that syncs does first: nothing written to the new
    /// journal is reported durable before its name is.
    pub fn rotate_onto_spare(&mut self, spare: &Path) -> crate::Result<(PathBuf, PathBuf)> {
        self.rotate_onto(Some(spare))
    }

    /// The rotations whose renames are not yet known durable (`0`: none), to hand to
    /// [`Self::names_synced`] after an fsync of the folder.
    pub fn unsynced_names(&self) -> u64 {
        self.renames - self.renames_synced
    }

    /// The folder holding the journal.
    pub fn folder(&self) -> PathBuf {
        self.path
            .parent()
            .expect("should have parent")
            .to_path_buf()
    }

    /// Records that an fsync of the folder, started when `renames` rotations had renamed a
    /// spare, returned.
    pub fn names_synced(&mut self, renames: u64) {
        self.renames_synced = self.renames_synced.max(renames);
    }

    /// The rotations counted so far (see [`Self::names_synced`]).
    pub fn renames(&self) -> u64 {
        self.renames
    }

    /// Makes the journal's name durable if a rotation renamed it since the last fsync of the
    /// folder.
    fn sync_names(&mut self) -> std::io::Result<()> {
        if self.renames_synced < self.renames {
            fsync_directory(self.folder())?;
            self.renames_synced = self.renames;
        }
        Ok(())
    }

    fn rotate_onto(&mut self, spare: Option<&Path>) -> crate::Result<(PathBuf, PathBuf)> {
        self.persist(PersistMode::SyncAll)?;

        log::debug!(
            "Sealing active journal at {}, len={}B",
            self.path.display(),
            self.path
                .metadata()
                .inspect_err(|e| {
                    log::error!(
                        "Failed to get file metadata of journal file at {}: {e:?}",
                        self.path.display()
                    );
                })?
                .len(),
        );

        let prev_path = self.path.clone();

        let folder = self
            .path
            .parent()
            .expect("should have parent")
            .to_path_buf();

        let Some(basename) = self
            .path
            .file_name()
            .expect("should be valid file name")
            .to_str()
            .expect("should be valid utf-8")
            .strip_suffix(".jnl")
        else {
            log::error!("Invalid journal file name: {}", self.path.display());
            return Err(crate::Error::JournalRecovery(
                crate::JournalRecoveryError::InvalidFileName,
            ));
        };

        let journal_id = basename.parse::<JournalId>().map_err(|_| {
            log::error!("Invalid journal file name: {}", self.path.display());
            crate::Error::JournalRecovery(crate::JournalRecoveryError::InvalidFileName)
        })?;

        let new_path = folder.join(format!("{}.jnl", journal_id + 1));
        log::debug!("Rotating active journal to {}", new_path.display());

        let comp = self.compression;
        let compt = self.compression_threshold;
        let (renames, renames_synced) = (self.renames, self.renames_synced);

        if let Some(spare) = spare {
            // `rename` replaces a file of that name: none may exist, the journal ids only grow.
            if new_path.try_exists()? {
                log::error!("Journal file {} already exists", new_path.display());
                return Err(crate::Error::Io(std::io::Error::from(
                    std::io::ErrorKind::AlreadyExists,
                )));
            }
            let file = OpenOptions::new().write(true).open(spare)?;
            std::fs::rename(spare, &new_path).inspect_err(|e| {
                log::error!(
                    "Failed to rename spare journal {} to {}: {e:?}",
                    spare.display(),
                    new_path.display(),
                );
            })?;
            *self = Self::from_parts(new_path.clone(), file);
            self.preallocated = true;
            self.renames = renames + 1;
            self.renames_synced = renames_synced;
        } else {
            *self = Self::create_new(new_path.clone())?;
            self.renames = renames;
            self.renames_synced = renames_synced;

            // IMPORTANT: fsync folder on Unix
            fsync_directory(&folder)?;
        }
        self.set_compression(comp, compt);

        Ok((prev_path, new_path))
    }

    fn from_parts(path: PathBuf, file: File) -> Self {
        Self {
            path,
            file: BufWriter::with_capacity(JOURNAL_BUFFER_BYTES, file),
            buf: Vec::new(),
            is_buffer_dirty: false,
            renames: 0,
            renames_synced: 0,
            preallocated: false,
            early_rotation_asked: false,
            compression: CompressionType::None,
            compression_threshold: 0,
        }
    }

    pub fn create_new<P: Into<PathBuf>>(path: P) -> crate::Result<Self> {
        let path = path.into();

        let file = File::create_new(&path).inspect_err(|e| {
            log::error!("Failed to create journal file at {}: {e:?}", path.display());
        })?;

        file.set_len(PRE_ALLOCATED_BYTES).inspect_err(|e| {
            log::error!(
                "Failed to set journal file size to {PRE_ALLOCATED_BYTES}B at {}: {e:?}",
                path.display(),
            );
        })?;

        file.sync_all().inspect_err(|e| {
            log::error!("Failed to fsync journal file at {}: {e:?}", path.display());
        })?;

        Ok(Self {
            path,
            file: BufWriter::new(file),
            buf: Vec::new(),
            is_buffer_dirty: false,
            renames: 0,
            renames_synced: 0,
            preallocated: false,
            early_rotation_asked: false,
            compression: CompressionType::None,
            compression_threshold: 0,
        })
    }

    pub fn from_file<P: AsRef<Path>>(path: P) -> crate::Result<Self> {
        let path = path.as_ref();

        if !path.try_exists()? {
            let file = OpenOptions::new()
                .create_new(true)
                .write(true)
                .open(path)
                .inspect_err(|e| {
                    log::error!("Failed to create journal file at {}: {e:?}", path.display());
                })?;

            file.set_len(PRE_ALLOCATED_BYTES).inspect_err(|e| {
                log::error!(
                    "Failed to set journal file size to {PRE_ALLOCATED_BYTES}B at {}: {e:?}",
                    path.display(),
                );
            })?;

            file.sync_all().inspect_err(|e| {
                log::error!("Failed to fsync journal file at {}: {e:?}", path.display());
            })?;

            return Ok(Self {
                path: path.into(),
                file: BufWriter::with_capacity(JOURNAL_BUFFER_BYTES, file),
                buf: Vec::new(),
                is_buffer_dirty: false,
                renames: 0,
                renames_synced: 0,
                preallocated: false,
                early_rotation_asked: false,
                compression: CompressionType::None,
                compression_threshold: 0,
            });
        }

        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .inspect_err(|e| {
                log::error!("Failed to open journal file at {}: {e:?}", path.display());
            })?;

        Ok(Self {
            path: path.into(),
            file: BufWriter::with_capacity(JOURNAL_BUFFER_BYTES, file),
            buf: Vec::new(),
            is_buffer_dirty: false,
            renames: 0,
            renames_synced: 0,
            preallocated: false,
            early_rotation_asked: false,
            compression: CompressionType::None,
            compression_threshold: 0,
        })
    }

    /// A second handle of the journal file, to fsync it without holding the journal's lock
    /// (call `persist(Buffer)` first, so the buffered bytes are in the file).
    pub(crate) fn try_clone_file(&self) -> std::io::Result<File> {
        self.file.get_ref().try_clone()
    }

    /// Persists the journal file.
    pub(crate) fn persist(&mut self, mode: PersistMode) -> std::io::Result<()> {
        log::trace!(
            "Persisting journal at {} with mode={mode:?}",
            self.path.display(),
        );

        if self.is_buffer_dirty {
            self.file.flush().inspect_err(|e| {
                log::error!(
                    "Failed to flush journal IO buffers at {}: {e:?}",
                    self.path.display(),
                );
            })?;
            self.is_buffer_dirty = false;
        }

        if mode != PersistMode::Buffer {
            self.sync_names()?;
        }

        match mode {
            PersistMode::SyncAll => self.file.get_mut().sync_all().inspect_err(|e| {
                log::error!(
                    "Failed to fsync journal file at {}: {e:?}",
                    self.path.display(),
                );
            }),
            PersistMode::SyncData => self.file.get_mut().sync_data().inspect_err(|e| {
                log::error!(
                    "Failed to fsyncdata journal file at {}: {e:?}",
                    self.path.display(),
                );
            }),
            PersistMode::Buffer => Ok(()),
        }
    }

    /// Writes a batch start marker to the journal
    fn write_start(&mut self, item_count: u32, seqno: SeqNo) -> Result<usize, crate::Error> {
        debug_assert!(self.buf.is_empty());

        Entry::Start { item_count, seqno }.encode_into(&mut self.buf)?;

        self.file.write_all(&self.buf)?;

        Ok(self.buf.len())
    }

    /// Writes a batch end marker to the journal
    fn write_end(&mut self, checksum: u64) -> Result<usize, crate::Error> {
        debug_assert!(self.buf.is_empty());

        Entry::End(checksum).encode_into(&mut self.buf)?;

        self.file.write_all(&self.buf)?;

        Ok(self.buf.len())
    }

    pub(crate) fn write_raw(
        &mut self,
        keyspace_id: InternalKeyspaceId,
        key: &[u8],
        value: &[u8],
        value_type: ValueType,
        seqno: u64,
    ) -> crate::Result<usize> {
        self.is_buffer_dirty = true;

        let mut hasher = xxhash_rust::xxh3::Xxh3::default();
        let mut byte_count = 0;

        self.buf.clear();
        byte_count += self.write_start(1, seqno)?;
        self.buf.clear();

        serialize_marker_item(
            &mut self.buf,
            keyspace_id,
            key,
            value,
            value_type,
            if self.compression_threshold > 0 && value.len() >= self.compression_threshold {
                self.compression
            } else {
                CompressionType::None
            },
        )?;

        self.file.write_all(&self.buf)?;

        hasher.update(&self.buf);
        byte_count += self.buf.len();

        self.buf.clear();
        let checksum = hasher.finish();
        byte_count += self.write_end(checksum)?;

        Ok(byte_count)
    }

    pub(crate) fn write_clear(
        &mut self,
        keyspace_id: InternalKeyspaceId,
        seqno: SeqNo,
    ) -> crate::Result<usize> {
        self.is_buffer_dirty = true;

        let mut hasher = xxhash_rust::xxh3::Xxh3::default();
        let mut byte_count = 0;

        self.buf.clear();
        byte_count += self.write_start(1, seqno)?;
        self.buf.clear();

        Entry::Clear { keyspace_id }.encode_into(&mut self.buf)?;
        self.file.write_all(&self.buf)?;
        hasher.update(&self.buf);
        byte_count += self.buf.len();

        self.buf.clear();
        let checksum = hasher.finish();
        byte_count += self.write_end(checksum)?;

        Ok(byte_count)
    }

    pub fn write_batch<'a>(
        &mut self,
        items: impl Iterator<Item = &'a BatchItem>,
        batch_size: usize,
        seqno: SeqNo,
    ) -> crate::Result<usize> {
        if batch_size == 0 {
            return Ok(0);
        }

        self.is_buffer_dirty = true;

        self.buf.clear();

        // NOTE: entries.len() is surely never > u32::MAX
        #[expect(clippy::cast_possible_truncation)]
        let item_count = batch_size as u32;

        let mut hasher = xxhash_rust::xxh3::Xxh3::default();
        let mut byte_count = 0;

        byte_count += self.write_start(item_count, seqno)?;
        self.buf.clear();

        for item in items {
            debug_assert!(self.buf.is_empty());

            serialize_marker_item(
                &mut self.buf,
                item.keyspace.id,
                &item.key,
                &item.value,
                item.value_type,
                if self.compression_threshold > 0 && item.value.len() >= self.compression_threshold
                {
                    self.compression
                } else {
                    CompressionType::None
                },
            )?;

            self.file.write_all(&self.buf)?;

            hasher.update(&self.buf);
            byte_count += self.buf.len();

            self.buf.clear();
        }

        let checksum = hasher.finish();
        byte_count += self.write_end(checksum)?;

        Ok(byte_count)
    }
}
