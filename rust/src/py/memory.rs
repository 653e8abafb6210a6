//! Python view of [`crate::memory`]: the limit of the cache of large buffers, and the
//! `MemoryError` raised when a buffer cannot be allocated.

use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;

use crate::memory::recycle;

/// `MemoryError` naming the bytes and what they were for, for a failed allocation of a Python
/// object of `bytes` bytes: CPython raises a bare `MemoryError()`, which this replaces; any other
/// error is returned unchanged.
pub(crate) fn named_memory_error(py: Python<'_>, err: PyErr, what: &str, bytes: usize) -> PyErr {
    if err.is_instance_of::<PyMemoryError>(py) {
        PyMemoryError::new_err(format!(
            "out of memory: cannot allocate {bytes} bytes for the {what}"
        ))
    } else {
        err
    }
}

/// buffer_cache(limit=None) -> tuple[int, int]
/// --
///
/// The cache of large buffers (output tensors, decoded images, intermediate images): sets its
/// limit in bytes when `limit` is given (0 turns recycling off and frees what is kept); returns
/// `(limit, held)` in bytes, the limit before any change and what is held after it.
#[pyfunction]
#[pyo3(signature = (limit=None))]
fn buffer_cache(limit: Option<usize>) -> (usize, usize) {
    let previous = match limit {
        Some(bytes) => recycle::set_limit(bytes),
        None => recycle::limit(),
    };
    (previous, recycle::held())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(buffer_cache, m)?)
}
