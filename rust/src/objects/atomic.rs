//! Atomic file writes, the one home for them (objects and materialized slot files): a temp file beside the
//! target (the `tempfile` crate: created exclusively, removed when dropped unless renamed), fsync, rename,
//! fsync the directory.
//!
//! CONTRACT: any failure removes the temp file, so readers see all of a file or nothing (`write_unpublished`
//! stops short of the rename, for a caller with a condition of its own: `Unpublished::publish` renames, a drop
//! removes); `durable = false` skips the fsyncs (a materialized file that is consumed at once, a cache).
//! Files get the mode a plain `File::create` gives (0o666 less the umask). `touch_now` refreshes a file's mtime
//! (the time gc's grace period counts from); `unique_suffix` is the random part of names that must not collide
//! (not temp files: quarantined copies, lock keys).

use std::fs::{File, Permissions};
use std::io::{self, IoSlice, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use tempfile::TempPath;

use super::ObjectError;

/// I/O threads of a batched write: fsyncs block, so more threads than cores keep the disk queue full.
const WRITE_THREADS: usize = 8;

/// How a temp file beside its target is named: `<prefix><random><suffix>`.
#[derive(Debug, Clone, Copy)]
pub struct TempName {
    pub prefix: &'static str,
    pub suffix: &'static str,
}

/// Temp files beside objects (`.tmp-*`, removed by gc once older than the grace period).
pub const OBJECT_TEMP: TempName = TempName { prefix: super::TEMP_PREFIX, suffix: "" };
/// Temp files beside materialized slot files (`.*.tmp`).
pub const FILE_TEMP: TempName = TempName { prefix: ".", suffix: ".tmp" };

/// 64 random bits as 16 hex digits.
pub fn unique_suffix() -> String {
    hex::encode(fastrand::u64(..).to_be_bytes())
}

pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A new temp file in `dir` holding `bytes`, fsynced if `durable`; removed when the returned path drops.
fn write_temp(dir: &Path, name: TempName, bytes: &[u8], durable: bool) -> Result<TempPath, ObjectError> {
    write_temp_pieces(dir, name, &[bytes], durable)
}

/// Most slices one `writev` takes (Linux's IOV_MAX).
const IOV_MAX: usize = 1024;

/// [`write_temp`] of `pieces` concatenated, written straight from them (`writev`: no copy into one buffer).
fn write_temp_pieces(dir: &Path, name: TempName, pieces: &[&[u8]], durable: bool) -> Result<TempPath, ObjectError> {
    let mut f = temp_in(dir, name)?;
    write_all_pieces(f.as_file_mut(), pieces).map_err(|e| ObjectError::io(f.path(), e))?;
    if durable {
        f.as_file().sync_all().map_err(|e| ObjectError::io(f.path(), e))?;
    }
    Ok(f.into_temp_path())
}

fn write_all_pieces(f: &mut File, pieces: &[&[u8]]) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = pieces.iter().filter(|p| !p.is_empty()).map(|p| IoSlice::new(p)).collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        match f.write_vectored(&rest[..rest.len().min(IOV_MAX)]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut rest, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Write `bytes` to `target` atomically: a temp file named by `temp` beside it, (fsync), rename, (fsync dir).
/// `check` runs alongside the write and must pass before the rename (a materialize checks the file hash).
pub fn atomic_write<E: From<ObjectError> + Send>(
    target: &Path,
    temp: TempName,
    bytes: &[u8],
    durable: bool,
    check: impl FnOnce() -> Result<(), E> + Send,
) -> Result<(), E> {
    atomic_write_pieces(target, temp, &[bytes], durable, check)
}

/// [`atomic_write`] of `pieces` concatenated (written with `writev`, never copied into one buffer).
pub fn atomic_write_pieces<E: From<ObjectError> + Send>(
    target: &Path,
    temp: TempName,
    pieces: &[&[u8]],
    durable: bool,
    check: impl FnOnce() -> Result<(), E> + Send,
) -> Result<(), E> {
    Ok(write_unpublished(target, temp, pieces, durable, check)?.publish()?)
}

/// Write `bytes` to `target` unless a file is there (not fsynced: a copy of what lives elsewhere, a cache's):
/// true if this call put it there; two writers of one target leave one file and only one of them says true.
pub fn write_new(target: &Path, temp: TempName, bytes: &[u8]) -> Result<bool, ObjectError> {
    let tmp = write_temp(parent_dir(target), temp, bytes, false)?;
    match tmp.persist_noclobber(target) {
        Ok(()) => Ok(true),
        Err(e) if e.error.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(ObjectError::io(target, e.error)),
    }
}

/// A file written and checked beside its target, not yet renamed into place: `publish` does that; dropped, it
/// is removed.
pub struct Unpublished {
    tmp: TempPath,
    target: PathBuf,
    durable: bool,
}

impl Unpublished {
    pub fn publish(self) -> Result<(), ObjectError> {
        self.tmp.persist(&self.target).map_err(|e| ObjectError::io(&self.target, e.error))?;
        if self.durable {
            let dir = parent_dir(&self.target);
            fsync_dir(dir).map_err(|e| ObjectError::io(dir, e))?;
        }
        Ok(())
    }
}

/// An empty temp file beside `target` (named by `temp`), to be filled in place (`pwrite`) and then made
/// [`Unpublished::filled`]; dropped, it is removed.
pub fn temp_beside(target: &Path, temp: TempName) -> Result<tempfile::NamedTempFile, ObjectError> {
    temp_in(parent_dir(target), temp)
}

fn temp_in(dir: &Path, temp: TempName) -> Result<tempfile::NamedTempFile, ObjectError> {
    tempfile::Builder::new()
        .prefix(temp.prefix)
        .suffix(temp.suffix)
        .rand_bytes(16)
        .permissions(Permissions::from_mode(0o666))
        .tempfile_in(dir)
        .map_err(|e| ObjectError::io(dir, e))
}

impl Unpublished {
    /// A temp file from [`temp_beside`], filled: fsynced if `durable`, ready to `publish` as `target`.
    pub fn filled(f: tempfile::NamedTempFile, target: &Path, durable: bool) -> Result<Self, ObjectError> {
        if durable {
            f.as_file().sync_all().map_err(|e| ObjectError::io(f.path(), e))?;
        }
        Ok(Unpublished { tmp: f.into_temp_path(), target: target.to_path_buf(), durable })
    }
}

/// The first half of [`atomic_write_pieces`]: the temp file written (fsynced if `durable`) with `check`
/// beside the write; a failed check removes it. For a caller with one more condition to wait for before the
/// file may appear (`store/materialize.rs`: that the name still points at the state written).
pub fn write_unpublished<E: From<ObjectError> + Send>(
    target: &Path,
    temp: TempName,
    pieces: &[&[u8]],
    durable: bool,
    check: impl FnOnce() -> Result<(), E> + Send,
) -> Result<Unpublished, E> {
    let (written, checked) = rayon::join(|| write_temp_pieces(parent_dir(target), temp, pieces, durable), check);
    let tmp = written?;
    checked?; // a failed check drops `tmp`, which removes it
    Ok(Unpublished { tmp, target: target.to_path_buf(), durable })
}

fn parent_dir(target: &Path) -> &Path {
    target.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Write many files atomically each, all durable when this returns Ok (their directories must exist).
/// `make(i)` produces file i's bytes on any of a few I/O threads (so producing the next file overlaps an
/// fsync); None skips it. Then every temp file (named by `temp`) is renamed and each touched directory
/// fsynced once. Returns the bytes written per file; on any failure no temp file is left behind.
#[allow(clippy::type_complexity)]
pub fn write_batch(
    targets: &[PathBuf],
    temp: TempName,
    make: &(dyn Fn(usize) -> Result<Option<Vec<u8>>, ObjectError> + Sync),
) -> Result<Vec<Option<u64>>, ObjectError> {
    let n = targets.len();
    // (temp file, stored len) per object written; a temp file left here is removed when dropped.
    let slots: Vec<Mutex<Option<(TempPath, u64)>>> = (0..n).map(|_| Default::default()).collect();
    let next = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let first_err: Mutex<Option<ObjectError>> = Default::default();
    let workers = n.min(WRITE_THREADS);
    std::thread::scope(|sc| {
        for _ in 0..workers {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= n || failed.load(Ordering::Relaxed) {
                    return;
                }
                let r = (|| {
                    let Some(enc) = make(i)? else { return Ok(()) };
                    let dir = targets[i].parent().expect("an object path has a directory");
                    let tmp = write_temp(dir, temp, &enc, true)?;
                    *slots[i].lock().unwrap() = Some((tmp, enc.len() as u64));
                    Ok(())
                })();
                if let Err(e) = r {
                    failed.store(true, Ordering::Relaxed);
                    first_err.lock().unwrap().get_or_insert(e);
                    return;
                }
            });
        }
    });
    if let Some(e) = first_err.into_inner().unwrap() {
        return Err(e); // dropping `slots` removes every temp file written
    }
    let mut lens: Vec<Option<u64>> = vec![None; n];
    let mut dirty: Vec<&Path> = Vec::new();
    for (i, slot) in slots.into_iter().enumerate() {
        let Some((tmp, len)) = slot.into_inner().unwrap() else { continue };
        let target = &targets[i];
        // On failure the rest of `slots` (and this temp file, inside the error) drop: nothing is left behind.
        tmp.persist(target).map_err(|e| ObjectError::io(target, e.error))?;
        lens[i] = Some(len);
        dirty.push(target.parent().expect("an object path has a directory"));
    }
    dirty.sort();
    dirty.dedup();
    let dirty_n = dirty.len();
    let dnext = AtomicU64::new(0);
    let derr: Mutex<Option<ObjectError>> = Default::default();
    std::thread::scope(|sc| {
        for _ in 0..dirty_n.min(WRITE_THREADS) {
            sc.spawn(|| loop {
                let i = dnext.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= dirty_n {
                    return;
                }
                if let Err(e) = fsync_dir(dirty[i]) {
                    derr.lock().unwrap().get_or_insert(ObjectError::io(dirty[i], e));
                }
            });
        }
    });
    if let Some(e) = derr.into_inner().unwrap() {
        return Err(e);
    }
    Ok(lens)
}

/// mtime := now, also on read-only files we own (utimensat), unlike opening for write.
pub fn touch_now(p: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: valid NUL-terminated path; a null `times` means "now" for both atime and mtime.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), std::ptr::null(), 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;

    /// Writers racing to keep one target leave one whole file, the first one's; one of them says so; no temp
    /// file is left.
    #[test]
    fn write_new_puts_a_file_once_and_never_replaces_one() {
        let d = TempDir::new("write-new");
        let target = d.0.join("obj");
        let said: Vec<bool> = std::thread::scope(|sc| {
            let writers: Vec<_> = (0..8u8)
                .map(|k| {
                    let target = &target;
                    sc.spawn(move || write_new(target, OBJECT_TEMP, &vec![k; 1 << 16]).unwrap())
                })
                .collect();
            writers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        assert_eq!(said.iter().filter(|&&s| s).count(), 1, "one writer put the file there: {said:?}");
        let kept = std::fs::read(&target).unwrap();
        assert_eq!(kept.len(), 1 << 16);
        assert!(kept.iter().all(|&b| b == kept[0]), "the file is one writer's bytes, whole");
        assert!(!write_new(&target, OBJECT_TEMP, b"other").unwrap(), "a file there is never replaced");
        assert_eq!(std::fs::read(&target).unwrap(), kept);
        assert_eq!(std::fs::read_dir(&d.0).unwrap().count(), 1, "no temp file is left");
    }
}
