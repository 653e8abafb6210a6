//! Python view of [`crate::hash`]: media content digests with the GIL released.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use super::array::{is_ndarray, NumpyArray};
use super::errors::{self, Class};
use crate::hash;

/// One input of a digest, borrowed from its Python object.
enum Part<'py> {
    Bytes(Bound<'py, PyBytes>),
    Array(NumpyArray<'py>),
}

impl Part<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Part::Bytes(b) => b.as_bytes(),
            Part::Array(a) => a.bytes(),
        }
    }
}

/// media_digest(parts) -> bytes
/// --
///
/// The 32-byte BLAKE3 digest of `parts` (a list or tuple of `bytes` and C-contiguous numpy
/// arrays, read as their raw memory), each part preceded by its length as a little-endian u64.
/// Anything else (or a non-contiguous array) raises `ImageTypeError` naming `parts[i]`.
#[pyfunction]
fn media_digest<'py>(py: Python<'py>, parts: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let type_error = |message: String, field: &str, expected: &str, actual: String| {
        errors::raise(py, Class::ImageType, &message, field, expected, actual)
    };
    let items: Vec<Bound<'py, PyAny>> = if let Ok(list) = parts.cast::<PyList>() {
        list.iter().collect()
    } else if let Ok(tuple) = parts.cast::<PyTuple>() {
        tuple.iter().collect()
    } else {
        let got = parts.get_type().name()?.to_string();
        let message = format!("parts: expected a list or tuple, got {got}");
        return Err(type_error(message, "parts", "list or tuple", got));
    };
    let mut borrowed = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        if let Ok(b) = item.cast::<PyBytes>() {
            borrowed.push(Part::Bytes(b.clone()));
            continue;
        }
        let field = format!("parts[{i}]");
        if !is_ndarray(item)? {
            let got = item.get_type().name()?.to_string();
            let message = format!("{field}: expected bytes or a numpy.ndarray, got {got}");
            return Err(type_error(message, &field, "bytes or numpy.ndarray", got));
        }
        let array = NumpyArray::of(item, &field, Class::ImageType)?;
        if !array.contiguous {
            let message =
                format!("{field}: the array must be C-contiguous (use numpy.ascontiguousarray)");
            let got = "a non-contiguous numpy.ndarray".to_owned();
            return Err(type_error(
                message,
                &field,
                "a C-contiguous numpy.ndarray",
                got,
            ));
        }
        borrowed.push(Part::Array(array));
    }
    let slices: Vec<&[u8]> = borrowed.iter().map(Part::bytes).collect();
    // Bytes objects are immutable and arrays stay referenced by `borrowed` until we return.
    let out = py.detach(|| hash::digest(slices.iter().copied()));
    Ok(PyBytes::new(py, &out))
}

/// blake3(data) -> bytes
/// --
///
/// The plain 32-byte BLAKE3 hash of `data` (no framing), with the GIL released.
#[pyfunction]
#[pyo3(name = "blake3")]
fn blake3_plain<'py>(py: Python<'py>, data: &Bound<'py, PyBytes>) -> Bound<'py, PyBytes> {
    let bytes = data.as_bytes();
    // Bytes objects are immutable; `data` stays referenced for the whole call.
    let out = py.detach(|| hash::plain(bytes));
    PyBytes::new(py, &out)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(media_digest, m)?)?;
    m.add_function(wrap_pyfunction!(blake3_plain, m)?)
}
