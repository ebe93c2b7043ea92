//! Mark and sweep. Live = manifests referenced by names, plus their skeleton and blocks. Sweep deletes object
//! files that are not live and older than the grace period, then drops index rows of dead manifests (their
//! prefix keys) and of deleted objects, and stale temp files.
//!
//! Phase 1 (no lock) marks and lists candidates; phase 2 takes the exclusive flock on `<store>/lock` (so no
//! ingest is between its first object write and its commit), re-marks, re-checks each candidate's mtime and
//! deletes. An ingest that reused an object refreshed its mtime, so the grace period protects it too.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use heed::types::Bytes;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::id::ObjectId;
use crate::store::{HeedExt, Store};

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct GcReport {
    /// Objects reachable from names.
    pub live_objects: usize,
    /// Unreachable objects past the grace period: deleted (or, with dry_run, that would be).
    pub dead_objects: usize,
    pub freed_bytes: u64,
    /// Unreachable objects younger than the grace period, kept.
    pub kept_young: usize,
    /// Temp files past the grace period removed (or that would be).
    pub removed_temp: usize,
    /// Manifest rows (and their prefix keys) no name references any more: dropped (or would be).
    pub dead_manifests: usize,
    pub dry_run: bool,
}

struct Marks {
    objects: HashSet<ObjectId>,
    manifests: HashSet<ObjectId>,
}

fn mark(store: &Store) -> Result<Marks> {
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

pub fn gc(store: &Store, grace: Duration, dry_run: bool) -> Result<GcReport> {
    let backend = store.objects().backend();
    let cutoff = SystemTime::now().checked_sub(grace).unwrap_or(SystemTime::UNIX_EPOCH);

    // Phase 1: candidates without blocking ingests.
    let marks = mark(store)?;
    let mut candidates = Vec::new();
    for id in backend.list()? {
        if !marks.objects.contains(&id) {
            candidates.push(id);
        }
    }
    drop(marks);

    // Phase 2: under the exclusive lock, re-mark and sweep.
    let _lock = store.lock_exclusive()?;
    let marks = mark(store)?;
    let mut report = GcReport {
        live_objects: marks.objects.len(),
        dead_objects: 0,
        freed_bytes: 0,
        kept_young: 0,
        removed_temp: 0,
        dead_manifests: 0,
        dry_run,
    };
    let mut deleted: HashSet<ObjectId> = HashSet::new();
    for id in candidates {
        if marks.objects.contains(&id) {
            continue;
        }
        let Some((mtime, len)) = backend.mtime(&id)? else { continue };
        if mtime >= cutoff {
            report.kept_young += 1;
            continue;
        }
        let freed = if dry_run { len } else { backend.delete(&id)? };
        report.dead_objects += 1;
        report.freed_bytes += freed;
        deleted.insert(id);
    }

    // Index rows: dead manifests, their prefix keys, rows of objects that are gone.
    let ix = store.index();
    let mut w = ix.write_txn()?;
    let mut dead_manifests = Vec::new();
    for kv in ix.manifests.iter(&w).ix(ix)? {
        let (id, _) = kv.ix(ix)?;
        if !marks.manifests.contains(&id) {
            dead_manifests.push(id);
        }
    }
    report.dead_manifests = dead_manifests.len();
    if !dry_run {
        let dead: HashSet<ObjectId> = dead_manifests.iter().copied().collect();
        let mut dead_prefixes: Vec<Vec<u8>> = Vec::new();
        for kv in ix.prefixes.remap_key_type::<Bytes>().iter(&w).ix(ix)? {
            let (k, _) = kv.ix(ix)?;
            if k.len() == 64 && dead.contains(&ObjectId(k[32..].try_into().unwrap())) {
                dead_prefixes.push(k.to_vec());
            }
        }
        let mut dead_rows = Vec::new();
        for kv in ix.objects.iter(&w).ix(ix)? {
            let (id, _) = kv.ix(ix)?;
            if deleted.contains(&id) || (!marks.objects.contains(&id) && !backend.exists(&id)?) {
                dead_rows.push(id);
            }
        }
        for id in &dead_manifests {
            ix.manifests.delete(&mut w, id).ix(ix)?;
        }
        let prefixes = ix.prefixes.remap_key_type::<Bytes>();
        for k in &dead_prefixes {
            prefixes.delete(&mut w, &k[..]).ix(ix)?;
        }
        for id in &dead_rows {
            ix.objects.delete(&mut w, id).ix(ix)?;
        }
        w.commit().ix(ix)?;
    } else {
        w.abort();
    }
    report.removed_temp = backend.clean_temp(grace, dry_run)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let dry = gc(&s, Duration::ZERO, true).unwrap();
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
