"""Argument errors at the Rust boundary are ``smg_grpc_proto.errors`` classes too.

The checks the binding layer (``rust/src/py``) makes itself — a non-array, an image array of the
wrong dtype or shape, a configuration value of a type it cannot hold, a bad ``alpha`` — raise a
class of ``smg_grpc_proto.errors`` whose ``field`` names the argument (``images[1]``,
``config["size"]``, ``parts[2]``) and whose ``expected``/``actual`` carry the values. A former
``TypeError`` is still a ``TypeError``, a former ``ValueError`` still a ``ValueError``.
"""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from smg_grpc_proto import _native
from smg_grpc_proto.errors import (
    ImageDecodeError,
    ImageShapeError,
    ImageTypeError,
    ProcessorConfigError,
    SmgProtoError,
    TensorError,
    TensorTypeError,
)

PY_SRC = Path(__file__).resolve().parents[2] / "rust" / "src" / "py"


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("L", (1, 1)).save(out, format="PNG")
    return out.getvalue()


PNG = _png()
IMAGE = np.zeros((4, 4, 3), np.uint8)
STRIDED = np.zeros((4, 8, 3), np.uint8)[:, ::2]
U64_MAX = 2**64 - 1


def _processor() -> Any:
    return _native.Preprocessor("clip", {})


def _images(images: Any) -> Any:
    return _processor().images(images, 1, True, "white", None)


def _videos(videos: Any) -> Any:
    return _native.Preprocessor("qwen2_vl", {}).videos(videos, 1, True, "white", None)


CONFIG_TYPES = (
    "bool, int (64-bit), float, str, None, a list of numbers, a list of [h, w] pairs or a dict "
    "of ints"
)

