//! The one error protocol at the boundary: every native error enum becomes an instance of a
//! class of `smg_grpc_proto.errors`, built with keyword arguments (`field=`, `expected=`,
//! `actual=`, and `offset=`, `format=` or `index=` where the class takes them), so Python never
//! re-parses a message or a tuple.
//!
//! Each enum maps to one family of classes: [`TensorError`] to `TensorError` (allocation
//! failures to `TensorMemoryError`), [`DecodeError`] to the `ImageDecodeError` subclass of its
//! kind, [`ProcessorError`] to the `ImageProcessingError` subclass of its kind (a decoding
//! failure inside a batch to the decode class), [`ResampleError`] to `ResizeError` (allocation
//! failures to `ProcessingMemoryError`). The classes are imported once per interpreter and kept.
//!
//! `_native._error_samples()` returns one converted instance of every variant of every enum, so
//! the Python tests can check each class and its fields. The variant names come from exhaustive
//! matches (`variant_names!`, and the `kind()` of `DecodeError` and `ProcessorError`), so a new
//! variant does not compile until it is named, and `_error_samples` raises while a named variant
//! has no sample.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyInt, PyList, PyType};
use pyo3::IntoPyObjectExt;

use crate::image::decode::{DecodeError, Format};
use crate::image::resample::{self, ResampleError};
use crate::processors::ProcessorError;
use crate::tensor::wire::{MAX_DEPTH, MAX_FIELD_NUMBER, MAX_TENSORS, NONCE_LEN};
use crate::tensor::{TensorError, WireDtype};

/// The classes of `smg_grpc_proto.errors` raised from Rust.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    Tensor,
    TensorMemory,
    TensorType,
    UnknownImageFormat,
    UnsupportedImage,
    TruncatedImage,
    CorruptImage,
    EmptyImage,
    ImageTooLarge,
    ImageMemory,
    ImageType,
    AspectRatio,
    ProcessorConfig,
    ImageShape,
    ProcessingLimit,
    ProcessingMemory,
    VideoShape,
    BatchShape,
    Resize,
}

const CLASSES: usize = 19;
// `Resize` is the last class: every `Class as usize` indexes `TYPES`.
const _: () = assert!(Class::Resize as usize + 1 == CLASSES);

/// The imported type objects, one cell per [`Class`].
static TYPES: [PyOnceLock<Py<PyType>>; CLASSES] = [const { PyOnceLock::new() }; CLASSES];

impl Class {
    fn name(self) -> &'static str {
        match self {
            Self::Tensor => "TensorError",
            Self::TensorMemory => "TensorMemoryError",
            Self::TensorType => "TensorTypeError",
            Self::UnknownImageFormat => "UnknownImageFormatError",
            Self::UnsupportedImage => "UnsupportedImageError",
            Self::TruncatedImage => "TruncatedImageError",
            Self::CorruptImage => "CorruptImageError",
            Self::EmptyImage => "EmptyImageError",
            Self::ImageTooLarge => "ImageTooLargeError",
            Self::ImageMemory => "ImageMemoryError",
            Self::ImageType => "ImageTypeError",
            Self::AspectRatio => "AspectRatioError",
            Self::ProcessorConfig => "ProcessorConfigError",
            Self::ImageShape => "ImageShapeError",
            Self::ProcessingLimit => "ProcessingLimitError",
            Self::ProcessingMemory => "ProcessingMemoryError",
            Self::VideoShape => "VideoShapeError",
            Self::BatchShape => "BatchShapeError",
            Self::Resize => "ResizeError",
        }
    }

    fn get(self, py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
        TYPES[self as usize].import(py, "smg_grpc_proto.errors", self.name())
    }
}

/// A Python value for a keyword argument.
fn val<'py>(py: Python<'py>, value: impl IntoPyObject<'py>) -> PyResult<Bound<'py, PyAny>> {
    value.into_bound_py_any(py)
}

/// The keyword arguments of one exception, besides its message.
struct Fields<'py> {
    class: Class,
    field: String,
    expected: Bound<'py, PyAny>,
    actual: Bound<'py, PyAny>,
    /// `offset=`, `format=` or `index=`, for the classes that take one.
    extra: Option<(&'static str, Bound<'py, PyAny>)>,
}

