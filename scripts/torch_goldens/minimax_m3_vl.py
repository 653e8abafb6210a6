"""MiniMax-M3-VL: ``transformers.MiniMaxM3VLImageProcessor(**config)`` (torchvision backend only),
one CHW uint8 tensor per image; ``pixel_values`` and ``image_grid_thw``, and the ``]<]image[>[``
tokens ``MiniMaxM3VLProcessor.replace_image_token`` writes per image (``t * h * w //
merge_size**2`` of its grid row).

``MiniMaxM3VLImageProcessor.__init__`` replaces ``size == [672, 672]`` (the published
checkpoint's value) by the class attribute ``size`` itself, not a copy, and then writes
``min_pixels``/``max_pixels`` into it: constructing such a processor changes the class default
for every later instance in the process. The cases here restore the attribute after each
construction, so each case sees the class defaults transformers ships.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from torch_goldens.common import processor_case, run_processor
from transformers.models.minimax_m3_vl.image_processing_minimax_m3_vl import (
    MiniMaxM3VLImageProcessor,
)

KIND = "minimax_m3_vl"

OUTPUTS = {"pixel_values": "pixel_values", "image_grid_thw": "image_grid_thw"}

# The published MiniMax-M3 preprocessor values (the SMG gateway's documented bounds):
# size [672, 672] (replaced by the class default), 4 * 28 * 28 ... 576 * 28 * 28 pixels.
PUBLISHED: dict[str, Any] = {"size": [672, 672], "min_pixels": 3136, "max_pixels": 451584}

VARIANTS: list[dict[str, Any]] = [
    PUBLISHED,
    {"size": [672, 672]},
    {"min_pixels": 100_000, "max_pixels": 200_000},
    {"size": [672, 672], "min_pixels": 50_176, "max_pixels": 1_003_520},
    {"size": {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}},
    {"size": {"shortest_edge": 200_704}},
    {"resample": 2},
    {"patch_size": 16},
    {"merge_size": 1},
    {"temporal_patch_size": 1},
    {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
    {"rescale_factor": 1 / 127.5},
]

# Photos and odd shapes each variant runs on.
VARIANT_INPUTS = [
    "photo_resized-1080x1920",
    "noise-331x449",
    "prime_crop-97x89",
    "strip_tall-3000x5",
    "pixel-1x1",
]


def _make(config: dict[str, Any]) -> MiniMaxM3VLImageProcessor:
    saved = MiniMaxM3VLImageProcessor.size
    MiniMaxM3VLImageProcessor.size = dict(saved)
    try:
        return MiniMaxM3VLImageProcessor(**config)
    finally:
        MiniMaxM3VLImageProcessor.size = saved


def _case(names: list[str], arrays: dict[str, np.ndarray], config: dict[str, Any]) -> Any:
    def run() -> list[dict[str, Any]]:
        processor = _make(config)
        merge = processor.merge_size**2

        def counts(feature: Any) -> list[int]:
            return [int(row.prod()) // merge for row in feature["image_grid_thw"]]

        return run_processor(processor, [arrays[n] for n in names], OUTPUTS, counts)

    return processor_case(KIND, names, config, run)


def cases(inputs: dict[str, np.ndarray], photos: dict[str, np.ndarray]) -> Iterator[Any]:
    arrays = {**inputs, **photos}
    # Every real photo and every odd shape with the class defaults.
    for name in [*photos, *inputs]:
        yield _case([name], arrays, {})
    # Batches: same-shape and mixed-shape images in one call (grouped by shape, reordered).
    photo_names = sorted(photos)
    yield _case([photo_names[0], "noise-331x449", photo_names[1], "noise-331x449"], arrays, {})
    yield _case(["crop_a-335x337", "crop_b-336x336", "crop_c-337x337", "pixel-1x1"], arrays, {})
    yield _case(photo_names[:6], arrays, PUBLISHED)
    # Config variants.
    for config in VARIANTS:
        for name in VARIANT_INPUTS:
            yield _case([name], arrays, config)
    # do_resize off: sides multiples of patch_size * merge_size, and one that is not (an error).
    yield _case(["impulse-41x41"], arrays, {"do_resize": False})
    yield _case(["gradient-256x384"], arrays, {"do_resize": False, "patch_size": 16})
    yield _case(["crop_b-336x336"], arrays, {"do_resize": False})
