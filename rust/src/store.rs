//! The store: ingest, materialize, lookup, get/list/remove/touch, stats, verify (gc is in gc.rs).
//!
//! Order (docs/design.md "Concurrency and crash safety"): objects are durable before the one LMDB write
//! transaction that commits manifest, name, prefix and object rows. Ingest holds a shared flock on
//! `<store>/lock` from its first object write to its commit; gc sweeps under the exclusive lock.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use heed::types::Bytes;
use heed::BytesDecode;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::{self, Decomposed, EmitOptions};
use crate::index::{validate_name, Index, IndexError, NameKeyCodec, NameRecord, ObjectRow};
use crate::manifest::{
    check_expect, common_prefix, fingerprint_id, now_f64, now_secs, prefix_chain, Fingerprint, Manifest,
    MANIFEST_VERSION,
};
use crate::objects::{fsync_dir, random_suffix, ObjectError, ObjectId, ObjectStore, Put};

mod prefix;
pub use prefix::{PrefixOptions, PrefixReport};

pub const BLOCK_SIZE_DEFAULT: u32 = 32;
pub const LEVEL_DEFAULT: i32 = 1;
pub const MAP_SIZE_DEFAULT: usize = 64 << 30;

/// heed results → our errors, with the index path.
pub(crate) trait HeedExt<T> {
    fn ix(self, ix: &Index) -> Result<T>;
}
impl<T> HeedExt<T> for std::result::Result<T, heed::Error> {
    fn ix(self, ix: &Index) -> Result<T> {
        self.map_err(|e| Error::Index(ix.err(e)))
    }
}

pub struct Store {
    root: PathBuf,
    block_size: u32,
    level: i32,
    pub(crate) index: Arc<Index>,
    pub(crate) objects: ObjectStore,
    lock_path: PathBuf,
}

/// What to materialize.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    Name { namespace: &'a str, name: &'a str },
    /// Manifest id, full hex.
    Manifest(&'a str),
}

