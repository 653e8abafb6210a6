//! Python view of [`crate::image::decode`]: bytes in, an RGB pixel buffer numpy can wrap out.
//!
//! The input is read through `bytes` (the buffer protocol is outside the abi3-py310 API; the
//! Python wrapper turns bytearray, memoryview and paths into `bytes`). Decoding runs with the
//! GIL released; the `bytes` object is immutable and our reference keeps it alive meanwhile.
//! Every [`DecodeError`] is raised as the `smg_grpc_proto.errors.ImageDecodeError` subclass of
//! its kind, with its field, numbers and format (see [`super::errors`]). A bad `alpha` or
//! `max_pixels` is a caller's mistake, not a failure to decode: `ProcessorConfigError` (a
//! `ValueError`, like the processors' own bad `alpha`) or, for a `max_pixels` that is not an int,
//! `ImageTypeError` (a `TypeError`), which a handler of bad images (`except ImageDecodeError`)
//! does not swallow.

use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyInt};

use super::errors::{self, Class};

use crate::image::decode::{self as core, AlphaMode, DecodeError, DecodeOptions};

/// The pixels of one decoded image, exposed to numpy through `__array_interface__` (zero copy).
///
/// The buffer is a leaked `Vec<u8>` owned by this object: Rust keeps only its raw parts and never
/// reads or references the memory again (numpy may write to it), and frees it when the object
/// is collected, which numpy delays for as long as any array viewing it is alive (the array's
/// `base` holds a reference to this object).
#[pyclass(module = "smg_grpc_proto._native", name = "DecodedImage", frozen)]
struct PyDecodedImage {
    ptr: *mut u8,
    len: usize,
    capacity: usize,
    height: u32,
    width: u32,
}

// SAFETY: the object owns its buffer outright (no other owner exists); moving it to another
// thread moves that ownership. Concurrent access goes through numpy, which the GIL serialises.
unsafe impl Send for PyDecodedImage {}
// SAFETY: `&PyDecodedImage` only reads the pointer value and sizes, never the buffer.
unsafe impl Sync for PyDecodedImage {}

impl PyDecodedImage {
    fn new(pixels: Vec<u8>, height: u32, width: u32) -> Self {
        let mut pixels = std::mem::ManuallyDrop::new(pixels);
        Self {
            ptr: pixels.as_mut_ptr(),
            len: pixels.len(),
            capacity: pixels.capacity(),
            height,
            width,
        }
    }
}

impl Drop for PyDecodedImage {
    fn drop(&mut self) {
        // SAFETY: the raw parts come from a `Vec<u8>` that was leaked in `new` and is rebuilt
        // exactly once, here; no array can view the buffer any more (each holds a reference).
        let pixels = unsafe { Vec::from_raw_parts(self.ptr, self.len, self.capacity) };
        // Large buffers are kept for the next decode (see `memory::recycle`).
        crate::memory::recycle::give_u8(pixels);
    }
}

#[pymethods]
impl PyDecodedImage {
    #[getter]
    fn height(&self) -> u32 {
        self.height
    }

    #[getter]
    fn width(&self) -> u32 {
        self.width
    }

    /// numpy's array interface (version 3): C-contiguous `(height, width, 3)` uint8, writable.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        out.set_item("version", 3)?;
        out.set_item("shape", (self.height, self.width, 3))?;
        out.set_item("typestr", "|u1")?;
        out.set_item("data", (self.ptr as usize, false))?;
        Ok(out)
    }
}

/// `max_pixels` as a `u64`: an int out of range (negative, or past 2**64 - 1) is a
/// `ProcessorConfigError` naming the argument and its range instead of a bare `OverflowError`;
/// a non-int is an `ImageTypeError`.
fn max_pixels_arg(value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    let Some(value) = value else {
        return Ok(None);
    };
    let py = value.py();
    if value.cast::<PyInt>().is_err() {
        let got = value.get_type().name()?.to_string();
        let message = format!("max_pixels must be an int or None, got {got}");
        let expected = "int or None";
        return Err(errors::raise(
            py,
            Class::ImageType,
            &message,
            "max_pixels",
            expected,
            got,
        ));
    }
    match value.extract::<u64>() {
        Ok(n) => Ok(Some(n)),
        Err(err) if err.is_instance_of::<PyOverflowError>(py) => {
            let message = format!(
                "max_pixels must be between 0 and {} (2**64 - 1) or None, got {}",
                u64::MAX,
                value.repr()?
            );
            let expected = (0, u64::MAX);
            Err(errors::raise(
                py,
                Class::ProcessorConfig,
                &message,
                "max_pixels",
                expected,
                value,
            ))
        }
        Err(err) => Err(err),
    }
}

