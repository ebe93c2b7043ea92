//! Garbage collection in two steps (restic's PlanPrune / Execute), on the two seams (the catalog's locks and
//! sync, the backend's listing and deletes), one implementation for every store: `plan` marks and lists
//! what would go, changing nothing (a dry run is a plan, printed); `execute` deletes it.
//!
//! CONTRACT: live = manifests referenced by names (and manifests a lost race displaced), plus their
//! skeleton and blocks. `plan` marks in one read transaction and lists unreachable objects past the grace
//! period; it refuses to go on if a live manifest is unreadable (its blocks are unknown). `gc` takes the
//! catalog's gc lock (no save is between its first object write and its commit; a catalog elsewhere also
//! tells every machine's next save to re-check its cache), syncs every name, plans against the lock's
//! clock, and sweeps: deletes the planned objects, then drops, through the index's own methods, the rows of
//! dead manifests (with their prefix keys) and of deleted or absent unmarked objects, and stale temp files.
//! `execute` of a plan made earlier without the lock takes the lock, re-marks and re-checks each planned
//! object's mtime (an ingest that reused an object refreshed it) before it sweeps. A dry run takes no lock.
//! `evict.rs`: eviction to a size (ttl, quotas, a cap), planned, then executed with this sweep.

use std::time::Duration;

use serde::Serialize;

use crate::error::Result;
use crate::store::Store;

mod evict;
mod execute;
mod plan;

pub use evict::{check_pin, evict, owned_bytes, plan_eviction, EvictPlan, EvictReport, Limits, NamespaceUse, Reason, Victim};
pub use execute::execute;
pub use plan::{plan, GcPlan};

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct GcReport {
    /// Objects reachable from names.
    pub live_objects: usize,
    /// Unreachable objects past the grace period: deleted (or, with dry_run, that would be).
    pub dead_objects: usize,
    pub freed_bytes: u64,
    /// Unreachable objects younger than the grace period, kept.
    pub kept_young: usize,
    /// Unreachable objects left in a bucket's packs for now: copying their packs' live objects out would have
    /// passed the cap (the next gc or eviction takes them).
    pub kept_packed: usize,
    pub kept_packed_bytes: u64,
    /// Temp files past the grace period removed (or that would be).
    pub removed_temp: usize,
    /// Manifest rows (and their prefix keys) no name references any more: dropped (or would be).
    pub dead_manifests: usize,
    pub dry_run: bool,
}

/// A dry run: sync, then `plan`. Else: the gc lock, sync, a plan under it, and the sweep.
pub fn gc(store: &Store, grace: Duration, dry_run: bool) -> Result<GcReport> {
    let catalog = store.catalog();
    if dry_run {
        catalog.sync(None)?;
        return Ok(plan(store, grace)?.report());
    }
    let lock = catalog.lock_gc()?;
    catalog.sync(None)?;
    let plan = plan::plan_at(store, grace, lock.now)?;
    execute::sweep(store, plan, &lock, false, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::ObjectId;
    use crate::testutil::{fp, open, put_synthetic, TempDir};
    use crate::store::Target;

    #[test]
    fn gc_keeps_shared_and_young_drops_old_unreachable() {
        let d = TempDir::new("gc");
        let s = open(&d, 16);
        let f = fp(&[("model", "m")]);
        let parent: Vec<i32> = (0..64).collect();
        let mut child = parent.clone();
        child.extend(200..232);
        let pr = put_synthetic(&s, "parent", "", &parent, &f);
        let cr = put_synthetic(&s, "child", "", &child, &f);
        assert_eq!(s.stats().unwrap().objects, 4 + 2 + 2 + 2);

        // Nothing unreachable yet.
        let r = gc(&s, Duration::ZERO, false).unwrap();
        assert_eq!((r.dead_objects, r.kept_young, r.dead_manifests), (0, 0, 0));
        assert_eq!(r.live_objects, 10);

        s.remove("parent", "").unwrap();
        // Within the grace period: kept.
        let r = gc(&s, Duration::from_secs(3600), false).unwrap();
        assert_eq!((r.dead_objects, r.kept_young), (0, 2), "{r:?}"); // parent's skeleton + manifest
        assert_eq!(r.dead_manifests, 1);

        // Dry run reports without deleting.
        let p = plan(&s, Duration::ZERO).unwrap();
        let parent_manifest = pr.manifest_id.parse::<ObjectId>().unwrap();
        assert!(p.dead_objects.iter().any(|(id, len)| *id == parent_manifest && *len > 0), "{p:?}");
        assert!(p.dead_manifests.is_empty()); // its row went with the first gc after the remove
        let dry = gc(&s, Duration::ZERO, true).unwrap();
        assert_eq!(dry, p.report());
        assert_eq!(dry.dead_objects, 2);
        assert!(dry.freed_bytes > 0);
        assert!(s.objects().exists(&pr.manifest_id.parse::<ObjectId>().unwrap()).unwrap());

        let r = gc(&s, Duration::ZERO, false).unwrap();
        assert_eq!(r.dead_objects, 2);
        assert_eq!(r.freed_bytes, dry.freed_bytes);
        assert_eq!(r.live_objects, 8);
        assert!(!s.objects().exists(&pr.manifest_id.parse::<ObjectId>().unwrap()).unwrap());
        // The child (sharing every parent block) is intact; the index lost the dead rows.
        s.load(&Target::Name { namespace: "", name: "child" }, None).unwrap();
        let st = s.stats().unwrap();
        assert_eq!((st.objects, st.manifests), (8, 1));
        let hit = s.lookup(&parent, "", &f).unwrap().unwrap();
        assert_eq!(hit.manifest_id, cr.manifest_id);
        let prefix_rows = {
            let r = s.index().read_txn().unwrap();
            s.index().prefixes.len(&r).unwrap()
        };
        assert_eq!(prefix_rows, 6);

        // Everything goes once the last name does.
        s.remove("child", "").unwrap();
        let r = gc(&s, Duration::ZERO, false).unwrap();
        assert_eq!((r.dead_objects, r.live_objects), (8, 0));
        assert_eq!(s.stats().unwrap().objects, 0);
        let ok = s.verify(&mut |_, _| Ok(())).unwrap();
        assert_eq!(ok.objects_checked, 0);
    }

    #[test]
    fn gc_refuses_when_a_live_manifest_is_unreadable() {
        let d = TempDir::new("gc-broken");
        let s = open(&d, 16);
        let r = put_synthetic(&s, "a", "", &(0..32).collect::<Vec<_>>(), &fp(&[]));
        let id = r.manifest_id.parse::<ObjectId>().unwrap();
        let ix = s.index();
        let mut w = ix.write_txn().unwrap();
        ix.manifests.delete(&mut w, &id).unwrap();
        w.commit().unwrap();
        std::fs::remove_file(crate::objects::LocalDir::new(d.0.join("objects")).unwrap().path_of(&id)).unwrap();
        let e = gc(&s, Duration::ZERO, false).unwrap_err().to_string();
        assert!(e.contains("gc refused") && e.contains("'a'"), "{e}");
        let v = s.verify(&mut |_, _| Ok(())).unwrap();
        assert_eq!(v.missing, vec![id.hex()]);
    }
}
