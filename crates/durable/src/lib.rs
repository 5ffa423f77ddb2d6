//! craterdex-durable: writes that a crash cannot half-apply.
//!
//! Owns: atomic file replacement (temporary sibling, fsync, rename) and atomic directory
//! replacement (complete sibling directory swapped in). Knows nothing of what is written.
//! Its only failures are file operations: [`IoError`] names the action and the path.

use craterdex_errors::IoContext;
pub use craterdex_errors::IoError;
use std::io::Write;
use std::path::{Path, PathBuf};

pub type Result<T> = std::result::Result<T, IoError>;

/// Replaces `path` with `bytes`: readers see the old file or the new one, never a mix.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).io("create", parent)?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(IoError::new("write", &tmp, e));
    }
    failpoint("durable-before-rename");
    std::fs::rename(&tmp, path).io("move into place", path)?;
    if let Some(parent) = path.parent() {
        sync_dir(parent);
    }
    Ok(())
}

/// Writes `bytes` to `path` directly: for files inside a directory that is built beside its
/// final place and moved there whole ([`tempdir_beside`], [`replace_dir`]).
pub fn write_new(path: &Path, bytes: impl AsRef<[u8]>) -> Result<()> {
    std::fs::write(path, bytes).io("write", path)
}

/// Creates `dir` and its parents.
pub fn create_dir_all(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).io("create", dir)
}

/// A fresh, empty directory beside `target` (same filesystem, so a rename is atomic).
pub fn tempdir_beside(target: &Path) -> Result<PathBuf> {
    let name = match target.file_name() {
        Some(n) => n.to_string_lossy().to_string(),
        None => {
            let why = std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name");
            return Err(IoError::new("write beside", target, why));
        }
    };
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).io("create", &parent)?;
    for attempt in 0..1000 {
        let tmp = parent.join(format!(".{name}.tmp-{}-{attempt}", std::process::id()));
        match std::fs::create_dir(&tmp) {
            Ok(()) => return Ok(tmp),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(IoError::new("create", &tmp, e)),
        }
    }
    let taken = std::io::Error::new(std::io::ErrorKind::AlreadyExists, "every name is taken");
    Err(IoError::new(
        "create a temporary directory beside",
        target,
        taken,
    ))
}

/// Flushes every file in `dir` and the directory itself to disk.
pub fn sync_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if let Ok(f) = std::fs::File::open(e.path()) {
                let _ = f.sync_all();
            }
        }
    }
    sync_dir(dir);
}

pub fn sync_dir(dir: &Path) {
    if let Ok(f) = std::fs::File::open(dir) {
        let _ = f.sync_all();
    }
}

/// Moves the complete directory `tmp` to `dir`. Where the platform can exchange two paths
/// atomically (Linux `renameat2(RENAME_EXCHANGE)`), readers and a crash see the old
/// directory or the new one at `dir`, never neither; the old one then lies at `tmp` and is
/// deleted. Elsewhere an old `dir` is moved aside first: a crash in the instant between the
/// two renames leaves it beside `dir` under a `.NAME.tmp-*` name.
pub fn replace_dir(tmp: &Path, dir: &Path) -> Result<()> {
    sync_tree(tmp);
    failpoint("durable-before-swap");
    if dir.exists() {
        if exchange(tmp, dir).is_ok() {
            failpoint("durable-after-swap");
            let _ = std::fs::remove_dir_all(tmp);
        } else {
            let old = tempdir_beside(dir)?;
            std::fs::remove_dir(&old).io("remove", &old)?;
            std::fs::rename(dir, &old).io("move aside", dir)?;
            std::fs::rename(tmp, dir).io("move new data into", dir)?;
            let _ = std::fs::remove_dir_all(&old);
        }
    } else {
        std::fs::rename(tmp, dir).io("move new data into", dir)?;
    }
    if let Some(parent) = dir.parent() {
        sync_dir(parent);
    }
    Ok(())
}

/// An exclusive advisory lock on a file (created if missing), held until dropped: how the
/// writers of one index (threads or processes) take turns. Readers never lock.
#[derive(Debug)]
pub struct FileLock {
    _file: std::fs::File,
}

fn lock_file(path: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .io("open the lock file", path)
}

/// Waits for the exclusive lock on `path`.
pub fn lock(path: &Path) -> Result<FileLock> {
    let file = lock_file(path)?;
    file.lock().io("lock", path)?;
    Ok(FileLock { _file: file })
}

/// The exclusive lock on `path` if no one holds it now.
pub fn try_lock(path: &Path) -> Result<Option<FileLock>> {
    let file = lock_file(path)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(FileLock { _file: file })),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(IoError::new("lock", path, e)),
    }
}

/// Swaps the two paths in one step.
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
    };
    let (a, b) = (c(a)?, c(b)?);
    // SAFETY: both pointers are NUL-terminated strings that outlive the call; the flags
    // are a valid renameat2 request.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn exchange(_: &Path, _: &Path) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// Aborts the process when `CRATERDEX_FAILPOINT` names this point: crash tests use it to
/// kill a writer at a precise moment. Only with the `failpoints` feature (which tests turn
/// on); in other builds it does nothing.
#[inline(always)]
pub fn failpoint(name: &str) {
    #[cfg(feature = "failpoints")]
    if std::env::var("CRATERDEX_FAILPOINT").is_ok_and(|v| v == name) {
        // printed, not logged: the crash tests read this line from the killed child's
        // stderr, where no log subscriber runs (a test-only feature; release builds lack it)
        eprintln!("failpoint {name}: aborting");
        std::process::abort();
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_is_refused_until_dropped() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("write.lock");
        let held = lock(&p).unwrap();
        assert!(try_lock(&p).unwrap().is_none());
        drop(held);
        let again = try_lock(&p).unwrap();
        assert!(again.is_some());
    }

    #[test]
    fn write_atomic_replaces_content() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a/b.txt");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(
            std::fs::read_dir(p.parent().unwrap()).unwrap().count(),
            1,
            "no temporary file left behind"
        );
    }

    #[test]
    fn replace_dir_swaps_whole_directories() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("idx");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("old"), b"x").unwrap();
        let tmp = tempdir_beside(&target).unwrap();
        std::fs::write(tmp.join("new"), b"y").unwrap();
        replace_dir(&tmp, &target).unwrap();
        assert!(target.join("new").exists() && !target.join("old").exists());
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }
}
