"""Inkling2: ``transformers.Inkling2ImageProcessor`` (torchvision only) at the pinned versions.

Every real photo and odd shape with the class defaults (sides that are multiples of 40 among
them: no padding there), a batch, and config variants (a non-square patch, CLIP mean/std, each
of rescale and normalize off, ``do_resize`` off, which the class ignores). RGBA inputs (its
checkerboard compositing) are covered by ``tests/vision/test_inkling.py``'s alpha goldens.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from torch_goldens import common
from transformers import Inkling2ImageProcessor

KIND = "inkling2"
OUTPUTS = {"pixel_values": "pixel_values", "image_grid_thw": "image_grid_thw"}

CONFIGS: list[dict[str, Any]] = [
    {"size": {"height": 32, "width": 48}},
    {"size": {"height": 14, "width": 14}},
    {"image_mean": common.OPENAI_CLIP_MEAN, "image_std": common.OPENAI_CLIP_STD},
    {"do_normalize": False},
    {"do_rescale": False},
    {"do_rescale": False, "do_normalize": False},
    {"rescale_factor": 0.25},
    {"do_resize": False},
]
VARIANT_INPUTS = ("noise_small", "prime_crop", "photo_square", "checker8", "pixel")
BATCH = ("flower2", "two_by_two", "stripes_v2", "noise_small", "crop_b")


def _counts(feature: Any) -> list[int]:
    """``Inkling2Processor.replace_image_token``: ``prod(image_grid_thw)`` placeholders."""
    return [int(t * h * w) for t, h, w in feature["image_grid_thw"].tolist()]


def _case(names: list[str], arrays: list[np.ndarray], config: dict[str, Any]) -> dict[str, Any]:
    def run() -> list[dict[str, Any]]:
        processor = Inkling2ImageProcessor(**config)
        return common.run_processor(processor, arrays, OUTPUTS, _counts)

    return common.processor_case(KIND, names, config, run)


def _named(inputs: dict[str, np.ndarray], stem: str) -> str:
    return next(name for name in inputs if name.split("-")[0] == stem)


def cases(inputs: dict[str, np.ndarray], photos: dict[str, np.ndarray]) -> Iterable[dict[str, Any]]:
    for name, array in {**photos, **inputs}.items():
        yield _case([name], [array], {})
    batch = [_named(inputs, stem) for stem in BATCH]
    yield _case(batch, [inputs[n] for n in batch], {})
    for config in CONFIGS:
        for stem in VARIANT_INPUTS:
            name = _named(inputs, stem)
            yield _case([name], [inputs[name]], config)
