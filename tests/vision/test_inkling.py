"""Inkling and Inkling2 beyond the per-family torch goldens (``test_torch_family_goldens.py``,
RGB arrays): inputs with alpha against ``tests/goldens/torch/alpha/inkling.json``
(``scripts/gen_inkling_alpha_goldens.py``: transformers' ``InklingImageProcessor`` and
``Inkling2ImageProcessor`` at the pinned torch), the configs we refuse, how ``from_pretrained``
finds the families, and the expanded prompt against the processors' own
``replace_image_token`` (their processors cannot be built without torch).
"""

from __future__ import annotations

import base64
import io
import json
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.goldens import compare

from smg_grpc_proto import errors, vision
from smg_grpc_proto.engines import VisionModel, expand_placeholders

ALPHA = Path(__file__).resolve().parents[1] / "goldens" / "torch" / "alpha" / "inkling.json"
GOLDENS = json.loads(ALPHA.read_text())
PINNED = {"torch": "2.14.1", "torchvision": "0.29.1", "transformers": "5.24.0", "pillow": "13.0.0"}
IMAGE_TOKEN_ID = 200054


def _array(record: dict[str, Any]) -> np.ndarray:
    data = np.frombuffer(base64.b64decode(record["data"]), dtype=np.uint8)
    return data.reshape(record["shape"])


def _check(case: dict[str, Any], result: Any) -> None:
    problems = []
    for golden in case["outputs"]:
        problems += compare(golden, getattr(result, golden["name"], None))
    assert not problems, "\n".join(problems)


def test_alpha_goldens_file() -> None:
    found = GOLDENS["versions"]
    assert {k: found[k].split("+")[0] for k in PINNED} == PINNED
    assert found["torch_num_threads"] == 1
    ids = [c["id"] for c in GOLDENS["cases"]]
    assert len(set(ids)) == len(ids)
    assert {c["family"] for c in GOLDENS["cases"]} == {"inkling", "inkling2"}


ARRAY_CASES = [c for c in GOLDENS["cases"] if "file" not in c]
FILE_CASES = [c for c in GOLDENS["cases"] if "file" in c]


@pytest.mark.parametrize("case", ARRAY_CASES, ids=[c["id"] for c in ARRAY_CASES])
def test_rgba_arrays(case: dict[str, Any]) -> None:
    """Inkling: torch's float32 compositing onto white; Inkling2: the 204/153 checkerboard."""
    records = case["arrays"] if "arrays" in case else [case["array"]]
    processor = vision.ImageProcessor.for_family(case["family"])
    _check(case, processor([_array(r) for r in records]))


@pytest.mark.parametrize("case", FILE_CASES, ids=[c["id"] for c in FILE_CASES])
def test_files_as_pil_images(case: dict[str, Any]) -> None:
    """``Image.open``-ed files: Inkling2 keeps their alpha (RGBA arrays to the native side),
    Inkling composites onto white as ``convert_to_rgb`` does."""
    image_module = pytest.importorskip("PIL.Image")
    data = base64.b64decode(case["file"])
    with image_module.open(io.BytesIO(data)) as image:
        image.load()
        result = vision.ImageProcessor.for_family(case["family"])([image])
    _check(case, result)


@pytest.mark.parametrize("case", FILE_CASES, ids=[c["id"] for c in FILE_CASES])
def test_files_as_bytes_with_alpha_white(case: dict[str, Any]) -> None:
    """The same files as bytes, decoded natively with ``alpha="white"`` (the processor given
    ``Image.open``): Inkling2's decoder keeps alpha as Pillow's ``convert("RGBA")`` makes it."""
    data = base64.b64decode(case["file"])
    processor = vision.ImageProcessor.for_family(case["family"], alpha="white", apply_exif=False)
    _check(case, processor([data]))


# -- configs -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"rescale_image_frac": 0.5, "resample": 0}, "resample"),
        ({"rescale_image_frac": 0.5, "resample": 4}, "resample"),
        ({"do_resize": False}, "do_resize"),
        ({"size": {"height": 40, "width": 32}}, "size"),
        ({"size": 40}, "size"),  # default_to_square False: a shortest edge, unusable
    ],
)
def test_inkling_refusals(config: dict[str, Any], field: str) -> None:
    with pytest.raises(errors.ProcessorConfigError) as info:
        vision.ImageProcessor("inkling", config)
    assert info.value.field == field


