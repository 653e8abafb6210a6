"""Image and video inputs to what the native processor reads: ``bytes`` or ``uint8`` arrays.

* encoded ``bytes``/``bytearray``/``memoryview`` and file paths (``str``/``PathLike``; read here,
  decoded in Rust with the GIL released — no URLs, nothing is downloaded);
* numpy arrays ``HxW`` or ``HxWxC`` (C = 1, 3, 4), ``uint8``, channels last (transformers guesses
  the channel axis of arrays; we never do);
* PIL images, converted like transformers' ``convert_to_rgb``: with an alpha band or
  ``info["transparency"]`` alpha-composited onto white, otherwise ``convert("RGB")``; no EXIF
  transpose (transformers applies it only to paths and URLs).
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Sequence
from typing import Any, TypeAlias, TypeGuard

import numpy as np
import numpy.typing as npt

from smg_grpc_proto.errors import InputFileError

__all__ = [
    "MAX_FILE_BYTES",
    "NativeItem",
    "flatten_images",
    "flatten_videos",
    "read_file",
    "to_native",
]

MAX_FILE_BYTES = 1 << 30
"""The most bytes read from one input file (1 GiB: more than any image Pillow opens under its
pixel limit needs)."""

NativeItem: TypeAlias = "bytes | npt.NDArray[np.uint8]"
"""What the native processor reads: encoded bytes or a C-contiguous uint8 array."""


def _is_pil(obj: object) -> bool:
    module = sys.modules.get("PIL.Image")
    image_cls = getattr(module, "Image", None)
    return isinstance(image_cls, type) and isinstance(obj, image_cls)


def _is_sequence(obj: object) -> TypeGuard[Sequence[Any]]:
    return isinstance(obj, (list, tuple))


def _pil_to_array(image: Any) -> npt.NDArray[np.uint8]:
    from PIL import Image

    has_alpha = "A" in image.getbands() or image.info.get("transparency") is not None
    if has_alpha:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        rgb = Image.alpha_composite(background, rgba).convert("RGB")
    else:
        rgb = image.convert("RGB")
    return np.asarray(rgb, dtype=np.uint8)


def to_native(item: Any, what: str, keep_alpha: bool = False) -> NativeItem:
    """One input as ``bytes`` or a C-contiguous ``uint8`` array. ``keep_alpha`` (a family whose
    processor composites alpha itself, Inkling2): a PIL image is converted as that processor
    converts it, ``convert("RGBA" if has_transparency_data else "RGB")``."""
    if isinstance(item, bytes):
        return item
    if isinstance(item, (bytearray, memoryview)):
        return bytes(item)
    if isinstance(item, (str, os.PathLike)):
        return read_file(item, what)
    if isinstance(item, np.ndarray):
        if item.dtype != np.uint8:
            raise TypeError(f"{what}: arrays must be uint8 (HxW or HxWxC), got {item.dtype}")
        if item.ndim not in (2, 3):
            raise ValueError(f"{what}: expected an HxW or HxWxC array, got shape {item.shape}")
        return np.ascontiguousarray(item)
    if _is_pil(item):
        if keep_alpha:
            mode = "RGBA" if item.has_transparency_data else "RGB"
            return np.ascontiguousarray(np.asarray(item.convert(mode), dtype=np.uint8))
        return _pil_to_array(item)
    raise TypeError(
        f"{what}: expected encoded bytes, a path, a uint8 numpy array or a PIL image, "
        f"got {type(item).__name__}"
    )


def read_file(path: str | os.PathLike[str], what: str, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file, at most ``max_bytes`` of them. A FIFO, device, socket or
    directory is refused at once (opened without blocking, never read), as is a longer file
    (:class:`InputFileError`); a missing file raises ``FileNotFoundError`` as ``open`` does."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputFileError(
                f"{what}: {os.fspath(path)!r} is not a regular file "
                f"(mode {stat.filemode(st.st_mode)})",
                field=what,
                expected="regular file",
                actual=stat.filemode(st.st_mode),
            )
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:  # read until EOF: st_size may be stale or 0
            chunk = os.read(fd, min(max_bytes + 1 - size, 1 << 24))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
        raise InputFileError(
            f"{what}: {os.fspath(path)!r} holds more than {max_bytes} bytes",
            field=what,
            expected=max_bytes,
            actual=max(size, st.st_size),
        )
    finally:
        os.close(fd)


def flatten_images(images: Any) -> list[Any]:
    """One image, a list of images, a list of lists (flattened), or an ``NxHxWxC`` array."""
    if isinstance(images, np.ndarray) and images.ndim == 4:
        return list(images)
    if not _is_sequence(images):
        return [images]
    out: list[Any] = []
    for item in images:
        if _is_sequence(item) or (isinstance(item, np.ndarray) and item.ndim == 4):
            out.extend(item)
        else:
            out.append(item)
    return out


def flatten_videos(videos: Any) -> list[list[Any]]:
    """One video (a list of frames or a ``TxHxWxC`` array) or a list of videos."""
    if isinstance(videos, np.ndarray):
        if videos.ndim == 4:
            return [list(videos)]
        if videos.ndim == 5:
            return [list(v) for v in videos]
        raise ValueError(f"videos: expected a TxHxWxC array, got shape {videos.shape}")
    if _is_sequence(videos) and videos:
        if all(_is_sequence(v) or (isinstance(v, np.ndarray) and v.ndim == 4) for v in videos):
            return [list(v) for v in videos]
        return [list(videos)]
    raise TypeError(
        f"videos: expected a list of frames or a list of videos, got {type(videos).__name__}"
    )
