"""The deterministic input set of the torch goldens (``tests/goldens/torch/``).

Imported by two environments: ``scripts/gen_torch_goldens.py`` under the torch reference venv,
and ``tests/vision/test_torch_goldens.py`` under the test environment. So this module needs only
numpy and Pillow (13.0.0 in both), never torch or smg_grpc_proto.

Nothing here draws random numbers: photographs are decoded by Pillow, cropped or resized by
Pillow, and the synthetic patterns are integer formulas (``uint32`` arithmetic that wraps the
same way in every numpy version). The goldens store a sha256 of every array, and the test
checks them, so a drifting generator fails loudly instead of producing silent mismatches.

Every name ends in ``-HxW`` (the array's height and width), added by :func:`torch_inputs`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
GRACE_HOPPER = ROOT / "src" / "smg_grpc_proto" / "data" / "grace_hopper.jpg"


def _open(path: Path) -> Image.Image:
    """A file decoded by Pillow as ``convert("RGB")`` does (alpha dropped, palette expanded)."""
    with Image.open(path) as im:
        return im.convert("RGB")


def _u8(image: Image.Image) -> np.ndarray:
    return np.asarray(image, dtype=np.uint8)


def _grid(h: int, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``uint32`` row, column and channel indices, broadcast to ``(h, w, 3)``."""
    y = np.arange(h, dtype=np.uint32)[:, None, None]
    x = np.arange(w, dtype=np.uint32)[None, :, None]
    c = np.arange(3, dtype=np.uint32)[None, None, :]
    return y, x, c


def _hash_noise(h: int, w: int, seed: int) -> np.ndarray:
    """Full-range per-pixel noise from an integer hash (xorshift-multiply, wrapping ``uint32``)."""
    y, x, c = _grid(h, w)
    v = (y * np.uint32(73856093)) ^ (x * np.uint32(19349663)) ^ (c * np.uint32(83492791))
    v = v ^ np.uint32(seed)
    v = v ^ (v >> np.uint32(15))
    v = v * np.uint32(2246822519)
    v = v ^ (v >> np.uint32(13))
    v = v * np.uint32(3266489917)
    v = v ^ (v >> np.uint32(16))
    return (v & np.uint32(255)).astype(np.uint8)


def _gradient(h: int, w: int) -> np.ndarray:
    """R ramps left to right, G top to bottom, B along the diagonal (each 0..255)."""
    y, x, c = _grid(h, w)
    r = x * np.uint32(255) // np.uint32(max(w - 1, 1))
    g = y * np.uint32(255) // np.uint32(max(h - 1, 1))
    b = (x + y) * np.uint32(255) // np.uint32(max(h + w - 2, 1))
    out = np.where(c == 0, r, np.where(c == 1, g, b))
    return out.astype(np.uint8)