impl<'py> Fields<'py> {
    fn new(
        py: Python<'py>,
        class: Class,
        field: impl Into<String>,
        expected: impl IntoPyObject<'py>,
        actual: impl IntoPyObject<'py>,
    ) -> PyResult<Self> {
        Ok(Self {
            class,
            field: field.into(),
            expected: val(py, expected)?,
            actual: val(py, actual)?,
            extra: None,
        })
    }

    fn with(mut self, key: &'static str, value: Bound<'py, PyAny>) -> Self {
        self.extra = Some((key, value));
        self
    }

    /// The exception, `class(message, field=..., expected=..., actual=..., <extra>=...)`.
    fn raise(self, message: &str) -> PyResult<PyErr> {
        let py = self.expected.py();
        let kwargs = PyDict::new(py);
        kwargs.set_item("field", self.field)?;
        kwargs.set_item("expected", self.expected)?;
        kwargs.set_item("actual", self.actual)?;
        if let Some((key, value)) = self.extra {
            kwargs.set_item(key, value)?;
        }
        let exc = self.class.get(py)?.call((message,), Some(&kwargs))?;
        Ok(PyErr::from_value(exc))
    }
}

/// The error itself, or the error met while building it (a failed import, say).
fn flatten(made: PyResult<PyErr>) -> PyErr {
    made.unwrap_or_else(|e| e)
}

/// An `smg_grpc_proto.errors` exception built from its parts, for errors the py layer detects
/// itself (argument checks) rather than a core enum.
pub(crate) fn raise<'py>(
    py: Python<'py>,
    class: Class,
    message: &str,
    field: &str,
    expected: impl IntoPyObject<'py>,
    actual: impl IntoPyObject<'py>,
) -> PyErr {
    flatten(Fields::new(py, class, field, expected, actual).and_then(|f| f.raise(message)))
}

/// `MemoryError` raised by CPython for an allocation of a Python object (a bare
/// `MemoryError()`) replaced by `replacement`, which names the bytes and their use; any other
/// error is returned unchanged.
pub(crate) fn named_memory_error(
    py: Python<'_>,
    err: PyErr,
    replacement: impl FnOnce() -> PyErr,
) -> PyErr {
    if err.is_instance_of::<pyo3::exceptions::PyMemoryError>(py) {
        replacement()
    } else {
        err
    }
}

// ---------------------------------------------------------------------------- tensors

/// A [`TensorError`] as `TensorError` (`TensorMemoryError` for a failed allocation).
pub(crate) fn tensor_error(py: Python<'_>, err: &TensorError) -> PyErr {
    tensor_error_in(py, err, None)
}

/// Like [`tensor_error`], for an error about one element of a list argument: `context`
/// (`"sources[2]"`) prefixes the message (`"sources[2]: ..."`) and the field
/// (`"sources[2].array"`).
pub(crate) fn tensor_error_in(py: Python<'_>, err: &TensorError, context: Option<&str>) -> PyErr {
    flatten(tensor_fields(py, err).and_then(|mut fields| match context {
        None => fields.raise(&err.to_string()),
        Some(context) => {
            fields.field = format!("{context}.{}", fields.field);
            fields.raise(&format!("{context}: {err}"))
        }
    }))
}

