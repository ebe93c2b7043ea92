//! The store: one `Store` over two seams, `objects::Backend` (where objects live) and `catalog::Catalog`
//! (names, locks, sync); each operation is its own file, written once for every backend and catalog.
//!
//! | file | operation |
//! |---|---|
//! | `ingest.rs` | a slot file → objects + one index commit |
//! | `materialize.rs` | load, rebuild, materialize (objects → a byte-exact slot file) |
//! | `streamed.rs` | a restore from afar written as its objects arrive |
//! | `lookup.rs` | longest stored token prefix |
//! | `cut.rs` | a stored state cut at any P (SWA window rows lent by related states) |
//! | `states.rs` | the named states: get, tokens, list, remove, touch |
//! | `stats.rs` | sizes and ratios |
//! | `verify.rs` | re-hash every object, name the states hit |
//!
//! CONTRACT (docs/design.md "Concurrency and crash safety"): objects are durable before the one LMDB write
//! transaction that commits manifest, name, prefix and object rows; a save holds the catalog's save lock
//! from its first object write to that commit, and the catalog commits the name (elsewhere, if names live
//! elsewhere) before it. gc is `crate::gc` (plan, then execute, under the catalog's gc lock). This file:
//! open, and the reads every operation shares (names → manifests, the live set).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use crate::catalog::{Catalog, LocalCatalog, LockFile, SyncReport};
use crate::error::{Error, ErrorKind, Result};
use crate::id::ObjectId;
use crate::index::{validate_name, HeedExt, Index, NameRecord};
use crate::manifest::Manifest;
use crate::objects::{ObjectError, ObjectStore};
use crate::scope::Scope;

mod states;
mod ingest;
mod lookup;
mod materialize;
mod streamed;
mod cut;
mod stats;
mod buffers;
mod verify;
mod file_check;
#[cfg(test)]
mod scope_tests;

pub use states::StateInfo;
pub use ingest::IngestReport;
pub use file_check::FileSums;
pub use lookup::LookupHit;
pub use materialize::{Loaded, MaterializeReport};
pub use cut::{PrefixOptions, PrefixReport};
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
    pub(crate) catalog: Arc<dyn Catalog>,
    /// Rebuild buffers kept between restores (`buffers.rs`).
    pub(crate) buffers: buffers::Buffers,
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
    /// Open or create a local store at `path` (objects in `objects/`, names in the index, `flock`s on `lock`).
    /// `block_size` is recorded at creation; reopening uses the recorded value whatever is passed (see
    /// [`Store::block_size`]).
    pub fn open(path: &Path, block_size: u32, level: i32, map_size: usize) -> Result<Store> {
        check_params(block_size, level)?;
        std::fs::create_dir_all(path).map_err(|e| Error::io(path, e))?;
        let root = path.canonicalize().map_err(|e| Error::io(path, e))?;
        let objects = ObjectStore::local(root.join("objects"))?;
        let index = Index::open(&root.join("index"), map_size.max(1 << 20), block_size)?;
        let catalog = LocalCatalog::new(index.clone(), LockFile::new(root.join("lock"))?);
        Store::from_parts(root, index, objects, Arc::new(catalog), level)
    }

    /// A store over any backend and catalog, with its index under `root` (a local store's directory, or the
    /// cache directory of a store kept elsewhere). The block size is the index's.
    pub fn from_parts(
        root: PathBuf,
        index: Arc<Index>,
        objects: ObjectStore,
        catalog: Arc<dyn Catalog>,
        level: i32,
    ) -> Result<Store> {
        let block_size = index.block_size()?;
        check_params(block_size, level)?;
        Ok(Store { root, block_size, level, index, objects, catalog, buffers: Default::default() })
    }

    /// The catalog seam: where names live, locks, sync.
    pub fn catalog(&self) -> &dyn Catalog {
        &*self.catalog
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

    /// Bring the index up to date with the names kept elsewhere (one namespace, or all); refused for a store
    /// whose index is its catalog.
    pub fn sync(&self, namespace: Option<&str>) -> Result<SyncReport> {
        if let Some(ns) = namespace {
            validate_name(ns, "namespace")?;
        }
        self.catalog.sync(namespace)?.ok_or_else(|| self.kept_here("sync"))
    }

    /// Rebuild the index from the names kept elsewhere; refused for a store whose index is its catalog.
    pub fn reindex(&self) -> Result<SyncReport> {
        self.catalog.reindex()?.ok_or_else(|| self.kept_here("reindex"))
    }

    fn kept_here(&self, what: &str) -> Error {
        Error::Invalid(format!("{what} is for a bucket store (s3://...); {} is local", self.root.display()))
    }

    /// `sync` where names live elsewhere; an unreachable place leaves the index as it is (reads serve what
    /// this machine knows). Nothing for a store whose index is its catalog. False: the place was unreachable.
    pub(crate) fn sync_quietly(&self, namespace: Option<&str>) -> Result<bool> {
        match self.catalog.sync(namespace) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::RemoteUnavailable => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The manifest with this id: from the index, else from its object.
    pub(crate) fn read_manifest(&self, r: &heed::RoTxn, id: ObjectId) -> Result<Manifest> {
        let ix = &*self.index;
        if let Some(bytes) = ix.manifests.get(r, &id).ix(ix)? {
            return Ok(Manifest::from_json(id, bytes)?);
        }
        match self.objects.get(&id, &Scope::Unkeyed) {
            Ok(got) => Ok(Manifest::from_json(id, &got.bytes)?),
            Err(ObjectError::Missing { .. }) => Err(Error::ManifestNotFound { id: id.hex() }),
            Err(e) => Err(e.into()),
        }
    }

    /// A name's record, from the catalog (where names live).
    fn name_record(&self, namespace: &str, name: &str) -> Result<Option<(NameRecord, ObjectId)>> {
        Ok(self.catalog.name(namespace, name)?.map(|rec| {
            let id = rec.manifest;
            (rec, id)
        }))
    }

    fn resolve(&self, target: &Target) -> Result<(ObjectId, Manifest)> {
        let id = match *target {
            Target::Name { namespace, name } => {
                validate_name(name, "name")?;
                validate_name(namespace, "namespace")?;
                self.name_record(namespace, name)?
                    .ok_or_else(|| Error::NameNotFound { namespace: namespace.into(), name: name.into() })?
                    .1
            }
            Target::Manifest(h) => h.parse().map_err(|_| Error::ManifestNotFound { id: h.into() })?,
        };
        // Read after the name: reading it may have mirrored its manifest into the index (a bucket store).
        let r = self.index.read_txn()?;
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
