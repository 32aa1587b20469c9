//! Names made durable: a directory created, a file replaced, a directory's entries synced.
//!
//! A power cut keeps a file's bytes once the file is fsynced, but its *name* (a new file or
//! directory, a rename, an unlink) only once the directory holding it is fsynced (strict POSIX;
//! ext4 and XFS often keep more, but nothing promises it). SQLite fsyncs the directory after
//! creating its journal, RocksDB after creating a WAL, a table or a MANIFEST; the store does the
//! same for every name a write depends on, when the name is made, never per write.
//!
//! **Invariant:** every function here returns only once what it created, replaced or removed
//! would survive a power cut.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// Makes the entries of `dir` durable: the names created, renamed or removed in it.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format!("syncing the directory {}", dir.display()), e))
}

/// Creates `dir` and any missing parent, each made durable in its own parent before the next
/// is created. An existing directory is left as it is, and nothing is synced for it.
pub(crate) fn create_dir(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir(parent)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        // Made by someone else meanwhile: whoever made it syncs its name.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => return Ok(()),
        Err(e) => return Err(Error::io(format!("creating {}", dir.display()), e)),
    }
    sync_dir(&parent_of(dir))
}

/// Replaces `dir/name` with `bytes`, whole or not at all: written to `name.new`, fsynced,
/// renamed over `name`, then the directory fsynced.
pub(crate) fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
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

/// Removes the file `dir/name` if it is there, durably.
pub(crate) fn remove_file(dir: &Path, name: &str) -> Result<()> {
    let path = dir.join(name);
    match std::fs::remove_file(&path) {
        Ok(()) => sync_dir(dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("removing {}", path.display()), e)),
    }
}

/// The directory whose entry names `path`: its parent, or the current directory for a
/// relative name of one component.
fn parent_of(path: &Path) -> std::path::PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => Path::new(".").to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creating_makes_every_missing_level_and_keeps_what_exists() {
        let root = tempfile::tempdir().expect("tempdir");
        let deep = root.path().join("a").join("b").join("c");
        create_dir(&deep).expect("create");
        assert!(deep.is_dir());
        std::fs::write(deep.join("f"), b"x").expect("write");
        create_dir(&deep).expect("again");
        assert_eq!(std::fs::read(deep.join("f")).expect("kept"), b"x");
        let file = root.path().join("a").join("file");
        std::fs::write(&file, b"x").expect("write");
        let e = create_dir(&file.join("below")).expect_err("a file is not a directory");
        assert!(e.to_string().contains("creating"), "{e}");
    }

    #[test]
    fn a_replaced_file_is_whole_and_a_removed_one_stays_removed() {
        let root = tempfile::tempdir().expect("tempdir");
        replace_file(root.path(), "w", b"one").expect("first");
        replace_file(root.path(), "w", b"two").expect("second");
        assert_eq!(std::fs::read(root.path().join("w")).expect("read"), b"two");
        assert!(!root.path().join("w.new").exists());
        remove_file(root.path(), "w").expect("remove");
        remove_file(root.path(), "w").expect("remove twice");
        assert!(!root.path().join("w").exists());
    }
}
