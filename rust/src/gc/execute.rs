//! Execute a plan under the exclusive lock: re-mark, re-check, delete objects, then drop index rows through
//! the index's own methods, then stale temp files.

use std::collections::HashSet;
use std::time::SystemTime;

use super::plan::{mark, GcPlan};
use super::GcReport;
use crate::error::Result;
use crate::id::ObjectId;
use crate::store::Store;

/// Carry out a plan under the exclusive lock. What became live or young since the plan is kept.
pub fn execute(store: &Store, plan: GcPlan) -> Result<GcReport> {
    let backend = store.objects().backend();
    let cutoff = SystemTime::now().checked_sub(plan.grace).unwrap_or(SystemTime::UNIX_EPOCH);
    let _lock = store.lock_exclusive()?;
    let marks = mark(store)?;
    let mut report = GcReport {
        live_objects: marks.objects.len(),
        dead_objects: 0,
        freed_bytes: 0,
        kept_young: plan.kept_young,
        removed_temp: 0,
        dead_manifests: 0,
        dry_run: false,
    };
    let mut deleted: HashSet<ObjectId> = HashSet::new();
    for (id, _) in plan.dead_objects {
        if marks.objects.contains(&id) {
            continue;
        }
        let Some((mtime, _)) = backend.mtime(&id)? else { continue };
        if mtime >= cutoff {
            report.kept_young += 1;
            continue;
        }
        report.freed_bytes += backend.delete(&id)?;
        report.dead_objects += 1;
        deleted.insert(id);
    }

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

