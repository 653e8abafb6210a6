"""Llama 4, Phi-4-multimodal, Phi-3-vision and the torch kernels against committed goldens.

Their references need torch and torchvision, too heavy for every test run, so
``scripts/gen_torch_goldens.py`` computed them once (torch 2.14.1, torchvision 0.29.1,
transformers 5.24.0, Pillow 13.0.0; see ``tests/goldens/torch/README.md``) into
``tests/goldens/torch/goldens.json``, on the inputs of ``support/torch_inputs.py``:

- ``resize_u8``: :func:`vision.resize_torch` against torchvision's ``resize`` of a uint8 CHW
  tensor (``antialias=True``, torch's native uint8 kernel);
- ``interpolate_bicubic_f32``: :func:`vision.interpolate_bicubic` against
  ``torch.nn.functional.interpolate(mode="bicubic", align_corners=False)``;
- ``llama4``, ``phi4_multimodal``: :class:`vision.ImageProcessor` against transformers'
  ``Llama4ImageProcessor`` and ``Phi4MultimodalImageProcessor`` (torchvision backend);
- ``phi3_v``: against the hub's ``Phi3VImageProcessor`` (remote code, transcribed in the
  script).

Every output must have the reference's shape, dtype and sha256 (bfloat16 compared as its 2-byte
patterns); a mismatch lists the golden's sampled values that differ. Where the reference raised,
ours must raise a ``ValueError`` (every ``smg_grpc_proto.errors`` exception is one). The inputs
are regenerated here and checked against the hashes the goldens recorded, so a drifting input
generator fails loudly rather than as hundreds of unexplained mismatches.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

PIL = pytest.importorskip("PIL", reason="the inputs are decoded and resized by Pillow")

from support import images  # noqa: E402
from support.goldens import compare, sha256_of  # noqa: E402
from support.torch_inputs import torch_inputs  # noqa: E402

from smg_grpc_proto import vision  # noqa: E402

GOLDENS_PATH = Path(__file__).resolve().parents[1] / "goldens" / "torch" / "goldens.json"
GOLDENS: dict[str, Any] = json.loads(GOLDENS_PATH.read_text())
CASES: list[dict[str, Any]] = GOLDENS["cases"]

PINNED = {
    "torch": "2.14.1",
    "torchvision": "0.29.1",
    "transformers": "5.24.0",
    "pillow": "13.0.0",
}
KINDS = ("resize_u8", "interpolate_bicubic_f32", "llama4", "phi4_multimodal", "phi3_v")
PROCESSORS = ("llama4", "phi4_multimodal", "phi3_v")
# golden output name -> ProcessorOutput attribute
OUTPUT_ATTRS = {
    "llama4": {
        "pixel_values": "pixel_values",
        "aspect_ratios": "aspect_ratios",
        "num_image_tokens": "num_image_tokens",
    },
    "phi4_multimodal": {
        "image_pixel_values": "image_pixel_values",
        "image_sizes": "image_sizes",
        "image_attention_mask": "image_attention_mask",
        "num_img_tokens": "num_image_tokens",
    },
    "phi3_v": {
        "pixel_values": "pixel_values",
        "image_sizes": "image_sizes",
        "num_img_tokens": "num_image_tokens",
    },
}


@pytest.fixture(scope="module")
def inputs() -> dict[str, np.ndarray]:
    try:
        folder = images.pillow_test_images()
    except RuntimeError as exc:  # no package index
        pytest.skip(str(exc))
    return dict(torch_inputs(folder))


def _names(case: dict[str, Any]) -> list[str]:
    names = case["input"]
    return list(names) if isinstance(names, list) else [names]


def prep_f32(a: np.ndarray) -> np.ndarray:
    """float32 CHW ``(u8 / 255 - 0.5) / 0.5``, each step in float32 as torch does it."""
    x = np.ascontiguousarray(a.transpose(2, 0, 1)).astype(np.float32)
    return (x / np.float32(255) - np.float32(0.5)) / np.float32(0.5)


def ours(case: dict[str, Any], inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """Our outputs for ``case``, under the golden's output names (tensors CHW like torch's)."""
    kind, config = case["kind"], case["config"]
    arrays = [inputs[name] for name in _names(case)]
    if kind == "resize_u8":
        h, w = config["size"]
        out = vision.resize_torch(arrays[0], (w, h), resample=config["interpolation"])
        return {"output": np.ascontiguousarray(np.asarray(out).transpose(2, 0, 1))}
    if kind == "interpolate_bicubic_f32":
        assert config["prep"] == "u8/255-0.5/0.5"
        x = prep_f32(arrays[0])
        assert sha256_of(x) == case["prep_sha256"], "the float32 input differs from torch's"
        h, w = config["size"]
        return {"output": vision.interpolate_bicubic(x, (h, w))}
    result = processor(case)(arrays)
    return {name: getattr(result, attr) for name, attr in OUTPUT_ATTRS[kind].items()}


def processor(case: dict[str, Any]) -> Any:
    """``for_family`` for the class defaults, else the case's config."""
    if case["config"]:
        return vision.ImageProcessor(case["kind"], case["config"])
    return vision.ImageProcessor.for_family(case["kind"])


