"""The videos of the GLM video goldens (``scripts/gen_glm_video_goldens.py`` makes them with torch,
``tests/vision/test_glm_video.py`` checks ours against them), built the same way in both
environments from the real photos and seeded noise: numpy and Pillow only.

A photo video is ``frames`` crops of the photo (decoded by Pillow, converted to RGB), each
shifted a few pixels from the one before — frames that differ, all of one size.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from PIL import Image


def photo_video(path: Path, frames: int) -> np.ndarray:
    """``(frames, H - 3·frames, W - 2·frames, 3)`` uint8: crop ``i`` starts at ``(3i, 2i)``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pillow's notes on malformed test files
        with Image.open(path) as im:
            rgb = np.asarray(im.convert("RGB"))
    h, w = rgb.shape[0] - 3 * frames, rgb.shape[1] - 2 * frames
    return np.stack([rgb[3 * i : 3 * i + h, 2 * i : 2 * i + w] for i in range(frames)])


def noise_video(seed: int, frames: int, height: int, width: int) -> np.ndarray:
    """``(frames, height, width, 3)`` uint8 noise."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (frames, height, width, 3), dtype=np.uint8)


def frame_count(index: int) -> int:
    """The frame count of the ``index``-th photo's video: 2, 3, 4, 5, 2, … (odd counts make the
    processor repeat the last frame)."""
    return 2 + index % 4


# name -> (seed, frames, height, width): odd shapes.
NOISE = {
    "noise-1f-40x60": (1, 1, 40, 60),
    "noise-2f-1x1": (2, 2, 1, 1),
    "noise-3f-5x700": (3, 3, 5, 700),
    "noise-2f-1x300": (4, 2, 1, 300),
    "noise-4f-28x28": (5, 4, 28, 28),
    "noise-6f-90x120": (6, 6, 90, 120),
    "noise-2f-1080x1920": (7, 2, 1080, 1920),
    "noise-7f-333x517": (8, 7, 333, 517),
}


def videos(photos: dict[str, Path]) -> dict[str, np.ndarray]:
    """Every video by name: ``photo_<stem>`` for each photo (sorted by name) and the noise."""
    out: dict[str, np.ndarray] = {}
    for i, name in enumerate(sorted(photos)):
        out[f"photo_{Path(name).stem}"] = photo_video(photos[name], frame_count(i))
    for name, (seed, frames, height, width) in NOISE.items():
        out[name] = noise_video(seed, frames, height, width)
    return out
