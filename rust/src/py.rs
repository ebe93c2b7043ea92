//! The Python face of the core (`kvstore._core`): exceptions, `Store`, and a few functions.
//! Arguments are copied into owned values, then every call releases the GIL (`py.detach`) while it works.
//! Results are plain dicts/lists. The only place that knows pyo3.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyException, PyKeyError, PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyList, PyString, PyTuple, PyType};

use crate::error::{Error, ErrorKind};
use crate::manifest::Fingerprint;
use crate::store::{Store, Target, BLOCK_SIZE_DEFAULT};

const MODULE: &str = "kvstore._core";

struct ExceptionTypes {
    base: Py<PyType>,
    format: Py<PyType>,
    corrupt: Py<PyType>,
    fingerprint: Py<PyType>,
    name_not_found: Py<PyType>,
    invalid_name: Py<PyType>,
    store_full: Py<PyType>,
}

static EXCEPTIONS: PyOnceLock<ExceptionTypes> = PyOnceLock::new();

/// Exception classes, built with `type(name, bases, ns)` because several have two bases
/// (e.g. `NameNotFound(KvStoreError, KeyError)`), which `create_exception!` cannot express.
fn exceptions(py: Python<'_>) -> &ExceptionTypes {
    EXCEPTIONS.get_or_init(py, || {
        let make = |name: &str, bases: &[Bound<'_, PyType>], doc: &str| -> Py<PyType> {
            let ns = PyDict::new(py);
            ns.set_item("__module__", MODULE).unwrap();
            ns.set_item("__doc__", doc).unwrap();
            // KeyError quotes its message in str(); keep kvstore messages readable.
            ns.set_item("__str__", py.get_type::<pyo3::exceptions::PyBaseException>().getattr("__str__").unwrap())
                .unwrap();
            let bases = PyTuple::new(py, bases).unwrap();
            py.get_type::<PyType>()
                .call1((name, bases, ns))
                .and_then(|t| Ok(t.cast_into::<PyType>()?))
                .expect("creating an exception class")
                .unbind()
        };
        let base = make(
            "KvStoreError",
            &[py.get_type::<PyException>()],
            "Base of every kvstore error; the message says what to do next.",
        );
        let b = || base.bind(py).clone();
        ExceptionTypes {
            format: make(
                "FormatError",
                &[b(), py.get_type::<PyValueError>()],
                "The bytes are not a llama.cpp slot file this build understands (truncated, foreign, other version).",
            ),
            corrupt: make("CorruptObject", &[b()], "A stored object is missing or does not match its hash; run `kvstore verify`."),
            fingerprint: make(
                "FingerprintMismatch",
                &[b()],
                "A state was asked for a server it cannot be restored into; the message names the differing key.",
            ),
            name_not_found: make(
                "NameNotFound",
                &[b(), py.get_type::<PyKeyError>()],
                "No state is stored under this (namespace, name).",
            ),
            invalid_name: make(
                "InvalidName",
                &[b(), py.get_type::<PyValueError>()],
                "A name or namespace breaks the naming rules (empty, > 200 bytes, '/', '\\\\', '..', control characters).",
            ),
            store_full: make(
                "StoreFull",
                &[b(), py.get_type::<PyOSError>()],
                "The disk or the LMDB map is full; nothing was committed.",
            ),
            base,
        }
    })
}

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        Python::attach(|py| {
            let t = exceptions(py);
            let ty = match e.kind() {
                ErrorKind::Format => &t.format,
                ErrorKind::Corrupt => &t.corrupt,
                ErrorKind::FingerprintMismatch => &t.fingerprint,
                ErrorKind::NameNotFound => &t.name_not_found,
                ErrorKind::InvalidName => &t.invalid_name,
                ErrorKind::StoreFull => &t.store_full,
                ErrorKind::Other => &t.base,
            };
            PyErr::from_type(ty.bind(py).clone(), e.to_string())
        })
    }
}

