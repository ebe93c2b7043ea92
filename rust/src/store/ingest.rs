//! Ingest: a slot file (or an already decomposed one) → objects, then one index transaction.
//!
//! CONTRACT: validates name and namespace; refuses a file whose sections are not all there for the model the
//! fingerprint describes (`n_layer`, `n_swa`: `format::Shape`); refuses a file whose layout differs from a
//! `layout` the caller knows, or else (unless `force`) from the layout of the states already stored under the
//! same fingerprint in the namespace (a tenant's refusal never depends on another namespace); writes skeleton, distinct blocks and manifest in one durable batch under the
//! catalog's save lock, has the catalog commit the name (where names live: a reader never sees a name whose
//! objects are not all stored), then commits manifest, name, prefix and object rows in one LMDB transaction.
//! Objects are addressed in the namespace's scope (`crate::scope`), which the manifest records. A parent is
//! lineage only: an unknown one (or a manifest of another scope) is recorded as none. The report carries the
//! state's layout, so a caller learning its server's layout needs no second read.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use super::file_check::FileSums;
use super::Store;
use crate::catalog::Committed;
use crate::error::Result;
use crate::format::{self, Decomposed};
use crate::id::{hex, ObjectId};
use crate::index::{validate_name, HeedExt, ObjectRow};
use crate::manifest::{
    fingerprint_id, layout_is_empty, model_shape, now_f64, now_secs, Fingerprint, Manifest, ManifestError,
    LAYOUT, MANIFEST_VERSION, N_CTX_SLOT, N_LAYER,
};
use crate::objects::Put;
use crate::scope::Scope;

#[derive(Debug, Clone, Serialize)]
pub struct IngestReport {
    pub name: String,
    pub namespace: String,
    pub manifest_id: String,
    pub n_tokens: u64,
    pub file_bytes: u64,
    /// The state's cache layout (`format::layout`), as `get` reports it.
    pub layout: String,
    /// Block references in the state (repeats counted).
    pub blocks: usize,
    /// Objects (blocks, skeleton, manifest) written by this ingest.
    pub new_objects: usize,
    /// Uncompressed bytes of the new objects.
    pub new_raw_bytes: u64,
    /// On-disk bytes of the new objects.
    pub new_stored_bytes: u64,
    /// Uncompressed bytes of this state's distinct objects that were already stored.
    pub reused_bytes: u64,
    pub parent_manifest: Option<String>,
    /// The name's retention after this save (carried over from its previous state).
    pub ttl_s: Option<f64>,
    pub pinned: bool,
    pub elapsed_s: f64,
}

impl Store {
    /// Store a slot file under (namespace, name), replacing the previous state of that name. `force` stores a
    /// layout that differs from the namespace's other states under the fingerprint (a server's own save after a
    /// change of cache configuration; the hooks pass it).
    pub fn ingest(
        &self,
        name: &str,
        namespace: &str,
        file: &[u8],
        fingerprint: &Fingerprint,
        parent: Option<&str>,
        force: bool,
    ) -> Result<IngestReport> {
        let t0 = Instant::now();
        validate_name(name, "name")?;
        validate_name(namespace, "namespace")?;
        let (d, sums) = rayon::join(|| format::decompose(file, self.block_size), || FileSums::of(file));
        self.ingest_decomposed(name, namespace, file.len() as u64, sums, d?, fingerprint, parent, force, t0)
    }

