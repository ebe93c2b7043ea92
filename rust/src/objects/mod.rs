//! Content-addressed objects: `ObjectStore` puts bytes under their `ObjectId` (blake3 of the uncompressed
//! bytes, keyed per namespace: `crate::scope`) and reads them back verified in the scope the caller names.
//!
//! CONTRACT (docs/design.md "Objects"): an object is written once, atomically and durably, never rewritten;
//! a put of present content only refreshes its mtime (gc's grace period protects it); every read is verified,
//! by re-hashing the object (`get`) or, for a byte-exact rebuild, by the whole file's hash that the caller
//! checks (`get_for_file_hash`: on a mismatch it reads again with `get_fetched`; a raw object kept as a local
//! file comes back mapped from it, `Part::Mapped`, safe because object files are never rewritten; one a
//! bucket store fetched comes back as a slice of the response, `Part::Shared`); what a backend fetched is kept
//! (`Backend::keep_fetched`) only once verified; a corrupt object is moved aside (quarantine) where it was read, so
//! that saving the same state again repairs it. Objects
//! know nothing of llama.cpp, LMDB or names, nor which backend holds them: a backend is a `Backend`, and
//! what it reports is an `ObjectError` (one that could not reach its objects: `Unavailable`).
//!
//! Files: `backend.rs` the `Backend` trait (the seam to wherever objects live) and `ObjectError`;
//! `local.rs` the local directory; `codec.rs` + `planes.rs` the KVOB encoding; `atomic.rs` atomic file
//! writes (the `tempfile` crate).

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::Arc;

pub mod atomic;
mod backend;
pub mod codec;
mod local;
mod planes;

pub use backend::{is_disk_full, Backend, Fetched, Layers, ObjectError, Stamped, Usage};
pub use codec::{decode, encode};
pub use local::LocalDir;

use crate::id::ObjectId;
use crate::scope::Scope;

/// Prefix of temporary files beside objects (removed by gc once older than the grace period).
pub const TEMP_PREFIX: &str = ".tmp-";

/// What `put` did.
#[derive(Debug, Clone, Copy)]
pub struct Put {
    pub id: ObjectId,
    /// Bytes the object occupies in the backend (header + frames).
    pub stored_len: u64,
    /// False when the object was already present (its mtime was refreshed instead).
    pub was_new: bool,
}

/// A verified object read.
#[derive(Debug)]
pub struct Got {
    pub bytes: Vec<u8>,
    pub stored_len: u64,
}

/// What `probe` found.
#[derive(Debug)]
pub enum Checked {
    /// Decoded, and its id is that of its bytes in one of the scopes asked.
    Matched(Got),
    /// Decoded, but in none of the scopes asked is its id that of its bytes.
    InNoScope,
}

/// Cheap to clone: clones share one backend (the store and its catalog read through the same cache).
#[derive(Clone)]
pub struct ObjectStore {
    backend: Arc<dyn Backend>,
}

impl ObjectStore {
    pub fn new(backend: Box<dyn Backend>) -> Self {
        ObjectStore { backend: Arc::from(backend) }
    }
    pub fn local(root: impl Into<PathBuf>) -> Result<Self, ObjectError> {
        Ok(Self::new(Box::new(LocalDir::new(root)?)))
    }
    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// Store `bytes` unless already present (then only refresh its mtime, which protects it from a concurrent
    /// gc's grace check). `elem_size > 1` splits into byte planes, each its own zstd frame.
    pub fn put(&self, bytes: &[u8], elem_size: u8, level: i32) -> Result<Put, ObjectError> {
        let id = ObjectId::of(bytes);
        self.put_with_id(id, bytes, elem_size, level)
    }

    /// `put` when the caller already hashed the bytes.
    pub fn put_with_id(&self, id: ObjectId, bytes: &[u8], elem_size: u8, level: i32) -> Result<Put, ObjectError> {
        if let Some(stored_len) = self.backend.touch(&id)? {
            return Ok(Put { id, stored_len, was_new: false });
        }
        let encoded = encode(bytes, elem_size, level).map_err(|source| ObjectError::Compress { id, source })?;
        self.backend.put_file(&id, &encoded)?;
        Ok(Put { id, stored_len: encoded.len() as u64, was_new: true })
    }

