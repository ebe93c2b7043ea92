//! gc across machines: mark from the names in the bucket, sweep what is unreachable and older than the grace
//! period (the bucket's LastModified against the bucket's clock), under the exclusive lock.
//!
//! Contract: take the exclusive lock (`locks.rs`: refuses if another gc holds one, waits for saves in flight),
//! bump the gc generation (so every machine's next save stops trusting its cache for dedup), sync every name
//! into the index, mark (names, their manifests, and manifests displaced by a lost race), list the bucket's
//! objects, delete the unmarked ones older than `grace` (16 in flight), drop them from this machine's cache,
//! then drop index rows of dead manifests and deleted objects. A save in flight holds a shared lock, so it is
//! never between upload and name commit while this runs; objects of a crashed save age out after `grace`.
//! A dry run takes no lock, bumps nothing and deletes nothing.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use super::backend::{object_key, PARALLEL};
use super::{locks, sync, Remote};
use crate::error::Result;
use crate::gc::{mark, GcReport};
use crate::id::ObjectId;
use crate::store::Store;

pub fn gc(store: &Store, remote: &Remote, grace: Duration, dry_run: bool) -> Result<GcReport> {
    let bucket = &*remote.bucket;
    let lock = match dry_run {
        true => None,
        false => Some(locks::exclusive(&remote.bucket, remote.opts.stale_lock, remote.opts.lock_wait)?),
    };
    let now = lock.as_ref().map_or_else(SystemTime::now, |l| l.written);
    if !dry_run {
        locks::bump_generation(bucket)?;
    }
    sync::sync(store, remote, None)?;
    let marks = mark(store)?;
    let cutoff = now.checked_sub(grace).unwrap_or(SystemTime::UNIX_EPOCH);
    let mut report = GcReport {
        live_objects: marks.objects.len(),
        dead_objects: 0,
        freed_bytes: 0,
        kept_young: 0,
        removed_temp: store.objects().backend().stale_temp(grace)?,
        dead_manifests: 0,
        dry_run,
    };
    let mut dead: Vec<(ObjectId, u64)> = Vec::new();
    for (id, meta) in remote.objects.list_meta()? {
        if marks.objects.contains(&id) {
            continue;
        }
        if meta.modified >= cutoff {
            report.kept_young += 1;
        } else {
            dead.push((id, meta.size));
        }
    }
    report.dead_objects = dead.len();
    report.freed_bytes = dead.iter().map(|d| d.1).sum();
    let ix = store.index();
    let dead_manifests: HashSet<ObjectId> = {
        let r = ix.read_txn()?;
        ix.manifest_ids(&r)?.into_iter().filter(|id| !marks.manifests.contains(id)).collect()
    };
    report.dead_manifests = dead_manifests.len();
    if dry_run {
        return Ok(report);
    }
    let ids: Vec<ObjectId> = dead.iter().map(|d| d.0).collect();
    bucket.run_all(ids.clone(), PARALLEL, |id| async move { bucket.delete_async(&object_key(&id)).await })?;
    for id in &ids {
        remote.cache.forget(id);
    }
    let mut w = ix.write_txn()?;
    ix.drop_manifests(&mut w, &dead_manifests)?;
    ix.drop_object_rows(&mut w, &ids)?;
    w.commit().map_err(|e| ix.err(e))?;
    report.removed_temp = store.objects().backend().clean_temp(grace)?;
    drop(lock);
    Ok(report)
}
