//! A store in an S3 bucket, with the local disk as a cache (docs/design.md "Remote store (S3)"): the two seams
//! of a store implemented over a bucket, the objects (`CachedBackend`, an `objects::Backend`) and the names
//! and locks (`BucketCatalog`, a `catalog::Catalog`). Nothing here knows `Store`: `open` returns the parts,
//! and `crate::open` assembles them.
//!
//! | file | job |
//! |---|---|
//! | `url.rs` | parse `s3://bucket/prefix` |
//! | `error.rs` | `RemoteError`, and its one conversion into the backend-neutral `Unavailable` |
//! | `client.rs` | the bucket client (object_store on a small tokio runtime) |
//! | `s3.rs` | the S3 client from the AWS environment variables |
//! | `keys.rs` | object keys and unique suffixes of the bucket layout |
//! | `pack.rs` | the pack: objects uploaded together, with their index and a trailer |
//! | `pack_map.rs` | `PackMap`: where each packed object lies, from the packs' indexes |
//! | `hints.rs` | `Hints`: the packs and object places name records just read named, tried by reads that miss |
//! | `prune.rs` | the prune's plan: which packs are rewritten with what, which orphans are mended or deleted |
//! | `bucket_objects.rs` | `BucketObjects`: objects in the bucket, packed, create-if-absent; the prune executed |
//! | `fills.rs` | `Fills`: what the cache is writing behind its restores, their objects' bytes until on disk |
//! | `lru_cache.rs` | `LruCache`: the local directory of cached objects (LRU bound, trust after a gc elsewhere) |
//! | `cached_backend.rs` | `CachedBackend`: the `Backend` of a bucket behind the `LruCache` |
//! | `names.rs` | name records, changed only by compare-and-swap |
//! | `locks.rs` | shared/exclusive lock files, the gc generation |
//! | `sync.rs` | the local index brought up to date from the bucket; `reindex` |
//! | `catalog.rs` | `BucketCatalog`: the `Catalog` of names, locks and sync in the bucket |
//!
//! CONTRACT: bucket layout under the prefix: `config.json` (block size, fixed at creation), `packs/` (a save's
//! objects, with their indexes), `objects/` (loose objects: manifests, and what older versions wrote),
//! `names/`, `locks/`, `gc-generation`, `quarantine/`. The cache directory holds `index/` (LMDB, a
//! rebuildable cache of the bucket), `objects/` (cached objects), `remote.json` (which bucket it caches; a
//! cache directory of another bucket is refused), `lock`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

mod bucket_objects;
mod cached_backend;
mod catalog;
mod client;
mod error;
mod fills;
mod hints;
mod keys;
mod locks;
mod lru_cache;
mod pack;
mod pack_map;
mod prune;
pub mod names;
mod s3;
mod sync;
pub mod url;
#[cfg(test)]
mod pack_tests;
#[cfg(test)]
mod restore_tests;
#[cfg(test)]
mod tests;

pub use bucket_objects::BucketObjects;
pub use cached_backend::CachedBackend;
pub use catalog::BucketCatalog;
pub use client::{Bucket, Meta};
pub use error::RemoteError;
pub use keys::object_key;
pub use locks::LockGuard;
pub use lru_cache::LruCache;
pub use url::{is_remote, BucketUrl};

use crate::catalog::LockFile;
use crate::error::{Error, Result};
use crate::index::Index;
use crate::objects::ObjectStore;

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

/// What a bucket store is made of, for `Store::from_parts`.
pub struct Parts {
    /// The cache directory (canonical).
    pub root: PathBuf,
    pub index: Arc<Index>,
    /// Objects through the cache (`CachedBackend`).
    pub objects: ObjectStore,
    pub catalog: Arc<BucketCatalog>,
}

#[derive(Serialize, Deserialize)]
struct Config {
    version: u32,
    block_size: u32,
}

/// Open a bucket store (`s3://bucket/prefix`, client from the AWS environment) with its cache in `cache_dir`.
pub fn open(location: &str, cache_dir: &Path, cache_size: Option<u64>, block_size: u32, map_size: usize) -> Result<Parts> {
    let url = url::parse(location)?;
    let bucket = s3::client(&url)?;
    open_with(bucket, cache_dir, cache_size, block_size, map_size, RemoteOptions::default())
}

/// Open a bucket store over any client (unit tests use `InMemory`).
pub fn open_with(
    bucket: Bucket,
    cache_dir: &Path,
    cache_size: Option<u64>,
    block_size: u32,
    map_size: usize,
    opts: RemoteOptions,
) -> Result<Parts> {
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
    let cache = Arc::new(LruCache::open(root.clone(), cache_size)?);
    let bucket_objects = BucketObjects::new(bucket.clone(), opts.stale_lock);
    let objects = ObjectStore::new(Box::new(CachedBackend { cache: cache.clone(), bucket: bucket_objects.clone(), bucket_reads: Default::default() }));
    let index = Index::open(&root.join("index"), map_size.max(1 << 20), config.block_size)?;
    let made_with = index.block_size()?;
    if made_with != config.block_size {
        return Err(Error::Invalid(format!(
            "cache directory {} was made with block size {} but the bucket's is {}; remove the cache directory (it is rebuilt from the bucket)",
            root.display(),
            made_with,
            config.block_size
        )));
    }
    let lock_file = LockFile::new(root.join("lock"))?;
    let catalog = BucketCatalog::new(bucket, bucket_objects, cache, objects.clone(), index.clone(), made_with, opts, lock_file);
    Ok(Parts { root, index, objects, catalog: Arc::new(catalog) })
}
