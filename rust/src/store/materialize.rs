//! Materialize: a stored state → its slot file. `load` reads and verifies the skeleton and distinct blocks
//! (parallel), `rebuild` recomposes the file in memory, `materialize` writes it atomically straight from the
//! parts (`format::recompose_pieces` + `writev`; raw objects kept as local files, a local store's or a bucket
//! store's cache, are mapped, not read: the file's rows go from the objects' page cache to the file's once, as
//! a copy's do; what a bucket store fetched is used where it lies in the responses).
//!
//! CONTRACT: `expect` (the server's fingerprint) is checked before any object is read; a rebuild with the
//! saved stream count is byte-exact and checked against the manifest's file sums (`file_check.rs`: xxh3 when
//! every part came from this machine's files, blake3 when any came from a bucket), a mismatch (or parts that
//! do not even recompose, which only the file hash would have vouched for) writes nothing.
//! That check is what verifies the objects on this path (each is decoded, not hashed again:
//! `ObjectStore::get_for_file_hash`); on a mismatch every object is read again hashed, so the bad one is found,
//! quarantined and named in the error, as on any other read. What a bucket store fetched goes to its cache
//! only once verified: when the file hash matched, written behind the restore (`Backend::keep_fetched`).
//! A materialized file never names an older state than the name's record: a bucket store's name whose state
//! this machine already holds is written while the record is read, and put in place only if the record
//! names that state (else dropped unseen, and the record's state restored).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use super::file_check::{self, FileSum};
use super::{label, Store, Target};
use crate::index::HeedExt;
use crate::error::Result;
use crate::format::{self, EmitOptions};
use crate::id::ObjectId;
use crate::manifest::{check_expect, Fingerprint, Manifest};
use crate::objects::atomic::{write_unpublished, Unpublished, FILE_TEMP};
use crate::objects::{Fetched, ObjectError, Part};

#[derive(Debug, Clone, Serialize)]
pub struct MaterializeReport {
    pub manifest_id: String,
    pub n_tokens: u64,
    pub file_bytes: u64,
    pub objects_read: usize,
    pub read_raw_bytes: u64,
    pub read_stored_bytes: u64,
    /// What vouched for the bytes: "file xxh3" (every part from this machine's files), "file blake3" (some
    /// from a bucket, or a manifest older than the xxh3 sum), "objects" (each object hashed: a rebuild for
    /// another stream count, or the second read after a mismatch), "objects as they arrived" (a restore from
    /// afar written as its objects arrived: `streamed.rs`).
    pub verified_by: &'static str,
    pub elapsed_s: f64,
}

/// A state's parts, read and verified.
pub struct Loaded {
    pub manifest_id: ObjectId,
    pub manifest: Manifest,
    pub skeleton: Vec<u8>,
    /// Distinct blocks by id.
    pub blocks: HashMap<ObjectId, Part>,
    pub objects_read: usize,
    pub read_raw_bytes: u64,
    pub read_stored_bytes: u64,
    /// What a bucket store fetched for a read checked by the file hash (`Backend::fetch`), for the caller to
    /// keep once the hash matched (a read that hashed each object kept its own already: then empty; a
    /// streamed restore's: what arrived and matched, kept once the file is in place).
    fetched: Fetched,
    /// Each object was hashed as it was read (`Check::EachObject`); else only the rebuilt file's hash will
    /// vouch for them.
    hashed_each: bool,
    /// Every part was read from a file this machine holds, none from a bucket (`file_check.rs`: which sum
    /// checks the rebuilt file).
    local: bool,
    /// Written as its objects arrived, each checked then (`streamed.rs`).
    streamed: bool,
}

