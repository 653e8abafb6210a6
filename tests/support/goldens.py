"""Comparing our outputs with committed torch goldens (``tests/goldens/torch/``): the shared
half of ``test_torch_goldens.py`` (kernels, Llama 4, Phi) and ``test_torch_family_goldens.py``
(one file per family)."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np


def sha256_of(array: np.ndarray) -> str:
    """The sha256 of an array's C-contiguous bytes (as the generator hashes torch tensors)."""
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def _as_float(value: Any) -> float:
    return float(np.asarray(value).astype(np.float64))


def compare(golden: dict[str, Any], got: Any) -> list[str]:
    """What differs between one golden output and ours (empty: identical)."""
    name = golden["name"]
    if "sha256" not in golden:  # a list of ints (token counts)
        values = [int(v) for v in got]
        return [] if values == golden["values"] else [f"{name}: {values} != {golden['values']}"]
    if got is None:
        return [f"{name}: missing (None)"]
    array = np.asarray(got)
    problems = []
    if list(array.shape) != golden["shape"]:
        problems.append(f"{name}: shape {list(array.shape)} != {golden['shape']}")
    if array.dtype.name != golden["dtype"]:
        problems.append(f"{name}: dtype {array.dtype.name} != {golden['dtype']}")
    if problems or sha256_of(array) == golden["sha256"]:
        return problems
    flat = array.reshape(-1)
    differ = [
        (index, _as_float(flat[index]), want)
        for index, want in golden["samples"]
        if _as_float(flat[index]) != want
    ]
    lines = [f"{name}: sha256 differs"]
    if differ:
        lines.append(f"  {len(differ)} of {len(golden['samples'])} sampled values differ:")
        lines += [f"    [{i}] ours {o!r}, reference {r!r}" for i, o, r in differ]
    else:
        lines.append(f"  all {len(golden['samples'])} sampled values agree (difference elsewhere)")
    if "values" in golden:
        lines.append(f"  ours {array.tolist()}\n  reference {golden['values']}")
    problems.append("\n".join(lines))
    return problems
