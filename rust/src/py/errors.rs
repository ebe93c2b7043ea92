//! The exception hierarchy, defined once (here) for Python, and the one `From<Error> for PyErr`.
//!
//! CONTRACT: classes are built with `type(name, bases, ns)` because several have two bases (e.g.
//! `NameNotFound(KvStoreError, KeyError)`), which `create_exception!` cannot express. Each carries the
//! context of its error as attributes (None where a variant does not know it); the message says what
//! happened and what to do next. `kvstore/errors.py` re-exports these classes; `_core.pyi` types them.

use pyo3::exceptions::{PyBaseException, PyException, PyKeyError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

use crate::error::{Error, ErrorKind};
use crate::index::IndexError;
use crate::manifest::{ManifestError, LAYOUT, N_CTX_SLOT};
use crate::objects::ObjectError;

use super::MODULE;

pub(super) struct ExceptionTypes {
    pub base: Py<PyType>,
    pub format: Py<PyType>,
    pub corrupt: Py<PyType>,
    pub fingerprint: Py<PyType>,
    pub name_not_found: Py<PyType>,
    pub invalid_name: Py<PyType>,
    pub store_full: Py<PyType>,
    pub remote_unavailable: Py<PyType>,
    pub gc_locked: Py<PyType>,
}

impl ExceptionTypes {
    pub fn all(&self) -> [&Py<PyType>; 9] {
        [
            &self.base,
            &self.format,
            &self.corrupt,
            &self.fingerprint,
            &self.name_not_found,
            &self.invalid_name,
            &self.store_full,
            &self.remote_unavailable,
            &self.gc_locked,
        ]
    }
}

static EXCEPTIONS: PyOnceLock<ExceptionTypes> = PyOnceLock::new();

pub(super) fn exceptions(py: Python<'_>) -> &ExceptionTypes {
    EXCEPTIONS.get_or_init(py, || {
        let make = |name: &str, bases: &[Bound<'_, PyType>], attrs: &[&str], doc: &str| -> Py<PyType> {
            let ns = PyDict::new(py);
            ns.set_item("__module__", MODULE).unwrap();
            ns.set_item("__doc__", doc).unwrap();
            // KeyError quotes its message in str(); keep kvstore messages readable.
            ns.set_item("__str__", py.get_type::<PyBaseException>().getattr("__str__").unwrap()).unwrap();
            for a in attrs {
                ns.set_item(*a, py.None()).unwrap();
            }
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
            &[],
            "Base of every kvstore error; the message says what to do next.",
        );
        let b = || base.bind(py).clone();
        ExceptionTypes {
            format: make(
                "FormatError",
                &[b(), py.get_type::<PyValueError>()],
                &[],
                "The bytes are not a llama.cpp slot file this build understands (truncated, foreign, other version).",
            ),
            corrupt: make(
                "CorruptObject",
                &[b()],
                &["object_id"],
                "A stored object is missing or does not match its hash; run `kvstore verify`.\n\n\
                 `object_id`: the object's full hex id, or None (a corrupt index row).",
            ),
            fingerprint: make(
                "FingerprintMismatch",
                &[b()],
                &["name", "key", "stored", "server"],
                "A state was asked for a server it cannot be restored into.\n\n\
                 `name`: the state as messages show it; `key`: the differing fingerprint key; `stored`, `server`: its \
                 two values (for `n_ctx_slot`, `stored` is the state's token count).",
            ),
            name_not_found: make(
                "NameNotFound",
                &[b(), py.get_type::<PyKeyError>()],
                &["name", "namespace"],
                "No state is stored under this (namespace, name) (`name` is None for an unknown manifest id).",
            ),
            invalid_name: make(
                "InvalidName",
                &[b(), py.get_type::<PyValueError>()],
                &["what", "value"],
                "A name or namespace breaks the naming rules (empty, > 200 bytes, '/', '\\\\', '..', control \
                 characters).\n\n`what`: 'name' or 'namespace'; `value`: the string refused.",
            ),
            store_full: make(
                "StoreFull",
                &[b(), py.get_type::<PyOSError>()],
                &["path"],
                "The disk or the LMDB map is full; nothing was committed. `path`: where the write failed.",
            ),
            remote_unavailable: make(
                "RemoteUnavailable",
                &[b()],
                &["url"],
                "The store's bucket did not answer (down, unreachable, timed out); nothing was saved. Reads are \
                 served from the local cache where it holds the objects.\n\n`url`: the store, `s3://bucket/prefix`.",
            ),
            gc_locked: make(
                "GcLocked",
                &[b()],
                &["url"],
                "The bucket store's lock is held: another gc is running (a gc refuses), or a gc (a save waited for \
                 it) or saves in flight (a gc waited for them) held it too long.\n\n`url`: the store.",
            ),
            base,
        }
    })
}

/// The attributes an error carries to Python (names as in the classes above).
fn attrs(e: &Error) -> Vec<(&'static str, String)> {
    let path = |p: &std::path::Path| vec![("path", p.display().to_string())];
    match e {
        Error::NameNotFound { namespace, name } => vec![("name", name.clone()), ("namespace", namespace.clone())],
        Error::Manifest(ManifestError::FingerprintMismatch { state, key, stored, server }) => vec![
            ("name", state.clone()),
            ("key", key.clone()),
            ("stored", stored.clone()),
            ("server", server.clone()),
        ],
        Error::Manifest(ManifestError::LayoutDiffers { state, stored, file }) => vec![
            ("name", state.clone()),
            ("key", LAYOUT.into()),
            ("stored", stored.clone()),
            ("server", file.clone()),
        ],
        Error::Manifest(ManifestError::ContextTooSmall { state, n_tokens, server }) => vec![
            ("name", state.clone()),
            ("key", N_CTX_SLOT.into()),
            ("stored", n_tokens.to_string()),
            ("server", server.clone()),
        ],
        Error::Manifest(ManifestError::Invalid { id, .. })
        | Error::Object(ObjectError::Corrupt { id, .. } | ObjectError::Missing { id }) => vec![("object_id", id.hex())],
        Error::Index(IndexError::InvalidName { what, value, .. }) => vec![("what", what.to_string()), ("value", value.clone())],
        Error::Object(ObjectError::Full { path: p, .. }) => path(p),
        Error::Index(IndexError::MapFull { path: p } | IndexError::DiskFull { path: p }) => path(p),
        e if e.unavailable().is_some() => vec![("url", e.unavailable().map(|u| u.location.clone()).unwrap_or_default())],
        _ => Vec::new(),
    }
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
                ErrorKind::RemoteUnavailable => &t.remote_unavailable,
                ErrorKind::GcLocked => &t.gc_locked,
                ErrorKind::Other => &t.base,
            };
            let made = ty.bind(py).call1((e.to_string(),)).and_then(|exc| {
                for (k, v) in attrs(&e) {
                    exc.setattr(k, v)?;
                }
                Ok(PyErr::from_value(exc))
            });
            made.unwrap_or_else(|err| err)
        })
    }
}
