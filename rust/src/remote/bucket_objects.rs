//! `BucketObjects`, the `Backend` of objects in a bucket. A save's objects go up in packs (`pack.rs`,
//! `packs/<2 hex>/<64 hex>` and its `.idx`), as restic packs blobs, manifests included; a single `put_file` is
//! a loose object, `objects/<2 hex>/<64 hex>` (the same KVOB bytes as a local store's file), as is what older
//! versions wrote. Reads find an object through the `PackMap`, else where a name's record placed it (`hint`),
//! and fetch it with a ranged GET, else loose.
//!
//! CONTRACT: every PUT is a create-if-absent (If-None-Match: *) of content-addressed bytes, so nothing is
//! rewritten; a PUT is atomic on S3, so there are no temp files. `put_files` encodes on rayon's threads,
//! packs the new objects in their order (about `PACK_TARGET` bytes a pack) and uploads packs and indexes
//! concurrently (`PARALLEL` requests in flight); all are durable when it returns. `download` reads adjacent
//! objects of a pack in one ranged GET (split to keep `PARALLEL` requests busy). `delete_many` is a prune,
//! planned then executed: packs holding only doomed (or duplicate) objects are deleted first; a pack holding
//! any is rewritten without them (its survivors uploaded as new packs first, then the old index, then the old
//! pack deleted), so the bucket holds no garbage after a gc and a cap counts what the bucket really holds; a
//! kill in between leaves duplicates, never a gap. Under an eviction's cap (`ceiling`) the copies must fit
//! below it: a pack whose survivors do not is left as it is, and its doomed objects are returned (still
//! stored, counted, taken by a later prune). Orphans older than `orphan_age` (a save killed between its
//! PUTs, an index deleted by hand): a pack without its index gets it back from its trailer (its objects then
//! count, and gc drops those no name references), an index without its pack is deleted. `touch` cannot
//! refresh a bucket's LastModified: reuse is protected by the lock protocol (`locks.rs`). `quarantine`
//! copies a corrupt object to `<prefix>/quarantine/` and removes it (a repack for a packed one), so the next
//! put repairs it. `stored` (the bucket's totals, for stats only) lists the bucket at most every
//! `TOTALS_FOR`, adding this process's uploads meanwhile; nothing that decides what to keep or evict reads it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use rayon::prelude::*;

use super::client::{Bucket, Meta, PARALLEL};
use super::hints::Hints;
use super::keys::{id_in_key, index_key, object_key, pack_key, unique_suffix};
use super::pack::{self, Entry};
use super::pack_map::{Located, PackInfo, PackMap};
use super::prune;
use crate::id::ObjectId;
use crate::objects::{Backend, ObjectError, Stamped};

/// A save's objects go up in packs of about this many bytes (several upload at once).
pub const PACK_TARGET: usize = 16 << 20;
/// Wanted objects of one pack this close together are read in one range (the gap is read and dropped).
const RANGE_GAP: u64 = 64 << 10;
/// A miss re-lists the packs at most this often (another machine may have saved the object meanwhile).
const REFRESH_EVERY: Duration = Duration::from_secs(1);
/// A prune rewrites packs in batches of about this many live bytes (bounds its memory).
const REPACK_BATCH: usize = 4 * PACK_TARGET;

#[derive(Clone)]
pub struct BucketObjects {
    pub(crate) bucket: Arc<Bucket>,
    packs: Arc<PackMap>,
    /// A pack without its index (or the reverse) older than this is a killed save's (the lock protocol's
    /// `stale_lock`): the prune rebuilds the pack's index from its trailer, or deletes the lone index.
    orphan_age: Duration,
    /// The gc generation at which `packs` was last listed under a save's lock (`trust_at`).
    trusted_at: Arc<std::sync::Mutex<Option<u64>>>,
    /// What name records just read say about where their objects lie (`hint`), for a read that misses.
    hints: Arc<Hints>,
    /// Loose objects (`objects/`, with their lengths) as listed by `trust_at` at `trusted_at`'s generation: a
    /// save's dedup asks this set instead of sending a HEAD for each object its pack map lacks. None: not
    /// listed, or changed here since (a prune, a delete).
    loose: Arc<std::sync::RwLock<Option<HashMap<ObjectId, u64>>>>,
    /// The bucket's totals for `stored` (when listed, objects, bytes): listed at most every `TOTALS_FOR`, this
    /// process's uploads added as they go; None after a prune here (the next read lists).
    totals: Arc<std::sync::Mutex<Option<(Instant, u64, u64)>>>,
}

