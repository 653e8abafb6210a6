"""CLIP, LLaVA-1.5 and SigLIP (``CLIPImageProcessorPil``, ``LlavaImageProcessorPil``,
``SiglipImageProcessorPil``): ``vision.ImageProcessor`` against transformers, live and bit for
bit, on every input kind and option. The reference, the test images and the comparison:
``support/parity.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.parity import (
    IMAGE_CASES,
    check_batches,
    check_files,
    check_options,
    check_pil_inputs,
    check_raw_arrays,
    configs_of,
    reference_mark,
)

pytest.importorskip("transformers", reason="the reference is transformers")
pytest.importorskip("PIL", reason="the reference resizer is Pillow")

pytestmark = reference_mark()


# ---- parity on every input kind (the checks are support.parity's) ------------------------


@pytest.mark.parametrize("config", configs_of("clip", "llava", "siglip"))
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_files(corpus: dict[str, Path], config: str, name: str) -> None:
    """Encoded files: our decoder + processor vs ``load_image`` + the PIL backend."""
    check_files(corpus, config, name)


@pytest.mark.parametrize("config", ["clip-336"])
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_pil_inputs(corpus: dict[str, Path], config: str, name: str) -> None:
    """PIL images and encoded bytes with ``alpha="white"``."""
    check_pil_inputs(corpus, config, name)


@pytest.mark.parametrize("config", ["siglip-384", "llava-pad-336"])
@pytest.mark.parametrize("channels", [1, 2, 4])
def test_raw_arrays(config: str, channels: int) -> None:
    """1- and 4-channel arrays (transformers' ``convert_to_rgb`` for numpy)."""
    check_raw_arrays(config, channels)


@pytest.mark.slow
@pytest.mark.parametrize("config", configs_of("clip", "llava", "siglip"))
def test_batches(corpus: dict[str, Path], config: str) -> None:
    """Images of mixed sizes and kinds in one call (processed in parallel, in order)."""
    check_batches(corpus, config)


OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("clip", {"resample": 2}),  # bilinear
    ("clip", {"resample": 1, "size": {"shortest_edge": 100}, "crop_size": 90}),  # lanczos
    ("clip", {"resample": 0}),  # nearest
    ("clip", {"resample": 4, "crop_size": {"height": 300, "width": 250}}),  # box, padded crop
    ("clip", {"resample": 5, "do_center_crop": False, "do_pad": True}),  # hamming, batch pad
    ("clip", {"do_center_crop": False, "do_pad": True, "pad_size": {"height": 600, "width": 700}}),
    ("clip", {"size": {"shortest_edge": 200, "longest_edge": 260}}),
    ("clip", {"size": {"max_height": 150, "max_width": 190}, "crop_size": 120}),
    ("clip", {"rescale_factor": 0.5, "do_normalize": False}),
    ("clip", {"do_rescale": False, "image_mean": [100.0, 110.0, 120.0], "image_std": 50.0}),
    ("llava", {"do_pad": True, "image_mean": [0.2, 0.9, 0.0]}),
    ("siglip", {"size": {"height": 123, "width": 45}, "do_resize": True}),
    ("siglip", {"do_resize": False}),
]


@pytest.mark.parametrize(("family", "options"), OPTIONS, ids=lambda v: str(v))
def test_options(family: str, options: dict[str, Any]) -> None:
    """Other filters, sizes, crops, paddings and switches, on a batch of two sizes."""
    check_options(family, options)
