//! The seam between the object store and where object files live: the `Backend` trait (a local directory,
//! `local.rs`; other places implement it outside this module, which names none of them) and `ObjectError`,
//! the errors any backend reports.
//!
//! CONTRACT for every backend: a put is atomic (readers see all of an object or nothing) and durable when it
//! returns; objects are never rewritten in place; `touch` refreshes the time gc's grace period is measured
//! from; `quarantine` moves a corrupt object aside so that the next put of the same content rewrites it. A
//! backend that could not reach where it keeps objects reports `ObjectError::Unavailable` (backend-neutral).

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use crate::id::ObjectId;
use crate::unavailable::Unavailable;

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("object {id}: {reason} (moved aside: to objects/.quarantine in a local store, to quarantine/ in a bucket; a cache's copy is dropped; saving the same state again repairs it); run `kvstore verify` to see which names are affected")]
    Corrupt { id: ObjectId, reason: String },
    #[error("object {id} is missing; run `kvstore verify`")]
    Missing { id: ObjectId },
    #[error("no space left writing {}: free disk space or run `kvstore gc`; nothing was committed", path.display())]
    Full { path: PathBuf, source: io::Error },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("object {id}: compression failed: {source}")]
    Compress { id: ObjectId, source: io::Error },
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
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

/// A backend that keeps a cache in front of where its objects live: the two copies, each as a backend of
/// its own, for `verify` to check one at a time.
pub struct Layers {
    pub cache: Box<dyn Backend>,
    pub primary: Box<dyn Backend>,
}

/// What a layered backend holds, for the store's stats (None where a backend has no such layer, or where it
/// could not be counted just now).
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// (objects, stored bytes) where the objects live.
    pub primary: Option<(u64, u64)>,
    /// (bytes used, bound) of the local cache.
    pub cache: Option<(u64, Option<u64>)>,
}

/// Objects `Backend::fetch` brought for one read: encoded bytes by id, not yet verified (slices of the
/// responses they came in, never copied). A copy a read found wrong is `reject`ed: it is never kept.
#[derive(Default)]
pub struct Fetched {
    objects: HashMap<ObjectId, Bytes>,
    rejected: std::sync::Mutex<std::collections::HashSet<ObjectId>>,
}

impl Fetched {
    pub fn new(objects: HashMap<ObjectId, Bytes>) -> Self {
        Fetched { objects, rejected: Default::default() }
    }
    pub fn get(&self, id: &ObjectId) -> Option<&Bytes> {
        self.objects.get(id)
    }
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
    /// This copy did not match its id (a bad transfer, or a read hint that pointed elsewhere).
    pub fn reject(&self, id: &ObjectId) {
        self.rejected.lock().unwrap_or_else(|e| e.into_inner()).insert(*id);
    }
    /// The fetched copies not rejected.
    pub fn accepted(&self) -> impl Iterator<Item = (&ObjectId, &Bytes)> {
        let rejected = self.rejected.lock().unwrap_or_else(|e| e.into_inner()).clone();
        self.objects.iter().filter(move |(id, _)| !rejected.contains(id))
    }
}

/// An object listed with its modification time (the backend's clock) and stored length.
pub type Stamped = (ObjectId, SystemTime, u64);