/// How long the bucket's totals (`stored`: stats, /metrics, the status page) serve before they are listed
/// again. A listing of a large bucket is many requests (1,000 keys a page) and a scrape every 15 s must not
/// send them all each time; another machine's saves show in these totals within this long.
const TOTALS_FOR: Duration = Duration::from_secs(60);

/// One ranged GET: a span of a pack, and the wanted objects in it (their slot in the caller's list).
struct Span {
    pack: ObjectId,
    start: u64,
    end: u64,
    parts: Vec<(usize, Entry)>,
}

impl BucketObjects {
    pub fn new(bucket: Arc<Bucket>, orphan_age: Duration) -> Self {
        BucketObjects {
            bucket,
            packs: Arc::new(PackMap::default()),
            orphan_age,
            trusted_at: Arc::default(),
            hints: Arc::default(),
            loose: Arc::default(),
            totals: Arc::default(),
        }
    }

    /// Called under a save's shared lock with the bucket's gc generation: the pack map is listed again if a
    /// gc may have pruned since it was last listed under such a lock, so that dedup against a pack it names
    /// is safe until the lock is released (a prune bumps the generation before it deletes anything).
    pub fn trust_at(&self, generation: u64) -> Result<(), ObjectError> {
        let mut seen = self.trusted_at.lock().expect("generation lock");
        let new_generation = *seen != Some(generation);
        if new_generation {
            self.packs.refresh(&self.bucket)?;
        }
        // Listed again after a prune here too (`loose_changed`), which already listed the packs afresh.
        if new_generation || self.loose.read().expect("loose lock").is_none() {
            let listed = self.bucket.list("objects")?;
            let loose = listed.iter().filter_map(|m| Some((id_in_key(&m.rel)?, m.size))).collect();
            *self.loose.write().expect("loose lock") = Some(loose);
        }
        *seen = Some(generation);
        Ok(())
    }

    /// Forget the loose listing (this process deleted or wrote loose objects): the next dedup asks the bucket.
    fn loose_changed(&self) {
        *self.loose.write().expect("loose lock") = None;
    }

    fn locate(&self, id: &ObjectId) -> Result<Option<Located>, ObjectError> {
        if let Some(l) = self.packs.locate(id) {
            return Ok(Some(l));
        }
        if self.packs.refresh_if_stale(&self.bucket, REFRESH_EVERY)? {
            return Ok(self.packs.locate(id));
        }
        Ok(None)
    }

    /// Upload encoded objects as packs and their indexes (create-if-absent each); durable when it returns.
    pub fn upload(&self, items: Vec<(ObjectId, Bytes)>) -> Result<(), ObjectError> {
        let mut seen = HashSet::new();
        let items: Vec<_> = items.into_iter().filter(|(id, _)| seen.insert(*id)).collect();
        if items.is_empty() {
            return Ok(());
        }
        let built: Vec<pack::Built> = pack::group(items, PACK_TARGET).par_iter().map(|g| pack::build(g)).collect();
        let puts: Vec<(String, Bytes)> = built
            .iter()
            .flat_map(|p| [(pack_key(&p.id), p.bytes.clone()), (index_key(&p.id), Bytes::from(p.index.clone()))])
            .collect();
        let b = &*self.bucket;
        b.run_all(puts, PARALLEL, |(key, bytes)| async move { b.put_create_async(&key, bytes).await })?;
        let objects = built.iter().map(|p| p.entries.len() as u64).sum();
        self.totals_add(objects, built.iter().map(|p| (p.bytes.len() + p.index.len()) as u64).sum());
        for p in built {
            let info = PackInfo { modified: SystemTime::now(), entries: p.entries };
            self.packs.add(p.id, info);
        }
        Ok(())
    }

