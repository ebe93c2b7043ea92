//! The LMDB index (heed): one `Index` owns the `Env` and every typed table (docs/design.md "LMDB").
//!
//! CONTRACT: the index is a cache of what the manifests say (`kvstore reindex` could rebuild it); keys and
//! values are laid out only by the codecs in `codec.rs`; callers read and edit through the typed tables and
//! the methods in `tables.rs`, never through raw bytes. Naming rules: `names.rs`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use heed::byteorder::BigEndian;
use heed::types::{Bytes, SerdeJson, Str, U32};
use heed::{Database, Env, EnvOpenOptions, RoTxn, RwTxn, WithoutTls};
use serde::{Deserialize, Serialize};

pub mod codec;
mod names;
mod tables;

pub use codec::{IdCodec, NameKeyCodec, ObjectRowCodec, PrefixKeyCodec};
pub use tables::NameRow;
pub use names::{validate_name, MAX_NAME_BYTES};


use crate::id::ObjectId;

pub const SCHEMA_VERSION: &str = "1";

/// Table names, all created in one write transaction by `Index::open`.
pub mod db_name {
    pub const META: &str = "meta";
    pub const NAMES: &str = "names";
    pub const MANIFESTS: &str = "manifests";
    pub const PREFIXES: &str = "prefixes";
    pub const OBJECTS: &str = "objects";
}

/// Keys of the `meta` table.
pub mod meta_key {
    pub const SCHEMA_VERSION: &str = "schema_version";
    pub const BLOCK_SIZE: &str = "block_size";
    pub const CREATED: &str = "created";
}

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("invalid {what} {shown}: {reason}")]
    InvalidName { what: &'static str, value: String, shown: String, reason: String },
    #[error("the index map is full ({}): reopen the store with a larger map_size_mib or run `kvstore gc`; nothing was committed", path.display())]
    MapFull { path: PathBuf },
    #[error("no space left on device for the index ({}): free disk space; nothing was committed", path.display())]
    DiskFull { path: PathBuf },
    #[error("index {}: {source}", path.display())]
    Lmdb { path: PathBuf, source: heed::Error },
    #[error("index table `{table}`, key {key}: {detail}; run `kvstore verify`")]
    Corrupt { table: &'static str, key: String, detail: String },
    #[error("index {}: schema version {found}, this build reads {SCHEMA_VERSION}", path.display())]
    Schema { path: PathBuf, found: String },
}

/// A `names` row value.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NameRecord {
    /// Manifest id (hex in JSON).
    pub manifest: ObjectId,
    /// Unix seconds when this state was stored under the name.
    pub created: f64,
    /// Unix seconds of the last `touch` (or of the ingest).
    pub last_used: f64,
    /// Bucket stores: the ETag of the bucket's name record this row mirrors (sync skips unchanged names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// Bucket stores: manifests a concurrent save on another machine committed and this one replaced
    /// (kept live by gc; see `remote/names.rs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub displaced: Vec<ObjectId>,
    /// How long the name is kept (`gc::evict`); kept where names live, carried over by every later save.
    #[serde(default, skip_serializing_if = "Retention::is_default")]
    pub retention: Retention,
}

/// How long a name is kept: `ttl_s` seconds after its last use (None: until evicted for space); `pinned`:
/// never evicted and never expired.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Retention {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<f64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pinned: bool,
}

impl Retention {
    pub fn is_default(&self) -> bool {
        *self == Retention::default()
    }
    /// Unix seconds when a name last used at `last_used` expires (None: never).
    pub fn expires(&self, last_used: f64) -> Option<f64> {
        if self.pinned {
            return None;
        }
        self.ttl_s.map(|t| last_used + t)
    }
}

/// An `objects` row value: u64be raw_len ‖ u64be stored_len.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectRow {
    pub raw_len: u64,
    pub stored_len: u64,
}


pub struct Index {
    path: PathBuf,
    env: Env<WithoutTls>,
    pub meta: Database<Str, Str>,
    pub names: Database<NameKeyCodec, SerdeJson<NameRecord>>,
    pub manifests: Database<IdCodec, Bytes>,
    pub prefixes: Database<PrefixKeyCodec, U32<BigEndian>>,
    pub objects: Database<IdCodec, ObjectRowCodec>,
}

/// heed refuses to open one env twice in a process; Stores on the same path share one `Index`.
fn registry() -> &'static Mutex<HashMap<PathBuf, Weak<Index>>> {
    static R: OnceLock<Mutex<HashMap<PathBuf, Weak<Index>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

