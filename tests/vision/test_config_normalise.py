"""Each family's reading of a transformers ``preprocessor_config.json`` (now in its Rust module,
``_native.normalise_config``) against the Python ``normalise`` it replaced, kept here verbatim
as the oracle: equal results (types included) on every family's defaults and on the varied forms
a config takes (int, list and dict sizes, ``crop_size``/``pad_size``, Qwen's ``min_pixels``/
``max_pixels`` overrides, ``None`` values, unknown keys), the same error for a value that is no
size, and the same family for every class name.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from smg_grpc_proto import _native
from smg_grpc_proto.vision import _config
from smg_grpc_proto.vision._config import FAMILIES, Family

# ---- the oracle: smg_grpc_proto/vision/_config.py before the families moved to Rust ----------

QWEN: frozenset[str] = frozenset(
    {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_omni_moe"}
)

# transformers class names (without the "Fast"/"Pil" backend suffix) -> family.
_CLASSES: dict[str, Family] = {
    "Qwen2VLImageProcessor": "qwen2_vl",
    "Qwen2_5_VLImageProcessor": "qwen2_5_vl",
    "CLIPImageProcessor": "clip",
    "LlavaImageProcessor": "llava",
    "SiglipImageProcessor": "siglip",
    "LlavaNextImageProcessor": "llava_next",
    "PixtralImageProcessor": "pixtral",
    "Gemma3ImageProcessor": "gemma3",
    "GotOcr2ImageProcessor": "internvl",
    "Idefics3ImageProcessor": "idefics3",
    "SmolVLMImageProcessor": "smolvlm",
    "Llama4ImageProcessor": "llama4",
    "Phi4MultimodalImageProcessor": "phi4_multimodal",
    "Phi3VImageProcessor": "phi3_v",
    "MllamaImageProcessor": "mllama",
    "Gemma4ImageProcessor": "gemma4",
    "Gemma4UnifiedImageProcessor": "gemma4_unified",
    "Glm4vImageProcessor": "glm4v",
    "Glm46VImageProcessor": "glm46v",
    "Glm5NextImageProcessor": "glm5_next",
    "InklingImageProcessor": "inkling",
    "Inkling2ImageProcessor": "inkling2",
    "MiniMaxM3VLImageProcessor": "minimax_m3_vl",
    "Kimi_K25ImageProcessor": "kimi_k25",
    "NemotronH_Omni_Reasoning_V3ImageProcessor": "nemotron_h_omni",
}

_COMMON = (
    "do_resize",
    "resample",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "image_mean",
    "image_std",
    "pass_order",
)
_KEYS: dict[str, tuple[str, ...]] = {
    "qwen": ("patch_size", "merge_size", "temporal_patch_size"),
    "clip": ("do_center_crop", "do_pad"),
    "llava_next": ("do_center_crop", "do_pad", "image_grid_pinpoints"),
    "pixtral": ("do_center_crop", "do_pad", "spatial_merge_size"),
    "gemma3": (
        "do_pan_and_scan",
        "pan_and_scan_min_crop_size",
        "pan_and_scan_max_num_crops",
        "pan_and_scan_min_ratio_to_activate",
        "image_seq_length",
    ),
    "internvl": ("crop_to_patches", "min_patches", "max_patches", "image_seq_length"),
    "idefics3": ("max_image_size", "do_image_splitting", "do_pad", "image_seq_len"),
    "llama4": ("max_patches", "resize_to_max_canvas", "patch_size", "pixel_shuffle_ratio"),
    "phi4_multimodal": ("patch_size", "dynamic_hd"),
    "phi3_v": ("num_crops",),
    "mllama": ("max_image_tiles", "do_pad"),
    "gemma4": ("patch_size", "max_soft_tokens", "pooling_kernel_size"),
    "nemotron_h_omni": (
        "patch_size",
        "downsample_ratio",
        "min_num_patches",
        "max_num_patches",
        "max_model_len",
    ),
    "glm4v": ("patch_size", "merge_size", "temporal_patch_size"),
    "inkling": ("rescale_image_frac", "rescale_image_max_upscaled_long_edge"),
    "inkling2": (),
    "minimax": ("patch_size", "merge_size", "temporal_patch_size"),
    "glm5_next": (
        "patch_size",
        "merge_size",
        "temporal_patch_size",
        "min_image_tokens",
        "max_image_tokens",
        # ours: the video processor's token bounds
        "video_min_image_tokens",
        "video_max_image_tokens",
    ),
    "kimi_k25": ("max_patches", "patch_size", "merge_size"),
}
# The hub's Phi3VImageProcessor takes only these keys.
_PHI3_V = ("image_mean", "image_std", "num_crops")

# Families whose class has default_to_square = True: an int size is a square.
_SQUARE: frozenset[str] = frozenset(
    {"pixtral", "gemma3", "internvl", "llama4", "phi4_multimodal", "mllama", "kimi_k25", "inkling2"}
)
# Families whose size, crop and pad keys need none of the CLIP-like handling below.
_OWN_SIZES: frozenset[str] = frozenset(
    {"gemma3", "internvl", "idefics3", "llama4", "phi4_multimodal", "phi3_v", "mllama", "gemma4"}
    | {"glm4v", "glm46v", "glm5_next", "gemma4_unified", "minimax_m3_vl", "kimi_k25"}
    | {"nemotron_h_omni", "inkling", "inkling2"}
)
# Families whose class reads no size at all (Gemma 4: the patch budget drives the resize).
# GLM-5-next's resize reads min/max_image_tokens, never size.
# Nemotron-H-Omni's resize reads the patch limits, never size.
_NO_SIZE: frozenset[str] = frozenset(
    {"phi3_v", "gemma4", "gemma4_unified", "glm5_next", "nemotron_h_omni"}
)

CONFIG_NAME = "preprocessor_config.json"


def _kind(family: Family) -> str:
    if family in QWEN:
        return "qwen"
    if family in ("idefics3", "smolvlm"):
        return "idefics3"
    if family in ("glm4v", "glm46v"):
        return "glm4v"  # GLM-4.6V's class is GLM-4.1V's code
    if family == "glm5_next":
        return "glm5_next"
    if family == "gemma4_unified":
        return "gemma4"  # Gemma 4's keys, read the same way
    if family == "minimax_m3_vl":
        return "minimax"
    own = (
        "llava_next",
        "pixtral",
        "gemma3",
        "internvl",
        "llama4",
        "phi4_multimodal",
        "phi3_v",
        "mllama",
        "gemma4",
        "inkling",
        "inkling2",
        "kimi_k25",
        "nemotron_h_omni",
    )
    return family if family in own else "clip"


def _old_family_of(config: Mapping[str, Any]) -> Family:
    """The family of a transformers config, from ``image_processor_type``."""
    name = config.get("image_processor_type") or config.get("video_processor_type")
    if not isinstance(name, str):
        raise ValueError(
            "the config names no image_processor_type; pass family=... "
            f"(one of {', '.join(FAMILIES)})"
        )
    base = name.removesuffix("Fast").removesuffix("Pil")
    if base in _CLASSES:
        return _CLASSES[base]
    if base in ("Qwen2VLVideoProcessor", "Qwen3VLVideoProcessor"):
        return "qwen3_vl" if base.startswith("Qwen3") else "qwen2_vl"
    raise ValueError(
        f"image_processor_type {name!r} is not supported; supported: "
        f"{', '.join(sorted(_CLASSES))} (pass family=... to force one)"
    )


def _size_dict(value: Any, *, square: bool) -> dict[str, int]:
    if isinstance(value, Mapping):
        return {str(k): v for k, v in value.items() if v is not None}
    if isinstance(value, int) and not isinstance(value, bool):
        return {"height": value, "width": value} if square else {"shortest_edge": value}
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return {"height": value[0], "width": value[1]}
    raise ValueError(f"cannot read a size from {value!r}")


def _old_normalise(family: Family, config: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``config`` that ``family`` uses, in the native processor's form."""
    kind = _kind(family)
    out: dict[str, Any] = {}
    if kind == "nemotron_h_omni":
        # its __init__: kwargs.setdefault("image_mean", norm_mean), likewise image_std
        config = dict(config)
        for legacy, key in (("norm_mean", "image_mean"), ("norm_std", "image_std")):
            if config.get(legacy) is not None and key not in config:
                config[key] = config[legacy]
    keys = _PHI3_V if kind == "phi3_v" else (*_COMMON, *_KEYS[kind])
    for key in keys:
        value = config.get(key)
        if value is not None:
            out[key] = list(value) if isinstance(value, tuple) else value
    for key in ("image_mean", "image_std"):
        if key in out and not isinstance(out[key], (int, float)):
            out[key] = [float(v) for v in out[key]]
    # Inkling: None is "no cap" (a value of its own, not the class default): false natively.
    cap = "rescale_image_max_upscaled_long_edge"
    if kind == "inkling" and cap in config and config[cap] is None:
        out[cap] = False
    if kind == "minimax" and config.get("size") == [672, 672]:
        # MiniMaxM3VLImageProcessor.__init__: the published checkpoint's stale size is replaced
        # by the class default
        config = {k: v for k, v in config.items() if k != "size"}
    if config.get("size") is not None and kind not in _NO_SIZE:
        out["size"] = _size_dict(config["size"], square=family in _SQUARE)
    if family == "pixtral" and config.get("patch_size") is not None:
        # get_size_dict(patch_size, default_to_square=True); anything else is for the native
        # processor to reject with a precise error.
        patch = config["patch_size"]
        is_int = isinstance(patch, int) and not isinstance(patch, bool)
        out["patch_size"] = (
            _size_dict(patch, square=True) if is_int or isinstance(patch, Mapping) else patch
        )
    if kind == "qwen":
        size = dict(out.get("size", {}))
        for key, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
            if config.get(key) is not None:
                size[edge] = config[key]
                size.pop(key, None)
        if size:
            if set(size) == {"shortest_edge"} or set(size) == {"longest_edge"}:
                # Complete a partial override from the class default the processor would keep.
                size = {**_qwen_default_size(family), **size}
            out["size"] = size
        if family == "qwen3_omni_moe" and config.get("video_size") is not None:
            # Qwen3-Omni's processor video size (ours; absent from transformers' files)
            out["video_size"] = _size_dict(config["video_size"], square=False)
        if family == "qwen3_omni_moe" and config.get("fps") is not None:
            out["fps"] = config["fps"]  # the caller's video fps (video_second_per_grid)
    elif kind == "minimax":
        # Qwen2-VL's folding, but a partial size stays partial (MiniMaxM3VLImageProcessor keeps
        # it; its resize then raises), and no size means the class default
        folds = {
            edge: config[key]
            for key, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge"))
            if config.get(key) is not None
        }
        if folds:
            size = dict(out.get("size", {"shortest_edge": 3136, "longest_edge": 451584}))
            size.update(folds)
            size.pop("min_pixels", None)
            size.pop("max_pixels", None)
            out["size"] = size
    elif kind == "glm4v" and config.get("video_size") is not None:
        # ours: GLM-4.1V/4.6V's video processor size (absent from transformers' image files)
        out["video_size"] = _size_dict(config["video_size"], square=False)
    elif kind not in _OWN_SIZES:
        if config.get("crop_size") is not None:
            out["crop_size"] = _size_dict(config["crop_size"], square=True)
        if family == "clip" and config.get("use_square_size"):
            out["size"] = {"height": 224, "width": 224}
        if family in ("clip", "siglip") and "pad_size" in config:
            pad = config["pad_size"]
            out["pad_size"] = None if pad is None else _size_dict(pad, square=True)
        if "image_grid_pinpoints" in out:
            out["image_grid_pinpoints"] = [list(p) for p in out["image_grid_pinpoints"]]
    if family == "kimi_k25" and isinstance(config.get("media_proc_cfg"), Mapping):
        # The hub checkpoints' nested settings, for the keys the file does not set itself.
        media = config["media_proc_cfg"]
        for src, key in (
            ("in_patch_limit", "max_patches"),
            ("patch_size", "patch_size"),
            ("merge_kernel_size", "merge_size"),
            ("image_mean", "image_mean"),
            ("image_std", "image_std"),
        ):
            if key not in out and media.get(src) is not None:
                value = media[src]
                if key in ("image_mean", "image_std") and not isinstance(value, (int, float)):
                    value = [float(v) for v in value]
                out[key] = value
        side = media.get("patch_limit_on_one_side")
        if "size" not in out and side is not None:
            out["size"] = {"max_height": side, "max_width": side}
        for key in ("transparent_bg_config", "fixed_output_tokens"):
            if media.get(key) is not None:
                value = media[key]
                out[key] = "set" if isinstance(value, (Mapping, list, tuple)) else value
    return out