    /// Where these objects' canonical copies lie now: (pack, entry) of each packed one (loose objects have none).
    pub fn places(&self, ids: &[ObjectId]) -> Vec<(ObjectId, Entry)> {
        let mut seen = HashSet::new();
        ids.iter().filter(|id| seen.insert(**id)).filter_map(|id| self.packs.locate(id)).map(|l| (l.pack, l.entry)).collect()
    }

    /// What a name's record says of where its objects lay when it was committed (`names.rs`): the packs, and
    /// each object's place in them. A later read that misses in the pack map reads those ranges at once, then
    /// the packs' indexes, before it lists the bucket. Costs no request now. A place is only a hint: packs are
    /// immutable (keyed by their hash), so one is right or its pack is gone (a prune), and what a read fetches
    /// is checked against its id before it is used or kept (`ObjectStore::get_fetched`).
    pub fn hint(&self, packs: &[ObjectId], places: &[(ObjectId, Entry)]) {
        self.hints.add(packs, places, |p| self.packs.knows(p));
    }

    pub fn listings(&self) -> u64 {
        self.packs.listings()
    }

    /// Download these objects concurrently (packed ones by ranged GETs); None for an absent one.
    pub fn download(&self, ids: Vec<ObjectId>) -> Result<Vec<Option<Bytes>>, ObjectError> {
        let mut out: Vec<Option<Bytes>> = vec![None; ids.len()];
        let all: Vec<usize> = (0..ids.len()).collect();
        let mut left = self.read_packed(&ids, &all, &mut out)?;
        // Not in a pack this map knows (a pack another machine just wrote, or one a prune elsewhere rewrote):
        // where name records placed them; the packs they named, by their indexes; then every pack listed
        // again, once; then loose (what older versions wrote).
        if !left.is_empty() {
            left = self.read_placed(&ids, left, &mut out);
        }
        if !left.is_empty() && self.packs.learn(&self.bucket, &self.hints.take_packs())? > 0 {
            left = self.read_packed(&ids, &left, &mut out)?;
        }
        if !left.is_empty() {
            self.packs.refresh(&self.bucket)?;
            left = self.read_packed(&ids, &left, &mut out)?;
        }
        let b = &*self.bucket;
        let loose = b.run_all(left.clone(), PARALLEL, |k| {
            let key = object_key(&ids[k]);
            async move { Ok(b.get_async(&key).await?.map(|(bytes, _)| bytes)) }
        })?;
        for (k, got) in left.into_iter().zip(loose) {
            out[k] = got;
        }
        Ok(out)
    }

    /// [`download`](Self::download), each object handed to `deliver(slot, encoded)` the moment its last byte
    /// arrived (a restore checks one while the others are on their way); `ids` distinct. Returns the slots of
    /// the objects the bucket does not hold. What the pack map locates, and what name records placed
    /// (`hint`), is streamed; the rare rest (a pack neither knows, loose objects) is read as `download` reads
    /// it and handed over after.
    pub fn download_each(&self, ids: &[ObjectId], deliver: &(dyn Fn(usize, Bytes) + Sync)) -> Result<Vec<usize>, ObjectError> {
        let mut wanted: Vec<(ObjectId, usize, Entry)> = Vec::new();
        let mut unlocated = Vec::new();
        for (k, id) in ids.iter().enumerate() {
            match self.packs.locate(id) {
                Some(l) => wanted.push((l.pack, k, l.entry)),
                None => unlocated.push(k),
            }
        }
        let (placed, mut left) = self.hints.take_places(ids, unlocated);
        // A place that fails in any way is a miss, never an error (as in `read_placed`).
        let tolerant: HashSet<usize> = placed.iter().map(|(_, k, _)| *k).collect();
        wanted.extend(placed);
        left.extend(self.stream_spans(wanted, &tolerant, deliver)?);
        if left.is_empty() {
            return Ok(left);
        }
        let got = self.download(left.iter().map(|&k| ids[k]).collect())?;
        let mut absent = Vec::new();
        for (k, got) in left.into_iter().zip(got) {
            match got {
                Some(bytes) => deliver(k, bytes),
                None => absent.push(k),
            }
        }
        Ok(absent)
    }

