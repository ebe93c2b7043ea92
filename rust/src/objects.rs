//! Content-addressed objects: `ObjectId` (blake3 of the uncompressed bytes), zstd on disk (byte planes for
//! f16/bf16/f32 rows), atomic put, verified get. Knows nothing of llama.cpp or LMDB.
//!
//! File layout (docs/design.md "Objects"):
//! ```text
//! b"KVOB" u8 version=1 u8 codec u8 planes u8 0  u64le raw_len      (16 bytes)
//! codec 0: one zstd frame of the raw bytes
//! codec 1: planes x u64le frame_len, then `planes` zstd frames; plane p = raw[p::planes]
//! ```

use std::cell::RefCell;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

pub const MAGIC: &[u8; 4] = b"KVOB";
pub const OBJECT_VERSION: u8 = 1;
pub const CODEC_ZSTD: u8 = 0;
pub const CODEC_PLANES: u8 = 1;
pub const HEADER_LEN: usize = 16;
/// Largest object this build will decode (bounds the allocation a corrupt header could ask for).
pub const MAX_RAW_LEN: u64 = 1 << 36;
/// Prefix of temporary files beside objects (removed by gc once older than the grace period).
pub const TEMP_PREFIX: &str = ".tmp-";
/// I/O threads of a batched put: fsyncs block, so more threads than cores keep the disk queue full.
const PUT_THREADS: usize = 8;

/// blake3 of an object's uncompressed bytes. Full hex on disk, 8-hex short form in messages.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(pub [u8; 32]);

impl ObjectId {
    pub fn of(bytes: &[u8]) -> Self {
        ObjectId(*blake3::hash(bytes).as_bytes())
    }
    pub fn hex(&self) -> String {
        hex(&self.0)
    }
    pub fn short(&self) -> String {
        hex(&self.0[..4])
    }
    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, chunk) in s.as_bytes().chunks(2).enumerate() {
            let hi = (chunk[0] as char).to_digit(16)?;
            let lo = (chunk[1] as char).to_digit(16)?;
            out[i] = (hi * 16 + lo) as u8;
        }
        Some(ObjectId(out))
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.short())
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({})", self.hex())
    }
}

pub fn hex(bytes: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(D[(b >> 4) as usize] as char);
        s.push(D[(b & 15) as usize] as char);
    }
    s
}

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("object {id}: {reason} (moved to objects/.quarantine; saving the same state again repairs it); run `kvstore verify` to see which names are affected")]
    Corrupt { id: ObjectId, reason: String },
    #[error("object {id} is missing; run `kvstore verify`")]
    Missing { id: ObjectId },
    #[error("no space left writing {}: free disk space or run `kvstore gc`; nothing was committed", path.display())]
    Full { path: PathBuf, source: io::Error },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("object {id}: compression failed: {source}")]
    Compress { id: ObjectId, source: io::Error },
}

impl ObjectError {
    /// Wrap an I/O error with its path; ENOSPC/EDQUOT become `Full`.
    pub fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        let path = path.into();
        if is_disk_full(&source) {
            ObjectError::Full { path, source }
        } else {
            ObjectError::Io { path, source }
        }
    }
}

pub fn is_disk_full(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(c) if c == libc::ENOSPC || c == libc::EDQUOT)
        || matches!(e.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded)
}

