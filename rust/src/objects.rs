//! Content-addressed objects: `ObjectId` (blake3 of the uncompressed bytes), zstd on disk (byte planes for
//! f16/bf16/f32 rows), atomic put, verified get. Knows nothing of llama.cpp or LMDB.
//!
//! File layout (docs/design.md "Objects"):
//! ```text
//! b"KVOB" u8 version=1 u8 codec u8 planes u8 0  u64le raw_len      (16 bytes)
//! codec 0: one zstd frame of the raw bytes
//! codec 1: planes x u64le frame_len, then `planes` zstd frames; plane p = raw[p::planes]
//! ```

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
    /// The encoded bytes, or None if the object does not exist.
    fn get(&self, id: &ObjectId) -> Result<Option<Vec<u8>>, ObjectError>;
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

    fn get(&self, id: &ObjectId) -> Result<Option<Vec<u8>>, ObjectError> {
        let p = self.path_of(id);
        match fs::read(&p) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ObjectError::io(p, e)),
        }
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

    /// Read, decode and re-hash. `Missing` if absent, `Corrupt` on any mismatch.
    pub fn get(&self, id: &ObjectId) -> Result<Got, ObjectError> {
        let encoded = self.backend.get(id)?.ok_or(ObjectError::Missing { id: *id })?;
        let checked = match decode(&encoded) {
            Ok(bytes) if ObjectId::of(&bytes) == *id => Ok(bytes),
            Ok(_) => Err("hash mismatch".to_string()),
            Err(reason) => Err(reason),
        };
        match checked {
            Ok(bytes) => Ok(Got { bytes, stored_len: encoded.len() as u64 }),
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

/// Encode raw bytes as an object file.
pub fn encode(raw: &[u8], elem_size: u8, level: i32) -> io::Result<Vec<u8>> {
    let planes = if elem_size > 1 && raw.len() >= elem_size as usize { elem_size as usize } else { 1 };
    let mut out = Vec::with_capacity(HEADER_LEN + raw.len() / 2 + 64);
    out.extend_from_slice(MAGIC);
    out.push(OBJECT_VERSION);
    out.push(if planes > 1 { CODEC_PLANES } else { CODEC_ZSTD });
    out.push(planes as u8);
    out.push(0);
    out.extend_from_slice(&(raw.len() as u64).to_le_bytes());
    if planes == 1 {
        out.extend_from_slice(&zstd::bulk::compress(raw, level)?);
        return Ok(out);
    }
    let mut frames = Vec::with_capacity(planes);
    let mut plane = Vec::with_capacity(raw.len() / planes + 1);
    let mut cx = zstd::bulk::Compressor::new(level)?;
    for p in 0..planes {
        plane.clear();
        plane.extend(raw.iter().skip(p).step_by(planes));
        frames.push(cx.compress(&plane)?);
    }
    for f in &frames {
        out.extend_from_slice(&(f.len() as u64).to_le_bytes());
    }
    for f in &frames {
        out.extend_from_slice(f);
    }
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

fn decompress_exact(frame: &[u8], expect: usize, what: &str) -> Result<Vec<u8>, String> {
    match zstd::zstd_safe::get_frame_content_size(frame) {
        Ok(Some(n)) if n != expect as u64 => {
            return Err(format!("{what}: frame declares {n} bytes, header says {expect}"))
        }
        Err(_) => return Err(format!("{what}: not a zstd frame")),
        _ => {}
    }
    let out = zstd::bulk::decompress(frame, expect).map_err(|e| format!("{what}: zstd: {e}"))?;
    if out.len() != expect {
        return Err(format!("{what}: decompressed {} bytes, header says {expect}", out.len()));
    }
    Ok(out)
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
        CODEC_ZSTD => decompress_exact(&b[HEADER_LEN..], raw_len, "frame"),
        CODEC_PLANES => {
            if planes < 2 {
                return Err(format!("codec 1 with {planes} planes"));
            }
            let table_end = HEADER_LEN + 8 * planes;
            if b.len() < table_end {
                return Err("truncated plane table".into());
            }
            let mut raw = vec![0u8; raw_len];
            let mut at = table_end;
            for p in 0..planes {
                let flen = read_u64(b, HEADER_LEN + 8 * p).unwrap() as usize;
                let frame = b.get(at..at.saturating_add(flen)).ok_or_else(|| format!("plane {p}: truncated frame"))?;
                at += flen;
                let plane = decompress_exact(frame, plane_len(raw_len, planes, p), &format!("plane {p}"))?;
                for (i, v) in plane.into_iter().enumerate() {
                    raw[p + i * planes] = v;
                }
            }
            if at != b.len() {
                return Err(format!("{} trailing bytes", b.len() - at));
            }
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