    /// Read these (pack, slot, entry)s by ranged GETs (`plan_spans`), each object handed to `deliver` as soon
    /// as it is whole; returns the slots not delivered (a range not there, or cut short; a failed span with a
    /// `tolerant` slot in it).
    fn stream_spans(
        &self,
        wanted: Vec<(ObjectId, usize, Entry)>,
        tolerant: &HashSet<usize>,
        deliver: &(dyn Fn(usize, Bytes) + Sync),
    ) -> Result<Vec<usize>, ObjectError> {
        let b = &*self.bucket;
        let undelivered = b.run_all(plan_spans(wanted, b.range_bytes()), PARALLEL, |s| async move {
            let mut parts = s.parts;
            parts.sort_by_key(|(_, e)| e.offset);
            let mut next = 0; // parts delivered so far
            // The bytes from `start` on: each part leaves as a slice of the front split off at its end (no copy).
            let mut start = s.start;
            let mut buf = bytes::BytesMut::with_capacity((s.end - s.start) as usize);
            // The part delivered last: an object asked for twice (two slots, one place) gets its bytes again.
            let mut last: Option<(Entry, Bytes)> = None;
            let got = b
                .get_range_each(&pack_key(&s.pack), s.start..s.end, |chunk| {
                    buf.extend_from_slice(&chunk);
                    while let Some(&(k, e)) = parts.get(next) {
                        let end = e.offset + e.len as u64;
                        if e.offset < start {
                            match &last {
                                Some((le, bytes)) if (le.offset, le.len) == (e.offset, e.len) => deliver(k, bytes.clone()),
                                _ => break, // overlaps one delivered (not a pack's layout): left to the fallback
                            }
                        } else if end > start + buf.len() as u64 {
                            break; // not whole yet
                        } else {
                            let front = buf.split_to((end - start) as usize).freeze();
                            let bytes = front.slice((e.offset - start) as usize..);
                            deliver(k, bytes.clone());
                            last = Some((e, bytes));
                            start = end;
                        }
                        next += 1;
                    }
                })
                .await;
            match got {
                Err(e) if !parts[next..].iter().any(|(k, _)| tolerant.contains(k)) => Err(e),
                _ => Ok(parts[next..].iter().map(|(k, _)| *k).collect::<Vec<usize>>()),
            }
        })?;
        Ok(undelivered.into_iter().flatten().collect())
    }

    /// Read `which` of `ids` from their packs into `out`; returns those not found in a pack.
    fn read_packed(&self, ids: &[ObjectId], which: &[usize], out: &mut [Option<Bytes>]) -> Result<Vec<usize>, ObjectError> {
        let mut left = Vec::new();
        let mut wanted: Vec<(ObjectId, usize, Entry)> = Vec::new();
        for &k in which {
            match self.packs.locate(&ids[k]) {
                Some(l) => wanted.push((l.pack, k, l.entry)),
                None => left.push(k),
            }
        }
        left.extend(self.read_spans(wanted, &HashSet::new(), out)?);
        Ok(left)
    }

    /// Read `which` of `ids` where name records placed them (each place used once) into `out`; returns those
    /// not read so. A place that fails in any way (its pack gone, a range past its end) is a miss, never an
    /// error: the reads after it find the object, or say why not.
    fn read_placed(&self, ids: &[ObjectId], which: Vec<usize>, out: &mut [Option<Bytes>]) -> Vec<usize> {
        let (wanted, mut left) = self.hints.take_places(ids, which);
        let tried: HashSet<usize> = wanted.iter().map(|(_, k, _)| *k).collect();
        // Every part tolerant: a failed span's parts come back as not read, never as an error.
        left.extend(self.read_spans(wanted, &tried, out).unwrap_or_else(|_| tried.into_iter().collect()));
        left
    }

