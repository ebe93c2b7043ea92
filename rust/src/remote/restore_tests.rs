//! Unit tests of a bucket store's restore path (`CachedBackend::fetch`, `stage`, `keep` and
//! `Store::materialize` over them) with real slot files, against `object_store::memory::InMemory`.
//!
//! CONTRACT: test code only.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use object_store::memory::InMemory;

use super::bucket_objects::located;
use super::names;
use super::tests::{bucket, load, machine, machine_of, machine_over, quick, Machine};
use crate::id::ObjectId;
use crate::manifest::Manifest;
use crate::objects::{codec, Backend};
use crate::store::Target;
use crate::testutil::{fp, state_file, TempDir};

const FILES: [&str; 2] = ["smollm2_parent.bin", "gemma3_parent.bin"];

fn target(name: &str) -> Target<'_> {
    Target::Name { namespace: "", name }
}

/// The skeleton and blocks of a name's state, each once.
fn objects_of(m: &Machine, name: &str) -> Vec<ObjectId> {
    let l = load(m, name);
    let mut ids = l.manifest.blocks.clone();
    ids.push(l.manifest.skeleton);
    ids.sort_by_key(|id| id.0);
    ids.dedup();
    ids
}

/// A new in-memory bucket with both real files saved by machine A, each under its file name.
fn both_saved_by_a(tag: &str) -> (Arc<InMemory>, TempDir, Machine) {
    let mem = Arc::new(InMemory::new());
    let da = TempDir::new(tag);
    let a = machine(&mem, &da, None, quick());
    for file in FILES {
        a.ingest(file, "", &state_file(file), &fp(&[]), None, false).unwrap();
    }
    (mem, da, a)
}

/// Temp files left in a cache's object directory (a staged copy not renamed nor removed).
fn temp_files(m: &Machine) -> usize {
    m.cat.cache.dir().stale_temp(std::time::Duration::ZERO).unwrap()
}

fn restore(m: &Machine, name: &str, out: &Path) -> crate::error::Result<Vec<u8>> {
    m.materialize(&target(name), out, None, None, false)?;
    Ok(std::fs::read(out).unwrap())
}

/// A cold restore writes the file as the state's objects arrive from the bucket, each checked against its id
/// (a layout whose made bytes come from rows, transposed V, is read whole and checked by its file's blake3),
/// or, where the bucket does not stream restores (`KVSTORE_S3_STREAM`), from them all once they are here,
/// checked by its file's blake3; either keeps the objects in its cache once they matched, and the next restore
/// reads the cache alone (the bucket's packs are gone by then and it is still byte-exact). Full attention,
/// sliding window, and transposed V.
#[test]
#[ignore = "needs real slot files: ./dev test"]
fn a_cold_restore_keeps_what_matched_and_the_next_reads_the_cache_alone() {
    for streamed in [true, false] {
        a_cold_restore_keeps_what_matched(streamed);
    }
}

fn a_cold_restore_keeps_what_matched(streamed: bool) {
    let mem = Arc::new(InMemory::new());
    let (da, db) = (TempDir::new("ca"), TempDir::new("cb"));
    let a = machine(&mem, &da, None, quick());
    let b = machine_of(bucket(mem.clone()).with_streamed_restores(streamed), &db, None, quick());
    let files = [FILES[0], FILES[1], "smollm2_fa_off.bin"];
    for file in files {
        a.ingest(file, "", &state_file(file), &fp(&[("model", file)]), None, false).unwrap();
    }
    for file in files {
        let out = db.0.join("cold.bin");
        let r = b.materialize(&target(file), &out, None, None, false).unwrap();
        let checked = if streamed && !file.contains("fa_off") { "objects as they arrived" } else { "file blake3" };
        assert_eq!(r.verified_by, checked, "{file}: how what a bucket sent is checked");
        assert!(restore(&b, file, &out).unwrap() == state_file(file), "{file}: cold restore is not byte-exact");
        for id in objects_of(&a, file) {
            assert!(b.cat.cache.holds(&id), "{file}: {id} was restored but not kept");
        }
        assert_eq!(temp_files(&b), 0, "{file}: a staged copy was left behind");
    }
    let stored: u64 = b.cat.cache.dir().list().unwrap().iter().map(|id| b.cat.cache.dir().mtime(id).unwrap().unwrap().1).sum();
    assert_eq!(b.cat.cache.used(), stored, "the cache counts what it holds");
    for meta in a.cat.bucket.list("packs").unwrap() {
        a.cat.bucket.delete(&meta.rel).unwrap();
    }
    for file in files {
        let out = db.0.join("warm.bin");
        let r = b.materialize(&target(file), &out, None, None, false).unwrap();
        assert_eq!(r.verified_by, "file xxh3", "{file}: the cache's own files are checked by xxh3");
        assert!(std::fs::read(&out).unwrap() == state_file(file), "{file}: warm restore is not byte-exact");
    }
}

