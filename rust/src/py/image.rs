//! Python view of [`crate::image::resample`]: Pillow-exact resizing of numpy `uint8` images.
//!
//! The image is read through [`super::array`] while a strong reference to the array is held;
//! the result is a new
//! `bytearray` (writable, so the numpy view the Python wrapper makes of it is writable too),
//! filled with the GIL released. Every [`ResampleError`] and every bad argument value is raised
//! as `smg_grpc_proto.errors.ResizeError` (a `ValueError`) with its field and numbers, a failed
//! allocation as `ProcessingMemoryError` (also a `MemoryError`; see [`super::errors`]); an
//! image array of the wrong dtype, shape or layout raises `ImageShapeError` (a `ValueError`) and
//! a non-array argument `ImageTypeError` (a `TypeError`), both naming the argument.

use std::mem::MaybeUninit;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyInt};

use super::array::{ImageArray, NumpyArray};
use super::errors::{self, Class};
use crate::image::resample::{self, ImageRef, PassOrder, ResampleError, ResizeOptions};
use crate::image::torch::{self, TorchFilter};
use crate::image::Filter;
use crate::memory::fallible;

/// The Python exception of a [`ResampleError`] (called with the GIL held).
fn value_error(err: ResampleError) -> PyErr {
    Python::attach(|py| errors::resample_error(py, &err))
}

/// A `ResizeError` for a bad argument value: `field` what it expected and got.
fn bad_value<'py>(
    py: Python<'py>,
    message: String,
    field: &str,
    expected: impl IntoPyObject<'py>,
    actual: impl IntoPyObject<'py>,
) -> PyErr {
    errors::raise(py, Class::Resize, &message, field, expected, actual)
}

/// The image of a checked array, as the resampler takes it.
fn image_ref<'a>(array: &'a ImageArray<'_>) -> ImageRef<'a> {
    ImageRef {
        data: array.pixels(),
        width: array.width,
        height: array.height,
        channels: array.channels,
    }
}

/// A new `bytearray` of `len ≥ 1` bytes, zeroed and then filled by `write`, with the GIL
/// released.
///
/// The object is made empty and then resized: when `PyByteArray_FromStringAndSize(NULL, len)`
/// cannot allocate its buffer, CPython (3.10-3.13) frees the half-built object before setting its
/// export count, which prints "SystemError: deallocated bytearray object has exported buffers"
/// and raises a bare `MemoryError`. A failed `PyByteArray_Resize` leaves a valid empty object, and
/// the failure becomes a `MemoryError` naming the bytes.
fn new_bytearray<'py, F>(py: Python<'py>, len: usize, write: F) -> PyResult<Bound<'py, PyByteArray>>
where
    F: FnOnce(&mut [u8]) -> Result<(), ResampleError> + Send,
{
    let size = ffi::Py_ssize_t::try_from(len).map_err(|_| {
        let message = format!("output of {len} bytes is too large");
        bad_value(py, message, "output", isize::MAX, len)
    })?;
    // SAFETY: `PyByteArray_FromStringAndSize(NULL, 0)` allocates no buffer; it returns a new
    // reference to an empty bytearray, or NULL with an exception set, which
    // `from_owned_ptr_or_err` turns into the error. We take ownership of the new reference.
    let array = unsafe {
        Bound::from_owned_ptr_or_err(py, ffi::PyByteArray_FromStringAndSize(std::ptr::null(), 0))?
    }
    .cast_into::<PyByteArray>()?;
    // SAFETY: `array` is a bytearray we own and no one else has seen, so it exports no buffer and
    // may be resized; on failure (-1) it is left empty and valid, with an exception set.
    if unsafe { ffi::PyByteArray_Resize(array.as_ptr(), size) } != 0 {
        return Err(errors::named_memory_error(py, PyErr::fetch(py), || {
            value_error(ResampleError::OutOfMemory {
                what: "output bytearray",
                bytes: len as u64,
            })
        }));
    }
    // SAFETY: `PyByteArray_AsString` returns the object's buffer of `size` bytes (plus a NUL),
    // valid while the object lives and is not resized; `array` holds our reference until we
    // return it, and no Python code sees the object before then, so nothing resizes it and this
    // is the only access. The bytes are uninitialised, hence `MaybeUninit`, until zeroed below.
    let buffer = unsafe {
        let data = ffi::PyByteArray_AsString(array.as_ptr()).cast::<MaybeUninit<u8>>();
        if data.is_null() {
            return Err(PyErr::fetch(py));
        }
        std::slice::from_raw_parts_mut(data, len)
    };
    py.detach(|| {
        buffer.fill(MaybeUninit::new(0));
        // SAFETY: every byte was just initialised, and `MaybeUninit<u8>` has the layout of `u8`.
        let bytes = unsafe { &mut *(buffer as *mut [MaybeUninit<u8>] as *mut [u8]) };
        write(bytes)
    })
    .map_err(value_error)?;
    Ok(array)
}