    /// Read these (pack, slot, entry)s by ranged GETs (`plan_spans`) into `out[slot]`; returns the slots not
    /// read (a range not there: a pack deleted or rewritten since it was listed; or cut short, past the parts
    /// already whole). Errors other than a missing range end the read, unless a part of the failed span not yet
    /// read is `tolerant` (as `stream_spans`; callers pass none or all).
    fn read_spans(
        &self,
        wanted: Vec<(ObjectId, usize, Entry)>,
        tolerant: &HashSet<usize>,
        out: &mut [Option<Bytes>],
    ) -> Result<Vec<usize>, ObjectError> {
        let got = std::sync::Mutex::new(Vec::with_capacity(wanted.len()));
        let missed = self.stream_spans(wanted, tolerant, &|k, bytes| got.lock().unwrap_or_else(|e| e.into_inner()).push((k, bytes)))?;
        for (k, bytes) in got.into_inner().unwrap_or_else(|e| e.into_inner()) {
            out[k] = Some(bytes);
        }
        Ok(missed)
    }

    /// Every object once with its LastModified and length (packed ones: their pack's time; loose ones not also
    /// packed), and the bytes the bucket holds for them (everything under `packs/`, and the loose objects).
    /// One listing of `packs/` (the pack map refreshed) and one of `objects/`.
    fn census(&self) -> Result<(Vec<Stamped>, u64), ObjectError> {
        let listed = self.packs.refresh(&self.bucket)?;
        let mut out: Vec<Stamped> =
            self.packs.objects().into_iter().map(|l| (l.entry.id, l.modified, l.entry.len as u64)).collect();
        let packed: HashSet<ObjectId> = out.iter().map(|(id, _, _)| *id).collect();
        let mut bytes = listed.bytes;
        for m in self.bucket.list("objects")? {
            bytes += m.size;
            if let Some(id) = id_in_key(&m.rel) {
                if !packed.contains(&id) {
                    out.push((id, m.modified, m.size));
                }
            }
        }
        Ok((out, bytes))
    }

    /// Every object with its LastModified and length (`census`).
    pub fn list_stamped_all(&self) -> Result<Vec<Stamped>, ObjectError> {
        Ok(self.census()?.0)
    }