    /// Ingest an already decomposed file (`file_bytes`/`sums` describe the original).
    #[allow(clippy::too_many_arguments)]
    pub fn ingest_decomposed(
        &self,
        name: &str,
        namespace: &str,
        file_bytes: u64,
        sums: FileSums,
        d: Decomposed,
        fingerprint: &Fingerprint,
        parent: Option<&str>,
        force: bool,
        t0: Instant,
    ) -> Result<IngestReport> {
        validate_name(name, "name")?;
        validate_name(namespace, "namespace")?;
        // An empty slot (0 tokens) is not a state: restoring it would only clear a slot.
        if d.tokens.is_empty() {
            return Err(format::FormatError::Empty.into());
        }
        let ix = &*self.index;
        let parent_manifest = match parent {
            Some(p) => self.resolve_parent(namespace, p)?,
            None => None,
        };

        // A `layout` the caller knows for its server (learned from an earlier save) must match the file's: a file
        // cut at a section boundary, or saved by another cache configuration, parses but would never restore.
        // (Empty slots, which carry no layers, were refused above.) The layout itself lives in the manifest.
        d.shape.check(&model_shape(fingerprint))?;
        let mut fingerprint = fingerprint.clone();
        let caller_layout = fingerprint.remove(LAYOUT);
        if let Some(want) = &caller_layout {
            if *want != d.layout {
                return Err(ManifestError::FingerprintMismatch {
                    state: name.into(),
                    key: LAYOUT.into(),
                    stored: d.layout.clone(),
                    server: want.clone(),
                }
                .into());
            }
        }
        let fingerprint = &fingerprint;

        // Hash every block (parallel) in the namespace's scope (dedup never crosses namespaces), keep the first
        // occurrence of each distinct one.
        let scope = Scope::of_namespace(namespace);
        let ids: Vec<ObjectId> = d.blocks.par_iter().map(|b| scope.id_of(&b.bytes)).collect();
        let mut seen = HashSet::with_capacity(ids.len());
        let distinct: Vec<usize> = (0..ids.len()).filter(|&i| seen.insert(ids[i])).collect();

        let skeleton_id = scope.id_of(&d.skeleton);
        let fid = fingerprint_id(fingerprint);
        let manifest = Manifest {
            version: MANIFEST_VERSION,
            fingerprint: fingerprint.clone(),
            fingerprint_id: hex(&fid),
            layout: d.layout.clone(),
            n_tokens: d.tokens.len() as u64,
            tokens: d.tokens.clone(),
            file_bytes,
            file_hash: sums.blake3_hex(),
            skeleton: skeleton_id,
            blocks: ids.clone(),
            block_size: self.block_size,
            parent: parent_manifest,
            created: now_secs(),
            n_stream: d.n_stream,
            scope: scope.namespace().map(str::to_string),
            file_xxh3: Some(sums.xxh3_hex()),
        };
        let json = manifest.to_json();
        let mid = ObjectId::of(&json);

        // Skeleton, distinct blocks and manifest in one batch: encoded in parallel, all durable (files and
        // their directories fsynced) before the index commit below.
        let mut items: Vec<(ObjectId, &[u8], u8)> = Vec::with_capacity(distinct.len() + 2);
        items.push((skeleton_id, &d.skeleton, 1));
        items.extend(distinct.iter().map(|&i| (ids[i], d.blocks[i].bytes.as_slice(), d.blocks[i].elem_size)));
        items.push((mid, &json, 1));
        // Ids are distinct unless the skeleton or the manifest equals a block (only by hash collision).
        let mut seen_items = HashSet::with_capacity(items.len());
        items.retain(|x| seen_items.insert(x.0));
        let _lock = self.catalog.lock_save()?;
        // Under the save lock, so two first saves of one fingerprint cannot both set the layout. A fingerprint that
        // names nothing (no key but fit limits) binds the state to no server: no layout is compared or recorded.
        let fid_hex = hex(&fid);
        let unbound = fingerprint.keys().all(|k| k == N_CTX_SLOT || k == N_LAYER);
        let record_layout = match (&caller_layout, force) {
            _ if unbound => false,
            (Some(_), _) | (None, true) => true,
            (None, false) => match self.layout_under(namespace, &fid_hex)? {
                Some(stored) if stored != d.layout => {
                    return Err(ManifestError::LayoutDiffers { state: name.into(), stored, file: d.layout.clone() }.into())
                }
                Some(_) => false,
                None => true,
            },
        };
        let puts: HashMap<ObjectId, Put> =
            self.objects.put_many(&items, self.level)?.into_iter().map(|p| (p.id, p)).collect();
        let skeleton_put = puts[&skeleton_id];
        let block_puts: Vec<Put> = distinct.iter().map(|&i| puts[&ids[i]]).collect();
        let manifest_put = puts[&mid];

        // Accounting over this state's distinct objects.
        let mut rows: Vec<(ObjectId, ObjectRow, bool)> = Vec::with_capacity(block_puts.len() + 2);
        rows.push((skeleton_put.id, row(d.skeleton.len(), &skeleton_put), skeleton_put.was_new));
        for (&i, p) in distinct.iter().zip(&block_puts) {
            rows.push((p.id, row(d.blocks[i].bytes.len(), p), p.was_new));
        }
        rows.push((mid, row(json.len(), &manifest_put), manifest_put.was_new));
        let mut seen_rows = HashSet::new();
        rows.retain(|r| seen_rows.insert(r.0));
        let (mut new_objects, mut new_raw, mut new_stored, mut reused) = (0usize, 0u64, 0u64, 0u64);
        for (_, r, was_new) in &rows {
            if *was_new {
                new_objects += 1;
                new_raw += r.raw_len;
                new_stored += r.stored_len;
            } else {
                reused += r.raw_len;
            }
        }

        // Every object is stored; now the name, where names live.
        let state = Committed { id: mid, manifest: &manifest, json: &json };
        let mut record = self.catalog.commit_name(namespace, name, &state, now_f64())?;

        // One transaction: manifest, name, prefix and object rows.
        let mut w = ix.write_txn()?;
        // A new state of a name keeps the name's retention (a catalog elsewhere carried it over itself).
        if record.retention.is_default() {
            if let Some(old) = ix.names.get(&w, &(namespace, name)).ix(ix)? {
                record.retention = old.retention;
            }
        }
        ix.manifests.put(&mut w, &mid, &json).ix(ix)?;
        ix.names.put(&mut w, &(namespace, name), &record).ix(ix)?;
        ix.put_prefixes(&mut w, namespace, &fid, &d.tokens, self.block_size, mid)?;
        if record_layout && !layout_is_empty(&d.layout) {
            ix.put_layout(&mut w, namespace, &fid_hex, &d.layout)?;
        }
        for (id, r, _) in &rows {
            ix.objects.put(&mut w, id, r).ix(ix)?;
        }
        w.commit().ix(ix)?;
        drop(_lock);

        Ok(IngestReport {
            name: name.into(),
            namespace: namespace.into(),
            manifest_id: mid.hex(),
            n_tokens: manifest.n_tokens,
            file_bytes,
            layout: manifest.layout,
            blocks: ids.len(),
            new_objects,
            new_raw_bytes: new_raw,
            new_stored_bytes: new_stored,
            reused_bytes: reused,
            parent_manifest: manifest.parent.map(|p| p.hex()),
            ttl_s: record.retention.ttl_s,
            pinned: record.retention.pinned,
            elapsed_s: t0.elapsed().as_secs_f64(),
        })
    }

