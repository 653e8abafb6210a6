"""Goldens of Gemma 4 unified: transformers' ``Gemma4UnifiedImageProcessor`` (torchvision
backend only) at the pinned versions — every real photo with the class defaults (those of the
published ``preprocessor_config.json``), every odd shape, each ``max_soft_tokens`` budget, a
bilinear resize, a normalisation, other patch/kernel sizes and a rescale factor, batches, and
the budgets the class refuses. Counts: ``num_soft_tokens_per_image``, which
``Gemma4UnifiedProcessor.replace_image_token`` expands to that many image tokens."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from torch_goldens import common
from transformers.models.gemma4_unified.image_processing_gemma4_unified import (
    Gemma4UnifiedImageProcessor,
)

KIND = "gemma4_unified"

OUTPUTS = {
    "pixel_values": "pixel_values",
    "image_position_ids": "image_position_ids",
}


def _counts(feature: Any) -> list[int]:
    return [int(n) for n in feature["num_soft_tokens_per_image"]]


def _case(
    names: list[str], config: dict[str, Any], arrays: dict[str, np.ndarray]
) -> dict[str, Any]:
    def run() -> list[dict[str, Any]]:
        processor = Gemma4UnifiedImageProcessor(**config)
        return common.run_processor(processor, [arrays[n] for n in names], OUTPUTS, _counts)

    return common.processor_case(KIND, names, config, run)


def cases(inputs: dict[str, np.ndarray], photos: dict[str, np.ndarray]) -> Iterator[dict[str, Any]]:
    arrays = {**inputs, **photos}
    photo_names = sorted(photos)
    shape_names = list(inputs)
    # Every photo and every odd shape with the class defaults.
    for name in photo_names + shape_names:
        yield _case([name], {}, arrays)
    # Each other soft-token budget: a spread of photos and the edge shapes.
    budget_names = photo_names[::4] + [
        n
        for n in shape_names
        if n.split("-")[0]
        in {
            "pixel",
            "row",
            "column",
            "strip_wide",
            "strip_tall",
            "photo_big",
            "two_by_two",
            "noise",
            "prime_photo",
            "crop_d",
        }
    ]
    for budget in (70, 140, 560, 1120):
        for name in budget_names:
            yield _case([name], {"max_soft_tokens": budget}, arrays)
    # Other settings on a few inputs.
    variant_names = photo_names[1::8] + [
        n for n in shape_names if n.split("-")[0] in {"noise", "strip_tall", "gradient", "pixel"}
    ]
    variants: list[dict[str, Any]] = [
        {"resample": 2},
        {"resample": 2, "max_soft_tokens": 560},
        {"do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
        {"do_normalize": True, "image_mean": [0.1, 0.2, 0.3], "image_std": [2.0, 0.4, 0.9]},
        {
            "do_normalize": True,
            "do_rescale": False,
            "image_mean": [10.0, 20.0, 30.0],
            "image_std": [50.0, 60.0, 70.0],
        },
        {"rescale_factor": 0.5},
        {"patch_size": 14, "pooling_kernel_size": 2},
        {"patch_size": 8, "pooling_kernel_size": 1, "max_soft_tokens": 70},
    ]
    for config in variants:
        for name in variant_names:
            yield _case([name], config, arrays)
    # Batches of mixed sizes.
    yield _case(photo_names[:6], {}, arrays)
    yield _case(photo_names[6:9] + shape_names[:5], {"max_soft_tokens": 140}, arrays)
    yield _case(shape_names[::3], {"max_soft_tokens": 1120}, arrays)
    # Budgets the class refuses.
    for budget in (100, 0):
        yield _case([photo_names[0]], {"max_soft_tokens": budget}, arrays)