    /// `put_with_id` for many objects at once (distinct ids, each `(id, raw bytes, elem_size)`): present ones
    /// only get their mtime refreshed; new ones are encoded and written in parallel, and all are durable
    /// when this returns. Results are in input order.
    pub fn put_many(&self, items: &[(ObjectId, &[u8], u8)], level: i32) -> Result<Vec<Put>, ObjectError> {
        let ids: Vec<ObjectId> = items.iter().map(|x| x.0).collect();
        let existing: Vec<std::sync::Mutex<Option<u64>>> = (0..items.len()).map(|_| Default::default()).collect();
        let make = |i: usize| -> Result<Option<Vec<u8>>, ObjectError> {
            let (id, bytes, elem) = items[i];
            if let Some(stored_len) = self.backend.touch(&id)? {
                *existing[i].lock().unwrap() = Some(stored_len);
                return Ok(None);
            }
            encode(bytes, elem, level).map(Some).map_err(|source| ObjectError::Compress { id, source })
        };
        let written = self.backend.put_files(&ids, &make)?;
        Ok(written
            .into_iter()
            .zip(existing)
            .zip(ids)
            .map(|((w, e), id)| match w {
                Some(stored_len) => Put { id, stored_len, was_new: true },
                None => Put { id, stored_len: e.into_inner().unwrap().unwrap_or(0), was_new: false },
            })
            .collect())
    }

    /// Read, decode and re-hash in `scope` (the manifest's, `crate::scope`). `Missing` if absent, `Corrupt` on
    /// any mismatch.
    pub fn get(&self, id: &ObjectId, scope: &Scope) -> Result<Got, ObjectError> {
        self.get_with(id, scope, &fresh)
    }

    /// [`get`](Self::get), decoding into `buffer(raw_len)` (a caller that reads many objects passes buffers it
    /// keeps).
    pub fn get_with(&self, id: &ObjectId, scope: &Scope, buffer: &BufferFor<'_>) -> Result<Got, ObjectError> {
        self.get_fetched(id, scope, buffer, &Fetched::default())
    }

    /// [`get_with`](Self::get_with) that takes the encoded bytes from `fetched` where they are there (a bucket
    /// store's `Backend::fetch`), else from the backend. A fetched copy that does not match is rejected (never
    /// kept) and the backend's own copy read instead; a mismatch there is quarantined where it lies.
    pub fn get_fetched(&self, id: &ObjectId, scope: &Scope, buffer: &BufferFor<'_>, fetched: &Fetched) -> Result<Got, ObjectError> {
        match self.read_checked(id, std::slice::from_ref(scope), true, buffer, Some(fetched))? {
            Checked::Matched(got) => Ok(got),
            Checked::InNoScope => unreachable!("a mismatch is quarantined and reported as corrupt"),
        }
    }

    /// A read for an object whose scope is not known (verify of an object no known manifest references): it
    /// must decode and match one of `scopes`; bytes that decode but match none are left in place
    /// (`InNoScope`: a save in a namespace not yet committed, or garbage for gc), never quarantined.
    pub fn probe(&self, id: &ObjectId, scopes: &[Scope]) -> Result<Checked, ObjectError> {
        self.read_checked(id, scopes, false, &fresh, None)
    }

