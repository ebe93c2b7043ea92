//! `Hints`: what name records just read say about where their states' objects lie, kept for the reads that
//! follow (`BucketObjects::download`): the packs a record names (their indexes are read before the bucket is
//! listed) and each object's place in them (read straight away, without the index).
//!
//! CONTRACT: a hint is never trusted, only tried: packs are immutable (keyed by their hash), so a place is right
//! or its pack is gone, and what a read fetches is checked against its id before it is used or kept. Each place
//! is taken once; the packs are taken together by the first read that misses. Bounded: at most `PACKS_KEPT`
//! packs (oldest dropped) and `PLACES_KEPT` places (all dropped when a record would pass it).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use super::pack::Entry;
use crate::id::ObjectId;

/// Packs remembered from name records.
const PACKS_KEPT: usize = 256;
/// Object places remembered from name records.
const PLACES_KEPT: usize = 1 << 16;

#[derive(Default)]
pub struct Hints {
    /// Packs, newest last.
    packs: Mutex<VecDeque<ObjectId>>,
    /// Object id -> (pack, entry).
    places: Mutex<HashMap<ObjectId, (ObjectId, Entry)>>,
}

impl Hints {
    /// A record's packs and places; `known` packs (already in the pack map) are left out.
    pub fn add(&self, packs: &[ObjectId], places: &[(ObjectId, Entry)], known: impl Fn(&ObjectId) -> bool) {
        let mut h = self.packs.lock().unwrap_or_else(|e| e.into_inner());
        for p in packs.iter().filter(|p| !known(p)) {
            h.retain(|q| q != p);
            h.push_back(*p);
        }
        while h.len() > PACKS_KEPT {
            h.pop_front();
        }
        let mut placed = self.places.lock().unwrap_or_else(|e| e.into_inner());
        if placed.len() + places.len() > PLACES_KEPT {
            placed.clear();
        }
        placed.extend(places.iter().filter(|(p, _)| !known(p)).map(|&(p, e)| (e.id, (p, e))));
    }

    /// Every pack hinted so far, forgotten here.
    pub fn take_packs(&self) -> Vec<ObjectId> {
        std::mem::take(&mut *self.packs.lock().unwrap_or_else(|e| e.into_inner())).into()
    }

    /// The places of `which` of `ids`, forgotten here, as (pack, slot, entry); and the slots with none.
    pub fn take_places(&self, ids: &[ObjectId], which: Vec<usize>) -> (Vec<(ObjectId, usize, Entry)>, Vec<usize>) {
        let mut placed = self.places.lock().unwrap_or_else(|e| e.into_inner());
        let (mut found, mut none) = (Vec::new(), Vec::new());
        for k in which {
            match placed.remove(&ids[k]) {
                Some((pack, entry)) => found.push((pack, k, entry)),
                None => none.push(k),
            }
        }
        (found, none)
    }
}
