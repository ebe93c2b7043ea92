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
    let mut f = tempfile::Builder::new()
        .prefix(name.prefix)
        .suffix(name.suffix)
        .rand_bytes(16)
        .permissions(Permissions::from_mode(0o666))
        .tempfile_in(dir)
        .map_err(|e| ObjectError::io(dir, e))?;
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

/// Files written under temp names beside their targets and renamed onto them only by `persist` (a cache's
/// copies of fetched objects, written while the restore that will verify them runs); dropped before that,
/// every temp file is removed. Not fsynced: for a directory whose files are copies of what lives elsewhere.
#[derive(Default)]
pub struct StagedFiles {
    files: Vec<(TempPath, PathBuf, u64)>,
}

impl StagedFiles {
    /// Write `bytes` under a temp name (`temp`) beside `target`, whose directory must exist.
    pub fn add(&mut self, target: PathBuf, temp: TempName, bytes: &[u8]) -> Result<(), ObjectError> {
        let dir = target.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let tmp = write_temp(dir, temp, bytes, false)?;
        self.files.push((tmp, target, bytes.len() as u64));
        Ok(())
    }

    /// Rename every file onto its target unless the target is there already (another restore's copy of the
    /// same object: then it is removed and not counted); returns the bytes put in place.
    pub fn persist(self) -> u64 {
        self.files.into_iter().filter_map(|(tmp, target, len)| tmp.persist_noclobber(&target).ok().map(|_| len)).sum()
    }
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

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        v.sort();
        v
    }

    /// Staged files are invisible until `persist`, gone if dropped before, and never replace a file there.
    #[test]
    fn staged_files_appear_only_when_persisted_and_never_clobber() {
        let d = TempDir::new("staged");
        let (a, b) = (d.0.join("a"), d.0.join("b"));
        let mut dropped = StagedFiles::default();
        dropped.add(a.clone(), OBJECT_TEMP, b"first").unwrap();
        assert_eq!(names(&d.0).len(), 1, "the temp file is written");
        drop(dropped);
        assert!(names(&d.0).is_empty(), "dropped: the temp file is removed");

        std::fs::write(&b, b"already").unwrap();
        let mut staged = StagedFiles::default();
        staged.add(a.clone(), OBJECT_TEMP, b"first").unwrap();
        staged.add(b.clone(), OBJECT_TEMP, b"other copy").unwrap();
        assert_eq!(names(&d.0).len(), 3);
        assert_eq!(staged.persist(), 5, "only the new file counts");
        assert_eq!(names(&d.0), ["a", "b"]);
        assert_eq!(std::fs::read(&a).unwrap(), b"first");
        assert_eq!(std::fs::read(&b).unwrap(), b"already");
    }
}
