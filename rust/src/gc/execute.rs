//! Execute a plan under the catalog's gc lock: (re-mark, re-check,) delete objects, then drop index rows
//! through the index's own methods, then stale temp files.
//!
//! CONTRACT: nothing marked live, and (when re-checking a plan made without the lock) nothing whose mtime is
//! now within the grace period, is deleted; the index keeps no row of a dead manifest (nor its prefix keys)
//! or of a deleted or absent unmarked object. The caller holds the lock until the sweep is done.

use std::collections::HashSet;

use super::plan::{mark, GcPlan};
use super::GcReport;
use crate::catalog::GcLock;
use crate::error::Result;
use crate::id::ObjectId;
use crate::store::Store;

/// Carry out a plan made earlier (without the lock): take the gc lock, re-mark, re-check, sweep. What
/// became live or young since the plan is kept.
pub fn execute(store: &Store, plan: GcPlan) -> Result<GcReport> {
    let lock = store.catalog().lock_gc()?;
    sweep(store, plan, &lock, true, None)
}

/// Delete what `plan` found dead, under `lock`. `recheck`: the plan was made without the lock, so mark again
/// and re-read each planned object's mtime against the lock's clock. `ceiling`: the bytes a backend that copies
/// survivors (a bucket's packs) may hold meanwhile (`Backend::delete_many`; an eviction's cap, None for a gc);
/// what it leaves stays dead, counted in `kept_packed`, with its index row, for the next gc.
pub(super) fn sweep(
    store: &Store,
    mut plan: GcPlan,
    lock: &GcLock,
    recheck: bool,
    ceiling: Option<u64>,
) -> Result<GcReport> {
    let backend = store.objects().backend();
    let cutoff = lock.now.checked_sub(plan.grace).unwrap_or(std::time::SystemTime::UNIX_EPOCH);
    if recheck {
        plan.marks = mark(store)?;
    }
    let marks = &plan.marks;
    let mut report = GcReport {
        live_objects: marks.objects.len(),
        dead_objects: 0,
        freed_bytes: 0,
        kept_young: plan.kept_young,
        kept_packed: 0,
        kept_packed_bytes: 0,
        removed_temp: 0,
        dead_manifests: 0,
        dry_run: false,
    };
    let mut doomed: Vec<(ObjectId, u64)> = Vec::new();
    for &(id, len) in &plan.dead_objects {
        if marks.objects.contains(&id) {
            continue;
        }
        let len = match recheck {
            false => len,
            true => match backend.mtime(&id)? {
                None => continue,
                Some((mtime, _)) if mtime > cutoff => {
                    report.kept_young += 1;
                    continue;
                }
                Some((_, len)) => len,
            },
        };
        doomed.push((id, len));
    }
    let ids: Vec<ObjectId> = doomed.iter().map(|d| d.0).collect();
    let left: HashSet<ObjectId> = backend.delete_many(&ids, ceiling)?.into_iter().collect();
    let mut deleted: HashSet<ObjectId> = HashSet::new();
    for (id, len) in doomed {
        if left.contains(&id) {
            report.kept_packed += 1;
            report.kept_packed_bytes += len;
        } else {
            report.freed_bytes += len;
            deleted.insert(id);
        }
    }
    report.dead_objects = deleted.len();

    let ix = store.index();
    let mut w = ix.write_txn()?;
    let dead_manifests: HashSet<ObjectId> = ix.manifest_ids(&w)?.into_iter().filter(|id| !marks.manifests.contains(id)).collect();
    report.dead_manifests = dead_manifests.len();
    let mut dead_rows = Vec::new();
    for id in ix.object_ids(&w)? {
        if deleted.contains(&id) || (!marks.objects.contains(&id) && !backend.exists(&id)?) {
            dead_rows.push(id);
        }
    }
    ix.drop_manifests(&mut w, &dead_manifests)?;
    ix.drop_object_rows(&mut w, &dead_rows)?;
    w.commit().map_err(|e| ix.err(e))?;
    report.removed_temp = backend.clean_temp(plan.grace)?;
    Ok(report)
}
