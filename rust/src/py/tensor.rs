//! Python view of [`crate::tensor`]: dtype sizes, conversions and the frame codec.
//!
//! numpy arrays are read through [`super::array`]. Each function holds a strong reference to every array it touches for its
//! whole duration, releases the GIL around copies, conversions and parsing, and raises every
//! [`TensorError`] as `smg_grpc_proto.errors.TensorError` (a `ValueError`; `TensorMemoryError`,
//! also a `MemoryError`, for a failed allocation) with its field and numbers (see
//! [`super::errors`]); wrong Python types raise `TensorTypeError` (a `TypeError`).

use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyTuple};

use super::array::NumpyArray;
use super::errors::{self, Class};
use super::processors::PyPendingTensor;
use crate::tensor::convert::{self as core_convert, Conversion};
use crate::tensor::wire::{self, Plan, Source, MAX_DEPTH};
use crate::tensor::{TensorError, WireDtype};

/// The Python exception of a [`TensorError`] (called with the GIL held).
pub(super) fn value_error(err: TensorError) -> PyErr {
    Python::attach(|py| errors::tensor_error(py, &err))
}

/// A `TensorTypeError` about `field`, saying what it got.
fn type_error(message: String, field: &str) -> PyErr {
    Python::attach(|py| errors::raise(py, Class::TensorType, &message, field, py.None(), py.None()))
}

/// A new `bytes` object of `len` bytes, filled by `write` with the GIL released, on `writers`
/// threads (its fresh pages are faulted in by as many first: [`crate::memory::prefault`]).
///
/// `write` gets the object's uninitialised buffer and must return it initialised (the core's
/// `*_uninit` writers do exactly that, so each output byte is written once). `PyBytes::new_with`
/// is not used because it zero-fills the buffer first, holding the GIL: for a fresh 100 MiB
/// output that first touch of the memory is most of the cost, and a second pass besides.
pub(super) fn new_bytes<'py, F>(
    py: Python<'py>,
    len: usize,
    writers: usize,
    write: F,
) -> PyResult<Bound<'py, PyBytes>>
where
    F: for<'b> FnOnce(&'b mut [MaybeUninit<u8>]) -> Result<&'b mut [u8], TensorError> + Send,
{
    if len == 0 {
        return Ok(PyBytes::new(py, &[]));
    }
    let size = ffi::Py_ssize_t::try_from(len).map_err(|_| {
        value_error(TensorError::MessageTooLarge {
            what: "output",
            size: len as u64,
            limit: isize::MAX as u64,
        })
    })?;
    // SAFETY: with a NULL source, `PyBytes_FromStringAndSize` returns a new reference to a
    // fresh bytes object of `size` uninitialised bytes, or NULL with an exception set, which
    // `from_owned_ptr_or_err` turns into the error. We take ownership of the new reference.
    let bytes = unsafe {
        Bound::from_owned_ptr_or_err(py, ffi::PyBytes_FromStringAndSize(std::ptr::null(), size))
    }
    .map_err(|e| {
        errors::named_memory_error(py, e, || {
            value_error(TensorError::OutOfMemory {
                what: "output bytes",
                bytes: len as u64,
            })
        })
    })?
    .cast_into::<PyBytes>()?;
    // SAFETY: `PyBytes_AsString` of a bytes object returns its internal buffer of `size` (+1
    // NUL) bytes, valid while the object lives; `bytes` holds our reference until we return it.
    // The object was created above and no one else has seen it (len > 0, so it is not the
    // shared empty singleton), so this is the only access to the buffer. Its contents are
    // uninitialised, hence `MaybeUninit`.
    let buffer = unsafe {
        let data = ffi::PyBytes_AsString(bytes.as_ptr()).cast::<MaybeUninit<u8>>();
        if data.is_null() {
            return Err(PyErr::fetch(py));
        }
        std::slice::from_raw_parts_mut(data, len)
    };
    // On error the object is dropped unseen, so its unwritten bytes are never read.
    py.detach(|| {
        crate::memory::advise_huge_pages(buffer);
        crate::memory::prefault(buffer, writers);
        write(buffer).map(|written| written.len())
    })
    .map_err(value_error)?;
    Ok(bytes)
}