/// Where object files live. Local directory now; an S3 backend can implement the same trait later.
pub trait Backend: Send + Sync {
    /// Store the encoded bytes of `id` atomically (readers see all of it or nothing).
    fn put_file(&self, id: &ObjectId, encoded: &[u8]) -> Result<(), ObjectError>;
    /// Store many objects atomically each; all are durable when this returns Ok. `make(i)` encodes object i
    /// (it may run on any thread); one whose encoding is None is already present and skipped.
    #[allow(clippy::type_complexity)]
    fn put_files(
        &self,
        ids: &[ObjectId],
        make: &(dyn Fn(usize) -> Result<Option<Vec<u8>>, ObjectError> + Sync),
    ) -> Result<Vec<Option<u64>>, ObjectError> {
        let mut out = Vec::with_capacity(ids.len());
        for (i, id) in ids.iter().enumerate() {
            out.push(match make(i)? {
                Some(enc) => {
                    self.put_file(id, &enc)?;
                    Some(enc.len() as u64)
                }
                None => None,
            });
        }
        Ok(out)
    }
    /// The encoded bytes, or None if the object does not exist.
    fn get(&self, id: &ObjectId) -> Result<Option<Vec<u8>>, ObjectError>;
    /// `get` into `buf` (replacing its contents, reusing its allocation); false if the object does not exist.
    fn get_into(&self, id: &ObjectId, buf: &mut Vec<u8>) -> Result<bool, ObjectError> {
        match self.get(id)? {
            Some(b) => {
                *buf = b;
                Ok(true)
            }
            None => Ok(false),
        }
    }
    fn exists(&self, id: &ObjectId) -> Result<bool, ObjectError>;
    /// Every object id present (in no particular order).
    fn list(&self) -> Result<Vec<ObjectId>, ObjectError>;
    /// Remove an object; returns the bytes freed (0 if it was already gone).
    fn delete(&self, id: &ObjectId) -> Result<u64, ObjectError>;
    /// Modification time and stored length, None if absent.
    fn mtime(&self, id: &ObjectId) -> Result<Option<(SystemTime, u64)>, ObjectError>;
    /// Set the modification time to now if the object exists; returns its stored length.
    fn touch(&self, id: &ObjectId) -> Result<Option<u64>, ObjectError>;
    /// Remove leftover temporary files older than `grace` (count them only if `dry_run`).
    fn clean_temp(&self, grace: Duration, dry_run: bool) -> Result<usize, ObjectError>;
    /// Move a corrupt object aside (kept for inspection), so that the next put of the same content rewrites it.
    fn quarantine(&self, id: &ObjectId) -> Result<(), ObjectError>;
}

/// `<root>/xx/<64 hex>`; temp files `<root>/xx/.tmp-<random>` beside their target.
pub struct LocalDir {
    root: PathBuf,
}

impl LocalDir {
    pub fn new(root: impl Into<PathBuf>) -> Result<Self, ObjectError> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(|e| ObjectError::io(&root, e))?;
        Ok(LocalDir { root })
    }
    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn path_of(&self, id: &ObjectId) -> PathBuf {
        let h = id.hex();
        self.root.join(&h[..2]).join(h)
    }
    fn shards(&self) -> Result<Vec<PathBuf>, ObjectError> {
        let mut out = Vec::new();
        let rd = match fs::read_dir(&self.root) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(ObjectError::io(&self.root, e)),
        };
        for ent in rd {
            let ent = ent.map_err(|e| ObjectError::io(&self.root, e))?;
            let name = ent.file_name();
            let name = name.to_string_lossy();
            if name.len() == 2 && name.bytes().all(|b| b.is_ascii_hexdigit()) && ent.path().is_dir() {
                out.push(ent.path());
            }
        }
        Ok(out)
    }
}

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

