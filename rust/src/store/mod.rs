//! The store: one `Store` owns the object store, the index and the lock; each operation is its own file.
//!
//! | file | operation |
//! |---|---|
//! | `ingest.rs` | a slot file → objects + one index commit |
//! | `materialize.rs` | load, rebuild, materialize (objects → a byte-exact slot file) |
//! | `lookup.rs` | longest stored token prefix |
//! | `catalog.rs` | get, tokens, list, remove, touch |
//! | `stats.rs` | sizes and ratios |
//! | `verify.rs` | re-hash every object, name the states hit |
//!
//! gc is `crate::gc` (plan, then execute). Order (docs/design.md "Concurrency and crash safety"): objects are
//! durable before the one LMDB write transaction that commits manifest, name, prefix and object rows. Ingest
//! holds a shared flock on `<store>/lock` from its first object write to its commit; gc sweeps under the
//! exclusive lock. This file: open, locks, and the reads every operation shares (names → manifests).
//! A bucket store (`crate::remote`) is the same `Store` with `remote` set: objects go through the cached
//! bucket backend, names are read from the bucket (falling back to the index when it is unreachable), a save
//! takes the bucket's shared lock and commits its name there (compare-and-swap) before its index commit.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use crate::error::{Error, ErrorKind, Result};
use crate::id::ObjectId;
use crate::index::{validate_name, HeedExt, Index, NameRecord};
use crate::manifest::Manifest;
use crate::objects::{ObjectError, ObjectStore};
use crate::remote::Remote;

mod catalog;
mod ingest;
mod lookup;
mod materialize;
mod stats;
mod verify;

pub use catalog::StateInfo;
pub use ingest::IngestReport;
pub use lookup::LookupHit;
pub use materialize::{Loaded, MaterializeReport};
pub use stats::Stats;
pub use verify::{VerifyReport, Where};

/// The block size of a new store (tokens per block), chosen by measurement (docs/design.md "Block size").
pub const DEFAULT_BLOCK_SIZE: u32 = 32;
pub const LEVEL_DEFAULT: i32 = 1;
pub const MAP_SIZE_DEFAULT: usize = 64 << 30;

pub struct Store {
    root: PathBuf,
    block_size: u32,
    level: i32,
    pub(crate) index: Arc<Index>,
    pub(crate) objects: ObjectStore,
    lock_path: PathBuf,
    pub(crate) remote: Option<Arc<Remote>>,
}

/// Refuse a block size or zstd level out of range.
pub(crate) fn check_params(block_size: u32, level: i32) -> Result<()> {
    if block_size == 0 || block_size > 1 << 20 {
        return Err(Error::Invalid(format!("block_size {block_size} is out of range 1..=1048576")));
    }
    if !zstd::compression_level_range().contains(&level) {
        return Err(Error::Invalid(format!("zstd level {level} is out of range {:?}", zstd::compression_level_range())));
    }
    Ok(())
}

