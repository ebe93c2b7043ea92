//! The prune's plan (restic's prune: planned on a fresh listing, then executed by `BucketObjects`): which packs
//! go whole, which are rewritten and what survives in each, which orphans get their index back or are deleted,
//! which loose objects go, and which doomed objects stay where they are for now. Pure: it reads the `PackMap`
//! and a listing's orphans, and asks the bucket nothing.
//!
//! CONTRACT: a pack holding any doomed object, or a copy that is not the object's canonical one (a killed
//! repack's duplicate), is dropped whole when nothing in it survives, else rewritten with the rest; a pack with
//! nothing to drop is left alone. Drops and deletes come first, then rewrites, smallest survivors first, in
//! batches of about `batch_bytes` survivors (the execution's memory). Given a `room` (an eviction's cap less
//! what the bucket holds), the bucket never holds more than `room` bytes above what it held when the prune
//! began: a batch's survivors, uploaded before their old packs go, fit in the room left, and a pack whose
//! survivors do not fit is left with its doomed objects (`left`: a later prune, with more room, takes them).
//! Bytes are counted as the packs' objects (their indexes aside).
//! Orphans count only when older than `orphan_age` (younger ones may be a save between its two PUTs).

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use super::client::Meta;
use super::pack::Entry;
use super::pack_map::{Orphans, PackMap};
use crate::id::ObjectId;

/// What a prune does, in the order it does it.
#[derive(Debug, Default)]
pub struct Plan {
    /// Keys deleted first: indexes without their pack, and doomed objects that are loose (not in any pack).
    pub deletes: Vec<String>,
    /// Packs with nothing that survives, deleted first (their index, then the pack).
    pub drops: Vec<ObjectId>,
    /// Packs without their index, old enough to be a killed save's: their index is written again.
    pub lone_packs: Vec<Meta>,
    /// Packs to rewrite, batch by batch: (old pack, the entries that survive it).
    pub rewrites: Vec<Vec<(ObjectId, Vec<Entry>)>>,
    /// Doomed objects left in packs whose survivors did not fit in the room.
    pub left: Vec<ObjectId>,
}

/// A pack that loses some of its objects and keeps others.
struct Partial {
    pack: ObjectId,
    keep: Vec<Entry>,
    /// The doomed objects it holds (every copy: one may become canonical once the others go).
    doomed: Vec<ObjectId>,
    /// Bytes of its surviving objects, and of all its objects.
    survive: u64,
    total: u64,
}