/// A new `bytes` object holding a copy of `data`: [`new_bytes`], so that a failed allocation
/// is a `TensorMemoryError`, not a panic.
pub(super) fn bytes_of<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    new_bytes(py, data.len(), 1, |out| {
        // SAFETY: `out` has `data.len()` bytes (`new_bytes` made it that long), a fresh buffer
        // that cannot overlap `data`; the copy writes every one of them, after which the
        // `MaybeUninit<u8>` slice is initialised and may be viewed as `[u8]` (same layout).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), out.as_mut_ptr().cast::<u8>(), data.len());
            Ok(&mut *(std::ptr::from_mut(out) as *mut [u8]))
        }
    })
}

/// The memory of the numpy array `array`; a non-array is a `TensorTypeError` about `arg`.
fn numpy_array<'py>(array: &Bound<'py, PyAny>, arg: &str) -> PyResult<NumpyArray<'py>> {
    NumpyArray::of(array, arg, Class::TensorType)
}

/// A tensor source: a C-contiguous numpy array of a dtype we know (little-endian); `error`
/// raises its [`TensorError`]s.
fn source<'py>(
    array: &Bound<'py, PyAny>,
    arg: &'static str,
    error: impl Fn(TensorError) -> PyErr,
) -> PyResult<(NumpyArray<'py>, WireDtype)> {
    let memory = numpy_array(array, arg)?;
    let dtype = WireDtype::from_numpy_str(&memory.dtype, arg).map_err(&error)?;
    if !memory.contiguous {
        return Err(error(TensorError::NotContiguous { arg }));
    }
    Ok((memory, dtype))
}

/// A destination: a writable, C-contiguous `uint8` numpy array.
fn destination<'py>(array: &Bound<'py, PyAny>, arg: &'static str) -> PyResult<NumpyArray<'py>> {
    let memory = numpy_array(array, arg)?;
    if memory.dtype != "|u1" {
        return Err(value_error(TensorError::DestinationDtype {
            numpy: memory.dtype,
        }));
    }
    if !memory.contiguous {
        return Err(value_error(TensorError::NotContiguous { arg }));
    }
    if memory.readonly {
        return Err(value_error(TensorError::ReadOnly { arg }));
    }
    Ok(memory)
}

/// Plans already converted, with the Python object each came from (held, so it stays alive and
/// its address is never reused for another object while it is here). A message type's plan is
/// one cached tuple on the Python side, so each call finds its plan here by address instead of
/// walking the tuples again (microseconds per call, most of a small message's cost).
static PLANS: Mutex<Vec<(Py<PyAny>, Arc<Plan>)>> = Mutex::new(Vec::new());
/// The most plans kept (one per message type in use; the oldest goes first).
const MAX_CACHED_PLANS: usize = 64;

/// [`plan_from_py`] of `obj`, converted once per tuple object. Only immutable objects (tuples
/// and ints, all a valid plan is made of) are kept, so a cached conversion never goes stale.
fn cached_plan(obj: &Bound<'_, PyAny>) -> PyResult<Arc<Plan>> {
    let mut plans = PLANS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, plan)) = plans.iter().find(|(o, _)| o.as_ptr() == obj.as_ptr()) {
        return Ok(Arc::clone(plan));
    }
    let plan = Arc::new(plan_from_py(obj, "plan", 0)?);
    if plans.len() >= MAX_CACHED_PLANS {
        plans.remove(0);
    }
    plans.push((obj.clone().unbind(), Arc::clone(&plan)));
    Ok(plan)
}