#[derive(Debug, Clone, Serialize)]
pub struct IngestReport {
    pub name: String,
    pub namespace: String,
    pub manifest_id: String,
    pub n_tokens: u64,
    pub file_bytes: u64,
    /// Block references in the state (repeats counted).
    pub blocks: usize,
    /// Objects (blocks, skeleton, manifest) written by this ingest.
    pub new_objects: usize,
    /// Uncompressed bytes of the new objects.
    pub new_raw_bytes: u64,
    /// On-disk bytes of the new objects.
    pub new_stored_bytes: u64,
    /// Uncompressed bytes of this state's distinct objects that were already stored.
    pub reused_bytes: u64,
    pub parent_manifest: Option<String>,
    pub elapsed_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MaterializeReport {
    pub manifest_id: String,
    pub n_tokens: u64,
    pub file_bytes: u64,
    pub objects_read: usize,
    pub read_raw_bytes: u64,
    pub read_stored_bytes: u64,
    pub elapsed_s: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LookupHit {
    pub manifest_id: String,
    pub name: String,
    pub n_tokens: u64,
    pub n_common: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct StateInfo {
    pub name: String,
    pub namespace: String,
    pub manifest_id: String,
    pub n_tokens: u64,
    pub file_bytes: u64,
    /// blake3 hex of the slot file a byte-exact materialize writes (compare with `hash_file`).
    pub file_hash: String,
    pub fingerprint: Fingerprint,
    pub layout: String,
    pub parent: Option<String>,
    pub created: f64,
    pub last_used: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub names: u64,
    pub manifests: u64,
    pub objects: u64,
    pub logical_bytes: u64,
    pub unique_raw_bytes: u64,
    pub stored_bytes: u64,
    pub dedup_ratio: f64,
    pub compression_ratio: f64,
    pub total_ratio: f64,
    pub block_size: u32,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct NameRef {
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    pub objects_checked: usize,
    pub corrupt: Vec<String>,
    pub missing: Vec<String>,
    pub names_affected: Vec<NameRef>,
}

/// A state's parts, read and verified.
pub struct Loaded {
    pub manifest_id: ObjectId,
    pub manifest: Manifest,
    pub skeleton: Vec<u8>,
    /// Distinct blocks by id.
    pub blocks: HashMap<ObjectId, Vec<u8>>,
    pub objects_read: usize,
    pub read_raw_bytes: u64,
    pub read_stored_bytes: u64,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        1.0
    } else {
        a as f64 / b as f64
    }
}

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
        if block_size == 0 || block_size > 1 << 20 {
            return Err(Error::Invalid(format!("block_size {block_size} is out of range 1..=1048576")));
        }
        if !zstd::compression_level_range().contains(&level) {
            return Err(Error::Invalid(format!(
                "zstd level {level} is out of range {:?}",
                zstd::compression_level_range()
            )));
        }
        std::fs::create_dir_all(path).map_err(|e| Error::io(path, e))?;
        let root = path.canonicalize().map_err(|e| Error::io(path, e))?;
        let objects = ObjectStore::local(root.join("objects"))?;
        let index = Index::open(&root.join("index"), map_size.max(1 << 20), block_size)?;
        let block_size = index.block_size()?;
        let lock_path = root.join("lock");
        File::options().create(true).append(true).open(&lock_path).map_err(|e| Error::io(&lock_path, e))?;
        Ok(Store { root, block_size, level, index, objects, lock_path })
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

    // ---------------------------------------------------------------- ingest

    /// Store a slot file under (namespace, name), replacing the previous state of that name.
    pub fn ingest(
        &self,
        name: &str,
        namespace: &str,
        file: &[u8],
        fingerprint: &Fingerprint,
        parent: Option<&str>,
    ) -> Result<IngestReport> {
        let t0 = Instant::now();
        validate_name(name, "name")?;
        validate_name(namespace, "namespace")?;
        let (d, file_hash) = rayon::join(|| format::decompose(file, self.block_size), || blake3::hash(file));
        self.ingest_decomposed(name, namespace, file.len() as u64, *file_hash.as_bytes(), d?, fingerprint, parent, t0)
    }

    /// Ingest an already decomposed file (`file_bytes`/`file_hash` describe the original).
    #[allow(clippy::too_many_arguments)]
    pub fn ingest_decomposed(
        &self,
        name: &str,
        namespace: &str,
        file_bytes: u64,
        file_hash: [u8; 32],
        d: Decomposed,
        fingerprint: &Fingerprint,
        parent: Option<&str>,
        t0: Instant,
    ) -> Result<IngestReport> {
        validate_name(name, "name")?;
        validate_name(namespace, "namespace")?;
        let ix = &*self.index;
        let parent_manifest = match parent {
            Some(p) => self.resolve_parent(namespace, p)?,
            None => None,
        };

        // A `layout` the caller knows for its server (learned from an earlier save) must match the file's: a file
        // cut at a section boundary, or saved by another cache configuration, parses but would never restore.
        // Empty slots carry no layers, so they have nothing to compare. The layout itself lives in the manifest.
        let mut fingerprint = fingerprint.clone();
        if let Some(want) = fingerprint.remove(crate::manifest::LAYOUT) {
            if want != d.layout && !d.layout.contains("kv[-]") {
                return Err(crate::manifest::ManifestError::FingerprintMismatch {
                    state: name.into(),
                    key: crate::manifest::LAYOUT.into(),
                    stored: d.layout.clone(),
                    server: want,
                }
                .into());
            }
        }
        let fingerprint = &fingerprint;

        // Hash every block (parallel), keep the first occurrence of each distinct one.
        let ids: Vec<ObjectId> = d.blocks.par_iter().map(|b| ObjectId::of(&b.bytes)).collect();
        let mut seen = HashSet::with_capacity(ids.len());
        let distinct: Vec<usize> = (0..ids.len()).filter(|&i| seen.insert(ids[i])).collect();

        let skeleton_id = ObjectId::of(&d.skeleton);
        let fid = fingerprint_id(fingerprint);
        let manifest = Manifest {
            version: MANIFEST_VERSION,
            fingerprint: fingerprint.clone(),
            fingerprint_id: crate::objects::hex(&fid),
            layout: d.layout.clone(),
            n_tokens: d.tokens.len() as u64,
            tokens: d.tokens.clone(),
            file_bytes,
            file_hash: crate::objects::hex(&file_hash),
            skeleton: skeleton_id.hex(),
            blocks: ids.iter().map(ObjectId::hex).collect(),
            block_size: self.block_size,
            parent: parent_manifest.map(|p| p.hex()),
            created: now_secs(),
            n_stream: d.n_stream,
        };
        let json = manifest.to_json();
        let mid = ObjectId::of(&json);

        // Skeleton, distinct blocks and manifest in one batch: encoded in parallel, all durable (files and
        // their directories fsynced) before the index commit below.
        let mut items: Vec<(ObjectId, &[u8], u8)> = Vec::with_capacity(distinct.len() + 2);
        items.push((skeleton_id, &d.skeleton, 1));
        items.extend(distinct.iter().map(|&i| (ids[i], d.blocks[i].bytes.as_slice(), d.blocks[i].elem_size)));
        items.push((mid, &json, 1));
        // Ids are distinct unless the skeleton or the manifest equals a block (only by hash collision).
        let mut seen_items = HashSet::with_capacity(items.len());
        items.retain(|x| seen_items.insert(x.0));
        let _lock = self.lock_shared()?;
        let puts: HashMap<ObjectId, Put> =
            self.objects.put_many(&items, self.level)?.into_iter().map(|p| (p.id, p)).collect();
        let skeleton_put = puts[&skeleton_id];
        let block_puts: Vec<Put> = distinct.iter().map(|&i| puts[&ids[i]]).collect();
        let manifest_put = puts[&mid];

        // Accounting over this state's distinct objects.
        let mut rows: Vec<(ObjectId, ObjectRow, bool)> = Vec::with_capacity(block_puts.len() + 2);
        rows.push((skeleton_put.id, row(d.skeleton.len(), &skeleton_put), skeleton_put.was_new));
        for (&i, p) in distinct.iter().zip(&block_puts) {
            rows.push((p.id, row(d.blocks[i].bytes.len(), p), p.was_new));
        }
        rows.push((mid, row(json.len(), &manifest_put), manifest_put.was_new));
        let mut seen_rows = HashSet::new();
        rows.retain(|r| seen_rows.insert(r.0));
        let (mut new_objects, mut new_raw, mut new_stored, mut reused) = (0usize, 0u64, 0u64, 0u64);
        for (_, r, was_new) in &rows {
            if *was_new {
                new_objects += 1;
                new_raw += r.raw_len;
                new_stored += r.stored_len;
            } else {
                reused += r.raw_len;
            }
        }

        // One transaction: manifest, name, prefix and object rows.
        let chain = prefix_chain(namespace, &fid, &d.tokens, self.block_size);
        let now = now_f64();
        let mut w = ix.write_txn()?;
        ix.manifests.put(&mut w, &mid, &json).ix(ix)?;
        ix.names
            .put(&mut w, &(namespace, name), &NameRecord { manifest: mid.hex(), created: now, last_used: now })
            .ix(ix)?;
        for (k, h) in chain.iter().enumerate() {
            let covered = ((k as u64 + 1) * self.block_size as u64).min(u32::MAX as u64) as u32;
            ix.prefixes.put(&mut w, &(*h, mid), &covered).ix(ix)?;
        }
        for (id, r, _) in &rows {
            ix.objects.put(&mut w, id, r).ix(ix)?;
        }
        w.commit().ix(ix)?;
        drop(_lock);

        Ok(IngestReport {
            name: name.into(),
            namespace: namespace.into(),
            manifest_id: mid.hex(),
            n_tokens: manifest.n_tokens,
            file_bytes,
            blocks: ids.len(),
            new_objects,
            new_raw_bytes: new_raw,
            new_stored_bytes: new_stored,
            reused_bytes: reused,
            parent_manifest: manifest.parent.clone(),
            elapsed_s: t0.elapsed().as_secs_f64(),
        })
    }

    /// A parent given as a name in the same namespace, or as a stored manifest id (hex). Unknown parents are
    /// recorded as none: the state itself is complete, the parent is only lineage.
    fn resolve_parent(&self, namespace: &str, parent: &str) -> Result<Option<ObjectId>> {
        let ix = &*self.index;
        let r = ix.read_txn()?;
        if validate_name(parent, "name").is_ok() {
            if let Some(rec) = ix.names.get(&r, &(namespace, parent)).ix(ix)? {
                return Ok(ObjectId::from_hex(&rec.manifest));
            }
        }
        if let Some(id) = ObjectId::from_hex(parent) {
            if ix.manifests.get(&r, &id).ix(ix)?.is_some() {
                return Ok(Some(id));
            }
        }
        validate_name(parent, "name")?;
        Ok(None)
    }

    // ---------------------------------------------------------------- reading

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
        let Some(rec) = ix.names.get(r, &(namespace, name)).ix(ix)? else { return Ok(None) };
        let id = ObjectId::from_hex(&rec.manifest).ok_or_else(|| {
            Error::Index(IndexError::Corrupt {
                table: crate::index::db_name::NAMES,
                key: format!("{namespace}/{name}"),
                detail: format!("bad manifest id {:?}", rec.manifest),
            })
        })?;
        Ok(Some((rec, id)))
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
            Target::Manifest(h) => ObjectId::from_hex(h).ok_or_else(|| Error::ManifestNotFound { id: h.into() })?,
        };
        let m = self.read_manifest(&r, id)?;
        Ok((id, m))
    }

