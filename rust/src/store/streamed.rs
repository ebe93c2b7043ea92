//! A restore that reads from afar (a bucket store's cold cache), written as its objects arrive: each object is
//! checked against its id the moment it is whole, and its rows written where the file wants them
//! (`format::place`, `pwrite`) while the others are still on their way. So the write and the hashing run under
//! the transfer instead of after it (the skeleton, saved first in its pack, usually arrives first; a block
//! that arrives before it waits, checked, for the placement).
//!
//! CONTRACT: taken only for a byte-exact rebuild (the saved stream count) of a layout with a placement (no
//! transposed V, no recurrent rows), and only when the backend streams (`Backend::streams`: a bucket store,
//! `KVSTORE_S3_STREAM`) and something comes from afar; else None and `materialize.rs` reads as usual. No byte is written before its object matched its id in the manifest's
//! scope (the skeleton's too), so the file is the recomposition of verified parts. An object that does not
//! match, is absent, or arrives with another length than its place leaves no file (the temp file is removed)
//! and returns None: the usual read then runs, which finds, quarantines and names the bad copy. What arrived
//! and matched is kept by the cache once the file is in place (`Loaded::fetched`).

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};

use bytes::Bytes;

use super::buffers::Buffers;
use super::materialize::{Loaded, Written};
use super::{label, Store, Target};
use crate::error::Result;
use crate::format::{self, EmitOptions, Placement};
use crate::id::ObjectId;
use crate::manifest::{check_expect, Fingerprint, Manifest};
use crate::objects::atomic::{temp_beside, Unpublished, FILE_TEMP};
use crate::objects::{check_arrived, Fetched, ObjectError, Part};

/// Threads that check and write arrived objects (the transfer itself runs on the bucket client's runtime).
const WORKERS: usize = 2;

/// How far the file is: blocks checked before the skeleton wait in `Waiting`.
enum Stage {
    Waiting(Vec<(usize, Part)>),
    Placed(Arc<(Placement, std::fs::File)>),
    /// The skeleton has no placement, or an object did not check out: the usual read takes over.
    Abandoned,
}

/// What the workers share.
struct Shared<'a> {
    manifest: &'a Manifest,
    want: &'a [ObjectId],
    /// Per slot of `want`: its positions in the manifest's block list (a block may be referenced twice).
    refs: Vec<Vec<usize>>,
    /// The slot of the skeleton in `want`.
    skeleton_slot: usize,
    out_path: &'a Path,
    stage: Mutex<Stage>,
    /// The temp file, once the skeleton was placed (removed when dropped unless published).
    temp: Mutex<Option<tempfile::NamedTempFile>>,
    /// Per slot: the encoded copy that matched (kept by the cache), and the decoded length.
    arrived: Mutex<HashMap<usize, (Bytes, usize)>>,
    skeleton: Mutex<Option<Vec<u8>>>,
    /// The first I/O error writing the temp file (reported: the usual read would meet the same disk).
    io_error: Mutex<Option<ObjectError>>,
    /// Where a decoded object's buffer comes from and goes back to once its rows are written.
    buffers: &'a Buffers,
}

