//! Unit tests of packs in the bucket (`pack.rs`, `pack_map.rs`, `bucket_objects.rs`) against
//! `object_store::memory::InMemory`, with machines as `tests.rs` assembles them.
//!
//! CONTRACT: test code only.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;

use super::bucket_objects::packs_of;
use super::tests::{load, machine, quick, Machine};
use super::*;
use crate::id::ObjectId;
use crate::objects::Backend;
use crate::testutil::{fp, put_synthetic, TempDir};

/// (packs, lone indexes or packs, loose objects) in the bucket.
fn layout(m: &Machine) -> (Vec<String>, usize, Vec<String>) {
    let listed = m.cat.bucket.list("packs").unwrap();
    let idx: HashSet<String> = listed.iter().filter_map(|x| x.rel.strip_suffix(".idx").map(String::from)).collect();
    let packs: Vec<String> = listed.iter().filter(|x| !x.rel.ends_with(".idx")).map(|x| x.rel.clone()).collect();
    let lone = packs.iter().filter(|p| !idx.contains(*p)).count() + idx.iter().filter(|i| !packs.contains(i)).count();
    let loose = m.cat.bucket.list("objects").unwrap().into_iter().map(|x| x.rel).collect();
    (packs, lone, loose)
}

/// The bytes under `packs/` beyond the objects the bucket lists (each once): with no garbage and no copy,
/// only each pack's index (twice: in the pack and alone) and its trailer.
fn overhead(m: &Machine) -> (u64, u64) {
    let listed = m.cat.bucket.list("packs").unwrap();
    let total: u64 = listed.iter().map(|x| x.size).sum();
    let objects = m.cat.objects.list_stamped_all().unwrap();
    let live: u64 = objects.iter().map(|(_, _, l)| *l).sum();
    let packs = listed.iter().filter(|x| !x.rel.ends_with(".idx")).count() as u64;
    (total - live, packs * (2 * 17 + 8) + objects.len() as u64 * 2 * 44)
}

/// x (80 tokens, one pack) and y, which shares x's first 3 blocks and adds 2 of its own (a second pack); y's
/// tokens and ingest report.
fn x_and_y_sharing_blocks(m: &Machine) -> (Vec<i32>, crate::store::IngestReport) {
    let f = fp(&[]);
    put_synthetic(m, "x", "", &(0..80).collect::<Vec<_>>(), &f);
    let mut y: Vec<i32> = (0..48).collect();
    y.extend(1000..1032);
    let ry = put_synthetic(m, "y", "", &y, &f);
    (y, ry)
}

fn objects_of(m: &Machine, name: &str) -> Vec<ObjectId> {
    let l = load(m, name);
    let mut ids: Vec<ObjectId> = l.manifest.blocks.clone();
    ids.push(l.manifest.skeleton);
    ids
}

#[test]
fn a_save_goes_up_as_one_pack_and_a_cold_machine_reads_it_back() {
    let mem = Arc::new(InMemory::new());
    let (da, db) = (TempDir::new("pa"), TempDir::new("pb"));
    let (a, b) = (machine(&mem, &da, None, quick()), machine(&mem, &db, None, quick()));
    let f = fp(&[]);
    let toks: Vec<i32> = (0..80).collect();
    let r = put_synthetic(&a, "x", "", &toks, &f);
    assert_eq!(r.new_objects, 5 + 2);
    let (packs, lone, loose) = layout(&a);
    assert_eq!((packs.len(), lone), (1, 0), "{packs:?}");
    assert!(loose.is_empty(), "nothing is loose: {loose:?}");
    let mut ids = objects_of(&a, "x");
    ids.push(r.manifest_id.parse().unwrap());
    assert_eq!(packs_of(&a.cat.objects, &ids).into_values().collect::<Vec<_>>(), vec![7]);
    // B has never listed the packs: its reads find the pack, then read every object by one ranged GET.
    assert_eq!(load(&b, "x").manifest.tokens, toks);
    let got = b.cat.objects.download(ids.clone()).unwrap();
    for (id, g) in ids.iter().zip(&got) {
        let bytes = g.as_ref().expect("downloaded");
        assert_eq!(bytes, &a.cat.objects.get(id).unwrap().unwrap()[..]);
    }
    // An object asked for twice gets its bytes twice from the one range (no listing of the packs again).
    let listings = b.cat.objects.listings();
    let twice = vec![ids[0], ids[1], ids[0]];
    for (id, g) in twice.iter().zip(b.cat.objects.download(twice.clone()).unwrap()) {
        assert_eq!(g.as_deref(), Some(&a.cat.objects.get(id).unwrap().unwrap()[..]));
    }
    assert_eq!(b.cat.objects.listings(), listings);
    assert_eq!(b.cat.objects.download(vec![ObjectId([7; 32])]).unwrap(), vec![None]);
    let v = b.verify_where(crate::store::Where::Bucket, &mut |_, _| Ok(())).unwrap();
    assert!(v.corrupt.is_empty() && v.missing.is_empty() && v.objects_checked >= 7, "{v:?}");
}

