"""``src/smg_grpc_proto/_families.py`` is generated from the native registry: fail when stale."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import get_args

from smg_grpc_proto import _families, _native
from smg_grpc_proto.vision import _config

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_families", ROOT / "scripts/gen_families.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_families"] = module
    spec.loader.exec_module(module)
    return module


def test_generated_module_is_fresh() -> None:
    gen = _generator()
    committed = gen.TARGET.read_text(encoding="utf-8")
    assert committed == gen.current(), "stale: run python scripts/gen_families.py"
    assert gen.main(["--check"]) == 0


def test_families_match_the_registry() -> None:
    names = tuple(name for name, *_ in _native.families())
    assert names == _families.FAMILIES
    assert get_args(_families.Family) == names
    assert tuple(_native.processor_families()) == names
    assert _config.FAMILIES is _families.FAMILIES


def test_class_names_name_one_family() -> None:
    seen: dict[str, str] = {}
    for name, images, videos, _, _ in _native.families():
        for cls in (*images, *videos):
            assert cls not in seen, f"{cls} names {seen[cls]} and {name}"
            assert not cls.endswith(("Fast", "Pil")), cls
            seen[cls] = name
