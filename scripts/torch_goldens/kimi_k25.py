"""Kimi-K2.5: transformers 5.24's ``Kimi_K25ImageProcessor`` (torchvision backend only), and the
``<|media_pad|>`` tokens ``Kimi_K25Processor.replace_image_token`` writes per image.

Cases: every odd-shaped input and every real photo with the class defaults (which are the
published checkpoints' ``media_proc_cfg`` values: 16 384 patches, 512 a side, patch 14, merge 2,
mean/std 0.5), batches (several shapes, equal shapes grouped together), small budgets that make
big photos shrink, a per-side cap that binds, BILINEAR, CLIP mean/std with another rescale
factor, another patch/merge size, ``do_resize`` off, and the configurations the class refuses.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import numpy as np
from torch_goldens.common import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, processor_case, run_processor
from transformers.models.kimi_k25.image_processing_kimi_k25 import Kimi_K25ImageProcessor
from transformers.models.kimi_k25.processing_kimi_k25 import Kimi_K25Processor

KIND = "kimi_k25"

OUTPUTS = {"pixel_values": "pixel_values", "image_grid_thw": "image_grid_thw"}


def _counts(merge_size: int) -> Any:
    """The placeholder count per image, from ``Kimi_K25Processor.replace_image_token`` itself
    (run on a stand-in holding only what it reads: the image processor's merge size and a
    one-character image token)."""

    def counts(feature: Any) -> list[int]:
        stand_in = SimpleNamespace(
            image_processor=SimpleNamespace(merge_size=merge_size), image_token="#"
        )
        grid = {"image_grid_thw": feature["image_grid_thw"]}
        return [
            len(Kimi_K25Processor.replace_image_token(stand_in, grid, i))  # type: ignore[arg-type]
            for i in range(len(feature["image_grid_thw"]))
        ]

    return counts


def _case(names: list[str], config: dict[str, Any], arrays: dict[str, np.ndarray]) -> Any:
    def run() -> list[dict[str, Any]]:
        processor = Kimi_K25ImageProcessor(**config)
        return run_processor(
            processor, [arrays[n] for n in names], OUTPUTS, _counts(processor.merge_size)
        )

    return processor_case(KIND, names, config, run)


def cases(inputs: dict[str, np.ndarray], photos: dict[str, np.ndarray]) -> Iterable[dict[str, Any]]:
    arrays = {**inputs, **photos}
    for name in list(inputs) + list(photos):
        yield _case([name], {}, arrays)
    photo_names = list(photos)
    # batches: mixed shapes, a repeated shape (grouped by transformers), photos
    yield _case(["grace_hopper-600x512", "pixel-1x1", "flower-360x480"], {}, arrays)
    yield _case(["hopper_jpg-128x128", "crop_b-336x336", "hopper_png-128x128"], {}, arrays)
    yield _case(photo_names[:4], {}, arrays)
    # the patch budget binds (big photos shrink; sqrt scale, truncation)
    for name in ["photo_big-3024x4032", "photo_crop-1920x1080", "grace_hopper-600x512"]:
        yield _case([name], {"max_patches": 1024}, arrays)
    for name in [*photo_names[:6], "strip_wide-5x3000", "row-1x700"]:
        yield _case([name], {"max_patches": 256}, arrays)
    # the per-side cap binds
    for name in ["strip_wide-5x3000", "xmp_test-1072x2000", "photo_big-3024x4032", "column-700x1"]:
        yield _case([name], {"size": {"max_height": 32, "max_width": 32}}, arrays)
    # BILINEAR, other normalisations, other patching
    for name in ["grace_hopper-600x512", "photo_crop-1920x1080", photo_names[0]]:
        yield _case([name], {"resample": 2, "max_patches": 2048}, arrays)
    for name in ["grace_hopper-600x512", photo_names[1]]:
        yield _case(
            [name],
            {"image_mean": OPENAI_CLIP_MEAN, "image_std": OPENAI_CLIP_STD, "rescale_factor": 0.5},
            arrays,
        )
    for name in ["grace_hopper-600x512", "noise_small-31x47", photo_names[2]]:
        yield _case([name], {"patch_size": 16, "merge_size": 1, "max_patches": 4096}, arrays)
    # do_resize off: used as they are (a side not a multiple of the patch fails to patchify)
    yield _case(["crop_b-336x336"], {"do_resize": False}, arrays)
    yield _case(["hopper_jpg-128x128"], {"do_resize": False}, arrays)
    # refused configurations
    yield _case(["pixel-1x1"], {"size": {"max_height": 32, "max_width": 64}}, arrays)
