"""Pillow-exact and torch-exact resizing of numpy images (the native resampling kernels).

``resize(image, (width, height), resample=...)`` returns exactly the bytes of::

    np.array(Image.fromarray(image).resize((width, height), resample, reducing_gap=None))

for Pillow 13.0.0 and modes ``L`` (``HxW``), ``RGB`` (``HxWx3``) and ``RGBX`` (``HxWx4``).
Four-channel input is resampled channel by channel, like Pillow's ``RGBX``; Pillow resamples
``RGBA`` premultiplied by alpha, so an ``RGBA`` image differs from this function wherever alpha
is not 255 (transformers converts images to RGB before resizing, so it never resizes RGBA).

:func:`resize_torch` and :func:`interpolate_bicubic` are the two torch 2.14.1 CPU kernels the
torchvision-only processors (Llama 4, Phi-4-multimodal) and Phi-3-vision are built on, bit for
bit: the antialiased ``uint8`` resize (int16 weights of at most 15 bits) and the float bicubic
interpolation without antialiasing (``A = -0.75``).
"""

from __future__ import annotations

import operator
from typing import Literal, TypeAlias

import numpy as np
import numpy.typing as npt

from smg_grpc_proto._core import native as _native

__all__ = [
    "PassOrder",
    "Resample",
    "TorchResample",
    "interpolate_bicubic",
    "resize",
    "resize_torch",
]

#: Filter names, as :func:`resize` accepts them (also as Pillow's integer ids).
Resample: TypeAlias = Literal["nearest", "box", "bilinear", "hamming", "bicubic", "lanczos"]
#: torch's antialiased ``uint8`` modes (``InterpolationMode.BILINEAR`` / ``BICUBIC``).
TorchResample: TypeAlias = Literal["bilinear", "bicubic", "lanczos"]
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
    n_threads = _threads(threads)
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
        n_threads,
    )
    shape = (height, width) if image.ndim == 2 else (height, width, image.shape[2])
    return np.frombuffer(out, dtype=np.uint8).reshape(shape)


def _threads(threads: int | None) -> int:
    if threads is None:
        return 0
    if operator.index(threads) < 1:
        raise ValueError(f"threads must be at least 1 (or None for automatic), got {threads}")
    return operator.index(threads)


def resize_torch(
    image: npt.NDArray[np.uint8],
    size: tuple[int, int],
    *,
    resample: TorchResample = "bilinear",
    threads: int | None = None,
) -> npt.NDArray[np.uint8]:
    """Resize ``image`` to ``size = (width, height)`` exactly as torch 2.14.1 does on CPU::

        tvF.resize(torch.from_numpy(image).permute(2, 0, 1), [height, width],
                   interpolation=resample, antialias=True).permute(1, 2, 0)

    (torchvision 0.29's native ``uint8`` path, which transformers' torchvision backend takes).
    ``image`` is a C-contiguous ``uint8`` array ``HxW`` or ``HxWxC`` with C in 1, 3, 4; each
    channel is resampled on its own; the result is a new array of the same rank. An unchanged
    size returns a copy, as torchvision returns its input. The GIL is released while resizing.

    Raises ``ValueError`` like :func:`resize`, and for a filter other than ``bilinear`` and
    ``bicubic``; ``TypeError`` if ``image`` is not a numpy array.
    """
    width, height = (operator.index(v) for v in size)
    if resample not in ("bilinear", "bicubic", "lanczos"):
        raise ValueError(
            f"unknown resample filter {resample!r} for torch's uint8 resize: expected "
            "'bilinear', 'bicubic' or 'lanczos'"
        )
    out = _native.resize_torch(image, width, height, resample, _threads(threads))
    shape = (height, width) if image.ndim == 2 else (height, width, image.shape[2])
    return np.frombuffer(out, dtype=np.uint8).reshape(shape)


def interpolate_bicubic(
    planes: npt.NDArray[np.float32], size: tuple[int, int]
) -> npt.NDArray[np.float32]:
    """``torch.nn.functional.interpolate(x[None], size=(height, width), mode="bicubic",
    align_corners=False)[0]`` on CPU, bit for bit (torch 2.14.1; Keys' cubic with ``A = -0.75``,
    edge pixels repeated, no antialiasing), for a C-contiguous float32 array ``(C, H, W)``.
    ``size`` is ``(height, width)``, as torch orders it. Returns a new ``(C, height, width)``
    float32 array.

    Raises ``ValueError`` for another dtype, rank or layout, an empty input, or a non-positive
    or too large size; ``TypeError`` if ``planes`` is not a numpy array.
    """
    height, width = (operator.index(v) for v in size)
    out = _native.interpolate_bicubic(planes, height, width)
    return np.frombuffer(out, dtype=np.float32).reshape(planes.shape[0], height, width)