impl Store {
    /// `state` (the record `target` resolved to) written beside `out_path` as its objects arrive; None where
    /// this path does not apply or an object did not check out (see the contract).
    pub(super) fn write_streamed(
        &self,
        target: &Target,
        state: &(ObjectId, Manifest),
        out_path: &Path,
        expect: Option<&Fingerprint>,
        n_stream: Option<u32>,
        durable: bool,
    ) -> Result<Option<Written>> {
        let (mid, manifest) = state;
        let backend = self.objects.backend();
        if !backend.streams() || n_stream.is_some_and(|k| k != manifest.n_stream) {
            return Ok(None);
        }
        if let Some(expect) = expect {
            check_expect(&label(target), manifest, expect)?;
        }
        let mut want: Vec<ObjectId> = Vec::with_capacity(manifest.blocks.len() + 1);
        let mut slot_of: HashMap<ObjectId, usize> = HashMap::new();
        let mut refs: Vec<Vec<usize>> = Vec::new();
        for (i, id) in manifest.blocks.iter().chain([&manifest.skeleton]).enumerate() {
            let slot = *slot_of.entry(*id).or_insert_with(|| {
                want.push(*id);
                refs.push(Vec::new());
                want.len() - 1
            });
            if i < manifest.blocks.len() {
                refs[slot].push(i);
            }
        }
        if backend.holds_here(&want) {
            return Ok(None); // nothing would arrive as it streams: no threads started for it
        }
        let shared = Shared {
            manifest,
            want: &want,
            refs,
            skeleton_slot: slot_of[&manifest.skeleton],
            out_path,
            stage: Mutex::new(Stage::Waiting(Vec::new())),
            temp: Mutex::new(None),
            arrived: Mutex::new(HashMap::new()),
            skeleton: Mutex::new(None),
            io_error: Mutex::new(None),
            buffers: &self.buffers,
        };
        let scope = manifest.object_scope();
        let (tx, rx) = mpsc::channel::<(usize, Bytes)>();
        let rx = Mutex::new(rx);
        let streamed = std::thread::scope(|sc| {
            for _ in 0..WORKERS {
                sc.spawn(|| loop {
                    let next = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    let Ok((slot, encoded)) = next else { return };
                    shared.take(slot, encoded, &scope);
                });
            }
            let deliver = move |slot: usize, encoded: Bytes| {
                let _ = tx.send((slot, encoded));
            };
            backend.stream(&want, &deliver)
            // `deliver` (the channel's only sender) drops here: the workers end once they emptied it
        });
        // A stream that ended with the file unplaced (the skeleton absent, the transfer failed) is abandoned like
        // one that failed a check: blocks that waited for the skeleton give their buffers back.
        if !matches!(*shared.stage.lock().unwrap(), Stage::Placed(_)) {
            shared.abandon();
        }
        let absent = match streamed? {
            None => return Ok(None),
            Some(absent) => absent,
        };
        let Shared { stage, temp, arrived, skeleton, io_error, .. } = shared;
        if let Some(e) = io_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(e.into());
        }
        let arrived = arrived.into_inner().unwrap_or_else(|e| e.into_inner());
        let placed = matches!(stage.into_inner().unwrap_or_else(|e| e.into_inner()), Stage::Placed(_));
        let (Some(temp), Some(skeleton)) = (temp.into_inner().unwrap(), skeleton.into_inner().unwrap()) else {
            return Ok(None);
        };
        if !placed || !absent.is_empty() || arrived.len() != want.len() {
            return Ok(None); // dropping `temp` removes it
        }
        let file_bytes = temp.as_file().metadata().map_err(|e| ObjectError::io(temp.path(), e))?.len();
        let file = Unpublished::filled(temp, out_path, durable)?;
        let (read_raw_bytes, read_stored_bytes) =
            arrived.values().fold((0, 0), |(r, s), (b, n)| (r + *n as u64, s + b.len() as u64));
        let fetched = Fetched::new(arrived.into_iter().map(|(slot, (b, _))| (want[slot], b)).collect());
        let loaded = Loaded::arrived(*mid, manifest.clone(), skeleton, want.len(), read_raw_bytes, read_stored_bytes, fetched);
        Ok(Some(Written { loaded, file, file_bytes }))
    }
}

