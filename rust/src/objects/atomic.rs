//! Atomic file writes, the one home for them (objects and materialized slot files): a temp file beside the
//! target, fsync, rename, fsync the directory; any failure removes the temp file, so readers see all of a
//! file or nothing. `durable = false` skips the fsyncs (a materialized file that is consumed at once, a cache).
//! `touch_now` refreshes a file's mtime (the time gc's grace period counts from).

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

use super::ObjectError;
use crate::id::hex;

/// I/O threads of a batched write: fsyncs block, so more threads than cores keep the disk queue full.
const WRITE_THREADS: usize = 8;

/// A unique-enough random suffix for temp files (no extra crate: pid, time, counter, thread through blake3).
pub fn random_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = blake3::Hasher::new();
    h.update(&std::process::id().to_le_bytes());
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    h.update(&now.as_nanos().to_le_bytes());
    h.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    h.update(format!("{:?}", std::thread::current().id()).as_bytes());
    hex(&h.finalize().as_bytes()[..8])
}

pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Create `tmp` (it must not exist) holding `bytes`, fsynced if `durable`.
fn write_new(tmp: &Path, bytes: &[u8], durable: bool) -> Result<(), ObjectError> {
    let mut f = File::options().write(true).create_new(true).open(tmp).map_err(|e| ObjectError::io(tmp, e))?;
    f.write_all(bytes).map_err(|e| ObjectError::io(tmp, e))?;
    if durable {
        f.sync_all().map_err(|e| ObjectError::io(tmp, e))?;
    }
    Ok(())
}

/// Write `bytes` to `target` atomically: temp file `temp_name` beside it, (fsync), rename, (fsync dir).
/// `check` runs alongside the write and must pass before the rename (a materialize checks the file hash).
pub fn atomic_write<E: From<ObjectError> + Send>(
    target: &Path,
    temp_name: &str,
    bytes: &[u8],
    durable: bool,
    check: impl FnOnce() -> Result<(), E> + Send,
) -> Result<(), E> {
    let dir = target.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp = dir.join(temp_name);
    let (w, c) = rayon::join(|| write_new(&tmp, bytes, durable), check);
    let result = w.map_err(E::from).and(c).and_then(|()| {
        fs::rename(&tmp, target).map_err(|e| ObjectError::io(target, e))?;
        if durable {
            fsync_dir(dir).map_err(|e| ObjectError::io(dir, e))?;
        }
        Ok(())
    });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Write many files atomically each, all durable when this returns Ok (their directories must exist).
/// `make(i)` produces file i's bytes on any of a few I/O threads (so producing the next file overlaps an
/// fsync); None skips it. Then every temp file is renamed and each touched directory fsynced once. Returns
/// the bytes written per file; on any failure no temp file is left behind.
#[allow(clippy::type_complexity)]
pub fn write_batch(
    targets: &[PathBuf],
    temp_prefix: &str,
    make: &(dyn Fn(usize) -> Result<Option<Vec<u8>>, ObjectError> + Sync),
) -> Result<Vec<Option<u64>>, ObjectError> {
    let n = targets.len();
    // (temp path, stored len) per object written.
    let slots: Vec<Mutex<Option<(PathBuf, u64)>>> = (0..n).map(|_| Default::default()).collect();
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
                    let tmp = targets[i].with_file_name(format!("{temp_prefix}{}", random_suffix()));
                    // Recorded before the write so that a failure below still removes it.
                    *slots[i].lock().unwrap() = Some((tmp.clone(), enc.len() as u64));
                    write_new(&tmp, &enc, true)
                })();
                if let Err(e) = r {
                    failed.store(true, Ordering::Relaxed);
                    first_err.lock().unwrap().get_or_insert(e);
                    return;
                }
            });
        }
    });
    let slots: Vec<Option<(PathBuf, u64)>> = slots.into_iter().map(|m| m.into_inner().unwrap()).collect();
    let mut result = match first_err.into_inner().unwrap() {
        Some(e) => Err(e),
        None => Ok(()),
    };
    let mut renamed = vec![false; n];
    if result.is_ok() {
        for (i, slot) in slots.iter().enumerate() {
            let Some((tmp, _)) = slot else { continue };
            let target = &targets[i];
            if let Err(e) = fs::rename(tmp, target) {
                result = Err(ObjectError::io(target, e));
                break;
            }
            renamed[i] = true;
        }
    }
    if result.is_err() {
        for (slot, done) in slots.iter().zip(&renamed) {
            if let (Some((tmp, _)), false) = (slot, done) {
                let _ = fs::remove_file(tmp);
            }
        }
        return Err(result.unwrap_err());
    }
    let mut dirty: Vec<&Path> = slots.iter().flatten().map(|(tmp, _)| tmp.parent().unwrap()).collect();
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
    Ok(slots.into_iter().map(|s| s.map(|(_, len)| len)).collect())
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
