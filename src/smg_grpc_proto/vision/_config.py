"""transformers ``preprocessor_config.json`` files to the native processor's configuration.

The native ``Preprocessor`` starts from a family's transformers class defaults (they live in
Rust, ``rust/src/processors/``) and applies normalised keys. This module finds the family and
normalises the keys exactly as transformers' ``__init__``/``_standardize_kwargs`` would:

* ``size``: an int becomes ``{"shortest_edge": n}`` (``default_to_square = False`` in every
  supported class but Pixtral's, where it becomes ``{"height": n, "width": n}``), a list
  ``{"height": h, "width": w}``;
* Gemma 3: an int ``size`` is ``{"height": n, "width": n}`` too (``default_to_square = True``);
  the pan-and-scan keys and ``image_seq_length`` (a ``Gemma3Processor`` setting) are passed
  through, and ``crop_size``/``do_center_crop``/``do_pad``, which its ``_preprocess`` ignores,
  are ignored;
* InternVL (``GotOcr2ImageProcessor``): an int ``size`` is a square as well; ``crop_to_patches``,
  ``min_patches``, ``max_patches`` and ``image_seq_length`` (an ``InternVLProcessor`` setting)
  are passed through, and ``crop_size``/``do_center_crop``/``do_pad``, which its
  ``_preprocess`` ignores, are ignored;
* Idefics3 and SmolVLM: ``size`` and ``max_image_size`` must be ``{"longest_edge": n}``;
  ``do_image_splitting``, ``do_pad`` and ``image_seq_len`` (an ``Idefics3Processor``/
  ``SmolVLMProcessor`` setting) are passed through;
* Llama 4 and Phi-4-multimodal (torchvision classes): an int ``size`` is a square;
  ``max_patches``/``resize_to_max_canvas`` (Llama 4) and ``patch_size``/``dynamic_hd`` (Phi-4)
  are passed through, and ``Llama4Processor``'s ``patch_size``/``pixel_shuffle_ratio`` too (they
  count tokens);
* Phi-3-vision (the hub's ``Phi3VImageProcessor``): only ``num_crops``, ``image_mean`` and
  ``image_std`` exist;
* Pixtral: an int ``patch_size`` becomes ``{"height": p, "width": p}``; ``spatial_merge_size``
  (a ``PixtralProcessor`` setting, not an image processor key) is passed through;
* ``crop_size``/``pad_size``: an int becomes ``{"height": n, "width": n}``;
* Qwen: top-level ``min_pixels``/``max_pixels`` override ``size["shortest_edge"]``/
  ``size["longest_edge"]`` (as ``Qwen2VLImageProcessorPil.__init__`` does);
* CLIP: ``use_square_size`` replaces ``size`` by ``{"height": 224, "width": 224}`` (the class's
  own shortest edge, as ``CLIPImageProcessorPil.__init__`` does);
* ``None`` values keep the class default; keys a family does not use are ignored.

Nothing is downloaded: a source is a dict, a JSON file, or a local model directory holding
``preprocessor_config.json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, cast, get_args

__all__ = ["FAMILIES", "Family", "family_of", "from_hf", "load_json", "normalise"]

Family = Literal[
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "qwen3_5",
    "clip",
    "llava",
    "siglip",
    "llava_next",
    "pixtral",
    "gemma3",
    "internvl",
    "idefics3",
    "smolvlm",
    "llama4",
    "phi4_multimodal",
    "phi3_v",
]
FAMILIES: tuple[Family, ...] = get_args(Family)

QWEN: frozenset[str] = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"})

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
}
# The hub's Phi3VImageProcessor takes only these keys.
_PHI3_V = ("image_mean", "image_std", "num_crops")

# Families whose class has default_to_square = True: an int size is a square.
_SQUARE: frozenset[str] = frozenset({"pixtral", "gemma3", "internvl", "llama4", "phi4_multimodal"})
# Families whose size, crop and pad keys need none of the CLIP-like handling below.
_OWN_SIZES: frozenset[str] = frozenset(
    {"gemma3", "internvl", "idefics3", "llama4", "phi4_multimodal", "phi3_v"}
)

CONFIG_NAME = "preprocessor_config.json"


def _kind(family: Family) -> str:
    if family in QWEN:
        return "qwen"
    if family in ("idefics3", "smolvlm"):
        return "idefics3"
    own = ("llava_next", "pixtral", "gemma3", "internvl", "llama4", "phi4_multimodal", "phi3_v")
    return family if family in own else "clip"


def family_of(config: Mapping[str, Any]) -> Family:
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


def normalise(family: Family, config: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``config`` that ``family`` uses, in the native processor's form."""
    kind = _kind(family)
    out: dict[str, Any] = {}
    keys = _PHI3_V if kind == "phi3_v" else (*_COMMON, *_KEYS[kind])
    for key in keys:
        value = config.get(key)
        if value is not None:
            out[key] = list(value) if isinstance(value, tuple) else value
    for key in ("image_mean", "image_std"):
        if key in out and not isinstance(out[key], (int, float)):
            out[key] = [float(v) for v in out[key]]
    if config.get("size") is not None and kind != "phi3_v":
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
    return out


def _qwen_default_size(family: Family) -> dict[str, int]:
    if family in ("qwen3_vl", "qwen3_5"):
        return {"shortest_edge": 65536, "longest_edge": 16777216}
    return {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}


def load_json(source: str | os.PathLike[str]) -> dict[str, Any]:
    """The preprocessor config at ``source``: a JSON file, or a directory holding
    ``preprocessor_config.json``. Never downloads: a name that is not a local path fails."""
    path = Path(source)
    if path.is_dir():
        path = path / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"no {CONFIG_NAME} at {os.fspath(source)!r}: pass a local file, a model directory "
            "or a dict (nothing is downloaded)"
        )
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return cast(dict[str, Any], data)


def from_hf(
    source: Mapping[str, Any] | str | os.PathLike[str], family: Family | None = None
) -> tuple[Family, dict[str, Any]]:
    """``(family, config)`` of a transformers config source (a dict, a file or a directory)."""
    raw = dict(source) if isinstance(source, Mapping) else load_json(source)
    chosen = family if family is not None else family_of(raw)
    if chosen not in FAMILIES:
        raise ValueError(f"unknown family {chosen!r}: expected one of {', '.join(FAMILIES)}")
    return chosen, raw
