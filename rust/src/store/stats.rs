//! Stats: names, manifests, objects and the dedup/compression ratios, from the index alone (no object reads).
//!
//! CONTRACT: syncs the names first (quietly: an unreachable place leaves the index as it is); sizes are the
//! index's object rows (this machine's saves); a layered backend adds what its primary copy and its cache
//! hold (`Backend::usage`; the primary's counts are None when it could not be listed, or when the names'
//! sync found it unreachable). `namespace_stats(ns)` is the same figures for one namespace: its names, the
//! manifests they reference (displaced ones too) and the distinct objects those need, nothing store-wide
//! (bucket and cache sizes None). With scoped object ids (`crate::scope`) no object of a namespace `!= ""` is
//! shared with another, so its `stored_bytes` are bytes that namespace alone holds, and they never depend on
//! what another tenant stored.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::Store;
use crate::error::Result;
use crate::id::ObjectId;
use crate::index::{validate_name, HeedExt};

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

impl Stats {
    /// Figures from counts and sizes, with no bucket or cache part.
    fn of(names: u64, manifests: u64, objects: u64, logical: u64, raw: u64, stored: u64, block_size: u32) -> Stats {
        Stats {
            names,
            manifests,
            objects,
            logical_bytes: logical,
            unique_raw_bytes: raw,
            stored_bytes: stored,
            dedup_ratio: ratio(logical, raw),
            compression_ratio: ratio(raw, stored),
            total_ratio: ratio(logical, stored),
            block_size,
            bucket_objects: None,
            bucket_bytes: None,
            cache_bytes: None,
            cache_limit: None,
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        1.0
    } else {
        a as f64 / b as f64
    }
}

impl Store {
    /// One namespace's figures (see the file's contract): what a tenant may see of the store.
    pub fn namespace_stats(&self, namespace: &str) -> Result<Stats> {
        validate_name(namespace, "namespace")?;
        self.sync_quietly(Some(namespace))?;
        let ix = &*self.index;
        let r = ix.read_txn()?;
        let (mut names, mut logical) = (0u64, 0u64);
        let mut manifests: HashMap<ObjectId, u64> = HashMap::new();
        let mut objects: HashSet<ObjectId> = HashSet::new();
        for (_, _, rec) in ix.names_in(&r, Some(namespace))? {
            names += 1;
            for (k, mid) in std::iter::once(rec.manifest).chain(rec.displaced).enumerate() {
                let file_bytes = match manifests.get(&mid) {
                    Some(&n) => n,
                    None => {
                        // A manifest that cannot be read adds only itself (verify names it).
                        let n = match self.read_manifest(&r, mid) {
                            Ok(m) => {
                                objects.extend(m.referenced());
                                m.file_bytes
                            }
                            Err(_) => 0,
                        };
                        objects.insert(mid);
                        manifests.insert(mid, n);
                        n
                    }
                };
                if k == 0 {
                    logical += file_bytes;
                }
            }
        }
        // Sized, like the store's figures, by the index's object rows (this machine's saves).
        let (mut n_objects, mut raw, mut stored) = (0u64, 0u64, 0u64);
        for id in &objects {
            if let Some(row) = ix.objects.get(&r, id).ix(ix)? {
                n_objects += 1;
                raw += row.raw_len;
                stored += row.stored_len;
            }
        }
        Ok(Stats::of(names, manifests.len() as u64, n_objects, logical, raw, stored, self.block_size))
    }

    pub fn stats(&self) -> Result<Stats> {
        #[derive(Deserialize)]
        struct Sizes {
            file_bytes: u64,
        }
        // An unreachable bucket's totals (which it keeps for a while, `BucketObjects::stored`) are not shown, so
        // that stats say the bucket could not be read.
        let reached = self.sync_quietly(None)?;
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
        let mut st = Stats::of(names, ix.manifests.len(&r).ix(ix)?, objects, logical, raw, stored, self.block_size);
        let primary = usage.primary.filter(|_| reached);
        st.bucket_objects = primary.map(|b| b.0);
        st.bucket_bytes = primary.map(|b| b.1);
        st.cache_bytes = usage.cache.map(|c| c.0);
        st.cache_limit = usage.cache.and_then(|c| c.1);
        Ok(st)
    }
}
