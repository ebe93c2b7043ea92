//! Unit tests of the bucket store against `object_store::memory::InMemory` (a real object store held in
//! memory): two stores with their own cache directories share one bucket, as two machines would.
//!
//! CONTRACT: test code only; each machine is a `Store` assembled from `open_with`'s parts, as `crate::open`
//! assembles it, and keeps its `BucketCatalog` for the tests that look inside.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::memory::InMemory;

use super::*;
use crate::error::ErrorKind;
use crate::objects::Backend;
use crate::store::{Store, Target};
use crate::testutil::{fp, put_synthetic, TempDir};

/// A bucket as one on another machine is by default: restores streamed (`KVSTORE_S3_STREAM` auto).
pub(super) fn bucket(store: Arc<dyn object_store::ObjectStore>) -> Bucket {
    Bucket::new(store, &url::parse("s3://test-bucket/team").unwrap()).unwrap().with_streamed_restores(true)
}

pub(super) fn quick() -> RemoteOptions {
    RemoteOptions { stale_lock: Duration::from_secs(600), lock_wait: Duration::from_millis(600), sync_interval: Duration::from_secs(1) }
}

/// One machine: a store over the bucket, and its catalog (for the tests that look inside).
pub(super) struct Machine {
    pub(super) store: Store,
    pub(super) cat: Arc<BucketCatalog>,
}

impl std::ops::Deref for Machine {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.store
    }
}

pub(super) fn machine(mem: &Arc<InMemory>, d: &TempDir, limit: Option<u64>, opts: RemoteOptions) -> Machine {
    machine_over(mem.clone(), d, limit, opts)
}

/// A machine over any object store (a test double that wraps the in-memory one).
pub(super) fn machine_over(store: Arc<dyn object_store::ObjectStore>, d: &TempDir, limit: Option<u64>, opts: RemoteOptions) -> Machine {
    machine_of(bucket(store), d, limit, opts)
}

/// A machine over `bucket` as given.
pub(super) fn machine_of(bucket: Bucket, d: &TempDir, limit: Option<u64>, opts: RemoteOptions) -> Machine {
    let p = open_with(bucket, &d.0, limit, 16, 1 << 26, opts).unwrap();
    let cat = p.catalog.clone();
    Machine { store: Store::from_parts(p.root, p.index, p.objects, p.catalog, 1).unwrap(), cat }
}

pub(super) fn load(s: &Store, name: &str) -> crate::store::Loaded {
    s.load(&Target::Name { namespace: "", name }, None).unwrap()
}

#[test]
fn saved_on_a_is_read_and_found_on_b() {
    let mem = Arc::new(InMemory::new());
    let (da, db) = (TempDir::new("ra"), TempDir::new("rb"));
    let (a, b) = (machine(&mem, &da, None, quick()), machine(&mem, &db, None, quick()));
    let f = fp(&[("model", "m")]);
    let toks: Vec<i32> = (0..80).collect();
    let r = put_synthetic(&a, "user", "", &toks, &f);
    assert_eq!(r.new_objects, 5 + 2);
    // B: get by name (one bucket read), load (fetched into B's cache), lookup (synced on the miss).
    let info = b.get("user", "").unwrap().unwrap();
    assert_eq!(info.manifest_id, r.manifest_id);
    assert_eq!(load(&b, "user").manifest.tokens, toks);
    assert_eq!(b.cat.cache.dir().list().unwrap().len(), 7); // manifest, skeleton, 5 blocks
    let hit = b.lookup(&toks[..70], "", &f).unwrap().unwrap();
    assert_eq!((hit.name.as_str(), hit.n_common), ("user", 70));
    assert_eq!(b.list(None).unwrap().len(), 1);
    // A child saved on B reuses A's blocks without uploading them again.
    let mut child = toks.clone();
    child.extend(900..916);
    let c = put_synthetic(&b, "child", "", &child, &f);
    assert_eq!(c.new_objects, 1 + 2, "{c:?}");
    // A user served by A, then by a third machine: it read the name (restore), so its save replaces it
    // knowingly (nothing displaced).
    let dc = TempDir::new("rc");
    let c3 = machine(&mem, &dc, None, quick());
    let mut more = child.clone();
    more.extend(920..936);
    load(&c3, "user");
    put_synthetic(&c3, "user", "", &more, &f);
    assert!(a.get("user", "").unwrap().unwrap().displaced.is_empty());
    // A removes it; B no longer sees it.
    assert!(a.remove("child", "").unwrap());
    assert!(b.get("child", "").unwrap().is_none());
    b.sync_quietly(None).unwrap();
    assert_eq!(b.list(None).unwrap().len(), 1);
    let v = b.verify_where(crate::store::Where::Both, &mut |_, _| Ok(())).unwrap();
    assert!(v.corrupt.is_empty() && v.missing.is_empty(), "{v:?}");
}