    /// Read and verify a state's skeleton and distinct blocks (parallel).
    pub fn load(&self, target: &Target, expect: Option<&Fingerprint>) -> Result<Loaded> {
        let (mid, manifest) = self.resolve(target)?;
        if let Some(expect) = expect {
            check_expect(&label(target), &manifest, expect)?;
        }
        let skeleton_id = manifest.skeleton_id(mid)?;
        let mut want = manifest.block_ids(mid)?;
        want.push(skeleton_id);
        let mut seen = HashSet::new();
        want.retain(|id| seen.insert(*id));
        let got: Vec<(ObjectId, crate::objects::Got)> = want
            .par_iter()
            .map(|id| self.objects.get(id).map(|g| (*id, g)))
            .collect::<std::result::Result<_, ObjectError>>()?;
        let objects_read = got.len();
        let mut read_raw_bytes = 0;
        let mut read_stored_bytes = 0;
        let mut blocks = HashMap::with_capacity(got.len());
        for (id, g) in got {
            read_raw_bytes += g.bytes.len() as u64;
            read_stored_bytes += g.stored_len;
            blocks.insert(id, g.bytes);
        }
        // The skeleton may equal a block only by hash collision; share the bytes anyway.
        let skeleton = if manifest.blocks.contains(&manifest.skeleton) {
            blocks[&skeleton_id].clone()
        } else {
            blocks.remove(&skeleton_id).expect("skeleton was read")
        };
        Ok(Loaded {
            manifest_id: mid,
            manifest,
            skeleton,
            blocks,
            objects_read,
            read_raw_bytes,
            read_stored_bytes,
        })
    }

    /// Rebuild a state's slot file in memory. Byte-exact (and checked against the stored file hash) unless
    /// `n_stream` asks for another stream count than the saved one.
    pub fn rebuild(&self, target: &Target, expect: Option<&Fingerprint>, n_stream: Option<u32>) -> Result<(Loaded, Vec<u8>)> {
        let (loaded, file, exact) = self.rebuild_unchecked(target, expect, n_stream)?;
        if exact {
            check_file_hash(target, &loaded, &file)?;
        }
        Ok((loaded, file))
    }