    fn read_checked(
        &self,
        id: &ObjectId,
        scopes: &[Scope],
        mismatch_is_corrupt: bool,
        buffer: &BufferFor<'_>,
        fetched: Option<&Fetched>,
    ) -> Result<Checked, ObjectError> {
        let check = |encoded: &[u8], from_backend: bool| match decode_with(encoded, buffer) {
            Ok(bytes) if scopes.iter().any(|s| s.id_of(&bytes) == *id) => {
                if from_backend {
                    self.backend.verified(id, encoded);
                }
                Ok(Some(bytes))
            }
            Ok(_) if !mismatch_is_corrupt => Ok(None),
            Ok(_) => Err("hash mismatch".to_string()),
            Err(reason) => Err(reason),
        };
        // The encoded bytes go to a per-thread buffer, reused from object to object (no fresh pages per read).
        let from_backend = || {
            READ_BUF.with(|buf| {
                let mut buf = buf.borrow_mut();
                if !self.backend.get_into(id, &mut buf)? {
                    return Err(ObjectError::Missing { id: *id });
                }
                Ok((check(&buf, true), buf.len() as u64))
            })
        };
        let (checked, stored_len) = match fetched.and_then(|f| f.get(id).map(|encoded| (f, encoded))) {
            Some((f, encoded)) => match check(encoded, false) {
                Err(_) => {
                    // A fetched copy that does not match may be a bad transfer or a read hint that pointed
                    // elsewhere (`BucketObjects::hint`): the backend's own copy decides what is corrupt.
                    f.reject(id);
                    from_backend()?
                }
                checked => (checked, encoded.len() as u64),
            },
            None => from_backend()?,
        };
        match checked {
            Ok(Some(bytes)) => Ok(Checked::Matched(Got { bytes, stored_len })),
            Ok(None) => Ok(Checked::InNoScope),
            Err(reason) => {
                // Content addressing would otherwise keep reusing the bad file: a re-ingest of the same bytes
                // finds the id present and skips the write. Moving it aside lets the next put repair it.
                self.backend.quarantine(id)?;
                Err(ObjectError::Corrupt { id: *id, reason })
            }
        }
    }

    /// Read and decode without re-hashing, for a caller that checks the bytes another way: a byte-exact rebuild
    /// checks the whole file against the manifest's file hash and, on a mismatch, reads every object again with
    /// `get_fetched` (which finds, quarantines and reports the bad one). Hashing each object as well would hash
    /// every byte twice (the largest cost of a materialize). The bytes come from `fetched` where they are there,
    /// else from what the backend holds in memory (`Backend::in_memory`), else from a file the backend keeps (a
    /// raw one mapped), else from `get_into`. None where the object does not decode: the caller then uses
    /// `get_fetched`.
    pub fn get_for_file_hash(&self, id: &ObjectId, buffer: &BufferFor<'_>, fetched: &Fetched) -> Result<Option<(Part, u64)>, ObjectError> {
        if let Some(encoded) = fetched.get(id).cloned().or_else(|| self.backend.in_memory(id)) {
            return Ok(part_of(&encoded, buffer).ok().map(|p| (p, encoded.len() as u64)));
        }
        if let Some(mapped) = self.backend.local_file(id).map(|path| map_raw(&path)).transpose()?.flatten() {
            return Ok(Some(mapped));
        }
        READ_BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            if !self.backend.get_into(id, &mut buf)? {
                return Err(ObjectError::Missing { id: *id });
            }
            Ok(decode_with(&buf, buffer).ok().map(|bytes| (Part::Buffer(bytes), buf.len() as u64)))
        })
    }

    /// Keep what `Backend::fetch` brought once the caller verified it (a bucket store's cache writes it behind
    /// the caller: `Backend::keep_fetched`).
    pub fn keep_fetched(&self, fetched: Fetched) {
        if !fetched.is_empty() {
            self.backend.keep_fetched(fetched);
        }
    }

    pub fn exists(&self, id: &ObjectId) -> Result<bool, ObjectError> {
        self.backend.exists(id)
    }
}

/// `encoded`, a copy of `id` that arrived from afar (`Backend::stream`), decoded and checked against its id in
/// `scope` without asking any backend: Err(why) where it does not decode or match (the caller then reads the
/// object the usual way, which quarantines a bad stored copy where it lies). A raw object's bytes stay where
/// they arrived (`Part::Shared`); another is decoded into `buffer(raw_len)`.
pub fn check_arrived(id: &ObjectId, encoded: &bytes::Bytes, scope: &Scope, buffer: &BufferFor<'_>) -> Result<Part, String> {
    let part = part_of(encoded, buffer)?;
    match scope.id_of(&part) == *id {
        true => Ok(part),
        false => Err("hash mismatch".to_string()),
    }
}