/// Converts a plan of nested tuples: `((field, child), ...)` or an int (a `TensorData` whose
/// payload is that field).
fn plan_from_py(obj: &Bound<'_, PyAny>, path: &str, depth: usize) -> PyResult<Plan> {
    if depth > MAX_DEPTH {
        return Err(value_error(TensorError::PlanTooDeep { max: MAX_DEPTH }));
    }
    if let Ok(number) = obj.cast::<PyInt>() {
        return Ok(Plan::Tensor(field_number(number, path)?));
    }
    let Ok(fields) = obj.cast::<PyTuple>() else {
        return Err(type_error(
            format!(
                "{path}: expected a tuple of (field_number, child) pairs or an int, got {}",
                obj.get_type().name()?
            ),
            path,
        ));
    };
    let mut plan = Vec::with_capacity(fields.len());
    for (i, pair) in fields.iter().enumerate() {
        let item = format!("{path}[{i}]");
        let pair = pair
            .cast::<PyTuple>()
            .ok()
            .filter(|p| p.len() == 2)
            .ok_or_else(|| {
                type_error(
                    format!("{item}: expected a (field_number, child) pair"),
                    &item,
                )
            })?;
        let number = pair.get_item(0)?;
        let number = number.cast::<PyInt>().map_err(|_| {
            type_error(
                format!("{item}[0]: field number must be an int"),
                &format!("{item}[0]"),
            )
        })?;
        let number = field_number(number, &format!("{item}[0]"))?;
        let child = plan_from_py(&pair.get_item(1)?, &format!("{item}[1]"), depth + 1)?;
        plan.push((number, child));
    }
    Ok(Plan::Message(plan))
}

/// `obj` as `bytes`, or a `TensorTypeError` naming the argument.
fn bytes_arg<'a, 'py>(obj: &'a Bound<'py, PyAny>, arg: &str) -> PyResult<&'a Bound<'py, PyBytes>> {
    obj.cast::<PyBytes>()
        .map_err(|_| expected("bytes", obj, arg))
}

/// The `TensorTypeError` of argument `arg`, which should have been `what`: `obj`'s type named.
pub(super) fn expected(what: &str, obj: &Bound<'_, PyAny>, arg: &str) -> PyErr {
    let got = obj
        .get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string());
    type_error(format!("{arg}: expected {what}, got {got}"), arg)
}

/// The exception of a [`TensorError`] about `sources[i]`: the message and the field say so.
fn in_source(py: Python<'_>, i: usize) -> impl Fn(TensorError) -> PyErr + '_ {
    move |err| errors::tensor_error_in(py, &err, Some(&format!("sources[{i}]")))
}

/// A `TypeError` about `sources[i]` (from reading its array) as a `TensorTypeError` whose
/// message and field say so; any other error unchanged.
fn type_in_source(py: Python<'_>, i: usize, err: PyErr) -> PyErr {
    if err.is_instance_of::<PyTypeError>(py) {
        let field = format!("sources[{i}]");
        type_error(format!("{field}: {}", err.value(py)), &field)
    } else {
        err
    }
}

fn field_number(number: &Bound<'_, PyInt>, path: &str) -> PyResult<u32> {
    let invalid = || {
        value_error(TensorError::PlanFieldNumber {
            path: path.to_owned(),
            value: number.to_string(),
        })
    };
    let value: i64 = number.extract().map_err(|_| invalid())?;
    Plan::field_number(value, path).map_err(value_error)
}

/// dtype_itemsize(name: str) -> int
/// --
///
/// Bytes per element of a wire dtype; `ValueError` for names outside the vocabulary.
#[pyfunction]
fn dtype_itemsize(name: &str) -> PyResult<usize> {
    WireDtype::from_name(name, "name")
        .map(WireDtype::itemsize)
        .map_err(value_error)
}

/// convert(src, wire_dtype) -> bytes
/// --
///
/// The bytes of `src` (a C-contiguous little-endian numpy array) converted to `wire_dtype`.
#[pyfunction]
fn convert<'py>(
    py: Python<'py>,
    src: &Bound<'py, PyAny>,
    wire_dtype: &str,
) -> PyResult<Bound<'py, PyBytes>> {
    let (memory, from) = source(src, "src", value_error)?;
    let to = WireDtype::from_name(wire_dtype, "wire_dtype").map_err(value_error)?;
    let conversion = Conversion::new(from, to).map_err(value_error)?;
    let len = conversion
        .output_len(memory.len(), "src")
        .map_err(value_error)?;
    let bytes = memory.bytes();
    let writers = core_convert::default_threads(bytes.len());
    new_bytes(py, len, writers, |out| {
        core_convert::convert_into_uninit(bytes, from, out, to)
    })
}

