//! `BucketCatalog`: the catalog seam of a store kept in a bucket. Names live in the bucket (`names.rs`) and
//! are mirrored into this machine's LMDB index (`sync.rs`); locks are the bucket's (`locks.rs`) beside this
//! machine's `flock`.
//!
//! CONTRACT (crate::catalog): `name` reads the bucket's record (one GET) and mirrors a changed one into the
//! index; with the bucket unreachable the index serves what this machine knows (a name it never saw is
//! `Unavailable`, not "not found"). `commit_name` is the compare-and-swap of `names.rs`. `lock_save` is the
//! local shared flock, then the bucket's shared lock, then the cache made trustworthy for dedup at the
//! bucket's gc generation; `lock_gc` is the bucket's exclusive lock with the generation bumped, on the
//! bucket's clock. Lookups sync a namespace at most once per `sync_interval` (and again on a miss).

use std::sync::Arc;

use super::bucket_objects::BucketObjects;
use super::client::Bucket;
use super::locks::{self, LockGuard};
use super::lru_cache::LruCache;
use super::sync::{self, Mirror};
use super::{names, RemoteOptions};
use crate::catalog::{Catalog, Committed, Freshness, GcLock, Held, LockFile, SyncReport};
use crate::error::Result;
use crate::index::{Index, NameRecord, Retention};
use crate::objects::ObjectStore;

pub struct BucketCatalog {
    pub(super) bucket: Arc<Bucket>,
    /// The bucket's objects, without the cache (the listing a revalidation needs).
    pub(super) objects: BucketObjects,
    pub(super) cache: Arc<LruCache>,
    /// The bucket's names mirrored into this machine's index.
    pub(super) mirror: Mirror,
    pub(super) opts: RemoteOptions,
    lock_file: LockFile,
}

impl BucketCatalog {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        bucket: Arc<Bucket>,
        objects: BucketObjects,
        cache: Arc<LruCache>,
        cached: ObjectStore,
        index: Arc<Index>,
        block_size: u32,
        opts: RemoteOptions,
        lock_file: LockFile,
    ) -> BucketCatalog {
        let mirror = Mirror::new(bucket.clone(), cached, index, block_size);
        BucketCatalog { bucket, objects, cache, mirror, opts, lock_file }
    }

    pub fn url(&self) -> &str {
        self.bucket.url()
    }

    /// The bucket's shared lock, then the pack map and the cache made trustworthy for dedup at the current gc
    /// generation.
    fn bucket_save_lock(&self) -> Result<LockGuard> {
        let guard = locks::shared(&self.bucket, self.opts.stale_lock, self.opts.lock_wait)?;
        let (gen, _) = locks::generation(&self.bucket)?;
        self.objects.trust_at(gen)?;
        let objects = self.objects.clone();
        self.cache.revalidate(gen, move || Ok(objects.list_stamped_all()?.into_iter().map(|(id, _, _)| id).collect()))?;
        Ok(guard)
    }

    fn local_row(&self, namespace: &str, name: &str) -> Result<Option<NameRecord>> {
        Ok(self.mirror.index.name_row(namespace, name)?)
    }
}

impl Catalog for BucketCatalog {
    fn location(&self) -> Option<&str> {
        Some(self.bucket.url())
    }

    fn requests(&self) -> Vec<(&'static str, u64)> {
        self.bucket.requests()
    }

    fn name(&self, namespace: &str, name: &str) -> Result<Option<NameRecord>> {
        let local = self.local_row(namespace, name)?;
        match sync::read_name(&self.mirror, namespace, name, local.as_ref())? {
            Some(read) => Ok(read.map(|got| {
                self.objects.hint(&got.packs, &got.places); // where a restore of it will look first
                got.row
            })),
            None => Ok(local), // unreachable: what this machine knows
        }
    }

    fn commit_name(&self, namespace: &str, name: &str, state: &Committed, now: f64) -> Result<NameRecord> {
        let (manifest, known) = (state.id, self.local_row(namespace, name)?.map(|r| r.manifest));
        // Where its objects lie now (the save just uploaded or located them all).
        let mut ids = state.manifest.referenced();
        ids.push(manifest);
        let places = self.objects.places(&ids);
        let (rec, etag) = names::commit(&self.bucket, namespace, name, manifest, state.json, &places, now, known)?;
        let (displaced, retention) = (rec.displaced, rec.retention);
        Ok(NameRecord { manifest, created: now, last_used: now, etag: Some(etag), displaced, retention })
    }

    fn set_retention(&self, namespace: &str, name: &str, retention: Retention) -> Result<bool> {
        Ok(names::set_retention(&self.bucket, namespace, name, retention)?)
    }

    fn remove_name(&self, namespace: &str, name: &str) -> Result<bool> {
        Ok(names::remove(&self.bucket, namespace, name)?)
    }

    fn lock_save(&self) -> Result<Held> {
        let local = self.lock_file.shared()?;
        // Dropped in this order: the bucket's lock first, then the flock.
        Ok(Box::new((self.bucket_save_lock()?, local)))
    }

    fn lock_gc(&self) -> Result<GcLock> {
        let guard = locks::exclusive(&self.bucket, self.opts.stale_lock, self.opts.lock_wait)?;
        // Every machine's next save stops trusting its cache for dedup before anything is deleted.
        locks::bump_generation(&self.bucket)?;
        let now = guard.written;
        Ok(GcLock { held: Box::new(guard), now })
    }

    fn freshness(&self, namespace: &str) -> Freshness {
        match self.mirror.synced_within(Some(namespace), self.opts.sync_interval) {
            true => Freshness::Recent,
            false => Freshness::Due,
        }
    }

    fn sync(&self, namespace: Option<&str>) -> Result<Option<SyncReport>> {
        Ok(Some(sync::sync(&self.mirror, namespace)?))
    }

    fn reindex(&self) -> Result<Option<SyncReport>> {
        Ok(Some(sync::reindex(&self.mirror)?))
    }
}
