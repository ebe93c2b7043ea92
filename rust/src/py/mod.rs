//! The Python face of the core (`kvstore._core`); the only code that knows pyo3.
//!
//! CONTRACT: this file is the module table: it registers the `Store` class (`store.rs`), the module functions
//! (`functions.rs`), the exception classes (`errors.rs`, with the one `From<Error> for PyErr`) and the module
//! constants; `convert.rs` converts arguments and reports. `kvstore/_core.pyi` describes exactly this table
//! (checked by stubtest).

use pyo3::prelude::*;

mod convert;
mod errors;
mod functions;
mod store;

use crate::store::DEFAULT_BLOCK_SIZE;

const MODULE: &str = "kvstore._core";

/// Fill the `kvstore._core` module.
pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    for ty in errors::exceptions(py).all() {
        let ty = ty.bind(py);
        m.add(ty.name()?, ty)?;
    }
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("DEFAULT_BLOCK_SIZE", DEFAULT_BLOCK_SIZE)?;
    m.add_class::<store::PyStore>()?;
    m.add_function(wrap_pyfunction!(functions::validate_name, m)?)?;
    m.add_function(wrap_pyfunction!(functions::hash_file, m)?)?;
    m.add_function(wrap_pyfunction!(functions::inspect_state, m)?)?;
    m.add_function(wrap_pyfunction!(functions::layout_is_empty, m)?)?;
    m.add_function(wrap_pyfunction!(functions::cut_state, m)?)?;
    Ok(())
}