    /// (objects, bytes the bucket holds for them: whole packs with their indexes, and loose objects), as
    /// listed at most `TOTALS_FOR` ago plus this process's uploads since.
    pub fn stored(&self) -> Result<(u64, u64), ObjectError> {
        if let Some((at, objects, bytes)) = *self.totals.lock().unwrap_or_else(|e| e.into_inner()) {
            if at.elapsed() < TOTALS_FOR {
                return Ok((objects, bytes));
            }
        }
        let (objects, bytes) = self.census()?;
        let objects = objects.len() as u64;
        *self.totals.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), objects, bytes));
        Ok((objects, bytes))
    }

    fn totals_add(&self, objects: u64, bytes: u64) {
        if let Some((_, o, b)) = self.totals.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            *o += objects;
            *b += bytes;
        }
    }

    /// Objects left the bucket (a prune): the next `stored` lists it.
    fn totals_changed(&self) {
        *self.totals.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// `Backend::put_files`'s work, returning the encoded bytes (None: already present) so that the cache in
    /// front (`Cached`) keeps the same bytes without encoding or uploading twice.
    #[allow(clippy::type_complexity)]
    pub fn encode_and_upload(
        &self,
        ids: &[ObjectId],
        make: &(dyn Fn(usize) -> Result<Option<Vec<u8>>, ObjectError> + Sync),
    ) -> Result<Vec<Option<Bytes>>, ObjectError> {
        // `make` may block on the bucket itself (a HEAD), so it runs here, outside the runtime.
        let encoded: Vec<Option<Bytes>> =
            (0..ids.len()).into_par_iter().map(|i| Ok(make(i)?.map(Bytes::from))).collect::<Result<_, ObjectError>>()?;
        let items = ids.iter().zip(&encoded).filter_map(|(id, e)| e.clone().map(|b| (*id, b))).collect();
        self.upload(items)?;
        Ok(encoded)
    }

    /// The prune: remove `doomed` objects (and duplicate copies) from their packs, give old lone packs their
    /// index back, delete old lone indexes and the doomed loose objects. Planned (`prune.rs`) on a fresh
    /// listing, then executed: what goes whole first (a pack's index before the pack, so no reader trusts a
    /// pack being deleted for longer than one listing), then the rewrites batch by batch (survivors up first,
    /// then the old packs go). `ceiling`: the bytes the bucket may hold meanwhile (or what it held when it
    /// began, if more; None: as much as it takes). Returns the doomed objects left in packs that did not fit.
    fn prune(&self, doomed: &[ObjectId], ceiling: Option<u64>) -> Result<Vec<ObjectId>, ObjectError> {
        self.loose_changed();
        self.totals_changed();
        let listed = self.packs.refresh(&self.bucket)?;
        let room = ceiling.map(|c| c.saturating_sub(listed.bytes));
        let plan = prune::plan(&self.packs, listed.orphans, doomed, self.orphan_age, REPACK_BATCH, room, object_key);
        let b = &*self.bucket;
        b.run_all(plan.drops.clone(), PARALLEL, |p| async move { b.delete_async(&index_key(&p)).await })?;
        let whole = plan.drops.iter().map(pack_key).chain(plan.deletes);
        b.run_all(whole.collect(), PARALLEL, |key| async move { b.delete_async(&key).await })?;
        self.packs.remove(&plan.drops);
        for m in &plan.lone_packs {
            self.rebuild_index(m)?;
        }
        for batch in plan.rewrites {
            self.repack(batch)?;
        }
        self.totals_changed(); // a `stored` that listed while the prune ran may have seen it half done
        Ok(plan.left)
    }

    /// Write a pack's index again from the copy in its trailer (its objects then count again; a gc removes
    /// those no name references, as it does any).
    fn rebuild_index(&self, m: &Meta) -> Result<(), ObjectError> {
        let Some(id) = id_in_key(&m.rel) else { return Ok(()) };
        let b = &*self.bucket;
        let key = pack_key(&id);
        let read = |range| b.block_on(b.get_range_async(&key, range));
        let Some(tail) = read(m.size.saturating_sub(pack::TRAILER as u64)..m.size)? else { return Ok(()) };
        let Ok(ilen) = pack::trailer_index_len(&tail) else { return Ok(()) }; // not a pack: left for a person
        let start = m.size.saturating_sub(pack::TRAILER as u64 + ilen);
        let Some(index) = read(start..m.size - pack::TRAILER as u64)? else { return Ok(()) };
        if pack::decode_index(&index).is_ok() {
            b.put_create(&index_key(&id), index)?;
        }
        Ok(())
    }

    /// Upload the survivors of these packs as new packs, then delete the old ones.
    fn repack(&self, batch: Vec<(ObjectId, Vec<Entry>)>) -> Result<(), ObjectError> {
        if batch.is_empty() {
            return Ok(());
        }
        let survivors: Vec<(ObjectId, Entry)> =
            batch.iter().flat_map(|(pid, keep)| keep.iter().map(move |e| (*pid, *e))).collect();
        let mut got: Vec<Option<Bytes>> = vec![None; survivors.len()];
        let wanted = survivors.iter().enumerate().map(|(k, (pid, e))| (*pid, k, *e)).collect();
        if let Some(&k) = self.read_spans(wanted, &HashSet::new(), &mut got)?.first() {
            // The pack changed under the plan (a prune elsewhere, which the gc lock should exclude): stop before
            // deleting anything.
            return Err(ObjectError::Missing { id: survivors[k].1.id });
        }
        let items = survivors.iter().zip(got).map(|((_, e), g)| (e.id, g.expect("every slot read"))).collect();
        self.upload(items)?;
        let b = &*self.bucket;
        let old: Vec<ObjectId> = batch.iter().map(|(p, _)| *p).collect();
        b.run_all(old.clone(), PARALLEL, |p| async move { b.delete_async(&index_key(&p)).await })?;
        b.run_all(old.clone(), PARALLEL, |p| async move { b.delete_async(&pack_key(&p)).await })?;
        self.packs.remove(&old);
        Ok(())
    }
}