    /// The rebuilt bytes and whether they must match the manifest's file hash (not yet checked).
    fn rebuild_unchecked(
        &self,
        target: &Target,
        expect: Option<&Fingerprint>,
        n_stream: Option<u32>,
    ) -> Result<(Loaded, Vec<u8>, bool)> {
        let loaded = self.load(target, expect)?;
        let m = &loaded.manifest;
        let exact = n_stream.is_none() || n_stream == Some(m.n_stream);
        let ids = m.block_ids(loaded.manifest_id)?;
        let refs: Vec<&[u8]> = ids.iter().map(|id| loaded.blocks[id].as_slice()).collect();
        let opts = EmitOptions { n_stream: if exact { None } else { n_stream } };
        let file = format::recompose(&loaded.skeleton, &refs, &opts)?;
        Ok((loaded, file, exact))
    }

    /// Write a state as a slot file at `out_path`: `<dir>/.<random>.tmp`, then rename (fsync only if `durable`).
    /// The file hash is checked while the temp file is written; a mismatch removes it before any rename.
    pub fn materialize(
        &self,
        target: &Target,
        out_path: &Path,
        expect: Option<&Fingerprint>,
        n_stream: Option<u32>,
        durable: bool,
    ) -> Result<MaterializeReport> {
        let t0 = Instant::now();
        let (loaded, file, exact) = self.rebuild_unchecked(target, expect, n_stream)?;
        let dir = out_path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let tmp = dir.join(format!(".{}.tmp", random_suffix()));
        let write = || -> Result<()> {
            let mut f = File::options().write(true).create_new(true).open(&tmp).map_err(|e| ObjectError::io(&tmp, e))?;
            f.write_all(&file).map_err(|e| ObjectError::io(&tmp, e))?;
            if durable {
                f.sync_all().map_err(|e| ObjectError::io(&tmp, e))?;
            }
            Ok(())
        };
        let check = || if exact { check_file_hash(target, &loaded, &file) } else { Ok(()) };
        let (w, c) = rayon::join(write, check);
        let result = w.and(c).and_then(|()| {
            std::fs::rename(&tmp, out_path).map_err(|e| ObjectError::io(out_path, e))?;
            if durable {
                fsync_dir(dir).map_err(|e| ObjectError::io(dir, e))?;
            }
            Ok(())
        });
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(MaterializeReport {
            manifest_id: loaded.manifest_id.hex(),
            n_tokens: loaded.manifest.n_tokens,
            file_bytes: file.len() as u64,
            objects_read: loaded.objects_read,
            read_raw_bytes: loaded.read_raw_bytes,
            read_stored_bytes: loaded.read_stored_bytes,
            elapsed_s: t0.elapsed().as_secs_f64(),
        })
    }

    // ---------------------------------------------------------------- lookup

    /// Names of one namespace by manifest id (most recently used name per manifest).
    fn live_names(&self, r: &heed::RoTxn, namespace: &str) -> Result<HashMap<ObjectId, (String, f64)>> {
        let ix = &*self.index;
        let mut prefix = namespace.as_bytes().to_vec();
        prefix.push(0);
        let mut out: HashMap<ObjectId, (String, f64)> = HashMap::new();
        for kv in ix.names.remap_key_type::<Bytes>().prefix_iter(r, &prefix[..]).ix(ix)? {
            let (k, rec) = kv.ix(ix)?;
            let Ok((_, name)) = NameKeyCodec::bytes_decode(k) else { continue };
            let Some(id) = ObjectId::from_hex(&rec.manifest) else { continue };
            let e = out.entry(id).or_insert_with(|| (name.to_string(), f64::MIN));
            if rec.last_used > e.1 {
                *e = (name.to_string(), rec.last_used);
            }
        }
        Ok(out)
    }

    /// The live state with the longest common token prefix (at least one block) with `tokens`.
    pub fn lookup(&self, tokens: &[i32], namespace: &str, fingerprint: &Fingerprint) -> Result<Option<LookupHit>> {
        validate_name(namespace, "namespace")?;
        let chain = prefix_chain(namespace, &fingerprint_id(fingerprint), tokens, self.block_size);
        if chain.is_empty() {
            return Ok(None);
        }
        let ix = &*self.index;
        let r = ix.read_txn()?;
        let live = self.live_names(&r, namespace)?;
        if live.is_empty() {
            return Ok(None);
        }
        let prefixes = ix.prefixes.remap_key_type::<Bytes>();
        let mut candidates: Vec<ObjectId> = Vec::new();
        for h in chain.iter().rev() {
            for kv in prefixes.prefix_iter(&r, &h[..]).ix(ix)? {
                let (k, _) = kv.ix(ix)?;
                if k.len() == 64 {
                    let id = ObjectId(k[32..].try_into().unwrap());
                    if live.contains_key(&id) {
                        candidates.push(id);
                    }
                }
            }
            if !candidates.is_empty() {
                break;
            }
        }
        let mut best: Option<(u64, u64, ObjectId, u64)> = None; // (lcp, created, id, n_tokens)
        for id in candidates {
            let m = match self.read_manifest(&r, id) {
                Ok(m) => m,
                Err(Error::ManifestNotFound { .. }) => continue,
                Err(e) => return Err(e),
            };
            let lcp = common_prefix(tokens, &m.tokens) as u64;
            let key = (lcp, m.created, id, m.n_tokens);
            if best.as_ref().is_none_or(|b| (key.0, key.1) > (b.0, b.1)) {
                best = Some(key);
            }
        }
        Ok(best.map(|(lcp, _, id, n_tokens)| LookupHit {
            manifest_id: id.hex(),
            name: live[&id].0.clone(),
            n_tokens,
            n_common: lcp,
        }))
    }

    // ---------------------------------------------------------------- names

