"""Pillow-exact resizing of numpy ``uint8`` images (the native ``resize`` kernel).

``resize(image, (width, height), resample=...)`` returns exactly the bytes of::

    np.array(Image.fromarray(image).resize((width, height), resample, reducing_gap=None))

for Pillow 13.0.0 and modes ``L`` (``HxW``), ``RGB`` (``HxWx3``) and ``RGBX`` (``HxWx4``).
Four-channel input is resampled channel by channel, like Pillow's ``RGBX``; Pillow resamples
``RGBA`` premultiplied by alpha, so an ``RGBA`` image differs from this function wherever alpha
is not 255 (transformers converts images to RGB before resizing, so it never resizes RGBA).
"""

from __future__ import annotations

import operator
from typing import Literal, TypeAlias

import numpy as np
import numpy.typing as npt

from smg_grpc_proto import _native

__all__ = ["PassOrder", "Resample", "resize"]

#: Filter names, as :func:`resize` accepts them (also as Pillow's integer ids).
Resample: TypeAlias = Literal["nearest", "box", "bilinear", "hamming", "bicubic", "lanczos"]
#: ``"pillow13"``: Pillow 13's order (vertical pass first iff the height shrinks by more than
#: twice as many pixels as the width); ``"pillow12"``: Pillow <= 12.2's (always horizontal
#: first). The order changes output bytes (the intermediate image is rounded to uint8).
PassOrder: TypeAlias = Literal["pillow13", "pillow12"]

# PIL.Image.Resampling ids.
_PIL_IDS: dict[int, Resample] = {
    0: "nearest",
    1: "lanczos",
    2: "bilinear",
    3: "bicubic",
    4: "box",
    5: "hamming",
}
_NAMES = frozenset(_PIL_IDS.values())


def _filter_name(resample: Resample | int) -> str:
    if isinstance(resample, str):
        if resample not in _NAMES:
            raise ValueError(
                f"unknown resample filter {resample!r}: expected one of {sorted(_NAMES)} "
                "or a PIL id 0-5"
            )
        return resample
    if isinstance(resample, bool) or not isinstance(resample, int):
        raise TypeError(f"resample must be a filter name or a PIL id, got {resample!r}")
    try:
        return _PIL_IDS[int(resample)]
    except KeyError:
        raise ValueError(
            f"unknown resample filter id {int(resample)}: PIL ids are NEAREST 0, LANCZOS 1, "
            "BILINEAR 2, BICUBIC 3, BOX 4, HAMMING 5"
        ) from None


def resize(
    image: npt.NDArray[np.uint8],
    size: tuple[int, int],
    *,
    resample: Resample | int = "bicubic",
    pass_order: PassOrder = "pillow13",
    box: tuple[float, float, float, float] | None = None,
    threads: int | None = None,
) -> npt.NDArray[np.uint8]:
    """Resize ``image`` to ``size = (width, height)`` exactly as Pillow 13.0.0 does.

    ``image`` is a C-contiguous ``uint8`` array ``HxW`` or ``HxWxC`` with C in 1, 3, 4; the
    result is a new, writable array of the same rank, ``height x width (x C)``. ``resample`` is
    a filter name or a PIL id (``Image.Resampling`` members work); ``box`` is Pillow's source
    region ``(left, top, right, bottom)``; ``threads`` caps the threads (``None``: one per
    core when the image is large enough to gain from it). The GIL is released while resizing.

    Raises ``ValueError`` for non-positive or too large sizes (at most 65536 per side and 2**31 - 1
    bytes), other channel counts, non-uint8 or non-contiguous arrays, unknown filters and boxes
    Pillow rejects; ``TypeError`` if ``image`` is not a numpy array.
    """
    width, height = (operator.index(v) for v in size)
    if pass_order not in ("pillow13", "pillow12"):
        raise ValueError(f"unknown pass_order {pass_order!r}: expected 'pillow13' or 'pillow12'")
    if threads is not None and operator.index(threads) < 1:
        raise ValueError(f"threads must be at least 1 (or None for automatic), got {threads}")
    region: tuple[float, float, float, float] | None = None
    if box is not None:
        if len(box) != 4:
            raise ValueError(f"box must be (left, top, right, bottom), got {box!r}")
        region = (float(box[0]), float(box[1]), float(box[2]), float(box[3]))
    out = _native.resize(
        image,
        width,
        height,
        _filter_name(resample),
        pass_order,
        region,
        0 if threads is None else operator.index(threads),
    )
    shape = (height, width) if image.ndim == 2 else (height, width, image.shape[2])
    return np.frombuffer(out, dtype=np.uint8).reshape(shape)