/// Write `bytes` to `target` atomically: temp file beside it, (fsync), rename, (fsync dir).
/// Any failure removes the temp file.
pub fn atomic_write(target: &Path, temp_name: &str, bytes: &[u8], durable: bool) -> Result<(), ObjectError> {
    let dir = target.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(temp_name);
    let result = (|| {
        let mut f = File::options()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| ObjectError::io(&tmp, e))?;
        f.write_all(bytes).map_err(|e| ObjectError::io(&tmp, e))?;
        if durable {
            f.sync_all().map_err(|e| ObjectError::io(&tmp, e))?;
        }
        drop(f);
        fs::rename(&tmp, target).map_err(|e| ObjectError::io(target, e))?;
        if durable {
            fsync_dir(dir).map_err(|e| ObjectError::io(dir, e))?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

impl Backend for LocalDir {
    fn put_file(&self, id: &ObjectId, encoded: &[u8]) -> Result<(), ObjectError> {
        let target = self.path_of(id);
        let shard = target.parent().expect("object path has a shard dir");
        if !shard.is_dir() {
            fs::create_dir_all(shard).map_err(|e| ObjectError::io(shard, e))?;
            fsync_dir(&self.root).map_err(|e| ObjectError::io(&self.root, e))?;
        }
        atomic_write(&target, &format!("{TEMP_PREFIX}{}", random_suffix()), encoded, true)
    }

    /// Batched: every object is encoded, written to its temp file and fsynced on a few I/O threads (an fsync
    /// blocks, so encoding the next object overlaps it); then all are renamed and each touched shard
    /// directory is fsynced once, instead of once per object.
    fn put_files(
        &self,
        ids: &[ObjectId],
        make: &(dyn Fn(usize) -> Result<Option<Vec<u8>>, ObjectError> + Sync),
    ) -> Result<Vec<Option<u64>>, ObjectError> {
        let n = ids.len();
        // Shard directories first (each new one made durable in the root).
        let mut shards: Vec<PathBuf> = ids.iter().map(|id| self.path_of(id).parent().unwrap().to_path_buf()).collect();
        shards.sort();
        shards.dedup();
        let mut made = false;
        for shard in &shards {
            if !shard.is_dir() {
                fs::create_dir_all(shard).map_err(|e| ObjectError::io(shard, e))?;
                made = true;
            }
        }
        if made {
            fsync_dir(&self.root).map_err(|e| ObjectError::io(&self.root, e))?;
        }
        // (temp path, stored len) per object written.
        let slots: Vec<std::sync::Mutex<Option<(PathBuf, u64)>>> = (0..n).map(|_| Default::default()).collect();
        let next = AtomicU64::new(0);
        let failed = std::sync::atomic::AtomicBool::new(false);
        let first_err: std::sync::Mutex<Option<ObjectError>> = Default::default();
        let workers = n.min(PUT_THREADS);
        std::thread::scope(|sc| {
            for _ in 0..workers {
                sc.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    if i >= n || failed.load(Ordering::Relaxed) {
                        return;
                    }
                    let r = (|| {
                        let Some(enc) = make(i)? else { return Ok(()) };
                        let tmp = self.path_of(&ids[i]).with_file_name(format!("{TEMP_PREFIX}{}", random_suffix()));
                        // Recorded before the write so that a failure below still removes it.
                        *slots[i].lock().unwrap() = Some((tmp.clone(), enc.len() as u64));
                        let mut f = File::options()
                            .write(true)
                            .create_new(true)
                            .open(&tmp)
                            .map_err(|e| ObjectError::io(&tmp, e))?;
                        f.write_all(&enc).map_err(|e| ObjectError::io(&tmp, e))?;
                        f.sync_all().map_err(|e| ObjectError::io(&tmp, e))?;
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
        let slots: Vec<Option<(PathBuf, u64)>> = slots.into_iter().map(|m| m.into_inner().unwrap()).collect();
        let mut result = match first_err.into_inner().unwrap() {
            Some(e) => Err(e),
            None => Ok(()),
        };
        let mut renamed = vec![false; n];
        if result.is_ok() {
            for (i, slot) in slots.iter().enumerate() {
                let Some((tmp, _)) = slot else { continue };
                let target = self.path_of(&ids[i]);
                if let Err(e) = fs::rename(tmp, &target) {
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
        let mut dirty: Vec<&Path> = slots
            .iter()
            .zip(ids)
            .filter(|(s, _)| s.is_some())
            .map(|(s, _)| s.as_ref().unwrap().0.parent().unwrap())
            .collect();
        dirty.sort();
        dirty.dedup();
        let dirty_n = dirty.len();
        let dnext = AtomicU64::new(0);
        let derr: std::sync::Mutex<Option<ObjectError>> = Default::default();
        std::thread::scope(|sc| {
            for _ in 0..dirty_n.min(PUT_THREADS) {
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

    fn get(&self, id: &ObjectId) -> Result<Option<Vec<u8>>, ObjectError> {
        let p = self.path_of(id);
        match fs::read(&p) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ObjectError::io(p, e)),
        }
    }

    fn get_into(&self, id: &ObjectId, buf: &mut Vec<u8>) -> Result<bool, ObjectError> {
        use std::io::Read;
        let p = self.path_of(id);
        let mut f = match File::open(&p) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(ObjectError::io(p, e)),
        };
        buf.clear();
        let len = f.metadata().map(|m| m.len() as usize).unwrap_or(0);
        buf.reserve(len);
        f.read_to_end(buf).map_err(|e| ObjectError::io(&p, e))?;
        Ok(true)
    }

    fn exists(&self, id: &ObjectId) -> Result<bool, ObjectError> {
        Ok(self.mtime(id)?.is_some())
    }

    fn list(&self) -> Result<Vec<ObjectId>, ObjectError> {
        let mut out = Vec::new();
        for shard in self.shards()? {
            let rd = fs::read_dir(&shard).map_err(|e| ObjectError::io(&shard, e))?;
            for ent in rd {
                let ent = ent.map_err(|e| ObjectError::io(&shard, e))?;
                if let Some(id) = ent.file_name().to_str().and_then(ObjectId::from_hex) {
                    out.push(id);
                }
            }
        }
        Ok(out)
    }

    fn quarantine(&self, id: &ObjectId) -> Result<(), ObjectError> {
        let dir = self.root.join(".quarantine");
        fs::create_dir_all(&dir).map_err(|e| ObjectError::io(&dir, e))?;
        let src = self.path_of(id);
        let dst = dir.join(format!("{}.{}", id.hex(), random_suffix()));
        match fs::rename(&src, &dst) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()), // another reader moved it first
            Err(e) => Err(ObjectError::io(src, e)),
        }
    }

    fn delete(&self, id: &ObjectId) -> Result<u64, ObjectError> {
        let p = self.path_of(id);
        let len = match fs::metadata(&p) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(ObjectError::io(p, e)),
        };
        match fs::remove_file(&p) {
            Ok(()) => Ok(len),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(ObjectError::io(p, e)),
        }
    }

    fn mtime(&self, id: &ObjectId) -> Result<Option<(SystemTime, u64)>, ObjectError> {
        let p = self.path_of(id);
        match fs::metadata(&p) {
            Ok(m) if m.is_file() => {
                let t = m.modified().map_err(|e| ObjectError::io(&p, e))?;
                Ok(Some((t, m.len())))
            }
            Ok(_) => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ObjectError::io(p, e)),
        }
    }

    fn touch(&self, id: &ObjectId) -> Result<Option<u64>, ObjectError> {
        let p = self.path_of(id);
        let m = match fs::metadata(&p) {
            Ok(m) if m.is_file() => m,
            Ok(_) => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ObjectError::io(p, e)),
        };
        touch_now(&p).map_err(|e| ObjectError::io(&p, e))?;
        Ok(Some(m.len()))
    }

    fn clean_temp(&self, grace: Duration, dry_run: bool) -> Result<usize, ObjectError> {
        let cutoff = SystemTime::now().checked_sub(grace).unwrap_or(SystemTime::UNIX_EPOCH);
        let mut n = 0;
        let mut dirs = self.shards()?;
        dirs.push(self.root.clone());
        for dir in dirs {
            let rd = fs::read_dir(&dir).map_err(|e| ObjectError::io(&dir, e))?;
            for ent in rd {
                let ent = ent.map_err(|e| ObjectError::io(&dir, e))?;
                if !ent.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
                    continue;
                }
                let Ok(m) = ent.metadata() else { continue };
                if m.is_file() && m.modified().map(|t| t < cutoff).unwrap_or(false) {
                    if !dry_run {
                        match fs::remove_file(ent.path()) {
                            Ok(()) => {}
                            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                            Err(e) => return Err(ObjectError::io(ent.path(), e)),
                        }
                    }
                    n += 1;
                }
            }
        }
        Ok(n)
    }
}

/// mtime := now, also on read-only files we own (utimensat), unlike opening for write.
fn touch_now(p: &Path) -> io::Result<()> {
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

/// What `put` did.
#[derive(Debug, Clone, Copy)]
pub struct Put {
    pub id: ObjectId,
    /// Bytes the object occupies in the backend (header + frames).
    pub stored_len: u64,
    /// False when the object was already present (its mtime was refreshed instead).
    pub was_new: bool,
}

/// A verified object read.
#[derive(Debug)]
pub struct Got {
    pub bytes: Vec<u8>,
    pub stored_len: u64,
}

pub struct ObjectStore {
    backend: Box<dyn Backend>,
}

impl ObjectStore {
    pub fn new(backend: Box<dyn Backend>) -> Self {
        ObjectStore { backend }
    }
    pub fn local(root: impl Into<PathBuf>) -> Result<Self, ObjectError> {
        Ok(Self::new(Box::new(LocalDir::new(root)?)))
    }
    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// Store `bytes` unless already present (then only refresh its mtime, which protects it from a concurrent
    /// gc's grace check). `elem_size > 1` splits into byte planes, each its own zstd frame.
    pub fn put(&self, bytes: &[u8], elem_size: u8, level: i32) -> Result<Put, ObjectError> {
        let id = ObjectId::of(bytes);
        self.put_with_id(id, bytes, elem_size, level)
    }

    /// `put` when the caller already hashed the bytes.
    pub fn put_with_id(&self, id: ObjectId, bytes: &[u8], elem_size: u8, level: i32) -> Result<Put, ObjectError> {
        if let Some(stored_len) = self.backend.touch(&id)? {
            return Ok(Put { id, stored_len, was_new: false });
        }
        let encoded = encode(bytes, elem_size, level).map_err(|source| ObjectError::Compress { id, source })?;
        self.backend.put_file(&id, &encoded)?;
        Ok(Put { id, stored_len: encoded.len() as u64, was_new: true })
    }

    /// `put_with_id` for many objects at once (distinct ids, each `(id, raw bytes, elem_size)`): present ones
    /// only get their mtime refreshed; new ones are encoded and written in parallel, and all are durable
    /// when this returns. Results are in input order.
    pub fn put_many(&self, items: &[(ObjectId, &[u8], u8)], level: i32) -> Result<Vec<Put>, ObjectError> {
        let ids: Vec<ObjectId> = items.iter().map(|x| x.0).collect();
        let existing: Vec<std::sync::Mutex<Option<u64>>> = (0..items.len()).map(|_| Default::default()).collect();
        let make = |i: usize| -> Result<Option<Vec<u8>>, ObjectError> {
            let (id, bytes, elem) = items[i];
            if let Some(stored_len) = self.backend.touch(&id)? {
                *existing[i].lock().unwrap() = Some(stored_len);
                return Ok(None);
            }
            encode(bytes, elem, level).map(Some).map_err(|source| ObjectError::Compress { id, source })
        };
        let written = self.backend.put_files(&ids, &make)?;
        Ok(written
            .into_iter()
            .zip(existing)
            .zip(ids)
            .map(|((w, e), id)| match w {
                Some(stored_len) => Put { id, stored_len, was_new: true },
                None => Put { id, stored_len: e.into_inner().unwrap().unwrap_or(0), was_new: false },
            })
            .collect())
    }

    /// Read, decode and re-hash. `Missing` if absent, `Corrupt` on any mismatch.
    pub fn get(&self, id: &ObjectId) -> Result<Got, ObjectError> {
        // The encoded bytes go to a per-thread buffer, reused from object to object (no fresh pages per read).
        let (checked, stored_len) = READ_BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            if !self.backend.get_into(id, &mut buf)? {
                return Err(ObjectError::Missing { id: *id });
            }
            let checked = match decode(&buf) {
                Ok(bytes) if ObjectId::of(&bytes) == *id => Ok(bytes),
                Ok(_) => Err("hash mismatch".to_string()),
                Err(reason) => Err(reason),
            };
            Ok((checked, buf.len() as u64))
        })?;
        match checked {
            Ok(bytes) => Ok(Got { bytes, stored_len }),
            Err(reason) => {
                // Content addressing would otherwise keep reusing the bad file: a re-ingest of the same bytes
                // finds the id present and skips the write. Moving it aside lets the next put repair it.
                self.backend.quarantine(id)?;
                Err(ObjectError::Corrupt { id: *id, reason })
            }
        }
    }

    pub fn exists(&self, id: &ObjectId) -> Result<bool, ObjectError> {
        self.backend.exists(id)
    }
}

thread_local! {
    /// Per-thread zstd contexts (a context costs an allocation and setup; objects are encoded and decoded on
    /// rayon workers, many per state).
    static CCTX: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
    static DCTX: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
    /// Planes of the object being encoded or decoded, back to back.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Encoded bytes of the object being read.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn with_cctx<R>(level: i32, f: impl FnOnce(&mut zstd::bulk::Compressor<'static>) -> io::Result<R>) -> io::Result<R> {
    CCTX.with(|c| {
        let mut c = c.borrow_mut();
        if c.as_ref().is_none_or(|(l, _)| *l != level) {
            *c = Some((level, zstd::bulk::Compressor::new(level)?));
        }
        f(&mut c.as_mut().unwrap().1)
    })
}

fn with_dctx<R>(f: impl FnOnce(&mut zstd::bulk::Decompressor<'static>) -> R) -> Result<R, String> {
    DCTX.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_none() {
            *d = Some(zstd::bulk::Decompressor::new().map_err(|e| format!("zstd: {e}"))?);
        }
        Ok(f(d.as_mut().unwrap()))
    })
}

fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < len {
            s.resize(len, 0);
        }
        f(&mut s[..len])
    })
}

/// Start of each plane when the planes of `raw_len` bytes lie back to back.
fn plane_offsets(raw_len: usize, planes: usize) -> Vec<usize> {
    let mut at = 0;
    (0..planes)
        .map(|p| {
            let o = at;
            at += plane_len(raw_len, planes, p);
            o
        })
        .collect()
}

/// `raw` split into byte planes laid back to back in `out` (plane p = raw[p::planes]).
fn deinterleave(raw: &[u8], planes: usize, out: &mut [u8]) {
    let n = raw.len();
    let full = n / planes;
    let offs = plane_offsets(n, planes);
    match planes {
        2 => {
            let (a, b) = out.split_at_mut(offs[1]);
            for ((c, x), y) in raw.chunks_exact(2).zip(a.iter_mut()).zip(b.iter_mut()) {
                *x = c[0];
                *y = c[1];
            }
        }
        4 => {
            let (a, rest) = out.split_at_mut(offs[1]);
            let (b, rest) = rest.split_at_mut(offs[2] - offs[1]);
            let (c, d) = rest.split_at_mut(offs[3] - offs[2]);
            for ((((w, x), y), z), v) in
                raw.chunks_exact(4).zip(a.iter_mut()).zip(b.iter_mut()).zip(c.iter_mut()).zip(d.iter_mut())
            {
                *x = w[0];
                *y = w[1];
                *z = w[2];
                *v = w[3];
            }
        }
        _ => {
            for (p, &o) in offs.iter().enumerate() {
                for (i, x) in out[o..o + full].iter_mut().enumerate() {
                    *x = raw[i * planes + p];
                }
            }
        }
    }
    for i in full * planes..n {
        out[offs[i - full * planes] + full] = raw[i];
    }
}

/// Inverse of [`deinterleave`].
fn interleave(src: &[u8], planes: usize, raw: &mut [u8]) {
    let n = raw.len();
    let full = n / planes;
    let offs = plane_offsets(n, planes);
    match planes {
        2 => {
            let (a, b) = src.split_at(offs[1]);
            for ((c, &x), &y) in raw.chunks_exact_mut(2).zip(a).zip(b) {
                c[0] = x;
                c[1] = y;
            }
        }
        4 => {
            let (a, rest) = src.split_at(offs[1]);
            let (b, rest) = rest.split_at(offs[2] - offs[1]);
            let (c, d) = rest.split_at(offs[3] - offs[2]);
            for ((((w, &x), &y), &z), &v) in raw.chunks_exact_mut(4).zip(a).zip(b).zip(c).zip(d) {
                w[0] = x;
                w[1] = y;
                w[2] = z;
                w[3] = v;
            }
        }
        _ => {
            for (p, &o) in offs.iter().enumerate() {
                for (i, &x) in src[o..o + full].iter().enumerate() {
                    raw[i * planes + p] = x;
                }
            }
        }
    }
    for i in full * planes..n {
        raw[i] = src[offs[i - full * planes] + full];
    }
}

/// Encode raw bytes as an object file.
pub fn encode(raw: &[u8], elem_size: u8, level: i32) -> io::Result<Vec<u8>> {
    let planes = if elem_size > 1 && raw.len() >= elem_size as usize { elem_size as usize } else { 1 };
    let mut out = Vec::with_capacity(HEADER_LEN + 8 * planes + zstd::zstd_safe::compress_bound(raw.len()));
    out.extend_from_slice(MAGIC);
    out.push(OBJECT_VERSION);
    out.push(if planes > 1 { CODEC_PLANES } else { CODEC_ZSTD });
    out.push(planes as u8);
    out.push(0);
    out.extend_from_slice(&(raw.len() as u64).to_le_bytes());
    if planes == 1 {
        with_cctx(level, |cx| {
            let at = out.len();
            out.resize(out.capacity(), 0);
            let n = cx.compress_to_buffer(raw, &mut out[at..])?;
            out.truncate(at + n);
            Ok(())
        })?;
        return Ok(out);
    }
    let table = out.len();
    out.resize(table + 8 * planes, 0);
    with_scratch(raw.len(), |split| {
        deinterleave(raw, planes, split);
        let offs = plane_offsets(raw.len(), planes);
        with_cctx(level, |cx| {
            for p in 0..planes {
                let plane = &split[offs[p]..offs[p] + plane_len(raw.len(), planes, p)];
                let at = out.len();
                out.resize(at + zstd::zstd_safe::compress_bound(plane.len()), 0);
                let n = cx.compress_to_buffer(plane, &mut out[at..])?;
                out.truncate(at + n);
                out[table + 8 * p..table + 8 * p + 8].copy_from_slice(&(n as u64).to_le_bytes());
            }
            Ok(())
        })
    })?;
    Ok(out)
}

fn plane_len(raw_len: usize, planes: usize, p: usize) -> usize {
    if raw_len > p {
        (raw_len - p).div_ceil(planes)
    } else {
        0
    }
}

fn read_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Decompress one frame into exactly `out` (its length is what the header promises).
fn decompress_exact(frame: &[u8], out: &mut [u8], what: &str) -> Result<(), String> {
    let expect = out.len();
    match zstd::zstd_safe::get_frame_content_size(frame) {
        Ok(Some(n)) if n != expect as u64 => {
            return Err(format!("{what}: frame declares {n} bytes, header says {expect}"))
        }
        Err(_) => return Err(format!("{what}: not a zstd frame")),
        _ => {}
    }
    let n = with_dctx(|d| d.decompress_to_buffer(frame, out))?.map_err(|e| format!("{what}: zstd: {e}"))?;
    if n != expect {
        return Err(format!("{what}: decompressed {n} bytes, header says {expect}"));
    }
    Ok(())
}

/// Decode an object file; the error is the reason it is corrupt.
pub fn decode(b: &[u8]) -> Result<Vec<u8>, String> {
    if b.len() < HEADER_LEN {
        return Err(format!("truncated: {} bytes, header needs {HEADER_LEN}", b.len()));
    }
    if &b[..4] != MAGIC {
        return Err("bad magic (not a kvstore object)".into());
    }
    if b[4] != OBJECT_VERSION {
        return Err(format!("object version {} is not supported (this build reads {OBJECT_VERSION})", b[4]));
    }
    let (codec, planes) = (b[5], b[6] as usize);
    let raw_len = read_u64(b, 8).unwrap();
    if raw_len > MAX_RAW_LEN {
        return Err(format!("header claims {raw_len} raw bytes"));
    }
    let raw_len = raw_len as usize;
    match codec {
        CODEC_ZSTD => {
            let mut raw = vec![0u8; raw_len];
            decompress_exact(&b[HEADER_LEN..], &mut raw, "frame")?;
            Ok(raw)
        }
        CODEC_PLANES => {
            if planes < 2 {
                return Err(format!("codec 1 with {planes} planes"));
            }
            let table_end = HEADER_LEN + 8 * planes;
            if b.len() < table_end {
                return Err("truncated plane table".into());
            }
            let mut raw = vec![0u8; raw_len];
            with_scratch(raw_len, |split| {
                let mut at = table_end;
                let mut out_at = 0;
                for p in 0..planes {
                    let flen = read_u64(b, HEADER_LEN + 8 * p).unwrap();
                    let frame = usize::try_from(flen)
                        .ok()
                        .and_then(|flen| b.get(at..at.checked_add(flen)?))
                        .ok_or_else(|| format!("plane {p}: truncated frame"))?;
                    at += frame.len();
                    let plen = plane_len(raw_len, planes, p);
                    decompress_exact(frame, &mut split[out_at..out_at + plen], &format!("plane {p}"))?;
                    out_at += plen;
                }
                if at != b.len() {
                    return Err(format!("{} trailing bytes", b.len() - at));
                }
                interleave(split, planes, &mut raw);
                Ok(())
            })?;
            Ok(raw)
        }
        c => Err(format!("unknown codec {c}")),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fresh directory under the target dir's tmp, removed on drop.
    pub struct TempDir(pub PathBuf);
    impl TempDir {
        pub fn new(tag: &str) -> Self {
            let p = std::env::temp_dir().join(format!("kvstore-test-{tag}-{}", random_suffix()));
            fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn sample(n: usize) -> Vec<u8> {
        // f16-like rows: smooth high bytes, noisy low bytes.
        (0..n).map(|i| if i % 2 == 1 { (i / 64) as u8 } else { (i * 31 % 251) as u8 }).collect()
    }

    #[test]
    fn round_trip_with_and_without_planes() {
        let d = TempDir::new("obj");
        let s = ObjectStore::local(&d.0).unwrap();
        for (n, elem) in [(0usize, 1u8), (1, 2), (1000, 1), (1001, 2), (4096, 2), (4099, 4), (3, 4)] {
            let raw = sample(n);
            let put = s.put(&raw, elem, 1).unwrap();
            assert!(put.was_new || n == 0 || put.id == ObjectId::of(&raw));
            let got = s.get(&put.id).unwrap();
            assert_eq!(got.bytes, raw, "n={n} elem={elem}");
            assert_eq!(got.stored_len, put.stored_len);
            let again = s.put(&raw, elem, 1).unwrap();
            assert!(!again.was_new);
            assert_eq!(again.stored_len, put.stored_len);
        }
        // planes really used
        let raw = sample(4096);
        let enc = encode(&raw, 2, 1).unwrap();
        assert_eq!((enc[5], enc[6]), (CODEC_PLANES, 2));
        assert_eq!(decode(&enc).unwrap(), raw);
    }

    #[test]
    fn corrupt_and_missing_objects_are_detected() {
        let d = TempDir::new("corrupt");
        let s = ObjectStore::local(&d.0).unwrap();
        let raw = sample(5000);
        let put = s.put(&raw, 2, 1).unwrap();
        let local = LocalDir::new(&d.0).unwrap();
        let p = local.path_of(&put.id);
        // A valid object of other content under this id: hash mismatch.
        fs::write(&p, encode(b"something else", 1, 1).unwrap()).unwrap();
        let e = s.get(&put.id).unwrap_err();
        assert!(matches!(e, ObjectError::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("hash mismatch") && e.to_string().contains(&put.id.short()), "{e}");
        // Truncated and garbage files.
        let good = encode(&raw, 2, 1).unwrap();
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, &good[..good.len() - 3]).unwrap();
        assert!(matches!(s.get(&put.id), Err(ObjectError::Corrupt { .. })));
        fs::write(&p, b"KVOB\x01\x00\x01\x00\xff\xff\xff\xff\xff\xff\xff\x7f").unwrap();
        assert!(matches!(s.get(&put.id), Err(ObjectError::Corrupt { .. })));
        // Each corrupt read moved the file aside, so the id is now missing and the next put repairs it.
        assert!(!p.exists());
        assert_eq!(fs::read_dir(d.0.join(".quarantine")).unwrap().count(), 3);
        assert!(matches!(s.get(&put.id), Err(ObjectError::Missing { .. })));
        assert!(s.put(&raw, 2, 1).unwrap().was_new);
        assert_eq!(s.get(&put.id).unwrap().bytes, raw);
    }

    #[test]
    fn failed_put_leaves_no_temp_file() {
        let d = TempDir::new("atomic");
        let s = ObjectStore::local(&d.0).unwrap();
        let raw = sample(300);
        let id = ObjectId::of(&raw);
        let local = LocalDir::new(&d.0).unwrap();
        let target = local.path_of(&id);
        // A directory where the object file should go makes the rename fail.
        fs::create_dir_all(target.join("blocker")).unwrap();
        assert!(s.put(&raw, 1, 1).is_err());
        let leftovers: Vec<_> = fs::read_dir(target.parent().unwrap())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(TEMP_PREFIX))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn put_many_batches_and_cleans_up() {
        let d = TempDir::new("many");
        let s = ObjectStore::local(&d.0).unwrap();
        let raws: Vec<Vec<u8>> = (0..20).map(|k| sample(1000 + 37 * k)).collect();
        let pre = s.put(&raws[3], 2, 1).unwrap();
        let items: Vec<(ObjectId, &[u8], u8)> =
            raws.iter().enumerate().map(|(k, r)| (ObjectId::of(r), r.as_slice(), (k % 3 + 1) as u8)).collect();
        let puts = s.put_many(&items, 1).unwrap();
        for (k, (p, r)) in puts.iter().zip(&raws).enumerate() {
            assert_eq!(p.id, ObjectId::of(r));
            assert_eq!(p.was_new, k != 3);
            assert_eq!(s.get(&p.id).unwrap().bytes, *r);
            assert_eq!(s.get(&p.id).unwrap().stored_len, p.stored_len);
        }
        assert_eq!(puts[3].stored_len, pre.stored_len);
        assert!(s.put_many(&items, 1).unwrap().iter().all(|p| !p.was_new));

        // A failing rename (a directory where one object goes) fails the batch and leaves no temp file.
        let d2 = TempDir::new("many-fail");
        let s2 = ObjectStore::local(&d2.0).unwrap();
        let local = LocalDir::new(&d2.0).unwrap();
        fs::create_dir_all(local.path_of(&items[5].0).join("blocker")).unwrap();
        assert!(s2.put_many(&items, 1).is_err());
        for shard in local.shards().unwrap() {
            for e in fs::read_dir(shard).unwrap() {
                assert!(!e.unwrap().file_name().to_string_lossy().starts_with(TEMP_PREFIX));
            }
        }
    }

    #[test]
    fn planes_round_trip_odd_lengths() {
        for planes in [2u8, 3, 4, 5] {
            for n in [planes as usize, 7, 64, 1001, 4099] {
                let raw = sample(n);
                let enc = encode(&raw, planes, 1).unwrap();
                assert_eq!(decode(&enc).unwrap(), raw, "planes={planes} n={n}");
            }
        }
    }

    #[test]
    fn ids_and_hex() {
        let id = ObjectId::of(b"abc");
        assert_eq!(ObjectId::from_hex(&id.hex()), Some(id));
        assert_eq!(id.short().len(), 8);
        assert_eq!(ObjectId::from_hex("zz"), None);
        assert_eq!(ObjectId::from_hex(&"g".repeat(64)), None);
    }

    #[test]
    fn clean_temp_respects_grace() {
        let d = TempDir::new("tmp");
        let local = LocalDir::new(&d.0).unwrap();
        fs::create_dir_all(d.0.join("ab")).unwrap();
        fs::write(d.0.join("ab").join(".tmp-x"), b"x").unwrap();
        assert_eq!(local.clean_temp(Duration::from_secs(3600), false).unwrap(), 0);
        assert_eq!(local.clean_temp(Duration::ZERO, true).unwrap(), 1);
        assert_eq!(local.clean_temp(Duration::ZERO, false).unwrap(), 1);
        assert!(!d.0.join("ab").join(".tmp-x").exists());
    }
}
