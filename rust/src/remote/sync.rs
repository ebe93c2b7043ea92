//! The local index brought up to date from the bucket; `reindex` rebuilds it from nothing.
//!
//! CONTRACT: `sync(namespace)` lists the bucket's names (of one namespace, or all), reads the records whose
//! ETag differs from the index row's (16 in flight), fetches the manifests the index lacks and the records do
//! not carry (`names::INLINE_MANIFEST_MAX`; through the cache), and in one write transaction puts name rows
//! (keeping `last_used` when the manifest is unchanged), manifest rows and prefix keys (recomputed per
//! namespace), and drops rows of names gone from the bucket.
//! The index is only a cache of the bucket: `reindex` clears names, manifests, prefixes and object rows,
//! then syncs everything. Object rows (sizes) come only from this machine's saves. `read_name` mirrors the one
//! record a read by name just fetched (so a save after a restore here knows what it replaces). Prefix rows
//! are written by the index's one writer (`Index::put_prefixes`), the same rows an ingest writes.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::client::{Bucket, PARALLEL};
use super::names::{self, RemoteName};
use crate::catalog::SyncReport;
use crate::error::Result;
use crate::id::ObjectId;
use crate::index::{HeedExt, Index, NameRecord};
use crate::manifest::Manifest;
use crate::objects::{ObjectError, ObjectStore};
use crate::scope::Scope;

/// What a sync reads and writes: the bucket's name records, objects through the cache (manifests, verified),
/// this machine's index; and when each namespace was last synced.
pub struct Mirror {
    pub(super) bucket: Arc<Bucket>,
    pub(super) cached: ObjectStore,
    pub(super) index: Arc<Index>,
    pub(super) block_size: u32,
    last_sync: Mutex<HashMap<Option<String>, Instant>>,
}

impl Mirror {
    pub(super) fn new(bucket: Arc<Bucket>, cached: ObjectStore, index: Arc<Index>, block_size: u32) -> Mirror {
        Mirror { bucket, cached, index, block_size, last_sync: Mutex::new(HashMap::new()) }
    }

    /// Whether `namespace` (None: all) was synced less than `within` ago.
    pub(super) fn synced_within(&self, namespace: Option<&str>, within: Duration) -> bool {
        let m = self.last_sync.lock().unwrap_or_else(|e| e.into_inner());
        [namespace.map(str::to_string), None].iter().any(|k| m.get(k).is_some_and(|t| t.elapsed() < within))
    }

    fn note_synced(&self, namespace: Option<&str>) {
        let mut m = self.last_sync.lock().unwrap_or_else(|e| e.into_inner());
        m.insert(namespace.map(str::to_string), Instant::now());
    }