/// A block whose bytes went bad in the bucket: the cold restore fails naming it and writes nothing, its
/// cache keeps none of what it fetched, the bad copy leaves the bucket (quarantine), and a save of the same
/// state from another machine puts it back.
#[test]
#[ignore = "needs real slot files: ./dev test"]
fn a_bad_object_in_the_bucket_is_never_kept_and_a_save_repairs_it() {
    let file = "smollm2_parent.bin";
    let bytes = state_file(file);
    let mem = Arc::new(InMemory::new());
    let (da, db, dc) = (TempDir::new("xa"), TempDir::new("xb"), TempDir::new("xc"));
    let (a, b) = (machine(&mem, &da, None, quick()), machine(&mem, &db, None, quick()));
    a.ingest("p", "", &bytes, &fp(&[]), None, false).unwrap();
    let ids = objects_of(&a, "p");
    // The largest block, a raw one (restored as a slice of the response, checked by the file hash only).
    let bad = *ids.iter().max_by_key(|id| located(&a.cat.objects, id).unwrap().2).unwrap();
    let (key, offset, len) = located(&a.cat.objects, &bad).unwrap();
    let (pack, _) = a.cat.bucket.get(&key).unwrap().unwrap();
    let at = offset as usize;
    let head: [u8; codec::HEADER_LEN] = pack[at..at + codec::HEADER_LEN].try_into().unwrap();
    assert!(codec::is_raw_file(&head, len), "the largest block of a full-attention state is stored raw");
    let mut flipped = pack.to_vec();
    flipped[at + len as usize / 2] ^= 0x40;
    a.cat.bucket.put(&key, Bytes::from(flipped)).unwrap();

    let out = db.0.join("p.bin");
    let e = restore(&b, "p", &out).unwrap_err().to_string();
    assert!(e.contains(&bad.to_string()) && e.contains("hash mismatch"), "{e}");
    assert!(!out.exists(), "a failed restore wrote its file");
    assert!(b.cat.cache.dir().list().unwrap().iter().all(|id| !ids.contains(id)), "a restore that failed kept objects");
    assert_eq!(temp_files(&b), 0);
    assert_eq!(a.cat.bucket.list("quarantine").unwrap().len(), 1, "the bad copy is kept aside");
    assert!(located(&b.cat.objects, &bad).is_none(), "the bad copy left its pack");

    let c = machine(&mem, &dc, None, quick());
    let r = c.ingest("p2", "", &bytes, &fp(&[]), None, false).unwrap();
    // New: the bad block, and p2's manifest unless it is byte for byte p's (it records when it was saved).
    assert!((1..=2).contains(&r.new_objects) && r.reused_bytes > 0, "{r:?}");
    assert!(located(&c.cat.objects, &bad).is_some(), "the bad block did not go up again");
    assert!(restore(&b, "p", &out).unwrap() == bytes, "not repaired");
    assert!(b.cat.cache.holds(&bad));
}

