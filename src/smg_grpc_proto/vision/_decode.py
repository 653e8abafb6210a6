"""Decoding encoded images to RGB exactly as transformers' loader gets them from Pillow.

``decode(data)`` equals, byte for byte (Pillow 13.0.0, transformers 5.x)::

    image = PIL.Image.open(io.BytesIO(data))
    image = PIL.ImageOps.exif_transpose(image)            # apply_exif=True
    np.array(transformers.image_transforms.convert_to_rgb(image, return_numpy=True))

for JPEG (baseline, progressive, arithmetic; gray, YCbCr, RGB, CMYK/YCCK), PNG (1-16 bit, gray,
gray+alpha, RGB, RGBA, palette with or without ``tRNS``, interlaced; first frame of an APNG),
GIF (first frame, transparency index), BMP (1/4/8-bit palette, 16/24/32-bit, bitfields,
RLE4/RLE8) and WebP (lossy, lossless, alpha; first frame of an animation). The decoding runs in
Rust with the GIL released; JPEG goes through the same libjpeg-turbo code path as Pillow (ISLOW
IDCT, fancy upsampling), WebP through libwebp, both linked statically into the extension.

``alpha="white"`` composites images with an alpha band or transparency onto white like
``convert_to_rgb``; ``alpha="drop"`` gives ``image.convert("RGB")`` instead, which is what
transformers' ``load_image`` (paths and URLs) does after ``exif_transpose``.

``max_pixels`` (default :data:`DEFAULT_MAX_PIXELS` = 2 x Pillow's ``MAX_IMAGE_PIXELS``, the size
above which Pillow raises ``DecompressionBombError``) is checked against the header's width x
height before any pixel memory is allocated; ``None`` disables the check.

``threads`` is how many threads the decode may use (default 0: one per core; 1 keeps it on the
calling thread). With two or more, a baseline JPEG with at least 4 096 blocks (about 0.17 MP in
4:2:0) and 32 KiB of entropy-coded data is Huffman-decoded on a second thread while the calling
thread runs libjpeg's IDCT, upsampling and colour conversion: the same pixels, sooner (1.1-1.7x
on camera photos of 0.3-2 MP). Other formats and smaller JPEGs use the calling thread only.

The returned array is ``(height, width, 3)`` ``uint8``, C-contiguous and writable. It views the
buffer the decoder wrote (no copy): its ``base`` is the native ``DecodedImage`` that owns the
memory and frees it when the last array viewing it is gone.
"""

from __future__ import annotations

import os
from typing import Literal

import numpy as np
import numpy.typing as npt

from smg_grpc_proto._core import native as _native
from smg_grpc_proto.vision._inputs import read_file

__all__ = ["DEFAULT_MAX_PIXELS", "ImageSource", "decode"]

DEFAULT_MAX_PIXELS: int = 178_956_970
"""178 956 970: twice Pillow's ``Image.MAX_IMAGE_PIXELS`` (89 478 485). The native core's
``DEFAULT_MAX_PIXELS`` (tests/test_pure.py checks they agree), written out so that this module
imports without it."""

ImageSource = bytes | bytearray | memoryview | str | os.PathLike[str]
"""Encoded image bytes, or the path of an image file."""


def _to_bytes(data: ImageSource) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, (str, os.PathLike)):
        return read_file(data, "data")
    raise TypeError(
        f"data must be bytes, bytearray, memoryview or a path, not {type(data).__name__}"
    )


def decode(
    data: ImageSource,
    *,
    apply_exif: bool = True,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    alpha: Literal["white", "drop"] = "white",
    threads: int = 0,
) -> npt.NDArray[np.uint8]:
    """Decode a JPEG, PNG, GIF, BMP or WebP image to an ``(H, W, 3)`` uint8 RGB array.

    Raises a subclass of :class:`~smg_grpc_proto.errors.ImageDecodeError` (a ``ValueError``):
    ``UnknownImageFormatError``, ``UnsupportedImageError``, ``TruncatedImageError``,
    ``CorruptImageError``, ``EmptyImageError``, ``ImageTooLargeError`` or ``ImageMemoryError``
    (also a ``MemoryError``), raised by the extension with their fields; ``TypeError`` for an
    argument of the wrong type, a plain ``ValueError`` for ``max_pixels`` past 2**64 - 1 or an
    unknown ``alpha`` or a negative ``threads``, ``OSError`` if a path cannot be read.
    """
    raw = _to_bytes(data)
    if max_pixels is not None and (isinstance(max_pixels, bool) or max_pixels < 0):
        raise TypeError(f"max_pixels must be a non-negative int or None, got {max_pixels!r}")
    if isinstance(threads, bool) or not isinstance(threads, int):
        raise TypeError(f"threads must be an int, got {threads!r}")
    if threads < 0:
        raise ValueError(f"threads must be 0 (one per core) or positive, got {threads}")
    image = _native.decode_image(raw, bool(apply_exif), max_pixels, alpha, threads)
    return np.asarray(image)