/// Plan the removal of `doomed` from the packs `map` knows (listed just before), with that listing's orphans.
/// `room`: how many bytes the bucket may hold above what it holds now while the prune runs (None: no bound).
pub fn plan(
    map: &PackMap,
    orphans: Orphans,
    doomed: &[ObjectId],
    orphan_age: Duration,
    batch_bytes: usize,
    room: Option<u64>,
    loose_key: impl Fn(&ObjectId) -> String,
) -> Plan {
    let doomed: HashSet<ObjectId> = doomed.iter().copied().collect();
    let mut plan = Plan::default();
    let mut packed: HashSet<ObjectId> = HashSet::new();
    let mut partial: Vec<Partial> = Vec::new();
    let mut room = room;
    let bytes = |entries: &[Entry]| entries.iter().map(|e| e.len as u64).sum::<u64>();
    for (pid, info) in map.packs() {
        packed.extend(info.entries.iter().map(|e| e.id));
        let keep: Vec<Entry> =
            info.entries.iter().filter(|e| !doomed.contains(&e.id) && map.is_canonical(&e.id, &pid)).copied().collect();
        if keep.len() == info.entries.len() {
            continue;
        }
        let total = bytes(&info.entries);
        if keep.is_empty() {
            plan.drops.push(pid);
            room = room.map(|r| r + total);
        } else {
            let doomed_here = info.entries.iter().filter(|e| doomed.contains(&e.id)).map(|e| e.id).collect();
            partial.push(Partial { pack: pid, survive: bytes(&keep), keep, doomed: doomed_here, total });
        }
    }
    partial.sort_by_key(|p| (p.survive, p.pack.0));
    let (mut batch, mut in_batch, mut batch_frees) = (Vec::new(), 0u64, 0u64);
    let mut rest = partial.into_iter();
    for p in rest.by_ref() {
        // The batch so far is closed when it is full, or when this pack's copies would not fit beside it: once
        // executed, its old packs are gone and the room grows by what they held beyond their survivors.
        let full = in_batch >= batch_bytes as u64 || room.is_some_and(|r| in_batch + p.survive > r);
        if full && !batch.is_empty() {
            plan.rewrites.push(std::mem::take(&mut batch));
            room = room.map(|r| r + batch_frees);
            (in_batch, batch_frees) = (0, 0);
        }
        if room.is_some_and(|r| p.survive > r) {
            // Sorted by survivors: no later pack fits either.
            plan.left.extend(p.doomed);
            break;
        }
        in_batch += p.survive;
        batch_frees += p.total - p.survive;
        batch.push((p.pack, p.keep));
    }
    plan.left.extend(rest.flat_map(|p| p.doomed));
    if !batch.is_empty() {
        plan.rewrites.push(batch);
    }
    plan.left.sort_unstable_by_key(|id| id.0);
    plan.left.dedup();
    let now = SystemTime::now();
    let old = |m: &Meta| now.duration_since(m.modified).unwrap_or_default() > orphan_age;
    let (lone_indexes, lone_packs): (Vec<Meta>, Vec<Meta>) =
        orphans.into_iter().filter(old).partition(|m| m.rel.ends_with(".idx"));
    plan.lone_packs = lone_packs;
    plan.deletes = lone_indexes.into_iter().map(|m| m.rel).collect();
    plan.deletes.extend(doomed.iter().filter(|id| !packed.contains(id)).map(loose_key));
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::pack_map::PackInfo;

    fn id(n: u8) -> ObjectId {
        ObjectId([n; 32])
    }

    /// A map of packs, each a list of (object, bytes).
    fn map(packs: &[(u8, &[(u8, u32)])]) -> PackMap {
        let m = PackMap::default();
        for (p, objects) in packs {
            let mut offset = 0;
            let entries = objects
                .iter()
                .map(|&(o, len)| {
                    offset += len as u64;
                    Entry { id: id(o), offset: offset - len as u64, len }
                })
                .collect();
            m.add(id(*p), PackInfo { modified: SystemTime::now(), entries });
        }
        m
    }

    fn run(m: &PackMap, doomed: &[u8], room: Option<u64>, batch: usize) -> Plan {
        let doomed: Vec<ObjectId> = doomed.iter().map(|&n| id(n)).collect();
        plan(m, Vec::new(), &doomed, Duration::from_secs(60), batch, room, |i| format!("objects/{}", i.hex()))
    }

    fn packs_of(p: &Plan) -> Vec<Vec<u8>> {
        p.rewrites.iter().map(|b| b.iter().map(|(pid, _)| pid.0[0]).collect()).collect()
    }

    /// The bucket's bytes at each step of the plan's execution, from `start`: drops first, then each batch
    /// (survivors up, then the old packs gone). Returns the highest.
    fn peak(m: &PackMap, p: &Plan, start: u64) -> u64 {
        let size = |pid: &ObjectId| -> u64 {
            m.packs().into_iter().find(|(q, _)| q == pid).unwrap().1.entries.iter().map(|e| e.len as u64).sum()
        };
        let mut now = start - p.drops.iter().map(size).sum::<u64>();
        let mut high = start;
        for batch in &p.rewrites {
            let up: u64 = batch.iter().flat_map(|(_, keep)| keep.iter().map(|e| e.len as u64)).sum();
            high = high.max(now + up);
            now = now + up - batch.iter().map(|(pid, _)| size(pid)).sum::<u64>();
        }
        high
    }

    #[test]
    fn drops_come_first_and_copies_fit_in_the_room_they_make() {
        // Pack 1 is all doomed (100 bytes); pack 2 keeps 30 of 40; pack 3 keeps 90 of 100; pack 4 keeps all.
        let m = map(&[
            (1, &[(10, 60), (11, 40)]),
            (2, &[(20, 30), (21, 10)]),
            (3, &[(30, 90), (31, 10)]),
            (4, &[(40, 50)]),
        ]);
        let doomed = [10, 11, 21, 31, 99]; // 99 is loose
        let start = 290;
        // No bound: every pack that loses something is dropped or rewritten, smallest survivors first.
        let free = run(&m, &doomed, None, 1 << 20);
        assert_eq!(free.drops, vec![id(1)]);
        assert_eq!(packs_of(&free), vec![vec![2, 3]]);
        assert!(free.left.is_empty());
        assert_eq!(free.deletes, vec![format!("objects/{}", id(99).hex())]);
        // No room at all: pack 1's drop frees 100, room for pack 2's copy (30) but not for pack 3's beside it
        // (120); once pack 2's rewrite has freed its 10, pack 3's 90 fit in a batch of their own. The bucket
        // never passes where it began.
        let tight = run(&m, &doomed, Some(0), 1 << 20);
        assert_eq!(tight.drops, vec![id(1)]);
        assert_eq!(packs_of(&tight), vec![vec![2], vec![3]]);
        assert!(tight.left.is_empty());
        assert!(peak(&m, &tight, start) <= start, "{}", peak(&m, &tight, start));
        // Without pack 1's drop there is no room for any copy: both partial packs keep their doomed objects.
        let none = run(&m, &[21, 31], Some(0), 1 << 20);
        assert!(none.drops.is_empty() && none.rewrites.is_empty());
        assert_eq!(none.left, vec![id(21), id(31)]);
        // Some room: pack 2's copy fits (30 <= 35) and its rewrite frees 10, which still leaves pack 3's 90 out.
        let some = run(&m, &[21, 31], Some(35), 1 << 20);
        assert_eq!(packs_of(&some), vec![vec![2]]);
        assert_eq!(some.left, vec![id(31)]);
        assert!(peak(&m, &some, start) <= start + 35);
        // Small batches: each batch is uploaded and its old packs deleted before the next.
        let small = run(&m, &doomed, Some(0), 1);
        assert_eq!(packs_of(&small), vec![vec![2], vec![3]]);
        assert!(peak(&m, &small, start) <= start);
    }
}
