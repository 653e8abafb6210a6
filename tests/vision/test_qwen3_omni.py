"""Qwen3-Omni (``qwen3_omni_moe``): its thinker's image and video towers against transformers
5.24, live and bit for bit.

transformers maps the model type to ``Qwen2VLImageProcessor`` / ``Qwen2VLVideoProcessor``; the
published ``preprocessor_config.json`` (``support.parity.QWEN3_OMNI_HUB``) sets patch 16 and
3 136 … 12 845 056 pixels, and ``Qwen3OmniMoeProcessor`` passes its own video ``size``
(128·32² … 768·32² pixels) to the video processor on every call. Images are compared with
``Qwen2VLImageProcessorPil`` on every input kind; videos with the PIL backend's per-frame
arithmetic at the processor's video size followed by ``Qwen2VLVideoProcessor.patchify``
(``support.parity.qwen_video_reference``: transformers has no PIL video backend). Audio (the
Whisper features of the same file) is not ours.

Also: how a model is recognised — the ``processor_class`` ``Qwen3OmniMoeProcessor``, and
``config.json``'s ``model_type`` (``qwen3_omni_moe``, and the Qwen3.5 aliases the SMG gateway
accepts: ``qwen3_5_moe``, ``qwen3_6``, ``qwen4_exp``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.parity import (
    IMAGE_CASES,
    META,
    QWEN3_HUB,
    QWEN3_OMNI_HUB,
    QWEN3_OMNI_VIDEO_SIZE,
    assert_matches,
    assert_same,
    check_batches,
    check_files,
    check_pil_inputs,
    check_raw_arrays,
    hf_load,
    pattern,
    qwen_video_reference,
    reference_mark,
    run_hf,
)

from smg_grpc_proto import _native
from smg_grpc_proto.errors import AspectRatioError, ProcessorConfigError, VideoShapeError
from smg_grpc_proto.vision import ImageProcessor

pytest.importorskip("transformers", reason="the reference is transformers")
pytest.importorskip("PIL", reason="the reference resizer is Pillow")

from transformers import Qwen2VLImageProcessorPil

pytestmark = reference_mark()

CONFIG = "qwen3_omni-hub"
HUB_KWARGS = {k: v for k, v in QWEN3_OMNI_HUB.items() if k not in META}


def _hf(**overrides: Any) -> Any:
    return Qwen2VLImageProcessorPil(**{**HUB_KWARGS, **overrides})


# ---- images: parity on every input kind ---------------------------------------------------


@pytest.mark.parametrize("name", IMAGE_CASES)
def test_files(corpus: dict[str, Path], name: str) -> None:
    check_files(corpus, CONFIG, name)


@pytest.mark.parametrize("name", IMAGE_CASES)
def test_pil_inputs(corpus: dict[str, Path], name: str) -> None:
    check_pil_inputs(corpus, CONFIG, name)


@pytest.mark.parametrize("channels", [2, 1, 4])
def test_raw_arrays(channels: int) -> None:
    check_raw_arrays(CONFIG, channels)


def test_batches(corpus: dict[str, Path]) -> None:
    check_batches(corpus, CONFIG)


# 1x1 (scaled up to the 3 136-pixel floor), strips up to the 200:1 limit, odd sizes, a size
# past the 12 845 056-pixel cap (scaled down).
SHAPES = [(1, 1), (1, 150), (150, 1), (2, 399), (37, 23), (64, 64), (333, 517), (4000, 3300)]


@pytest.mark.parametrize(("height", "width"), SHAPES)
def test_random_shapes(height: int, width: int) -> None:
    array = pattern(height, width, height * 7 + width)
    ref = run_hf(_hf(), array, input_data_format="channels_last")
    out = ImageProcessor.from_pretrained(QWEN3_OMNI_HUB)(array)
    assert_matches(out, ref, f"{height}x{width}")
    _, gh, gw = (int(v) for v in out.image_grid_thw[0])
    assert out.num_image_tokens == (gh * gw // 4,)


def test_random_batch() -> None:
    rng = np.random.default_rng(5)
    arrays = [
        rng.integers(0, 256, (int(h), int(w), 3), dtype=np.uint8)
        for h, w in rng.integers(1, 700, (6, 2))
        if max(h, w) / min(h, w) <= 200
    ]
    ref = run_hf(_hf(), arrays, input_data_format="channels_last")
    assert_matches(ImageProcessor.for_family("qwen3_omni_moe")(arrays), ref, "random batch")


def test_aspect_ratio_limit() -> None:
    with pytest.raises(AspectRatioError):
        ImageProcessor.for_family("qwen3_omni_moe")(pattern(1, 201, 3))


def test_family_defaults_are_the_published_config() -> None:
    """``for_family`` is the published checkpoints' preprocessor config, as transformers loads
    it, and the processor's video size."""
    ours = ImageProcessor.for_family("qwen3_omni_moe")
    from_file = ImageProcessor.from_pretrained(QWEN3_OMNI_HUB)
    assert ours.family == from_file.family == "qwen3_omni_moe"
    assert ours.config == from_file.config
    assert ours.config["video_size"] == QWEN3_OMNI_VIDEO_SIZE
    assert ours.config["size"] == {"shortest_edge": 3136, "longest_edge": 12845056}
    array = pattern(300, 411, 16)
    assert_matches(ours(array), run_hf(_hf(), array, input_data_format="channels_last"), "")