/// JSON-shaped Rust values → plain Python objects.
fn to_py<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(a) => {
            let l = PyList::empty(py);
            for x in a {
                l.append(to_py(py, x)?)?;
            }
            l.into_any()
        }
        Value::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}

fn dict<'py, T: serde::Serialize>(py: Python<'py>, v: &T) -> PyResult<Bound<'py, PyAny>> {
    let j = serde_json::to_value(v).map_err(|e| PyValueError::new_err(e.to_string()))?;
    to_py(py, &j)
}

/// A `Mapping[str, str]` (int values are accepted and written in decimal) or None.
fn fingerprint(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Fingerprint> {
    let mut out = BTreeMap::new();
    let Some(obj) = obj else { return Ok(out) };
    if obj.is_none() {
        return Ok(out);
    }
    let items = obj
        .call_method0("items")
        .map_err(|_| PyTypeError::new_err(format!("{what} must be a mapping of str to str")))?;
    for kv in items.try_iter()? {
        let (k, v): (Bound<PyAny>, Bound<PyAny>) = kv?.extract()?;
        let k: String = k
            .extract()
            .map_err(|_| PyTypeError::new_err(format!("{what} keys must be str, got {}", k.get_type().name().map(|n| n.to_string()).unwrap_or_default())))?;
        let v = if let Ok(s) = v.extract::<String>() {
            s
        } else if !v.is_instance_of::<PyBool>() && v.extract::<i64>().is_ok() {
            v.extract::<i64>()?.to_string()
        } else {
            return Err(PyTypeError::new_err(format!("{what}[{k:?}] must be str (or int), got {}", v.repr()?)));
        };
        out.insert(k, v);
    }
    Ok(out)
}

fn name_what(what: &str) -> PyResult<&'static str> {
    match what {
        "name" => Ok("name"),
        "namespace" => Ok("namespace"),
        _ => Err(PyValueError::new_err(format!("what must be 'name' or 'namespace', not {what:?}"))),
    }
}

#[pyfunction]
#[pyo3(signature = (name, what = "name"))]
fn validate_name(name: &str, what: &str) -> PyResult<()> {
    Ok(crate::index::validate_name(name, name_what(what)?).map_err(Error::from)?)
}

#[pyfunction]
fn hash_file(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    py.detach(|| -> Result<String, Error> {
        let f = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
        let mut h = blake3::Hasher::new();
        h.update_reader(f).map_err(|e| Error::io(&path, e))?;
        Ok(h.finalize().to_hex().to_string())
    })
    .map_err(Into::into)
}

#[derive(serde::Serialize)]
struct Inspect {
    file_bytes: u64,
    n_tokens: usize,
    tokens: Vec<i32>,
    layout: String,
    n_stream: u32,
    n_checkpoints: u32,
    blocks: usize,
}

#[pyfunction]
fn inspect_state<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyAny>> {
    let r = py.detach(|| -> Result<Inspect, Error> {
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        let d = crate::format::decompose(&bytes, BLOCK_SIZE_DEFAULT)?;
        Ok(Inspect {
            file_bytes: bytes.len() as u64,
            n_tokens: d.tokens.len(),
            layout: d.layout,
            n_stream: d.n_stream,
            n_checkpoints: d.n_checkpoints,
            blocks: d.blocks.len(),
            tokens: d.tokens,
        })
    })?;
    dict(py, &r)
}

#[derive(serde::Serialize)]
#[serde(untagged)]
enum Cut {
    File { n_tokens: u32, window: (i32, i32), origins: Vec<(usize, Option<usize>, i32, i32)>, file_bytes: usize },
    Missing { missing: Vec<(i32, i32)> },
}

