"""Inkling: ``transformers.InklingImageProcessor`` (torchvision only) at the pinned versions.

Every real photo and odd shape with the class defaults (widths that are multiples of 40 among
them: their last patch column is padding only), a batch, the config variants ours reproduces
(another square patch, mean/std, each of rescale and normalize off, the ``rescale_image_frac``
pre-scaling with LANCZOS, BICUBIC and BILINEAR, capped, uncapped and to a size of 0), and the
configs the reference rejects (a non-square ``size``, ``do_resize`` false).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from torch_goldens import common
from transformers import InklingImageProcessor

KIND = "inkling"
OUTPUTS = {"pixel_values": "pixel_values", "num_patches": "num_patches"}

CONFIGS: list[dict[str, Any]] = [
    {"size": {"height": 32, "width": 32}},
    {"size": {"height": 16, "width": 16}, "image_mean": [0.5] * 3, "image_std": [0.5] * 3},
    {"do_normalize": False},
    {"do_rescale": False},
    {"do_rescale": False, "do_normalize": False},
    {"rescale_factor": 0.25},
    {"rescale_image_max_upscaled_long_edge": None},
    # the pre-scaling: torch's uint8 LANCZOS by default, capped at 2048 px of long edge
    {"rescale_image_frac": 0.5},
    {"rescale_image_frac": 2.0},
    {"rescale_image_frac": 1.7, "rescale_image_max_upscaled_long_edge": 300},
    {"rescale_image_frac": 1.5, "rescale_image_max_upscaled_long_edge": None},
    {"rescale_image_frac": 0.37, "resample": 3},
    {"rescale_image_frac": 0.61, "resample": 2},
    {"rescale_image_frac": 0.001},
]
ERRORS: list[dict[str, Any]] = [
    {"size": {"height": 32, "width": 40}},
    {"do_resize": False},
]
VARIANT_INPUTS = ("noise_small", "prime_crop", "photo_square", "checker8", "pixel")
BATCH = ("flower2", "two_by_two", "stripes_v2", "noise_small", "crop_b")


def _counts(feature: Any) -> list[int]:
    """``InklingProcessor.replace_image_token``: one placeholder per patch."""
    return [int(n) for n in feature["num_patches"]]


def _case(names: list[str], arrays: list[np.ndarray], config: dict[str, Any]) -> dict[str, Any]:
    def run() -> list[dict[str, Any]]:
        processor = InklingImageProcessor(**config)
        return common.run_processor(processor, arrays, OUTPUTS, _counts)

    return common.processor_case(KIND, names, config, run)


def _named(inputs: dict[str, np.ndarray], stem: str) -> str:
    return next(name for name in inputs if name.split("-")[0] == stem)


def cases(inputs: dict[str, np.ndarray], photos: dict[str, np.ndarray]) -> Iterable[dict[str, Any]]:
    for name, array in {**photos, **inputs}.items():
        yield _case([name], [array], {})
    batch = [_named(inputs, stem) for stem in BATCH]
    yield _case(batch, [inputs[n] for n in batch], {})
    for config in CONFIGS + ERRORS:
        for stem in VARIANT_INPUTS:
            name = _named(inputs, stem)
            yield _case([name], [inputs[name]], config)