/// resize(image, width, height, filter, pass_order, region, threads) -> bytearray
/// --
///
/// Pillow 13.0.0's `Image.resize((width, height), filter, box=region, reducing_gap=None)` of a
/// C-contiguous uint8 array `(H, W)` or `(H, W, C)` with C in 1, 3, 4, byte for byte; the
/// result is `height × width × C` bytes. `filter`: nearest, box, bilinear, hamming, bicubic,
/// lanczos. `pass_order`: "pillow13" or "pillow12" (Pillow ≤ 12.2). `threads`: 0 = automatic.
#[pyfunction]
#[pyo3(signature = (image, width, height, filter, pass_order, region, threads))]
#[allow(clippy::too_many_arguments)]
fn resize<'py>(
    py: Python<'py>,
    image: &Bound<'py, PyAny>,
    width: &Bound<'py, PyInt>,
    height: &Bound<'py, PyInt>,
    filter: &str,
    pass_order: &str,
    region: Option<(f64, f64, f64, f64)>,
    threads: usize,
) -> PyResult<Bound<'py, PyByteArray>> {
    let filter = Filter::from_name(filter).ok_or_else(|| {
        let expected = "nearest, box, bilinear, hamming, bicubic or lanczos";
        let message = format!("unknown filter {filter:?}: expected {expected}");
        bad_value(py, message, "filter", expected, filter)
    })?;
    let pass_order = PassOrder::from_name(pass_order).ok_or_else(|| {
        let message =
            format!("unknown pass_order {pass_order:?}: expected \"pillow13\" or \"pillow12\"");
        bad_value(
            py,
            message,
            "pass_order",
            ("pillow13", "pillow12"),
            pass_order,
        )
    })?;
    let (pixels, out_w, out_h, len) = resize_args(image, width, height)?;
    let src = image_ref(&pixels);
    let options = ResizeOptions {
        filter,
        pass_order,
        // Pillow parses the box with "ffff": each coordinate rounded to single precision.
        region: region.map(|(l, t, r, b)| [l as f32, t as f32, r as f32, b as f32]),
        threads,
        simd: true,
    };
    new_bytearray(py, len, |out| {
        resample::resize_into(&src, out, out_w, out_h, &options)
    })
}

/// resize_torch(image, width, height, filter, threads) -> bytearray
/// --
///
/// torch 2.14.1's antialiased uint8 resize on CPU, as `torchvision.transforms.v2.functional.resize(
/// t, [height, width], BILINEAR | BICUBIC, antialias=True)` computes it for the CHW tensor `t` of a
/// C-contiguous uint8 array `(H, W)` or `(H, W, C)`, C in 1, 3, 4; the result is
/// `height × width × C` bytes, interleaved like the input. `filter`: bilinear or bicubic.
#[pyfunction]
#[pyo3(signature = (image, width, height, filter, threads))]
fn resize_torch<'py>(
    py: Python<'py>,
    image: &Bound<'py, PyAny>,
    width: &Bound<'py, PyInt>,
    height: &Bound<'py, PyInt>,
    filter: &str,
    threads: usize,
) -> PyResult<Bound<'py, PyByteArray>> {
    let filter = TorchFilter::from_name(filter).ok_or_else(|| {
        let message = format!(
            "unknown filter {filter:?} for torch's antialiased uint8 resize: expected bilinear, \
             bicubic or lanczos"
        );
        bad_value(
            py,
            message,
            "filter",
            ("bilinear", "bicubic", "lanczos"),
            filter,
        )
    })?;
    let (pixels, out_w, out_h, len) = resize_args(image, width, height)?;
    let src = image_ref(&pixels);
    new_bytearray(py, len, |out| {
        torch::resize_u8(&src, out, out_w, out_h, filter, threads)
    })
}