/// What to materialize.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    Name { namespace: &'a str, name: &'a str },
    /// Manifest id, full hex.
    Manifest(&'a str),
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct NameRef {
    pub namespace: String,
    pub name: String,
}

/// (names with their manifest, manifest → objects it needs, manifests missing or unreadable).
pub(crate) type LiveSet = (Vec<(NameRef, ObjectId)>, HashMap<ObjectId, Vec<ObjectId>>, Vec<ObjectId>);

/// How messages name a target: `name`, `namespace/name` or `manifest 3fa2c1d0`.
fn label(t: &Target) -> String {
    match t {
        Target::Name { namespace: "", name } => (*name).to_string(),
        Target::Name { namespace, name } => format!("{namespace}/{name}"),
        Target::Manifest(h) => format!("manifest {}", &h[..h.len().min(8)]),
    }
}

impl Store {
    /// Open or create a store at `path`. `block_size` is recorded at creation; reopening uses the recorded
    /// value whatever is passed (see [`Store::block_size`]).
    pub fn open(path: &Path, block_size: u32, level: i32, map_size: usize) -> Result<Store> {
        check_params(block_size, level)?;
        std::fs::create_dir_all(path).map_err(|e| Error::io(path, e))?;
        let root = path.canonicalize().map_err(|e| Error::io(path, e))?;
        let objects = ObjectStore::local(root.join("objects"))?;
        Store::assemble(root, objects, block_size, level, map_size, None)
    }

    /// A store over `objects` with its index and lock under `root` (a local store's directory, or a bucket
    /// store's cache directory).
    pub(crate) fn assemble(
        root: PathBuf,
        objects: ObjectStore,
        block_size: u32,
        level: i32,
        map_size: usize,
        remote: Option<Arc<Remote>>,
    ) -> Result<Store> {
        let index = Index::open(&root.join("index"), map_size.max(1 << 20), block_size)?;
        let block_size = index.block_size()?;
        let lock_path = root.join("lock");
        File::options().create(true).append(true).open(&lock_path).map_err(|e| Error::io(&lock_path, e))?;
        Ok(Store { root, block_size, level, index, objects, lock_path, remote })
    }

    /// The bucket behind this store, if it is a bucket store.
    pub fn remote(&self) -> Option<&Arc<Remote>> {
        self.remote.as_ref()
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    pub fn index(&self) -> &Index {
        &self.index
    }

    pub fn objects(&self) -> &ObjectStore {
        &self.objects
    }

    fn lock_file(&self) -> Result<File> {
        File::options().create(true).append(true).open(&self.lock_path).map_err(|e| Error::io(&self.lock_path, e))
    }

    /// Shared flock on `<store>/lock` (ingest); released when the file is dropped.
    pub fn lock_shared(&self) -> Result<File> {
        let f = self.lock_file()?;
        f.lock_shared().map_err(|e| Error::io(&self.lock_path, e))?;
        Ok(f)
    }

    /// Exclusive flock on `<store>/lock` (gc sweep).
    pub fn lock_exclusive(&self) -> Result<File> {
        let f = self.lock_file()?;
        f.lock().map_err(|e| Error::io(&self.lock_path, e))?;
        Ok(f)
    }

    /// The manifest with this id: from the index, else from its object.
    pub(crate) fn read_manifest(&self, r: &heed::RoTxn, id: ObjectId) -> Result<Manifest> {
        let ix = &*self.index;
        if let Some(bytes) = ix.manifests.get(r, &id).ix(ix)? {
            return Ok(Manifest::from_json(id, bytes)?);
        }
        match self.objects.get(&id) {
            Ok(got) => Ok(Manifest::from_json(id, &got.bytes)?),
            Err(ObjectError::Missing { .. }) => Err(Error::ManifestNotFound { id: id.hex() }),
            Err(e) => Err(e.into()),
        }
    }

    fn name_record(&self, r: &heed::RoTxn, namespace: &str, name: &str) -> Result<Option<(NameRecord, ObjectId)>> {
        let ix = &*self.index;
        let local = ix.names.get(r, &(namespace, name)).ix(ix)?;
        if let Some(remote) = &self.remote {
            if let Some(row) = crate::remote::sync::read_name(self, remote, namespace, name, local.as_ref())? {
                return Ok(row.map(|rec| {
                    let id = rec.manifest;
                    (rec, id)
                }));
            }
        }
        Ok(local.map(|rec| {
            let id = rec.manifest;
            (rec, id)
        }))
    }

    fn resolve(&self, target: &Target) -> Result<(ObjectId, Manifest)> {
        let r = self.index.read_txn()?;
        let id = match *target {
            Target::Name { namespace, name } => {
                validate_name(name, "name")?;
                validate_name(namespace, "namespace")?;
                self.name_record(&r, namespace, name)?
                    .ok_or_else(|| Error::NameNotFound { namespace: namespace.into(), name: name.into() })?
                    .1
            }
            Target::Manifest(h) => h.parse().map_err(|_| Error::ManifestNotFound { id: h.into() })?,
        };
        let m = self.read_manifest(&r, id)?;
        Ok((id, m))
    }

    /// Every live name with the objects it needs (manifest, skeleton, blocks). Manifests that are missing or
    /// unreadable are returned in the third list (their blocks are unknown) and map to no objects.
    pub(crate) fn live_set(&self, r: &heed::RoTxn) -> Result<LiveSet> {
        let mut names = Vec::new();
        let mut manifests: HashMap<ObjectId, Vec<ObjectId>> = HashMap::new();
        let mut bad = Vec::new();
        for (namespace, name, rec) in self.index.names_in(r, None)? {
            let id = rec.manifest;
            names.push((NameRef { namespace, name }, id));
            // Manifests a lost race displaced (bucket stores) stay live; unreadable ones protect nothing.
            for d in rec.displaced {
                if let std::collections::hash_map::Entry::Vacant(e) = manifests.entry(d) {
                    if let Ok(m) = self.read_manifest(r, d) {
                        e.insert(m.referenced());
                    }
                }
            }
            if manifests.contains_key(&id) {
                continue;
            }
            let refs = match self.read_manifest(r, id).map(|m| m.referenced()) {
                Ok(refs) => refs,
                Err(e) if matches!(e, Error::ManifestNotFound { .. }) || e.kind() == ErrorKind::Corrupt => {
                    bad.push(id);
                    Vec::new()
                }
                Err(e) => return Err(e),
            };
            manifests.insert(id, refs);
        }
        Ok((names, manifests, bad))
    }
}
