//! `CachedBackend`, the `Backend` of a bucket store: the bucket behind the local cache (`lru_cache.rs`).
//!
//! CONTRACT: reads try the cache, then the bucket; bytes fetched from the bucket are kept only after they
//! passed a hash check: their own (`verified`), or the restored file's (`fetch`, then `keep_fetched`, which
//! writes them behind the restore: `LruCache::fill_behind`; dropping this backend waits for it). A put goes to
//! the bucket first, then to the cache, so a cached object was in the bucket. Dedup
//! (`touch`) trusts the cache once it was revalidated, else asks the bucket (HEAD). A corrupt copy is
//! quarantined where it was read: the cache's if it holds one, else the bucket's.

use std::cell::Cell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::bucket_objects::BucketObjects;
use super::lru_cache::LruCache;
use crate::id::ObjectId;
use crate::objects::{Backend, Fetched, Layers, LocalDir, ObjectError, Stamped, Usage};

thread_local! {
    /// The object the last `get_into` on this thread fetched from the bucket (kept once verified).
    static FROM_BUCKET: Cell<Option<ObjectId>> = const { Cell::new(None) };
}

/// A bucket behind the local cache.
pub struct CachedBackend {
    pub cache: Arc<LruCache>,
    pub bucket: BucketObjects,
    /// `get_into` calls answered by the bucket (`Backend::reads_from_afar`).
    pub bucket_reads: AtomicU64,
}

/// A fill still writing when the store closes finishes first: the cache is whole before anyone else may look.
impl Drop for CachedBackend {
    fn drop(&mut self) {
        self.cache.settle();
    }
}

impl Backend for CachedBackend {
    fn put_file(&self, id: &ObjectId, encoded: &[u8]) -> Result<(), ObjectError> {
        self.bucket.put_file(id, encoded)?;
        self.cache.keep(id, encoded);
        Ok(())
    }

    fn put_files(
        &self,
        ids: &[ObjectId],
        make: &(dyn Fn(usize) -> Result<Option<Vec<u8>>, ObjectError> + Sync),
    ) -> Result<Vec<Option<u64>>, ObjectError> {
        let encoded = self.bucket.encode_and_upload(ids, make)?;
        let fresh: Vec<usize> = (0..ids.len()).filter(|&i| encoded[i].is_some() && !self.cache.holds(&ids[i])).collect();
        let fresh_ids: Vec<ObjectId> = fresh.iter().map(|&i| ids[i]).collect();
        let put = self.cache.dir().put_files(&fresh_ids, &|k| Ok(encoded[fresh[k]].as_ref().map(|b| b.to_vec())));
        if let Ok(sizes) = put {
            self.cache.added(sizes.iter().flatten().sum());
        }
        Ok(encoded.iter().map(|e| e.as_ref().map(|b| b.len() as u64)).collect())
    }

    fn get(&self, id: &ObjectId) -> Result<Option<Vec<u8>>, ObjectError> {
        let mut buf = Vec::new();
        Ok(self.get_into(id, &mut buf)?.then_some(buf))
    }