    fn info(&self, r: &heed::RoTxn, namespace: &str, name: &str, rec: NameRecord) -> Result<StateInfo> {
        let id = ObjectId::from_hex(&rec.manifest).ok_or_else(|| Error::ManifestNotFound { id: rec.manifest.clone() })?;
        let m = self.read_manifest(r, id)?;
        Ok(StateInfo {
            name: name.into(),
            namespace: namespace.into(),
            manifest_id: rec.manifest,
            n_tokens: m.n_tokens,
            file_bytes: m.file_bytes,
            file_hash: m.file_hash,
            fingerprint: m.fingerprint,
            layout: m.layout,
            parent: m.parent,
            created: rec.created,
            last_used: rec.last_used,
        })
    }

    pub fn get(&self, name: &str, namespace: &str) -> Result<Option<StateInfo>> {
        validate_name(name, "name")?;
        validate_name(namespace, "namespace")?;
        let ix = &*self.index;
        let r = ix.read_txn()?;
        match ix.names.get(&r, &(namespace, name)).ix(ix)? {
            None => Ok(None),
            Some(rec) => self.info(&r, namespace, name, rec).map(Some),
        }
    }

    pub fn tokens(&self, name: &str, namespace: &str) -> Result<Vec<i32>> {
        let (_, m) = self.resolve(&Target::Name { namespace, name })?;
        Ok(m.tokens)
    }

    /// Every named state (of one namespace, or all), in (namespace, name) order.
    pub fn list(&self, namespace: Option<&str>) -> Result<Vec<StateInfo>> {
        let ix = &*self.index;
        let r = ix.read_txn()?;
        let names = ix.names.remap_key_type::<Bytes>();
        let iter = match namespace {
            Some(ns) => {
                validate_name(ns, "namespace")?;
                let mut p = ns.as_bytes().to_vec();
                p.push(0);
                names.prefix_iter(&r, &p[..]).ix(ix)?.collect::<Vec<_>>()
            }
            None => names.iter(&r).ix(ix)?.collect::<Vec<_>>(),
        };
        let mut out = Vec::with_capacity(iter.len());
        for kv in iter {
            let (k, rec) = kv.ix(ix)?;
            let Ok((ns, name)) = NameKeyCodec::bytes_decode(k) else { continue };
            out.push(self.info(&r, ns, name, rec)?);
        }
        Ok(out)
    }

    /// Forget a name (its objects stay until gc). True if it existed.
    pub fn remove(&self, name: &str, namespace: &str) -> Result<bool> {
        validate_name(name, "name")?;
        validate_name(namespace, "namespace")?;
        let ix = &*self.index;
        let mut w = ix.write_txn()?;
        let existed = ix.names.delete(&mut w, &(namespace, name)).ix(ix)?;
        w.commit().ix(ix)?;
        Ok(existed)
    }

    /// Set a name's last_used to now.
    pub fn touch(&self, name: &str, namespace: &str) -> Result<()> {
        validate_name(name, "name")?;
        validate_name(namespace, "namespace")?;
        let ix = &*self.index;
        let mut w = ix.write_txn()?;
        let mut rec = ix
            .names
            .get(&w, &(namespace, name))
            .ix(ix)?
            .ok_or_else(|| Error::NameNotFound { namespace: namespace.into(), name: name.into() })?;
        rec.last_used = now_f64();
        ix.names.put(&mut w, &(namespace, name), &rec).ix(ix)?;
        w.commit().ix(ix)?;
        Ok(())
    }

    // ---------------------------------------------------------------- stats, verify

    pub fn stats(&self) -> Result<Stats> {
        #[derive(Deserialize)]
        struct Sizes {
            file_bytes: u64,
        }
        let ix = &*self.index;
        let r = ix.read_txn()?;
        let mut logical = 0u64;
        let mut names = 0u64;
        let mut sizes: HashMap<ObjectId, u64> = HashMap::new();
        for kv in ix.names.iter(&r).ix(ix)? {
            let (_, rec) = kv.ix(ix)?;
            names += 1;
            let Some(id) = ObjectId::from_hex(&rec.manifest) else { continue };
            if let Some(&n) = sizes.get(&id) {
                logical += n;
                continue;
            }
            let n = match ix.manifests.get(&r, &id).ix(ix)? {
                Some(b) => serde_json::from_slice::<Sizes>(b).map(|s| s.file_bytes).unwrap_or(0),
                None => 0,
            };
            sizes.insert(id, n);
            logical += n;
        }
        let (mut objects, mut raw, mut stored) = (0u64, 0u64, 0u64);
        for kv in ix.objects.iter(&r).ix(ix)? {
            let (_, row) = kv.ix(ix)?;
            objects += 1;
            raw += row.raw_len;
            stored += row.stored_len;
        }
        Ok(Stats {
            names,
            manifests: ix.manifests.len(&r).ix(ix)?,
            objects,
            logical_bytes: logical,
            unique_raw_bytes: raw,
            stored_bytes: stored,
            dedup_ratio: ratio(logical, raw),
            compression_ratio: ratio(raw, stored),
            total_ratio: ratio(logical, stored),
            block_size: self.block_size,
        })
    }

