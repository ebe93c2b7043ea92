//! The plan: mark live objects in one read transaction, list what is unreachable. Changes nothing.
//!
//! CONTRACT: `mark` is the one marking (names, their manifests, displaced manifests; refuses on an unreadable
//! live manifest); `plan_at(now)` lists the backend once (`list_stamped`) and splits the unmarked objects
//! into dead (not newer than `now - grace`) and young; `plan` is `plan_at` the local clock. An object stamped
//! with the gc lock's own time is dead: a bucket's clock counts whole seconds, so an object saved before the
//! lock was taken (no save runs under it) may carry the lock's second; counted young, an eviction's victims
//! stayed in the bucket until the next one.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use super::GcReport;
use crate::error::{Error, Result};
use crate::id::ObjectId;
use crate::store::Store;

/// What a gc would do, computed without changing anything.
#[derive(Debug, Clone)]
pub struct GcPlan {
    pub(super) marks: Marks,
    pub grace: Duration,
    pub live_objects: usize,
    /// Unreachable objects past the grace period, with their stored bytes.
    pub dead_objects: Vec<(ObjectId, u64)>,
    pub kept_young: usize,
    /// Manifests with an index row that no name references.
    pub dead_manifests: Vec<ObjectId>,
    /// Temp files past the grace period.
    pub stale_temp: usize,
}

impl GcPlan {
    /// The plan as a report (a dry run).
    pub fn report(&self) -> GcReport {
        GcReport {
            live_objects: self.live_objects,
            dead_objects: self.dead_objects.len(),
            freed_bytes: self.dead_objects.iter().map(|d| d.1).sum(),
            kept_young: self.kept_young,
            kept_packed: 0,
            kept_packed_bytes: 0,
            removed_temp: self.stale_temp,
            dead_manifests: self.dead_manifests.len(),
            dry_run: true,
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Marks {
    pub(super) objects: HashSet<ObjectId>,
    pub(super) manifests: HashSet<ObjectId>,
}

pub(super) fn mark(store: &Store) -> Result<Marks> {
    let r = store.index().read_txn()?;
    let (names, manifests, unreadable) = store.live_set(&r)?;
    if let Some(id) = unreadable.first() {
        let who: Vec<String> = names
            .iter()
            .filter(|(_, m)| m == id)
            .map(|(n, _)| if n.namespace.is_empty() { n.name.clone() } else { format!("{}/{}", n.namespace, n.name) })
            .collect();
        return Err(Error::Invalid(format!(
            "gc refused: manifest {id} of state '{}' is missing or unreadable, so the objects it needs are unknown; \
             run `kvstore verify`, then remove the broken name(s) and run gc again",
            who.join("', '")
        )));
    }
    let mut objects = HashSet::new();
    for (mid, refs) in &manifests {
        objects.insert(*mid);
        objects.extend(refs.iter().copied());
    }
    Ok(Marks { objects, manifests: manifests.keys().copied().collect() })
}

/// Mark, and list what is unreachable: objects past the grace period, manifest rows, temp files.
pub fn plan(store: &Store, grace: Duration) -> Result<GcPlan> {
    plan_at(store, grace, SystemTime::now())
}

/// `plan` with the grace period measured back from `now` (the gc lock's clock).
pub(super) fn plan_at(store: &Store, grace: Duration, now: SystemTime) -> Result<GcPlan> {
    let backend = store.objects().backend();
    let cutoff = now.checked_sub(grace).unwrap_or(SystemTime::UNIX_EPOCH);
    let marks = mark(store)?;
    let mut plan = GcPlan {
        live_objects: marks.objects.len(),
        marks,
        grace,
        dead_objects: Vec::new(),
        kept_young: 0,
        dead_manifests: Vec::new(),
        stale_temp: backend.stale_temp(grace)?,
    };
    for (id, mtime, len) in backend.list_stamped()? {
        if plan.marks.objects.contains(&id) {
            continue;
        }
        if mtime > cutoff {
            plan.kept_young += 1;
        } else {
            plan.dead_objects.push((id, len));
        }
    }
    let ix = store.index();
    let r = ix.read_txn()?;
    plan.dead_manifests = ix.manifest_ids(&r)?.into_iter().filter(|id| !plan.marks.manifests.contains(id)).collect();
    Ok(plan)
}
