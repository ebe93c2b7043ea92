//! A store in an S3 bucket, with the local disk as a cache (docs/design.md "Remote store (S3)").
//!
//! | file | job |
//! |---|---|
//! | `url.rs` | parse `s3://bucket/prefix` |
//! | `client.rs` | the bucket client (object_store on a small tokio runtime), `RemoteError` |
//! | `s3.rs` | the S3 client from the AWS environment variables |
//! | `backend.rs` | `BucketObjects`: objects in the bucket, create-if-absent |
//! | `cache.rs` | the local object cache (LRU bound, trust after a gc elsewhere) |
//! | `cached.rs` | `Cached`, the `Backend` of a bucket behind the cache |
//! | `names.rs` | name records, changed only by compare-and-swap |
//! | `locks.rs` | shared/exclusive lock files, the gc generation |
//! | `sync.rs` | the local index brought up to date from the bucket; `reindex` |
//! | `gc.rs` | gc across machines |
//!
//! Bucket layout under the prefix: `config.json` (block size, fixed at creation), `objects/`, `names/`,
//! `locks/`, `gc-generation`, `quarantine/`. The cache directory holds `index/` (LMDB, a rebuildable cache of
//! the bucket), `objects/` (cached objects), `remote.json` (which bucket it caches), `lock`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

mod backend;
mod cache;
mod cached;
mod client;
pub mod gc;
mod locks;
pub mod names;
mod s3;
pub mod sync;
pub mod url;
#[cfg(test)]
mod tests;

pub use backend::{object_key, BucketObjects};
pub use cache::Cache;
pub use cached::Cached;
pub use client::{Bucket, Meta, RemoteError};
pub use locks::LockGuard;
pub use sync::SyncReport;
pub use url::{is_remote, BucketUrl};

use crate::error::{Error, Result};
use crate::objects::ObjectStore;
use crate::store::Store;

/// Timing of the lock protocol and of syncs.
#[derive(Debug, Clone, Copy)]
pub struct RemoteOptions {
    /// A lock older than this (bucket clock) is a crashed holder's and is ignored.
    pub stale_lock: Duration,
    /// How long a save waits for a gc, and a gc for saves in flight.
    pub lock_wait: Duration,
    /// Lookups sync a namespace's names at most this often (and always on a miss).
    pub sync_interval: Duration,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            stale_lock: Duration::from_secs(600),
            lock_wait: Duration::from_secs(30),
            sync_interval: Duration::from_secs(1),
        }
    }
}

pub struct Remote {
    pub bucket: Arc<Bucket>,
    pub objects: BucketObjects,
    pub cache: Arc<Cache>,
    pub opts: RemoteOptions,
    last_sync: Mutex<HashMap<Option<String>, Instant>>,
}

#[derive(Serialize, Deserialize)]
struct Config {
    version: u32,
    block_size: u32,
}

impl Remote {
    pub fn url(&self) -> &str {
        self.bucket.url()
    }

    /// A save's lock: shared lock in the bucket, then the cache made trustworthy for dedup.
    pub(crate) fn save_lock(&self) -> Result<LockGuard> {
        let guard = locks::shared(&self.bucket, self.opts.stale_lock, self.opts.lock_wait)?;
        let (gen, _) = locks::generation(&self.bucket)?;
        let objects = self.objects.clone();
        self.cache.revalidate(gen, move || Ok(objects.list_meta()?.into_iter().map(|(id, _)| id).collect()))?;
        Ok(guard)
    }

    /// Whether `namespace` (None: all) was synced less than `within` ago.
    pub(crate) fn synced_within(&self, namespace: Option<&str>, within: Duration) -> bool {
        let m = self.last_sync.lock().unwrap_or_else(|e| e.into_inner());
        [namespace.map(str::to_string), None].iter().any(|k| m.get(k).is_some_and(|t| t.elapsed() < within))
    }

    pub(crate) fn note_synced(&self, namespace: Option<&str>) {
        let mut m = self.last_sync.lock().unwrap_or_else(|e| e.into_inner());
        m.insert(namespace.map(str::to_string), Instant::now());
    }

