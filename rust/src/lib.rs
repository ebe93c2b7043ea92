//! kvstore core: a content-addressed, deduplicating store of llama.cpp slot states.
//! Table of contents; each module's header states its contract (docs/design.md "Modules").

/// Slot files: parse into skeleton + blocks, emit back (the only module that knows llama.cpp).
pub mod format;
/// `ObjectId`: blake3 ids, hex on disk, short in messages.
pub mod id;
/// Content-addressed objects: `ObjectStore`, the `Backend` seam, the KVOB codec, atomic writes.
pub mod objects;
/// The LMDB index: typed tables, key codecs, naming rules.
pub mod index;
/// The manifest record, fingerprints, the empty-layout rule.
pub mod manifest;
/// The prefix-key chain over a state's tokens.
pub mod prefix;
/// The store: one operation per file (ingest, materialize, lookup, catalog, stats, verify).
pub mod store;
/// Garbage collection: plan, then execute.
pub mod gc;
/// A store in an S3 bucket, the local disk as a cache.
pub mod remote;
/// Reading a slot file from disk: regular files only, bounded by their size (the one rule).
pub mod slot_file;
/// One `Error` folding the module errors.
pub mod error;

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
