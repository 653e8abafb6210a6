"""Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 (``Qwen2VLImageProcessorPil``): ``vision.ImageProcessor``
against transformers, live and bit for bit — every input kind, options, the 200:1 aspect-ratio
limit, sizes and token counts, the family defaults, and videos (whose reference is the PIL
backend's per-frame ``resize``/``rescale``/``normalize`` followed by
``Qwen2VLVideoProcessor.patchify``'s view/permute transcribed to numpy: transformers has no
PIL video backend). The reference, the test images and the comparison: ``support/parity.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.parity import (
    IMAGE_CASES,
    META,
    QWEN3_HUB,
    assert_matches,
    assert_same,
    check_batches,
    check_files,
    check_options,
    check_pil_inputs,
    check_raw_arrays,
    configs_of,
    hf_load,
    hf_processor,
    our_processor,
    pattern,
    qwen_video_reference,
    reference_mark,
    run_hf,
)

from smg_grpc_proto.errors import (
    AspectRatioError,
    ProcessorConfigError,
    SmgProtoError,
    VideoShapeError,
)
from smg_grpc_proto.vision import ImageProcessor

pytest.importorskip("transformers", reason="the reference is transformers")
pytest.importorskip("PIL", reason="the reference resizer is Pillow")

from transformers import Qwen2VLImageProcessorPil

pytestmark = reference_mark()

QWEN_CONFIGS = ("qwen2-defaults", "qwen2-hub", "qwen3-hub")


# ---- parity on every input kind (the checks are support.parity's) ------------------------


@pytest.mark.parametrize("config", configs_of("qwen2_vl"))
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_files(corpus: dict[str, Path], config: str, name: str) -> None:
    """Encoded files: our decoder + processor vs ``load_image`` + the PIL backend."""
    check_files(corpus, config, name)


@pytest.mark.parametrize("config", ["qwen2-defaults"])
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_pil_inputs(corpus: dict[str, Path], config: str, name: str) -> None:
    """PIL images and encoded bytes with ``alpha="white"``."""
    check_pil_inputs(corpus, config, name)


@pytest.mark.parametrize("config", ["qwen2-hub", "qwen3-hub"])
@pytest.mark.parametrize("channels", [1, 2, 4])
def test_raw_arrays(config: str, channels: int) -> None:
    """1- and 4-channel arrays (transformers' ``convert_to_rgb`` for numpy)."""
    check_raw_arrays(config, channels)


@pytest.mark.slow
@pytest.mark.parametrize("config", configs_of("qwen2_vl"))
def test_batches(corpus: dict[str, Path], config: str) -> None:
    """Images of mixed sizes and kinds in one call (processed in parallel, in order)."""
    check_batches(corpus, config)


OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("qwen2_vl", {"resample": 2, "min_pixels": 20000, "max_pixels": 60000}),
    ("qwen2_vl", {"patch_size": 8, "merge_size": 3, "temporal_patch_size": 3}),
    ("qwen2_vl", {"do_normalize": False}),
    ("qwen2_vl", {"do_rescale": False, "do_normalize": False}),
]


@pytest.mark.parametrize(("family", "options"), OPTIONS, ids=lambda v: str(v))
def test_options(family: str, options: dict[str, Any]) -> None:
    """Other filters, sizes, crops, paddings and switches, on a batch of two sizes."""
    check_options(family, options)


@pytest.mark.parametrize("config", QWEN_CONFIGS)
@pytest.mark.parametrize(("height", "width"), [(1, 201), (201, 1), (2, 401), (3, 601), (1, 1000)])
def test_aspect_ratio_error(config: str, height: int, width: int) -> None:
    """Beyond 200:1, the same error (type and message) as transformers, after the "image N:"
    prefix every processor error carries."""
    array = pattern(height, width, 14)
    with pytest.raises(ValueError, match="aspect ratio") as hf_error:
        run_hf(hf_processor(config), array, input_data_format="channels_last")
    with pytest.raises(AspectRatioError) as ours:
        our_processor(config)(array)
    assert str(ours.value) == f"image 0: {hf_error.value}"
    assert isinstance(ours.value, ValueError)
    assert isinstance(ours.value, SmgProtoError)
    assert ours.value.index == 0
    # A batch names the offending image.
    with pytest.raises(AspectRatioError) as second:
        our_processor(config)([pattern(30, 30, 1), array])
    assert str(second.value) == f"image 1: {hf_error.value}"
    assert second.value.index == 1