/// convert_into(src, dst, wire_dtype) -> None
/// --
///
/// Like `convert`, written into `dst`: a writable C-contiguous uint8 array of exactly the
/// converted size.
#[pyfunction]
fn convert_into(
    py: Python<'_>,
    src: &Bound<'_, PyAny>,
    dst: &Bound<'_, PyAny>,
    wire_dtype: &str,
) -> PyResult<()> {
    let to = WireDtype::from_name(wire_dtype, "wire_dtype").map_err(value_error)?;
    if let Ok(pending) = src.cast::<PyPendingTensor>() {
        let pending = pending.get();
        check_pending(pending, to, None)?;
        let mut destination = destination(dst, "dst")?;
        let output = core_convert::as_uninit(destination.bytes_mut("dst").map_err(value_error)?);
        let source = Source::produced(pending.producer(), to).map_err(value_error)?;
        return py
            .detach(|| {
                // A fresh shared-memory segment, typically: its pages mapped before the writers
                // come (contents unchanged; every byte is overwritten next).
                crate::memory::prefault(output, source.writers());
                source.write(output)
            })
            .map_err(value_error);
    }
    let (source, from) = source(src, "src", value_error)?;
    let mut destination = destination(dst, "dst")?;
    if source.overlaps(&destination) {
        return Err(value_error(TensorError::Overlap {
            src: source.addr(),
            src_len: source.len(),
            dst: destination.addr(),
            dst_len: destination.len(),
        }));
    }
    let input = source.bytes();
    let output = destination.bytes_mut("dst").map_err(value_error)?;
    py.detach(|| {
        crate::memory::prefault(output, core_convert::default_threads(input.len()));
        core_convert::convert_into(input, from, output, to)
    })
    .map_err(value_error)
}

/// One source of `encode_frames`, held for the call.
enum Item<'py> {
    Memory(NumpyArray<'py>, WireDtype, WireDtype),
    Pending(Bound<'py, PyPendingTensor>, WireDtype),
}

/// A pending tensor goes on the wire as it is written: `float32`, or `bfloat16` (the same
/// values rounded); a constant one as `int64`. `context` names the source (`"sources[2]"`) in
/// the message and the field.
fn check_pending(pending: &PyPendingTensor, to: WireDtype, context: Option<&str>) -> PyResult<()> {
    if pending.producer().wire_len(to).is_none() {
        let message = format!(
            "a PendingTensor ({}) is written as {}, not {}; materialize() it to convert",
            pending.name(),
            pending.wire_dtypes(),
            to.name()
        );
        let (message, field) = match context {
            Some(context) => (
                format!("{context}: {message}"),
                format!("{context}.wire_dtype"),
            ),
            None => (message, "wire_dtype".to_owned()),
        };
        return Err(Python::attach(|py| {
            errors::raise(py, Class::Tensor, &message, &field, "float32", to.name())
        }));
    }
    Ok(())
}

/// The header and the payload spans `(offset, length)` returned by `decode_frames`.
type Decoded<'py> = (Bound<'py, PyBytes>, Vec<(usize, usize)>);

/// decode_frames(data, plan, nonce) -> tuple[bytes, list[tuple[int, int]]]
/// --
///
/// Splits a serialized message into a header whose tensor payloads are tokens
/// (`nonce + u32_le(i)`) and the `(offset, length)` of each payload within `data`.
#[pyfunction]
fn decode_frames<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    plan: &Bound<'py, PyAny>,
    nonce: &Bound<'py, PyAny>,
) -> PyResult<Decoded<'py>> {
    let (data, nonce) = (bytes_arg(data, "data")?, bytes_arg(nonce, "nonce")?);
    let plan = cached_plan(plan)?;
    let (data, nonce) = (data.as_bytes(), nonce.as_bytes());
    let layout = py
        .detach(|| wire::decode_frames(data, &plan, nonce))
        .map_err(value_error)?;
    let header = new_bytes(py, layout.len(), layout.writers(), |out| {
        layout.write_into_uninit(out)
    })?;
    Ok((header, layout.spans().to_vec()))
}

