"""Nemotron-H-Omni: transformers' ``NemotronH_Omni_Reasoning_V3ImageProcessor`` (torchvision
only; it resizes in float32 with torch's antialiased bicubic kernel), on every real photo and odd
shape with the class defaults, batches (the per-call patch budget depends on the number of
images), and config variants: the context length, the patch limits, the merge factor, the patch
size, BILINEAR, and the released checkpoints' legacy keys (``norm_mean`` / ``norm_std`` /
``_downsample_factor``).

Token counts: ``NemotronH_Omni_Reasoning_V3Processor.replace_image_token`` writes
``h·w // merge²`` ``<image>`` tokens per image (``merge = round(1 / downsample_ratio)``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from torch_goldens import common
from transformers.models.nemotron_h_omni.image_processing_nemotron_h_omni import (
    NemotronH_Omni_Reasoning_V3ImageProcessor,
)

KIND = "nemotron_h_omni"
OUTPUTS = {"pixel_values": "pixel_values", "image_grid_hw": "image_grid_hw"}

# Variants, each run on a few inputs.
VARIANTS: list[dict[str, Any]] = [
    {"max_model_len": 600},  # budget (600 - 4) * 4 = 2384 patches
    {"min_num_patches": 256, "max_num_patches": 4096},
    {"max_num_patches": 0, "max_model_len": 2048},  # no cap: the context decides
    {"downsample_ratio": 0.25},  # merge 4
    {"patch_size": 14},
    {"resample": 2},  # BILINEAR: the float antialiased triangle kernel
    {"min_num_patches": 64, "max_num_patches": 64},  # max == min: no upscaling branch
    {
        # the released checkpoints' preprocessor_config.json keys
        "norm_mean": [0.48145466, 0.4578275, 0.40821073],
        "norm_std": [0.26862954, 0.26130258, 0.27577711],
        "_downsample_factor": 2,
    },
    {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
]
VARIANT_INPUTS = [
    "grace_hopper-600x512",
    "photo_big-3024x4032",
    "strip_wide-5x3000",
    "pixel-1x1",
    "noise_small-31x47",
    "stripes_v3-337x500",
]


def _counts(config: dict[str, Any]) -> Any:
    merge = round(1 / config.get("downsample_ratio", 0.5))

    def counts(feature: Any) -> list[int]:
        return [int(h * w) // merge**2 for h, w in feature["image_grid_hw"].tolist()]

    return counts


def _case(
    names: list[str], config: dict[str, Any], arrays: dict[str, np.ndarray]
) -> dict[str, Any]:
    def run() -> list[dict[str, Any]]:
        processor = NemotronH_Omni_Reasoning_V3ImageProcessor(**config)
        return common.run_processor(processor, [arrays[n] for n in names], OUTPUTS, _counts(config))

    return common.processor_case(KIND, names, config, run)


def cases(inputs: dict[str, np.ndarray], photos: dict[str, np.ndarray]) -> Iterator[dict[str, Any]]:
    arrays = {**inputs, **photos}
    for name in [*photos, *inputs]:
        yield _case([name], {}, arrays)
    shapes = [n for n in VARIANT_INPUTS if n in arrays]
    for config in VARIANTS:
        for name in shapes:
            yield _case([name], config, arrays)
    # Batches: two shapes and a repeat (grouped by shape in transformers), the budget per call.
    photo_names = list(photos)
    yield _case([photo_names[0], "crop_b-336x336", photo_names[0]], {}, arrays)
    yield _case(photo_names[:5], {}, arrays)
    yield _case(photo_names[:4], {"max_model_len": 300}, arrays)  # 4 images: 4096-patch budget
    yield _case(["pixel-1x1", "row-1x700", "gradient-256x384"], {"max_model_len": 64}, arrays)