/// Ranged GETs for these (pack, slot, entry)s: adjacent entries of one pack are merged while the gap between
/// them is at most `RANGE_GAP`, and a span is closed at a size that spreads the bytes over `PARALLEL` requests,
/// but not below `range_min` (`Bucket::range_bytes`) nor above twice that.
fn plan_spans(mut wanted: Vec<(ObjectId, usize, Entry)>, range_min: u64) -> Vec<Span> {
    let total: u64 = wanted.iter().map(|(_, _, e)| e.len as u64).sum();
    let cap = (total / PARALLEL as u64).clamp(range_min, 2 * range_min);
    wanted.sort_by_key(|(p, _, e)| (p.0, e.offset));
    let mut spans: Vec<Span> = Vec::new();
    for (pack, k, e) in wanted {
        match spans.last_mut() {
            Some(s) if s.pack == pack && e.offset >= s.end && e.offset - s.end <= RANGE_GAP && s.end - s.start < cap => {
                s.end = e.offset + e.len as u64;
                s.parts.push((k, e));
            }
            Some(s) if s.pack == pack && e.offset < s.end => {
                s.end = s.end.max(e.offset + e.len as u64); // the same object asked twice
                s.parts.push((k, e));
            }
            _ => spans.push(Span { pack, start: e.offset, end: e.offset + e.len as u64, parts: vec![(k, e)] }),
        }
    }
    spans
}

impl Backend for BucketObjects {
    fn put_file(&self, id: &ObjectId, encoded: &[u8]) -> Result<(), ObjectError> {
        if self.bucket.put_create(&object_key(id), Bytes::copy_from_slice(encoded))? {
            self.totals_add(1, encoded.len() as u64);
        }
        if let Some(loose) = self.loose.write().expect("loose lock").as_mut() {
            loose.insert(*id, encoded.len() as u64);
        }
        Ok(())
    }

    fn put_files(
        &self,
        ids: &[ObjectId],
        make: &(dyn Fn(usize) -> Result<Option<Vec<u8>>, ObjectError> + Sync),
    ) -> Result<Vec<Option<u64>>, ObjectError> {
        Ok(self.encode_and_upload(ids, make)?.iter().map(|e| e.as_ref().map(|b| b.len() as u64)).collect())
    }

    fn get(&self, id: &ObjectId) -> Result<Option<Vec<u8>>, ObjectError> {
        Ok(self.download(vec![*id])?.pop().flatten().map(|b| b.to_vec()))
    }

    /// Asks the bucket (the pack map, else a HEAD), never the save's loose listing: `verify` relies on it.
    fn exists(&self, id: &ObjectId) -> Result<bool, ObjectError> {
        Ok(self.mtime(id)?.is_some())
    }

    fn list(&self) -> Result<Vec<ObjectId>, ObjectError> {
        Ok(self.list_stamped_all()?.into_iter().map(|(id, _, _)| id).collect())
    }

    fn list_stamped(&self) -> Result<Vec<Stamped>, ObjectError> {
        self.list_stamped_all()
    }

    fn delete_many(&self, ids: &[ObjectId], ceiling: Option<u64>) -> Result<Vec<ObjectId>, ObjectError> {
        self.prune(ids, ceiling)
    }

    fn delete(&self, id: &ObjectId) -> Result<u64, ObjectError> {
        let Some((_, len)) = self.mtime(id)? else { return Ok(0) };
        self.prune(&[*id], None)?;
        Ok(len)
    }

    fn mtime(&self, id: &ObjectId) -> Result<Option<(SystemTime, u64)>, ObjectError> {
        if let Some(l) = self.locate(id)? {
            return Ok(Some((l.modified, l.entry.len as u64)));
        }
        Ok(self.bucket.head(&object_key(id))?.map(|m| (m.modified, m.size)))
    }