@pytest.mark.parametrize(("height", "width"), [(1, 200), (200, 1), (3, 600), (5, 1000)])
def test_aspect_ratio_at_the_limit(height: int, width: int) -> None:
    """Exactly 200:1 is accepted by both."""
    array = pattern(height, width, 15)
    for config in QWEN_CONFIGS:
        ref = run_hf(hf_processor(config), array, input_data_format="channels_last")
        assert_matches(our_processor(config)(array), ref, f"{config} {height}x{width}")


@pytest.mark.parametrize(
    ("height", "width"),
    [
        (70, 70),
        (600, 512),
        (1000, 3000),
        pytest.param(4000, 3000, marks=pytest.mark.slow),
        (1080, 1920),
        (10, 10),
        (28, 28),
    ],
)
def test_qwen_sizes_and_tokens(height: int, width: int) -> None:
    """Sizes from the reference table (§5.1) and token counts, via cheap constant images."""
    array = np.full((height, width, 3), 77, np.uint8)
    for config in QWEN_CONFIGS:
        hf = hf_processor(config)
        out = our_processor(config)(array)
        patches = hf.get_number_of_image_patches(height, width, {})
        assert out.image_grid_thw is not None
        assert out.pixel_values is not None
        _, gh, gw = out.image_grid_thw[0].tolist()
        assert gh * gw == patches == out.pixel_values.shape[0]
        assert out.num_image_tokens == (patches // hf.merge_size**2,)


def test_qwen_family_defaults() -> None:
    """``for_family``: Qwen2/2.5 are the class defaults; Qwen3-VL/3.5 (no class of their own)
    the published configs."""
    array = pattern(300, 411, 16)
    hf = run_hf(Qwen2VLImageProcessorPil(), array, input_data_format="channels_last")
    for family in ("qwen2_vl", "qwen2_5_vl"):
        assert_matches(ImageProcessor.for_family(family)(array), hf, family)
    kwargs = {k: v for k, v in QWEN3_HUB.items() if k not in META}
    hf3 = run_hf(Qwen2VLImageProcessorPil(**kwargs), array, input_data_format="channels_last")
    for family in ("qwen3_vl", "qwen3_5"):
        assert_matches(ImageProcessor.for_family(family)(array), hf3, family)


@pytest.mark.parametrize("config", QWEN_CONFIGS)
@pytest.mark.parametrize("count", [1, 3, 4])
def test_qwen_video(corpus: dict[str, Path], config: str, count: int) -> None:
    photo = np.asarray(hf_load(corpus["grace_hopper.jpg"]))
    frames = [
        np.ascontiguousarray(photo[i * 7 : i * 7 + 500, i * 5 : i * 5 + 450]) for i in range(count)
    ]
    hf = hf_processor(config)
    pixels, grid = qwen_video_reference(hf, frames)
    ours = our_processor(config)
    out = ours(videos=frames)
    assert_same(out.pixel_values_videos, pixels, f"{config} video of {count}")
    assert_same(out.video_grid_thw, grid, f"{config} video grid")
    assert out.num_video_tokens == (int(grid.prod()) // hf.merge_size**2,)
    # Two videos at once, and images with them.
    small = [pattern(90, 120, s) for s in range(2)]
    pixels2, grid2 = qwen_video_reference(hf, small)
    both = ours(frames[0], videos=[frames, small])
    assert_same(both.pixel_values_videos, np.concatenate([pixels, pixels2]), f"{config} two videos")
    assert_same(both.video_grid_thw, np.concatenate([grid, grid2]), f"{config} two grids")
    assert_matches(both, run_hf(hf, frames[0], input_data_format="channels_last"), "image too")
    # A still image is a one-frame video padded to T frames: same patches as the image path.
    assert_same(ours(videos=[frames[:1]]).pixel_values_videos, ours(frames[0]).pixel_values, "")


def test_video_errors() -> None:
    ours = ImageProcessor.for_family("qwen2_vl")
    with pytest.raises(VideoShapeError, match="frame 1"):
        ours(videos=[pattern(60, 60, 1), pattern(61, 60, 2)])
    with pytest.raises(ProcessorConfigError, match="videos"):
        ImageProcessor.for_family("clip")(videos=[pattern(60, 60, 1)])