#[test]
fn a_lost_race_keeps_the_other_manifest() {
    let mem = Arc::new(InMemory::new());
    let (da, db) = (TempDir::new("ca"), TempDir::new("cb"));
    let (a, b) = (machine(&mem, &da, None, quick()), machine(&mem, &db, None, quick()));
    let f = fp(&[]);
    let ra = put_synthetic(&a, "n", "", &(0..40).collect::<Vec<_>>(), &f);
    // B never saw A's save: its save wins, A's manifest is kept as displaced (and by gc).
    let rb = put_synthetic(&b, "n", "", &(100..140).collect::<Vec<_>>(), &f);
    let info = a.get("n", "").unwrap().unwrap();
    assert_eq!(info.manifest_id, rb.manifest_id);
    assert_eq!(info.displaced, vec![ra.manifest_id.clone()]);
    std::thread::sleep(Duration::from_millis(20));
    let g = crate::gc::gc(&a, Duration::ZERO, false).unwrap();
    assert_eq!(g.dead_objects, 0, "{g:?}");
    a.load(&Target::Manifest(&ra.manifest_id), None).unwrap();
    // A replaces what it knows: nothing more is displaced.
    a.sync_quietly(None).unwrap();
    let rc = put_synthetic(&a, "n", "", &(200..240).collect::<Vec<_>>(), &f);
    let info = b.get("n", "").unwrap().unwrap();
    assert_eq!(info.manifest_id, rc.manifest_id);
    assert_eq!(info.displaced, vec![ra.manifest_id]);
    // The CAS itself: a write against a stale ETag is refused.
    let bk = &b.cat.bucket;
    let (_, etag) = names::read(bk, "", "n").unwrap().unwrap();
    assert!(bk.put_if_match(&names::name_key("", "n"), "{}".into(), Some("\"nope\"")).unwrap().is_none());
    assert!(bk.put_if_match(&names::name_key("", "x"), "{}".into(), None).unwrap().is_some());
    assert!(bk.put_if_match(&names::name_key("", "x"), "{}".into(), None).unwrap().is_none());
    assert_eq!(names::read(bk, "", "n").unwrap().unwrap().1, etag);
}

#[test]
fn lock_protocol() {
    let mem = Arc::new(InMemory::new());
    let d = TempDir::new("lk");
    let s = machine(&mem, &d, None, quick());
    let r = s.cat.clone();
    // A save in flight (shared lock): gc waits, then refuses.
    let save = locks::shared(&r.bucket, Duration::from_secs(600), Duration::from_secs(1)).unwrap();
    let e = crate::gc::gc(&s, Duration::ZERO, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::GcLocked, "{e}");
    assert!(e.to_string().contains("save(s) in flight"), "{e}");
    drop(save);
    // A gc running (exclusive lock): a second gc refuses at once; a save waits, then gives up.
    let gc1 = locks::exclusive(&r.bucket, Duration::from_secs(600), Duration::from_secs(1)).unwrap();
    let e = crate::gc::gc(&s, Duration::ZERO, false).unwrap_err();
    assert!(e.to_string().contains("another gc is running"), "{e}");
    let e = locks::shared(&r.bucket, Duration::from_secs(600), Duration::from_millis(300)).err().unwrap();
    assert!(e.to_string().contains("a gc holds"), "{e}");
    drop(gc1);
    assert!(r.bucket.list("locks").unwrap().is_empty());
    // A crashed holder's lock goes stale (bucket clock) and is ignored, and gc removes it.
    std::mem::forget(locks::shared(&r.bucket, Duration::from_secs(600), Duration::from_secs(1)).unwrap());
    std::thread::sleep(Duration::from_millis(1100));
    let stale = locks::exclusive(&r.bucket, Duration::from_secs(1), Duration::from_secs(1)).unwrap();
    drop(stale);
    assert!(r.bucket.list("locks").unwrap().is_empty());
    // A long save keeps its lock fresh: older than `stale`, still live.
    let long = locks::shared(&r.bucket, Duration::from_secs(1), Duration::from_secs(1)).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let e = locks::exclusive(&r.bucket, Duration::from_secs(1), Duration::from_millis(300)).err().unwrap();
    assert!(e.to_string().contains("save(s) in flight"), "{e}");
    drop(long);
    crate::gc::gc(&s, Duration::ZERO, false).unwrap();
}

