//! `PackMap`: where each packed object of the bucket lies, learned from the packs' indexes (`pack.rs`) and
//! kept in memory; rebuilt from the bucket by one listing of `packs/` and a GET of each index not yet known,
//! or grown by the packs a name's record names (`learn`), without a listing.
//!
//! CONTRACT: a pack counts only once both it and its index are listed (they are PUT together, so either may
//! land first; a save commits its name only after both). An object in several packs (a repack killed before
//! it deleted the old pack, or two machines saving the same block at once) has one canonical copy, in the
//! newest pack (ties: the larger pack id); the other copies are garbage that the next prune drops. A pack
//! whose index does not match its length is left out (its objects read as absent, so a save uploads them
//! again). The map is a cache: every read of a pack that vanished meanwhile (a prune elsewhere) refreshes it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant, SystemTime};

use super::client::{Bucket, Meta};
use super::error::RemoteError;
use super::keys::{index_key, pack_key, PACKS};
use super::pack::{self, Entry};
use crate::id::ObjectId;

/// One pack as its index describes it.
#[derive(Debug, Clone)]
pub struct PackInfo {
    /// The index's LastModified (the bucket's clock; our own clock for a pack we just uploaded).
    pub modified: SystemTime,
    pub entries: Vec<Entry>,
}

/// Where a packed object's canonical copy lies.
#[derive(Debug, Clone, Copy)]
pub struct Located {
    pub pack: ObjectId,
    pub entry: Entry,
    pub modified: SystemTime,
}

/// What a listing of `packs/` found besides whole packs: a pack without its index or an index without its
/// pack (a save killed between its PUTs, or an index deleted by hand); the prune deals with them once old.
pub type Orphans = Vec<Meta>;

#[derive(Default)]
struct State {
    packs: HashMap<ObjectId, PackInfo>,
    /// Object id -> (pack, entry) of its canonical copy.
    objects: HashMap<ObjectId, (ObjectId, Entry)>,
    refreshed: Option<Instant>,
}

impl State {
    /// Make `entry` of `pack` (already in `packs`) its object's canonical copy if that pack is newer than the
    /// one named now (ties: the larger pack id).
    fn offer(&mut self, pack: ObjectId, entry: Entry) {
        let rank = |p: &ObjectId| (self.packs[p].modified, p.0);
        let newer = self.objects.get(&entry.id).is_none_or(|(have, _)| rank(&pack) > rank(have));
        if newer {
            self.objects.insert(entry.id, (pack, entry));
        }
    }

    /// Every object's canonical copy chosen again (packs were removed, or their times changed).
    fn rebuild(&mut self) {
        self.objects.clear();
        let all: Vec<(ObjectId, Entry)> =
            self.packs.iter().flat_map(|(p, info)| info.entries.iter().map(move |e| (*p, *e))).collect();
        for (pack, entry) in all {
            self.offer(pack, entry);
        }
    }
}

/// What one listing of `packs/` found besides the packs the map now holds.
pub struct Listed {
    pub orphans: Orphans,
    /// Every byte under `packs/`: packs, their indexes and orphans (what the bucket holds for packed objects).
    pub bytes: u64,
}

#[derive(Default)]
pub struct PackMap {
    state: RwLock<State>,
    /// Listings of `packs/` so far (`refresh`).
    listings: AtomicU64,
}

impl PackMap {
    pub fn locate(&self, id: &ObjectId) -> Option<Located> {
        let s = self.state.read().expect("pack map lock");
        let (pack, entry) = *s.objects.get(id)?;
        Some(Located { pack, entry, modified: s.packs[&pack].modified })
    }

    /// A pack this process just uploaded (with its index). Only its own entries are weighed: a save must not
    /// pay for the size of the bucket.
    pub fn add(&self, pack: ObjectId, info: PackInfo) {
        let mut s = self.state.write().expect("pack map lock");
        let entries = info.entries.clone();
        s.packs.insert(pack, info);
        for entry in entries {
            s.offer(pack, entry);
        }
    }

    /// A pack this process just deleted.
    pub fn remove(&self, packs: &[ObjectId]) {
        let mut s = self.state.write().expect("pack map lock");
        for p in packs {
            s.packs.remove(p);
        }
        s.rebuild();
    }

    /// Every pack and its entries (a prune's plan is made on this).
    pub fn packs(&self) -> Vec<(ObjectId, PackInfo)> {
        self.state.read().expect("pack map lock").packs.iter().map(|(p, i)| (*p, i.clone())).collect()
    }

    /// Every object's canonical copy.
    pub fn objects(&self) -> Vec<Located> {
        let s = self.state.read().expect("pack map lock");
        s.objects.iter().map(|(_, &(pack, entry))| Located { pack, entry, modified: s.packs[&pack].modified }).collect()
    }

    /// Whether `id`'s canonical copy is in `pack`.
    pub fn is_canonical(&self, id: &ObjectId, pack: &ObjectId) -> bool {
        self.state.read().expect("pack map lock").objects.get(id).is_some_and(|(p, _)| p == pack)
    }