/// Where object files live: a local directory (`local.rs`), or any place that keeps the same contract.
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
    /// Remove many objects (a backend may do it concurrently); absent ones are fine. A backend that must copy
    /// what survives to remove the rest (a bucket's packs) holds at most `ceiling` bytes meanwhile (or what it
    /// held when it began, if more; None: no bound) and returns the objects it left for a later call.
    fn delete_many(&self, ids: &[ObjectId], _ceiling: Option<u64>) -> Result<Vec<ObjectId>, ObjectError> {
        for id in ids {
            self.delete(id)?;
        }
        Ok(Vec::new())
    }
    /// Every object with its modification time and stored length (gc's listing; a backend may do it in one
    /// request instead of one per object).
    fn list_stamped(&self) -> Result<Vec<Stamped>, ObjectError> {
        let mut out = Vec::new();
        for id in self.list()? {
            if let Some((t, len)) = self.mtime(&id)? {
                out.push((id, t, len));
            }
        }
        Ok(out)
    }
    /// Modification time and stored length, None if absent.
    fn mtime(&self, id: &ObjectId) -> Result<Option<(SystemTime, u64)>, ObjectError>;
    /// Set the modification time to now if the object exists; returns its stored length.
    fn touch(&self, id: &ObjectId) -> Result<Option<u64>, ObjectError>;
    /// Leftover temporary files older than `grace` (an interrupted put's).
    fn stale_temp(&self, grace: Duration) -> Result<usize, ObjectError>;
    /// Remove leftover temporary files older than `grace`; returns how many.
    fn clean_temp(&self, grace: Duration) -> Result<usize, ObjectError>;
    /// Move a corrupt object aside (kept for inspection), so that the next put of the same content rewrites it.
    fn quarantine(&self, id: &ObjectId) -> Result<(), ObjectError>;
    /// Whether every one of `ids` lies in a file this machine holds, so that reading them asks nothing of
    /// afar (a bucket store: its cache holds them). A backend that holds all its objects here: true.
    fn holds_here(&self, _ids: &[ObjectId]) -> bool {
        true
    }
    /// How many `get_into` calls this backend answered from afar (a bucket store: from the bucket, not its
    /// cache) since it was opened. A read during which this did not move, and that fetched nothing, read only
    /// files this machine holds (a restore then checks its file by the cheaper sum: `store/file_check.rs`).
    fn reads_from_afar(&self) -> u64 {
        0
    }
    /// Fetch those of `ids` that must come from afar (a bucket store: what its cache lacks, in parallel), encoded,
    /// neither verified nor kept: the reader verifies them (`ObjectStore::get_fetched`, or a rebuilt file's
    /// hash) and then hands them to `keep_fetched`. A backend that holds its objects where it reads them
    /// fetches nothing.
    fn fetch(&self, _ids: &[ObjectId]) -> Result<Fetched, ObjectError> {
        Ok(Fetched::default())
    }
    /// Whether `stream` may hand anything over (a bucket store that streams restores, `KVSTORE_S3_STREAM`): a
    /// caller asks before it starts the threads that would take the objects.
    fn streams(&self) -> bool {
        false
    }
    /// Hand each of `ids` (distinct) to `deliver(slot, encoded)` as soon as it is here, unverified: what this
    /// machine holds first, then each object from afar the moment it arrived, so that the caller works on one
    /// while the others are on their way (`store/streamed.rs`). Some(the slots of objects absent everywhere);
    /// None where nothing would arrive from afar (a backend without one, or everything held here), or where
    /// the backend does not stream (`KVSTORE_S3_STREAM`): the caller reads as usual.
    fn stream(&self, _ids: &[ObjectId], _deliver: &(dyn Fn(usize, Bytes) + Sync)) -> Result<Option<Vec<usize>>, ObjectError> {
        Ok(None)
    }
    /// Keep what `fetch` brought, which the caller verified (its rejected copies are left out): a cache writes
    /// it behind the caller, who does not wait, and reads it from memory until then (`in_memory`). A backend
    /// that holds its objects already keeps nothing.
    fn keep_fetched(&self, _fetched: Fetched) {}
    /// Wait for what this backend does behind its callers (a cache's fills); nothing for most.
    fn settle(&self) {}
    /// The encoded bytes of `id` if this backend holds them in memory on their way to its files (a cache being
    /// filled behind a restore: verified when fetched); a reader uses them as it would a fetched copy.
    fn in_memory(&self, _id: &ObjectId) -> Option<Bytes> {
        None
    }
    /// The bytes `get_into` just returned for `id` passed the hash check (a cache keeps them only then).
    fn verified(&self, _id: &ObjectId, _encoded: &[u8]) {}
    /// Where `id` lies as a plain file, for a backend that keeps objects so (a raw object is then mapped, not
    /// read: `ObjectStore::get_for_file_hash`); None: read it with `get_into`.
    fn local_file(&self, _id: &ObjectId) -> Option<std::path::PathBuf> {
        None
    }
    /// The cache and the primary copy, for a backend that keeps both; None: this backend is the only copy.
    fn layers(&self) -> Option<Layers> {
        None
    }
    /// What the layers hold (stats); all None for a single copy.
    fn usage(&self) -> Usage {
        Usage::default()
    }
}