    pub(crate) fn forget_syncs(&self) {
        self.last_sync.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// Open a local store (a path) or a bucket store (`s3://...`, which needs `cache`); `cache`/`cache_size` are
/// refused for a local one.
pub fn open_location(
    location: &str,
    cache: Option<&Path>,
    cache_size: Option<u64>,
    block_size: u32,
    level: i32,
    map_size: usize,
) -> Result<Store> {
    if is_remote(location) {
        let cache = cache.ok_or_else(|| {
            Error::Invalid(format!("a bucket store ({location}) needs cache=: the local cache directory"))
        })?;
        open(location, cache, cache_size, block_size, level, map_size)
    } else if cache.is_some() || cache_size.is_some() {
        Err(Error::Invalid(format!("cache= and cache_size= are for a bucket store (s3://...); {location} is a local store")))
    } else {
        Store::open(Path::new(location), block_size, level, map_size)
    }
}

/// Open a bucket store (`s3://bucket/prefix`, client from the AWS environment) with its cache in `cache_dir`.
pub fn open(
    location: &str,
    cache_dir: &Path,
    cache_size: Option<u64>,
    block_size: u32,
    level: i32,
    map_size: usize,
) -> Result<Store> {
    let url = url::parse(location)?;
    let bucket = s3::client(&url)?;
    open_with(bucket, cache_dir, cache_size, block_size, level, map_size, RemoteOptions::default())
}

/// Open a bucket store over any client (unit tests use `InMemory`).
pub fn open_with(
    bucket: Bucket,
    cache_dir: &Path,
    cache_size: Option<u64>,
    block_size: u32,
    level: i32,
    map_size: usize,
    opts: RemoteOptions,
) -> Result<Store> {
    crate::store::check_params(block_size, level)?;
    let bucket = Arc::new(bucket);
    // The block size is the bucket's, fixed by the first store opened on it: prefix keys and blocks depend on it.
    let wanted = Config { version: 1, block_size };
    bucket.put_create("config.json", Bytes::from(serde_json::to_vec(&wanted).expect("config serializes")))?;
    let (bytes, _) = bucket.get("config.json")?.ok_or_else(|| RemoteError::Invalid {
        url: bucket.url().into(),
        detail: "config.json vanished after it was written".into(),
    })?;
    let config: Config = serde_json::from_slice(&bytes)
        .map_err(|e| RemoteError::Invalid { url: bucket.url().into(), detail: format!("config.json: {e}") })?;

    std::fs::create_dir_all(cache_dir).map_err(|e| Error::io(cache_dir, e))?;
    let root = cache_dir.canonicalize().map_err(|e| Error::io(cache_dir, e))?;
    let marker = root.join("remote.json");
    let mine = serde_json::json!({ "url": bucket.url() }).to_string();
    match std::fs::read_to_string(&marker) {
        Ok(s) if s == mine => {}
        Ok(s) => {
            return Err(Error::Invalid(format!(
                "cache directory {} belongs to another store ({s}); give this store its own cache directory",
                root.display()
            )))
        }
        Err(_) => std::fs::write(&marker, &mine).map_err(|e| Error::io(&marker, e))?,
    }
    let cache = Arc::new(Cache::open(root.clone(), cache_size)?);
    let objects = BucketObjects::new(bucket.clone());
    let backend = Cached { cache: cache.clone(), bucket: objects.clone() };
    let remote = Remote { bucket, objects, cache, opts, last_sync: Mutex::new(HashMap::new()) };
    let store = Store::assemble(root, ObjectStore::new(Box::new(backend)), config.block_size, level, map_size, Some(Arc::new(remote)))?;
    if store.block_size() != config.block_size {
        return Err(Error::Invalid(format!(
            "cache directory {} was made with block size {} but the bucket's is {}; remove the cache directory (it is rebuilt from the bucket)",
            store.path().display(),
            store.block_size(),
            config.block_size
        )));
    }
    Ok(store)
}