/// A cached copy that rotted on this machine's disk (warm restores check the file by xxh3, not blake3): the
/// restore fails naming it and writes nothing, the cache forgets that copy, the bucket keeps its good one,
/// and the next restore reads it from there, byte-exact. Full attention and sliding window.
#[test]
#[ignore = "needs real slot files: ./dev test"]
fn a_rotten_cache_copy_is_found_by_the_warm_restore_and_read_again_from_the_bucket() {
    let (mem, _da, a) = both_saved_by_a("rot");
    let db = TempDir::new("rotb");
    let b = machine(&mem, &db, None, quick());
    for file in FILES {
        let out = db.0.join("p.bin");
        assert!(restore(&b, file, &out).unwrap() == state_file(file));
        std::fs::remove_file(&out).unwrap();
        let ids = objects_of(&a, file);
        let bad = *ids.iter().max_by_key(|id| std::fs::metadata(b.cat.cache.dir().path_of(id)).unwrap().len()).unwrap();
        let path = b.cat.cache.dir().path_of(&bad);
        let mut bytes = std::fs::read(&path).unwrap();
        assert!(codec::is_raw_file(&bytes[..codec::HEADER_LEN].try_into().unwrap(), bytes.len() as u64), "{file}");
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x01;
        std::fs::set_permissions(&path, <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o644)).unwrap();
        std::fs::write(&path, &bytes).unwrap();

        let e = b.materialize(&target(file), &out, None, None, false).unwrap_err().to_string();
        assert!(e.contains(&bad.to_string()) && e.contains("hash mismatch"), "{file}: {e}");
        assert!(!out.exists(), "{file}: a failed restore wrote its file");
        assert!(!b.cat.cache.holds(&bad), "{file}: the rotten copy is still cached");
        assert_eq!(a.cat.bucket.list("quarantine").unwrap().len(), 0, "{file}: the bucket's good copy was moved aside");
        let r = b.materialize(&target(file), &out, None, None, false).unwrap();
        assert_eq!(r.verified_by, "objects as they arrived", "{file}: the block came from the bucket again");
        assert!(std::fs::read(&out).unwrap() == state_file(file), "{file}: not byte-exact after the rot");
        std::fs::remove_file(&out).unwrap();
    }
}

/// Several restores of one cold state at once (requests in flight on one machine): each is byte-exact, each
/// object is kept once and the cache's count of its bytes is what it holds.
#[test]
#[ignore = "needs real slot files: ./dev test"]
fn restores_in_flight_of_one_cold_state_keep_each_object_once() {
    let file = "gemma3_parent.bin";
    let bytes = state_file(file);
    let mem = Arc::new(InMemory::new());
    let (da, db) = (TempDir::new("fa"), TempDir::new("fb"));
    let (a, b) = (machine(&mem, &da, None, quick()), machine(&mem, &db, None, quick()));
    a.ingest("p", "", &bytes, &fp(&[]), None, false).unwrap();
    b.get("p", "").unwrap().expect("B knows the name");
    std::thread::scope(|sc| {
        let runs: Vec<_> = (0..4)
            .map(|k| {
                let (b, bytes, out) = (&b, &bytes, db.0.join(format!("p{k}.bin")));
                sc.spawn(move || assert!(restore(b, "p", &out).unwrap() == *bytes, "restore {k}"))
            })
            .collect();
        for r in runs {
            r.join().unwrap();
        }
    });
    let held = b.cat.cache.dir().list().unwrap();
    let stored: u64 = held.iter().map(|id| b.cat.cache.dir().mtime(id).unwrap().unwrap().1).sum();
    assert_eq!(b.cat.cache.used(), stored, "an object kept twice was counted twice");
    assert_eq!(temp_files(&b), 0);
    for id in objects_of(&a, "p") {
        assert!(held.contains(&id));
    }
}

