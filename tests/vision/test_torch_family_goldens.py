"""Every torch-reference family against its committed goldens, one file per family:
``tests/goldens/torch/<family>.json``, written by
``scripts/gen_torch_goldens.py --family <family>`` from ``scripts/torch_goldens/<family>.py``
(the family's transformers torchvision processor at the pinned torch, torchvision, transformers
and Pillow; see ``tests/goldens/torch/README.md``).

Each case runs :class:`vision.ImageProcessor` (the class defaults for an empty config, else the
config) on the case's inputs: the 32 real photographs of the parity corpus
(``support.torch_inputs.photo_inputs``) and the odd shapes of ``support.torch_inputs``. Every
golden output must equal our ``ProcessorOutput`` attribute of the same name in shape, dtype and
sha256; where the reference raised, ours must raise a ``ValueError``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("PIL", reason="the inputs are decoded and resized by Pillow")

from support import images
from support.goldens import compare, sha256_of
from support.torch_inputs import photo_inputs, torch_inputs

from smg_grpc_proto import _native, vision

# Pillow's sugarshack photo (one of the real photos) has a malformed MPO header, read as a plain
# JPEG; Pillow warns about it while the inputs are made.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Image appears to be a malformed MPO file:UserWarning"
)

FOLDER = Path(__file__).resolve().parents[1] / "goldens" / "torch"
PINNED = {"torch": "2.14.1", "torchvision": "0.29.1", "transformers": "5.24.0", "pillow": "13.0.0"}
FILES = {p.stem: json.loads(p.read_text()) for p in sorted(FOLDER.glob("*.json"))}
FILES.pop("goldens", None)  # the kernels, Llama 4 and Phi: test_torch_goldens.py
FAMILIES = {name for name, *_ in _native.families()}
MIN_PHOTOS = 30


def _cases() -> Iterator[Any]:
    for family, goldens in FILES.items():
        for case in goldens["cases"]:
            yield pytest.param(family, case, id=case["id"])


@pytest.fixture(scope="module")
def inputs() -> dict[str, np.ndarray]:
    try:
        shapes = dict(torch_inputs(images.pillow_test_images()))
        photos = dict(photo_inputs(images.real_photos()))
    except RuntimeError as exc:  # no package index to fetch the images from
        pytest.skip(str(exc))
    return {**shapes, **photos}


def _names(case: dict[str, Any]) -> list[str]:
    names = case["input"]
    return list(names) if isinstance(names, list) else [names]


def _processor(case: dict[str, Any]) -> vision.ImageProcessor:
    if case["config"]:
        return vision.ImageProcessor(case["kind"], case["config"])
    return vision.ImageProcessor.for_family(case["kind"])


@pytest.mark.parametrize("family", sorted(FILES))
def test_goldens_file(family: str, inputs: dict[str, np.ndarray]) -> None:
    """From the pinned reference, on exactly the inputs we regenerate, for a family we ship,
    covering >= 30 real photos with the defaults, a batch, and at least one config variant."""
    goldens = FILES[family]
    found = goldens["versions"]
    assert {k: found[k].split("+")[0] for k in PINNED} == PINNED
    assert found["torch_num_threads"] == 1
    assert family in FAMILIES, f"{family}.json has no family of that name"
    drifted = [
        name
        for name, rec in goldens["inputs"].items()
        if name not in inputs
        or [list(inputs[name].shape), sha256_of(inputs[name])] != [rec["shape"], rec["sha256"]]
    ]
    assert not drifted, f"the inputs no longer match the goldens: {drifted}"
    cases = goldens["cases"]
    assert {c["kind"] for c in cases} == {family}
    ids = [c["id"] for c in cases]
    assert len(set(ids)) == len(ids)
    photos = {
        c["input"]
        for c in cases
        if not c["config"] and isinstance(c["input"], str) and c["input"].startswith("photo_")
    }
    assert len(photos) >= MIN_PHOTOS, f"{len(photos)} real photos with the defaults"
    assert any(isinstance(c["input"], list) for c in cases), "no batch"
    assert any(c["config"] for c in cases), "no config variant"


@pytest.mark.parametrize(("family", "case"), list(_cases()))
def test_golden(family: str, case: dict[str, Any], inputs: dict[str, np.ndarray]) -> None:
    arrays = [inputs[name] for name in _names(case)]
    if "error" in case:
        try:  # a configuration the reference refuses is refused when ours is built
            result = _processor(case)(arrays)
        except ValueError:
            return
        pytest.fail(f"the reference raised {case['error']!r}; ours returned {result!r}")
    result = _processor(case)(arrays)
    problems = []
    for golden in case["outputs"]:
        got = getattr(result, golden["name"], None)
        problems += compare(golden, got)
    assert not problems, "\n".join(problems)
