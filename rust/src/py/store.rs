//! The `Store` class of `kvstore._core`.
//!
//! CONTRACT: arguments are copied into owned values, then every call releases the GIL (`py.detach`) while it
//! works; results are plain dicts and lists (`convert.rs`); errors become the exceptions of `errors.rs`. A
//! store is opened by location (`crate::open`): a directory, or `s3://...` with its cache directory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;

use super::convert::{self, dict};
use crate::error::Error;
use crate::store::{Store, Target, DEFAULT_BLOCK_SIZE};

/// A content-addressed, deduplicating store of slot states. Thread-safe: share one across threads.
#[pyclass(frozen, name = "Store", module = "kvstore._core")]
pub(super) struct PyStore {
    inner: Arc<Store>,
}

#[pymethods]
impl PyStore {
    /// `location`: a local directory, or `s3://bucket/prefix` (then `cache` is required: the local cache
    /// directory; `cache_size`: its bound in bytes, None = unbounded).
    #[new]
    #[pyo3(signature = (location, *, cache = None, cache_size = None, block_size = DEFAULT_BLOCK_SIZE, level = 1, map_size_mib = 65536))]
    fn new(
        py: Python<'_>,
        location: PathBuf,
        cache: Option<PathBuf>,
        cache_size: Option<u64>,
        block_size: u32,
        level: i32,
        map_size_mib: u64,
    ) -> PyResult<Self> {
        let map_size = usize::try_from(map_size_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
        let loc = location.to_string_lossy().into_owned();
        let inner = py.detach(|| crate::open::open_location(&loc, cache.as_deref(), cache_size, block_size, level, map_size))?;
        Ok(PyStore { inner: Arc::new(inner) })
    }

    /// The store's directory (a bucket store: its cache directory).
    #[getter]
    fn path(&self) -> String {
        self.inner.path().to_string_lossy().into_owned()
    }

    /// `s3://bucket/prefix` of a bucket store, else None.
    #[getter]
    fn remote(&self) -> Option<String> {
        self.inner.catalog().location().map(str::to_string)
    }

    /// Requests this store sent to its bucket since it was opened, by kind (`get`, `get_range`, `head`,
    /// `list`, `put`, `delete`); None for a local store. Sends none itself.
    fn bucket_requests(&self) -> Option<std::collections::BTreeMap<&'static str, u64>> {
        self.inner.catalog().location()?;
        Some(self.inner.catalog().requests().into_iter().collect())
    }

    /// Wait for what this store does behind its calls: a bucket store's restore returns once its file is in
    /// place and verified, and writes what it fetched into the cache after that (a read of those objects
    /// meanwhile takes them from memory; gc, stats and eviction wait for it). For a caller that times the two
    /// apart (the bench).
    fn settle(&self, py: Python<'_>) {
        py.detach(|| self.inner.objects().backend().settle());
    }

    /// The local cache directory of a bucket store, else None.
    #[getter]
    fn cache_dir(&self) -> Option<String> {
        self.inner.catalog().location().map(|_| self.inner.path().to_string_lossy().into_owned())
    }