/// A name's record carries its manifest (`names::INLINE_MANIFEST_MAX`): a machine that never saw the name
/// restores it with the manifest gone from the bucket's packs. Full attention and sliding window.
#[test]
#[ignore = "needs real slot files: ./dev test"]
fn a_cold_restore_reads_the_manifest_from_the_name_record() {
    let mem = Arc::new(InMemory::new());
    let (da, db) = (TempDir::new("ma"), TempDir::new("mb"));
    let (a, b) = (machine(&mem, &da, None, quick()), machine(&mem, &db, None, quick()));
    for file in FILES {
        a.ingest(file, "", &state_file(file), &fp(&[]), None, false).unwrap();
        let (rec, _) = names::read(&a.cat.bucket, "", file).unwrap().unwrap();
        let carried = rec.inline_manifest().expect("the record carries its manifest");
        assert_eq!(Manifest::from_json(rec.manifest, carried).unwrap(), load(&a, file).manifest);
        assert!(a.cat.objects.delete_many(&[rec.manifest], None).unwrap().is_empty());
        assert!(located(&a.cat.objects, &rec.manifest).is_none(), "{file}: the manifest is still packed");
    }
    for file in FILES {
        let out = db.0.join("cold.bin");
        assert!(restore(&b, file, &out).unwrap() == state_file(file), "{file}: not byte-exact");
    }
}

/// A carried manifest is trusted only if it hashes to the record's manifest id: a record whose
/// `manifest_json` is another state's manifest (valid, but not this one) restores this name's own state, read
/// from the packs; so does a record without the field (written before it, or with a larger manifest).
#[test]
#[ignore = "needs real slot files: ./dev test"]
fn a_carried_manifest_that_is_not_the_records_own_is_ignored() {
    let (own, other) = (FILES[0], FILES[1]);
    let (mem, _da, a) = both_saved_by_a("ta");
    let (other_rec, _) = names::read(&a.cat.bucket, "", other).unwrap().unwrap();
    let key = names::name_key("", own);
    let (mut rec, _) = names::read(&a.cat.bucket, "", own).unwrap().unwrap();
    for carried in [other_rec.manifest_json.clone(), None] {
        rec.manifest_json = carried;
        assert!(rec.inline_manifest().is_none());
        a.cat.bucket.put(&key, Bytes::from(serde_json::to_vec(&rec).unwrap())).unwrap();
        let d = TempDir::new("tb");
        let b = machine(&mem, &d, None, quick());
        let out = d.0.join("own.bin");
        assert!(restore(&b, own, &out).unwrap() == state_file(own), "not the record's own state");
    }
}

/// A name's record names the packs its objects lie in: a machine restoring a state saved elsewhere reads those
/// packs' indexes and no listing of the bucket's packs, whether its pack map was never listed or listed before
/// the save. Full attention and sliding window.
#[test]
#[ignore = "needs real slot files: ./dev test"]
fn a_restore_of_a_state_saved_elsewhere_reads_its_packs_without_listing_the_bucket() {
    let mem = Arc::new(InMemory::new());
    let (da, db) = (TempDir::new("pa"), TempDir::new("pb"));
    let (a, b) = (machine(&mem, &da, None, quick()), machine(&mem, &db, None, quick()));
    a.ingest("first", "", &state_file(FILES[0]), &fp(&[]), None, false).unwrap();
    restore(&b, "first", &db.0.join("first.bin")).unwrap();
    let listed_before = b.cat.objects.listings();
    for file in FILES {
        a.ingest(file, "", &state_file(file), &fp(&[]), None, false).unwrap();
        let (rec, _) = names::read(&a.cat.bucket, "", file).unwrap().unwrap();
        assert!(!rec.packs.is_empty(), "{file}: the record names no pack");
        let mut held: Vec<ObjectId> = a.cat.objects.places(&objects_of(&a, file)).into_iter().map(|(p, _)| p).collect();
        held.dedup();
        assert_eq!(rec.packs, held, "{file}");
        let dc = TempDir::new("pc");
        let c = machine(&mem, &dc, None, quick());
        assert!(restore(&c, file, &dc.0.join("c.bin")).unwrap() == state_file(file), "{file}: not byte-exact");
        assert_eq!(c.cat.objects.listings(), 0, "{file}: a machine that never listed the packs listed them");
        assert!(restore(&b, file, &db.0.join("b.bin")).unwrap() == state_file(file), "{file}: not byte-exact");
    }
    assert_eq!(b.cat.objects.listings(), listed_before, "a machine that had listed the packs listed them again");
}