    /// Every live name with the objects it needs (manifest, skeleton, blocks). Manifests that are missing or
    /// unreadable are returned in the third list (their blocks are unknown) and map to no objects.
    pub(crate) fn live_set(&self, r: &heed::RoTxn) -> Result<LiveSet> {
        let ix = &*self.index;
        let mut names = Vec::new();
        let mut manifests: HashMap<ObjectId, Vec<ObjectId>> = HashMap::new();
        let mut bad = Vec::new();
        for kv in ix.names.iter(r).ix(ix)? {
            let (k, rec) = kv.ix(ix)?;
            let Some(id) = ObjectId::from_hex(&rec.manifest) else { continue };
            names.push((NameRef { namespace: k.0.into(), name: k.1.into() }, id));
            if manifests.contains_key(&id) {
                continue;
            }
            let refs = match self.read_manifest(r, id).and_then(|m| Ok(m.referenced(id)?)) {
                Ok(refs) => refs,
                Err(e) if matches!(e, Error::ManifestNotFound { .. }) || e.kind() == crate::error::ErrorKind::Corrupt => {
                    bad.push(id);
                    Vec::new()
                }
                Err(e) => return Err(e),
            };
            manifests.insert(id, refs);
        }
        Ok((names, manifests, bad))
    }

    /// Re-hash every object file; report corrupt ones, objects live states need but lack, and the names hit.
    /// `progress(done, total)` is called from this thread after each batch; an error from it aborts.
    pub fn verify(&self, progress: &mut dyn FnMut(usize, usize) -> Result<()>) -> Result<VerifyReport> {
        let all = self.objects.backend().list()?;
        let total = all.len();
        let mut corrupt: Vec<ObjectId> = Vec::new();
        let mut present: HashSet<ObjectId> = HashSet::with_capacity(total);
        let mut done = 0;
        progress(0, total)?;
        for chunk in all.chunks(64) {
            let bad: Vec<Option<ObjectId>> = chunk
                .par_iter()
                .map(|id| match self.objects.get(id) {
                    Ok(_) => Ok(None),
                    Err(ObjectError::Corrupt { .. }) => Ok(Some(*id)),
                    Err(ObjectError::Missing { .. }) => Ok(None), // deleted meanwhile (gc)
                    Err(e) => Err(e),
                })
                .collect::<std::result::Result<_, ObjectError>>()?;
            corrupt.extend(bad.into_iter().flatten());
            present.extend(chunk.iter().copied());
            done += chunk.len();
            progress(done, total)?;
        }
        let r = self.index.read_txn()?;
        let (names, manifests, bad) = self.live_set(&r)?;
        drop(r);
        let mut corrupt_set: HashSet<ObjectId> = corrupt.iter().copied().collect();
        let mut missing: HashSet<ObjectId> = HashSet::new();
        for id in bad {
            if present.contains(&id) {
                corrupt_set.insert(id);
            } else {
                missing.insert(id);
            }
        }
        let mut hit: HashSet<ObjectId> = HashSet::new(); // manifests affected
        for (mid, refs) in &manifests {
            let mut affected = false;
            for id in refs.iter().chain(std::iter::once(mid)) {
                if corrupt_set.contains(id) {
                    affected = true;
                } else if !present.contains(id) && !self.objects.exists(id)? {
                    missing.insert(*id);
                    affected = true;
                }
            }
            if affected {
                hit.insert(*mid);
            }
        }
        let mut names_affected: Vec<NameRef> =
            names.into_iter().filter(|(_, mid)| hit.contains(mid)).map(|(n, _)| n).collect();
        names_affected.sort();
        let mut corrupt: Vec<String> = corrupt_set.iter().map(ObjectId::hex).collect();
        corrupt.sort();
        let mut missing: Vec<String> = missing.iter().map(ObjectId::hex).collect();
        missing.sort();
        Ok(VerifyReport { objects_checked: total, corrupt, missing, names_affected })
    }
}

/// (names with their manifest, manifest → objects it needs, manifests missing or unreadable).
pub(crate) type LiveSet = (Vec<(NameRef, ObjectId)>, HashMap<ObjectId, Vec<ObjectId>>, Vec<ObjectId>);

/// A byte-exact rebuild must match the manifest's length and file hash.
fn check_file_hash(target: &Target, loaded: &Loaded, file: &[u8]) -> Result<()> {
    let m = &loaded.manifest;
    let ok = file.len() as u64 == m.file_bytes && crate::objects::hex(blake3::hash(file).as_bytes()) == m.file_hash;
    if ok {
        return Ok(());
    }
    Err(ObjectError::Corrupt {
        id: loaded.manifest_id,
        reason: format!("state {} rebuilt to bytes that do not match its file hash", label(target)),
    }
    .into())
}

