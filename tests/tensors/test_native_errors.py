"""One error protocol at the Rust boundary.

The extension raises ``smg_grpc_proto.errors`` classes itself, with keyword fields: every variant
of every native error enum (``_native._error_samples()`` gives one converted sample of each) maps
to one class with the real field and numbers; the kernels' errors reach the caller unchanged
(no re-wrapping); the pure-numpy fallback raises the same class, message and fields.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from smg_grpc_proto import _native, errors, vision
from smg_grpc_proto.errors import (
    AspectRatioError,
    BatchShapeError,
    CorruptImageError,
    EmptyImageError,
    ImageDecodeError,
    ImageMemoryError,
    ImageShapeError,
    ImageTooLargeError,
    ProcessingLimitError,
    ProcessingMemoryError,
    ProcessorConfigError,
    ResizeError,
    TensorError,
    TensorMemoryError,
    TensorTypeError,
    TruncatedImageError,
    UnknownImageFormatError,
    UnsupportedImageError,
    VideoShapeError,
)
from smg_grpc_proto.tensors import _fallback

SRC = Path(__file__).resolve().parents[2] / "src" / "smg_grpc_proto"
VOCABULARY = ["float32", "bfloat16", "float16", "int64", "uint32", "uint8"]
NO = object()  # the class takes no such keyword

# name: (class, field, expected, actual, extra attributes)
EXPECTED: dict[str, tuple[type[Exception], str, Any, Any, dict[str, Any]]] = {
    "TensorError::UnknownDtype": (
        TensorError,
        "wire_dtype",
        VOCABULARY,
        "float64",
        {"offset": None},
    ),
    "TensorError::UnsupportedSourceDtype": (
        TensorError,
        "src",
        ["<f4", "<f2", "<u2", "<i8", "<u4", "|u1"],
        ">f8",
        {},
    ),
    "TensorError::UnsupportedConversion": (TensorError, "wire_dtype", "int64", "bfloat16", {}),
    "TensorError::ShapeOverflow": (TensorError, "shape", 2**64 - 1, 2**70 * 4, {}),
    "TensorError::PartialItem": (TensorError, "src", 4, 7, {}),
    "TensorError::DestinationSize": (TensorError, "dst", 8, 6, {}),
    "TensorError::NotContiguous": (TensorError, "src", None, None, {}),
    "TensorError::ReadOnly": (TensorError, "dst", None, None, {}),
    "TensorError::DestinationDtype": (TensorError, "dst", "|u1", "<f4", {}),
    "TensorError::Overlap": (TensorError, "dst", (0x1000, 16), (0x1008, 16), {}),
    "TensorError::NonceLength": (TensorError, "nonce", 16, 3, {}),
    "TensorError::PlanFieldNumber": (
        TensorError,
        "plan[0][0]",
        2**29 - 1,
        99999999999999999999,
        {},
    ),
    "TensorError::PlanDuplicateField": (TensorError, "plan", None, 5, {}),
    "TensorError::PlanTooDeep": (TensorError, "plan", 100, None, {}),
    "TensorError::VarintTruncated": (TensorError, "data", None, None, {"offset": 7}),
    "TensorError::VarintTooLong": (TensorError, "data", None, None, {"offset": 7}),
    "TensorError::FieldNumberZero": (TensorError, "data", None, 0, {"offset": 7}),
    "TensorError::FieldNumberTooLarge": (TensorError, "data", 2**29 - 1, 2**30, {"offset": 7}),
    "TensorError::GroupWireType": (TensorError, "data", None, 3, {"offset": 7}),
    "TensorError::InvalidWireType": (TensorError, "data", None, 6, {"offset": 7}),
    "TensorError::FixedTruncated": (TensorError, "data", 8, 3, {"offset": 7}),
    "TensorError::LengthTruncated": (TensorError, "header", 300, 10, {"offset": 7}),
    "TensorError::MessageTooLarge": (TensorError, "output", 2**31 - 1, 2**31, {}),
    "TensorError::TooManyTensors": (TensorError, "data", 2**16, 2**16 + 1, {}),
    "TensorError::TokenIndexOutOfRange": (TensorError, "header", 2, 3, {"offset": 40}),
    "TensorError::OutOfMemory": (TensorMemoryError, "output bytes", None, 2**40, {}),
    "ResampleError::Channels": (ResizeError, "channels", [1, 3, 4], 2, {"index": None}),
    "ResampleError::EmptyInput": (ResizeError, "image", None, (0, 5), {}),
    "ResampleError::OutputSize": (ResizeError, "size", None, (0, -1), {}),
    "ResampleError::TooLarge": (ResizeError, "output", (2**16, 2**31 - 1), (2**17, 2, 3), {}),
    "ResampleError::DataLength": (ResizeError, "image", 12, 11, {}),
    "ResampleError::DestinationLength": (ResizeError, "output", 12, 13, {}),
    "ResampleError::Region": (ResizeError, "box", (8, 6), (-1.0, 0.0, 4.0, 4.0), {}),
    "ResampleError::OutOfMemory": (
        ProcessingMemoryError,
        "output bytearray",
        None,
        2**40,
        {"index": None},
    ),
    "DecodeError::unknown_format": (
        UnknownImageFormatError,
        "format",
        "JPEG, PNG, GIF, BMP or WebP",
        b"GARBAGE",
        {"format": None},
    ),
    "DecodeError::unsupported": (UnsupportedImageError, "data", None, None, {"format": "JPEG"}),
    "DecodeError::truncated": (TruncatedImageError, "data", None, None, {"format": "PNG"}),
    "DecodeError::corrupt": (CorruptImageError, "data", None, None, {"format": "GIF"}),
    "DecodeError::zero_size": (EmptyImageError, "size", None, (0, 9), {"format": "BMP"}),
    "DecodeError::too_many_pixels": (
        ImageTooLargeError,
        "max_pixels",
        1000,
        2**40,
        {"format": "PNG"},
    ),
    "DecodeError::out_of_memory": (ImageMemoryError, "size", None, 2**40, {"format": "WEBP"}),
    "ProcessorError::aspect_ratio": (AspectRatioError, "aspect_ratio", 200.0, 201.0, {"index": 1}),
    "ProcessorError::config": (
        ProcessorConfigError,
        "patch_size",
        "a positive int",
        "0",
        {"index": None},
    ),
    "ProcessorError::image_shape": (ImageShapeError, "channels", "1, 3 or 4", "2", {"index": 2}),
    "ProcessorError::too_large": (ProcessingLimitError, "pixel_values", 100, 101, {"index": None}),
    "ProcessorError::video_shape": (VideoShapeError, "frame size", (4, 5), (6, 7), {"index": 3}),
    "ProcessorError::batch_shape": (
        BatchShapeError,
        "images",
        [3, 4, 4],
        [3, 5, 4],
        {"index": None},
    ),
    "ProcessorError::decode": (TruncatedImageError, "data", None, None, {"format": "JPEG"}),
    "ProcessorError::resample": (ResizeError, "channels", [1, 3, 4], 2, {"index": 5}),
    "ProcessorError::out_of_memory": (
        ProcessingMemoryError,
        "pixel_values",
        None,
        2**40,
        {"index": None},
    ),
}

SAMPLES = dict(_native._error_samples())


def test_every_variant_has_a_sample_and_an_expectation() -> None:
    names = [name for name, _ in _native._error_samples()]
    assert len(names) == len(set(names))
    assert set(names) == set(EXPECTED)
    # Each enum's samples cover its kinds (the Rust side checks its variant lists itself).
    decode = {n.split("::")[1] for n in names if n.startswith("DecodeError::")}
    assert decode == set(_native.decode_error_kinds()) == set(errors.IMAGE_DECODE_ERRORS)
    processing = {n.split("::")[1] for n in names if n.startswith("ProcessorError::")}
    assert processing == set(_native.processor_error_kinds())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_variant_raises_its_class_with_its_fields(name: str) -> None:
    cls, field, expected, actual, extra = EXPECTED[name]
    exc = SAMPLES[name]
    assert type(exc) is cls, (name, type(exc))
    assert isinstance(exc, errors.SmgProtoError)
    assert (exc.field, exc.expected, exc.actual) == (field, expected, actual), name
    for key, value in extra.items():
        assert getattr(exc, key, NO) == value, (name, key)
    assert str(exc), name
    assert not str(exc).startswith("("), str(exc)  # a message, not a tuple
    assert len(exc.args) == 1
    if isinstance(exc, ImageDecodeError):
        assert exc.kind == name.split("::")[1] or name == "ProcessorError::decode"
    if name.endswith(("OutOfMemory", "out_of_memory")):
        assert isinstance(exc, MemoryError)
        assert f"cannot allocate {2**40} bytes" in str(exc)
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is cls
    assert (again.field, again.expected, again.actual, str(again)) == (
        exc.field,
        exc.expected,
        exc.actual,
        str(exc),
    )
    for key in extra:
        assert getattr(again, key) == getattr(exc, key)


def test_memory_errors_stay_memory_errors() -> None:
    for cls in (TensorMemoryError, ImageMemoryError, ProcessingMemoryError):
        assert issubclass(cls, MemoryError)
        assert issubclass(cls, ValueError)  # what their families promise
    assert issubclass(TensorMemoryError, TensorError)


def test_no_python_side_rewrapping_is_left() -> None:
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        for marker in ("len(exc.args)", "len(e.args)", "exc.args[", "_raise_native"):
            assert marker not in text, (path, marker)
    backend = (SRC / "tensors" / "_backend.py").read_text()
    assert "except ValueError" not in backend


# ------------------------------------------------------------ real calls, end to end
NONCE = b"\x11" * 16


def test_kernel_errors_reach_the_caller_unchanged() -> None:
    from smg_grpc_proto.tensors import _backend

    with pytest.raises(TensorError) as info:
        _backend.decode_frames(b"\x0a\x05ab", 1, NONCE)
    assert type(info.value) is TensorError
    assert (info.value.field, info.value.expected, info.value.actual, info.value.offset) == (
        "data",
        5,
        2,
        0,
    )
    assert str(info.value) == "data: field 1 at byte 0 claims 5 bytes, only 2 remain"


def test_encode_frames_sources_name_the_source() -> None:
    header = b"\x0a\x14" + NONCE + b"\0\0\0\0"
    with pytest.raises(TensorError) as info:
        _native.encode_frames(header, 1, NONCE, [(np.zeros(2, np.float32), "complex")])
    assert info.value.field == "sources[0].wire_dtype"
    assert (info.value.expected, info.value.actual) == (VOCABULARY, "complex")
    assert str(info.value).startswith("sources[0]: wire_dtype: unknown dtype")
    with pytest.raises(TensorError) as info:
        _native.encode_frames(header, 1, NONCE, [(np.zeros(2, np.float64), "float32")])
    assert (info.value.field, info.value.actual) == ("sources[0].array", "<f8")
    with pytest.raises(TensorTypeError) as type_info:
        _native.encode_frames(header, 1, NONCE, [("text", "float32")])
    assert type_info.value.field == "sources[0]"
    with pytest.raises(TensorTypeError) as type_info:
        _native.decode_frames("text", 1, NONCE)
    assert type_info.value.field == "data"
    with pytest.raises(TensorError) as info:
        _native.encode_frames(header, 1, NONCE, [])
    assert (info.value.field, info.value.expected, info.value.actual) == ("header", 0, 0)
    assert info.value.offset == 2


def test_convert_errors_carry_fields() -> None:
    with pytest.raises(TensorError) as info:
        _native.convert(np.zeros(3, np.float32), "float64")
    assert (info.value.field, info.value.actual) == ("wire_dtype", "float64")
    with pytest.raises(TensorTypeError) as type_info:
        _native.convert([1.0, 2.0], "float32")
    assert type_info.value.field == "src"
    with pytest.raises(TensorError) as info:
        _native.convert_into(np.zeros(2, np.float32), np.zeros(8, np.float32), "float32")
    assert (info.value.field, info.value.expected, info.value.actual) == ("dst", "|u1", "<f4")


def test_resize_errors_carry_fields() -> None:
    image = np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(ResizeError) as info:
        _native.resize(image, 2, 2, "sinc", "pillow13", None, 1)
    assert (info.value.field, info.value.actual) == ("filter", "sinc")
    with pytest.raises(ResizeError) as info:
        vision.resize(image, (0, 3))
    assert info.value.field == "size"
    with pytest.raises(ResizeError) as info:
        vision.resize(image, (2, 2), box=(-1, 0, 4, 4))
    assert (info.value.field, info.value.expected) == ("box", (4, 4))


def test_decode_and_processor_errors_carry_fields() -> None:
    with pytest.raises(UnknownImageFormatError) as info:
        vision.decode(b"not an image")
    assert (info.value.field, info.value.actual, info.value.format) == (
        "format",
        b"not an image",
        None,
    )
    # A bad argument is the caller's mistake, not an image that fails to decode.
    with pytest.raises(ValueError, match="alpha") as value_info:
        _native.decode_image(b"", True, None, "pink")
    assert not isinstance(value_info.value, ImageDecodeError)
    with pytest.raises(ProcessorConfigError) as config_info:
        vision.ImageProcessor("no_such_family")  # type: ignore[arg-type]
    assert config_info.value.field == "family"
    processor = vision.ImageProcessor.for_family("clip")
    with pytest.raises(ImageShapeError) as shape_info:
        processor([np.zeros((4, 4, 3), np.uint8), np.zeros((4, 4, 2), np.uint8)])
    assert shape_info.value.index == 1
    assert shape_info.value.field == "channels"


# ------------------------------------------------------------ fallback parity
def _nested(field: int, body: bytes) -> bytes:
    return bytes([field << 3 | 2, len(body)]) + body


# (data, plan): malformed messages whose native and fallback errors must agree exactly.
MALFORMED: dict[str, tuple[bytes, Any]] = {
    "truncated-key": (b"\x08\x01\x80", 1),
    "truncated-value": (b"\x08\xff", 1),
    "truncated-in-nested": (b"\x2a\x02\x08\x96\x01", ((5, 1),)),
    "varint-too-long": (b"\x08" + b"\x80" * 10 + b"\x01", 1),
    "field-zero": (b"\x08\x01\x00\x00", 1),
    "field-too-large": (b"\xf8\xff\xff\xff\x1f\x00", 1),
    "group": (b"\x08\x01\x13", 1),
    "end-group": (b"\x0c", 1),
    "invalid-6": (b"\x0e", 1),
    "invalid-7": (b"\x0f", 1),
    "fixed64-short": (b"\x09\x01\x02", 1),
    "fixed32-short": (b"\x0d\x01", 1),
    "length-beyond": (b"\x0a\x05ab", 1),
    "length-beyond-nested": (_nested(5, b"\x0a\x09abc"), ((5, 1),)),
    "length-huge": (b"\x0a" + b"\xff" * 9 + b"\x01", 1),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_fallback_raises_what_native_raises(case: str) -> None:
    data, plan = MALFORMED[case]
    with pytest.raises(TensorError) as native_info:
        _native.decode_frames(data, plan, NONCE)
    with pytest.raises(TensorError) as fallback_info:
        _fallback.decode_frames(data, plan, NONCE)
    got, want = fallback_info.value, native_info.value
    assert type(got) is type(want)
    assert (str(got), got.field, got.expected, got.actual, got.offset) == (
        str(want),
        want.field,
        want.expected,
        want.actual,
        want.offset,
    )


def test_fallback_token_and_destination_errors_match_native() -> None:
    header = b"\x0a\x14" + NONCE + b"\x05\0\0\0"
    sources = [(np.zeros(1, np.float32), "float32")]
    with pytest.raises(TensorError) as native_info:
        _native.encode_frames(header, 1, NONCE, sources)
    with pytest.raises(TensorError) as fallback_info:
        _fallback.encode_frames(header, 1, NONCE, sources)
    got, want = fallback_info.value, native_info.value
    assert (str(got), got.field, got.expected, got.actual, got.offset) == (
        str(want),
        want.field,
        want.expected,
        want.actual,
        want.offset,
    )
    src, dst = np.zeros(2, np.float32), np.zeros(7, np.uint8)
    with pytest.raises(TensorError) as native_info:
        _native.convert_into(src, dst, "float32")
    with pytest.raises(TensorError) as fallback_info:
        _fallback.convert_into(src, dst, "float32")
    got, want = fallback_info.value, native_info.value
    assert (str(got), got.field, got.expected, got.actual) == (
        str(want),
        want.field,
        want.expected,
        want.actual,
    )