/// The first `n_tokens` of the slot file at `path` as a slot file written to `out_path` (format/prefix.rs);
/// SWA rows may also come from the slot files `extras`. Returns `{"n_tokens", "window", "origins",
/// "file_bytes"}`, or `{"missing": [[start, end], ...]}` (nothing written) when no file holds those rows.
#[pyfunction]
#[pyo3(signature = (path, n_tokens, n_swa, out_path, *, extras = Vec::new(), n_stream = None, fill_masked = 0))]
fn cut_state<'py>(
    py: Python<'py>,
    path: PathBuf,
    n_tokens: u32,
    n_swa: u32,
    out_path: PathBuf,
    extras: Vec<PathBuf>,
    n_stream: Option<u32>,
    fill_masked: u32,
) -> PyResult<Bound<'py, PyAny>> {
    let r = py.detach(|| -> Result<Cut, Error> {
        let read = |p: &PathBuf| -> Result<_, Error> {
            let bytes = std::fs::read(p).map_err(|e| Error::io(p, e))?;
            Ok(crate::format::decompose(&bytes, BLOCK_SIZE_DEFAULT)?)
        };
        let base = read(&path)?;
        let others = extras.iter().map(read).collect::<Result<Vec<_>, _>>()?;
        fn blocks(d: &crate::format::Decomposed) -> Vec<&[u8]> {
            d.blocks.iter().map(|b| b.bytes.as_slice()).collect()
        }
        let bb = blocks(&base);
        let ob: Vec<Vec<&[u8]>> = others.iter().map(blocks).collect();
        let refs: Vec<_> =
            others.iter().zip(&ob).map(|(d, b)| crate::format::StateRef { skeleton: &d.skeleton, blocks: b }).collect();
        let spec = crate::format::PrefixSpec { n_tokens, n_swa, n_stream, fill_masked };
        match crate::format::emit_prefix(crate::format::StateRef { skeleton: &base.skeleton, blocks: &bb }, &refs, &spec)? {
            crate::format::Prefix::Missing { missing } => {
                Ok(Cut::Missing { missing: missing.into_iter().map(|r| (r.start, r.end)).collect() })
            }
            crate::format::Prefix::File { bytes, window, origins } => {
                std::fs::write(&out_path, &bytes).map_err(|e| Error::io(&out_path, e))?;
                Ok(Cut::File {
                    n_tokens,
                    window: (window.start, window.end),
                    origins: origins.into_iter().map(|o| (o.state, o.checkpoint, o.positions.start, o.positions.end)).collect(),
                    file_bytes: bytes.len(),
                })
            }
        }
    })?;
    dict(py, &r)
}

/// A content-addressed, deduplicating store of slot states. Thread-safe: share one across threads.
#[pyclass(frozen, name = "Store", module = "kvstore._core")]
struct PyStore {
    inner: Arc<Store>,
}

#[pymethods]
impl PyStore {
    #[new]
    #[pyo3(signature = (path, *, block_size = BLOCK_SIZE_DEFAULT, level = 1, map_size_mib = 65536))]
    fn new(py: Python<'_>, path: PathBuf, block_size: u32, level: i32, map_size_mib: u64) -> PyResult<Self> {
        let map_size = usize::try_from(map_size_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
        let inner = py.detach(|| Store::open(&path, block_size, level, map_size))?;
        Ok(PyStore { inner: Arc::new(inner) })
    }

    #[getter]
    fn path(&self) -> String {
        self.inner.path().to_string_lossy().into_owned()
    }

    #[getter]
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }

    fn __repr__(&self) -> String {
        format!("Store({:?}, block_size={})", self.inner.path().display().to_string(), self.inner.block_size())
    }