def _checker(h: int, w: int, cell: int) -> np.ndarray:
    """Black and white squares of ``cell`` pixels (``cell=1``: the highest frequency there is),
    tinted per channel so the three planes are not identical."""
    y, x, c = _grid(h, w)
    on = ((y // np.uint32(cell)) + (x // np.uint32(cell))) % np.uint32(2)
    hi = np.uint32(255) - c * np.uint32(8)
    lo = c * np.uint32(4)
    return np.broadcast_to(np.where(on == 1, hi, lo), (h, w, 3)).astype(np.uint8)


def _stripes(h: int, w: int, period: int, *, vertical: bool) -> np.ndarray:
    """0/255 stripes, one pixel on and ``period - 1`` off: every kernel overshoots on them."""
    y, x, c = _grid(h, w)
    pos = x if vertical else y
    on = (pos + c) % np.uint32(period) == 0
    return np.broadcast_to(np.where(on, np.uint32(255), np.uint32(0)), (h, w, 3)).astype(np.uint8)


def _impulse(h: int, w: int) -> np.ndarray:
    """Black, one white pixel in the middle and one saturated red pixel at each corner."""
    out = np.zeros((h, w, 3), dtype=np.uint8)
    out[h // 2, w // 2] = 255
    for yy, xx in ((0, 0), (0, w - 1), (h - 1, 0), (h - 1, w - 1)):
        out[yy, xx] = (255, 0, 0)
    return out


def _constant(h: int, w: int, rgb: tuple[int, int, int]) -> np.ndarray:
    return np.broadcast_to(np.array(rgb, dtype=np.uint8), (h, w, 3)).copy()


def _two_by_two() -> np.ndarray:
    return np.array(
        [[[0, 255, 17], [255, 0, 240]], [[255, 255, 0], [0, 0, 255]]],
        dtype=np.uint8,
    )


def torch_inputs(pillow_images: Path) -> list[tuple[str, np.ndarray]]:
    """The ordered ``(name, uint8 HxWx3 array)`` inputs; ``pillow_images`` is the ``Tests/images``
    folder of the Pillow 13.0.0 sdist (``support.images.pillow_test_images()``). The arrays are
    read-only and C-contiguous."""
    pil = pillow_images
    grace = _open(GRACE_HOPPER)  # 512 x 600 (W x H): portrait
    flower = _open(pil / "flower.jpg")  # 480 x 360
    flower2 = _open(pil / "flower2.jpg")  # 300 x 225
    hopper = _open(pil / "hopper.jpg")  # 128 x 128
    sugarshack = _open(pil / "sugarshack.mpo")  # 640 x 480 (first frame)
    xmp = _open(pil / "xmp_test.jpg")  # 2000 x 1072
    fuji = _open(pil / "fujifilm.mpo")  # 3648 x 2736 (first frame)

    makers: list[tuple[str, Callable[[], Image.Image | np.ndarray]]] = [
        # --- photographs as decoded
        ("grace_hopper", lambda: grace),
        ("grace_hopper_transposed", lambda: grace.transpose(Image.Transpose.TRANSPOSE)),
        ("hopper_jpg", lambda: hopper),
        ("hopper_png", lambda: _open(pil / "hopper.png")),
        ("flower", lambda: flower),
        ("flower2", lambda: flower2),
        ("rgb32bf_rgba_bmp", lambda: _open(pil / "rgb32bf-rgba.bmp")),
        ("sugarshack", lambda: sugarshack),
        ("tiff_adobe_deflate", lambda: _open(pil / "tiff_adobe_deflate.png")),
        ("exif_200dpcm", lambda: _open(pil / "exif-200dpcm.jpg")),  # 200 x 200
        ("icc_profile_big", lambda: _open(pil / "icc_profile_big.jpg")),
        ("xmp_test", lambda: xmp),
        # --- photographs cropped or resized (Pillow) to edge sizes
        ("photo_resized", lambda: xmp.resize((1920, 1080), Image.Resampling.BICUBIC)),
        ("photo_crop", lambda: fuji.crop((1300, 400, 1300 + 1080, 400 + 1920))),
        ("photo_big", lambda: fuji.resize((4032, 3024), Image.Resampling.BICUBIC)),
        ("photo_square", lambda: fuji.crop((1700, 800, 2700, 1800))),
        ("crop_a", lambda: sugarshack.crop((101, 57, 101 + 337, 57 + 335))),
        ("crop_b", lambda: sugarshack.crop((150, 80, 150 + 336, 80 + 336))),
        ("crop_c", lambda: sugarshack.crop((0, 143, 337, 143 + 337))),
        ("crop_d", lambda: grace.crop((32, 60, 32 + 448, 60 + 448))),
        ("crop_e", lambda: grace.crop((65, 151, 65 + 447, 151 + 449))),
        ("row", lambda: xmp.crop((600, 500, 600 + 700, 501))),
        ("column", lambda: xmp.crop((1000, 200, 1001, 200 + 700))),
        ("strip_wide", lambda: fuji.crop((300, 1400, 300 + 3000, 1405))),
        ("strip_tall", lambda: flower.resize((5, 3000), Image.Resampling.BILINEAR)),
        ("pixel", lambda: hopper.resize((1, 1), Image.Resampling.BOX)),
        ("prime_photo", lambda: flower2.resize((17, 13), Image.Resampling.LANCZOS)),
        ("prime_crop", lambda: hopper.crop((11, 5, 11 + 89, 5 + 97))),
        ("flower_portrait", lambda: flower.resize((211, 307), Image.Resampling.HAMMING)),
        # --- synthetic patterns
        ("two_by_two", _two_by_two),
        ("checker1", lambda: _checker(64, 64, 1)),
        ("checker8", lambda: _checker(120, 200, 8)),
        ("stripes_v3", lambda: _stripes(337, 500, 3, vertical=True)),
        ("stripes_v2", lambda: _stripes(100, 1000, 2, vertical=True)),
        ("stripes_h5", lambda: _stripes(1000, 100, 5, vertical=False)),
        ("gradient", lambda: _gradient(256, 384)),
        ("noise", lambda: _hash_noise(331, 449, 0x5EED)),
        ("noise_small", lambda: _hash_noise(31, 47, 7)),
        ("impulse", lambda: _impulse(41, 41)),
        ("constant", lambda: _constant(57, 43, (17, 128, 250))),
        ("white", lambda: _constant(29, 23, (255, 255, 255))),
    ]
    out: list[tuple[str, np.ndarray]] = []
    for label, make in makers:
        made = make()
        array = np.ascontiguousarray(_u8(made) if isinstance(made, Image.Image) else made)
        if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
            raise AssertionError(f"{label}: {array.dtype} {array.shape}")
        array.setflags(write=False)
        h, w = array.shape[:2]
        out.append((f"{label}-{h}x{w}", array))
    names = [name for name, _ in out]
    if len(set(names)) != len(names):
        raise AssertionError("duplicate input names")
    return out


def photo_inputs(photos: dict[str, Path]) -> list[tuple[str, np.ndarray]]:
    """The real photographs of the parity corpus (``support.images.real_photos()``: Grace Hopper,
    Pillow's and scikit-image's photos) as ``(name, uint8 HxWx3 array)``, each decoded by Pillow
    as ``convert("RGB")`` does (no EXIF rotation: an array has none), named
    ``photo_<file stem>-HxW``. The per-family torch goldens run every family on all of them."""
    out = []
    for file, path in sorted(photos.items()):
        a = _u8(_open(path))
        a.setflags(write=False)
        stem = Path(file).stem.replace("-", "_")
        out.append((f"photo_{stem}-{a.shape[0]}x{a.shape[1]}", a))
    return out