fn tensor_fields<'py>(py: Python<'py>, err: &TensorError) -> PyResult<Fields<'py>> {
    use TensorError::*;
    let none = || py.None();
    let tensor = Class::Tensor;
    // Wire-format errors: the input parsed, and the byte where the offending record starts.
    let wire = |input: &str, offset: usize, expected: Py<PyAny>, actual: Py<PyAny>| {
        PyResult::Ok(
            Fields::new(py, tensor, input, expected, actual)?.with("offset", val(py, offset)?),
        )
    };
    match err {
        UnknownDtype { arg, name } => {
            let names: Vec<&str> = WireDtype::ALL.iter().map(|d| d.name()).collect();
            Fields::new(py, tensor, *arg, names, name)
        }
        UnsupportedSourceDtype { arg, numpy } => Fields::new(
            py,
            tensor,
            *arg,
            ["<f4", "<f2", "<u2", "<i8", "<u4", "|u1"],
            numpy,
        ),
        UnsupportedConversion { from, to } => {
            Fields::new(py, tensor, "wire_dtype", from.name(), to.name())
        }
        ShapeOverflow { shape, itemsize } => Fields::new(
            py,
            tensor,
            "shape",
            usize::MAX,
            shape
                .iter()
                .fold(*itemsize as u128, |n, &d| n.saturating_mul(u128::from(d))),
        ),
        PartialItem { arg, len, itemsize } => Fields::new(py, tensor, *arg, *itemsize, *len),
        DestinationSize { expected, actual } => Fields::new(py, tensor, "dst", *expected, *actual),
        NotContiguous { arg } | ReadOnly { arg } => Fields::new(py, tensor, *arg, none(), none()),
        DestinationDtype { numpy } => Fields::new(py, tensor, "dst", "|u1", numpy),
        Overlap {
            src,
            src_len,
            dst,
            dst_len,
        } => Fields::new(py, tensor, "dst", (*src, *src_len), (*dst, *dst_len)),
        NonceLength { len } => Fields::new(py, tensor, "nonce", NONCE_LEN, *len),
        PlanFieldNumber { path, value } => {
            // `value` is the caller's int, written out: given back as that int.
            let number = py
                .get_type::<PyInt>()
                .call1((value.as_str(),))
                .or_else(|_| val(py, value))?;
            Fields::new(py, tensor, path.as_str(), MAX_FIELD_NUMBER, number)
        }
        PlanDuplicateField { path, field } => {
            Fields::new(py, tensor, path.as_str(), none(), *field)
        }
        PlanTooDeep { max } => Fields::new(py, tensor, "plan", *max, none()),
        VarintTruncated { input, offset } | VarintTooLong { input, offset } => {
            wire(input, *offset, none(), none())
        }
        FieldNumberZero { input, offset } => wire(input, *offset, none(), val(py, 0)?.unbind()),
        FieldNumberTooLarge {
            input,
            offset,
            field,
        } => wire(
            input,
            *offset,
            val(py, MAX_FIELD_NUMBER)?.unbind(),
            val(py, *field)?.unbind(),
        ),
        GroupWireType {
            input,
            offset,
            wire_type,
            ..
        }
        | InvalidWireType {
            input,
            offset,
            wire_type,
            ..
        } => wire(input, *offset, none(), val(py, *wire_type)?.unbind()),
        FixedTruncated {
            input,
            offset,
            needed,
            available,
            ..
        } => wire(
            input,
            *offset,
            val(py, *needed)?.unbind(),
            val(py, *available)?.unbind(),
        ),
        LengthTruncated {
            input,
            offset,
            length,
            available,
            ..
        } => wire(
            input,
            *offset,
            val(py, *length)?.unbind(),
            val(py, *available)?.unbind(),
        ),
        MessageTooLarge { what, size, limit } => Fields::new(py, tensor, *what, *limit, *size),
        TooManyTensors { max } => Fields::new(py, tensor, "data", *max, *max + 1),
        TokenIndexOutOfRange {
            offset,
            index,
            count,
        } => wire(
            "header",
            *offset,
            val(py, *count)?.unbind(),
            val(py, *index)?.unbind(),
        ),
        OutOfMemory { what, bytes } => Fields::new(py, Class::TensorMemory, *what, none(), *bytes),
    }
}

// ---------------------------------------------------------------------------- decoding

/// A [`DecodeError`] as the `ImageDecodeError` subclass of its kind.
pub(crate) fn decode_error(py: Python<'_>, err: &DecodeError) -> PyErr {
    flatten(decode_fields(py, err).and_then(|f| f.raise(&err.to_string())))
}

fn decode_fields<'py>(py: Python<'py>, err: &DecodeError) -> PyResult<Fields<'py>> {
    let none = || py.None();
    let fields = match err {
        DecodeError::UnknownFormat { head, recognised } => {
            let actual = match recognised {
                Some(name) => val(py, name)?,
                None => PyBytes::new(py, head).into_any(),
            };
            Fields::new(
                py,
                Class::UnknownImageFormat,
                "format",
                "JPEG, PNG, GIF, BMP or WebP",
                actual,
            )?
        }
        DecodeError::Unsupported { .. } => {
            Fields::new(py, Class::UnsupportedImage, "data", none(), none())?
        }
        DecodeError::Truncated { .. } => {
            Fields::new(py, Class::TruncatedImage, "data", none(), none())?
        }
        DecodeError::Corrupt { .. } => {
            Fields::new(py, Class::CorruptImage, "data", none(), none())?
        }
        DecodeError::ZeroSize { width, height, .. } => {
            Fields::new(py, Class::EmptyImage, "size", none(), (*width, *height))?
        }
        DecodeError::TooManyPixels {
            width,
            height,
            limit,
            ..
        } => Fields::new(
            py,
            Class::ImageTooLarge,
            "max_pixels",
            *limit,
            u128::from(*width) * u128::from(*height),
        )?,
        DecodeError::OutOfMemory { bytes, .. } => {
            Fields::new(py, Class::ImageMemory, "size", none(), *bytes)?
        }
    };
    Ok(fields.with("format", val(py, err.format().map(Format::name))?))
}

