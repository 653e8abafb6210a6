//! Python view of [`crate::prompt`]: a prompt's token ids read from a Python list in one pass,
//! and expanded into a request's packed `input_ids` record.
//!
//! Both functions only take the common case and answer `None` for anything else (an item that
//! is not exactly an `int`, an id outside `uint32`, anchors that do not match the media): the
//! Python caller then takes its numpy path, whose errors name the problem, so that the errors
//! stay in one place. Wrong argument types raise `TensorTypeError`; a failed allocation
//! `TensorMemoryError`.

use std::os::raw::c_ulong;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use super::tensor::{bytes_of, expected, value_error};
use crate::prompt::{expand_runs, Anchor, ExpandError};
use crate::tensor::TensorError;

/// The `TensorMemoryError` of a buffer of `bytes` bytes that could not be allocated.
fn memory_error(what: &'static str, bytes: u64) -> PyErr {
    value_error(TensorError::OutOfMemory { what, bytes })
}

/// The items of `list`, each exactly an `int` within `u32`; `None` as soon as one is not. Read
/// under the list's critical section: nothing else then changes the list (on a free-threaded
/// interpreter, whose other threads would otherwise run alongside; with the GIL it costs
/// nothing).
fn read_ids(py: Python<'_>, list: &Bound<'_, PyList>) -> PyResult<Option<Vec<u32>>> {
    pyo3::sync::critical_section::with_critical_section(list.as_any(), || read_items(py, list))
}

/// The loop of [`read_ids`], under the list's critical section.
fn read_items(py: Python<'_>, list: &Bound<'_, PyList>) -> PyResult<Option<Vec<u32>>> {
    let len = list.len();
    let mut ids = crate::memory::fallible::with_capacity::<u32>(len)
        .map_err(|e| memory_error("token ids", e.bytes))?;
    // Only the address of the interpreter's `int` type object (taking it reads nothing).
    let int_type = std::ptr::addr_of_mut!(ffi::PyLong_Type);
    for i in 0..len {
        // SAFETY: `list` is a live list (a `Bound` holds a strong reference, and we are
        // attached to the interpreter); `PyList_GetItem` checks `i` against its current length
        // and returns a borrowed reference or NULL (an `IndexError` set). The list cannot
        // change while this loop runs: it holds the list's critical section (free-threaded
        // builds), and nothing in it runs Python code that could (no `__index__` is called:
        // only exact ints are read), so the borrowed item stays alive while it is read.
        let item = unsafe { ffi::PyList_GetItem(list.as_ptr(), i as ffi::Py_ssize_t) };
        if item.is_null() {
            return Err(PyErr::fetch(py));
        }
        // SAFETY: `item` is a live object (above); `Py_TYPE` reads its type pointer.
        if unsafe { ffi::Py_TYPE(item) } != int_type {
            return Ok(None);
        }
        // SAFETY: `item` is a live, exact `int`: `PyLong_AsUnsignedLong` reads it without running
        // Python code, and on overflow (negative, or past `unsigned long`) returns -1 with an
        // `OverflowError` set, which is cleared below.
        let value = unsafe { ffi::PyLong_AsUnsignedLong(item) };
        if value == c_ulong::MAX && PyErr::take(py).is_some() {
            return Ok(None);
        }
        let Ok(value) = u32::try_from(value) else {
            return Ok(None);
        };
        ids.push(value);
    }
    Ok(Some(ids))
}

/// `obj` as a list, or the `TensorTypeError` saying it is not one.
fn as_list<'a, 'py>(obj: &'a Bound<'py, PyAny>, field: &str) -> PyResult<&'a Bound<'py, PyList>> {
    obj.cast::<PyList>()
        .map_err(|_| expected("a list", obj, field))
}

/// uint32_list(values) -> bytes | None
/// --
///
/// The little-endian `uint32` bytes of `values`, a list of `int`s each in `0..=2**32 - 1` (a
/// prompt's token ids), read in one pass: numpy's `asarray` first discovers the type of every
/// item, at nearly six times the cost (21 against 3.7 ns an id). `None` as soon as an item is
/// not exactly an `int` or lies outside that range: the caller then takes numpy's path, whose
/// checks name the problem. `TensorTypeError` (`field="values"`) when `values` is not a list.
#[pyfunction]
fn uint32_list<'py>(
    py: Python<'py>,
    values: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let Some(mut ids) = read_ids(py, as_list(values, "values")?)? else {
        return Ok(None);
    };
    for id in &mut ids {
        *id = id.to_le(); // the wire's byte order (a no-op on little-endian machines)
    }
    // SAFETY: `u32` has no padding and any bytes are valid `u8`s; the view covers exactly the
    // `4 × ids.len()` bytes of `ids` (a size its allocation already holds, so no overflow),
    // which outlives it (`bytes_of` copies them).
    let view = unsafe { std::slice::from_raw_parts(ids.as_ptr().cast::<u8>(), 4 * ids.len()) };
    Ok(Some(bytes_of(py, view)?))
}