/// A record whose packs are not where its objects are (a prune rewrote them since, or a bogus id) costs the
/// restore a listing, nothing more.
#[test]
#[ignore = "needs real slot files: ./dev test"]
fn a_record_naming_the_wrong_packs_still_restores() {
    let file = FILES[1];
    let mem = Arc::new(InMemory::new());
    let (da, db) = (TempDir::new("wa"), TempDir::new("wb"));
    let a = machine(&mem, &da, None, quick());
    a.ingest(file, "", &state_file(file), &fp(&[]), None, false).unwrap();
    let (mut rec, _) = names::read(&a.cat.bucket, "", file).unwrap().unwrap();
    rec.packs = vec![ObjectId::of(b"no such pack")];
    a.cat.bucket.put(&names::name_key("", file), Bytes::from(serde_json::to_vec(&rec).unwrap())).unwrap();
    let b = machine(&mem, &db, None, quick());
    assert!(restore(&b, file, &db.0.join("b.bin")).unwrap() == state_file(file), "not byte-exact");
    assert_eq!(b.cat.objects.listings(), 1);
}

/// Requests of each kind a machine sent while `f` ran.
fn requests_during<T>(m: &Machine, f: impl FnOnce() -> T) -> (T, std::collections::HashMap<&'static str, u64>) {
    let before: std::collections::HashMap<_, _> = m.cat.bucket.requests().into_iter().collect();
    let out = f();
    let sent = m.cat.bucket.requests().into_iter().map(|(k, n)| (k, n - before[k])).filter(|(_, n)| *n > 0).collect();
    (out, sent)
}

/// A warm restore writes the state this machine holds while it reads the name's record, and puts the file in
/// place only if the record names that state: unchanged, one request (the record); saved again elsewhere
/// meanwhile, the newer state, byte-exact, never the older; removed elsewhere, NameNotFound and no file.
/// Full attention (a parent, then a child of it under the same name) and sliding window.
#[test]
#[ignore = "needs real slot files: ./dev test"]
fn a_warm_restore_is_put_in_place_only_if_the_record_still_names_it() {
    let mem = Arc::new(InMemory::new());
    let (da, db) = (TempDir::new("oa"), TempDir::new("ob"));
    let (a, b) = (machine(&mem, &da, None, quick()), machine(&mem, &db, None, quick()));
    for (first, second) in [("smollm2_parent.bin", "smollm2_child.bin"), ("gemma3_parent.bin", "gemma3_child.bin")] {
        let out = db.0.join("n.bin");
        a.ingest("n", "", &state_file(first), &fp(&[]), None, false).unwrap();
        assert!(!b.held("n", "").unwrap(), "{first}: held asks nothing of the bucket, and B has not read the name");
        assert!(restore(&b, "n", &out).unwrap() == state_file(first), "{first}: cold");
        assert!(b.held("n", "").unwrap());
        let (r, sent) = requests_during(&b, || b.materialize(&target("n"), &out, None, None, false).unwrap());
        assert!(std::fs::read(&out).unwrap() == state_file(first), "{first}: warm");
        assert_eq!(r.verified_by, "file xxh3");
        assert_eq!(sent, [("get", 1)].into_iter().collect(), "{first}: a warm restore asks for the record alone");

        a.ingest("n", "", &state_file(second), &fp(&[]), None, false).unwrap();
        let (r, sent) = requests_during(&b, || b.materialize(&target("n"), &out, None, None, false).unwrap());
        assert!(std::fs::read(&out).unwrap() == state_file(second), "{second}: the older state was put in place");
        assert_eq!(r.manifest_id, b.get("n", "").unwrap().unwrap().manifest_id, "{second}");
        assert_eq!(sent.get("get"), Some(&2), "{second}: the record, then again for the state it names: {sent:?}");

        assert!(a.remove("n", "").unwrap());
        std::fs::remove_file(&out).unwrap();
        assert!(b.held("n", "").unwrap(), "{second}: B's index is behind A's removal until B reads the record");
        let e = b.materialize(&target("n"), &out, None, None, false).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::NameNotFound, "{second}: {e}");
        assert!(!b.held("n", "").unwrap(), "{second}: the record read dropped the name from B's index");
        assert!(!out.exists(), "{second}: a removed name's older state was put in place");
        assert!(!std::fs::read_dir(&db.0).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".tmp")));
    }
}