impl Loaded {
    /// What a streamed restore read (`streamed.rs`): every object checked against its id as it arrived.
    pub(super) fn arrived(
        manifest_id: ObjectId,
        manifest: Manifest,
        skeleton: Vec<u8>,
        objects_read: usize,
        read_raw_bytes: u64,
        read_stored_bytes: u64,
        fetched: Fetched,
    ) -> Self {
        Loaded {
            manifest_id,
            manifest,
            skeleton,
            blocks: HashMap::new(),
            objects_read,
            read_raw_bytes,
            read_stored_bytes,
            fetched,
            hashed_each: true,
            local: false,
            streamed: true,
        }
    }
}

impl Store {
    /// Read and verify a state's skeleton and distinct blocks (parallel).
    pub fn load(&self, target: &Target, expect: Option<&Fingerprint>) -> Result<Loaded> {
        self.load_checked(target, None, expect, Check::EachObject, None, false)
    }

    /// `check` is `FileHash` only where the rebuild for `n_stream` is byte-exact (decided on the manifest this
    /// read resolved, the one the caller's file hash check will use). `kept`: objects are decoded into buffers
    /// kept between restores, which the caller gives back (`buffers.rs`). `held`: the state `target` names, as
    /// this machine's index has it (not resolved again).
    fn load_checked(
        &self,
        target: &Target,
        held: Option<&(ObjectId, Manifest)>,
        expect: Option<&Fingerprint>,
        check: Check,
        n_stream: Option<u32>,
        kept: bool,
    ) -> Result<Loaded> {
        let (mid, manifest) = match held {
            Some(state) => state.clone(),
            None => self.resolve(target)?,
        };
        let exact = n_stream.is_none() || n_stream == Some(manifest.n_stream);
        let check = if exact { check } else { Check::EachObject };
        if let Some(expect) = expect {
            check_expect(&label(target), &manifest, expect)?;
        }
        let skeleton_id = manifest.skeleton;
        let mut want = manifest.blocks.clone();
        want.push(skeleton_id);
        let mut seen = HashSet::new();
        want.retain(|id| seen.insert(*id));
        // A bucket store fetches what its cache lacks in parallel (a local store: nothing); they are kept once
        // verified (`ObjectStore::keep_fetched`).
        let afar = self.objects.backend().reads_from_afar();
        let fetched = self.objects.backend().fetch(&want)?;
        let scope = manifest.object_scope();
        let take = |len: usize| if kept { self.buffers.take(len) } else { Vec::new() };
        let got: Vec<(ObjectId, Part, u64)> = want
            .par_iter()
            .map(|id| {
                let unhashed = match check {
                    Check::FileHash => self.objects.get_for_file_hash(id, &take, &fetched)?,
                    Check::EachObject => None,
                };
                match unhashed {
                    Some((part, stored_len)) => Ok((*id, part, stored_len)),
                    None => self
                        .objects
                        .get_fetched(id, &scope, &take, &fetched)
                        .map(|g| (*id, Part::Buffer(g.bytes), g.stored_len)),
                }
            })
            .collect::<std::result::Result<_, ObjectError>>()?;
        let local = fetched.is_empty() && self.objects.backend().reads_from_afar() == afar;
        let objects_read = got.len();
        let mut read_raw_bytes = 0;
        let mut read_stored_bytes = 0;
        let mut blocks = HashMap::with_capacity(got.len());
        for (id, part, stored_len) in got {
            read_raw_bytes += part.len() as u64;
            read_stored_bytes += stored_len;
            blocks.insert(id, part);
        }
        // The skeleton may equal a block only by hash collision; share the bytes anyway.
        let skeleton = if manifest.blocks.contains(&manifest.skeleton) {
            blocks[&skeleton_id].to_vec()
        } else {
            match blocks.remove(&skeleton_id).expect("skeleton was read") {
                Part::Buffer(b) => b,
                mapped => mapped.to_vec(),
            }
        };
        Ok(Loaded {
            manifest_id: mid,
            manifest,
            skeleton,
            blocks,
            objects_read,
            read_raw_bytes,
            read_stored_bytes,
            fetched: match check {
                Check::FileHash => fetched,
                Check::EachObject => {
                    self.objects.keep_fetched(fetched); // each object was hashed as it was read
                    Fetched::default()
                }
            },
            hashed_each: matches!(check, Check::EachObject),
            local,
            streamed: false,
        })
    }