# ---- videos -------------------------------------------------------------------------------


def _frames(corpus: dict[str, Path], count: int, height: int = 500, width: int = 450) -> list[Any]:
    photo = np.asarray(hf_load(corpus["grace_hopper.jpg"]))
    return [
        np.ascontiguousarray(photo[i * 7 : i * 7 + height, i * 5 : i * 5 + width])
        for i in range(count)
    ]


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5])
def test_video(corpus: dict[str, Path], count: int) -> None:
    """Frames resized at the processor's video size (not the image bounds), grouped two at a
    time with the last frame repeated."""
    frames = _frames(corpus, count)
    pixels, grid = qwen_video_reference(_hf(), frames, QWEN3_OMNI_VIDEO_SIZE)
    out = ImageProcessor.from_pretrained(QWEN3_OMNI_HUB)(videos=frames)
    assert_same(out.pixel_values_videos, pixels, f"video of {count}")
    assert_same(out.video_grid_thw, grid, "video grid")
    assert out.num_video_tokens == (int(grid.prod()) // 4,)


def test_videos_small_large_and_with_images(corpus: dict[str, Path]) -> None:
    """A small clip scaled up to 131 072 pixels, a large one down to 786 432, two videos and
    images in one call (images keep their own bounds)."""
    ours = ImageProcessor.for_family("qwen3_omni_moe")
    small = [pattern(40, 60, s) for s in range(3)]
    large = [pattern(1500, 2100, s) for s in range(2)]
    hf = _hf()
    p_small, g_small = qwen_video_reference(hf, small, QWEN3_OMNI_VIDEO_SIZE)
    p_large, g_large = qwen_video_reference(hf, large, QWEN3_OMNI_VIDEO_SIZE)
    assert int(g_small[0, 1] * g_small[0, 2]) * 256 >= 131072
    assert int(g_large[0, 1] * g_large[0, 2]) * 256 <= 786432
    # the image bounds give other sizes: the video size is what frames are resized with
    for clip, grid in ((small, g_small), (large, g_large)):
        image_grid = ours(clip[0]).image_grid_thw
        assert image_grid[0].tolist()[1:] != grid[0].tolist()[1:]
    image = pattern(300, 411, 1)
    out = ours(image, videos=[small, large])
    assert_same(out.pixel_values_videos, np.concatenate([p_small, p_large]), "two videos")
    assert_same(out.video_grid_thw, np.concatenate([g_small, g_large]), "two grids")
    assert_matches(out, run_hf(hf, image, input_data_format="channels_last"), "image")


def test_video_size_override_and_errors() -> None:
    """``video_size`` is a setting like ``size`` (a caller's ``videos_kwargs``); bad values and
    frames of different sizes are refused with the field named."""
    size = {"shortest_edge": 3136, "longest_edge": 200704}
    frames = [pattern(300, 420, s) for s in range(2)]
    out = ImageProcessor("qwen3_omni_moe", {"video_size": size})(videos=frames)
    pixels, grid = qwen_video_reference(_hf(), frames, size)
    assert_same(out.pixel_values_videos, pixels, "video_size override")
    assert_same(out.video_grid_thw, grid, "video_size override grid")
    for bad in ({"shortest_edge": 0, "longest_edge": 10}, {"height": 3}, 128):
        with pytest.raises(ProcessorConfigError, match="video_size"):
            ImageProcessor("qwen3_omni_moe", {"video_size": bad})
    with pytest.raises(VideoShapeError):
        ImageProcessor.for_family("qwen3_omni_moe")(videos=[pattern(60, 60, 1), pattern(61, 60, 2)])


def test_video_second_per_grid() -> None:
    """``Qwen3OmniMoeProcessor`` returns ``video_second_per_grid`` = ``temporal_patch_size / fps``
    per video (``fps`` 1.0 unless the caller gives one): float32, deferred or not."""
    frames = [pattern(64, 64, s) for s in range(3)]
    out = ImageProcessor.for_family("qwen3_omni_moe")(videos=[frames, frames[:1]])
    assert_same(out.video_second_per_grid, np.array([2.0, 2.0], np.float32), "default fps 1")
    fast = ImageProcessor("qwen3_omni_moe", {"fps": 2})(videos=[frames])
    assert_same(fast.video_second_per_grid, np.array([1.0], np.float32), "fps 2")
    odd = ImageProcessor("qwen3_omni_moe", {"fps": 3.0})
    assert_same(odd(videos=[frames]).video_second_per_grid, np.array([2 / 3], np.float32), "")
    deferred = odd.deferred(videos=[frames])
    assert_same(deferred.ready.video_second_per_grid, np.array([2 / 3], np.float32), "deferred")
    assert ImageProcessor.for_family("qwen3_omni_moe")(frames[0]).video_second_per_grid is None
    for bad in (0, -1.0, float("inf"), "2"):
        with pytest.raises(ProcessorConfigError, match="fps"):
            ImageProcessor("qwen3_omni_moe", {"fps": bad})


def test_other_qwen_families_have_no_video_size() -> None:
    for family in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"):
        processor = ImageProcessor.for_family(family)  # type: ignore[arg-type]
        assert "video_size" not in processor.config
        assert "fps" not in processor.config
        assert processor(videos=[pattern(64, 64, 1)]).video_second_per_grid is None


# ---- recognition ----------------------------------------------------------------------------


def _model_dir(tmp_path: Path, config: dict[str, Any], preprocessor: dict[str, Any]) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(preprocessor), encoding="utf-8")
    return tmp_path


