//! The local object cache of a bucket store.
//!
//! CONTRACT: the cache is a `LocalDir` under `<cache>/objects`, bounded by `limit` bytes (None: unbounded):
//! when it grows past the bound the least recently used files (mtime, refreshed on every hit by `CachedBackend`) go
//! until it is under 90% of it. Dedup may trust "cached ⇒ in the bucket" (`trusted`) only after `revalidate`
//! for the bucket's current gc generation: a gc on another machine bumps the generation, and the next save
//! here lists the bucket once and drops cached objects the gc deleted.

use std::collections::HashSet;
use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

use crate::id::ObjectId;
use crate::objects::{Backend, LocalDir, ObjectError};

pub struct LruCache {
    pub dir: LocalDir,
    limit: Option<u64>,
    used: AtomicU64,
    evicting: Mutex<()>,
    gen_path: PathBuf,
    pub(super) trusted: AtomicBool,
}

impl LruCache {
    pub fn open(root: PathBuf, limit: Option<u64>) -> Result<LruCache, ObjectError> {
        let dir = LocalDir::volatile(root.join("objects"))?;
        let cache = LruCache {
            dir,
            limit,
            used: AtomicU64::new(0),
            evicting: Mutex::new(()),
            gen_path: root.join("gc-generation"),
            trusted: AtomicBool::new(false),
        };
        let used: u64 = cache.files()?.iter().map(|f| f.2).sum();
        cache.used.store(used, Ordering::Relaxed);
        Ok(cache)
    }

    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// Bytes the cached objects occupy.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// (id, mtime, size) of every cached object.
    fn files(&self) -> Result<Vec<(ObjectId, SystemTime, u64)>, ObjectError> {
        let mut out = Vec::new();
        for id in self.dir.list()? {
            if let Some((t, len)) = self.dir.mtime(&id)? {
                out.push((id, t, len));
            }
        }
        Ok(out)
    }

    pub fn holds(&self, id: &ObjectId) -> bool {
        self.dir.path_of(id).is_file()
    }

    /// Keep an object's encoded bytes (errors are not the caller's: the bucket has it).
    pub fn keep(&self, id: &ObjectId, encoded: &[u8]) {
        if self.holds(id) {
            return;
        }
        if self.dir.put_file(id, encoded).is_ok() {
            self.added(encoded.len() as u64);
        }
    }

    pub fn added(&self, n: u64) {
        let used = self.used.fetch_add(n, Ordering::Relaxed) + n;
        if self.limit.is_some_and(|l| used > l) {
            let _ = self.evict();
        }
    }

    /// Least recently used out until under 90% of the bound. Returns the bytes removed.
    pub fn evict(&self) -> Result<u64, ObjectError> {
        let Some(limit) = self.limit else { return Ok(0) };
        let _one = self.evicting.lock().unwrap_or_else(|e| e.into_inner());
        let mut files = self.files()?;
        let mut used: u64 = files.iter().map(|f| f.2).sum();
        files.sort_by_key(|f| f.1);
        let target = limit / 10 * 9;
        let mut freed = 0;
        for (id, _, _) in files {
            if used <= target {
                break;
            }
            let n = self.dir.delete(&id)?;
            used -= n.min(used);
            freed += n;
        }
        self.used.store(used, Ordering::Relaxed);
        Ok(freed)
    }

    pub fn forget(&self, id: &ObjectId) {
        if let Ok(n) = self.dir.delete(id) {
            self.used.fetch_sub(n.min(self.used()), Ordering::Relaxed);
        }
    }

    /// Make "cached ⇒ in the bucket" true for gc generation `gen`: if the cache last checked an older one,
    /// list the bucket (`present`) and drop what is gone. Returns how many cached objects were dropped.
    pub fn revalidate(
        &self,
        gen: u64,
        present: impl FnOnce() -> Result<HashSet<ObjectId>, ObjectError>,
    ) -> Result<usize, ObjectError> {
        let seen = fs::read_to_string(&self.gen_path).ok().and_then(|s| s.trim().parse::<u64>().ok());
        let mut dropped = 0;
        if seen != Some(gen) {
            let cached = self.dir.list()?;
            if !cached.is_empty() {
                let present = present()?;
                for id in cached.iter().filter(|id| !present.contains(id)) {
                    self.forget(id);
                    dropped += 1;
                }
            }
            let temp = crate::objects::atomic::TempName { prefix: ".gen", suffix: ".tmp" };
            crate::objects::atomic::atomic_write(&self.gen_path, temp, gen.to_string().as_bytes(), false, || {
                Ok::<(), ObjectError>(())
            })?;
        }
        self.trusted.store(true, Ordering::Release);
        Ok(dropped)
    }
}