    /// Rebuild a state's slot file in memory. Byte-exact (and checked against the stored file hash) unless
    /// `n_stream` asks for another stream count than the saved one.
    pub fn rebuild(&self, target: &Target, expect: Option<&Fingerprint>, n_stream: Option<u32>) -> Result<(Loaded, Vec<u8>)> {
        let mut loaded = self.load_checked(target, None, expect, Check::FileHash, n_stream, false)?;
        let file = recompose_loaded(&loaded, n_stream);
        if loaded.hashed_each {
            return Ok((loaded, file?)); // not byte-exact: its objects were hashed, there is no file hash
        }
        if let Ok(file) = file {
            if check_file_hash(target, &loaded, &[&file]).is_ok() {
                self.objects.keep_fetched(std::mem::take(&mut loaded.fetched)); // the rebuilt file's hash matched
                return Ok((loaded, file));
            }
        }
        // Parts read unhashed that do not recompose, or not into the file: read again, each object hashed (the
        // bad one is quarantined and named).
        let loaded = self.load_checked(target, None, expect, Check::EachObject, n_stream, false)?;
        let file = recompose_loaded(&loaded, n_stream)?;
        check_file_hash(target, &loaded, &[&file])?;
        Ok((loaded, file))
    }

    /// Write a state as a slot file at `out_path`: `<dir>/.<random>.tmp`, then rename (fsync only if `durable`).
    /// The file is written straight from the objects' decoded bytes (`format::recompose_pieces`, `writev`),
    /// its file hash checked beside the write; a mismatch removes it before any rename.
    ///
    /// A bucket store's name whose state this machine's index and cache hold is written while the name's record
    /// is read (the round trip that says whether another machine saved it since), and renamed into place only
    /// if the record names that same state; else the file is dropped and the record's state restored as usual.
    /// So a warm restore costs the longer of the two, not their sum, and never returns an older state than the
    /// record names.
    pub fn materialize(
        &self,
        target: &Target,
        out_path: &Path,
        expect: Option<&Fingerprint>,
        n_stream: Option<u32>,
        durable: bool,
    ) -> Result<MaterializeReport> {
        let t0 = Instant::now();
        if let (Target::Name { namespace, name }, Some(held)) = (*target, self.held_here(target)) {
            let confirmed = std::thread::scope(|sc| {
                let record = sc.spawn(|| self.catalog.name(namespace, name));
                let written = self.write_state(target, Some(&held), out_path, expect, n_stream, durable);
                let record = record.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
                match record.is_some_and(|r| r.manifest == held.0) {
                    true => written.map(Some),
                    false => {
                        if let Ok(w) = written {
                            self.give_back(w.loaded); // the file is dropped unpublished: removed
                        }
                        Ok(None)
                    }
                }
            })?;
            if let Some(w) = confirmed {
                return self.publish(w, t0);
            }
        }
        // A state read from afar is written as its objects arrive (`streamed.rs`); else, or where that gave
        // up, as usual.
        let state = self.resolve(target)?;
        if let Some(w) = self.write_streamed(target, &state, out_path, expect, n_stream, durable)? {
            return self.publish(w, t0);
        }
        let w = self.write_state(target, Some(&state), out_path, expect, n_stream, durable)?;
        self.publish(w, t0)
    }

    /// The state a bucket store's name points at in this machine's index, when its cache holds every object of
    /// it (a restore of it asks nothing of the bucket but the name's record). None for a local store (its
    /// index is where names live), and for anything this machine lacks: the usual path reads and reports.
    fn held_here(&self, target: &Target) -> Option<(ObjectId, Manifest)> {
        let Target::Name { namespace, name } = *target else { return None };
        self.catalog.location()?;
        let ix = &*self.index;
        let r = ix.read_txn().ok()?;
        let id = ix.names.get(&r, &(namespace, name)).ix(ix).ok()??.manifest;
        let manifest = self.read_manifest(&r, id).ok()?;
        self.objects.backend().holds_here(&manifest.referenced()).then_some((id, manifest))
    }