    #[pyo3(signature = (name, path, *, namespace = String::new(), fingerprint = None, parent = None, remove_file = false))]
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
    ) -> PyResult<Bound<'py, PyAny>> {
        let fp = self::fingerprint(fingerprint.as_ref(), "fingerprint")?;
        let s = &self.inner;
        let r = py.detach(|| -> Result<_, Error> {
            let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
            let r = s.ingest(&name, &namespace, &bytes, &fp, parent.as_deref())?;
            if remove_file {
                let _ = std::fs::remove_file(&path);
            }
            Ok(r)
        })?;
        dict(py, &r)
    }

    #[pyo3(signature = (name, data, *, namespace = String::new(), fingerprint = None, parent = None))]
    fn ingest_bytes<'py>(
        &self,
        py: Python<'py>,
        name: String,
        data: &[u8],
        namespace: String,
        fingerprint: Option<Bound<'py, PyAny>>,
        parent: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fp = self::fingerprint(fingerprint.as_ref(), "fingerprint")?;
        let s = &self.inner;
        let r = py.detach(|| s.ingest(&name, &namespace, data, &fp, parent.as_deref()))?;
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
        let expect = expect.map(|e| self::fingerprint(Some(&e), "expect")).transpose()?;
        let s = &self.inner;
        let r = py.detach(|| {
            s.materialize(&Target::Name { namespace: &namespace, name: &name }, &out_path, expect.as_ref(), n_stream, durable)
        })?;
        dict(py, &r)
    }

    /// The first `n_tokens` of a stored state (by `name`, or by `manifest_id` when name is None) as a slot file
    /// llama-server resumes at exactly n_tokens (store/prefix.rs).
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
        let expect = expect.map(|e| self::fingerprint(Some(&e), "expect")).transpose()?;
        let target = match (&name, &manifest_id) {
            (Some(n), None) => Target::Name { namespace: &namespace, name: n },
            (None, Some(m)) => Target::Manifest(m),
            _ => return Err(PyTypeError::new_err("pass exactly one of name and manifest_id")),
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
        let expect = expect.map(|e| self::fingerprint(Some(&e), "expect")).transpose()?;
        let s = &self.inner;
        let r = py.detach(|| s.materialize(&Target::Manifest(&manifest_id), &out_path, expect.as_ref(), n_stream, durable))?;
        dict(py, &r)
    }

    #[pyo3(signature = (tokens, *, namespace = String::new(), fingerprint = None))]
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        tokens: Vec<i32>,
        namespace: String,
        fingerprint: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let fp = self::fingerprint(fingerprint.as_ref(), "fingerprint")?;
        let s = &self.inner;
        let r = py.detach(|| s.lookup(&tokens, &namespace, &fp))?;
        r.map(|h| dict(py, &h)).transpose()
    }

    #[pyo3(signature = (name, *, namespace = String::new()))]
    fn get<'py>(&self, py: Python<'py>, name: String, namespace: String) -> PyResult<Option<Bound<'py, PyAny>>> {
        let s = &self.inner;
        let r = py.detach(|| s.get(&name, &namespace))?;
        r.map(|i| dict(py, &i)).transpose()
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

    #[pyo3(signature = (*, progress = None))]
    fn verify<'py>(&self, py: Python<'py>, progress: Option<Py<PyAny>>) -> PyResult<Bound<'py, PyAny>> {
        let s = &self.inner;
        let mut cb_err: Option<PyErr> = None;
        let r = py.detach(|| {
            s.verify(&mut |done, total| {
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

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = &self.inner;
        let r = py.detach(|| s.stats())?;
        dict(py, &r)
    }
}

/// Fill the `kvstore._core` module.
pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let t = exceptions(py);
    for ty in [&t.base, &t.format, &t.corrupt, &t.fingerprint, &t.name_not_found, &t.invalid_name, &t.store_full] {
        let ty = ty.bind(py);
        m.add(ty.name()?, ty)?;
    }
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("BLOCK_SIZE_DEFAULT", BLOCK_SIZE_DEFAULT)?;
    m.add_class::<PyStore>()?;
    m.add_function(wrap_pyfunction!(validate_name, m)?)?;
    m.add_function(wrap_pyfunction!(hash_file, m)?)?;
    m.add_function(wrap_pyfunction!(inspect_state, m)?)?;
    m.add_function(wrap_pyfunction!(cut_state, m)?)?;
    Ok(())
}
