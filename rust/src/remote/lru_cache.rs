//! The local object cache of a bucket store.
//!
//! CONTRACT: the cache is a `LocalDir` under `<cache>/objects`, bounded by `limit` bytes (None: unbounded):
//! when it grows past the bound the least recently used files (mtime, refreshed on every hit by `CachedBackend`) go
//! until it is under 90% of it. Dedup may trust "cached ⇒ in the bucket" (`trusted`) only after `revalidate`
//! for the bucket's current gc generation: a gc on another machine bumps the generation, and the next save
//! here lists the bucket once and drops cached objects the gc deleted.
//!
//! A restore's fetched objects are written behind it (`fill_behind`, on a thread of its own, once the restore
//! verified them), so the restore returns without waiting for a second write of the bytes it fetched. Until a fill's
//! object is on disk its bytes are held in memory (`filling`): a read of it uses them (`get_into`; `holds` counts
//! it, `file_of` names no file yet), so a restore never waits for a fill. A way in that changes one object
//! (`dir_for`, `keep`, `forget`) first waits for a fill that holds that object (`settle_for`); a way in about the
//! whole cache (`dir()`, `evict`, `revalidate`, `used`) waits for every fill started before it (`settle`). So the
//! cache is never seen half-filled by a later step of the same process. The fill itself uses the fields, never those
//! ways in (it must not wait on itself).

use std::collections::HashSet;
use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use bytes::Bytes;

use super::fills::Fills;
use crate::id::ObjectId;
use crate::objects::{Backend, LocalDir, ObjectError};

pub struct LruCache {
    dir: LocalDir,
    limit: Option<u64>,
    used: AtomicU64,
    evicting: Mutex<()>,
    /// What `fill_behind` is writing (`fills.rs`).
    fills: Arc<Fills>,
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
            fills: Arc::default(),
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

    /// The cache's directory, once the fills started before this call are done.
    pub fn dir(&self) -> &LocalDir {
        self.settle();
        &self.dir
    }

    /// The cache's directory for a use of `id` alone, once no running fill holds `id`.
    pub fn dir_for(&self, id: &ObjectId) -> &LocalDir {
        self.settle_for(id);
        &self.dir
    }

    /// The encoded bytes of `id` while a running fill holds it (verified, not yet on disk).
    pub fn filling(&self, id: &ObjectId) -> Option<Bytes> {
        self.fills.bytes_of(id)
    }

    /// Wait until no running fill holds `id`.
    pub fn settle_for(&self, id: &ObjectId) {
        self.fills.settle_for(id)
    }

    /// Wait for the fills started before this call (`fill_behind`), whoever else waits too.
    pub fn settle(&self) {
        self.fills.settle()
    }

    /// Keep these verified objects (a restore's fetched copies) on a thread of its own; the caller goes on.
    /// Errors are not the caller's: the bucket has every object.
    pub fn fill_behind(self: &Arc<Self>, objects: Vec<(ObjectId, Bytes)>) {
        if objects.is_empty() {
            return;
        }
        let fill = self.fills.begin(&objects);
        let cache = Arc::clone(self);
        let write = move || {
            let _fill = fill; // ends once the files are written (or the thread is gone)
            let mut added = 0;
            for (id, encoded) in objects {
                if cache.dir.put_new(&id, &encoded).unwrap_or(false) {
                    added += encoded.len() as u64;
                }
            }
            cache.added(added);
        };
        // No thread to be had: nothing is kept (the fill ends with the closure), the objects stay in the bucket
        // and are read from there next time.
        let _ = std::thread::Builder::new().name("kvstore-cache-fill".into()).spawn(write);
    }