#[test]
fn gc_elsewhere_never_loses_a_later_save() {
    let mem = Arc::new(InMemory::new());
    let (da, db) = (TempDir::new("ga"), TempDir::new("gb"));
    let (a, b) = (machine(&mem, &da, None, quick()), machine(&mem, &db, None, quick()));
    let f = fp(&[]);
    let toks: Vec<i32> = (0..64).collect();
    put_synthetic(&a, "p", "", &toks, &f);
    put_synthetic(&a, "keep", "", &(500..532).collect::<Vec<_>>(), &f);
    a.remove("p", "").unwrap();
    // gc on B deletes p's objects; A's cache still holds them.
    std::thread::sleep(Duration::from_millis(20));
    let g = crate::gc::gc(&b, Duration::ZERO, false).unwrap();
    assert_eq!(g.dead_objects, 4 + 2, "{g:?}");
    assert_eq!(locks::generation(&b.cat.bucket).unwrap().0, 1);
    // A saves the same state again: the new gc generation makes it re-check its cache and upload again.
    let r = put_synthetic(&a, "p", "", &toks, &f);
    assert_eq!(r.new_objects, 4 + 2, "{r:?}");
    load(&b, "p");
    load(&b, "keep");
    let v = b.verify_where(crate::store::Where::Bucket, &mut |_, _| Ok(())).unwrap();
    assert!(v.missing.is_empty() && v.corrupt.is_empty(), "{v:?}");
    // Nothing is unreachable now; a dry run changes nothing.
    let dry = crate::gc::gc(&a, Duration::ZERO, true).unwrap();
    assert_eq!((dry.dead_objects, dry.dry_run), (0, true));
}

#[test]
fn cache_is_bounded_and_rebuildable() {
    let mem = Arc::new(InMemory::new());
    let (da, db) = (TempDir::new("la"), TempDir::new("lb"));
    let a = machine(&mem, &da, Some(1500), quick());
    let f = fp(&[]);
    for k in 0..6 {
        put_synthetic(&a, &format!("s{k}"), "", &(k * 1000..k * 1000 + 64).collect::<Vec<_>>(), &f);
    }
    let cache = &a.cat.cache;
    assert!(cache.used() <= 1500, "{}", cache.used());
    assert!(cache.dir().list().unwrap().len() < 6 * 6);
    for k in 0..6 {
        assert_eq!(load(&a, &format!("s{k}")).manifest.n_tokens, 64); // evicted ones come back from the bucket
    }
    assert!(cache.used() <= 1500);
    // A machine with an empty cache rebuilds its index from the bucket.
    let b = machine(&mem, &db, None, quick());
    let rep = sync::reindex(&b.cat.mirror).unwrap();
    // Each record carries its (small) manifest: none is read from the packs.
    assert_eq!((rep.names, rep.updated, rep.manifests_fetched), (6, 6, 0));
    let r = b.index().read_txn().unwrap();
    assert_eq!(b.index().names_in(&r, None).unwrap().len(), 6);
    drop(r);
    let hit = b.lookup(&(3000..3064).collect::<Vec<_>>(), "", &f).unwrap().unwrap();
    assert_eq!(hit.name, "s3");
    // A second sync reads no record again (ETags unchanged).
    let again = sync::sync(&b.cat.mirror, None).unwrap();
    assert_eq!((again.updated, again.manifests_fetched), (0, 0));
    // A name whose manifest is gone still syncs; gc refuses and verify names it.
    let r6 = put_synthetic(&a, "broken", "", &(9000..9032).collect::<Vec<_>>(), &f);
    a.cat.objects.delete(&r6.manifest_id.parse().unwrap()).unwrap();
    // ... and its record does not carry it (written before records did, or too large to carry).
    let (mut rec, _) = names::read(&a.cat.bucket, "", "broken").unwrap().unwrap();
    rec.manifest_json = None;
    a.cat.bucket.put(&names::name_key("", "broken"), Bytes::from(serde_json::to_vec(&rec).unwrap())).unwrap();
    let dd = TempDir::new("ld");
    let d = machine(&mem, &dd, None, quick());
    assert_eq!(sync::sync(&d.cat.mirror, None).unwrap().names, 7);
    let e = crate::gc::gc(&d, Duration::ZERO, false).unwrap_err();
    assert!(e.to_string().contains("gc refused"), "{e}");
    let v = d.verify_where(crate::store::Where::Bucket, &mut |_, _| Ok(())).unwrap();
    assert_eq!(v.missing, vec![r6.manifest_id.clone()]);
    // The cache directory belongs to its bucket.
    let other = Bucket::new(mem.clone(), &url::parse("s3://test-bucket/other").unwrap()).unwrap();
    let e = open_with(other, &db.0, None, 16, 1 << 26, quick()).err().unwrap();
    assert!(e.to_string().contains("belongs to another store"), "{e}");
}

