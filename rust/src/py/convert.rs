//! Conversions at the boundary: JSON-shaped Rust reports → plain dicts and lists, fingerprint mappings →
//! `Fingerprint`.
//!
//! CONTRACT: a report's fields become a dict's keys as serde names them (so the Python shape is the Rust
//! struct's); a fingerprint is a mapping of `str` to `str` (an `int` value is written in decimal), `None`
//! meaning `{}`; anything else is a `TypeError` naming the argument.

use std::collections::BTreeMap;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList, PyString};

use crate::manifest::Fingerprint;

/// JSON-shaped Rust values → plain Python objects.
pub(super) fn to_py<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
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

pub(super) fn dict<'py, T: serde::Serialize>(py: Python<'py>, v: &T) -> PyResult<Bound<'py, PyAny>> {
    let j = serde_json::to_value(v).map_err(|e| PyValueError::new_err(e.to_string()))?;
    to_py(py, &j)
}

/// A `Mapping[str, str]` (int values are accepted and written in decimal) or None.
pub(super) fn fingerprint(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Fingerprint> {
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