/// `obj`'s items as `T`s when it is a sized sequence of at most `most` such ints; `None`
/// otherwise (or when the memory is not there: no list handed in makes this abort).
fn ints<T: for<'a, 'py> FromPyObject<'a, 'py>>(
    obj: &Bound<'_, PyAny>,
    most: usize,
) -> Option<Vec<T>> {
    let len = obj.len().ok().filter(|&n| n <= most)?;
    let mut out = crate::memory::fallible::with_capacity(len).ok()?;
    for item in obj.try_iter().ok()? {
        if out.len() == len {
            return None; // more items than it said
        }
        out.push(item.ok()?.extract::<T>().ok()?);
    }
    Some(out)
}

/// `obj` as exactly `n` sequences of at most `most` ints each (the items' token counts of each
/// media); `None` otherwise.
fn count_lists(obj: &Bound<'_, PyAny>, n: usize, most: usize) -> Option<Vec<Vec<u64>>> {
    if obj.len().ok()? != n {
        return None;
    }
    let mut out = crate::memory::fallible::with_capacity(n).ok()?;
    for item in obj.try_iter().ok()? {
        if out.len() == n {
            return None; // more items than it said
        }
        out.push(ints::<u64>(&item.ok()?, most)?);
    }
    Some(out)
}

/// The record and ranges of [`crate::prompt::Expanded`] as Python objects.
type Packed<'py> = (Bound<'py, PyBytes>, Vec<Vec<(u64, u64)>>);

/// packed_prompt(input_ids, anchors, counts, field) -> tuple[bytes, list[list[tuple[int, int]]]] | None
/// --
///
/// `input_ids` (a list of `int`s within `uint32`) with each occurrence of `anchors[m]` expanded
/// to a run of `counts[m][k]` copies of it (its `k`-th item's token count), as the whole record
/// of the packed `repeated uint32` field number `field` (tag, length, varints) for protobuf to
/// merge into a message, and per media each item's `(offset, length)` in the expanded ids.
/// `None` when an id is not an `int` within `uint32`, when an anchor or a count is not one
/// either, when two media share an anchor, when an anchor occurs other than once per item, when
/// a count is 0 or when `field` is not a field number: the caller's general path raises the
/// error. `TensorTypeError` (`field="input_ids"`) when `input_ids` is not a list;
/// `TensorMemoryError` when the record cannot be allocated.
#[pyfunction]
fn packed_prompt<'py>(
    py: Python<'py>,
    input_ids: &Bound<'py, PyAny>,
    anchors: &Bound<'py, PyAny>,
    counts: &Bound<'py, PyAny>,
    field: &Bound<'py, PyAny>,
) -> PyResult<Option<Packed<'py>>> {
    let Some(ids) = read_ids(py, as_list(input_ids, "input_ids")?)? else {
        return Ok(None);
    };
    // A media per anchor, each with at most as many items as the prompt has ids (more would be
    // refused anyway): what is read here is bounded by the prompt.
    let media_count = anchors.len().ok().filter(|&n| n <= ids.len().max(1));
    let (Some(n), Some(field)) = (media_count, field.extract::<u32>().ok()) else {
        return Ok(None);
    };
    let Some(tokens) = ints::<u32>(anchors, n) else {
        return Ok(None);
    };
    let Some(counts) = count_lists(counts, n, ids.len()) else {
        return Ok(None);
    };
    if counts.len() != tokens.len() {
        return Ok(None);
    }
    let media: Vec<Anchor<'_>> = tokens
        .iter()
        .zip(&counts)
        .map(|(&token, counts)| Anchor { token, counts })
        .collect();
    match py.detach(|| expand_runs(&ids, &media, field)) {
        Ok(expanded) => Ok(Some((bytes_of(py, expanded.record())?, expanded.ranges))),
        Err(ExpandError::Refused(_)) => Ok(None),
        Err(ExpandError::OutOfMemory(e)) => Err(memory_error("input_ids", e.bytes)),
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(uint32_list, m)?)?;
    m.add_function(wrap_pyfunction!(packed_prompt, m)?)?;
    Ok(())
}
