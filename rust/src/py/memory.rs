//! Python view of [`crate::memory`]: the limit of the cache of large buffers.

use pyo3::prelude::*;

use crate::memory::recycle;

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