# name: (call, class, builtin it must stay, field, expected, actual)
CASES: dict[str, tuple[Callable[[], Any], type[SmgProtoError], type[Exception], str, Any, Any]] = {
    "media_digest: not a list": (
        lambda: _native.media_digest(3),  # type: ignore[arg-type]
        ImageTypeError,
        TypeError,
        "parts",
        "list or tuple",
        "int",
    ),
    "media_digest: a part of the wrong type": (
        lambda: _native.media_digest([b"x", b"y", "text"]),  # type: ignore[list-item]
        ImageTypeError,
        TypeError,
        "parts[2]",
        "bytes or numpy.ndarray",
        "str",
    ),
    "media_digest: a non-contiguous array": (
        lambda: _native.media_digest([STRIDED]),
        ImageTypeError,
        TypeError,
        "parts[0]",
        "a C-contiguous numpy.ndarray",
        "a non-contiguous numpy.ndarray",
    ),
    "decode_image: alpha": (
        lambda: _native.decode_image(PNG, True, None, "pink"),
        ProcessorConfigError,
        ValueError,
        "alpha",
        ("white", "drop"),
        "pink",
    ),
    "decode_image: max_pixels past u64": (
        lambda: _native.decode_image(PNG, True, 2**64, "white"),
        ProcessorConfigError,
        ValueError,
        "max_pixels",
        (0, U64_MAX),
        2**64,
    ),
    "decode_image: negative max_pixels": (
        lambda: _native.decode_image(PNG, True, -1, "white"),
        ProcessorConfigError,
        ValueError,
        "max_pixels",
        (0, U64_MAX),
        -1,
    ),
    "decode_image: max_pixels not an int": (
        lambda: _native.decode_image(PNG, True, 1.5, "white"),  # type: ignore[arg-type]
        ImageTypeError,
        TypeError,
        "max_pixels",
        "int or None",
        "float",
    ),
    "Preprocessor: config value of no known type": (
        lambda: _native.Preprocessor("clip", {"size": {1, 2}}),
        ImageTypeError,
        TypeError,
        'config["size"]',
        CONFIG_TYPES,
        "{1, 2}",
    ),
    "Preprocessor: config int beyond 64 bits": (
        lambda: _native.Preprocessor("clip", {"patch_size": 2**70}),
        ImageTypeError,
        TypeError,
        'config["patch_size"]',
        CONFIG_TYPES,
        str(2**70),
    ),
    "Preprocessor: config pair of three": (
        lambda: _native.Preprocessor("qwen2_vl", {"image_grid_pinpoints": [[1, 2, 3]]}),
        ImageTypeError,
        TypeError,
        'config["image_grid_pinpoints"]',
        CONFIG_TYPES,
        "[[1, 2, 3]]",
    ),
    "Preprocessor: config key not a str": (
        lambda: _native.Preprocessor("clip", {7: 1}),  # type: ignore[dict-item]
        ImageTypeError,
        TypeError,
        "config",
        "str",
        "int",
    ),
    "images: not a list": (
        lambda: _images("abc"),
        ImageTypeError,
        TypeError,
        "images",
        "list or tuple",
        "str",
    ),
    "images: an item of the wrong type": (
        lambda: _images([IMAGE, 3]),
        ImageTypeError,
        TypeError,
        "images[1]",
        "bytes or numpy.ndarray",
        "int",
    ),
    "images: dtype": (
        lambda: _images([IMAGE, IMAGE, IMAGE.astype(np.float32)]),
        ImageShapeError,
        ValueError,
        "images[2]",
        "|u1",
        "<f4",
    ),
    "images: dimensions": (
        lambda: _images([IMAGE[None]]),
        ImageShapeError,
        ValueError,
        "images[0]",
        (2, 3),
        4,
    ),
    "images: layout": (
        lambda: _images([IMAGE, STRIDED]),
        ImageShapeError,
        ValueError,
        "images[1]",
        None,
        None,
    ),
    "videos: a video that is not a list": (
        lambda: _videos([[IMAGE], IMAGE]),
        ImageTypeError,
        TypeError,
        "videos[1]",
        "list or tuple",
        "ndarray",
    ),
    "videos: a frame of the wrong type": (
        lambda: _videos([[IMAGE, None]]),
        ImageTypeError,
        TypeError,
        "videos[0][1]",
        "bytes or numpy.ndarray",
        "NoneType",
    ),
    "resize: not an array": (
        lambda: _native.resize([[0]], 2, 2, "bilinear", "pillow13", None, 1),  # type: ignore[arg-type]
        ImageTypeError,
        TypeError,
        "image",
        "numpy.ndarray",
        "list",
    ),
    "resize: dtype": (
        lambda: _native.resize(np.zeros((4, 4), np.int16), 2, 2, "bilinear", "pillow13", None, 1),
        ImageShapeError,
        ValueError,
        "image",
        "|u1",
        "<i2",
    ),
    "interpolate_bicubic: not an array": (
        lambda: _native.interpolate_bicubic(b"planes", 2, 2),  # type: ignore[arg-type]
        ImageTypeError,
        TypeError,
        "planes",
        "numpy.ndarray",
        "bytes",
    ),
    "convert: not an array": (
        lambda: _native.convert([1.0, 2.0], "float32"),  # type: ignore[arg-type]
        TensorTypeError,
        TypeError,
        "src",
        "numpy.ndarray",
        "list",
    ),
    "uint32_varints: not bytes": (
        lambda: _native.uint32_varints(bytearray(4)),  # type: ignore[arg-type]
        TensorTypeError,
        TypeError,
        "values",
        None,
        None,
    ),
    "uint32_varints: a partial item": (
        lambda: _native.uint32_varints(b"\x01\x02\x03\x04\x05\x06\x07"),
        TensorError,
        ValueError,
        "values",
        4,
        7,
    ),
    "convert_into: dst not an array": (
        lambda: _native.convert_into(np.zeros(2, np.float32), bytearray(8), "float32"),  # type: ignore[arg-type]
        TensorTypeError,
        TypeError,
        "dst",
        "numpy.ndarray",
        "bytearray",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_argument_errors_are_errors_classes_with_fields(name: str) -> None:
    call, cls, builtin, field, expected, actual = CASES[name]
    with pytest.raises(SmgProtoError) as info:
        call()
    exc = info.value
    assert type(exc) is cls, (name, type(exc))
    assert isinstance(exc, builtin), name  # what it raised before
    assert (exc.field, exc.expected, exc.actual) == (field, expected, actual), name
    assert str(exc)
    assert len(exc.args) == 1
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is cls
    assert (again.field, again.expected, again.actual) == (field, expected, actual)


def test_decode_option_errors_are_not_decode_errors() -> None:
    # `except ImageDecodeError` is for images that fail to decode, not for the caller's mistakes.
    for value in ("black", ""):
        with pytest.raises(ProcessorConfigError) as info:
            _native.decode_image(PNG, True, None, value)
        assert not isinstance(info.value, ImageDecodeError)
    with pytest.raises(ProcessorConfigError) as info:
        _native.decode_image(PNG, True, 2**70, "white")
    assert not isinstance(info.value, ImageDecodeError)
    assert _native.decode_image(PNG, True, U64_MAX, "white").height == 1


def test_a_read_only_destination_is_a_tensor_error() -> None:
    dst = np.zeros(8, np.uint8)
    dst.flags.writeable = False
    with pytest.raises(TensorError) as info:
        _native.convert_into(np.zeros(2, np.float32), dst, "float32")
    assert (info.value.field, str(info.value)) == ("dst", "dst: array is read-only")


def test_no_builtin_exception_is_built_in_the_bindings() -> None:
    """Every error the binding layer makes goes through `errors::raise` or an enum conversion;
    only the test hook in errors.rs may build a builtin (a missing sample is a bug)."""
    pattern = re.compile(r"Py[A-Za-z]*(Error|Exception)::new_err|PyErr::new::<")
    found = {
        path.name: pattern.findall(path.read_text())
        for path in PY_SRC.glob("*.rs")
        if path.name != "errors.rs"
    }
    assert {name: hits for name, hits in found.items() if hits} == {}
    assert PY_SRC.joinpath("array.rs").is_file()  # the glob found the sources


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (PNG, "png"),
        (b"\xff\xd8\xff\xe0", "jpeg"),
        (b"GIF89a", "gif"),
        (b"GIF87a....", "gif"),
        (b"BM", "bmp"),
        (b"RIFF\0\0\0\0WEBPVP8L", "webp"),
        (b"RIFF\0\0\0\0WEBPVP8", None),
        (b"RIFF\0\0\0\0WAVEfmt ", None),
        (b"II*\x00\x08\x00\x00\x00", None),
        (b"", None),
    ],
)
def test_image_format_is_the_decoders_sniff(data: bytes, expected: str | None) -> None:
    assert _native.image_format(data) == expected
    if expected is None:
        # What the decoder says of the same bytes: not a format it recognises.
        with pytest.raises(ImageDecodeError) as info:
            _native.decode_image(data, False, 0, "white")
        assert info.value.format is None
