//! Stats: names, manifests, objects and the dedup/compression ratios, from the index alone (no object reads).
//!
//! CONTRACT: syncs the names first (quietly: an unreachable place leaves the index as it is); sizes are the
//! index's object rows (this machine's saves); a layered backend adds what its primary copy and its cache
//! hold (`Backend::usage`; the primary's counts are None when it could not be listed).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::Store;
use crate::error::Result;
use crate::id::ObjectId;
use crate::index::HeedExt;

#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub names: u64,
    pub manifests: u64,
    pub objects: u64,
    pub logical_bytes: u64,
    pub unique_raw_bytes: u64,
    pub stored_bytes: u64,
    pub dedup_ratio: f64,
    pub compression_ratio: f64,
    pub total_ratio: f64,
    pub block_size: u32,
    /// Bucket stores (None otherwise, or when the bucket is unreachable): objects and bytes in the bucket.
    pub bucket_objects: Option<u64>,
    pub bucket_bytes: Option<u64>,
    /// Bucket stores: bytes in the local cache, and its bound (None: unbounded).
    pub cache_bytes: Option<u64>,
    pub cache_limit: Option<u64>,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        1.0
    } else {
        a as f64 / b as f64
    }
}

impl Store {
    pub fn stats(&self) -> Result<Stats> {
        #[derive(Deserialize)]
        struct Sizes {
            file_bytes: u64,
        }
        self.sync_quietly(None)?;
        let ix = &*self.index;
        let r = ix.read_txn()?;
        let mut logical = 0u64;
        let mut names = 0u64;
        let mut sizes: HashMap<ObjectId, u64> = HashMap::new();
        for (_, _, rec) in ix.names_in(&r, None)? {
            names += 1;
            let id = rec.manifest;
            if let Some(&n) = sizes.get(&id) {
                logical += n;
                continue;
            }
            let n = match ix.manifests.get(&r, &id).ix(ix)? {
                Some(b) => serde_json::from_slice::<Sizes>(b).map(|s| s.file_bytes).unwrap_or(0),
                None => 0,
            };
            sizes.insert(id, n);
            logical += n;
        }
        let usage = self.objects.backend().usage();
        let (mut objects, mut raw, mut stored) = (0u64, 0u64, 0u64);
        for kv in ix.objects.iter(&r).ix(ix)? {
            let (_, row) = kv.ix(ix)?;
            objects += 1;
            raw += row.raw_len;
            stored += row.stored_len;
        }
        Ok(Stats {
            names,
            manifests: ix.manifests.len(&r).ix(ix)?,
            objects,
            logical_bytes: logical,
            unique_raw_bytes: raw,
            stored_bytes: stored,
            dedup_ratio: ratio(logical, raw),
            compression_ratio: ratio(raw, stored),
            total_ratio: ratio(logical, stored),
            block_size: self.block_size,
            bucket_objects: usage.primary.map(|b| b.0),
            bucket_bytes: usage.primary.map(|b| b.1),
            cache_bytes: usage.cache.map(|c| c.0),
            cache_limit: usage.cache.and_then(|c| c.1),
        })
    }
}