#[test]
fn a_gc_rewrites_a_pack_without_its_dead_objects_and_leaves_no_garbage() {
    let mem = Arc::new(InMemory::new());
    let (da, db, dc) = (TempDir::new("ga"), TempDir::new("gb"), TempDir::new("gc"));
    let (a, b, c) = (machine(&mem, &da, None, quick()), machine(&mem, &db, None, quick()), machine(&mem, &dc, None, quick()));
    let (y, ry) = x_and_y_sharing_blocks(&a);
    assert_eq!(ry.new_objects, 2 + 2, "{ry:?}"); // 3 blocks shared with x
    let (before, _, _) = layout(&a);
    assert_eq!(before.len(), 2);
    // C lists the packs now (so its map names x's pack), reads nothing yet.
    c.cat.objects.list_stamped_all().unwrap();
    a.remove("x", "").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let g = crate::gc::gc(&b, Duration::ZERO, false).unwrap();
    assert_eq!(g.dead_objects, 2 + 1 + 1, "{g:?}"); // x's 2 own blocks, skeleton, manifest
    let (after, lone, _) = layout(&b);
    assert_eq!((after.len(), lone), (2, 0), "{after:?}");
    assert_eq!(after.iter().filter(|p| before.contains(p)).count(), 1, "x's pack was rewritten, y's kept");
    // Every byte of every pack is a live object's (besides each pack's index and trailer).
    let (beyond, indexes) = overhead(&b);
    assert_eq!(beyond, indexes, "bytes of packs beyond the live objects");
    // C still names the old pack: its read misses, lists again, and finds the survivors.
    assert_eq!(load(&c, "y").manifest.tokens, y);
    let dry = crate::gc::gc(&a, Duration::ZERO, true).unwrap();
    assert_eq!(dry.dead_objects, 0, "{dry:?}");
    let v = c.verify_where(crate::store::Where::Bucket, &mut |_, _| Ok(())).unwrap();
    assert!(v.corrupt.is_empty() && v.missing.is_empty(), "{v:?}");
}

#[test]
fn duplicates_from_a_killed_repack_read_fine_and_the_next_prune_drops_them() {
    let mem = Arc::new(InMemory::new());
    let da = TempDir::new("da");
    let a = machine(&mem, &da, None, quick());
    let f = fp(&[]);
    put_synthetic(&a, "x", "", &(0..80).collect::<Vec<_>>(), &f);
    let ids = objects_of(&a, "x");
    // A repack killed after its upload: some of x's objects are in a second pack too.
    let copies: Vec<(ObjectId, bytes::Bytes)> =
        ids[..3].iter().map(|id| (*id, bytes::Bytes::from(a.cat.objects.get(id).unwrap().unwrap()))).collect();
    a.cat.objects.upload(copies).unwrap();
    assert_eq!(layout(&a).0.len(), 2);
    let db = TempDir::new("db");
    let b = machine(&mem, &db, None, quick());
    assert_eq!(load(&b, "x").manifest.n_tokens, 80);
    assert_eq!(b.cat.objects.list_stamped_all().unwrap().len(), 7, "each object listed once");
    std::thread::sleep(Duration::from_millis(20));
    let g = crate::gc::gc(&b, Duration::ZERO, false).unwrap();
    assert_eq!(g.dead_objects, 0, "{g:?}");
    let mut per_pack: Vec<usize> = packs_of(&b.cat.objects, &ids).into_values().collect();
    per_pack.sort();
    let (packs, _, _) = layout(&b);
    assert_eq!(packs.len(), per_pack.len(), "no pack holds only copies: {packs:?} {per_pack:?}");
    let (beyond, indexes) = overhead(&b);
    assert_eq!(beyond, indexes, "the copies are gone");
    assert_eq!(load(&b, "x").manifest.n_tokens, 80);
}