impl Index {
    /// Open (or create) the index at `path`. On creation `meta` gets `schema_version`, `created` and
    /// `block_size` = `block_size`; the caller reads back the stored block size with [`Index::block_size`].
    pub fn open(path: &Path, map_size: usize, block_size: u32) -> Result<Arc<Index>, IndexError> {
        std::fs::create_dir_all(path).map_err(|e| IndexError::Lmdb { path: path.into(), source: e.into() })?;
        let canon = path.canonicalize().map_err(|e| IndexError::Lmdb { path: path.into(), source: e.into() })?;
        let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ix) = reg.get(&canon).and_then(Weak::upgrade) {
            return Ok(ix);
        }
        let lm = |source| lmdb_err(&canon, source);
        // SAFETY: local filesystem, short transactions, one Env per path per process (the registry above).
        let env = unsafe {
            EnvOpenOptions::new().read_txn_without_tls().map_size(map_size).max_dbs(8).max_readers(1022).open(&canon)
        }
        .map_err(lm)?;
        let mut w = env.write_txn().map_err(lm)?;
        let meta = env.create_database(&mut w, Some(db_name::META)).map_err(lm)?;
        let names = env.create_database(&mut w, Some(db_name::NAMES)).map_err(lm)?;
        let manifests = env.create_database(&mut w, Some(db_name::MANIFESTS)).map_err(lm)?;
        let prefixes = env.create_database(&mut w, Some(db_name::PREFIXES)).map_err(lm)?;
        let objects = env.create_database(&mut w, Some(db_name::OBJECTS)).map_err(lm)?;
        let ix = Index { path: canon.clone(), env: env.clone(), meta, names, manifests, prefixes, objects };
        match ix.meta.get(&w, meta_key::SCHEMA_VERSION).map_err(lm)? {
            None => {
                ix.meta.put(&mut w, meta_key::SCHEMA_VERSION, SCHEMA_VERSION).map_err(lm)?;
                ix.meta.put(&mut w, meta_key::BLOCK_SIZE, &block_size.to_string()).map_err(lm)?;
                ix.meta.put(&mut w, meta_key::CREATED, &format!("{}", crate::manifest::now_secs())).map_err(lm)?;
            }
            Some(v) if v == SCHEMA_VERSION => {}
            Some(v) => return Err(IndexError::Schema { path: canon, found: v.to_string() }),
        }
        w.commit().map_err(lm)?;
        let ix = Arc::new(ix);
        reg.retain(|_, w| w.strong_count() > 0);
        reg.insert(canon, Arc::downgrade(&ix));
        Ok(ix)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn read_txn(&self) -> Result<RoTxn<'_, WithoutTls>, IndexError> {
        self.env.read_txn().map_err(|e| self.err(e))
    }
    pub fn write_txn(&self) -> Result<RwTxn<'_>, IndexError> {
        self.env.write_txn().map_err(|e| self.err(e))
    }
    /// Wrap a heed error with this index's path (MapFull / ENOSPC become the "full" variants).
    pub fn err(&self, e: heed::Error) -> IndexError {
        lmdb_err(&self.path, e)
    }

    /// The block size recorded when the store was created.
    pub fn block_size(&self) -> Result<u32, IndexError> {
        let r = self.read_txn()?;
        let v = self.meta.get(&r, meta_key::BLOCK_SIZE).map_err(|e| self.err(e))?;
        let v = v.ok_or_else(|| IndexError::Corrupt {
            table: db_name::META,
            key: meta_key::BLOCK_SIZE.into(),
            detail: "missing".into(),
        })?;
        v.parse().map_err(|_| IndexError::Corrupt {
            table: db_name::META,
            key: meta_key::BLOCK_SIZE.into(),
            detail: format!("not a number: {v:?}"),
        })
    }
}

fn lmdb_err(path: &Path, e: heed::Error) -> IndexError {
    match e {
        heed::Error::Mdb(heed::MdbError::MapFull) => IndexError::MapFull { path: path.into() },
        heed::Error::Io(ref io) if crate::objects::is_disk_full(io) => IndexError::DiskFull { path: path.into() },
        e => IndexError::Lmdb { path: path.into(), source: e },
    }
}

/// heed results → `IndexError` with the index path, for callers that use the typed tables directly.
pub(crate) trait HeedExt<T> {
    fn ix(self, ix: &Index) -> Result<T, IndexError>;
}
impl<T> HeedExt<T> for Result<T, heed::Error> {
    fn ix(self, ix: &Index) -> Result<T, IndexError> {
        self.map_err(|e| ix.err(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;

    #[test]
    fn open_twice_shares_env_and_keeps_block_size() {
        let d = TempDir::new("index");
        let a = Index::open(&d.0.join("index"), 1 << 24, 64).unwrap();
        let b = Index::open(&d.0.join("index"), 1 << 24, 16).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(b.block_size().unwrap(), 64);
        let id = ObjectId::of(b"m");
        let mut w = a.write_txn().unwrap();
        a.names
            .put(&mut w, &("ns", "n"), &NameRecord { manifest: id, created: 1.0, last_used: 2.0, etag: None, displaced: vec![], retention: Default::default() })
            .unwrap();
        a.prefixes.put(&mut w, &([7u8; 32], id), &128).unwrap();
        a.objects.put(&mut w, &id, &ObjectRow { raw_len: 5, stored_len: 3 }).unwrap();
        w.commit().unwrap();
        let r = b.read_txn().unwrap();
        assert_eq!(b.names.get(&r, &("ns", "n")).unwrap().unwrap().manifest, id);
        assert_eq!(b.objects.get(&r, &id).unwrap(), Some(ObjectRow { raw_len: 5, stored_len: 3 }));
        let hits = b.manifests_at_prefix(&r, &[7u8; 32]).unwrap();
        assert_eq!(hits, vec![id]);
        assert!(b.manifests_at_prefix(&r, &[8u8; 32]).unwrap().is_empty());
        drop(r);
        drop((a, b));
        // Reopen after the last handle closed.
        let c = Index::open(&d.0.join("index"), 1 << 24, 32).unwrap();
        assert_eq!(c.block_size().unwrap(), 64);
    }
}