def test_inkling_prescale_errors() -> None:
    """A pre-scaled side of 0 (transformers: no usable size) or a 1 x 1 result from more than
    one row (torch's uint8 kernel asserts) is an ImageShapeError, a ValueError as theirs."""
    image = np.zeros((20, 30, 3), dtype=np.uint8)
    for frac in (0.001, 0.04):
        with pytest.raises(errors.ImageShapeError):
            vision.ImageProcessor("inkling", {"rescale_image_frac": frac})([image])
    with pytest.raises(errors.ImageShapeError):  # 2 x 2 -> 1 x 1
        vision.ImageProcessor("inkling", {"rescale_image_frac": 0.5})([image[:2, :2]])
    row = np.zeros((1, 2, 3), dtype=np.uint8)  # 1 x 2 -> 1 x 1: torch resizes one row
    out = vision.ImageProcessor("inkling", {"rescale_image_frac": 0.5})([row])
    assert out.num_patches is not None
    assert out.num_patches.tolist() == [1]


def test_inkling_config_keys() -> None:
    config = vision.ImageProcessor("inkling", {}).config
    assert config["size"] == {"height": 40, "width": 40}
    assert config["rescale_image_max_upscaled_long_edge"] == 2048
    assert "rescale_image_frac" not in config
    uncapped = vision.ImageProcessor("inkling", {"rescale_image_max_upscaled_long_edge": None})
    assert uncapped.config["rescale_image_max_upscaled_long_edge"] is False
    square = vision.ImageProcessor("inkling2", {"size": 32}).config
    assert square["size"] == {"height": 32, "width": 32}


@pytest.mark.parametrize(
    ("processor_type", "model_type", "family"),
    [
        ("InklingImageProcessor", None, "inkling"),
        ("Inkling2ImageProcessor", None, "inkling2"),
        (None, "inkling_mm_model", "inkling"),
        (None, "inkling2", "inkling2"),
        (None, "inkling2_loop", "inkling2"),
    ],
)
def test_from_pretrained_finds_the_family(
    tmp_path: Path, processor_type: str | None, model_type: str | None, family: str
) -> None:
    pre: dict[str, Any] = {"size": {"height": 40, "width": 40}}
    if processor_type is not None:
        pre["image_processor_type"] = processor_type
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(pre))
    if model_type is not None:
        (tmp_path / "config.json").write_text(
            json.dumps({"model_type": model_type, "image_token_id": IMAGE_TOKEN_ID})
        )
    assert vision.ImageProcessor.from_pretrained(tmp_path).family == family


# -- the prompt --------------------------------------------------------------------------------
def _images(shapes: list[tuple[int, int]]) -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in shapes]


SHAPES = [[(40, 40)], [(1, 1), (123, 80), (41, 401)]]


@pytest.mark.parametrize("shapes", SHAPES, ids=["one", "three"])
def test_input_ids_equal_inkling_processor(shapes: list[tuple[int, int]]) -> None:
    """``InklingProcessor.replace_image_token`` (``num_patches`` times ``<|unused_200054|>``)."""
    from transformers.models.inkling.processing_inkling import InklingProcessor

    media = VisionModel.for_family("inkling").prepare(_images(shapes))
    out = media.output
    this = types.SimpleNamespace(image_token="<I>")
    runs = [
        InklingProcessor.replace_image_token(this, {"num_patches": out.num_patches}, i)
        for i in range(len(shapes))
    ]
    prompt = [1, *[x for _ in shapes for x in (200005, IMAGE_TOKEN_ID)], 2]
    want = [1]
    for run in runs:
        want += [200005, *[IMAGE_TOKEN_ID] * run.count("<I>")]
    want.append(2)
    ids, ranges = expand_placeholders(prompt, [media])
    assert ids.tolist() == want
    assert [length for _, length in ranges[0]] == [int(n) for n in out.num_patches]


@pytest.mark.parametrize("shapes", SHAPES, ids=["one", "three"])
def test_input_ids_equal_inkling2_processor(shapes: list[tuple[int, int]]) -> None:
    """``Inkling2Processor.replace_image_token`` (``prod(image_grid_thw)`` placeholders)."""
    from transformers.models.inkling2.processing_inkling2 import Inkling2Processor

    media = VisionModel.for_family("inkling2").prepare(_images(shapes))
    grid = media.output.image_grid_thw
    this = types.SimpleNamespace(image_token="<I>")
    counts = [
        Inkling2Processor.replace_image_token(this, {"image_grid_thw": grid}, i).count("<I>")
        for i in range(len(shapes))
    ]
    prompt = [7, *[IMAGE_TOKEN_ID] * len(shapes), 8]
    ids, ranges = expand_placeholders(prompt, [media])
    assert ids.tolist() == [7, *[IMAGE_TOKEN_ID] * sum(counts), 8]
    assert [length for _, length in ranges[0]] == counts
    assert list(media.token_counts) == counts