#[test]
fn a_lost_index_is_rebuilt_from_its_pack_and_a_lone_index_goes() {
    let mem = Arc::new(InMemory::new());
    let da = TempDir::new("ia");
    let opts = RemoteOptions { stale_lock: Duration::from_millis(50), ..quick() };
    let a = machine(&mem, &da, None, opts);
    let f = fp(&[]);
    put_synthetic(&a, "x", "", &(0..80).collect::<Vec<_>>(), &f);
    let (packs, _, _) = layout(&a);
    let idx = format!("{}.idx", packs[0]);
    a.cat.bucket.delete(&idx).unwrap();
    a.cat.bucket.put(&format!("packs/ab/{}.idx", "ab".repeat(32)), bytes::Bytes::from_static(b"KVPI")).unwrap();
    assert_eq!(layout(&a).1, 2);
    // A machine that never saw the index finds the blocks where the name's record placed them ...
    let db = TempDir::new("ib");
    assert_eq!(load(&machine(&mem, &db, None, opts), "x").manifest.n_tokens, 80);
    // ... and without those places it cannot find them, and says so.
    let (mut rec, _) = names::read(&a.cat.bucket, "", "x").unwrap().unwrap();
    rec.placed.clear();
    a.cat.bucket.put(&names::name_key("", "x"), bytes::Bytes::from(serde_json::to_vec(&rec).unwrap())).unwrap();
    let db = TempDir::new("ib2");
    let b = machine(&mem, &db, None, opts);
    let e = b.load(&crate::store::Target::Name { namespace: "", name: "x" }, None).err().unwrap();
    assert!(e.to_string().contains("missing"), "{e}");
    std::thread::sleep(Duration::from_millis(100));
    crate::gc::gc(&a, Duration::from_secs(600), false).unwrap(); // grace: the rebuilt objects stay
    assert_eq!(layout(&a).1, 0, "index rebuilt, lone index deleted");
    assert!(a.cat.bucket.head(&idx).unwrap().is_some());
    let dc = TempDir::new("ic");
    assert_eq!(load(&machine(&mem, &dc, None, opts), "x").manifest.n_tokens, 80);
}

#[test]
fn a_quarantined_packed_object_leaves_its_pack_and_the_next_save_repairs_it() {
    let mem = Arc::new(InMemory::new());
    let da = TempDir::new("qa");
    let a = machine(&mem, &da, None, quick());
    let f = fp(&[]);
    let toks: Vec<i32> = (0..80).collect();
    put_synthetic(&a, "x", "", &toks, &f);
    let ids = objects_of(&a, "x");
    a.cat.objects.quarantine(&ids[1]).unwrap();
    assert_eq!(a.cat.bucket.list("quarantine").unwrap().len(), 1);
    assert!(a.cat.objects.download(vec![ids[1]]).unwrap()[0].is_none());
    let rest: HashSet<ObjectId> = ids.iter().copied().filter(|id| *id != ids[1]).collect();
    assert_eq!(packs_of(&a.cat.objects, &rest.iter().copied().collect::<Vec<_>>()).values().sum::<usize>(), 5);
    let db = TempDir::new("qb");
    let b = machine(&mem, &db, None, quick());
    let r = put_synthetic(&b, "x2", "", &toks, &f);
    assert_eq!(r.new_objects, 1, "the quarantined block (the manifest is x's): {r:?}");
    assert_eq!(load(&b, "x").manifest.tokens, toks);
}

