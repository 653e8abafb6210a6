//! Python view of [`crate::build_info`].

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// build_info() -> dict
/// --
///
/// Version, profile, target triple and compiler of the native module, and the SIMD features
/// of the running CPU.
#[pyfunction]
fn build_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let info = crate::build_info::build_info();
    let out = PyDict::new(py);
    out.set_item("version", info.version)?;
    out.set_item("profile", info.profile)?;
    out.set_item("target", info.target)?;
    out.set_item("rustc", info.rustc)?;
    out.set_item("cpu_features", info.cpu_features)?;
    Ok(out)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(build_info, m)?)
}