    /// Bring the local index up to date with the bucket's names (one namespace, or all).
    #[pyo3(signature = (namespace = None))]
    fn sync<'py>(&self, py: Python<'py>, namespace: Option<String>) -> PyResult<Bound<'py, PyAny>> {
        let s = &self.inner;
        let r = py.detach(|| s.sync(namespace.as_deref()))?;
        dict(py, &r)
    }

    /// Rebuild the local index from the bucket.
    fn reindex<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = &self.inner;
        let r = py.detach(|| s.reindex())?;
        dict(py, &r)
    }

    #[getter]
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }

    fn __repr__(&self) -> String {
        format!("Store({:?}, block_size={})", self.inner.path().display().to_string(), self.inner.block_size())
    }

    #[pyo3(signature = (name, path, *, namespace = String::new(), fingerprint = None, parent = None, remove_file = false,
                        force = false))]
    #[allow(clippy::too_many_arguments)]
    fn ingest<'py>(
        &self,
        py: Python<'py>,
        name: String,
        path: PathBuf,
        namespace: String,
        fingerprint: Option<Bound<'py, PyAny>>,
        parent: Option<String>,
        remove_file: bool,
        force: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fp = convert::fingerprint(fingerprint.as_ref(), "fingerprint")?;
        let s = &self.inner;
        let r = py.detach(|| -> Result<_, Error> {
            let bytes = crate::slot_file::read_slot_file(&path)?;
            let r = s.ingest(&name, &namespace, &bytes, &fp, parent.as_deref(), force)?;
            if remove_file {
                let _ = std::fs::remove_file(&path);
            }
            Ok(r)
        })?;
        dict(py, &r)
    }

    #[pyo3(signature = (name, data, *, namespace = String::new(), fingerprint = None, parent = None, force = false))]
    fn ingest_bytes<'py>(
        &self,
        py: Python<'py>,
        name: String,
        data: &[u8],
        namespace: String,
        fingerprint: Option<Bound<'py, PyAny>>,
        parent: Option<String>,
        force: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fp = convert::fingerprint(fingerprint.as_ref(), "fingerprint")?;
        let s = &self.inner;
        let r = py.detach(|| s.ingest(&name, &namespace, data, &fp, parent.as_deref(), force))?;
        dict(py, &r)
    }

    #[pyo3(signature = (name, out_path, *, namespace = String::new(), expect = None, n_stream = None, durable = false))]
    #[allow(clippy::too_many_arguments)]
    fn materialize<'py>(
        &self,
        py: Python<'py>,
        name: String,
        out_path: PathBuf,
        namespace: String,
        expect: Option<Bound<'py, PyAny>>,
        n_stream: Option<u32>,
        durable: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.materialize_target(py, Target::Name { namespace: &namespace, name: &name }, &out_path, expect, n_stream, durable)
    }

    /// The first `n_tokens` of a stored state (by `name`, or by `manifest_id` when name is None) as a slot file
    /// llama-server resumes at exactly n_tokens (store/cut.rs).
    #[pyo3(signature = (name, n_tokens, out_path, *, namespace = String::new(), manifest_id = None, expect = None,
                        n_stream = None, fill_masked = 0))]
    #[allow(clippy::too_many_arguments)]
    fn materialize_prefix<'py>(
        &self,
        py: Python<'py>,
        name: Option<String>,
        n_tokens: u32,
        out_path: PathBuf,
        namespace: String,
        manifest_id: Option<String>,
        expect: Option<Bound<'py, PyAny>>,
        n_stream: Option<u32>,
        fill_masked: u32,
    ) -> PyResult<Bound<'py, PyAny>> {
        let expect = expect.map(|e| convert::fingerprint(Some(&e), "expect")).transpose()?;
        let target = match (&name, &manifest_id) {
            (Some(n), None) => Target::Name { namespace: &namespace, name: n },
            (None, Some(m)) => Target::Manifest(m),
            _ => return Err(pyo3::exceptions::PyTypeError::new_err("pass exactly one of name and manifest_id")),
        };
        let s = &self.inner;
        let opts = crate::store::PrefixOptions { n_stream, fill_masked };
        let r = py.detach(|| s.materialize_prefix(&target, &namespace, n_tokens, &out_path, expect.as_ref(), opts))?;
        dict(py, &r)
    }

    #[pyo3(signature = (manifest_id, out_path, *, expect = None, n_stream = None, durable = false))]
    fn materialize_manifest<'py>(
        &self,
        py: Python<'py>,
        manifest_id: String,
        out_path: PathBuf,
        expect: Option<Bound<'py, PyAny>>,
        n_stream: Option<u32>,
        durable: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.materialize_target(py, Target::Manifest(&manifest_id), &out_path, expect, n_stream, durable)
    }

    #[pyo3(signature = (tokens, *, namespace = String::new(), fingerprint = None, whole = false))]
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        tokens: Vec<i32>,
        namespace: String,
        fingerprint: Option<Bound<'py, PyAny>>,
        whole: bool,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let fp = convert::fingerprint(fingerprint.as_ref(), "fingerprint")?;
        let s = &self.inner;
        let r = py.detach(|| if whole { s.lookup_whole(&tokens, &namespace, &fp) } else { s.lookup(&tokens, &namespace, &fp) })?;
        r.map(|h| dict(py, &h)).transpose()
    }

    #[pyo3(signature = (name, *, namespace = String::new()))]
    fn get<'py>(&self, py: Python<'py>, name: String, namespace: String) -> PyResult<Option<Bound<'py, PyAny>>> {
        let s = &self.inner;
        let r = py.detach(|| s.get(&name, &namespace))?;
        r.map(|i| dict(py, &i)).transpose()
    }

    #[pyo3(signature = (name, *, namespace = String::new()))]
    fn held(&self, py: Python<'_>, name: String, namespace: String) -> PyResult<bool> {
        let s = &self.inner;
        Ok(py.detach(|| s.held(&name, &namespace))?)
    }

    #[pyo3(signature = (name, *, namespace = String::new()))]
    fn tokens(&self, py: Python<'_>, name: String, namespace: String) -> PyResult<Vec<i32>> {
        let s = &self.inner;
        Ok(py.detach(|| s.tokens(&name, &namespace))?)
    }

    #[pyo3(signature = (*, namespace = None))]
    fn list<'py>(&self, py: Python<'py>, namespace: Option<String>) -> PyResult<Bound<'py, PyAny>> {
        let s = &self.inner;
        let r = py.detach(|| s.list(namespace.as_deref()))?;
        dict(py, &r)
    }

    #[pyo3(signature = (name, *, namespace = String::new()))]
    fn remove(&self, py: Python<'_>, name: String, namespace: String) -> PyResult<bool> {
        let s = &self.inner;
        Ok(py.detach(|| s.remove(&name, &namespace))?)
    }

    #[pyo3(signature = (name, *, namespace = String::new()))]
    fn touch(&self, py: Python<'_>, name: String, namespace: String) -> PyResult<()> {
        let s = &self.inner;
        Ok(py.detach(|| s.touch(&name, &namespace))?)
    }

    #[pyo3(signature = (*, grace_seconds = 3600.0, dry_run = false))]
    fn gc<'py>(&self, py: Python<'py>, grace_seconds: f64, dry_run: bool) -> PyResult<Bound<'py, PyAny>> {
        let grace = Duration::try_from_secs_f64(grace_seconds.max(0.0)).unwrap_or(Duration::MAX);
        let s = &self.inner;
        let r = py.detach(|| crate::gc::gc(s, grace, dry_run))?;
        dict(py, &r)
    }

    /// Keep the store within limits: expired names, namespaces over their quota, then the cap (see
    /// `gc::evict`). `quotas`: {namespace: bytes}; `protect`: [(namespace, name)] not to evict now;
    /// `ceiling_bytes`: what the store may hold while the sweep runs (default `max_bytes`).
    #[pyo3(signature = (*, max_bytes = None, low_water = 0.9, quotas = None, protect = None, dry_run = false,
                        ceiling_bytes = None))]
    #[allow(clippy::too_many_arguments)]
    fn evict<'py>(
        &self,
        py: Python<'py>,
        max_bytes: Option<u64>,
        low_water: f64,
        quotas: Option<HashMap<String, u64>>,
        protect: Option<Vec<(String, String)>>,
        dry_run: bool,
        ceiling_bytes: Option<u64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let limits = crate::gc::Limits {
            max_bytes,
            ceiling: ceiling_bytes,
            low_water,
            quotas: quotas.unwrap_or_default(),
            protect: protect.unwrap_or_default().into_iter().collect(),
        };
        let s = &self.inner;
        let r = py.detach(|| crate::gc::evict(s, &limits, dry_run))?;
        dict(py, &r)
    }

    /// What each name alone holds: [(namespace, name, stored bytes no other name references)] (see
    /// `gc::owned_bytes`): what its eviction would free now.
    fn owned_bytes(&self, py: Python<'_>) -> PyResult<Vec<(String, String, u64)>> {
        let s = &self.inner;
        Ok(py.detach(|| crate::gc::owned_bytes(s))?)
    }

    /// Set a name's retention: `ttl_seconds` after its last use it expires (None: never); `pinned`: never
    /// evicted or expired. With `max_bytes`, a pin that would put the pinned bytes over it is refused
    /// (StoreFullError) and changes nothing.
    #[pyo3(signature = (name, namespace = String::new(), *, ttl_seconds = None, pinned = false, max_bytes = None))]
    fn set_retention(
        &self,
        py: Python<'_>,
        name: String,
        namespace: String,
        ttl_seconds: Option<f64>,
        pinned: bool,
        max_bytes: Option<u64>,
    ) -> PyResult<()> {
        let s = &self.inner;
        Ok(py.detach(|| {
            if let (true, Some(max)) = (pinned, max_bytes) {
                crate::gc::check_pin(s, &namespace, &name, max)?;
            }
            s.set_retention(&name, &namespace, crate::index::Retention { ttl_s: ttl_seconds, pinned })
        })?)
    }

    #[pyo3(signature = (*, progress = None, r#where = String::from("both")))]
    fn verify<'py>(&self, py: Python<'py>, progress: Option<Py<PyAny>>, r#where: String) -> PyResult<Bound<'py, PyAny>> {
        let s = &self.inner;
        let place: crate::store::Where = r#where.parse()?;
        let mut cb_err: Option<PyErr> = None;
        let r = py.detach(|| {
            s.verify_where(place, &mut |done, total| {
                let Some(cb) = &progress else { return Ok(()) };
                Python::attach(|py| cb.call1(py, (done, total)).map(|_| ())).map_err(|e| {
                    let msg = e.to_string();
                    cb_err = Some(e);
                    Error::Callback(msg)
                })
            })
        });
        if let Some(e) = cb_err {
            return Err(e);
        }
        dict(py, &r?)
    }

    #[pyo3(signature = (*, namespace = None))]
    fn stats<'py>(&self, py: Python<'py>, namespace: Option<String>) -> PyResult<Bound<'py, PyAny>> {
        let s = &self.inner;
        let r = py.detach(|| match &namespace {
            None => s.stats(),
            Some(ns) => s.namespace_stats(ns),
        })?;
        dict(py, &r)
    }
}

impl PyStore {
    /// `materialize` and `materialize_manifest`: check `expect`, then write the target without the GIL.
    fn materialize_target<'py>(
        &self,
        py: Python<'py>,
        target: Target<'_>,
        out_path: &Path,
        expect: Option<Bound<'py, PyAny>>,
        n_stream: Option<u32>,
        durable: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let expect = expect.map(|e| convert::fingerprint(Some(&e), "expect")).transpose()?;
        let s = &self.inner;
        let r = py.detach(|| s.materialize(&target, out_path, expect.as_ref(), n_stream, durable))?;
        dict(py, &r)
    }
}