    /// A parent given as a name in the same namespace, or as a stored manifest id (hex) of a state saved in the
    /// same scope (another tenant's manifest is unknown here: a reply naming it would tell that it exists).
    /// Unknown parents are recorded as none: the state itself is complete, the parent is only lineage.
    fn resolve_parent(&self, namespace: &str, parent: &str) -> Result<Option<ObjectId>> {
        let ix = &*self.index;
        let r = ix.read_txn()?;
        if validate_name(parent, "name").is_ok() {
            if let Some(rec) = ix.names.get(&r, &(namespace, parent)).ix(ix)? {
                return Ok(Some(rec.manifest));
            }
        }
        if let Ok(id) = parent.parse::<ObjectId>() {
            if let Some(json) = ix.manifests.get(&r, &id).ix(ix)? {
                if Manifest::from_json(id, json)?.object_scope() == Scope::of_namespace(namespace) {
                    return Ok(Some(id));
                }
            }
        }
        validate_name(parent, "name")?;
        Ok(None)
    }

    /// The layout of the states stored under fingerprint id `fid_hex` in `namespace`: the index's row, else (an
    /// index rebuilt, or written before the row existed) the first such state's manifest, read from this index.
    fn layout_under(&self, namespace: &str, fid_hex: &str) -> Result<Option<String>> {
        let ix = &*self.index;
        let r = ix.read_txn()?;
        if let Some(l) = ix.layout_of(&r, namespace, fid_hex)? {
            return Ok(Some(l));
        }
        for (_, _, rec) in ix.names_in(&r, Some(namespace))? {
            let Some(json) = ix.manifests.get(&r, &rec.manifest).ix(ix)? else { continue };
            let m = Manifest::from_json(rec.manifest, json)?;
            if m.fingerprint_id == fid_hex && !layout_is_empty(&m.layout) {
                return Ok(Some(m.layout));
            }
        }
        Ok(None)
    }
}

fn row(raw_len: usize, p: &Put) -> ObjectRow {
    ObjectRow { raw_len: raw_len as u64, stored_len: p.stored_len }
}
