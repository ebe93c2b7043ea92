//! Module-level functions: name checks, file hashing, parsing a slot file, the empty-layout rule, cutting a
//! slot file's prefix.
//!
//! CONTRACT: each function is the core's own rule exposed as it is (no second implementation in Python);
//! every one that reads a slot file goes through `slot_file.rs`, and every one that writes one writes it
//! atomically (`objects::atomic`); the GIL is released while they work.

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

#[derive(serde::Serialize)]
#[serde(untagged)]
enum Cut {
    File { n_tokens: u32, window: (i32, i32), origins: Vec<(usize, Option<usize>, i32, i32)>, file_bytes: usize },
    Missing { missing: Vec<(i32, i32)> },
}

/// The first `n_tokens` of the slot file at `path` as a slot file written to `out_path` (format/cut.rs);
/// SWA rows may also come from the slot files `extras`. Returns `{"n_tokens", "window", "origins",
/// "file_bytes"}`, or `{"missing": [[start, end], ...]}` (nothing written) when no file holds those rows.
#[pyfunction]
#[pyo3(signature = (path, n_tokens, n_swa, out_path, *, extras = Vec::new(), n_stream = None, fill_masked = 0))]
#[allow(clippy::too_many_arguments)]
pub(super) fn cut_state<'py>(
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
            let bytes = crate::slot_file::read_slot_file(p)?;
            Ok(crate::format::decompose(&bytes, DEFAULT_BLOCK_SIZE)?)
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
                // The one writer of materialized files: a reader of out_path never sees half a file.
                crate::objects::atomic::atomic_write(&out_path, crate::objects::atomic::FILE_TEMP, &bytes, false, || {
                    Ok::<(), Error>(())
                })?;
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