def test_recognised_by_processor_class_and_model_type(tmp_path: Path) -> None:
    # the published file alone: its processor_class names the family over Qwen2VLImageProcessor
    assert ImageProcessor.from_pretrained(QWEN3_OMNI_HUB).family == "qwen3_omni_moe"
    # a file without processor_class, in a directory whose config.json names the model type
    bare = {k: v for k, v in QWEN3_OMNI_HUB.items() if k != "processor_class"}
    assert ImageProcessor.from_pretrained(bare).family == "qwen2_vl"  # the class alone
    for model_type in ("qwen3_omni_moe", "qwen3_omni_moe_thinker"):
        directory = _model_dir(tmp_path / model_type, {"model_type": model_type}, bare)
        processor = ImageProcessor.from_pretrained(directory)
        assert processor.family == "qwen3_omni_moe"
        assert processor.config["video_size"] == QWEN3_OMNI_VIDEO_SIZE
        # the file path in that directory too
        path = directory / "preprocessor_config.json"
        assert ImageProcessor.from_pretrained(path).family == "qwen3_omni_moe"
    # family= wins
    assert ImageProcessor.from_pretrained(QWEN3_OMNI_HUB, family="qwen2_vl").family == "qwen2_vl"


@pytest.mark.parametrize(
    ("model_type", "family"),
    [
        ("qwen3_5", "qwen3_5"),
        ("qwen3_5_moe", "qwen3_5"),
        ("qwen3_6", "qwen3_5"),
        ("qwen3_6_moe", "qwen3_5"),
        ("qwen4_exp", "qwen3_5"),
        ("qwen3_vl", "qwen3_vl"),
        ("qwen3_vl_moe", "qwen3_vl"),
        ("qwen2_5_vl", "qwen2_5_vl"),
        ("qwen2_vl", "qwen2_vl"),
    ],
)
def test_gateway_aliases(tmp_path: Path, model_type: str, family: str) -> None:
    """The model types the SMG gateway files under Qwen3-VL (``qwen3_5``, ``qwen3_5_moe``,
    ``qwen4_exp``; ``qwen3.6`` spelled as a model type) name the family transformers 5.24 gives
    them (Qwen3.5's: same image processor, video processor, processor and token ids)."""
    assert _native.family_of_model_type(model_type) == family
    directory = _model_dir(tmp_path, {"model_type": model_type}, QWEN3_HUB)
    processor = ImageProcessor.from_pretrained(directory)
    assert processor.family == family
    # the same preprocessing: every Qwen3 file gives the same pixels whatever the family
    array = pattern(123, 321, 4)
    kwargs = {k: v for k, v in QWEN3_HUB.items() if k not in META}
    ref = run_hf(Qwen2VLImageProcessorPil(**kwargs), array, input_data_format="channels_last")
    assert_matches(processor(array), ref, model_type)


def test_unknown_model_type_falls_back_to_the_class(tmp_path: Path) -> None:
    assert _native.family_of_model_type("qwen9_unknown") is None
    assert _native.family_of_model_type("llava") is None  # names no alias: the class decides
    assert _native.family_of_processor_class("Qwen3VLProcessor") is None
    directory = _model_dir(tmp_path, {"model_type": "qwen9_unknown"}, QWEN3_HUB)
    assert ImageProcessor.from_pretrained(directory).family == "qwen2_vl"