// ---------------------------------------------------------------------------- resizing

/// A [`ResampleError`] as `ResizeError` (`ProcessingMemoryError` for a failed allocation).
pub(crate) fn resample_error(py: Python<'_>, err: &ResampleError) -> PyErr {
    flatten(resample_fields(py, err).and_then(|f| f.raise(&err.to_string())))
}

fn resample_fields<'py>(py: Python<'py>, err: &ResampleError) -> PyResult<Fields<'py>> {
    let none = || py.None();
    let resize = Class::Resize;
    match err {
        ResampleError::Channels { channels } => {
            Fields::new(py, resize, "channels", [1, 3, 4], *channels)
        }
        ResampleError::EmptyInput { width, height } => {
            Fields::new(py, resize, "image", none(), (*width, *height))
        }
        ResampleError::OutputSize { width, height } => {
            Fields::new(py, resize, "size", none(), (*width, *height))
        }
        ResampleError::TooLarge {
            what,
            width,
            height,
            channels,
        } => Fields::new(
            py,
            resize,
            *what,
            (resample::MAX_SIDE, resample::MAX_BYTES),
            (*width, *height, *channels),
        ),
        ResampleError::DataLength { expected, actual } => {
            Fields::new(py, resize, "image", *expected, *actual)
        }
        ResampleError::DestinationLength { expected, actual } => {
            Fields::new(py, resize, "output", *expected, *actual)
        }
        ResampleError::Region {
            region,
            width,
            height,
            ..
        } => Fields::new(
            py,
            resize,
            "box",
            (*width, *height),
            (region[0], region[1], region[2], region[3]),
        ),
        ResampleError::OutOfMemory { what, bytes } => {
            Fields::new(py, Class::ProcessingMemory, *what, none(), *bytes)
        }
    }
}

// ---------------------------------------------------------------------------- processors

/// A [`ProcessorError`] as the `ImageProcessingError` subclass of its kind, with `index`; a
/// decoding failure as the `ImageDecodeError` subclass of its kind. The message is the
/// processor's (it names the image).
pub(crate) fn processor_error(py: Python<'_>, err: &ProcessorError) -> PyErr {
    flatten(processor_fields(py, err).and_then(|f| f.raise(&err.to_string())))
}

fn processor_fields<'py>(py: Python<'py>, err: &ProcessorError) -> PyResult<Fields<'py>> {
    let fields = match err {
        ProcessorError::AspectRatio { height, width, .. } => Fields::new(
            py,
            Class::AspectRatio,
            "aspect_ratio",
            200.0f64,
            ProcessorError::ratio(*height, *width),
        )?,
        ProcessorError::Config {
            field,
            expected,
            actual,
        } => Fields::new(py, Class::ProcessorConfig, *field, expected, actual)?,
        ProcessorError::ImageShape {
            field,
            expected,
            actual,
            ..
        } => Fields::new(py, Class::ImageShape, *field, expected, actual)?,
        ProcessorError::TooLarge {
            what,
            limit,
            actual,
        } => Fields::new(py, Class::ProcessingLimit, *what, *limit, *actual)?,
        ProcessorError::VideoShape {
            expected, actual, ..
        } => Fields::new(py, Class::VideoShape, "frame size", *expected, *actual)?,
        ProcessorError::BatchShape {
            what,
            expected,
            actual,
        } => Fields::new(py, Class::BatchShape, *what, expected, actual)?,
        // The decode classes take `format`, not `index` (the message names the image).
        ProcessorError::Decode { error, .. } => return decode_fields(py, error),
        ProcessorError::Resample { error, .. } => resample_fields(py, error)?,
        ProcessorError::OutOfMemory { what, bytes } => {
            Fields::new(py, Class::ProcessingMemory, *what, py.None(), *bytes)?
        }
    };
    Ok(fields.with("index", val(py, err.index())?))
}

// ---------------------------------------------------------------------------- samples

