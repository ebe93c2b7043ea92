//! The prune's plan (restic's prune: planned on a fresh listing, then executed by `BucketObjects`): which packs
//! are rewritten and what survives in each, which orphans get their index back or are deleted, which loose
//! objects go. Pure: it reads the `PackMap` and a listing's orphans, and asks the bucket nothing.
//!
//! CONTRACT: a pack holding any doomed object, or a copy that is not the object's canonical one (a killed
//! repack's duplicate), is rewritten with the rest; a pack with nothing to drop is left alone. Rewrites come in
//! batches of about `batch_bytes` surviving bytes, so the execution's memory is bounded. Orphans count only
//! when older than `orphan_age` (younger ones may be a save between its two PUTs).

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use super::client::Meta;
use super::pack::Entry;
use super::pack_map::{Orphans, PackMap};
use crate::id::ObjectId;

/// What a prune does, in the order it does it.
#[derive(Debug, Default)]
pub struct Plan {
    /// Packs to rewrite, batch by batch: (old pack, the entries that survive it).
    pub rewrites: Vec<Vec<(ObjectId, Vec<Entry>)>>,
    /// Packs without their index, old enough to be a killed save's: their index is written again.
    pub lone_packs: Vec<Meta>,
    /// Keys deleted last: indexes without their pack, and doomed objects that are loose (not in any pack).
    pub deletes: Vec<String>,
}

/// Plan the removal of `doomed` from the packs `map` knows (listed just before), with that listing's orphans.
pub fn plan(
    map: &PackMap,
    orphans: Orphans,
    doomed: &[ObjectId],
    orphan_age: Duration,
    batch_bytes: usize,
    loose_key: impl Fn(&ObjectId) -> String,
) -> Plan {
    let doomed: HashSet<ObjectId> = doomed.iter().copied().collect();
    let mut plan = Plan::default();
    let mut packed: HashSet<ObjectId> = HashSet::new();
    let (mut batch, mut in_batch) = (Vec::new(), 0usize);
    for (pid, info) in map.packs() {
        packed.extend(info.entries.iter().map(|e| e.id));
        let keep: Vec<Entry> =
            info.entries.iter().filter(|e| !doomed.contains(&e.id) && map.is_canonical(&e.id, &pid)).copied().collect();
        if keep.len() == info.entries.len() {
            continue;
        }
        in_batch += keep.iter().map(|e| e.len as usize).sum::<usize>();
        batch.push((pid, keep));
        if in_batch >= batch_bytes {
            plan.rewrites.push(std::mem::take(&mut batch));
            in_batch = 0;
        }
    }
    if !batch.is_empty() {
        plan.rewrites.push(batch);
    }
    let now = SystemTime::now();
    let old = |m: &Meta| now.duration_since(m.modified).unwrap_or_default() > orphan_age;
    let (lone_indexes, lone_packs): (Vec<Meta>, Vec<Meta>) =
        orphans.into_iter().filter(old).partition(|m| m.rel.ends_with(".idx"));
    plan.lone_packs = lone_packs;
    plan.deletes = lone_indexes.into_iter().map(|m| m.rel).collect();
    plan.deletes.extend(doomed.iter().filter(|id| !packed.contains(id)).map(loose_key));
    plan
}
