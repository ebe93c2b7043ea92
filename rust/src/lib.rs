//! kvstore core: a content-addressed, deduplicating store of llama.cpp slot states.
//! Table of contents; the logic lives in the modules (docs/design.md "Modules").
pub mod error;
pub mod format;
pub mod gc;
pub mod index;
pub mod manifest;
pub mod objects;
pub mod slot_file;
pub mod store;

#[cfg(feature = "python")]
pub mod py;

/// The compiled module, imported as `kvstore._core`.
#[cfg(feature = "python")]
#[pyo3::pymodule]
#[pyo3(name = "_core")]
fn core_module(m: &pyo3::Bound<'_, pyo3::types::PyModule>) -> pyo3::PyResult<()> {
    py::init(m)
}