/// `$name(&err)`, the variant name of an error of enum `$enum`, and `$all`, every name in
/// declaration order, both from one list: the match is exhaustive, so a new variant does not
/// compile until it is listed here, and once listed `_error_samples` refuses to run until the
/// samples cover it.
macro_rules! variant_names {
    ($enum:ident, $name:ident, $all:ident, [$($variant:ident),+ $(,)?]) => {
        fn $name(err: &$enum) -> &'static str {
            match err {
                $($enum::$variant { .. } => stringify!($variant),)+
            }
        }
        const $all: &[&str] = &[$(stringify!($variant)),+];
    };
}

variant_names!(
    TensorError,
    tensor_variant,
    TENSOR_VARIANTS,
    [
        UnknownDtype,
        UnsupportedSourceDtype,
        UnsupportedConversion,
        ShapeOverflow,
        PartialItem,
        DestinationSize,
        NotContiguous,
        ReadOnly,
        DestinationDtype,
        Overlap,
        NonceLength,
        PlanFieldNumber,
        PlanDuplicateField,
        PlanTooDeep,
        VarintTruncated,
        VarintTooLong,
        FieldNumberZero,
        FieldNumberTooLarge,
        GroupWireType,
        InvalidWireType,
        FixedTruncated,
        LengthTruncated,
        MessageTooLarge,
        TooManyTensors,
        TokenIndexOutOfRange,
        OutOfMemory,
    ]
);

variant_names!(
    ResampleError,
    resample_variant,
    RESAMPLE_VARIANTS,
    [
        Channels,
        EmptyInput,
        OutputSize,
        TooLarge,
        DataLength,
        DestinationLength,
        Region,
        OutOfMemory,
    ]
);

fn tensor_samples() -> Vec<TensorError> {
    use TensorError::*;
    let (input, offset) = ("data", 7);
    vec![
        UnknownDtype {
            arg: "wire_dtype",
            name: "float64".into(),
        },
        UnsupportedSourceDtype {
            arg: "src",
            numpy: ">f8".into(),
        },
        UnsupportedConversion {
            from: WireDtype::Int64,
            to: WireDtype::Bfloat16,
        },
        ShapeOverflow {
            shape: vec![1 << 40, 1 << 30],
            itemsize: 4,
        },
        PartialItem {
            arg: "src",
            len: 7,
            itemsize: 4,
        },
        DestinationSize {
            expected: 8,
            actual: 6,
        },
        NotContiguous { arg: "src" },
        ReadOnly { arg: "dst" },
        DestinationDtype {
            numpy: "<f4".into(),
        },
        Overlap {
            src: 0x1000,
            src_len: 16,
            dst: 0x1008,
            dst_len: 16,
        },
        NonceLength { len: 3 },
        PlanFieldNumber {
            path: "plan[0][0]".into(),
            value: "99999999999999999999".into(),
        },
        PlanDuplicateField {
            path: "plan".into(),
            field: 5,
        },
        PlanTooDeep { max: MAX_DEPTH },
        VarintTruncated { input, offset },
        VarintTooLong { input, offset },
        FieldNumberZero { input, offset },
        FieldNumberTooLarge {
            input,
            offset,
            field: 1 << 30,
        },
        GroupWireType {
            input,
            offset,
            field: 2,
            wire_type: 3,
        },
        InvalidWireType {
            input,
            offset,
            field: 2,
            wire_type: 6,
        },
        FixedTruncated {
            input,
            offset,
            field: 2,
            needed: 8,
            available: 3,
        },
        LengthTruncated {
            input: "header",
            offset,
            field: 2,
            length: 300,
            available: 10,
        },
        MessageTooLarge {
            what: "output",
            size: 1 << 31,
            limit: i32::MAX as u64,
        },
        TooManyTensors { max: MAX_TENSORS },
        TokenIndexOutOfRange {
            offset: 40,
            index: 3,
            count: 2,
        },
        OutOfMemory {
            what: "output bytes",
            bytes: 1 << 40,
        },
    ]
}

fn resample_samples() -> Vec<ResampleError> {
    vec![
        ResampleError::Channels { channels: 2 },
        ResampleError::EmptyInput {
            width: 0,
            height: 5,
        },
        ResampleError::OutputSize {
            width: 0,
            height: -1,
        },
        ResampleError::TooLarge {
            what: "output",
            width: 1 << 17,
            height: 2,
            channels: 3,
        },
        ResampleError::DataLength {
            expected: 12,
            actual: 11,
        },
        ResampleError::DestinationLength {
            expected: 12,
            actual: 13,
        },
        ResampleError::Region {
            region: [-1.0, 0.0, 4.0, 4.0],
            width: 8,
            height: 6,
            reason: "negative left",
        },
        ResampleError::OutOfMemory {
            what: "output bytearray",
            bytes: 1 << 40,
        },
    ]
}