def _qwen_default_size(family: Family) -> dict[str, int]:
    if family in ("qwen3_vl", "qwen3_5"):
        return {"shortest_edge": 65536, "longest_edge": 16777216}
    if family == "qwen3_omni_moe":
        return {"shortest_edge": 3136, "longest_edge": 12845056}
    return {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}


# ---- the differential tests -------------------------------------------------------------------


def _typed(value: Any) -> Any:
    """``value`` with every leaf tagged by its type (``1 == 1.0 == True`` in Python)."""
    if isinstance(value, Mapping):
        return ("dict", sorted((str(k), _typed(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_typed(v) for v in value])
    return (type(value).__name__, value)


def _outcome(function: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """``("ok", result)``, or ``("error", message)`` for a ``ValueError``."""
    try:
        return "ok", _typed(function(*args))
    except ValueError as exc:
        return "error", str(exc)


def _same(family: Family, config: Mapping[str, Any]) -> None:
    expected = _outcome(_old_normalise, family, config)
    assert _outcome(_config.normalise, family, config) == expected, (family, config)


SIZES: list[Any] = [
    336,
    2**70,
    [336, 448],
    (336, 448),
    {"shortest_edge": 224},
    {"height": 336, "width": 448},
    {"shortest_edge": 3136, "longest_edge": 1003520},
    {"longest_edge": 1536},
    {"max_height": 4, "max_width": 5},
    {"height": 336, "width": None},
    {"shortest_edge": 100, "min_pixels": 7},
    {},
    None,
    # No sizes: the same error.
    "336",
    True,
    [1, 2, 3],
    3.5,
]

VARIED: list[dict[str, Any]] = [
    {},
    {"image_processor_type": "X", "processor_class": "Y", "unknown": 1},
    *({"size": size} for size in SIZES),
    *({"crop_size": size} for size in SIZES),
    *({"pad_size": size} for size in SIZES),
    *({"size": size, "crop_size": 224, "pad_size": [8, 9]} for size in SIZES[:8]),
    {"use_square_size": True},
    {"use_square_size": 1, "size": {"shortest_edge": 100}},
    {"use_square_size": False, "size": 300},
    {"use_square_size": None},
    {"use_square_size": "", "size": 300},
    {"min_pixels": 1000},
    {"max_pixels": 2000},
    {"video_size": {"shortest_edge": 10, "longest_edge": 20}},
    {"video_size": 12},
    {"video_size": "12"},
    {"fps": 2.5},
    {"fps": 2},
    {"min_pixels": 1000, "max_pixels": 2000},
    {"min_pixels": None, "max_pixels": 2000},
    {"min_pixels": 1000, "size": {"longest_edge": 9999}},
    {"max_pixels": 2000, "size": {"shortest_edge": 10, "longest_edge": 20}},
    {"max_pixels": 2000, "size": {"max_pixels": 5, "min_pixels": 6}},
    {"min_pixels": 1000, "size": 12},
    {"size": [672, 672]},
    {"size": [672, 672], "min_pixels": 1000, "max_pixels": 2000},
    {"size": {"shortest_edge": 10}},
    {"size": {"longest_edge": 10}},
    {"max_pixels": 2**70},
    {"image_mean": [0.5, 0.5, 0.5], "image_std": (1, 2, 3)},
    {"image_mean": 0.5, "image_std": 2},
    {"image_mean": [True, 1, 2.5], "image_std": ["0.25", " 0.5", "1e-1"]},
    {"image_mean": None, "image_std": None, "do_normalize": None},
    {"do_resize": False, "resample": 2, "do_rescale": True, "rescale_factor": 0.5},
    {"resample": "bilinear", "pass_order": "pillow12", "do_normalize": False},
    {"patch_size": 14, "merge_size": 2, "temporal_patch_size": (2,)},
    {"patch_size": {"height": 16, "width": 16}, "spatial_merge_size": 2},
    {"patch_size": [16, 16]},
    {"patch_size": "16"},
    {"patch_size": 2**70},
    {"do_center_crop": True, "do_pad": True, "crop_size": {"height": 3, "width": 4}},
    {"image_grid_pinpoints": [[336, 672], (672, 336)]},
    {"image_grid_pinpoints": ((336, 672),)},
    {
        "do_pan_and_scan": True,
        "pan_and_scan_min_crop_size": 256,
        "pan_and_scan_max_num_crops": 4,
        "pan_and_scan_min_ratio_to_activate": 1.2,
        "image_seq_length": 256,
    },
    {"crop_to_patches": True, "min_patches": 1, "max_patches": 12, "image_seq_length": 256},
    {
        "max_image_size": {"longest_edge": 364},
        "do_image_splitting": True,
        "do_pad": True,
        "image_seq_len": 64,
    },
    {"max_patches": 16, "resize_to_max_canvas": False, "pixel_shuffle_ratio": 0.5},
    {"dynamic_hd": 36, "patch_size": 14},
    {"num_crops": 4, "image_mean": [0.1, 0.2, 0.3], "size": 336, "do_resize": False},
    # Kimi-K2.5's hub file: everything nested in media_proc_cfg (top-level keys win)
    {
        "media_proc_cfg": {
            "in_patch_limit": 16384,
            "patch_size": 14,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
            "merge_kernel_size": 2,
            "fixed_output_tokens": None,
            "patch_limit_on_one_side": 512,
            "in_patch_limit_each_frame": 4096,
            "sample_fps": 2.0,
        }
    },
    {
        "max_patches": 99,
        "size": {"max_height": 7, "max_width": 7},
        "media_proc_cfg": {
            "in_patch_limit": 4096,
            "patch_limit_on_one_side": 64,
            "image_mean": 0.25,
        },
    },
    {"media_proc_cfg": {"transparent_bg_config": {"pattern": "chessboard"}}},
    {"media_proc_cfg": None},
    # Nemotron-H-Omni's released keys: norm_mean/norm_std stand in for absent image_mean/std.
    {"norm_mean": [0.1, 0.2, 0.3], "norm_std": [0.4, 0.5, 0.6], "_downsample_factor": 2},
    {"norm_mean": [0.1, 0.2, 0.3], "image_mean": [0.5, 0.5, 0.5], "norm_std": None},
    {"downsample_ratio": 0.25, "min_num_patches": 64, "max_num_patches": 0, "max_model_len": 99},
]


@pytest.mark.parametrize("family", FAMILIES)
def test_defaults_read_the_same(family: Family) -> None:
    """A family's complete native configuration, fed back as a config."""
    _same(family, _native.Preprocessor(family, {}).config())


@pytest.mark.parametrize("family", FAMILIES)
def test_varied_forms_read_the_same(family: Family) -> None:
    for config in VARIED:
        _same(family, config)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_key_together(family: Family) -> None:
    """Every key any family reads, with the values above, combined."""
    union: dict[str, Any] = {}
    for config in VARIED[::-1]:
        union.update({k: v for k, v in config.items() if v is not None})
    _same(family, union)
    for a, b in itertools.combinations(VARIED[2:40:3], 2):
        _same(family, {**a, **b})


def test_big_ints_pass_through_unchanged() -> None:
    big = 2**70
    out = _config.normalise("clip", {"size": big, "crop_size": big})
    assert out["size"]["shortest_edge"] is big
    assert out["crop_size"]["height"] is big


def test_class_names_find_the_same_family() -> None:
    classes = [*_CLASSES, "Qwen2VLVideoProcessor", "Qwen3VLVideoProcessor"]
    for name in classes:
        for suffix in ("", "Fast", "Pil"):
            for key in ("image_processor_type", "video_processor_type"):
                config = {key: name + suffix}
                assert _config.family_of(config) == _old_family_of(config)
    unknown: list[dict[str, Any]] = [
        {"image_processor_type": "NopeImageProcessor"},
        {},
        {"size": 3},
    ]
    for config in unknown:
        expected = _outcome(_old_family_of, config)
        assert expected[0] == "error"
        assert _outcome(_config.family_of, config) == expected


# What ImageProcessor.from_pretrained read from processor_config.json before the table moved to
# the families' Rust modules (`Hf::processor_keys`, `Hf::processor_forces`).
_OLD_PROCESSOR_KEYS: dict[str, tuple[tuple[str, int | None], ...]] = {
    "pixtral": (("patch_size", 16), ("spatial_merge_size", 1)),
    "gemma3": (("image_seq_length", None),),
    "internvl": (("image_seq_length", None),),
    "idefics3": (("image_seq_len", None),),
    "smolvlm": (("image_seq_len", None),),
    "llama4": (("patch_size", None), ("pixel_shuffle_ratio", None)),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_processor_settings_are_the_old_table(family: Family) -> None:
    assert _config.processor_keys(family) == _OLD_PROCESSOR_KEYS.get(family, ())
    expected = ("InternVLProcessor", "crop_to_patches", True) if family == "internvl" else None
    assert _config.processor_forces(family) == expected