#[test]
fn a_dead_holder_on_this_machine_does_not_hold_gc_off() {
    let mem = Arc::new(InMemory::new());
    let d = TempDir::new("lkdead");
    let s = machine(&mem, &d, None, quick());
    let r = s.cat.clone();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let put = |key: &str, host: &str| {
        let body = serde_json::json!({"kind": "shared", "pid": dead, "host": host}).to_string();
        r.bucket.put(key, bytes::Bytes::from(body)).unwrap();
    };
    // another machine's lock with the same pid: live until it goes stale (its process may well exist there)
    put("locks/shared-elsewhere", "another-host/another-boot");
    let e = crate::gc::gc(&s, Duration::ZERO, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::GcLocked, "{e}");
    r.bucket.delete("locks/shared-elsewhere").unwrap();
    // this machine's, its process gone (a save killed with -9): ignored at once and removed by gc
    put("locks/shared-killed", &locks::this_machine());
    crate::gc::gc(&s, Duration::ZERO, false).unwrap();
    assert!(r.bucket.list("locks").unwrap().is_empty());
}

/// A save dedups against what the bucket holds without a HEAD per object: packed objects through the pack
/// map, loose ones (what versions before packs wrote) through one listing of `objects/` under the save's lock.
#[test]
fn a_save_finds_loose_objects_without_asking_for_each() {
    let mem = Arc::new(InMemory::new());
    let (da, db) = (TempDir::new("oa"), TempDir::new("ob"));
    let a = machine(&mem, &da, None, quick());
    let f = fp(&[]);
    let tokens: Vec<i32> = (0..256).collect();
    put_synthetic(&a, "s", "", &tokens, &f);
    let l = load(&a, "s");
    let mut ids = l.manifest.referenced();
    ids.dedup();
    // Unpack them: each object loose, as an older version wrote it, and out of its pack.
    let bytes: Vec<Bytes> = a.cat.objects.download(ids.clone()).unwrap().into_iter().map(Option::unwrap).collect();
    assert!(a.cat.objects.delete_many(&ids, None).unwrap().is_empty());
    for (id, b) in ids.iter().zip(bytes) {
        a.cat.bucket.put(&keys::object_key(id), b).unwrap();
    }
    let b = machine(&mem, &db, None, quick());
    let heads = |m: &Machine| m.cat.bucket.requests().into_iter().find(|(k, _)| *k == "head").unwrap().1;
    let before = heads(&b);
    let r = put_synthetic(&b, "t", "", &tokens, &f);
    // Only the manifest may be new (it records the second it was saved).
    assert!(r.new_objects <= 1 && r.reused_bytes > 0, "{r:?}");
    assert_eq!(heads(&b), before, "a save asked the bucket about each object");
    assert_eq!(load(&b, "t").manifest.n_tokens, 256);
}