/// A name's record places each of its objects in its packs: a machine that never saw the name restores it
/// with the record's GET and the ranges alone (no pack index, no HEAD, no listing), byte-exact, and keeps what
/// it read. Full attention and sliding window.
#[test]
#[ignore = "needs real slot files: ./dev test"]
fn a_cold_restore_reads_the_record_and_the_ranges_alone() {
    let (mem, _da, a) = both_saved_by_a("ra");
    for file in FILES {
        let (rec, _) = names::read(&a.cat.bucket, "", file).unwrap().unwrap();
        let ids = objects_of(&a, file);
        assert_eq!(rec.places().len(), ids.len() + 1, "{file}: the record places its objects and its manifest");
        let db = TempDir::new("rb");
        let b = machine(&mem, &db, None, quick());
        let (bytes, sent) = requests_during(&b, || restore(&b, file, &db.0.join("cold.bin")).unwrap());
        assert!(bytes == state_file(file), "{file}: not byte-exact");
        assert_eq!(sent.get("get"), Some(&1), "{file}: {sent:?}");
        assert!(sent.keys().all(|k| ["get", "get_range"].contains(k)), "{file}: {sent:?}");
        assert!(ids.iter().all(|id| b.cat.cache.holds(id)), "{file}: what was read was not kept");
    }
}

/// Places that are wrong (a damaged record: each object placed where another lies, or past its pack's end)
/// never fail a restore, never put a wrong copy in the cache and never quarantine a good object: what they read
/// fails its id's check and the object is read again through the packs' indexes. Both reads: the one checked
/// by the file hash (a restore) and the one that checks each object (a prefix cut, `load`).
#[test]
#[ignore = "needs real slot files: ./dev test"]
fn wrong_places_in_a_record_cost_a_read_again_and_nothing_else() {
    let (mem, _da, a) = both_saved_by_a("wpa");
    for (file, past_end) in [(FILES[0], false), (FILES[1], false), (FILES[1], true)] {
        let key = names::name_key("", file);
        let (good, _) = names::read(&a.cat.bucket, "", file).unwrap().unwrap();
        let mut rec = good.clone();
        let n = rec.placed.len();
        for k in 0..n {
            let (pack, id, _, _) = good.placed[k];
            let (_, _, offset, len) = good.placed[(k + 1) % n]; // the next object's range
            rec.placed[k] = (pack, id, if past_end { offset + (1 << 40) } else { offset }, len);
        }
        a.cat.bucket.put(&key, Bytes::from(serde_json::to_vec(&rec).unwrap())).unwrap();
        for each_object in [false, true] {
            let db = TempDir::new("wpb");
            let b = machine(&mem, &db, None, quick());
            if each_object {
                let l = load(&b, file);
                assert_eq!(l.manifest.file_hash, load(&a, file).manifest.file_hash, "{file}");
            } else {
                assert!(restore(&b, file, &db.0.join("b.bin")).unwrap() == state_file(file), "{file}: not byte-exact");
            }
            assert!(a.cat.bucket.list("quarantine").unwrap().is_empty(), "{file}: a good object was quarantined");
            // What the cache kept is right: restored again with the bucket's packs out of reach, byte-exact.
            let held = b.cat.cache.dir().list().unwrap();
            assert!(objects_of(&a, file).iter().all(|id| held.contains(id)), "{file}: not kept");
            let dc = TempDir::new("wpc");
            let c = machine(&mem, &dc, None, quick());
            for id in &held {
                let kept = b.cat.cache.dir().get(id).unwrap().unwrap();
                assert!(c.cat.objects.get(id).unwrap() == Some(kept), "{file}: {id} kept wrong");
            }
        }
        a.cat.bucket.put(&key, Bytes::from(serde_json::to_vec(&good).unwrap())).unwrap();
    }
}

