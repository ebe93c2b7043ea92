//! Module-level functions: name checks, file hashing, parsing a slot file, the empty-layout rule.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::convert::dict;
use crate::error::Error;
use crate::store::DEFAULT_BLOCK_SIZE;

fn name_what(what: &str) -> PyResult<&'static str> {
    match what {
        "name" => Ok("name"),
        "namespace" => Ok("namespace"),
        _ => Err(PyValueError::new_err(format!("what must be 'name' or 'namespace', not {what:?}"))),
    }
}

#[pyfunction]
#[pyo3(signature = (name, what = "name"))]
pub(super) fn validate_name(name: &str, what: &str) -> PyResult<()> {
    Ok(crate::index::validate_name(name, name_what(what)?).map_err(Error::from)?)
}

#[pyfunction]
pub(super) fn hash_file(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    py.detach(|| -> Result<String, Error> {
        let (f, size) = crate::slot_file::open_slot_file(&path)?;
        let mut h = blake3::Hasher::new();
        h.update_reader(std::io::Read::take(f, size)).map_err(|e| Error::io(&path, e))?;
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
pub(super) fn inspect_state<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyAny>> {
    let r = py.detach(|| -> Result<Inspect, Error> {
        let bytes = crate::slot_file::read_slot_file(&path)?;
        let d = crate::format::decompose(&bytes, DEFAULT_BLOCK_SIZE)?;
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

/// Whether a layout (of `Store.get`, `inspect_state`) is an empty slot's, which matches any server.
#[pyfunction]
pub(super) fn layout_is_empty(layout: &str) -> bool {
    crate::manifest::layout_is_empty(layout)
}