/// The bytes of an object held encoded in memory (fetched, or waiting for its cache fill), unchecked: a raw
/// object's stay where they are (`Part::Shared`), another is decoded into `buffer(raw_len)`; Err(why) where it
/// does not decode.
fn part_of(encoded: &bytes::Bytes, buffer: &BufferFor<'_>) -> Result<Part, String> {
    let raw = encoded.len() >= codec::HEADER_LEN
        && codec::is_raw_file(encoded[..codec::HEADER_LEN].try_into().expect("header length"), encoded.len() as u64);
    match raw {
        true => Ok(Part::Shared(encoded.slice(codec::HEADER_LEN..))),
        false => decode_with(encoded, buffer).map(Part::Buffer),
    }
}

/// An object's bytes as a restore uses them: decoded into a buffer, mapped from the object's file (a raw
/// object kept as a local file: the page cache's own pages, never copied into this process), or a raw
/// object's bytes where they were fetched (a slice of the response).
pub enum Part {
    Buffer(Vec<u8>),
    /// The whole file; the bytes are those after the header.
    Mapped(memmap2::Mmap),
    /// The bytes after the header.
    Shared(bytes::Bytes),
}

impl std::ops::Deref for Part {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Part::Buffer(b) => b,
            Part::Mapped(m) => &m[codec::HEADER_LEN..],
            Part::Shared(b) => b,
        }
    }
}

/// Where a read decodes an object of `raw_len` bytes: an empty buffer, ideally with that capacity.
pub type BufferFor<'a> = dyn Fn(usize) -> Vec<u8> + Sync + 'a;

fn fresh(_: usize) -> Vec<u8> {
    Vec::new()
}

/// A raw object (codec 2) kept as a file, mapped: its bytes are the file's after the header, so nothing is
/// copied until the restore writes them. None for any other object (it is read and decoded as usual) and for
/// a file that is not there (a cache's evicted copy: `get_into` fetches it, or reports it missing).
fn map_raw(path: &std::path::Path) -> Result<Option<(Part, u64)>, ObjectError> {
    use std::io::Read;
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ObjectError::io(path, e)),
    };
    let file_len = f.metadata().map_err(|e| ObjectError::io(path, e))?.len();
    let mut head = [0u8; codec::HEADER_LEN];
    if f.read_exact(&mut head).is_err() || !codec::is_raw_file(&head, file_len) {
        return Ok(None);
    }
    // SAFETY: an object file is immutable: written once under a temp name and renamed into place, never
    // rewritten or truncated by kvstore; gc unlinks it and quarantine renames it, and a mapping outlives
    // both. (Only a process outside the store truncating the file while it is mapped could fault this one.)
    let map = unsafe { memmap2::MmapOptions::new().populate().map(&f) }.map_err(|e| ObjectError::io(path, e))?;
    Ok((map.len() as u64 == file_len).then_some((Part::Mapped(map), file_len)))
}

fn decode_with(encoded: &[u8], buffer: &BufferFor<'_>) -> Result<Vec<u8>, String> {
    let mut raw = buffer(codec::declared_len(encoded).unwrap_or(0).min(codec::MAX_RAW_LEN) as usize);
    codec::decode_into(encoded, &mut raw)?;
    Ok(raw)
}