/// An in-memory bucket whose next `garble` ranged responses arrive with one byte flipped (a bad transfer: the
/// bucket's copy is fine).
#[derive(Debug)]
struct Garbling {
    inner: Arc<InMemory>,
    garble: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Display for Garbling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Garbling({})", self.inner)
    }
}

#[async_trait::async_trait]
impl object_store::ObjectStore for Garbling {
    async fn put_opts(
        &self,
        at: &object_store::path::Path,
        payload: object_store::PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.inner.put_opts(at, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        at: &object_store::path::Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.inner.put_multipart_opts(at, opts).await
    }
    async fn get_opts(&self, at: &object_store::path::Path, opts: object_store::GetOptions) -> object_store::Result<object_store::GetResult> {
        use std::sync::atomic::Ordering::SeqCst;
        let ranged = opts.range.is_some();
        let got = self.inner.get_opts(at, opts).await?;
        if !ranged || self.garble.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_err() {
            return Ok(got);
        }
        let (meta, range, attributes, extensions) = (got.meta.clone(), got.range.clone(), got.attributes.clone(), got.extensions.clone());
        let mut bytes = got.bytes().await?.to_vec();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x40;
        let payload = object_store::GetResultPayload::Stream(Box::pin(futures::stream::once(async { Ok(Bytes::from(bytes)) })));
        Ok(object_store::GetResult { payload, meta, range, attributes, extensions })
    }
    fn delete_stream(
        &self,
        at: futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>> {
        self.inner.delete_stream(at)
    }
    fn list(&self, prefix: Option<&object_store::path::Path>) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&object_store::path::Path>) -> object_store::Result<object_store::ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &object_store::path::Path,
        to: &object_store::path::Path,
        opts: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, opts).await
    }
}

/// A bad transfer (the bucket's copy is fine) never costs a good object: a restore checked by the file hash and
/// a read that hashes each object (a prefix cut, `load`) both read the object again, come out right, quarantine
/// nothing and keep only right copies. Full attention and sliding window.
#[test]
#[ignore = "needs real slot files: ./dev test"]
fn a_bad_transfer_is_read_again_and_quarantines_nothing() {
    let (mem, _da, a) = both_saved_by_a("ga");
    for file in FILES {
        for each_object in [false, true] {
            let garbling = Arc::new(Garbling { inner: mem.clone(), garble: 1.into() });
            let db = TempDir::new("gb");
            let b = machine_over(garbling.clone(), &db, None, quick());
            if each_object {
                assert_eq!(load(&b, file).manifest, load(&a, file).manifest, "{file}");
            } else {
                assert!(restore(&b, file, &db.0.join("b.bin")).unwrap() == state_file(file), "{file}: not byte-exact");
            }
            assert_eq!(garbling.garble.load(std::sync::atomic::Ordering::SeqCst), 0, "{file}: nothing was garbled");
            assert!(a.cat.bucket.list("quarantine").unwrap().is_empty(), "{file}: a good object was quarantined");
            let held = b.cat.cache.dir().list().unwrap();
            assert!(objects_of(&a, file).iter().all(|id| held.contains(id)), "{file}: not kept");
            for id in &held {
                assert!(a.cat.objects.get(id).unwrap() == b.cat.cache.dir().get(id).unwrap(), "{file}: {id} kept wrong");
            }
        }
    }
}