/// decode_image(data, apply_exif, max_pixels, alpha, threads=1) -> DecodedImage
/// --
///
/// Decodes a JPEG, PNG, GIF, BMP or WebP file to RGB: an object with `height`, `width` and an
/// `__array_interface__` for `numpy.asarray` (`height × width × 3` uint8, no copy). `alpha` is
/// "white" (composite onto white) or "drop"; `threads` the threads the decode may use (0: one
/// per core).
#[pyfunction]
#[pyo3(signature = (data, apply_exif, max_pixels, alpha, threads = 1))]
fn decode_image(
    py: Python<'_>,
    data: &Bound<'_, PyBytes>,
    apply_exif: bool,
    max_pixels: Option<&Bound<'_, PyAny>>,
    alpha: &str,
    threads: usize,
) -> PyResult<PyDecodedImage> {
    let max_pixels = max_pixels_arg(max_pixels)?;
    let alpha = match alpha {
        "white" => AlphaMode::White,
        "drop" => AlphaMode::Drop,
        other => {
            let message = format!("alpha must be 'white' or 'drop', got {other:?}");
            let expected = ("white", "drop");
            return Err(errors::raise(
                py,
                Class::ProcessorConfig,
                &message,
                "alpha",
                expected,
                other,
            ));
        }
    };
    let options = DecodeOptions {
        apply_exif,
        max_pixels,
        alpha,
        threads,
    };
    let input = data.as_bytes();
    let image = py
        .detach(|| core::decode(input, &options))
        .map_err(|err| errors::decode_error(py, &err))?;
    Ok(PyDecodedImage::new(image.pixels, image.height, image.width))
}

/// image_format(data) -> str | None
/// --
///
/// The format `decode_image` recognises from the signature at the start of `data` (the first
/// 16 bytes are all any signature needs), lower-case (`"jpeg"`, `"png"`, `"gif"`, `"bmp"`,
/// `"webp"`), or None; nothing is decoded.
#[pyfunction]
fn image_format(data: &Bound<'_, PyBytes>) -> Option<String> {
    core::sniff(data.as_bytes()).map(|format| format.name().to_ascii_lowercase())
}

/// jpeg_huffman_stats() -> dict[str, int]
/// --
///
/// JPEG scans whose Huffman decoding the Rust decoder took since the process started:
/// `inline` (on the calling thread), `helper` (on a helper thread), `shared` (of those, with
/// the calling thread decoding some restart intervals too), `progressive` (scans of progressive
/// files, on the calling thread), `progressive_rows` (calls that decoded the rest of a block
/// row of a progressive scan of one component), `resumed` (images where libjpeg-turbo took a
/// scan over at the MCU where the Rust decoder stopped on an anomaly, decoding only the rest of
/// that scan) and `retried` (images given back to libjpeg-turbo on an anomaly where it could
/// not: decoded again by libjpeg alone).
#[pyfunction]
fn jpeg_huffman_stats() -> std::collections::HashMap<&'static str, u64> {
    crate::image::decode::jpeg::huffman_stats()
        .into_iter()
        .collect()
}

/// png_inflate_stats() -> dict[str, int]
/// --
///
/// PNG images since the process started whose image data our inflate took (`ours`: a whole,
/// valid stream filling the image, of at least 2 KiB compressed), and those left to zlib-rs
/// (`zlib`).
#[pyfunction]
fn png_inflate_stats() -> std::collections::HashMap<&'static str, u64> {
    crate::image::decode::png::inflate_stats()
        .into_iter()
        .collect()
}

/// decode_error_kinds() -> list[str]
/// --
///
/// The `kind` of every decoding failure, one per Rust error variant, in declaration order.
#[pyfunction]
fn decode_error_kinds() -> Vec<&'static str> {
    DecodeError::KINDS.to_vec()
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("DEFAULT_MAX_PIXELS", core::DEFAULT_MAX_PIXELS)?;
    m.add_class::<PyDecodedImage>()?;
    m.add_function(wrap_pyfunction!(decode_image, m)?)?;
    m.add_function(wrap_pyfunction!(image_format, m)?)?;
    m.add_function(wrap_pyfunction!(jpeg_huffman_stats, m)?)?;
    m.add_function(wrap_pyfunction!(png_inflate_stats, m)?)?;
    m.add_function(wrap_pyfunction!(decode_error_kinds, m)?)
}