    /// How many times this map listed `packs/`.
    pub fn listings(&self) -> u64 {
        self.listings.load(Ordering::Relaxed)
    }

    /// Whether the map knows `pack`.
    pub fn knows(&self, pack: &ObjectId) -> bool {
        self.state.read().expect("pack map lock").packs.contains_key(pack)
    }

    /// Read these packs by their indexes alone (a GET of each index beside a HEAD of the pack, all in parallel)
    /// instead of listing every pack: a machine restoring a state another one just saved pays for that state's
    /// packs, not for the size of the bucket. A pack gone since (a prune) or whose index does not match its
    /// length is left out, as a listing leaves it out. Returns how many packs it added.
    pub fn learn(&self, bucket: &Bucket, packs: &[ObjectId]) -> Result<usize, RemoteError> {
        let unknown: HashSet<ObjectId> = packs.iter().filter(|p| !self.knows(p)).copied().collect();
        if unknown.is_empty() {
            return Ok(0);
        }
        let read = bucket.run_all(unknown.into_iter().collect(), super::client::PARALLEL, |id| async move {
            let (index_at, pack_at) = (index_key(&id), pack_key(&id));
            let (index, pack) = futures::join!(bucket.get_async(&index_at), bucket.head_async(&pack_at));
            Ok((id, index?, pack?))
        })?;
        let mut s = self.state.write().expect("pack map lock");
        let mut added = 0;
        for (id, index, pack) in read {
            let (Some((bytes, meta)), Some(pack)) = (index, pack) else { continue };
            let Ok((entries, data_len)) = pack::decode_index(&bytes) else { continue };
            if pack::pack_len(data_len, entries.len()) != pack.size {
                continue;
            }
            s.packs.insert(id, PackInfo { modified: meta.modified, entries: entries.clone() });
            for entry in entries {
                s.offer(id, entry);
            }
            added += 1;
        }
        Ok(added)
    }

    /// Refresh unless that was done less than `every` ago; true if it listed the bucket.
    pub fn refresh_if_stale(&self, bucket: &Bucket, every: Duration) -> Result<bool, RemoteError> {
        let fresh = self.state.read().expect("pack map lock").refreshed.is_some_and(|t| t.elapsed() < every);
        if fresh {
            return Ok(false);
        }
        self.refresh(bucket)?;
        Ok(true)
    }

    /// List `packs/`, read the indexes not yet known, forget packs that are gone; returns the orphans seen and
    /// the bytes listed.
    pub fn refresh(&self, bucket: &Bucket) -> Result<Listed, RemoteError> {
        self.listings.fetch_add(1, Ordering::Relaxed);
        let listed = bucket.list(PACKS)?;
        let bytes = listed.iter().map(|m| m.size).sum();
        let mut pack_meta: HashMap<ObjectId, Meta> = HashMap::new();
        let mut index_meta: HashMap<ObjectId, Meta> = HashMap::new();
        for m in listed {
            let Some(file) = m.rel.rsplit('/').next() else { continue };
            match file.strip_suffix(".idx") {
                Some(hex) => hex.parse().ok().map(|id| index_meta.insert(id, m)),
                None => file.parse().ok().map(|id| pack_meta.insert(id, m)),
            };
        }
        let lone = |mine: &HashMap<ObjectId, Meta>, other: &HashMap<ObjectId, Meta>| -> Orphans {
            mine.iter().filter(|(id, _)| !other.contains_key(id)).map(|(_, m)| m.clone()).collect()
        };
        let orphans: Orphans = [lone(&pack_meta, &index_meta), lone(&index_meta, &pack_meta)].concat();
        let whole: Vec<ObjectId> = pack_meta.keys().filter(|id| index_meta.contains_key(id)).copied().collect();
        let known: HashSet<ObjectId> = self.state.read().expect("pack map lock").packs.keys().copied().collect();
        let unknown: Vec<ObjectId> = whole.iter().filter(|id| !known.contains(id)).copied().collect();
        let read = bucket.run_all(unknown, super::client::PARALLEL, |id| async move {
            Ok((id, bucket.get_async(&index_key(&id)).await?))
        })?;
        let mut s = self.state.write().expect("pack map lock");
        let keep: HashSet<ObjectId> = whole.iter().copied().collect();
        s.packs.retain(|id, _| keep.contains(id));
        for (id, got) in read {
            let Some((bytes, meta)) = got else { continue }; // deleted since the listing
            let Ok((entries, data_len)) = pack::decode_index(&bytes) else { continue };
            let size = pack_meta[&id].size;
            if pack::pack_len(data_len, entries.len()) != size {
                continue;
            }
            s.packs.insert(id, PackInfo { modified: meta.modified, entries });
        }
        // A pack we uploaded carries our clock until now: take the bucket's, as every other machine does.
        for (id, info) in s.packs.iter_mut() {
            if let Some(m) = index_meta.get(id) {
                info.modified = m.modified;
            }
        }
        s.rebuild();
        s.refreshed = Some(Instant::now());
        Ok(Listed { orphans, bytes })
    }
}