impl Shared<'_> {
    /// One arrived object: checked, then written (a block) or placed (the skeleton).
    fn take(&self, slot: usize, encoded: Bytes, scope: &crate::scope::Scope) {
        let part = match check_arrived(&self.want[slot], &encoded, scope, &|n| self.buffers.take(n)) {
            Ok(part) => part,
            Err(_) => return self.abandon(),
        };
        self.arrived.lock().unwrap().insert(slot, (encoded, part.len()));
        if slot == self.skeleton_slot {
            self.place(&part);
        }
        if self.refs[slot].is_empty() {
            return self.recycle(part); // the skeleton alone
        }
        let placed = {
            let mut stage = self.stage.lock().unwrap();
            match &mut *stage {
                Stage::Placed(p) => Some(p.clone()),
                Stage::Waiting(early) => return early.push((slot, part)),
                Stage::Abandoned => None,
            }
        };
        if let Some(placed) = placed {
            self.write_block(&placed, slot, &part);
        }
        self.recycle(part);
    }

    /// A decoded object's buffer back to the store's (its rows are in the file, or will not be written).
    fn recycle(&self, part: Part) {
        if let Part::Buffer(buffer) = part {
            self.buffers.give(buffer);
        }
    }

    /// The skeleton checked: the file created at its length, the made bytes written, and the blocks that
    /// arrived before it written.
    fn place(&self, skeleton: &[u8]) {
        let placement = match format::place(skeleton, &EmitOptions::default()) {
            Ok(Some(p)) if p.n_blocks() == self.manifest.blocks.len() => p,
            _ => return self.abandon(), // no placement (transposed V, recurrent rows), or not this manifest's
        };
        *self.skeleton.lock().unwrap() = Some(skeleton.to_vec());
        let made = (|| {
            let temp = temp_beside(self.out_path, FILE_TEMP)?;
            let io = |e| ObjectError::io(temp.path(), e);
            temp.as_file().set_len(placement.file_len).map_err(io)?;
            for (at, bytes) in placement.made() {
                temp.as_file().write_all_at(bytes, at).map_err(io)?;
            }
            let file = temp.as_file().try_clone().map_err(io)?;
            *self.temp.lock().unwrap() = Some(temp);
            Ok::<_, ObjectError>(file)
        })();
        let file = match made {
            Ok(file) => file,
            Err(e) => return self.fail(e),
        };
        let placed = Arc::new((placement, file));
        let early = {
            let mut stage = self.stage.lock().unwrap();
            match std::mem::replace(&mut *stage, Stage::Placed(placed.clone())) {
                Stage::Waiting(early) => early,
                abandoned => {
                    *stage = abandoned;
                    return;
                }
            }
        };
        for (slot, part) in early {
            self.write_block(&placed, slot, &part);
            self.recycle(part);
        }
    }

    fn write_block(&self, placed: &(Placement, std::fs::File), slot: usize, rows: &[u8]) {
        let (placement, file) = placed;
        for &i in &self.refs[slot] {
            if rows.len() != placement.block_len(i) {
                return self.abandon();
            }
            for r in placement.rows_of(i) {
                if let Err(e) = file.write_all_at(&rows[r.block_at..r.block_at + r.len], r.file_at) {
                    return self.fail(ObjectError::io(self.out_path, e));
                }
            }
        }
    }

    /// The usual read takes over; blocks that waited for the skeleton give their buffers back, for that read.
    fn abandon(&self) {
        let was = std::mem::replace(&mut *self.stage.lock().unwrap(), Stage::Abandoned);
        if let Stage::Waiting(early) = was {
            for (_, part) in early {
                self.recycle(part);
            }
        }
    }

    fn fail(&self, e: ObjectError) {
        self.io_error.lock().unwrap().get_or_insert(e);
        self.abandon();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::tests_support::manifest;

    #[test]
    fn blocks_that_waited_for_the_skeleton_give_their_buffers_back_when_the_stream_is_abandoned() {
        let manifest = manifest(4, Default::default());
        let want = [manifest.blocks[0], manifest.skeleton];
        let buffers = Buffers::default();
        let shared = Shared {
            manifest: &manifest,
            want: &want,
            refs: vec![vec![0], vec![]],
            skeleton_slot: 1,
            out_path: Path::new("/nonexistent/out.bin"),
            stage: Mutex::new(Stage::Waiting(vec![(0, Part::Buffer(Vec::with_capacity(4096)))])),
            temp: Mutex::new(None),
            arrived: Mutex::new(HashMap::new()),
            skeleton: Mutex::new(None),
            io_error: Mutex::new(None),
            buffers: &buffers,
        };
        shared.abandon();
        assert!(matches!(*shared.stage.lock().unwrap(), Stage::Abandoned));
        assert!(buffers.kept_bytes() >= 4096, "the early block's buffer is back in the pool");
        shared.abandon(); // a second abandon (another worker's failed check) finds nothing more to give back
        assert!(buffers.kept_bytes() >= 4096);
    }
}