    /// Dedup at ingest: the pack map, then the loose objects listed under the save's lock at this gc
    /// generation (`trust_at`; no gc runs while a save holds it, and an object another machine writes meanwhile
    /// is at worst uploaded twice, which a prune drops); without that listing, a HEAD.
    fn touch(&self, id: &ObjectId) -> Result<Option<u64>, ObjectError> {
        if let Some(l) = self.packs.locate(id) {
            return Ok(Some(l.entry.len as u64));
        }
        if let Some(loose) = &*self.loose.read().expect("loose lock") {
            return Ok(loose.get(id).copied());
        }
        Ok(self.mtime(id)?.map(|(_, len)| len))
    }

    fn stale_temp(&self, _grace: Duration) -> Result<usize, ObjectError> {
        Ok(0)
    }

    fn clean_temp(&self, _grace: Duration) -> Result<usize, ObjectError> {
        Ok(0)
    }

    fn quarantine(&self, id: &ObjectId) -> Result<(), ObjectError> {
        let Some(bytes) = self.download(vec![*id])?.pop().flatten() else { return Ok(()) };
        self.bucket.put(&format!("quarantine/{}.{}", id.hex(), unique_suffix()), bytes)?;
        self.prune(&[*id], None).map(drop)
    }
}

/// How many of these ids lie in each pack (tests look inside).
#[cfg(test)]
pub fn packs_of(objects: &BucketObjects, ids: &[ObjectId]) -> std::collections::HashMap<ObjectId, usize> {
    let mut out = std::collections::HashMap::new();
    for id in ids {
        if let Some(l) = objects.packs.locate(id) {
            *out.entry(l.pack).or_insert(0) += 1;
        }
    }
    out
}

/// Where an object lies in the bucket: its pack's key, offset and length (tests corrupt it there).
#[cfg(test)]
pub fn located(objects: &BucketObjects, id: &ObjectId) -> Option<(String, u64, u64)> {
    objects.packs.locate(id).map(|l| (pack_key(&l.pack), l.entry.offset, l.entry.len as u64))
}

#[cfg(test)]
mod tests {
    use super::super::client::RANGE_BYTES;
    use super::*;

    /// A 15.6 MB state in one pack (24 objects of 650 KB, back to back) and a few of another: ranges of at
    /// least the asked size and at most twice it, each object read once, in one range of its own pack, with a
    /// gap above `RANGE_GAP` never read.
    #[test]
    fn a_restore_reads_few_large_ranges() {
        let (p, q) = (ObjectId::of(b"pack p"), ObjectId::of(b"pack q"));
        let mut wanted: Vec<(ObjectId, usize, Entry)> = (0..24u64)
            .map(|k| (p, k as usize, Entry { id: ObjectId::of(&k.to_le_bytes()), offset: k * 650_000, len: 650_000 }))
            .collect();
        wanted.push((q, 24, Entry { id: ObjectId::of(b"q0"), offset: 0, len: 1000 }));
        wanted.push((q, 25, Entry { id: ObjectId::of(b"q1"), offset: 1000 + RANGE_GAP + 1, len: 1000 }));
        wanted.reverse(); // in any order
        for (range_min, ranges_of_p) in [(RANGE_BYTES, 2), (1 << 20, 12)] {
            let spans = plan_spans(wanted.clone(), range_min);
            let of_p: Vec<&Span> = spans.iter().filter(|s| s.pack == p).collect();
            assert_eq!(of_p.len(), ranges_of_p, "range_min {range_min}");
            assert!(of_p.iter().all(|s| s.end - s.start <= 2 * range_min), "range_min {range_min}");
            assert_eq!(spans.iter().filter(|s| s.pack == q).count(), 2, "a gap above RANGE_GAP is not read");
            let mut slots: Vec<usize> = spans.iter().flat_map(|s| s.parts.iter().map(|(k, _)| *k)).collect();
            slots.sort();
            assert_eq!(slots, (0..26).collect::<Vec<_>>(), "each object once");
            for s in &spans {
                assert!(s.parts.iter().all(|(_, e)| e.offset >= s.start && e.offset + e.len as u64 <= s.end));
            }
        }
    }
}