fn decode_samples() -> Vec<DecodeError> {
    vec![
        DecodeError::UnknownFormat {
            head: b"GARBAGE".to_vec(),
            recognised: None,
        },
        DecodeError::Unsupported {
            format: Format::Jpeg,
            feature: "12-bit samples".into(),
        },
        DecodeError::Truncated {
            format: Format::Png,
            detail: "IDAT".into(),
        },
        DecodeError::Corrupt {
            format: Format::Gif,
            reason: "bad LZW code".into(),
        },
        DecodeError::ZeroSize {
            format: Format::Bmp,
            width: 0,
            height: 9,
        },
        DecodeError::TooManyPixels {
            format: Format::Png,
            width: 1 << 20,
            height: 1 << 20,
            limit: 1000,
        },
        DecodeError::OutOfMemory {
            format: Format::WebP,
            bytes: 1 << 40,
        },
    ]
}

fn processor_samples() -> Vec<ProcessorError> {
    vec![
        ProcessorError::AspectRatio {
            index: 1,
            height: 1,
            width: 201,
        },
        ProcessorError::Config {
            field: "patch_size",
            expected: "a positive int".into(),
            actual: "0".into(),
        },
        ProcessorError::ImageShape {
            index: 2,
            field: "channels",
            expected: "1, 3 or 4".into(),
            actual: "2".into(),
        },
        ProcessorError::TooLarge {
            what: "pixel_values",
            limit: 100,
            actual: 101,
        },
        ProcessorError::VideoShape {
            video: 3,
            frame: 1,
            expected: (4, 5),
            actual: (6, 7),
        },
        ProcessorError::BatchShape {
            what: "images",
            expected: vec![3, 4, 4],
            actual: vec![3, 5, 4],
        },
        ProcessorError::Decode {
            index: 4,
            error: DecodeError::Truncated {
                format: Format::Jpeg,
                detail: "scan".into(),
            },
        },
        ProcessorError::Resample {
            index: 5,
            error: ResampleError::Channels { channels: 2 },
        },
        ProcessorError::OutOfMemory {
            what: "pixel_values",
            bytes: 1 << 40,
        },
    ]
}

/// Checks that `names` (each sample's variant) is exactly `all`, in order.
fn check_covered(what: &str, names: &[&str], all: &[&str]) -> PyResult<()> {
    if names == all {
        Ok(())
    } else {
        Err(PyRuntimeError::new_err(format!(
            "{what}: the samples cover {names:?}, the variants are {all:?}"
        )))
    }
}

/// _error_samples() -> list[tuple[str, Exception]]
/// --
///
/// One sample of every variant of every native error enum, converted to the exception the
/// extension raises for it, as `("Enum::Variant", exception)`; for the tests.
#[pyfunction]
fn _error_samples(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let out = PyList::empty(py);
    let push = |name: String, err: PyErr| out.append((name, err.into_value(py)));

    let tensors = tensor_samples();
    let names: Vec<_> = tensors.iter().map(tensor_variant).collect();
    check_covered("TensorError", &names, TENSOR_VARIANTS)?;
    for (name, err) in names.iter().zip(&tensors) {
        push(format!("TensorError::{name}"), tensor_error(py, err))?;
    }
    let resamples = resample_samples();
    let names: Vec<_> = resamples.iter().map(resample_variant).collect();
    check_covered("ResampleError", &names, RESAMPLE_VARIANTS)?;
    for (name, err) in names.iter().zip(&resamples) {
        push(format!("ResampleError::{name}"), resample_error(py, err))?;
    }
    let decodes = decode_samples();
    let names: Vec<_> = decodes.iter().map(DecodeError::kind).collect();
    check_covered("DecodeError", &names, &DecodeError::KINDS)?;
    for (name, err) in names.iter().zip(&decodes) {
        push(format!("DecodeError::{name}"), decode_error(py, err))?;
    }
    let processors = processor_samples();
    let names: Vec<_> = processors.iter().map(ProcessorError::kind).collect();
    check_covered("ProcessorError", &names, &ProcessorError::KINDS)?;
    for (name, err) in names.iter().zip(&processors) {
        push(format!("ProcessorError::{name}"), processor_error(py, err))?;
    }
    Ok(out)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_error_samples, m)?)
}
