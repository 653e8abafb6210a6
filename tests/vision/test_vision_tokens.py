"""Placeholder token counts, counted natively by each family's Rust module.

The parity tests (``test_<family>.py``, ``test_torch_families.py``, ``test_torch_goldens.py``)
compare the counts with transformers' processors; these check that the native calls return them
with the tensors, that the deferred path agrees, and that every family's count equals the
formula its processor uses (the formulas the Python code held before the counts moved to Rust).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from smg_grpc_proto import _native
from smg_grpc_proto.errors import ImageProcessingError
from smg_grpc_proto.vision import ImageProcessor, VisionTokens, _tokens
from smg_grpc_proto.vision._config import FAMILIES, Family


def _images() -> list[np.ndarray[Any, np.dtype[np.uint8]]]:
    rng = np.random.default_rng(20)
    sizes = [(300, 500), (640, 200), (224, 224)]
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]


def _best_resolution(height: int, width: int, pinpoints: list[list[int]]) -> tuple[int, int]:
    best = (pinpoints[0][0], pinpoints[0][1])
    max_effective, min_wasted = 0, math.inf
    for ph, pw in pinpoints:
        scale = min(pw / width, ph / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        wasted = pw * ph - effective
        if effective > max_effective or (effective == max_effective and wasted < min_wasted):
            max_effective, min_wasted, best = effective, wasted, (ph, pw)
    return best


def _llava_next(
    orig: tuple[int, int], tile: tuple[int, int], pinpoints: Any, v: VisionTokens
) -> int:
    # LlavaNextProcessor._get_number_of_features.
    (oh, ow), (height, width) = orig, tile
    best_h, best_w = _best_resolution(oh, ow, pinpoints)
    ph, pw = height // v.patch_size, width // v.patch_size
    ch, cw = ph * (best_h // height), pw * (best_w // width)
    if ow / oh > cw / ch:
        ch -= (ch - int(round(oh * (cw / ow), 7))) // 2 * 2
    else:
        cw -= (cw - int(round(ow * (ch / oh), 7))) // 2 * 2
    count = ch * cw + ch + ph * pw + v.num_additional_image_tokens
    return count - 1 if v.vision_feature_select_strategy == "default" else count


def _expected(family: str, cfg: dict[str, Any], out: Any, vision: VisionTokens) -> tuple[int, ...]:
    """The count transformers' processor of ``family`` writes, from the processed outputs."""
    # Qwen's and GLM's processors: t·h·w / merge² per image (Glm4vProcessor.replace_image_token)
    if family.startswith(("qwen", "glm", "minimax", "kimi")):
        return tuple(int(t * h * w) // cfg["merge_size"] ** 2 for t, h, w in out.image_grid_thw)
    if family in ("clip", "llava", "siglip"):
        h, w = out.pixel_values.shape[-2:]
        p = vision.patch_size
        n = (h // p) * (w // p) + vision.num_additional_image_tokens
        n -= vision.vision_feature_select_strategy == "default"
        return (int(n),) * int(out.pixel_values.shape[0])
    if family == "llava_next":
        tile = out.pixel_values.shape[-2:]
        pins = cfg["image_grid_pinpoints"]
        return tuple(_llava_next((h, w), tile, pins, vision) for h, w in out.image_sizes.tolist())
    if family == "pixtral":
        m = cfg["spatial_merge_size"]
        ph, pw = cfg["patch_size"]["height"] * m, cfg["patch_size"]["width"] * m
        return tuple((h // ph) * (w // pw + 1) for h, w in out.image_sizes.tolist())
    if family == "gemma3":
        return tuple((1 + c) * cfg["image_seq_length"] for c in out.num_crops.tolist())
    if family == "inkling":
        # InklingProcessor.replace_image_token: num_patches placeholders
        return tuple(int(n) for n in out.num_patches.tolist())
    if family == "inkling2":
        # Inkling2Processor.replace_image_token: prod(image_grid_thw) placeholders
        return tuple(int(t * h * w) for t, h, w in out.image_grid_thw.tolist())
    if family == "internvl":
        return tuple(n * cfg["image_seq_length"] for n in out.num_patches.tolist())
    if family in ("idefics3", "smolvlm"):
        pairs = zip(out.rows.reshape(-1).tolist(), out.cols.reshape(-1).tolist(), strict=True)
        return tuple((r * c + 1) * cfg["image_seq_len"] for r, c in pairs)
    if family == "llama4":
        side = cfg["size"]["height"] // cfg["patch_size"]
        per_tile = side * side // round(1 / cfg["pixel_shuffle_ratio"] ** 2)
        return tuple(
            per_tile * (r * c + 1) if r * c > 1 else per_tile for r, c in out.aspect_ratios.tolist()
        )
    if family == "phi3_v":
        # The hub's Phi3VImageProcessor: (rows * cols + 1) * 144 + 1 + (rows + 1) * 12.
        return tuple(
            (h // 336 * (w // 336) + 1) * 144 + 1 + (h // 336 + 1) * 12
            for h, w in out.image_sizes.tolist()
        )
    if family == "mllama":
        # MllamaProcessor keeps each <|image|> as one token (cross-attention).
        return (1,) * int(out.num_tiles.size)
    if family == "gemma4":
        # patches (all but the (-1, -1) padding rows) over the pooling kernel's area
        real = (out.image_position_ids[..., 0] >= 0).sum(axis=1)
        return tuple(int(n) // cfg["pooling_kernel_size"] ** 2 for n in real)
    if family == "gemma4_unified":
        # one soft token per merged patch (all but the (-1, -1) padding rows)
        return tuple(int(n) for n in (out.image_position_ids[..., 0] >= 0).sum(axis=1))
    if family == "nemotron_h_omni":
        # NemotronH_Omni_Reasoning_V3Processor.replace_image_token: h * w // merge ** 2
        merge = round(1 / cfg["downsample_ratio"])
        return tuple(h * w // merge**2 for h, w in out.image_grid_hw.tolist())
    raise AssertionError(family)


VISION = VisionTokens(14, 1, "default")


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "phi4_multimodal"])
def test_every_family_counts_natively(family: str) -> None:
    processor = ImageProcessor.for_family(family, vision_tokens=VISION)  # type: ignore[arg-type]
    out = processor(_images())
    assert out.num_image_tokens is not None
    assert out.num_image_tokens == _expected(family, processor.config, out, VISION)
    assert all(n > 0 for n in out.num_image_tokens)


def test_phi4_multimodal_counts_natively() -> None:
    # Phi-4-multimodal's count needs its attention masks: test_torch_goldens compares it with
    # transformers; here, that it comes back once per image and positive.
    out = ImageProcessor.for_family("phi4_multimodal")(_images())
    assert out.num_image_tokens is not None
    assert len(out.num_image_tokens) == 3
    assert all(n > 256 for n in out.num_image_tokens)


@pytest.mark.parametrize("family", ["clip", "llava", "siglip", "llava_next"])
def test_tower_families_need_vision_tokens(family: str) -> None:
    assert ImageProcessor.for_family(family)(_images()).num_image_tokens is None  # type: ignore[arg-type]
    full = VisionTokens(14, 0, "full")
    out = ImageProcessor.for_family(family, vision_tokens=full)(_images()[:1])  # type: ignore[arg-type]
    with_cls = ImageProcessor.for_family(family, vision_tokens=VISION)(_images()[:1])  # type: ignore[arg-type]
    assert out.num_image_tokens is not None
    assert with_cls.num_image_tokens is not None
    # One CLS token added, one dropped by the "default" strategy: the same count.
    assert out.num_image_tokens == with_cls.num_image_tokens


def test_native_calls_return_the_counts() -> None:
    native = _native.Preprocessor("qwen2_vl", {})
    names = [name for name, _ in native.images(_images(), 0, True, "load_image", None)]
    assert names == ["pixel_values", "image_grid_thw", "num_image_tokens"]
    deferred = [n for n, _ in native.images_deferred(_images(), 0, True, "load_image", None)]
    assert deferred == names
    frames = [_images()[2]] * 4
    videos = dict(native.videos([frames], 0, True, "load_image", None))
    assert np.asarray(videos["num_video_tokens"]).tolist() == [2 * 16 * 16 // 4]
    clip = _native.Preprocessor("clip", {}, (14, 1, "default"))
    tokens = dict(clip.images(_images()[:2], 0, True, "load_image", None))["num_image_tokens"]
    assert np.asarray(tokens).tolist() == [256, 256]


def test_deferred_counts_equal_the_computed_ones() -> None:
    families: tuple[Family, ...] = ("qwen2_vl", "qwen3_vl", "gemma3", "llama4")
    for family in families:
        processor = ImageProcessor.for_family(family)
        want = processor(_images()).num_image_tokens
        assert processor.deferred(_images()).materialize().num_image_tokens == want
    qwen = ImageProcessor.for_family("qwen2_vl")
    video = [[_images()[2]] * 4]
    assert qwen.deferred(videos=video).materialize().num_video_tokens == (2 * 16 * 16 // 4,)


def test_bad_vision_tokens_are_refused() -> None:
    with pytest.raises(ImageProcessingError, match="patch_size"):
        ImageProcessor.for_family("llava", vision_tokens=VisionTokens(0))
    processor = ImageProcessor.for_family("llava", vision_tokens=VISION)
    assert processor.vision_tokens == VISION
    with pytest.raises(AttributeError):
        processor.vision_tokens = None  # type: ignore[misc]


def test_python_holds_no_count() -> None:
    # Each family counts in its Rust module; Python keeps only the tower settings.
    assert _tokens.__all__ == ["VisionTokens"]
    assert VISION.native() == (14, 1, "default")