# ---------------------------------------------------------------------------------------------


def test_goldens_are_from_the_pinned_reference():
    found = GOLDENS["versions"]
    assert {k: found[k].split("+")[0] for k in PINNED} == PINNED
    assert found["torch_num_threads"] == 1
    assert found["cpu_avx2"], "torch's uint8 kernels are its AVX2 ones only with AVX2"


def test_inputs_match_the_goldens(inputs: dict[str, np.ndarray]):
    recorded = GOLDENS["inputs"]
    assert sorted(inputs) == sorted(recorded)
    drifted = [
        f"{name}: {list(a.shape)} {sha256_of(a)} != {recorded[name]['shape']} "
        f"{recorded[name]['sha256']}"
        for name, a in inputs.items()
        if [list(a.shape), sha256_of(a)] != [recorded[name]["shape"], recorded[name]["sha256"]]
    ]
    assert not drifted, (
        "support/torch_inputs.py no longer makes the goldens' inputs:\n" + "\n".join(drifted)
    )


def test_goldens_cover_every_kind():
    ids = [case["id"] for case in CASES]
    assert len(set(ids)) == len(ids)
    kinds = Counter(case["kind"] for case in CASES)
    assert set(kinds) == set(KINDS)
    assert kinds["resize_u8"] >= 100
    assert kinds["interpolate_bicubic_f32"] >= 20
    for kind in PROCESSORS:
        cases = [case for case in CASES if case["kind"] == kind]
        defaults = [case for case in cases if case["config"] in ({}, {"num_crops": 16})]
        assert len({case["input"] for case in defaults if isinstance(case["input"], str)}) >= 30
        assert any(isinstance(case["input"], list) for case in cases), kind
    assert any("error" in case for case in CASES)


@pytest.mark.parametrize("case", [pytest.param(c, id=c["id"]) for c in CASES])
def test_golden(case: dict[str, Any], inputs: dict[str, np.ndarray]):
    if "error" in case:
        # The configuration is valid (built outside the check): the input must be rejected.
        process = processor(case)
        arrays = [inputs[name] for name in _names(case)]
        try:
            result = process(arrays)
        except ValueError:
            return
        pytest.fail(f"the reference raised {case['error']!r}; ours returned {result!r}")
    got = ours(case, inputs)
    problems = []
    for golden in case["outputs"]:
        if golden["name"] not in got:
            problems.append(f"{golden['name']}: not in our outputs")
            continue
        problems += compare(golden, got[golden["name"]])
    if problems and "torch_error" in case:
        problems.append(
            f"(torch itself raised {case['torch_error']!r} here; the golden is the same uint8 "
            "kernel run on an RGBA copy, cut back to RGB)"
        )
    assert not problems, "\n".join(problems)