    /// The file of `target`'s state (`held`: as this machine's index has it) written and checked, not yet in
    /// place. A part that does not match is found by reading every object again, each hashed: it is
    /// quarantined and named, and a rebuild that still does not match its file hash writes nothing.
    fn write_state(
        &self,
        target: &Target,
        held: Option<&(ObjectId, Manifest)>,
        out_path: &Path,
        expect: Option<&Fingerprint>,
        n_stream: Option<u32>,
        durable: bool,
    ) -> Result<Written> {
        let loaded = self.load_checked(target, held, expect, Check::FileHash, n_stream, true)?;
        match write_checked(target, out_path, durable, &loaded, n_stream) {
            Ok(Some((file, file_bytes))) => Ok(Written { loaded, file, file_bytes }),
            Ok(None) => {
                self.give_back(loaded);
                let loaded = self.load_checked(target, held, expect, Check::EachObject, n_stream, false)?;
                match write_checked(target, out_path, durable, &loaded, n_stream)? {
                    Some((file, file_bytes)) => Ok(Written { loaded, file, file_bytes }),
                    None => Err(mismatch(target, &loaded)),
                }
            }
            Err(e) => {
                self.give_back(loaded);
                Err(e)
            }
        }
    }

    /// Rename a written file into place, report, and keep what the read fetched (verified by the file hash)
    /// behind the caller: the restore does not wait for a second write of the bytes it fetched.
    fn publish(&self, w: Written, t0: Instant) -> Result<MaterializeReport> {
        let Written { mut loaded, file, file_bytes } = w;
        if let Err(e) = file.publish() {
            self.give_back(loaded);
            return Err(e.into());
        }
        self.objects.keep_fetched(std::mem::take(&mut loaded.fetched));
        let report = MaterializeReport {
            manifest_id: loaded.manifest_id.hex(),
            n_tokens: loaded.manifest.n_tokens,
            file_bytes,
            objects_read: loaded.objects_read,
            read_raw_bytes: loaded.read_raw_bytes,
            read_stored_bytes: loaded.read_stored_bytes,
            verified_by: match (loaded.streamed, loaded.hashed_each) {
                (true, _) => "objects as they arrived",
                (false, true) => "objects",
                (false, false) => FileSum::for_read(&loaded.manifest, loaded.local).name(),
            },
            elapsed_s: t0.elapsed().as_secs_f64(),
        };
        self.give_back(loaded);
        Ok(report)
    }

    /// The parts' buffers are kept for the next restore.
    fn give_back(&self, loaded: Loaded) {
        for part in loaded.blocks.into_values() {
            if let Part::Buffer(b) = part {
                self.buffers.give(b);
            }
        }
        self.buffers.give(loaded.skeleton);
    }
}

/// What a recompose of `loaded` takes: its blocks in reference order, the stream count to emit, and whether
/// the result is byte-exact (the saved stream count: the only rebuild with a file hash to check).
fn emit_args(loaded: &Loaded, n_stream: Option<u32>) -> (Vec<&[u8]>, EmitOptions, bool) {
    let m = &loaded.manifest;
    let exact = n_stream.is_none() || n_stream == Some(m.n_stream);
    let refs = m.blocks.iter().map(|id| &*loaded.blocks[id]).collect();
    (refs, EmitOptions { n_stream: if exact { None } else { n_stream } }, exact)
}

/// `loaded` recomposed in memory (`rebuild`).
fn recompose_loaded(loaded: &Loaded, n_stream: Option<u32>) -> std::result::Result<Vec<u8>, format::FormatError> {
    let (refs, opts, _) = emit_args(loaded, n_stream);
    format::recompose(&loaded.skeleton, &refs, &opts)
}