    fn forget_syncs(&self) {
        self.last_sync.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

type Fetched = (String, String, Option<(RemoteName, String)>);

/// Bring the index up to date with the bucket's names (of `namespace`, or all).
pub fn sync(c: &Mirror, namespace: Option<&str>) -> Result<SyncReport> {
    let t0 = Instant::now();
    let bucket = &*c.bucket;
    let listed = names::list(bucket, namespace)?;
    let ix = &*c.index;
    let local: HashMap<(String, String), NameRecord> = {
        let r = ix.read_txn()?;
        ix.names_in(&r, namespace)?.into_iter().map(|(ns, n, rec)| ((ns, n), rec)).collect()
    };
    let todo: Vec<(String, String)> = listed
        .iter()
        .filter(|(ns, n, etag)| {
            local.get(&(ns.clone(), n.clone())).is_none_or(|rec| etag.is_none() || rec.etag != *etag)
        })
        .map(|(ns, n, _)| (ns.clone(), n.clone()))
        .collect();
    let fetched: Vec<Fetched> = bucket.run_all(todo, PARALLEL, |(ns, n)| async move {
        let rec = names::read_async(bucket, &ns, &n).await?;
        Ok((ns, n, rec))
    })?;

    // Manifests the index lacks: fetched in parallel through the cache, each verified (manifests are unkeyed).
    let mut manifests: HashMap<ObjectId, (Manifest, Vec<u8>)> = HashMap::new();
    for (rec, _) in fetched.iter().filter_map(|f| f.2.as_ref()) {
        if let Some(json) = rec.inline_manifest() {
            if let Ok(m) = Manifest::from_json(rec.manifest, json) {
                manifests.insert(rec.manifest, (m, json.to_vec()));
            }
        }
    }
    let known: HashSet<ObjectId> = {
        let r = ix.read_txn()?;
        let mut k: HashSet<ObjectId> = manifests.keys().copied().collect();
        for (_, _, rec) in &fetched {
            if let Some((rec, _)) = rec {
                if ix.manifests.get(&r, &rec.manifest).ix(ix)?.is_some() {
                    k.insert(rec.manifest);
                }
            }
        }
        k
    };
    let need: Vec<ObjectId> = fetched
        .iter()
        .filter_map(|f| f.2.as_ref().map(|r| r.0.manifest))
        .filter(|id| !known.contains(id))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let from_bucket = c.cached.backend().fetch(&need)?;
    for id in &need {
        // A missing or corrupt manifest still gets its name row (gc then refuses, verify names it).
        let got = match c.cached.get_fetched(id, &Scope::Unkeyed, &|_| Vec::new(), &from_bucket) {
            Ok(got) => got,
            Err(ObjectError::Missing { .. } | ObjectError::Corrupt { .. }) => {
                from_bucket.reject(id);
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if let Ok(m) = Manifest::from_json(*id, &got.bytes) {
            manifests.insert(*id, (m, got.bytes));
        }
    }
    c.cached.keep_fetched(from_bucket);

    let mut report = SyncReport { names: listed.len(), manifests_fetched: need.len(), ..Default::default() };
    let listed_set: HashSet<(&str, &str)> = listed.iter().map(|(ns, n, _)| (ns.as_str(), n.as_str())).collect();
    let mut w = ix.write_txn()?;
    for (ns, n, rec) in &fetched {
        let Some((rec, etag)) = rec else {
            report.removed += ix.names.delete(&mut w, &(ns.as_str(), n.as_str())).ix(ix)? as usize;
            continue;
        };
        let prev = local.get(&(ns.clone(), n.clone()));
        let last_used = prev.filter(|p| p.manifest == rec.manifest).map_or(rec.created, |p| p.last_used);
        let row = NameRecord {
            manifest: rec.manifest,
            created: rec.created,
            last_used,
            etag: Some(etag.clone()),
            displaced: rec.displaced.clone(),
            retention: rec.retention,
        };
        ix.names.put(&mut w, &(ns.as_str(), n.as_str()), &row).ix(ix)?;
        report.updated += 1;
        let m = match manifests.get(&rec.manifest) {
            Some((m, json)) => {
                ix.manifests.put(&mut w, &rec.manifest, json).ix(ix)?;
                m.clone()
            }
            None => match ix.manifests.get(&w, &rec.manifest).ix(ix)? {
                Some(json) => Manifest::from_json(rec.manifest, json)?,
                None => continue,
            },
        };
        put_prefixes(c, &mut w, ns, rec.manifest, &m)?;
    }
    for (ns, n) in local.keys() {
        if !listed_set.contains(&(ns.as_str(), n.as_str())) {
            report.removed += ix.names.delete(&mut w, &(ns.as_str(), n.as_str())).ix(ix)? as usize;
        }
    }
    w.commit().ix(ix)?;
    c.note_synced(namespace);
    report.elapsed_s = t0.elapsed().as_secs_f64();
    Ok(report)
}

/// A name's record read from the bucket (`names::row`: Some(None) = no such name, None = unreachable, the
/// index serves), mirrored into the index so this machine's next save of it knows what it replaces.
pub(super) fn read_name(
    c: &Mirror,
    namespace: &str,
    name: &str,
    local: Option<&NameRecord>,
) -> Result<Option<Option<names::RowRead>>> {
    let read = names::row(&c.bucket, namespace, name, local)?;
    match &read {
        Some(Some(got)) if local.is_none_or(|l| l.etag != got.row.etag) => {
            mirror(c, namespace, name, &got.row, got.manifest_json.as_deref())?
        }
        Some(None) if local.is_some() => unmirror(c, namespace, name)?,
        _ => {}
    }
    Ok(read)
}

/// Mirror one bucket record just read into the index: its name row, manifest row and prefix keys. The manifest
/// comes from the index, else from the record (`carried`, verified by `names`), else from the bucket.
fn mirror(c: &Mirror, namespace: &str, name: &str, row: &NameRecord, carried: Option<&[u8]>) -> Result<()> {
    let ix = &*c.index;
    let known = {
        let r = ix.read_txn()?;
        ix.manifests.get(&r, &row.manifest).ix(ix)?.map(<[u8]>::to_vec)
    };
    let json = match (known, carried) {
        (Some(j), _) => j,
        (None, Some(j)) => j.to_vec(),
        (None, None) => c.cached.get(&row.manifest, &Scope::Unkeyed)?.bytes,
    };
    let m = Manifest::from_json(row.manifest, &json)?;
    let mut w = ix.write_txn()?;
    ix.names.put(&mut w, &(namespace, name), row).ix(ix)?;
    ix.manifests.put(&mut w, &row.manifest, &json).ix(ix)?;
    put_prefixes(c, &mut w, namespace, row.manifest, &m)?;
    w.commit().ix(ix)?;
    Ok(())
}

/// Drop the row of a name the bucket no longer has.
fn unmirror(c: &Mirror, namespace: &str, name: &str) -> Result<()> {
    let ix = &*c.index;
    let mut w = ix.write_txn()?;
    ix.names.delete(&mut w, &(namespace, name)).ix(ix)?;
    w.commit().ix(ix)?;
    Ok(())
}

/// The prefix keys of manifest `mid` in `namespace` (the same rows an ingest writes).
fn put_prefixes(c: &Mirror, w: &mut heed::RwTxn, namespace: &str, mid: ObjectId, m: &Manifest) -> Result<()> {
    let Ok(fid) = m.fingerprint_id.parse::<ObjectId>() else { return Ok(()) };
    Ok(c.index.put_prefixes(w, namespace, &fid.0, &m.tokens, c.block_size, mid)?)
}

/// Rebuild the index from the bucket: clear it, then sync every namespace.
pub fn reindex(c: &Mirror) -> Result<SyncReport> {
    let ix = &*c.index;
    let mut w = ix.write_txn()?;
    ix.names.clear(&mut w).ix(ix)?;
    ix.manifests.clear(&mut w).ix(ix)?;
    ix.prefixes.clear(&mut w).ix(ix)?;
    ix.objects.clear(&mut w).ix(ix)?;
    w.commit().ix(ix)?;
    c.forget_syncs();
    sync(c, None)
}