/// uint32_varints(values) -> bytes
/// --
///
/// The minimal varints of `values` (bytes of little-endian uint32s) one after the other: the
/// payload of a packed `repeated uint32` field (a request's token ids) for protobuf to parse,
/// instead of one Python int per id. `TensorError` (`field="values"`) when `values` is not a
/// whole number of 4-byte items.
#[pyfunction]
fn uint32_varints<'py>(
    py: Python<'py>,
    values: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let values = bytes_arg(values, "values")?;
    let out = wire::uint32_varints(values.as_bytes()).map_err(value_error)?;
    bytes_of(py, &out)
}

/// encode_frames(header, plan, nonce, sources) -> bytes
/// --
///
/// Replaces every token `nonce + u32_le(i)` in the tensor payloads of `header` by the bytes
/// of `sources[i] = (array, wire_dtype)`, converted, in one pass over each tensor.
#[pyfunction]
fn encode_frames<'py>(
    py: Python<'py>,
    header: &Bound<'py, PyAny>,
    plan: &Bound<'py, PyAny>,
    nonce: &Bound<'py, PyAny>,
    sources: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let (header, nonce) = (bytes_arg(header, "header")?, bytes_arg(nonce, "nonce")?);
    let plan = cached_plan(plan)?;
    let items: Vec<Bound<'py, PyAny>> = if let Ok(list) = sources.cast::<pyo3::types::PyList>() {
        list.iter().collect()
    } else if let Ok(tuple) = sources.cast::<PyTuple>() {
        tuple.iter().collect()
    } else {
        return Err(type_error(
            format!(
                "sources: expected a list of (ndarray, wire_dtype) tuples, got {}",
                sources.get_type().name()?
            ),
            "sources",
        ));
    };
    let mut arrays = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let pair = item
            .cast::<PyTuple>()
            .ok()
            .filter(|p| p.len() == 2)
            .ok_or_else(|| {
                type_error(
                    format!(
                        "sources[{i}]: expected an (ndarray or PendingTensor, wire_dtype) tuple"
                    ),
                    &format!("sources[{i}]"),
                )
            })?;
        let name: String = pair.get_item(1)?.extract().map_err(|_| {
            type_error(
                format!("sources[{i}]: wire_dtype must be a str"),
                &format!("sources[{i}].wire_dtype"),
            )
        })?;
        let to = WireDtype::from_name(&name, "wire_dtype").map_err(in_source(py, i))?;
        let first = pair.get_item(0)?;
        if let Ok(pending) = first.cast::<PyPendingTensor>() {
            check_pending(pending.get(), to, Some(&format!("sources[{i}]")))?;
            arrays.push(Item::Pending(pending.clone(), to));
            continue;
        }
        let (memory, from) =
            source(&first, "array", in_source(py, i)).map_err(|e| type_in_source(py, i, e))?;
        arrays.push(Item::Memory(memory, from, to));
    }
    let mut tensors = Vec::with_capacity(arrays.len());
    for (i, item) in arrays.iter().enumerate() {
        let source = match item {
            Item::Memory(memory, from, to) => {
                Source::new(memory.bytes(), *from, *to).map_err(in_source(py, i))?
            }
            Item::Pending(pending, to) => {
                Source::produced(pending.get().producer(), *to).map_err(in_source(py, i))?
            }
        };
        tensors.push(source);
    }
    let (header, nonce) = (header.as_bytes(), nonce.as_bytes());
    let layout = py
        .detach(|| wire::encode_frames(header, &plan, nonce, &tensors))
        .map_err(value_error)?;
    new_bytes(py, layout.len(), layout.writers(), |out| {
        layout.write_into_uninit(out)
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(dtype_itemsize, m)?)?;
    m.add_function(wrap_pyfunction!(convert, m)?)?;
    m.add_function(wrap_pyfunction!(convert_into, m)?)?;
    m.add_function(wrap_pyfunction!(decode_frames, m)?)?;
    m.add_function(wrap_pyfunction!(uint32_varints, m)?)?;
    m.add_function(wrap_pyfunction!(encode_frames, m)?)?;
    Ok(())
}