/// An eviction's prune copies a pack's survivors out only below the cap: with no room, the dead objects of a
/// pack that keeps live ones stay (counted, still stored); while that passes the cap a second round evicts more,
/// whose packs go whole; a gc without a cap takes what was left.
#[test]
fn an_eviction_copies_survivors_only_below_its_cap_and_evicts_more_for_room() {
    use crate::gc::{evict, Limits};
    use crate::index::Retention;
    let mem = Arc::new(InMemory::new());
    let da = TempDir::new("ea");
    let a = machine(&mem, &da, None, quick());
    let setup = |a: &Machine| {
        x_and_y_sharing_blocks(a); // y keeps 3 of x's blocks, in x's pack
        a.remove("x", "").unwrap();
        std::thread::sleep(Duration::from_millis(20));
    };
    setup(&a);
    let (before, _, _) = layout(&a);
    let limits = |max: u64| Limits { max_bytes: Some(max), low_water: 0.9, ..Default::default() };
    let dry = evict(&a, &limits(u64::MAX), true).unwrap().plan;
    let live = dry.used_bytes - dry.garbage_bytes;
    assert!(dry.garbage_bytes > 0, "{dry:?}");
    // y pinned: no name can go, so x's dead objects stay in the pack that keeps y's blocks.
    a.set_retention("y", "", Retention { ttl_s: None, pinned: true }).unwrap();
    let r = evict(&a, &limits(live + 1), false).unwrap();
    assert_eq!((r.evicted, r.kept_packed_bytes, r.freed_bytes), (0, dry.garbage_bytes, 0), "{r:?}");
    assert!(r.plan.unmet, "the cap cannot be met while x's garbage stays and y is pinned: {r:?}");
    assert_eq!(layout(&a).0, before, "no pack was rewritten");
    assert_eq!(load(&a, "y").manifest.n_tokens, 80);
    // A gc without a cap rewrites it.
    let g = crate::gc::gc(&a, Duration::ZERO, false).unwrap();
    assert_eq!((g.dead_objects, g.kept_packed), (4, 0), "{g:?}");
    let (beyond, indexes) = overhead(&a);
    assert_eq!(beyond, indexes, "bytes of packs beyond the live objects");

    // Unpinned, the same: the first round leaves x's dead objects, the second evicts y, and both packs go.
    let db = TempDir::new("eb");
    let mem = Arc::new(InMemory::new());
    let b = machine(&mem, &db, None, quick());
    setup(&b);
    let r = evict(&b, &limits(live + 1), false).unwrap();
    assert_eq!((r.evicted, r.kept_packed_bytes), (1, 0), "{r:?}");
    assert_eq!(r.plan.victims.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(), vec!["y"]);
    assert!(layout(&b).0.is_empty(), "{:?}", layout(&b));
}

/// The bucket's totals (stats, /metrics) list the bucket once per `TOTALS_FOR`, not on every read: a second
/// read lists nothing, this machine's own saves (packed or loose) are counted as they go and agree with what a
/// fresh machine lists, and a prune here makes the next read list again.
#[test]
fn the_buckets_totals_are_listed_once_and_follow_this_machines_own_saves() {
    let mem = Arc::new(InMemory::new());
    let (da, db) = (TempDir::new("ta"), TempDir::new("tb"));
    let a = machine(&mem, &da, None, quick());
    let f = fp(&[]);
    put_synthetic(&a, "x", "", &(0..80).collect::<Vec<_>>(), &f);
    let lists = |m: &Machine| m.cat.bucket.requests().into_iter().find(|(k, _)| *k == "list").unwrap().1;
    let first = a.cat.objects.stored().unwrap();
    let listed = lists(&a);
    assert_eq!(a.cat.objects.stored().unwrap(), first);
    assert_eq!(lists(&a), listed, "a second read listed the bucket again");
    put_synthetic(&a, "y", "", &(100..260).collect::<Vec<_>>(), &f);
    a.cat.objects.put_file(&ObjectId::of(b"a loose one"), b"not a real object, only its bytes count").unwrap();
    let now = a.cat.objects.stored().unwrap();
    assert!(now.0 > first.0 && now.1 > first.1, "{first:?} -> {now:?}");
    assert_eq!(now, machine(&mem, &db, None, quick()).cat.objects.stored().unwrap(), "not what the bucket holds");
    let listed = lists(&a);
    a.remove("y", "").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    crate::gc::gc(&a, Duration::ZERO, false).unwrap();
    let after = a.cat.objects.stored().unwrap();
    assert!(lists(&a) > listed && after.0 < now.0, "{now:?} -> {after:?}");
}
