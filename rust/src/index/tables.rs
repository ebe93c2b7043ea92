//! Typed reads and edits over the index tables that take more than one `get`/`put`: a name's row in a read of
//! its own, name rows of a namespace, manifests at a prefix key, the one writer of prefix rows, and the edits gc makes (dropping
//! dead manifests with their prefix keys, dropping object rows).
//!
//! CONTRACT: callers never see key bytes; every prefix row is written by `put_prefixes` (an ingest's and a
//! sync's rows are the same rows: `h(k) ‖ manifest → tokens covered`, k = 1..floor(n/B)).

use std::collections::HashSet;

use heed::{RoTxn, RwTxn};

use super::codec::{NamespaceRange, PrefixRange};
use super::{HeedExt, Index, IndexError, NameRecord};
use crate::id::ObjectId;
use crate::prefix_keys::prefix_chain;

/// A `names` row: (namespace, name, record).
pub type NameRow = (String, String, NameRecord);

fn layout_key(namespace: &str, fingerprint_id: &str) -> String {
    format!("layout:{fingerprint_id}:{namespace}")
}

impl Index {
    /// A name's row, read in a transaction of its own.
    pub fn name_row(&self, namespace: &str, name: &str) -> Result<Option<NameRecord>, IndexError> {
        let r = self.read_txn()?;
        self.names.get(&r, &(namespace, name)).ix(self)
    }

    /// Name rows of one namespace, or of all, in (namespace, name) order.
    pub fn names_in(&self, r: &RoTxn<'_>, namespace: Option<&str>) -> Result<Vec<NameRow>, IndexError> {
        let mut out = Vec::new();
        match namespace {
            Some(ns) => {
                for kv in self.names.remap_key_type::<NamespaceRange>().prefix_iter(r, ns).ix(self)? {
                    let ((ns, name), rec) = kv.ix(self)?;
                    out.push((ns.to_string(), name.to_string(), rec));
                }
            }
            None => {
                for kv in self.names.iter(r).ix(self)? {
                    let ((ns, name), rec) = kv.ix(self)?;
                    out.push((ns.to_string(), name.to_string(), rec));
                }
            }
        }
        Ok(out)
    }

    /// The layout recorded for states of one fingerprint id in one namespace (`meta` row `layout:<fid>:<ns>`;
    /// the fid is fixed-width hex, so the key is unambiguous). A rebuilt index has none until an ingest finds one.
    pub fn layout_of(&self, r: &RoTxn<'_>, namespace: &str, fingerprint_id: &str) -> Result<Option<String>, IndexError> {
        Ok(self.meta.get(r, &layout_key(namespace, fingerprint_id)).ix(self)?.map(str::to_string))
    }

    pub fn put_layout(&self, w: &mut RwTxn<'_>, namespace: &str, fingerprint_id: &str, layout: &str) -> Result<(), IndexError> {
        self.meta.put(w, &layout_key(namespace, fingerprint_id), layout).ix(self)
    }

    /// Manifests recorded under prefix key `h` (states whose token prefix hashes to it).
    pub fn manifests_at_prefix(&self, r: &RoTxn<'_>, h: &[u8; 32]) -> Result<Vec<ObjectId>, IndexError> {
        let mut out = Vec::new();
        for kv in self.prefixes.remap_key_type::<PrefixRange>().prefix_iter(r, h).ix(self)? {
            let ((_, manifest), _) = kv.ix(self)?;
            out.push(manifest);
        }
        Ok(out)
    }

    /// The prefix rows of `manifest` (tokens `tokens`, of fingerprint id `fingerprint_id`) in `namespace`:
    /// one row per full block of the prefix-key chain, valued by the tokens it covers.
    pub fn put_prefixes(
        &self,
        w: &mut RwTxn<'_>,
        namespace: &str,
        fingerprint_id: &[u8; 32],
        tokens: &[i32],
        block_size: u32,
        manifest: ObjectId,
    ) -> Result<(), IndexError> {
        for (k, h) in prefix_chain(namespace, fingerprint_id, tokens, block_size).iter().enumerate() {
            let covered = ((k as u64 + 1) * block_size as u64).min(u32::MAX as u64) as u32;
            self.prefixes.put(w, &(*h, manifest), &covered).ix(self)?;
        }
        Ok(())
    }

    /// Every manifest id with a row.
    pub fn manifest_ids(&self, r: &RoTxn<'_>) -> Result<Vec<ObjectId>, IndexError> {
        self.manifests.iter(r).ix(self)?.map(|kv| kv.map(|(id, _)| id).ix(self)).collect()
    }

    /// Every object id with a row.
    pub fn object_ids(&self, r: &RoTxn<'_>) -> Result<Vec<ObjectId>, IndexError> {
        self.objects.iter(r).ix(self)?.map(|kv| kv.map(|(id, _)| id).ix(self)).collect()
    }

    /// Drop the rows of these manifests and every prefix key that points at one of them.
    pub fn drop_manifests(&self, w: &mut RwTxn<'_>, dead: &HashSet<ObjectId>) -> Result<(), IndexError> {
        let mut keys = Vec::new();
        for kv in self.prefixes.iter(w).ix(self)? {
            let (k, _) = kv.ix(self)?;
            if dead.contains(&k.1) {
                keys.push(k);
            }
        }
        for k in &keys {
            self.prefixes.delete(w, k).ix(self)?;
        }
        for id in dead {
            self.manifests.delete(w, id).ix(self)?;
        }
        Ok(())
    }

    /// Drop these objects' rows (the files are gone).
    pub fn drop_object_rows(&self, w: &mut RwTxn<'_>, ids: &[ObjectId]) -> Result<(), IndexError> {
        for id in ids {
            self.objects.delete(w, id).ix(self)?;
        }
        Ok(())
    }
}