/// interpolate_bicubic(planes, height, width) -> bytearray
/// --
///
/// `torch.nn.functional.interpolate(x[None], (height, width), mode="bicubic",
/// align_corners=False)[0]` on CPU for a C-contiguous float32 array `x` of shape `(C, H, W)`,
/// bit for bit; the result is the `C × height × width` float32 values' bytes.
#[pyfunction]
#[pyo3(signature = (planes, height, width))]
fn interpolate_bicubic<'py>(
    py: Python<'py>,
    planes: &Bound<'py, PyAny>,
    height: &Bound<'py, PyInt>,
    width: &Bound<'py, PyInt>,
) -> PyResult<Bound<'py, PyByteArray>> {
    let (out_w, out_h) =
        resample::output_size(size_arg(width, "width")?, size_arg(height, "height")?)
            .map_err(value_error)?;
    let array = NumpyArray::of(planes, "planes", Class::ImageType)?;
    let [c, h, w] = array.shape[..] else {
        let message = format!(
            "planes: expected shape (C, H, W), got {} dimensions {:?}",
            array.shape.len(),
            array.shape
        );
        return Err(bad_value(py, message, "planes", 3, array.shape.len()));
    };
    if array.dtype != "<f4" || !array.contiguous {
        let message = format!(
            "planes: expected a C-contiguous float32 array, got dtype {} (C-contiguous: {})",
            array.dtype, array.contiguous
        );
        let actual = (array.dtype.as_str(), array.contiguous);
        return Err(bad_value(py, message, "planes", ("<f4", true), actual));
    }
    for (what, side) in [
        ("input height", h),
        ("input width", w),
        ("height", out_h),
        ("width", out_w),
    ] {
        if side > resample::MAX_SIDE {
            let message = format!(
                "planes: {what} {side} is beyond {} per side",
                resample::MAX_SIDE
            );
            return Err(bad_value(py, message, what, resample::MAX_SIDE, side));
        }
    }
    let len = c
        .checked_mul(out_h)
        .and_then(|n| n.checked_mul(out_w))
        .and_then(|n| n.checked_mul(4))
        .filter(|&n| n <= resample::MAX_BYTES)
        .ok_or_else(|| {
            let message = format!(
                "planes: an output of {c}x{out_h}x{out_w} float32 values is beyond {} bytes",
                resample::MAX_BYTES
            );
            let bytes = c as u128 * out_h as u128 * out_w as u128 * 4;
            bad_value(py, message, "output", resample::MAX_BYTES, bytes)
        })?;
    if len == 0 || h == 0 || w == 0 {
        let message = format!(
            "planes: expected a non-empty (C, H, W) array, got {:?}",
            array.shape
        );
        return Err(bad_value(py, message, "planes", py.None(), &array.shape));
    }
    // numpy does not promise 4-byte alignment, so the values are read byte-wise (one copy, far
    // cheaper than the interpolation).
    let input = array.bytes();
    let values = fallible::collect(
        input.len() / 4,
        input
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    )
    .map_err(|e| value_error(ResampleError::oom("copy of the input planes")(e)))?;
    // The result is allocated before the output object (an abort here used to end the process).
    let mut result = fallible::zeros::<f32>(len / 4)
        .map_err(|e| value_error(ResampleError::oom("interpolated planes")(e)))?;
    new_bytearray(py, len, move |out| {
        torch::bicubic_f32(&values, c, h, w, &mut result, out_h, out_w)?;
        for (dst, v) in out.chunks_exact_mut(4).zip(&result) {
            dst.copy_from_slice(&v.to_le_bytes());
        }
        Ok(())
    })
}

/// The checked image array of a resize, its output width and height, and the output's length.
fn resize_args<'py>(
    image: &Bound<'py, PyAny>,
    width: &Bound<'py, PyInt>,
    height: &Bound<'py, PyInt>,
) -> PyResult<(ImageArray<'py>, usize, usize, usize)> {
    let (out_w, out_h) =
        resample::output_size(size_arg(width, "width")?, size_arg(height, "height")?)
            .map_err(value_error)?;
    let pixels = ImageArray::of(image, "image")?;
    let len = resample::check(&image_ref(&pixels), out_w, out_h).map_err(value_error)?;
    Ok((pixels, out_w, out_h, len))
}

/// A size argument as `i64`; ints beyond it are refused here, naming the value.
fn size_arg(v: &Bound<'_, PyInt>, name: &str) -> PyResult<i64> {
    v.extract::<i64>().map_err(|_| {
        let message = format!(
            "output {name} {v} is out of range (at most {} per side)",
            resample::MAX_SIDE
        );
        bad_value(v.py(), message, name, resample::MAX_SIDE, v)
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(resize, m)?)?;
    m.add_function(wrap_pyfunction!(resize_torch, m)?)?;
    m.add_function(wrap_pyfunction!(interpolate_bicubic, m)?)
}
