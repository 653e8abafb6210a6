//! Python view of [`crate::hash`]: media content digests with the GIL released.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use super::array::{is_ndarray, NumpyArray};
use super::errors::{self, Class};
use crate::hash;
use crate::processors::parallel;

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

/// The parts of one digest, borrowed: `bytes` objects and C-contiguous arrays; `what` names the
/// list in errors (`parts`, `batches[i]`).
fn borrow_parts<'py>(
    py: Python<'py>,
    parts: &Bound<'py, PyAny>,
    what: &str,
) -> PyResult<Vec<Part<'py>>> {
    let type_error = |message: String, field: &str, expected: &str, actual: String| {
        errors::raise(py, Class::ImageType, &message, field, expected, actual)
    };
    let items: Vec<Bound<'py, PyAny>> = if let Ok(list) = parts.cast::<PyList>() {
        list.iter().collect()
    } else if let Ok(tuple) = parts.cast::<PyTuple>() {
        tuple.iter().collect()
    } else {
        let got = parts.get_type().name()?.to_string();
        let message = format!("{what}: expected a list or tuple, got {got}");
        return Err(type_error(message, what, "list or tuple", got));
    };
    let mut borrowed = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        if let Ok(b) = item.cast::<PyBytes>() {
            borrowed.push(Part::Bytes(b.clone()));
            continue;
        }
        let field = format!("{what}[{i}]");
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
    Ok(borrowed)
}

/// media_digest(parts) -> bytes
/// --
///
/// The 32-byte BLAKE3 digest of `parts` (a list or tuple of `bytes` and C-contiguous numpy
/// arrays, read as their raw memory), each part preceded by its length as a little-endian u64.
/// Anything else (or a non-contiguous array) raises `ImageTypeError` naming `parts[i]`.
#[pyfunction]
fn media_digest<'py>(py: Python<'py>, parts: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let borrowed = borrow_parts(py, parts, "parts")?;
    let slices: Vec<&[u8]> = borrowed.iter().map(Part::bytes).collect();
    // Bytes objects are immutable and arrays stay referenced by `borrowed` until we return.
    let out = py.detach(|| hash::digest(slices.iter().copied()));
    Ok(PyBytes::new(py, &out))
}

/// Below this many bytes in all, a batch is hashed on the calling thread: starting a worker
/// costs more than it saves.
const PARALLEL_DIGEST_MIN_BYTES: usize = 256 << 10;

/// media_digests(batches, threads=0) -> list[bytes]
/// --
///
/// `media_digest` of each list of parts in `batches`, on up to `threads` threads (0: one per
/// core; the largest first), with the GIL released: the digests of a batch of images no longer
/// run one after the other on the calling thread. Errors as `media_digest`'s, naming
/// `batches[i][j]`.
#[pyfunction]
#[pyo3(signature = (batches, threads=0))]
fn media_digests<'py>(
    py: Python<'py>,
    batches: &Bound<'py, PyAny>,
    threads: usize,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let lists: Vec<Bound<'py, PyAny>> = if let Ok(list) = batches.cast::<PyList>() {
        list.iter().collect()
    } else if let Ok(tuple) = batches.cast::<PyTuple>() {
        tuple.iter().collect()
    } else {
        let got = batches.get_type().name()?.to_string();
        let message = format!("batches: expected a list or tuple, got {got}");
        return Err(errors::raise(
            py,
            Class::ImageType,
            &message,
            "batches",
            "list or tuple",
            got,
        ));
    };
    let mut borrowed = Vec::with_capacity(lists.len());
    for (i, parts) in lists.iter().enumerate() {
        borrowed.push(borrow_parts(py, parts, &format!("batches[{i}]"))?);
    }
    let jobs: Vec<Vec<&[u8]>> = borrowed
        .iter()
        .map(|parts| parts.iter().map(Part::bytes).collect())
        .collect();
    let costs: Vec<u64> = jobs
        .iter()
        .map(|parts| parts.iter().map(|p| p.len() as u64).sum())
        .collect();
    let total: u64 = costs.iter().sum();
    let workers = if total < PARALLEL_DIGEST_MIN_BYTES as u64 {
        1
    } else {
        parallel::workers(threads, jobs.len())
    };
    let order = parallel::costliest_first(&costs);
    // Bytes objects are immutable and arrays stay referenced by `borrowed` until we return.
    let digests = py.detach(|| {
        parallel::map_in_order(jobs, workers, &order, |_, parts| {
            hash::digest(parts.iter().copied())
        })
    });
    Ok(digests.iter().map(|d| PyBytes::new(py, d)).collect())
}

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
    m.add_function(wrap_pyfunction!(media_digests, m)?)?;
    m.add_function(wrap_pyfunction!(blake3_plain, m)?)
}