thread_local! {
    /// Encoded bytes of the object being read, reused from read to read on each thread.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::testutil::{sample, TempDir};

    #[test]
    fn round_trip_with_and_without_planes() {
        let d = TempDir::new("obj");
        let s = ObjectStore::local(&d.0).unwrap();
        for (n, elem) in [(0usize, 1u8), (1, 2), (1000, 1), (1001, 2), (4096, 2), (4099, 4), (3, 4)] {
            let raw = sample(n);
            let put = s.put(&raw, elem, 1).unwrap();
            assert!(put.was_new || n == 0 || put.id == ObjectId::of(&raw));
            let got = s.get(&put.id, &Scope::Unkeyed).unwrap();
            assert_eq!(got.bytes, raw, "n={n} elem={elem}");
            assert_eq!(got.stored_len, put.stored_len);
            let again = s.put(&raw, elem, 1).unwrap();
            assert!(!again.was_new);
            assert_eq!(again.stored_len, put.stored_len);
        }
    }


    #[test]
    fn corrupt_and_missing_objects_are_detected() {
        let d = TempDir::new("corrupt");
        let s = ObjectStore::local(&d.0).unwrap();
        let raw = sample(5000);
        let put = s.put(&raw, 2, 1).unwrap();
        let local = LocalDir::new(&d.0).unwrap();
        let p = local.path_of(&put.id);
        // A valid object of other content under this id: hash mismatch.
        fs::write(&p, encode(b"something else", 1, 1).unwrap()).unwrap();
        let e = s.get(&put.id, &Scope::Unkeyed).unwrap_err();
        assert!(matches!(e, ObjectError::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("hash mismatch") && e.to_string().contains(&put.id.short()), "{e}");
        // Truncated and garbage files.
        let good = encode(&raw, 2, 1).unwrap();
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, &good[..good.len() - 3]).unwrap();
        assert!(matches!(s.get(&put.id, &Scope::Unkeyed), Err(ObjectError::Corrupt { .. })));
        fs::write(&p, b"KVOB\x01\x00\x01\x00\xff\xff\xff\xff\xff\xff\xff\x7f").unwrap();
        assert!(matches!(s.get(&put.id, &Scope::Unkeyed), Err(ObjectError::Corrupt { .. })));
        // Each corrupt read moved the file aside, so the id is now missing and the next put repairs it.
        assert!(!p.exists());
        assert_eq!(fs::read_dir(d.0.join(".quarantine")).unwrap().count(), 3);
        assert!(matches!(s.get(&put.id, &Scope::Unkeyed), Err(ObjectError::Missing { .. })));
        assert!(s.put(&raw, 2, 1).unwrap().was_new);
        assert_eq!(s.get(&put.id, &Scope::Unkeyed).unwrap().bytes, raw);
    }

    #[test]
    fn failed_put_leaves_no_temp_file() {
        let d = TempDir::new("atomic");
        let s = ObjectStore::local(&d.0).unwrap();
        let raw = sample(300);
        let id = ObjectId::of(&raw);
        let local = LocalDir::new(&d.0).unwrap();
        let target = local.path_of(&id);
        // A directory where the object file should go makes the rename fail.
        fs::create_dir_all(target.join("blocker")).unwrap();
        assert!(s.put(&raw, 1, 1).is_err());
        let leftovers: Vec<_> = fs::read_dir(target.parent().unwrap())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(TEMP_PREFIX))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn put_many_batches_and_cleans_up() {
        let d = TempDir::new("many");
        let s = ObjectStore::local(&d.0).unwrap();
        let raws: Vec<Vec<u8>> = (0..20).map(|k| sample(1000 + 37 * k)).collect();
        let pre = s.put(&raws[3], 2, 1).unwrap();
        let items: Vec<(ObjectId, &[u8], u8)> =
            raws.iter().enumerate().map(|(k, r)| (ObjectId::of(r), r.as_slice(), (k % 3 + 1) as u8)).collect();
        let puts = s.put_many(&items, 1).unwrap();
        for (k, (p, r)) in puts.iter().zip(&raws).enumerate() {
            assert_eq!(p.id, ObjectId::of(r));
            assert_eq!(p.was_new, k != 3);
            assert_eq!(s.get(&p.id, &Scope::Unkeyed).unwrap().bytes, *r);
            assert_eq!(s.get(&p.id, &Scope::Unkeyed).unwrap().stored_len, p.stored_len);
        }
        assert_eq!(puts[3].stored_len, pre.stored_len);
        assert!(s.put_many(&items, 1).unwrap().iter().all(|p| !p.was_new));

        // A failing rename (a directory where one object goes) fails the batch and leaves no temp file.
        let d2 = TempDir::new("many-fail");
        let s2 = ObjectStore::local(&d2.0).unwrap();
        let local = LocalDir::new(&d2.0).unwrap();
        fs::create_dir_all(local.path_of(&items[5].0).join("blocker")).unwrap();
        assert!(s2.put_many(&items, 1).is_err());
        for shard in local.shards().unwrap() {
            for e in fs::read_dir(shard).unwrap() {
                assert!(!e.unwrap().file_name().to_string_lossy().starts_with(TEMP_PREFIX));
            }
        }
    }
}