    /// Bytes the cached objects occupy.
    pub fn used(&self) -> u64 {
        self.settle();
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

    /// Whether `id` is cached: on disk, or held by a running fill (`filling`; its file is written before the
    /// fill lets go of it, so one of the two is always seen).
    pub fn holds(&self, id: &ObjectId) -> bool {
        self.filling(id).is_some() || self.dir.path_of(id).is_file()
    }

    /// Read `id`'s encoded bytes into `buf`: a running fill's copy, else the cached file (its mtime refreshed:
    /// least recently used = oldest mtime). False if the cache holds neither.
    pub fn get_into(&self, id: &ObjectId, buf: &mut Vec<u8>) -> Result<bool, ObjectError> {
        if let Some(filling) = self.filling(id) {
            buf.clear();
            buf.extend_from_slice(&filling);
            return Ok(true);
        }
        let dir = self.dir_for(id);
        if !dir.get_into(id, buf)? {
            return Ok(false);
        }
        let _ = dir.touch(id);
        Ok(true)
    }

    /// Where `id`'s cached file lies, once it is written: None while a running fill holds it in memory (read it
    /// with `get_into`).
    pub fn file_of(&self, id: &ObjectId) -> Option<PathBuf> {
        match self.filling(id) {
            Some(_) => None,
            None => Some(self.dir_for(id).path_of(id)),
        }
    }

    /// Keep an object's encoded bytes (errors are not the caller's: the bucket has it).
    pub fn keep(&self, id: &ObjectId, encoded: &[u8]) {
        if self.dir_for(id).put_new(id, encoded).unwrap_or(false) {
            self.added(encoded.len() as u64);
        }
    }

    /// `n` more bytes are cached (written by the caller).
    pub fn added(&self, n: u64) {
        let used = self.used.fetch_add(n, Ordering::Relaxed) + n;
        if self.limit.is_some_and(|l| used > l) {
            let _ = self.evict_now();
        }
    }

    /// Least recently used out until under 90% of the bound. Returns the bytes removed.
    pub fn evict(&self) -> Result<u64, ObjectError> {
        self.settle();
        self.evict_now()
    }

    fn evict_now(&self) -> Result<u64, ObjectError> {
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
        if let Ok(n) = self.dir_for(id).delete(id) {
            let _ = self.used.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| Some(u - n.min(u)));
        }
    }

    /// Make "cached ⇒ in the bucket" true for gc generation `gen`: if the cache last checked an older one,
    /// list the bucket (`present`) and drop what is gone. Returns how many cached objects were dropped.
    pub fn revalidate(
        &self,
        gen: u64,
        present: impl FnOnce() -> Result<HashSet<ObjectId>, ObjectError>,
    ) -> Result<usize, ObjectError> {
        self.settle();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;

    /// What is filled behind is seen whole by the cache's next reads (all of them, at once), counted once, and
    /// bounded like any keep.
    #[test]
    fn a_fill_behind_is_whole_before_the_next_read_and_counted_once() {
        let d = TempDir::new("fill");
        let objects: Vec<(ObjectId, Bytes)> = (0..48u32)
            .map(|k| {
                let bytes: Vec<u8> = (0..(64u32 << 10)).map(|i| (i.wrapping_mul(2654435761) ^ k) as u8).collect();
                (ObjectId::of(&bytes), Bytes::from(bytes))
            })
            .collect();
        let total: u64 = objects.iter().map(|(_, b)| b.len() as u64).sum();
        let cache = Arc::new(LruCache::open(d.0.clone(), None).unwrap());
        cache.fill_behind(objects.clone());
        cache.fill_behind(objects[..16].to_vec()); // a second restore's copies of the same objects
        let (last, bytes) = &objects[objects.len() - 1];
        assert!(cache.holds(last), "an object being filled is held: in memory, then on disk");
        assert!(cache.filling(last).is_none_or(|b| b == *bytes), "what a fill holds in memory is its bytes");
        assert_eq!(cache.dir_for(last).get(last).unwrap().as_deref(), Some(&bytes[..]), "dir_for waits for the file");
        assert!(cache.filling(last).is_none(), "a written object is no longer held in memory");
        let seen: Vec<u64> = std::thread::scope(|sc| {
            let readers: Vec<_> = (0..3).map(|_| sc.spawn(|| cache.used())).collect();
            readers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        assert_eq!(seen, [total; 3], "every reader waits for the fills started before it, not only the first");
        assert_eq!(cache.dir().list().unwrap().len(), objects.len(), "each object counted once");
        for (id, bytes) in &objects {
            assert_eq!(cache.dir().get(id).unwrap().as_deref(), Some(&bytes[..]));
        }

        let bounded = Arc::new(LruCache::open(d.0.join("bounded"), Some(total / 2)).unwrap());
        bounded.fill_behind(objects);
        assert!(bounded.used() <= total / 2, "a fill evicts like any keep: {} of {}", bounded.used(), total / 2);
        let held: u64 = bounded.dir().list().unwrap().iter().map(|id| bounded.dir().mtime(id).unwrap().unwrap().1).sum();
        assert_eq!(bounded.used(), held);
    }
}