    fn get_into(&self, id: &ObjectId, buf: &mut Vec<u8>) -> Result<bool, ObjectError> {
        FROM_BUCKET.with(|c| c.set(None));
        if self.cache.get_into(id, buf)? {
            return Ok(true);
        }
        self.bucket_reads.fetch_add(1, Ordering::AcqRel);
        match self.bucket.get(id)? {
            Some(bytes) => {
                *buf = bytes;
                FROM_BUCKET.with(|c| c.set(Some(*id)));
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn holds_here(&self, ids: &[ObjectId]) -> bool {
        ids.iter().all(|id| self.cache.holds(id))
    }

    fn reads_from_afar(&self) -> u64 {
        self.bucket_reads.load(Ordering::Acquire)
    }

    fn verified(&self, id: &ObjectId, encoded: &[u8]) {
        if FROM_BUCKET.with(|c| c.take()) == Some(*id) {
            self.cache.keep(id, encoded);
        }
    }

    /// What the cache lacks, from the bucket (ranged GETs in parallel); an object the bucket lacks is left out
    /// (its read reports it missing).
    fn fetch(&self, ids: &[ObjectId]) -> Result<Fetched, ObjectError> {
        let missing: Vec<ObjectId> = ids.iter().filter(|id| !self.cache.holds(id)).copied().collect();
        if missing.is_empty() {
            return Ok(Fetched::default());
        }
        let got = self.bucket.download(missing.clone())?;
        Ok(Fetched::new(missing.into_iter().zip(got).filter_map(|(id, b)| b.map(|b| (id, b))).collect()))
    }

    fn streams(&self) -> bool {
        self.bucket.bucket.streams_restores()
    }

    /// What the cache holds, read from it; the rest streamed from the bucket (`BucketObjects::download_each`).
    /// None where the bucket does not stream restores (`KVSTORE_S3_STREAM`; by default, one on loopback).
    fn stream(&self, ids: &[ObjectId], deliver: &(dyn Fn(usize, bytes::Bytes) + Sync)) -> Result<Option<Vec<usize>>, ObjectError> {
        if !self.streams() {
            return Ok(None);
        }
        let (held, afar): (Vec<usize>, Vec<usize>) = (0..ids.len()).partition(|&k| self.cache.holds(&ids[k]));
        if afar.is_empty() {
            return Ok(None);
        }
        let mut absent = Vec::new();
        for k in held {
            let mut buf = Vec::new();
            match self.cache.get_into(&ids[k], &mut buf)? {
                true => deliver(k, buf.into()),
                false => absent.push(k), // evicted meanwhile: from the bucket too
            }
        }
        let mut afar = afar;
        afar.extend(absent);
        self.bucket_reads.fetch_add(1, Ordering::AcqRel);
        let afar_ids: Vec<ObjectId> = afar.iter().map(|&k| ids[k]).collect();
        let absent = self.bucket.download_each(&afar_ids, &|j, bytes| deliver(afar[j], bytes))?;
        Ok(Some(absent.into_iter().map(|j| afar[j]).collect()))
    }

    /// What the cache lacks of `fetched` (its rejected copies left out), written behind the caller.
    fn keep_fetched(&self, fetched: Fetched) {
        let fresh: Vec<(ObjectId, bytes::Bytes)> =
            fetched.accepted().filter(|(id, _)| !self.cache.holds(id)).map(|(id, b)| (*id, b.clone())).collect();
        self.cache.fill_behind(fresh);
    }

    fn settle(&self) {
        self.cache.settle();
    }

    /// A cached copy is a plain file (a raw one is mapped by a restore, and checked by its file hash), once its
    /// fill wrote it; before that it is `in_memory`.
    fn local_file(&self, id: &ObjectId) -> Option<PathBuf> {
        self.cache.file_of(id)
    }

    fn in_memory(&self, id: &ObjectId) -> Option<bytes::Bytes> {
        self.cache.filling(id)
    }

    fn exists(&self, id: &ObjectId) -> Result<bool, ObjectError> {
        Ok(self.cache.holds(id) || self.bucket.exists(id)?)
    }

    fn list(&self) -> Result<Vec<ObjectId>, ObjectError> {
        self.bucket.list()
    }

    fn delete(&self, id: &ObjectId) -> Result<u64, ObjectError> {
        let n = self.bucket.delete(id)?;
        self.cache.forget(id);
        Ok(n)
    }

    /// gc: the bucket's deletes run concurrently, then the cache forgets what went.
    fn delete_many(&self, ids: &[ObjectId], ceiling: Option<u64>) -> Result<Vec<ObjectId>, ObjectError> {
        let left = self.bucket.delete_many(ids, ceiling)?;
        let kept: std::collections::HashSet<&ObjectId> = left.iter().collect();
        for id in ids.iter().filter(|id| !kept.contains(id)) {
            self.cache.forget(id);
        }
        Ok(left)
    }

    /// gc's listing: the bucket's, one request per 1000 objects (LastModified is the bucket's clock).
    fn list_stamped(&self) -> Result<Vec<Stamped>, ObjectError> {
        self.bucket.list_stamped()
    }

    /// verify: the cached copies (a directory of its own, so a corrupt one is quarantined there) and the
    /// bucket's.
    fn layers(&self) -> Option<Layers> {
        let cache = LocalDir::new(self.cache.dir().root().to_path_buf()).ok()?;
        Some(Layers { cache: Box::new(cache), primary: Box::new(self.bucket.clone()) })
    }

    /// stats: the bucket's objects (None when it cannot be listed just now) and the cache's bytes and bound.
    fn usage(&self) -> Usage {
        let primary = self.bucket.stored().ok();
        Usage { primary, cache: Some((self.cache.used(), self.cache.limit())) }
    }

    fn mtime(&self, id: &ObjectId) -> Result<Option<(SystemTime, u64)>, ObjectError> {
        self.bucket.mtime(id)
    }

    /// Dedup at ingest: a cached object is in the bucket once the cache was revalidated for this gc
    /// generation (the save's shared lock keeps a gc out until its name is committed); else a HEAD.
    fn touch(&self, id: &ObjectId) -> Result<Option<u64>, ObjectError> {
        if self.cache.trusted.load(Ordering::Acquire) {
            if let Some(len) = self.cache.dir_for(id).touch(id)? {
                return Ok(Some(len));
            }
        }
        self.bucket.touch(id)
    }

    fn stale_temp(&self, grace: Duration) -> Result<usize, ObjectError> {
        self.cache.dir().stale_temp(grace)
    }

    fn clean_temp(&self, grace: Duration) -> Result<usize, ObjectError> {
        self.cache.dir().clean_temp(grace)
    }

    fn quarantine(&self, id: &ObjectId) -> Result<(), ObjectError> {
        if self.cache.holds(id) {
            self.cache.forget(id);
            Ok(())
        } else {
            self.bucket.quarantine(id)
        }
    }
}