/// Write a state's file beside `out_path` from its parts, its file hash checked beside the write (when
/// byte-exact). Some(the file, not yet in place; bytes written); None: the hash did not match, or parts not yet
/// verified did not recompose (a wrong copy fails the format before the hash), and nothing was written.
fn write_checked(
    target: &Target,
    out_path: &Path,
    durable: bool,
    loaded: &Loaded,
    n_stream: Option<u32>,
) -> Result<Option<(Unpublished, u64)>> {
    let (refs, opts, exact) = emit_args(loaded, n_stream);
    let mut pieces = match format::recompose_pieces(&loaded.skeleton, &refs, &opts) {
        Ok(pieces) => pieces,
        Err(_) if !loaded.hashed_each => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let file_bytes = pieces.total_len();
    let slices = pieces.slices();
    let mismatch = std::sync::atomic::AtomicBool::new(false);
    let check = || {
        let r = if exact { check_file_hash(target, loaded, &slices) } else { Ok(()) };
        mismatch.store(r.is_err(), std::sync::atomic::Ordering::Relaxed);
        r
    };
    match write_unpublished(out_path, FILE_TEMP, &slices, durable, check) {
        Ok(file) => Ok(Some((file, file_bytes))),
        Err(_) if mismatch.into_inner() => Ok(None),
        Err(e) => Err(e),
    }
}

/// A state's file written and checked, not yet in place, with what its read used.
pub(super) struct Written {
    pub(super) loaded: Loaded,
    pub(super) file: Unpublished,
    pub(super) file_bytes: u64,
}

/// How a rebuild's objects are verified.
#[derive(Clone, Copy)]
enum Check {
    /// Each object is hashed as it is read.
    EachObject,
    /// Only the rebuilt file is hashed (a byte-exact rebuild); a mismatch reads again with `EachObject`.
    FileHash,
}

/// A byte-exact rebuild (its pieces, in order) must be the file its manifest was saved from (`file_check.rs`).
fn check_file_hash(target: &Target, loaded: &Loaded, pieces: &[&[u8]]) -> Result<()> {
    match file_check::matches(&loaded.manifest, pieces, loaded.local) {
        true => Ok(()),
        false => Err(mismatch(target, loaded)),
    }
}

fn mismatch(target: &Target, loaded: &Loaded) -> crate::error::Error {
    ObjectError::Corrupt {
        id: loaded.manifest_id,
        reason: format!("state {} rebuilt to bytes that do not match its file hash", label(target)),
    }
    .into()
}
#[cfg(test)]
mod tests {

    use super::*;
    use crate::error::{Error, ErrorKind};
    use crate::testutil::{fp, open, put_synthetic, TempDir};
    #[test]
    fn load_checks_expect_and_reads_each_block_once() {
        let d = TempDir::new("load");
        let s = open(&d, 16);
        let f = fp(&[("model", "m1"), ("flash_attn", "on")]);
        let mut tokens: Vec<i32> = (0..16).collect();
        tokens.extend(0..16); // block 1 == block 0
        put_synthetic(&s, "rep", "", &tokens, &f);
        let t = Target::Name { namespace: "", name: "rep" };
        let l = s.load(&t, Some(&fp(&[("model", "m1"), ("n_ctx_slot", "32")]))).unwrap();
        assert_eq!(l.objects_read, 2); // one distinct block + skeleton
        assert_eq!(l.manifest.blocks.len(), 2);
        let e = s.load(&t, Some(&fp(&[("flash_attn", "off")]))).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::FingerprintMismatch);
        assert!(e.to_string().starts_with("state 'rep' was saved with flash_attn=on"), "{e}");
        let e = s.load(&t, Some(&fp(&[("n_ctx_slot", "31")]))).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::FingerprintMismatch);
        let by_id = s.load(&Target::Manifest(&l.manifest_id.hex()), None).unwrap();
        assert_eq!(by_id.manifest, l.manifest);
        assert!(matches!(s.load(&Target::Manifest("00"), None), Err(Error::ManifestNotFound { .. })));
    }

    /// Restores one after another take the buffers earlier ones left (other sizes, other bytes, another
    /// model's layout) and are still byte-exact.
    #[test]
    #[ignore = "needs real slot files: ./dev test"]
    fn restores_reuse_kept_buffers_and_stay_byte_exact() {
        let d = TempDir::new("kept");
        let s = open(&d, 32);
        let files = [("big", crate::testutil::state_file("gemma3_child.bin")), ("small", crate::testutil::state_file("smollm2_child.bin"))];
        for (name, bytes) in &files {
            s.ingest(name, "", bytes, &fp(&[("model", name)]), None, false).unwrap();
        }
        assert!(files[0].1.len() > 2 * files[1].1.len());
        let rebuilt = s.rebuild(&Target::Name { namespace: "", name: "big" }, None, None).unwrap().1;
        assert_eq!(rebuilt, files[0].1);
        assert_eq!(s.buffers.kept_bytes(), 0, "a rebuild handed to its caller keeps nothing");
        // Big, small, big, small.
        for i in 0..4 {
            let (name, want) = &files[i % 2];
            let out = d.0.join(format!("{name}{i}.bin"));
            let r = s.materialize(&Target::Name { namespace: "", name }, &out, None, None, false).unwrap();
            assert!(std::fs::read(&out).unwrap() == *want, "restore {i} of {name} is not byte-exact");
            assert_eq!(r.file_bytes, want.len() as u64);
            assert_eq!(r.verified_by, "file xxh3", "a local store's files are checked by xxh3");
            assert!(s.buffers.kept_bytes() > 0, "the decoded parts' buffers (skeleton, compressed blocks) are kept");
        }
        // Raw blocks are not copied at all: a restore maps their files.
        let l = s.load_checked(&Target::Name { namespace: "", name: "big" }, None, None, Check::FileHash, None, true).unwrap();
        let mapped = l.blocks.values().filter(|p| matches!(p, Part::Mapped(_))).count();
        assert!(mapped * 2 > l.blocks.len(), "{mapped} of {} blocks mapped", l.blocks.len());
        // Another stream count rebuilds to other bytes, in kept buffers too, and reports their length.
        let out = d.0.join("np3.bin");
        let r = s.materialize(&Target::Name { namespace: "", name: "small" }, &out, None, Some(3), false).unwrap();
        let three_streams = std::fs::read(&out).unwrap();
        assert_eq!(r.file_bytes, three_streams.len() as u64);
        assert_eq!(r.verified_by, "objects", "another stream count has no file sum: each object is hashed");
        assert!(three_streams != files[1].1);
        let again = d.0.join("small-again.bin");
        s.materialize(&Target::Name { namespace: "", name: "small" }, &again, None, None, false).unwrap();
        assert!(std::fs::read(&again).unwrap() == files[1].1);
    }

    /// A real state's rows are stored raw (codec 2) and read straight into their buffers; a raw object whose
    /// bytes were changed, or that was cut short, is still found by the restore: named, moved aside, nothing
    /// written; saving the state again repairs it.
    #[test]
    #[ignore = "needs real slot files: ./dev test"]
    fn a_damaged_raw_object_is_found_named_and_nothing_written() {
        let d = TempDir::new("rawbad");
        let s = open(&d, 32);
        let bytes = crate::testutil::state_file("gemma3_child.bin");
        s.ingest("a", "", &bytes, &fp(&[]), None, false).unwrap();
        let t = Target::Name { namespace: "", name: "a" };
        let (_, m) = s.resolve(&t).unwrap();
        let objects = d.0.join("objects");
        let file_of = |id: &ObjectId| objects.join(&id.hex()[..2]).join(id.hex());
        let raw: Vec<ObjectId> = m.blocks.iter().copied().filter(|id| std::fs::read(file_of(id)).unwrap()[5] == 2).collect();
        assert!(raw.len() * 2 > m.blocks.len(), "most of a real state's blocks are stored raw: {} of {}", raw.len(), m.blocks.len());
        let out = d.0.join("out.bin");
        for (i, damage) in ["flip", "cut"].iter().enumerate() {
            let victim = raw[i];
            let path = file_of(&victim);
            let mut b = std::fs::read(&path).unwrap();
            match *damage {
                "flip" => *b.last_mut().unwrap() ^= 1,
                _ => b.truncate(b.len() - 100),
            }
            std::fs::write(&path, &b).unwrap();
            let e = s.materialize(&t, &out, None, None, false).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Corrupt, "{damage}: {e}");
            assert!(e.to_string().contains(&victim.short()), "{damage}: the bad object is named: {e}");
            assert!(!out.exists() && !path.exists(), "{damage}: nothing written, the object moved aside");
            s.ingest("a", "", &bytes, &fp(&[]), None, false).unwrap();
            s.materialize(&t, &out, None, None, false).unwrap();
            assert!(std::fs::read(&out).unwrap() == bytes, "{damage}: repaired by saving again");
            std::fs::remove_file(&out).unwrap();
        }
    }

    /// Real slot files (KVSTORE_STATE_DIR=dir of *.bin, see tests/make_states.py) through ingest/materialize.
    /// `./dev test` sets the variable and runs the ignored tests; without it this test fails.
    #[test]
    #[ignore = "needs real slot files: ./dev test"]
    fn real_files_round_trip() {
        let files = crate::testutil::state_files();
        let d = TempDir::new("real");
        let s = open(&d, 64);
        for p in &files {
            let bytes = std::fs::read(p).unwrap();
            let name = p.file_stem().unwrap().to_string_lossy().to_string();
            // One fingerprint per file: each was saved by another server configuration (flash attention, cache
            // type), and a store refuses a second layout under one fingerprint.
            let f = fp(&[("model", name.as_str())]);
            if crate::format::decompose(&bytes, 64).unwrap().tokens.is_empty() {
                let r = s.ingest(&name, "", &bytes, &f, None, false);
                assert!(matches!(r, Err(Error::Format(crate::format::FormatError::Empty))), "{name}: {r:?}");
                continue;
            }
            let r = s.ingest(&name, "", &bytes, &f, None, false).unwrap();
            assert_eq!(r.file_bytes, bytes.len() as u64);
            let out = d.0.join(format!("{name}.out"));
            let m = s.materialize(&Target::Name { namespace: "", name: &name }, &out, None, None, true).unwrap();
            assert_eq!(m.file_bytes, bytes.len() as u64);
            assert_eq!(std::fs::read(&out).unwrap(), bytes, "{name}: materialize is not byte-exact");
            // Re-ingesting the same bytes writes only a new manifest (created time) at most.
            let again = s.ingest(&name, "", &bytes, &f, None, false).unwrap();
            assert!(again.new_objects <= 1, "{name}: {again:?}");
            let leftovers = std::fs::read_dir(&d.0).unwrap().filter_map(|e| e.ok()).filter(|e| {
                e.file_name().to_string_lossy().ends_with(".tmp")
            });
            assert_eq!(leftovers.count(), 0);
        }
        // parent/child pairs share blocks
        let f = fp(&[("model", "test")]);
        for m in ["smollm2", "gemma3"] {
            let dir = crate::testutil::state_dir();
            let (pp, cp) = (dir.join(format!("{m}_parent.bin")), dir.join(format!("{m}_child.bin")));
            // make_states.py writes both of every model; a missing one is a failure, not a skip.
            let read = |p: &std::path::PathBuf| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let d2 = TempDir::new("pc");
            let s2 = open(&d2, 64);
            s2.ingest("p", "", &read(&pp), &f, None, false).unwrap();
            let c = s2.ingest("c", "", &read(&cp), &f, Some("p"), false).unwrap();
            assert!(c.reused_bytes > 0, "{m}: child shares nothing with its parent: {c:?}");
        }
    }
}
