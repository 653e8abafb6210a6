"""transformers ``preprocessor_config.json`` files to the native processor's configuration.

The native ``Preprocessor`` starts from a family's transformers class defaults and applies
normalised keys. Everything about a family lives in its Rust module
(``rust/src/processors/<family>.rs``, named by one registry line in ``config.rs``): the
transformers image/video processor classes that name it, and how its keys read — as
transformers' ``__init__``/``_standardize_kwargs`` would (an int ``size`` is a shortest edge or,
for the ``default_to_square`` classes, a square; Qwen's top-level ``min_pixels``/``max_pixels``
override ``size``; ``None`` values keep the class default; keys a family does not use are
ignored). This module is the family-agnostic glue: it reads the file, finds the family from
``image_processor_type`` and asks the native module to normalise. ``Family``/``FAMILIES`` are
generated from the registry into ``smg_grpc_proto/_families.py`` (``scripts/gen_families.py``).

Nothing is downloaded: a source is a dict, a JSON file, or a local model directory holding
``preprocessor_config.json``.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from smg_grpc_proto._core import native as _native
from smg_grpc_proto._families import FAMILIES, Family

__all__ = [
    "FAMILIES",
    "Family",
    "family_of",
    "from_hf",
    "load_json",
    "model_type_of",
    "normalise",
    "processor_forces",
    "processor_keys",
]

CONFIG_NAME = "preprocessor_config.json"


@functools.cache
def _classes() -> tuple[dict[str, Family], dict[str, Family]]:
    """transformers image and video processor class names (without the "Fast"/"Pil" backend
    suffix) -> family, from the native registry."""
    images: dict[str, Family] = {}
    videos: dict[str, Family] = {}
    for name, image_classes, video_classes, _, _ in _native.families():
        family = cast(Family, name)
        images.update(dict.fromkeys(image_classes, family))
        videos.update(dict.fromkeys(video_classes, family))
    return images, videos


@functools.cache
def _processor_settings() -> dict[
    str, tuple[tuple[tuple[str, int | None], ...], tuple[str, str, bool] | None]
]:
    return {name: (tuple(keys), forces) for name, _, _, keys, forces in _native.families()}


def processor_keys(family: Family) -> tuple[tuple[str, int | None], ...]:
    """The settings of ``family``'s transformers processor that reach its image processor, read
    from a model's ``processor_config.json``: ``(key, default)`` pairs, the default applying
    when the file lacks the key (``None``: keep the preprocessor config's). Empty: the file
    gives ``VisionTokens`` instead."""
    return _processor_settings()[family][0]


def processor_forces(family: Family) -> tuple[str, str, bool] | None:
    """``(processor_class, key, value)``: when a config names ``processor_class``, that
    processor passes ``key = value`` to ``family``'s image processor on every call."""
    return _processor_settings()[family][1]


def family_of(config: Mapping[str, Any], model_type: str | None = None) -> Family:
    """The family of a transformers config: the one its ``processor_class`` names where a
    family's module lists that class (``Qwen3OmniMoeProcessor``), else the one ``model_type``
    (``config.json``'s, or the config's own) names where a module lists it (the Qwen model types
    and the gateway's aliases: ``qwen3_5_moe``, ``qwen3_6``, ``qwen4_exp`` → ``qwen3_5``;
    ``qwen3_omni_moe`` …), else the one ``image_processor_type`` names."""
    processor_class = config.get("processor_class")
    if isinstance(processor_class, str):
        found = _native.family_of_processor_class(processor_class)
        if found is not None:
            return cast(Family, found)
    for candidate in (model_type, config.get("model_type")):
        if isinstance(candidate, str):
            found = _native.family_of_model_type(candidate)
            if found is not None:
                return cast(Family, found)
    name = config.get("image_processor_type") or config.get("video_processor_type")
    if not isinstance(name, str):
        raise ValueError(
            "the config names no image_processor_type; pass family=... "
            f"(one of {', '.join(FAMILIES)})"
        )
    base = name.removesuffix("Fast").removesuffix("Pil")
    images, videos = _classes()
    if base in images:
        return images[base]
    if base in videos:
        return videos[base]
    raise ValueError(
        f"image_processor_type {name!r} is not supported; supported: "
        f"{', '.join(sorted(images))} (pass family=... to force one)"
    )


def normalise(family: Family, config: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``config`` that ``family`` uses, in the native processor's form (each
    family's reading is in its Rust module)."""
    return _native.normalise_config(family, dict(config))


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


def model_type_of(source: str | os.PathLike[str]) -> str | None:
    """The ``model_type`` of the ``config.json`` next to a config source (a model directory or
    a file in one), if there is one."""
    path = Path(source)
    config = (path if path.is_dir() else path.parent) / "config.json"
    if not config.is_file():
        return None
    with open(config, encoding="utf-8") as f:
        data = json.load(f)
    value = data.get("model_type") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def from_hf(
    source: Mapping[str, Any] | str | os.PathLike[str], family: Family | None = None
) -> tuple[Family, dict[str, Any]]:
    """``(family, config)`` of a transformers config source (a dict, a file or a directory;
    a directory's ``config.json`` ``model_type`` takes part in finding the family)."""
    raw = dict(source) if isinstance(source, Mapping) else load_json(source)
    if family is not None:
        chosen = family
    else:
        model_type = None if isinstance(source, Mapping) else model_type_of(source)
        chosen = family_of(raw, model_type)
    if chosen not in FAMILIES:
        raise ValueError(f"unknown family {chosen!r}: expected one of {', '.join(FAMILIES)}")
    return chosen, raw
