//! The one place the extension reads numpy arrays' memory.
//!
//! The buffer protocol is outside the abi3-py310 API, so arrays are read through
//! `__array_interface__`: the data address and read-only flag, with `nbytes`, `shape`, `dtype`
//! and `flags.c_contiguous` from the array itself. Every value is checked before any memory is
//! touched (a numpy array, a non-null address for non-empty data, a size within `isize::MAX`,
//! and for images a length equal to the product of the shape), and the array stays referenced
//! for as long as a slice of its memory exists.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use pyo3::IntoPyObjectExt;

use super::errors::{self, Class};
use crate::tensor::TensorError;

/// The memory of one numpy array, kept alive by the strong reference in `_array`.
pub(crate) struct NumpyArray<'py> {
    _array: Bound<'py, PyAny>,
    addr: usize,
    len: usize,
    pub readonly: bool,
    pub contiguous: bool,
    /// numpy's `dtype.str` (`"<f4"`, `"|u1"`, …).
    pub dtype: String,
    pub shape: Vec<usize>,
}

/// Whether `obj` is a `numpy.ndarray`.
pub(crate) fn is_ndarray(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    static NDARRAY: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    obj.is_instance(NDARRAY.import(obj.py(), "numpy", "ndarray")?)
}

impl<'py> NumpyArray<'py> {
    /// Reads the address, size, flags, dtype and shape of `obj`, which must be a
    /// `numpy.ndarray`: otherwise (or when numpy reports an impossible address) `type_class`
    /// (`TensorTypeError` or `ImageTypeError`, both `TypeError`s) with `field=what`.
    pub fn of(obj: &Bound<'py, PyAny>, what: &str, type_class: Class) -> PyResult<Self> {
        let py = obj.py();
        if !is_ndarray(obj)? {
            let actual = obj.get_type().name()?;
            let message = format!("{what}: expected a numpy.ndarray, got {actual}");
            return Err(errors::raise(
                py,
                type_class,
                &message,
                what,
                "numpy.ndarray",
                actual,
            ));
        }
        // Interned names: no new Python string per call for each attribute looked up.
        let (addr, readonly): (usize, bool) = obj
            .getattr(intern!(py, "__array_interface__"))?
            .get_item(intern!(py, "data"))?
            .extract()?;
        let len: usize = obj.getattr(intern!(py, "nbytes"))?.extract()?;
        if len > 0 && (addr == 0 || isize::try_from(len).is_err()) {
            let message = format!("{what}: array reports {len} bytes at address {addr:#x}");
            // expected: at most isize::MAX bytes at a non-null address; actual: (bytes, address).
            return Err(errors::raise(
                py,
                type_class,
                &message,
                what,
                isize::MAX,
                (len, addr),
            ));
        }
        Ok(NumpyArray {
            _array: obj.clone(),
            addr,
            len,
            readonly,
            contiguous: obj
                .getattr(intern!(py, "flags"))?
                .getattr(intern!(py, "c_contiguous"))?
                .extract()?,
            dtype: obj
                .getattr(intern!(py, "dtype"))?
                .getattr(intern!(py, "str"))?
                .extract()?,
            shape: obj.getattr(intern!(py, "shape"))?.extract()?,
        })
    }

    /// The address of the data (for messages).
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// The size of the data in bytes (`nbytes`).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the two arrays' memory ranges share a byte.
    pub fn overlaps(&self, other: &Self) -> bool {
        self.len > 0
            && other.len > 0
            && self.addr < other.addr.saturating_add(other.len)
            && other.addr < self.addr.saturating_add(self.len)
    }

    /// The array's bytes. Only meaningful as a whole when the array is C-contiguous.
    pub fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: numpy reported `len` (`nbytes`) bytes starting at `addr`
        // (`__array_interface__['data']`), checked non-null and at most `isize::MAX` in `of`.
        // `self._array` holds a strong reference to the array and the slice borrows `self`, so the
        // array (which owns or references its memory) outlives the slice; numpy refuses to
        // reallocate an array that has other references (`resize` refcheck). Another Python
        // thread writing into the array meanwhile only makes the values read unspecified bytes.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    /// The array's bytes, writable; [`TensorError::ReadOnly`] naming `what` when numpy marks it
    /// read-only (only tensor destinations are written).
    ///
    /// The caller must not read another array's memory that overlaps this one while the slice
    /// lives ([`NumpyArray::overlaps`]).
    pub fn bytes_mut(&mut self, what: &'static str) -> Result<&mut [u8], TensorError> {
        if self.readonly {
            return Err(TensorError::ReadOnly { arg: what });
        }
        if self.len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: as in `bytes`, plus: numpy reports the memory writable (checked above), and the
        // slice borrows `self` mutably, so no other slice of this `NumpyArray` exists meanwhile.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) })
    }
}

/// A C-contiguous `uint8` array of shape `(H, W)` or `(H, W, C)`: an image.
pub(crate) struct ImageArray<'py> {
    pub memory: NumpyArray<'py>,
    pub height: usize,
    pub width: usize,
    pub channels: usize,
}

impl<'py> ImageArray<'py> {
    /// Checks `obj` is an image array: `ImageTypeError` (a `TypeError`) for a non-array,
    /// `ImageShapeError` (a `ValueError`) for a wrong dtype, shape, layout or size, each with
    /// `field=what` and the numbers.
    pub fn of(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Self> {
        let py = obj.py();
        let memory = NumpyArray::of(obj, what, Class::ImageType)?;
        let shape_error =
            |message: String, expected: Bound<'py, PyAny>, actual: Bound<'py, PyAny>| {
                errors::raise(py, Class::ImageShape, &message, what, expected, actual)
            };
        if memory.dtype != "|u1" {
            let message = format!("{what}: expected dtype uint8, got {}", memory.dtype);
            return Err(shape_error(
                message,
                "|u1".into_bound_py_any(py)?,
                memory.dtype.as_str().into_bound_py_any(py)?,
            ));
        }
        let shape = &memory.shape;
        let (height, width, channels) = match shape[..] {
            [h, w] => (h, w, 1),
            [h, w, c] => (h, w, c),
            _ => {
                let message = format!(
                    "{what}: expected shape (H, W) or (H, W, C), got {} dimensions {shape:?}",
                    shape.len()
                );
                // expected: the numbers of dimensions taken; actual: the array's.
                return Err(shape_error(
                    message,
                    (2, 3).into_bound_py_any(py)?,
                    shape.len().into_bound_py_any(py)?,
                ));
            }
        };
        if !memory.contiguous {
            let message = format!(
                "{what}: array {shape:?} is not C-contiguous (use numpy.ascontiguousarray)"
            );
            return Err(shape_error(
                message,
                py.None().into_bound(py),
                py.None().into_bound(py),
            ));
        }
        let expected = height
            .checked_mul(width)
            .and_then(|n| n.checked_mul(channels));
        if expected != Some(memory.len()) {
            let message = format!(
                "{what}: array reports {} bytes for shape {shape:?}",
                memory.len()
            );
            let wanted = height as u128 * width as u128 * channels as u128;
            return Err(shape_error(
                message,
                wanted.into_bound_py_any(py)?,
                memory.len().into_bound_py_any(py)?,
            ));
        }
        Ok(ImageArray {
            memory,
            height,
            width,
            channels,
        })
    }

    /// The pixels: `height` rows of `width × channels` bytes.
    pub fn pixels(&self) -> &[u8] {
        self.memory.bytes()
    }
}
