//! kvstore core: a content-addressed, deduplicating store of llama.cpp slot states.
//!
//! CONTRACT: this file is the table of contents, listed from the ground up (a module uses only those above
//! it in this list, and `py` uses any); each module's header states its own contract (docs/design.md
//! "Modules").

/// Slot files: parse into skeleton + blocks, emit back (the only module that knows llama.cpp).
pub mod format;
/// `ObjectId`: blake3 ids, hex on disk, short in messages.
pub mod id;
/// `Scope`: the key object ids are computed under (per namespace: dedup never crosses tenants).
pub mod scope;
/// The prefix-key chain over a state's tokens.
pub mod prefix_keys;
/// The backend-neutral error of a place that did not serve (unreachable, locked, refused).
pub mod unavailable;
/// Content-addressed objects: `ObjectStore`, the `Backend` seam, the KVOB codec, atomic writes.
pub mod objects;
/// The manifest record, fingerprints, the empty-layout rule.
pub mod manifest;
/// The LMDB index: typed tables, key codecs, naming rules.
pub mod index;
/// One `Error` folding the module errors.
pub mod error;
/// The catalog seam (names, locks, sync) and its local implementation.
pub mod catalog;
/// The store, written once against the two seams: one operation per file.
pub mod store;
/// Reading a slot file from disk: regular files only, bounded by their size (the one rule).
pub mod slot_file;
/// Garbage collection on the seams: plan, then execute.
pub mod gc;
/// Both seams over an S3 bucket, the local disk as a cache.
pub mod remote;
/// Opening a store at a location: a directory or `s3://...`.
pub mod open;

/// The Python face (`kvstore._core`): the only module that knows pyo3.
#[cfg(feature = "python")]
pub mod py;

/// Helpers shared by the unit tests.
#[cfg(test)]
mod testutil;

/// The compiled module, imported as `kvstore._core`.
#[cfg(feature = "python")]
#[pyo3::pymodule]
#[pyo3(name = "_core")]
fn core_module(m: &pyo3::Bound<'_, pyo3::types::PyModule>) -> pyo3::PyResult<()> {
    py::init(m)
}