fn row(raw_len: usize, p: &Put) -> ObjectRow {
    ObjectRow { raw_len: raw_len as u64, stored_len: p.stored_len }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::format::Block;
    use crate::objects::tests::TempDir;

    pub fn fp(kv: &[(&str, &str)]) -> Fingerprint {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// A synthetic decomposed state: block k is a function of tokens [kB, (k+1)B) (so children share their
    /// parent's blocks below the fork), skeleton = token list.
    pub fn synthetic(tokens: &[i32], b: usize) -> (Decomposed, u64, [u8; 32]) {
        let blocks: Vec<Block> = tokens
            .chunks(b)
            .map(|c| Block { bytes: c.iter().flat_map(|t| [(t & 0xff) as u8, 0x3c].repeat(16)).collect(), elem_size: 2 })
            .collect();
        let skeleton: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        let mut file = skeleton.clone();
        for bl in &blocks {
            file.extend_from_slice(&bl.bytes);
        }
        let d = Decomposed {
            skeleton,
            blocks,
            tokens: tokens.to_vec(),
            layout: "kv[test]".into(),
            n_stream: 1,
            n_checkpoints: 0,
        };
        (d, file.len() as u64, *blake3::hash(&file).as_bytes())
    }

    pub fn put_synthetic(s: &Store, name: &str, ns: &str, tokens: &[i32], f: &Fingerprint) -> IngestReport {
        let (d, len, h) = synthetic(tokens, s.block_size() as usize);
        s.ingest_decomposed(name, ns, len, h, d, f, None, Instant::now()).unwrap()
    }

    pub fn open(d: &TempDir, b: u32) -> Store {
        Store::open(&d.0, b, 1, 1 << 26).unwrap()
    }

    #[test]
    fn ingest_dedups_and_names_work() {
        let d = TempDir::new("store");
        let s = open(&d, 16);
        let f = fp(&[("model", "m1")]);
        let parent: Vec<i32> = (0..100).collect();
        let a = put_synthetic(&s, "article", "", &parent, &f);
        assert_eq!(a.blocks, 7);
        assert_eq!(a.reused_bytes, 0);
        assert_eq!(a.new_objects, 7 + 2);
        let mut child = parent.clone();
        child.extend(1000..1040);
        let (dd, len, h) = synthetic(&child, 16);
        let c = s.ingest_decomposed("q1", "", len, h, dd, &f, Some("article"), Instant::now()).unwrap();
        assert_eq!(c.parent_manifest.as_deref(), Some(a.manifest_id.as_str()));
        // blocks 0..6 (96 tokens) are shared; block 6 differs (96..112 now has child tokens)
        assert_eq!(c.new_objects, 3 + 2, "{c:?}"); // blocks 6,7,8 (of 9) + skeleton + manifest
        assert!(c.reused_bytes > 0);

        let info = s.get("q1", "").unwrap().unwrap();
        assert_eq!(info.n_tokens, 140);
        assert_eq!(info.parent.as_deref(), Some(a.manifest_id.as_str()));
        assert_eq!(s.tokens("q1", "").unwrap(), child);
        assert!(s.get("nope", "").unwrap().is_none());
        assert!(matches!(s.tokens("nope", ""), Err(Error::NameNotFound { .. })));
        assert!(matches!(s.get("a/b", ""), Err(e) if e.kind() == crate::error::ErrorKind::InvalidName));

        put_synthetic(&s, "other", "tenant", &parent, &fp(&[("model", "m2")]));
        assert_eq!(s.list(None).unwrap().len(), 3);
        assert_eq!(s.list(Some("")).unwrap().len(), 2);
        assert_eq!(s.list(Some("tenant")).unwrap()[0].name, "other");

        let before = s.get("article", "").unwrap().unwrap().last_used;
        std::thread::sleep(std::time::Duration::from_millis(5));
        s.touch("article", "").unwrap();
        assert!(s.get("article", "").unwrap().unwrap().last_used > before);
        assert!(matches!(s.touch("nope", ""), Err(Error::NameNotFound { .. })));

        let st = s.stats().unwrap();
        assert_eq!(st.names, 3);
        assert_eq!(st.manifests, 3);
        assert!(st.dedup_ratio > 1.0, "{st:?}");
        assert_eq!(st.block_size, 16);

        assert!(s.remove("q1", "").unwrap());
        assert!(!s.remove("q1", "").unwrap());
        assert!(s.get("q1", "").unwrap().is_none());
    }

    #[test]
    fn lookup_finds_longest_live_prefix() {
        let d = TempDir::new("lookup");
        let s = open(&d, 16);
        let f = fp(&[("model", "m1"), ("n_ctx_slot", "4096")]);
        let base: Vec<i32> = (0..64).collect();
        let mut long = base.clone();
        long.extend(500..540);
        put_synthetic(&s, "short", "", &base, &f);
        let lr = put_synthetic(&s, "long", "", &long, &f);

        // n_ctx_slot does not take part in the fingerprint id.
        let q_f = fp(&[("model", "m1")]);
        let mut q = long[..90].to_vec();
        q.extend([7, 7, 7]);
        let hit = s.lookup(&q, "", &q_f).unwrap().unwrap();
        assert_eq!(hit.name, "long");
        assert_eq!(hit.manifest_id, lr.manifest_id);
        assert_eq!(hit.n_common, 90);
        assert_eq!(hit.n_tokens, 104);

        // Another fingerprint or namespace: miss. Shorter than a block: miss.
        assert!(s.lookup(&q, "", &fp(&[("model", "m2")])).unwrap().is_none());
        assert!(s.lookup(&q, "tenant", &q_f).unwrap().is_none());
        assert!(s.lookup(&q[..10], "", &q_f).unwrap().is_none());

        // Query diverging inside block 4: deepest hit is block 4 for both; LCP decides, "long" wins at 70.
        let mut q2 = base.clone();
        q2.extend(500..506);
        q2.extend([9; 20]);
        let hit = s.lookup(&q2, "", &q_f).unwrap().unwrap();
        assert_eq!((hit.name.as_str(), hit.n_common), ("long", 70));

        // Removed names are skipped: falls back to the shorter live state.
        s.remove("long", "").unwrap();
        let hit = s.lookup(&q, "", &q_f).unwrap().unwrap();
        assert_eq!((hit.name.as_str(), hit.n_common), ("short", 64));
        s.remove("short", "").unwrap();
        assert!(s.lookup(&q, "", &q_f).unwrap().is_none());
    }

    #[test]
    fn verify_reports_corrupt_and_missing() {
        let d = TempDir::new("verify");
        let s = open(&d, 16);
        let f = Fingerprint::new();
        let r = put_synthetic(&s, "a", "", &(0..40).collect::<Vec<_>>(), &f);
        put_synthetic(&s, "b", "ns", &(100..140).collect::<Vec<_>>(), &f);
        let mut calls = 0;
        let ok = s.verify(&mut |_, _| { calls += 1; Ok(()) }).unwrap();
        assert!(ok.corrupt.is_empty() && ok.missing.is_empty() && ok.names_affected.is_empty());
        assert_eq!(ok.objects_checked, 2 * (3 + 2));
        assert!(calls >= 2);

        let r_txn = s.index.read_txn().unwrap();
        let m = s.read_manifest(&r_txn, ObjectId::from_hex(&r.manifest_id).unwrap()).unwrap();
        drop(r_txn);
        let local = crate::objects::LocalDir::new(d.0.join("objects")).unwrap();
        let b0 = ObjectId::from_hex(&m.blocks[0]).unwrap();
        let b1 = ObjectId::from_hex(&m.blocks[1]).unwrap();
        std::fs::write(local.path_of(&b0), b"garbage").unwrap();
        std::fs::remove_file(local.path_of(&b1)).unwrap();
        let rep = s.verify(&mut |_, _| Ok(())).unwrap();
        assert_eq!(rep.corrupt, vec![b0.hex()]);
        assert_eq!(rep.missing, vec![b1.hex()]);
        assert_eq!(rep.names_affected, vec![NameRef { namespace: "".into(), name: "a".into() }]);
        let e = s.load(&Target::Name { namespace: "", name: "a" }, None).err().unwrap();
        assert_eq!(e.kind(), crate::error::ErrorKind::Corrupt, "{e}");
        assert!(e.to_string().contains("run `kvstore verify`"), "{e}");
    }

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
        assert_eq!(e.kind(), crate::error::ErrorKind::FingerprintMismatch);
        assert!(e.to_string().starts_with("state 'rep' was saved with flash_attn=on"), "{e}");
        let e = s.load(&t, Some(&fp(&[("n_ctx_slot", "31")]))).err().unwrap();
        assert_eq!(e.kind(), crate::error::ErrorKind::FingerprintMismatch);
        let by_id = s.load(&Target::Manifest(&l.manifest_id.hex()), None).unwrap();
        assert_eq!(by_id.manifest, l.manifest);
        assert!(matches!(s.load(&Target::Manifest("00"), None), Err(Error::ManifestNotFound { .. })));
    }

    /// Real slot files (KVSTORE_STATE_DIR=dir of *.bin, see tests/make_states.py) through ingest/materialize.
    /// `./dev test` (and so CI) always sets the variable.
    #[test]
    fn real_files_round_trip() {
        let Some(dir) = std::env::var_os("KVSTORE_STATE_DIR") else {
            assert!(std::env::var_os("CI").is_none(), "CI must set KVSTORE_STATE_DIR (./dev test does)");
            eprintln!("not run: set KVSTORE_STATE_DIR to a directory of slot files (tests/make_states.py)");
            return;
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "bin"))
            .collect();
        files.sort();
        assert!(!files.is_empty(), "KVSTORE_STATE_DIR holds no *.bin files");
        let d = TempDir::new("real");
        let s = open(&d, 64);
        let f = fp(&[("model", "test")]);
        for p in &files {
            let bytes = std::fs::read(p).unwrap();
            let name = p.file_stem().unwrap().to_string_lossy().to_string();
            let r = s.ingest(&name, "", &bytes, &f, None).unwrap();
            assert_eq!(r.file_bytes, bytes.len() as u64);
            let out = d.0.join(format!("{name}.out"));
            let m = s.materialize(&Target::Name { namespace: "", name: &name }, &out, None, None, true).unwrap();
            assert_eq!(m.file_bytes, bytes.len() as u64);
            assert_eq!(std::fs::read(&out).unwrap(), bytes, "{name}: materialize is not byte-exact");
            // Re-ingesting the same bytes writes only a new manifest (created time) at most.
            let again = s.ingest(&name, "", &bytes, &f, None).unwrap();
            assert!(again.new_objects <= 1, "{name}: {again:?}");
            let leftovers = std::fs::read_dir(&d.0).unwrap().filter_map(|e| e.ok()).filter(|e| {
                e.file_name().to_string_lossy().ends_with(".tmp")
            });
            assert_eq!(leftovers.count(), 0);
        }
        // parent/child pairs share blocks
        for m in ["smollm2", "gemma3"] {
            let (pp, cp) = (PathBuf::from(&dir).join(format!("{m}_parent.bin")), PathBuf::from(&dir).join(format!("{m}_child.bin")));
            if pp.exists() && cp.exists() {
                let d2 = TempDir::new("pc");
                let s2 = open(&d2, 64);
                s2.ingest("p", "", &std::fs::read(&pp).unwrap(), &f, None).unwrap();
                let c = s2.ingest("c", "", &std::fs::read(&cp).unwrap(), &f, Some("p")).unwrap();
                assert!(c.reused_bytes > 0, "{m}: child shares nothing with its parent: {c:?}");
            }
        }
    }
}
